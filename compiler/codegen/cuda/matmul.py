"""The matmul extern as CUDA C: a shared-memory tiled GEMM, batched and broadcast.

One kernel per (operand dtypes, output dtype, transpose flags), shared by every matmul step
of those types; sizes, leading dimensions and batch strides are its scalar arguments. A
block of 256 threads computes a 64 x 64 tile of C: it stages 64 x 16 tiles of op(A) and
16 x 64 tiles of op(B) in shared memory (each loaded along the operand's contiguous
dimension, so a warp's loads coalesce whether or not the operand is transposed), and each
thread accumulates a 4 x 4 block of C in registers, rows ty + 16 i and columns tx + 16 j
(conflict-free shared reads, coalesced stores). Grid: tiles of N, tiles of M, batch; each a
grid-stride loop, so any size fits the grid's limits.

Accumulation: float32 and float16 in float, float64 in double, integers in the unsigned type
of the output's width (NumPy's wrapping products and sums, without C's signed overflow).
Batch dimensions broadcast (NumPy's matmul); after merging, at most two batch groups are
handled (z = z0 * batch1 + z1).

Where the operands and the output share float32 or float64 and one batch stride remains, the
launch also carries the GEMM's description (``Launch.blas``): the executable runs it through
the GPU's BLAS (cuBLAS; HYBRID_CUDA_BLAS) and the kernel is the fallback. The kernel stays in
the source, so the source (and its cache key) does not depend on the machine.
"""
from __future__ import annotations

import math

from ..kernel import KernelIRError, matmul_operand_shapes
from .scalar import dtype_tag, load_expr, mem_ctype, store_acc
from .source import KernelArg
from .writer import INT_LIMIT, ModuleWriter, ceil_div

TILE, TILE_K, THREADS = 64, 16, 256
GRID_YZ_LIMIT = 65535
BLAS_DTYPES = ("float32", "float64")
ACC = {"float16": "float", "float32": "float", "float64": "double", "int8": "unsigned",
       "uint8": "unsigned", "int32": "unsigned", "int64": "unsigned long long"}


def _tile_load(dst: str, operand: str, transposed: bool, src: str, dt: str, acc: str) -> list:
    """Lines filling the shared tile ``dst[k][i]`` from operand ``src`` ('a': 64 rows of
    op(A) x 16 of k; 'b': 16 of k x 64 columns of op(B)). Thread e of a pass takes element
    e along the operand's stored contiguous dimension, so a warp's loads coalesce."""
    is_a = operand == "a"
    contiguous_k = (not transposed) if is_a else transposed
    ii, kk = ("e / 16", "e % 16") if contiguous_k else ("e % 64", "e / 64")
    k_major = is_a == transposed  # stored (k, m) for A^T, (k, n) for B
    ld, origin, limit = ("lda", "row0", "M") if is_a else ("ldb", "col0", "N")
    addr = f"(long long)gk * {ld} + gi" if k_major else f"(long long)gi * {ld} + gk"
    value = load_expr(dt, f"{src}[{addr}]")
    return [
        f"for (int e = threadIdx.x; e < {TILE * TILE_K}; e += {THREADS}) {{",
        f"    const int ii = {ii}, kk = {kk};",
        f"    const int gi = {origin} + ii, gk = k0 + kk;",
        f"    {dst}[kk][ii] = (gi < {limit} && gk < K) ? ({acc})({value}) : ({acc})0;",
        "}"]


def gemm_kernel(mw: ModuleWriter, a_dt: str, b_dt: str, c_dt: str, ta: bool, tb: bool) -> str:
    name = (f"hyb_gemm_{'t' if ta else 'n'}{'t' if tb else 'n'}_"
            f"{dtype_tag(a_dt)}_{dtype_tag(b_dt)}_{dtype_tag(c_dt)}")
    acc = ACC[c_dt]

    def text():
        ind = "            "
        load_a = _tile_load("As", "a", ta, "a", a_dt, acc)
        load_b = _tile_load("Bs", "b", tb, "b", b_dt, acc)
        body = "\n".join(ind + line for line in load_a + load_b)
        return f"""extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
    const {mem_ctype(a_dt)}* __restrict__ A, const {mem_ctype(b_dt)}* __restrict__ B,
    {mem_ctype(c_dt)}* __restrict__ C, int M, int N, int K, long long lda, long long ldb,
    int Z, int batch1, long long sa0, long long sa1, long long sb0, long long sb1) {{
    __shared__ {acc} As[{TILE_K}][{TILE}];
    __shared__ {acc} Bs[{TILE_K}][{TILE}];
    const int tx = (int)(threadIdx.x & 15u), ty = (int)(threadIdx.x >> 4);
    const int tiles_m = (M + {TILE - 1}) / {TILE}, tiles_n = (N + {TILE - 1}) / {TILE};
    for (int z = blockIdx.z; z < Z; z += gridDim.z) {{
        const long long z0 = z / batch1, z1 = z % batch1;
        const {mem_ctype(a_dt)}* a = A + z0 * sa0 + z1 * sa1;
        const {mem_ctype(b_dt)}* b = B + z0 * sb0 + z1 * sb1;
        {mem_ctype(c_dt)}* c = C + (long long)z * M * N;
        for (int tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)
        for (int tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {{
            const int row0 = tm * {TILE}, col0 = tn * {TILE};
            {acc} r[4][4];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) r[i][j] = ({acc})0;
            for (int k0 = 0; k0 < K; k0 += {TILE_K}) {{
{body}
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < {TILE_K}; ++kk) {{
                    {acc} av[4], bv[4];
                    for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
                    for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
                    for (int i = 0; i < 4; ++i)
                        for (int j = 0; j < 4; ++j) r[i][j] += av[i] * bv[j];
                }}
                __syncthreads();
            }}
            for (int i = 0; i < 4; ++i) {{
                const int gi = row0 + ty + 16 * i;
                if (gi >= M) continue;
                for (int j = 0; j < 4; ++j) {{
                    const int gj = col0 + tx + 16 * j;
                    if (gj < N) c[(long long)gi * N + gj] = {store_acc(c_dt, "r[i][j]")};
                }}
            }}
        }}
    }}
}}
"""
    return mw.define(name, text, kernel=True)


