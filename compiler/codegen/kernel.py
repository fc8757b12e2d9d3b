"""The backend-neutral kernel IR: what a fused graph lowers to before any code is generated.

A :class:`Program` is a list of kernels over numbered buffers (*slots*). Every backend (LLVM,
the NumPy interpreter, later CUDA) runs a Program; none of them knows about graphs.

Slots
    ``Slot(dtype, shape, role, offset)``; ``role`` is one of

    - ``'input'``, ``'param'``, ``'output'``: buffers owned by the caller. The native entry point
      ``void <name>(void** io, char* arena)`` receives their pointers in ``io``, one per such
      slot in slot order (``Program.io_slots()``). Outputs are fresh buffers; distinct io slots
      never overlap, except that read-only slots may share memory.
    - ``'arena'``: an intermediate at byte ``offset`` of the program's private arena
      (``arena_bytes`` long). Arena slots may overlap (the memory planner's buffer reuse); a
      kernel may write a slot that it also reads only through the *same* access (in place).
    - ``'scratch'``: arena space an :class:`ExternKernel` uses internally (im2col columns).

Kernels
    - :class:`LoopKernel`: a loop nest over ``loop_shape``; ``loads`` are :class:`Access` es
      (element strides per loop dimension, 0 = broadcast, plus an element offset) read by
      ``Load(i)`` nodes; each :class:`Output` stores an expression through its own access, or
      reduces it (``reduce`` = 'sum' | 'prod' | 'max' | 'min'; the output access has stride 0
      on the reduced loop dimensions, every output element starts from the reduction's
      identity). Strides express broadcasting, transposes, slices with any step, reshapes of
      contiguous buffers and writes into a region (concatenate).
    - :class:`ExternKernel`: a library kernel (matmul, conv2d and its gradients, pool2d and
      its gradient, take, take_grad, pick, argmax, argmin) over whole slots.

Expressions
    ``Load(i)``, ``Const(value, dtype)`` (``dtype=None``: weak, like a Python scalar operand
    in the graph: it adopts the dtype of the typed operand it meets), ``Index(dim)`` (the
    loop index along ``dim``, or the row-major linear index of the loop space when ``dim``
    is None; int64) and
    ``Call(op, attrs, args, dtype)``: the registry op ``op`` whose meaning comes only from
    ``REGISTRY[op].scalar``; ``dtype`` is the op's output dtype from the graph's type rules.
    Source ops (``full``, ``arange``, ``random_uniform``, ``random_normal``,
    ``random_randint``) take their element's index into the op's own output (row-major) as an
    optional trailing int64 argument, ``Index(None)`` by default; random ops take the 0-d
    integer key as their first argument.

Everything is a frozen dataclass: hashable, comparable, and ``to_dict()`` gives plain JSON
for cache keys (``Program.key()``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from typing import Union

import numpy as np

from ..ops.core import ALL_DTYPES, REGISTRY, OpError, Spec, dtype_name, infer_types

IR_VERSION = 1
ROLES = ("input", "param", "output", "arena", "scratch")
IO_ROLES = ("input", "param", "output")
REDUCE_OPS = ("sum", "prod", "max", "min")
SOURCE_OPS = ("full", "arange", "random_uniform", "random_normal", "random_randint")
RANDOM_OPS = ("random_uniform", "random_normal", "random_randint")
EXTERN_OPS = ("matmul", "conv2d", "conv2d_grad_data", "conv2d_grad_weight", "pool2d",
              "pool2d_grad", "take", "take_grad", "pick", "argmax", "argmin")
ALIGN = 64  # bytes: arena slots, scratch and run_program's outputs start on a cache line


class KernelIRError(ValueError):
    """A Program is malformed (bad slot, access out of bounds, unknown op, ...)."""


def itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def contiguous_strides(shape) -> tuple:
    """Row-major element strides of ``shape``."""
    strides, acc = [], 1
    for n in reversed(tuple(shape)):
        strides.append(acc)
        acc *= int(n)
    return tuple(reversed(strides))


def dense_strides(shape, strides) -> bool:
    """Whether element ``strides`` lay ``shape`` out row-major without gaps (an extent-1
    dimension's stride never matters: a (1, 1) slice of a (4, 5) array is dense)."""
    return all(s == c for n, s, c in zip(shape, strides, contiguous_strides(shape)) if n != 1)


def make_attrs(attrs) -> tuple:
    """A dict (or item tuple) of attributes as a sorted tuple of items with hashable values."""
    items = attrs.items() if isinstance(attrs, dict) else attrs
    return tuple(sorted((str(k), _freeze(v)) for k, v in items))


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(a) for a in v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.dtype):
        return v.name
    return v


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if isinstance(v, tuple):
        return [_jsonable(a) for a in v]
    if isinstance(v, dict):
        return {k: _jsonable(a) for k, a in v.items()}
    return v


