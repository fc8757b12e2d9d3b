"""The LLVM CPU backend: a kernel-IR Program -> one native function (llvmlite).

The module has one internal function per kernel and the entry point
``void <name>(void** io, char* arena)`` that computes each slot's address once (io pointers,
arena + constant offsets) and calls the kernels in order. A kernel function takes one pointer
per distinct buffer it touches, marked ``noalias`` unless the memory plan made two of its
buffers overlap, so LLVM vectorizes without runtime alias checks.

Loop kernels (:class:`LoopEmitter`):

- dimensions of extent 1 are dropped and adjacent dimensions that every access walks
  contiguously are merged (a contiguous elementwise op becomes one flat loop);
- the innermost loop is the dimension with the most unit-stride accesses (a reduction output
  with stride 0 there counts: it accumulates in a register), outer loops are ordered by
  decreasing stride; constant trip counts, GEP addressing, so LLVM's O3 vectorizes the
  inner loop (AVX2/AVX-512 per the host's features);
- every expression node is emitted at the outermost loop level where its inputs are
  invariant (broadcast operands and their arithmetic are computed once per outer iteration);
- reductions accumulate in a register over the innermost run of reduced dimensions (float
  adds/muls marked ``reassoc`` so they vectorize with several partial sums, like NumPy's
  pairwise sum), and through memory otherwise (the output region is first set to the
  identity);
- kernels of at least PARALLEL_MIN_ELEMENTS points split their outermost loop across threads
  (``CompiledProgram.threads``, default: the CPU device's core share from runtime.engine):
  chunks claimed by the caller and the process-wide pool's threads (threadpool.py), or
  threads started for the loop when another caller holds the pool; reductions over that loop
  stay serial;
- float32 sin/cos kernels are versioned: a fast nest (NumPy's algorithm) runs first and the
  general one (huge arguments) only if some argument needed it;
- a float32 copy that loads along one level and stores along another (a transpose) moves
  blocks of lanes x lanes through registers: vector loads, shuffles, vector stores (a 1 MB
  weight's transpose 3x faster than a gathered load per element).

Extern kernels are emitted by extern.py (BLAS calls and loop nests, one file per family; big
ones split into workers that the same parallel driver runs).

Calling convention: ``CompiledProgram(io, arena)``; ``Runner`` binds params once and only
touches the input and output pointers per call; ``run_program`` is the one-shot helper.
"""
from __future__ import annotations

import ctypes
import math
import re

import numpy as np
from llvmlite import ir

from runtime import native

from ..extern_plan import MAX_THREADS
from ..kernel import (ALIGN, SOURCE_OPS, Call, Const, ExternKernel, Index, Load, LoopKernel,
                      Program, expr_nodes, scalar_arity)
from ..scalar import Typed, eval_call, reduce_scalar
from .loaded import ALIGN as _LOADED_ALIGN
from .loaded import (SMALL_OUTPUT, CompiledProgram, aligned_empty,  # noqa: F401 - re-exported
                     data_address, new_arena)
from .scalar import F32, I1, I32, I64, PTR, Intrinsics, LLVMScalarBuilder, mem_type, reg_type
from .shuffles import transpose_block

assert _LOADED_ALIGN == ALIGN, "loaded.ALIGN must be kernel.ALIGN"

CODEGEN_VERSION = 11
VOID = ir.VoidType()
# A loop kernel of at least this many points splits its outer loop across the device's
# threads (thread start-up is ~10-30 us; below this the kernel takes about that long).
PARALLEL_MIN_ELEMENTS = 1 << 17
# Instructions per shard of a module (ModuleBuilder.build_shards): LLVM optimizes a shard
# while Python builds the next (a big kernel is one shard, small ones share one). 150: an
# MLP's two batch-1 Dense layers land in shards of their own, compiled on both cores (cold
# first call, medians of 6: 179 -> 162 ms; LeNet and training steps unchanged).
SHARD_INSTRUCTIONS = 150


def sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name or "program")
    return s if not s[0].isdigit() else "_" + s


