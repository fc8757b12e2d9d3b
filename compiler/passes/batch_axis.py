"""batch_axis: may a graph run on inputs padded with extra rows, its real rows unchanged?

A graph traced at a padded batch (or sequence length) computes the same real rows as the
graph traced at the real size when every op keeps rows apart: row ``b`` of each output is
computed from row ``b`` of the batched inputs (and batch-free values: parameters,
constants) only. This pass follows the batch axis from the inputs through the graph and
says yes (with the axis of each output, to slice the real rows back out) or no (with the
op that mixes rows: a reduction over the batch, a BatchNorm's statistics in training, a
slice or a gather across rows, a random draw).

A value is batch-free (``None``), *uniform* (``UNIFORM``: a ``full`` or ``arange``, whose
first rows are the same at every size) or batched ``(axis, f)``: along ``axis``, element
``i`` belongs to batch row ``i // f`` (``f`` rows per batch element after a reshape merged
the batch with the next axis, as (T, N, C) -> (T*N, C) does).

A ``foreach`` scanning over the batch axis (a sequence length padded with extra steps) is
also allowed: it must then stop after the real steps, so the pass lists such nodes for the
caller to make them ``counted`` by the real length.
"""
from __future__ import annotations

import dataclasses
import math

from ..graph import NodeRef
from ..ops import REGISTRY
from ..ops.core import normalize_axis

UNIFORM = "uniform"


class NotSeparable(Exception):
    """The graph mixes rows of the batch (the message says where)."""


@dataclasses.dataclass
class BatchAxes:
    ok: bool
    reason: str = ""
    outputs: list = dataclasses.field(default_factory=list)  # per output: (axis, f) or None
    scans: list = dataclasses.field(default_factory=list)  # foreach nodes over the batch
    batched: frozenset = frozenset()  # the nodes whose values have the batch axis


def batch_axes(graph, batched: dict, size: int) -> BatchAxes:
    """Pure: follow the batch axis of ``batched`` (input node -> axis, each of extent
    ``size``) through ``graph``."""
    try:
        state, scans = _walk(graph, {n: (a, 1) for n, a in batched.items()}, size, True)
    except NotSeparable as exc:
        return BatchAxes(False, str(exc))
    outs = []
    for o in graph.outputs:
        s = state.get(o)
        if s == UNIFORM:
            return BatchAxes(False, f"output %{o} is a constant fill whose batch axis is not "
                                    "known")
        outs.append(s)
    return BatchAxes(True, outputs=outs, scans=scans,
                     batched=frozenset(n for n, st in state.items()
                                       if st is not None and st != UNIFORM))


