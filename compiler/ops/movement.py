"""Shape and data-movement primitives: reshape, transpose, broadcast_to, slice, concatenate,
gather (take, pick) and their scatter twins, and the sources full and arange."""
from __future__ import annotations

import math
import operator

import numpy as np

from .composite import sum_to
from .core import (INT_RANGE, OpError, Spec, check_dtype, check_int_fits, dtype_name,
                   is_scalar, normalize_axis, register, spec_of)


def _prod(shape):
    return int(math.prod(shape))


def _size(n) -> int:
    """One dimension: an integer, never a float truncated (NumPy refuses ``(2.5, 2)``)."""
    try:
        return operator.index(n)
    except TypeError:
        raise OpError(f"dimensions must be integers, got {n!r} of type "
                      f"{type(n).__name__}") from None


def resolve_shape(shape, size: int, op: str = "reshape") -> tuple:
    """Replace one -1 in ``shape`` so that it holds ``size`` elements."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(map(_size, shape))
    if shape.count(-1) > 1:
        raise OpError(f"{op}: only one dimension may be -1, got {shape}")
    if -1 in shape:
        known = _prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise OpError(f"{op}: cannot reshape {size} elements into {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if any(s < 0 for s in shape) or _prod(shape) != size:
        raise OpError(f"{op}: cannot reshape an array of {size} elements into shape {shape}")
    return shape


# ------------------------------------------------------------------- reshape & co
register("reshape", "movement",
         infer=lambda x, shape: Spec(resolve_shape(shape, x.size), x.dtype),
         impl=lambda xp, x, shape: xp.reshape(x, shape),
         grad=lambda F, i, out, g, shape: (F.reshape(g, shape=tuple(i[0].shape)),),
         attrs=("shape",), doc="x with a new shape of the same size (one -1 allowed)")


def _transpose_infer(x, axes=None):
    if axes is not None and any(not -x.ndim <= int(a) < x.ndim for a in axes):
        raise OpError(f"transpose: axes {tuple(axes)} are out of range for an array of "
                      f"{x.ndim} dimension(s)")
    axes = tuple(reversed(range(x.ndim))) if axes is None else tuple(int(a) % max(x.ndim, 1)
                                                                      for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise OpError(f"transpose: axes {axes} are not a permutation of 0..{x.ndim - 1}")
    return Spec(tuple(x.shape[a] for a in axes), x.dtype)


def _transpose_grad(F, i, out, g, axes=None):
    nd = len(i[0].shape)
    axes = tuple(reversed(range(nd))) if axes is None else tuple(a % nd for a in axes)
    inverse = tuple(int(a) for a in np.argsort(axes))
    return (F.transpose(g, axes=inverse),)


register("transpose", "movement", infer=_transpose_infer,
         # (NumPy's transpose(x) is x.transpose() behind a Python wrapper: ~1 us per call)
         impl=lambda xp, x, axes=None: x.transpose(axes) if type(x) is np.ndarray else
         xp.transpose(x, axes),
         grad=_transpose_grad, attrs=("axes",), doc="permute the axes")


def _broadcast_infer(x, shape):
    shape = tuple(int(s) for s in shape)
    try:
        if tuple(np.broadcast_shapes(x.shape, shape)) != shape:
            raise ValueError
    except ValueError:
        raise OpError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}") from None
    return Spec(shape, x.dtype)


register("broadcast_to", "movement", infer=_broadcast_infer,
         impl=lambda xp, x, shape: xp.broadcast_to(x, shape),
         grad=lambda F, i, out, g, shape: (sum_to(F, g, tuple(i[0].shape)),),
         attrs=("shape",), doc="x repeated along size-1 and new leading axes")


# ------------------------------------------------------------------------- slices
def normalize_slice(shape, begin, end, step):
    """Per-axis (begin, end, step) in Python slice semantics -> canonical tuples."""
    nd = len(shape)
    if not (len(begin) == len(end) == len(step) == nd):
        raise OpError(f"slice: begin/end/step need {nd} entries each, got "
                      f"{len(begin)}/{len(end)}/{len(step)}")
    out = []
    for n, b, e, s in zip(shape, begin, end, step):
        if s == 0:
            raise OpError("slice: step must not be 0")
        out.append(slice(b, e, s).indices(n))
    return tuple(o[0] for o in out), tuple(o[1] for o in out), tuple(o[2] for o in out)


def _slice_shape(shape, begin, end, step):
    b, e, s = normalize_slice(shape, begin, end, step)
    return tuple(len(range(bi, ei, si)) for bi, ei, si in zip(b, e, s))


def _np_key(shape, begin, end, step):
    b, e, s = normalize_slice(shape, begin, end, step)
    return tuple(slice(bi, None if ei < 0 else ei, si) for bi, ei, si in zip(b, e, s))


register("slice", "movement",
         infer=lambda x, begin, end, step: Spec(_slice_shape(x.shape, begin, end, step),
                                                x.dtype),
         impl=lambda xp, x, begin, end, step: x[_np_key(x.shape, begin, end, step)],
         grad=lambda F, i, out, g, begin, end, step: (
             F.slice_scatter(g, shape=tuple(i[0].shape), begin=begin, end=end, step=step),),
         attrs=("begin", "end", "step"), doc="basic slicing x[b0:e0:s0, b1:e1:s1, ...]")


def _slice_scatter_infer(g, shape, begin, end, step):
    want = _slice_shape(tuple(shape), begin, end, step)
    if tuple(g.shape) != want:
        raise OpError(f"slice_scatter: values of shape {g.shape} do not fit the region {want}")
    return Spec(tuple(shape), g.dtype)


def _slice_scatter_impl(xp, g, shape, begin, end, step):
    out = xp.zeros(shape, dtype=g.dtype)
    out[_np_key(tuple(shape), begin, end, step)] = g
    return out


register("slice_scatter", "movement", infer=_slice_scatter_infer, impl=_slice_scatter_impl,
         grad=lambda F, i, out, g, shape, begin, end, step: (
             F.slice(g, begin=begin, end=end, step=step),),
         attrs=("shape", "begin", "end", "step"),
         doc="zeros of `shape` with the region set to g (the gradient of slice)")


def _slice_update_infer(x, v, begin, end, step):
    if x.dtype in INT_RANGE:  # x[i] = 300 on uint8: NumPy's OverflowError, not a wrap-around
        check_int_fits(v, x.dtype)
    region = _slice_shape(x.shape, begin, end, step)
    vshape = () if is_scalar(v) else v.shape
    try:
        if tuple(np.broadcast_shapes(vshape, region)) != region:
            raise ValueError
    except ValueError:
        raise OpError(f"setitem: a value of shape {vshape} cannot be broadcast into the "
                      f"selected region of shape {region}") from None
    return Spec(x.shape, x.dtype)


def _slice_update_impl(xp, x, v, begin, end, step):
    out = xp.array(x, copy=True)
    out[_np_key(x.shape, begin, end, step)] = v
    return out


def _slice_update_grad(F, i, out, g, begin, end, step):
    x, v = i
    gx = F.slice_update(g, 0.0, begin=begin, end=end, step=step)
    gv = None if is_scalar(v) else sum_to(F, F.slice(g, begin=begin, end=end, step=step),
                                          tuple(v.shape))
    return (gx, gv)


register("slice_update", "movement", infer=_slice_update_infer, impl=_slice_update_impl,
         grad=_slice_update_grad, attrs=("begin", "end", "step"),
         doc="a copy of x with x[region] = v (functional setitem)")


def _concat_infer(*xs, axis=0):
    if not xs:
        raise OpError("concatenate: needs at least one array")
    first = xs[0]
    nd = first.ndim
    if nd == 0:
        raise OpError("concatenate: zero-dimensional arrays cannot be concatenated")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise OpError(f"concatenate: axis must be an int, got {axis!r} (hb.concatenate "
                      "flattens the arrays first for axis=None)")
    axis = normalize_axis(axis, nd, "concatenate")[0]
    for k, x in enumerate(xs[1:], 1):
        if x.ndim != nd or any(a != b for d, (a, b) in enumerate(zip(x.shape, first.shape))
                               if d != axis):
            raise OpError(f"concatenate: array {k} has shape {x.shape}, which does not match "
                          f"{first.shape} outside axis {axis}")
    from .core import result_dtype  # noqa: PLC0415 - tiny helper
    dt = result_dtype(*[_Arr(x) for x in xs])
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return Spec(tuple(shape), dt)


class _Arr:
    def __init__(self, spec):
        self.shape, self.dtype = spec.shape, spec.dtype


def _concat_grad(F, xs, out, g, axis=0):
    nd = len(out.shape)
    axis = axis % nd
    grads, start = [], 0
    for x in xs:
        n = x.shape[axis]
        begin = [0] * nd
        end = list(out.shape)
        begin[axis], end[axis] = start, start + n
        grads.append(F.slice(g, begin=tuple(begin), end=tuple(end), step=(1,) * nd))
        start += n
    return tuple(grads)


register("concatenate", "movement", infer=_concat_infer,
         impl=lambda xp, *xs, axis=0: xp.concatenate(xs, axis=axis),
         grad=_concat_grad, attrs=("axis",), doc="join arrays along an existing axis")


# ---------------------------------------------------------------- gather/scatter
def _take_infer(x, indices, axis=0, mode="clip"):
    check_dtype("take", "indices", indices.dtype, "int")
    if mode not in ("clip", "wrap", "raise"):
        raise OpError(f"take: mode must be 'clip', 'wrap' or 'raise', got {mode!r}")
    if not isinstance(axis, (int, np.integer)):
        raise OpError(f"take: axis must be an int, got {axis!r} (reshape to 1-D to take from "
                      "the flattened array)")
    axis = normalize_axis(axis, x.ndim, "take")[0]
    return Spec(x.shape[:axis] + tuple(indices.shape) + x.shape[axis + 1:], x.dtype)


def _take_impl(xp, x, indices, axis=0, mode="clip"):
    if xp.__name__ == "numpy":  # NumPy, or an emulated GPU's (runtime/gpu/emulated.py)
        return np.take(x, indices, axis=axis, mode=mode)
    # CuPy's take has no mode (its indices wrap): clip or check here, with NumPy's meaning
    axis = normalize_axis(axis, x.ndim, "take")[0]
    dim = x.shape[axis]
    if mode == "clip" and dim:
        indices = xp.clip(indices, 0, dim - 1)  # NumPy's clip sends negatives to 0 too
    elif mode == "raise" and indices.size:
        lo, hi = int(indices.min()), int(indices.max())  # a sync: 'raise' needs the values
        if lo < -dim or hi >= dim:
            bad = hi if hi >= dim else lo
            raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {dim}")
    return xp.take(x, indices, axis=axis)


def _take_grad(F, i, out, g, axis=0, mode="clip"):
    x, idx = i
    axis = axis % len(x.shape)
    return (F.take_grad(g, idx, axis=axis, dim=x.shape[axis], mode=mode), None)


register("take", "index", infer=_take_infer, impl=_take_impl, grad=_take_grad,
         attrs=("axis", "mode"), doc="gather slices of x along axis at integer indices")


def _take_grad_infer(g, indices, axis, dim, mode="clip"):
    nidx = indices.ndim
    shape = g.shape[:axis] + (dim,) + g.shape[axis + nidx:]
    return Spec(shape, g.dtype)


def _take_grad_impl(xp, g, indices, axis, dim, mode="clip"):
    nidx = indices.ndim
    if mode in ("wrap", "raise"):  # 'raise': the forward checked [-dim, dim); negative
        idx = xp.mod(indices, dim)   # indices count from the end
    else:
        idx = xp.clip(indices, 0, dim - 1)
    lead = g.shape[:axis]
    rest = g.shape[axis + nidx:]
    out = xp.zeros(lead + (dim,) + rest, dtype=g.dtype)
    # move the gathered axis to the front, then scatter-add rows
    gm = xp.moveaxis(g.reshape(lead + (-1,) + rest), axis, 0)
    om = xp.moveaxis(out, axis, 0)
    if xp.__name__ == "numpy":
        xp.add.at(om, idx.reshape(-1), gm)
    else:
        import cupyx  # noqa: PLC0415 - GPU only
        cupyx.scatter_add(om, idx.reshape(-1), gm)
    return out


register("take_grad", "index", infer=_take_grad_infer, impl=_take_grad_impl,
         grad=lambda F, i, out, g, axis, dim, mode="clip": (
             F.take(g, i[1], axis=axis, mode=mode), None),
         attrs=("axis", "dim", "mode"), doc="scatter-add g into zeros (the gradient of take)")


def _pick_infer(x, index, axis=-1, keepdims=False):
    check_dtype("pick", "index", index.dtype, "int")
    axis = normalize_axis(axis, x.ndim, "pick")[0]
    want = x.shape[:axis] + x.shape[axis + 1:]
    if tuple(index.shape) not in (want, x.shape[:axis] + (1,) + x.shape[axis + 1:]):
        raise OpError(f"pick: index of shape {index.shape} does not match x of shape "
                      f"{x.shape} without axis {axis} (expected {want})")
    shape = x.shape[:axis] + (1,) + x.shape[axis + 1:] if keepdims else want
    return Spec(shape, x.dtype)


def _pick_impl(xp, x, index, axis=-1, keepdims=False):
    axis = axis % x.ndim
    idx = xp.clip(index, 0, x.shape[axis] - 1).reshape(
        x.shape[:axis] + (1,) + x.shape[axis + 1:])
    out = xp.take_along_axis(x, idx, axis=axis)
    return out if keepdims else out.reshape(x.shape[:axis] + x.shape[axis + 1:])


def _pick_grad(F, i, out, g, axis=-1, keepdims=False):
    x, index = i
    nd = len(x.shape)
    axis = axis % nd
    kshape = tuple(x.shape[:axis]) + (1,) + tuple(x.shape[axis + 1:])
    depth = x.shape[axis]
    # positions in int64: in the index's own dtype they would wrap (uint8: 259 is 3)
    positions = F.reshape(F.arange(start=0, stop=depth, step=1, dtype="int64"),
                          shape=tuple(depth if d == axis else 1 for d in range(nd)))
    if spec_of(index).dtype != "int64":
        index = F.cast(index, dtype="int64")
    index = F.clip(index, a_min=0, a_max=depth - 1)  # as the forward pass: out of range clips
    hot = F.eq(F.reshape(index, shape=kshape), positions)
    return (F.where(hot, F.reshape(g, shape=kshape), 0.0), None)


register("pick", "index", infer=_pick_infer, impl=_pick_impl, grad=_pick_grad,
         attrs=("axis", "keepdims"),
         doc="x[..., index, ...] along axis, one element per position (MXNet's pick)")


# ------------------------------------------------------------------------ sources
def _full_infer(shape, value, dtype="float32"):
    shape = tuple(map(_size, shape))
    if any(n < 0 for n in shape):
        raise OpError(f"full: negative dimensions are not allowed, got shape {shape}")
    dt = dtype_name(dtype)
    if isinstance(value, (complex, np.complexfloating)):
        raise OpError(f"full: value {value!r} is complex; no dtype here holds an imaginary part")
    if dt in INT_RANGE:
        check_int_fits(value, dt, "full: value")
    return Spec(shape, dt)


register("full", "source", infer=lambda shape, value, dtype="float32": _full_infer(
             shape, value, dtype),
         impl=lambda xp, shape, value, dtype="float32": xp.full(shape, value, dtype=dtype),
         scalar=lambda b, shape, value, dtype="float32": b.const(value),
         attrs=("shape", "value", "dtype"), doc="an array filled with value")


def _arange_infer(start, stop, step=1, dtype="float32"):
    if step == 0:
        raise OpError("arange: step must not be 0")
    n = max(0, math.ceil((stop - start) / step))
    return Spec((n,), dtype_name(dtype))


register("arange", "source", infer=_arange_infer,
         impl=lambda xp, start, stop, step=1, dtype="float32": xp.arange(
             start, stop, step).astype(dtype),
         scalar=lambda b, start, stop, step=1, dtype="float32": b.add(
             b.const(start), b.mul(b.cast(b.index(), dtype), b.const(step))),
         attrs=("start", "stop", "step", "dtype"), doc="evenly spaced values in [start, stop)")

