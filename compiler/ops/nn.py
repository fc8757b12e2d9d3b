"""Neural-network extern ops in NCHW layout: 2-D convolution and pooling, with their
gradient kernels. Batch norm, layer norm, dropout and softmax are composites (composite.py)."""
from __future__ import annotations

import math

import numbers

from .core import OpError, Spec, check_dtype, register


def _pair(v, name, op):
    if isinstance(v, int):
        return (int(v), int(v))  # a bool read from JSON becomes a plain int for the kernels
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise OpError(f"{op}: {name} must be an int or a pair, got {v}")
    return v


def conv_out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _windows(xp, xp_pad, kh, kw, oh, ow, stride, dilation):
    """A strided view (N, C, OH, OW, KH, KW) of a padded NCHW array (no copy)."""
    n, c, _, _ = xp_pad.shape
    sn, sc, sh, sw = xp_pad.strides
    shape = (n, c, oh, ow, kh, kw)
    strides = (sn, sc, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1])
    return xp.lib.stride_tricks.as_strided(xp_pad, shape=shape, strides=strides)


def _pad(xp, x, pad, value=0.0):
    if pad == (0, 0):
        return x
    return xp.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])),
                  constant_values=value)


# ------------------------------------------------------------------- convolution
def _check_window(op, **pairs):
    """stride/dilation/kernel of at least 1 and pad of at least 0 (no division by zero)."""
    for name, v in pairs.items():
        low = 0 if name == "pad" else 1
        if any(a < low for a in v):
            raise OpError(f"{op}: {name} must be >= {low} in each dimension, got {v}")


def _same_dtype(op, *named):
    """Convolutions take operands of one dtype (the kernels read every operand in the
    output's dtype): mixed operands are an error here, the front end promotes them first
    (``npx.convolution``)."""
    (n0, a0), *rest = named
    for n, a in rest:
        if a.dtype != a0.dtype:
            raise OpError(f"{op}: '{n0}' is {a0.dtype} but '{n}' is {a.dtype}: the operands "
                          "must have one dtype (cast one of them first)")


def _conv_params(stride, pad, dilation, op):
    return _pair(stride, "stride", op), _pair(pad, "pad", op), _pair(dilation, "dilation", op)


def _conv_infer(x, w, stride=1, pad=0, dilation=1, groups=1):
    stride, pad, dilation = _conv_params(stride, pad, dilation, "conv2d")
    _check_window("conv2d", stride=stride, pad=pad, dilation=dilation)
    check_dtype("conv2d", "data", x.dtype, "float")
    check_dtype("conv2d", "weight", w.dtype, "float")
    _same_dtype("conv2d", ("data", x), ("weight", w))
    if not isinstance(groups, numbers.Integral) or groups < 1:
        raise OpError(f"conv2d: groups must be a positive int, got {groups!r}")
    if x.ndim != 4 or w.ndim != 4:
        raise OpError(f"conv2d: data must be (N, C, H, W) and weight (O, C/groups, KH, KW), got "
                      f"{x.shape} and {w.shape}")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c % groups or o % groups or cg != c // groups:
        raise OpError(f"conv2d: data has {c} channels and weight {w.shape} with groups={groups}:"
                      f" weight.shape[1] must be C/groups = {c // max(groups, 1)}")
    oh = conv_out_size(h, kh, stride[0], pad[0], dilation[0])
    ow = conv_out_size(wd, kw, stride[1], pad[1], dilation[1])
    if oh <= 0 or ow <= 0:
        raise OpError(f"conv2d: kernel {kh}x{kw} (dilation {dilation}) does not fit the padded "
                      f"input {h + 2 * pad[0]}x{wd + 2 * pad[1]}")
    return Spec((n, o, oh, ow), x.dtype)


def _conv_impl(xp, x, w, stride=1, pad=0, dilation=1, groups=1):
    stride, pad, dilation = _conv_params(stride, pad, dilation, "conv2d")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = conv_out_size(h, kh, stride[0], pad[0], dilation[0])
    ow = conv_out_size(wd, kw, stride[1], pad[1], dilation[1])
    win = _windows(xp, _pad(xp, x, pad), kh, kw, oh, ow, stride, dilation)
    og = o // groups
    outs = []
    for gi in range(groups):
        wg = w[gi * og:(gi + 1) * og]
        wing = win[:, gi * cg:(gi + 1) * cg]
        # im2col + GEMM: (N, OH, OW, C*KH*KW) @ (C*KH*KW, O)
        cols = xp.ascontiguousarray(wing.transpose(0, 2, 3, 1, 4, 5)).reshape(n * oh * ow, -1)
        outs.append((cols @ wg.reshape(og, -1).T).reshape(n, oh, ow, og))
    out = outs[0] if groups == 1 else xp.concatenate(outs, axis=-1)
    return xp.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _conv_grad(F, i, out, g, stride=1, pad=0, dilation=1, groups=1, *, needs=(True, True)):
    x, w = i
    kw = dict(stride=stride, pad=pad, dilation=dilation, groups=groups)
    return (F.conv2d_grad_data(g, w, data_shape=tuple(x.shape), **kw) if needs[0] else None,
            F.conv2d_grad_weight(x, g, weight_shape=tuple(w.shape), **kw) if needs[1] else None)


