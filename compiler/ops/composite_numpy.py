"""NumPy's and the Array API's array functions, composed from registry primitives over ``F``.

Like composite.py: gradients and code generation (LLVM, CUDA) come from the primitives, so
each function below hybridizes as it runs eagerly. The front end's names for them live in
hybrid/numpy_ops.py. Shapes are static here (they are part of every graph's key), so the
Python loops over axes below unroll at trace time.
"""
from __future__ import annotations

import math
import numbers
import string

from .composite import expand_dims, scan_operand, swapaxes
from .core import FLOAT_DTYPES, INT_DTYPES, broadcast_shapes, normalize_axis, spec_of

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _shape(v):
    return tuple(v.shape)


def _dt(v):
    return spec_of(v).dtype


def _axis(axis, nd, who):
    return normalize_axis(axis, nd, who)[0]


def _cut(F, x, axis, lo, hi, step=1):
    """x[..., lo:hi:step, ...] along one axis (Python slice semantics)."""
    nd = len(_shape(x))
    begin, end, steps = [0] * nd, list(_shape(x)), [1] * nd
    begin[axis], end[axis], steps[axis] = lo, hi, step
    return F.slice(x, begin=tuple(begin), end=tuple(end), step=tuple(steps))


def _positions(F, n, axis, nd, dtype="int64"):
    """0..n-1 laid along ``axis`` of an nd-d array of ones elsewhere."""
    pos = F.arange(start=0, stop=n, step=1, dtype=dtype)
    return F.reshape(pos, shape=tuple(n if i == axis else 1 for i in range(nd)))


# ------------------------------------------------------------------ elementwise
def log2(F, x):
    """log(x) / ln 2: within an ulp or two of libm's log2 (not always exact at powers of 2)."""
    return F.mul(F.log(x), 1.0 / _LN2)


def log10(F, x):
    return F.mul(F.log(x), 1.0 / _LN10)


def exp2(F, x):
    return F.exp(F.mul(x, _LN2))


def logaddexp(F, x, y):
    """log(exp(x) + exp(y)) without overflow: max + log1p(exp(-|x - y|)); equal arguments
    (infinities included) give x + ln 2, as NumPy's npy_logaddexp. Integers compute in
    float32."""
    x, y = (F.cast(v, dtype="float32") if hasattr(v, "shape") and _dt(v) not in FLOAT_DTYPES
            else v for v in (x, y))
    m = F.maximum(x, y)
    same = F.eq(x, y)
    d = F.sub(F.where(same, 0.0, x), F.where(same, 0.0, y))  # never inf - inf
    r = F.add(m, F.log1p(F.exp(F.neg(F.abs(d)))))
    return F.where(same, F.add(m, _LN2), r)


def trunc(F, x):
    """Round toward 0. Integers and bools are returned as they are (NumPy 2 keeps them)."""
    if _dt(x) not in FLOAT_DTYPES:
        return F.copy(x)
    return F.where(F.lt(x, 0), F.ceil(x), F.floor(x))


def isnan(F, x):
    if _dt(x) not in FLOAT_DTYPES:
        return F.full(shape=_shape(x), value=False, dtype="bool")
    return F.ne(x, x)


def isinf(F, x):
    if _dt(x) not in FLOAT_DTYPES:
        return F.full(shape=_shape(x), value=False, dtype="bool")
    return F.eq(F.abs(x), float("inf"))


def isfinite(F, x):
    if _dt(x) not in FLOAT_DTYPES:
        return F.full(shape=_shape(x), value=True, dtype="bool")
    return F.lt(F.abs(x), float("inf"))  # False for NaN: an unordered compare


def signbit(F, x):
    """True where the sign bit is set: -0.0 and negative NaNs included."""
    if _dt(x) not in FLOAT_DTYPES:
        return F.lt(x, 0) if _dt(x) != "bool" else F.full(shape=_shape(x), value=False,
                                                            dtype="bool")
    return F.lt(F.copysign(1.0, x), 0.0)


