"""The matmul extern on the LLVM backend: batched and single GEMMs, through OpenBLAS or
generated loops.

A product runs as, in this order of preference: batch-1 GEMV loops (gemv.py, x @ W.T at
batch 1, W packed when it is a parameter); one GEMV per row of x for a product with fewer
outputs than vector lanes (``_thin``); the register-tiled float32 loops (sgemm.py) at the
sizes they take (extern_plan.matmul_plan); OpenBLAS's sgemm/dgemm (or sgemv/dgemv for a
vector operand) for the other float32/float64 products; loop GEMMs for other dtypes. Big
products split into workers (extern_plan.py), OpenBLAS single-threaded inside them
(runtime/blas.py). ``gemm`` is also the convolutions' GEMM (conv.py).
"""
from __future__ import annotations

import math

from llvmlite import ir

from ..extern_plan import (PACK_HEADER, PARALLEL_MIN_WORK, POOL_MIN_WORK, THIN_MIN_WORK,
                           GEMV_ROWS, gemv_applies, gemv_pack_size, matmul_plan,
                           sgemm_applies, tile_rows, workers_for)
from ..kernel import contiguous_strides, matmul_operand_shapes
from .emit import for_range
from .extern_builder import EB, run_workers, slot_of, worker_range
from .gemv import (PACK_NEW, PACK_READY, PACK_SEEN, gemv_pack, gemv_rows, gemv_workers,
                   thin_applies)
from .scalar import F32, F64, I32, I64, PTR
from .sgemm import emit_sgemm

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112
GEMM_MIN_ROWS = 32  # rows (or columns) of C per worker: thinner slices waste BLAS's packing


# --------------------------------------------------------------------------- GEMM
def gemm(e, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate=False,
         a_dt=None, b_dt=None):
    """C (m x n, row stride ldc) (+)= op(A) @ op(B); op = transpose when ta/tb."""
    a_dt, b_dt = a_dt or dt, b_dt or dt
    if m == 0 or n == 0:
        return
    if k == 0:
        if not accumulate:
            with for_range(e.b, m) as i:
                e.fill(e.gep(cp, dt, e.mul(i, ldc)), dt, n, 0)
        return
    if not (ta or tb or accumulate) and a_dt == dt == b_dt and sgemm_applies(dt, m, n, k):
        emit_sgemm(e, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc)  # no scratch: in place
        return
    if dt in ("float32", "float64") and a_dt == dt and b_dt == dt:
        _blas_gemm(e, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate)
    else:
        _loop_gemm(e, dt, a_dt, b_dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate)


def _blas_gemm(e, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate):
    e.mb.uses_blas = True
    fty = F32 if dt == "float32" else F64
    p = "s" if dt == "float32" else "d"
    def i32(v):  # sizes are constants, or i64 values where workers split a GEMM
        return e.b.trunc(v, I32) if isinstance(v, ir.Value) else ir.Constant(I32, int(v))
    beta = ir.Constant(fty, 1.0 if accumulate else 0.0)
    one = ir.Constant(fty, 1.0)
    if gemv_applies(m, n, k, ta, tb):
        gemv_rows(e, dt, n, k, a, bp, ldb, cp, accumulate)
        return
    if m == 1 and ldc >= 1:  # row vector: y(n) = op(B)^T x
        gemv = e.mb.intr.get(f"hybrid_cblas_{p}gemv", ir.VoidType(),
                             [I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty, PTR, I32],
                             readnone=False)
        incx = lda if ta else 1
        if tb:  # B stored (n, k): y = B x
            args = [CBLAS_NO_TRANS, n, k]
        else:  # B stored (k, n): y = B^T x
            args = [CBLAS_TRANS, k, n]
        e.b.call(gemv, [i32(CBLAS_ROW_MAJOR), i32(args[0]), i32(args[1]), i32(args[2]),
                        one, bp, i32(ldb), a, i32(incx), beta, cp, i32(1)])
        return
    if n == 1:  # column vector: y(m) = op(A) x
        gemv = e.mb.intr.get(f"hybrid_cblas_{p}gemv", ir.VoidType(),
                             [I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty, PTR, I32],
                             readnone=False)
        incx = 1 if tb else ldb
        args = [CBLAS_TRANS, k, m] if ta else [CBLAS_NO_TRANS, m, k]
        e.b.call(gemv, [i32(CBLAS_ROW_MAJOR), i32(args[0]), i32(args[1]), i32(args[2]),
                        one, a, i32(lda), bp, i32(incx), beta, cp, i32(ldc)])
        return
    cblas_gemm = e.mb.intr.get(f"hybrid_cblas_{p}gemm", ir.VoidType(),
                               [I32, I32, I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty,
                                PTR, I32], readnone=False)
    e.b.call(cblas_gemm, [i32(CBLAS_ROW_MAJOR), i32(CBLAS_TRANS if ta else CBLAS_NO_TRANS),
                          i32(CBLAS_TRANS if tb else CBLAS_NO_TRANS), i32(m), i32(n), i32(k),
                          one, a, i32(lda), bp, i32(ldb), beta, cp, i32(ldc)])


