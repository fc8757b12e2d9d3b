"""Functional neural-network ops with MXNet's ``npx`` names and keywords (the book's 12.5
LeNet uses them). Each is a thin name over registry ops, so it hybridizes."""
from __future__ import annotations

import numpy as np

from compiler.ops import composite as _c

from . import _state
from .ndarray import F, apply, pick, one_hot  # noqa: F401 - re-exported npx names


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
}


def activation(data, act_type="relu"):
    act = _ACTIVATIONS.get(act_type)
    if act is None:
        raise ValueError(f"activation: act_type must be one of {sorted(_ACTIVATIONS)}, got "
                         f"{act_type!r}")
    return act(data)


def _dtype_of(a) -> str:
    dt = getattr(a, "_dtype", None)
    return dt if dt is not None else np.asarray(a).dtype.name


def convolution(data, weight, bias=None, kernel=None, stride=(1, 1), dilate=(1, 1), pad=(0, 0),
                num_filter=None, num_group=1, no_bias=False, layout="NCHW"):
    if layout != "NCHW":
        raise ValueError(f"convolution: only layout='NCHW' is supported, got {layout!r}")
    if kernel is not None and tuple(weight.shape[2:]) != tuple(_pair(kernel)):
        raise ValueError(f"convolution: kernel={kernel} but weight has shape {weight.shape}")
    if num_filter is not None and weight.shape[0] != num_filter:
        raise ValueError(f"convolution: num_filter={num_filter} but weight has "
                         f"{weight.shape[0]} filters")
    # conv2d takes one dtype: mixed operands (a float32 batch, float64 weights after
    # net.cast('float64')) are promoted as NumPy (and eager matmul) would
    dt = np.result_type(_dtype_of(data), _dtype_of(weight)).name
    if _dtype_of(data) != dt:
        data = data.astype(dt)
    if _dtype_of(weight) != dt:
        weight = weight.astype(dt)
    out = apply("conv2d", (data, weight), {"stride": _pair(stride), "pad": _pair(pad),
                                           "dilation": _pair(dilate), "groups": num_group})
    if bias is not None and not no_bias:
        out = out + bias.reshape((1, -1, 1, 1))
    return out


def pooling(data, kernel=(1, 1), stride=None, pad=(0, 0), pool_type="max", global_pool=False,
            count_include_pad=True, layout="NCHW"):
    if layout != "NCHW":
        raise ValueError(f"pooling: only layout='NCHW' is supported, got {layout!r}")
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


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)