# --------------------------------------------------------------------------- slots
@dataclasses.dataclass(frozen=True)
class Slot:
    dtype: str
    shape: tuple
    role: str
    offset: int = 0  # byte offset into the arena ('arena' and 'scratch' slots)
    name: str = ""

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def in_arena(self) -> bool:
        return self.role in ("arena", "scratch")

    @property
    def spec(self) -> Spec:
        return Spec(tuple(self.shape), self.dtype)

    def to_dict(self):
        return {"dtype": self.dtype, "shape": list(self.shape), "role": self.role,
                "offset": self.offset, "name": self.name}


# ---------------------------------------------------------------------- expressions
@dataclasses.dataclass(frozen=True)
class Load:
    index: int  # into LoopKernel.loads

    def to_dict(self):
        return {"load": self.index}


@dataclasses.dataclass(frozen=True)
class Const:
    value: Union[float, int, bool]
    dtype: Union[str, None]  # None: weak, like a Python scalar operand (adopts the other's)

    def to_dict(self):
        return {"const": _jsonable(self.value), "dtype": self.dtype}


@dataclasses.dataclass(frozen=True)
class Index:
    dim: Union[int, None] = None  # None: the row-major linear index of the loop space

    def to_dict(self):
        return {"index": self.dim}


@dataclasses.dataclass(frozen=True)
class Call:
    op: str
    attrs: tuple  # make_attrs(...)
    args: tuple
    dtype: str

    def to_dict(self):
        return {"call": self.op, "attrs": [[k, _jsonable(v)] for k, v in self.attrs],
                "args": [a.to_dict() for a in self.args], "dtype": self.dtype}

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)


Expr = Union[Load, Const, Index, Call]


def call(op: str, *args, dtype: str, attrs=None) -> Call:
    """Shorthand: ``call('add', Load(0), Const(1.0, None), dtype='float32')``; op attributes
    as a dict: ``call('cast', Load(0), dtype='int32', attrs={'dtype': 'int32'})``."""
    return Call(op, make_attrs(attrs or {}), tuple(args), dtype)


# --------------------------------------------------------------------------- kernels
@dataclasses.dataclass(frozen=True)
class Access:
    slot: int
    strides: tuple  # elements per loop dimension (0: broadcast or reduced)
    offset: int = 0  # elements

    def to_dict(self):
        return {"slot": self.slot, "strides": list(self.strides), "offset": self.offset}


@dataclasses.dataclass(frozen=True)
class Output:
    access: Access
    expr: Expr
    reduce: Union[str, None] = None  # 'sum' | 'prod' | 'max' | 'min'

    def to_dict(self):
        return {"access": self.access.to_dict(), "expr": self.expr.to_dict(),
                "reduce": self.reduce}


@dataclasses.dataclass(frozen=True)
class LoopKernel:
    loop_shape: tuple
    loads: tuple  # of Access
    outputs: tuple  # of Output
    name: str = ""

    def to_dict(self):
        return {"kind": "loop", "loop_shape": list(self.loop_shape),
                "loads": [a.to_dict() for a in self.loads],
                "outputs": [o.to_dict() for o in self.outputs], "name": self.name}


