"""Devices: ``cpu(i)`` and ``gpu(i)``, each with its array module.

CPU devices are logical: ``cpu(0)`` and ``cpu(1)`` are separate engine workers on one machine,
each with its share of the cores. A GPU's work goes through the GPU seam (runtime/gpu/): CuPy
on a real GPU, or emulated GPUs on the CPU (``HYBRID_GPU_EMULATE=N``). The methods here that
touch a GPU (``xp``, ``activate``, ``synchronize``, ``to_numpy``, ``seam``) are the one way
the layers above reach it. A GPU that is not there fails at first use, not at creation.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np


class DeviceError(RuntimeError):
    """A device was asked for that this machine does not have."""


class Device:
    """A device, one object per (kind, index): ``cpu(0) is cpu(0)``. Interned so that equality
    and hashing are the object's own (C-level identity): devices key the signature caches
    and engine tables that every call looks up."""

    __slots__ = ("kind", "index", "_key", "__weakref__")
    _interned: dict = {}

    def __new__(cls, kind: str, index: int = 0):
        if kind not in ("cpu", "gpu"):
            raise ValueError(f"device kind must be 'cpu' or 'gpu', got {kind!r}")
        if not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"device index must be a non-negative int, got {index!r}")
        key = (kind, int(index))
        dev = cls._interned.get((cls, key))
        if dev is None:
            dev = object.__new__(cls)
            dev.kind, dev.index, dev._key = kind, key[1], key
            dev = cls._interned.setdefault((cls, key), dev)  # two threads: one wins
        return dev

    @property
    def device_type(self) -> str:
        return self.kind

    @property
    def device_id(self) -> int:
        return self.index

    @property
    def xp(self):
        """The array module that computes on this device: NumPy on a CPU and on an emulated
        GPU, CuPy on a real one. DeviceError, saying the fix, for a GPU that is not there."""
        if self.kind == "cpu":
            return np
        return _get_gpu(self.index).xp

    @property
    def seam(self):
        """The GPU seam object doing this GPU's work (:class:`runtime.gpu.seam.GPU`)."""
        if self.kind != "gpu":
            raise DeviceError(f"{self} is not a GPU")
        return _get_gpu(self.index)

    def activate(self):
        """A context manager making this device current in this thread (a GPU and its compute
        stream, where eager ops queue their kernels); nothing for a CPU."""
        return _NOTHING if self.kind == "cpu" else _get_gpu(self.index).activate()

    def synchronize(self, timeout: float | None = None):
        """Block until the work queued on this device's streams is done (an engine op on a GPU
        is done when its kernels are queued, not when they ran). A GPU that is not there
        has nothing to wait for."""
        if self.kind == "gpu":
            try:
                gpu = _get_gpu(self.index)
            except DeviceError:
                return
            gpu.synchronize(timeout)

    def to_numpy(self, data, copy: bool = True) -> np.ndarray:
        """A host array of ``data``, an array of this device (a copy, unless ``copy`` is False
        and ``data`` is host memory already). On a GPU: the seam's device->host copy, ordered
        after the kernels queued before it."""
        if self.kind == "cpu":
            return data.copy() if copy else data
        return _get_gpu(self.index).to_host(data)

    @property
    def copy_lane(self):
        """Where the engine queues copies to and from this device: a GPU's copy stream, beside
        its compute (so they overlap); a CPU device itself."""
        if self.kind == "cpu":
            return self
        lane = _copy_lanes.get(self)
        if lane is None:
            lane = _copy_lanes.setdefault(self, CopyLane(self))
        return lane

    def __repr__(self):
        return f"{self.kind}({self.index})"

    def __str__(self):
        return f"{self.kind}({self.index})"

    def __reduce__(self):  # lets multiprocessing send devices; no project file pickles them
        return (Device, self._key)

    def __enter__(self):
        _default_stack.append(self)
        return self

    def __exit__(self, *exc):
        _default_stack.pop()


_default_stack: list[Device] = []
_NOTHING = contextlib.nullcontext()


class CopyLane:
    """The engine queue of a GPU's copies (one FIFO worker, as its copy stream is one queue):
    copies run beside the GPU's compute ops instead of behind them."""

    __slots__ = ("device", "kind", "index")

    def __init__(self, device: Device):
        self.device, self.kind, self.index = device, "copy", device.index

    def activate(self):
        return self.device.activate()

    def __repr__(self):
        return f"{self.device}.copy"


_copy_lanes: dict = {}


def cpu(index: int = 0) -> Device:
    return Device("cpu", index)


def gpu(index: int = 0) -> Device:
    return Device("gpu", index)


def current_device() -> Device:
    """The device of ``with hb.cpu(1):`` blocks, else ``cpu(0)``."""
    return _default_stack[-1] if _default_stack else cpu(0)


def parse_device(spec) -> Device:
    """A Device from a Device, ``"cpu:1"``, ``"gpu"`` or ``"cpu(0)"``."""
    if isinstance(spec, Device):
        return spec
    if spec is None:
        return current_device()
    if isinstance(spec, str):
        text = spec.strip().lower().replace("(", ":").rstrip(")")
        kind, _, idx = text.partition(":")
        if kind in ("cpu", "gpu", "cuda") and (not idx or idx.strip().isdigit()):
            return Device("gpu" if kind == "cuda" else kind, int(idx) if idx else 0)
    raise ValueError(f"device must be hb.cpu(i), hb.gpu(i) or a string like 'cpu:0', got {spec!r}")


def _get_gpu(index: int):
    global _get_gpu  # the seam imports this module: bound at first use, then called direct
    from .gpu.seam import get_gpu  # noqa: PLC0415
    _get_gpu = get_gpu
    return get_gpu(index)


def cupy_module():
    """CuPy if it imports, else None (never raises)."""
    from .gpu.cupy_gpu import cupy_module as found  # noqa: PLC0415
    return found()


def num_gpus() -> int:
    """How many GPUs ``gpu(i)`` can name: HYBRID_GPU_EMULATE's emulated ones when it is set,
    else those CuPy sees; 0 without CuPy or a driver. Cheap, and never raises."""
    from .gpu.seam import num_gpus as count  # noqa: PLC0415
    return count()


def device_of(array) -> Device:
    """The device of a raw numpy/cupy array."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return cpu(0)
    dev = getattr(array, "device", None)
    if dev is not None and hasattr(dev, "id"):
        return gpu(int(dev.id))
    return cpu(0)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
