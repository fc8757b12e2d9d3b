"""row_bounds: which steps of a Program may stop after a padded call's real rows.

A shape bucket (hybrid/buckets.py) runs one compiled graph for many batch sizes, its inputs
padded to the bucket's rows. With row bounds the Program also reads the real number of batch
units (the *count slot*, an int64 input) and every step that touches the batch computes the
real units only: a call costs the work of its real size, whatever its bucket, so one bucket
can serve every smaller size.

Rows past the count are then never written: they hold whatever the memory held. That is
safe only if no step reads them, so bounds are all or nothing: every step reading a slot
that carries the batch must be bounded - a row-wise step computes the rows below the count,
a step summing over the batch (a reduction over it, a product contracting it) sums those
rows only. If one step cannot be, the Program gets no bounds and every step computes every
padded row, as it would without this pass (the caller's padding rows are copies of real
ones).

A slot carries the batch on its leading elements: ``unit`` elements per batch unit (an MLP's
(B, C) input: C; a decoder's (T*N, C) input, T time steps of N rows: N*C per step), and the
bucket's ``units`` of them in all. Understood steps:

- a loop kernel with a dimension ``d`` of extent ``units * g`` along which every batch slot it
  reads or writes advances one unit per ``g`` iterations, all other dimensions staying inside
  that unit, and every other slot it reads is the same for every ``d`` (a weight, a bias):
  dimension ``d`` runs ``count * g`` times. An output with no stride along ``d`` is a
  reduction over the batch, free of it;
- a 2-D matmul whose A carries the batch on its rows (x @ W, dY @ W): C's rows are A's, ``m``
  runs ``count * f`` rows; or whose A and B both carry it on the contracted axis
  (X^T @ dY, a weight's gradient): ``k`` runs ``count * f`` rows, C is free of the batch.

Anything else touching the batch (a gather, a convolution) leaves the Program unbounded.
Pure: Program in, bounds out; tests run it without a device.
"""
from __future__ import annotations

from ..codegen.kernel import ExternKernel, LoopKernel, matmul_operand_shapes


def row_bounds(program, batched: dict, units: int) -> tuple:
    """The Program's ``rows`` (see kernel.Program): ``((step, what, per), ...)`` bounding
    every step that touches the batch, given ``batched`` (input slot -> elements per batch
    unit) and the bucket's ``units``; ``()`` when some step cannot be bounded (or nothing
    would be saved: one unit)."""
    if units < 2:
        return ()
    unit = {}
    for s, u in batched.items():
        if u < 1 or program.slots[s].size != units * u:
            return ()
        unit[s] = u
    rows = []
    for i, step in enumerate(program.steps):
        reads, writes = _slots(step)
        if not any(s in unit for s in reads):
            for s in writes:  # (a slot's memory written again: what it holds now)
                unit.pop(s, None)
            continue
        got = _loop(program, step, unit, units) if isinstance(step, LoopKernel) else \
            _matmul(program, step, unit, units) if step.op == "matmul" else None
        if got is None:
            return ()
        what, per, carried = got
        rows.append((i, what, per))
        for s in writes:
            unit.pop(s, None)
        unit.update(carried)
    return tuple(rows)


def _slots(step):
    if isinstance(step, LoopKernel):
        return [a.slot for a in step.loads], [o.access.slot for o in step.outputs]
    return list(step.in_slots), list(step.out_slots)


def _inside(access, shape, d, g, u) -> bool:
    """Whether, for each unit, the elements ``access`` reaches over that unit's ``g``
    iterations of dimension ``d`` and every other dimension lie inside that unit."""
    if access.offset < 0 or any(s < 0 for s in access.strides):
        return False
    span = access.offset + (g - 1) * access.strides[d] + sum(
        (n - 1) * s for j, (n, s) in enumerate(zip(shape, access.strides)) if j != d)
    return span < u


def _loop(program, k: LoopKernel, unit, units):
    shape = tuple(k.loop_shape)
    for d, extent in enumerate(shape):
        if extent and extent % units == 0:
            carried = _along(program, k, unit, units, shape, d, extent // units)
            if carried is not None:
                return ("loop", d), extent // units, carried
    return None


def _along(program, k, unit, units, shape, d, g):
    """The batch slots ``k``'s outputs carry when its dimension ``d`` walks the batch, g
    iterations per unit; None when it does not."""
    for a in k.loads:
        s = a.strides[d]
        if a.slot in unit:
            if s * g != unit[a.slot] or not _inside(a, shape, d, g, unit[a.slot]):
                return None
        elif s != 0:  # a batch-free value read along the batch: rows baked in
            return None
    carried = {}
    for o in k.outputs:
        a = o.access
        s = a.strides[d]
        if s == 0:  # a reduction over the batch (the IR has no other such write)
            continue
        u = s * g
        if program.slots[a.slot].size != units * u or not _inside(a, shape, d, g, u):
            return None
        carried[a.slot] = u
    return carried


def _matmul(program, k: ExternKernel, unit, units):
    sa, sb = k.in_slots
    (sc,) = k.out_slots
    A, B = program.slots[sa].shape, program.slots[sb].shape
    if len(A) != 2 or len(B) != 2:
        return None
    attrs = k.attr_dict
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    ashape, bshape = matmul_operand_shapes([A, B], attrs)
    (m, kk), n = ashape, bshape[-1]
    if sa in unit and sb not in unit and not ta:  # rows of A are rows of C
        f, rest = divmod(unit[sa], kk)
        if rest or m != units * f:
            return None
        return ("m",), f, {sc: f * n}
    if sa in unit and sb in unit and ta and not tb:  # the rows are contracted
        f, rest = divmod(unit[sa], m)
        if rest or kk != units * f or unit[sb] != f * n:
            return None
        return ("k",), f, {}
    return None
