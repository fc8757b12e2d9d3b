"""``hybrid.linalg`` (the book's ``np.linalg``): norms composed from registry ops, so they
record gradients and hybridize like any other NumPy-named function."""
from __future__ import annotations

import math
import numbers

from compiler.ops.core import normalize_axis

from . import ndarray as _nd

__all__ = ["norm"]


def norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002 - NumPy's keyword
    """NumPy's ``linalg.norm``: the 2-norm of the flattened array by default; vector norms
    (``ord`` a number, ``inf``, ``-inf`` or 0) along one axis; the Frobenius, 1, -1, inf and
    -inf norms of matrices (a 2-d array, or two axes). The spectral and nuclear norms need
    an SVD, which hybrid does not have: they are refused. Integer input gives float32."""
    if not isinstance(x, _nd.NDArray):
        x = _nd.asarray(x)
    if not x._dtype.startswith("float"):
        x = x.astype("float32")
    nd = x.ndim
    if axis is None:
        if ord is None:  # NumPy: the flattened 2-norm, whatever the rank
            return _keep(_nd.sqrt(_nd.sum(x * x)), nd, keepdims)
        if nd not in (1, 2):
            raise ValueError(f"norm: ord={ord!r} needs a 1-d or 2-d array or axis=, got "
                             f"{nd} dimensions")
        axis = tuple(range(nd))
    axes = normalize_axis(axis, nd, "norm")
    if isinstance(axis, numbers.Integral) or len(axes) == 1:
        return _vector_norm(x, ord, axes[0], keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, tuple(normalize_axis(a, nd)[0] for a in axis), keepdims)
    raise ValueError(f"norm: axis must name one or two axes, got {axis!r}")


def _keep(out, nd, keepdims):
    return out.reshape((1,) * nd) if keepdims else out


def _vector_norm(x, ord, axis, keepdims):
    a = abs(x)
    if ord is None or ord == 2:
        return _nd.sqrt(_nd.sum(x * x, axis=axis, keepdims=keepdims))
    if ord == math.inf:
        return _nd.max(a, axis=axis, keepdims=keepdims)
    if ord == -math.inf:
        return _nd.min(a, axis=axis, keepdims=keepdims)
    if ord == 0:  # the count of nonzero entries
        return _nd.sum((x != 0).astype(x._dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return _nd.sum(a, axis=axis, keepdims=keepdims)
    if isinstance(ord, str):
        raise ValueError(f"norm: ord={ord!r} is a matrix norm; a vector takes a number")
    p = float(ord)
    return _nd.sum(a ** p, axis=axis, keepdims=keepdims) ** (1.0 / p)


def _matrix_norm(x, ord, axes, keepdims):
    row, col = axes
    if ord is None or ord == "fro":
        return _nd.sqrt(_nd.sum(x * x, axis=axes, keepdims=keepdims))
    if ord in (2, -2, "nuc"):
        raise NotImplementedError(f"norm: ord={ord!r} of a matrix needs singular values, and "
                                  "hybrid has no SVD; use numpy.linalg.norm(x.asnumpy(), "
                                  f"ord={ord!r}) (no gradient)")
    if ord in (1, -1):  # the largest (smallest) column sum: sum over rows first
        inner, outer = row, col
    elif ord in (math.inf, -math.inf):  # the largest (smallest) row sum
        inner, outer = col, row
    else:
        raise ValueError(f"norm: invalid ord {ord!r} for a matrix (None, 'fro', 1, -1, inf, "
                         "-inf)")
    sums = _nd.sum(abs(x), axis=inner, keepdims=True)
    pick = _nd.max if ord in (1, math.inf) else _nd.min
    out = pick(sums, axis=outer, keepdims=True)
    if keepdims:
        return out
    return out.reshape(tuple(n for i, n in enumerate(out.shape) if i not in axes))
