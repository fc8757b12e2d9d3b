"""Batch-1 Dense layers on the LLVM backend: y (+)= x @ W.T with W stored (out, in).

At batch 1 a Dense layer is a matrix-vector product whose weights stream from cache; an
OpenBLAS sgemv call (argument checks, thread dispatch) costs more than the whole loop at the
book's sizes, so these run as generated vector loops.

Each call streams the weights from L2 once, so what counts is bandwidth: eight rows in flight,
each a full-width register (16 float32 lanes where the host has AVX-512), each row
prefetched a few cache lines ahead, and a layer of GEMV_PARALLEL_MIN weights or more split
into chunks that the caller and the thread pool claim, so both cores' L2s stream at once.
The book's MLP at batch 1 on a Xeon (AVX-512), the whole native call: 10.9 us (four 8-lane
rows, one thread) -> 6.4 us -> 4.4 us with a parameter's weights packed (below).
"""
from __future__ import annotations

from llvmlite import ir

from ..extern_plan import GEMV_LOOP_MAX, GEMV_ROWS as ROWS, gemv_pack_size, vector_lanes
from ..kernel import ExternKernel
from .emit import for_range
from .loaded import PACK_NEW, PACK_OFF, PACK_READY, PACK_SEEN  # noqa: F401 - the states
from .scalar import F32, F64, I32, I64, PTR

# Up to GEMV_LOOP_MAX weights the loop stays in cache and single-threaded (extern_plan.py,
# with ROWS, the rows of a block); bigger products call BLAS, which splits them across the
# device's threads.
# From this many weights (256 KiB of float32, ~4 us from L2) the rows split into chunks that
# the caller and the thread pool claim: each core streams its share from its own L2. A
# chunk nobody else claims in time is run by the caller, so a sleeping pool costs one wake-up
# call, never a wait.
GEMV_PARALLEL_MIN = 1 << 16
GEMV_CHUNKS = 4
PREFETCH_AHEAD = 256  # bytes of each row read ahead into L1 (software prefetch: ~10% here)

# A parameter's weights are read the same way every call, so they are worth a copy in the
# order the loop reads them: each block of ROWS rows as one contiguous stream, vector after
# vector ((block, k / lanes, row, lane) order), instead of ROWS interleaved row streams. The
# L2 streams it ~1.6x faster (the 512 x 256 layer, one thread: 6.4 -> 4.1 us). The copy lives
# in the step's scratch (extern_plan.gemv_pack_bytes), after a header (PACK_HEADER) whose
# first word is the pack state; the arena's owner sets the state to PACK_NEW whenever it
# binds new parameter arrays, and every other arena is zeroed (PACK_OFF: the rows are read
# in place, always). A binding packs on its second call, so a binding used once (a training
# step's forward) never pays for a copy.
# (PACK_OFF, PACK_NEW, PACK_SEEN, PACK_READY: loaded.py, which NativeRun's arenas need)


def _isize(dt):
    return 4 if dt == "float32" else 8


def thin_applies(dt, m, n, k, ta, tb) -> bool:
    """A product x @ W.T with fewer outputs than a vector has lanes (a classifier's last
    Dense layer: 10 classes): too thin for the register-tiled GEMM, and BLAS spends ~30 us
    on 256 x 256 x 10 (39 GFLOP/s). It runs as one gemv_rows per row of x instead."""
    return m > 1 and tb and not ta and dt in ("float32", "float64") and \
        all(isinstance(v, int) for v in (m, n, k)) and 1 <= n < vector_lanes(dt) and \
        n * k <= GEMV_LOOP_MAX


