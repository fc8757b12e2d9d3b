"""The builder extern kernels are written with on the LLVM backend (``EB``: one kernel
function's IR builder, slot addressing, loads and stores, loop nests) and the split of an
extern into workers (``run_workers``, ``worker_range``; how many: extern_plan.py)."""
from __future__ import annotations

from llvmlite import ir

from ..kernel import itemsize
from ..scalar import Typed
from .emit import emit_parallel_driver, for_range, kernel_function
from .scalar import I64, LLVMScalarBuilder, mem_type, reg_type

# LLVM vectorizes a loop of fewer iterations than this (its tiny-trip-count threshold) only by
# masking the tail, and AVX2's masked loads/stores are slow on AMD (LeNet's col2im rows of 10:
# 2 masked iterations, 2.6x slower than a plain loop): copy nests unroll such innermost loops
# into straight-line code instead, which the SLP vectorizer turns into 8 + 2 lanes.
TINY_TRIP = 16


class EB:
    """Emission helpers for one extern kernel function."""

    def __init__(self, mb, fn, program, groups, bound=None):
        self.mb = mb
        self.fn = fn
        self.program = program
        self.groups = groups
        self.bound = bound  # the step's row bound (kernel.Program.rows): (what, per)
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.sb = LLVMScalarBuilder(self.b, mb.intr)
        self.base = {}
        self.parts = 0  # worker functions emitted for this kernel so far
        for arg, grp in zip(fn.args, groups):
            for s in grp.slots:
                self.base[s] = arg

    @staticmethod
    def c(v):
        return ir.Constant(I64, int(v))

    def i64(self, v):
        return v if isinstance(v, ir.Value) else self.c(v)

    def add(self, *xs):
        acc = self.i64(xs[0])
        for x in xs[1:]:
            if isinstance(x, int) and x == 0:
                continue
            acc = self.b.add(acc, self.i64(x))
        return acc

    def mul(self, x, k):
        if isinstance(k, int) and k == 1:
            return self.i64(x)
        return self.b.mul(self.i64(x), self.i64(k))

    def gep(self, ptr, dtype, off):
        return self.b.gep(ptr, [self.i64(off)], inbounds=True, source_etype=mem_type(dtype))

    def slot_ptr(self, slot, off=0):
        return self.gep(self.base[slot], self.program.slots[slot].dtype, off)

    def scratch(self, slot, byte_off):
        return self.b.gep(self.base[slot], [self.i64(byte_off)], inbounds=True,
                          source_etype=ir.IntType(8))

    def region(self, step, lay, w, name):
        """Worker w's scratch region ``name`` (see extern_plan.ScratchLayout)."""
        return self.scratch(step.scratch, self.add(self.mul(w, lay.size), lay.at[name]))

    def entry_alloca(self, ty):
        with self.b.goto_entry_block():  # out of every loop: one stack slot, promoted
            return self.b.alloca(ty)

    def fmuladd(self, x, y, acc, dt):
        """x * y + acc (one FMA where the CPU has it), reassociable so that a reduction
        through it vectorizes."""
        ty = reg_type(dt)
        fn = self.mb.intr.get(f"llvm.fmuladd.{'f32' if dt == 'float32' else 'f64'}", ty,
                              [ty, ty, ty])
        return self.b.call(fn, [x, y, acc], fastmath=("reassoc",))

    def load(self, ptr, dtype):
        v = self.b.load(ptr, typ=mem_type(dtype), align=itemsize(dtype))
        if dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        return Typed(v, dtype)

    def store(self, ptr, v: Typed, dtype):
        v = self.sb.typed(v, dtype).v
        if dtype == "bool":
            v = self.b.zext(v, mem_type("bool"))
        self.b.store(v, ptr, align=itemsize(dtype))

    def fill(self, ptr, dtype, n, value):
        if isinstance(n, int) and n <= 0:
            return
        v = self.sb.const(value, dtype)
        with for_range(self.b, n) as i:
            self.store(self.gep(ptr, dtype, i), v, dtype)

    def copy_nest(self, extents, dst, dst_dt, dst_strides, src, src_dt, src_strides,
                  accumulate=False):
        """dst[sum i*ds] (+)= src[sum i*ss] over a loop nest (innermost last)."""
        if any(n == 0 for n in extents):
            return
        b = self.b

        def nest(d, doff, soff):
            if d == len(extents):
                v = self.load(self.gep(src, src_dt, soff), src_dt)
                p = self.gep(dst, dst_dt, doff)
                if accumulate:  # NumPy adds booleans as a logical or (True + True is True)
                    acc = self.sb.logical_or if dst_dt == "bool" else self.sb.add
                    v = acc(self.load(p, dst_dt), self.sb.typed(v, dst_dt))
                self.store(p, v, dst_dt)
                return
            if d == len(extents) - 1 and extents[d] < TINY_TRIP:
                for i in range(extents[d]):  # straight-line code for the SLP vectorizer
                    nest(d + 1, self.add(doff, i * dst_strides[d]),
                         self.add(soff, i * src_strides[d]))
                return
            with for_range(b, extents[d]) as i:
                nest(d + 1, self.add(doff, self.mul(i, dst_strides[d])),
                     self.add(soff, self.mul(i, src_strides[d])))
        nest(0, self.c(0), self.c(0))

    def bounded(self, extent: int):
        """The step's row bound as a trip count: min(extent, count * per), count (>= 0) read
        from the program's count slot."""
        count = self.b.load(self.base[self.program.count_slot], typ=I64, align=8)
        return self.smin(self.mul(self.smax(count, 0), self.bound[1]), extent)

    def clamp(self, v, lo, hi):
        b = self.b
        v = b.select(b.icmp_signed("<", v, self.i64(lo)), self.i64(lo), v)
        return b.select(b.icmp_signed(">", v, self.i64(hi)), self.i64(hi), v)

    def smax(self, x, y):
        x, y = self.i64(x), self.i64(y)
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def smin(self, x, y):
        x, y = self.i64(x), self.i64(y)
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)


def slot_of(eb, s):
    return eb.program.slots[s]


def run_workers(eb: EB, workers: int, emit, spawn=True):
    """``emit(e, w)`` for each worker w in [0, workers): inline when there is one, else in a
    worker function that the parallel driver runs on the module's threads (a thread gets a
    contiguous range of workers). spawn=False: when the pool is busy the caller runs every
    worker itself instead of starting threads (work too short to pay for them)."""
    if workers <= 1:
        emit(eb, eb.c(0))
        return
    eb.parts += 1
    name = f"{eb.fn.name}.par{eb.parts}"
    driver = kernel_function(eb.mb, name, eb.groups)
    body = kernel_function(eb.mb, name + ".work", eb.groups, extra=[I64, I64])
    e = EB(eb.mb, body, eb.program, eb.groups, eb.bound)
    with for_range(e.b, body.args[-1], start=body.args[-2]) as w:
        emit(e, w)
    e.b.ret_void()
    emit_parallel_driver(eb.mb, driver, body, workers, lambda b, fn: None, spawn)
    eb.b.call(driver, list(eb.fn.args[:len(eb.groups)]))


def worker_range(eb: EB, w, n, workers: int):
    """[lo, hi): worker w's part of n items, an int or an i64 value (sizes differ by at
    most one)."""
    lo = eb.b.sdiv(eb.mul(w, n), eb.c(workers))
    hi = eb.b.sdiv(eb.mul(eb.add(w, 1), n), eb.c(workers))
    return lo, hi
