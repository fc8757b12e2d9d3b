"""The array functions a NumPy user reaches for beyond hybrid/ndarray.py's core, under
NumPy's names and the Array API standard's (NumPy 2 has both: ``arcsin`` is ``asin``).

Each name is one registry op (the inverse trigonometric and hyperbolic functions, atan2,
hypot, copysign) or one composite of registry ops (compiler/ops/composite_numpy.py), so
each records gradients, hybridizes and compiles for every backend. An alias is the same
function object: ``hb.asin is hb.arcsin``.

    import hybrid as hb
    x = hb.array([[3., 1.], [2., 5.]])
    hb.sort(x, axis=-1), hb.einsum("ij,jk->ik", x, x), hb.flip(x, 0), hb.tril(x)
"""
from __future__ import annotations

import numbers

import numpy as _np

from compiler.ops import composite_numpy as _c
from compiler.ops.composite import cumsum as _cumsum
from compiler.ops.core import ALL_DTYPES, dtype_name

from . import _state
from .ndarray import F, NDArray, apply, asarray

# ------------------------------------------------------------------ input handling


def _arr(x, like=None):
    """An array argument: hybrid arrays (traced ones too) pass; NumPy data and lists become
    arrays on ``like``'s device (outside a trace: inside one, data must be arrays)."""
    if isinstance(x, NDArray) or _state.tracing():
        return x
    return asarray(x, device=like.device if isinstance(like, NDArray) else None)


def _operand(x, like=None):
    """An elementwise operand: Python numbers stay weak scalars."""
    if isinstance(x, (numbers.Number, _np.generic)) and not isinstance(x, complex):
        return x
    return _arr(x, like)


def _unary(op, name, doc):
    def fn(x):
        return apply(op, (_arr(x),), {})
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _binary(op, name, doc):
    def fn(x1, x2):
        like = x1 if isinstance(x1, NDArray) else x2
        return apply(op, (_operand(x1, like), _operand(x2, like)), {})
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _on_device(fn):
    """Run a composite on its first array argument's device (its aranges and constants are
    made there)."""
    def run(x, *args, **kw):
        x = _arr(x)
        with x.device:
            return fn(F, x, *args, **kw)
    run.__name__ = run.__qualname__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


# ------------------------------------------------------------------ elementwise
arcsin = _unary("asin", "arcsin", "Inverse sine, elementwise (NaN outside [-1, 1]).")
arccos = _unary("acos", "arccos", "Inverse cosine, elementwise (NaN outside [-1, 1]).")
arctan = _unary("atan", "arctan", "Inverse tangent, elementwise.")
tan = _unary("tan", "tan", "Tangent, elementwise.")
sinh = _unary("sinh", "sinh", "Hyperbolic sine, elementwise.")
cosh = _unary("cosh", "cosh", "Hyperbolic cosine, elementwise.")
arcsinh = _unary("asinh", "arcsinh", "Inverse hyperbolic sine, elementwise.")
arccosh = _unary("acosh", "arccosh", "Inverse hyperbolic cosine (NaN below 1).")
arctanh = _unary("atanh", "arctanh", "Inverse hyperbolic tangent (+-inf at +-1).")
arctan2 = _binary("atan2", "arctan2",
                  "The angle of the point (x2, x1) in [-pi, pi]: atan2(x1, x2), elementwise.")
hypot = _binary("hypot", "hypot", "sqrt(x1**2 + x2**2), elementwise, without overflow.")
copysign = _binary("copysign", "copysign", "|x1| with the sign of x2, elementwise.")
# the Array API standard's spellings: the same functions
asin, acos, atan, atan2 = arcsin, arccos, arctan, arctan2
asinh, acosh, atanh = arcsinh, arccosh, arctanh


def log2(x):
    """Base-2 logarithm: log(x) / ln 2 (an ulp or two from libm's, powers of 2 included)."""
    return _c.log2(F, _arr(x))


def log10(x):
    """Base-10 logarithm: log(x) / ln 10."""
    return _c.log10(F, _arr(x))


def exp2(x):
    return _c.exp2(F, _arr(x))


def logaddexp(x1, x2):
    """log(exp(x1) + exp(x2)) without overflow."""
    like = x1 if isinstance(x1, NDArray) else x2
    return _c.logaddexp(F, _operand(x1, like), _operand(x2, like))


