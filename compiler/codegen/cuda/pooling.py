"""The pooling externs as CUDA C: pool2d (max, avg) and its gradient.

pool2d: a thread per output element (grid-stride) combines its window, clipped to the
image (padding never wins a max and counts for an average only with count_include_pad),
with the registry's max/add/div through the scalar builder.

pool2d_grad, without atomics: a thread per input element gathers from the windows that
contain it, in (oh, ow) order, which is the order the windows' shares are added on the CPU.
An average window gives every element g / count; a max window gives all of g to its first
maximum in (kh, kw) scan order over the padded window (padding reads as -inf), as the eager
impl does. Geometry: extern_plan.pool_geometry, as on every target.
"""
from __future__ import annotations

from ..extern_plan import pool_geometry
from ..scalar import Typed
from .scalar import CudaScalarBuilder, load_expr, reg_ctype, store_expr
from .writer import ModuleWriter, decompose, grid_stride_kernel


def _window_range(code, origin: str, extent: int, size: int, names):
    """Lines bounding a window axis starting at ``origin`` to the image [0, size)."""
    lo, hi = names
    code.line(f"const int {lo} = {origin} < 0 ? -{origin} : 0;")
    code.line(f"const int {hi} = {origin} + {extent} > {size} ? {size} - {origin} : {extent};")


def _pool2d(mw: ModuleWriter, step):
    X = mw.program.slots[step.in_slots[0]]
    dt = X.dtype
    g = pool_geometry(X.shape, step.attr_dict)
    total = g["nc"] * g["oh"] * g["ow"]
    if total == 0:
        return
    (kh, kw), (sh, sw), (ph, pw) = g["k"], g["s"], g["p"]
    with grid_stride_kernel(mw, step.name or "pool2d", total, X.size) as (kern, it):
        code = kern.code
        sb = CudaScalarBuilder(code)
        p, oh, ow = decompose(code, it, "i", (g["nc"], g["oh"], g["ow"]), ("p", "oh", "ow"))
        code.line(f"const int ih0 = (int){oh} * {sh} - {ph}, iw0 = (int){ow} * {sw} - {pw};")
        _window_range(code, "ih0", kh, g["h"], ("a0", "a1"))
        _window_range(code, "iw0", kw, g["w"], ("b0", "b1"))
        init = "-inf" if g["kind"] == "max" else 0.0
        code.line(f"{reg_ctype(dt)} acc = {sb.const(init, dt).v};")
        code.line(f"const long long plane = (long long){p} * {g['h'] * g['w']};")
        with code.block("for (int a = a0; a < a1; ++a)"):
            with code.block("for (int b = b0; b < b1; ++b)"):
                ref = f"{kern.ptr(step.in_slots[0])}[plane + (long long)(ih0 + a) * {g['w']}" \
                      " + iw0 + b]"
                v = Typed(sb.emit(dt, load_expr(dt, ref)), dt)
                acc = Typed("acc", dt)
                r = sb.max(acc, v) if g["kind"] == "max" else sb.add(acc, v)
                code.line(f"acc = {sb.typed(r, dt).v};")
        res = Typed("acc", dt)
        if g["kind"] == "avg":
            res = sb.typed(sb.div(res, _avg_count(code, sb, g, dt, "ih0", "iw0")), dt)
        code.line(f"{kern.ptr(step.out_slots[0], write=True)}[i] = {store_expr(dt, res.v)};")


