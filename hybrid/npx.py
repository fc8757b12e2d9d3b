"""Functional neural-network ops with MXNet's ``npx`` names and keywords (the book's 12.5
LeNet uses them). Each is a thin name over registry ops, so it hybridizes.

The book's other ``npx`` names are here too, as aliases of the one implementation: devices
(``npx.cpu``, ``npx.gpu``, ``npx.num_gpus``: whatever ``hybrid.cpu`` ... are), ``waitall``,
``stop_gradient``, array files (``save``/``load``) and ``set_np`` (see docs/book.md)."""
from __future__ import annotations

import math
import sys

import numpy as np

from compiler.ops import composite as _c
from compiler.ops import composite_nn as _c_nn

from . import _state
from .checkpoint import load_arrays as _load_arrays, save  # noqa: F401 - npx.save
from .control_flow import cond, foreach, while_loop  # noqa: F401 - npx.foreach, ...
from .ndarray import F, NDArray, apply, pick, one_hot, stop_gradient, waitall  # noqa: F401

# Device names are hybrid's own (hybrid/__init__.py decides what ``hybrid.num_gpus`` is);
# looked up at use, so this module never holds a second copy of them.
_DEVICE_NAMES = ("cpu", "gpu", "num_gpus", "current_device")


def __getattr__(name):
    if name in _DEVICE_NAMES:
        return getattr(sys.modules["hybrid"], name)
    if name == "current_context":
        return sys.modules["hybrid"].current_device
    raise AttributeError(f"module 'hybrid.npx' has no attribute {name!r}")


def set_np(shape=True, array=True, dtype=False):
    """MXNet's switch to NumPy semantics. hybrid has no other semantics, so this changes
    nothing; it exists so the book's ``npx.set_np()`` runs. ``dtype=True`` (MXNet's float64
    defaults, as in NumPy) is refused: hybrid's defaults stay float32 (docs/book.md)."""
    if dtype:
        raise ValueError("npx.set_np(dtype=True): hybrid keeps MXNet's float32 defaults "
                         "(np.arange, np.array of Python data, ...); pass dtype= to the "
                         "functions that should make float64 arrays")
    if not (shape and array):
        raise ValueError("npx.set_np(shape=False / array=False): the legacy (non-NumPy) "
                         "array semantics of MXNet 1.x are not part of hybrid")


def reset_np():
    """MXNet's way back to legacy semantics; hybrid has only NumPy's (nothing to reset)."""


def is_np_array() -> bool:
    return True


def is_np_shape() -> bool:
    return True


def load(fname):
    """Arrays saved by ``npx.save``, as MXNet returns them: a dict for a saved dict, else a
    list (one saved array comes back as a list of one, as the book prints it)."""
    out = _load_arrays(fname)
    return [out] if isinstance(out, NDArray) else out


def relu(data): return apply("relu", (data,), {})
def sigmoid(data): return apply("sigmoid", (data,), {})
def softmax(data, axis=-1, temperature=None): return _c.softmax(F, data, axis, temperature)
def log_softmax(data, axis=-1): return _c.log_softmax(F, data, axis)


_ACTIVATIONS = {
    "relu": lambda x: apply("relu", (x,), {}),
    "sigmoid": lambda x: apply("sigmoid", (x,), {}),
    "tanh": lambda x: apply("tanh", (x,), {}),
    "softrelu": lambda x: _c.softrelu(F, x),
    "softsign": lambda x: x / (abs(x) + 1),
    "gelu": lambda x: _c.gelu(F, x),
    "silu": lambda x: silu(x),
}
ACT_TYPES = tuple(_ACTIVATIONS)  # the act_type names (nn.Activation takes these)


def silu(data, beta=1.0):
    """x * sigmoid(beta * x) (SiLU; Swish for other beta)."""
    return _c_nn.silu(F, data, beta)


