"""The plan of an extern kernel: its geometry, the workers it splits into and the scratch
each worker needs, all decided when a program is lowered.

Scratch is an arena slot sized statically, so the kernel IR sizes it from here
(``scratch_bytes``, through kernel.extern_scratch_bytes) without loading a code generator,
and a target's emitters carry out the same plan (codegen/llvm/conv.py reads conv_plan,
codegen/llvm/matmul.py matmul_plan): one rule, read by both.

The plans are those of the CPU: workers are cores, and the float32 GEMM loops' tiles and the
batch-1 loops' packed weights follow the host's vector width. Both are part of the
machine-code cache key (codegen/llvm/extern.py: extern_key).
"""
from __future__ import annotations

from runtime import native

from ..ops.core import dtype_name
from ..ops.nn import conv_out_size
from .kernel import ALIGN, itemsize, matmul_operand_shapes


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int,)) else tuple(int(a) for a in v)


def _align(n):
    return -(-n // ALIGN) * ALIGN


# ---------------------------------------------------------------------- threads
# Big externs split their batch (images, planes, GEMM rows) across *workers*: worker w owns a
# slice of the output and its own scratch, and the target runs the workers on the program's
# threads (codegen/llvm/emit.py: the parallel driver). The worker count is fixed when the
# program is lowered (scratch is sized statically) and so is every sum's order: results never
# depend on how many threads the runtime grants (with a smaller core share a thread runs
# several workers in turn). OpenBLAS runs single-threaded inside the workers
# (runtime/blas.py).
MAX_THREADS = 64  # threads one program runs on at most (the parallel driver's arrays)
# Below this many multiply-adds (~0.3 ms in BLAS) an extern runs on one thread: a parallel
# region costs up to ~50 us here (waking the pool, or starting threads when it is busy), and
# a 2.6M-MAC GEMM of LeNet's (0.12 ms) measured slower split with threads started per call.
PARALLEL_MIN_WORK = 1 << 23
# A single GEMM from this many multiply-adds (~6 us on one core) splits too, but only across
# the pool (spawn=False): the caller claims every chunk nobody else took, so a sleeping or
# busy pool costs a wake-up call, never a wait or a thread start (MLP batch 64, layer 2:
# 2.1M MACs, 29 -> ~17 us).
POOL_MIN_WORK = 1 << 20
THIN_MIN_WORK = 1 << 18  # a thin product (llvm/matmul.py) splits from here (~10 us on one
# core: its rows run at ~50 GFLOP/s; 256 x 256 x 10: 27 -> 19 us)
SCRATCH_BUDGET = 64 << 20  # bytes of per-worker scratch, all workers together, at most


def max_workers() -> int:
    """Workers a big extern splits into: one per core of the machine."""
    from runtime.device import cpu_count  # noqa: PLC0415
    return max(1, min(cpu_count(), MAX_THREADS))


def workers_for(items: int, work: int, per_worker: int = 0, min_work=None) -> int:
    """Workers for ``items`` independent slices of ``work`` multiply-adds (one below
    ``min_work``, PARALLEL_MIN_WORK by default), each with ``per_worker`` bytes of scratch."""
    if work < (PARALLEL_MIN_WORK if min_work is None else min_work):
        return 1
    w = min(items, max_workers())
    if per_worker:
        w = min(w, max(1, SCRATCH_BUDGET // per_worker))
    return max(1, w)


class ScratchLayout:
    """One worker's scratch: named regions, each on its own cache lines."""

    def __init__(self):
        self.at, self.size = {}, 0

    def add(self, name, nbytes):
        if nbytes > 0:
            self.at[name] = self.size
            self.size += _align(nbytes)


# ------------------------------------------------------------------ vector width
def vector_lanes(dt) -> int:
    """Lanes of one vector register on this host: 512 bits with AVX-512, else 256 (the
    host's features are part of the machine-code cache key)."""
    wide = "+avx512f" in native.target_info()["features"].split(",")
    return (64 if wide else 32) // itemsize(dt)


# ---------------------------------------------------------------------- convolution
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


def direct_1x1(g):
    """A 1x1 stride-1 unpadded convolution: the image is its own im2col matrix."""
    return (g["kh"], g["kw"]) == (1, 1) and g["stride"] == (1, 1) and g["pad"] == (0, 0)


def _use_direct(g, dt) -> bool:
    """Direct loops for stride-1 float convolutions with a tiny reduction and few filters
    (LeNet's first layer: C*KH*KW = 25, O = 6), whose GEMMs (6 x 25 @ 25 x 784 per image) are
    too thin for BLAS; im2col + GEMM otherwise (see codegen/llvm/conv.py)."""
    return dt in ("float32", "float64") and g["groups"] == 1 and g["stride"] == (1, 1) and \
        g["cg"] * g["kh"] * g["kw"] <= 32 and g["o"] <= 16 and not direct_1x1(g)


def slack(g):
    """Elements after the flat planes that the garbage columns of the last row read."""
    return (g["kw"] - 1) * g["dil"][1]


def conv_plan(op, g, dt):
    """How a convolution extern runs: (direct?, workers, one worker's ScratchLayout).
    Scratch sizing and emission both read it."""
    size = itemsize(dt)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    lay = ScratchLayout()
    direct = op != "conv2d_grad_data" and _use_direct(g, dt)
    if direct:
        flat = g["oh"] * g["wp"]
        lay.add("x", (g["c"] * g["hp"] * g["wp"] + slack(g)) * size)
        lay.add("g" if op == "conv2d_grad_weight" else "out", g["o"] * flat * size)
        if op == "conv2d_grad_weight":
            lay.add("mask", flat * size)
    else:
        if op == "conv2d_grad_data" or not direct_1x1(g):
            lay.add("cols", ckk * ohw * size)
        if g["pad"] != (0, 0):
            lay.add("pad", g["c"] * g["hp"] * g["wp"] * size)
    workers = workers_for(g["n"], g["n"] * g["o"] * ckk * ohw, lay.size)
    if op == "conv2d_grad_weight" and workers > 1:
        lay.add("dw", g["o"] * ckk * size)  # each worker's partial sum, added up at the end
    return direct, workers, lay


# -------------------------------------------------------------------------- pooling
def pool_geometry(x_shape, attrs):
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


# ---------------------------------------------------------------- float32 GEMM loops
# Bounds for the loops (codegen/llvm/sgemm.py) to stay cache-resident without the packing a
# general sgemm does: a B panel (k x NR floats) stays in L2, and A (m x k) streams from L2
# once per panel.
SGEMM_MAX_K = 1024
SGEMM_MAX_A_BYTES = 1 << 20
SGEMM_MIN_WORK = 1 << 12  # multiply-adds: below it a call's set-up is not worth a kernel
# B's panels are copied (contiguous, one TLB page per few rows) from this many rows of A: the
# copy is read by every row tile (at 16 x 150 @ 150 x 100, LeNet's convolution, it costs more
# than it saves)
SGEMM_PACK_MIN_ROWS = 32


def tile_rows() -> int:
    """MR: rows of a C tile. MR x 2 accumulators + 2 B vectors + a broadcast fit the register
    file: 16 of 32 zmm registers with AVX-512, 12 of 16 ymm with AVX2."""
    return 8 if vector_lanes("float32") == 16 else 6


def panel_cols() -> int:
    """NR: columns of C per panel, two vector registers."""
    return 2 * vector_lanes("float32")


def sgemm_applies(dt, m, n, k) -> bool:
    """Sizes these loops take: float32, known sizes, a panel of B in L2 and A streamed from
    L2; everything else calls BLAS."""
    return dt == "float32" and all(isinstance(v, int) for v in (m, n, k)) and \
        n >= vector_lanes(dt) and 1 <= k <= SGEMM_MAX_K and m >= 1 and \
        m * k * 4 <= SGEMM_MAX_A_BYTES and m * n * k >= SGEMM_MIN_WORK


def panels(n: int) -> int:
    return -(-n // panel_cols())


def pack_bytes(k: int) -> int:
    """Scratch one worker needs for a packed panel of B (copied, or transposed when tb)."""
    return k * panel_cols() * 4


def strip_bytes(m: int, k: int) -> int:
    """Scratch one worker needs for A's strips (ta)."""
    return -(-m // tile_rows()) * tile_rows() * k * 4


# -------------------------------------------------------------- batch-1 GEMV loops
# Up to this many weights the loop (codegen/llvm/gemv.py) stays in cache and single-threaded;
# bigger products call BLAS, which splits them across the device's threads.
GEMV_LOOP_MAX = 1 << 20
GEMV_ROWS = 8  # rows per block: independent FMA chains (latency 4 x 2 ports)
# A parameter's packed weights (codegen/llvm/gemv.py) follow a header whose first word is the
# pack state
PACK_HEADER = 64  # bytes: the state word on its own cache line; the copy starts aligned


def gemv_applies(m, n, k, ta, tb) -> bool:
    """A batch-1 product x @ W.T with constant sizes small enough to run as these loops."""
    return m == 1 and tb and not ta and isinstance(n, int) and isinstance(k, int) and \
        n * k <= GEMV_LOOP_MAX


def gemv_pack_bytes(dt, m, n, k, ta, tb, b_param) -> int:
    """Scratch bytes of a product's packed weights and their header (0: read in place).
    Only a parameter's weights (``b_param``), only the full row blocks and the vectors of k
    (tails are read in place)."""
    if not (b_param and dt in ("float32", "float64") and gemv_applies(m, n, k, ta, tb)):
        return 0
    kv = k - k % vector_lanes(dt)
    blocks = n // GEMV_ROWS
    return PACK_HEADER + blocks * GEMV_ROWS * kv * itemsize(dt) if kv and blocks else 0


# ------------------------------------------------------------------------- matmul
class MatmulPlan:
    """How one unbatched float32 GEMM runs as generated loops (codegen/llvm/sgemm.py): split
    by column panels (by rows of tiles when C has a single panel), `workers` of them, each
    with the scratch `lay` for its packed panel of B and, for a transposed A, A's strips."""

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
    workers = workers_for(units, m * n * k, min_work=POOL_MIN_WORK)
    lay = ScratchLayout()
    if tb or m >= SGEMM_PACK_MIN_ROWS:  # a thin A: copying B's panels costs more than it saves
        lay.add("pack", pack_bytes(k))
    if ta:
        lay.add("strips", strip_bytes(m, k))
    return MatmulPlan(by, units, workers, lay)


def gemv_pack_size(in_shapes, in_dtypes, out_dtype, attrs) -> int:
    """Scratch bytes of a matmul's packed weights (a batch-1 product whose B is a parameter,
    ``b_param`` set by the lowering), 0 where it reads B in place."""
    ashape, bshape = matmul_operand_shapes(in_shapes, attrs)
    dt = dtype_name(out_dtype)
    if len(ashape) != 2 or len(bshape) != 2 or {dtype_name(d) for d in in_dtypes} != {dt}:
        return 0
    (m, k), n = ashape, bshape[-1]
    return gemv_pack_bytes(dt, m, n, k, bool(attrs.get("transpose_a")),
                           bool(attrs.get("transpose_b")), bool(attrs.get("b_param")))


# ------------------------------------------------------------------------ scratch
def scratch_bytes(op, attrs, in_specs, out_specs) -> int:
    """Bytes of scratch arena the extern ``op`` needs (0: none), all its workers together."""
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


def _settings() -> list:
    return [max_workers(), PARALLEL_MIN_WORK, POOL_MIN_WORK, THIN_MIN_WORK, SCRATCH_BUDGET,
            SGEMM_PACK_MIN_ROWS, SGEMM_MAX_K, SGEMM_MAX_A_BYTES, SGEMM_MIN_WORK]


_SETTINGS_AT_IMPORT = _settings()


def settings_changed() -> bool:
    """Whether a split setting above differs from its value at import (a test's monkeypatch):
    code generated then must not go to the executable cache, which a later process reads
    without importing this module (compiler/exe_cache.py)."""
    return _settings() != _SETTINGS_AT_IMPORT
