"""The graph IR: a dataflow graph on ``networkx.MultiDiGraph``.

Nodes are values. Each node has ``op`` (a registry op, or one of ``input``, ``param``,
``const``), ``attrs``, ``spec`` (shape + dtype), ``scalars`` (weakly-typed Python numbers
at argument positions), ``device`` and ``where`` (the user's file:line and block path).
An edge u -> v with attribute ``pos`` says u is argument ``pos`` of v (multi-edges: x * x).
"""
from __future__ import annotations

import base64
import heapq
import json

import networkx as nx
import numpy as np

from runtime.artifact import clip

from .ops import ALL_DTYPES, REGISTRY, OpError, Spec, infer_types
from .ops.control import TUPLE_SPEC, Body

SCHEMA_VERSION = 1
SOURCE_OPS = ("input", "param", "const")


class GraphError(ValueError):
    """A graph is malformed (verifier) or cannot be read (JSON)."""


class Graph:
    def __init__(self, name: str = "graph"):
        self.name = name
        self.g = nx.MultiDiGraph()
        self.inputs: list[int] = []
        self.params: list[int] = []
        self.outputs: list[int] = []
        self.constants: dict[str, np.ndarray] = {}
        self.meta: dict = {}  # what passes decided (fusion groups, schedule, memory plan)
        self._next = 0

    # ------------------------------------------------------------- building
    def _add(self, op, spec, attrs=None, scalars=None, where=None, device="cpu(0)", **extra):
        nid = self._next
        self._next += 1
        self.g.add_node(nid, op=op, spec=spec, attrs=dict(attrs or {}),
                        scalars=dict(scalars or {}), where=where, device=device, **extra)
        return nid

    def add_input(self, spec: Spec, name: str, device="cpu(0)") -> int:
        nid = self._add("input", spec, {"name": name}, device=device)
        self.inputs.append(nid)
        return nid

    def add_param(self, spec: Spec, name: str, device="cpu(0)") -> int:
        nid = self._add("param", spec, {"name": name}, device=device)
        self.params.append(nid)
        return nid

    def add_const(self, value: np.ndarray, name: str | None = None, device="cpu(0)") -> int:
        value = np.array(value, order="C", copy=True)  # (ascontiguousarray makes 0-d 1-d)
        if name is None:  # a fresh name: len(constants) may be taken after remove_dead
            k = len(self.constants)
            while f"const{k}" in self.constants:
                k += 1
            name = f"const{k}"
        self.constants[name] = value
        return self._add("const", Spec(value.shape, value.dtype.name), {"name": name},
                         device=device)

    def add_op(self, name: str, args, attrs: dict, where=None, device="cpu(0)") -> int:
        """Add op ``name`` applied to ``args`` (node ids or Python scalars); types inferred."""
        specs, scalars, edges = [], {}, []
        for pos, a in enumerate(args):
            if isinstance(a, NodeRef):
                specs.append(self.spec(a.id))
                edges.append((a.id, pos))
            else:
                specs.append(a)
                scalars[pos] = a
        attrs = {k: _attr_value(v) for k, v in attrs.items()}
        if name == "nth":  # a result of a control-flow node: typed by the node it reads
            results = self.node(edges[0][0]).get("results") if len(edges) == 1 else None
            index = attrs.get("index")
            if results is None or type(index) is not int or not 0 <= index < len(results):
                raise GraphError(f"nth(index={index!r}) must read one control-flow node and "
                                 "name one of its results")
            nid = self._add(name, results[index], attrs, scalars, where, device)
        elif REGISTRY[name].kind == "control" if name in REGISTRY else False:
            # several results: a tuple node (an empty value) whose results nth nodes read
            results = infer_types(name, specs, attrs)
            nid = self._add(name, TUPLE_SPEC, attrs, scalars, where, device,
                            results=tuple(results))
        else:
            out = infer_types(name, specs, attrs)
            if len(out) != 1:
                raise GraphError(f"op {name} has {len(out)} outputs; graphs hold one-output "
                                 "ops")
            nid = self._add(name, out[0], attrs, scalars, where, device)
        for src, pos in edges:
            self.g.add_edge(src, nid, pos=pos)
        return nid

    # ------------------------------------------------------------- queries
    def node(self, nid) -> dict:
        return self.g.nodes[nid]

    def spec(self, nid) -> Spec:
        return self.g.nodes[nid]["spec"]

    def op(self, nid) -> str:
        return self.g.nodes[nid]["op"]

    def args(self, nid) -> list:
        """Arguments of ``nid`` in order: NodeRef for graph values, numbers for scalars."""
        data = self.g.nodes[nid]
        n = len(data["scalars"]) + self.g.in_degree(nid)
        out = [None] * n
        for pos, v in data["scalars"].items():
            out[pos] = v
        for src, _, ed in self.g.in_edges(nid, data=True):
            out[ed["pos"]] = NodeRef(src)
        return out

    def arg_ids(self, nid) -> list[int]:
        return [a.id for a in self.args(nid) if isinstance(a, NodeRef)]

    def users(self, nid) -> list[int]:
        return list(dict.fromkeys(v for _, v in self.g.out_edges(nid)))

    def topo_order(self) -> list[int]:
        """Node ids in dependency order, the smallest ready id first: networkx's
        lexicographical_topological_sort, written out (its first call in a process costs
        ~10-20 ms of networkx dispatch set-up, on a first hybridized call's path)."""
        g = self.g
        indeg = {n: d for n, d in g.in_degree()}
        ready = [n for n, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        succ = g.succ
        order = []
        while ready:
            n = heapq.heappop(ready)
            order.append(n)
            for m, edges in succ[n].items():
                indeg[m] -= len(edges)
                if indeg[m] == 0:
                    heapq.heappush(ready, m)
        if len(order) != len(indeg):
            raise nx.NetworkXUnfeasible("the graph has a cycle")
        return order

    def op_nodes(self) -> list[int]:
        return [n for n in self.topo_order() if self.op(n) not in SOURCE_OPS]

    def __len__(self):
        return self.g.number_of_nodes()

    def copy(self) -> "Graph":
        other = Graph(self.name)
        other.g = self.g.copy()
        for n in other.g.nodes:
            d = other.g.nodes[n]
            d["attrs"] = dict(d["attrs"])
            d["scalars"] = dict(d["scalars"])
        other.inputs, other.params, other.outputs = list(self.inputs), list(self.params), \
            list(self.outputs)
        other.constants = dict(self.constants)
        other.meta = dict(self.meta)
        other._next = self._next
        return other

    def copy_node(self, src: "Graph", n: int, remap: dict, device=None) -> int:
        """Node ``n`` of graph ``src`` added here, its arguments read through ``remap`` (an
        id of ``src`` -> an id here); a constant keeps its name where it is free here."""
        d = src.node(n)
        device = device or d["device"]
        if d["op"] == "const":
            name = d["attrs"]["name"]
            return self.add_const(src.constants[name],
                                  None if name in self.constants else name, device)
        args = [NodeRef(remap[a.id]) if isinstance(a, NodeRef) else a for a in src.args(n)]
        return self.add_op(d["op"], args, d["attrs"], d.get("where"), device)

    def replace_control_node(self, old: int, args, attrs: dict, index=None) -> int:
        """A control node (see ops/control.py) in place of ``old``: same op, place and
        device, new operands and attributes; every ``nth`` reading ``old`` now reads result
        ``index(k)`` (k by default) of the new one."""
        d = self.node(old)
        new = self.add_op(d["op"], [NodeRef(a) for a in args], attrs, d.get("where"),
                          d["device"])
        for u in self.users(old):
            k = self.node(u)["attrs"]["index"]
            m = self.add_op("nth", [NodeRef(new)], {"index": k if index is None else index(k)},
                            self.node(u).get("where"), self.node(u)["device"])
            self.replace_uses(u, m)
            self.g.remove_node(u)
        self.g.remove_node(old)
        return new

    def replace_uses(self, old: int, new: int):
        """Every use of ``old`` (edges and outputs) now reads ``new``."""
        for _, dst, key, ed in list(self.g.out_edges(old, keys=True, data=True)):
            self.g.remove_edge(old, dst, key)
            self.g.add_edge(new, dst, pos=ed["pos"])
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove_dead(self) -> int:
        """Remove op and const nodes no output depends on; returns how many."""
        # a walk up the edges (nx.ancestors costs ~20 ms the first time a process calls it:
        # networkx compiles its dispatch wrapper, on a first hybridized call's path)
        pred = self.g.pred
        live = set(self.outputs)
        todo = list(live)
        while todo:
            for src in pred[todo.pop()]:
                if src not in live:
                    live.add(src)
                    todo.append(src)
        dead = [n for n in self.g.nodes if n not in live and self.op(n) not in ("input", "param")]
        self.g.remove_nodes_from(dead)
        used_consts = {self.node(n)["attrs"]["name"] for n in self.g.nodes
                       if self.op(n) == "const"}
        self.constants = {k: v for k, v in self.constants.items() if k in used_consts}
        return len(dead)

    # ------------------------------------------------------------- printing
    def format(self) -> str:
        """One line per node, typed, with the user's source line (like a jaxpr)."""
        lines = [f"graph {self.name}("
                 + ", ".join(f"%{i}:{self.spec(i)}" for i in self.inputs) + ")"]
        if self.params:
            lines.append("  params: " + ", ".join(
                f"%{p}:{self.spec(p)} {self.node(p)['attrs']['name']}" for p in self.params))
        for n in self.topo_order():
            d = self.node(n)
            if d["op"] in ("input", "param"):
                continue
            if d["op"] == "const":
                rhs = f"const {d['attrs']['name']}"
            else:
                args = ", ".join(f"%{a.id}" if isinstance(a, NodeRef) else repr(a)
                                 for a in self.args(n))
                attrs = ", ".join(f"{k}={_short(v)}" for k, v in d["attrs"].items()
                                  if v is not None)
                rhs = f"{d['op']}({args}{', ' + attrs if attrs else ''})"
            where = d.get("where")
            loc = f"  # {_fmt_where(where)}" if where else ""
            lines.append(f"  %{n}:{d['spec']} = {rhs}{loc}")
        lines.append("  return " + ", ".join(f"%{o}" for o in self.outputs))
        return "\n".join(lines)

    __str__ = format

    def op_counts(self) -> dict:
        counts: dict = {}
        for n in self.g.nodes:
            counts[self.op(n)] = counts.get(self.op(n), 0) + 1
        return counts

    # ------------------------------------------------------------- JSON
    def to_json(self, with_constants: bool = True, indent: int | None = 1) -> str:
        """The graph as JSON (keys sorted). ``indent=None``: one line, written by json's C
        encoder, ~5-10x faster (what the executable cache hashes)."""
        nodes = []
        for n in self.topo_order():
            d = self.node(n)
            nodes.append({
                "id": n, "op": d["op"], "shape": list(d["spec"].shape),
                "dtype": d["spec"].dtype, "attrs": _jsonable(d["attrs"]),
                "args": [{"node": a.id} if isinstance(a, NodeRef) else {"scalar": _num(a)}
                         for a in self.args(n)] if d["op"] not in SOURCE_OPS else [],
                "where": list(d["where"]) if d.get("where") else None,
                "device": d.get("device", "cpu(0)"),
            })
        doc = {"schema": "hybrid.graph", "schema_version": SCHEMA_VERSION, "name": self.name,
               "inputs": self.inputs, "params": self.params, "outputs": self.outputs,
               "nodes": nodes}
        if with_constants:
            doc["constants"] = {k: {"dtype": v.dtype.name, "shape": list(v.shape),
                                    "data": base64.b64encode(v.tobytes()).decode("ascii")}
                                for k, v in self.constants.items()}
        return json.dumps(doc, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, constants: dict | None = None) -> "Graph":
        """Rebuild a graph from JSON, treating it as untrusted data: every op must be in the
        registry and every type is re-inferred (a mismatch is refused)."""
        try:
            doc = json.loads(text)
        except RecursionError:
            raise GraphError("graph.json is not valid JSON: nested too deeply") from None
        except ValueError as exc:  # not UTF-8, not JSON, an integer of too many digits
            raise GraphError(f"graph.json is not valid JSON: {exc}") from None
        try:
            return _from_doc(cls, doc, constants)
        except GraphError:
            raise
        except RecursionError:
            raise GraphError("graph.json is malformed: nested too deeply") from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OpError,
                ArithmeticError) as exc:
            raise GraphError(f"graph.json is malformed: {type(exc).__name__}: {exc}") from None