def _loop_gemm(e, dt, a_dt, b_dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc,
               accumulate):
    b, sb = e.b, e.sb
    with for_range(b, m) as i:
        crow = e.gep(cp, dt, e.mul(i, ldc))
        if not accumulate:
            e.fill(crow, dt, n, 0)
        with for_range(b, k) as kk:
            aoff = e.add(e.mul(kk, lda), i) if ta else e.add(e.mul(i, lda), kk)
            av = sb.typed(e.load(e.gep(a, a_dt, aoff), a_dt), dt)
            with for_range(b, n) as j:
                boff = e.add(e.mul(j, ldb), kk) if tb else e.add(e.mul(kk, ldb), j)
                bv = sb.typed(e.load(e.gep(bp, b_dt, boff), b_dt), dt)
                pc = e.gep(crow, dt, j)
                e.store(pc, sb.add(e.load(pc, dt), sb.mul(av, bv)), dt)


# ------------------------------------------------------------------------- matmul
def _matmul(eb: EB, step, attrs):
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    A, B, C = slot_of(eb, sa), slot_of(eb, sbb), slot_of(eb, so)
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
        st = contiguous_strides(own) if own else []
        st = [s * mat for s in st]
        st = [0 if own[i] == 1 else st[i] for i in range(len(own))]
        return [0] * (nb - len(own)) + st
    sa_st, sb_st = bstrides(A.shape), bstrides(B.shape)
    sc_st = [s * m * n for s in contiguous_strides(batch)] if batch else []
    if math.prod(batch) == 0:
        return
    work = math.prod(batch) * m * n * k

    def nest(e, d, aoff, boff, coff):
        if d == nb:
            gemm(e, C.dtype, ta, tb, m, n, k, e.slot_ptr(sa, aoff), lda,
                 e.slot_ptr(sbb, boff), ldb, e.slot_ptr(so, coff), n, a_dt=A.dtype,
                 b_dt=B.dtype)
            return
        with for_range(e.b, batch[d]) as i:
            nest(e, d + 1, e.add(aoff, e.mul(i, sa_st[d])), e.add(boff, e.mul(i, sb_st[d])),
                 e.add(coff, e.mul(i, sc_st[d])))
    if nb:  # workers take slices of the outermost batch dimension
        workers = workers_for(batch[0], work)

        def batches(e, w):
            lo, hi = worker_range(e, w, batch[0], workers)
            with for_range(e.b, hi, start=lo) as i:
                nest(e, 1, e.mul(i, sa_st[0]), e.mul(i, sb_st[0]), e.mul(i, sc_st[0]))
        run_workers(eb, workers, batches)
        return
    if eb.bound is not None:
        _bounded(eb, step, attrs, C.dtype, A.dtype, B.dtype, ta, tb, m, n, k, lda, ldb, work)
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
    workers = workers_for(max(m, n) // GEMM_MIN_ROWS, work, min_work=POOL_MIN_WORK)

    def block(e, w):
        lo, hi = worker_range(e, w, m if rows else n, workers)
        cnt = e.b.sub(hi, lo) if workers > 1 else (m if rows else n)
        if rows:
            gemm(e, C.dtype, ta, tb, cnt, n, k, e.slot_ptr(sa, lo if ta else e.mul(lo, lda)),
                 lda, e.slot_ptr(sbb), ldb, e.slot_ptr(so, e.mul(lo, n)), n,
                 a_dt=A.dtype, b_dt=B.dtype)
        else:
            gemm(e, C.dtype, ta, tb, m, cnt, k, e.slot_ptr(sa), lda,
                 e.slot_ptr(sbb, e.mul(lo, ldb) if tb else lo), ldb, e.slot_ptr(so, lo), n,
                 a_dt=A.dtype, b_dt=B.dtype)
    run_workers(eb, workers, block, spawn=work >= PARALLEL_MIN_WORK)


def _bounded(eb: EB, step, attrs, dt, a_dt, b_dt, ta, tb, m, n, k, lda, ldb, work):
    """A product under a row bound (kernel.Program.rows, compiler/passes/row_bounds.py):
    ("m",) computes C's rows below the bound (the generated loops' row tiles up to it, or
    BLAS on that many rows), ("k",) contracts that many rows (BLAS takes a run-time k)."""
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    mr = tile_rows()
    if eb.bound[0] == ("m",):
        plan = matmul_plan([slot_of(eb, sa).shape, slot_of(eb, sbb).shape], [a_dt, b_dt], dt,
                           attrs) if a_dt == b_dt == dt else None
        if plan is not None:
            def block(e, w):
                rows = e.bounded(m)
                tiles = e.smin(e.b.sdiv(e.add(rows, mr - 1), e.c(mr)), m // mr)
                last = e.b.icmp_signed(">", rows, e.c(m // mr * mr))
                pack = e.region(step, plan.lay, w, "pack") if "pack" in plan.lay.at else None
                part = None
                if plan.workers > 1 and plan.by == "cols":
                    lo, hi = worker_range(e, w, plan.units, plan.workers)
                    part = ("cols", lo, hi)
                    own = (e.c(0), tiles, last)
                elif plan.workers > 1:  # row tiles: the real ones split among the workers
                    lo, hi = worker_range(e, w, tiles, plan.workers)
                    own = (lo, hi, e.b.and_(last, e.b.icmp_signed(
                        "==", w, e.c(plan.workers - 1))))
                else:
                    own = (e.c(0), tiles, last)
                emit_sgemm(e, ta, tb, m, n, k, e.slot_ptr(sa), lda, e.slot_ptr(sbb), ldb,
                           e.slot_ptr(so), n, pack=pack, part=part, row_tiles=own)
            run_workers(eb, plan.workers, block, spawn=work >= PARALLEL_MIN_WORK)
            return
        thin = dt == a_dt == b_dt and thin_applies(dt, m, n, k, ta, tb)
        workers = workers_for(m, work, min_work=THIN_MIN_WORK) if thin else \
            workers_for(max(m // GEMM_MIN_ROWS, 1), work, min_work=POOL_MIN_WORK)

        def rows_block(e, w):  # BLAS (or GEMV rows) on the worker's share of the real rows
            lo, hi = worker_range(e, w, e.bounded(m), workers)
            with e.b.if_then(e.b.icmp_signed("<", lo, hi)):
                if thin:
                    with for_range(e.b, hi, start=lo) as i:
                        gemv_rows(e, dt, n, k, e.slot_ptr(sa, e.mul(i, lda)), e.slot_ptr(sbb),
                                  ldb, e.slot_ptr(so, e.mul(i, n)), False)
                else:
                    gemm(e, dt, ta, tb, e.b.sub(hi, lo), n, k, e.slot_ptr(sa, e.mul(lo, lda)),
                         lda, e.slot_ptr(sbb), ldb, e.slot_ptr(so, e.mul(lo, n)), n,
                         a_dt=a_dt, b_dt=b_dt)
        run_workers(eb, workers, rows_block, spawn=work >= PARALLEL_MIN_WORK)
        return
    # ("k",): C (m x n, free of the batch) = A^T B over the real rows; workers take C's rows
    # (columns when C is wide), each a BLAS call with the run-time k
    rows = m >= n
    workers = workers_for(max(m, n) // GEMM_MIN_ROWS, work, min_work=POOL_MIN_WORK)

    def k_block(e, w):
        kk = e.bounded(k)
        lo, hi = worker_range(e, w, m if rows else n, workers)
        cnt = e.b.sub(hi, lo)
        if rows:
            gemm(e, dt, ta, tb, cnt, n, kk, e.slot_ptr(sa, lo if ta else e.mul(lo, lda)), lda,
                 e.slot_ptr(sbb), ldb, e.slot_ptr(so, e.mul(lo, n)), n, a_dt=a_dt, b_dt=b_dt)
        else:
            gemm(e, dt, ta, tb, m, cnt, kk, e.slot_ptr(sa), lda,
                 e.slot_ptr(sbb, e.mul(lo, ldb) if tb else lo), ldb, e.slot_ptr(so, lo), n,
                 a_dt=a_dt, b_dt=b_dt)
    run_workers(eb, workers, k_block, spawn=work >= PARALLEL_MIN_WORK)


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
            lo, hi = worker_range(e, w, plan.units, plan.workers)
            part = ("cols", lo, hi) if plan.by == "cols" else \
                ("rows", lo, hi, e.b.icmp_signed("==", w, e.c(plan.workers - 1)))
        emit_sgemm(e, ta, tb, m, n, k, e.slot_ptr(sa), lda, e.slot_ptr(sbb), ldb,
                   e.slot_ptr(so), n, pack=pack, strips=strips, part=part)
    run_workers(eb, plan.workers, block, spawn=m * n * k >= PARALLEL_MIN_WORK)


def _thin(eb: EB, step, dt, m, n, k, lda, ldb, work):
    """x @ W.T with fewer outputs than vector lanes (gemv.thin_applies): a gemv_rows
    per row of x, the rows split among the caller and the pool."""
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    workers = workers_for(m, work, min_work=THIN_MIN_WORK)

    def rows(e, w):
        lo, hi = worker_range(e, w, m, workers) if workers > 1 else (e.c(0), e.c(m))
        with for_range(e.b, hi, start=lo) as i:
            gemv_rows(e, dt, n, k, e.slot_ptr(sa, e.mul(i, lda)), e.slot_ptr(sbb), ldb,
                      e.slot_ptr(so, e.mul(i, n)), False)
    run_workers(eb, workers, rows, spawn=False)


def _gemv(eb: EB, step, dt, n, k, ldb, packed):
    """A batch-1 Dense layer: its row blocks split into chunks for the caller and the pool
    (never threads started for it: a few microseconds of work). packed: B is a parameter
    with a packed copy in the step's scratch (gemv.py), used from the binding's second
    call on."""
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    workers = gemv_workers(n, k)

    def part(e, w):
        if workers == 1:
            return None
        lo, hi = worker_range(e, w, n // GEMV_ROWS, workers)
        return lo, hi, e.b.icmp_signed("==", w, e.c(workers - 1))

    def rows(e, w):  # packed: one loop for both layouts, reading the state the caller set
        ready = e.b.icmp_unsigned("==", e.b.load(e.scratch(step.scratch, 0), typ=I64, align=8),
                                  e.c(PACK_READY)) if packed else None
        gemv_rows(e, dt, n, k, e.slot_ptr(sa), e.slot_ptr(sbb), ldb, e.slot_ptr(so), False,
                  part(e, w), e.scratch(step.scratch, PACK_HEADER) if packed else None, ready)
    if not packed:
        run_workers(eb, workers, rows, spawn=False)
        return
    b = eb.b
    state_at = eb.scratch(step.scratch, 0)
    state = b.load(state_at, typ=I64, align=8)  # only this thread runs here: plain access
    with b.if_then(b.icmp_unsigned("==", state, eb.c(PACK_SEEN))):
        gemv_pack(eb, dt, n, k, eb.slot_ptr(sbb), ldb, eb.scratch(step.scratch, PACK_HEADER))
        b.store(eb.c(PACK_READY), state_at, align=8)
    with b.if_then(b.icmp_unsigned("==", state, eb.c(PACK_NEW))):
        b.store(eb.c(PACK_SEEN), state_at, align=8)
    run_workers(eb, workers, rows, spawn=False)



EMITTERS = {"matmul": _matmul}
