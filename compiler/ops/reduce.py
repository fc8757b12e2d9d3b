"""Reductions: sum, max, min, prod, argmax, argmin (``axis``, ``keepdims``).

``scalar`` of a reduction is ``(combine, identity)``: how code generators accumulate.
"""
from __future__ import annotations

import numpy as np

from .composite import reduced_shape
from .core import OpError, Spec, check_dtype, normalize_axis, register


def _check_reduce_attrs(name, axis, keepdims):
    """axis: None, an int or a sequence of ints; keepdims: a bool (not merely truthy), so a
    graph read from JSON cannot carry attributes the eager kernels would choke on."""
    axes = () if axis is None else (axis,) if not isinstance(axis, (tuple, list)) else axis
    if any(isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer))
           for a in axes):
        raise OpError(f"{name}: axis must be None, an int or a sequence of ints, got {axis!r}")
    if not isinstance(keepdims, (bool, np.bool_, int, np.integer)):
        raise OpError(f"{name}: keepdims must be a bool, got {keepdims!r}")


def _reduce_infer(name, allowed, out_dtype=None):
    def infer(x, axis=None, keepdims=False):
        _check_reduce_attrs(name, axis, keepdims)
        check_dtype(name, "x", x.dtype, allowed)
        normalize_axis(axis, x.ndim, name)
        dt = out_dtype or x.dtype
        if name in ("sum", "prod") and x.dtype in ("bool", "int8", "uint8", "int32"):
            dt = "int64"  # NumPy's accumulator for small integers
        if name in ("max", "min") and x.size == 0 and (axis is None or any(
                x.shape[a] == 0 for a in normalize_axis(axis, x.ndim))):
            raise OpError(f"{name}: zero-size array to reduction operation {name} which has "
                          "no identity")
        return Spec(reduced_shape(x.shape, axis, keepdims), dt)
    return infer


def _axis_arg(axis):
    return None if axis is None else (axis if isinstance(axis, int) else tuple(axis))


def _keep(F, x, out, axis, keepdims):
    """``out`` reshaped to keepdims form and broadcast to x's shape."""
    kshape = reduced_shape(tuple(x.shape), axis, True)
    return F.broadcast_to(F.reshape(out, shape=kshape), shape=tuple(x.shape))


def _sum_grad(F, i, out, g, axis=None, keepdims=False):
    return (_keep(F, i[0], g, axis, keepdims),)


def _extreme_grad(F, i, out, g, axis=None, keepdims=False):
    x = i[0]
    mask = F.cast(F.eq(x, _keep(F, x, out, axis, keepdims)), dtype=x.dtype)
    ties = F.sum(mask, axis=axis, keepdims=True)  # ties share the gradient, as in PyTorch
    share = F.div(F.reshape(g, shape=reduced_shape(tuple(x.shape), axis, True)), ties)
    return (F.mul(mask, F.broadcast_to(share, shape=tuple(x.shape))),)


def _prod_grad(F, i, out, g, axis=None, keepdims=False):
    """d prod / d x_i is the product of the other entries: out / x_i where no entry is 0; at
    a lone zero, the product of the nonzero entries; 0 elsewhere (never 0 / 0)."""
    x = i[0]
    shape = tuple(x.shape)
    is0 = F.eq(x, 0)
    safe = F.where(is0, 1, x)
    rest = F.broadcast_to(F.prod(safe, axis=axis, keepdims=True), shape=shape)
    zeros = F.broadcast_to(F.sum(is0, axis=axis, keepdims=True), shape=shape)
    d = F.where(is0, F.where(F.eq(zeros, 1), rest, 0.0),
                F.where(F.eq(zeros, 0), F.div(rest, safe), 0.0))
    return (F.mul(_keep(F, x, g, axis, keepdims), d),)


def _np_reduce(fname):
    def impl(xp, x, axis=None, keepdims=False):
        return getattr(xp, fname)(x, axis=_axis_arg(axis), keepdims=keepdims)
    return impl


register("sum", "reduce", infer=_reduce_infer("sum", "all"), impl=_np_reduce("sum"),
         grad=_sum_grad, scalar=(lambda b, acc, x: b.add(acc, x), 0),
         attrs=("axis", "keepdims"))
register("prod", "reduce", infer=_reduce_infer("prod", "numeric"), impl=_np_reduce("prod"),
         dtypes="numeric",
         grad=_prod_grad, scalar=(lambda b, acc, x: b.mul(acc, x), 1),
         attrs=("axis", "keepdims"))
register("max", "reduce", infer=_reduce_infer("max", "numeric"), impl=_np_reduce("max"),
         dtypes="numeric",
         grad=_extreme_grad, scalar=(lambda b, acc, x: b.max(acc, x), "-inf"),
         attrs=("axis", "keepdims"))
register("min", "reduce", infer=_reduce_infer("min", "numeric"), impl=_np_reduce("min"),
         dtypes="numeric",
         grad=_extreme_grad, scalar=(lambda b, acc, x: b.min(acc, x), "inf"),
         attrs=("axis", "keepdims"))


def _arg_infer(name):
    def infer(x, axis=None, keepdims=False):
        _check_reduce_attrs(name, axis, keepdims)
        check_dtype(name, "x", x.dtype, "numeric")
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise OpError(f"{name}: axis must be an int or None, got {axis!r}")
        if axis is not None:
            normalize_axis(axis, x.ndim, name)
        if x.size == 0:
            raise OpError(f"{name}: attempt to get {name} of an empty sequence")
        if axis is None:
            return Spec((1,) * x.ndim if keepdims else (), "int64")
        return Spec(reduced_shape(x.shape, axis, keepdims), "int64")
    return infer


def _arg_impl(fname):
    def impl(xp, x, axis=None, keepdims=False):
        out = getattr(xp, fname)(x, axis=axis)
        if keepdims:
            out = xp.expand_dims(out, axis) if axis is not None else out.reshape((1,) * x.ndim)
        return out.astype("int64", copy=False)
    return impl


register("argmax", "reduce", infer=_arg_infer("argmax"), impl=_arg_impl("argmax"),
         dtypes="numeric", attrs=("axis", "keepdims"),
         doc="index of the first maximum (int64, no gradient)")
register("argmin", "reduce", infer=_arg_infer("argmin"), impl=_arg_impl("argmin"),
         dtypes="numeric", attrs=("axis", "keepdims"),
         doc="index of the first minimum (int64, no gradient)")