# ------------------------------------------------------------------ module level
class ModuleBuilder:
    """Builds the LLVM module of one Program."""

    def __init__(self, program: Program, name: str):
        program.validate()
        self.program = program
        self.name = sanitize(name)
        self.module = ir.Module(name=self.name)
        info = native.target_info()
        self._triple, self._data_layout = info["triple"], info["data_layout"]
        self.module.triple = self._triple
        self.module.data_layout = self._data_layout
        self.intr = Intrinsics(self.module)
        self.uses_blas = False
        self.threaded = False
        self.defined_globals: set = set()  # module globals defined in an earlier shard

    def module_global(self, name: str, ty, init) -> ir.GlobalVariable:
        """The module-wide variable ``name``: defined (with ``init``) in the first shard
        that uses it, declared in later ones (the linked module has one definition)."""
        g = self.module.globals.get(name)
        if g is None:
            g = ir.GlobalVariable(self.module, ty, name)
            if name not in self.defined_globals:
                g.initializer = init
        return g

    def build(self) -> str:
        """The whole module as one IR text."""
        (text,) = self.build_shards(per_shard=0)
        return text

    def build_shards(self, per_shard: int | None = None):
        """The module as a sequence of IR texts ("shards"), generated lazily: a shard closes
        once its kernels hold ``per_shard`` instructions (default SHARD_INSTRUCTIONS; 0: one
        shard), so the caller optimizes it while the next one is built (native.compile_ir).
        Kernels called across shards have external linkage; the entry point, which calls
        them all, is in the last shard; a thread global is defined in the shard of its
        first use and declared in later ones: linked, the shards are the one-shard module."""
        from . import extern  # noqa: PLC0415 - avoid an import cycle
        limit = SHARD_INSTRUCTIONS if per_shard is None else per_shard
        prog = self.program
        fns = []
        shard_start = 0  # index in fns of the current shard's first kernel
        for k, step in enumerate(prog.steps):
            fname = f"{self.name}.k{k}.{sanitize(step.name or type(step).__name__)}"
            used = _used_slots(step)
            bound = prog.bound_of(k)
            if bound is not None and prog.count_slot not in used:
                used.append(prog.count_slot)  # the step reads the real row count
            groups = param_groups(prog, used)
            if isinstance(step, LoopKernel):
                fn = LoopEmitter(self, step, fname, groups, bound=bound).emit()
            else:
                fn = extern.emit_extern(self, step, fname, groups, bound=bound)
            fns.append((fn, groups))
            if limit > 0 and k + 1 < len(prog.steps) and \
                    _instructions(self.module) >= limit:
                for f, _ in fns[shard_start:]:
                    f.linkage = "external"  # called from the entry's shard
                yield str(self.module)
                self._next_shard()
                shard_start = len(fns)
        entry = ir.Function(self.module, ir.FunctionType(VOID, [PTR, PTR]), self.name)
        entry.attributes.add("nounwind")
        io, arena = entry.args
        io.name, arena.name = "io", "arena"
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        io_pos = {s: i for i, s in enumerate(prog.io_slots())}
        ptrs = {}

        def slot_ptr(s):
            if s not in ptrs:
                slot = prog.slots[s]
                if slot.in_arena:
                    ptrs[s] = b.gep(arena, [ir.Constant(I64, slot.offset)], inbounds=True,
                                    source_etype=ir.IntType(8), name=f"slot{s}")
                else:
                    p = b.gep(io, [ir.Constant(I64, io_pos[s])], inbounds=True,
                              source_etype=PTR)
                    ptrs[s] = b.load(p, name=f"slot{s}", typ=PTR, align=8)
            return ptrs[s]
        for k, (fn, groups) in enumerate(fns):
            if k < shard_start:  # defined in an earlier shard
                fn = ir.Function(self.module, fn.function_type, fn.name)
            b.call(fn, [slot_ptr(g.slots[0]) for g in groups])
        b.ret_void()
        yield str(self.module)

    def _next_shard(self):
        """Start a new module for the next kernels; the globals defined so far are declared
        in it when used again (module_global)."""
        for g in self.module.global_values:
            if isinstance(g, ir.GlobalVariable) and g.linkage == "" and \
                    g.initializer is not None:
                self.defined_globals.add(g.name)
        self.module = ir.Module(name=self.name)
        self.module.triple = self._triple
        self.module.data_layout = self._data_layout
        self.intr = Intrinsics(self.module)


def _instructions(module: ir.Module) -> int:
    return sum(len(block.instructions) for fn in module.functions for block in fn.blocks)


def _used_slots(step) -> list:
    if isinstance(step, LoopKernel):
        slots = [a.slot for a in step.loads] + [o.access.slot for o in step.outputs]
    else:
        slots = list(step.in_slots) + list(step.out_slots)
        if step.scratch is not None:
            slots.append(step.scratch)
    out = []
    for s in slots:
        if s not in out:
            out.append(s)
    return out


class ParamGroup:
    """Slots a kernel reaches through one pointer argument."""

    def __init__(self, slots, noalias):
        self.slots = slots
        self.noalias = noalias


def param_groups(program: Program, used) -> list:
    """Group arena slots at the same offset; noalias unless byte ranges overlap another's."""
    groups, by_offset = [], {}
    for s in used:
        slot = program.slots[s]
        if slot.in_arena:
            g = by_offset.get(slot.offset)
            if g is not None:
                g.slots.append(s)
                continue
            g = by_offset[slot.offset] = ParamGroup([s], True)
        else:
            g = ParamGroup([s], True)
        groups.append(g)

    def span(g):
        lo = min(program.slots[s].offset for s in g.slots)
        return lo, max(program.slots[s].offset + program.slots[s].nbytes for s in g.slots)
    arena_groups = [g for g in groups if program.slots[g.slots[0]].in_arena]
    for i, g in enumerate(arena_groups):
        lo, hi = span(g)
        for h in arena_groups[i + 1:]:
            lo2, hi2 = span(h)
            if lo < hi2 and lo2 < hi:
                g.noalias = h.noalias = False
    return groups


def kernel_function(mb: ModuleBuilder, fname: str, groups, extra=()) -> ir.Function:
    fn = ir.Function(mb.module, ir.FunctionType(VOID, [PTR] * len(groups) + list(extra)),
                     fname)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for arg, g in zip(fn.args, groups):
        arg.name = "s" + "_".join(map(str, g.slots))
        if g.noalias:
            arg.add_attribute("noalias")
    return fn


# ------------------------------------------------------------------- loop kernels
def with_index(expr):
    """Make the implicit element index of source-op calls explicit (Index(None))."""
    if not isinstance(expr, Call):
        return expr
    args = tuple(with_index(a) for a in expr.args)
    if expr.op in SOURCE_OPS and len(args) == scalar_arity(expr.op):
        args = args + (Index(None),)
    return Call(expr.op, expr.attrs, args, expr.dtype)


class _Acc:
    """One strided walk: a load, an output or an index, over the normalized loop dims."""

    def __init__(self, strides, offset, slot=None):
        self.strides = list(strides)
        self.offset = offset
        self.slot = slot
        self.level = -1


