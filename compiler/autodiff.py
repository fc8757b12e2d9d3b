"""Reverse-mode autodiff on graphs, with the registry's gradient rules.

``differentiate`` extends a forward graph with gradient nodes (a joint graph);
``split_joint`` cuts it into a forward-for-training graph that also returns the residuals
the backward needs, and a backward graph that takes residuals + output gradients.
The same gradient rules serve eager autograd: they are written over an op namespace ``F``.
"""
from __future__ import annotations

import dataclasses

import networkx as nx

from .graph import SOURCE_OPS, Graph, NodeRef
from .ops import REGISTRY, OpNamespace, Spec
from .ops.control import CONTROL_OPS


class Sym:
    """A graph value as gradient rules see it: ``.shape``, ``.dtype`` and a node id."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: Graph, nid: int):
        self.graph = graph
        self.id = nid

    @property
    def shape(self):
        return self.graph.spec(self.id).shape

    @property
    def dtype(self):
        return self.graph.spec(self.id).dtype


class GraphBuilder:
    """Applies registry ops by adding nodes (``F = OpNamespace(builder.apply)``)."""

    def __init__(self, graph: Graph, where=None, device="cpu(0)"):
        self.graph = graph
        self.where = where
        self.device = device
        self.F = OpNamespace(self.apply)

    def apply(self, name, args, attrs):
        conv = [NodeRef(a.id) if isinstance(a, Sym) else a for a in args]
        return Sym(self.graph, self.graph.add_op(name, conv, attrs, self.where, self.device))


def differentiate(graph: Graph, wrt: list[int]):
    """Add gradient nodes for d(outputs)/d(wrt) to a copy of ``graph``.

    Returns (joint, grad_inputs, grads, reached): ``grad_inputs`` are new input nodes holding
    each output's incoming gradient; ``grads[i]`` is the node of the gradient for ``wrt[i]``
    (a zero constant where no path exists); ``reached[i]``: whether a path exists (through
    differentiable ops), as eager autograd's backward reaches an array or not.
    """
    joint = graph.copy()
    b = GraphBuilder(joint)
    F = b.F
    grad_inputs = []
    acc: dict[int, Sym] = {}
    for i, o in enumerate(graph.outputs):
        gi = joint.add_input(joint.spec(o), f"grad_out{i}", joint.node(o)["device"])
        joint.inputs.remove(gi)  # not a forward input: tracked separately
        grad_inputs.append(gi)
        _acc(b, acc, o, Sym(joint, gi))
    need = set()
    for w in wrt:
        need |= nx.descendants(graph.g, w) | {w}
    results: dict[int, dict] = {}  # control node -> {result index: its cotangent}
    for n in reversed(graph.topo_order()):
        d = graph.node(n)
        if d["op"] == "nth":  # a control node's result: its rule sees all of them at once
            if n in acc and n in need:
                cot = results.setdefault(graph.arg_ids(n)[0], {})
                k = d["attrs"]["index"]
                cot[k] = acc[n] if k not in cot else _add_on(b, d.get("device", "cpu(0)"),
                                                              cot[k], acc[n])
            continue
        if d["op"] in CONTROL_OPS:
            if n not in results or n not in need:
                continue
            g_out = [results[n].get(k) for k in range(len(d["results"]))]
        elif d["op"] in SOURCE_OPS or n not in acc or n not in need:
            continue
        else:
            g_out = acc[n]
        op = REGISTRY[d["op"]]
        if op.grad is None:
            continue
        b.where, b.device = d.get("where"), d.get("device", "cpu(0)")
        args = [Sym(joint, a.id) if isinstance(a, NodeRef) else a for a in graph.args(n)]
        in_grads = op.grad(F, args, Sym(joint, n), g_out, **d["attrs"])
        for a, g in zip(args, in_grads):
            if g is None or not isinstance(a, Sym) or a.id not in need:
                continue
            _acc(b, acc, a.id, g)
    grads = []
    for w in wrt:
        if w in acc:
            grads.append(acc[w].id)
        else:
            spec = graph.spec(w)
            b.device = graph.node(w).get("device", "cpu(0)")  # a zero beside its input
            grads.append(b.apply("full", (), {"shape": spec.shape, "value": 0.0,
                                              "dtype": spec.dtype}).id)
    return joint, grad_inputs, grads, [w in acc for w in wrt]


def _acc(b, acc, nid, g):
    """Add ``g`` to the gradient of node ``nid``, on that node's device: a sum of two
    gradient paths (a body's output that is also its next state; a value read on two
    devices) is made where the value lives, never on the builder's default device."""
    acc[nid] = g if nid not in acc else \
        _add_on(b, b.graph.node(nid).get("device", "cpu(0)"), acc[nid], g)


