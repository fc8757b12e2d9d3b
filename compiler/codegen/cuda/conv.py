"""The convolution externs as CUDA C: conv2d and its data and weight gradients.

float32 and float64 convolutions without groups run as im2col + GEMM, the GEMM a launch that
carries its BLAS description (cuBLAS on a real GPU, like cuDNN's GEMM algorithms; the
generated tiled GEMM under graph capture or with HYBRID_CUDA_BLAS=0). With K = C*KH*KW
taps and P = OH*OW positions, the im2col matrix ``col`` is K x (N*P) (row k = (c, a, b),
column n*P + p), in scratch shared by every convolution of the source (they run in stream
order; reserve_scratch sizes it before the steps are written):

- conv2d: Y[n] (O x P) = W (O x K) @ col[:, n*P : (n+1)*P], N products of one launch;
- conv2d_grad_data: colg[n] (K x P) = W^T @ gY[n], then a gather per input element sums the
  columns of the taps that reach it (deterministic: no atomics);
- conv2d_grad_weight: gW (O x K) = gY' (O x N*P) @ col^T, gY' the output gradient permuted
  to (O, N, P): one product whose depth is the whole batch.

A convolution whose scratch would pass SCRATCH_CAP, float16 ones and grouped ones run as
direct kernels (no scratch):

- conv2d: a thread per output element (n, o, oh, ow) sums over its group's channels and the
  window (taps outside the image are padding: skipped);
- conv2d_grad_data: a thread per input element (n, c, ih, iw) sums g * w over the filters of
  its group and the taps that reach it (those whose output position is a whole stride away);
- conv2d_grad_weight: a block per weight element (o, c, kh, kw), its threads striding over
  the N * OH * OW products, combined by the block tree of reduction.py.

float32 and float16 accumulate in float, float64 in double. Geometry: extern_plan's
conv_geometry, as on every target.
"""
from __future__ import annotations

import contextlib

from ..extern_plan import conv_geometry
from ..kernel import itemsize
from .matmul import BLAS_DTYPES, TILE, emit_gemm
from .reduction import block_reduce_fn
from .scalar import load_expr, mem_ctype, store_acc
from .source import KernelArg
from .writer import (BLOCK, MAX_GRID, KernelWriter, ModuleWriter, ceil_div, decompose,
                     grid_stride_kernel, index_type)

ACC = {"float16": ("float", "float32"), "float32": ("float", "float32"),
       "float64": ("double", "float64")}


def _term(kw, slot, dt, index, acc_t) -> str:
    return f"({acc_t})({load_expr(dt, f'{kw.ptr(slot)}[{index}]')})"


# A source's im2col scratch at most (bytes): a larger convolution runs its direct kernels
SCRATCH_CAP = 1 << 29


def _geometry(prog, step):
    """(geometry, dtype) of a convolution step, from its data and weight shapes."""
    a, b = (prog.slots[x] for x in step.in_slots)
    (out,) = (prog.slots[x] for x in step.out_slots)
    if step.op == "conv2d":
        return conv_geometry(a.shape, b.shape, step.attr_dict), a.dtype
    if step.op == "conv2d_grad_data":  # (gY, W) -> dX
        return conv_geometry(out.shape, b.shape, step.attr_dict), a.dtype
    return conv_geometry(a.shape, out.shape, step.attr_dict), a.dtype  # (X, gY) -> dW


# The weight gradient's product is as deep as the batch; where its O x K output has few
# tiles, it is split over groups of images into partial products (summed after), so that
# about this many tiles run at once: one tile would be one block doing all the work when the
# generated GEMM runs it (a captured CUDA graph, HYBRID_CUDA_BLAS=0)
TARGET_TILES = 256


def weight_grad_chunks(g) -> int:
    """Image groups of the weight gradient's partial products: a divisor of N (every
    product equally deep), as many as bring O x K's tiles to about TARGET_TILES."""
    tiles = ceil_div(g["o"], TILE) * ceil_div(g["c"] * g["kh"] * g["kw"], TILE)
    want = min(g["n"], max(1, ceil_div(TARGET_TILES, tiles)))
    return max(d for d in range(1, want + 1) if g["n"] % d == 0)


