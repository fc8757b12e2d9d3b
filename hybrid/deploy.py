"""export() and load(): a hybridized model as a self-contained artifact.

The artifact is a directory (see ``runtime.artifact``): ``manifest.json``, ``graph.json``
and ``weights.safetensors``; no pickle anywhere and no native code.

graph.json holds the traced predict-mode graph *before* optimization: loading re-verifies it
against this machine's op registry, re-infers every type and re-runs the passes, so a newer
hybrid with better passes still loads it and nothing compiled elsewhere has to be trusted.

**Batch sizes.** At export the model is traced again at two more batch sizes (B+1 and 2B+3
for an example of batch B). When the three graphs are the same apart from integers (shapes,
attributes such as a reshape's target, integer scalars) that are affine in the batch size,
graph.json records each such integer as ``value = a * batch + b`` under its ``"batch"`` key
(the graph schema is unchanged: an older reader ignores the key and loads the graph at batch
B). ``load`` then instantiates the graph for the caller's batch size, re-verifying every type
through Graph construction, and compiles once per batch size. When the traces differ in
structure (or a captured constant depends on the batch), the fixed-shape graph is exported and
the manifest says why; other batch sizes are then refused with a clear error.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import threading

import numpy as np

from compiler.graph import Graph, GraphError
from runtime import config
from runtime.artifact import (KNOWN_PARTS, ArtifactError, clip, json_depth, parse_json,
                              publish, read_artifact, staging_path, write_artifact)
from runtime.device import parse_device

from . import _state
from .ndarray import array
from .tracing import CachedFunction, HybridFunction, Static, call_cached, flatten, unflatten

PRODUCER = "hybrid 0.1.0"
MAX_GRAPH_BYTES = 256 << 20
MAX_VALUE_BYTES = 1 << 40  # a value this large is an implausible claim, not a model
MAX_BATCH = 1 << 31


# ------------------------------------------------------------------ structures
def _tree_to_json(t):
    kind = t[0]
    if kind == "a":
        return {"k": "a"}
    if kind in ("t", "l"):
        return {"k": kind, "c": [_tree_to_json(x) for x in t[1]]}
    if kind == "d":
        return {"k": "d", "keys": list(t[1]), "c": [_tree_to_json(x) for x in t[2]]}
    v = t[1].value if isinstance(t[1], Static) else t[1]
    return {"k": "s", "v": v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)}


def _tree_from_json(d, what="structure", depth=0):
    """The treedef recorded by export, validated (an ArtifactError on anything else)."""
    if depth > 32 or not isinstance(d, dict):
        raise ArtifactError(f"manifest.json: {what} is malformed")
    k = d.get("k")
    if k == "a":
        return ("a",)
    if k in ("t", "l", "d"):
        kids = d.get("c")
        if not isinstance(kids, list):
            raise ArtifactError(f"manifest.json: {what} is malformed")
        kids = tuple(_tree_from_json(x, what, depth + 1) for x in kids)
        if k != "d":
            return (k, kids)
        keys = d.get("keys")
        if not isinstance(keys, list) or len(keys) != len(kids) or any(
                not isinstance(x, (str, int, float, bool, type(None))) for x in keys):
            raise ArtifactError(f"manifest.json: {what} is malformed")
        return ("d", tuple(keys), kids)
    if k == "s":
        v = d.get("v")
        if not isinstance(v, (int, float, str, bool, type(None))):
            raise ArtifactError(f"manifest.json: {what} is malformed")
        return ("s", v)
    raise ArtifactError(f"manifest.json: unknown {what} kind {clip(repr(k), 40)}")


def _n_leaves(t) -> int:
    if t[0] == "a":
        return 1
    if t[0] in ("t", "l"):
        return sum(_n_leaves(x) for x in t[1])
    if t[0] == "d":
        return sum(_n_leaves(x) for x in t[2])
    return 0


def _sig(spec) -> dict:
    return {"shape": list(spec.shape), "dtype": spec.dtype}


# ------------------------------------------------------------------ export
def _predict_entry(block, example_inputs):
    """(compiled predict-mode entry, example inputs or None, call) for ``block``."""
    if not isinstance(block, HybridFunction) and not hasattr(block, "hybridize"):
        raise TypeError(f"export: expected a HybridBlock or an hb.hybridize'd function, got "
                        f"{type(block).__name__}")

    def call(ins):
        with _predict():
            return block(*ins) if isinstance(block, HybridFunction) else \
                call_cached(block, tuple(ins), {})
    ins = None
    cache = block.cache if isinstance(block, HybridFunction) else getattr(block, "_cached", None)
    if example_inputs is not None:
        ins = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
            else (example_inputs,)
        if isinstance(cache, CachedFunction):  # an export is the example's own graph, never
            leaves, tree = flatten((ins, {}))  # a shape bucket's padded one
            with _predict():
                sig = cache.signature(leaves, tree)
            if hasattr(cache.entries.get(sig), "bucket_run"):
                del cache.entries[sig]
                cache.fast.clear()
        old = config.set_flag("HYBRID_BUCKETS", False)
        try:
            call(ins)
        finally:
            config.set_flag("HYBRID_BUCKETS", old)
    cache = block.cache if isinstance(block, HybridFunction) else getattr(block, "_cached", None)
    entries = [e for e in (cache.entries.values() if isinstance(cache, CachedFunction) else [])
               if not e.signature[2] and not hasattr(e, "bucket_run")]
    if not entries:
        raise ValueError("export: nothing to export yet; call net.hybridize() and run the net "
                         "once in predict mode, or pass example_inputs=")
    entry = entries[-1]
    if ins is not None:  # the signature of the example, not the latest one
        want = [(tuple(a.shape), a._dtype) for a in flatten(ins)[0]]
        for e in entries:
            if [(s, d) for s, d, _ in e.signature[1]] == want:
                entry = e
    if entry.uses_key:
        raise ValueError("export: the predict-mode graph draws random numbers; exporting it "
                         "would not be deterministic")
    if entry.input_writes:
        raise ValueError("export: forward writes to its input arrays (x[:] = ..., x += ...); a "
                         "deployed model never changes its caller's arrays: return the new "
                         "value from forward instead")
    devices = sorted({str(d.get("device", "cpu(0)")) for _, d in entry.graph.g.nodes(data=True)})
    if len(devices) > 1:
        raise ValueError(f"export: the graph spans devices {', '.join(devices)} (x.to(device) in "
                         "forward, or parameters on several devices); an artifact runs on one "
                         "device: export a version of the model that keeps to one device")
    return entry, ins, call


def export(block, path, example_inputs=None, check: bool = True, dynamic_batch: bool = True):
    """Write the predict-mode graph of a hybridized block or function (and its weights) to
    the artifact directory ``path``, atomically: it is written and checked under a temporary
    sibling name, then renamed into place, so a crash or a failed check leaves an older
    artifact at ``path`` intact.

    ``example_inputs``: the inputs to trace with (else the latest predict-mode call's
    signature). ``dynamic_batch``: also trace at two other batch sizes so the artifact runs at
    any batch size (see the module doc). ``check``: load what was written and compare its
    outputs on the example inputs (bitwise, same backend), so a broken round trip fails here.
    """
    from safetensors.numpy import save  # noqa: PLC0415
    entry, ins, call = _predict_entry(block, example_inputs)
    g = entry.graph
    device = entry.signature[1][0][2] if entry.signature[1] else parse_device(None)
    weights = {}
    with _suspended_trace():
        for p, nid in zip(entry.params, g.params):
            weights[g.node(nid)["attrs"]["name"]] = p.data(device).asnumpy()
    for k, v in g.constants.items():
        weights[f"__const__.{k}"] = v
    doc = json.loads(g.to_json(with_constants=False))
    batch_info, rules, probe = {"dynamic": False, "reason": "dynamic_batch=False"}, None, None
    if dynamic_batch:
        batch_info, rules, probe = _batch_rules(block, entry, doc, device)
    if rules is not None:
        doc["batch"] = {"exported": batch_info["exported"], "axis": 0,
                        "rules": [[p, a, b] for p, a, b in rules]}
    manifest = {
        "producer": PRODUCER,
        "backend": entry.backend,
        "graph": "traced predict-mode graph before optimization; re-verified and compiled "
                 "on the loading machine",
        "native_code": False,
        "target": _target(),
        "inputs": [_sig(g.spec(n)) for n in g.inputs],
        "outputs": [_sig(g.spec(n)) for n in g.outputs[:entry.n_user_out]],
        "input_structure": _tree_to_json(entry.signature[0]),
        "output_structure": _tree_to_json(entry.out_tree),
        "n_outputs": entry.n_user_out,
        "batch": batch_info,
    }
    graph_bytes = json.dumps(doc, indent=1, sort_keys=True).encode()
    parts = {"graph.json": graph_bytes, "weights.safetensors": save(weights)}
    if not check:
        write_artifact(path, parts, manifest)
        return path
    staged = staging_path(path)  # checked before it replaces anything at `path`
    try:
        write_artifact(staged, parts, manifest)
        if ins is not None:
            deployed = load(staged, device=device, backend=entry.backend)
            got, _ = flatten(deployed(*ins))
            want, _ = flatten(call(ins))
            _same_outputs(got, want, path, "the example inputs")
        if probe is not None:  # another batch size, through the artifact's own rules
            if not (ins is not None and entry.backend == "reference"):
                deployed = load(staged, device=device, backend="reference")
            probe_entry, probe_ins = probe
            got, _ = flatten(deployed(*probe_ins[0], **probe_ins[1]))
            _same_outputs(got, _run_entry(probe_entry, probe_ins, device), path,
                          f"batch size {batch_info['exported'] + 1}")
        publish(staged, path)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return path


def _same_outputs(got, want, path, what):
    if len(got) != len(want):
        raise RuntimeError(f"export: the artifact at {path} returns {len(got)} outputs on "
                           f"{what}, the model {len(want)}")
    for a, b in zip(got, want):
        a, b = a.asnumpy(), b.asnumpy()
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True):
            raise RuntimeError(f"export: the artifact at {path} does not reproduce the "
                               f"model's outputs on {what}")


def _target() -> dict:
    """Where the artifact was built (informational: it carries no native code)."""
    import platform  # noqa: PLC0415
    out = {"machine": platform.machine(), "system": platform.system()}
    try:
        import llvmlite.binding as llvm  # noqa: PLC0415
        out["triple"] = llvm.get_process_triple()
        out["cpu"] = llvm.get_host_cpu_name()
        out["cpu_features"] = llvm.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 - llvmlite missing or not initialized: informational
        pass
    return out


# ------------------------------------------------------------------ batch rules
_RULE_FIELDS = ("shape", "attrs", "args")


def _batch_rules(block, entry, doc, device):
    """(manifest batch info, rules or None, probe or None): trace at B+1 and 2B+3 and express
    every differing integer as a*batch + b; None when the graph is not batch-polymorphic."""
    specs = entry.signature[1]
    if not specs or any(len(s) == 0 for s, _, _ in specs):
        return {"dynamic": False, "reason": "an input has no leading (batch) dimension"}, \
            None, None
    B = specs[0][0][0]
    if any(s[0] != B for s, _, _ in specs):
        return {"dynamic": False, "exported": B,
                "reason": "the inputs do not share one leading (batch) dimension"}, None, None
    fixed = {"dynamic": False, "exported": B}
    if B < 1:
        return dict(fixed, reason="the example batch is empty"), None, None
    b1, b2 = B + 1, 2 * B + 3
    try:
        (e1, ins1), (e2, _) = (_trace_at(block, entry, device, n) for n in (b1, b2))
    except Exception as exc:  # noqa: BLE001 - any failure to trace means "fixed shape"
        return dict(fixed, reason=f"tracing at another batch size failed: "
                                  f"{type(exc).__name__}: {clip(str(exc), 300)}"), None, None
    for e in (e1, e2):
        why = _same_constants(entry.graph, e.graph)
        if why:
            return dict(fixed, reason=why), None, None
        if e.n_user_out != entry.n_user_out or e.out_tree != entry.out_tree:
            return dict(fixed, reason="the output structure depends on the batch size"), \
                None, None
    d1 = json.loads(e1.graph.to_json(with_constants=False))
    d2 = json.loads(e2.graph.to_json(with_constants=False))
    rules, why = [], None
    for path, v0, v1 in _diff(_strip(doc), _strip(d1)):
        if not (_is_int(v0) and _is_int(v1)) or not _rule_path(path):
            why = f"the graph at batch {b1} differs from batch {B} at {_fmt_path(path)}: " \
                  f"{_short(v0)} vs {_short(v1)}"
            break
        a = v1 - v0
        rules.append((path, a, v0 - a * B))
    if why is None:
        try:
            inst = _instantiate(doc, rules, b2)
        except ValueError as exc:
            why = f"batch rules do not extend to batch {b2}: {exc}"
        else:
            diff = next(iter(_diff(_strip(inst), _strip(d2))), None)
            if diff is not None:
                why = f"the graph is not affine in the batch size at {_fmt_path(diff[0])} " \
                      f"(batch {b2}: {_short(diff[2])}, predicted {_short(diff[1])})"
    if why is not None:
        return dict(fixed, reason=why), None, None
    return {"dynamic": True, "exported": B, "axis": 0, "checked": [B, b1, b2]}, rules, \
        (e1, ins1)


def _run_entry(entry, ins, device):
    """The outputs of a compiled trace entry on ``ins`` ((args, kwargs)), as one engine op."""
    from .tracing import _push  # noqa: PLC0415
    with _suspended_trace():
        leaves = flatten(ins)[0]
        params = [p.data(device) for p in entry.params]
        return _push(entry.exe, device, [a._buf for a in leaves], [p._buf for p in params],
                     entry.exe.out_specs, "export-check")[:entry.n_user_out]


def _trace_at(block, entry, device, n):
    """A predict-mode trace of ``block`` at batch ``n`` (reference backend, own cache)."""
    from . import ndarray as nd  # noqa: PLC0415
    if isinstance(block, HybridFunction):
        cf = CachedFunction(block.__wrapped__, block.__name__, {"backend": "reference"})
    else:
        cf = CachedFunction(block.forward, type(block).__name__, {"backend": "reference"},
                            owner=block)
    rng = np.random.default_rng(n)
    leaves = []
    for shape, dtype, dev in entry.signature[1]:
        shape = (n,) + tuple(shape[1:])
        if dtype.startswith("float"):
            v = rng.standard_normal(shape).astype(dtype)
        else:
            v = np.zeros(shape, dtype=dtype)
        leaves.append(nd.array(v, dtype=dtype, device=dev))
    args, kwargs = unflatten(entry.signature[0], leaves)
    with _predict():
        sig = cf.signature(leaves, entry.signature[0])
        e = cf._build(sig, leaves, entry.signature[0], args, kwargs)
    return e, (args, kwargs)


def _same_constants(g0, g1):
    if set(g0.constants) != set(g1.constants):
        return "the captured constants depend on the batch size"
    for k, v in g0.constants.items():
        w = g1.constants[k]
        if v.shape != w.shape or v.dtype != w.dtype or v.tobytes() != w.tobytes():
            return f"captured constant {k!r} depends on the batch size"
    return None


def _strip(doc):
    """A graph document without source locations (they differ between traces)."""
    out = dict(doc)
    out.pop("batch", None)
    out["nodes"] = [{k: v for k, v in nd.items() if k != "where"} for nd in doc["nodes"]]
    return out


def _diff(a, b, path=()):
    """Yield (path, a_value, b_value) for every leaf where two JSON documents differ; a
    structural difference (types, keys, lengths) is yielded at the containing path."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            yield path, sorted(a), sorted(b)
            return
        for k in sorted(a):
            yield from _diff(a[k], b[k], path + (k,))
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield path, f"{len(a)} entries", f"{len(b)} entries"
            return
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, path + (i,))
    elif type(a) is not type(b) or a != b:
        if not (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                and math.isnan(b)):
            yield path, a, b


