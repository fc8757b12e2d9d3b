"""index_checks: out-of-range indices raise in compiled code, as they do eagerly.

A ``take`` with ``mode="raise"`` (NumPy's default: indices in [-dim, dim)) cannot raise from
inside a kernel. This pass gives each one two extra graph outputs, the smallest and the
largest index, and a check the executable runs on them after every call: an index out of
range raises IndexError naming the op, the user's line, the index and the bound. The
kernels themselves read in-range indices as NumPy does (negative ones from the end) and stay
memory-safe for any index, so nothing is read out of bounds before the check reports it.

Target-neutral: every backend gets the same outputs and the same check.
"""
from __future__ import annotations

import dataclasses

from ..graph import Graph, NodeRef


@dataclasses.dataclass(frozen=True)
class IndexCheck:
    op: str
    where: tuple | None  # (file, line) of the take in the user's code
    axis: int
    dim: int
    low: int  # output position of min(indices)
    high: int  # output position of max(indices)

    def verify(self, low, high):
        bad = int(low) if int(low) < -self.dim else int(high) if int(high) >= self.dim \
            else None
        if bad is not None:
            at = f" (at {self.where[0]}:{self.where[1]})" if self.where else ""
            raise IndexError(f"{self.op}: index {bad} is out of bounds for axis {self.axis} "
                             f"with size {self.dim}{at}; pass mode='clip' or 'wrap' to "
                             "take() to clip or wrap indices instead")


def is_checked_gather(graph: Graph, n) -> bool:
    """A gather whose out-of-range index raises (take, mode='raise'): it can fail at run time."""
    return graph.op(n) == "take" and graph.node(n)["attrs"].get("mode", "clip") == "raise"


def add_index_checks(graph: Graph):
    """Graph -> (Graph, [IndexCheck]). Pure: the input graph is not modified; the checks'
    outputs come after the graph's own."""
    takes = [n for n in graph.op_nodes() if is_checked_gather(graph, n)]
    if not takes:
        return graph, []
    g = graph.copy()
    checks = []
    for n in takes:
        x, idx = g.arg_ids(n)
        if g.spec(idx).size == 0:
            continue
        d = g.node(n)
        ndim = len(g.spec(x).shape)
        axis = d["attrs"].get("axis", 0) % ndim
        low = g.add_op("min", [NodeRef(idx)], {"axis": None, "keepdims": False},
                       d.get("where"), d["device"])
        high = g.add_op("max", [NodeRef(idx)], {"axis": None, "keepdims": False},
                        d.get("where"), d["device"])
        checks.append(IndexCheck("take", d.get("where"), axis, g.spec(x).shape[axis],
                                 len(g.outputs), len(g.outputs) + 1))
        g.outputs = g.outputs + [low, high]
    return g, checks


def checked_run(run, checks, n_outputs):
    """``run`` followed by the checks, returning only the graph's own outputs."""
    def run_checked(xp, inputs, params):
        outs = run(xp, inputs, params)
        for c in checks:
            c.verify(outs[c.low], outs[c.high])
        return outs[:n_outputs]
    return run_checked
