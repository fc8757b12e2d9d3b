"""``mx.context``: MXNet's names for devices. A ``Context`` is a :class:`Device`; the
functions are hybrid's own (looked up at use, so there is one of each)."""
from __future__ import annotations

import sys

from runtime.device import Device

Context = Device

_NAMES = {"cpu": "cpu", "gpu": "gpu", "num_gpus": "num_gpus",
          "current_context": "current_device", "current_device": "current_device"}


def __getattr__(name):
    if name in _NAMES:
        return getattr(sys.modules["hybrid"], _NAMES[name])
    raise AttributeError(f"module 'hybrid.context' has no attribute {name!r}")