def _pool2d_grad(mw: ModuleWriter, step):
    prog = mw.program
    sg, sx, sout = step.in_slots
    X = prog.slots[sx]
    dt = X.dtype
    g = pool_geometry(X.shape, step.attr_dict)
    total = g["nc"] * g["h"] * g["w"]
    if total == 0:
        return
    (kh, kw), (sh, sw), (ph, pw) = g["k"], g["s"], g["p"]
    oplane, iplane = g["oh"] * g["ow"], g["h"] * g["w"]
    with grid_stride_kernel(mw, step.name or "pool2d_grad", total, X.size,
                            prog.slots[sg].size) as (kern, it):
        code = kern.code
        sb = CudaScalarBuilder(code)
        p, ih, iw = decompose(code, it, "i", (g["nc"], g["h"], g["w"]), ("p", "ih", "iw"))
        code.line(f"{reg_ctype(dt)} acc = {sb.const(0.0, dt).v};")
        # windows (oh, ow) whose rows hold ih: oh * sh - ph <= ih < oh * sh - ph + kh
        code.line(f"const int y = (int){ih} + {ph}, x = (int){iw} + {pw};")
        code.line(f"const int oh0 = y < {kh} ? 0 : (y - {kh}) / {sh} + 1;")
        code.line(f"const int oh1 = y / {sh} + 1 < {g['oh']} ? y / {sh} + 1 : {g['oh']};")
        code.line(f"const int ow0 = x < {kw} ? 0 : (x - {kw}) / {sw} + 1;")
        code.line(f"const int ow1 = x / {sw} + 1 < {g['ow']} ? x / {sw} + 1 : {g['ow']};")
        code.line(f"const long long obase = (long long){p} * {oplane};")
        code.line(f"const long long ibase = (long long){p} * {iplane};")
        with code.block("for (int oh = oh0; oh < oh1; ++oh)"):
            with code.block("for (int ow = ow0; ow < ow1; ++ow)"):
                gv = Typed(sb.emit(dt, load_expr(dt, f"{kern.ptr(sg)}[obase + oh * "
                                                     f"{g['ow']} + ow]")), dt)
                if g["kind"] == "avg":
                    code.line(f"const int wy = oh * {sh} - {ph}, wx = ow * {sw} - {pw};")
                    share = sb.div(gv, _avg_count(code, sb, g, dt, "wy", "wx"))
                    code.line(f"acc = {sb.typed(sb.add(Typed('acc', dt), share), dt).v};")
                else:
                    _first_max_takes(kern, sb, g, dt, sx, sout, gv)
        code.line(f"{kern.ptr(step.out_slots[0], write=True)}[i] = {store_expr(dt, 'acc')};")


def _avg_count(code, sb, g, dt, y0: str, x0: str):
    """The divisor of the average of the window at (y0, x0): its size, or with
    count_include_pad=False and padding, the number of its taps inside the image."""
    (kh, kw) = g["k"]
    if g["include_pad"] or g["p"] == (0, 0):
        return sb.const(float(kh * kw), dt)
    names = [code.fresh("w") for _ in range(4)]
    _window_range(code, y0, kh, g["h"], names[:2])
    _window_range(code, x0, kw, g["w"], names[2:])
    rows, cols = f"({names[1]} - {names[0]})", f"({names[3]} - {names[2]})"
    return sb.typed(Typed(sb.emit("float32", f"(float)({rows} * {cols})"), "float32"), dt)


def _first_max_takes(kwr, sb, g, dt, sx, sout, gv):
    """acc += g of window (oh, ow) if this element is the window's first maximum."""
    code = kwr.code
    (kh, kw), (sh, sw), (ph, pw) = g["k"], g["s"], g["p"]
    ov = sb.emit(dt, load_expr(dt, f"{kwr.ptr(sout)}[obase + oh * {g['ow']} + ow]"))
    code.line("int first = -1;")
    with code.block(f"for (int e = 0; e < {kh * kw} && first < 0; ++e)"):
        code.line(f"const int yy = oh * {sh} - {ph} + e / {kw}, "
                  f"xx = ow * {sw} - {pw} + e % {kw};")
        code.line(f"const bool inside = yy >= 0 && yy < {g['h']} && xx >= 0 && xx < {g['w']};")
        xv = load_expr(dt, f"{kwr.ptr(sx)}[ibase + (inside ? yy * {g['w']} + xx : 0)]")
        code.line(f"const {reg_ctype(dt)} xv = inside ? {xv} : {sb.const('-inf', dt).v};")
        code.line(f"if (xv == {ov}) first = e;")
    hit = f"first >= 0 && oh * {sh} - {ph} + first / {kw} == y - {ph} && " \
          f"ow * {sw} - {pw} + first % {kw} == x - {pw}"
    add = sb.typed(sb.add(Typed("acc", dt), gv), dt)
    code.line(f"if ({hit}) acc = {add.v};")


EMITTERS = {"pool2d": _pool2d, "pool2d_grad": _pool2d_grad}