def scratch_elements(op: str, g, dt: str):
    """Elements of im2col scratch a convolution step takes, or None: its direct kernels
    (float16, groups, empty, or past SCRATCH_CAP)."""
    if dt not in BLAS_DTYPES or g["groups"] != 1:
        return None
    k, npos = g["c"] * g["kh"] * g["kw"], g["n"] * g["oh"] * g["ow"]
    if k * npos == 0:
        return None
    count = k * npos
    if op == "conv2d_grad_weight":  # gY permuted, and the partial products
        chunks = weight_grad_chunks(g)
        count += g["o"] * npos + (g["o"] * k * chunks if chunks > 1 else 0)
    return count if count * itemsize(dt) <= SCRATCH_CAP else None


def reserve_scratch(mw: ModuleWriter):
    """Reserve the im2col scratch of every convolution step (the largest one's: they run in
    stream order) before the steps are written; ``mw.conv_scratch`` is its workspace offset."""
    need = 0
    for step in mw.program.steps:
        if getattr(step, "op", None) in EMITTERS:
            g, dt = _geometry(mw.program, step)
            count = scratch_elements(step.op, g, dt)
            if count:
                need = max(need, count * itemsize(dt))
    mw.conv_scratch = mw.workspace(need) if need else None


def _im2col(mw: ModuleWriter, sx: int, dt: str, g, offset: int):
    """A kernel writing col (K x N*P, at workspace ``offset``) from image slot ``sx``."""
    k, p = g["c"] * g["kh"] * g["kw"], g["oh"] * g["ow"]
    total = k * g["n"] * p
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["pad"], g["dil"]
    with grid_stride_kernel(mw, "im2col", total, g["n"] * g["c"] * g["h"] * g["w"]) as (kw, it):
        code = kw.code
        col = kw.workspace(offset, mem_ctype(dt))
        c, a, b, n, oh, ow = decompose(code, it, "i", (g["c"], g["kh"], g["kw"], g["n"],
                                                       g["oh"], g["ow"]),
                                       ("c", "a", "b", "n", "oh", "ow"))
        code.line(f"const int yy = (int){oh} * {sh} - {ph} + (int){a} * {dh};")
        code.line(f"const int xx = (int){ow} * {sw} - {pw} + (int){b} * {dw};")
        code.line(f"const bool inside = yy >= 0 && yy < {g['h']} && xx >= 0 && xx < {g['w']};")
        xi = f"((({it}){n} * {g['c']} + {c}) * {g['h']} + yy) * {g['w']} + xx"
        code.line(f"{col}[i] = inside ? {kw.ptr(sx)}[{xi}] : ({mem_ctype(dt)})0;")


def _ws(offset: int) -> KernelArg:
    return KernelArg("workspace", offset=offset)


def _conv2d_gemm(mw, step, g, dt):
    sx, sw_ = step.in_slots
    (so,) = step.out_slots
    k, p = g["c"] * g["kh"] * g["kw"], g["oh"] * g["ow"]
    col = mw.conv_scratch
    _im2col(mw, sx, dt, g, col)
    # Y[n] = W @ col[:, n*P:(n+1)*P]: W shared (stride 0), col's blocks P apart
    emit_gemm(mw, (dt, dt, dt), False, False, g["o"], p, k, k, g["n"] * p, g["n"],
              [(1, 0, 0), (g["n"], 0, p)],
              [KernelArg("slot", slot=sw_), _ws(col), KernelArg("slot", slot=so)])


