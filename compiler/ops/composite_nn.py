"""The layers of chapters 5-11 composed from registry primitives (issue 25): convolutions
and pooling of other ranks through the 2-D extern ops, the transposed convolution through
conv2d's data gradient, group normalization and the ELU family of activations.

Written once over an op namespace ``F`` (see composite.py), so eager calls, hybridized
graphs and every backend get them from the primitives, gradients included.
"""
from __future__ import annotations

import math
import numbers

from .composite import mean, sequence_mask, softmax
from .core import normalize_axis, spec_of
from .nn import conv_out_size


def _shape(v):
    return tuple(v.shape)


def ntuple(v, n, name, who):
    """A window attribute (kernel, stride, pad, ...) of ``n`` ints from an int or a
    sequence; ``who`` and ``name`` go into the error for a sequence of another length."""
    out = (int(v),) * n if isinstance(v, numbers.Integral) else tuple(int(a) for a in v)
    if len(out) != n:
        raise ValueError(f"{who}: {name} must be an int or {n} ints, got {v}")
    return out


# ------------------------------------------------------------------- convolution
def convolution(F, x, w, stride=1, pad=0, dilation=1, groups=1):
    """Cross-correlation of (N, C, *spatial) data with (O, C/groups, *kernel) weights, for 1
    or 2 spatial axes. 1-D runs as 2-D over a height of 1."""
    nd = len(_shape(w)) - 2
    if nd == 2:
        return F.conv2d(x, w, stride=ntuple(stride, 2, "stride", "convolution"),
                        pad=ntuple(pad, 2, "pad", "convolution"),
                        dilation=ntuple(dilation, 2, "dilate", "convolution"), groups=groups)
    if nd != 1:
        raise ValueError(f"convolution: {nd}-d kernels are not supported (1-d and 2-d are)")
    n, c, width = _shape(x)
    o, cg, k = _shape(w)
    y = F.conv2d(F.reshape(x, shape=(n, c, 1, width)), F.reshape(w, shape=(o, cg, 1, k)),
                 stride=(1,) + ntuple(stride, 1, "stride", "convolution"),
                 pad=(0,) + ntuple(pad, 1, "pad", "convolution"),
                 dilation=(1,) + ntuple(dilation, 1, "dilate", "convolution"), groups=groups)
    return F.reshape(y, shape=(n, o, _shape(y)[3]))


def deconvolution(F, x, w, stride=1, pad=0, dilation=1, groups=1, adj=0):
    """The transposed convolution (the gradient of a convolution with respect to its data):
    (N, C_in, *spatial) data, (C_in, C_out/groups, *kernel) weights (MXNet's layout). Each
    output size is (n - 1) * stride - 2 * pad + dilation * (k - 1) + 1 + adj."""
    nd = len(_shape(w)) - 2
    if nd not in (1, 2):
        raise ValueError(f"deconvolution: {nd}-d kernels are not supported (1-d and 2-d are)")
    stride, pad, dilation, adj = (ntuple(v, nd, name, "deconvolution") for v, name in (
        (stride, "stride"), (pad, "pad"), (dilation, "dilate"), (adj, "adj")))
    for a, s, d in zip(adj, stride, dilation):
        if not 0 <= a < max(s, d):
            raise ValueError(f"deconvolution: adj {adj} must be >= 0 and smaller than the "
                             f"stride {stride} or the dilation {dilation}")
    xs, ws = _shape(x), _shape(w)
    if nd == 1:  # as 2-D, over a height of 1
        x = F.reshape(x, shape=(xs[0], xs[1], 1, xs[2]))
        w = F.reshape(w, shape=(ws[0], ws[1], 1, ws[2]))
        stride, pad, dilation, adj = ((1,) + stride, (0,) + pad, (1,) + dilation, (0,) + adj)
    n, cin, *spatial = _shape(x)
    _, cg, *kernel = _shape(w)
    out = tuple((i - 1) * s - 2 * p + d * (k - 1) + 1 + a for i, s, p, d, k, a in zip(
        spatial, stride, pad, dilation, kernel, adj))
    if min(out) <= 0:
        raise ValueError(f"deconvolution: the output would have size {out[nd - 2:]}")
    y = F.conv2d_grad_data(x, w, data_shape=(n, cg * groups) + out, stride=stride, pad=pad,
                           dilation=dilation, groups=groups)
    return F.reshape(y, shape=(n, cg * groups, out[1])) if nd == 1 else y


