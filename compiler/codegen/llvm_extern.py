"""Extern kernels on the LLVM backend: matmul (BLAS), convolution, pooling, gather/scatter.

Semantics are those of the registry's eager impls (compiler/ops/nn.py, movement.py,
linalg.py, reduce.py); tests compare the two.

Threads: big externs split their batch into workers (see "threads" below) run by llvm.py's
parallel driver; OpenBLAS runs single-threaded inside them.

Convolution, im2col + GEMM: one image (and group) at a time into the worker's scratch: the
columns of one image stay in L2 (LeNet's second layer: 150 x 100 floats) and each image is
one ``sgemm`` W (O x CKK) @ cols (CKK x OH*OW) writing NCHW output directly; gradients are
dX = col2im(W^T @ g) per image and dW = sum over images of g @ cols^T (GEMMs accumulating
with beta = 1). Padding goes through a zero-bordered copy of the image so the im2col loops
have no bounds checks; 1x1 stride-1 convolutions skip im2col. Several images per GEMM (8
for LeNet's second layer: 16 x 150 @ 150 x 800) measured no faster: what the wider GEMM
gains, packing the wider columns gives back.

Direct convolution: stride-1 float convolutions with a tiny reduction and few filters
(C*KH*KW <= 32, O <= 16: LeNet's first layer) run the forward and the weight gradient as
vectorized loops over the flat zero-padded image (_conv2d_direct, _grad_weight_direct), as
their GEMMs (6 x 25 @ 25 x 784 per image) are too thin for BLAS.

Measured at batch 256, float32, on this 2-core machine, each kernel alone (min ms; before:
the loop kernel and per-image GEMMs this replaced, one thread):

    kernel                                  before    now, 1 thread    now, 2 threads
    LeNet conv1 forward (direct)            9.5       1.05-1.47        0.59
    LeNet conv1 weight gradient (direct)    4.4       0.99             0.68
    LeNet conv2 data gradient               7.2       2.76             1.50
      (col2im without masked tail loops: see TINY_TRIP)
    LeNet conv2 forward (BLAS-bound)        2.4       2.31             1.20
    LeNet conv2 weight gradient (BLAS)      2.8       2.73             1.47
    LeNet pooling 2x2 forward / gradient    1.0/0.67  0.25/0.48        0.19/0.27

float32/float64 GEMMs call OpenBLAS (runtime/blas.py); other dtypes use loop GEMMs.
"""
from __future__ import annotations

import math

from llvmlite import ir

from ..ops.core import dtype_name
from ..ops.nn import conv_out_size
from .kernel import ALIGN, ExternKernel, KernelIRError, matmul_operand_shapes
from .llvm import MAX_THREADS, emit_parallel_driver, for_range, kernel_function
from .llvm_gemv import (GEMV_CHUNKS, GEMV_PARALLEL_MIN, PACK_HEADER, PACK_NEW, PACK_READY,
                        PACK_SEEN, ROWS as GEMV_ROWS, gemv_applies, gemv_pack, gemv_pack_bytes,
                        gemv_rows, gemv_workers, thin_applies)
from .llvm_scalar import F32, F64, I32, I64, PTR, LLVMScalarBuilder, mem_type, reg_type
from . import llvm_sgemm
from .llvm_sgemm import (emit_sgemm, pack_bytes, panels, sgemm_applies, strip_bytes,
                          tile_rows)
from .scalar import FLOATS, Typed

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int,)) else tuple(int(a) for a in v)


