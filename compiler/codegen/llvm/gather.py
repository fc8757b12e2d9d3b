"""The index externs on the LLVM backend: gather (take, pick), its scatter-add gradient
(take_grad) and argmax/argmin, as loop nests over whole slots."""
from __future__ import annotations

import math

from llvmlite import ir

from ..kernel import KernelIRError
from ..scalar import FLOATS, Typed
from .emit import for_range
from .extern_builder import EB, slot_of
from .scalar import I64, reg_type


def _axis(axis, ndim):
    return int(axis) % ndim if ndim else 0


def _index_of(eb, idx_ptr, idx_dt, j, dim, mode):
    v = eb.sb.typed(eb.load(eb.gep(idx_ptr, idx_dt, j), idx_dt), "int64")
    if mode in ("wrap", "raise"):
        # 'raise': the executable checks the range after the call (passes/index_checks.py);
        # here an index in [-dim, dim) counts from the end as NumPy's, and any other stays
        # in bounds
        return eb.sb.mod(v, eb.sb.const(dim, "int64")).v
    return eb.clamp(v.v, 0, dim - 1)


def _take(eb: EB, step, attrs):
    sx, si = step.in_slots
    so = step.out_slots[0]
    X, IDX = slot_of(eb, sx), slot_of(eb, si)
    mode = attrs.get("mode", "clip")
    ax = _axis(attrs.get("axis", 0), len(X.shape))
    lead = math.prod(X.shape[:ax])
    dim = X.shape[ax]
    rest = math.prod(X.shape[ax + 1:])
    nj = IDX.size
    if lead * nj * rest == 0:
        return
    if dim == 0:
        raise KernelIRError("take: cannot take from an empty axis")
    b = eb.b
    count = eb.bounded(nj) if eb.bound is not None else nj  # (a row bound: lead is 1)
    with for_range(b, lead) as l_:
        with for_range(b, count) as j:
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, j, dim, mode)
            src = eb.slot_ptr(sx, eb.mul(eb.add(eb.mul(l_, dim), i), rest))
            dst = eb.slot_ptr(so, eb.mul(eb.add(eb.mul(l_, nj), j), rest))
            eb.copy_nest([rest], dst, X.dtype, [1], src, X.dtype, [1])


def _take_grad(eb: EB, step, attrs):
    sg, si = step.in_slots
    so = step.out_slots[0]
    G, IDX, OUT = slot_of(eb, sg), slot_of(eb, si), slot_of(eb, so)
    mode = attrs.get("mode", "clip")
    ax = int(attrs["axis"])
    dim = int(attrs["dim"])
    lead = math.prod(OUT.shape[:ax])
    rest = math.prod(OUT.shape[ax + 1:])
    nj = IDX.size
    eb.fill(eb.slot_ptr(so), OUT.dtype, OUT.size, 0)
    if lead * nj * rest * dim == 0:
        return
    b = eb.b
    count = eb.bounded(nj) if eb.bound is not None else nj  # (a row bound: lead is 1)
    with for_range(b, lead) as l_:
        with for_range(b, count) as j:
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, j, dim, mode)
            dst = eb.slot_ptr(so, eb.mul(eb.add(eb.mul(l_, dim), i), rest))
            src = eb.slot_ptr(sg, eb.mul(eb.add(eb.mul(l_, nj), j), rest))
            eb.copy_nest([rest], dst, OUT.dtype, [1], src, G.dtype, [1], accumulate=True)


def _pick(eb: EB, step, attrs):
    sx, si = step.in_slots
    so = step.out_slots[0]
    X, IDX = slot_of(eb, sx), slot_of(eb, si)
    ax = _axis(attrs.get("axis", -1), len(X.shape))
    lead = math.prod(X.shape[:ax])
    dim = X.shape[ax]
    rest = math.prod(X.shape[ax + 1:])
    if lead * rest == 0:
        return
    b = eb.b
    with for_range(b, eb.bounded(lead) if eb.bound is not None else lead) as l_:
        with for_range(b, rest) as r:
            pos = eb.add(eb.mul(l_, rest), r)
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, pos, dim, "clip")
            v = eb.load(eb.slot_ptr(sx, eb.add(eb.mul(eb.add(eb.mul(l_, dim), i), rest), r)),
                        X.dtype)
            eb.store(eb.slot_ptr(so, pos), v, X.dtype)


def _argext(kind):
    def emit(eb: EB, step, attrs):
        sx, so = step.in_slots[0], step.out_slots[0]
        X = slot_of(eb, sx)
        axis = attrs.get("axis")
        if axis is None:
            lead, dim, rest = 1, X.size, 1
        else:
            ax = _axis(axis, len(X.shape))
            lead, dim, rest = (math.prod(X.shape[:ax]), X.shape[ax],
                               math.prod(X.shape[ax + 1:]))
        if lead * rest == 0 or dim == 0:
            return
        b, sb = eb.b, eb.sb
        dt = X.dtype
        best = b.alloca(reg_type(dt))
        besti = b.alloca(I64)
        with for_range(b, lead) as l_:
            with for_range(b, rest) as r:
                base = eb.add(eb.mul(l_, dim * rest), r)
                b.store(eb.load(eb.slot_ptr(sx, base), dt).v, best)
                b.store(eb.c(0), besti)
                if dim > 1:
                    with for_range(b, dim, start=1) as kk:
                        v = eb.load(eb.slot_ptr(sx, eb.add(base, eb.mul(kk, rest))), dt)
                        cur = Typed(b.load(best, typ=reg_type(dt)), dt)
                        better = sb.cmp("gt" if kind == "argmax" else "lt", v, cur).v
                        if dt in FLOATS:  # the first NaN wins, as in NumPy
                            vnan = b.fcmp_unordered("uno", v.v, v.v)
                            cnan = b.fcmp_unordered("uno", cur.v, cur.v)
                            better = b.or_(better, b.and_(vnan, b.xor(
                                cnan, ir.Constant(cnan.type, 1))))
                        b.store(b.select(better, v.v, cur.v), best)
                        b.store(b.select(better, kk, b.load(besti, typ=I64)), besti)
                eb.store(eb.slot_ptr(so, eb.add(eb.mul(l_, rest), r)),
                         Typed(b.load(besti, typ=I64), "int64"), "int64")
    return emit


EMITTERS = {"take": _take, "take_grad": _take_grad, "pick": _pick,
            "argmax": _argext("argmax"), "argmin": _argext("argmin")}
