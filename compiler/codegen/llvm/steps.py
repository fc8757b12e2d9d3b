"""A control-flow loop in native code: ``void hybrid_steps(body, arena, n, nslots, io, base,
stride)`` calls the compiled body ``n`` times, step ``j`` with io pointer ``k`` set to
``base[k] + j * stride[k]`` bytes: a data row, an output row, the state row the step reads
and the one it writes (states live in rows ``0..n`` of one buffer), or a captured value
(stride 0). A reverse scan passes its last row as the base and a negative stride.

One generic driver, compiled once per process (or read from the disk cache): the whole loop
is one native call with the GIL released, no Python and no allocation per step.
"""
from __future__ import annotations

import ctypes

from llvmlite import ir

from .scalar import I64, PTR

VERSION = 1
SYMBOL = "hybrid_steps"

_state: dict = {}


def emit_steps_ir(triple: str, data_layout: str) -> str:
    m = ir.Module(name="hybrid_steps")
    m.triple, m.data_layout = triple, data_layout
    body_ty = ir.FunctionType(ir.VoidType(), [PTR, PTR])
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, PTR, PTR, PTR]),
                     SYMBOL)
    body, arena, n, nslots, io, base, stride = fn.args
    entry, outer, inner, call, done = (fn.append_basic_block(x) for x in
                                       ("entry", "outer", "inner", "call", "done"))
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    b = ir.IRBuilder(entry)
    slot = b.alloca(PTR)  # the body as a function pointer (opaque pointers carry no type)
    b.store(body, slot)
    body_fn = b.load(slot, typ=body_ty.as_pointer())
    b.cbranch(b.and_(b.icmp_signed(">", n, zero), b.icmp_signed(">", nslots, zero)), outer,
              done)
    b.position_at_end(outer)
    j = b.phi(I64, "j")
    j.add_incoming(zero, entry)
    b.branch(inner)
    b.position_at_end(inner)  # io[k] = base[k] + j * stride[k]
    k = b.phi(I64, "k")
    k.add_incoming(zero, outer)
    row = b.load(b.gep(base, [k], source_etype=PTR), typ=PTR)
    step = b.load(b.gep(stride, [k], source_etype=I64), typ=I64)
    ptr = b.gep(row, [b.mul(step, j)], source_etype=ir.IntType(8))
    b.store(ptr, b.gep(io, [k], source_etype=PTR))
    k1 = b.add(k, one)
    k.add_incoming(k1, inner)
    b.cbranch(b.icmp_signed("<", k1, nslots), inner, call)
    b.position_at_end(call)
    b.call(body_fn, [io, arena])
    j1 = b.add(j, one)
    j.add_incoming(j1, call)
    b.cbranch(b.icmp_signed("<", j1, n), outer, done)
    b.position_at_end(done)
    b.ret_void()
    return str(m)


def driver():
    """The compiled driver as a ctypes function (GIL released during the call)."""
    fn = _state.get("fn")
    if fn is None:
        from runtime import native  # noqa: PLC0415
        mod = native.builtin_module("hybrid_steps", emit_steps_ir, f"hybrid_steps/{VERSION}",
                                    [SYMBOL])
        v = ctypes.c_void_p
        fn = _state["fn"] = mod.cfunc(SYMBOL, None, v, v, ctypes.c_int64, ctypes.c_int64, v,
                                      v, v)
    return fn
