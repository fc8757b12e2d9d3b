"""hybridize(): trace a block's forward into a compiler Graph, compile it, run it as one op.

The first call with a new input signature (argument structure, shapes, dtypes, devices,
train/predict mode) runs ``forward`` with :class:`Tracer` values that record graph nodes;
later calls with that signature run the compiled executable as ONE engine op. Python code in
``forward`` (a ``print``, a loop over layers) runs only while tracing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import struct
import sys
import threading
import time

import networkx as nx
import numpy as np

from compiler.graph import Graph, NodeRef
from compiler.ops import OpError, Spec, is_scalar
from runtime import config
from runtime import engine as _engine_mod
from runtime.device import cpu, parse_device
from runtime.executable import PartitionedExecutable

from . import _state
from . import buckets as _buckets
from .dispatch import Caller, _push
from ._where import user_frame
from .ndarray import NDArray, array, rebind_token
from .nn.block import describe_change, fingerprint, structure_epoch as _structure_epoch
from .nn.parameter import data_epoch as _param_epoch

_log_re = config.logger("recompiles")
_compiles = [0]  # graphs traced and compiled by this process (see num_compiles)


def num_compiles() -> int:
    """How many graphs this process has compiled for hybridized calls so far (a forward,
    or a training step's forward and backward, counts each): a loop can tell the steps that
    paid for compilation from the rest, and a test can assert that nothing re-compiles."""
    return _compiles[0]


class TraceError(RuntimeError):
    """Something in a hybridized forward cannot be captured in a graph."""


def _at(where=None):
    where = where or user_frame()
    return f"{where[0]}:{where[1]}" if where else "?"


# =================================================================== Tracer
class Tracer(NDArray):
    """A symbolic array inside a trace: shape and dtype are known, the value is not."""

    __slots__ = ("_nid", "_trace")

    def __init__(self, trace, nid, spec: Spec, device):
        NDArray.__init__(self, None, spec.shape, spec.dtype, device)
        self._nid = nid
        self._trace = trace

    def _refuse(self, what, fix):
        if _state.local.trace is not self._trace:
            raise TraceError(
                f"{what} at {_at()} of an array that leaked out of a hybridized forward (kept "
                "in a global, a list or an attribute while tracing): it is a node of a "
                "finished graph and never had a value. Return it from forward instead")
        raise TraceError(f"{what} of a traced value at {_at()}: inside a hybridized forward, "
                         f"arrays have no values yet (they are graph nodes). {fix}")

    @property
    def _buf(self):  # where an eager op would read the value: there is none
        self._refuse("computing with it", "Use hybrid ops on it inside forward.")

    @_buf.setter
    def _buf(self, value):
        if value is not None:
            raise TraceError("a traced value cannot hold data")

    def wait_to_read(self, timeout=None):
        self._refuse("wait_to_read()", "Remove it from forward; sync outside the block.")

    def asnumpy(self):
        self._refuse("asnumpy()", "Compute with hybrid ops inside forward, or call "
                     "net.hybridize(active=False) to debug eagerly.")

    def item(self):
        self._refuse("item()", "Keep the value as an array (e.g. use hb.where) or run eagerly.")

    def __array__(self, dtype=None, copy=None):
        self._refuse("np.asarray()", "Use hybrid ops instead of NumPy inside forward.")

    def __bool__(self):
        self._refuse("bool() (an `if` or `while` on an array)",
                     "Python control flow cannot depend on array values in a graph: use "
                     "hb.where(cond, a, b) to select elementwise, npx.cond(pred, then_func, "
                     "else_func, inputs) to run one branch, npx.while_loop / npx.foreach for "
                     "loops, or keep this block un-hybridized.")

    def __float__(self):
        self._refuse("float()", "Keep it an array.")

    def __int__(self):
        self._refuse("int()", "Keep it an array.")

    def __index__(self):
        self._refuse("using as an index", "Use hb.take(x, indices) with an index array.")

    def __repr__(self):
        return f"<traced {Spec(self.shape, self._dtype)} %{self._nid}>"

    __str__ = __repr__

    def detach(self):
        from .ndarray import apply  # noqa: PLC0415
        return apply("stop_gradient", (self,), {})

    def attach_grad(self, grad_req="write", stype=None):
        self._refuse("attach_grad()", "Attach gradients to inputs outside the block.")

    def to(self, device, non_blocking: bool = False):
        """This value on ``device``: a ``device_copy`` node. The compiled graph is cut there
        into per-device parts that run concurrently where nothing orders them."""
        device = parse_device(device)
        if device == self.device:
            return self
        from .ndarray import apply  # noqa: PLC0415
        return apply("device_copy", (self,), {"device": str(device),
                                              "source": str(self.device)})

    as_in_context = to
    as_in_ctx = to

    def copyto(self, other):
        if isinstance(other, NDArray):
            self._refuse("copyto(array)", "Return the value from forward instead of writing "
                         "into an array.")
        return self.to(other)


# =================================================================== Trace
class Trace:
    def __init__(self, name: str, device, param_names=None):
        self.param_names = param_names or {}  # id(Parameter) -> structured name
        self.graph = Graph(name)
        self.device = device
        self.params: list = []  # Parameter objects in graph.params order
        self.param_devices: list = []  # the device of each (a parameter may be on several)
        self._param_nodes: dict = {}  # (id(Parameter), device) -> node
        self.param_of_node: dict = {}  # node -> Parameter
        self._consts: dict = {}
        self.state_updates: list = []  # (Parameter, node id)
        self.key_inputs: list = []  # (input node, device): one per random op, in program order
        self.first_keys: list = []  # the keys this (first) call's draws take, see random_key

    def apply(self, name, args, attrs):
        conv = []
        device = None
        for a in args:
            if isinstance(a, Tracer):
                if device is None:
                    device = a.device
                elif a.device != device:
                    raise TraceError(f"{name}: arguments are on different devices ({device} "
                                     f"and {a.device}) at {_at()}; move one with .to(device)")
                conv.append(NodeRef(a._nid if a._trace is self else self.foreign(a)))
            elif isinstance(a, NDArray):
                conv.append(NodeRef(self.capture(a)))
            elif is_scalar(a):
                conv.append(a.item() if isinstance(a, np.generic) else a)
            elif isinstance(a, np.ndarray):
                conv.append(NodeRef(self.capture_numpy(a)))
            else:
                raise TraceError(f"{name}: argument of type {type(a).__name__} at {_at()} "
                                 "cannot be traced; pass hybrid arrays or numbers")
        if name == "device_copy":
            device = parse_device(attrs["device"])
        device = device or self.device
        try:
            nid = self.graph.add_op(name, conv, attrs, user_frame(), str(device))
        except OpError as exc:
            raise OpError(f"{exc} (at {_at()}, while hybridizing)") from None
        return Tracer(self, nid, self.graph.spec(nid), device)

    def foreign(self, a: Tracer) -> int:
        """The node of a traced value of another trace (a control-flow body's trace lifts
        its enclosing trace's values: control_trace.SubTrace)."""
        raise TraceError(f"a traced value from another trace was used at {_at()}: "
                         "do not keep arrays from inside forward in globals")

    def capture(self, a: NDArray) -> int:
        """A concrete array used inside forward becomes a graph constant (its value now)."""
        key = id(a._buf)
        if key not in self._consts:
            _log_re.info("captured a concrete array %s at %s as a constant: later changes to "
                         "it are not seen by the compiled graph", a.shape, _at())
            self._consts[key] = (self.graph.add_const(a.asnumpy(), device=str(self.device)), a)
        return self._consts[key][0]

    def capture_numpy(self, a: np.ndarray) -> int:
        return self.graph.add_const(np.array(a), device=str(self.device))

    def param(self, param, device):
        device = parse_device(device) if device is not None else self.device
        key = (id(param), device)
        if key not in self._param_nodes:
            with suspended():
                data = param.data(device)
            name = self.param_names.get(id(param)) or _param_name(param)
            taken = {self.graph.node(n)["attrs"]["name"] for n in self.graph.params}
            base, k = name, 1
            while name in taken:  # parameters of plain functions may share a short name
                name, k = f"{base}_{k}", k + 1
            nid = self.graph.add_param(Spec(data.shape, data._dtype), name, str(device))
            self._param_nodes[key] = nid
            self.param_of_node[nid] = param
            self.params.append(param)
            self.param_devices.append(device)
        nid = self._param_nodes[key]
        return Tracer(self, nid, self.graph.spec(nid), device)

    def random_key(self, device=None):
        """The key of one random op: an input of its own, filled at every call with the next
        key of the device's stream, in program order — so the same seed gives the same draws
        eagerly and hybridized. This (first) call's key is taken from the stream now, where
        the eager program would take it (between an initializer's draws, say)."""
        from .random import next_key  # noqa: PLC0415 - random imports ndarray, as we do
        device = parse_device(device) if device is not None else self.device
        nid = self.graph.add_input(Spec((), "int64"), f"rng_key{len(self.key_inputs)}",
                                   str(device))
        self.key_inputs.append((nid, device))
        self.first_keys.append(next_key(device))
        return Tracer(self, nid, Spec((), "int64"), device)


def _param_name(param):
    return getattr(param, "name", None) or f"param{id(param)}"


@contextlib.contextmanager
def suspended():
    """Run eagerly inside a trace (initializers, parameter look-ups)."""
    loc = _state.local
    old, loc.trace = loc.trace, None
    try:
        yield
    finally:
        loc.trace = old


def trace_apply(name, args, attrs):
    return _state.local.trace.apply(name, args, attrs)


def param_symbol(param, device=None):
    """Called by Parameter.data() while tracing."""
    return _state.local.trace.param(param, device)


def random_key(device=None):
    return _state.local.trace.random_key(device)


def inplace_rebind(target: NDArray, new):
    """``x += 1`` / ``x[:] = v`` / running-stat updates inside a traced forward."""
    tr = _state.local.trace
    if not isinstance(new, Tracer):
        raise TraceError(f"in-place update with a concrete value at {_at()}")
    if isinstance(target, Tracer) and target._trace is not tr:
        raise TraceError(f"in-place update at {_at()} of an array from outside the "
                         "npx.foreach / while_loop / cond body it is in: a body cannot write "
                         "to the enclosing graph; carry the value as a state and return it")
    if isinstance(target, Tracer):
        p = tr.param_of_node.get(target._nid)
        if p is not None:
            # a parameter updated inside forward (BatchNorm running stats): a graph output
            # written back to the parameter after each call
            tr.state_updates = [(q, n) for q, n in tr.state_updates if q is not p]
            tr.state_updates.append((p, new._nid))
            tr.param_of_node[new._nid] = p  # a later update of the same array: the same state
        target._nid = new._nid  # an input's Tracer: _build writes its last value back
        target._dtype = new._dtype
        return
    raise TraceError(f"in-place update of an array captured from outside forward at {_at()}: "
                     "a hybridized graph cannot write to it; return the new value instead")


# ============================================================ pytrees
class Static:
    """A non-array argument as part of a signature: equal only to the same type and the same
    exact value, so 2, 2.0 and True, 0.0 and -0.0 each get a graph of their own and a NaN
    finds its graph again (it is never == itself)."""

    __slots__ = ("value", "_key")

    def __init__(self, value):
        self.value = value
        self._key = _static_key(value)

    def __eq__(self, other):
        return isinstance(other, Static) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return repr(self.value)


def _static_key(o):
    t = type(o)
    if t is float:
        return t, struct.pack("<d", o)  # the bits: the sign of zero, every NaN alike
    if t is complex:
        return t, struct.pack("<dd", o.real, o.imag)
    if isinstance(o, np.generic):
        return t, o.dtype.str, o.tobytes()
    try:
        hash(o)
        return t, o
    except TypeError:
        return t, repr(o)


def flatten(obj):
    """(leaves, treedef): NDArray leaves; other values become part of the treedef as
    ``("s", Static(value))``."""
    leaves = []
    return leaves, _flatten_into(obj, leaves)


def _flatten_into(o, leaves):
    # (module level: a recursive closure is a reference cycle holding the leaves - a
    # bucketed call's outputs, 8 MB of a language model's logits - until the GC runs)
    if isinstance(o, NDArray):
        leaves.append(o)
        return ("a",)
    if isinstance(o, tuple):
        return ("t", tuple(_flatten_into(x, leaves) for x in o))
    if isinstance(o, list):
        return ("l", tuple(_flatten_into(x, leaves) for x in o))
    if isinstance(o, dict):
        keys = tuple(o.keys())
        return ("d", keys, tuple(_flatten_into(o[k], leaves) for k in keys))
    if isinstance(o, np.ndarray):  # as eager ops do: a clear refusal, not a constant
        raise TypeError(f"got a NumPy array of shape {o.shape} (at {_at()}): hybridized "
                        "blocks and loaded models take hybrid arrays; wrap NumPy data "
                        "with hb.array(x)")
    return ("s", Static(o))


def unflatten(treedef, leaves):
    return _unflatten_from(treedef, iter(leaves))


def _unflatten_from(t, it):  # (module level, as _flatten_into: no cycle holds the leaves)
    kind = t[0]
    if kind == "a":
        return next(it)
    if kind == "t":
        return tuple(_unflatten_from(x, it) for x in t[1])
    if kind == "l":
        return [_unflatten_from(x, it) for x in t[1]]
    if kind == "d":
        return {k: _unflatten_from(x, it) for k, x in zip(t[1], t[2])}
    return t[1].value if isinstance(t[1], Static) else t[1]


# ============================================================ compiled entries
@dataclasses.dataclass
class Compiled:
    signature: tuple
    graph: Graph
    params: list
    out_tree: tuple
    n_user_out: int
    state_updates: list  # (Parameter, output index)
    key_devices: list  # the device of each random op's key input (the last inputs)
    backend: str
    compiled_exe: object = None  # the inference executable, once a call needed it: see exe
    # needs-grad flags -> (TrainingGraphs, fwd exe, bwd exe, wrt input idx, wrt param idx)
    train: dict = dataclasses.field(default_factory=dict)
    handles: tuple = ()  # (parameter epoch, the parameters' arrays): see _param_handles
    # no random key, no state updates, one device: see dispatch.Caller. None until the
    # inference executable exists (then the fast path in CachedFunction.__call__ takes it)
    direct: bool | None = None
    direct_ok: bool = False  # the same, but for the executable's kind (device parts)
    device: object = None  # the device the executable is compiled for
    caller: object = None  # its dispatch.Caller, once a direct call made it
    param_devices: list = dataclasses.field(default_factory=list)  # the device of each param
    trace_seconds: float = 0.0
    # (leaf, output index, input positions, parameter positions it is computed from)
    input_writes: list = dataclasses.field(default_factory=list)
    first_keys: list = dataclasses.field(default_factory=list)  # the tracing call's keys
    # a shape bucket's padded inputs (compiler.pipeline.compile's ``rows``): its inference
    # executable computes the real rows only, where every kernel can (hybrid/buckets.py)
    rows: dict | None = None

    lock: object = dataclasses.field(default_factory=threading.Lock, repr=False)

    @property
    def uses_key(self) -> bool:
        return bool(self.key_devices)

    @property
    def exe(self):
        """The inference executable, compiled on first use: a signature that only ever
        trains (recorded calls whose inputs or parameters need gradients) runs the forward
        and backward executables of ``train`` and never compiles this one (it was a third
        of a new training shape's compile time)."""
        exe = self.compiled_exe
        if exe is None:
            with self.lock:
                exe = self.compiled_exe
                if exe is None:
                    # a graph compiled before (this host, these sources) loads its stored
                    # executable: no passes, lowering or code generation (exe_cache.py)
                    from compiler.exe_cache import compile as compile_graph  # noqa: PLC0415
                    exe = compile_graph(self.graph, self.backend, self.device,
                                        rows=self.rows)
                    _compiles[0] += 1
                    self.direct = self.direct_ok and \
                        not isinstance(exe, PartitionedExecutable)
                    self.compiled_exe = exe
        return exe

    def executable(self):
        return self.exe

    def make_caller(self):
        """The Caller of this (direct) entry's executable, on the device it was traced for."""
        self.caller = Caller(self.exe, self.signature[1][0][2] if self.signature[1] else cpu(0))
        return self.caller


class CachedFunction:
    """The compiled-graph cache of one block or function, keyed by input signature."""

    def __init__(self, fn, name, flags, owner=None):
        self.fn = fn
        self.name = name
        self.flags = dict(flags or {})
        self.owner = owner
        self.entries: dict = {}
        self.fast: dict = {}  # (array specs, training) -> entry, for positional-array calls
        self.retraces: list = []  # (reason, signature)
        self.buckets: dict = {}  # (size family, padded size) -> a bucket's entry (buckets.py)
        self.no_buckets: dict = {}  # size family -> why its sizes must compile exactly
        self._lock = threading.Lock()
        # the owner's block tree as traced: a change (a child added or replaced, a parameter
        # replaced or shared, hooks, hybridize flags) drops every compiled entry
        self._epoch = _structure_epoch[0]
        self._tree = fingerprint(owner) if owner is not None else None

    def backend_for(self, device) -> str:
        """The code generator for a call on ``device``: the block's flag, else CUDA C on a GPU
        and LLVM (or the NumPy reference, without llvmlite) on a CPU."""
        b = self.flags.get("backend")
        if b:
            return b
        if device.kind == "gpu":
            return "cuda"
        return "llvm" if _llvm_available() else "reference"

    def signature(self, leaves, tree):
        return (tree, tuple((a.shape, a._dtype, a.device) for a in leaves),
                _state.is_training())

    def __call__(self, args, kwargs):
        if self._epoch != _structure_epoch[0]:
            self._check_tree()
        if not kwargs:  # the common case: positional arrays only, no pytree walk
            loc = _state.local
            key = [loc.training]  # then shape, dtype, device of each argument
            for a in args:
                if type(a) is not NDArray:
                    break
                key += a.shape, a._dtype, a.device
            else:
                entry = self.fast.get(tuple(key))
                if entry is not None:
                    if entry.direct and not loc.recording:
                        handles = entry.handles  # _param_handles' cache, checked inline
                        handles = handles[1] if handles and handles[0] == _param_epoch[0] \
                            else _param_handles(entry)
                        outs = (entry.caller or entry.make_caller())(args, handles, self.name)
                        return outs[0] if entry.out_tree == _SINGLE else \
                            unflatten(entry.out_tree, outs[:entry.n_user_out])
                    return _run(entry, args, self.name)
        leaves, tree = flatten((args, kwargs))
        for a in leaves:
            if isinstance(a, Tracer):  # nested hybridized call inside an outer trace
                return self.fn(*args, **kwargs)
        sig = self.signature(leaves, tree)
        entry = self.entries.get(sig)
        if entry is None:
            with self._lock:
                entry = self.entries.get(sig) or \
                    _buckets.lookup(self, sig, leaves, tree, args, kwargs) or \
                    self._build(sig, leaves, tree, args, kwargs)
            if not kwargs and len(leaves) == len(args) and all(type(a) is NDArray
                                                                for a in args):
                # the key the fast path above builds: training, then each argument's spec
                self.fast[(sig[2],) + tuple(x for spec in sig[1] for x in spec)] = entry
        return _run(entry, leaves, self.name)

    def _check_tree(self):
        with self._lock:
            self._epoch = _structure_epoch[0]
            if self.owner is None:
                return
            tree = fingerprint(self.owner)
            if tree != self._tree:
                reason = describe_change(self._tree, tree)
                if self.entries:
                    _log_re.info("%s: dropping %d compiled graph(s) because %s", self.name,
                                 len(self.entries), reason)
                    self.retraces.append((reason, None))
                self._tree = tree
                self.entries, self.fast = {}, {}
                self.buckets, self.no_buckets = {}, {}

    def _build(self, sig, leaves, tree, args, kwargs, prepare=None):
        """Trace and compile ``sig``'s entry. ``prepare(entry)`` (a shape bucket's) checks
        and rewrites the trace before it compiles, or returns None: then nothing compiles
        and nothing is kept."""
        if self.retraces and self.retraces[-1][1] is None and not self.entries:
            self.retraces[-1] = (self.retraces[-1][0], sig)  # the block tree changed
        elif self.entries:
            reason = _why_retrace(list(self.entries), sig)
            self.retraces.append((reason, sig))
            _log_re.info("%s: re-tracing because %s", self.name, reason)
            _warn_retraces(self, reason)
        device = leaves[0].device if leaves else cpu(0)
        t0 = time.perf_counter()
        names = {}
        if self.owner is not None and hasattr(self.owner, "collect_params"):
            names = {id(p): k for k, p in self.owner.collect_params().items()}
        trace = Trace(self.name, device, names)
        tracers = [Tracer(trace, trace.graph.add_input(Spec(a.shape, a._dtype), f"in{i}",
                                                       str(a.device)), Spec(a.shape, a._dtype),
                          a.device) for i, a in enumerate(leaves)]
        in_nodes = [t._nid for t in tracers]
        targs, tkwargs = unflatten(tree, tracers)
        loc = _state.local
        old, loc.trace = loc.trace, trace
        try:
            # deferred shapes are inferred here, while tracing: forward runs once per call,
            # its side effects (BatchNorm's statistics, a print) included
            out = self.fn(*targs, **tkwargs)
        finally:
            loc.trace = old
        out_leaves, out_tree = flatten(out)
        for o in out_leaves:
            if not isinstance(o, Tracer) or o._trace is not trace:
                raise TraceError(f"{self.name}: forward returned an array that was not computed "
                                 "from its inputs (a captured constant); return hybrid ops of "
                                 "the inputs")
        g = trace.graph
        g.outputs = [o._nid for o in out_leaves]
        n_user = len(g.outputs)
        updates = []
        for p, nid in trace.state_updates:
            updates.append((p, len(g.outputs)))
            g.outputs.append(nid)
        key_nodes = [nid for nid, _ in trace.key_inputs]
        g.inputs = [n for n in g.inputs if n not in key_nodes] + key_nodes  # keys come last
        writes = []  # inputs written in forward (x[:] = v, x += 1): their last value goes back
        for i, (t, nid) in enumerate(zip(tracers, in_nodes)):
            if t._nid != nid:
                writes.append((i, len(g.outputs)) + _sources(g, t._nid))
                g.outputs.append(t._nid)
        g.remove_dead()
        entry = Compiled(sig, g, trace.params, out_tree, n_user, updates,
                         [d for _, d in trace.key_inputs], self.backend_for(device),
                         param_devices=trace.param_devices,
                         trace_seconds=time.perf_counter() - t0, input_writes=writes,
                         first_keys=list(trace.first_keys))
        if prepare is not None:
            entry = prepare(entry)
            if entry is None:
                return None
        # the inference executable compiles when a call needs it (Compiled.exe): not for
        # a training call, which compiles the forward and backward pair instead
        entry.device = device
        entry.direct_ok = not entry.uses_key and not updates and not writes
        if prepare is None:
            self.entries[sig] = entry
        return entry

    def report(self) -> str:
        return explain_cache(self)


def _sources(g, nid):
    """(input positions, parameter positions) the value ``nid`` is computed from: a value
    written back to an input is tracked by autograd only if one of them needs a gradient."""
    up = nx.ancestors(g.g, nid) | {nid}
    return (tuple(i for i, n in enumerate(g.inputs) if n in up),
            tuple(i for i, n in enumerate(g.params) if n in up))


RETRACE_WARN = 8  # signatures one block compiles before the one-time warning says why


def _warn_retraces(cf, reason):
    """Once per block: it is compiling its RETRACE_WARN-th input signature; say what keeps
    changing and what to do (every re-trace is on HYBRID_LOG=recompiles)."""
    # graphs compiled for exact signatures (shape buckets are a few powers of two at most,
    # and a size a bucket serves compiles nothing)
    n = sum(not hasattr(e, "bucket_run") for e in cf.entries.values()) + 1
    if n < RETRACE_WARN or getattr(cf, "_retrace_warned", False):
        return
    cf._retrace_warned = True
    recent = [r for r, _ in cf.retraces[-(RETRACE_WARN - 1):]]
    if recent and all("changed shape" in r for r in recent):
        why = next(iter(cf.no_buckets.values()), None)
        fix = ("a new batch size or sequence length traces and compiles again" +
               (f" (shape buckets do not apply: {why})" if why else "") +
               ": feed a few fixed sizes (pad the last batch, bucket sequence lengths), or "
               "keep the block un-hybridized while sizes vary")
    else:
        fix = "keep the arguments' dtypes, devices, structure and train/predict mode steady"
    import warnings  # noqa: PLC0415 - once per process at most
    warnings.warn(f"{cf.name}: hybridized block re-traced {n - 1} times ({n} compiled "
                  f"signatures; the last because {reason}): {fix}. HYBRID_LOG=recompiles "
                  "names every re-trace.", RuntimeWarning, stacklevel=5)


def _why_retrace(old_sigs, sig) -> str:
    """The difference to the closest cached signature, named field by field."""
    best = None
    for prev in old_sigs:
        diffs = []
        if prev[0] != sig[0]:
            diffs.append("the argument structure changed")
        if prev[2] != sig[2]:
            diffs.append(f"the mode changed to {'training' if sig[2] else 'predict'}")
        if len(prev[1]) != len(sig[1]):
            diffs.append(f"the number of array arguments changed ({len(prev[1])} -> "
                         f"{len(sig[1])})")
        else:
            for i, (a, b) in enumerate(zip(prev[1], sig[1])):
                for field, x, y in zip(("shape", "dtype", "device"), a, b):
                    if x != y:
                        diffs.append(f"array argument {i} changed {field}: {x} -> {y}")
        if best is None or len(diffs) < len(best):
            best = diffs
    return "; ".join(best) if best else "a new signature"


@functools.cache  # importability does not change within a process
def _llvm_available() -> bool:
    try:
        import compiler.codegen  # noqa: F401,PLC0415
        from compiler.codegen import backend_compile  # noqa: F401,PLC0415
        return True
    except ImportError:
        return False


# ============================================================ running
def _param_handles(entry):
    """The parameters' arrays (each on the device it was traced on); cached until some
    Parameter's arrays are replaced (in-place updates rebind an array's buffer, not the
    array: the cache holds)."""
    cached = entry.handles
    epoch = _param_epoch[0]
    if cached and cached[0] == epoch:
        return cached[1]
    with suspended():
        handles = [p.data(d) for p, d in zip(entry.params, entry.param_devices)]
    for p, h, nid in zip(entry.params, handles, entry.graph.params):
        spec = entry.graph.spec(nid)
        if (tuple(h.shape), h._dtype) != (tuple(spec.shape), spec.dtype):
            raise RuntimeError(
                f"Parameter '{getattr(p, 'name', p)}' is now {h._dtype}{list(h.shape)} but was "
                f"{spec.dtype}{list(spec.shape)} when the graph was compiled (a cast or a "
                "re-initialization of the parameter alone): call block.cast(dtype) on the "
                "block, or hybridize() it again, so it re-traces")
    entry.handles = (epoch, handles)
    return handles


def _needs_grad(a) -> bool:  # as autograd's: a value of a freed graph is a constant
    return (a._node is not None and not a._node[0].freed) or a._grad_req != "null"


def _run(entry: Compiled, leaves, name):
    padded = getattr(entry, "bucket_run", None)  # a size served by a shape bucket
    if padded is not None:
        return padded(leaves, name)
    device = leaves[0].device if leaves else cpu(0)
    handles = _param_handles(entry)
    inputs = list(leaves)
    if entry.key_devices:
        inputs += _keys(entry)
    recording = _state.is_recording()
    if recording and any(_needs_grad(a) for a in inputs + handles):
        outs = _run_training(entry, inputs, handles, device, name)
    else:
        exe = entry.compiled_exe or entry.exe  # (the property compiles it on first use)
        outs = _push(exe, device, [a._buf for a in inputs], [h._buf for h in handles],
                     exe.out_specs, name)
    for p, k in entry.state_updates:
        handles[entry.params.index(p)]._buf = outs[k]._buf
        rebind_token[0] = object()
    for i, k, from_inputs, from_params in entry.input_writes:
        new = outs[k]
        if not (recording and (any(_needs_grad(inputs[j]) for j in from_inputs) or
                               any(_needs_grad(handles[j]) for j in from_params))):
            new = new.detach()  # as eager: a value computed from nothing tracked has no node
        leaves[i]._rebind(new)
    if entry.out_tree == _SINGLE:  # the common case: one array out
        return outs[0]
    return unflatten(entry.out_tree, outs[:entry.n_user_out])


def _keys(entry):
    """One key array per random op: the tracing call's own keys once (taken from the stream
    where eager would take them), then the stream's next keys, in program order."""
    from .random import device_key, next_key  # noqa: PLC0415
    first, entry.first_keys = entry.first_keys, []
    keys = first or [next_key(d) for d in entry.key_devices]
    return [device_key(k, d) for k, d in zip(keys, entry.key_devices)]


_SINGLE = ("a",)


def _training(entry, device, needs):
    """The forward-for-training and backward executables for the inputs and parameters that
    need gradients (``needs``: one flag per input then per parameter): a gradient nobody
    asked for (the batch, a frozen layer) is never computed."""
    compiled = entry.train.get(needs)
    if compiled is None:
        from compiler.autodiff import split_joint  # noqa: PLC0415
        from compiler.exe_cache import compile as compile_graph  # noqa: PLC0415
        g = entry.graph
        n_in = len(g.inputs)
        wrt_in = [i for i, n in enumerate(g.inputs)
                  if needs[i] and g.spec(n).dtype.startswith("float")]
        wrt_par = [i for i, n in enumerate(g.params)
                   if needs[n_in + i] and g.spec(n).dtype.startswith("float")]
        wrt = [g.inputs[i] for i in wrt_in] + [g.params[i] for i in wrt_par]
        tg = split_joint(g, wrt)
        fwd_rows = bwd_rows = None
        if entry.rows:  # a shape bucket: both halves may compute the real rows only
            from compiler.passes.row_bounds import training_rows  # noqa: PLC0415
            fwd_rows, bwd_rows = training_rows(tg, entry.rows)
        fwd = compile_graph(tg.forward, entry.backend, device, rows=fwd_rows)
        bwd = compile_graph(tg.backward, entry.backend, device, rows=bwd_rows)
        if fwd_rows and not (fwd.report.get("row_bounds") and bwd.report.get("row_bounds")):
            # one half computes every padded row: it would read rows the other never wrote
            tg.backward.inputs.pop()  # (training_rows' count input: read by nothing now)
            fwd = compile_graph(tg.forward, entry.backend, device)
            bwd = compile_graph(tg.backward, entry.backend, device)
            bwd_rows = None
        _compiles[0] += 2
        # outputs computed from nothing that needs a gradient get no autograd node, as
        # eagerly (a constant, or the batch alone): their positions, once per `needs`
        n_in = len(g.inputs)
        sources = [_sources(g, o) for o in g.outputs]
        untracked = tuple(k for k, (ins, pars) in enumerate(sources) if not any(
            needs[j] for j in ins) and not any(needs[n_in + j] for j in pars))
        compiled = entry.train[needs] = (tg, fwd, bwd, wrt_in, wrt_par, Caller(fwd, device),
                                         Caller(bwd, device), untracked, bool(bwd_rows))
    return compiled


def _run_training(entry, inputs, handles, device, name):
    """A recorded call: the forward-for-training executable now (through its Caller: in
    this thread when the inputs are ready and the call is quick or found faster so, else on
    the engine), the backward one when autograd asks for it."""
    record_custom = sys.modules["hybrid.autograd"].record_custom  # imported by hybrid/__init__
    needs = tuple(_needs_grad(a) for a in inputs) + tuple(_needs_grad(h) for h in handles)
    tg, fwd, bwd, wrt_in, wrt_par, run_fwd, run_bwd, untracked, counted = _training(
        entry, device, needs)
    outs = run_fwd(inputs, handles, name)
    g = entry.graph
    n_out = len(g.outputs)
    fg = tg.forward  # the residuals' graph (it may read a control node's extra results)
    extra = {nid: outs[n_out + k] for k, nid in
             enumerate(r for r in tg.residuals if fg.op(r) not in ("input", "param"))}
    res = []  # the residuals as they are now: an input or parameter rebound before backward
    for r in tg.residuals:  # (an in-place update) must not change this call's gradients
        if r in extra:
            res.append(extra[r])
        else:
            a = inputs[g.inputs.index(r)] if fg.op(r) == "input" else \
                handles[g.params.index(r)]
            res.append(a.detach())  # the buffer it has now
    user_outs = outs[:n_out]
    record_inputs = inputs + handles

    reached = tg.reached
    if counted:  # a row-bounded bucket's backward reads the real count too (the last input)
        res.append(inputs[entry.rows["count"]])

    def backward_fn(out_grads):
        # an input or parameter the outputs do not reach gets no gradient (None), as eagerly:
        # its .grad keeps what it held (a block whose layer's output is overwritten, unused)
        grads = run_bwd(res[:len(tg.residuals)] + list(out_grads) + res[len(tg.residuals):],
                        (), f"{name}_backward")
        result = [None] * len(record_inputs)
        for k, i in enumerate(wrt_in):
            if reached[k]:
                result[i] = grads[k]
        for k, i in enumerate(wrt_par):
            if reached[len(wrt_in) + k]:
                result[len(inputs) + i] = grads[len(wrt_in) + k]
        return result

    record_custom(f"hybridized:{name}", record_inputs, user_outs, backward_fn)
    for k in untracked:
        user_outs[k]._node = None
    return outs


# ============================================================ functions + reports
class HybridFunction:
    """``hb.hybridize(fn)``: a plain function traced and compiled per input signature."""

    def __init__(self, fn, **flags):
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "function")
        self.cache = CachedFunction(fn, self.__name__, flags)

    def __call__(self, *args, **kwargs):
        return self.cache(args, kwargs)

    def report(self) -> str:
        return self.cache.report()


# Gluon's hybridize() flags: `backend` picks the code generator; the others are MXNet's,
# accepted so the book's code runs (this compiler always plans memory statically).
HYBRIDIZE_FLAGS = ("active", "backend", "backend_opts", "static_alloc", "static_shape",
                   "inline_limit", "forward_bulk_size", "backward_bulk_size", "clear",
                   "partition_if_dynamic")


def check_flags(flags, who="hybridize"):
    """Refuse a misspelt flag (static_aloc=True) instead of ignoring it."""
    unknown = sorted(set(flags) - set(HYBRIDIZE_FLAGS))
    if unknown:
        raise TypeError(f"{who}() got unknown flag(s) {', '.join(unknown)}; the known flags "
                        f"are {', '.join(HYBRIDIZE_FLAGS)}")


def hybridize(fn=None, **flags):
    """Decorator: ``@hb.hybridize`` or ``@hb.hybridize(backend="reference")`` (like jax.jit)."""
    check_flags(flags)
    if fn is None:
        return lambda f: HybridFunction(f, **flags)
    return HybridFunction(fn, **flags)


def call_cached(block, args, kwargs):
    """HybridBlock.__call__ when hybridized."""
    cache = getattr(block, "_cached", None)
    if not isinstance(cache, CachedFunction):
        flags = getattr(block, "_hybrid_flags", {}) or {}
        cache = CachedFunction(block.forward, type(block).__name__, flags, owner=block)
        block._cached = cache
    return cache(args, kwargs)


def explain_cache(cache: CachedFunction) -> str:
    lines = [f"== {cache.name}: {len(cache.entries)} compiled signature(s), "
             f"{len(cache.retraces)} re-trace(s) =="]
    for reason, _ in cache.retraces:
        lines.append(f"  re-traced: {reason}")
    for sig, e in cache.entries.items():
        args = ", ".join(f"{Spec(s, d)}@{dev}" for s, d, dev in sig[1])
        mode = "training" if sig[2] else "predict"
        # an entry only ever trained has no inference executable (Compiled.exe): say so,
        # rather than compile one to explain it
        exe = e.compiled_exe if isinstance(e, Compiled) else e.exe
        done = (f"compiled in {exe.report.get('compile_seconds', 0) * 1e3:.1f} ms"
                if exe is not None else "its inference executable not compiled (only "
                f"training calls so far: {len(getattr(e, 'train', {}))} forward/backward "
                "pair(s))")
        lines.append(f"-- signature ({args}) [{mode}], backend {e.backend}, traced in "
                     f"{e.trace_seconds * 1e3:.1f} ms, {done}")
        report = exe.report if exe is not None else {}
        if hasattr(e, "pieces"):  # a size a shape bucket serves (hybrid/buckets.py)
            bounded = report.get("row_bounds")
            lines.append(f"   runs the shape bucket of {e.padded} rows" +
                         (f" in {e.pieces} pieces" if e.pieces > 1 else "") +
                         (f": its program computes the real rows only ({bounded} kernel(s) "
                          "bounded)" if bounded else ": every padded row computed"))
        counts = e.graph.op_counts()
        lines.append("   nodes: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        lines.append(e.graph.format())
        if report.get("exe_cache"):
            lines.append(f"   passes: none run (executable cache hit: {report['exe_cache']})")
        for rep in report.get("passes", []):
            summary = rep.get("summary") or ", ".join(
                f"{k}={v}" for k, v in rep.items() if k not in ("pass", "seconds", "details"))
            lines.append(f"   pass {rep['pass']}: {summary} ({rep['seconds'] * 1e3:.1f} ms)")
        extra = report.get("explain")
        if extra:
            lines.append(extra)
    return "\n".join(lines)


def explain(obj, *inputs) -> str:
    """The compiled signatures, re-traces, graph, passes and plans of a hybridized block or
    function; with inputs, calls it first so there is something to explain."""
    if inputs:
        obj(*inputs)
        _engine_mod.get_engine().wait_all()
    cache = obj.cache if isinstance(obj, HybridFunction) else getattr(obj, "_cached", None)
    if not isinstance(cache, CachedFunction):
        return f"{type(obj).__name__} is not hybridized (call .hybridize() and then call it)"
    return explain_cache(cache)