def trunc(x):
    """Round toward zero; integer input is returned as it is (as NumPy 2)."""
    return _c.trunc(F, _arr(x))


fix = trunc


def isnan(x): return _c.isnan(F, _arr(x))
def isinf(x): return _c.isinf(F, _arr(x))
def isfinite(x): return _c.isfinite(F, _arr(x))
def signbit(x): return _c.signbit(F, _arr(x))


def fmod(x1, x2):
    """C's remainder: the sign of x1 (``mod``/``remainder`` take x2's)."""
    like = x1 if isinstance(x1, NDArray) else x2
    return _c.fmod(F, _operand(x1, like), _operand(x2, like))


def remainder(x1, x2):
    """x1 % x2 with the sign of x2, as NumPy's mod."""
    return apply("mod", (_operand(x1, x2), _operand(x2, x1)), {})


def pow(x1, x2):  # noqa: A001 - the Array API's name for power
    return apply("pow", (_operand(x1, x2), _operand(x2, x1)), {})


def reciprocal(x):
    return apply("div", (1.0, _arr(x)), {})


def positive(x):
    return apply("copy", (_arr(x),), {})


def conj(x):
    """The complex conjugate: a copy, since hybrid's dtypes are real."""
    return apply("copy", (_arr(x),), {})


conjugate = conj


def real(x):
    return apply("copy", (_arr(x),), {})


def imag(x):
    """The imaginary part of a real array: zeros of its dtype."""
    x = _arr(x)
    with x.device:
        return apply("full", (), {"shape": tuple(x.shape), "value": 0, "dtype": x._dtype})


def degrees(x):
    return apply("mul", (_arr(x), 180.0 / _np.pi), {})


def radians(x):
    return apply("mul", (_arr(x), _np.pi / 180.0), {})


rad2deg, deg2rad = degrees, radians


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    like = a if isinstance(a, NDArray) else b
    return _c.isclose(F, _operand(a, like), _operand(b, like), rtol, atol, equal_nan)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """Whether every element is close (a sync point: it returns a Python bool)."""
    return bool(all(isclose(a, b, rtol, atol, equal_nan)))


# ------------------------------------------------------------------ reductions
def all(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """True where no element along ``axis`` is 0 (an empty array is all True)."""
    x = _arr(x)
    return apply("sum", (apply("logical_not", (x,), {}),),
                 {"axis": axis, "keepdims": bool(keepdims)}) == 0


def any(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    x = _arr(x)
    return apply("sum", (apply("ne", (x, 0), {}),),
                 {"axis": axis, "keepdims": bool(keepdims)}) > 0


def count_nonzero(x, axis=None, keepdims=False):
    x = _arr(x)
    return apply("sum", (apply("ne", (x, 0), {}),), {"axis": axis, "keepdims": bool(keepdims)})


# ------------------------------------------------------------------ rearranging
flip = _on_device(_c.flip)
roll = _on_device(_c.roll)
moveaxis = _on_device(_c.moveaxis)
tril = _on_device(_c.tril)
triu = _on_device(_c.triu)
diagonal = _on_device(_c.diagonal)
diag = _on_device(_c.diag)
trace = _on_device(_c.trace)
diff = _on_device(_c.diff)
pad = _on_device(_c.pad)


def fliplr(m): return flip(m, 1)
def flipud(m): return flip(m, 0)


def permute_dims(x, axes):
    """The Array API's transpose: ``axes`` is required."""
    return apply("transpose", (_arr(x),), {"axes": tuple(axes)})


def matrix_transpose(x):
    """Swap the last two axes (the Array API's ``x.mT``)."""
    x = _arr(x)
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose: needs 2 or more dimensions, got shape {x.shape}")
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return apply("transpose", (x,), {"axes": axes})


def broadcast_arrays(*arrays):
    arrays = [_arr(a) for a in arrays]
    return list(_c.broadcast_arrays(F, *arrays))


def meshgrid(*xi, indexing="xy"):
    """Coordinate matrices from 1-D arrays ('xy': Cartesian, NumPy's default; 'ij')."""
    xi = [_arr(x) for x in xi]
    return list(_c.meshgrid(F, *xi, indexing=indexing))


def unstack(x, axis=0):
    """The Array API's unstack: a tuple of the slices along ``axis``."""
    return _c.unstack(F, _arr(x), axis)


def astype(x, dtype, copy=True):
    """The Array API's astype function."""
    return _arr(x).astype(dtype, copy=copy)


# ------------------------------------------------------------------ scans
def cumulative_sum(x, axis=None, dtype=None, include_initial=False):
    """The Array API's cumsum; ``include_initial`` starts the result with a 0."""
    x = _arr(x)
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"cumulative_sum: axis is required for an array of {x.ndim} "
                             "dimensions (cumsum flattens; this one does not)")
        axis = 0
    with x.device:
        out = _cumsum(F, x, axis, None if dtype is None else dtype_name(dtype))
        return _c.with_initial(F, out, axis % max(x.ndim, 1), 0) if include_initial else out


def cumprod(x, axis=None, dtype=None):
    """NumPy's cumprod; O(n**2) in the axis length (see composite_numpy.cumprod)."""
    x = _arr(x)
    with x.device:
        return _c.cumprod(F, x, axis, None if dtype is None else dtype_name(dtype))


def cumulative_prod(x, axis=None, dtype=None, include_initial=False):
    x = _arr(x)
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"cumulative_prod: axis is required for an array of {x.ndim} "
                             "dimensions")
        axis = 0
    out = cumprod(x, axis, dtype)
    if include_initial:
        with x.device:
            out = _c.with_initial(F, out, axis % max(x.ndim, 1), 1)
    return out


