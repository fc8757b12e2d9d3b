"""Register shuffles shared by the emitters: the transpose of a square block of vectors
(the GEMM loops' transposed panels, sgemm.py; transposing copies, emit.py)."""
from __future__ import annotations

from llvmlite import ir

from .scalar import I32


def transpose_block(b, rows, lanes):
    """rows: `lanes` vectors of `lanes` floats (a square block); returns its transpose, by
    log2(lanes) rounds of two-input shuffles that swap the off-diagonal halves of every block
    (16 x 16: 64 shuffles, one per cycle)."""
    cur = list(rows)
    bs = lanes
    while bs > 1:
        half = bs // 2
        lo_mask, hi_mask = [], []
        for blk in range(lanes // bs):
            base = blk * bs
            lo_mask += [base + t for t in range(half)] + [lanes + base + t for t in range(half)]
            hi_mask += [base + half + t for t in range(half)] + \
                [lanes + base + half + t for t in range(half)]
        lo_c = ir.Constant(ir.VectorType(I32, lanes), lo_mask)
        hi_c = ir.Constant(ir.VectorType(I32, lanes), hi_mask)
        nxt = list(cur)
        for g in range(0, lanes, bs):
            for r in range(g, g + half):
                x, y = cur[r], cur[r + half]
                nxt[r] = b.shuffle_vector(x, y, lo_c)
                nxt[r + half] = b.shuffle_vector(x, y, hi_c)
        cur = nxt
        bs = half
    return cur
