"""hybrid under the Array API standard's names and defaults (``x.__array_namespace__()``).

Everything is hybrid.np's one implementation; this module only adapts what the standard
spells or defaults differently from MXNet's np: Python integers make int64 arrays (not
float32), ``arange`` of integers is int64, ``sum``/``prod`` take ``dtype=``, ``var``/``std``
take ``correction=``, and functions take the standard's keywords. The dtypes are hybrid's
(no int16/uint16/uint32/uint64, no complex). The Array API test suite runs against it:
benchmarks/array_api_suite.sh.
"""
from __future__ import annotations

import builtins
import math
from typing import NamedTuple

import numpy as _numpy

from runtime.device import cpu, current_device, gpu, num_gpus

from . import np as _np
from . import numpy_ops as _ops
from .ndarray import NDArray as _NDArray

__array_api_version__ = "2023.12"

_SKIP = {"arange", "asarray", "full", "zeros", "ones", "empty", "linspace", "eye", "sum",
         "prod", "var", "std", "astype", "squeeze", "expand_dims", "reshape", "full_like",
         "ones_like", "zeros_like", "empty_like", "max", "min", "mean", "ndarray", "dtype",
         "finfo", "iinfo", "clip"}
globals().update({k: v for k, v in vars(_np).items()
                  if not k.startswith("_") and k not in _SKIP})

bool = _numpy.bool_  # the standard's dtype names
float32, float64 = _numpy.float32, _numpy.float64
int8, uint8, int32, int64 = _numpy.int8, _numpy.uint8, _numpy.int32, _numpy.int64
e, pi, inf, nan, newaxis = math.e, math.pi, math.inf, math.nan, None


def _default_dtype(obj):
    """The standard's defaults for Python data: bool, int64, float32 (hybrid's float)."""
    if isinstance(obj, (builtins.bool, _numpy.bool_)):
        return "bool"
    if isinstance(obj, (int, _numpy.integer)):
        return "int64"
    if isinstance(obj, (float, _numpy.floating)):
        return "float32"
    if isinstance(obj, (list, tuple)):
        kind = _numpy.asarray(obj).dtype.kind
        return {"b": "bool", "i": "int64", "u": "int64"}.get(kind, "float32")
    return None


def asarray(obj, /, *, dtype=None, device=None, copy=None):
    if isinstance(obj, _NDArray):
        if copy is False and dtype is not None and _np.dtype(dtype) != obj.dtype:
            raise ValueError("asarray: copy=False cannot change the dtype")
        out = obj if dtype is None else obj.astype(dtype, copy=builtins.bool(copy))
        if device is not None:
            out = out.to(device)
        return out.copy() if copy and out is obj else out
    if copy is False and not isinstance(obj, _numpy.ndarray):
        raise ValueError("asarray: copy=False needs an array to share memory with")
    return _np.array(obj, dtype=dtype if dtype is not None else _default_dtype(obj),
                     device=device)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    if dtype is None:
        ints = builtins.all(isinstance(v, int) for v in (start, stop, step) if v is not None)
        dtype = "int64" if ints else "float32"
    return _np.arange(start, stop, step, dtype=dtype, device=device)


def full(shape, fill_value, *, dtype=None, device=None):
    return _np.full(shape, fill_value, dtype=dtype or _default_dtype(fill_value),
                    device=device)


def zeros(shape, *, dtype=None, device=None):
    return _np.zeros(shape, dtype=dtype, device=device)


def ones(shape, *, dtype=None, device=None):
    return _np.ones(shape, dtype=dtype, device=device)


def empty(shape, *, dtype=None, device=None):
    return _np.empty(shape, dtype=dtype, device=device)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    return _np.full(x.shape, fill_value, dtype=dtype or x.dtype, device=device or x.device)


def zeros_like(x, /, *, dtype=None, device=None):
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x, /, *, dtype=None, device=None):
    return full_like(x, 1, dtype=dtype, device=device)


empty_like = zeros_like


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    return _np.eye(n_rows, n_cols, k, dtype=dtype, device=device)


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    return _np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype, device=device)


def astype(x, dtype, /, *, copy=True, device=None):
    out = x.astype(dtype, copy=copy)
    return out.to(device) if device is not None else out


def reshape(x, /, shape, *, copy=None):
    return _np.reshape(x, shape)


def squeeze(x, /, axis):
    return _np.squeeze(x, axis)


def expand_dims(x, /, axis=0):
    if not -x.ndim - 1 <= axis <= x.ndim:  # the standard asks for IndexError here
        raise IndexError(f"expand_dims: axis {axis} is out of range for the result's "
                         f"{x.ndim + 1} dimensions")
    return _np.expand_dims(x, axis)


def _with_dtype(fn):
    def reduce(x, /, *, axis=None, dtype=None, keepdims=False):
        if dtype is not None and dtype != x.dtype:
            x = x.astype(dtype)
        out = fn(x, axis, keepdims=keepdims)
        # an asked-for dtype is the result's (small integers otherwise add up in int64)
        return out if dtype is None or out.dtype == dtype else out.astype(dtype)
    reduce.__name__ = fn.__name__
    return reduce


sum = _with_dtype(_np.sum)
prod = _with_dtype(_np.prod)


def clip(x, /, min=None, max=None):  # the standard's keywords (NumPy's: a_min, a_max)
    return _np.clip(x, min, max)


def max(x, /, *, axis=None, keepdims=False):
    return _np.max(x, axis, keepdims=keepdims)


def min(x, /, *, axis=None, keepdims=False):
    return _np.min(x, axis, keepdims=keepdims)


def mean(x, /, *, axis=None, keepdims=False):
    return _np.mean(x, axis, keepdims=keepdims)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    return _np.var(x, axis, keepdims=keepdims, ddof=correction)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return _np.std(x, axis, keepdims=keepdims, ddof=correction)


def sort(x, /, *, axis=-1, descending=False, stable=True):
    return _ops.sort(x, axis, descending=descending)


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    return _ops.argsort(x, axis, descending=descending)


class _FInfo(NamedTuple):
    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: object


class _IInfo(NamedTuple):
    bits: int
    max: int
    min: int
    dtype: object


def finfo(type, /):  # the standard's parameter name
    """As NumPy's finfo, with Python floats (the standard asks for them)."""
    f = _ops.finfo(type)
    return _FInfo(int(f.bits), float(f.eps), float(f.max), float(f.min),
                  float(f.smallest_normal), f.dtype)


def iinfo(type, /):
    i = _ops.iinfo(type)
    return _IInfo(int(i.bits), int(i.max), int(i.min), i.dtype)


class _Info:
    """``__array_namespace_info__()``: what this namespace supports."""

    def capabilities(self):
        return {"boolean indexing": False, "data-dependent shapes": False,
                "max dimensions": 64}

    def default_device(self):
        return current_device()

    def default_dtypes(self, *, device=None):
        return {"real floating": float32, "complex floating": None, "integral": int64,
                "indexing": int64}

    def dtypes(self, *, device=None, kind=None):
        names = ("bool", "int8", "uint8", "int32", "int64", "float32", "float64")
        out = {n: _numpy.dtype(n) for n in names}
        if kind is None:
            return out
        return {n: d for n, d in out.items() if _ops.isdtype(n, kind)}

    def devices(self):
        return [cpu(0)] + [gpu(i) for i in range(num_gpus())]


def __array_namespace_info__():
    return _Info()