def leaky_relu(data, gamma=None, act_type="leaky", slope=0.25):
    """MXNet's LeakyReLU family: 'leaky' (slope * x below 0), 'prelu' (gamma * x below 0,
    gamma one value or one per channel), 'elu' (slope * (exp(x) - 1) below 0), 'selu' and
    'gelu'."""
    if act_type == "leaky":
        return F.where(F.gt(data, 0.0), data, F.mul(data, float(slope)))
    if act_type == "prelu":
        if gamma is None:
            raise ValueError("leaky_relu: act_type='prelu' needs gamma")
        return _c_nn.prelu(F, data, gamma)
    if act_type == "elu":
        return _c_nn.elu(F, data, slope)
    if act_type == "selu":
        return _c_nn.selu(F, data)
    if act_type == "gelu":
        return _c.gelu(F, data)
    raise ValueError(f"leaky_relu: act_type must be 'leaky', 'prelu', 'elu', 'selu' or "
                     f"'gelu', got {act_type!r}")


def activation(data, act_type="relu"):
    act = _ACTIVATIONS.get(act_type)
    if act is None:
        raise ValueError(f"activation: act_type must be one of {sorted(_ACTIVATIONS)}, got "
                         f"{act_type!r}")
    return act(data)


def _dtype_of(a) -> str:
    dt = getattr(a, "_dtype", None)
    return dt if dt is not None else np.asarray(a).dtype.name


_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


def _check_layout(who, layout, nd):
    if layout is not None and layout != _LAYOUTS.get(nd):
        raise ValueError(f"{who}: only the channels-first layout ({_LAYOUTS.get(nd)} for "
                         f"{nd}-d windows) is supported, got {layout!r}")


def _one_dtype(data, weight):
    """Convolutions take one dtype: mixed operands (a float32 batch, float64 weights after
    net.cast('float64')) are promoted as NumPy (and eager matmul) would."""
    dt = np.result_type(_dtype_of(data), _dtype_of(weight)).name
    if _dtype_of(data) != dt:
        data = data.astype(dt)
    if _dtype_of(weight) != dt:
        weight = weight.astype(dt)
    return data, weight


def _add_bias(out, bias, no_bias):
    if bias is None or no_bias:
        return out
    return out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))


def convolution(data, weight, bias=None, kernel=None, stride=1, dilate=1, pad=0,
                num_filter=None, num_group=1, no_bias=False, layout=None):
    """Cross-correlation over 1 (NCW) or 2 (NCHW) spatial axes; weight (num_filter,
    C / num_group, *kernel)."""
    nd = weight.ndim - 2
    _check_layout("convolution", layout, nd)
    if kernel is not None and \
            tuple(weight.shape[2:]) != _c_nn.ntuple(kernel, nd, "kernel", "convolution"):
        raise ValueError(f"convolution: kernel={kernel} but weight has shape {weight.shape}")
    if num_filter is not None and weight.shape[0] != num_filter:
        raise ValueError(f"convolution: num_filter={num_filter} but weight has "
                         f"{weight.shape[0]} filters")
    data, weight = _one_dtype(data, weight)
    if nd == 2:
        out = apply("conv2d", (data, weight), {"stride": _pair(stride), "pad": _pair(pad),
                                               "dilation": _pair(dilate), "groups": num_group})
    else:
        out = _c_nn.convolution(F, data, weight, stride, pad, dilate, num_group)
    return _add_bias(out, bias, no_bias)


