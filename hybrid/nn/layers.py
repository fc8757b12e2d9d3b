"""Gluon's layers: Dense, BatchNorm, Dropout, Flatten, Activation, Embedding, LayerNorm
(convolutions and pooling: conv_layers.py; activations with parameters: activations.py).

Every ``forward`` is written with hybrid ops and ``hybrid.npx`` functions only (no
``asnumpy()``, no Python branching on array values), so layers trace into graphs. Unknown
input sizes (``in_units=0``, ``in_channels=0``) are learned at the first call: the layer tells
its parameters the shape the input implies (``Parameter._finish_deferred_init``).
"""
from __future__ import annotations

import math

from compiler.ops import composite as _c

from .. import npx
from ..ndarray import F, NDArray, eager_linear
from .block import HybridBlock
from .parameter import Parameter

__all__ = ["Dense", "BatchNorm", "Dropout", "Flatten", "Activation", "LeakyReLU", "Embedding",
           "LayerNorm"]

ACTIVATIONS = npx.ACT_TYPES  # npx.activation's table: one list of the names


def _dev(x):
    """The device of an input (None for a traced value without one)."""
    return getattr(x, "device", None)


def _float_input(layer, x, param):
    """A layer computes in its parameters' float dtype. An integer or bool input is refused
    (PyTorch refuses int @ float): NumPy's promotion would run the layer, and every layer
    after it, in float64 (int64 with float32 weights), and a silent cast to the parameter
    dtype would round integers above 2**24 (float32). The caller casts, knowingly."""
    dt = getattr(x, "_dtype", None)
    if dt is not None and not dt.startswith("float"):
        want = param.dtype.name
        raise TypeError(f"{type(layer).__name__} '{layer.name}': the input has dtype {dt}, "
                        f"but the layer computes in {want} (its {param.name}'s dtype); "
                        f"cast the input first: x.astype('{want}')")


def _opt_act(activation):
    return Activation(activation) if activation is not None else None


def _fused_act(act):
    """The op an eager Dense may apply in its own fused call (None: no activation), or
    False: the activation block runs as a block (a composite activation, a hook on it, or
    hybridized on its own)."""
    if act is None:
        return None
    if act._act_type not in ("relu", "sigmoid", "tanh") or act._forward_pre_hooks or \
            act._forward_hooks or act._active:
        return False
    return act._act_type


class Activation(HybridBlock):
    """An elementwise activation: 'relu', 'sigmoid', 'tanh', 'softrelu', 'softsign', 'gelu'
    or 'silu'."""

    def __init__(self, activation: str, **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"Activation: activation must be one of {ACTIVATIONS}, got "
                             f"{activation!r}")
        self._act_type = activation

    def forward(self, x):
        return npx.activation(x, act_type=self._act_type)

    def __repr__(self):
        return f"Activation({self._act_type})"


class LeakyReLU(HybridBlock):
    """max(x, 0) + alpha * min(x, 0)."""

    def __init__(self, alpha: float, **kwargs):
        super().__init__(**kwargs)
        if alpha < 0:
            raise ValueError(f"LeakyReLU: alpha must be >= 0, got {alpha}")
        self._alpha = float(alpha)

    def forward(self, x):
        return F.where(F.gt(x, 0.0), x, F.mul(x, self._alpha))

    def __repr__(self):
        return f"LeakyReLU({self._alpha})"


class Dense(HybridBlock):
    """A fully connected layer: ``activation(x @ weight.T + bias)``.

    weight has shape (units, in_units); ``in_units=0`` is learned from the first input.
    flatten=True flattens inputs to (batch, -1) first; otherwise the last axis is
    transformed.
    """

    def __init__(self, units: int, activation=None, use_bias: bool = True, flatten: bool = True,
                 dtype="float32", weight_initializer=None, bias_initializer="zeros",
                 in_units: int = 0, **kwargs):
        super().__init__(**kwargs)
        if int(units) <= 0:
            raise ValueError(f"Dense: units must be a positive int, got {units!r}")
        self._units = int(units)
        self._flatten = flatten
        self.weight = Parameter("weight", shape=(self._units, in_units), dtype=dtype,
                                init=weight_initializer)
        self.bias = Parameter("bias", shape=(self._units,), dtype=dtype,
                              init=bias_initializer) if use_bias else None
        self.act = _opt_act(activation)

    def forward(self, x):
        weight, bias, shape = self.weight, self.bias, x.shape
        _float_input(self, x, weight)
        if self._flatten:
            in_units = (int(shape[1]) if len(shape) == 2 else int(math.prod(shape[1:]))) \
                if len(shape) > 1 else 1
        else:
            in_units = shape[-1]
        weight._finish_deferred_init((self._units, in_units))
        dev = getattr(x, "device", None)  # None: a traced value without one
        if bias is not None:
            bias = bias.data(dev)
        wd = weight.data(dev)
        act = self.act
        fast = _fused_act(act)
        if fast is not False:  # one eager op for the layer's product, bias and activation
            if self._flatten and len(shape) > 2 and type(x) is NDArray and \
                    x.device.kind == "cpu":
                x = _c.flatten(F, x)  # (as linear() would)
            out = eager_linear(x, wd, bias, fast)
            if out is not None:
                return out
        out = npx.fully_connected(x, wd, bias, no_bias=bias is None, flatten=self._flatten)
        return act(out) if act is not None else out

    def __repr__(self):
        shape = self.weight.shape
        return f"Dense({shape[1] or None} -> {shape[0]}, {self.act if self.act else 'linear'})"