def gemv_workers(n, k) -> int:
    """Chunks of row blocks a product splits into (1: run whole in the caller)."""
    if n * k < GEMV_PARALLEL_MIN:
        return 1
    return max(1, min(GEMV_CHUNKS, n // ROWS))


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


def gemv_pack(eb, dt, n, k, w, ldw, packed):
    """Copy w's full row blocks into ``packed`` in the order gemv_rows reads them."""
    b = eb.b
    lanes = vector_lanes(dt)
    vty = ir.VectorType(F32 if dt == "float32" else F64, lanes)
    kb_count = (k - k % lanes) // lanes
    with for_range(b, n // ROWS) as jb:
        with for_range(b, kb_count) as kb:
            dst = eb.mul(eb.add(eb.mul(jb, kb_count), kb), ROWS * lanes)
            for i in range(ROWS):
                src = eb.add(eb.mul(eb.add(eb.mul(jb, ROWS), i), ldw), eb.mul(kb, lanes))
                v = b.load(eb.gep(w, dt, src), typ=vty, align=_isize(dt))
                b.store(v, eb.gep(packed, dt, eb.add(dst, i * lanes)), align=_isize(dt))


def gemv_rows(eb, dt, n, k, x, w, ldw, y, accumulate, part=None, packed=None,
              ready=None):
    """y[j] (+)= dot(x, w[j, :k]) for j < n: batch-1 Dense layers (x @ W.T, W stored
    (out, in)). ROWS rows at a time, each with its own vector accumulator, so the FMA chains
    overlap and x is loaded once per block; the tail below one vector is scalar.

    part: ``(lo, hi, last)`` to run only blocks [lo, hi) of the n // ROWS full blocks (i64
    values), and the rows after them when ``last`` (an i1) holds: one worker's share.
    packed: the full blocks' vectors as gemv_pack left them, read where ``ready`` (an i1)
    holds at run time, else the rows in place: the same sums in the same order, one loop
    for both layouts (each row's vectors ROWS or 1 element(s) apart) — a loop per layout
    doubled the code that a cold first call's LLVM compiles."""
    b = eb.b
    fty = F32 if dt == "float32" else F64
    lanes = vector_lanes(dt)
    vty = ir.VectorType(fty, lanes)
    sfx = f"v{lanes}{'f32' if dt == 'float32' else 'f64'}"
    fma = eb.mb.intr.get(f"llvm.fma.{sfx}", vty, [vty, vty, vty])
    hsum = eb.mb.intr.get(f"llvm.vector.reduce.fadd.{sfx}", fty, [fty, vty])
    prefetch = eb.mb.intr.get("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    kv = k - k % lanes
    zero = ir.Constant(vty, [0.0] * lanes)

    def rows(j0, r, jb=None):
        bases = [eb.mul(eb.add(j0, i), ldw) for i in range(r)]
        # where row i's vectors start and how many elements apart they are: in place, w's
        # row, 1; packed (gemv_pack: row i of vector kk at jb * ROWS * kv + kk * ROWS + i *
        # lanes), the block's stream, ROWS
        starts = [b.gep(w, [base], source_etype=fty) for base in bases]
        mult = eb.c(1)
        if packed is not None and jb is not None:
            at = eb.mul(jb, ROWS * kv)
            starts = [b.select(ready, eb.gep(packed, dt, eb.add(at, i * lanes)), start)
                      for i, start in enumerate(starts)]
            mult = b.select(ready, eb.c(ROWS), mult)
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
            step = eb.mul(kk, mult)
            ahead = eb.mul(eb.add(kk, eb.c(PREFETCH_AHEAD // _isize(dt))), mult)
            for start, ph in zip(starts, phis):
                if PREFETCH_AHEAD:  # (packed, it reads ahead in the block's own stream)
                    # not inbounds: the address may run past the weights (a prefetch
                    # never faults)
                    b.call(prefetch, [b.gep(start, [ahead], source_etype=fty),
                                      ir.Constant(I32, 0), ir.Constant(I32, 3),
                                      ir.Constant(I32, 1)])
                wv = b.load(b.gep(start, [step], inbounds=True, source_etype=fty), typ=vty,
                            align=_isize(dt))
                new.append(b.call(fma, [xv, wv, ph]))
            nxt = b.add(kk, eb.c(lanes))
            kk.add_incoming(nxt, b.block)
            for ph, v in zip(phis, new):
                ph.add_incoming(v, b.block)
            b.cbranch(b.icmp_signed("<", nxt, eb.c(kv)), loop, done)
            b.position_at_end(done)
            accs = new
        for i, (base, acc) in enumerate(zip(bases, accs)):
            # a tree sum of the lanes (reassoc): a row's sum order is fixed by the code,
            # never by the thread count
            total = b.call(hsum, [ir.Constant(fty, -0.0), acc], fastmath=("reassoc",))
            for t in range(kv, k):  # the tail below one vector
                xt = b.load(eb.gep(x, dt, t), typ=fty)
                wt = b.load(eb.gep(w, dt, eb.add(base, t)), typ=fty)
                total = b.fadd(total, b.fmul(xt, wt))
            out = eb.gep(y, dt, eb.add(j0, i))
            if accumulate:
                total = b.fadd(b.load(out, typ=fty), total)
            b.store(total, out)
    blocks = n // ROWS
    lo, hi, last = part if part is not None else (0, blocks, None)
    if blocks:
        with for_range(b, hi, start=lo) as jb:
            rows(eb.mul(jb, ROWS), ROWS, jb)
    if n % ROWS:
        if last is None:
            rows(eb.c(blocks * ROWS), n % ROWS)
        else:
            with b.if_then(last):
                rows(eb.c(blocks * ROWS), n % ROWS)


_SETTINGS_AT_IMPORT = (GEMV_PARALLEL_MIN, GEMV_CHUNKS)


def settings_changed() -> bool:
    """Whether GEMV_PARALLEL_MIN or GEMV_CHUNKS changed since import (emit.settings_changed)."""
    return (GEMV_PARALLEL_MIN, GEMV_CHUNKS) != _SETTINGS_AT_IMPORT
