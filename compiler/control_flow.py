"""What the control-flow ops do, how they are differentiated, and how they compile.

One loop runner per op (``run_control``) serves every backend: it is handed a ``run_body``
that runs a body's compiled executable (or the NumPy interpreter, for the reference oracle),
so a loop's body is a graph of its own, optimized by the whole pass list (fusion and a memory
plan inside the loop) and compiled once, whatever the number of steps. On LLVM all of a
foreach's steps are one native call (``run_steps``: codegen/llvm/steps.py); elsewhere each
step is a call writing straight into the rows preallocated for all steps.

Gradients (``control_grad``): a ``foreach`` is differentiated by a reverse ``foreach``. In
a training graph (``training_form``) each forward step also saves its body's residuals (the
gates of an LSTM), and the reverse scan runs the body's own backward graph; otherwise the
reverse scan runs the forward body again from the states each step started from, then its
vector-Jacobian product. The captured values' gradients (the weights) are summed in carried
states. A ``while_loop``'s gradient is the same reverse scan over the steps actually taken
(a ``counted`` foreach, bounded by ``max_iterations``); a ``cond``'s is a ``cond`` of the
two branches' VJPs, so only the branch taken is differentiated.
"""
from __future__ import annotations

import collections
import concurrent.futures
import math
import os

import numpy as np

from runtime import config, engine
from runtime.executable import Executable
from runtime.memory import host_pool

from .graph import Graph, NodeRef
from .ops.control import CONTROL_OPS, Body

FLOATS = ("float16", "float32", "float64")
_log = config.logger("compile")


# ============================================================ running
def _zeros(xp, shape, dtype):
    return xp.zeros(tuple(shape), dtype=dtype)


def _rows(xp, shape, dtype, written: int, zero_rest: bool = True):
    """A buffer of stacked rows whose first ``written`` rows a loop writes: the rest are
    zeroed, unless no one reads them (``zero_rest`` False: a shape bucket whose programs
    compute its real rows only, compiler/passes/row_bounds.py; zeroing 54 of a 64-step
    bucket's rows cost ~3 ms of a language model's training step). On the host big ones
    come from the host pool (recycled pages: a fresh 4.6 MB buffer of an LSTM's gate
    gradients costs ~1 ms of page faults per step)."""
    shape = tuple(shape)
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    pool = host_pool() if xp is np and nbytes > 4096 else None
    if pool is None:
        return _zeros(xp, shape, dtype) if zero_rest else xp.empty(shape, dtype)
    a = pool.empty(shape, np.dtype(dtype), nbytes)[0]
    if zero_rest:
        a[written:] = 0
    return a


def _host(xp, v):
    """A 0-d (or one-element) value on the host: a GPU's is copied back (a sync point, as
    a Python ``if`` on a CUDA tensor is in PyTorch)."""
    return np.asarray(v.get() if hasattr(v, "get") else v).reshape(())


def _truth(xp, v) -> bool:
    return bool(_host(xp, v))


def run_control(xp, op, args, attrs, run_body, wanted=None, run_steps=None,
                zero_rest=True):
    """The results of control op ``op`` on raw arrays. ``run_body(name, inputs) -> outputs``
    runs the body attribute ``name``; ``run_body(name, inputs, targets) -> bool`` runs it
    writing its outputs into ``targets`` where it can (False: not run). ``wanted``: the
    result indices someone reads (None: all), so an inference call never stacks the states
    a gradient would need. ``run_steps(name, n, inputs, outputs) -> bool`` (where the
    backend has one) runs all of a foreach's steps in one native call."""
    if op == "foreach":
        return _run_foreach(xp, args, attrs, run_body, wanted, run_steps, zero_rest)
    if op == "while_loop":
        return _run_while(xp, args, attrs, run_body, wanted)
    if op == "cond":
        branch = "then_body" if _truth(xp, args[0]) else "else_body"
        return list(run_body(branch, list(args[1:])))
    raise ValueError(f"{op!r} is not a control-flow op")


