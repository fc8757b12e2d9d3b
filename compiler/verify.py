"""The graph verifier: run between passes when HYBRID_CHECK=1 (on under pytest)."""
from __future__ import annotations

import networkx as nx

from .graph import SOURCE_OPS, Graph, GraphError, NodeRef
from .ops import REGISTRY, OpError, infer_types
from .ops.control import TUPLE_SPEC


def verify(graph: Graph, where: str = "") -> None:
    """Raise GraphError unless the graph is acyclic, uses registered ops with consistent
    types and argument positions, and its inputs/params/outputs exist."""
    ctx = f" (after {where})" if where else ""
    g = graph.g
    if not nx.is_directed_acyclic_graph(g):
        raise GraphError(f"graph {graph.name} has a cycle{ctx}")
    for n in list(graph.inputs) + list(graph.params) + list(graph.outputs):
        if n not in g:
            raise GraphError(f"graph {graph.name}: node %{n} is listed as an input, param or "
                             f"output but is not in the graph{ctx}")
    for n, d in g.nodes(data=True):
        op = d["op"]
        if op in SOURCE_OPS:
            if g.in_degree(n):
                raise GraphError(f"%{n} ({op}) has inputs{ctx}")
            continue
        if op not in REGISTRY:
            raise GraphError(f"%{n} uses unknown op {op!r}{ctx}")
        args = graph.args(n)
        if any(a is None for a in args):
            raise GraphError(f"%{n} ({op}) has a gap in its argument positions{ctx}")
        if op == "nth":  # typed by the control node it reads
            src = graph.arg_ids(n)
            results = g.nodes[src[0]].get("results") if len(src) == 1 else None
            k = d["attrs"].get("index")
            if results is None or type(k) is not int or not 0 <= k < len(results) or \
                    results[k] != d["spec"]:
                raise GraphError(f"%{n} (nth) does not read result {k!r} of a control-flow "
                                 f"node with its type{ctx}")
            continue
        specs = [graph.spec(a.id) if isinstance(a, NodeRef) else a for a in args]
        if REGISTRY[op].kind == "control":
            try:
                out = infer_types(op, specs, d["attrs"])
            except OpError as exc:
                raise GraphError(f"%{n} ({op}) fails its type rule{ctx}: {exc}") from None
            if tuple(out) != tuple(d.get("results") or ()) or d["spec"] != TUPLE_SPEC:
                raise GraphError(f"%{n} ({op}) is typed {d.get('results')} but its rule "
                                 f"gives {list(map(str, out))}{ctx}")
            continue
        try:
            out = infer_types(op, specs, d["attrs"])
        except OpError as exc:
            raise GraphError(f"%{n} ({op}) fails its type rule{ctx}: {exc}") from None
        if out[0] != d["spec"]:
            raise GraphError(f"%{n} ({op}) is typed {d['spec']} but its rule gives "
                             f"{out[0]}{ctx}")
