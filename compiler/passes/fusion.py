"""fusion: decide which values live in memory, then group the rest into kernels.

First the materialization decision, value by value, with the rule that decided it; then
every op node joins a group whose single materialized root is the group's output:

- 'elementwise': a chain/tree of elementwise ops evaluated in one loop nest; on a GPU, a
  value in it that is also a graph output (a training forward's saved residual: an LSTM
  cell's gates) is stored by the same loop as a second output (``extra_outputs``) instead
  of a kernel of its own whose result the rest of the chain reads back;
- 'reduce': a reduction with its elementwise prologue;
- 'extern': matmul/conv/pool with an elementwise epilogue applied in place (bias + ReLU);
- 'view': reshape/transpose/broadcast/slice of a value already in memory (an access map,
  no kernel);
- 'movement' / 'index': a data-movement or gather kernel of its own.

The graph is unchanged; the decision is stored in ``graph.meta["fusion"]``.
"""
from __future__ import annotations

from runtime import config

from ..graph import SOURCE_OPS, Graph
from ..ops import REGISTRY

_log = config.logger("fusion")
VIEW_OPS = ("reshape", "transpose", "broadcast_to", "slice")
CHEAP_TO_RECOMPUTE = ("full", "arange")
EPILOGUE_OF = ("matmul", "conv2d")
# Devices whose kernels store saved values from their consumer's loop (stored_in_consumer).
# A GPU pays a launch (and a step's host work) per kernel: an LSTM cell's training forward is
# one kernel instead of seven per time step. Not on a CPU: there a call costs little, and the
# one long loop body holds more constants than AVX2 has registers (spills), measured ~10%
# slower than the chain split at its saved values (the cell at 16-256 rows on the dev box).
STORED_IN_CONSUMER_ON = ("gpu",)


def _kind(graph, n):
    op = graph.op(n)
    return "source" if op in SOURCE_OPS else REGISTRY[op].kind


def materialization(graph: Graph):
    """{node: rule} for every op node that must be in memory, and the refusals to log."""
    must: dict[int, str] = {}
    refused = []
    outputs = set(graph.outputs)
    for n in graph.op_nodes():
        kind = _kind(graph, n)
        users = graph.users(n)
        dev = graph.node(n)["device"]
        if n in outputs:
            must[n] = "graph output"
        elif kind in ("extern", "index", "reduce"):
            must[n] = f"{kind} result"
        elif kind == "movement" or kind == "source" and graph.op(n) not in CHEAP_TO_RECOMPUTE:
            must[n] = f"{kind} result"
        elif len(users) > 1:  # inlined into each, a value would join their groups into one
            must[n] = f"used by {len(users)} consumers"
        elif not users:
            must[n] = "unused"
        else:
            (u,) = users
            ukind = _kind(graph, u)
            if graph.node(u)["device"] != dev:
                must[n] = f"consumer %{u} is on another device"
            elif ukind not in ("elementwise", "reduce"):
                must[n] = f"consumer %{u} ({graph.op(u)}) is an {ukind} op that reads memory"
            elif ukind == "elementwise" and graph.spec(u).size != graph.spec(n).size:
                must[n] = (f"consumer %{u} broadcasts it ({graph.spec(n)} -> {graph.spec(u)}): "
                           "fusing would recompute it per output element")
        if n in must and users and kind == "elementwise":
            refused.append((n, users, must[n]))
    return must, refused


def stored_in_consumer(graph: Graph, must) -> dict:
    """{node: its consumer}: elementwise values in memory only because they are graph
    outputs, whose one consumer on the same device is an elementwise op of the same shape
    (on a device of STORED_IN_CONSUMER_ON) or a reduction of it (on any device: its loop
    body stays short; a softmax cross-entropy's exp, saved for the backward and summed).
    Such a value is computed in its consumer's loop and stored there as an extra output:
    one kernel instead of one that writes it and one that reads it back."""
    out = {}
    for n, why in must.items():
        if why != "graph output" or _kind(graph, n) != "elementwise":
            continue
        users = graph.users(n)
        if len(users) != 1:
            continue
        (u,) = users
        if graph.node(u)["device"] != graph.node(n)["device"]:
            continue
        ukind = _kind(graph, u)
        if ukind == "elementwise" and graph.spec(u).shape == graph.spec(n).shape and \
                str(graph.node(n)["device"]).startswith(STORED_IN_CONSUMER_ON) or \
                ukind == "reduce":  # (an argmax's group stores none: fuse() unstores it)
            out[n] = u
    return out