def batch_groups(a_batch, b_batch, out_batch) -> list:
    """[(extent, a stride, b stride)] of the output's batch dimensions (element strides of
    whole matrices; 0 where an operand broadcasts), extent-1 dimensions dropped and adjacent
    ones merged where both operands walk them contiguously."""
    def strides(batch, mat):
        lead = len(out_batch) - len(batch)
        own = [0] * len(batch)
        acc = mat
        for d in reversed(range(len(batch))):
            own[d] = acc
            acc *= batch[d]
        return [0 if d < lead or batch[d - lead] == 1 else own[d - lead]
                for d in range(len(out_batch))]
    sa, sb = strides(*a_batch), strides(*b_batch)
    groups = []
    for n, x, y in zip(out_batch, sa, sb):
        if n == 1:
            continue
        if groups and groups[-1][1] == x * n and groups[-1][2] == y * n:
            groups[-1] = (groups[-1][0] * n, x, y)
        else:
            groups.append((n, x, y))
    return groups


def _matmul(mw: ModuleWriter, step):
    prog = mw.program
    sa, sb = step.in_slots
    (so,) = step.out_slots
    A, B, C = prog.slots[sa], prog.slots[sb], prog.slots[so]
    attrs = step.attr_dict
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    ashape, bshape = matmul_operand_shapes([A.shape, B.shape], attrs)
    m, k, n = ashape[-2], ashape[-1], bshape[-1]
    out_batch = tuple(C.shape[:-2])
    z = math.prod(out_batch)
    if m * n * z == 0:
        return
    if max(m, n, k, z) > INT_LIMIT:
        raise KernelIRError(f"the CUDA matmul takes sizes below 2^31, got m={m}, n={n}, k={k}, "
                            f"batch={z}")
    groups = batch_groups((A.shape[:-2], m * k), (B.shape[:-2], k * n), out_batch)
    if len(groups) > 2:
        raise KernelIRError(f"the CUDA matmul handles at most two broadcast batch groups; "
                            f"{A.shape} @ {B.shape} has {len(groups)}")
    groups = [(1, 0, 0)] * (2 - len(groups)) + groups
    emit_gemm(mw, (A.dtype, B.dtype, C.dtype), ta, tb, m, n, k, A.shape[-1], B.shape[-1], z,
              groups, [KernelArg("slot", slot=x) for x in (sa, sb, so)])


def emit_gemm(mw: ModuleWriter, dtypes, ta: bool, tb: bool, m: int, n: int, k: int, lda: int,
              ldb: int, z: int, groups, operands):
    """Launch C[z] = op(A[z]) @ op(B[z]) (row-major; C dense, m * n apart): the generated
    kernel, carrying the BLAS's description where it applies. ``groups``: the two batch
    groups ((z0, A stride, B stride), (z1, A stride, B stride)), z = z0 * z1; ``operands``:
    the KernelArgs of A, B and C (slots, or workspace: convolutions' im2col matrices)."""
    a_dt, b_dt, c_dt = dtypes
    (_, a0, b0), (z1, a1, b1) = groups
    kernel = gemm_kernel(mw, a_dt, b_dt, c_dt, ta, tb)

    def scalar(ct, v):
        return KernelArg("scalar", ctype=ct, value=int(v))
    args = list(operands) + [
        scalar("int", m), scalar("int", n), scalar("int", k), scalar("long long", lda),
        scalar("long long", ldb), scalar("int", z), scalar("int", z1),
        scalar("long long", a0), scalar("long long", a1), scalar("long long", b0),
        scalar("long long", b1)]
    grid = (min(ceil_div(n, TILE), GRID_YZ_LIMIT), min(ceil_div(m, TILE), GRID_YZ_LIMIT),
            min(z, GRID_YZ_LIMIT))
    # the BLAS takes one float dtype throughout and one batch stride (after merging)
    blas = ()
    if a_dt == b_dt == c_dt and c_dt in BLAS_DTYPES and z == z1:
        blas = (c_dt, ta, tb, m, n, k, lda, ldb, z, a1, b1)
    mw.launch(kernel, grid, THREADS, args, blas=blas)


EMITTERS = {"matmul": _matmul}
