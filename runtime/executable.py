"""Executables: a compiled plan the runtime can run on bound inputs, one engine op per call."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass
class Executable:
    """``run(xp, inputs, params) -> outputs`` over raw arrays, plus what the compiler reported.

    ``run`` never mutates its inputs and returns fresh output arrays (or inputs passed
    through, which are immutable buffers), so a later call never overwrites what a caller holds.
    """
    run: Callable
    backend: str
    in_specs: list
    param_specs: list
    out_specs: list
    device: Any
    report: dict = dataclasses.field(default_factory=dict)

    def __call__(self, xp, inputs, params):
        return self.run(xp, inputs, params)
