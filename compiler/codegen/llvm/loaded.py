"""A compiled program, loaded: what runs native code, and nothing that generates it.

``CompiledProgram`` (a loaded Program's entry point, its arena and threads) and ``NativeRun``
(a compiled graph's executable: one native call per call) need only NumPy, ctypes and
runtime.native: neither llvmlite.ir nor the kernel IR. A warm first call (compiler/
exe_cache.py: a disk cache hit for the traced graph) builds them from a stored description
(:class:`ProgramInfo`) without importing the code generator at all; emit.py and exec.py
re-export them.
"""
from __future__ import annotations

import ctypes
import math
import threading
import weakref
from operator import is_not

import numpy as np

from runtime.memory import host_pool

ALIGN = 64  # bytes: kernel.ALIGN (emit.py checks they agree)
# a packed-weights state word (gemv.py): the arena's owner sets PACK_NEW on each binding
PACK_OFF, PACK_NEW, PACK_SEEN, PACK_READY = 0, 1, 2, 3


class SlotInfo:
    """What running a program needs to know of one slot (kernel.Slot's fields)."""
    __slots__ = ("dtype", "shape", "role", "offset")

    def __init__(self, dtype: str, shape, role: str, offset: int = 0):
        self.dtype, self.shape, self.role, self.offset = dtype, tuple(shape), role, offset


class ProgramInfo:
    """A Program as its runner sees it: slots, arena size, the packed-weights state offsets
    (no kernels). Built from a Program (``of``) or from stored JSON (``from_doc``)."""

    def __init__(self, slots, arena_bytes: int, pack_offsets, key: str):
        self.slots = tuple(slots)
        self.arena_bytes = int(arena_bytes)
        self.pack_offsets = tuple(int(o) for o in pack_offsets)
        self.key_ = key

    def key(self) -> str:
        return self.key_

    def io_slots(self) -> tuple:
        return tuple(i for i, s in enumerate(self.slots) if s.role in ("input", "param",
                                                                       "output"))

    def slots_of(self, role: str) -> tuple:
        return tuple(i for i, s in enumerate(self.slots) if s.role == role)

    @classmethod
    def of(cls, program) -> "ProgramInfo":
        from .gemv import pack_states  # noqa: PLC0415 - a Program in hand: compiled already
        return cls([SlotInfo(s.dtype, s.shape, s.role, s.offset) for s in program.slots],
                   program.arena_bytes, pack_states(program), program.key())

    def to_doc(self) -> dict:
        return {"slots": [[s.dtype, list(s.shape), s.role, s.offset] for s in self.slots],
                "arena_bytes": self.arena_bytes, "pack_offsets": list(self.pack_offsets),
                "key": self.key_}

    @classmethod
    def from_doc(cls, doc: dict) -> "ProgramInfo":
        slots = [SlotInfo(str(d), tuple(int(n) for n in sh), str(r), int(o))
                 for d, sh, r, o in doc["slots"]]
        return cls(slots, doc["arena_bytes"], doc["pack_offsets"], str(doc["key"]))


def pack_offsets(program) -> tuple:
    """Arena offsets of ``program``'s pack state words (a ProgramInfo carries them)."""
    offsets = getattr(program, "pack_offsets", None)
    if offsets is not None:
        return offsets
    from .gemv import pack_states  # noqa: PLC0415
    return pack_states(program)


def _probe_data_offset():
    """CPython + NumPy: PyArrayObject's ``data`` pointer follows the object header. Reading
    it directly costs ~0.1 us; ``__array_interface__`` or ``.ctypes.data`` cost ~1-3 us,
    which matters for a per-call budget of a few microseconds. Verified here once."""
    from_address = ctypes.c_void_p.from_address
    probes = [np.empty(n, dtype=np.float32) for n in (1, 3, 1000)]
    off = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
    try:
        ok = all(from_address(id(a) + off).value == a.__array_interface__["data"][0]
                 for a in probes + [probes[2][5:]])
    except Exception:  # noqa: BLE001 - any surprise: use the documented interface
        ok = False
    return off if ok else None


