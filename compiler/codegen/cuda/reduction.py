"""Reducing loop kernels as CUDA C.

The loop space splits into *kept* dimensions (the output walks them) and *reduced* ones
(output stride 0). With M output elements and R reduced points each, one of:

- ``serial``: a thread per output element, looping over its R points (R small, or the
  fastest-varying dimension is kept and outputs are many: neighbouring threads then read
  neighbouring elements);
- ``block``: a block per output element (grid-stride over elements): its threads stride
  over the R points, then combine as a tree: warp shuffles (``__shfl_down_sync``) within
  each warp, the warps' partials through shared memory, a last shuffle tree in warp 0;
- ``split``: few outputs with many points each: P blocks per output element each reduce a
  chunk into a partial in the source's workspace; a second kernel combines each element's
  P partials (a block tree again).

Every output element is the identity combined with its points' values, as the IR says;
accumulation is in the output's dtype, with the registry's combine (``reduce_scalar``)
emitted once per (reduction, dtype) as a device function. Kernels whose outputs reduce
different dimensions (never made by the lowering) run as one thread.
"""
from __future__ import annotations

import contextlib
import math

from ..kernel import LoopKernel
from ..scalar import Typed, reduce_scalar
from .loops import PointEval, accesses, emit_elementwise, slot_limits
from .scalar import Code, CudaScalarBuilder, dtype_tag, literal, reg_ctype, store_expr
from .writer import (BLOCK, MAX_GRID, KernelWriter, ModuleWriter, ceil_div, decompose,
                     grid_for, grid_stride_kernel, index_type, linear_expr)

BLOCK_MIN_POINTS = 32  # reduced points per output from which a block shares the work
SERIAL_MIN_OUTPUTS = 1024  # outputs from which threads-per-output win when the inner dim is kept
SPLIT_MAX_OUTPUTS = 128  # split outputs this few ...
SPLIT_MIN_POINTS = 1 << 14  # ... with this many points each
SPLIT_CHUNK = 1 << 12  # points per partial block at least
SPLIT_BLOCKS = 512  # blocks to aim for across all outputs


def identity(op: str, dt: str) -> str:
    return CudaScalarBuilder(Code()).const(reduce_scalar(op)[1], dt).v


def combine_fn(mw: ModuleWriter, op: str, dt: str) -> str:
    """A device function ``T f(T acc, T x)``: the registry's combine of reduction ``op``."""
    name = f"hyb_combine_{op}_{dtype_tag(dt)}"

    def text():
        code = Code()
        sb = CudaScalarBuilder(code)
        res = sb.typed(reduce_scalar(op)[0](sb, Typed("a", dt), Typed("b", dt)), dt)
        ct = reg_ctype(dt)
        return (f"__device__ __forceinline__ {ct} {name}({ct} a, {ct} b) {{\n{code.text()}\n"
                f"    return {res.v};\n}}\n")
    return mw.define(name, text)


def block_reduce_fn(mw: ModuleWriter, op: str, dt: str) -> str:
    """A device function ``T f(T v, T* shared32)``: the block's values combined (in thread
    0); every thread of the (1-D, whole-warp) block must call it."""
    comb = combine_fn(mw, op, dt)
    name = f"hyb_block_{op}_{dtype_tag(dt)}"
    ct = reg_ctype(dt)
    ident = identity(op, dt)
    text = f"""__device__ __forceinline__ {ct} {name}({ct} v, {ct}* sh) {{
    for (int o = 16; o > 0; o >>= 1) v = {comb}(v, hyb_shfl_down(v, o));
    const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {{
        v = lane < (int)((blockDim.x + 31u) >> 5) ? sh[lane] : {ident};
        for (int o = 16; o > 0; o >>= 1) v = {comb}(v, hyb_shfl_down(v, o));
    }}
    __syncthreads();  /* sh may be reused at once */
    return v;
}}
"""
    return mw.define(name, lambda: text)


@contextlib.contextmanager
def nested_loops(code: Code, it: str, shape, dims, names):
    """``for`` loops over ``dims`` (outermost first); yields {dim: coordinate text}."""
    coords = {}
    with contextlib.ExitStack() as stack:
        for d, name in zip(dims, names):
            stack.enter_context(code.block(f"for ({it} {name} = 0; {name} < {shape[d]}; "
                                           f"++{name})"))
            coords[d] = name
        yield coords


