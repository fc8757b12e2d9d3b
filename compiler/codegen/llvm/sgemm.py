"""Float32 GEMMs at the sizes of deep-learning layers, as generated register-tiled loops.

At a Dense layer's sizes (64 x 512 @ 512 x 256) OpenBLAS's sgemm (scipy-openblas32) reaches
~120 GFLOP/s on one core of the Xeon this was measured on, and ~95 when B is transposed
(x @ W.T, W stored (out, in)); MKL (PyTorch) ~165 there. These loops reach ~145-170: the
classic broadcast micro-kernel, every size known when the program is lowered.

A tile of C, MR rows x NR columns (NR = two full vector registers: 32 float32 lanes with
AVX-512, 16 with AVX2), lives in registers for the whole sum over k: per k, NR/lanes vector
loads of B's row k, MR broadcasts of A[i, k], MR x NR/lanes FMAs. Columns of C are taken in
*panels* of NR; a panel of B (k x NR floats, at most 128 KiB at the sizes these loops take)
stays in L2 while every row tile of A streams past it.

B transposed (the Dense layer's W (n, k)): each panel is first transposed into the worker's
scratch (lanes x lanes blocks through shuffles, zero-padded past n), then read as above: the
transpose reads W once, ~7% of the product at batch 64 and less at larger batches.
A transposed (the weight gradient g^T @ x, A stored (k, m)): A is first copied into
MR-wide strips, strip t holding A[k, t*MR : t*MR + MR] for every k, one after another. Read in
place, a row tile's k-th elements sit lda floats apart (1 KiB at m = 256): they fall into a
few L1 sets and evict each other (the 256 x 256 @ 256 x 784 weight gradient: 470 us read in
place, below OpenBLAS's 384).

The sum over k runs in order for every element: results do not depend on the tiling or on
the worker count (each element is one FMA chain).
"""
from __future__ import annotations

from llvmlite import ir

from ..extern_plan import panel_cols, panels, tile_rows, vector_lanes
from .emit import for_range
from .scalar import F32, I1, I32
from .shuffles import transpose_block

# Which products these loops take, their tile sizes (MR = tile_rows(), NR = panel_cols()) and
# the scratch of a worker (pack_bytes, strip_bytes) are the matmul plan's: extern_plan.py.


