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


@dataclasses.dataclass
class PartExecutable:
    """One device's part of a partitioned graph: its executable and where its inputs come
    from: ("input", i) / ("param", i) of the whole call, or ("part", p, k), output k of part
    p (an earlier part); ``input_devices``: the device name each input lives on before the
    part runs (the caller moves those on another device where a GPU is one of the two)."""
    device: Any  # the device name, e.g. 'cpu(1)'
    exe: Executable
    inputs: list
    params: list
    input_devices: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PartitionedExecutable:
    """A graph spanning several devices: one executable per (device, stage) part, run as one
    engine op each, so parts with no path between them run at once on their devices.
    ``outputs``: per output, ("part", p, k) / ("input", i) / ("param", i) / ("const", a)."""
    parts: list
    outputs: list
    backend: str
    in_specs: list
    param_specs: list
    out_specs: list
    device: Any
    report: dict = dataclasses.field(default_factory=dict)

    def run_in_order(self, xp, inputs, params):
        """Every part in this thread, in order: how a control-flow body made of parts runs
        each step (the loop is one engine op already). The parts share one device here."""
        done = []

        def value(ref):
            kind = ref[0]
            if kind == "part":
                return done[ref[1]][ref[2]]
            if kind == "input":
                return inputs[ref[1]]
            if kind == "param":
                return params[ref[1]]
            return xp.asarray(ref[1])
        for part in self.parts:
            done.append(part.exe.run(xp, [value(r) for r in part.inputs],
                                     [value(r) for r in part.params]))
        return [value(r) for r in self.outputs]