_DATA_OFFSET = _probe_data_offset()
_from_address = ctypes.c_void_p.from_address


if _DATA_OFFSET is not None:
    def data_address(a: np.ndarray) -> int:
        """Address of an ndarray's first element (read from the object: ~0.1 us)."""
        return _from_address(id(a) + _DATA_OFFSET).value or 0
else:
    def data_address(a: np.ndarray) -> int:
        """Address of an ndarray's first element."""
        return a.__array_interface__["data"][0]


SMALL_OUTPUT = 4096  # bytes: below this NumPy's own (16-byte) alignment is kept


def new_arena(program):
    """(array, address): ``program``'s arena, 64-byte aligned and zeroed. Zero leaves every
    packed-weights state PACK_OFF (gemv.py): only an owner that binds parameters and sets
    the states on each binding (NativeRun) lets a program use packed copies."""
    nbytes = max(program.arena_bytes, 1)
    buf = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    off = (-data_address(buf)) % ALIGN
    return buf[off:off + nbytes], data_address(buf) + off


def aligned_empty(shape, dtype):
    """A fresh array whose data starts on a 64-byte boundary (arrays over 4 KiB; smaller ones
    keep NumPy's 16-byte alignment, which no loop here can tell apart), and that address."""
    dt = np.dtype(dtype)
    a = np.empty(shape, dtype=dt)
    addr = data_address(a)
    if addr % ALIGN == 0 or a.nbytes <= SMALL_OUTPUT:
        return a, addr
    nbytes = a.nbytes
    buf = np.empty(nbytes + ALIGN, dtype=np.uint8)
    base = data_address(buf)
    off = (-base) % ALIGN
    return buf[off:off + nbytes].view(dt).reshape(shape), base + off


class CompiledProgram:
    """A compiled Program: ``compiled(io, arena=None)`` runs it.

    ``io``: a ctypes ``c_void_p`` array (or its address) holding the pointers of the io slots
    (``program.io_slots()`` order); ``arena``: the address of ``arena_bytes`` bytes made by
    :func:`new_arena` (zeroed: packed-weights states must start PACK_OFF) (default: this
    program's own arena, allocated once; callers running one program from several threads
    at once pass their own). ``cfunc`` is the raw ctypes function (GIL released).
    """

    def __init__(self, program, name: str, module, symbol: str, threaded=False):
        self.program = program
        self.name = name
        self.symbol = symbol
        self.native = module
        self.cfunc = module.cfunc(symbol, None, ctypes.c_void_p, ctypes.c_void_p)
        self.arena, self.arena_ptr = new_arena(program)
        self.io_slots = program.io_slots()
        self.lock = threading.Lock()
        self._nthreads = None
        if threaded:
            from . import threadpool  # noqa: PLC0415 - compiled for threaded programs only
            addr = module.global_address(f"{symbol}.nthreads")
            self._nthreads = ctypes.c_int32.from_address(addr)
            ctypes.c_void_p.from_address(module.global_address(f"{symbol}.pool")).value = \
                threadpool.address()
            _follow_core_share(self)

    @property
    def threads(self) -> int:
        """Threads the program's big loop kernels use (1 when it has none)."""
        return self._nthreads.value if self._nthreads is not None else 1

    def set_threads(self, n: int):
        """Threads for the program's big loop kernels (default: the device's core share)."""
        if self._nthreads is not None:
            self._nthreads.value = max(1, int(n))

    def __call__(self, io, arena=None):
        if not isinstance(io, int):
            io = ctypes.addressof(io)
        self.cfunc(io, self.arena_ptr if arena is None else arena)

    def runner(self, params=(), check=True):
        from .emit import Runner  # noqa: PLC0415
        return Runner(self, params, check)


_threaded_programs: "weakref.WeakSet[CompiledProgram]" = weakref.WeakSet()