def _align(n):
    return -(-n // ALIGN) * ALIGN


# ---------------------------------------------------------------------- threads
# Big externs split their batch (images, planes, GEMM rows) across *workers*: worker w owns a
# slice of the output and its own scratch, and the parallel driver of llvm.py runs the workers
# on the module's threads. The worker count is fixed when the program is lowered (scratch is
# sized statically) and so is every sum's order: results never depend on how many threads the
# runtime grants (with a smaller core share a thread runs several workers in turn). OpenBLAS
# runs single-threaded inside the workers (runtime/blas.py).
# Below this many multiply-adds (~0.3 ms in BLAS) an extern runs on one thread: a parallel
# region costs up to ~50 us here (waking the pool, or starting threads when it is busy), and
# a 2.6M-MAC GEMM of LeNet's (0.12 ms) measured slower split with threads started per call.
PARALLEL_MIN_WORK = 1 << 23
# A single GEMM from this many multiply-adds (~6 us on one core) splits too, but only across
# the pool (spawn=False): the caller claims every chunk nobody else took, so a sleeping or
# busy pool costs a wake-up call, never a wait or a thread start (MLP batch 64, layer 2:
# 2.1M MACs, 29 -> ~17 us).
POOL_MIN_WORK = 1 << 20
THIN_MIN_WORK = 1 << 18  # a thin product (_thin) splits from here (~10 us on one core: its
# rows run at ~50 GFLOP/s; 256 x 256 x 10: 27 -> 19 us)
SCRATCH_BUDGET = 64 << 20  # bytes of per-worker scratch, all workers together, at most


def max_workers() -> int:
    """Workers a big extern splits into: one per core of the machine."""
    from runtime.device import cpu_count  # noqa: PLC0415
    return max(1, min(cpu_count(), MAX_THREADS))


def extern_key() -> list:
    """The settings that split externs into workers: part of the machine-code cache key, as
    the Program shows them only through scratch sizes."""
    return [max_workers(), PARALLEL_MIN_WORK, POOL_MIN_WORK, THIN_MIN_WORK, SCRATCH_BUDGET,
            GEMV_PARALLEL_MIN, GEMV_CHUNKS, SGEMM_PACK_MIN_ROWS, llvm_sgemm.SGEMM_MAX_K,
            llvm_sgemm.SGEMM_MAX_A_BYTES, llvm_sgemm.SGEMM_MIN_WORK]


def _workers(items: int, work: int, per_worker: int = 0, min_work=PARALLEL_MIN_WORK) -> int:
    if work < min_work:
        return 1
    w = min(items, max_workers())
    if per_worker:
        w = min(w, max(1, SCRATCH_BUDGET // per_worker))
    return max(1, w)


# LLVM vectorizes a loop of fewer iterations than this (its tiny-trip-count threshold) only by
# masking the tail, and AVX2's masked loads/stores are slow on AMD (LeNet's col2im rows of 10:
# 2 masked iterations, 2.6x slower than a plain loop): copy nests unroll such innermost loops
# into straight-line code instead, which the SLP vectorizer turns into 8 + 2 lanes.
TINY_TRIP = 16


class _Layout:
    """One worker's scratch: named regions, each on its own cache lines."""

    def __init__(self):
        self.at, self.size = {}, 0

    def add(self, name, nbytes):
        if nbytes > 0:
            self.at[name] = self.size
            self.size += _align(nbytes)


# ---------------------------------------------------------------------- scratch
def conv_geometry(x_shape, w_shape, attrs):
    n, c, h, wd = x_shape
    o, cg, kh, kw = w_shape
    stride, pad, dil = (_pair(attrs.get("stride", 1)), _pair(attrs.get("pad", 0)),
                        _pair(attrs.get("dilation", 1)))
    groups = int(attrs.get("groups", 1))
    oh = conv_out_size(h, kh, stride[0], pad[0], dil[0])
    ow = conv_out_size(wd, kw, stride[1], pad[1], dil[1])
    return dict(n=n, c=c, h=h, w=wd, o=o, cg=cg, kh=kh, kw=kw, stride=stride, pad=pad,
                dil=dil, groups=groups, oh=oh, ow=ow, og=o // groups,
                hp=h + 2 * pad[0], wp=wd + 2 * pad[1])


def _direct_1x1(g):
    return (g["kh"], g["kw"]) == (1, 1) and g["stride"] == (1, 1) and g["pad"] == (0, 0)


def _use_direct(g, dt) -> bool:
    """Direct loops for stride-1 float convolutions with a tiny reduction and few filters
    (LeNet's first layer: C*KH*KW = 25, O = 6), whose GEMMs (6 x 25 @ 25 x 784 per image) are
    too thin for BLAS; im2col + GEMM otherwise (see the module docstring)."""
    return dt in ("float32", "float64") and g["groups"] == 1 and g["stride"] == (1, 1) and \
        g["cg"] * g["kh"] * g["kw"] <= 32 and g["o"] <= 16 and not _direct_1x1(g)


def _slack(g):
    """Elements after the flat planes that the garbage columns of the last row read."""
    return (g["kw"] - 1) * g["dil"][1]


def conv_plan(op, g, dt):
    """How a convolution extern runs: (direct?, workers, one worker's scratch _Layout).
    Scratch sizing and emission both read it."""
    size = _isize(dt)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    lay = _Layout()
    direct = op != "conv2d_grad_data" and _use_direct(g, dt)
    if direct:
        flat = g["oh"] * g["wp"]
        lay.add("x", (g["c"] * g["hp"] * g["wp"] + _slack(g)) * size)
        lay.add("g" if op == "conv2d_grad_weight" else "out", g["o"] * flat * size)
        if op == "conv2d_grad_weight":
            lay.add("mask", flat * size)
    else:
        if op == "conv2d_grad_data" or not _direct_1x1(g):
            lay.add("cols", ckk * ohw * size)
        if g["pad"] != (0, 0):
            lay.add("pad", g["c"] * g["hp"] * g["wp"] * size)
    workers = _workers(g["n"], g["n"] * g["o"] * ckk * ohw, lay.size)
    if op == "conv2d_grad_weight" and workers > 1:
        lay.add("dw", g["o"] * ckk * size)  # each worker's partial sum, added up at the end
    return direct, workers, lay


def scratch_bytes(op, attrs, in_specs, out_specs) -> int:
    if op == "matmul":
        plan = matmul_plan([s.shape for s in in_specs], [s.dtype for s in in_specs],
                           out_specs[0].dtype, attrs)
        if plan is not None:
            return plan.workers * plan.lay.size
        return gemv_pack_size([s.shape for s in in_specs], [s.dtype for s in in_specs],
                              out_specs[0].dtype, attrs)
    if op in ("conv2d", "conv2d_grad_data", "conv2d_grad_weight"):
        x_shape = out_specs[0].shape if op == "conv2d_grad_data" else in_specs[0].shape
        w_shape = out_specs[0].shape if op == "conv2d_grad_weight" else in_specs[1].shape
        g = conv_geometry(x_shape, w_shape, attrs)
        _, workers, lay = conv_plan(op, g, dtype_name(in_specs[0].dtype))
        return workers * lay.size
    return 0


# ------------------------------------------------------------------- emission aid
class EB:
    """Emission helpers for one extern kernel function."""

    def __init__(self, mb, fn, program, groups):
        self.mb = mb
        self.fn = fn
        self.program = program
        self.groups = groups
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
        """Worker w's scratch region ``name`` (see _Layout)."""
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
        v = self.b.load(ptr, typ=mem_type(dtype), align=_isize(dtype))
        if dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        return Typed(v, dtype)

    def store(self, ptr, v: Typed, dtype):
        v = self.sb.typed(v, dtype).v
        if dtype == "bool":
            v = self.b.zext(v, mem_type("bool"))
        self.b.store(v, ptr, align=_isize(dtype))

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

    # -- GEMM --------------------------------------------------------------------
    def gemm(self, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate=False,
             a_dt=None, b_dt=None):
        """C (m x n, row stride ldc) (+)= op(A) @ op(B); op = transpose when ta/tb."""
        a_dt, b_dt = a_dt or dt, b_dt or dt
        if m == 0 or n == 0:
            return
        if k == 0:
            if not accumulate:
                with for_range(self.b, m) as i:
                    self.fill(self.gep(cp, dt, self.mul(i, ldc)), dt, n, 0)
            return
        if not (ta or tb or accumulate) and a_dt == dt == b_dt and sgemm_applies(dt, m, n, k):
            emit_sgemm(self, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc)  # no scratch: in place
            return
        if dt in ("float32", "float64") and a_dt == dt and b_dt == dt:
            self._blas_gemm(dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate)
        else:
            self._loop_gemm(dt, a_dt, b_dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc,
                            accumulate)

    def _blas_gemm(self, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate):
        self.mb.uses_blas = True
        fty = F32 if dt == "float32" else F64
        p = "s" if dt == "float32" else "d"
        def i32(v):  # sizes are constants, or i64 values where workers split a GEMM
            return self.b.trunc(v, I32) if isinstance(v, ir.Value) else ir.Constant(I32, int(v))
        beta = ir.Constant(fty, 1.0 if accumulate else 0.0)
        one = ir.Constant(fty, 1.0)
        if gemv_applies(m, n, k, ta, tb):
            gemv_rows(self, dt, n, k, a, bp, ldb, cp, accumulate)
            return
        if m == 1 and ldc >= 1:  # row vector: y(n) = op(B)^T x
            gemv = self.mb.intr.get(f"hybrid_cblas_{p}gemv", ir.VoidType(),
                                    [I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty, PTR,
                                     I32], readnone=False)
            incx = lda if ta else 1
            if tb:  # B stored (n, k): y = B x
                args = [CBLAS_NO_TRANS, n, k]
            else:  # B stored (k, n): y = B^T x
                args = [CBLAS_TRANS, k, n]
            self.b.call(gemv, [i32(CBLAS_ROW_MAJOR), i32(args[0]), i32(args[1]), i32(args[2]),
                               one, bp, i32(ldb), a, i32(incx), beta, cp, i32(1)])
            return
        if n == 1:  # column vector: y(m) = op(A) x
            gemv = self.mb.intr.get(f"hybrid_cblas_{p}gemv", ir.VoidType(),
                                    [I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty, PTR,
                                     I32], readnone=False)
            incx = 1 if tb else ldb
            args = [CBLAS_TRANS, k, m] if ta else [CBLAS_NO_TRANS, m, k]
            self.b.call(gemv, [i32(CBLAS_ROW_MAJOR), i32(args[0]), i32(args[1]), i32(args[2]),
                               one, a, i32(lda), bp, i32(incx), beta, cp, i32(ldc)])
            return
        gemm = self.mb.intr.get(f"hybrid_cblas_{p}gemm", ir.VoidType(),
                                [I32, I32, I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty,
                                 PTR, I32], readnone=False)
        self.b.call(gemm, [i32(CBLAS_ROW_MAJOR), i32(CBLAS_TRANS if ta else CBLAS_NO_TRANS),
                           i32(CBLAS_TRANS if tb else CBLAS_NO_TRANS), i32(m), i32(n), i32(k),
                           one, a, i32(lda), bp, i32(ldb), beta, cp, i32(ldc)])

    def _loop_gemm(self, dt, a_dt, b_dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc,
                   accumulate):
        b, sb = self.b, self.sb
        with for_range(b, m) as i:
            crow = self.gep(cp, dt, self.mul(i, ldc))
            if not accumulate:
                self.fill(crow, dt, n, 0)
            with for_range(b, k) as kk:
                aoff = self.add(self.mul(kk, lda), i) if ta else self.add(self.mul(i, lda), kk)
                av = sb.typed(self.load(self.gep(a, a_dt, aoff), a_dt), dt)
                with for_range(b, n) as j:
                    boff = self.add(self.mul(j, ldb), kk) if tb else \
                        self.add(self.mul(kk, ldb), j)
                    bv = sb.typed(self.load(self.gep(bp, b_dt, boff), b_dt), dt)
                    pc = self.gep(crow, dt, j)
                    self.store(pc, sb.add(self.load(pc, dt), sb.mul(av, bv)), dt)


def _isize(dtype):
    return {"float16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
            "int64": 8, "uint64": 8, "bool": 1}[dtype]


def _strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return list(reversed(out))


# -------------------------------------------------------------------------- entry
def emit_extern(mb, step: ExternKernel, fname: str, groups) -> ir.Function:
    fn = kernel_function(mb, fname, groups)
    eb = EB(mb, fn, mb.program, groups)
    emit = _EMITTERS.get(step.op)
    if emit is None:
        raise KernelIRError(f"the LLVM backend has no extern kernel for {step.op!r}")
    emit(eb, step, step.attr_dict)
    eb.b.ret_void()
    return fn


def _slot(eb, s):
    return eb.program.slots[s]


def _parallel(eb: EB, workers: int, emit, spawn=True):
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
    e = EB(eb.mb, body, eb.program, eb.groups)
    with for_range(e.b, body.args[-1], start=body.args[-2]) as w:
        emit(e, w)
    e.b.ret_void()
    emit_parallel_driver(eb.mb, driver, body, workers, lambda b, fn: None, spawn)
    eb.b.call(driver, list(eb.fn.args[:len(eb.groups)]))


def _share(eb: EB, w, n: int, workers: int):
    """[lo, hi): worker w's part of n items (sizes differ by at most one)."""
    lo = eb.b.sdiv(eb.mul(w, n), eb.c(workers))
    hi = eb.b.sdiv(eb.mul(eb.add(w, 1), n), eb.c(workers))
    return lo, hi


# ------------------------------------------------------------------------- matmul
GEMM_MIN_ROWS = 32  # rows (or columns) of C per worker: thinner slices waste BLAS's packing


def _matmul(eb: EB, step, attrs):
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    A, B, C = _slot(eb, sa), _slot(eb, sbb), _slot(eb, so)
    ashape, bshape = matmul_operand_shapes([A.shape, B.shape], attrs)
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    m, k = ashape[-2], ashape[-1]
    n = bshape[-1]
    lda = A.shape[-1]
    ldb = B.shape[-1]
    batch = tuple(C.shape[:-2])
    nb = len(batch)

    def bstrides(shape):  # element strides of a batch index into an operand (0: broadcast)
        own = list(shape[:-2])
        mat = shape[-2] * shape[-1]
        st = _strides(own) if own else []
        st = [s * mat for s in st]
        st = [0 if own[i] == 1 else st[i] for i in range(len(own))]
        return [0] * (nb - len(own)) + st
    sa_st, sb_st = bstrides(A.shape), bstrides(B.shape)
    sc_st = [s * m * n for s in _strides(batch)] if batch else []
    if math.prod(batch) == 0:
        return
    work = math.prod(batch) * m * n * k

    def nest(e, d, aoff, boff, coff):
        if d == nb:
            e.gemm(C.dtype, ta, tb, m, n, k, e.slot_ptr(sa, aoff), lda, e.slot_ptr(sbb, boff),
                   ldb, e.slot_ptr(so, coff), n, a_dt=A.dtype, b_dt=B.dtype)
            return
        with for_range(e.b, batch[d]) as i:
            nest(e, d + 1, e.add(aoff, e.mul(i, sa_st[d])), e.add(boff, e.mul(i, sb_st[d])),
                 e.add(coff, e.mul(i, sc_st[d])))
    if nb:  # workers take slices of the outermost batch dimension
        workers = _workers(batch[0], work)

        def batches(e, w):
            lo, hi = _share(e, w, batch[0], workers)
            with for_range(e.b, hi, start=lo) as i:
                nest(e, 1, e.mul(i, sa_st[0]), e.mul(i, sb_st[0]), e.mul(i, sc_st[0]))
        _parallel(eb, workers, batches)
        return
    if C.dtype in ("float32", "float64") and A.dtype == B.dtype == C.dtype and \
            gemv_applies(m, n, k, ta, tb):
        packed = gemv_pack_size([A.shape, B.shape], [A.dtype, B.dtype], C.dtype, attrs) > 0
        _gemv(eb, step, C.dtype, n, k, ldb, packed)
        return
    if A.dtype == B.dtype == C.dtype and thin_applies(C.dtype, m, n, k, ta, tb):
        _thin(eb, step, C.dtype, m, n, k, lda, ldb, work)
        return
    plan = matmul_plan([A.shape, B.shape], [A.dtype, B.dtype], C.dtype, attrs)
    if plan is not None:
        _sgemm(eb, step, plan, ta, tb, m, n, k, lda, ldb)
        return
    # one GEMM: workers take rows of C, columns when C is wide, or square with B transposed
    # (a Dense layer's x @ W.T: each worker then packs only its rows of W; 5-7% faster)
    rows = m > n or (m == n and not tb)
    workers = _workers(max(m, n) // GEMM_MIN_ROWS, work, min_work=POOL_MIN_WORK)

    def block(e, w):
        lo, hi = _share(e, w, m if rows else n, workers)
        cnt = e.b.sub(hi, lo) if workers > 1 else (m if rows else n)
        if rows:
            e.gemm(C.dtype, ta, tb, cnt, n, k, e.slot_ptr(sa, lo if ta else e.mul(lo, lda)),
                   lda, e.slot_ptr(sbb), ldb, e.slot_ptr(so, e.mul(lo, n)), n,
                   a_dt=A.dtype, b_dt=B.dtype)
        else:
            e.gemm(C.dtype, ta, tb, m, cnt, k, e.slot_ptr(sa), lda,
                   e.slot_ptr(sbb, e.mul(lo, ldb) if tb else lo), ldb, e.slot_ptr(so, lo), n,
                   a_dt=A.dtype, b_dt=B.dtype)
    _parallel(eb, workers, block, spawn=work >= PARALLEL_MIN_WORK)


# B's panels are copied (contiguous, one TLB page per few rows) from this many rows of A: the
# copy is read by every row tile (at 16 x 150 @ 150 x 100, LeNet's convolution, it costs more
# than it saves)
SGEMM_PACK_MIN_ROWS = 32


class MatmulPlan:
    """How one unbatched float32 GEMM runs as generated loops (llvm_sgemm): split by column
    panels (by rows of tiles when C has a single panel), `workers` of them, each with the
    scratch `lay` for its packed panel of B and, for a transposed A, A's strips."""

    def __init__(self, by, units, workers, lay):
        self.by, self.units, self.workers, self.lay = by, units, workers, lay


def matmul_plan(in_shapes, in_dtypes, out_dtype, attrs):
    """The MatmulPlan of a matmul extern, None where it calls BLAS (or GEMV loops). Scratch
    sizing and emission both read it."""
    ashape, bshape = matmul_operand_shapes(in_shapes, attrs)
    dt = dtype_name(out_dtype)
    if len(ashape) != 2 or len(bshape) != 2 or \
            {dtype_name(d) for d in in_dtypes} != {dt}:
        return None
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    (m, k), n = ashape, bshape[-1]
    if gemv_applies(m, n, k, ta, tb) or not sgemm_applies(dt, m, n, k):
        return None
    by = "cols" if panels(n) > 1 else "rows"
    units = panels(n) if by == "cols" else max(1, m // tile_rows())
    workers = _workers(units, m * n * k, min_work=POOL_MIN_WORK)
    lay = _Layout()
    if tb or m >= SGEMM_PACK_MIN_ROWS:  # a thin A: copying B's panels costs more than it saves
        lay.add("pack", pack_bytes(k))
    if ta:
        lay.add("strips", strip_bytes(m, k))
    return MatmulPlan(by, units, workers, lay)


def _sgemm(eb: EB, step, plan, ta, tb, m, n, k, lda, ldb):
    """One GEMM as generated loops, its panels (or row tiles) shared among plan.workers: the
    caller claims every share the pool has not (spawn only for long products)."""
    sa, sbb = step.in_slots
    so = step.out_slots[0]

    def block(e, w):
        pack = e.region(step, plan.lay, w, "pack") if "pack" in plan.lay.at else None
        strips = e.region(step, plan.lay, w, "strips") if ta else None
        part = None
        if plan.workers > 1:
            lo, hi = _share(e, w, plan.units, plan.workers)
            part = ("cols", lo, hi) if plan.by == "cols" else \
                ("rows", lo, hi, e.b.icmp_signed("==", w, e.c(plan.workers - 1)))
        emit_sgemm(e, ta, tb, m, n, k, e.slot_ptr(sa), lda, e.slot_ptr(sbb), ldb,
                   e.slot_ptr(so), n, pack=pack, strips=strips, part=part)
    _parallel(eb, plan.workers, block, spawn=m * n * k >= PARALLEL_MIN_WORK)


def _thin(eb: EB, step, dt, m, n, k, lda, ldb, work):
    """x @ W.T with fewer outputs than vector lanes (llvm_gemv.thin_applies): a gemv_rows
    per row of x, the rows split among the caller and the pool."""
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    workers = _workers(m, work, min_work=THIN_MIN_WORK)

    def rows(e, w):
        lo, hi = _share(e, w, m, workers) if workers > 1 else (e.c(0), e.c(m))
        with for_range(e.b, hi, start=lo) as i:
            gemv_rows(e, dt, n, k, e.slot_ptr(sa, e.mul(i, lda)), e.slot_ptr(sbb), ldb,
                      e.slot_ptr(so, e.mul(i, n)), False)
    _parallel(eb, workers, rows, spawn=False)


def gemv_pack_size(in_shapes, in_dtypes, out_dtype, attrs) -> int:
    """Scratch bytes of a matmul's packed weights (llvm_gemv: a batch-1 product whose B is a
    parameter, ``b_param`` set by the lowering), 0 where it reads B in place."""
    ashape, bshape = matmul_operand_shapes(in_shapes, attrs)
    dt = dtype_name(out_dtype)
    if len(ashape) != 2 or len(bshape) != 2 or {dtype_name(d) for d in in_dtypes} != {dt}:
        return 0
    (m, k), n = ashape, bshape[-1]
    return gemv_pack_bytes(dt, m, n, k, bool(attrs.get("transpose_a")),
                           bool(attrs.get("transpose_b")), bool(attrs.get("b_param")))


def pack_states(program) -> tuple:
    """Arena byte offsets of the pack state words of ``program``'s packed weights: the
    arena's owner sets each to PACK_NEW when it binds new parameter arrays."""
    out = []
    for step in program.steps:
        if isinstance(step, ExternKernel) and step.op == "matmul" and step.scratch is not None:
            specs = [program.slots[i] for i in step.in_slots]
            if gemv_pack_size([sl.shape for sl in specs], [sl.dtype for sl in specs],
                              program.slots[step.out_slots[0]].dtype, step.attr_dict):
                out.append(program.slots[step.scratch].offset)
    return tuple(out)


def _gemv(eb: EB, step, dt, n, k, ldb, packed):
    """A batch-1 Dense layer: its row blocks split into chunks for the caller and the pool
    (never threads started for it: a few microseconds of work). packed: B is a parameter
    with a packed copy in the step's scratch (llvm_gemv), used from the binding's second
    call on."""
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    workers = gemv_workers(n, k)

    def part(e, w):
        if workers == 1:
            return None
        lo, hi = _share(e, w, n // GEMV_ROWS, workers)
        return lo, hi, e.b.icmp_signed("==", w, e.c(workers - 1))

    def run(pack):
        _parallel(eb, workers, lambda e, w: gemv_rows(
            e, dt, n, k, e.slot_ptr(sa), e.slot_ptr(sbb), ldb, e.slot_ptr(so), False,
            part(e, w), e.scratch(step.scratch, PACK_HEADER) if pack else None), spawn=False)
    if not packed:
        run(False)
        return
    b = eb.b
    state_at = eb.scratch(step.scratch, 0)
    state = b.load(state_at, typ=I64, align=8)  # only this thread runs here: plain access
    with b.if_then(b.icmp_unsigned("==", state, eb.c(PACK_SEEN))):
        gemv_pack(eb, dt, n, k, eb.slot_ptr(sbb), ldb, eb.scratch(step.scratch, PACK_HEADER))
        b.store(eb.c(PACK_READY), state_at, align=8)
    with b.if_then(b.icmp_unsigned("==", state, eb.c(PACK_NEW))):
        b.store(eb.c(PACK_SEEN), state_at, align=8)
    ready = b.icmp_unsigned("==", b.load(state_at, typ=I64, align=8), eb.c(PACK_READY))
    with b.if_else(ready) as (from_pack, in_place):
        with from_pack:
            run(True)
        with in_place:
            run(False)


# ---------------------------------------------------------------------- convolution
def _im2col(eb, g, src, dt, src_dims, cols):
    """cols[(c, kh, kw), (oh, ow)] = src[c, oh*s + kh*d, ow*s + kw*d] for one image/group.

    src_dims: (rows, cols) of the (padded) image planes src points into."""
    hs, ws = src_dims
    sh, sw = g["stride"]
    dh, dw = g["dil"]
    ext = [g["cg"], g["kh"], g["kw"], g["oh"], g["ow"]]
    src_st = [hs * ws, dh * ws, dw, sh * ws, sw]
    dst_st = _strides(ext)
    eb.copy_nest(ext, cols, dt, dst_st, src, dt, src_st)


def _col2im(eb, g, cols, dt, dst, dst_dims):
    """dst[c, oh*s + kh*d, ow*s + kw*d] += cols[(c, kh, kw), (oh, ow)]."""
    hs, ws = dst_dims
    sh, sw = g["stride"]
    dh, dw = g["dil"]
    ext = [g["cg"], g["kh"], g["kw"], g["oh"], g["ow"]]
    eb.copy_nest(ext, dst, dt, [hs * ws, dh * ws, dw, sh * ws, sw], cols, dt, _strides(ext),
                 accumulate=True)


def _to_padded(eb, g, dt, img, dst):
    """Copy image ``img`` (c x h x w) into the interior of ``dst`` (c planes of hp x wp whose
    border is already zero)."""
    ph, pw = g["pad"]
    eb.copy_nest([g["c"], g["h"], g["w"]], eb.gep(dst, dt, ph * g["wp"] + pw), dt,
                 [g["hp"] * g["wp"], g["wp"], 1], img, dt, [g["h"] * g["w"], g["w"], 1])


def _image(e, g, slot, i):
    return e.slot_ptr(slot, e.mul(i, g["c"] * g["h"] * g["w"]))


def _source(e, g, step, lay, w, dt, x_slot, i):
    """(pointer, plane dims) of image i as the im2col loops read it: worker w's zero-bordered
    copy when the convolution pads."""
    if g["pad"] == (0, 0):
        return _image(e, g, x_slot, i), (g["h"], g["w"])
    xp = e.region(step, lay, w, "pad")
    _to_padded(e, g, dt, _image(e, g, x_slot, i), xp)
    return xp, (g["hp"], g["wp"])


def _image_columns(e, g, step, lay, w, dt, x_slot, workers):
    """For each image n of worker w's share and each group gi: (n, gi, cols), the im2col
    matrix (CKK x OH*OW) of that image and group (the image itself for 1x1 stride-1), emitted
    inside the loop over images; the caller emits its GEMM per item. Forward and weight
    gradient share it."""
    _zero_pad_region(e, g, step, lay, w, dt)
    lo, hi = _share(e, w, g["n"], workers)
    with for_range(e.b, hi, start=lo) as n:
        src, dims = _source(e, g, step, lay, w, dt, x_slot, n)
        for gi in range(g["groups"]):
            gsrc = e.gep(src, dt, gi * g["cg"] * dims[0] * dims[1])
            if _direct_1x1(g):
                cols = gsrc
            else:
                cols = e.region(step, lay, w, "cols")
                _im2col(e, g, gsrc, dt, dims, cols)
            yield n, gi, cols


def _zero_pad_region(e, g, step, lay, w, dt):
    if g["pad"] != (0, 0):  # the border stays zero: images only overwrite the interior
        e.fill(e.region(step, lay, w, "pad"), dt, g["c"] * g["hp"] * g["wp"], 0)


OBLOCK = 8  # filters per direct-conv loop: 8 vector accumulators + operands fit in registers


def _taps(g):
    """(index in a filter, offset in the flat padded planes) of each tap, in W's order."""
    plane = g["hp"] * g["wp"]
    dh, dw = g["dil"]
    return [((c * g["kh"] + i) * g["kw"] + j, c * plane + i * dh * g["wp"] + j * dw)
            for c in range(g["cg"]) for i in range(g["kh"]) for j in range(g["kw"])]


def _conv2d_direct(eb: EB, step, g, dt, workers, lay):
    """Stride-1 direct convolution over the flat zero-padded planes: with p = oh * wp + ow,
    out[o, p] = sum_t w[o, t] * x[p + off_t], one vectorizable loop over p per image (up to
    OBLOCK filters at once, every tap unrolled, weights in registers). Columns ow >= OW of
    that flat output are garbage, computed anyway (no remainder loops: 896 lanes instead of
    28 rows of 28 for LeNet) and dropped by the copy out."""
    sx, sw_ = step.in_slots
    so = step.out_slots[0]
    o_, ohw, flat = g["o"], g["oh"] * g["ow"], g["oh"] * g["wp"]
    taps = _taps(g)
    ckk = len(taps)

    def work(e, w):
        xf, out = e.region(step, lay, w, "x"), e.region(step, lay, w, "out")
        e.fill(xf, dt, g["c"] * g["hp"] * g["wp"] + _slack(g), 0)
        lo, hi = _share(e, w, g["n"], workers)
        with for_range(e.b, hi, start=lo) as i:
            _to_padded(e, g, dt, _image(e, g, sx, i), xf)
            for o0 in range(0, o_, OBLOCK):
                filt = range(o0, min(o_, o0 + OBLOCK))
                wv = {(o, t): e.load(e.slot_ptr(sw_, o * ckk + t), dt).v
                      for o in filt for t in range(ckk)}
                with for_range(e.b, flat) as p:
                    accs = {}  # tap-major: each x vector feeds every filter, then dies
                    for t, (_, off) in enumerate(taps):
                        xv = e.load(e.gep(xf, dt, e.add(p, off)), dt).v
                        for o in filt:
                            accs[o] = e.b.fmul(wv[o, t], xv) if t == 0 else \
                                e.fmuladd(wv[o, t], xv, accs[o], dt)
                    for o in filt:
                        e.b.store(accs[o], e.gep(out, dt, e.add(p, o * flat)),
                                  align=_isize(dt))
            e.copy_nest([o_, g["oh"], g["ow"]], e.slot_ptr(so, e.mul(i, o_ * ohw)), dt,
                        [ohw, g["ow"], 1], out, dt, [flat, g["wp"], 1])
    _parallel(eb, workers, work)


def _conv2d(eb: EB, step, attrs):
    sx, sw_ = step.in_slots
    so = step.out_slots[0]
    X, W = _slot(eb, sx), _slot(eb, sw_)
    dt = X.dtype
    g = conv_geometry(X.shape, W.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    if g["n"] == 0 or g["o"] == 0 or ohw == 0:
        return
    direct, workers, lay = conv_plan("conv2d", g, dt)
    if direct:
        _conv2d_direct(eb, step, g, dt, workers, lay)
        return

    def work(e, w):
        for n, gi, cols in _image_columns(e, g, step, lay, w, dt, sx, workers):
            out = e.slot_ptr(so, e.add(e.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            wg = e.slot_ptr(sw_, gi * g["og"] * ckk)
            e.gemm(dt, False, False, g["og"], ohw, ckk, wg, ckk, cols, ohw, out, ohw)
    _parallel(eb, workers, work)


def _conv2d_grad_data(eb: EB, step, attrs):
    sg, sw_ = step.in_slots
    so = step.out_slots[0]
    G, W, DX = _slot(eb, sg), _slot(eb, sw_), _slot(eb, so)
    dt = G.dtype
    g = conv_geometry(DX.shape, W.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    plane = g["h"] * g["w"]
    if g["n"] == 0 or g["c"] == 0 or plane == 0:
        return
    _, workers, lay = conv_plan("conv2d_grad_data", g, dt)
    padded = g["pad"] != (0, 0)

    def work(e, w):
        cols = e.region(step, lay, w, "cols")
        lo, hi = _share(e, w, g["n"], workers)
        with for_range(e.b, hi, start=lo) as n:
            img = _image(e, g, so, n)
            if padded:
                dst, dims = e.region(step, lay, w, "pad"), (g["hp"], g["wp"])
            else:
                dst, dims = img, (g["h"], g["w"])
            e.fill(dst, dt, g["c"] * dims[0] * dims[1], 0)
            for gi in range(g["groups"]):
                gin = e.slot_ptr(sg, e.add(e.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
                wg = e.slot_ptr(sw_, gi * g["og"] * ckk)
                # dcols (CKK x OHW) = W_g^T (CKK x og) @ g_n (og x OHW)
                e.gemm(dt, True, False, ckk, ohw, g["og"], wg, ckk, gin, ohw, cols, ohw)
                _col2im(e, g, cols, dt, e.gep(dst, dt, gi * g["cg"] * dims[0] * dims[1]), dims)
            if padded:
                ph, pw = g["pad"]
                e.copy_nest([g["c"], g["h"], g["w"]], img, dt, [plane, g["w"], 1],
                            e.gep(dst, dt, ph * g["wp"] + pw), dt,
                            [g["hp"] * g["wp"], g["wp"], 1])
    _parallel(eb, workers, work)


def _conv2d_grad_weight(eb: EB, step, attrs):
    """dW = sum over images of g_n @ cols_n^T: each worker sums its images (into dW itself
    when it is the only one, else into its scratch, added up in worker order at the end)."""
    sx, sg = step.in_slots
    so = step.out_slots[0]
    X, DW = _slot(eb, sx), _slot(eb, so)
    dt = X.dtype
    g = conv_geometry(X.shape, DW.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    if g["n"] == 0 or ohw == 0 or DW.size == 0:
        eb.fill(eb.slot_ptr(so), dt, DW.size, 0)
        return
    direct, workers, lay = conv_plan("conv2d_grad_weight", g, dt)

    def partial(e, w):
        if workers == 1:
            return e.slot_ptr(so)
        return e.region(step, lay, w, "dw")

    def work(e, w):
        dw = partial(e, w)
        e.fill(dw, dt, DW.size, 0)
        if direct:
            _grad_weight_direct(e, step, g, dt, lay, w, workers, dw)
            return
        for n, gi, cols in _image_columns(e, g, step, lay, w, dt, sx, workers):
            gin = e.slot_ptr(sg, e.add(e.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            # dW_g (og x CKK) += g_n (og x OHW) @ cols^T (OHW x CKK)
            e.gemm(dt, False, True, g["og"], ckk, ohw, gin, ohw, cols, ohw,
                   e.gep(dw, dt, gi * g["og"] * ckk), ckk, accumulate=True)
    _parallel(eb, workers, work)
    if workers > 1:
        with for_range(eb.b, DW.size) as i:
            acc = None
            for w in range(workers):
                v = eb.load(eb.gep(partial(eb, eb.c(w)), dt, i), dt)
                acc = v if acc is None else eb.sb.add(acc, v)
            eb.store(eb.slot_ptr(so, i), acc, dt)


def _grad_weight_direct(e: EB, step, g, dt, lay, w, workers, dw):
    """Worker w's images of a direct (stride-1) convolution: with g_n copied to the flat
    layout (zero garbage columns), dw[o, t] += sum_p g[o, p] * (x[p + off_t] & mask[p]), one
    vectorizable reduction loop per tap. The mask zeroes x where p is a garbage column (there
    x is a wrapped-around neighbour that may be inf or NaN, and 0 * inf is NaN)."""
    sx, sg = step.in_slots
    o_, ohw, flat = g["o"], g["oh"] * g["ow"], g["oh"] * g["wp"]
    taps = _taps(g)
    ckk = len(taps)
    b = e.b
    ity = ir.IntType(8 * _isize(dt))
    ity_name = "int32" if _isize(dt) == 4 else "int64"
    xf, gf, mask = (e.region(step, lay, w, r) for r in ("x", "g", "mask"))
    e.fill(xf, dt, g["c"] * g["hp"] * g["wp"] + _slack(g), 0)
    e.fill(gf, dt, o_ * flat, 0)
    with for_range(b, g["oh"]) as r:
        with for_range(b, g["wp"]) as col:
            keep = b.icmp_signed("<", col, e.c(g["ow"]))
            bits = b.select(keep, ir.Constant(ity, -1), ir.Constant(ity, 0))
            b.store(bits, e.gep(mask, ity_name, e.add(e.mul(r, g["wp"]), col)))
    # Register blocks of filters x taps: each p loads ob g values and tb x values (one mask)
    # for ob * tb FMAs into as many vector accumulators (12: 6 x 2 for LeNet, 9 loads
    # instead of 16 for the same 12 FMAs tap by tap).
    ob = min(o_, 6)
    tb = max(1, 12 // ob)
    accs = [e.entry_alloca(reg_type(dt)) for _ in range(ob * tb)]
    zero = e.sb.const(0.0, dt).v
    lo, hi = _share(e, w, g["n"], workers)
    with for_range(b, hi, start=lo) as i:
        _to_padded(e, g, dt, _image(e, g, sx, i), xf)
        e.copy_nest([o_, g["oh"], g["ow"]], gf, dt, [flat, g["wp"], 1],
                    e.slot_ptr(sg, e.mul(i, o_ * ohw)), dt, [ohw, g["ow"], 1])
        for t0 in range(0, ckk, tb):
            tblock = taps[t0:t0 + tb]
            for o0 in range(0, o_, ob):
                pairs = [(o, t) for o in range(o0, min(o_, o0 + ob))
                         for t in range(t0, t0 + len(tblock))]
                for a in accs[:len(pairs)]:
                    b.store(zero, a)
                with for_range(b, flat) as p:
                    keep = b.load(e.gep(mask, ity_name, p), typ=ity, align=_isize(dt))
                    xs = {}
                    for t, off in tblock:
                        xv = b.load(e.gep(xf, dt, e.add(p, off)), typ=ity, align=_isize(dt))
                        xs[t] = b.bitcast(b.and_(xv, keep), reg_type(dt))
                    gs = {}
                    for (o, t), a in zip(pairs, accs):
                        if o not in gs:
                            gs[o] = e.load(e.gep(gf, dt, e.add(p, o * flat)), dt).v
                        b.store(e.fmuladd(gs[o], xs[t], b.load(a, typ=reg_type(dt)), dt), a)
                for (o, t), a in zip(pairs, accs):
                    pd = e.gep(dw, dt, o * ckk + t)
                    total = Typed(b.load(a, typ=reg_type(dt)), dt)
                    e.store(pd, e.sb.add(e.load(pd, dt), total), dt)


# -------------------------------------------------------------------------- pooling
def _pool_geometry(x_shape, attrs):
    n, c, h, w = x_shape
    if attrs.get("global_pool"):
        k, s, p = (h, w), (1, 1), (0, 0)
    else:
        k = _pair(attrs.get("kernel", 2))
        st = attrs.get("stride")
        s = k if st is None else _pair(st)
        p = _pair(attrs.get("pad", 0))
    oh = conv_out_size(h, k[0], s[0], p[0], 1)
    ow = conv_out_size(w, k[1], s[1], p[1], 1)
    return dict(nc=n * c, h=h, w=w, k=k, s=s, p=p, oh=oh, ow=ow,
                kind=attrs.get("pool_type", "max"),
                include_pad=bool(attrs.get("count_include_pad", True)))


def _unrolled(g) -> bool:
    """No padding and a small window: every window lies inside the plane, so its loads are
    unrolled with constant offsets (the ow loop vectorizes)."""
    return g["p"] == (0, 0) and g["k"][0] * g["k"][1] <= 16


def _window(eb, g, oh, ow):
    """(ih0, iw0, kh range, kw range) of output position (oh, ow), ranges clipped to x."""
    ih0 = eb.add(eb.mul(oh, g["s"][0]), -g["p"][0])
    iw0 = eb.add(eb.mul(ow, g["s"][1]), -g["p"][1])
    b = eb.b
    kh_lo = eb.smax(b.sub(eb.c(0), ih0), 0)
    kh_hi = eb.smin(b.sub(eb.c(g["h"]), ih0), g["k"][0])
    kw_lo = eb.smax(b.sub(eb.c(0), iw0), 0)
    kw_hi = eb.smin(b.sub(eb.c(g["w"]), iw0), g["k"][1])
    return ih0, iw0, (kh_lo, kh_hi), (kw_lo, kw_hi)


def _window_offsets(eb, g, oh, ow):
    """Plane offsets of an unrolled window's elements, in (kh, kw) order."""
    base = eb.add(eb.mul(oh, g["s"][0] * g["w"]), eb.mul(ow, g["s"][1]))
    return [eb.add(base, i * g["w"] + j) for i in range(g["k"][0]) for j in range(g["k"][1])]


def _count(eb, g, dt, khr, kwr):
    if g["include_pad"] or g["p"] == (0, 0):
        return eb.sb.const(float(g["k"][0] * g["k"][1]), dt)
    b = eb.b
    cnt = b.mul(eb.smax(b.sub(khr[1], khr[0]), 0), eb.smax(b.sub(kwr[1], kwr[0]), 0))
    return eb.sb.typed(Typed(b.sitofp(cnt, F32), "float32"), dt)


def _pool_workers(g):
    # a window element (load, compare or add, in scalar window loops) costs about as much as
    # 8 multiply-adds in BLAS: LeNet's first pooling (1.2M loads) takes 0.25 ms
    return _workers(g["nc"], 8 * g["nc"] * g["oh"] * g["ow"] * g["k"][0] * g["k"][1])


def _pool2d(eb: EB, step, attrs):
    sx, so = step.in_slots[0], step.out_slots[0]
    X = _slot(eb, sx)
    dt = X.dtype
    g = _pool_geometry(X.shape, attrs)
    if g["nc"] * g["oh"] * g["ow"] == 0:
        return
    workers = _pool_workers(g)
    init = "-inf" if g["kind"] == "max" else 0.0

    def work(e, w):
        b, sb = e.b, e.sb
        acc = e.entry_alloca(reg_type(dt))
        lo, hi = _share(e, w, g["nc"], workers)
        with for_range(b, hi, start=lo) as p:
            xplane = e.slot_ptr(sx, e.mul(p, g["h"] * g["w"]))
            oplane = e.slot_ptr(so, e.mul(p, g["oh"] * g["ow"]))
            with for_range(b, g["oh"]) as oh:
                with for_range(b, g["ow"]) as ow:
                    if _unrolled(g):
                        res = sb.const(init, dt)
                        for off in _window_offsets(e, g, oh, ow):
                            v = e.load(e.gep(xplane, dt, off), dt)
                            res = sb.max(res, v) if g["kind"] == "max" else sb.add(res, v)
                        res = sb.typed(res, dt)
                        count = sb.const(float(g["k"][0] * g["k"][1]), dt)
                    else:
                        ih0, iw0, khr, kwr = _window(e, g, oh, ow)
                        b.store(sb.const(init, dt).v, acc)
                        with for_range(b, khr[1], start=khr[0]) as kh:
                            row = e.add(e.mul(e.add(ih0, kh), g["w"]), iw0)
                            with for_range(b, kwr[1], start=kwr[0]) as kw:
                                v = e.load(e.gep(xplane, dt, e.add(row, kw)), dt)
                                a = Typed(b.load(acc, typ=reg_type(dt)), dt)
                                r = sb.max(a, v) if g["kind"] == "max" else sb.add(a, v)
                                b.store(sb.typed(r, dt).v, acc)
                        res = Typed(b.load(acc, typ=reg_type(dt)), dt)
                        count = _count(e, g, dt, khr, kwr) if g["kind"] == "avg" else None
                    if g["kind"] == "avg":
                        res = sb.div(res, count)
                    e.store(e.gep(oplane, dt, e.add(e.mul(oh, g["ow"]), ow)), res, dt)
    _parallel(eb, workers, work)


def _pool2d_grad(eb: EB, step, attrs):
    sg, sx, sout = step.in_slots
    so = step.out_slots[0]
    X = _slot(eb, sx)
    dt = X.dtype
    g = _pool_geometry(X.shape, attrs)
    if g["nc"] * g["oh"] * g["ow"] == 0:
        eb.fill(eb.slot_ptr(so), dt, _slot(eb, so).size, 0)
        return
    workers = _pool_workers(g)
    (kh_, kw_), (sh, sw) = g["k"], g["s"]
    # Windows that tile the plane exactly write every element of dx once: no zero fill.
    tiled = _unrolled(g) and (sh, sw) == (kh_, kw_) and g["oh"] * kh_ == g["h"] and \
        g["ow"] * kw_ == g["w"]

    def work(e, w):
        b = e.b
        taken = e.entry_alloca(ir.IntType(1))
        lo, hi = _share(e, w, g["nc"], workers)
        with for_range(b, hi, start=lo) as p:
            xplane = e.slot_ptr(sx, e.mul(p, g["h"] * g["w"]))
            dplane = e.slot_ptr(so, e.mul(p, g["h"] * g["w"]))
            gplane = e.slot_ptr(sg, e.mul(p, g["oh"] * g["ow"]))
            oplane = e.slot_ptr(sout, e.mul(p, g["oh"] * g["ow"]))
            if not tiled:
                e.fill(dplane, dt, g["h"] * g["w"], 0)
            with for_range(b, g["oh"]) as oh:
                with for_range(b, g["ow"]) as ow:
                    o_off = e.add(e.mul(oh, g["ow"]), ow)
                    gv = e.load(e.gep(gplane, dt, o_off), dt)
                    if _unrolled(g):
                        _grad_window_unrolled(e, g, dt, xplane, dplane, oplane, o_off, gv,
                                              oh, ow, tiled)
                    else:
                        _grad_window_clipped(e, g, dt, taken, xplane, dplane, oplane, o_off,
                                             gv, oh, ow)
    _parallel(eb, workers, work)


def _grad_window_unrolled(e, g, dt, xplane, dplane, oplane, o_off, gv, oh, ow, tiled):
    """One window's gradient, unrolled (see _unrolled): avg spreads g / count; max gives all
    of g to the window's first maximum. dx += share, or dx = 0 + share where the windows tile
    the plane (the same bits as a zero fill and an add)."""
    b, sb = e.b, e.sb
    if g["kind"] == "avg":
        share = sb.div(gv, sb.const(float(g["k"][0] * g["k"][1]), dt))
    else:
        ov = e.load(e.gep(oplane, dt, o_off), dt)
        taken = ir.Constant(ir.IntType(1), 0)
    for off in _window_offsets(e, g, oh, ow):
        pd = e.gep(dplane, dt, off)
        if g["kind"] == "max":
            hit = b.and_(sb.cmp("eq", e.load(e.gep(xplane, dt, off), dt), ov).v,
                         b.xor(taken, ir.Constant(taken.type, 1)))
            taken = b.or_(taken, hit)
            share = sb.select(Typed(hit, "bool"), gv, sb.const(0.0, dt))
        old = sb.const(0.0, dt) if tiled else e.load(pd, dt)
        e.store(pd, sb.add(old, share), dt)


def _grad_window_clipped(e, g, dt, taken, xplane, dplane, oplane, o_off, gv, oh, ow):
    """One window's gradient, the window clipped to the plane (padding)."""
    b, sb = e.b, e.sb
    ih0, iw0, khr, kwr = _window(e, g, oh, ow)
    if g["kind"] == "max":
        _max_grad_window(e, g, dt, taken, xplane, dplane, oplane, o_off, gv, ih0, iw0)
        return
    share = sb.div(gv, _count(e, g, dt, khr, kwr))
    with for_range(b, khr[1], start=khr[0]) as kh:
        row = e.add(e.mul(e.add(ih0, kh), g["w"]), iw0)
        with for_range(b, kwr[1], start=kwr[0]) as kw:
            pd = e.gep(dplane, dt, e.add(row, kw))
            e.store(pd, sb.add(e.load(pd, dt), share), dt)


def _max_grad_window(eb, g, dt, taken, xplane, dplane, oplane, o_off, gv, ih0, iw0):
    """Max pooling's gradient for one window: the first maximum (in the padded window, as
    the eager impl scans it) takes all of g."""
    b, sb = eb.b, eb.sb
    ov = eb.load(eb.gep(oplane, dt, o_off), dt)
    b.store(ir.Constant(ir.IntType(1), 0), taken)
    with for_range(b, g["k"][0]) as kh:
        ih = eb.add(ih0, kh)
        vh = b.and_(b.icmp_signed(">=", ih, eb.c(0)),
                    b.icmp_signed("<", ih, eb.c(g["h"])))
        with for_range(b, g["k"][1]) as kw:
            iw = eb.add(iw0, kw)
            valid = b.and_(vh, b.and_(b.icmp_signed(">=", iw, eb.c(0)),
                                      b.icmp_signed("<", iw, eb.c(g["w"]))))
            off = eb.add(eb.mul(eb.clamp(ih, 0, g["h"] - 1), g["w"]),
                         eb.clamp(iw, 0, g["w"] - 1))
            xv = eb.load(eb.gep(xplane, dt, off), dt)
            xv = sb.select(Typed(valid, "bool"), xv, sb.const("-inf", dt))
            t = b.load(taken, typ=ir.IntType(1))
            hit = b.and_(sb.cmp("eq", xv, ov).v, b.xor(t, ir.Constant(t.type, 1)))
            b.store(b.or_(t, hit), taken)
            pd = eb.gep(dplane, dt, off)
            add = sb.select(Typed(b.and_(hit, valid), "bool"), gv,
                            sb.const(0.0, dt))
            eb.store(pd, sb.add(eb.load(pd, dt), add), dt)


# --------------------------------------------------------------- gather / scatter
def _axis(axis, ndim):
    return int(axis) % ndim if ndim else 0


def _index_of(eb, idx_ptr, idx_dt, j, dim, mode):
    v = eb.sb.typed(eb.load(eb.gep(idx_ptr, idx_dt, j), idx_dt), "int64")
    if mode == "wrap":
        return eb.sb.mod(v, eb.sb.const(dim, "int64")).v
    return eb.clamp(v.v, 0, dim - 1)


def _take(eb: EB, step, attrs):
    sx, si = step.in_slots
    so = step.out_slots[0]
    X, IDX = _slot(eb, sx), _slot(eb, si)
    mode = attrs.get("mode", "clip")
    if mode not in ("clip", "wrap"):
        raise KernelIRError("take: mode='raise' cannot raise inside compiled code; use "
                            "mode='clip' or 'wrap' (or run it eagerly)")
    ax = _axis(attrs.get("axis", 0), len(X.shape))
    lead = math.prod(X.shape[:ax])
    dim = X.shape[ax]
    rest = math.prod(X.shape[ax + 1:])
    nj = IDX.size
    if lead * nj * rest == 0:
        return
    if dim == 0:
        raise KernelIRError("take: cannot take from an empty axis")
    b = eb.b
    with for_range(b, lead) as l_:
        with for_range(b, nj) as j:
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, j, dim, mode)
            src = eb.slot_ptr(sx, eb.mul(eb.add(eb.mul(l_, dim), i), rest))
            dst = eb.slot_ptr(so, eb.mul(eb.add(eb.mul(l_, nj), j), rest))
            eb.copy_nest([rest], dst, X.dtype, [1], src, X.dtype, [1])


def _take_grad(eb: EB, step, attrs):
    sg, si = step.in_slots
    so = step.out_slots[0]
    G, IDX, OUT = _slot(eb, sg), _slot(eb, si), _slot(eb, so)
    mode = attrs.get("mode", "clip")
    ax = int(attrs["axis"])
    dim = int(attrs["dim"])
    lead = math.prod(OUT.shape[:ax])
    rest = math.prod(OUT.shape[ax + 1:])
    nj = IDX.size
    eb.fill(eb.slot_ptr(so), OUT.dtype, OUT.size, 0)
    if lead * nj * rest * dim == 0:
        return
    b = eb.b
    with for_range(b, lead) as l_:
        with for_range(b, nj) as j:
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, j, dim, mode)
            dst = eb.slot_ptr(so, eb.mul(eb.add(eb.mul(l_, dim), i), rest))
            src = eb.slot_ptr(sg, eb.mul(eb.add(eb.mul(l_, nj), j), rest))
            eb.copy_nest([rest], dst, OUT.dtype, [1], src, G.dtype, [1], accumulate=True)


def _pick(eb: EB, step, attrs):
    sx, si = step.in_slots
    so = step.out_slots[0]
    X, IDX = _slot(eb, sx), _slot(eb, si)
    ax = _axis(attrs.get("axis", -1), len(X.shape))
    lead = math.prod(X.shape[:ax])
    dim = X.shape[ax]
    rest = math.prod(X.shape[ax + 1:])
    if lead * rest == 0:
        return
    b = eb.b
    with for_range(b, lead) as l_:
        with for_range(b, rest) as r:
            pos = eb.add(eb.mul(l_, rest), r)
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, pos, dim, "clip")
            v = eb.load(eb.slot_ptr(sx, eb.add(eb.mul(eb.add(eb.mul(l_, dim), i), rest), r)),
                        X.dtype)
            eb.store(eb.slot_ptr(so, pos), v, X.dtype)


def _argext(kind):
    def emit(eb: EB, step, attrs):
        sx, so = step.in_slots[0], step.out_slots[0]
        X = _slot(eb, sx)
        axis = attrs.get("axis")
        if axis is None:
            lead, dim, rest = 1, X.size, 1
        else:
            ax = _axis(axis, len(X.shape))
            lead, dim, rest = (math.prod(X.shape[:ax]), X.shape[ax],
                               math.prod(X.shape[ax + 1:]))
        if lead * rest == 0 or dim == 0:
            return
        b, sb = eb.b, eb.sb
        dt = X.dtype
        best = b.alloca(reg_type(dt))
        besti = b.alloca(I64)
        with for_range(b, lead) as l_:
            with for_range(b, rest) as r:
                base = eb.add(eb.mul(l_, dim * rest), r)
                b.store(eb.load(eb.slot_ptr(sx, base), dt).v, best)
                b.store(eb.c(0), besti)
                if dim > 1:
                    with for_range(b, dim, start=1) as kk:
                        v = eb.load(eb.slot_ptr(sx, eb.add(base, eb.mul(kk, rest))), dt)
                        cur = Typed(b.load(best, typ=reg_type(dt)), dt)
                        better = sb.cmp("gt" if kind == "argmax" else "lt", v, cur).v
                        if dt in FLOATS:  # the first NaN wins, as in NumPy
                            vnan = b.fcmp_unordered("uno", v.v, v.v)
                            cnan = b.fcmp_unordered("uno", cur.v, cur.v)
                            better = b.or_(better, b.and_(vnan, b.xor(
                                cnan, ir.Constant(cnan.type, 1))))
                        b.store(b.select(better, v.v, cur.v), best)
                        b.store(b.select(better, kk, b.load(besti, typ=I64)), besti)
                eb.store(eb.slot_ptr(so, eb.add(eb.mul(l_, rest), r)),
                         Typed(b.load(besti, typ=I64), "int64"), "int64")
    return emit


_EMITTERS = {"matmul": _matmul, "conv2d": _conv2d, "conv2d_grad_data": _conv2d_grad_data,
             "conv2d_grad_weight": _conv2d_grad_weight, "pool2d": _pool2d,
             "pool2d_grad": _pool2d_grad, "take": _take, "take_grad": _take_grad,
             "pick": _pick, "argmax": _argext("argmax"), "argmin": _argext("argmin")}