def _conv_work(g, w):
    """Multiply-adds of a convolution, its data gradient or its weight gradient: every
    output position (g's elements) times a filter's C/groups x KH x KW taps."""
    shape = tuple(w.shape) if isinstance(w, Spec) else tuple(w)  # (a Spec is a tuple too)
    return g.size * math.prod(shape[1:])


register("conv2d", "extern", infer=_conv_infer, impl=_conv_impl, grad=_conv_grad,
         work=lambda out, x, w, **attrs: _conv_work(out, w),
         dtypes="float", attrs=("stride", "pad", "dilation", "groups"),
         doc="2-D cross-correlation, NCHW data and (O, C/groups, KH, KW) weight")


def _grad_data_infer(g, w, data_shape, stride=1, pad=0, dilation=1, groups=1):
    _same_dtype("conv2d_grad_data", ("g", g), ("weight", w))
    return Spec(tuple(data_shape), g.dtype)


def _grad_data_impl(xp, g, w, data_shape, stride=1, pad=0, dilation=1, groups=1):
    stride, pad, dilation = _conv_params(stride, pad, dilation, "conv2d")
    n, c, h, wd = data_shape
    o, cg, kh, kw = w.shape
    _, _, oh, ow = g.shape
    og = o // groups
    dpad = xp.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]), dtype=g.dtype)
    gm = g.transpose(0, 2, 3, 1).reshape(n * oh * ow, o)
    for gi in range(groups):
        wg = w[gi * og:(gi + 1) * og].reshape(og, -1)
        cols = (gm[:, gi * og:(gi + 1) * og] @ wg).reshape(n, oh, ow, cg, kh, kw)
        for a in range(kh):
            for b in range(kw):
                ya, xb = a * dilation[0], b * dilation[1]
                dpad[:, gi * cg:(gi + 1) * cg,
                     ya:ya + stride[0] * (oh - 1) + 1:stride[0],
                     xb:xb + stride[1] * (ow - 1) + 1:stride[1]] += \
                    cols[:, :, :, :, a, b].transpose(0, 3, 1, 2)
    return dpad[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd]


def _grad_data_grad(F, i, out, dy, data_shape, **kw):
    """conv2d_grad_data is also the transposed convolution (Conv2DTranspose): y = W^T g, so
    dg = W dy (a convolution) and dW pairs dy with g as conv2d's weight gradient does."""
    g, w = i
    return (F.conv2d(dy, w, **kw), F.conv2d_grad_weight(dy, g, weight_shape=tuple(w.shape), **kw))


register("conv2d_grad_data", "extern", infer=_grad_data_infer, impl=_grad_data_impl,
         grad=_grad_data_grad, work=lambda out, g, w, **attrs: _conv_work(g, w),
         dtypes="float", attrs=("data_shape", "stride", "pad", "dilation", "groups"),
         doc="gradient of conv2d with respect to its data (col2im of g @ W)")


def _grad_weight_infer(x, g, weight_shape, stride=1, pad=0, dilation=1, groups=1):
    _same_dtype("conv2d_grad_weight", ("data", x), ("g", g))
    return Spec(tuple(weight_shape), g.dtype)


def _grad_weight_impl(xp, x, g, weight_shape, stride=1, pad=0, dilation=1, groups=1):
    stride, pad, dilation = _conv_params(stride, pad, dilation, "conv2d")
    o, cg, kh, kw = weight_shape
    n, _, oh, ow = g.shape
    win = _windows(xp, _pad(xp, x, pad), kh, kw, oh, ow, stride, dilation)
    og = o // groups
    gm = g.transpose(1, 0, 2, 3).reshape(o, -1)
    outs = []
    for gi in range(groups):
        wing = win[:, gi * cg:(gi + 1) * cg]
        cols = xp.ascontiguousarray(wing.transpose(0, 2, 3, 1, 4, 5)).reshape(n * oh * ow, -1)
        outs.append((gm[gi * og:(gi + 1) * og] @ cols).reshape(og, cg, kh, kw))
    return outs[0] if groups == 1 else xp.concatenate(outs, axis=0)


register("conv2d_grad_weight", "extern", infer=_grad_weight_infer, impl=_grad_weight_impl,
         work=lambda out, x, g, weight_shape, **attrs: _conv_work(g, tuple(weight_shape)),
         dtypes="float", attrs=("weight_shape", "stride", "pad", "dilation", "groups"),
         doc="gradient of conv2d with respect to its weight (g @ im2col(x))")