class NodeRef(int):
    """A graph value used as an argument (distinct from an integer scalar)."""

    @property
    def id(self) -> int:
        return int(self)

    def __repr__(self):
        return f"%{int(self)}"


def _from_doc(cls, doc, constants):
    if not isinstance(doc, dict) or doc.get("schema") != "hybrid.graph":
        raise GraphError("graph.json: not a hybrid graph (schema field missing or wrong)")
    ver = doc.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise GraphError(f"graph.json has schema_version {ver!r}; this hybrid reads version "
                         f"{SCHEMA_VERSION} (re-export the model with this hybrid version)")
    g = cls(str(doc.get("name", "graph")))
    consts = dict(constants or {})
    for k, v in (doc.get("constants") or {}).items():
        raw = base64.b64decode(v["data"], validate=True)
        if v["dtype"] not in ALL_DTYPES:
            raise GraphError(f"graph.json: constant {k!r} has unsupported dtype {v['dtype']!r}")
        dt = np.dtype(v["dtype"])
        shape = tuple(int(s) for s in v["shape"])
        if len(raw) != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise GraphError(f"graph.json: constant {k!r} has {len(raw)} bytes, expected "
                             f"{dt.itemsize * int(np.prod(shape))}")
        consts[k] = np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    idmap: dict[int, int] = {}
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise GraphError("graph.json: 'nodes' must be a list")
    for nd in nodes:
        try:
            _add_node(g, nd, consts, idmap)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OpError,
                ArithmeticError) as exc:
            what = f"node {clip(repr(nd.get('id')), 40)} ({clip(repr(nd.get('op')), 40)})" \
                if isinstance(nd, dict) else "a node that is not an object"
            raise GraphError(f"graph.json: {what} is malformed: {type(exc).__name__}: "
                             f"{clip(str(exc))}") from None

    def remap(field):
        ids = doc[field]
        if not isinstance(ids, list):
            raise GraphError(f"graph.json: '{field}' must be a list of node ids")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or i not in idmap:
                raise GraphError(f"graph.json: '{field}' names node {clip(repr(i), 40)}, "
                                 "which is not a node of the graph")
        return [idmap[i] for i in ids]
    inputs, params = remap("inputs"), remap("params")
    for kind, listed, have in (("inputs", inputs, g.inputs), ("params", params, g.params)):
        if sorted(listed) != sorted(have) or len(set(listed)) != len(listed):
            raise GraphError(f"graph.json: '{kind}' must list every {kind[:-1]} node exactly "
                             "once")
    g.inputs, g.params, g.outputs = inputs, params, remap("outputs")
    return g


