"""Buffers: an array's storage and the engine Var that orders access to it.

A buffer is written once, by the op that produces it, and never mutated afterwards. In-place
updates on the front end (``x[:] = v``, ``x += 1``) compute a new buffer and rebind the
array to it (SSA renaming), so ops queued earlier still read the old contents and raw
buffers can be shared freely between arrays, gradients and executables.
"""
from __future__ import annotations

from .engine import Var


class Buffer:
    __slots__ = ("data", "var")

    def __init__(self, data=None):
        self.data = data
        self.var = Var()

    def __repr__(self):
        state = "pending" if self.data is None else f"{self.data.dtype}{list(self.data.shape)}"
        return f"Buffer({state})"
