"""The index externs as CUDA C: take, take_grad, pick, argmax, argmin.

- take / pick: a thread per output element (grid-stride), indices clipped or wrapped as the
  registry's eager impls do; mode='raise' cannot raise inside a kernel and is refused;
- take_grad: zero the output, then scatter-add each gradient element with ``atomicAdd``
  (float32, float64, int32, int64: the types CUDA has atomics for). float16, int8, uint8 and
  bool have none: there each output element gathers the gradient rows that index it;
- argmax / argmin: a thread per output element scanning its axis, or, for a long axis and
  few outputs, a block per output element whose threads scan strided parts and merge
  (value, index) pairs as a tree in shared memory. The first maximum (minimum) wins and a
  NaN beats every number, as in NumPy.
"""
from __future__ import annotations

import math

from ..kernel import KernelIRError
from ..scalar import FLOATS
from .scalar import load_expr, reg_ctype, store_expr
from .writer import (BLOCK, MAX_GRID, KernelWriter, ModuleWriter, decompose,
                     grid_stride_kernel, index_type)

ATOMIC_TYPES = {"float32": ("float", "float"), "float64": ("double", "double"),
                "int32": ("int", "int"), "int64": ("unsigned long long", "unsigned long long")}
ARG_BLOCK_MIN_AXIS = 1024  # an axis this long (with few outputs) is scanned by a block
ARG_BLOCK_MAX_OUTPUTS = 4096


def _axis(axis, ndim) -> int:
    return int(axis) % ndim if ndim else 0


def _split(shape, ax):
    return math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])


def _index(kw, idx_slot, pos, dim, mode) -> str:
    """A variable holding the index at ``pos`` of slot ``idx_slot``, clipped or wrapped.
    'raise' reads as 'wrap': the executable checks the range after the call
    (passes/index_checks.py), and an index in [-dim, dim) counts from the end as NumPy's."""
    code = kw.code
    dt = kw.mw.program.slots[idx_slot].dtype
    v = code.fresh("ix")
    code.line(f"long long {v} = (long long)({load_expr(dt, f'{kw.ptr(idx_slot)}[{pos}]')});")
    if mode in ("wrap", "raise"):
        code.line(f"{v} %= {dim}LL;")
        code.line(f"if ({v} < 0) {v} += {dim}LL;")
    else:
        code.line(f"{v} = {v} < 0 ? 0 : ({v} > {dim - 1}LL ? {dim - 1}LL : {v});")
    return v


def _fill_zero(mw: ModuleWriter, slot: int, label: str):
    s = mw.program.slots[slot]
    if s.size == 0:
        return
    with grid_stride_kernel(mw, label, s.size) as (kw, _):
        kw.code.line(f"{kw.ptr(slot, write=True)}[i] = 0;")  # +0.0 and False are zero bits


def _take(mw: ModuleWriter, step):
    prog = mw.program
    sx, si = step.in_slots
    (so,) = step.out_slots
    X, IDX = prog.slots[sx], prog.slots[si]
    attrs = step.attr_dict
    mode = attrs.get("mode", "clip")
    lead, dim, rest = _split(X.shape, _axis(attrs.get("axis", 0), len(X.shape)))
    nj = IDX.size
    total = lead * nj * rest
    if total == 0:
        return
    if dim == 0:
        raise KernelIRError("take: cannot take from an empty axis")
    with grid_stride_kernel(mw, step.name or "take", total, X.size) as (kw, it):
        l_, j, r = decompose(kw.code, it, "i", (lead, nj, rest), ("l", "j", "r"))
        ix = _index(kw, si, j, dim, mode)
        kw.code.line(f"{kw.ptr(so, write=True)}[i] = "
                     f"{kw.ptr(sx)}[(({it}){l_} * {dim} + {ix}) * {rest} + {r}];")


