"""hybrid's runtime: devices, the dependency engine, memory, executables, artifacts.

Never imports ``compiler`` or ``hybrid`` (layers point down).
"""
from .device import Device, DeviceError, cpu, gpu, num_gpus, current_device, parse_device
from .engine import AsyncOpError, EngineUnusable, Var, WaitTimeout, get_engine

__all__ = ["Device", "DeviceError", "cpu", "gpu", "num_gpus", "current_device", "parse_device",
           "AsyncOpError", "EngineUnusable", "Var", "WaitTimeout", "get_engine"]