def _run_foreach(xp, args, attrs, run_body, wanted, run_steps=None, zero_rest=True):
    """Each step writes into rows preallocated for all steps where the body's executable can
    (``run_into``): its outputs into the rows of the stacked outputs, its new states into
    the row of the states the next step starts from (kept for a gradient anyway) or else
    into one of two buffers used in turn: no allocation and no copy per step."""
    body, nd, ns = attrs["body"], attrs["n_data"], attrs["n_states"]
    args = list(args)
    count = int(_host(xp, args.pop(0))) if attrs.get("counted") else None
    seqs, states, caps = args[:nd], list(args[nd:nd + ns]), list(args[nd + ns:])
    steps = seqs[0].shape[0]
    n = steps if count is None else max(0, min(count, steps))
    outs_spec = body.out_specs
    n_out = len(outs_spec) - ns
    keep_seq = wanted is None or any(i >= n_out + ns for i in wanted)
    # rows 0..n-1 are written whichever way the steps run
    outs = [_rows(xp, (steps,) + tuple(s.shape), s.dtype, n, zero_rest)
            for s in outs_spec[:n_out]]
    if run_steps is not None and n and not (keep_seq and attrs.get("reverse")):
        done = _native_steps(xp, attrs, run_steps, n, steps, seqs, states, caps, outs,
                             zero_rest,
                             keep_seq)
        if done is not None:
            return done
    seq = [_rows(xp, (steps,) + tuple(s.shape), s.dtype, n, zero_rest) for s in states] \
        if keep_seq else \
        [None] * ns
    order = list(reversed(range(n)) if attrs.get("reverse") else range(n))
    turns = [[xp.empty(s.shape, s.dtype) for s in states] for _ in range(2)]
    for j, t in enumerate(order):
        if keep_seq and j == 0:
            for k, s in enumerate(states):
                seq[k][t] = s
        # rows as views (x[t, ...] is a 0-d array where x[t] would be a NumPy scalar)
        if keep_seq and j + 1 < len(order):  # the next step's starting states: its row
            new = [seq[k][order[j + 1], ...] for k in range(ns)]
        else:
            new = list(turns[j % 2])
        step_in = [s[t, ...] for s in seqs] + states + caps
        targets = [outs[k][t, ...] for k in range(n_out)] + new
        if not run_body("body", step_in, targets):
            res = run_body("body", step_in)
            for k in range(n_out + ns):
                targets[k][...] = res[k]
        states = new
    if n and keep_seq:  # the final states are a row view: a result is an array of its own
        states = [s.copy() for s in states]
    if not keep_seq:  # results nobody reads: empty stand-ins of the right type are enough
        seq = [_zeros(xp, (steps,) + tuple(s.shape), s.dtype) if steps == 0 else None
               for s in states]
    return outs + states + seq


def _native_steps(xp, attrs, run_steps, n, steps, seqs, states, caps, outs, zero_rest,
                  keep_seq):
    """All ``n`` steps in one native call: the states live in rows 0..n of one buffer (step
    j reads row j, writes row j + 1, in the order the steps run), data and output rows are
    read and written in place; None when the backend declines."""
    rev = bool(attrs.get("reverse"))
    first, step = (n - 1, -1) if rev else (0, 1)
    # rows past n + 1: a counted scan never reaches them
    ext = [_rows(xp, (max(n, steps) + 1,) + tuple(s.shape), s.dtype, n + 1, zero_rest)
           for s in states]
    for e, s in zip(ext, states):
        e[0] = s
    # a data array whose rows are not contiguous (the cotangent of one direction's half of a
    # bidirectional layer's output) is copied once, rather than the loop run step by step
    seqs = [np.ascontiguousarray(s) if isinstance(s, np.ndarray) else s for s in seqs]
    ins = [("rows", s, first, step) for s in seqs] + [("rows", e, 0, 1) for e in ext] + \
        [("fixed", c) for c in caps]
    res = [("rows", o, first, step) for o in outs] + [("rows", e, 1, 1) for e in ext]
    if not run_steps("body", n, ins, res):
        return None
    finals = [e[n].copy() for e in ext]
    # forward only (see the caller): row t is the state step t started from
    seq = [e[:steps] for e in ext] if keep_seq else [None] * len(states)
    return outs + finals + seq