class LoopEmitter:
    def __init__(self, mb: ModuleBuilder, kernel: LoopKernel, fname: str, groups,
                 program: Program | None = None, bound=None):
        self.mb = mb
        self.program = program or mb.program  # externs lower to loops over derived slots
        self.k = kernel
        self.fname = fname
        self.groups = groups
        # a row bound (kernel.Program.rows): ("loop", d), per -> loop dimension d runs
        # min(extent, count * per) times, count read from the program's count slot
        self.bound = bound

    # -- normalization ---------------------------------------------------------
    def _normalize(self):
        k = self.k
        shape = tuple(k.loop_shape)
        self.exprs = [with_index(o.expr) for o in k.outputs]
        nodes = []
        seen = set()
        for e in self.exprs:
            for n in expr_nodes(e):
                if n not in seen:
                    seen.add(n)
                    nodes.append(n)
        self.nodes = nodes
        rowmajor = []
        acc = 1
        for n in reversed(shape):
            rowmajor.append(acc)
            acc *= n
        rowmajor = tuple(reversed(rowmajor))
        accs = [_Acc(a.strides, a.offset, a.slot) for a in k.loads]
        accs += [_Acc(o.access.strides, o.access.offset, o.access.slot) for o in k.outputs]
        self.index_acc = {}
        for n in nodes:
            if isinstance(n, Index):
                st = rowmajor if n.dim is None else tuple(
                    1 if d == n.dim else 0 for d in range(len(shape)))
                self.index_acc[n] = len(accs)
                accs.append(_Acc(st, 0))
        self.accs = accs
        self.n_loads = len(k.loads)
        dims = [(n, [a.strides[d] for a in accs], d) for d, n in enumerate(shape) if n != 1]
        bounded = self.bound[0][1] if self.bound is not None else None
        merged = []  # (extent, strides, the original dimensions merged, outermost first)
        for n, st, d in dims:
            if merged and n > 0 and merged[-1][0] > 0 and d != bounded and all(
                    sp == sc * n for sp, sc in zip(merged[-1][1], st)):
                merged[-1] = (merged[-1][0] * n, st, merged[-1][2] + (d,))
            else:  # (a bounded dimension leads its group: its bound is a prefix of it)
                merged.append((n, st, (d,)))
        self.empty = any(n == 0 for n, _, _ in merged)
        ordered = self._order(merged)
        self.bound_level, self.bound_scale = None, 1
        for level, (n, _, ids) in enumerate(ordered):
            if bounded in ids:
                self.bound_level = level
                self.bound_scale = self.bound[1] * math.prod(shape[d] for d in ids[1:])
        self.dims = [(n, st) for n, st, _ in ordered]
        for j, a in enumerate(accs):
            a.strides = [st[j] for _, st in self.dims]
            nz = [L for L, s in enumerate(a.strides) if s != 0]
            a.level = max(nz) if nz else -1

    def _order(self, dims):
        if len(dims) <= 1:
            return dims
        n_out = len(self.k.outputs)
        out0 = self.n_loads

        def unit_score(d):
            st = dims[d][1]
            score = 0
            for j in range(self.n_loads):
                score += abs(st[j]) == 1
            for j in range(n_out):
                s = st[out0 + j]
                if abs(s) == 1 or (s == 0 and self.k.outputs[j].reduce is not None):
                    score += 1
            return score
        inner = max(range(len(dims)), key=lambda d: (unit_score(d), d))
        rest = [d for d in range(len(dims)) if d != inner]
        rest.sort(key=lambda d: (-sum(abs(s) for s in dims[d][1]), d))
        return [dims[d] for d in rest + [inner]]

    # -- emission ----------------------------------------------------------------
    def emit(self) -> ir.Function:
        self._normalize()
        fn = kernel_function(self.mb, self.fname, self.groups)
        self.parallel = self._parallel_plan()
        self.transposing = self._transpose_plan()
        emit_body = self._emit_transpose if self.transposing else self._emit_body
        if self.parallel:
            body = kernel_function(self.mb, self.fname + ".body", self.groups,
                                   extra=[I64, I64])
            emit_body(body, body.args[-2], body.args[-1])
            runtime = self._bound_value if self.bound_level == 0 else None
            emit_parallel_driver(self.mb, fn, body, self.dims[0][0], self._fill_driver,
                                 runtime=runtime)
            return fn
        emit_body(fn, None, None)
        return fn

    # -- transposing copies ----------------------------------------------------------
    def _transpose_plan(self):
        """(i level, j level) when the kernel copies 4-byte elements with a transpose: the
        innermost level stores contiguously but loads strided, level j loads contiguously
        (a weight's transpose, a panel packing). Blocks of lanes x lanes then go through
        registers (vector loads along j, shuffles, vector stores along i) instead of one
        gathered load per element, each from another cache line."""
        k = self.k
        if self.empty or self.bound is not None or len(k.outputs) != 1 or \
                k.outputs[0].reduce is not None or not isinstance(k.outputs[0].expr, Load) \
                or len(self.dims) < 2:
            return None
        ld = k.outputs[0].expr.index
        dt = self.program.slots[k.loads[ld].slot].dtype
        if dt != "float32" or self.program.slots[k.outputs[0].access.slot].dtype != dt:
            return None
        from ..extern_plan import vector_lanes  # noqa: PLC0415
        lanes = vector_lanes(dt)
        load, store = self.accs[ld], self.accs[self.n_loads]
        ti = len(self.dims) - 1
        if store.strides[ti] != 1 or load.strides[ti] in (0, 1) or self.dims[ti][0] < lanes:
            return None
        for tj in range(ti):
            if load.strides[tj] == 1 and store.strides[tj] != 0 and \
                    self.dims[tj][0] >= lanes:
                return ti, tj, lanes
        return None

    def _emit_transpose(self, fn, lo, hi):
        """The copy as loops over every level, levels i and j (_transpose_plan) in blocks of
        `lanes`, each block transposed in registers; the tails of i and j element by
        element. [lo, hi): the outermost level's share (a parallel kernel's body)."""
        ti, tj, lanes = self.transposing
        self.lo, self.hi, self.red = lo, hi, {}
        b = self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.sb = LLVMScalarBuilder(b, self.mb.intr)
        self.base = {}
        for arg, g in zip(fn.args, self.groups):
            for sl in g.slots:
                self.base[sl] = arg
        ld = self.k.outputs[0].expr.index
        load, store = self.accs[ld], self.accs[self.n_loads]
        vty = ir.VectorType(F32, lanes)

        def step(off, acc, level, i):
            return b.add(off, b.mul(i, ir.Constant(I64, acc.strides[level])))

        def leaf(lo_off, st_off, blocked):
            if blocked[ti] and blocked[tj]:  # vectors along j, transposed, stored along i
                rows = [b.load(self._ptr(load.slot, b.add(lo_off, ir.Constant(
                    I64, c * load.strides[ti]))), typ=vty, align=4) for c in range(lanes)]
                for r, v in enumerate(transpose_block(b, rows, lanes)):
                    b.store(v, self._ptr(store.slot, b.add(st_off, ir.Constant(
                        I64, r * store.strides[tj]))), align=4)
                return
            for r in range(lanes if blocked[tj] else 1):
                for c in range(lanes if blocked[ti] else 1):
                    src = b.add(lo_off, ir.Constant(I64, r * load.strides[tj] +
                                                    c * load.strides[ti]))
                    dst = b.add(st_off, ir.Constant(I64, r * store.strides[tj] +
                                                    c * store.strides[ti]))
                    b.store(b.load(self._ptr(load.slot, src), typ=F32, align=4),
                            self._ptr(store.slot, dst), align=4)

        def nest(level, lo_off, st_off, blocked):
            if level == len(self.dims):
                leaf(lo_off, st_off, blocked)
                return
            start = self.lo if level == 0 and self.lo is not None else ir.Constant(I64, 0)
            end = self.hi if level == 0 and self.hi is not None else \
                ir.Constant(I64, self.dims[level][0])
            if level not in (ti, tj):
                with for_range(b, end, start=start) as i:
                    nest(level + 1, step(lo_off, load, level, i), step(st_off, store, level, i),
                         blocked)
                return
            # whole blocks from start, then the tail one by one
            full = b.add(start, b.mul(b.sdiv(b.sub(end, start), ir.Constant(I64, lanes)),
                                      ir.Constant(I64, lanes)))
            with for_range(b, full, start=start, step=lanes) as i:
                nest(level + 1, step(lo_off, load, level, i), step(st_off, store, level, i),
                     {**blocked, level: True})
            with for_range(b, end, start=full) as i:
                nest(level + 1, step(lo_off, load, level, i), step(st_off, store, level, i),
                     {**blocked, level: False})
        nest(0, ir.Constant(I64, load.offset), ir.Constant(I64, store.offset), {})
        b.ret_void()
        return fn

    def _parallel_plan(self) -> bool:
        """Split the outermost loop across threads? Only big kernels whose outer dimension
        every reduction keeps (each thread then owns disjoint outputs)."""
        if self.empty or not self.dims:
            return False
        total = math.prod(n for n, _ in self.dims)
        if total < PARALLEL_MIN_ELEMENTS or self.dims[0][0] < 2:
            return False
        for j, out in enumerate(self.k.outputs):
            if out.reduce is not None and self.accs[self.n_loads + j].strides[0] == 0:
                return False
        return True

    def _bound_value(self, b, args):
        """The bounded level's trip count: min(extent, count * scale), count >= 0 read from
        the count slot's pointer among ``args``."""
        count_slot = self.program.count_slot
        ptr = next(a for a, g in zip(args, self.groups) if count_slot in g.slots)
        count = b.load(ptr, typ=I64, align=8)
        count = b.select(b.icmp_signed("<", count, ir.Constant(I64, 0)),
                         ir.Constant(I64, 0), count)
        extent = ir.Constant(I64, self.dims[self.bound_level][0])
        n = b.mul(count, ir.Constant(I64, self.bound_scale))
        return b.select(b.icmp_signed("<", n, extent), n, extent)

    def _emit_body(self, fn, lo, hi):
        self.fn = fn
        self.lo, self.hi = lo, hi
        self.base = {}
        for arg, g in zip(fn.args, self.groups):
            for s in g.slots:
                self.base[s] = arg
        entry = fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.sb = LLVMScalarBuilder(self.b, self.mb.intr)
        self.bound_n = None if self.bound_level is None or self.empty else \
            self._bound_value(self.b, fn.args)
        if self.empty:
            self._emit_empty()
            self.b.ret_void()
            return fn
        n = len(self.dims)
        self.n = n
        # node levels
        self.node_level = {}
        for node in self.nodes:
            if isinstance(node, Load):
                lvl = self.accs[node.index].level
            elif isinstance(node, Index):
                lvl = self.accs[self.index_acc[node]].level
            elif isinstance(node, Const):
                lvl = -1
            else:
                lvl = max((self.node_level[a] for a in node.args), default=-1)
            self.node_level[node] = lvl
        self.by_level = {}
        for node in self.nodes:
            self.by_level.setdefault(self.node_level[node], []).append(node)
        # reductions
        self.red = {}
        for j, out in enumerate(self.k.outputs):
            if out.reduce is None:
                continue
            st = self.accs[self.n_loads + j].strides
            s = n
            while s > 0 and st[s - 1] == 0:
                s -= 1
            needs_init = any(x == 0 for x in st[:s])
            slot = self.program.slots[out.access.slot]
            combine, identity = reduce_scalar(out.reduce)
            info = {"start": s, "init": needs_init, "dtype": slot.dtype,
                    "combine": combine, "identity": identity, "alloca": None}
            if s < n:
                info["alloca"] = self._entry_alloca(reg_type(slot.dtype), f"acc{j}")
            self.red[j] = info
        # Loop versioning for float32 sin/cos: the nest runs first with NumPy's fast
        # Cody-Waite path only, OR-ing a flag when some |argument| is beyond its range; only
        # then does the general nest (exact reduction of huge arguments) run again. Needs a
        # kernel that does not read what it writes (re-running must be harmless).
        if self._rerunnable() and not (self.parallel and any(
                info["init"] for info in self.red.values())):
            self.sb.wide_flag = self._entry_alloca(I1, "wide")
            self.b.store(ir.Constant(I1, 0), self.sb.wide_flag)
        self._emit_nest()
        if self.sb.wide_used:
            flag = self.b.load(self.sb.wide_flag, typ=I1)
            general = self.fn.append_basic_block("general")
            done = self.fn.append_basic_block("done")
            self.b.cbranch(flag, general, done)
            self.b.position_at_end(general)
            self.sb.wide_flag = None
            self._emit_nest()
            self.b.branch(done)
            self.b.position_at_end(done)
        self.b.ret_void()
        return fn

    def _fill_driver(self, b, fn):
        """In the parallel driver: set init-reduction outputs to their identity."""
        saved = (self.b, self.sb, self.base)
        self.b, self.sb = b, LLVMScalarBuilder(b, self.mb.intr)
        self.base = {}
        for arg, g in zip(fn.args, self.groups):
            for s in g.slots:
                self.base[s] = arg
        for j, info in self.red.items():
            if info["init"]:
                self._emit_fill(j, info)
        self.b, self.sb, self.base = saved

    def _emit_nest(self):
        if not self.parallel:  # a parallel kernel's driver fills before the threads start
            for j, info in self.red.items():
                if info["init"]:
                    self._emit_fill(j, info)
        self.values = {}
        self.off = {a: ir.Constant(I64, acc.offset) for a, acc in enumerate(self.accs)}
        self._level_body(-1)

    def _entry_alloca(self, ty, name):
        with self.b.goto_entry_block():
            return self.b.alloca(ty, name=name)

    def _rerunnable(self) -> bool:
        slots = self.program.slots
        outs = {o.access.slot for o in self.k.outputs}
        for a in self.k.loads:
            for o in outs:
                if a.slot == o:
                    return False
                sa, so = slots[a.slot], slots[o]
                if sa.in_arena and so.in_arena and sa.offset < so.offset + so.nbytes and \
                        so.offset < sa.offset + sa.nbytes:
                    return False
        return True

    def _emit_empty(self):
        for j, out in enumerate(self.k.outputs):
            if out.reduce is None:
                continue
            acc = self.accs[self.n_loads + j]
            live = [d for d, s in enumerate(acc.strides) if s != 0]
            if any(self.dims[d][0] == 0 for d in live):
                continue
            slot = self.program.slots[out.access.slot]
            _, identity = reduce_scalar(out.reduce)
            self._emit_fill(j, {"dtype": slot.dtype, "identity": identity})

    def _emit_fill(self, j, info):
        """Set the region of reduction output j to the identity (before accumulating)."""
        acc = self.accs[self.n_loads + j]
        dims = [(self.dims[d][0], acc.strides[d]) for d in range(len(self.dims))
                if acc.strides[d] != 0]
        value = self.sb.const(info["identity"], info["dtype"]).v
        b = self.b

        def nest(level, off):
            if level == len(dims):
                self._store(acc.slot, off, value, info["dtype"])
                return
            extent, stride = dims[level]
            with for_range(b, extent) as i:
                nest(level + 1, b.add(off, b.mul(i, ir.Constant(I64, stride))))
        nest(0, ir.Constant(I64, acc.offset))

    def _ptr(self, slot, off):
        dt = self.program.slots[slot].dtype
        return self.b.gep(self.base[slot], [off], inbounds=True, source_etype=mem_type(dt))

    def _load(self, slot, off, dtype):
        v = self.b.load(self._ptr(slot, off), typ=mem_type(dtype), align=np.dtype(dtype).itemsize)
        if dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        return v

    def _store(self, slot, off, v, dtype):
        if dtype == "bool":
            v = self.b.zext(v, mem_type("bool"))
        self.b.store(v, self._ptr(slot, off), align=np.dtype(dtype).itemsize)

    def _value(self, node):
        v = self.values.get(node)
        if v is not None:
            return v
        if isinstance(node, Load):
            acc = self.accs[node.index]
            dt = self.program.slots[acc.slot].dtype
            v = Typed(self._load(acc.slot, self.off[node.index], dt), dt)
        elif isinstance(node, Const):
            v = self.sb.const(node.value, node.dtype)
        elif isinstance(node, Index):
            v = Typed(self.off[self.index_acc[node]], "int64")
        else:
            v = eval_call(self.sb, node, [self._value(a) for a in node.args])
        self.values[node] = v
        return v

    def _level_body(self, level):
        b = self.b
        if level >= 0:
            i = self.ivar
            for a, acc in enumerate(self.accs):
                s = acc.strides[level]
                if s != 0:
                    self.off[a] = b.add(self.off[a], b.mul(i, ir.Constant(I64, s)))
        for node in self.by_level.get(level, ()):
            self._value(node)
        starting = [j for j, info in self.red.items() if info["start"] == level + 1
                    and info["alloca"] is not None]
        for j in starting:
            info = self.red[j]
            b.store(self.sb.const(info["identity"], info["dtype"]).v, info["alloca"])
        if level + 1 < self.n:
            saved_off = dict(self.off)
            saved_vals = dict(self.values)
            if level == -1 and self.lo is not None:
                rng = for_range(b, self.hi, start=self.lo)
            elif level + 1 == self.bound_level:
                rng = for_range(b, self.bound_n)
            else:
                rng = for_range(b, self.dims[level + 1][0])
            with rng as i:
                self.ivar = i
                self._level_body(level + 1)
            self.off = saved_off
            self.values = saved_vals
        else:
            self._innermost()
        for j in starting:
            info = self.red[j]
            oa = self.n_loads + j
            acc = b.load(info["alloca"], typ=reg_type(info["dtype"]))
            self._finish(j, info, Typed(acc, info["dtype"]), oa)

    def _combine(self, info, x, y):
        self.sb.reassoc = True
        try:
            r = info["combine"](self.sb, x, y)
        finally:
            self.sb.reassoc = False
        return self.sb.typed(r, info["dtype"])

    def _finish(self, j, info, v, oa):
        slot = self.accs[oa].slot
        if info["init"]:
            old = Typed(self._load(slot, self.off[oa], info["dtype"]), info["dtype"])
            v = self._combine(info, old, v)
        self._store(slot, self.off[oa], v.v, info["dtype"])

    def _innermost(self):
        b = self.b
        for j, out in enumerate(self.k.outputs):
            oa = self.n_loads + j
            dt = self.program.slots[out.access.slot].dtype
            v = self.sb.typed(self._value(self.exprs[j]), dt)
            info = self.red.get(j)
            if info is None:
                self._store(out.access.slot, self.off[oa], v.v, dt)
            elif info["alloca"] is None:  # nothing reduced in a register: straight to memory
                self._finish(j, info, v, oa)
            else:
                acc = Typed(b.load(info["alloca"], typ=reg_type(dt)), dt)
                b.store(self._combine(info, acc, v).v, info["alloca"])


