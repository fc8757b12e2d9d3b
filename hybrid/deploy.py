"""export() and load(): a hybridized model as a self-contained artifact.

The artifact holds the traced graph *before* optimization (graph.json): loading re-verifies
it against this machine's op registry and re-runs the passes, so a newer hybrid with better
passes still loads it and nothing compiled elsewhere has to be trusted. Weights are
safetensors; no pickle anywhere.
"""
from __future__ import annotations

import json

import numpy as np

from compiler.graph import Graph, GraphError
from runtime.artifact import ArtifactError, read_artifact, write_artifact
from runtime.device import parse_device

from . import _state
from .ndarray import array
from .tracing import CachedFunction, HybridFunction, call_cached, flatten, unflatten

PRODUCER = "hybrid 0.1.0"


def _tree_to_json(t):
    kind = t[0]
    if kind == "a":
        return {"k": "a"}
    if kind in ("t", "l"):
        return {"k": kind, "c": [_tree_to_json(x) for x in t[1]]}
    if kind == "d":
        return {"k": "d", "keys": list(t[1]), "c": [_tree_to_json(x) for x in t[2]]}
    return {"k": "s", "v": t[1] if isinstance(t[1], (int, float, str, bool, type(None)))
            else repr(t[1])}


def _tree_from_json(d):
    k = d["k"]
    if k == "a":
        return ("a",)
    if k in ("t", "l"):
        return (k, tuple(_tree_from_json(x) for x in d["c"]))
    if k == "d":
        return ("d", tuple(d["keys"]), tuple(_tree_from_json(x) for x in d["c"]))
    if k == "s":
        return ("s", d["v"])
    raise ArtifactError(f"unknown output structure kind {k!r}")


def export(block, path, example_inputs=None, check: bool = True):
    """Write the predict-mode graph of a hybridized block (and its weights) to ``path``."""
    from safetensors.numpy import save  # noqa: PLC0415
    def call(ins):
        with _predict():
            return block(*ins) if isinstance(block, HybridFunction) else \
                call_cached(block, tuple(ins), {})
    if example_inputs is not None:
        ins = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        call(ins)
    cache = block.cache if isinstance(block, HybridFunction) else getattr(block, "_cached", None)
    entries = [e for e in (cache.entries.values() if isinstance(cache, CachedFunction) else [])
               if not e.signature[2]]
    if not entries:
        raise ValueError("export: nothing to export yet; call net.hybridize() and run the net "
                         "once in predict mode, or pass example_inputs=")
    entry = entries[-1]
    if example_inputs is not None:  # the signature of the example, not the latest one
        want = [(tuple(a.shape), a._dtype) for a in flatten(tuple(ins))[0]]
        for e in entries:
            if [(s, d) for s, d, _ in e.signature[1]] == want:
                entry = e
    if entry.uses_key:
        raise ValueError("export: the predict-mode graph draws random numbers; exporting it "
                         "would not be deterministic")
    g = entry.graph
    device = entry.signature[1][0][2] if entry.signature[1] else parse_device(None)
    weights = {}
    with _suspended_trace():
        for p, nid in zip(entry.params, g.params):
            weights[g.node(nid)["attrs"]["name"]] = p.data(device).asnumpy()
    for k, v in g.constants.items():
        weights[f"__const__.{k}"] = v
    manifest = {
        "producer": PRODUCER,
        "inputs": [{"shape": list(g.spec(n).shape), "dtype": g.spec(n).dtype}
                   for n in g.inputs],
        "outputs": [{"shape": list(g.spec(n).shape), "dtype": g.spec(n).dtype}
                    for n in g.outputs[:entry.n_user_out]],
        "input_structure": _tree_to_json(entry.signature[0]),
        "output_structure": _tree_to_json(entry.out_tree),
        "n_outputs": entry.n_user_out,
    }
    write_artifact(path, {"graph.json": g.to_json(with_constants=False).encode(),
                          "weights.safetensors": save(weights)}, manifest)
    if check and example_inputs is not None:
        deployed = load(path, device=device)
        got, _ = flatten(deployed(*ins))
        want, _ = flatten(call(ins))
        for a, b in zip(got, want):
            if not np.array_equal(a.asnumpy(), b.asnumpy(), equal_nan=True):
                raise RuntimeError(f"export: the artifact at {path} does not reproduce the "
                                   "model's outputs on the example inputs")
    return path