def _add_on(b, device, x, y):
    """x + y made by builder ``b`` on ``device`` (its own device left as it was)."""
    saved, b.device = b.device, device
    try:
        return b.F.add(x, y)
    finally:
        b.device = saved


VIEW_OPS = ("reshape", "transpose", "broadcast_to", "slice")


def _view_chain(graph: Graph, n) -> list:
    """[n, ...] if n is views all the way down to an input or parameter, else []."""
    chain = []
    while graph.op(n) in VIEW_OPS:
        chain.append(n)
        (n,) = graph.arg_ids(n)
    return chain if chain and graph.op(n) in ("input", "param") else []


@dataclasses.dataclass
class TrainingGraphs:
    """A forward graph returning outputs + residuals, and the matching backward graph.

    backward inputs: residuals (in ``residuals`` order; forward node ids) then one gradient
    per forward output; backward outputs: one gradient per ``wrt`` entry (zeros for one the
    outputs do not reach: ``reached`` says which, so that a caller can leave it alone, as
    eager autograd leaves an array its backward never reaches).
    """
    forward: Graph
    backward: Graph
    residuals: list  # forward node ids the backward reads (inputs, params or computed)
    n_outputs: int
    reached: list = dataclasses.field(default_factory=list)  # per wrt entry


def expose_results(graph: Graph) -> Graph:
    """``graph`` with an nth node for every result of every control node: the results a
    control node's gradient reads back (the states each step started from) are then
    forward values, which ``split_joint`` passes to the backward as residuals."""
    if not any(graph.op(n) in CONTROL_OPS for n in graph.g.nodes):
        return graph
    graph = graph.copy()
    for n in [n for n in graph.topo_order() if graph.op(n) in CONTROL_OPS]:
        have = {graph.node(u)["attrs"]["index"] for u in graph.users(n)
                if graph.op(u) == "nth"}
        d = graph.node(n)
        for k in range(len(d["results"])):
            if k not in have:
                graph.add_op("nth", [NodeRef(n)], {"index": k}, d.get("where"), d["device"])
    return graph


def split_joint(graph: Graph, wrt: list[int]) -> TrainingGraphs:
    from .control_flow import training_form  # noqa: PLC0415 - control_flow imports autodiff
    graph = expose_results(training_form(graph))
    joint, grad_inputs, grads, reached = differentiate(graph, wrt)
    g = joint.g
    fwd_nodes = set(graph.g.nodes)
    needed = set(grads)
    for gr in grads:
        needed |= nx.ancestors(g, gr)
    bwd_set = {n for n in needed if n not in fwd_nodes and n not in grad_inputs}
    # a view of an input or parameter (the transposed weight, the flattened input) is
    # recomputed in the backward instead of being saved: it costs nothing there
    for n in list(bwd_set):
        for a in joint.arg_ids(n):
            chain = _view_chain(joint, a)
            if chain:
                bwd_set.update(chain)
    bwd_nodes = [n for n in joint.topo_order() if n in bwd_set]
    residuals = []
    for n in bwd_nodes:
        for a in joint.arg_ids(n):
            if a in fwd_nodes and a not in bwd_set and a not in residuals and \
                    joint.op(a) != "const":
                residuals.append(a)
    for gr in grads:
        if gr in fwd_nodes and gr not in bwd_set and gr not in residuals and \
                joint.op(gr) != "const":
            residuals.append(gr)
    # forward: the original outputs, then computed residuals
    forward = graph.copy()
    forward.name = f"{graph.name}_fwd"
    computed = [r for r in residuals if forward.op(r) not in ("input", "param")]
    forward.outputs = list(graph.outputs) + computed
    # backward: residuals and output gradients in, wrt gradients out
    backward = Graph(f"{graph.name}_bwd")
    remap: dict[int, int] = {}
    for r in residuals:
        remap[r] = backward.add_input(joint.spec(r), f"res%{r}", joint.node(r)["device"])
    for i, gi in enumerate(grad_inputs):
        remap[gi] = backward.add_input(joint.spec(gi), f"grad_out{i}", joint.node(gi)["device"])
    for n in joint.topo_order():
        if n in remap or not (n in needed or n in grads or n in bwd_set):
            continue
        if joint.op(n) == "const" or n in bwd_set:
            remap[n] = backward.copy_node(joint, n, remap)
    backward.outputs = [remap[gr] for gr in grads]
    return TrainingGraphs(forward, backward, residuals, len(graph.outputs), reached)


__all__ = ["Sym", "GraphBuilder", "differentiate", "split_joint", "TrainingGraphs", "Spec"]