class for_range:
    """``with for_range(b, n) as i:`` a counted loop 0..n-1 (n > 0, an int or i64 value)."""

    def __init__(self, b: ir.IRBuilder, n, start=0, step=1):
        self.b = b
        self.n = n if isinstance(n, ir.Value) else ir.Constant(I64, int(n))
        self.start = start if isinstance(start, ir.Value) else ir.Constant(I64, int(start))
        self.step = step

    def __enter__(self):
        b = self.b
        fn = b.function
        self.pre = b.block
        self.header = fn.append_basic_block("loop")
        self.exit = fn.append_basic_block("loop.end")
        if not (isinstance(self.n, ir.Constant) and isinstance(self.start, ir.Constant)):
            b.cbranch(b.icmp_signed("<", self.start, self.n), self.header, self.exit)
        else:
            b.branch(self.header)
        b.position_at_end(self.header)
        self.i = b.phi(I64, name="i")
        self.i.add_incoming(self.start, self.pre)
        return self.i

    def __exit__(self, *exc):
        if exc[0] is not None:
            return False
        b = self.b
        nxt = b.add(self.i, ir.Constant(I64, self.step), flags=["nsw"])
        self.i.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, self.n), self.header, self.exit)
        b.position_at_end(self.exit)
        return False


# --------------------------------------------------------------------- threads
def nthreads_global(mb: ModuleBuilder):
    """The module's thread count (an exported i32 the runtime sets; 1 until it does)."""
    mb.threaded = True
    return mb.module_global(f"{mb.name}.nthreads", ir.IntType(32),
                            ir.Constant(ir.IntType(32), 1))