def _add_node(g, nd, consts, idmap):
    """Add one node of graph.json to ``g`` (after the ones it uses)."""
    op = nd["op"]
    spec = _checked_spec(nd)
    where = tuple(nd["where"]) if nd.get("where") else None
    device = str(nd.get("device", "cpu(0)"))
    attrs = _restore(nd.get("attrs") or {})
    if op == "input":
        nid = g.add_input(spec, str(attrs.get("name")), device)
    elif op == "param":
        nid = g.add_param(spec, str(attrs.get("name")), device)
    elif op == "const":
        name = str(attrs["name"])
        if name not in consts:
            raise GraphError(f"graph.json: constant {name!r} has no data")
        nid = g.add_const(consts[name], name, device)
        if g.spec(nid) != spec:
            raise GraphError(f"graph.json: constant {name!r} is {g.spec(nid)}, the graph "
                             f"says {spec}")
    else:
        if op not in REGISTRY:
            raise GraphError(f"graph.json: unknown op {op!r} (not in this hybrid's op "
                             "registry; the artifact needs a newer hybrid)")
        args = []
        for a in nd["args"]:
            if "node" in a:
                src = int(a["node"])
                if src not in idmap:
                    raise GraphError(f"graph.json: node {nd['id']} uses node {src} before "
                                     "it is defined (nodes must be in topological order)")
                args.append(NodeRef(idmap[src]))
            else:
                args.append(_checked_scalar(a["scalar"], nd["id"]))
        nid = g.add_op(op, args, attrs, where, device)
        if g.spec(nid) != spec:
            raise GraphError(f"graph.json: node {nd['id']} ({op}) is recorded as {spec} but "
                             f"its inputs give {g.spec(nid)}")
    if int(nd["id"]) in idmap:
        raise GraphError(f"graph.json: node id {nd['id']} appears twice")
    idmap[int(nd["id"])] = nid


