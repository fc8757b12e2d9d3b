"""Optimizers (``hybrid.optimizer``): SGD, NAG, Adam, AdamW, RMSProp, AdaGrad.

Updates follow MXNet's formulas. Each built-in optimizer writes its rule once, as hybrid
array ops over one parameter (``_rule(weight, grad, state, c)``, results assigned in place
with ``weight[:] = new``), and its per-step scalars separately (``_coefs``: learning rate,
bias corrections...). The same rule runs eagerly (``c`` holds floats) or traced into ONE
compiled update for all parameters of a device (``c`` holds 0-d graph inputs, so a new
learning rate or step count never re-compiles): MXNet's ``use_fused_step``. Every update
first takes ``g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)``; the Trainer
sets ``rescale_grad`` to 1 / batch_size.
"""
from __future__ import annotations

import functools

import math

from .ndarray import NDArray, clip, sqrt, square, zeros

__all__ = ["Optimizer", "SGD", "NAG", "Adam", "AdamW", "RMSProp", "AdaGrad", "create",
           "register"]

_REGISTRY: dict = {}


def register(cls):
    """Register an optimizer class under its lower-cased name, for ``create('name')``."""
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


def create(name, **kwargs) -> "Optimizer":
    if isinstance(name, Optimizer):
        if kwargs:
            raise ValueError("optimizer_params must be empty when an Optimizer instance is "
                             "given")
        return name
    cls = _REGISTRY.get(str(name).lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return cls(**kwargs)


class Coefs:
    """The per-step scalars of one parameter's update, by name (``c.lr``): floats when eager,
    0-d arrays when fused. ``wd_on`` / ``rescale_on`` are plain booleans either way (they
    decide which ops the rule applies, so they are part of a fused update's cache key)."""

    __slots__ = ("values", "wd_on", "rescale_on")

    def __init__(self, values: dict, wd_on: bool, rescale_on: bool):
        self.values = values
        self.wd_on = wd_on
        self.rescale_on = rescale_on

    def __getattr__(self, name):
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(f"no update coefficient {name!r}") from None


class Optimizer:
    """Base class. Subclasses define ``create_state(index, weight)`` and either
    ``_rule(weight, grad, state, c)`` with ``_coefs(lr, wd, t)`` (fusable: see the module
    docstring) or, simplest, ``_update_one(index, weight, grad, state, lr, wd, t)`` written
    with array ops (always eager).

    learning_rate, lr_scheduler (called with the update count), wd (L2 weight decay),
    clip_gradient, rescale_grad; per-parameter lr_mult / wd_mult come from the Parameters.
    use_fused_step: None or True (default: fused when the rule allows), False (eager).
    """

    _HYPER = ()  # names of float hyper-parameters saved with the trainer's states
    _STATIC = ()  # attributes a fused update bakes in (besides _HYPER)
    _DEFAULT_LR = 0.01

    def __init__(self, learning_rate=None, lr_scheduler=None, wd: float = 0.0,
                 clip_gradient=None, rescale_grad: float = 1.0, begin_num_update: int = 0,
                 multi_precision: bool = False, param_dict=None, use_fused_step=None):
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is not None and learning_rate is not None:
            lr_scheduler.base_lr = float(learning_rate)
            lr_scheduler.warmup_final_lr = float(learning_rate)
        if learning_rate is None:  # a scheduler's base_lr wins over the class default
            learning_rate = lr_scheduler.base_lr if lr_scheduler is not None else \
                self._DEFAULT_LR
        self.lr = float(learning_rate)
        self.wd = float(wd)
        if clip_gradient is not None and clip_gradient <= 0:
            raise ValueError(f"clip_gradient must be positive (or None), got {clip_gradient}")
        self.clip_gradient = clip_gradient
        self.rescale_grad = float(rescale_grad)
        self.begin_num_update = int(begin_num_update)
        self.num_update = int(begin_num_update)
        self._index_update_count: dict = {}
        self.multi_precision = multi_precision
        self.param_dict = param_dict or {}
        self.use_fused_step = use_fused_step

    # ------------------------------------------------------------ learning rate
    @property
    def learning_rate(self) -> float:
        if self.lr_scheduler is not None:
            return self.lr_scheduler(self.num_update)
        return self.lr

    def set_learning_rate(self, lr: float):
        if self.lr_scheduler is not None:
            raise RuntimeError("this optimizer has an lr_scheduler: set_learning_rate can only "
                               "change the rate of an optimizer without one")
        self.lr = float(lr)

    def _count(self, index):
        c = self._index_update_count.get(index, self.begin_num_update) + 1
        self._index_update_count[index] = c
        self.num_update = max(self.num_update, c)
        return c

    def _lr_wd(self, index):
        lr, wd = self.learning_rate, self.wd
        p = self.param_dict.get(index)
        if p is not None:
            lr *= p.lr_mult
            wd *= p.wd_mult
        return lr, wd

    # ------------------------------------------------------------ update
    def create_state(self, index, weight: NDArray):
        return None

    def _grad(self, grad, c):
        g = grad * c.rescale if c.rescale_on else grad
        if self.clip_gradient is not None:
            g = clip(g, -self.clip_gradient, self.clip_gradient)
        return g

    def update(self, index, weights, grads, states):
        """One step for parameter ``index``: ``weights``, ``grads``, ``states`` are lists
        with one entry per device (identical values); each copy gets the same update."""
        t = self._count(index)
        lr, wd = self._lr_wd(index)
        for w, g, s in zip(weights, grads, states):
            self._update_one(index, w, g, s, lr, wd, t)

    def coefficients(self, index, lr, wd, t) -> Coefs:
        """This step's scalars for parameter ``index`` (floats)."""
        return Coefs(self._coefs(lr, wd, t), wd != 0, self.rescale_grad != 1.0)

    def _coefs(self, lr, wd, t) -> dict:
        return {"lr": lr, "wd": wd, "rescale": self.rescale_grad}

    def fusable(self) -> bool:
        """Whether this optimizer's update may run as one compiled step: its rule is written
        with ``_rule`` (not a hand-written ``_update_one``) and fusion is not turned off."""
        return self.use_fused_step is not False and _rule_only(type(self))

    def _update_one(self, index, weight, grad, state, lr, wd, t):
        self._rule(weight, grad, state, self.coefficients(index, lr, wd, t))

    def _rule(self, weight, grad, state, c):
        raise NotImplementedError(f"{type(self).__name__} must implement _rule(weight, grad, "
                                  "state, c) (or _update_one(index, weight, grad, state, lr, "
                                  "wd, t)): the update rule of one parameter")

    def static_key(self) -> tuple:
        """What a compiled update bakes in: the class and every hyper-parameter but the
        per-step scalars (learning rate, rescale, weight decay travel as inputs)."""
        return (type(self).__name__, self.clip_gradient,
                tuple((k, getattr(self, k)) for k in self._HYPER + self._STATIC))

    def hyper(self) -> dict:
        out = {"lr": self.lr, "wd": self.wd, "rescale_grad": self.rescale_grad,
               "clip_gradient": self.clip_gradient}
        out.update({k: getattr(self, k) for k in self._HYPER})
        return out

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyper().items())
        return f"{type(self).__name__}({args})"


