"""The pooling externs on the LLVM backend: pool2d (max, avg) and its gradient, one plane
(image and channel) after another, planes split among workers.

Measured at batch 256, float32, on a 2-core machine, LeNet's 2x2 pooling alone (min ms,
forward / gradient): 1.0/0.67 as a loop kernel, 0.25/0.48 with these loops on one thread,
0.19/0.27 on two.
"""
from __future__ import annotations

from llvmlite import ir

from ..extern_plan import pool_geometry, workers_for
from ..scalar import Typed
from .emit import for_range
from .extern_builder import EB, run_workers, slot_of, worker_range
from .scalar import F32, reg_type


def _unrolled(g) -> bool:
    """No padding and a small window: every window lies inside the plane, so its loads are
    unrolled with constant offsets (the ow loop vectorizes)."""
    return g["p"] == (0, 0) and g["k"][0] * g["k"][1] <= 16


def _window(eb, g, oh, ow):
    """(ih0, iw0, kh range, kw range) of output position (oh, ow), ranges clipped to x."""
    ih0 = eb.add(eb.mul(oh, g["s"][0]), -g["p"][0])
    iw0 = eb.add(eb.mul(ow, g["s"][1]), -g["p"][1])
    b = eb.b
    kh_lo = eb.smax(b.sub(eb.c(0), ih0), 0)
    kh_hi = eb.smin(b.sub(eb.c(g["h"]), ih0), g["k"][0])
    kw_lo = eb.smax(b.sub(eb.c(0), iw0), 0)
    kw_hi = eb.smin(b.sub(eb.c(g["w"]), iw0), g["k"][1])
    return ih0, iw0, (kh_lo, kh_hi), (kw_lo, kw_hi)


def _window_offsets(eb, g, oh, ow):
    """Plane offsets of an unrolled window's elements, in (kh, kw) order."""
    base = eb.add(eb.mul(oh, g["s"][0] * g["w"]), eb.mul(ow, g["s"][1]))
    return [eb.add(base, i * g["w"] + j) for i in range(g["k"][0]) for j in range(g["k"][1])]


def _count(eb, g, dt, khr, kwr):
    if g["include_pad"] or g["p"] == (0, 0):
        return eb.sb.const(float(g["k"][0] * g["k"][1]), dt)
    b = eb.b
    cnt = b.mul(eb.smax(b.sub(khr[1], khr[0]), 0), eb.smax(b.sub(kwr[1], kwr[0]), 0))
    return eb.sb.typed(Typed(b.sitofp(cnt, F32), "float32"), dt)


def _planes(e, g):
    """The planes a worker split covers: all, or the real images' under a row bound."""
    return e.bounded(g["nc"]) if e.bound is not None else g["nc"]


def _pool_workers(g):
    # a window element (load, compare or add, in scalar window loops) costs about as much as
    # 8 multiply-adds in BLAS: LeNet's first pooling (1.2M loads) takes 0.25 ms
    return workers_for(g["nc"], 8 * g["nc"] * g["oh"] * g["ow"] * g["k"][0] * g["k"][1])


def _pool2d(eb: EB, step, attrs):
    sx, so = step.in_slots[0], step.out_slots[0]
    X = slot_of(eb, sx)
    dt = X.dtype
    g = pool_geometry(X.shape, attrs)
    if g["nc"] * g["oh"] * g["ow"] == 0:
        return
    workers = _pool_workers(g)
    init = "-inf" if g["kind"] == "max" else 0.0

    def work(e, w):
        b, sb = e.b, e.sb
        acc = e.entry_alloca(reg_type(dt))
        lo, hi = worker_range(e, w, _planes(e, g), workers)
        with for_range(b, hi, start=lo) as p:
            xplane = e.slot_ptr(sx, e.mul(p, g["h"] * g["w"]))
            oplane = e.slot_ptr(so, e.mul(p, g["oh"] * g["ow"]))
            with for_range(b, g["oh"]) as oh:
                with for_range(b, g["ow"]) as ow:
                    if _unrolled(g):
                        res = sb.const(init, dt)
                        for off in _window_offsets(e, g, oh, ow):
                            v = e.load(e.gep(xplane, dt, off), dt)
                            res = sb.max(res, v) if g["kind"] == "max" else sb.add(res, v)
                        res = sb.typed(res, dt)
                        count = sb.const(float(g["k"][0] * g["k"][1]), dt)
                    else:
                        ih0, iw0, khr, kwr = _window(e, g, oh, ow)
                        b.store(sb.const(init, dt).v, acc)
                        with for_range(b, khr[1], start=khr[0]) as kh:
                            row = e.add(e.mul(e.add(ih0, kh), g["w"]), iw0)
                            with for_range(b, kwr[1], start=kwr[0]) as kw:
                                v = e.load(e.gep(xplane, dt, e.add(row, kw)), dt)
                                a = Typed(b.load(acc, typ=reg_type(dt)), dt)
                                r = sb.max(a, v) if g["kind"] == "max" else sb.add(a, v)
                                b.store(sb.typed(r, dt).v, acc)
                        res = Typed(b.load(acc, typ=reg_type(dt)), dt)
                        count = _count(e, g, dt, khr, kwr) if g["kind"] == "avg" else None
                    if g["kind"] == "avg":
                        res = sb.div(res, count)
                    e.store(e.gep(oplane, dt, e.add(e.mul(oh, g["ow"]), ow)), res, dt)
    run_workers(eb, workers, work)