_MAX_DIM = 1 << 62


def _checked_spec(nd) -> Spec:
    """A node's recorded type, refused unless it is a plain shape and a supported dtype."""
    shape, dtype = nd["shape"], nd["dtype"]
    if not isinstance(shape, list) or len(shape) > 64 or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < _MAX_DIM for s in shape):
        raise GraphError(f"graph.json: node {nd.get('id')!r} has shape {shape!r}; a shape is a "
                         "list of at most 64 non-negative integers")
    if dtype not in ALL_DTYPES:
        raise GraphError(f"graph.json: node {nd.get('id')!r} has dtype {dtype!r}; supported: "
                         f"{', '.join(ALL_DTYPES)}")
    return Spec(tuple(shape), dtype)


def _checked_scalar(v, nid):
    """A scalar argument: a JSON number or bool (integers within int64)."""
    if isinstance(v, bool) or isinstance(v, float):
        return v
    if isinstance(v, int) and -(1 << 63) <= v < (1 << 63):
        return v
    raise GraphError(f"graph.json: node {nid!r} has scalar argument {v!r}; a scalar is a "
                     "number or a bool (integers within int64)")


def _attr_value(v):
    """Attributes are plain data: a dtype given as a type (np.float32) becomes its name."""
    if isinstance(v, type) or isinstance(v, np.dtype):
        try:
            return np.dtype(v).name
        except TypeError:
            return v
    return v


