"""Per-thread front-end state: autograd recording, train/predict mode, the active trace.

The one place such state lives (besides the engine and the config).
"""
from __future__ import annotations

import threading


class _Local(threading.local):
    def __init__(self):
        self.recording = False
        self.training = False
        self.trace = None  # the active hybridize trace (hybrid.tracing.Trace) or None


local = _Local()


def is_recording() -> bool:
    return local.recording


def is_training() -> bool:
    return local.training


def tracing() -> bool:
    return local.trace is not None