def deconvolution(data, weight, bias=None, kernel=None, stride=1, dilate=1, pad=0, adj=0,
                  target_shape=None, num_filter=None, num_group=1, no_bias=False, layout=None):
    """The transposed convolution over 1 or 2 spatial axes; weight (C_in, num_filter /
    num_group, *kernel), MXNet's layout. Each output size is (n - 1) * stride - 2 * pad +
    dilate * (k - 1) + 1 + adj."""
    nd = weight.ndim - 2
    _check_layout("deconvolution", layout, nd)
    if target_shape:
        raise ValueError("deconvolution: target_shape is not supported; give pad and adj")
    if kernel is not None and tuple(weight.shape[2:]) != _c_nn.ntuple(kernel, nd, "kernel",
                                                                      "deconvolution"):
        raise ValueError(f"deconvolution: kernel={kernel} but weight has shape {weight.shape}")
    if num_filter is not None and weight.shape[1] * num_group != num_filter:
        raise ValueError(f"deconvolution: num_filter={num_filter} but weight {weight.shape} "
                         f"with num_group={num_group} makes {weight.shape[1] * num_group}")
    data, weight = _one_dtype(data, weight)
    out = _c_nn.deconvolution(F, data, weight, stride, pad, dilate, num_group, adj)
    return _add_bias(out, bias, no_bias)


def pooling(data, kernel=1, stride=None, pad=0, pool_type="max", global_pool=False,
            count_include_pad=True, layout=None):
    """Max or average pooling over 1 (NCW), 2 (NCHW) or 3 (NCDHW) spatial axes."""
    nd = data.ndim - 2
    _check_layout("pooling", layout, nd)
    if nd != 2:
        return _c_nn.pooling(F, data, pool_type, kernel, stride, pad, bool(global_pool),
                             bool(count_include_pad))
    return apply("pool2d", (data,), {
        "pool_type": pool_type, "kernel": _pair(kernel),
        "stride": None if stride is None else _pair(stride), "pad": _pair(pad),
        "global_pool": bool(global_pool), "count_include_pad": bool(count_include_pad)})


def fully_connected(x, weight, bias=None, num_hidden=None, no_bias=False, flatten=True):
    return _c.linear(F, x, weight, None if no_bias else bias, flatten)


def batch_norm(x, gamma, beta, running_mean, running_var, eps=1e-5, momentum=0.9, axis=1,
               fix_gamma=False, use_global_stats=False):
    """Batch norm; in training mode (autograd.record) uses batch statistics and updates the
    running averages in place, as MXNet does."""
    if fix_gamma:
        gamma = F.full(shape=tuple(gamma.shape), value=1.0, dtype=gamma.dtype.name
                       if hasattr(gamma.dtype, "name") else gamma.dtype)
    if _state.is_training() and not use_global_stats:
        y, mu, var = _c.batch_norm_train(F, x, gamma, beta, axis=axis, eps=eps)
        recording, _state.local.recording = _state.local.recording, False
        try:  # running statistics are state, not part of the differentiated graph
            for running, batch in ((running_mean, mu), (running_var, var)):
                new = _c.batch_norm_running(F, x, running, batch, axis, momentum)
                if new is not running:  # an empty batch leaves them as they are
                    running._rebind(new)
        finally:
            _state.local.recording = recording
        return y
    return _c.batch_norm_infer(F, x, gamma, beta, running_mean, running_var, axis=axis, eps=eps)


def layer_norm(x, gamma, beta, axis=-1, eps=1e-5):
    return _c.layer_norm(F, x, gamma, beta, axis, eps)


def dropout(data, p=0.5, mode="training", axes=()):
    """Inverted dropout while training (autograd.record()), the identity otherwise."""
    if p <= 0 or (mode == "training" and not _state.is_training()):
        return data
    from .random import key_array  # noqa: PLC0415
    return _c.dropout(F, data, p, key_array(data.device))


def embedding(data, weight, input_dim=None, output_dim=None):
    return apply("take", (weight, data.astype("int64") if data.dtype != "int64" else data),
                 {"axis": 0, "mode": "raise"})  # a token past the table is an error


def gelu(x): return _c.gelu(F, x)


def batch_dot(a, b, transpose_a=False, transpose_b=False):
    return _c.batch_dot(F, a, b, transpose_a, transpose_b)