def fmod(F, x, y):
    """C's fmod: the remainder with the sign of x (``mod`` takes the sign of y)."""
    r = F.mod(x, y)
    wrong = F.logical_and(F.ne(r, 0), F.ne(F.lt(r, 0), F.lt(x, 0)))
    return F.where(wrong, F.sub(r, y), r)


def isclose(F, a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """NumPy's isclose: |a - b| <= atol + rtol * |b|; infinities close only to themselves."""
    same = F.eq(a, b)
    d = F.sub(F.where(same, 0, a), F.where(same, 0, b))  # never inf - inf
    close = F.le(F.abs(d), F.add(F.mul(F.abs(b), rtol), atol))
    out = F.logical_or(F.eq(a, b), F.logical_and(close, F.logical_and(isfinite(F, a),
                                                                       isfinite(F, b))))
    if equal_nan:
        out = F.logical_or(out, F.logical_and(isnan(F, a), isnan(F, b)))
    return out


# ------------------------------------------------------------------ rearranging
def flip(F, x, axis=None):
    """Reverse the order along ``axis`` (all axes by default): a slice with step -1."""
    nd = len(_shape(x))
    axes = normalize_axis(axis, nd, "flip")
    shape = _shape(x)
    begin = tuple(shape[i] - 1 if i in axes else 0 for i in range(nd))
    end = tuple(-shape[i] - 1 if i in axes else shape[i] for i in range(nd))
    step = tuple(-1 if i in axes else 1 for i in range(nd))
    return F.slice(x, begin=begin, end=end, step=step)


def roll(F, x, shift, axis=None):
    """NumPy's roll: the last ``shift`` entries along ``axis`` come first (two slices joined);
    ``axis=None`` rolls the flattened array and restores the shape."""
    if axis is None:
        flat = F.reshape(x, shape=(int(math.prod(_shape(x))),))
        return F.reshape(roll(F, flat, shift, 0), shape=_shape(x))
    shifts = (shift,) if isinstance(shift, numbers.Integral) else tuple(shift)
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    if len(shifts) == 1 and len(axes) > 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: shift {shift!r} and axis {axis!r} must have the same length")
    nd = len(_shape(x))
    for s, a in zip(shifts, axes):
        a = _axis(a, nd, "roll")
        n = _shape(x)[a]
        s = int(s) % n if n else 0
        if s:
            x = F.concatenate(_cut(F, x, a, n - s, n), _cut(F, x, a, 0, n - s), axis=a)
    return x


def moveaxis(F, x, source, destination):
    nd = len(_shape(x))
    src = (source,) if isinstance(source, numbers.Integral) else tuple(source)
    dst = (destination,) if isinstance(destination, numbers.Integral) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError(f"moveaxis: source {source!r} and destination {destination!r} must "
                         "name the same number of axes")
    src = [_axis(a, nd, "moveaxis") for a in src]
    dst = [_axis(a, nd, "moveaxis") for a in dst]
    order = [a for a in range(nd) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return F.transpose(x, axes=tuple(order))


def _tri_mask(F, shape, k, lower):
    """Over the last two axes: True where column - row <= k (lower) or >= k (upper)."""
    n, m = shape[-2], shape[-1]
    rows = F.reshape(F.arange(start=0, stop=n, step=1, dtype="int64"), shape=(n, 1))
    cols = F.reshape(F.arange(start=-int(k), stop=m - int(k), step=1, dtype="int64"),
                     shape=(1, m))
    return F.ge(rows, cols) if lower else F.le(rows, cols)


def _tri(F, x, k, lower, who):
    if len(_shape(x)) < 2:
        raise ValueError(f"{who}: needs an array of 2 or more dimensions, got shape "
                         f"{_shape(x)} (the triangle is over the last two axes)")
    zero = False if _dt(x) == "bool" else 0
    return F.where(_tri_mask(F, _shape(x), k, lower), x, zero)


def tril(F, x, k=0):
    return _tri(F, x, k, True, "tril")


def triu(F, x, k=0):
    return _tri(F, x, k, False, "triu")


def diagonal(F, x, offset=0, axis1=0, axis2=1):
    """NumPy's diagonal: the diagonal of the (axis1, axis2) planes as the last axis. Masked
    and summed (O(n * m) work per plane), so the gradient flows back into the diagonal."""
    nd = len(_shape(x))
    if nd < 2:
        raise ValueError(f"diagonal: needs 2 or more dimensions, got shape {_shape(x)}")
    a1, a2 = _axis(axis1, nd, "diagonal"), _axis(axis2, nd, "diagonal")
    if a1 == a2:
        raise ValueError(f"diagonal: axis1 and axis2 must differ, both are {a1}")
    rest = [a for a in range(nd) if a not in (a1, a2)]
    x = F.transpose(x, axes=tuple(rest) + (a1, a2))
    n, m = _shape(x)[-2:]
    k = int(offset)
    length = max(0, min(n, m - k) if k >= 0 else min(n + k, m))
    r0, c0 = (0, k) if k >= 0 else (-k, 0)
    x = _cut(F, _cut(F, x, nd - 2, r0, r0 + length), nd - 1, c0, c0 + length)
    eye = _tri_mask(F, (length, length), 0, True)
    eye = F.logical_and(eye, _tri_mask(F, (length, length), 0, False))
    zero = False if _dt(x) == "bool" else 0
    picked = F.where(eye, x, zero)
    if _dt(x) == "bool":
        return F.gt(F.sum(picked, axis=-1, keepdims=False), 0)
    out = F.sum(picked, axis=-1, keepdims=False)
    return F.cast(out, dtype=_dt(x)) if _dt(out) != _dt(x) else out


def diag(F, v, k=0):
    """NumPy's diag: a 1-D ``v`` becomes a square matrix with ``v`` on diagonal ``k``; a 2-D
    ``v`` gives its diagonal ``k``."""
    nd = len(_shape(v))
    if nd == 2:
        return diagonal(F, v, k, 0, 1)
    if nd != 1:
        raise ValueError(f"diag: v must be 1-D or 2-D, got shape {_shape(v)}")
    n = _shape(v)[0] + abs(int(k))
    mask = F.logical_and(_tri_mask(F, (n, n), k, True), _tri_mask(F, (n, n), k, False))
    # row i holds v[i] (k >= 0) or column j holds v[j] (k < 0): pad v to length n first
    pad = abs(int(k))
    full = F.concatenate(v, F.full(shape=(pad,), value=0, dtype=_dt(v)), axis=0) if pad \
        else v
    line = F.reshape(full, shape=(n, 1) if k >= 0 else (1, n))
    zero = False if _dt(v) == "bool" else 0
    return F.where(mask, F.broadcast_to(line, shape=(n, n)), zero)


def trace(F, x, offset=0, axis1=0, axis2=1, dtype=None):
    d = diagonal(F, x, offset, axis1, axis2)
    out = F.sum(d, axis=-1, keepdims=False)
    return F.cast(out, dtype=dtype) if dtype is not None and _dt(out) != dtype else out


# ------------------------------------------------------------------ broadcasting
def broadcast_arrays(F, *xs):
    shape = broadcast_shapes(*[_shape(x) for x in xs], op="broadcast_arrays")
    return [x if _shape(x) == shape else F.broadcast_to(x, shape=shape) for x in xs]


def meshgrid(F, *xs, indexing="xy"):
    """Coordinate arrays from 1-D vectors; 'xy' (NumPy's default) swaps the first two
    output axes, 'ij' keeps matrix order."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    for i, x in enumerate(xs):
        if len(_shape(x)) != 1:
            raise ValueError(f"meshgrid: argument {i} must be 1-D, got shape {_shape(x)}")
    sizes = [_shape(x)[0] for x in xs]
    nd = len(xs)
    order = list(range(nd))
    if indexing == "xy" and nd >= 2:
        order[0], order[1] = 1, 0  # x varies along columns, y along rows
    shape = tuple(sizes[order[i]] for i in range(nd))
    out = []
    for i, x in enumerate(xs):
        place = order.index(i)
        v = F.reshape(x, shape=tuple(sizes[i] if a == place else 1 for a in range(nd)))
        out.append(F.broadcast_to(v, shape=shape))
    return out


def unstack(F, x, axis=0):
    nd = len(_shape(x))
    if nd == 0:
        raise ValueError("unstack: needs an array of 1 or more dimensions, got a 0-d array")
    axis = _axis(axis, nd, "unstack")
    keep = tuple(n for i, n in enumerate(_shape(x)) if i != axis)
    return tuple(F.reshape(_cut(F, x, axis, i, i + 1), shape=keep)
                 for i in range(_shape(x)[axis]))


def diff(F, x, n=1, axis=-1):
    nd = len(_shape(x))
    axis = _axis(axis, nd, "diff")
    for _ in range(int(n)):
        m = _shape(x)[axis]
        hi, lo = _cut(F, x, axis, 1, m), _cut(F, x, axis, 0, max(m - 1, 0))
        x = F.ne(hi, lo) if _dt(x) == "bool" else F.sub(hi, lo)
    return x


# ------------------------------------------------------------------ padding
_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad(F, x, pad_width, mode="constant", constant_values=0):
    """NumPy's pad for modes constant, edge, reflect, symmetric and wrap: per axis, the
    pieces before and after are slices of x (or constants) joined by concatenate."""
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode {mode!r} is not supported; use one of {_PAD_MODES}")
    nd = len(_shape(x))
    widths = _pad_widths(pad_width, nd)
    for a, (before, after) in enumerate(widths):
        n = _shape(x)[a]
        if before == after == 0:
            continue
        if mode != "constant" and n == 0:
            raise ValueError(f"pad: mode {mode!r} cannot pad axis {a} of length 0")
        if mode == "reflect" and n == 1:
            x = _pad_one(F, x, a, before, after, "edge", constant_values)
            continue
        x = _pad_one(F, x, a, before, after, mode, constant_values)
    return x


def _pad_widths(pad_width, nd):
    if isinstance(pad_width, numbers.Integral):
        pw = ((int(pad_width), int(pad_width)),) * nd
    else:
        pw = tuple(pad_width)
        if pw and isinstance(pw[0], numbers.Integral):
            pw = (tuple(pw),) if len(pw) == 2 else ((int(pw[0]), int(pw[0])),)
        if len(pw) == 1:
            pw = pw * nd
    pairs = []
    for p in pw:
        p = (p, p) if isinstance(p, numbers.Integral) else tuple(p)
        pairs.append((int(p[0]), int(p[-1])) if len(p) in (1, 2) else (-1, -1))
    pw = tuple(pairs)
    if len(pw) != nd or any(b < 0 or a < 0 for b, a in pw):
        raise ValueError(f"pad: pad_width {pad_width!r} must give non-negative (before, after) "
                         f"widths for each of the {nd} axes")
    return pw


def _pad_piece(F, x, a, width, side, mode, value):
    n = _shape(x)[a]
    if mode == "constant":
        shape = tuple(width if i == a else s for i, s in enumerate(_shape(x)))
        return F.full(shape=shape, value=value, dtype=_dt(x))
    if mode == "edge":
        edge = _cut(F, x, a, 0, 1) if side == "before" else _cut(F, x, a, n - 1, n)
        shape = tuple(width if i == a else s for i, s in enumerate(_shape(x)))
        return F.broadcast_to(edge, shape=shape)
    if mode == "wrap":
        reps = [x] * (width // n) + ([] if width % n == 0 else
                                     [_cut(F, x, a, n - width % n, n) if side == "before"
                                      else _cut(F, x, a, 0, width % n)])
        if side == "before":
            reps = reps[-1:] + reps[:-1] if width % n else reps
        return reps[0] if len(reps) == 1 else F.concatenate(*reps, axis=a)
    # reflect (edge not repeated) and symmetric (edge repeated), one period at a time
    period = n - 1 if mode == "reflect" else n
    skip = 1 if mode == "reflect" else 0
    pieces, left = [], width
    cur = x
    while left > 0:
        take = min(left, period)
        m = _shape(cur)[a]
        if side == "before":
            piece = flip(F, _cut(F, cur, a, skip, skip + take), (a,))
            pieces.insert(0, piece)
        else:
            piece = flip(F, _cut(F, cur, a, m - skip - take, m - skip), (a,))
            pieces.append(piece)
        left -= take
        if left > 0:  # the next period reflects the padded array itself, as NumPy does
            cur = F.concatenate(*pieces, x, axis=a) if side == "before" else \
                F.concatenate(x, *pieces, axis=a)
    return pieces[0] if len(pieces) == 1 else F.concatenate(*pieces, axis=a)


def _pad_one(F, x, a, before, after, mode, value):
    parts = []
    if before:
        parts.append(_pad_piece(F, x, a, before, "before", mode, value))
    parts.append(x)
    if after:
        parts.append(_pad_piece(F, x, a, after, "after", mode, value))
    return F.concatenate(*parts, axis=a)


# ------------------------------------------------------------------ scans
def cumprod(F, x, axis=None, dtype=None):
    """NumPy's cumprod as a product over a masked copy: out[i] = prod(x[j] for j <= i) along
    the axis, from an (..., n, n) array, so O(n**2) work and memory; fine for the short axes
    it is used on. Gradients come from the prod primitive (zeros included)."""
    x, axis, dt = scan_operand(F, x, axis, dtype, "cumprod")
    nd = len(_shape(x))
    if nd == 0:
        return F.reshape(x, shape=(1,))
    x = swapaxes(F, x, axis, -1) if axis != nd - 1 else x
    n = _shape(x)[-1]
    j = F.reshape(F.arange(start=0, stop=n, step=1, dtype="int64"), shape=(1, n))
    i = F.reshape(F.arange(start=0, stop=n, step=1, dtype="int64"), shape=(n, 1))
    rows = F.where(F.le(j, i), expand_dims(F, x, -2), 1)  # (..., i, j): x[j] for j <= i
    out = F.prod(rows, axis=-1, keepdims=False)
    if _dt(out) != dt:
        out = F.cast(out, dtype=dt)
    return swapaxes(F, out, axis, -1) if axis != nd - 1 else out


def with_initial(F, out, axis, initial):
    """Array API's include_initial: ``initial`` (0 or 1) before the first entry."""
    shape = tuple(1 if i == axis else s for i, s in enumerate(_shape(out)))
    return F.concatenate(F.full(shape=shape, value=initial, dtype=_dt(out)), out, axis=axis)


# ------------------------------------------------------------------ sorting
def take_along_axis(F, x, indices, axis):
    """NumPy's take_along_axis: out[..., k, ...] = x[..., indices[..., k, ...], ...].

    Each of the m picks reads a broadcast (..., m, n) view of x, so the work is O(m * n)
    per row; negative indices count from the end as in NumPy."""
    nd = len(_shape(x))
    if len(_shape(indices)) != nd:
        raise ValueError(f"take_along_axis: indices must have x's {nd} dimensions, got shape "
                         f"{_shape(indices)} for x of shape {_shape(x)}")
    if _dt(indices) not in INT_DTYPES:
        raise TypeError(f"take_along_axis: indices must be integers, got {_dt(indices)}")
    axis = _axis(axis, nd, "take_along_axis")
    n = _shape(x)[axis]
    if _dt(indices) != "int64":
        indices = F.cast(indices, dtype="int64")
    indices = F.where(F.lt(indices, 0), F.add(indices, n), indices)
    xl = swapaxes(F, x, axis, -1) if axis != nd - 1 else x
    il = swapaxes(F, indices, axis, -1) if axis != nd - 1 else indices
    m = _shape(il)[-1]
    lead = broadcast_shapes(_shape(xl)[:-1], _shape(il)[:-1], op="take_along_axis")
    xb = F.broadcast_to(expand_dims(F, xl, -2), shape=lead + (m, n))
    if _shape(il) != lead + (m,):
        il = F.broadcast_to(il, shape=lead + (m,))
    out = F.pick(xb, il, axis=-1, keepdims=False)
    return swapaxes(F, out, axis, -1) if axis != nd - 1 else out


def argsort(F, x, axis=-1, descending=False):
    """A stable argsort by counting: the rank of x[i] is the number of x[j] that sort
    before it (smaller, or equal with j < i; NaN sorts last ascending, first descending),
    and position k holds the i whose rank is k. O(n**2) comparisons and memory per row
    (an (n, n) table): fine for the few hundred entries of a row one sorts in a model, far
    too much for a 10**5-long axis."""
    nd = len(_shape(x))
    if nd == 0:
        return F.full(shape=(), value=0, dtype="int64")
    axis = _axis(axis, nd, "argsort")
    if _dt(x) == "bool":
        x = F.cast(x, dtype="int8")
    xl = swapaxes(F, x, axis, -1) if axis != nd - 1 else x
    n = _shape(xl)[-1]
    xi = expand_dims(F, xl, -1)  # (..., i, 1)
    xj = expand_dims(F, xl, -2)  # (..., 1, j)
    first = F.gt if descending else F.lt
    before = first(xj, xi)
    ties = F.eq(xj, xi)
    if _dt(x) in FLOAT_DTYPES:  # NaN after every number (before, descending), ties among NaNs
        nan_i, nan_j = F.ne(xi, xi), F.ne(xj, xj)
        ordered_nan = F.logical_and(nan_i, F.logical_not(nan_j)) if not descending else \
            F.logical_and(nan_j, F.logical_not(nan_i))
        before = F.logical_or(before, ordered_nan)
        ties = F.logical_or(ties, F.logical_and(nan_i, nan_j))
    i = F.reshape(F.arange(start=0, stop=n, step=1, dtype="int64"), shape=(n, 1))
    j = F.reshape(F.arange(start=0, stop=n, step=1, dtype="int64"), shape=(1, n))
    before = F.logical_or(before, F.logical_and(ties, F.lt(j, i)))
    rank = F.sum(before, axis=-1, keepdims=False)  # (..., i), int64
    hit = F.eq(expand_dims(F, rank, -2), i)  # (..., k, i): rank[i] == k
    order = F.sum(F.where(hit, j, 0), axis=-1, keepdims=False)
    return swapaxes(F, order, axis, -1) if axis != nd - 1 else order


def sort(F, x, axis=-1, descending=False):
    """The values of x in argsort's order (the gradient goes back to where each came from)."""
    if len(_shape(x)) == 0:
        return F.copy(x)
    return take_along_axis(F, x, argsort(F, x, axis, descending), axis)


def searchsorted(F, a, v, side="left"):
    """Where each v would go in the sorted 1-D ``a``: how many entries of a are < v
    ('left') or <= v ('right'). O(len(a)) work per value."""
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if len(_shape(a)) != 1:
        raise ValueError(f"searchsorted: a must be 1-D, got shape {_shape(a)}")
    cmp = F.lt if side == "left" else F.le
    vv = expand_dims(F, v, -1) if len(_shape(v)) else F.reshape(v, shape=(1,))
    out = F.sum(cmp(a, vv), axis=-1, keepdims=False)
    return F.reshape(out, shape=()) if not len(_shape(v)) else out


# ------------------------------------------------------------------ contractions
def outer(F, a, b):
    a = F.reshape(a, shape=(int(math.prod(_shape(a))), 1))
    b = F.reshape(b, shape=(1, int(math.prod(_shape(b)))))
    return F.mul(a, b)


def _as_matrix(F, x, lead_axes, tail_axes):
    """x transposed to lead_axes + tail_axes and reshaped to (prod(lead), prod(tail))."""
    s = _shape(x)
    order = tuple(lead_axes) + tuple(tail_axes)
    if order != tuple(range(len(s))):
        x = F.transpose(x, axes=order)
    rows = int(math.prod(s[a] for a in lead_axes))
    cols = int(math.prod(s[a] for a in tail_axes))
    return F.reshape(x, shape=(rows, cols))


def tensordot(F, a, b, axes=2):
    """NumPy's tensordot: contract ``axes`` of a with those of b by one matmul."""
    na, nb = len(_shape(a)), len(_shape(b))
    if isinstance(axes, numbers.Integral):
        k = int(axes)
        if k < 0 or k > min(na, nb):
            raise ValueError(f"tensordot: axes={k} needs 0..{min(na, nb)} for shapes "
                             f"{_shape(a)} and {_shape(b)}")
        ax_a, ax_b = list(range(na - k, na)), list(range(k))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, numbers.Integral) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, numbers.Integral) else list(ax_b)
        if len(ax_a) != len(ax_b):
            raise ValueError(f"tensordot: axes {axes!r} name {len(ax_a)} axes of a and "
                             f"{len(ax_b)} of b; they must pair up")
        ax_a = [_axis(v, na, "tensordot") for v in ax_a]
        ax_b = [_axis(v, nb, "tensordot") for v in ax_b]
    for p, q in zip(ax_a, ax_b):
        if _shape(a)[p] != _shape(b)[q]:
            raise ValueError(f"tensordot: axis {p} of a (length {_shape(a)[p]}) and axis {q} "
                             f"of b (length {_shape(b)[q]}) differ in length")
    free_a = [i for i in range(na) if i not in ax_a]
    free_b = [i for i in range(nb) if i not in ax_b]
    ma = _as_matrix(F, a, free_a, ax_a)
    mb = _as_matrix(F, b, ax_b, free_b)
    out = F.matmul(ma, mb)
    return F.reshape(out, shape=tuple(_shape(a)[i] for i in free_a) +
                     tuple(_shape(b)[i] for i in free_b))