CHUNKS_PER_THREAD = 4  # pool chunks of a parallel loop: a late thread leaves them to others


def emit_parallel_driver(mb: ModuleBuilder, fn, body, extent: int, fill, spawn=True,
                         runtime=None):
    """``fn(ptrs...)``: run ``body(ptrs..., lo, hi)`` over [0, extent) on up to ``nthreads``
    threads: chunks of [0, extent) claimed by the caller and the process-wide pool's threads
    (threadpool.py); when another caller holds the pool, split across POSIX threads started
    here (the caller's thread takes the first chunk; a thread that cannot be started has its
    chunk run by the caller), or with spawn=False run whole by the caller. Either way every
    point runs once, whatever the thread count. ``runtime(b, ptrs) -> i64`` (a row bound):
    the range is [0, that) instead, at most ``extent``."""
    i32 = ir.IntType(32)
    nptr = len(body.args) - 2
    pooled = _pool_task(mb, fn, body, extent, runtime)
    ctx_ty = ir.LiteralStructType([PTR] * nptr + [I64, I64])
    tramp = ir.Function(mb.module, ir.FunctionType(PTR, [PTR]), fn.name + ".thread")
    tramp.linkage = "internal"
    tb = ir.IRBuilder(tramp.append_basic_block("entry"))
    ctx = tramp.args[0]
    vals = [tb.load(tb.gep(ctx, [ir.Constant(i32, 0), ir.Constant(i32, k)], inbounds=True,
                           source_etype=ctx_ty), typ=t)
            for k, t in enumerate([PTR] * nptr + [I64, I64])]
    tb.call(body, vals)
    tb.ret(ir.Constant(PTR, None))
    create = mb.intr.get("pthread_create", i32, [PTR, PTR, PTR, PTR], readnone=False)
    join = mb.intr.get("pthread_join", i32, [I64, PTR], readnone=False)

    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ptrs = list(fn.args)
    arr_ctx = b.alloca(ir.ArrayType(ctx_ty, MAX_THREADS), name="ctx")
    arr_tid = b.alloca(ir.ArrayType(I64, MAX_THREADS), name="tid")
    arr_ok = b.alloca(ir.ArrayType(ir.IntType(8), MAX_THREADS), name="ok")

    def opaque(p):  # llvmlite types alloca'd pointers; launder them into an opaque ptr
        return b.inttoptr(b.ptrtoint(p, I64), PTR)
    fill(b, fn)
    n = ir.Constant(I64, extent) if runtime is None else runtime(b, ptrs)
    nt = b.sext(b.load(nthreads_global(mb), typ=i32), I64)
    nt = b.select(b.icmp_signed("<", nt, ir.Constant(I64, 1)), ir.Constant(I64, 1), nt)
    nt = b.select(b.icmp_signed(">", nt, ir.Constant(I64, min(MAX_THREADS, extent))),
                  ir.Constant(I64, min(MAX_THREADS, extent)), nt)
    if runtime is not None:  # fewer points than threads (none: nothing to run)
        with b.if_then(b.icmp_signed("<", n, ir.Constant(I64, 1))):
            b.ret_void()
        nt = b.select(b.icmp_signed(">", nt, n), n, nt)
    with b.if_then(b.icmp_signed("==", nt, ir.Constant(I64, 1))):
        b.call(body, ptrs + [ir.Constant(I64, 0), n])
        b.ret_void()
    pooled(b, ptrs, nt)
    if not spawn:
        b.call(body, ptrs + [ir.Constant(I64, 0), n])
        b.ret_void()
        return
    chunk = b.sdiv(b.add(n, b.sub(nt, ir.Constant(I64, 1))), nt)

    def bounds(t):
        lo = b.mul(t, chunk)
        hi = b.add(lo, chunk)
        hi = b.select(b.icmp_signed(">", hi, n), n, hi)
        return lo, hi

    def slot(arr, ty, t):
        return opaque(b.gep(arr, [ir.Constant(I64, 0), t], inbounds=True,
                            source_etype=ir.ArrayType(ty, MAX_THREADS)))
    with for_range(b, nt, start=1) as t:
        lo, hi = bounds(t)
        c = slot(arr_ctx, ctx_ty, t)
        for k, v in enumerate(ptrs + [lo, hi]):
            b.store(v, b.gep(c, [ir.Constant(i32, 0), ir.Constant(i32, k)], inbounds=True,
                             source_etype=ctx_ty))
        rc = b.call(create, [slot(arr_tid, I64, t), ir.Constant(PTR, None), tramp, c])
        b.store(b.zext(b.icmp_signed("==", rc, ir.Constant(i32, 0)), ir.IntType(8)),
                slot(arr_ok, ir.IntType(8), t))
    lo0, hi0 = bounds(ir.Constant(I64, 0))
    b.call(body, ptrs + [lo0, hi0])
    with for_range(b, nt, start=1) as t:
        started = b.load(slot(arr_ok, ir.IntType(8), t), typ=ir.IntType(8))
        with b.if_else(b.icmp_signed("!=", started, ir.Constant(ir.IntType(8), 0))) as (
                then, otherwise):
            with then:
                b.call(join, [b.load(slot(arr_tid, I64, t), typ=I64), ir.Constant(PTR, None)])
            with otherwise:
                lo, hi = bounds(t)
                b.call(body, ptrs + [lo, hi])
    b.ret_void()