# ----------------------------------------------------------------------- pooling
def pooling(F, x, pool_type="max", kernel=2, stride=None, pad=0, global_pool=False,
            count_include_pad=True):
    """Max or average pooling over 1, 2 or 3 spatial axes of (N, C, *spatial) data. 1-D runs
    as 2-D over a height of 1; 3-D as 2-D over (H, W) and then over D, which gives the box's
    maximum or average since both are separable (the box's count is the product of each
    axis's count, padding counted or not)."""
    shape = _shape(x)
    nd = len(shape) - 2
    if nd == 2:
        return F.pool2d(x, pool_type=pool_type, kernel=kernel, stride=stride, pad=pad,
                        global_pool=global_pool, count_include_pad=count_include_pad)
    if nd not in (1, 3):
        raise ValueError(f"pooling: data must be (N, C, W), (N, C, H, W) or (N, C, D, H, W), "
                         f"got shape {shape}")
    n, c = shape[:2]
    attrs = dict(pool_type=pool_type, count_include_pad=count_include_pad)
    if global_pool:
        flat = F.reshape(x, shape=(n, c, 1, int(math.prod(shape[2:]))))
        y = F.pool2d(flat, kernel=(1, 1), global_pool=True, **attrs)
        return F.reshape(y, shape=(n, c) + (1,) * nd)
    kernel = ntuple(kernel, nd, "kernel", "pooling")
    stride = kernel if stride is None else ntuple(stride, nd, "stride", "pooling")
    pad = ntuple(pad, nd, "pad", "pooling")
    if nd == 1:
        y = F.pool2d(F.reshape(x, shape=(n, c, 1, shape[2])), kernel=(1,) + kernel,
                     stride=(1,) + stride, pad=(0,) + pad, **attrs)
        return F.reshape(y, shape=(n, c, _shape(y)[3]))
    d, h, w = shape[2:]
    hw = F.pool2d(F.reshape(x, shape=(n, c * d, h, w)), kernel=kernel[1:], stride=stride[1:],
                  pad=pad[1:], **attrs)
    oh, ow = _shape(hw)[2:]
    y = F.pool2d(F.reshape(hw, shape=(n, c, d, oh * ow)), kernel=(kernel[0], 1),
                 stride=(stride[0], 1), pad=(pad[0], 0), **attrs)
    return F.reshape(y, shape=(n, c, conv_out_size(d, kernel[0], stride[0], pad[0], 1), oh, ow))


# ------------------------------------------------------------------ normalization
def group_norm(F, x, gamma, beta, num_groups, eps=1e-5):
    """Normalize each of ``num_groups`` channel groups of (N, C, ...) data over its channels
    and spatial positions, then scale and shift per channel (gamma, beta of shape (C,)).
    ``num_groups`` = C is instance normalization, 1 normalizes each sample as a whole."""
    shape = _shape(x)
    n, c = shape[:2]
    if c % num_groups:
        raise ValueError(f"group_norm: {c} channels do not split into {num_groups} groups")
    g = F.reshape(x, shape=(n, num_groups, -1))
    mu = mean(F, g, axis=2, keepdims=True)
    d = F.sub(g, mu)
    var = mean(F, F.mul(d, d), axis=2, keepdims=True)
    y = F.reshape(F.mul(d, F.rsqrt(F.add(var, float(eps)))), shape=shape)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    return F.add(F.mul(y, F.reshape(gamma, shape=bshape)), F.reshape(beta, shape=bshape))


# -------------------------------------------------------------------- activations
def elu(F, x, alpha=1.0):
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return F.where(F.gt(x, 0.0), x, F.mul(F.expm1(F.minimum(x, 0.0)), float(alpha)))


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def selu(F, x):
    """scale * elu(x, alpha) with the self-normalizing constants of Klambauer et al."""
    return F.mul(elu(F, x, SELU_ALPHA), SELU_SCALE)


def silu(F, x, beta=1.0):
    """x * sigmoid(beta * x) (SiLU; Swish with a beta)."""
    return F.mul(x, F.sigmoid(F.mul(x, float(beta)) if beta != 1.0 else x))


def prelu(F, x, alpha, axis=1):
    """x where x > 0, else alpha * x; alpha one value, or one per channel along ``axis``."""
    shape = _shape(x)
    if _shape(alpha) not in ((), (1,)):
        axis = normalize_axis(axis, len(shape), "prelu")[0]
        alpha = F.reshape(alpha, shape=tuple(n if i == axis else 1 for i, n in enumerate(shape)))
    return F.where(F.gt(x, 0.0), x, F.mul(x, alpha))


# ---------------------------------------------------------------------- attention
def masked_softmax(F, x, valid_lens=None):
    """Softmax over the last axis of (batch, queries, keys) scores, keys at positions >= the
    valid length set to -1e6 first (the book's masked_softmax). ``valid_lens``: (batch,) or
    (batch, queries)."""
    if valid_lens is None:
        return softmax(F, x, axis=-1)
    shape = _shape(x)
    lens = F.reshape(valid_lens, shape=(-1,))
    if len(_shape(valid_lens)) == 1:
        lens = F.reshape(F.broadcast_to(F.reshape(valid_lens, shape=(shape[0], 1)),
                                        shape=(shape[0], shape[1])), shape=(-1,))
    if spec_of(lens).dtype != spec_of(x).dtype:
        lens = F.cast(lens, dtype=spec_of(x).dtype)
    masked = sequence_mask(F, F.reshape(x, shape=(-1, shape[-1])), lens, -1e6, axis=1)
    return F.reshape(softmax(F, masked, axis=-1), shape=shape)
