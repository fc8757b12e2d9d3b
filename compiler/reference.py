"""The reference executor: runs a graph with the registry's eager implementations.

The oracle every backend is compared against, and ``backend="reference"``.
"""
from __future__ import annotations

from .graph import Graph, NodeRef
from .ops import REGISTRY, eager_apply
from .ops.control import CONTROL_OPS

_TUPLE_OPS = frozenset(CONTROL_OPS + ("nth",))  # their values are Python tuples (or an item)


class ReferenceProgram:
    """A graph turned into a list of steps over value slots, freeing values after last use."""

    def __init__(self, graph: Graph):
        self.graph = graph
        order = graph.topo_order()
        slot = {n: i for i, n in enumerate(order)}
        self.n_slots = len(order)
        self.input_slots = [slot[n] for n in graph.inputs]
        self.param_slots = [slot[n] for n in graph.params]
        self.const_values = [(slot[n], graph.constants[graph.node(n)["attrs"]["name"]])
                             for n in order if graph.op(n) == "const"]
        self.output_slots = [slot[n] for n in graph.outputs]
        last_use = {}
        for n in order:
            for a in graph.arg_ids(n):
                last_use[a] = n
        keep = set(self.output_slots)
        self.steps = []
        for n in order:
            d = graph.node(n)
            if d["op"] in ("input", "param", "const"):
                continue
            args = [("s", slot[a.id]) if isinstance(a, NodeRef) else ("v", a)
                    for a in graph.args(n)]
            free = [slot[a] for a in dict.fromkeys(graph.arg_ids(n))
                    if last_use.get(a) == n and slot[a] not in keep]
            self.steps.append((d["op"], args, d["attrs"], (d["spec"],), slot[n], free))

    def __call__(self, xp, inputs, params):
        vals = [None] * self.n_slots
        for s, v in zip(self.input_slots, inputs):
            vals[s] = v
        for s, v in zip(self.param_slots, params):
            vals[s] = v
        for s, v in self.const_values:
            vals[s] = xp.asarray(v)
        for op, args, attrs, specs, out, free in self.steps:
            raw = [vals[i] if k == "s" else i for k, i in args]
            if op in _TUPLE_OPS:  # a control node's results, read by its nth nodes
                vals[out] = REGISTRY[op].impl(xp, *raw, **attrs)
            else:
                vals[out] = eager_apply(xp, op, raw, attrs, specs)[0]
            for f in free:
                vals[f] = None
        return [vals[s] for s in self.output_slots]


def run_reference(graph: Graph, inputs, params=(), xp=None):
    import numpy as np  # noqa: PLC0415
    return ReferenceProgram(graph)(xp or np, list(inputs), list(params))