def _run_while(xp, args, attrs, run_body, wanted):
    nv, cap = attrs["n_vars"], attrs["max_iterations"]
    lvars, caps = list(args[:nv]), list(args[nv:])
    outs_spec = attrs["func"].out_specs
    n_out = len(outs_spec) - nv
    keep_seq = wanted is None or any(i > n_out + nv for i in wanted)
    outs = [_zeros(xp, (cap,) + tuple(s.shape), s.dtype) for s in outs_spec[:n_out]]
    seq = [_zeros(xp, (cap,) + tuple(v.shape), v.dtype) for v in lvars] if keep_seq else \
        [None] * nv
    n = 0
    while n < cap and _truth(xp, run_body("cond", lvars + caps)[0]):
        if keep_seq:
            for k, v in enumerate(lvars):
                seq[k][n] = v
        res = run_body("func", lvars + caps)
        for k in range(n_out):
            outs[k][n] = res[k]
        lvars = list(res[n_out:])
        n += 1
    return outs + lvars + [xp.asarray(np.int64(n))] + seq


def run_reference_control(xp, op, args, attrs):
    """The registry's eager implementation (the NumPy interpreter's): bodies interpreted."""
    from .reference import ReferenceProgram  # noqa: PLC0415 - reference imports the ops

    progs = {}

    def run_body(name, inputs, targets=None):
        if targets is not None:
            return False
        if name not in progs:
            progs[name] = ReferenceProgram(attrs[name].graph)
        return progs[name](xp, inputs, [])
    return tuple(run_control(xp, op, args, attrs, run_body))


# ============================================================ compiling
def has_control(graph: Graph) -> bool:
    return any(graph.op(n) in CONTROL_OPS for n in graph.g.nodes)


def is_control_part(graph: Graph) -> bool:
    """A part holding one control node and the nth nodes reading it (see partition)."""
    ops = [graph.op(n) for n in graph.g.nodes if graph.op(n) not in ("input", "param", "const")]
    return sum(op in CONTROL_OPS for op in ops) == 1 and \
        all(op in CONTROL_OPS or op == "nth" for op in ops) and \
        all(graph.op(o) == "nth" for o in graph.outputs)


# compiled bodies by (content, backend, device): a body does not depend on the number of
# steps, so every sequence length (each its own outer graph) shares one body executable
_BODIES: collections.OrderedDict = collections.OrderedDict()
_BODIES_MAX = 64


def _body_graph(body: Body):
    """The graph a body compiles: each output a buffer of its own (the loop writes them into
    rows of its results)."""
    g = body.graph.copy()
    g.meta["distinct_outputs"] = True
    return g


def _compiled_body(body: Body, backend, device, compile_body):
    key = (body, backend, str(device))
    exe = _BODIES.get(key)
    if exe is None:
        exe = _BODIES[key] = compile_body(_body_graph(body))
        if len(_BODIES) > _BODIES_MAX:
            _BODIES.popitem(last=False)
    else:
        _BODIES.move_to_end(key)
    return exe


# ------------------------------------------------------------ a loop split across the batch
# A foreach whose body keeps the rows of its batch apart (an RNN step) runs as independent
# loops over slices of the batch, one thread each, all steps in one native call per thread:
# no barrier per step. Splitting each step's products across the pool instead measured
# ~1.35x on two cores for an LSTM(256)'s 32 x 256 x 1024 step GEMM (a pool hand-off per
# step) and nothing inside the loop.
SPLIT_MIN_WORK = 1 << 20  # multiply-adds of a step's products below which a loop stays whole
SPLIT_MIN_ROWS = 4  # rows per thread at least


class _SplitLoop:
    """Runs a foreach body's steps as ``len(runs)`` loops over slices of ``size`` rows."""

    def __init__(self, runs, size):
        self.runs, self.size = runs, size

    def __call__(self, n, ins, outs) -> bool:
        def part(plans, w):
            lo, hi = w * self.size, (w + 1) * self.size
            return [("rows", p[1][:, lo:hi], p[2], p[3]) if p[0] == "rows" else p
                    for p in plans]
        for r in self.runs:  # each thread alone on its core: no pool under the products
            r.compiled.set_threads(1)
        rest = None
        if engine.threads_per_cpu_device() > 1:  # else the device's share is one core
            try:
                pool = _loop_threads(len(self.runs) - 1)
                rest = [pool.submit(r.run_steps, n, part(ins, w), part(outs, w))
                        for w, r in enumerate(self.runs) if w]
            except RuntimeError:  # the interpreter is exiting: no new threads
                rest = None
        if rest is None:  # one slice after another
            return all([r.run_steps(n, part(ins, w), part(outs, w))
                        for w, r in enumerate(self.runs)])
        ok = self.runs[0].run_steps(n, part(ins, 0), part(outs, 0))
        timeout = config.get("HYBRID_WAIT_TIMEOUT")
        for f in rest:  # every slice has finished writing before the caller reads a row
            try:
                ok = f.result(timeout) and ok
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"a loop slice ran past HYBRID_WAIT_TIMEOUT ({timeout} s)")\
                    from None
        return ok  # False: a slice declined; the caller runs the whole loop again