def pool_global(mb: ModuleBuilder):
    """The module's pointer to the thread pool's entry (threadpool.py), set by the runtime
    with the thread count; null until then (the drivers then start threads of their own)."""
    return mb.module_global(f"{mb.name}.pool", PTR, ir.Constant(PTR, None))


def _pool_task(mb: ModuleBuilder, fn, body, extent: int, runtime=None):
    """The pool path of a parallel driver: ``emit(b, ptrs, nt)`` hands the pool a context
    (the pointers and the chunk count) and ``<fn>.task(ctx, c)``, which runs chunk c of
    [0, extent) (of [0, runtime(b, ptrs)) for a row bound); returns from the driver when the
    pool ran it."""
    nptr = len(body.args) - 2
    ctx_ty = ir.LiteralStructType([PTR] * nptr + [I64])
    task = ir.Function(mb.module, ir.FunctionType(VOID, [PTR, I64]), fn.name + ".task")
    task.linkage = "internal"
    tb = ir.IRBuilder(task.append_basic_block("entry"))
    ctx, c = task.args
    vals = [tb.load(tb.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True,
                           source_etype=ctx_ty), typ=t)
            for k, t in enumerate([PTR] * nptr + [I64])]
    chunks = vals[-1]
    n = ir.Constant(I64, extent) if runtime is None else runtime(tb, vals[:-1])
    lo = tb.sdiv(tb.mul(c, n), chunks)
    hi = tb.sdiv(tb.mul(tb.add(c, ir.Constant(I64, 1)), n), chunks)
    tb.call(body, vals[:-1] + [lo, hi])
    tb.ret_void()
    run_ty = ir.FunctionType(I32, [PTR, PTR, I64, I64])

    def emit(b, ptrs, nt):
        run = b.load(pool_global(mb), typ=run_ty.as_pointer())
        n = ir.Constant(I64, extent) if runtime is None else runtime(b, ptrs)
        with b.if_then(b.icmp_unsigned("!=", b.ptrtoint(run, I64), ir.Constant(I64, 0))):
            per = b.mul(nt, ir.Constant(I64, CHUNKS_PER_THREAD))
            chunks = b.select(b.icmp_signed("<", per, n), per, n)
            cx = b.inttoptr(b.ptrtoint(b.alloca(ctx_ty), I64), PTR)  # an opaque pointer
            for k, v in enumerate(ptrs + [chunks]):
                b.store(v, b.gep(cx, [ir.Constant(I32, 0), ir.Constant(I32, k)],
                                 inbounds=True, source_etype=ctx_ty))
            ran = b.call(run, [task, cx, chunks, nt])
            with b.if_then(b.icmp_signed("!=", ran, ir.Constant(I32, 0))):
                b.ret_void()
    return emit


