"""Batch-1 Dense layers on the LLVM backend: y (+)= x @ W.T with W stored (out, in).

At batch 1 a Dense layer is a matrix-vector product whose weights stream from cache; an
OpenBLAS sgemv call (argument checks, thread dispatch) costs more than the whole loop at the
book's sizes, so these run as generated vector loops, four rows at a time.
"""
from __future__ import annotations

from llvmlite import ir

from .llvm import for_range
from .llvm_scalar import F32, F64, I32, I64

# Up to this many weights the loop stays in cache and single-threaded; bigger products call
# BLAS, which splits them across the device's threads.
GEMV_LOOP_MAX = 1 << 20


def _isize(dt):
    return 4 if dt == "float32" else 8


def gemv_rows(eb, dt, n, k, x, w, ldw, y, accumulate):
    """y[j] (+)= dot(x, w[j, :k]) for j < n: batch-1 Dense layers (x @ W.T, W stored
    (out, in)). Four rows at a time, each with its own vector accumulator, so the FMA
    chains overlap and x is loaded once per four rows; the weights stream from cache.
    An OpenBLAS sgemv call costs more than this whole loop at the book's sizes."""
    b = eb.b
    fty = F32 if dt == "float32" else F64
    lanes = 8 if dt == "float32" else 4
    vty = ir.VectorType(fty, lanes)
    fma = eb.mb.intr.get(f"llvm.fma.v{lanes}{'f32' if dt == 'float32' else 'f64'}",
                         vty, [vty, vty, vty])
    kv = k - k % lanes
    zero = ir.Constant(vty, [0.0] * lanes)

    def rows(j0, r):
        accs = [zero] * r
        if kv:
            head = b.block
            loop = b.append_basic_block("gemv.loop")
            done = b.append_basic_block("gemv.done")
            b.branch(loop)
            b.position_at_end(loop)
            kk = b.phi(I64)
            kk.add_incoming(eb.c(0), head)
            phis = []
            for _ in range(r):
                ph = b.phi(vty)
                ph.add_incoming(zero, head)
                phis.append(ph)
            xv = b.load(eb.gep(x, dt, kk), typ=vty, align=_isize(dt))
            new = []
            for i, ph in enumerate(phis):
                row = eb.add(eb.mul(eb.add(j0, i), ldw), kk)
                wv = b.load(eb.gep(w, dt, row), typ=vty, align=_isize(dt))
                new.append(b.call(fma, [xv, wv, ph]))
            nxt = b.add(kk, eb.c(lanes))
            kk.add_incoming(nxt, b.block)
            for ph, v in zip(phis, new):
                ph.add_incoming(v, b.block)
            b.cbranch(b.icmp_signed("<", nxt, eb.c(kv)), loop, done)
            b.position_at_end(done)
            accs = new
        for i, acc in enumerate(accs):
            total = b.extract_element(acc, ir.Constant(I32, 0))
            for lane in range(1, lanes):
                total = b.fadd(total, b.extract_element(acc, ir.Constant(I32, lane)))
            for t in range(kv, k):  # the tail below one vector
                xt = b.load(eb.gep(x, dt, t), typ=fty)
                wt = b.load(eb.gep(w, dt, eb.add(eb.mul(eb.add(j0, i), ldw), t)),
                            typ=fty)
                total = b.fadd(total, b.fmul(xt, wt))
            out = eb.gep(y, dt, eb.add(j0, i))
            if accumulate:
                total = b.fadd(b.load(out, typ=fty), total)
            b.store(total, out)
    blocks = n // 4
    if blocks:
        with for_range(b, blocks) as jb:
            rows(eb.mul(jb, 4), 4)
    for j in range(blocks * 4, n):
        rows(eb.c(j), 1)