# ----------------------------------------------------------------------- pooling
def _pool_params(x_shape, kernel, stride, pad, global_pool, op="pool2d"):
    if global_pool:
        return tuple(x_shape[2:]), (1, 1), (0, 0)
    kernel = _pair(kernel, "kernel", op)
    stride = _pair(kernel if stride is None else stride, "stride", op)
    return kernel, stride, _pair(pad, "pad", op)


def _pool_infer(x, pool_type="max", kernel=2, stride=None, pad=0, global_pool=False,
                count_include_pad=True):
    if pool_type not in ("max", "avg"):
        raise OpError(f"pool2d: pool_type must be 'max' or 'avg', got {pool_type!r}")
    check_dtype("pool2d", "data", x.dtype, "float")
    if x.ndim != 4:
        raise OpError(f"pool2d: data must be (N, C, H, W), got shape {x.shape}")
    k, s, p = _pool_params(x.shape, kernel, stride, pad, global_pool)
    _check_window("pool2d", kernel=k, stride=s, pad=p)
    oh = conv_out_size(x.shape[2], k[0], s[0], p[0], 1)
    ow = conv_out_size(x.shape[3], k[1], s[1], p[1], 1)
    if oh <= 0 or ow <= 0:
        raise OpError(f"pool2d: window {k} does not fit the input {x.shape[2:]} with pad {p}")
    return Spec(x.shape[:2] + (oh, ow), x.dtype)


def _pool_impl(xp, x, pool_type="max", kernel=2, stride=None, pad=0, global_pool=False,
               count_include_pad=True):
    k, s, p = _pool_params(x.shape, kernel, stride, pad, global_pool)
    oh = conv_out_size(x.shape[2], k[0], s[0], p[0], 1)
    ow = conv_out_size(x.shape[3], k[1], s[1], p[1], 1)
    if global_pool:
        red = x.max(axis=(2, 3), keepdims=True) if pool_type == "max" else \
            x.mean(axis=(2, 3), keepdims=True)
        return red.astype(x.dtype, copy=False)
    fill = -float("inf") if pool_type == "max" else 0.0
    win = _windows(xp, _pad(xp, x, p, fill), k[0], k[1], oh, ow, s, (1, 1))
    if pool_type == "max":
        return win.max(axis=(4, 5))
    total = win.sum(axis=(4, 5), dtype=x.dtype)
    return (total / _pool_counts(xp, x.shape, k, s, p, oh, ow, count_include_pad)).astype(
        x.dtype, copy=False)


def _pool_counts(xp, shape, k, s, p, oh, ow, count_include_pad):
    if count_include_pad or p == (0, 0):
        return float(k[0] * k[1])
    ones = xp.ones((1, 1) + tuple(shape[2:]), dtype="float32")
    win = _windows(xp, _pad(xp, ones, p, 0.0), k[0], k[1], oh, ow, s, (1, 1))
    return win.sum(axis=(4, 5))


def _pool_grad(F, i, out, g, **attrs):
    return (F.pool2d_grad(g, i[0], out, **attrs),)


_POOL_ATTRS = ("pool_type", "kernel", "stride", "pad", "global_pool", "count_include_pad")
register("pool2d", "extern", infer=_pool_infer, impl=_pool_impl, grad=_pool_grad,
         dtypes="float", attrs=_POOL_ATTRS, doc="max or average pooling over 2-D windows")


def _pool_grad_impl(xp, g, x, out, pool_type="max", kernel=2, stride=None, pad=0,
                    global_pool=False, count_include_pad=True):
    k, s, p = _pool_params(x.shape, kernel, stride, pad, global_pool)
    _, _, oh, ow = g.shape
    h, w = x.shape[2:]
    fill = -float("inf") if pool_type == "max" else 0.0
    xpad = _pad(xp, x, p, fill)
    dpad = xp.zeros(xpad.shape, dtype=g.dtype)
    if pool_type == "avg":
        share = g / _pool_counts(xp, x.shape, k, s, p, oh, ow, count_include_pad)
    else:
        taken = xp.zeros(g.shape, dtype=bool)  # the first maximum of a window takes it all
    for a in range(k[0]):
        for b in range(k[1]):
            region = (slice(None), slice(None), slice(a, a + s[0] * (oh - 1) + 1, s[0]),
                      slice(b, b + s[1] * (ow - 1) + 1, s[1]))
            if pool_type == "avg":
                dpad[region] += share
            else:
                hit = (xpad[region] == out) & ~taken
                taken |= hit
                dpad[region] += xp.where(hit, g, 0)
    return dpad[:, :, p[0]:p[0] + h, p[1]:p[1] + w]


register("pool2d_grad", "extern",
         infer=lambda g, x, out, **attrs: Spec(tuple(x.shape), g.dtype), impl=_pool_grad_impl,
         dtypes="float", attrs=_POOL_ATTRS, doc="gradient of pool2d")