def batch_states(graph, batched: dict, size: int):
    """Pure: each node's batch state (``(axis, f)``, None, or UNIFORM) when ``batched``
    (input node -> axis, of extent ``size``) are a shape bucket's padded inputs, in a graph
    that may also *sum over* the batch (a training graph: a weight's gradient contracts the
    rows, a bias's sums them, an embedding's scatters them: batch-free results); None where
    rows mix otherwise, or a loop carries batch rows other than as a counted scan over them
    (which row-bounded programs could not serve: compiler/passes/row_bounds.py)."""
    try:  # (an input of ``f`` rows per example, a (T*N, C) residual: f = N)
        state, _ = _walk(graph, {n: (a, graph.spec(n).shape[a] // size)
                                 for n, a in batched.items()}, size, True, sums=True)
    except NotSeparable:
        return None
    return state


def _where(graph, n) -> str:
    w = graph.node(n).get("where")
    return f" (at {w[0]}:{w[1]})" if w and len(w) >= 2 else ""


def _walk(graph, state: dict, size: int, top: bool, sums: bool = False):
    scans = []
    for n in graph.topo_order():
        op = graph.op(n)
        if op in ("input", "param", "const"):
            state.setdefault(n, None)
            continue
        args = graph.args(n)
        sts = [state.get(a.id) if isinstance(a, NodeRef) else None for a in args]
        try:
            state[n] = _rule(graph, n, op, args, sts, size, state, scans, top, sums)
        except NotSeparable as exc:
            raise NotSeparable(f"{op}{_where(graph, n)}: {exc}") from None
    return state, scans


def _spec(graph, a):
    return graph.spec(a.id) if isinstance(a, NodeRef) else None


def _aligned(graph, n, args, sts, size):
    """Elementwise/broadcast: the batched arguments' axes, aligned on the output's."""
    out_nd = graph.spec(n).ndim
    axis = None
    for a, s in zip(args, sts):
        if isinstance(s, tuple):
            ax = (out_nd - _spec(graph, a).ndim + s[0], s[1])
            if axis is not None and ax != axis:
                raise NotSeparable("its operands carry the batch on different axes")
            axis = ax
    if axis is None:
        return UNIFORM if UNIFORM in sts else None
    for a, s in zip(args, sts):  # a batch-free array spanning the batch axis: rows baked in
        if s is None and isinstance(a, NodeRef):
            spec = _spec(graph, a)
            j = axis[0] - (out_nd - spec.ndim)
            if 0 <= j < spec.ndim and spec.shape[j] != 1:
                raise NotSeparable(f"a batch-free value of shape {spec.shape} meets the batch "
                                   f"axis {axis[0]} (a captured constant with one row per "
                                   "example?)")
    return axis


def _rule(graph, n, op, args, sts, size, state, scans, top, sums=False):
    kind = REGISTRY[op].kind if op in REGISTRY else None
    attrs = graph.node(n)["attrs"]
    if op in ("random_normal", "random_uniform", "random_randint"):
        raise NotSeparable("a random draw (padding would change the numbers drawn)")
    if op in ("full", "arange"):
        return UNIFORM
    if all(s is None or s == UNIFORM for s in sts) and op not in ("foreach", "cond", "nth",
                                                                   "while_loop"):
        return UNIFORM if UNIFORM in sts else None
    if kind == "elementwise" or op == "broadcast_to":
        return _aligned(graph, n, args, sts, size)
    if kind == "reduce":
        (s,) = [x for x in sts if isinstance(x, tuple)]
        nd = _spec(graph, args[0]).ndim
        axes = normalize_axis(attrs.get("axis"), nd, op)
        if s[0] in axes:
            if sums and op == "sum":
                return None
            raise NotSeparable("it reduces over the batch axis")
        return s if attrs.get("keepdims") else (s[0] - sum(a < s[0] for a in axes), s[1])
    if op == "transpose":
        axes = attrs.get("axes") or tuple(reversed(range(graph.spec(n).ndim)))
        return (list(axes).index(sts[0][0]), sts[0][1])
    if op == "reshape":
        return _reshape(graph, args[0], n, sts[0], size)
    if op in ("slice", "slice_scatter"):  # the whole batch axis, or rows would move
        ax, f = sts[0]
        extent = (attrs["shape"] if op == "slice_scatter" else _spec(graph, args[0]).shape)[ax]
        b, e, st = attrs["begin"][ax], attrs["end"][ax], attrs["step"][ax]
        if not (b in (0, None) and (e is None or e >= extent) and st in (1, None)):
            raise NotSeparable("it slices along the batch axis")
        return sts[0]
    if op == "concatenate":
        axis = attrs.get("axis", 0)
        if axis is None:
            raise NotSeparable("it flattens the batch into one axis")
        got = _aligned(graph, n, args, sts, size)
        if isinstance(got, tuple) and got[0] == axis % graph.spec(n).ndim:
            raise NotSeparable("it concatenates along the batch axis")
        return got
    if op == "matmul":
        if sums and _contracts_batch(graph, args, sts):
            return None
        return _matmul(graph, args, sts)
    if sums and op == "take_grad" and isinstance(sts[1], tuple) and \
            isinstance(sts[0], tuple) and sts[0][0] == sts[1][0] == 0:
        return None  # the rows scattered into a table
    if op in ("conv2d", "pool2d"):
        if sts[0] != (0, 1) or any(isinstance(s, tuple) for s in sts[1:]):
            raise NotSeparable("only its data may carry the batch, on axis 0")
        return (0, 1)
    if op == "take":
        return _take(graph, args, sts, attrs)
    if op == "pick":
        ax = normalize_axis(attrs.get("axis", -1), _spec(graph, args[0]).ndim, op)[0]
        s = sts[0] if isinstance(sts[0], tuple) else None
        if s is None or s[0] == ax:
            raise NotSeparable("it picks along the batch axis")
        return s if attrs.get("keepdims") else (s[0] - (ax < s[0]), s[1])
    if op == "nth":
        return state[("results", args[0].id)][attrs["index"]]
    if op == "foreach":
        return _foreach(graph, n, args, sts, attrs, size, state, scans, top, sums)
    if sums and op in ("cond", "while_loop"):
        raise NotSeparable("a loop or branch carries batch rows")
    if op == "cond":
        return _cond(graph, n, args, sts, attrs, size, state)
    raise NotSeparable("its rows are not known to stay apart")


def _reshape(graph, a, n, s, size):
    ax, f = s
    src, dst = _spec(graph, a).shape, graph.spec(n).shape
    if ax == 0:  # each batch element owns a contiguous block: axis 0 of the result too?
        per = math.prod(src) // size if size else 0
        rest = math.prod(dst[1:])
        if dst and rest and per % rest == 0:
            return (0, per // rest)
    elif tuple(src[:ax + 1]) == tuple(dst[:ax + 1]):  # only the axes after it change
        return s
    raise NotSeparable(f"it reshapes {src} to {dst}, mixing the batch with other axes")


def _matmul(graph, args, sts):
    a, b = (_spec(graph, x) for x in args)
    out_nd = max(a.ndim, b.ndim)
    sa, sb = sts
    if isinstance(sa, tuple):
        if a.ndim == 1 or sa[0] == a.ndim - 1:
            raise NotSeparable("the batch is its contracted axis")
        got = (out_nd - 2, sa[1]) if sa[0] == a.ndim - 2 else (out_nd - a.ndim + sa[0], sa[1])
        if isinstance(sb, tuple):
            raise NotSeparable("both operands carry the batch")
        return got
    if b.ndim == 1 or sb[0] == b.ndim - 2:
        raise NotSeparable("the batch is its contracted axis")
    return (out_nd - 1, sb[1]) if sb[0] == b.ndim - 1 else (out_nd - b.ndim + sb[0], sb[1])


def _contracts_batch(graph, args, sts) -> bool:
    """Both operands of a 2-D product carry the batch on the axis it contracts (A^T B)."""
    a, b = (_spec(graph, x) for x in args)
    sa, sb = sts
    return isinstance(sa, tuple) and isinstance(sb, tuple) and a.ndim == b.ndim == 2 and \
        sa[0] == a.ndim - 1 and sb[0] == b.ndim - 2 and sa[1] == sb[1]


def _take(graph, args, sts, attrs):
    data, idx = (_spec(graph, x) for x in args)
    axis = attrs.get("axis", 0)
    axis = axis % data.ndim if data.ndim else 0
    sd, si = sts
    if isinstance(sd, tuple) and isinstance(si, tuple):
        raise NotSeparable("both its data and its indices carry the batch")
    if isinstance(si, tuple):
        return (axis + si[0], si[1])
    if sd[0] == axis:
        raise NotSeparable("it gathers along the batch axis")
    return (sd[0] if sd[0] < axis else sd[0] - 1 + idx.ndim, sd[1])


def _body(graph_body, in_states, size):
    st, inner = _walk(graph_body, dict(zip(graph_body.inputs, in_states)), size, False)
    if inner:
        raise NotSeparable("a loop inside a loop body scans over the batch")
    return [st.get(o) for o in graph_body.outputs]


def _foreach(graph, n, args, sts, attrs, size, state, scans, top, sums=False):
    nd, ns = attrs["n_data"], attrs["n_states"]
    if sums:  # a bucket's graph: only a counted scan over the padded axis carries rows
        if attrs.get("counted"):
            args, sts = args[1:], sts[1:]
        data = sts[:nd]
        if not (attrs.get("counted") and data and all(s == (0, 1) for s in data)):
            if any(isinstance(s, tuple) for s in sts):
                raise NotSeparable("a loop carries batch rows")
            state[("results", n)] = [None] * len(graph.node(n)["results"])
            return None
        if any(isinstance(s, tuple) for s in sts[nd:]):
            raise NotSeparable("a scan's states or captured values carry batch rows")
        res = graph.node(n)["results"]
        n_out = len(res) - 2 * ns  # outputs stacked per step, final states, states seq
        state[("results", n)] = [(0, 1)] * n_out + [None] * ns + [(0, 1)] * ns
        return None
    if attrs.get("counted") or attrs.get("reverse") or attrs.get("vjp") is not None:
        raise NotSeparable("a counted or reverse scan")
    body = attrs["body"].graph
    n_out = len(body.outputs) - ns
    data, states, caps = sts[:nd], sts[nd:nd + ns], sts[nd + ns:]
    if any(isinstance(s, tuple) and s[0] == 0 for s in data):  # scanning over the batch
        if not top or any(s != (0, 1) for s in data) or \
                any(isinstance(s, tuple) for s in states + caps):
            raise NotSeparable("it scans over the batch axis together with other batched "
                               "values")
        scans.append(n)
        res = [(0, 1)] * n_out + [None] * ns + [(0, 1)] * ns
    else:
        rows = [None if not isinstance(s, tuple) else (s[0] - 1, s[1]) for s in data]
        outs = _body(body, rows + list(states) + list(caps), size)
        if [_norm(s) for s in outs[n_out:]] != [_norm(s) for s in states]:
            raise NotSeparable("its states change batch axis from step to step")
        res = [None if not isinstance(s, tuple) else (s[0] + 1, s[1]) for s in outs[:n_out]]
        res += list(states) + [None if not isinstance(s, tuple) else (s[0] + 1, s[1])
                               for s in states]
    state[("results", n)] = res
    return None


def _cond(graph, n, args, sts, attrs, size, state):
    if isinstance(sts[0], tuple):
        raise NotSeparable("its predicate depends on the batch")
    outs = [_body(attrs[k].graph, list(sts[1:]), size) for k in ("then_body", "else_body")]
    if [_norm(s) for s in outs[0]] != [_norm(s) for s in outs[1]]:
        raise NotSeparable("its branches carry the batch differently")
    state[("results", n)] = outs[0]
    return None


def _norm(s):
    return None if s == UNIFORM else s