def _conv2d_grad_data_gemm(mw, step, g, dt):
    sg, sw_ = step.in_slots
    (so,) = step.out_slots
    k, p = g["c"] * g["kh"] * g["kw"], g["oh"] * g["ow"]
    colg = mw.conv_scratch
    # colg[n] (K x P) = W^T @ gY[n]
    emit_gemm(mw, (dt, dt, dt), True, False, k, p, g["o"], k, p, g["n"],
              [(1, 0, 0), (g["n"], 0, g["o"] * p)],
              [KernelArg("slot", slot=sw_), KernelArg("slot", slot=sg), _ws(colg)])
    acc_t = ACC[dt][0]
    sh, sw = g["stride"]
    total = g["n"] * g["c"] * g["h"] * g["w"]
    with grid_stride_kernel(mw, "col2im", total, g["n"] * k * p) as (kw, it):
        code = kw.code
        src = kw.workspace(colg, mem_ctype(dt))
        n, c, ih, iw = decompose(code, it, "i", (g["n"], g["c"], g["h"], g["w"]),
                                 ("n", "c", "ih", "iw"))
        code.line(f"{acc_t} acc = 0;")
        code.line(f"const {it} base = (({it}){n} * {k} + ({it}){c} * {g['kh'] * g['kw']})"
                  f" * {p};")
        with _taps_reaching(code, g, ih, iw):
            ci = f"base + (a * {g['kw']} + b) * {p} + (ty / {sh}) * {g['ow']} + tx / {sw}"
            code.line(f"acc += ({acc_t}){src}[{ci}];")
        code.line(f"{kw.ptr(so, write=True)}[i] = {store_acc(dt, 'acc')};")


@contextlib.contextmanager
def _taps_reaching(code, g, ih: str, iw: str):
    """Loops over the window taps (a, b) that reach input position (ih, iw): inside, the
    output position reading it through tap (a, b) is (ty / sh, tx / sw)."""
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["pad"], g["dil"]
    with code.block(f"for (int a = 0; a < {g['kh']}; ++a)"):
        code.line(f"const int ty = (int){ih} + {ph} - a * {dh};")
        code.line(f"if (ty < 0 || ty % {sh} != 0 || ty / {sh} >= {g['oh']}) continue;")
        with code.block(f"for (int b = 0; b < {g['kw']}; ++b)"):
            code.line(f"const int tx = (int){iw} + {pw} - b * {dw};")
            code.line(f"if (tx < 0 || tx % {sw} != 0 || tx / {sw} >= {g['ow']}) continue;")
            yield


def _conv2d_grad_weight_gemm(mw, step, g, dt):
    sx, sg = step.in_slots
    (so,) = step.out_slots
    k, p = g["c"] * g["kh"] * g["kw"], g["oh"] * g["ow"]
    npos = g["n"] * p
    col = mw.conv_scratch
    gyt = col + k * npos * itemsize(dt)
    _im2col(mw, sx, dt, g, col)
    with grid_stride_kernel(mw, "permute_gy", g["o"] * npos, g["o"] * npos) as (kw, it):
        code = kw.code
        dst = kw.workspace(gyt, mem_ctype(dt))
        o, n, q = decompose(code, it, "i", (g["o"], g["n"], p), ("o", "n", "q"))
        code.line(f"{dst}[i] = {kw.ptr(sg)}[(({it}){n} * {g['o']} + {o}) * {p} + {q}];")
    # gW (O x K) = gY' (O x N*P) @ col^T, as deep as the batch: one product, or partial
    # products over groups of images (column blocks of gY' and col) summed in order
    chunks = weight_grad_chunks(g)
    depth = npos // chunks
    out = KernelArg("slot", slot=so)
    if chunks > 1:
        partial = gyt + g["o"] * npos * itemsize(dt)
        out = _ws(partial)
    emit_gemm(mw, (dt, dt, dt), False, True, g["o"], k, depth, npos, npos, chunks,
              [(1, 0, 0), (chunks, depth, depth)], [_ws(gyt), _ws(col), out])
    if chunks > 1:
        acc_t = ACC[dt][0]
        total = g["o"] * k
        with grid_stride_kernel(mw, "sum_partials", total, total * chunks) as (kw, it):
            code = kw.code
            src = kw.workspace(partial, mem_ctype(dt))
            code.line(f"{acc_t} acc = 0;")
            with code.block(f"for (int z = 0; z < {chunks}; ++z)"):
                code.line(f"acc += ({acc_t}){src}[({it})z * {total} + i];")
            code.line(f"{kw.ptr(so, write=True)}[i] = {store_acc(dt, 'acc')};")