class BatchNorm(HybridBlock):
    """Batch normalization over ``axis`` (the channel axis).

    Training (``autograd.record()``) normalizes with the batch's statistics and updates
    running_mean / running_var in place: running = momentum * running + (1 - momentum) * batch
    (biased batch variance, as MXNet). Prediction uses the running statistics.
    """

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5,
                 center: bool = True, scale: bool = True, use_global_stats: bool = False,
                 beta_initializer="zeros", gamma_initializer="ones",
                 running_mean_initializer="zeros", running_variance_initializer="ones",
                 in_channels: int = 0, dtype="float32", **kwargs):
        super().__init__(**kwargs)
        self._kwargs = {"axis": axis, "eps": epsilon, "momentum": momentum,
                        "fix_gamma": not scale, "use_global_stats": use_global_stats}
        self._axis = axis
        self._eps = float(epsilon)
        self._momentum = float(momentum)
        self._scale = scale
        self._use_global_stats = use_global_stats
        c = (in_channels,)
        self.gamma = Parameter("gamma", shape=c, init=gamma_initializer, dtype=dtype,
                               grad_req="write" if scale else "null", differentiable=scale)
        self.beta = Parameter("beta", shape=c, init=beta_initializer, dtype=dtype,
                              grad_req="write" if center else "null", differentiable=center)
        self.running_mean = Parameter("running_mean", shape=c, init=running_mean_initializer,
                                      dtype=dtype, grad_req="null", differentiable=False)
        self.running_var = Parameter("running_var", shape=c,
                                     init=running_variance_initializer, dtype=dtype,
                                     grad_req="null", differentiable=False)

    def forward(self, x):
        _float_input(self, x, self.gamma)
        c = (x.shape[self._axis],)
        for p in (self.gamma, self.beta, self.running_mean, self.running_var):
            p._finish_deferred_init(c)
        dev = _dev(x)
        return npx.batch_norm(x, self.gamma.data(dev), self.beta.data(dev),
                              self.running_mean.data(dev), self.running_var.data(dev),
                              eps=self._eps, momentum=self._momentum, axis=self._axis,
                              fix_gamma=not self._scale,
                              use_global_stats=self._use_global_stats)

    def __repr__(self):
        content = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"BatchNorm({content}, in_channels={self.gamma.shape[0] or None})"


def scale_shift_params(block, channels, center, scale, beta_initializer, gamma_initializer,
                       dtype):
    """A normalization layer's per-channel ``gamma`` (trained when ``scale``) and ``beta``
    (trained when ``center``); 0 channels: learned at the first input."""
    block._center, block._scale = center, scale
    block.gamma = Parameter("gamma", shape=(channels,), init=gamma_initializer, dtype=dtype,
                            grad_req="write" if scale else "null", differentiable=scale)
    block.beta = Parameter("beta", shape=(channels,), init=beta_initializer, dtype=dtype,
                           grad_req="write" if center else "null", differentiable=center)


def _scale_shift_ready(block, x, channels):
    """Finish gamma's and beta's deferred shapes for ``channels``; the input's device."""
    block.gamma._finish_deferred_init((channels,))
    block.beta._finish_deferred_init((channels,))
    return _dev(x)


class LayerNorm(HybridBlock):
    """Layer normalization over ``axis`` (the last by default)."""

    def __init__(self, axis: int = -1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, beta_initializer="zeros", gamma_initializer="ones",
                 in_channels: int = 0, dtype="float32", **kwargs):
        super().__init__(**kwargs)
        self._axis = axis
        self._eps = float(epsilon)
        scale_shift_params(self, in_channels, center, scale, beta_initializer,
                           gamma_initializer, dtype)

    def forward(self, x):
        _float_input(self, x, self.gamma)
        dev = _scale_shift_ready(self, x, x.shape[self._axis])
        return npx.layer_norm(x, self.gamma.data(dev), self.beta.data(dev), axis=self._axis,
                              eps=self._eps)

    def __repr__(self):
        return (f"LayerNorm(axis={self._axis}, eps={self._eps}, center={self._center}, "
                f"scale={self._scale}, in_channels={self.gamma.shape[0] or None})")


class Dropout(HybridBlock):
    """Zero each element with probability ``rate`` while training (scaled by 1/(1-rate));
    the identity in prediction."""

    def __init__(self, rate: float, axes=(), **kwargs):
        super().__init__(**kwargs)
        if not 0 <= rate < 1:
            raise ValueError(f"Dropout: rate must be in [0, 1), got {rate}")
        if axes:
            raise ValueError("Dropout: axes (a shared mask along some axes) is not supported")
        self._rate = float(rate)
        self._axes = tuple(axes)

    def forward(self, x):
        return npx.dropout(x, p=self._rate)

    def __repr__(self):
        return f"Dropout(p = {self._rate}, axes={self._axes})"


class Flatten(HybridBlock):
    """(N, d1, d2, ...) -> (N, d1 * d2 * ...)."""

    def forward(self, x):
        return _c.flatten(F, x)

    def __repr__(self):
        return "Flatten"


class Embedding(HybridBlock):
    """Rows of a (input_dim, output_dim) table at integer indices."""

    def __init__(self, input_dim: int, output_dim: int, dtype="float32",
                 weight_initializer=None, sparse_grad: bool = False, **kwargs):
        super().__init__(**kwargs)
        if sparse_grad:
            raise ValueError("Embedding: sparse_grad=True is not supported")
        self._input_dim, self._output_dim = int(input_dim), int(output_dim)
        self._dtype = dtype
        self.weight = Parameter("weight", shape=(self._input_dim, self._output_dim),
                                dtype=dtype, init=weight_initializer)

    def forward(self, x):
        return npx.embedding(x, self.weight.data(_dev(x)), self._input_dim, self._output_dim)

    def __repr__(self):
        return f"Embedding({self._input_dim} -> {self._output_dim}, {self.weight._dtype})"