def fuse(graph: Graph):
    """Graph -> (Graph, report); the groups go to ``graph.meta['fusion']``."""
    g = graph.copy()
    must0, refused0 = materialization(g)
    stored = stored_in_consumer(g, must0)
    while True:
        must = dict(must0)
        refused = [r for r in refused0 if r[0] not in stored]
        out_groups, group_of, epilogue_hits = _group(g, must, refused, stored)
        # only a loop or a reduction stores extra outputs: a saved value whose consumer's
        # group became an extern's epilogue or an argmax keeps a kernel of its own
        unstored = {m for grp in out_groups for m in grp["extra_outputs"]
                    if grp["kind"] not in ("elementwise", "reduce")
                    or g.op(grp["root"]) in ("argmax", "argmin")}
        if not unstored:
            break
        stored = {n: u for n, u in stored.items() if n not in unstored}
    for n, users, why in refused:
        if config.log_enabled("fusion"):
            _log.info("not fusing %%%d (%s) into %s: %s", n, g.op(n),
                      ", ".join(f"%{u}" for u in users), why)
    g.meta["fusion"] = {"groups": out_groups, "group_of": group_of,
                        "materialized": dict(must), "refused": refused,
                        "epilogues": epilogue_hits}
    n_extra = sum(len(grp["extra_outputs"]) for grp in out_groups)
    kernels = [grp for grp in out_groups if grp["kind"] != "view"]
    return g, {"kernels": len(kernels), "groups": len(out_groups),
               "summary": f"{len(g.op_nodes())} op nodes -> {len(kernels)} kernel(s) "
                          f"({sum(1 for k in kernels if k['kind'] == 'extern')} extern, "
                          f"{len(epilogue_hits)} fused epilogue(s), "
                          f"{n_extra} extra output(s), "
                          f"{sum(1 for x in out_groups if x['kind'] == 'view')} view(s))"}


def _group(g: Graph, must: dict, refused: list, stored: dict):
    """Union the op nodes into kernels given the values in memory (``must``, updated where
    a merge is refused) and the saved values ``stored`` in their consumers' loops:
    (groups, group_of, epilogues)."""
    parent: dict[int, int] = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    order = g.op_nodes()
    epilogue_hits = []
    has_extern: dict[int, bool] = {}  # group root -> holds an extern (at most one per kernel)

    def merge(a, n, why_not):
        ra, rn = find(a), find(n)
        if ra == rn:
            return True
        if has_extern.get(ra) and has_extern.get(rn):
            must[a] = why_not
            refused.append((a, [n], why_not))
            return False
        parent[ra] = rn
        has_extern[rn] = has_extern.get(rn, False) or has_extern.get(ra, False)
        return True

    for n in order:
        parent.setdefault(n, n)
        kind = _kind(g, n)
        has_extern[n] = kind == "extern" or g.op(n) in ("argmax", "argmin")
        for a in dict.fromkeys(g.arg_ids(n)):
            if g.op(a) in SOURCE_OPS:
                continue
            if a not in must and kind == "reduce" and has_extern.get(find(a)):
                # an extern kernel's group ends in an in-place elementwise epilogue over its
                # output; a reduction of that output reads it from memory
                must[a] = (f"consumer %{n} ({g.op(n)}) reduces it, and it ends an extern "
                           "kernel's epilogue")
                refused.append((a, [n], must[a]))
            elif a not in must and kind in ("elementwise", "reduce"):
                merge(a, n, "joining it would put two extern kernels in one group")
            elif stored.get(a) == n and not has_extern.get(find(a)):
                merge(a, n, "joining it would put two extern kernels in one group")
            elif (kind == "elementwise" and g.op(a) in EPILOGUE_OF and
                  g.users(a) == [n] and a not in g.outputs and
                  g.spec(a).size == g.spec(n).size and
                  g.node(a)["device"] == g.node(n)["device"] and
                  _group_root_is(find(a), a, parent, find) and
                  merge(a, n, "the consumer already ends another extern's epilogue")):
                epilogue_hits.append((a, n))  # n becomes the epilogue of extern a
                must.pop(a, None)
    groups: dict[int, list[int]] = {}
    for n in order:
        groups.setdefault(find(n), []).append(n)
    out_groups = []
    group_of = {}
    for root, members in groups.items():
        ops = [g.op(m) for m in members]
        kinds = {_kind(g, m) for m in members}
        if any(o in EPILOGUE_OF for o in ops):
            kind = "extern"
        elif "extern" in kinds:
            kind = "extern"
        elif "reduce" in kinds:
            kind = "reduce"
        elif len(members) == 1 and ops[0] in VIEW_OPS and all(
                g.op(a) in SOURCE_OPS or a in must for a in g.arg_ids(members[0])):
            kind = "view"
        elif kinds <= {"elementwise", "source"}:
            kind = "elementwise"
        else:
            kind = kinds.pop()
        gid = len(out_groups)
        extra = [m for m in members if m != root and stored.get(m) is not None]
        out_groups.append({"id": gid, "kind": kind, "nodes": members, "root": root,
                           "ops": ops, "reason": must.get(root, "group output"),
                           "extra_outputs": extra})
        for m in members:
            group_of[m] = gid
    return out_groups, group_of, epilogue_hits


def _group_root_is(root, node, parent, find):
    """The extern's group has not been extended yet (one epilogue chain per extern)."""
    return root == node


def describe(graph: Graph) -> str:
    """One line per kernel: its kind, ops and why its output is in memory."""
    info = graph.meta.get("fusion")
    if not info:
        return "(fusion has not run)"
    lines = []
    for grp in info["groups"]:
        if grp["kind"] == "view":
            continue
        ops = " -> ".join(grp["ops"])
        extra = "".join(f", %{m}" for m in grp.get("extra_outputs", ()))
        lines.append(f"  kernel {grp['id']} [{grp['kind']}] {ops}  => %{grp['root']}{extra} "
                     f"({grp['reason']})")
    return "\n".join(lines)