def _follow_core_share(compiled: CompiledProgram):
    """Threaded programs use the device's core share, and follow it when it changes."""
    from runtime import engine  # noqa: PLC0415
    if not _threaded_programs and not getattr(_follow_core_share, "hooked", False):
        engine.on_core_share(lambda n: [p.set_threads(n) for p in list(_threaded_programs)])
        _follow_core_share.hooked = True
    _threaded_programs.add(compiled)
    compiled.set_threads(engine.threads_per_cpu_device())



def _rows_contiguous(a, shape, itemsize) -> bool:
    """Each row of ``a`` (its first axis indexed) C-contiguous, of ``shape``: the strides of
    its axes longer than 1 are those of a C-ordered array (NumPy's own rule)."""
    want = itemsize
    for d, st in zip(reversed(shape), reversed(a.strides[1:])):
        if d > 1 and st != want:
            return False
        want *= d
    return True


class NativeRun:
    def __init__(self, compiled, binding):
        prog = compiled.program
        self.compiled = compiled
        self._binding = binding
        self.cfunc = compiled.cfunc
        io_slots = prog.io_slots()
        self.io = (ctypes.c_void_p * max(len(io_slots), 1))()
        self.io_addr = ctypes.addressof(self.io)
        self._io_arg = ctypes.c_void_p(self.io_addr)  # ctypes passes these without converting
        self.arena, self.arena_ptr = new_arena(prog)
        # the packed-weights states (gemv.py) in this arena: set on each parameter binding
        self._pack_states = [self.arena[off:off + 8].view(np.int64)
                             for off in pack_offsets(prog)]
        self.arena_bytes = prog.arena_bytes
        self._arena_arg = ctypes.c_void_p(self.arena_ptr)
        self.lock = threading.Lock()
        self.inputs, self.params, self.outs, self.aliases = [], [], [], []
        # inputs that may have fewer rows than their slot: a row-bounded program's padded
        # inputs, of which it reads the rows below its count only (llvm/exec.py sets them;
        # the caller hands at least that many: hybrid/buckets.py)
        self.short_inputs = frozenset()
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
        self.binding = binding  # what the executable cache stores (compiler/exe_cache.py)
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
            if getattr(a, "__device_memory__", False):  # an (emulated) GPU's array
                raise TypeError(f"native CPU code was handed a GPU's array "
                                f"({a.dtype}{list(a.shape)}): it must be copied to the host")
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
        if self.plain:
            return outs
        from ..lower import gather_outputs  # noqa: PLC0415 - outputs other than slots
        return gather_outputs(self.results, outs, inputs, params)

    def _bind_inputs(self, io, inputs, keep):
        """Point ``io`` at the inputs' data; converted copies are appended to ``keep`` (alive
        until the call returns)."""
        short = self.short_inputs
        for pos, i, shape, dt in self.inputs:
            a = inputs[i]
            # dtype identity: NumPy's built-in dtypes are singletons, and a miss only costs
            # the conversion check below, never a wrong pointer
            if type(a) is not np.ndarray or a.dtype is not dt or a.shape != shape or \
                    not a.flags.c_contiguous:
                if not (i in short and type(a) is np.ndarray and a.dtype is dt and
                        a.shape[1:] == shape[1:] and a.shape[0] <= shape[0] and
                        a.flags.c_contiguous):
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

    def twin(self) -> "NativeRun":
        """A runner of the same code with an arena of its own: two threads can run it at
        once (a loop split across the batch, compiler/control_flow.py)."""
        return NativeRun(self.compiled, self._binding)

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
            # each row C-contiguous (a view of a slice of the batch is fine: a loop split
            # across threads, compiler/control_flow.py)
            if type(a) is not np.ndarray or a.dtype != dt or a.shape[1:] != shape or \
                    not _rows_contiguous(a, shape, dt.itemsize) or \
                    not (0 <= first < a.shape[0] and 0 <= first + (n - 1) * step < a.shape[0]):
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
            from .steps import driver as steps_driver  # noqa: PLC0415
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
