"""memory: liveness intervals of materialized intermediates -> offsets in one arena.

Inputs, parameters and constants live outside the arena; graph outputs are fresh buffers
handed to the caller, never in the arena. A view (reshape/transpose/slice of a value in
memory) keeps its source alive until the view's last reader. An elementwise kernel may write
in place over an input that dies at that kernel when sizes and dtypes match.
"""
from __future__ import annotations

import numpy as np

from ..graph import SOURCE_OPS, Graph

ALIGN = 64


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(graph: Graph):
    g = graph.copy()
    if "schedule" not in g.meta:
        from .schedule import schedule  # noqa: PLC0415
        g, _ = schedule(g)
    info = g.meta["fusion"]
    groups = info["groups"]
    order = g.meta["schedule"]["order"]
    step_of = {gid: i for i, gid in enumerate(order)}
    outputs = set(g.outputs)

    def storage(gid):
        """The group whose buffer a value lives in (views alias their source)."""
        grp = groups[gid]
        while grp["kind"] == "view":
            (src,) = g.arg_ids(grp["nodes"][0])
            if g.op(src) in SOURCE_OPS:
                return None
            grp = groups[info["group_of"][src]]
        return grp["id"]

    last = {}
    for gid in order:
        members = set(groups[gid]["nodes"])
        for n in groups[gid]["nodes"]:
            for a in g.arg_ids(n):
                if g.op(a) in SOURCE_OPS or a in members:
                    continue
                s = storage(info["group_of"][a])
                if s is not None:
                    last[s] = max(last.get(s, -1), step_of[gid])
    buffers = {}
    for gid in order:
        grp = groups[gid]
        if grp["kind"] == "view" or grp["root"] in outputs:
            continue
        spec = g.spec(grp["root"])
        buffers[gid] = {"start": step_of[gid], "end": last.get(gid, step_of[gid]),
                        "bytes": _align(spec.size * np.dtype(spec.dtype).itemsize),
                        "dtype": spec.dtype, "size": spec.size}
    live: list = []  # (end, offset, bytes, gid)
    offsets, inplace = {}, []
    arena = 0
    peak = cur = 0
    for gid in order:
        if gid not in buffers:
            continue
        b = buffers[gid]
        step = b["start"]
        # values whose last reader ran before this step are dead now
        live = [x for x in live if x[0] >= step]
        cur = sum(x[2] for x in live) + b["bytes"]
        peak = max(peak, cur)
        choice = None
        if groups[gid]["kind"] == "elementwise":
            for x in live:  # in place over an input of this kernel dying here
                src = buffers[x[3]]
                if x[0] == step and src["bytes"] == b["bytes"] and src["dtype"] == b["dtype"] \
                        and src["size"] == b["size"] and _reads(g, groups[gid], x[3], info):
                    choice = x[1]
                    inplace.append((gid, x[3]))
                    live.remove(x)
                    cur -= b["bytes"]
                    break
        if choice is None:
            choice = _first_fit(live, b["bytes"])
        offsets[gid] = choice
        arena = max(arena, choice + b["bytes"])
        live.append((b["end"], choice, b["bytes"], gid))
    naive = sum(b["bytes"] for b in buffers.values())
    g.meta["memory"] = {"offsets": offsets, "buffers": buffers, "arena_bytes": arena,
                        "naive_bytes": naive, "peak_bytes": peak, "inplace": inplace}
    return g, {"naive_bytes": naive, "arena_bytes": arena, "peak_live_bytes": peak,
               "inplace": len(inplace),
               "summary": f"arena {arena} B for {len(buffers)} intermediate(s) "
                          f"(naive {naive} B, peak live {peak} B, {len(inplace)} in place)"}


def _reads(g, grp, src_gid, info):
    members = set(grp["nodes"])
    return any(info["group_of"].get(a) == src_gid for n in grp["nodes"] for a in g.arg_ids(n)
               if a not in members)


def _first_fit(live, nbytes):
    spans = sorted((x[1], x[1] + x[2]) for x in live)
    pos = 0
    for lo, hi in spans:
        if lo - pos >= nbytes:
            return pos
        pos = max(pos, hi)
    return pos


def check_plan(graph: Graph):
    """Raise AssertionError if two buffers with overlapping lifetimes share memory."""
    mem = graph.meta["memory"]
    items = [(gid, b, mem["offsets"][gid]) for gid, b in mem["buffers"].items()]
    inplace = {(a, b) for a, b in mem["inplace"]} | {(b, a) for a, b in mem["inplace"]}
    for i, (ga, a, oa) in enumerate(items):
        for gb, b, ob in items[i + 1:]:
            if (ga, gb) in inplace:
                continue
            overlap_time = a["start"] <= b["end"] and b["start"] <= a["end"]
            overlap_mem = oa < ob + b["bytes"] and ob < oa + a["bytes"]
            if overlap_time and overlap_mem:
                raise AssertionError(f"buffers of kernels {ga} and {gb} are live together "
                                     f"but share arena bytes")
