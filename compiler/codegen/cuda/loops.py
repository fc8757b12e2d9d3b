"""Loop kernels as CUDA C: elementwise kernels here, reductions in reduction.py.

An elementwise LoopKernel becomes one grid-stride kernel over its loop space in row-major
order (thread i, then i + all threads, ...): loop dimensions that every access walks
contiguously are merged first, so a contiguous kernel decomposes no index at all. Each
access's element offset is its offset plus coordinate x stride per dimension (stride 0:
broadcast), so transposes, slices and broadcasts are plain strided loads. Every output's
value is computed (all loads done) before any store, which keeps in-place kernels right.

Vectorized form: where the merged loop space is one dimension, every access walks it with
stride 1 (or 0: a broadcast scalar) and the stride-1 accesses are 4-byte types, each thread
moves float4/int4 vectors, after a run-time check that every stride-1 pointer is 16-byte
aligned; the remainder (and unaligned buffers) take the scalar loop.

:class:`PointEval` evaluates a kernel's output expressions at one point, through the
registry's scalar expressions (eval_call over the CUDA scalar builder).
"""
from __future__ import annotations

import math

from ..kernel import Call, Const, Index, Load, LoopKernel, access_extent, expr_nodes
from ..scalar import Typed, eval_call
from .scalar import CudaScalarBuilder, load_expr, store_expr
from .writer import BLOCK, KernelWriter, ModuleWriter, decompose, grid_for, index_type, \
    linear_expr

VECTOR = {"float32": "float4", "int32": "int4"}
LANES = ("x", "y", "z", "w")
MAX_VECTOR_NODES = 48  # expression nodes at most in a vectorized kernel (4 copies of each)
VECTOR_MIN = 1024  # elements from which a kernel also gets the vector loop (a block's worth)


class PointEval:
    """The kernel's expression values at one point of its loop space.

    ``offset_of(access) -> C text`` gives an access's element offset at the point;
    ``index_of(dim) -> C text`` the loop index along ``dim`` (None: the row-major linear
    index); ``load_of(i)`` may supply a load's value itself (vector lanes)."""

    def __init__(self, kw: KernelWriter, k: LoopKernel, offset_of, index_of, load_of=None):
        self.kw = kw
        self.k = k
        self.sb = CudaScalarBuilder(kw.code)
        self.offset_of = offset_of
        self.index_of = index_of
        self.load_of = load_of
        self.memo: dict = {}
        self.slots = kw.mw.program.slots

    def value(self, node) -> Typed:
        v = self.memo.get(node)
        if v is not None:
            return v
        if isinstance(node, Load):
            v = self.load_of(node.index) if self.load_of else None
            if v is None:
                v = self.load(self.k.loads[node.index])
        elif isinstance(node, Const):
            v = self.sb.const(node.value, node.dtype)
        elif isinstance(node, Index):
            v = Typed(f"((long long)({self.index_of(node.dim)}))", "int64")
        elif isinstance(node, Call):
            args = [self.value(a) for a in node.args]
            v = eval_call(self.sb, node, args, lambda: Typed(
                f"((long long)({self.index_of(None)}))", "int64"))
        else:
            raise TypeError(node)
        self.memo[node] = v
        return v

    def load(self, acc) -> Typed:
        dt = self.slots[acc.slot].dtype
        ref = f"{self.kw.ptr(acc.slot)}[{self.offset_of(acc)}]"
        return Typed(self.sb.emit(dt, load_expr(dt, ref)), dt)

    def output(self, j: int) -> Typed:
        out = self.k.outputs[j]
        return self.sb.typed(self.value(out.expr), self.slots[out.access.slot].dtype)

    def store(self, acc, value: Typed):
        dt = self.slots[acc.slot].dtype
        ptr = self.kw.ptr(acc.slot, write=True)
        self.kw.code.line(f"{ptr}[{self.offset_of(acc)}] = {store_expr(dt, value.v)};")


def accesses(k: LoopKernel) -> list:
    return list(k.loads) + [o.access for o in k.outputs]


def merge_dims(shape, accs) -> list:
    """[(extent, strides per access)]: extent-1 dimensions dropped, adjacent dimensions that
    every access walks contiguously merged (row-major order kept)."""
    merged = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        st = [a.strides[d] for a in accs]
        if merged and all(sp == sc * n for sp, sc in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * n, st)
        else:
            merged.append((n, st))
    return merged


def slot_limits(program, accs, shape) -> list:
    """Highest element index each access reaches (for the index type)."""
    out = []
    for a in accs:
        lo, hi = access_extent(a, shape)
        out += [abs(lo), abs(hi), program.slots[a.slot].size]
    return out