def emit_loop_kernel(mw: ModuleWriter, k: LoopKernel):
    """Any LoopKernel: elementwise (loops.py), filled with identities (an empty loop
    space), or reduced by one of the strategies above."""
    if not any(o.reduce for o in k.outputs):
        emit_elementwise(mw, k)
        return
    shape = tuple(k.loop_shape)
    if math.prod(shape) == 0:
        _fill_identities(mw, k)
        return
    patterns = {tuple(d for d, n in enumerate(shape) if n > 1 and o.access.strides[d] == 0)
                for o in k.outputs}
    if len(patterns) != 1:
        _one_thread(mw, k)
        return
    _Reduction(mw, k, sorted(patterns.pop())).emit()


class _Reduction:
    def __init__(self, mw, k, red):
        self.mw, self.k = mw, k
        self.shape = tuple(k.loop_shape)
        self.red = red
        self.kept = [d for d, n in enumerate(self.shape) if n > 1 and d not in red]
        self.M = math.prod(self.shape[d] for d in self.kept)
        self.R = math.prod(self.shape[d] for d in red)
        self.slots = mw.program.slots

    def _strategy(self):
        dims = [d for d, n in enumerate(self.shape) if n > 1]
        inner_reduced = bool(dims) and dims[-1] in self.red
        if self.R < BLOCK_MIN_POINTS or any(o.reduce is None for o in self.k.outputs):
            return "serial", 1
        if not inner_reduced and self.M >= SERIAL_MIN_OUTPUTS:
            return "serial", 1
        if self.M <= SPLIT_MAX_OUTPUTS and self.R >= SPLIT_MIN_POINTS:
            parts = min(ceil_div(self.R, SPLIT_CHUNK), max(2, SPLIT_BLOCKS // self.M))
            return "split", parts
        return "block", 1

    def emit(self):
        kind, parts = self._strategy()
        if kind == "serial":
            self._serial()
        elif kind == "block":
            self._block()
        else:
            self._split(parts)

    # ---------------------------------------------------------------- helpers
    def _it(self, *extra):
        return index_type(self.M, self.R, *extra,
                          *slot_limits(self.mw.program, accesses(self.k), self.shape))

    def _kept_coords(self, code, it, var):
        names = [code.fresh("k") for _ in self.kept]
        coords = decompose(code, it, var, [self.shape[d] for d in self.kept], names)
        return dict(zip(self.kept, coords))

    def _red_coords(self, code, it, var):
        names = [code.fresh("r") for _ in self.red]
        coords = decompose(code, it, var, [self.shape[d] for d in self.red], names)
        return dict(zip(self.red, coords))

    def _point(self, kw, coords):
        """A PointEval at the point with these coordinates (absent dimensions: 0)."""
        full = [coords.get(d, "0") for d in range(len(self.shape))]
        rowmajor = [math.prod(self.shape[d + 1:]) for d in range(len(self.shape))]

        def index_of(dim):
            if dim is None:
                return linear_expr(0, zip(full, rowmajor))
            return full[dim]
        return PointEval(kw, self.k, lambda acc: linear_expr(acc.offset, zip(full, acc.strides)),
                         index_of)

    def _accumulators(self, kw):
        """One accumulator per output: a reduced output's starts at its identity (a plain
        one, beside reductions over nothing, just holds its value); (names, dtypes)."""
        names, dts = [], []
        for j, o in enumerate(self.k.outputs):
            dt = self.slots[o.access.slot].dtype
            init = identity(o.reduce, dt) if o.reduce else literal(0, dt)
            kw.code.line(f"{reg_ctype(dt)} acc{j} = {init};")
            names.append(f"acc{j}")
            dts.append(dt)
        return names, dts

    def _accumulate(self, kw, coords, accs, dts):
        pe = self._point(kw, coords)
        values = [pe.output(j) for j in range(len(self.k.outputs))]
        for j, (o, v) in enumerate(zip(self.k.outputs, values)):
            if o.reduce is None:
                kw.code.line(f"{accs[j]} = {v.v};")
            else:
                kw.code.line(f"{accs[j]} = {combine_fn(self.mw, o.reduce, dts[j])}"
                             f"({accs[j]}, {v.v});")

    def _store_outputs(self, kw, kept_coords, accs, with_identity: bool):
        """Store each output. ``with_identity``: out = identity combined with the
        accumulator (the IR's definition; a tree's result was not started from it)."""
        full = [kept_coords.get(d, "0") for d in range(len(self.shape))]
        for o, a in zip(self.k.outputs, accs):
            acc = o.access
            dt = self.slots[acc.slot].dtype
            val = a
            if with_identity and o.reduce is not None:
                val = f"{combine_fn(self.mw, o.reduce, dt)}({identity(o.reduce, dt)}, {a})"
            kw.code.line(f"{kw.ptr(acc.slot, write=True)}"
                         f"[{linear_expr(acc.offset, zip(full, acc.strides))}] = "
                         f"{store_expr(dt, val)};")

    @staticmethod
    def _shared_arrays(kw, dts):
        """The block trees' shared memory: 32 partials (one per warp) per output."""
        for j, dt in enumerate(dts):
            kw.code.line(f"__shared__ {reg_ctype(dt)} sh{j}[32];")

    def _tree(self, kw, accs, dts):
        for j, (o, dt) in enumerate(zip(self.k.outputs, dts)):
            fn = block_reduce_fn(self.mw, o.reduce, dt)
            kw.code.line(f"{accs[j]} = {fn}({accs[j]}, sh{j});")

    # ---------------------------------------------------------------- strategies
    def _serial(self):
        grid = grid_for(self.M)
        it = self._it(self.M + grid * BLOCK)
        kw = KernelWriter(self.mw, self.k.name or "reduce")
        code = kw.code
        with kw.grid_stride(it, self.M, "m"):
            kept = self._kept_coords(code, it, "m")
            accs, dts = self._accumulators(kw)
            with nested_loops(code, it, self.shape, self.red,
                              [code.fresh("r") for _ in self.red]) as red:
                self._accumulate(kw, {**kept, **red}, accs, dts)
            self._store_outputs(kw, kept, accs, with_identity=False)  # folded from it
        kw.finish(grid, BLOCK)

    def _block(self):
        def points(kw, it, kept, accs, dts, _):
            coords = {**kept, **self._red_coords(kw.code, it, "p")}
            self._accumulate(kw, coords, accs, dts)
        self._blocks_per_output(self.k.name or "reduce", self.R, points)

    def _blocks_per_output(self, label, n_points, points, workspace=()):
        """A kernel with a block per output element (grid-stride over them): its threads
        stride over ``n_points`` (``points(kw, it, kept, accs, dts, ws)`` accumulates point
        ``p``), the block tree combines them and thread 0 stores. ``workspace``: byte
        offsets of arrays (one per output) the kernel reads, passed to ``points``."""
        block = min(BLOCK, ceil_div(n_points, 32) * 32)
        grid = min(self.M, MAX_GRID)
        it = self._it(self.M + grid, n_points + block)
        kw = KernelWriter(self.mw, label)
        code = kw.code
        dts = [self.slots[o.access.slot].dtype for o in self.k.outputs]
        ws = [kw.workspace(off, reg_ctype(dt)) for off, dt in zip(workspace, dts)]
        self._shared_arrays(kw, dts)
        with code.block(f"for ({it} m = blockIdx.x; m < {self.M}; m += gridDim.x)"):
            kept = self._kept_coords(code, it, "m")
            accs, _ = self._accumulators(kw)
            with code.block(f"for ({it} p = threadIdx.x; p < {n_points}; p += blockDim.x)"):
                points(kw, it, kept, accs, dts, ws)
            self._tree(kw, accs, dts)
            with code.block("if (threadIdx.x == 0)"):
                self._store_outputs(kw, kept, accs, with_identity=True)
        kw.finish(grid, block)

    def _split(self, parts):
        chunk = ceil_div(self.R, parts)
        it = self._it(self.M * parts, self.R + chunk + BLOCK)
        dts = [self.slots[o.access.slot].dtype for o in self.k.outputs]
        partials = [self.mw.workspace(self.M * parts * _reg_size(dt)) for dt in dts]
        # pass 1: each of M * parts blocks reduces one chunk of one output element
        kw = KernelWriter(self.mw, (self.k.name or "reduce") + "_partial")
        code = kw.code
        ws = [kw.workspace(off, reg_ctype(dt)) for off, dt in zip(partials, dts)]
        self._shared_arrays(kw, dts)
        if self.kept:
            code.line(f"const {it} m = blockIdx.x / {parts};")
        code.line(f"const {it} r_begin = (blockIdx.x % {parts}) * {chunk};")
        code.line(f"const {it} r_end = r_begin + {chunk} < {self.R} ? r_begin + {chunk} : "
                  f"{self.R};")
        kept = self._kept_coords(code, it, "m")
        accs, _ = self._accumulators(kw)
        with code.block(f"for ({it} r = r_begin + threadIdx.x; r < r_end; r += blockDim.x)"):
            self._accumulate(kw, {**kept, **self._red_coords(code, it, "r")}, accs, dts)
        self._tree(kw, accs, dts)
        with code.block("if (threadIdx.x == 0)"):
            for w, a in zip(ws, accs):
                code.line(f"{w}[blockIdx.x] = {a};")
        kw.finish(self.M * parts, BLOCK)
        # pass 2: a block per output element combines its partials

        def partial(kw, it, kept, accs, dts, ws):
            for j, (o, w) in enumerate(zip(self.k.outputs, ws)):
                comb = combine_fn(self.mw, o.reduce, dts[j])
                kw.code.line(f"{accs[j]} = {comb}({accs[j]}, {w}[m * {parts} + p]);")
        self._blocks_per_output((self.k.name or "reduce") + "_final", parts, partial, partials)


def _reg_size(dt: str) -> int:
    return {"float16": 4, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
            "int64": 8, "bool": 1}[dt]


def _fill_identities(mw: ModuleWriter, k: LoopKernel):
    """An empty loop space: each reduced output's region (its walked dimensions) is set to
    the identity, when that region is not empty itself."""
    shape = tuple(k.loop_shape)
    for o in k.outputs:
        if o.reduce is None:
            continue
        live = [d for d, s in enumerate(o.access.strides) if s != 0 and shape[d] != 1]
        region = [shape[d] for d in live]
        n = math.prod(region)
        if n == 0:
            continue
        dt = mw.program.slots[o.access.slot].dtype
        with grid_stride_kernel(mw, (k.name or "reduce") + "_identity", n,
                                mw.program.slots[o.access.slot].size) as (kw, it):
            coords = decompose(kw.code, it, "i", region, [kw.code.fresh("c") for _ in live])
            off = linear_expr(o.access.offset, zip(coords, [o.access.strides[d] for d in live]))
            kw.code.line(f"{kw.ptr(o.access.slot, write=True)}[{off}] = "
                         f"{store_expr(dt, identity(o.reduce, dt))};")


def _one_thread(mw: ModuleWriter, k: LoopKernel):
    """Outputs reducing different dimensions: one thread sets each reduced output to its
    identity, then walks the loop space combining through memory (slow but exact)."""
    shape = tuple(k.loop_shape)
    dims = [d for d, n in enumerate(shape) if n > 1]
    it = index_type(*slot_limits(mw.program, accesses(k), shape))
    kw = KernelWriter(mw, (k.name or "reduce") + "_serial")
    code = kw.code
    slots = mw.program.slots
    with code.block("if (blockIdx.x == 0 && threadIdx.x == 0)"):
        with nested_loops(code, it, shape, dims, [code.fresh("c") for _ in dims]) as coords:
            full = [coords.get(d, "0") for d in range(len(shape))]
            for o in k.outputs:
                if o.reduce is not None:
                    dt = slots[o.access.slot].dtype
                    kw.code.line(f"{kw.ptr(o.access.slot, write=True)}"
                                 f"[{linear_expr(o.access.offset, zip(full, o.access.strides))}]"
                                 f" = {store_expr(dt, identity(o.reduce, dt))};")
        with nested_loops(code, it, shape, dims, [code.fresh("c") for _ in dims]) as coords:
            full = [coords.get(d, "0") for d in range(len(shape))]
            pe = PointEval(kw, k, lambda acc: linear_expr(acc.offset, zip(full, acc.strides)),
                           lambda dim: full[dim] if dim is not None else linear_expr(
                               0, zip(full, [math.prod(shape[d + 1:])
                                             for d in range(len(shape))])))
            values = [pe.output(j) for j in range(len(k.outputs))]
            for o, v in zip(k.outputs, values):
                dt = slots[o.access.slot].dtype
                if o.reduce is None:
                    pe.store(o.access, v)
                    continue
                old = pe.load(o.access)
                comb = combine_fn(mw, o.reduce, dt)
                pe.store(o.access, Typed(pe.sb.emit(dt, f"{comb}({old.v}, {v.v})"), dt))
    kw.finish(1, 1)
