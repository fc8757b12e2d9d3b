"""schedule: an order of the fused kernels that keeps peak memory low, and the lanes.

List scheduling over the kernel DAG: among the ready kernels, run the one that frees the
most bytes net of what it allocates (ties: program order). Kernels on different devices, and
kernels with no path between them, are independent: the report names the lanes per device
and the widest set of kernels that may run at once.
"""
from __future__ import annotations

import heapq

import networkx as nx

from ..graph import SOURCE_OPS, Graph


def _nbytes(spec):
    import numpy as np  # noqa: PLC0415
    return spec.size * np.dtype(spec.dtype).itemsize


def kernel_dag(graph: Graph):
    """The DAG of fusion groups (node -> group edges), from graph.meta['fusion']."""
    info = graph.meta["fusion"]
    dag = nx.DiGraph()
    for grp in info["groups"]:
        dag.add_node(grp["id"])
    for grp in info["groups"]:
        for n in grp["nodes"]:
            for a in graph.arg_ids(n):
                if graph.op(a) in SOURCE_OPS:
                    continue
                src = info["group_of"][a]
                if src != grp["id"]:
                    dag.add_edge(src, grp["id"])
    return dag


def schedule(graph: Graph):
    g = graph.copy()
    if "fusion" not in g.meta:
        from .fusion import fuse  # noqa: PLC0415
        g, _ = fuse(g)
    info = g.meta["fusion"]
    groups = info["groups"]
    dag = kernel_dag(g)
    reads: dict[int, set] = {}
    for grp in groups:
        members = set(grp["nodes"])
        reads[grp["id"]] = {info["group_of"][a] for n in grp["nodes"] for a in g.arg_ids(n)
                            if g.op(a) not in SOURCE_OPS and a not in members}
    readers_left = {gid: dag.out_degree(gid) for gid in dag.nodes}
    outputs = set(g.outputs)
    # outputs are handed to the caller, not held in the arena: they cost the plan nothing
    size = {grp["id"]: (0 if grp["kind"] == "view" or grp["root"] in outputs
                        else _nbytes(g.spec(grp["root"]))) for grp in groups}
    indeg = {gid: dag.in_degree(gid) for gid in dag.nodes}
    first = {grp["id"]: min(grp["nodes"]) for grp in groups}

    def score(gid):
        freed = sum(size[r] for r in reads[gid] if readers_left[r] == 1)
        return (size[gid] - freed, first[gid])

    ready = [(score(gid), gid) for gid in dag.nodes if indeg[gid] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, gid = heapq.heappop(ready)
        order.append(gid)
        for r in reads[gid]:
            readers_left[r] -= 1
        for nxt in dag.successors(gid):
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                heapq.heappush(ready, (score(nxt), nxt))
        # scores of ready kernels change as readers finish: re-rank
        ready = [(score(x), x) for _, x in ready]
        heapq.heapify(ready)
    lanes: dict[str, list] = {}
    for gid in order:
        dev = g.node(groups[gid]["root"])["device"]
        lanes.setdefault(dev, []).append(gid)
    level: dict[int, int] = {}
    for gid in order:
        level[gid] = 1 + max((level[p] for p in dag.predecessors(gid)), default=-1)
    width = max((sum(1 for v in level.values() if v == lv) for lv in set(level.values())),
                default=0)
    g.meta["schedule"] = {"order": order, "lanes": lanes, "width": width}
    return g, {"kernels": len(order), "lanes": {k: len(v) for k, v in lanes.items()},
               "parallel_width": width,
               "summary": f"{len(order)} kernels on {len(lanes)} device lane(s); up to "
                          f"{width} independent kernel(s) at once"}