def _take_grad(mw: ModuleWriter, step):
    prog = mw.program
    sg, si = step.in_slots
    (so,) = step.out_slots
    G, IDX, OUT = prog.slots[sg], prog.slots[si], prog.slots[so]
    attrs = step.attr_dict
    mode = attrs.get("mode", "clip")
    ax, dim = int(attrs["axis"]), int(attrs["dim"])
    lead, rest = math.prod(OUT.shape[:ax]), math.prod(OUT.shape[ax + 1:])
    nj = IDX.size
    if OUT.dtype in ATOMIC_TYPES:
        _fill_zero(mw, so, (step.name or "take_grad") + "_zero")
        total = lead * nj * rest
        if total * dim == 0:
            return
        ptr_t, val_t = ATOMIC_TYPES[OUT.dtype]
        with grid_stride_kernel(mw, step.name or "take_grad", total, OUT.size) as (kw, it):
            l_, j, r = decompose(kw.code, it, "i", (lead, nj, rest), ("l", "j", "r"))
            ix = _index(kw, si, j, dim, mode)
            dst = f"&{kw.ptr(so, write=True)}[(({it}){l_} * {dim} + {ix}) * {rest} + {r}]"
            kw.code.line(f"atomicAdd(({ptr_t}*){dst}, ({val_t}){kw.ptr(sg)}[i]);")
        return
    _take_grad_gather(mw, step, G, OUT, lead, dim, rest, nj, mode)


def _take_grad_gather(mw, step, G, OUT, lead, dim, rest, nj, mode):
    """Without atomics: each output element sums the gradient elements whose index is its
    own (float16 sums in float, 8-bit integers wrap, bool ORs)."""
    sg, si = step.in_slots
    (so,) = step.out_slots
    total = OUT.size
    if total == 0:
        return
    dt = OUT.dtype
    acc_t = {"float16": "float", "bool": "bool"}.get(dt, "unsigned")
    with grid_stride_kernel(mw, (step.name or "take_grad") + "_gather", total,
                            G.size) as (kw, it):
        code = kw.code
        l_, d, r = decompose(code, it, "i", (lead, dim, rest), ("l", "d", "r"))
        code.line(f"{acc_t} acc = ({acc_t})0;")
        with code.block(f"for ({it} j = 0; j < {nj}; ++j)"):
            ix = _index(kw, si, "j", dim, mode)
            g = load_expr(dt, f"{kw.ptr(sg)}[(({it}){l_} * {nj} + j) * {rest} + {r}]")
            if dt == "bool":
                code.line(f"if ({ix} == {d}) acc = acc || {g};")
            else:
                code.line(f"if ({ix} == {d}) acc += ({acc_t}){g};")
        value = "acc" if dt in ("float16", "bool") else f"({reg_ctype(dt)})acc"
        code.line(f"{kw.ptr(so, write=True)}[i] = {store_expr(dt, value)};")


def _pick(mw: ModuleWriter, step):
    prog = mw.program
    sx, si = step.in_slots
    (so,) = step.out_slots
    X = prog.slots[sx]
    lead, dim, rest = _split(X.shape, _axis(step.attr_dict.get("axis", -1), len(X.shape)))
    total = lead * rest
    if total == 0:
        return
    with grid_stride_kernel(mw, step.name or "pick", total, X.size) as (kw, it):
        l_, r = decompose(kw.code, it, "i", (lead, rest), ("l", "r"))
        ix = _index(kw, si, "i", dim, "clip")
        kw.code.line(f"{kw.ptr(so, write=True)}[i] = "
                     f"{kw.ptr(sx)}[(({it}){l_} * {dim} + {ix}) * {rest} + {r}];")


def _better(kind: str, dt: str, v: str, w: str) -> str:
    """C condition: value v beats value w (NaN beats every number)."""
    cmp = f"{v} {'>' if kind == 'argmax' else '<'} {w}"
    if dt in FLOATS:
        return f"({cmp} || ({v} != {v} && {w} == {w}))"
    return f"({cmp})"


def _argext(kind: str):
    def emit(mw: ModuleWriter, step):
        X = mw.program.slots[step.in_slots[0]]
        axis = step.attr_dict.get("axis")
        if axis is None:
            lead, dim, rest = 1, X.size, 1
        else:
            lead, dim, rest = _split(X.shape, _axis(axis, len(X.shape)))
        total = lead * rest
        if total == 0 or dim == 0:
            return
        if dim >= ARG_BLOCK_MIN_AXIS and total <= ARG_BLOCK_MAX_OUTPUTS:
            _argext_block(mw, step, kind, X, lead, dim, rest)
        else:
            _argext_serial(mw, step, kind, X, lead, dim, rest)
    return emit


