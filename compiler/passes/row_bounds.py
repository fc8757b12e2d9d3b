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
  (X^T @ dY, a weight's gradient): ``k`` runs ``count * f`` rows, C is free of the batch;
- a gather from a batch-free table by indices that carry the batch (an embedding): ``count
  * f`` indices; its gradient, the scatter of their rows into the table, the same; a pick
  whose data and indices carry the batch on their leading rows: ``count * g`` of them;
- a convolution, its gradients and a pooling (NCHW) walk ``count * f`` images (a pooling
  ``count * f * C`` planes); the weight's gradient sums them.

Anything else touching the batch (an argmax) leaves the Program unbounded.
Pure: Program in, bounds out; tests run it without a device.
"""
from __future__ import annotations

import math

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
    written, last = set(), {}  # arena slots written so far; (offset, bytes) -> its unit
    for i, step in enumerate(program.steps):
        reads, writes = _slots(step)
        for s in reads:  # an arena slot no step writes is a view (a reshape) of the value
            slot = program.slots[s]  # last written at its bytes: its rows are that value's
            if slot.role == "arena" and s not in written and \
                    last.get((slot.offset, slot.nbytes)) is not None:
                unit[s] = last[(slot.offset, slot.nbytes)]
        written.update(writes)
        for s in writes:
            slot = program.slots[s]
            if slot.role == "arena":
                last[(slot.offset, slot.nbytes)] = None
        if not any(s in unit for s in reads):
            for s in writes:  # (a slot's memory written again: what it holds now)
                unit.pop(s, None)
            continue
        got = _loop(program, step, unit, units) if isinstance(step, LoopKernel) else \
            _EXTERNS[step.op](program, step, unit, units) if step.op in _EXTERNS else None
        if got is None:
            return ()
        what, per, carried = got
        rows.append((i, what, per))
        for s in writes:
            unit.pop(s, None)
        unit.update(carried)
        for s, u in carried.items():
            slot = program.slots[s]
            if slot.role == "arena":
                last[(slot.offset, slot.nbytes)] = u
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


def _gather(program, k: ExternKernel, unit, units):
    """take (table, indices) / take_grad (grads, indices): the indices' count, when the
    table's axis is its first (nothing before it: the rows are the indices')."""
    src, si = k.in_slots
    (so,) = k.out_slots
    attrs = k.attr_dict
    lead_shape = (program.slots[so] if k.op == "take_grad" else program.slots[src]).shape
    ax = int(attrs.get("axis", 0)) % max(len(lead_shape), 1)
    if si not in unit or any(n != 1 for n in lead_shape[:ax]):
        return None
    rest = math.prod(lead_shape[ax + 1:])
    f = unit[si]
    if k.op == "take":
        return (None if src in unit else (("take",), f, {so: f * rest}))
    return (("take",), f, {}) if unit.get(src) == f * rest else None


def _pick(program, k: ExternKernel, unit, units):
    """pick (data, indices) along an axis after the batch: its lead rows walk the batch."""
    sx, si = k.in_slots
    (so,) = k.out_slots
    shape = program.slots[sx].shape
    ax = int(k.attr_dict.get("axis", -1)) % len(shape)
    lead = math.prod(shape[:ax])
    if sx not in unit or si not in unit or ax == 0 or lead % units:
        return None
    g = lead // units
    rest = program.slots[so].size // lead
    if unit[sx] != g * shape[ax] * rest or unit[si] != g * rest:
        return None
    return ("pick",), g, {so: g * rest}


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


def _per_image(batched, free=(), summed=False, planes=False):
    """A convolution or pooling (NCHW): its kernel walks images - planes of C channels for a
    pooling - so it runs ``count * f`` of them (f images per unit) when the inputs at
    ``batched`` carry the batch on their images and those at ``free`` do not; ``summed``:
    its output sums over the images (a weight's gradient)."""
    def rule(program, k, unit, units):
        slots = [k.in_slots[i] for i in batched]
        if any(s not in unit for s in slots) or any(k.in_slots[i] in unit for i in free):
            return None
        shape = program.slots[slots[0]].shape
        n = shape[0] if shape else 0
        if n == 0 or n % units:
            return None
        f = n // units
        for s in slots:
            sl = program.slots[s]
            if sl.shape[0] != n or unit[s] != f * (sl.size // n):
                return None
        (so,) = k.out_slots
        carried = {} if summed else {so: program.slots[so].size // units}
        return (k.op,), f * shape[1] if planes else f, carried
    return rule


_EXTERNS = {"matmul": _matmul, "take": _gather, "take_grad": _gather, "pick": _pick,
            "conv2d": _per_image((0,), free=(1,)),
            "conv2d_grad_data": _per_image((0,), free=(1,)),
            "conv2d_grad_weight": _per_image((0, 1), summed=True),
            "pool2d": _per_image((0,), planes=True),
            "pool2d_grad": _per_image((0, 1, 2), planes=True)}
BOUNDED_EXTERNS = frozenset(_EXTERNS)  # the library kernels a target must bound


# ---------------------------------------------------------------- graphs that carry rows
# A compile's ``rows`` (compiler.pipeline.compile): {"count": input index of the real count,
# "batched": input indices padded along axis 0, "units": the bucket's rows}. Below: the
# rows of each part of a partitioned graph, and of a training graph's two halves, from the
# batch state of each value (passes/batch_axis.py's batch_states).

def _input_rows(graph, states_of_inputs, count: int, units: int):
    """``rows`` for a graph whose inputs have ``states_of_inputs``, or None where one
    carries the batch on another axis than 0 (then nothing can be bounded)."""
    batched = []
    for k, s in enumerate(states_of_inputs):
        if isinstance(s, tuple):
            if s[0] != 0:
                return None
            batched.append(k)
    return {"count": count, "batched": batched, "units": units}


def part_rows(graph, split, rows):
    """Per part of ``split`` (passes/partition.py) of ``graph``: its ``rows``, None for a
    part with no padded input or a control part (a counted scan stops by itself); None for
    the whole where the batch cannot be followed. A part lacking the count input gets it."""
    from ..control_flow import is_control_part  # noqa: PLC0415 - control_flow imports passes
    from ..ops import Spec  # noqa: PLC0415
    from .batch_axis import batch_states  # noqa: PLC0415
    states = batch_states(graph, {graph.inputs[i]: 0 for i in rows["batched"]},
                          rows["units"])
    if states is None:
        return None
    count = graph.inputs[rows["count"]]
    out = []
    for p in split.parts:
        st = [states.get(src) for src in p.sources]
        if is_control_part(p.graph) or not any(isinstance(s, tuple) for s in st):
            out.append(None)
            continue
        if count not in p.sources:
            p.graph.add_input(Spec((), "int64"), "valid_rows", p.device)
            p.inputs.append(("input", rows["count"]))
            p.input_devices.append(graph.node(count).get("device", "cpu(0)"))
            p.sources.append(count)
            st.append(None)
        got = _input_rows(p.graph, st, p.sources.index(count), rows["units"])
        if got is None:
            return None
        out.append(got)
    return out


def training_rows(tg, rows):
    """(rows of tg.forward, rows of tg.backward) for a bucket's TrainingGraphs
    (compiler/autodiff.py); the backward gets the count as a last input (its caller passes
    the forward call's). (None, None) where the batch cannot be followed."""
    from ..ops import Spec  # noqa: PLC0415
    from .batch_axis import batch_states  # noqa: PLC0415
    fwd, bwd = tg.forward, tg.backward
    states = batch_states(fwd, {fwd.inputs[i]: 0 for i in rows["batched"]}, rows["units"])
    if states is None:
        return None, None
    st = [states.get(r) for r in tg.residuals] + \
        [states.get(o) for o in fwd.outputs[:tg.n_outputs]]
    got = _input_rows(bwd, st + [None], len(bwd.inputs), rows["units"])
    if got is None:
        return None, None
    count = fwd.inputs[rows["count"]]
    bwd.add_input(Spec((), "int64"), "valid_rows", fwd.node(count).get("device", "cpu(0)"))
    return dict(rows), got
