"""Losses (``hybrid.loss``), Gluon's: each returns one loss per sample (the mean over every
axis but ``batch_axis``), weighted by ``weight`` and an optional ``sample_weight``.

The label is reshaped like the prediction (it must have as many elements), so an ``(n,)``
label against an ``(n, 1)`` prediction is per-sample, never a silent ``(n, n)`` broadcast.
Losses are HybridBlocks written with hybrid ops, so they hybridize.

Called eagerly in a loop, a built-in loss runs as one compiled function per signature from
its instance's ``COMPILE_AFTER``-th call (``Loss.__call__``), as eager kernels do for single
ops: a softmax cross-entropy is ~15 eager ops forward and ~20 backward, each a dispatch (and on
a GPU each a CuPy launch), where the compiled function is one call each way (~1 ms saved per
MLP step here). Not from the second call: compiling a loss costs ~0.4-0.7 s with an empty
cache (~60 ms warm), so a script calling it a few times never pays it. Earlier calls run op by
op (their errors name the user's line as any eager op's); a user's subclass, a hooked or
hybridized loss, keyword arguments, or ``HYBRID_EAGER_KERNELS=0`` keep the op-by-op path.
"""
from __future__ import annotations

import math

from compiler.ops import composite as _c
from compiler.ops import spec_of
from runtime import config

from . import _state
from .ndarray import F, NDArray
from .nn.block import HybridBlock, _tracing

__all__ = ["Loss", "L2Loss", "L1Loss", "SoftmaxCrossEntropyLoss", "SoftmaxCELoss",
           "SigmoidBinaryCrossEntropyLoss", "SigmoidBCELoss", "HuberLoss", "HingeLoss",
           "LogisticLoss", "KLDivLoss"]


def _reshape_like(label, pred, who):
    """The label with the prediction's shape (same number of elements), or a clear error."""
    if tuple(label.shape) == tuple(pred.shape):
        return label
    if math.prod(label.shape) != math.prod(pred.shape):
        raise ValueError(f"{who}: label of shape {tuple(label.shape)} does not match the "
                         f"prediction of shape {tuple(pred.shape)} (they need the same number "
                         "of elements; the label is reshaped like the prediction)")
    return F.reshape(label, shape=tuple(pred.shape))


COMPILE_AFTER = 16  # the call of a loss instance that compiles it (a training loop's warm-up)


def _to_float(label, pred):
    dt = spec_of(pred).dtype
    return F.cast(label, dtype=dt) if spec_of(label).dtype != dt else label


