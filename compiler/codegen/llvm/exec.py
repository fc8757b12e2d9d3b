"""The LLVM backend's executable: ONE native call per hybridized call.

Per call, Python writes the input (and changed parameter) pointers into a prebuilt pointer
array, allocates the fresh output arrays and calls the program's entry point with the GIL
released; the arena is allocated once per executable and reused.
"""
from __future__ import annotations

import ctypes
import math
import threading
import time
from operator import is_not

import numpy as np

from runtime import config
from runtime.executable import Executable
from runtime.memory import host_pool

from ..lower import gather_outputs, lower
from .emit import SMALL_OUTPUT, aligned_empty, compile_program, data_address, new_arena
from .gemv import PACK_NEW, pack_states
from .steps import driver as steps_driver

_log = config.logger("compile")


class NativeRun:
    def __init__(self, compiled, binding):
        prog = compiled.program
        self.compiled = compiled
        self.cfunc = compiled.cfunc
        io_slots = prog.io_slots()
        self.io = (ctypes.c_void_p * max(len(io_slots), 1))()
        self.io_addr = ctypes.addressof(self.io)
        self._io_arg = ctypes.c_void_p(self.io_addr)  # ctypes passes these without converting
        self.arena, self.arena_ptr = new_arena(prog)
        # the packed-weights states (gemv.py) in this arena: set on each parameter binding
        self._pack_states = [self.arena[off:off + 8].view(np.int64) for off in pack_states(prog)]
        self.arena_bytes = prog.arena_bytes
        self._arena_arg = ctypes.c_void_p(self.arena_ptr)
        self.lock = threading.Lock()
        self.inputs, self.params, self.outs, self.aliases = [], [], [], []
        self._keep = []
        for pos, (s, entry) in enumerate(zip(io_slots, binding.io)):
            slot = prog.slots[s]
            kind = entry[0]
            want = (tuple(slot.shape), np.dtype(slot.dtype))
            if kind == "input":
                self.inputs.append((pos, entry[1]) + want)
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
        self.outs = [(pos, shape, dt, math.prod(shape) * dt.itemsize)
                     for pos, _, (shape, dt) in self.outs]
        self.results = binding.outputs
        self.plain = [tuple(r) for r in self.results] == [("slot", k)
                                                           for k in range(len(self.outs))]
        # per graph output, its output slot, when each is a slot of its own (run_into)
        kinds = [tuple(r) for r in self.results]
        self._output_slots = [k for _, k in kinds] if all(
            kind == "slot" for kind, _ in kinds) and len({k for _, k in kinds}) == len(kinds) \
            else None
        self._held = ()
        self._held_list = None  # the params list last bound (a caller may reuse it)
        self._bound = []
        self._template = list(self.io)  # the constants' addresses, for private tables

    @staticmethod
    def _prep(a, want):
        shape, dt = want
        if type(a) is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a, dtype=dt)
        if a.shape != shape:
            a = a.reshape(shape)
        return a

    def __call__(self, xp, inputs, params):
        # the shared pointer table and arena, only ever written under the lock; while
        # another thread holds it, a private table and arena: two threads may run one
        # executable at once (one frame for both: this is the batch-1 path)
        shared = self.lock.acquire(False)
        keep = []  # converted inputs and parameters stay alive until the call returns
        try:
            if shared:
                io = self.io
                if params is not self._held_list:
                    held = self._held
                    if len(held) != len(params) or any(map(is_not, params, held)):
                        self._bind_params(params)  # parameters change only when rebound
                    self._held_list = params
            else:
                io = (ctypes.c_void_p * len(self.io))(*self._template)
                for pos, i, want in self.params:
                    a = self._prep(params[i], want)
                    keep.append(a)
                    io[pos] = data_address(a)
            self._bind_inputs(io, inputs, keep)
            outs = []
            for pos, shape, dt, nbytes in self.outs:
                if nbytes <= SMALL_OUTPUT:  # NumPy's own alignment serves small outputs
                    a = np.empty(shape, dt)
                    io[pos] = data_address(a)
                else:  # recycled pages when pooled: no page faults on first touch
                    pool = host_pool()
                    a, io[pos] = pool.empty(shape, dt, nbytes) if pool is not None else \
                        aligned_empty(shape, dt)
                outs.append(a)
            for pos, src in self.aliases:
                io[pos] = io[src]
            if shared:
                self.cfunc(self._io_arg, self._arena_arg)
            else:
                arena, aptr = new_arena(self.compiled.program)  # pack states zero: in place
                self.cfunc(ctypes.addressof(io), aptr)
        finally:
            if shared:
                self.lock.release()
        return outs if self.plain else gather_outputs(self.results, outs, inputs, params)

    def _bind_inputs(self, io, inputs, keep):
        """Point ``io`` at the inputs' data; converted copies are appended to ``keep`` (alive
        until the call returns)."""
        for pos, i, shape, dt in self.inputs:
            a = inputs[i]
            # dtype identity: NumPy's built-in dtypes are singletons, and a miss only costs
            # the conversion check below, never a wrong pointer
            if type(a) is not np.ndarray or a.dtype is not dt or a.shape != shape or \
                    not a.flags.c_contiguous:
                a = self._prep(a, (shape, dt))
                keep.append(a)
            io[pos] = data_address(a)

    def run_into(self, xp, inputs, targets) -> bool:
        """One call writing its outputs into ``targets`` (C-contiguous arrays of the output
        types, or None for a fresh one), with no parameters: how a control-flow loop runs its
        body each step, the rows of its stacked outputs and its state buffers as targets, so
        a step allocates nothing. False (nothing run) unless every output is a slot of its
        own and every target fits; the caller then runs it as usual."""
        slots = self._output_slots
        if slots is None or len(targets) != len(slots) or self.params:
            return False
        for k, t in zip(slots, targets):
            _, shape, dt, _ = self.outs[k]
            if t is not None and (type(t) is not np.ndarray or t.dtype != dt or
                                  t.shape != shape or not t.flags.c_contiguous):
                return False
        with self.lock:
            io = self.io
            keep = []
            self._bind_inputs(io, inputs, keep)
            for i, k in enumerate(slots):
                pos, shape, dt, _ = self.outs[k]
                if targets[i] is None:
                    targets[i] = np.empty(shape, dt)
                io[pos] = data_address(targets[i])
            for pos, src in self.aliases:
                io[pos] = io[src]
            self.cfunc(self._io_arg, self._arena_arg)
        return True

    def run_steps(self, n, inputs, outputs) -> bool:
        """``n`` calls in ONE native call (codegen/llvm/steps.py), step ``j`` reading and
        writing rows: per graph input ``("fixed", array)`` or ``("rows", array, first,
        step)`` (row ``first + j * step`` of a C-contiguous array whose rows are the input's
        shape and dtype), per graph output ``("rows", array, first, step)``. How a loop runs
        its body: no Python, no allocation per step. False (nothing run) where this
        executable or a plan cannot: the caller then runs the steps one by one."""
        slots = self._output_slots
        if slots is None or self.params or len(outputs) != len(slots):
            return False
        nio = len(self.io)
        base = (ctypes.c_void_p * max(nio, 1))(*self._template)
        stride = (ctypes.c_int64 * max(nio, 1))()
        keep = []

        def place(pos, plan, shape, dt, writable):
            if plan[0] == "fixed":
                if writable:
                    return False
                a = self._prep(plan[1], (shape, dt))
                keep.append(a)
                base[pos] = data_address(a)
                return True
            _, a, first, step = plan
            if type(a) is not np.ndarray or a.dtype != dt or a.shape[1:] != shape or \
                    not a.flags.c_contiguous or not (0 <= first < a.shape[0] and
                                                     0 <= first + (n - 1) * step < a.shape[0]):
                return False
            row = a.strides[0]
            base[pos] = data_address(a) + first * row
            stride[pos] = step * row
            return True
        for pos, i, shape, dt in self.inputs:
            if not place(pos, inputs[i], shape, dt, False):
                return False
        for i, k in enumerate(slots):
            pos, shape, dt, _ = self.outs[k]
            if not place(pos, outputs[i], shape, dt, True):
                return False
        for pos, src in self.aliases:
            base[pos], stride[pos] = base[src], stride[src]
        io = (ctypes.c_void_p * max(nio, 1))()
        with self.lock:
            steps_driver()(ctypes.c_void_p(self.compiled.native.address(self.compiled.symbol)),
                           self._arena_arg, n, nio, ctypes.addressof(io),
                           ctypes.addressof(base), ctypes.addressof(stride))
        return True

    def _bind_params(self, params):
        """Point the io array at the parameters' data. The arrays are held (with any converted
        copy), so their memory stays valid while the pointers are in use, and an identity
        check tells a rebound parameter apart (buffers are immutable: same array, same data)."""
        # forget the old binding first: a conversion failing halfway leaves pointers to
        # neither binding, and the next call must bind again rather than trust them
        self._held, self._held_list = (), None
        bound = []
        for pos, i, want in self.params:
            a = self._prep(params[i], want)
            bound.append(a)
            self.io[pos] = data_address(a)
        self._held = tuple(params)
        self._bound = bound
        for state in self._pack_states:  # new weights: a packed copy must be made again
            state[0] = PACK_NEW


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
