"""resize: the same graph at another batch size, where its rows stay apart.

A loop body whose rows never mix (an LSTM step: row ``b`` of its new state comes from row
``b`` of its input and state, and from the weights) computes the same rows on any slice of
the batch. ``resize_batch`` gives that body at ``size`` rows, so several threads can each run
the whole loop over a slice of the batch (compiler/control_flow.py), with no barrier per
step. Pure: batch_axis.py follows the batch through the graph (and says no where rows
mix); every shape attribute along the batch is rescaled and every type inferred again, and
the result must have, node by node, the original's types with the batch axis rescaled (a
captured value that secretly carried the batch would change some other dimension: no).
"""
from __future__ import annotations

from ..graph import Graph, NodeRef
from ..ops import Spec, infer_types
from .batch_axis import UNIFORM, NotSeparable, _walk


class NotResizable(Exception):
    """The graph's rows mix, or its shapes do not follow the batch (the message says why)."""


# ops whose "shape" attribute spans the batch axis of their result
_SHAPE_ATTR_OPS = ("reshape", "broadcast_to", "slice_scatter")


def resize_batch(graph: Graph, batched: list, size: int) -> Graph:
    """``graph`` with each input in ``batched`` (node ids, the batch on axis 0) at ``size``
    rows; every output must carry the batch on axis 0 too. Raises NotResizable."""
    old = graph.spec(batched[0]).shape[0] if batched else 0
    if not batched or any(graph.spec(n).ndim == 0 or graph.spec(n).shape[0] != old
                          for n in batched) or size < 1:
        raise NotResizable("the batched inputs must share a leading batch axis")
    try:
        state, scans = _walk(graph, {n: (0, 1) for n in batched}, old, False)
    except NotSeparable as exc:
        raise NotResizable(str(exc)) from None
    if scans:
        raise NotResizable("a loop inside scans over the batch")
    for o in graph.outputs:
        if state.get(o) != (0, 1):
            raise NotResizable(f"output %{o} does not carry the batch on axis 0")
    g = graph.copy()
    for n in graph.topo_order():
        d = g.node(n)
        op, s = d["op"], state.get(n)
        if op in ("input", "param", "const"):
            if n in batched:
                d["spec"] = _scaled(d["spec"], (0, 1), size)
            continue
        if op in ("foreach", "while_loop", "cond") or s == UNIFORM and \
                old in graph.spec(n).shape:
            # a nested loop's bodies, or a fill whose rows are not known: not rescaled here
            raise NotResizable(f"{op} %{n} holds the batch in a way not rescaled")
        attrs = dict(d["attrs"])
        if isinstance(s, tuple):
            attrs = _rescale_attrs(op, attrs, s, size, graph, n)
        args = g.args(n)
        specs = [g.spec(a.id) if isinstance(a, NodeRef) else a for a in args]
        try:
            (spec,) = infer_types(op, specs, attrs)
        except Exception as exc:  # noqa: BLE001 - any refusal of the new types: not resizable
            raise NotResizable(f"{op} %{n} at {size} rows: {exc}") from None
        want = _scaled(graph.spec(n), s, size) if isinstance(s, tuple) else graph.spec(n)
        if spec != want:
            raise NotResizable(f"{op} %{n} gives {spec.shape} at {size} rows, not {want.shape}")
        d["attrs"], d["spec"] = attrs, spec
    return g


def _scaled(spec: Spec, s, size: int) -> Spec:
    axis, f = s
    shape = list(spec.shape)
    shape[axis] = size * f
    return Spec(tuple(shape), spec.dtype)


def _rescale_attrs(op, attrs, s, size, graph, n):
    axis, f = s
    if op in _SHAPE_ATTR_OPS and "shape" in attrs:
        shape = list(attrs["shape"])
        if len(shape) != graph.spec(n).ndim or -1 in shape:
            raise NotResizable(f"{op} %{n}: shape {tuple(shape)} not rescaled")
        shape[axis] = size * f
        attrs["shape"] = tuple(shape)
    if op in ("slice", "slice_scatter"):  # batch_axis allows the whole batch axis only
        end = list(attrs["end"])
        end[axis] = None
        attrs["end"] = tuple(end)
    return attrs