def _gemm_path(mw, step, g, dt) -> bool:
    return mw.conv_scratch is not None and scratch_elements(step.op, g, dt) is not None


def _conv2d(mw: ModuleWriter, step):
    prog = mw.program
    sx, sw_ = step.in_slots
    (so,) = step.out_slots
    X, W = prog.slots[sx], prog.slots[sw_]
    g = conv_geometry(X.shape, W.shape, step.attr_dict)
    total = g["n"] * g["o"] * g["oh"] * g["ow"]
    if total == 0:
        return
    if _gemm_path(mw, step, g, X.dtype):
        return _conv2d_gemm(mw, step, g, X.dtype)
    acc_t = ACC[X.dtype][0]
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["pad"], g["dil"]
    with grid_stride_kernel(mw, step.name or "conv2d", total, X.size, W.size) as (kw, it):
        code = kw.code
        n, o, oh, ow = decompose(code, it, "i", (g["n"], g["o"], g["oh"], g["ow"]),
                                 ("n", "o", "oh", "ow"))
        code.line(f"const int y0 = (int){oh} * {sh} - {ph}, x0 = (int){ow} * {sw} - {pw};")
        code.line(f"const long long c0 = (long long){n} * {g['c']} + ({o} / {g['og']}) * "
                  f"{g['cg']};")
        code.line(f"{acc_t} acc = 0;")
        with code.block(f"for (int ci = 0; ci < {g['cg']}; ++ci)"):
            code.line(f"const long long xp = (c0 + ci) * {g['h'] * g['w']};")
            code.line(f"const long long wp = ((long long){o} * {g['cg']} + ci) * "
                      f"{g['kh'] * g['kw']};")
            with code.block(f"for (int a = 0; a < {g['kh']}; ++a)"):
                code.line(f"const int yy = y0 + a * {dh};")
                code.line(f"if (yy < 0 || yy >= {g['h']}) continue;")
                with code.block(f"for (int b = 0; b < {g['kw']}; ++b)"):
                    code.line(f"const int xx = x0 + b * {dw};")
                    code.line(f"if (xx < 0 || xx >= {g['w']}) continue;")
                    xi, wi = f"xp + yy * {g['w']} + xx", f"wp + a * {g['kw']} + b"
                    code.line(f"acc += {_term(kw, sx, X.dtype, xi, acc_t)} * "
                              f"{_term(kw, sw_, W.dtype, wi, acc_t)};")
        code.line(f"{kw.ptr(so, write=True)}[i] = {store_acc(X.dtype, 'acc')};")