def vecdot(F, a, b, axis=-1):
    """The Array API's vecdot: sum(a * b) along ``axis`` after broadcasting the other axes
    (real dtypes); the summed axis must have one length in both, and the result keeps the
    product's dtype (integers do not widen to int64 as a plain sum does)."""
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        raise ValueError(f"vecdot: needs arrays of 1 or more dimensions, got shapes {sa} "
                         f"and {sb}")
    na, nb = sa[_axis(axis, len(sa), "vecdot")], sb[_axis(axis, len(sb), "vecdot")]
    if na != nb:
        raise ValueError(f"vecdot: axis {axis} has length {na} in x1 and {nb} in x2; the "
                         "summed axis must match (it is not broadcast)")
    p = F.mul(a, b)
    out = F.sum(p, axis=axis, keepdims=False)
    return F.cast(out, dtype=_dt(p)) if _dt(out) != _dt(p) else out


# ------------------------------------------------------------------ einsum
def einsum(F, subscripts, *operands):
    """NumPy's einsum (explicit '->' or implicit output, '...' broadcasting, repeated labels
    in one operand for diagonals). Operands are contracted left to right, each pair by one
    batched matmul over the labels they share; a label no later term needs is summed away
    first. No path optimization: write the order you want."""
    inputs, output = _parse_einsum(subscripts, [_shape(o) for o in operands])
    terms = []
    for labels, x in zip(inputs, operands):
        labels, x = _einsum_diagonals(F, labels, x)
        terms.append((labels, x))
    for t in range(len(terms)):  # sum labels no other term nor the output needs
        labels, x = terms[t]
        others = set(output).union(*[set(lab) for k, (lab, _) in enumerate(terms) if k != t])
        gone = [i for i, c in enumerate(labels) if c not in others]
        if gone:
            x = F.sum(x, axis=tuple(gone), keepdims=False)
            labels = "".join(c for c in labels if c in others)
        terms[t] = (labels, x)
    labels, x = terms[0]
    for k in range(1, len(terms)):
        later = set(output).union(*[set(lab) for lab, _ in terms[k + 1:]])
        labels, x = _einsum_pair(F, labels, x, terms[k][0], terms[k][1], later)
    gone = [i for i, c in enumerate(labels) if c not in output]
    if gone:
        x = F.sum(x, axis=tuple(gone), keepdims=False)
        labels = "".join(c for c in labels if c in output)
    if labels != output:
        x = F.transpose(x, axes=tuple(labels.index(c) for c in output))
    return x


