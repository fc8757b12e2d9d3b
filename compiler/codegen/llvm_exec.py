"""The LLVM backend's executable: ONE native call per hybridized call.

Per call, Python writes the input (and changed parameter) pointers into a prebuilt pointer
array, allocates the fresh output arrays and calls the program's entry point with the GIL
released; the arena is allocated once per executable and reused.
"""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

from runtime import config
from runtime.executable import Executable

from .llvm import aligned_empty, compile_program, data_address
from .lower import lower

_log = config.logger("compile")


class NativeRun:
    def __init__(self, compiled, binding):
        prog = compiled.program
        self.compiled = compiled
        self.cfunc = compiled.cfunc
        io_slots = prog.io_slots()
        self.io = (ctypes.c_void_p * max(len(io_slots), 1))()
        self.io_addr = ctypes.addressof(self.io)
        self.arena, self.arena_ptr = aligned_empty((max(prog.arena_bytes, 1),), np.uint8)
        self.arena_bytes = prog.arena_bytes
        self.lock = threading.Lock()
        self.inputs, self.params, self.outs, self.aliases = [], [], [], []
        self._keep = []
        for pos, (s, entry) in enumerate(zip(io_slots, binding.io)):
            slot = prog.slots[s]
            kind = entry[0]
            want = (tuple(slot.shape), np.dtype(slot.dtype))
            if kind == "input":
                self.inputs.append((pos, entry[1], want))
            elif kind == "param":
                self.params.append((pos, entry[1], want))
            elif kind == "const":
                a = np.ascontiguousarray(entry[1], dtype=want[1]).reshape(want[0])
                self._keep.append(a)
                self.io[pos] = data_address(a)
            elif kind == "output":
                self.outs.append((pos, entry[1], want))
            else:
                self.aliases.append((pos, entry[1]))
        self.outs.sort(key=lambda t: t[1])
        self.results = binding.outputs
        self._last_params = {}

    @staticmethod
    def _prep(a, want):
        shape, dt = want
        if type(a) is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a, dtype=dt)
        if a.shape != shape:
            a = a.reshape(shape)
        return a

    def __call__(self, xp, inputs, params):
        io = self.io
        keep = []
        for pos, i, want in self.inputs:
            a = self._prep(inputs[i], want)
            keep.append(a)
            io[pos] = data_address(a)
        last = self._last_params
        for pos, i, want in self.params:
            p = params[i]
            if last.get(pos) is not p:  # parameters change only when the Trainer rebinds them
                a = self._prep(p, want)
                keep.append(a)
                io[pos] = data_address(a)
                last[pos] = p if a is p else None
        outs = []
        for pos, _, (shape, dt) in self.outs:
            a, ptr = aligned_empty(shape, dt)
            io[pos] = ptr
            outs.append(a)
        for pos, src in self.aliases:
            io[pos] = io[src]
        if self.lock.acquire(blocking=False):
            try:
                self.cfunc(self.io_addr, self.arena_ptr)
            finally:
                self.lock.release()
        else:  # another thread runs this executable: a private arena and pointer array
            arena, aptr = aligned_empty((max(self.arena_bytes, 1),), np.uint8)
            io2 = (ctypes.c_void_p * len(io))(*io)
            self.cfunc(ctypes.addressof(io2), aptr)
        res = []
        for kind, v in self.results:
            if kind == "slot":
                res.append(outs[v])
            elif kind == "input":
                res.append(inputs[v])
            elif kind == "param":
                res.append(params[v])
            else:
                res.append(v)
        del keep
        return res


def llvm_compile(graph, device, in_specs, param_specs) -> Executable:
    t0 = time.perf_counter()
    program, binding = lower(graph)
    t1 = time.perf_counter()
    # symbols live in one process-wide JIT: the name must be unique per program
    compiled = compile_program(program, f"{graph.name or 'hybrid'}_{program.key()[:16]}")
    t2 = time.perf_counter()
    _log.info("%s: lowered to %d kernel(s) in %.1f ms, native code in %.1f ms", graph.name,
              len(program.steps), (t1 - t0) * 1e3, (t2 - t1) * 1e3)
    run = NativeRun(compiled, binding)
    report = {"kernels": len(program.steps), "arena_bytes": program.arena_bytes,
              "lower_seconds": t1 - t0, "codegen_seconds": t2 - t1, "program": program}
    return Executable(run, "llvm", in_specs, param_specs,
                      [graph.spec(o) for o in graph.outputs], device, report)
