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
    end = len(order)
    out_backed = {}  # storage group -> the output that is a reshape of it: written in place
    for o in g.outputs:
        if g.op(o) in SOURCE_OPS or groups[info["group_of"][o]]["kind"] != "view":
            continue
        s = storage(info["group_of"][o])
        if s is None:
            continue
        if _reshape_chain(g, o, groups[s]["root"]) and groups[s]["root"] not in outputs \
                and s not in out_backed:
            out_backed[s] = o
        else:  # any other view output is copied out at the end: keep its storage alive
            last[s] = end
    buffers = {}
    for gid in order:
        grp = groups[gid]
        if grp["kind"] == "view" or grp["root"] in outputs or gid in out_backed:
            continue
        spec = g.spec(grp["root"])
        buffers[gid] = {"start": step_of[gid], "end": last.get(gid, step_of[gid]),
                        "bytes": _align(spec.size * np.dtype(spec.dtype).itemsize),
                        "dtype": spec.dtype, "size": spec.size}
    # 1. in place: an elementwise kernel writes over an input that dies at that kernel
    inplace = []
    share = {}  # gid -> the gid whose memory it reuses (chains resolve to one owner)
    live_at: dict = {}
    for gid in order:
        if gid not in buffers:
            continue
        b = buffers[gid]
        step = b["start"]
        if groups[gid]["kind"] == "elementwise":
            for src_gid, src in buffers.items():
                owner = share.get(src_gid, src_gid)
                if src["end"] == step and src_gid != gid and src["bytes"] == b["bytes"] and \
                        src["dtype"] == b["dtype"] and src["size"] == b["size"] and \
                        src["start"] < step and live_at.get(owner) == src_gid and \
                        _reads(g, groups[gid], src_gid, info):
                    inplace.append((gid, src_gid))
                    share[gid] = owner
                    break
        live_at[share.get(gid, gid)] = gid
    # 2. one interval per owner: its whole chain of in-place users
    spans = {}
    for gid, b in buffers.items():
        owner = share.get(gid, gid)
        lo, hi, nb = spans.get(owner, (b["start"], b["end"], b["bytes"]))
        spans[owner] = (min(lo, b["start"]), max(hi, b["end"]), max(nb, b["bytes"]))
    # 3. place the biggest first, each at the lowest offset free during its lifetime
    placed = []  # (start, end, offset, bytes)
    owner_off = {}
    for owner, (lo, hi, nb) in sorted(spans.items(), key=lambda kv: (-kv[1][2], kv[1][0])):
        busy = sorted((o, o + n) for a, z, o, n in placed if a <= hi and lo <= z)
        off = 0
        for b0, b1 in busy:
            if b0 - off >= nb:
                break
            off = max(off, b1)
        owner_off[owner] = off
        placed.append((lo, hi, off, nb))
    offsets = {gid: owner_off[share.get(gid, gid)] for gid in buffers}
    arena = max((o + n for _, _, o, n in placed), default=0)
    peak = 0
    for step in range(len(order)):
        peak = max(peak, sum(nb for lo, hi, nb in spans.values() if lo <= step <= hi))
    naive = sum(b["bytes"] for b in buffers.values())
    g.meta["memory"] = {"offsets": offsets, "buffers": buffers, "arena_bytes": arena,
                        "out_backed": out_backed,
                        "naive_bytes": naive, "peak_bytes": peak, "inplace": inplace}
    return g, {"naive_bytes": naive, "arena_bytes": arena, "peak_live_bytes": peak,
               "inplace": len(inplace),
               "summary": f"arena {arena} B for {len(buffers)} intermediate(s) "
                          f"(naive {naive} B, peak live {peak} B, {len(inplace)} in place)"}


def _reshape_chain(g, node, root) -> bool:
    """node is root seen through reshapes only (the same bytes in the same order)."""
    while node != root:
        if g.op(node) != "reshape":
            return False
        (node,) = g.arg_ids(node)
    return True


def _reads(g, grp, src_gid, info):
    members = set(grp["nodes"])
    return any(info["group_of"].get(a) == src_gid for n in grp["nodes"] for a in g.arg_ids(n)
               if a not in members)


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
