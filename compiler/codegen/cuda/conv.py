"""The convolution externs as CUDA C: conv2d and its data and weight gradients, as direct
kernels (no im2col scratch: the Program's scratch is sized for the CPU's plan, and a direct
kernel reads each input from cache as often as im2col would copy it).

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

from ..extern_plan import conv_geometry
from .reduction import block_reduce_fn
from .scalar import load_expr, store_acc
from .writer import (BLOCK, MAX_GRID, KernelWriter, ModuleWriter, ceil_div, decompose,
                     grid_stride_kernel, index_type)

ACC = {"float16": ("float", "float32"), "float32": ("float", "float32"),
       "float64": ("double", "float64")}


def _term(kw, slot, dt, index, acc_t) -> str:
    return f"({acc_t})({load_expr(dt, f'{kw.ptr(slot)}[{index}]')})"


def _conv2d(mw: ModuleWriter, step):
    prog = mw.program
    sx, sw_ = step.in_slots
    (so,) = step.out_slots
    X, W = prog.slots[sx], prog.slots[sw_]
    g = conv_geometry(X.shape, W.shape, step.attr_dict)
    total = g["n"] * g["o"] * g["oh"] * g["ow"]
    if total == 0:
        return
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
    acc_t = ACC[G.dtype][0]
    (sh, sw), (ph, pw), (dh, dw) = g["stride"], g["pad"], g["dil"]
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
            with code.block(f"for (int a = 0; a < {g['kh']}; ++a)"):
                code.line(f"const int ty = (int){ih} + {ph} - a * {dh};")
                code.line(f"if (ty < 0 || ty % {sh} != 0 || ty / {sh} >= {g['oh']}) continue;")
                with code.block(f"for (int b = 0; b < {g['kw']}; ++b)"):
                    code.line(f"const int tx = (int){iw} + {pw} - b * {dw};")
                    code.line(f"if (tx < 0 || tx % {sw} != 0 || tx / {sw} >= {g['ow']}) "
                              "continue;")
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