class OriginalIndex:
    """Loop indices along the original dimensions of a point known by its linear index,
    decomposed once per point, when an Index node asks."""

    def __init__(self, code, it, shape, linear: str):
        self.code, self.it, self.shape, self.linear = code, it, tuple(shape), linear
        self.coords = None

    def __call__(self, dim):
        if dim is None:
            return self.linear
        if self.coords is None:
            names = [self.code.fresh("d") for _ in self.shape]
            self.coords = decompose(self.code, self.it, self.linear, self.shape, names)
        return self.coords[dim]


def emit_elementwise(mw: ModuleWriter, k: LoopKernel):
    shape = tuple(k.loop_shape)
    n = math.prod(shape)
    if n == 0:
        return
    accs = accesses(k)
    merged = merge_dims(shape, accs)
    vec = _vectorizable(mw.program, k, merged)
    grid = grid_for(n, BLOCK, 4 if vec else 1)
    it = index_type(n + grid * BLOCK, *slot_limits(mw.program, accs, shape))
    kw = KernelWriter(mw, k.name or "loop")
    start = _vector_loop(kw, k, it, n, merged) + " + " if vec else ""
    with kw.code.block(f"for ({it} i = {start}({it})blockIdx.x * blockDim.x + threadIdx.x; "
                       f"i < {n}; i += ({it})gridDim.x * blockDim.x)"):
        _scalar_point(kw, k, it, "i", merged, shape)
    kw.finish(grid, BLOCK)


def _scalar_point(kw, k, it, var, merged, shape):
    code = kw.code
    coords = decompose(code, it, var, [m for m, _ in merged],
                       [code.fresh("c") for _ in merged])
    pos = {id(a): j for j, a in enumerate(accesses(k))}

    def offset_of(acc):
        j = pos[id(acc)]
        return linear_expr(acc.offset, [(c, st[j]) for c, (_, st) in zip(coords, merged)])
    pe = PointEval(kw, k, offset_of, OriginalIndex(code, it, shape, var))
    values = [pe.output(j) for j in range(len(k.outputs))]
    for out, v in zip(k.outputs, values):
        pe.store(out.access, v)


def _vectorizable(program, k, merged) -> bool:
    if len(merged) != 1 or merged[0][0] < VECTOR_MIN:
        return False
    strides = merged[0][1]
    n_loads = len(k.loads)
    unit = 0
    for j, (acc, s) in enumerate(zip(accesses(k), strides)):
        dt = program.slots[acc.slot].dtype
        if s == 1:
            if dt not in VECTOR:
                return False
            unit += 1
        elif s != 0 or j >= n_loads:  # outputs are written with stride 1, loads 0 or 1
            return False
    nodes = set()
    for o in k.outputs:
        nodes.update(expr_nodes(o.expr))
    return unit > 0 and len(nodes) <= MAX_VECTOR_NODES


def _vector_loop(kw: KernelWriter, k: LoopKernel, it: str, n: int, merged) -> str:
    """The float4/int4 loop over the aligned part; returns the scalar loop's start."""
    code = kw.code
    prog = kw.mw.program
    strides = merged[0][1]
    accs = accesses(k)
    base = {}
    for j, (acc, s) in enumerate(zip(accs, strides)):
        if s == 1:
            ptr = kw.ptr(acc.slot, write=j >= len(k.loads))
            base[j] = f"({ptr} + {acc.offset})" if acc.offset else ptr
    checks = " | ".join(f"(unsigned long long){p}" for p in base.values())
    code.line(f"const {it} nv = ((({checks}) & 15ull) == 0ull) ? {n // 4} : 0;")
    n_loads = len(k.loads)
    with kw.grid_stride(it, "nv", "v"):
        vecs = {}
        for j, p in base.items():
            if j < n_loads:
                vt = VECTOR[prog.slots[accs[j].slot].dtype]
                name = code.fresh("x")
                code.line(f"const {vt} {name} = reinterpret_cast<const {vt}*>({p})[v];")
                vecs[j] = name
        lanes = []
        for lane in range(4):
            linear = f"(v * 4 + {lane})"

            def load_of(i, lane=lane):
                if i in vecs:
                    dt = prog.slots[k.loads[i].slot].dtype
                    return Typed(f"{vecs[i]}.{LANES[lane]}", dt)
                return None  # a broadcast scalar: a plain load
            pe = PointEval(kw, k, lambda acc: str(acc.offset),
                           OriginalIndex(code, it, k.loop_shape, linear), load_of)
            lanes.append([pe.output(j) for j in range(len(k.outputs))])
        for j_out, out in enumerate(k.outputs):
            j = n_loads + j_out
            vt = VECTOR[prog.slots[out.access.slot].dtype]
            fields = ", ".join(lanes[lane][j_out].v for lane in range(4))
            code.line(f"reinterpret_cast<{vt}*>({base[j]})[v] = {vt}{{{fields}}};")
    return "nv * 4"