def _conv2d_grad_data(mw: ModuleWriter, step):
    prog = mw.program
    sg, sw_ = step.in_slots
    (so,) = step.out_slots
    G, W, DX = prog.slots[sg], prog.slots[sw_], prog.slots[so]
    g = conv_geometry(DX.shape, W.shape, step.attr_dict)
    total = DX.size
    if total == 0:
        return
    if _gemm_path(mw, step, g, G.dtype):
        return _conv2d_grad_data_gemm(mw, step, g, G.dtype)
    acc_t = ACC[G.dtype][0]
    sh, sw = g["stride"]
    with grid_stride_kernel(mw, step.name or "conv2d_grad_data", total, G.size,
                            W.size) as (kw, it):
        code = kw.code
        n, c, ih, iw = decompose(code, it, "i", (g["n"], g["c"], g["h"], g["w"]),
                                 ("n", "c", "ih", "iw"))
        code.line(f"const int grp = (int)({c} / {g['cg']}), ci = (int)({c} % {g['cg']});")
        code.line(f"{acc_t} acc = 0;")
        with code.block(f"for (int oo = 0; oo < {g['og']}; ++oo)"):
            code.line(f"const long long o = (long long)grp * {g['og']} + oo;")
            code.line(f"const long long gp = ((long long){n} * {g['o']} + o) * "
                      f"{g['oh'] * g['ow']};")
            code.line(f"const long long wp = (o * {g['cg']} + ci) * {g['kh'] * g['kw']};")
            with _taps_reaching(code, g, ih, iw):
                gi = f"gp + (ty / {sh}) * {g['ow']} + tx / {sw}"
                wi = f"wp + a * {g['kw']} + b"
                code.line(f"acc += {_term(kw, sg, G.dtype, gi, acc_t)} * "
                          f"{_term(kw, sw_, W.dtype, wi, acc_t)};")
        code.line(f"{kw.ptr(so, write=True)}[i] = {store_acc(G.dtype, 'acc')};")


def _conv2d_grad_weight(mw: ModuleWriter, step):
    prog = mw.program
    sx, sg = step.in_slots
    (so,) = step.out_slots
    X, G, DW = prog.slots[sx], prog.slots[sg], prog.slots[so]
    g = conv_geometry(X.shape, DW.shape, step.attr_dict)
    total = DW.size
    if total == 0:
        return
    if _gemm_path(mw, step, g, X.dtype):
        return _conv2d_grad_weight_gemm(mw, step, g, X.dtype)
    acc_t, acc_dt = ACC[X.dtype]
    points = g["n"] * g["oh"] * g["ow"]
    block = min(BLOCK, max(32, ceil_div(points, 32) * 32))
    grid = min(total, MAX_GRID)
    it = index_type(total + grid, points + block, X.size, G.size)
    tree = block_reduce_fn(mw, "sum", acc_dt)
    kw = KernelWriter(mw, step.name or "conv2d_grad_weight")
    code = kw.code
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["pad"], g["dil"]
    code.line(f"__shared__ {acc_t} sh0[32];")
    with code.block(f"for ({it} m = blockIdx.x; m < {total}; m += gridDim.x)"):
        o, ci, a, b = decompose(code, it, "m", (g["o"], g["cg"], g["kh"], g["kw"]),
                                ("o", "ci", "a", "b"))
        code.line(f"const long long c = (long long)({o} / {g['og']}) * {g['cg']} + {ci};")
        code.line(f"{acc_t} acc = 0;")
        with code.block(f"for ({it} r = threadIdx.x; r < {points}; r += blockDim.x)"):
            n, oh, ow = decompose(code, it, "r", (g["n"], g["oh"], g["ow"]), ("n", "oh", "ow"))
            code.line(f"const int yy = (int){oh} * {sh} - {ph} + (int){a} * {dh};")
            code.line(f"const int xx = (int){ow} * {sw} - {pw} + (int){b} * {dw};")
            code.line(f"if (yy < 0 || yy >= {g['h']} || xx < 0 || xx >= {g['w']}) continue;")
            gi = f"(((long long){n} * {g['o']} + {o}) * {g['oh']} + {oh}) * {g['ow']} + {ow}"
            xi = f"(((long long){n} * {g['c']} + c) * {g['h']} + yy) * {g['w']} + xx"
            code.line(f"acc += {_term(kw, sg, G.dtype, gi, acc_t)} * "
                      f"{_term(kw, sx, X.dtype, xi, acc_t)};")
        code.line(f"acc = {tree}(acc, sh0);")
        with code.block("if (threadIdx.x == 0)"):
            code.line(f"{kw.ptr(so, write=True)}[m] = {store_acc(G.dtype, 'acc')};")
    kw.finish(grid, block)


EMITTERS = {"conv2d": _conv2d, "conv2d_grad_data": _conv2d_grad_data,
            "conv2d_grad_weight": _conv2d_grad_weight}