class Deployed:
    """A loaded artifact: call it like the block it came from."""

    def __init__(self, graph: Graph, weights: dict, manifest: dict, device):
        self.graph = graph
        self.manifest = manifest
        self.device = device
        self.params = [array(weights[graph.node(n)["attrs"]["name"]], device=device)
                       for n in graph.params]
        self.in_tree = _tree_from_json(manifest["input_structure"])
        self.out_tree = _tree_from_json(manifest["output_structure"])
        self._exe = None

    def __call__(self, *args, **kwargs):
        from compiler.pipeline import compile as compile_graph  # noqa: PLC0415
        from .tracing import _push  # noqa: PLC0415
        leaves, tree = flatten((args, kwargs))
        specs = [(tuple(a.shape), a._dtype) for a in leaves]
        want = [(self.graph.spec(n).shape, self.graph.spec(n).dtype) for n in self.graph.inputs]
        if specs != want:
            raise ValueError(f"this artifact was exported for inputs {want}; got {specs} "
                             "(re-export with example inputs of the shape you need)")
        if self._exe is None:
            self._exe = compile_graph(self.graph, "reference", self.device)
        outs = _push(self._exe, self.device, [a._buf for a in leaves],
                     [p._buf for p in self.params], self._exe.out_specs, "deployed")
        return unflatten(self.out_tree, outs[:self.manifest["n_outputs"]])


def load(path, device=None, trust_native_code: bool = False) -> Deployed:
    """Load an exported artifact; it runs without the model's Python code.

    Artifacts carry no native code yet (kernels are generated on this machine), so
    ``trust_native_code`` changes nothing today; it is accepted for forward compatibility.
    """
    from safetensors.numpy import load as st_load  # noqa: PLC0415
    device = parse_device(device)
    man, parts = read_artifact(path)
    for need in ("graph.json", "weights.safetensors"):
        if need not in parts:
            raise ArtifactError(f"{path}: part {need} is missing from the manifest")
    try:
        weights = st_load(parts["weights.safetensors"])
    except Exception as exc:  # noqa: BLE001 - the library's own parse errors
        raise ArtifactError(f"{path}: weights.safetensors cannot be parsed: {exc}") from None
    consts = {k[len("__const__."):]: v for k, v in weights.items() if k.startswith("__const__.")}
    try:
        graph = Graph.from_json(parts["graph.json"], constants=consts)
    except GraphError as exc:
        raise ArtifactError(f"{path}: graph.json refused: {exc}") from None
    for n in graph.params:
        name = graph.node(n)["attrs"]["name"]
        if name not in weights:
            raise ArtifactError(f"{path}: weights.safetensors lacks parameter {name!r}")
        if tuple(weights[name].shape) != graph.spec(n).shape or \
                weights[name].dtype.name != graph.spec(n).dtype:
            raise ArtifactError(f"{path}: parameter {name!r} is {weights[name].dtype}"
                                f"{list(weights[name].shape)}, the graph needs "
                                f"{graph.spec(n)}")
    try:
        json.dumps(man["input_structure"]), man["n_outputs"]
        return Deployed(graph, weights, man, device)
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{path}: manifest.json is missing {exc}") from None


class _predict:
    def __enter__(self):
        self.old = _state.local.training
        _state.local.training = False

    def __exit__(self, *exc):
        _state.local.training = self.old


def _suspended_trace():
    from .tracing import suspended  # noqa: PLC0415
    return suspended()