def _zeros_like(w):
    return zeros(w.shape, dtype=w.dtype, device=w.device)


@register
class SGD(Optimizer):
    """g += wd * w; with momentum: m = momentum * m - lr * g; w += m. Else w -= lr * g."""

    _HYPER = ("momentum",)

    def __init__(self, learning_rate=None, momentum: float = 0.0, lazy_update=False, **kw):
        super().__init__(learning_rate, **kw)
        self.momentum = float(momentum)

    def create_state(self, index, weight):
        return _zeros_like(weight) if self.momentum else None

    def _coefs(self, lr, wd, t):
        return {"lr": lr, "wd": wd, "rescale": self.rescale_grad,
                "lr_rescale": lr * self.rescale_grad, "lr_wd": lr * wd}

    def _rule(self, weight, grad, state, c):
        if self.clip_gradient is None:  # lr * (rescale * grad + wd * weight), scalars folded
            d = grad * c.lr_rescale
            if c.wd_on:
                d = d + c.lr_wd * weight
        else:
            g = self._grad(grad, c)
            d = c.lr * (g + c.wd * weight) if c.wd_on else c.lr * g
        if state is None:
            weight[:] = weight - d
        else:
            state[:] = self.momentum * state - d
            weight[:] = weight + state


@register
class NAG(Optimizer):
    """Nesterov momentum (MXNet): m = momentum * m - lr * g; w += momentum * m - lr * g."""

    _HYPER = ("momentum",)

    def __init__(self, learning_rate=None, momentum: float = 0.9, **kw):
        super().__init__(learning_rate, **kw)
        self.momentum = float(momentum)

    def create_state(self, index, weight):
        return _zeros_like(weight) if self.momentum else None

    def _rule(self, weight, grad, state, c):
        g = self._grad(grad, c)
        if c.wd_on:
            g = g + c.wd * weight
        if state is None:
            weight[:] = weight - c.lr * g
        else:
            state[:] = self.momentum * state - c.lr * g
            weight[:] = weight + (self.momentum * state - c.lr * g)