# --------------------------------------------------------------- compile and run
def emit_ir(program: Program, name: str = "program") -> str:
    """The LLVM IR text of ``program`` (entry point ``sanitize(name)``)."""
    return ModuleBuilder(program, name).build()


_CODEGEN_AT_IMPORT = CODEGEN_VERSION


def settings_changed() -> bool:
    """Whether this process changed the code generator's settings since they were imported
    (CODEGEN_VERSION, the extern split: a test's monkeypatch); see extern_plan's."""
    from .. import extern_plan  # noqa: PLC0415
    from . import gemv  # noqa: PLC0415
    return CODEGEN_VERSION != _CODEGEN_AT_IMPORT or extern_plan.settings_changed() or \
        gemv.settings_changed()


def extern_key() -> list:
    """The settings that split externs into workers: part of the machine-code cache key, as
    the Program shows them only through scratch sizes. Read here, not through extern.py:
    a warm start (a disk cache hit) emits no IR, so it never imports the extern emitters
    (conv, matmul, sgemm: ~100 ms of imports on a first call; extern.extern_key is the
    same list, tests/test_eager_fast.py checks)."""
    from .. import extern_plan as p  # noqa: PLC0415
    from .gemv import GEMV_CHUNKS, GEMV_PARALLEL_MIN  # noqa: PLC0415
    return [p.max_workers(), p.PARALLEL_MIN_WORK, p.POOL_MIN_WORK, p.THIN_MIN_WORK,
            p.SCRATCH_BUDGET, GEMV_PARALLEL_MIN, GEMV_CHUNKS, p.SGEMM_PACK_MIN_ROWS,
            p.SGEMM_MAX_K, p.SGEMM_MAX_A_BYTES, p.SGEMM_MIN_WORK]