def _parse_einsum(subscripts, shapes):
    spec = subscripts.replace(" ", "")
    if "->" in spec:
        lhs, output = spec.split("->")
    else:
        lhs, output = spec, None
    inputs = lhs.split(",")
    if len(inputs) != len(shapes):
        raise ValueError(f"einsum: {subscripts!r} names {len(inputs)} operands, got "
                         f"{len(shapes)}")
    used = {c for c in spec if c.isalpha()}
    spare = [c for c in string.ascii_letters if c not in used]
    ell_nd = 0
    for term, shape in zip(inputs, shapes):
        if "..." in term:
            ell_nd = max(ell_nd, len(shape) - (len(term) - 3))
    ell = "".join(spare[:ell_nd])
    out_in = []
    for term, shape in zip(inputs, shapes):
        if "..." in term:
            k = len(shape) - (len(term) - 3)
            term = term.replace("...", ell[ell_nd - k:] if k else "")
        if not all(c.isalpha() for c in term):
            raise ValueError(f"einsum: subscripts {subscripts!r} may hold letters, ',', '->' "
                             "and '...' only")
        if len(term) != len(shape):
            raise ValueError(f"einsum: term {term!r} has {len(term)} labels for an operand "
                             f"of shape {shape}")
        out_in.append(term)
    if output is None:  # implicit: labels seen once, alphabetically, after the ellipsis
        counts = {}
        for term in out_in:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        output = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        output = output.replace("...", ell)
    seen = "".join(out_in)
    for c in output:
        if c not in seen:
            raise ValueError(f"einsum: output label {c!r} appears in no operand")
    if len(set(output)) != len(output):
        raise ValueError(f"einsum: output {output!r} repeats a label")
    sizes = {}
    for term, shape in zip(out_in, shapes):
        for c, n in zip(term, shape):
            if sizes.get(c, n) != n and 1 not in (n, sizes[c]):
                raise ValueError(f"einsum: label {c!r} has lengths {sizes[c]} and {n}")
            sizes[c] = max(sizes.get(c, n), n)
    return out_in, output


