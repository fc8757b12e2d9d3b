"""Initializers (``hybrid.init``), MXNet's names and defaults.

An initializer fills a parameter's array in place: ``init(desc, arr)``, where ``desc`` is the
parameter's name. Subclasses override ``_init_weight(name, arr)`` (the book writes its own
that way). Random initializers draw from ``hybrid.random``, so ``hb.random.seed`` makes
them deterministic.

    net.initialize(init.Xavier())                 # weights Xavier, biases their own 'zeros'
    nn.Dense(10, weight_initializer=init.Normal(0.01), bias_initializer="zeros")
"""
from __future__ import annotations

import math

import numpy as np

from . import random as _random
from .ndarray import NDArray, array, zeros

__all__ = ["Initializer", "InitDesc", "Uniform", "Normal", "Xavier", "MSRAPrelu", "Constant",
           "Zero", "One", "create", "register"]

_REGISTRY: dict = {}


def register(cls):
    """Register an initializer class under its lower-cased name (for ``create('name')``)."""
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


class InitDesc(str):
    """A parameter's name, with extra attributes (Gluon's InitDesc)."""

    def __new__(cls, name, attrs=None, global_init=None):
        ret = super().__new__(cls, name)
        ret.attrs = attrs or {}
        ret.global_init = global_init
        return ret


class Initializer:
    """Base class: ``init(desc, arr)`` fills ``arr`` in place via ``_init_weight``."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        self._verbose = False

    def set_verbosity(self, verbose: bool = False, print_func=None):
        self._verbose = verbose
        self._print_func = print_func
        return self

    def __call__(self, desc, arr: NDArray):
        if not isinstance(desc, InitDesc):
            desc = InitDesc(str(desc))
        self._init_weight(desc, arr)
        if self._verbose:
            print(f"Initialized {desc} as {self!r}: {tuple(arr.shape)}")

    def _init_weight(self, name, arr):
        raise NotImplementedError(f"{type(self).__name__} must implement _init_weight(name, arr)")

    def dumps(self) -> str:
        import json  # noqa: PLC0415
        return json.dumps([type(self).__name__.lower(), self._kwargs])

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self._kwargs == getattr(other, "_kwargs", None)

    def __hash__(self):
        return hash(type(self))


def _set(arr: NDArray, value):
    arr[...] = value


@register
class Zero(Initializer):
    """All zeros."""

    def _init_weight(self, name, arr):
        _set(arr, 0)


@register
class One(Initializer):
    """All ones."""

    def _init_weight(self, name, arr):
        _set(arr, 1)


@register
class Constant(Initializer):
    """A constant scalar, or an array broadcast to the parameter's shape."""

    def __init__(self, value):
        if isinstance(value, NDArray):
            value = value.asnumpy()
        super().__init__(value=value.tolist() if isinstance(value, np.ndarray) else value)
        self.value = value

    def _init_weight(self, name, arr):
        v = self.value
        if isinstance(v, (np.ndarray, list, tuple)):
            v = np.broadcast_to(np.asarray(v, dtype=arr.dtype), arr.shape)
            _set(arr, array(v, dtype=arr.dtype, device=arr.device))
        else:
            _set(arr, v)

    def __eq__(self, other):
        return type(self) is type(other) and np.array_equal(np.asarray(self.value),
                                                            np.asarray(other.value))

    __hash__ = Initializer.__hash__


@register
class Uniform(Initializer):
    """Uniform on [-scale, scale] (MXNet's default, scale=0.07)."""

    def __init__(self, scale: float = 0.07):
        super().__init__(scale=scale)
        self.scale = float(scale)

    def _init_weight(self, name, arr):
        _set(arr, _random.uniform(-self.scale, self.scale, size=arr.shape,
                                  dtype=_float(arr), device=arr.device))


@register
class Normal(Initializer):
    """Normal with mean 0 and standard deviation ``sigma``."""

    def __init__(self, sigma: float = 0.01):
        super().__init__(sigma=sigma)
        self.sigma = float(sigma)

    def _init_weight(self, name, arr):
        _set(arr, _random.normal(0.0, self.sigma, size=arr.shape, dtype=_float(arr),
                                 device=arr.device))