@dataclasses.dataclass(frozen=True)
class ExternKernel:
    op: str
    attrs: tuple  # make_attrs(...); matmul also takes transpose_a / transpose_b
    in_slots: tuple
    out_slots: tuple
    scratch: Union[int, None] = None  # a 'scratch' slot, sized by extern_scratch_bytes
    name: str = ""

    def to_dict(self):
        return {"kind": "extern", "op": self.op,
                "attrs": [[k, _jsonable(v)] for k, v in self.attrs],
                "in_slots": list(self.in_slots), "out_slots": list(self.out_slots),
                "scratch": self.scratch, "name": self.name}

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)


Kernel = Union[LoopKernel, ExternKernel]


@dataclasses.dataclass(frozen=True)
class Program:
    slots: tuple
    arena_bytes: int
    steps: tuple
    # row bounds (compiler/passes/row_bounds.py): the int64 scalar input slot holding the
    # real number of batch units of a padded call, and per bounded step (step index, what,
    # per): ("loop", d) runs loop dimension d min(extent, count * per) times, ("m",) / ("k",)
    # a matmul's rows / contraction; a target may ignore them (every step then computes the
    # padded rows, which the caller fills with copies of real ones)
    count_slot: Union[int, None] = None
    rows: tuple = ()

    def io_slots(self) -> tuple:
        """Slot indices of io[0], io[1], ...: inputs, params and outputs in slot order."""
        return tuple(i for i, s in enumerate(self.slots) if s.role in IO_ROLES)

    def slots_of(self, role: str) -> tuple:
        return tuple(i for i, s in enumerate(self.slots) if s.role == role)

    def to_dict(self):
        d = {"ir_version": IR_VERSION, "slots": [s.to_dict() for s in self.slots],
             "arena_bytes": self.arena_bytes, "steps": [k.to_dict() for k in self.steps]}
        if self.rows:  # (absent otherwise: unbounded programs keep their keys)
            d["count_slot"] = self.count_slot
            d["rows"] = [[i, list(what), per] for i, what, per in self.rows]
        return d

    def bound_of(self, step: int):
        """(what, per) of step ``step``'s row bound, None when it has none."""
        for i, what, per in self.rows:
            if i == step:
                return what, per
        return None

    def key(self) -> str:
        """sha256 of the canonical JSON form."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def validate(self) -> "Program":
        validate(self)
        return self


# ------------------------------------------------------------------------ helpers
def expr_nodes(expr) -> list:
    """Every node of ``expr`` once (by equality), children before parents."""
    seen, order = set(), []

    def visit(e):
        if e in seen:
            return
        if isinstance(e, Call):
            for a in e.args:
                visit(a)
        seen.add(e)
        order.append(e)
    visit(expr)
    return order


def scalar_arity(op_name: str) -> int:
    """How many array operands the op's scalar expression takes (attributes excluded)."""
    if op_name in RANDOM_OPS:
        return 1
    op = REGISTRY[op_name]
    return _arity(op_name, op.scalar, op.attrs)


_ARITY: dict = {}