def _einsum_diagonals(F, labels, x):
    """A label repeated in one operand ('ii') keeps the diagonal of those axes."""
    while len(set(labels)) != len(labels):
        c = next(c for c in labels if labels.count(c) > 1)
        p = labels.index(c)
        q = labels.index(c, p + 1)
        x = diagonal(F, x, 0, p, q)  # the diagonal becomes the last axis
        labels = "".join(v for i, v in enumerate(labels) if i not in (p, q)) + c
    return labels, x


def _einsum_pair(F, la, a, lb, b, later):
    """Contract two terms: batch labels (shared, needed later), summed labels (shared, not
    needed), and each side's own; one matmul of (batch, own_a, sum) by (batch, sum, own_b)."""
    shared = [c for c in la if c in lb]
    batch = [c for c in shared if c in later]
    summed = [c for c in shared if c not in later]
    own_a = [c for c in la if c not in lb]
    own_b = [c for c in lb if c not in la]
    sa, sb = dict(zip(la, _shape(a))), dict(zip(lb, _shape(b)))
    if any(sa[c] != sb[c] for c in shared if 1 not in (sa[c], sb[c])):
        bad = next(c for c in shared if sa[c] != sb[c])
        raise ValueError(f"einsum: label {bad!r} has lengths {sa[bad]} and {sb[bad]}")
    # lengths of 1 broadcast: expand them on the side that has 1
    size = {c: max(sa.get(c, 1), sb.get(c, 1)) for c in set(la) | set(lb)}
    a = _einsum_expand(F, a, la, size, shared)
    b = _einsum_expand(F, b, lb, size, shared)
    nb = int(math.prod(size[c] for c in batch))
    na = int(math.prod(size[c] for c in own_a))
    ns = int(math.prod(size[c] for c in summed))
    nob = int(math.prod(size[c] for c in own_b))
    ta = F.transpose(a, axes=tuple(la.index(c) for c in batch + own_a + summed))
    tb = F.transpose(b, axes=tuple(lb.index(c) for c in batch + summed + own_b))
    ma = F.reshape(ta, shape=(nb, na, ns))
    mb = F.reshape(tb, shape=(nb, ns, nob))
    out = F.matmul(ma, mb)
    labels = "".join(batch + own_a + own_b)
    return labels, F.reshape(out, shape=tuple(size[c] for c in labels))


def _einsum_expand(F, x, labels, size, shared):
    want = tuple(size[c] if c in shared else n for c, n in zip(labels, _shape(x)))
    return x if want == _shape(x) else F.broadcast_to(x, shape=want)

