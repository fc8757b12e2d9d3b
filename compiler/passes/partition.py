"""partition: cut a graph that spans several devices into one graph per device and stage
(and a control-flow node, with the nth nodes reading its results, into a part of its own).

A hybridized forward that moves values with ``x.to(device)`` (a ``device_copy`` node) holds
ops of several devices. Each op gets a *stage*: the most device changes on any path from the
sources to it. Ops of one device and one stage form a part. Along every edge the stage never
decreases and a device change raises it, so no path leaves a part and comes back: the parts
form a DAG and each part compiles on its own. Parts with no path between them (the book's
two matmuls on cpu(0) and cpu(1)) then run at once, one engine op per part on its device's
worker, ordered by the engine's read/write dependencies like any other ops.

A ``device_copy`` at a part boundary is not an op of the part that receives it: the value
enters that part as an input, and the part records the device it comes from
(``input_devices``): CPU devices share memory, so the runtime moves only what enters a part
from another device where a GPU is one of the two.
"""
from __future__ import annotations

import dataclasses

from ..graph import SOURCE_OPS, Graph, NodeRef
from ..ops.control import CONTROL_OPS


@dataclasses.dataclass
class Part:
    device: str
    graph: Graph
    # where each input of ``graph`` comes from: ("input", i) / ("param", i) of the whole
    # graph, or ("part", p, k): output k of part p (an earlier part)
    inputs: list
    params: list  # ("param", i) of the whole graph, in graph.params order
    input_devices: list  # the device each input of ``graph`` lives on before the part runs
    sources: list = dataclasses.field(default_factory=list)  # whole-graph node per input


@dataclasses.dataclass
class Partitioning:
    parts: list  # in an order where every part comes after the parts it reads
    outputs: list  # per whole-graph output: ("part", p, k) / ("input", i) / ("param", i)


def devices_of(graph: Graph) -> set:
    return {graph.node(n).get("device", "cpu(0)") for n in graph.g.nodes
            if graph.op(n) not in SOURCE_OPS}


def partition(graph: Graph) -> Partitioning:
    """Pure: the parts of ``graph`` (one part when all its ops share one device)."""
    dev = {n: graph.node(n).get("device", "cpu(0)") for n in graph.g.nodes}
    ctrl = _control_groups(graph)
    stage = {}
    order = graph.topo_order()
    for n in order:
        if graph.op(n) in SOURCE_OPS:
            stage[n] = 0
            continue
        # crossing a device or a control part's boundary starts a new stage
        stage[n] = max((stage[a] + (dev[a] != dev[n] or ctrl.get(a) != ctrl.get(n))
                        for a in graph.arg_ids(n)), default=0)
    # ...and on one device (whose parts run one after another anyway: on several, running
    # early lets parts of different devices overlap) an op joins the latest stage it can,
    # the earliest of its users' where none is a control part: a value only read after a
    # loop (a transposed residual, a weight's gradient) is then computed in the part that
    # reads it, where it fuses into its reader, rather than exported as a materialized copy
    for n in reversed(order) if len(devices_of(graph)) == 1 else ():
        users = graph.users(n)
        if graph.op(n) in SOURCE_OPS or n in ctrl or n in graph.outputs or not users or any(
                u in ctrl for u in users):
            continue
        stage[n] = max(stage[n], min(stage[u] for u in users))
    key_of = {n: (stage[n], dev[n], ctrl.get(n, -1)) for n in order
              if graph.op(n) not in SOURCE_OPS}
    keys = sorted(set(key_of.values()), key=lambda k: (k[0], _device_rank(k[1]), k[2]))
    index = {k: i for i, k in enumerate(keys)}
    part_of = {n: index[k] for n, k in key_of.items()}
    builders = [_PartBuilder(graph, key[1], i) for i, key in enumerate(keys)]
    for n in order:
        if graph.op(n) in SOURCE_OPS:
            continue
        builders[part_of[n]].add(n, part_of, builders)
    outputs = []
    for o in graph.outputs:
        op = graph.op(o)
        if op in ("input", "param"):
            outputs.append((op, (graph.inputs if op == "input" else graph.params).index(o)))
        elif op == "const":
            outputs.append(("const", graph.constants[graph.node(o)["attrs"]["name"]]))
        else:
            outputs.append(("part", part_of[o], builders[part_of[o]].export(o)))
    parts = [Part(b.device, b.sub, b.input_refs, b.param_refs, b.input_devices, b.sources)
             for b in builders]
    return Partitioning(parts, outputs)


def _control_groups(graph: Graph) -> dict:
    """Control node or nth reading one -> the control node: each group is a part of its own
    (compiler/control_flow.py runs it), so no other pass ever sees a control node."""
    groups = {}
    for n in graph.g.nodes:
        op = graph.op(n)
        if op in CONTROL_OPS:
            groups[n] = n
        elif op == "nth":
            groups[n] = graph.arg_ids(n)[0]
    return groups


def _device_rank(device: str):
    kind, _, rest = device.partition("(")
    return (kind, int(rest.rstrip(")") or 0)) if rest.rstrip(")").isdigit() else (kind, 0)


class _PartBuilder:
    def __init__(self, graph: Graph, device: str, index: int):
        self.graph = graph
        self.device = device
        self.index = index
        self.sub = Graph(f"{graph.name or 'graph'}_part{index}")
        self.local: dict[int, int] = {}  # whole-graph node -> node of this part
        self.input_refs: list = []
        self.input_devices: list = []
        self.sources: list = []  # the whole-graph node each input of sub holds
        self.param_refs: list = []
        self.exported: dict[int, int] = {}  # whole-graph node -> output index of this part

    def export(self, n) -> int:
        """Output index of whole-graph node ``n`` (computed here) for a later reader."""
        if n not in self.exported:
            self.exported[n] = len(self.sub.outputs)
            self.sub.outputs.append(self.local[n])
        return self.exported[n]

    def _import(self, a, part_of, builders) -> int:
        """The local node holding whole-graph value ``a``."""
        if a in self.local:
            return self.local[a]
        g = self.graph
        op = g.op(a)
        spec = g.spec(a)
        if op == "input":
            nid = self.sub.add_input(spec, g.node(a)["attrs"]["name"], self.device)
            self.input_refs.append(("input", g.inputs.index(a)))
            self.input_devices.append(g.node(a).get("device", "cpu(0)"))
            self.sources.append(a)
        elif op == "param":
            nid = self.sub.add_param(spec, g.node(a)["attrs"]["name"], self.device)
            self.param_refs.append(("param", g.params.index(a)))
        elif op == "const":
            name = g.node(a)["attrs"]["name"]
            nid = self.sub.add_const(g.constants[name], name, self.device)
        else:
            src = part_of[a]
            k = builders[src].export(a)
            nid = self.sub.add_input(spec, f"from_part{src}_{k}", self.device)
            self.input_refs.append(("part", src, k))
            self.input_devices.append(builders[src].device)
            self.sources.append(a)
        self.local[a] = nid
        return nid

    def add(self, n, part_of, builders):
        g = self.graph
        d = g.node(n)
        args = g.arg_ids(n)
        if d["op"] == "device_copy" and (g.op(args[0]) in SOURCE_OPS or
                                         part_of.get(args[0]) != self.index):
            self.local[n] = self._import(args[0], part_of, builders)  # a boundary: an input
            return
        conv = [NodeRef(self._import(a.id, part_of, builders)) if isinstance(a, NodeRef)
                else a for a in g.args(n)]
        self.local[n] = self.sub.add_op(d["op"], conv, d["attrs"], d.get("where"),
                                        self.device)