def _pool2d_grad(eb: EB, step, attrs):
    sg, sx, sout = step.in_slots
    so = step.out_slots[0]
    X = slot_of(eb, sx)
    dt = X.dtype
    g = pool_geometry(X.shape, attrs)
    if g["nc"] * g["oh"] * g["ow"] == 0:
        eb.fill(eb.slot_ptr(so), dt, slot_of(eb, so).size, 0)
        return
    workers = _pool_workers(g)
    (kh_, kw_), (sh, sw) = g["k"], g["s"]
    # Windows that tile the plane exactly write every element of dx once: no zero fill.
    tiled = _unrolled(g) and (sh, sw) == (kh_, kw_) and g["oh"] * kh_ == g["h"] and \
        g["ow"] * kw_ == g["w"]

    def work(e, w):
        b = e.b
        taken = e.entry_alloca(ir.IntType(1))
        lo, hi = worker_range(e, w, _planes(e, g), workers)
        with for_range(b, hi, start=lo) as p:
            xplane = e.slot_ptr(sx, e.mul(p, g["h"] * g["w"]))
            dplane = e.slot_ptr(so, e.mul(p, g["h"] * g["w"]))
            gplane = e.slot_ptr(sg, e.mul(p, g["oh"] * g["ow"]))
            oplane = e.slot_ptr(sout, e.mul(p, g["oh"] * g["ow"]))
            if not tiled:
                e.fill(dplane, dt, g["h"] * g["w"], 0)
            with for_range(b, g["oh"]) as oh:
                with for_range(b, g["ow"]) as ow:
                    o_off = e.add(e.mul(oh, g["ow"]), ow)
                    gv = e.load(e.gep(gplane, dt, o_off), dt)
                    if _unrolled(g):
                        _grad_window_unrolled(e, g, dt, xplane, dplane, oplane, o_off, gv,
                                              oh, ow, tiled)
                    else:
                        _grad_window_clipped(e, g, dt, taken, xplane, dplane, oplane, o_off,
                                             gv, oh, ow)
    run_workers(eb, workers, work)


def _grad_window_unrolled(e, g, dt, xplane, dplane, oplane, o_off, gv, oh, ow, tiled):
    """One window's gradient, unrolled (see _unrolled): avg spreads g / count; max gives all
    of g to the window's first maximum. dx += share, or dx = 0 + share where the windows tile
    the plane (the same bits as a zero fill and an add)."""
    b, sb = e.b, e.sb
    if g["kind"] == "avg":
        share = sb.div(gv, sb.const(float(g["k"][0] * g["k"][1]), dt))
    else:
        ov = e.load(e.gep(oplane, dt, o_off), dt)
        taken = ir.Constant(ir.IntType(1), 0)
    for off in _window_offsets(e, g, oh, ow):
        pd = e.gep(dplane, dt, off)
        if g["kind"] == "max":
            hit = b.and_(sb.cmp("eq", e.load(e.gep(xplane, dt, off), dt), ov).v,
                         b.xor(taken, ir.Constant(taken.type, 1)))
            taken = b.or_(taken, hit)
            share = sb.select(Typed(hit, "bool"), gv, sb.const(0.0, dt))
        old = sb.const(0.0, dt) if tiled else e.load(pd, dt)
        e.store(pd, sb.add(old, share), dt)


def _grad_window_clipped(e, g, dt, taken, xplane, dplane, oplane, o_off, gv, oh, ow):
    """One window's gradient, the window clipped to the plane (padding)."""
    b, sb = e.b, e.sb
    ih0, iw0, khr, kwr = _window(e, g, oh, ow)
    if g["kind"] == "max":
        _max_grad_window(e, g, dt, taken, xplane, dplane, oplane, o_off, gv, ih0, iw0)
        return
    share = sb.div(gv, _count(e, g, dt, khr, kwr))
    with for_range(b, khr[1], start=khr[0]) as kh:
        row = e.add(e.mul(e.add(ih0, kh), g["w"]), iw0)
        with for_range(b, kwr[1], start=kwr[0]) as kw:
            pd = e.gep(dplane, dt, e.add(row, kw))
            e.store(pd, sb.add(e.load(pd, dt), share), dt)


def _max_grad_window(eb, g, dt, taken, xplane, dplane, oplane, o_off, gv, ih0, iw0):
    """Max pooling's gradient for one window: the first maximum (in the padded window, as
    the eager impl scans it) takes all of g."""
    b, sb = eb.b, eb.sb
    ov = eb.load(eb.gep(oplane, dt, o_off), dt)
    b.store(ir.Constant(ir.IntType(1), 0), taken)
    with for_range(b, g["k"][0]) as kh:
        ih = eb.add(ih0, kh)
        vh = b.and_(b.icmp_signed(">=", ih, eb.c(0)),
                    b.icmp_signed("<", ih, eb.c(g["h"])))
        with for_range(b, g["k"][1]) as kw:
            iw = eb.add(iw0, kw)
            valid = b.and_(vh, b.and_(b.icmp_signed(">=", iw, eb.c(0)),
                                      b.icmp_signed("<", iw, eb.c(g["w"]))))
            off = eb.add(eb.mul(eb.clamp(ih, 0, g["h"] - 1), g["w"]),
                         eb.clamp(iw, 0, g["w"] - 1))
            xv = eb.load(eb.gep(xplane, dt, off), dt)
            xv = sb.select(Typed(valid, "bool"), xv, sb.const("-inf", dt))
            t = b.load(taken, typ=ir.IntType(1))
            hit = b.and_(sb.cmp("eq", xv, ov).v, b.xor(t, ir.Constant(t.type, 1)))
            b.store(b.or_(t, hit), taken)
            pd = eb.gep(dplane, dt, off)
            add = sb.select(Typed(b.and_(hit, valid), "bool"), gv,
                            sb.const(0.0, dt))
            eb.store(pd, sb.add(eb.load(pd, dt), add), dt)


EMITTERS = {"pool2d": _pool2d, "pool2d_grad": _pool2d_grad}