def _rule_path(path) -> bool:
    """Batch rules may touch a node's shape, attributes and scalar arguments only."""
    return len(path) >= 4 and path[0] == "nodes" and path[2] in _RULE_FIELDS and \
        (path[2] != "args" or path[-1] == "scalar")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fmt_path(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _short(v):
    text = repr(v)
    return text if len(text) < 80 else text[:77] + "..."


def _instantiate(doc, rules, n):
    """A copy of the graph document with every rule's integer set to a*n + b."""
    out = copy.deepcopy(doc)
    out.pop("batch", None)
    for path, a, b in rules:
        node = out
        for key in path[:-1]:
            node = node[key]
        v = a * n + b
        if path[2] == "shape" and v < 0:
            raise ValueError(f"{_fmt_path(path)} would be {v}")
        node[path[-1]] = v
    return out


def _check_rules(batch, doc):
    """Validate graph.json's "batch" record: (exported, rules). ArtifactError otherwise."""
    if not isinstance(batch, dict) or not isinstance(batch.get("rules"), list):
        raise ArtifactError("graph.json: the 'batch' record is malformed")
    B = batch.get("exported")
    if not _is_int(B) or not 1 <= B <= MAX_BATCH or batch.get("axis", 0) != 0:
        raise ArtifactError("graph.json: the 'batch' record has no valid exported batch size")
    rules, seen = [], set()
    for k, r in enumerate(batch["rules"]):
        ok = isinstance(r, list) and len(r) == 3 and isinstance(r[0], list) and \
            _is_int(r[1]) and _is_int(r[2]) and abs(r[1]) < (1 << 40) and \
            abs(r[2]) < (1 << 40) and 4 <= len(r[0]) <= 16 and \
            all(isinstance(p, str) or _is_int(p) for p in r[0])
        if not ok or not _rule_path(tuple(r[0])):
            raise ArtifactError(f"graph.json: batch rule {k} is malformed")
        path = tuple(r[0])
        if path in seen:
            raise ArtifactError(f"graph.json: batch rule {k} repeats {_fmt_path(path)}")
        seen.add(path)
        node = doc
        try:
            for key in path:
                if isinstance(node, dict) and isinstance(key, str) or \
                        isinstance(node, list) and _is_int(key) and 0 <= key < len(node):
                    node = node[key]
                else:
                    raise KeyError(key)
        except KeyError:
            raise ArtifactError(f"graph.json: batch rule {k} points at {_fmt_path(path)}, "
                                "which is not in the graph") from None
        if not _is_int(node) or node != r[1] * B + r[2]:
            raise ArtifactError(f"graph.json: batch rule {k} ({_fmt_path(path)} = {r[1]}*N + "
                                f"{r[2]}) does not give the exported value at N={B}")
        rules.append((path, r[1], r[2]))
    return B, rules


# ------------------------------------------------------------------ loading
class Deployed:
    """A loaded artifact: call it like the block it came from (one engine op per call), with
    inputs on ``device``; its outputs are on ``device``.

    Runs at the exported input shapes, and when the artifact allows it at any batch size
    (compiling once per batch size; the ``MAX_SHAPES`` most recent are kept). ``graph`` is
    the graph at the exported batch size.
    """

    MAX_SHAPES = 32

    def __init__(self, graph: Graph, doc: dict, batch, weights: dict, manifest: dict, device,
                 backend: str):
        self.graph = graph
        self.manifest = manifest
        self.device = device
        self.backend = backend
        self.params = [array(weights[graph.node(n)["attrs"]["name"]], device=device)
                       for n in graph.params]
        self.in_tree = _tree_from_json(manifest["input_structure"], "input_structure")
        self.out_tree = _tree_from_json(manifest["output_structure"], "output_structure")
        self.n_outputs = manifest["n_outputs"]
        self._doc = doc
        self.batch_size, self._rules = batch if batch else (None, None)
        if self.batch_size is None and graph.inputs and graph.spec(graph.inputs[0]).ndim:
            self.batch_size = graph.spec(graph.inputs[0]).shape[0]
        self._graphs = {self.batch_size: graph}
        self._exes: dict = {}
        self._callers: dict = {}  # batch -> dispatch.Caller of its executable
        self._lock = threading.Lock()

    @property
    def dynamic_batch(self) -> bool:
        """Whether the artifact runs at batch sizes other than the exported one."""
        return self._rules is not None

    @property
    def input_specs(self) -> list:
        return [self.graph.spec(n) for n in self.graph.inputs]

    @property
    def output_specs(self) -> list:
        return [self.graph.spec(n) for n in self.graph.outputs[:self.n_outputs]]

    def graph_for(self, batch: int) -> Graph:
        """The graph at batch size ``batch`` (re-verified through Graph construction)."""
        g = self._graphs.get(batch)
        if g is not None:
            return g
        if not self.dynamic_batch:
            raise ValueError(f"this artifact runs only at batch size {self.batch_size} "
                             f"({self.manifest.get('batch', {}).get('reason', 'fixed shape')})")
        if not (isinstance(batch, int) and 1 <= batch <= MAX_BATCH):
            raise ValueError(f"batch size must be an integer in [1, {MAX_BATCH}], got {batch!r}")
        try:
            doc = _instantiate(self._doc, self._rules, batch)
            g = Graph.from_json(json.dumps(doc), constants=self.graph.constants)
            _check_sizes(g)
        except (ValueError, GraphError) as exc:
            raise ValueError(f"this artifact cannot run at batch size {batch}: {exc}") from None
        with self._lock:
            self._graphs[batch] = g
            self._evict(self._graphs)
        return g

    def _evict(self, cache):
        """Keep at most MAX_SHAPES batch sizes (the exported one always stays)."""
        while len(cache) > self.MAX_SHAPES:
            victim = next(k for k in cache if k != self.batch_size)
            del cache[victim]

    def executable(self, batch: int | None = None):
        """The compiled plan for ``batch`` (the exported batch size by default)."""
        from compiler.pipeline import compile as compile_graph  # noqa: PLC0415
        batch = self.batch_size if batch is None else batch
        exe = self._exes.get(batch)
        if exe is None:
            g = self.graph_for(batch)
            with self._lock:
                exe = self._exes.get(batch)
                if exe is None:
                    exe = self._exes[batch] = compile_graph(g, self.backend, self.device)
                    self._evict(self._exes)
        return exe

    def __call__(self, *args, **kwargs):
        from .dispatch import Caller  # noqa: PLC0415
        leaves, tree = flatten((args, kwargs))
        dev = self.device
        for a in leaves:
            if a.device is not dev and a.device != dev:
                self._wrong_device(leaves)
        specs = [(tuple(a.shape), a._dtype) for a in leaves]
        want = [(s.shape, s.dtype) for s in self.input_specs]
        if len(specs) != len(want):
            kinds = ", ".join(type(a).__name__ for a in args) or "nothing"
            raise TypeError(f"this model takes {len(want)} hybrid array(s) "
                            f"({', '.join(str(s) for s in self.input_specs)}); got {kinds}: "
                            "wrap NumPy data or lists with hb.array(x)")
        batch = self.batch_size
        if specs != want:
            batch = self._batch_of(specs, want)
        exe = self.executable(batch)
        caller = self._callers.get(batch)
        if caller is None or caller.exe is not exe:
            caller = Caller(exe, self.device)
            self._callers = {b: c for b, c in self._callers.items() if b in self._exes}
            self._callers[batch] = caller
        outs = caller(leaves, self.params, "deployed")
        return unflatten(self.out_tree, outs[:self.n_outputs])

    def _wrong_device(self, leaves):
        i, d = next((i, a.device) for i, a in enumerate(leaves) if a.device != self.device)
        raise ValueError(f"input {i} is on {d}, but this model was loaded on {self.device}: "
                         f"move the input with x.copyto({self.device}), or load the model "
                         f"with device={d}")

    def _batch_of(self, specs, want):
        if self.dynamic_batch and len(specs) == len(want) and specs and all(
                len(s) >= 1 and len(s) == len(w) and s[1:] == w[1:] and d == wd
                for (s, d), (w, wd) in zip(specs, want)) and \
                len({s[0] for s, _ in specs}) == 1 and specs[0][0][0] >= 1:
            return specs[0][0][0]
        fmt = ", ".join(f"{d}{list(s)}" for s, d in want)
        got = ", ".join(f"{d}{list(s)}" for s, d in specs)
        hint = (" with any batch size N >= 1 in the leading dimension" if self.dynamic_batch
                else " (re-export with example inputs of the shape you need: "
                f"{self.manifest.get('batch', {}).get('reason', 'fixed shape')})")
        raise ValueError(f"this artifact was exported for inputs ({fmt}){hint}; got ({got})")

    def __repr__(self):
        ins = ", ".join(str(s) for s in self.input_specs)
        return f"<Deployed ({ins}) -> {len(self.output_specs)} output(s), " \
               f"batch {'dynamic' if self.dynamic_batch else 'fixed'}, {self.backend}>"


def _check_sizes(g: Graph):
    for n in g.g.nodes:
        s = g.spec(n)
        nbytes = math.prod(s.shape) * np.dtype(s.dtype).itemsize
        if nbytes > MAX_VALUE_BYTES:
            raise GraphError(f"node %{n} would hold {nbytes} bytes ({s}); refusing an "
                             "implausible graph")


def _default_backend(manifest) -> str:
    from .tracing import _llvm_available  # noqa: PLC0415
    exported = manifest.get("backend")
    if exported == "reference":
        return "reference"
    return "llvm" if _llvm_available() else "reference"


def load(path, device=None, trust_native_code: bool = False, backend=None) -> Deployed:
    """Load an exported artifact; it runs without the model's Python code.

    Everything in the artifact is treated as data: the manifest and parts are checked (names,
    sizes, sha256), the graph is validated against the op registry with every type
    re-inferred, the weights must match the graph exactly, and kernels are generated on this
    machine. Artifacts carry no native code: a part that looks like native code is refused,
    also with ``trust_native_code=True`` (shipping native code is not implemented).
    ``backend``: 'reference', 'llvm' or 'cuda'; by default the exporting backend when it is
    'reference', else LLVM when available.

    ``device``: where the model runs, whatever device it was exported from (default: the
    current device, ``with hb.cpu(1):``); its weights live there and its outputs are
    returned there. Inputs must be on that device too: one on another device is refused
    with a ValueError naming it (as an eager op with arguments on two devices is), never
    copied behind the caller's back.
    """
    from compiler.verify import verify  # noqa: PLC0415
    device = parse_device(device)
    man, parts = read_artifact(path, known=KNOWN_PARTS, trust_native_code=trust_native_code)
    for need in KNOWN_PARTS:
        if need not in parts:
            raise ArtifactError(f"{path}: part {need} is missing from the manifest")
    weights = _load_weights(path, parts["weights.safetensors"])
    consts = {k[len("__const__."):]: v for k, v in weights.items() if k.startswith("__const__.")}
    raw = parts["graph.json"]
    if len(raw) > MAX_GRAPH_BYTES:
        raise ArtifactError(f"{path}: graph.json is {len(raw)} bytes, over the limit")
    doc = parse_json(raw, f"{path}: graph.json")
    if not isinstance(doc, dict):
        raise ArtifactError(f"{path}: graph.json refused: not a hybrid graph")
    doc = _placed(doc, device)
    try:
        graph = Graph.from_json(json.dumps(doc), constants=consts)
        verify(graph, "loading")
        _check_sizes(graph)
    except GraphError as exc:
        raise ArtifactError(f"{path}: graph.json refused: {clip(str(exc), 1000)}") from None
    batch = None
    if "batch" in doc:
        try:
            batch = _check_rules(doc["batch"], doc)
        except ArtifactError as exc:
            raise ArtifactError(f"{path}: {exc}") from None
    _check_weights(path, graph, weights)
    _check_manifest(path, man, graph, batch)
    if backend is None:
        backend = _default_backend(man)
    from compiler.pipeline import BACKENDS  # noqa: PLC0415
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return Deployed(graph, doc, batch, weights, man, device, backend)


def _placed(doc: dict, device) -> dict:
    """graph.json with every node on ``device``: the graph records the device it was
    exported from (one device: export refuses graphs that span several), and a model
    loaded with ``device=`` runs there, not on the exporter's device."""
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        return doc  # malformed: Graph.from_json says why
    where = str(device)
    return dict(doc, nodes=[dict(n, device=where) if isinstance(n, dict) else n
                            for n in nodes])


def _load_weights(path, data: bytes) -> dict:
    from safetensors.numpy import load as st_load  # noqa: PLC0415
    try:
        weights = st_load(data)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the library's own errors, panics included
        raise ArtifactError(f"{path}: weights.safetensors cannot be parsed: "
                            f"{type(exc).__name__}: {clip(str(exc), 300)}") from None
    if not isinstance(weights, dict):
        raise ArtifactError(f"{path}: weights.safetensors cannot be parsed")
    return weights


def _check_weights(path, graph, weights):
    names = set()
    for n in graph.params:
        name = graph.node(n)["attrs"]["name"]
        names.add(name)
        if name not in weights:
            raise ArtifactError(f"{path}: weights.safetensors lacks parameter "
                                f"{clip(repr(name))}")
        w = weights[name]
        if tuple(w.shape) != graph.spec(n).shape or w.dtype.name != graph.spec(n).dtype:
            raise ArtifactError(f"{path}: parameter {clip(repr(name))} is "
                                f"{w.dtype}{list(w.shape)} in weights.safetensors, the graph "
                                f"needs {graph.spec(n)}")
    if len(names) != len(graph.params):
        raise ArtifactError(f"{path}: graph.json names a parameter twice")
    consts = {f"__const__.{k}" for k in graph.constants}
    extra = sorted(set(weights) - names - consts)
    if extra:
        raise ArtifactError(f"{path}: weights.safetensors holds tensors the graph does not use "
                            f"({clip(', '.join(map(repr, extra[:5])))}); refused as inconsistent")


def _check_manifest(path, man, graph, batch):
    """The manifest's signatures and structures must agree with the graph."""
    for key in ("inputs", "outputs", "input_structure", "output_structure", "n_outputs"):
        if key not in man:
            raise ArtifactError(f"{path}: manifest.json is missing {key!r}")
    if json_depth(man) > 40:
        raise ArtifactError(f"{path}: manifest.json is nested too deeply")
    n_out = man["n_outputs"]
    if not _is_int(n_out) or not 0 <= n_out <= len(graph.outputs):
        raise ArtifactError(f"{path}: manifest.json n_outputs {clip(repr(n_out), 40)} does not "
                            f"fit the graph's "
                            f"{len(graph.outputs)} outputs")
    ins = [_sig(graph.spec(n)) for n in graph.inputs]
    outs = [_sig(graph.spec(n)) for n in graph.outputs[:n_out]]
    if man["inputs"] != ins:
        raise ArtifactError(f"{path}: manifest.json input signature does not match graph.json")
    if man["outputs"] != outs:
        raise ArtifactError(f"{path}: manifest.json output signature does not match graph.json")
    in_tree = _tree_from_json(man["input_structure"], "input_structure")
    out_tree = _tree_from_json(man["output_structure"], "output_structure")
    if _n_leaves(in_tree) != len(graph.inputs):
        raise ArtifactError(f"{path}: manifest.json input_structure has {_n_leaves(in_tree)} "
                            f"arrays, the graph {len(graph.inputs)} inputs")
    if _n_leaves(out_tree) != n_out:
        raise ArtifactError(f"{path}: manifest.json output_structure has {_n_leaves(out_tree)} "
                            f"arrays, n_outputs is {n_out}")
    info = man.get("batch")
    if info is not None and not isinstance(info, dict):
        raise ArtifactError(f"{path}: manifest.json batch record is malformed")
    if isinstance(info, dict) and bool(info.get("dynamic")) != (batch is not None):
        raise ArtifactError(f"{path}: manifest.json and graph.json disagree about dynamic batch "
                            "sizes")
    if batch is not None and any(graph.spec(n).ndim == 0 or graph.spec(n).shape[0] != batch[0]
                                 for n in graph.inputs):
        raise ArtifactError(f"{path}: graph.json batch record does not match its inputs")


class _predict:
    def __enter__(self):
        self.old = _state.local.training
        _state.local.training = False

    def __exit__(self, *exc):
        _state.local.training = self.old


def _suspended_trace():
    from .tracing import suspended  # noqa: PLC0415
    return suspended()


def export_onnx(block, path, example_inputs=None, **kw):
    """ONNX export for interop (see hybrid.onnx_export; needs the optional onnx package)."""
    from .onnx_export import export_onnx as _export_onnx  # noqa: PLC0415
    return _export_onnx(block, path, example_inputs, **kw)