class _Kernel:
    """Emission state of one GEMM: C (m x n, row stride ldc) = op(A) @ op(B)."""

    def __init__(self, eb, ta, tb, m, n, k, a, lda, bp, ldb, c, ldc, pack, strips):
        self.eb, self.b = eb, eb.b
        self.ta, self.tb = ta, tb
        self.m, self.k = m, k
        self.a, self.lda, self.bp, self.ldb, self.c, self.ldc = a, lda, bp, ldb, c, ldc
        self.pack = pack  # scratch for one packed panel of B (None: B read in place)
        self.strips = strips  # ta: scratch for A's strips (None: A read in place)
        self.lanes = vector_lanes("float32")
        self.vty = ir.VectorType(F32, self.lanes)
        self.mr, self.nr = tile_rows(), panel_cols()
        intr = eb.mb.intr
        sfx = f"v{self.lanes}f32"
        self.fma = intr.get(f"llvm.fma.{sfx}", self.vty, [self.vty] * 3)
        mty = ir.VectorType(I1, self.lanes)
        self.mload = intr.get(f"llvm.masked.load.{sfx}.p0", self.vty,
                              [ir.PointerType(), I32, mty, self.vty])
        self.mstore = intr.get(f"llvm.masked.store.{sfx}.p0", ir.VoidType(),
                               [self.vty, ir.PointerType(), I32, mty])
        self.zero = ir.Constant(self.vty, [0.0] * self.lanes)

    # -- vectors -------------------------------------------------------------------------
    def _mask(self, valid):
        return ir.Constant(ir.VectorType(I1, self.lanes),
                           [1 if t < valid else 0 for t in range(self.lanes)])

    def _vload(self, ptr, valid):
        """`valid` leading lanes from ptr (the rest zero, never read)."""
        if valid >= self.lanes:
            return self.b.load(ptr, typ=self.vty, align=4)
        return self.b.call(self.mload, [ptr, ir.Constant(I32, 4), self._mask(valid), self.zero])

    def _vstore(self, v, ptr, valid):
        if valid >= self.lanes:
            self.b.store(v, ptr, align=4)
        else:
            self.b.call(self.mstore, [v, ptr, ir.Constant(I32, 4), self._mask(valid)])

    def _splat(self, x):
        b = self.b
        v = b.insert_element(ir.Constant(self.vty, ir.Undefined), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vty, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes))

    # -- packing (tb) ----------------------------------------------------------------------
    def pack_panel(self, j0, cols):
        """pack[kk * NR + c] = op(B)[kk, j0 + c] for c < cols, 0 for cols <= c < NR."""
        eb, b, L, k = self.eb, self.b, self.lanes, self.k
        nblk = self.nr // L
        if not self.tb:  # rows of the panel, one after another
            with for_range(b, k) as kk:
                src = eb.gep(self.bp, "float32", eb.add(eb.mul(kk, self.ldb), j0))
                dst = eb.gep(self.pack, "float32", eb.mul(kk, self.nr))
                for v in range(nblk):
                    valid = min(L, cols - v * L)
                    row = self._vload(eb.gep(src, "float32", v * L), valid) if valid > 0 \
                        else self.zero
                    b.store(row, eb.gep(dst, "float32", v * L), align=4)
            return
        kfull = k - k % L
        if kfull:
            with for_range(b, kfull // L) as kb:
                k0 = eb.mul(kb, L)
                for h in range(nblk):
                    rows = []
                    for t in range(L):
                        c = h * L + t
                        if c < cols:
                            src = eb.gep(self.bp, "float32",
                                         eb.add(eb.mul(eb.add(j0, c), self.ldb), k0))
                            rows.append(b.load(src, typ=self.vty, align=4))
                        else:
                            rows.append(self.zero)
                    for t, col in enumerate(transpose_block(b, rows, L)):
                        dst = eb.gep(self.pack, "float32",
                                     eb.add(eb.mul(eb.add(k0, t), self.nr), h * L))
                        b.store(col, dst, align=4)
        for kk in range(kfull, k):  # the rows of the panel below one block: scalar
            for c in range(self.nr):
                dst = eb.gep(self.pack, "float32", kk * self.nr + c)
                if c < cols:
                    src = eb.gep(self.bp, "float32", eb.add(eb.mul(eb.add(j0, c), self.ldb), kk))
                    b.store(b.load(src, typ=F32), dst)
                else:
                    b.store(ir.Constant(F32, 0.0), dst)

    def pack_strips(self):
        """strips[(t * k + kk) * MR + r] = A[kk, t * MR + r] (ta), zero past m."""
        eb, b, mr, k = self.eb, self.b, self.mr, self.k
        full, rem = self.m // mr, self.m % mr
        sty = ir.VectorType(F32, mr)

        def dst(t, kk):
            return eb.gep(self.strips, "float32", eb.mul(eb.add(eb.mul(t, k), kk), mr))
        if full:
            with for_range(b, full) as t:
                with for_range(b, k) as kk:
                    src = eb.gep(self.a, "float32", eb.add(eb.mul(kk, self.lda), eb.mul(t, mr)))
                    b.store(b.load(src, typ=sty, align=4), dst(t, kk), align=4)
        if rem:
            with for_range(b, k) as kk:
                base = dst(eb.c(full), kk)
                for r in range(mr):
                    v = ir.Constant(F32, 0.0)
                    if r < rem:
                        src = eb.add(eb.mul(kk, self.lda), full * mr + r)
                        v = b.load(eb.gep(self.a, "float32", src), typ=F32)
                    b.store(v, eb.gep(base, "float32", r))

    # -- one tile ----------------------------------------------------------------------------
    def tile(self, it, rows, j0, cols):
        """C[i0:i0+rows, j0:j0+cols] = sum over k (i0 = it * MR), accumulators in
        registers."""
        eb, b, L = self.eb, self.b, self.lanes
        i0 = eb.mul(it, self.mr)
        nv = -(-cols // L)
        valid = [min(L, cols - v * L) for v in range(nv)]
        pre = b.block
        loop = b.append_basic_block("sgemm.k")
        done = b.append_basic_block("sgemm.k.end")
        b.branch(loop)
        b.position_at_end(loop)
        kk = b.phi(eb.c(0).type)
        kk.add_incoming(eb.c(0), pre)
        acc = [[None] * nv for _ in range(rows)]
        for r in range(rows):
            for v in range(nv):
                acc[r][v] = b.phi(self.vty)
                acc[r][v].add_incoming(self.zero, pre)
        if self.pack is not None:  # the packed panel: full, zero-padded rows
            brow = eb.gep(self.pack, "float32", eb.mul(kk, self.nr))
            bv = [b.load(eb.gep(brow, "float32", v * L), typ=self.vty, align=4)
                  for v in range(nv)]
        else:
            brow = eb.gep(self.bp, "float32", eb.add(eb.mul(kk, self.ldb), j0))
            bv = [self._vload(eb.gep(brow, "float32", v * L), valid[v]) for v in range(nv)]
        new = [[None] * nv for _ in range(rows)]
        if self.strips is not None:
            arow = eb.gep(self.strips, "float32", eb.mul(eb.add(eb.mul(it, self.k), kk), self.mr))
        for r in range(rows):
            if self.strips is not None:
                ap = eb.gep(arow, "float32", r)
            else:
                i = eb.add(i0, r)
                ap = eb.gep(self.a, "float32", eb.add(eb.mul(kk, self.lda), i) if self.ta else
                            eb.add(eb.mul(i, self.lda), kk))
            av = self._splat(b.load(ap, typ=F32))
            for v in range(nv):
                new[r][v] = b.call(self.fma, [av, bv[v], acc[r][v]])
        nxt = b.add(kk, eb.c(1))
        kk.add_incoming(nxt, b.block)
        for r in range(rows):
            for v in range(nv):
                acc[r][v].add_incoming(new[r][v], b.block)
        b.cbranch(b.icmp_signed("<", nxt, eb.c(self.k)), loop, done)
        b.position_at_end(done)
        for r in range(rows):
            crow = eb.gep(self.c, "float32", eb.add(eb.mul(eb.add(i0, r), self.ldc), j0))
            for v in range(nv):
                self._vstore(new[r][v], eb.gep(crow, "float32", v * L), valid[v])

    def panel(self, j, cols, row_tiles=None):
        """Every row tile (or row tiles [lo, hi) and the tail rows when `last`) of panel j."""
        eb = self.eb
        j0 = eb.mul(j, self.nr)
        if self.pack is not None:
            self.pack_panel(j0, cols)
        full = self.m // self.mr
        lo, hi, last = row_tiles if row_tiles is not None else (0, full, None)
        if full:
            with for_range(self.b, hi, start=lo) as it:
                self.tile(it, self.mr, j0, cols)
        if self.m % self.mr:
            tail = lambda: self.tile(eb.c(full), self.m % self.mr, j0, cols)  # noqa
            if last is None:
                tail()
            else:
                with self.b.if_then(last):
                    tail()


def emit_sgemm(eb, ta, tb, m, n, k, a, lda, bp, ldb, c, ldc, pack=None, strips=None,
               part=None, row_tiles=None):
    """C (m x n, row stride ldc) = op(A) @ op(B) for sizes sgemm_applies() takes.

    pack: pack_bytes(k) of the worker's scratch for B's panels (required when tb; None:
    B's rows read in place); strips: strip_bytes(m, k) of it for A's strips (ta only; None:
    A read in place). part: one worker's share, as
    ``("cols", lo, hi)`` (panels [lo, hi) of panels(n), i64 values) or ``("rows", lo, hi,
    last)`` (row tiles [lo, hi) of m // MR, and the tail rows when the i1 `last` holds).
    row_tiles: ``(lo, hi, last)`` as in a rows part, for every panel of a cols part (a row
    bound: the tiles up to the real rows)."""
    kern = _Kernel(eb, ta, tb, m, n, k, a, lda, bp, ldb, c, ldc, pack, strips)
    if strips is not None:
        kern.pack_strips()
    full, tail_cols = n // kern.nr, n % kern.nr
    by_rows = part is not None and part[0] == "rows"
    plo, phi = (part[1], part[2]) if part is not None and not by_rows else (0, panels(n))
    if by_rows:
        row_tiles = part[1:]
    if full:
        hi = eb.smin(phi, full) if isinstance(phi, ir.Value) else min(phi, full)
        with for_range(eb.b, hi, start=plo) as j:
            kern.panel(j, kern.nr, row_tiles)
    if tail_cols:
        if isinstance(phi, ir.Value):
            with eb.b.if_then(eb.b.icmp_signed(">", phi, eb.c(full))):
                kern.panel(eb.c(full), tail_cols, row_tiles)
        else:
            kern.panel(eb.c(full), tail_cols, row_tiles)