def compile_program(program: Program, name: str = "program") -> CompiledProgram:
    """Generate, optimize (O3, host CPU) and load ``program``; cached in memory and on disk.

    The disk cache is keyed by the Program's own hash (IR generation is deterministic), so a
    warm start loads machine code without building the LLVM module in Python at all.
    """
    symbol = sanitize(name)
    builder = []

    def ir_text():  # shards, built while LLVM optimizes the ones before
        builder.append(ModuleBuilder(program, name))
        return builder[0].build_shards()

    def pool():  # a threaded program loads the thread pool next: compile it meanwhile
        if builder and builder[0].threaded:
            from . import threadpool  # noqa: PLC0415
            threadpool.address()

    if any(isinstance(s, ExternKernel) for s in program.steps):
        from runtime import blas  # noqa: PLC0415 - BLAS symbols must exist before linking
        before = blas.load
    else:
        before = None
    key = {"codegen": CODEGEN_VERSION, "symbol": symbol, "externs": extern_key()}
    module = native.compile_ir(
        ir_text, [symbol], key=key, name=name,
        before_load=before, source_key=program.key(),
        optional_globals=[f"{symbol}.nthreads", f"{symbol}.pool"], meanwhile=pool)
    threaded = f"{symbol}.nthreads" in module.addresses
    return CompiledProgram(program, name, module, symbol, threaded)


class Runner:
    """The fast path: parameters bound once; ``runner(*inputs) -> outputs`` (fresh arrays).

    Per call it writes only the input and output pointers into a prebuilt pointer array.
    One Runner must not be called from two threads at once (each thread makes its own).
    """

    def __init__(self, compiled: CompiledProgram, params=(), check=True):
        prog = compiled.program
        self.compiled = compiled
        self.check = check
        io_pos = {s: i for i, s in enumerate(prog.io_slots())}
        self._io = (ctypes.c_void_p * max(len(io_pos), 1))()
        self._io_addr = ctypes.addressof(self._io)
        self._fn = compiled.cfunc
        self._arena = new_arena(prog)
        self._arena_ptr = self._arena[1]
        self._inputs = [(io_pos[s], tuple(prog.slots[s].shape), np.dtype(prog.slots[s].dtype))
                        for s in prog.slots_of("input")]
        self._outputs = [(io_pos[s], tuple(prog.slots[s].shape), np.dtype(prog.slots[s].dtype))
                         for s in prog.slots_of("output")]
        pslots = prog.slots_of("param")
        if len(params) != len(pslots):
            raise ValueError(f"program has {len(pslots)} params, got {len(params)}")
        self._params = []
        for s, p in zip(pslots, params):
            p = _check_array(p, tuple(prog.slots[s].shape), np.dtype(prog.slots[s].dtype),
                             f"param slot {s}")
            self._params.append(p)
            self._io[io_pos[s]] = data_address(p)

    def __call__(self, *inputs):
        io = self._io
        if len(inputs) != len(self._inputs):
            raise ValueError(f"program takes {len(self._inputs)} inputs, got {len(inputs)}")
        for (pos, shape, dt), x in zip(self._inputs, inputs):
            if self.check and not (type(x) is np.ndarray and x.dtype == dt and  # noqa: E721
                                   x.shape == shape and x.flags.c_contiguous):
                _check_array(x, shape, dt, f"input {pos}")
            io[pos] = data_address(x)
        outs = []
        for pos, shape, dt in self._outputs:
            a, ptr = aligned_empty(shape, dt)
            io[pos] = ptr
            outs.append(a)
        self._fn(self._io_addr, self._arena_ptr)
        return outs


def _check_array(x, shape, dt, what):
    if not isinstance(x, np.ndarray) or x.dtype != dt or x.shape != shape or \
            not x.flags.c_contiguous:
        got = f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}"
        raise ValueError(f"{what}: expected a C-contiguous {dt.name} array of shape "
                         f"{list(shape)}, got {got}")
    return x


def run_program(compiled: CompiledProgram, inputs, params=(), outputs=None) -> list:
    """Run once: outputs are fresh 64-byte-aligned arrays unless given; returns them."""
    prog = compiled.program
    io_slots = prog.io_slots()
    io = (ctypes.c_void_p * max(len(io_slots), 1))()
    queues = {"input": list(inputs), "param": list(params)}
    if outputs is None:
        outputs = [aligned_empty(prog.slots[s].shape, prog.slots[s].dtype)[0]
                   for s in prog.slots_of("output")]
    queues["output"] = list(outputs)
    keep = []
    for i, s in enumerate(io_slots):
        slot = prog.slots[s]
        a = _check_array(queues[slot.role].pop(0), tuple(slot.shape), np.dtype(slot.dtype),
                         f"{slot.role} slot {s}")
        keep.append(a)
        io[i] = data_address(a)
    if compiled.lock.acquire(blocking=False):
        try:
            compiled(io)
        finally:
            compiled.lock.release()
    else:  # the shared arena is busy (another thread): use a private one
        arena, ptr = new_arena(prog)
        compiled(io, ptr)
    return list(outputs)