_threads: dict = {}


def _loop_threads(n: int):
    """The process's threads for the other slices of split loops (new ones after a fork)."""
    pid = os.getpid()
    pool = _threads.get("pool")
    if pool is None or _threads.get("pid") != pid or _threads.get("n", 0) < n:
        pool = concurrent.futures.ThreadPoolExecutor(max(n, 1), "hybrid-loop")
        _threads.update(pool=pool, pid=pid, n=max(n, 1))
    return pool


def _step_work(graph: Graph) -> int:
    """Multiply-adds of one step's matrix products."""
    total = 0
    for n in graph.op_nodes():
        if graph.op(n) == "matmul":
            a, b = (graph.spec(x).shape for x in graph.arg_ids(n))
            total += math.prod(graph.spec(n).shape) * (a[-1] if a else 1)
    return total


def _split_loop(attrs, backend, device, compile_body):
    """A _SplitLoop for a foreach on the LLVM backend whose body keeps its batch rows apart
    and is worth splitting, else None."""
    from .codegen.extern_plan import max_workers  # noqa: PLC0415
    from .passes.resize import NotResizable, resize_batch  # noqa: PLC0415
    workers = max_workers()
    body = attrs["body"].graph
    batched = body.inputs[:attrs["n_data"] + attrs["n_states"]]
    if backend != "llvm" or workers < 2 or not batched or _step_work(body) < SPLIT_MIN_WORK \
            or any(body.spec(i).ndim == 0 for i in batched):
        return None
    rows = body.spec(batched[0]).shape[0]
    while workers > 1 and (rows % workers or rows // workers < SPLIT_MIN_ROWS):
        workers -= 1
    if workers < 2:
        return None
    try:
        part = resize_batch(body, batched, rows // workers)
    except NotResizable as exc:
        _log.debug("foreach body not split across threads: %s", exc)
        return None
    run = getattr(_compiled_body(Body(part), backend, device, compile_body), "run", None)
    if not hasattr(run, "twin"):
        return None
    return _SplitLoop([run] + [run.twin() for _ in range(workers - 1)], rows // workers)


def _check_one_device(op, attrs, device):
    """A body runs where its loop runs: its steps pass the device's arrays straight to the
    body's executable, with no copy between devices (a CPU part of a GPU loop's body would
    be native CPU code handed GPU memory)."""
    from .passes.partition import devices_of  # noqa: PLC0415 - partition imports the ops

    if device is None:
        return
    for name, body in attrs.items():
        if isinstance(body, Body):
            other = devices_of(body.graph) - {str(device)}
            if other:
                raise ValueError(
                    f"{op}: its {name} graph has ops on {', '.join(sorted(other))} while the "
                    f"loop runs on {device}; a loop body runs on one device: move its "
                    f"arrays to {device} before the loop")


def compile_control(graph: Graph, backend: str, device, compile_body,
                    shared: bool = True) -> Executable:
    """The executable of a control part: its bodies compiled by ``compile_body(graph)`` (the
    same backend and device), run by the op's loop runner; ``shared``: bodies compiled
    before (the default pass list) are reused."""
    (node,) = [n for n in graph.g.nodes if graph.op(n) in CONTROL_OPS]
    d = graph.node(node)
    op, attrs = d["op"], d["attrs"]
    _check_one_device(op, attrs, device)
    bodies = {k: _compiled_body(v, backend, device, compile_body) if shared
              else compile_body(_body_graph(v)) for k, v in attrs.items() if isinstance(v, Body)}
    # a body holding control flow itself is parts: run in order within the loop's step
    runs = {k: exe.run if isinstance(exe, Executable) else exe.run_in_order
            for k, exe in bodies.items()}
    sources = []  # per operand: ("input", i) / ("param", i) / ("const", array)
    for a in graph.arg_ids(node):
        kind = graph.op(a)
        if kind == "input":
            sources.append(("input", graph.inputs.index(a)))
        elif kind == "param":
            sources.append(("param", graph.params.index(a)))
        else:
            sources.append(("const", graph.constants[graph.node(a)["attrs"]["name"]]))
    picks = []  # per part output: the result index it is
    for o in graph.outputs:
        if graph.op(o) != "nth" or graph.arg_ids(o) != [node]:
            raise ValueError("a control part's outputs are the results of its node")
        picks.append(graph.node(o)["attrs"]["index"])
    wanted = frozenset(picks)

    into = {k: getattr(getattr(exe, "run", None), "run_into", None)
            for k, exe in bodies.items()}
    native = {k: getattr(getattr(exe, "run", None), "run_steps", None)
              for k, exe in bodies.items()}

    split = _split_loop(attrs, backend, device, compile_body) \
        if op == "foreach" and shared and native.get("body") is not None else None

    def run_steps(name, n, ins, outs):
        if split is not None and name == "body" and n > 1 and split(n, ins, outs):
            return True
        return native[name] is not None and native[name](n, ins, outs)

    def run(xp, inputs, params):
        def run_body(name, vals, targets=None):
            if targets is None:
                return runs[name](xp, vals, [])
            return into[name] is not None and into[name](xp, vals, targets)
        args = [inputs[i] if kind == "input" else params[i] if kind == "param"
                else xp.asarray(i) for kind, i in sources]
        res = run_control(xp, op, args, attrs, run_body, wanted, run_steps,
                          options["zero_rest"])
        return [res[k] for k in picks]

    # zero_rest: rows a counted scan does not reach are zeroed, unless the graph around it
    # computes its real rows only (pipeline._compile_parts clears it: no one reads them)
    options = {"zero_rest": True}
    report = {"control": op, "bodies": {k: exe.report for k, exe in bodies.items()},
              "loop_options": options,
              "passes": [r for exe in bodies.values() for r in exe.report.get("passes", [])],
              "graph": graph,
              "explain": f"   {op} over bodies " + ", ".join(
                  f"{k} ({len(v.graph)} nodes)" for k, v in attrs.items()
                  if isinstance(v, Body))}
    return Executable(run, backend, [graph.spec(n) for n in graph.inputs],
                      [graph.spec(n) for n in graph.params],
                      [graph.spec(o) for o in graph.outputs], device, report)


# ============================================================ gradients
def _vjp_body(body: Body, wrt: list, name: str) -> Body:
    """A body computing the vector-Jacobian product of ``body``: inputs ``body``'s inputs,
    then one cotangent per output; outputs the gradient of each input index in ``wrt``."""
    from .autodiff import differentiate  # noqa: PLC0415 - autodiff imports the ops

    fwd = body.graph
    joint, grad_inputs, grads, _ = differentiate(fwd, [fwd.inputs[i] for i in wrt])
    joint.inputs = list(fwd.inputs) + list(grad_inputs)
    joint.outputs = list(grads)
    joint.name = name
    joint.remove_dead()
    return Body(joint)


def _zeros_like_sym(F, spec):
    return F.full(shape=tuple(spec.shape), value=0.0, dtype=spec.dtype)


def _results_of(graph: Graph, tup: int, count: int, F) -> list:
    """The nth nodes reading every result of ``tup`` (created where missing)."""
    from .autodiff import Sym  # noqa: PLC0415

    have = {graph.node(u)["attrs"]["index"]: u for u in graph.users(tup)
            if graph.op(u) == "nth"}
    return [Sym(graph, have[k]) if k in have else F.nth(Sym(graph, tup), index=k)
            for k in range(count)]


def control_grad(F, op, inputs, out, g, attrs):
    """Input gradients of a control node; ``g`` holds one cotangent per result (None where
    nothing reads it)."""
    graph = out.graph
    results = graph.node(out.id)["results"]
    res = _results_of(graph, out.id, len(results), F)
    if op == "foreach":
        return _foreach_grad(F, inputs, res, g, attrs)
    if op == "while_loop":
        return _while_grad(F, inputs, res, g, attrs)
    return _cond_grad(F, inputs, g, attrs)


def _is_float(sym) -> bool:
    return hasattr(sym, "dtype") and sym.dtype in FLOATS


def _cot(F, g, like):
    return g if g is not None else _zeros_like_sym(F, like.graph.spec(like.id))


def _scan_back(F, body: Body, seqs, states, caps, g_seq, g_final, states_seq, count=None):
    """The reverse scan of a loop that kept only the states each step started from: its
    body runs the forward body again and then its VJP (a while_loop's gradient, and a
    foreach's outside training_form). Returns (gradients of the data rows, of the initial
    states, of the captured values), None where not float."""
    n_data, n_states = len(seqs), len(states)
    inputs = list(seqs) + list(states) + list(caps)
    wrt = [i for i, a in enumerate(inputs) if _is_float(a)]
    if not wrt:
        return [None] * len(seqs), [None] * len(states), [None] * len(caps)
    vjp = _vjp_body(body, wrt, f"{body.graph.name}_vjp")
    sources = [("data", i) for i in range(n_data)] + [("state", k) for k in range(n_states)] \
        + [("cap", j) for j in range(len(caps))]
    return _reverse_scan(F, vjp.graph, sources, wrt, n_data, n_states, seqs, states, caps,
                         states_seq, [], g_seq, g_final, count)


def _reverse_scan(F, vjp: Graph, sources, wrt, n_data, n_states, seqs, states, caps,
                  states_seq, saved, g_seq, g_final, count=None):
    """A reverse foreach running ``vjp`` (inputs: one per residual in ``sources``, then one
    cotangent per forward body output; outputs: the gradient of each forward body input
    index in ``wrt``) from the last step to the first. A residual is a row of the forward's
    data (``("data", i)``), of the states each step started from (``("state", k)``), of a
    saved step output (``("out", k)``: ``saved[k]``), or a captured value (``("cap", j)``).
    The states' cotangents are carried from step to step; the captured values' gradients
    are summed in carried accumulators."""
    from .autodiff import GraphBuilder  # noqa: PLC0415 - autodiff imports the ops

    vg = vjp.copy()
    # what this adds (accumulators, zero states) runs on the loop's device, as its body
    dev = next((vg.node(n)["device"] for n in vg.inputs), "cpu(0)")
    b = GraphBuilder(vg, device=dev)
    n_res = len(sources)
    res_in, cot_in = vg.inputs[:n_res], vg.inputs[n_res:]
    n_out = len(cot_in) - n_states
    row_in, row_args, cap_in, cap_args = [], [], [], []
    for node, (kind, i) in zip(res_in, sources):
        if kind == "cap":
            cap_in.append(node)
            cap_args.append(caps[i])
        else:
            row_in.append(node)
            row_args.append({"data": seqs, "state": states_seq, "out": saved}[kind][i])
    grads = dict(zip(wrt, vg.outputs))
    first_cap = n_data + n_states
    # a captured weight whose per-step gradient is a^T b (a recurrent matmul's weight) is
    # summed after the loop as ONE product over all steps' rows, A^T B, as cuDNN and
    # PyTorch do; the others are summed in carried accumulators
    hoisted = {i: ab for i in wrt if i >= first_cap
               for ab in [_outer_product(vg, grads[i])] if ab is not None}
    wrt_caps = [i for i in wrt if i >= first_cap and i not in hoisted]
    acc_in, new_acc = [], []
    for i in wrt_caps:
        acc = vg.add_input(vg.spec(grads[i]), f"acc{i}", dev)
        acc_in.append(acc)
        new_acc.append(b.apply("add", (NodeRef(acc), NodeRef(grads[i])), {}).id)
    new_g_states = []
    for k in range(n_states):
        if n_data + k in grads:
            new_g_states.append(grads[n_data + k])
        else:  # an integer state: no gradient flows through it
            spec = vg.spec(cot_in[n_out + k])
            new_g_states.append(b.apply("full", (), {"shape": tuple(spec.shape), "value": 0.0,
                                                     "dtype": spec.dtype}).id)
    float_rows = [i for i in range(n_data) if i in grads]
    vg.inputs = row_in + cot_in[:n_out] + cot_in[n_out:] + acc_in + cap_in
    # a product's operands come from the scan's rows: a residual row already stacked (the
    # state each step started from) is read where it is, a value the scan outputs anyway
    # (the gates' gradient) is not output twice; each output row is a per-step copy
    row_outs = [grads[i] for i in float_rows]

    def stacked(x):
        if x in row_in:
            return ("row", row_in.index(x))
        if x not in row_outs:
            row_outs.append(x)
        return ("out", row_outs.index(x))
    operands = {i: [stacked(x) for x in hoisted[i][:2]] for i in hoisted}
    vg.outputs = row_outs + new_g_states + new_acc
    vg.name = f"{vjp.name}_scan"
    vg.remove_dead()
    data = row_args + list(g_seq)
    init = list(g_final) + [_zeros_like_sym(F, caps[i - first_cap].graph.spec(
        caps[i - first_cap].id)) for i in wrt_caps]
    lead = [count] if count is not None else []
    node = F.foreach(*(lead + data + init + cap_args), body=Body(vg), n_data=len(data),
                     n_states=len(init), reverse=True, counted=count is not None)
    n_rows = len(row_outs)
    res = _results_of(node.graph, node.id, n_rows + 2 * len(init), F)
    g_rows = [None] * n_data
    for j, i in enumerate(float_rows):
        g_rows[i] = res[j]
    finals = res[n_rows:n_rows + len(init)]
    g_init = [finals[k] if _is_float(states[k]) else None for k in range(n_states)]
    g_caps = [None] * len(caps)
    for j, i in enumerate(wrt_caps):
        g_caps[i - first_cap] = finals[n_states + j]
    for i in hoisted:  # sum over steps of a_t^T b_t = A^T B, the steps' rows stacked
        # (a counted scan's rows past its count: zero gradients, finite residuals)
        a, bb = [row_args[j] if kind == "row" else res[j] for kind, j in operands[i]]
        (steps, m, k), n = a.shape, bb.shape[2]
        total = F.matmul(F.transpose(F.reshape(a, shape=(steps * m, k)), axes=(1, 0)),
                         F.reshape(bb, shape=(steps * m, n)))
        g_caps[i - first_cap] = F.transpose(total, axes=(1, 0)) if hoisted[i][2] else total
    return g_rows, g_init, g_caps


def _outer_product(g: Graph, node):
    """(a, b, False) when ``node`` is ``matmul(transpose(a), b)`` of 2-D values, (a, b, True)
    when it is that product transposed (the gradient of a weight the body transposes itself,
    ``s @ W.T``), else None."""
    if g.op(node) == "transpose" and g.spec(node).ndim == 2 and \
            g.node(node)["attrs"].get("axes") in ((1, 0), None):
        inner = _outer_product(g, g.arg_ids(node)[0])
        return None if inner is None or inner[2] else inner[:2] + (True,)
    if g.op(node) != "matmul":
        return None
    p, q = g.arg_ids(node)
    if g.op(p) != "transpose" or g.node(p)["attrs"].get("axes") not in ((1, 0), None) or \
            g.spec(p).ndim != 2 or g.spec(q).ndim != 2:
        return None
    (a,) = g.arg_ids(p)
    return a, q, False


def _foreach_grad(F, inputs, res, g, attrs):
    body, nd, ns = attrs["body"], attrs["n_data"], attrs["n_states"]
    if attrs.get("reverse"):
        raise ValueError("the gradient of a gradient's scan (second-order differentiation "
                         "through foreach) is not supported")
    count = inputs[0] if attrs.get("counted") else None  # a shape bucket's real length
    lead = (None,) if count is not None else ()
    inputs = inputs[len(lead):]
    seqs, states, caps = inputs[:nd], inputs[nd:nd + ns], inputs[nd + ns:]
    n_steps_out = len(body.out_specs) - ns
    n_out = attrs.get("n_outputs", n_steps_out)  # the user's; saved residuals after them
    outs, saved = res[:n_out], res[n_out:n_steps_out]
    finals, states_seq = res[n_steps_out:n_steps_out + ns], res[n_steps_out + ns:]
    g_seq = [_cot(F, g[k], outs[k]) for k in range(n_out)]
    g_final = [_cot(F, g[n_steps_out + k], finals[k]) for k in range(ns)]
    if attrs.get("vjp") is not None:  # training_form: the residuals were saved per step
        g_rows, g_init, g_caps = _reverse_scan(
            F, attrs["vjp"].graph, attrs["residuals"], list(attrs["wrt"]), nd, ns, seqs,
            states, caps, states_seq, saved, g_seq, g_final, count)
    else:
        g_rows, g_init, g_caps = _scan_back(F, body, seqs, states, caps, g_seq, g_final,
                                            states_seq, count)
    return lead + tuple(g_rows) + tuple(g_init) + tuple(g_caps)


def training_form(graph: Graph) -> Graph:
    """``graph`` with each foreach saving its body's residuals per step (gates, activations:
    what the body's own backward reads), so the gradient's reverse scan runs only the body's
    backward instead of the forward body again and then its VJP. Pure; only training graphs
    (compiler/autodiff.split_joint) take this form."""
    from .autodiff import split_joint  # noqa: PLC0415 - autodiff imports this module

    todo = [n for n in graph.g.nodes if graph.op(n) == "foreach"
            and not graph.node(n)["attrs"].get("reverse")
            and graph.node(n)["attrs"].get("vjp") is None]
    if not todo:
        return graph
    graph = graph.copy()
    for n in todo:
        d = graph.node(n)
        attrs = d["attrs"]
        bg, nd, ns = attrs["body"].graph, attrs["n_data"], attrs["n_states"]
        wrt = [i for i, x in enumerate(bg.inputs) if bg.spec(x).dtype in FLOATS]
        # (a counted foreach's leading step count is an argument, not a body input)
        if not wrt:
            continue
        tg = split_joint(bg, [bg.inputs[i] for i in wrt])
        n_out = len(bg.outputs) - ns
        fwd = tg.forward
        # the body's outputs (renumbered where the body's own loops took this form too),
        # then the residuals computed inside the body
        outs, computed = fwd.outputs[:len(bg.outputs)], fwd.outputs[len(bg.outputs):]
        fwd.outputs = outs[:n_out] + computed + outs[n_out:]
        sources = []
        for r in tg.residuals:
            if r in computed:
                sources.append(("out", computed.index(r)))
            else:
                i = bg.inputs.index(r)
                sources.append(("data", i) if i < nd else ("state", i - nd) if i < nd + ns
                               else ("cap", i - nd - ns))
        new_attrs = dict(attrs, body=Body(fwd), vjp=Body(tg.backward),
                         residuals=tuple(sources), wrt=tuple(wrt), n_outputs=n_out)
        shift = len(computed)  # the saved residuals come after the user's step outputs
        graph.replace_control_node(n, graph.arg_ids(n), new_attrs,
                                   lambda k: k if k < n_out else k + shift)
    return graph


def _while_grad(F, inputs, res, g, attrs):
    func, nv = attrs["func"], attrs["n_vars"]
    lvars, caps = inputs[:nv], inputs[nv:]
    n_out = len(func.out_specs) - nv
    outs, finals = res[:n_out], res[n_out:n_out + nv]
    count, vars_seq = res[n_out + nv], res[n_out + nv + 1:]
    g_seq = [_cot(F, g[k], outs[k]) for k in range(n_out)]
    g_final = [_cot(F, g[n_out + k], finals[k]) for k in range(nv)]
    # func's inputs are (vars..., caps...): a foreach body with no data rows of its own
    _, g_init, g_caps = _scan_back(F, func, [], lvars, caps, g_seq, g_final, vars_seq,
                                   count=count)
    return tuple(g_init) + tuple(g_caps)


def _cond_grad(F, inputs, g, attrs):
    operands = inputs[1:]
    wrt = [i for i, a in enumerate(operands) if _is_float(a)]
    if not wrt:
        return (None,) * len(inputs)
    then_b, else_b = attrs["then_body"], attrs["else_body"]
    outs = then_b.out_specs
    cots = [c if c is not None else _zeros_like_sym(F, s) for c, s in zip(g, outs)]
    vjp_then = _vjp_body(then_b, wrt, f"{then_b.graph.name}_vjp")
    vjp_else = _vjp_body(else_b, wrt, f"{else_b.graph.name}_vjp")
    node = F.cond(inputs[0], *operands, *cots, then_body=vjp_then, else_body=vjp_else)
    res = _results_of(node.graph, node.id, len(wrt), F)
    grads = [None] * len(operands)
    for j, i in enumerate(wrt):
        grads[i] = res[j]
    return (None,) + tuple(grads)
