"""Data parallelism, as in sections 12.5 and 12.6 of the book.

    devices = [hb.cpu(0), hb.cpu(1)]
    X_shards, y_shards = hb.split_batch(X, y, devices)      # one slice of the batch per device
    net.initialize(device=devices)                           # one copy of every parameter each
    with autograd.record():
        losses = [loss(net(X_), y_) for X_, y_ in zip(X_shards, y_shards)]
    for l in losses:
        l.backward()
    trainer.step(batch_size)          # sums the gradients across devices (kvstore='device')

The section 12.5 helpers written from scratch are here too: :func:`allreduce` (sum on the
first device, copy back, in place) and :func:`get_params`; :func:`ring_allreduce` is section
12.7's ring. Every function returns at once: the copies and sums are engine ops, so the
devices work in parallel.

Across processes, ``hybrid launch -n N script.py`` starts the workers; ``rank()`` and
``num_workers()`` tell each which one it is (use them to shard the data), and
``hb.kv.create('dist_sync')`` / ``hb.Trainer(..., kvstore='dist_sync')`` sum the gradients.
"""
from __future__ import annotations

import numbers

import numpy as np

from runtime import collective as _coll
from runtime.device import Device, parse_device

from .ndarray import NDArray, array

__all__ = ["split_data", "split_and_load", "split_batch", "allreduce", "ring_allreduce",
           "get_params", "rank", "num_workers"]


def _size_along(data, axis):
    shape = data.shape
    if not shape:
        raise ValueError("split_data: cannot split a 0-d array")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"split_data: batch_axis {axis} is out of range for an array of "
                         f"shape {tuple(shape)}")
    return shape[axis]


def _bounds(size, num_slice, even_split):
    if not isinstance(num_slice, numbers.Integral) or num_slice < 1:
        raise ValueError(f"split_data: num_slice must be a positive int, got {num_slice!r}")
    if even_split and size % num_slice:
        raise ValueError(f"data with shape {size} along the batch axis cannot be evenly split "
                         f"into {num_slice} slices along axis; use a batch size that is a "
                         f"multiple of {num_slice}, or even_split=False")
    if size < num_slice:
        if even_split:
            raise ValueError(f"cannot split {size} samples into {num_slice} slices")
        num_slice = size
    step = size // num_slice
    # MXNet's rule: equal slices, the last one takes the remainder
    return [(i * step, (i + 1) * step if i < num_slice - 1 else size) for i in range(num_slice)]


def _take(data, lo, hi, axis):
    index = [slice(None)] * len(data.shape)
    index[axis] = slice(lo, hi)
    return data[tuple(index)]


def split_data(data, num_slice: int, batch_axis: int = 0, even_split: bool = True) -> list:
    """Split ``data`` (a hybrid or NumPy array) into ``num_slice`` slices along
    ``batch_axis``. With ``even_split=False`` the last slice takes the remainder."""
    size = _size_along(data, batch_axis)
    bounds = _bounds(size, num_slice, even_split)
    if len(bounds) == 1:
        return [data]
    return [_take(data, lo, hi, batch_axis) for lo, hi in bounds]


def split_and_load(data, device_list, batch_axis: int = 0, even_split: bool = True) -> list:
    """Split ``data`` along ``batch_axis`` and put slice ``i`` on ``device_list[i]`` (the
    copies are engine ops: they overlap with compute). NumPy data is loaded straight onto
    each device."""
    if isinstance(device_list, (Device, str)):
        device_list = [device_list]
    devices = [parse_device(d) for d in device_list]
    if not devices:
        raise ValueError("split_and_load: device_list is empty")
    if not isinstance(data, NDArray):
        data = np.asarray(data)
    slices = split_data(data, len(devices), batch_axis, even_split)
    out = []
    for part, dev in zip(slices, devices):
        if isinstance(part, NDArray):
            out.append(part.to(dev, non_blocking=True))
        else:
            out.append(array(part, device=dev))
    return out


def split_batch(X, y, devices) -> tuple:
    """Section 12.5's helper: split features and labels over ``devices``."""
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"split_batch: X has {X.shape[0]} samples but y has {y.shape[0]}")
    return split_and_load(X, devices), split_and_load(y, devices)


def allreduce(data: list) -> list:
    """Section 12.5's allreduce, from scratch: sum every array into the first, then copy the
    sum back to the others. In place (``data[i]`` then all hold the sum); returns ``data``."""
    data = list(data)
    if not data:
        raise ValueError("allreduce: no arrays given")
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].device)
    for i in range(1, len(data)):
        data[0].copyto(data[i])
    return data


def ring_allreduce(data: list) -> list:
    """Section 12.7's ring allreduce across device copies, in place: after it every array
    holds the sum, with identical bits; returns ``data``."""
    data = list(data)
    if not data:
        raise ValueError("ring_allreduce: no arrays given")
    for a in data:
        if not isinstance(a, NDArray):
            raise TypeError(f"ring_allreduce: expected hybrid arrays, got {type(a).__name__}")
    tensors = [_coll.Tensor(a._buf, a.shape, a._dtype, a.device) for a in data]
    for a, t in zip(data, _coll.ring_allreduce(tensors)):
        a._rebind(NDArray(t.buf, t.shape, t.dtype, t.device))
    return data


def get_params(params, device) -> list:
    """Section 12.5's helper: copies of ``params`` on ``device``, each with a gradient."""
    new = [p.copyto(parse_device(device)) for p in params]
    for p in new:
        p.attach_grad()
    return new


def rank() -> int:
    """This process's index among the workers started by ``hybrid launch`` (0 alone)."""
    return _coll.launched()[0]


def num_workers() -> int:
    """How many worker processes ``hybrid launch`` started (1 alone)."""
    return _coll.launched()[1]