def batch_flatten(data):
    """(N, ...) -> (N, prod(...))."""
    return _c.flatten(F, data)


def sequence_mask(data, sequence_length=None, use_sequence_length=False, value=0.0, axis=0):
    """Entries past each sequence's length (along ``axis``: 0 for (seq, batch, ...), 1 for
    (batch, seq, ...)) replaced by ``value``; the data unchanged without use_sequence_length."""
    if not use_sequence_length:
        return data
    if sequence_length is None:
        raise ValueError("sequence_mask: use_sequence_length=True needs sequence_length")
    with data.device:  # the positions are made where the data is
        return _c.sequence_mask(F, data, sequence_length, value, axis)


def topk(data, axis=-1, k=1, ret_typ="indices", is_ascend=False, dtype="float32"):
    """The k largest (``is_ascend``: smallest) entries along ``axis``: their indices (as
    ``dtype``, float32 by default as in MXNet), values, a 0/1 mask, or (values, indices)."""
    with data.device:
        return _c.topk(F, data, axis, k, ret_typ, is_ascend, dtype)


def reshape(a, newshape, reverse=False, order="C"):
    """MXNet's npx.reshape: NumPy's reshape plus special codes. -1 infers a dimension; -2
    copies the next input dimension; -3 drops the next input dimension, which must be 1; -4
    copies all remaining input dimensions; -5 merges the next two input dimensions; -6
    splits the next input dimension into the two codes after it (one may be -1).
    ``reverse=True`` matches the codes to the input dimensions from the right."""
    if order != "C":
        raise ValueError(f"npx.reshape: only order='C' is supported, got {order!r}")
    return a.reshape(_special_shape(tuple(a.shape), newshape, reverse))


def _special_shape(src, codes, reverse):
    codes = (codes,) if isinstance(codes, int) else tuple(int(c) for c in codes)
    if reverse:
        src, codes = src[::-1], codes[::-1]
    out, i, j = [], 0, 0

    def need(n, code):
        if i + n > len(src):
            raise ValueError(f"npx.reshape: code {code} needs {n} more input dimension(s), "
                             f"but input shape {src} has run out")

    while j < len(codes):
        c = codes[j]
        if c > 0 or c == -1:
            out.append(c)
            i += 1
        elif c == -2:
            need(1, c)
            out.append(src[i])
            i += 1
        elif c == -3:
            need(1, c)
            if src[i] != 1:
                raise ValueError(f"npx.reshape: -3 skips a dimension of size 1, but input "
                                 f"dimension {i} of {src} is {src[i]}")
            i += 1
        elif c == -4:
            out.extend(src[i:])
            i = len(src)
        elif c == -5:
            need(2, c)
            out.append(src[i] * src[i + 1])
            i += 2
        elif c == -6:
            need(1, c)
            if j + 2 >= len(codes):
                raise ValueError("npx.reshape: -6 must be followed by the two sizes to split "
                                 "into")
            d0, d1 = codes[j + 1], codes[j + 2]
            if d0 == -1:
                d0 = src[i] // d1
            elif d1 == -1:
                d1 = src[i] // d0
            if d0 * d1 != src[i]:
                raise ValueError(f"npx.reshape: cannot split dimension {src[i]} into "
                                 f"({codes[j + 1]}, {codes[j + 2]})")
            out.extend((d0, d1))
            i += 1
            j += 2
        else:
            raise ValueError(f"npx.reshape: unknown special code {c} in {codes}")
        j += 1
    if -1 in out:  # the one inferred dimension, from what the others leave
        known = math.prod(d for d in out if d != -1)
        total = math.prod(src)
        if out.count(-1) > 1 or known == 0 or total % known:
            raise ValueError(f"npx.reshape: cannot infer the -1 of {tuple(codes)} for input "
                             f"shape {src}")
        out[out.index(-1)] = total // known
    return tuple(out[::-1]) if reverse else tuple(out)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)