def _fans(name, shape):
    if len(shape) < 2:
        raise ValueError(f"Xavier-style initializers need a parameter with at least 2 "
                         f"dimensions; '{name}' has shape {tuple(shape)} (give it its own "
                         "initializer, e.g. 'zeros')")
    hw = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * hw, shape[0] * hw


@register
class Xavier(Initializer):
    """Glorot & Bengio: scale = sqrt(magnitude / factor) where factor is the average fan
    ('avg'), fan-in ('in') or fan-out ('out'); uniform on [-scale, scale] or normal(0, scale).
    """

    def __init__(self, rnd_type: str = "uniform", factor_type: str = "avg",
                 magnitude: float = 3):
        if rnd_type not in ("uniform", "gaussian"):
            raise ValueError(f"Xavier: rnd_type must be 'uniform' or 'gaussian', got {rnd_type!r}")
        if factor_type not in ("avg", "in", "out"):
            raise ValueError(f"Xavier: factor_type must be 'avg', 'in' or 'out', got "
                             f"{factor_type!r}")
        super().__init__(rnd_type=rnd_type, factor_type=factor_type, magnitude=magnitude)
        self.rnd_type = rnd_type
        self.factor_type = factor_type
        self.magnitude = float(magnitude)

    def scale(self, name, shape) -> float:
        fan_in, fan_out = _fans(name, shape)
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[
            self.factor_type]
        return math.sqrt(self.magnitude / factor)

    def _init_weight(self, name, arr):
        s = self.scale(name, arr.shape)
        if self.rnd_type == "uniform":
            v = _random.uniform(-s, s, size=arr.shape, dtype=_float(arr), device=arr.device)
        else:
            v = _random.normal(0.0, s, size=arr.shape, dtype=_float(arr), device=arr.device)
        _set(arr, v)


@register
class MSRAPrelu(Xavier):
    """He et al.: Gaussian Xavier with magnitude 2 / (1 + slope^2)."""

    def __init__(self, factor_type: str = "avg", slope: float = 0.25):
        super().__init__("gaussian", factor_type, 2.0 / (1 + slope ** 2))
        self._kwargs = {"factor_type": factor_type, "slope": slope}


_ALIASES = {"zeros": Zero, "zero": Zero, "ones": One, "one": One, "uniform": Uniform,
            "normal": Normal, "gaussian": Normal, "xavier": Xavier, "msraprelu": MSRAPrelu,
            "constant": Constant}


def create(init) -> Initializer:
    """An initializer from an instance, a class, a name ('zeros', 'xavier', ...) or a
    callable ``f(desc, arr)``."""
    if isinstance(init, Initializer):
        return init
    if isinstance(init, type) and issubclass(init, Initializer):
        return init()
    if isinstance(init, str):
        cls = _ALIASES.get(init.lower()) or _REGISTRY.get(init.lower())
        if cls is None:
            raise ValueError(f"unknown initializer {init!r}; known: "
                             f"{', '.join(sorted(set(_ALIASES) | set(_REGISTRY)))}")
        return cls()
    if callable(init):
        return _Callable(init)
    raise TypeError(f"an initializer must be an hb.init.Initializer, a name or a callable, "
                    f"got {type(init).__name__}")


class _Callable(Initializer):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __call__(self, desc, arr):
        self.fn(desc, arr)


def _float(arr) -> str:
    name = arr.dtype.name
    return name if name in ("float16", "float32", "float64") else "float32"


def fill(default_init, init, name: str, shape, dtype: str, device) -> NDArray:
    """A new array of ``shape`` filled by ``init`` (or ``default_init`` when None)."""
    arr = zeros(tuple(shape), dtype=dtype, device=device)
    chosen = create(init if init is not None else default_init)
    glob = create(default_init) if default_init is not None else chosen
    if glob._verbose and not chosen._verbose:
        chosen = _Verbose(chosen)
    chosen(InitDesc(name, {"__init__": chosen}, glob), arr)
    return arr


class _Verbose(Initializer):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self._verbose = True

    def _init_weight(self, name, arr):
        self.inner(name, arr)

    def __repr__(self):
        return repr(self.inner)