# ------------------------------------------------------------------ sorting
def argsort(x, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    """Indices that sort ``x`` along ``axis``: stable (ties keep their order), NaN last.
    Counting sort by pairwise comparison: O(n**2) work and memory per row, for the short
    rows models sort (``kind`` is accepted and ignored; ``order`` is for structured
    arrays, which hybrid has not)."""
    if order is not None:
        raise ValueError("argsort: order= sorts structured arrays, which hybrid has not")
    x = _arr(x)
    if axis is None:
        x, axis = x.reshape((-1,)), 0
    with x.device:
        return _c.argsort(F, x, axis, descending)


def sort(x, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    """A sorted copy of ``x`` along ``axis`` (NaN last); gradients flow to the entries the
    values came from. O(n**2) per row, as argsort."""
    if order is not None:
        raise ValueError("sort: order= sorts structured arrays, which hybrid has not")
    x = _arr(x)
    if axis is None:
        x, axis = x.reshape((-1,)), 0
    with x.device:
        return _c.sort(F, x, axis, descending)


def take_along_axis(arr, indices, axis):
    arr = _arr(arr)
    if axis is None:
        arr, axis = arr.reshape((-1,)), 0
    with arr.device:
        return _c.take_along_axis(F, arr, _arr(indices, arr), axis)


def searchsorted(a, v, side="left", sorter=None):
    """Insertion points of ``v`` in the sorted 1-D ``a`` (int64)."""
    a = _arr(a)
    if sorter is not None:
        a = take_along_axis(a, _arr(sorter, a), 0)
    v = _operand(v, a)
    if not isinstance(v, NDArray):
        v = asarray(v, dtype=a.dtype, device=a.device)
    return _c.searchsorted(F, a, v, side)


# ------------------------------------------------------------------ contractions
def outer(a, b):
    a = _arr(a)
    return _c.outer(F, a, _arr(b, a))


def tensordot(a, b, axes=2):
    """Sum products over ``axes`` (an int: the last n of a with the first n of b; or a pair
    of axis lists), by one matmul."""
    a = _arr(a)
    return _c.tensordot(F, a, _arr(b, a), axes)


def vecdot(x1, x2, axis=-1):
    x1 = _arr(x1)
    return _c.vecdot(F, x1, _arr(x2, x1), axis)


def einsum(subscripts, *operands):
    """NumPy's einsum: explicit or implicit output, '...', repeated labels for diagonals;
    pairs contract left to right, each by one batched matmul."""
    if not isinstance(subscripts, str):
        raise TypeError("einsum: the first argument must be the subscripts string, e.g. "
                        "einsum('ij,jk->ik', a, b) (the interleaved form is not supported)")
    if not operands:
        raise ValueError("einsum: give at least one operand")
    first = _arr(operands[0])
    ops = [first] + [_arr(o, first) for o in operands[1:]]
    with first.device:
        return _c.einsum(F, subscripts, *ops)


# ------------------------------------------------------------------ dtypes
def _dtype_of(x):
    """A dtype name from a dtype, a dtype name, or an array."""
    if isinstance(x, NDArray):
        return x._dtype
    if hasattr(x, "dtype") and not isinstance(x, type):
        return dtype_name(x.dtype)
    return dtype_name(x)


def can_cast(from_, to, casting="safe") -> bool:
    """Whether ``from_`` (a dtype or an array) converts to dtype ``to`` under ``casting``
    ('safe' by default: no value is lost)."""
    return bool(_np.can_cast(_dtype_of(from_), _dtype_of(to), casting))


def result_type(*arrays_and_dtypes):
    """The dtype NumPy's promotion gives (Python scalars stay weak), as a NumPy dtype."""
    from compiler.ops.core import result_dtype  # noqa: PLC0415 - one promotion rule

    args = [a if isinstance(a, (NDArray, bool, int, float)) else _np.empty(0, _dtype_of(a))
            for a in arrays_and_dtypes]
    return _np.dtype(result_dtype(*args))


_KINDS = {"bool": ("bool",), "signed integer": ("int8", "int32", "int64"),
          "unsigned integer": ("uint8",), "integral": ("int8", "uint8", "int32", "int64"),
          "real floating": ("float16", "float32", "float64"), "complex floating": (),
          "numeric": ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")}


def isdtype(dtype, kind) -> bool:
    """The Array API's isdtype: ``kind`` is a dtype, one of 'bool', 'signed integer',
    'unsigned integer', 'integral', 'real floating', 'complex floating', 'numeric', or a
    tuple of those."""
    name = _dtype_of(dtype)
    if isinstance(kind, tuple):
        return _any_true(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str) and kind in _KINDS:
        return name in _KINDS[kind]
    if isinstance(kind, str) and kind not in ALL_DTYPES:
        raise ValueError(f"isdtype: unknown kind {kind!r}; use a dtype or one of "
                         f"{sorted(_KINDS)}")
    return name == _dtype_of(kind)


def _any_true(it):  # the builtin any, which this module's any() shadows
    for v in it:
        if v:
            return True
    return False


def finfo(dtype):
    """Machine limits of a float dtype (or a float array's), NumPy's finfo object."""
    name = _dtype_of(dtype)
    if not name.startswith("float"):
        raise ValueError(f"finfo: {name} is not a float dtype (use iinfo for integers)")
    return _np.finfo(name)


def iinfo(dtype):
    """Limits of an integer dtype (or an integer array's), NumPy's iinfo object."""
    name = _dtype_of(dtype)
    if name not in ("int8", "uint8", "int32", "int64"):
        raise ValueError(f"iinfo: {name} is not an integer dtype (use finfo for floats)")
    return _np.iinfo(name)


__all__ = [  # noqa: RUF022 - grouped as the module is
    "arcsin", "arccos", "arctan", "arctan2", "tan", "sinh", "cosh", "arcsinh", "arccosh",
    "arctanh", "asin", "acos", "atan", "atan2", "asinh", "acosh", "atanh", "hypot",
    "copysign", "log2", "log10", "exp2", "logaddexp", "trunc", "fix", "isnan", "isinf",
    "isfinite", "signbit", "fmod", "remainder", "pow", "reciprocal", "positive", "degrees",
    "radians", "rad2deg", "deg2rad", "isclose", "allclose", "all", "any", "count_nonzero",
    "flip", "fliplr", "flipud", "roll", "moveaxis", "tril", "triu", "diagonal", "diag",
    "trace", "diff", "pad", "permute_dims", "matrix_transpose", "broadcast_arrays",
    "meshgrid", "unstack", "astype", "cumulative_sum", "cumprod", "cumulative_prod",
    "argsort", "sort", "take_along_axis", "searchsorted", "outer", "tensordot",
    "vecdot", "einsum", "can_cast", "result_type", "isdtype", "finfo", "iinfo", "conj",
    "conjugate", "real", "imag",
]
