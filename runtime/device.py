"""Devices: ``cpu(i)`` and ``gpu(i)``, each with its array module.

CPU devices are logical: ``cpu(0)`` and ``cpu(1)`` are separate engine workers on one machine,
each with its share of the cores. GPUs come from CuPy, imported lazily so the package never
depends on a CuPy wheel's name; a GPU that is not there fails at first use, not at creation.
"""
from __future__ import annotations

import functools
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
        """The array module (numpy or cupy) that computes on this device."""
        if self.kind == "cpu":
            return np
        cp = cupy_module()
        if cp is None:
            raise DeviceError(f"{self} was used, but CuPy is not installed: "
                              "pip install 'hybrid[gpu]' (cupy-cuda12x) on a machine with a GPU")
        n = num_gpus()
        if self.index >= n:
            raise DeviceError(f"{self} was used, but this machine has {n} GPU(s); "
                              f"use hb.gpu(i) with i < {n}, or hb.cpu()")
        return cp

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


@functools.lru_cache(maxsize=1)
def cupy_module():
    """CuPy if it imports, else None (never raises)."""
    try:
        import cupy  # noqa: PLC0415 - lazy on purpose
        return cupy
    except Exception:
        return None


@functools.lru_cache(maxsize=1)
def num_gpus() -> int:
    """How many CUDA GPUs CuPy sees; 0 without CuPy or a driver (never an exception)."""
    cp = cupy_module()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


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
