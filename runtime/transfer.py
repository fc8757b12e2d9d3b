"""Copies between devices, as engine ops: the one place where data moves from device to device.

A copy that touches a GPU is queued on the GPU's copy lane (``Device.copy_lane``: the engine's
queue for its copy stream), beside the GPU's compute ops, so transfers overlap compute. The
seam orders the copy after the kernels queued before it on the source's compute stream (an
event), and the op is done when the data has arrived: an op that reads the copy may then
use it on any stream.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from .device import Device
from .engine import get_engine
from .memory import Buffer


def move(data, src: Device, dst: Device, copy: bool = True):
    """``data``, an array of device ``src``, as an array of device ``dst``. Between CPU
    devices a copy, or with ``copy=False`` the same array (buffers are never mutated, so
    CPU devices may share one)."""
    if dst.kind == "gpu":
        if src.kind == "gpu":
            return dst.seam.from_gpu(data, src.seam)
        return dst.seam.to_device(np.asarray(data))
    if src.kind == "gpu":
        return src.seam.to_host(data)
    return np.array(data, copy=True) if copy else data


def lane(src: Device, dst: Device):
    """The engine queue of a copy: the copy lane of the GPU it involves (the destination's
    if both are GPUs), else the source CPU device."""
    if dst.kind == "gpu":
        return dst.copy_lane
    return src.copy_lane


def _run(src_buf, dst_buf, src, dst, copy):
    dst_buf.data = move(src_buf.data, src, dst, copy)


def push_copy(src_buf: Buffer, src: Device, dst: Device, name: str = "copyto", where=None,
              copy: bool = True) -> Buffer:
    """A new buffer on ``dst`` that will hold ``src_buf``'s value (an engine op)."""
    out = Buffer()
    get_engine().push(partial(_run, src_buf, out, src, dst, copy), (src_buf.var,), (out.var,),
                      lane(src, dst), name, where)
    return out


def _upload(host, dst_buf, device):
    dst_buf.data = device.seam.to_device(host)


def upload(host: np.ndarray, device: Device, name: str = "array", where=None) -> Buffer:
    """A buffer on ``device`` holding host array ``host`` (which must not change afterwards):
    the array itself on a CPU device, an engine op on the copy lane of a GPU."""
    if device.kind == "cpu":
        return Buffer(host)
    out = Buffer()
    get_engine().push(partial(_upload, host, out, device), (), (out.var,), device.copy_lane,
                      name, where)
    return out