def _argext_serial(mw, step, kind, X, lead, dim, rest):
    sx, so = step.in_slots[0], step.out_slots[0]
    dt, total = X.dtype, lead * rest
    with grid_stride_kernel(mw, step.name or kind, total, X.size) as (kw, it):
        code = kw.code
        l_, r = decompose(code, it, "i", (lead, rest), ("l", "r"))
        code.line(f"const {it} base = ({it}){l_} * {dim * rest} + {r};")
        code.line(f"{reg_ctype(dt)} best = {load_expr(dt, f'{kw.ptr(sx)}[base]')};")
        code.line("long long bi = 0;")
        with code.block(f"for ({it} k = 1; k < {dim}; ++k)"):
            code.line(f"const {reg_ctype(dt)} v = "
                      f"{load_expr(dt, f'{kw.ptr(sx)}[base + k * {rest}]')};")
            with code.block(f"if {_better(kind, dt, 'v', 'best')}"):
                code.line("best = v;")
                code.line("bi = k;")
        code.line(f"{kw.ptr(so, write=True)}[i] = bi;")


def _argext_block(mw, step, kind, X, lead, dim, rest):
    sx, so = step.in_slots[0], step.out_slots[0]
    dt, total = X.dtype, lead * rest
    ct = reg_ctype(dt)
    grid = min(total, MAX_GRID)
    it = index_type(total + grid, X.size + BLOCK * rest)
    kw = KernelWriter(mw, step.name or kind)
    code = kw.code
    code.line(f"__shared__ {ct} sv[{BLOCK}];")
    code.line(f"__shared__ long long si[{BLOCK}];")
    with code.block(f"for ({it} m = blockIdx.x; m < {total}; m += gridDim.x)"):
        l_, r = decompose(code, it, "m", (lead, rest), ("l", "r"))
        code.line(f"const {it} base = ({it}){l_} * {dim * rest} + {r};")
        code.line(f"{ct} best = ({ct})0;")
        code.line("long long bi = -1;")
        with code.block(f"for ({it} k = threadIdx.x; k < {dim}; k += blockDim.x)"):
            code.line(f"const {ct} v = {load_expr(dt, f'{kw.ptr(sx)}[base + k * {rest}]')};")
            with code.block(f"if (bi < 0 || {_better(kind, dt, 'v', 'best')})"):
                code.line("best = v;")
                code.line("bi = k;")
        code.line("sv[threadIdx.x] = best;")
        code.line("si[threadIdx.x] = bi;")
        code.line("__syncthreads();")
        with code.block(f"for (unsigned s = {BLOCK // 2}; s > 0; s >>= 1)"):
            with code.block("if (threadIdx.x < s)"):
                code.line(f"const {ct} w = sv[threadIdx.x + s];")
                code.line("const long long wi = si[threadIdx.x + s];")
                code.line(f"const {ct} u = sv[threadIdx.x];")
                code.line("const long long ui = si[threadIdx.x];")
                # the other pair wins if it exists and beats ours, or ties with a lower index
                code.line(f"if (wi >= 0 && (ui < 0 || {_better(kind, dt, 'w', 'u')} || "
                          f"(!{_better(kind, dt, 'u', 'w')} && wi < ui))) "
                          "{ sv[threadIdx.x] = w; si[threadIdx.x] = wi; }")
            code.line("__syncthreads();")
        with code.block("if (threadIdx.x == 0)"):
            code.line(f"{kw.ptr(so, write=True)}[m] = si[0];")
        code.line("__syncthreads();  /* sv and si are reused by the next element */")
    kw.finish(grid, BLOCK)


EMITTERS = {"take": _take, "take_grad": _take_grad, "pick": _pick,
            "argmax": _argext("argmax"), "argmin": _argext("argmin")}
