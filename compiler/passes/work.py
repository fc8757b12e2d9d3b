"""work: what one call of a graph costs, in multiply-adds (elements for elementwise ops).

An estimate for choices between plans (a shape bucket's padded work against the real
size's: hybrid/buckets.py), not a timing: each op's cost is the registry's (``op_work``), a
foreach body's counts once per step, a while_loop's or cond's bodies once. Pure.
"""
from __future__ import annotations

from ..ops.core import op_work


def graph_work(graph, batched=frozenset()) -> tuple:
    """(work of the nodes in ``batched``, of the other nodes outside loops, in loops)."""
    rows = other = inside = 0.0
    for n in graph.op_nodes():
        op = graph.op(n)
        attrs = graph.node(n)["attrs"]
        if op == "foreach":
            data = graph.spec(graph.arg_ids(n)[1 if attrs.get("counted") else 0])
            inside += (data.shape[0] if data.shape else 0) * sum(
                graph_work(attrs["body"].graph))
        elif op in ("while_loop", "cond"):
            inside += sum(sum(graph_work(b.graph)) for b in attrs.values()
                          if hasattr(b, "graph"))
        elif op != "nth":
            cost = op_work(op, graph.spec(n), [graph.spec(a) for a in graph.arg_ids(n)],
                           attrs)
            if n in batched:
                rows += cost
            else:
                other += cost
    return rows, other, inside