class Loss(HybridBlock):
    """Base class: ``weight`` scales the loss; ``batch_axis`` is kept, others averaged."""

    def __init__(self, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(**kwargs)
        self._weight = weight
        self._batch_axis = batch_axis

    def __call__(self, *args, **kwargs):
        if not kwargs and not self._active and _state.local.trace is None and \
                not self._forward_pre_hooks and not self._forward_hooks:
            fn = self._eager_compiled(args)
            if fn is not None:
                try:
                    return fn(*args)
                except _tracing().TraceError:  # a loss that does not trace: op by op
                    object.__setattr__(self, "_eager_fn", (self._eager_fn[0], False, 0))
        return super().__call__(*args, **kwargs)

    def _eager_compiled(self, args):
        """The compiled forward for an eager call (module docstring), or None: op by op."""
        if type(self).__module__ != __name__ or not config.get("HYBRID_EAGER_KERNELS") or \
                not all(isinstance(a, NDArray) for a in args):
            return None
        # the configuration the trace reads (axis, weight, ...): a change traces again
        conf = tuple(sorted((k, v) for k, v in vars(self).items() if k != "_eager_fn" and
                            isinstance(v, (bool, int, float, str, type(None)))))
        state = self.__dict__.get("_eager_fn")
        if state is None or state[0] != conf:
            state = (conf, None, 0)
        conf, fn, calls = state
        if fn is None and calls >= COMPILE_AFTER - 1:
            fn = _tracing().hybridize(self.forward)
        object.__setattr__(self, "_eager_fn", (conf, fn, calls + 1))
        return fn or None

    def _weighting(self, loss, sample_weight=None):
        if sample_weight is not None:
            loss = F.mul(loss, sample_weight)
        if self._weight is not None:
            loss = F.mul(loss, float(self._weight))
        return loss

    def _batch_mean(self, loss):
        nd = len(loss.shape)
        if nd == 0:
            return loss
        b = self._batch_axis % nd
        axes = tuple(i for i in range(nd) if i != b)
        return _c.mean(F, loss, axis=axes) if axes else loss

    def __repr__(self):
        return f"{type(self).__name__}(batch_axis={self._batch_axis}, w={self._weight})"


class L2Loss(Loss):
    """0.5 * weight * (label - pred)^2, averaged per sample."""

    def __init__(self, weight=1.0, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def forward(self, pred, label, sample_weight=None):
        label = _to_float(_reshape_like(label, pred, "L2Loss"), pred)
        loss = F.square(F.sub(label, pred))
        loss = self._weighting(loss, sample_weight)
        return self._batch_mean(F.mul(loss, 0.5))


class L1Loss(Loss):
    """weight * |label - pred|, averaged per sample."""

    def __init__(self, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def forward(self, pred, label, sample_weight=None):
        label = _to_float(_reshape_like(label, pred, "L1Loss"), pred)
        loss = self._weighting(F.abs(F.sub(label, pred)), sample_weight)
        return self._batch_mean(loss)


class SoftmaxCrossEntropyLoss(Loss):
    """Cross entropy of softmax(pred) with the label, computed stably with log_softmax.

    sparse_label=True: the label is a class index per sample (any int or float dtype);
    otherwise a distribution with pred's shape. from_logits=True: pred already holds
    log-probabilities.
    """

    def __init__(self, axis: int = -1, sparse_label: bool = True, from_logits: bool = False,
                 weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._axis = axis
        self._sparse_label = sparse_label
        self._from_logits = from_logits

    def forward(self, pred, label, sample_weight=None):
        logp = pred if self._from_logits else _c.log_softmax(F, pred, self._axis)
        if self._sparse_label:
            nd = len(pred.shape)
            axis = self._axis % nd
            want = tuple(pred.shape[:axis]) + tuple(pred.shape[axis + 1:])
            if tuple(label.shape) != want:
                if math.prod(label.shape) != math.prod(want):
                    raise ValueError(
                        f"SoftmaxCrossEntropyLoss: label of shape {tuple(label.shape)} does "
                        f"not match the prediction {tuple(pred.shape)} (expected one class "
                        f"index per sample, shape {want})")
                label = F.reshape(label, shape=want)
            if not spec_of(label).dtype.startswith("int"):
                label = F.cast(label, dtype="int64")
            loss = F.neg(F.pick(logp, label, axis=axis, keepdims=True))
        else:
            label = _to_float(_reshape_like(label, pred, "SoftmaxCrossEntropyLoss"), pred)
            loss = F.neg(F.sum(F.mul(logp, label), axis=self._axis, keepdims=True))
        loss = self._weighting(loss, sample_weight)
        return self._batch_mean(loss)


SoftmaxCELoss = SoftmaxCrossEntropyLoss


class SigmoidBinaryCrossEntropyLoss(Loss):
    """Binary cross entropy. from_sigmoid=False (default) takes logits and is computed
    stably: max(x, 0) - x * label + log(1 + exp(-|x|)). pos_weight scales positive terms."""

    def __init__(self, from_sigmoid: bool = False, weight=None, batch_axis: int = 0,
                 **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_sigmoid = from_sigmoid

    def forward(self, pred, label, sample_weight=None, pos_weight=None):
        label = _to_float(_reshape_like(label, pred, "SigmoidBinaryCrossEntropyLoss"), pred)
        if not self._from_sigmoid:
            if pos_weight is None:
                loss = F.add(F.sub(F.relu(pred), F.mul(pred, label)),
                             _c.softrelu(F, F.neg(F.abs(pred))))
            else:
                # (1 - label) * x + (1 + (pw - 1) * label) * log(1 + exp(-x)), stably
                log_w = F.add(F.mul(F.sub(pos_weight, 1.0), label), 1.0)
                loss = F.add(F.mul(F.sub(1.0, label), pred),
                             F.mul(log_w, F.add(_c.softrelu(F, F.neg(F.abs(pred))),
                                                F.relu(F.neg(pred)))))
        else:
            eps = 1e-12
            pos = F.mul(F.log(F.add(pred, eps)), label)
            if pos_weight is not None:
                pos = F.mul(pos, pos_weight)
            loss = F.neg(F.add(pos, F.mul(F.log(F.add(F.sub(1.0, pred), eps)),
                                          F.sub(1.0, label))))
        loss = self._weighting(loss, sample_weight)
        return self._batch_mean(loss)


SigmoidBCELoss = SigmoidBinaryCrossEntropyLoss


class HuberLoss(Loss):
    """Smooth L1: 0.5/rho * d^2 where |d| <= rho, |d| - 0.5 * rho elsewhere."""

    def __init__(self, rho: float = 1, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._rho = float(rho)

    def forward(self, pred, label, sample_weight=None):
        label = _to_float(_reshape_like(label, pred, "HuberLoss"), pred)
        d = F.abs(F.sub(label, pred))
        loss = F.where(F.gt(d, self._rho), F.sub(d, 0.5 * self._rho),
                       F.mul(F.square(d), 0.5 / self._rho))
        loss = self._weighting(loss, sample_weight)
        return self._batch_mean(loss)


class HingeLoss(Loss):
    """max(0, margin - pred * label) for labels in {-1, 1}."""

    def __init__(self, margin: float = 1, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = float(margin)

    def forward(self, pred, label, sample_weight=None):
        label = _to_float(_reshape_like(label, pred, "HingeLoss"), pred)
        loss = F.relu(F.sub(self._margin, F.mul(pred, label)))
        return self._batch_mean(self._weighting(loss, sample_weight))


class LogisticLoss(Loss):
    """log(1 + exp(-pred * label)) for labels in {-1, 1} ('signed') or {0, 1} ('binary')."""

    def __init__(self, weight=None, batch_axis: int = 0, label_format: str = "signed",
                 **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        if label_format not in ("signed", "binary"):
            raise ValueError(f"LogisticLoss: label_format must be 'signed' or 'binary', got "
                             f"{label_format!r}")
        self._label_format = label_format

    def forward(self, pred, label, sample_weight=None):
        label = _to_float(_reshape_like(label, pred, "LogisticLoss"), pred)
        if self._label_format == "binary":
            label = F.sub(F.mul(label, 2.0), 1.0)
        loss = _c.softrelu(F, F.neg(F.mul(pred, label)))
        return self._batch_mean(self._weighting(loss, sample_weight))


class KLDivLoss(Loss):
    """KL(label || softmax(pred)); from_logits=True means pred holds log-probabilities."""

    def __init__(self, from_logits: bool = True, axis: int = -1, weight=None,
                 batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_logits = from_logits
        self._axis = axis

    def forward(self, pred, label, sample_weight=None):
        if not self._from_logits:
            pred = _c.log_softmax(F, pred, self._axis)
        label = _to_float(_reshape_like(label, pred, "KLDivLoss"), pred)
        loss = F.mul(label, F.sub(F.log(F.add(label, 1e-12)), pred))
        return self._batch_mean(self._weighting(loss, sample_weight))