@register
class Adam(Optimizer):
    """Adam (MXNet): g += wd * w; m, v moving averages; the bias correction is folded into
    the rate: w -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)."""

    _HYPER = ("beta1", "beta2", "epsilon")
    _DEFAULT_LR = 0.001

    def __init__(self, learning_rate=None, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, lazy_update=False, **kw):
        super().__init__(learning_rate, **kw)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def _coefs(self, lr, wd, t):
        return {"lr_t": lr * math.sqrt(1 - self.beta2 ** t) / (1 - self.beta1 ** t),
                "wd": wd, "rescale": self.rescale_grad}

    def _rule(self, weight, grad, state, c):
        m, v = state
        g = self._grad(grad, c)
        if c.wd_on:
            g = g + c.wd * weight
        m[:] = self.beta1 * m + (1 - self.beta1) * g
        v[:] = self.beta2 * v + (1 - self.beta2) * square(g)
        weight[:] = weight - c.lr_t * m / (sqrt(v) + self.epsilon)


@register
class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter):
    w -= lr * (m_hat / (sqrt(v_hat) + epsilon) + wd * w), with bias-corrected m_hat, v_hat
    (correct_bias=True)."""

    _HYPER = ("beta1", "beta2", "epsilon")
    _DEFAULT_LR = 0.001

    def __init__(self, learning_rate=None, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-6, correct_bias: bool = True, **kw):
        super().__init__(learning_rate, **kw)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.correct_bias = correct_bias

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    _STATIC = ("correct_bias",)

    def _coefs(self, lr, wd, t):
        return {"lr": lr, "wd": wd, "rescale": self.rescale_grad,
                "c1": 1 - self.beta1 ** t if self.correct_bias else 1.0,
                "c2": 1 - self.beta2 ** t if self.correct_bias else 1.0}

    def _rule(self, weight, grad, state, c):
        m, v = state
        g = self._grad(grad, c)
        m[:] = self.beta1 * m + (1 - self.beta1) * g
        v[:] = self.beta2 * v + (1 - self.beta2) * square(g)
        step = (m / c.c1) / (sqrt(v / c.c2) + self.epsilon)
        if c.wd_on:
            step = step + c.wd * weight
        weight[:] = weight - c.lr * step


@register
class RMSProp(Optimizer):
    """RMSProp (MXNet): v = rho * v + (1 - rho) * g^2; w -= lr * g / (sqrt(v) + epsilon).
    centered=True (Graves) also tracks the mean gradient and uses momentum:
    mom = momentum * mom - lr * g / (sqrt(v - mean^2) + epsilon); w += mom."""

    _HYPER = ("rho", "momentum", "epsilon")
    _DEFAULT_LR = 0.001

    def __init__(self, learning_rate=None, rho: float = 0.9, momentum: float = 0.9,
                 epsilon: float = 1e-8, centered: bool = False, clip_weights=None, **kw):
        super().__init__(learning_rate, **kw)
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)
        self.centered = centered
        self.clip_weights = clip_weights

    def create_state(self, index, weight):
        if self.centered:
            return (_zeros_like(weight), _zeros_like(weight), _zeros_like(weight))
        return (_zeros_like(weight),)

    _STATIC = ("centered", "clip_weights")

    def _rule(self, weight, grad, state, c):
        g = self._grad(grad, c)
        if c.wd_on:
            g = g + c.wd * weight
        if not self.centered:
            (v,) = state
            v[:] = self.rho * v + (1 - self.rho) * square(g)
            new = weight - c.lr * g / (sqrt(v) + self.epsilon)
        else:
            v, mean, mom = state
            v[:] = self.rho * v + (1 - self.rho) * square(g)
            mean[:] = self.rho * mean + (1 - self.rho) * g
            mom[:] = self.momentum * mom - c.lr * g / (sqrt(v - square(mean)) + self.epsilon)
            new = weight + mom
        if self.clip_weights:
            new = clip(new, -self.clip_weights, self.clip_weights)
        weight[:] = new


@register
class AdaGrad(Optimizer):
    """AdaGrad: h += g^2; w -= lr * g / (sqrt(h) + epsilon)."""

    _HYPER = ("epsilon",)

    def __init__(self, learning_rate=None, epsilon: float = 1e-6, **kw):
        super().__init__(learning_rate, **kw)
        self.epsilon = float(epsilon)

    def create_state(self, index, weight):
        return (_zeros_like(weight),)

    def _rule(self, weight, grad, state, c):
        (h,) = state
        g = self._grad(grad, c)
        if c.wd_on:
            g = g + c.wd * weight
        h[:] = h + square(g)
        weight[:] = weight - c.lr * g / (sqrt(h) + self.epsilon)


@functools.cache
def _rule_only(cls) -> bool:
    """Whether ``cls`` writes its update as ``_rule`` alone (no hand-written step logic)."""
    return cls._rule is not Optimizer._rule and \
        all(getattr(cls, m) is getattr(Optimizer, m)
            for m in ("_update_one", "update", "coefficients"))