def _short(v):
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v)


def _fmt_where(where):
    if len(where) >= 2:
        fname = str(where[0]).rsplit("/", 1)[-1]
        extra = f" [{where[2]}]" if len(where) > 2 and where[2] else ""
        return f"{fname}:{where[1]}{extra}"
    return str(where)


def _num(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    return float(v)


def _jsonable(v):
    if isinstance(v, Body):  # a control-flow body: a whole graph document, constants inline
        return {"__body__": json.loads(v.to_json())}
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return {"__tuple__": [_jsonable(x) for x in v]}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return _num(v)
    if isinstance(v, float) and not np.isfinite(v):
        return {"__float__": repr(v)}
    return v


def _restore(v):
    if isinstance(v, dict):
        if set(v) == {"__body__"}:
            return Body(Graph.from_json(json.dumps(v["__body__"])))
        if set(v) == {"__tuple__"}:
            return tuple(_restore(x) for x in v["__tuple__"])
        if set(v) == {"__float__"}:
            text = v["__float__"]
            if text not in ("nan", "inf", "-inf"):  # the only floats JSON cannot hold
                raise GraphError(f"graph.json: attribute tag __float__ holds "
                                 f"{clip(repr(text), 40)}; expected 'nan', 'inf' or '-inf'")
            return float(text)
        return {k: _restore(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_restore(x) for x in v]
    return v