def _arity(name, fn, attrs):
    if name not in _ARITY:
        params = list(inspect.signature(fn).parameters.values())[1:]
        _ARITY[name] = sum(1 for p in params if p.name not in attrs and p.kind in (
            p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return _ARITY[name]


def access_extent(access: Access, loop_shape) -> tuple:
    """(lowest, highest) element index touched by ``access`` over a non-empty loop space."""
    lo = hi = access.offset
    for s, n in zip(access.strides, loop_shape):
        if s > 0:
            hi += s * (n - 1)
        else:
            lo += s * (n - 1)
    return lo, hi


def broadcast_strides(shape, loop_shape) -> tuple:
    """Strides reading a contiguous array of ``shape`` broadcast (NumPy rules) to loop_shape."""
    shape, loop_shape = tuple(shape), tuple(loop_shape)
    if len(shape) > len(loop_shape):
        raise KernelIRError(f"cannot broadcast {shape} to {loop_shape}")
    own = contiguous_strides(shape)
    lead = len(loop_shape) - len(shape)
    out = [0] * lead
    for n, m, s in zip(shape, loop_shape[lead:], own):
        if n == m:
            out.append(s if n != 1 else 0)
        elif n == 1:
            out.append(0)
        else:
            raise KernelIRError(f"cannot broadcast {shape} to {loop_shape}")
    return tuple(out)


# ------------------------------------------------------------------ extern helpers
def matmul_operand_shapes(in_shapes, attrs: dict) -> tuple:
    """Logical (a, b) shapes of a matmul extern (undo transpose_a / transpose_b)."""
    a, b = (tuple(s) for s in in_shapes)
    if attrs.get("transpose_a"):
        a = a[:-2] + (a[-1], a[-2])
    if attrs.get("transpose_b"):
        b = b[:-2] + (b[-1], b[-2])
    return a, b


def registry_attrs(op: str, attrs: dict) -> dict:
    """The attributes the registry op accepts (backend-only ones like transpose_a dropped)."""
    return {k: v for k, v in attrs.items() if k in REGISTRY[op].attrs}


def extern_out_specs(op: str, attrs: dict, in_specs) -> tuple:
    """Output Specs of an extern from its input Specs (the registry's type rule)."""
    in_specs = [Spec(tuple(s.shape), s.dtype) for s in in_specs]
    if op == "matmul":
        a, b = matmul_operand_shapes([s.shape for s in in_specs], attrs)
        in_specs = [Spec(a, in_specs[0].dtype), Spec(b, in_specs[1].dtype)]
    return infer_types(op, in_specs, registry_attrs(op, attrs))


def extern_scratch_bytes(op: str, attrs: dict, in_specs, out_specs) -> int:
    """Bytes of scratch arena an extern needs (0: none), from its plan (extern_plan.py)."""
    from .extern_plan import scratch_bytes  # noqa: PLC0415 - extern_plan reads this module
    return scratch_bytes(op, attrs, list(in_specs), list(out_specs))


# ---------------------------------------------------------------------- validation
def validate(program: Program):
    """Raise KernelIRError on a malformed program (checked statically, before codegen)."""
    slots = program.slots
    for i, s in enumerate(slots):
        if s.role not in ROLES:
            raise KernelIRError(f"slot {i}: role must be one of {ROLES}, got {s.role!r}")
        if s.dtype not in ALL_DTYPES:
            raise KernelIRError(f"slot {i}: unsupported dtype {s.dtype!r}")
        if any((not isinstance(n, (int, np.integer))) or n < 0 for n in s.shape):
            raise KernelIRError(f"slot {i}: bad shape {s.shape}")
        if s.in_arena:
            if s.offset < 0 or s.offset + s.nbytes > program.arena_bytes:
                raise KernelIRError(f"slot {i} ({s.role}) at byte {s.offset} with {s.nbytes} "
                                    f"bytes does not fit the arena of {program.arena_bytes}")
            if s.offset % s.itemsize:
                raise KernelIRError(f"slot {i}: arena offset {s.offset} is not aligned to "
                                    f"its itemsize {s.itemsize}")
    for k, step in enumerate(program.steps):
        where = f"step {k} ({step.name or type(step).__name__})"
        if isinstance(step, LoopKernel):
            _validate_loop(program, step, where)
        elif isinstance(step, ExternKernel):
            _validate_extern(program, step, where)
        else:
            raise KernelIRError(f"{where}: not a kernel: {step!r}")


def _check_access(program, acc, loop_shape, where, write):
    if not 0 <= acc.slot < len(program.slots):
        raise KernelIRError(f"{where}: access to unknown slot {acc.slot}")
    slot = program.slots[acc.slot]
    if len(acc.strides) != len(loop_shape):
        raise KernelIRError(f"{where}: access {acc} has {len(acc.strides)} strides for a "
                            f"{len(loop_shape)}-d loop space")
    if write and slot.role == "input":
        raise KernelIRError(f"{where}: writes input slot {acc.slot}")
    if math.prod(loop_shape) == 0:
        return
    lo, hi = access_extent(acc, loop_shape)
    if lo < 0 or hi >= slot.size:
        raise KernelIRError(f"{where}: access {acc} touches elements [{lo}, {hi}] of slot "
                            f"{acc.slot} which has {slot.size}")


def _validate_loop(program, k: LoopKernel, where):
    shape = tuple(k.loop_shape)
    for acc in k.loads:
        _check_access(program, acc, shape, where, False)
    if not k.outputs:
        raise KernelIRError(f"{where}: a loop kernel needs at least one output")
    for out in k.outputs:
        _check_access(program, out.access, shape, where, True)
        if out.reduce is not None and out.reduce not in REDUCE_OPS:
            raise KernelIRError(f"{where}: reduce must be one of {REDUCE_OPS}, got "
                                f"{out.reduce!r}")
        if out.reduce is None and math.prod(shape) > 0:
            bad = [d for d, (s, n) in enumerate(zip(out.access.strides, shape))
                   if s == 0 and n > 1]
            if bad:
                raise KernelIRError(f"{where}: output {out.access} has stride 0 on loop "
                                    f"dimension(s) {bad} but no reduce op")
        for node in expr_nodes(out.expr):
            _validate_node(node, k, shape, where)


def _validate_node(node, k, shape, where):
    if isinstance(node, Load):
        if not 0 <= node.index < len(k.loads):
            raise KernelIRError(f"{where}: Load({node.index}) but the kernel has "
                                f"{len(k.loads)} loads")
    elif isinstance(node, Index):
        if node.dim is not None and not 0 <= node.dim < len(shape):
            raise KernelIRError(f"{where}: Index({node.dim}) outside a {len(shape)}-d loop")
    elif isinstance(node, Const):
        if node.dtype is not None and node.dtype not in ALL_DTYPES:
            raise KernelIRError(f"{where}: Const of unsupported dtype {node.dtype!r}")
    elif isinstance(node, Call):
        op = REGISTRY.get(node.op)
        if op is None:
            raise KernelIRError(f"{where}: unknown op {node.op!r}")
        if node.op not in RANDOM_OPS and (op.scalar is None or op.kind == "reduce"):
            raise KernelIRError(f"{where}: op {node.op!r} ({op.kind}) has no scalar "
                                "expression; lower it as an ExternKernel or a reduce output")
        n = scalar_arity(node.op)
        extra = 1 if node.op in SOURCE_OPS else 0
        if not n <= len(node.args) <= n + extra:
            raise KernelIRError(f"{where}: {node.op} takes {n} argument(s)"
                                f"{' (+ an index)' if extra else ''}, got {len(node.args)}")
        if node.dtype not in ALL_DTYPES:
            raise KernelIRError(f"{where}: Call {node.op} of unsupported dtype {node.dtype!r}")
    else:
        raise KernelIRError(f"{where}: not an expression node: {node!r}")


def _validate_extern(program, k: ExternKernel, where):
    if k.op not in EXTERN_OPS:
        raise KernelIRError(f"{where}: extern op must be one of {EXTERN_OPS}, got {k.op!r}")
    for s in tuple(k.in_slots) + tuple(k.out_slots):
        if not 0 <= s < len(program.slots):
            raise KernelIRError(f"{where}: unknown slot {s}")
    for s in k.out_slots:
        if program.slots[s].role == "input":
            raise KernelIRError(f"{where}: writes input slot {s}")
    attrs = k.attr_dict
    ins = [program.slots[s].spec for s in k.in_slots]
    try:
        want = extern_out_specs(k.op, attrs, ins)
    except OpError as exc:
        raise KernelIRError(f"{where}: {exc}") from None
    got = [program.slots[s].spec for s in k.out_slots]
    if [tuple(w) for w in want] != [tuple(g) for g in got]:
        raise KernelIRError(f"{where}: {k.op} of {[str(s) for s in ins]} gives "
                            f"{[str(w) for w in want]}, but the output slots are "
                            f"{[str(g) for g in got]}")
    need = extern_scratch_bytes(k.op, attrs, ins, got)
    if need:
        if k.scratch is None:
            raise KernelIRError(f"{where}: {k.op} needs {need} bytes of scratch; give it a "
                                "'scratch' slot (ProgramBuilder.extern does)")
        sc = program.slots[k.scratch]
        if not sc.in_arena or sc.nbytes < need:
            raise KernelIRError(f"{where}: scratch slot {k.scratch} has {sc.nbytes} bytes in "
                                f"role {sc.role!r}; {k.op} needs {need} arena bytes")


# ------------------------------------------------------------------------ builder
class ProgramBuilder:
    """Assemble a Program: slots in order, arena slots bump-allocated (no reuse)."""

    def __init__(self):
        self.slots: list = []
        self.steps: list = []
        self.arena_bytes = 0

    def _add(self, shape, dtype, role, name="", offset=None):
        shape = tuple(int(n) for n in shape)
        dtype = dtype_name(dtype)
        if role in ("arena", "scratch") and offset is None:
            offset = self._reserve(int(math.prod(shape)) * itemsize(dtype))
        self.slots.append(Slot(dtype, shape, role, offset or 0, name))
        return len(self.slots) - 1

    def _reserve(self, nbytes: int) -> int:
        off = -(-self.arena_bytes // ALIGN) * ALIGN
        self.arena_bytes = off + nbytes
        return off

    def input(self, shape, dtype="float32", name=""):
        return self._add(shape, dtype, "input", name)

    def param(self, shape, dtype="float32", name=""):
        return self._add(shape, dtype, "param", name)

    def output(self, shape, dtype="float32", name=""):
        return self._add(shape, dtype, "output", name)

    def temp(self, shape, dtype="float32", name="", offset=None):
        """An arena slot (at ``offset`` bytes if given: slots may then share memory)."""
        if offset is not None:
            self.arena_bytes = max(self.arena_bytes,
                                   offset + int(math.prod(shape)) * itemsize(dtype))
        return self._add(shape, dtype, "arena", name, offset)

    def access(self, slot: int, loop_shape=None, strides=None, offset=0) -> Access:
        """An access of ``slot``: explicit strides, else its shape broadcast to loop_shape."""
        if strides is None:
            shape = self.slots[slot].shape
            strides = contiguous_strides(shape) if loop_shape is None else \
                broadcast_strides(shape, loop_shape)
        return Access(slot, tuple(int(s) for s in strides), int(offset))

    def loop(self, loop_shape, loads, outputs, name=""):
        self.steps.append(LoopKernel(tuple(int(n) for n in loop_shape), tuple(loads),
                                     tuple(outputs), name))
        return self.steps[-1]

    def extern(self, op, ins, outs, name="", **attrs):
        attrs = make_attrs(attrs)
        specs_in = [self.slots[s].spec for s in ins]
        specs_out = [self.slots[s].spec for s in outs]
        need = extern_scratch_bytes(op, dict(attrs), specs_in, specs_out)
        scratch = self._add((need,), "uint8", "scratch", f"{op}.scratch") if need else None
        self.steps.append(ExternKernel(op, attrs, tuple(ins), tuple(outs), scratch, name))
        return self.steps[-1]

    def build(self) -> Program:
        return Program(tuple(self.slots), int(self.arena_bytes), tuple(self.steps)).validate()
