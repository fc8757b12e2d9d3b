"""Tracing ``npx.foreach`` / ``while_loop`` / ``cond`` inside a hybridized forward.

Each body is traced once into a sub-graph by a :class:`SubTrace`: its explicit inputs (a
step's data rows, the states, the loop variables, the operands) come first; any value of an
enclosing trace the body reads (a parameter, an activation computed before the loop, a value
of an outer loop's body) becomes a *captured* input after them, passed by the control node.
The control node is one node of the enclosing graph (compiler/ops/control.py).
"""
from __future__ import annotations

from compiler.graph import NodeRef
from compiler.ops import OpError, Spec
from compiler.ops.control import Body

from . import _state
from .control_flow import _as_list, _check_body_result, _restore
from .ndarray import NDArray
from .tracing import Trace, Tracer, TraceError, _at


class SubTrace(Trace):
    """The trace of one control-flow body, inside ``parent``."""

    def __init__(self, parent: Trace, name: str):
        super().__init__(name, parent.device, parent.param_names)
        self.parent = parent
        self.captured: list = []  # the enclosing trace's Tracers, one per captured input
        self._lifted: dict = {}  # the enclosing trace's node -> this body's input node

    def foreign(self, t: Tracer) -> int:
        """A value of an enclosing trace read by this body: an input of the body."""
        if t._trace is self.parent:
            outer = t
        elif isinstance(self.parent, SubTrace) and _encloses(self.parent, t._trace):
            outer = _tracer(self.parent, self.parent.foreign(t), t)  # through each level
        else:
            return super().foreign(t)
        nid = self._lifted.get(outer._nid)
        if nid is None:
            nid = self.graph.add_input(_spec(t), f"captured{len(self.captured)}",
                                       str(t.device))
            self.captured.append(outer)
            self._lifted[outer._nid] = nid
        return nid

    def param(self, param, device):
        return _tracer(self, self.foreign(self.parent.param(param, device)))

    def random_key(self, device=None):
        raise TraceError(f"a random draw inside an npx.foreach / while_loop / cond body at "
                         f"{_at()} cannot be hybridized (every step would need a key of its "
                         "own): draw the random values before the loop, one row per step "
                         "(a dropout mask of shape (T, ...)), and pass them as data")


def _encloses(outer: Trace, inner: Trace) -> bool:
    t = outer
    while t is not None:
        if t is inner:
            return True
        t = getattr(t, "parent", None)
    return False


def _tracer(trace: Trace, nid: int, like=None) -> Tracer:
    spec = trace.graph.spec(nid)
    device = like.device if like is not None else trace.device
    return Tracer(trace, nid, spec, device)


def _parent() -> Trace:
    return _state.local.trace


def _trace_body(name, fn, in_specs, device):
    """(SubTrace, result) of ``fn`` on fresh inputs of ``in_specs``."""
    parent = _parent()
    sub = SubTrace(parent, f"{parent.graph.name}_{name}")
    ins = [_tracer(sub, sub.graph.add_input(s, f"x{i}", str(device)))
           for i, s in enumerate(in_specs)]
    loc = _state.local
    loc.trace = sub
    try:
        result = fn(ins)
    finally:
        loc.trace = parent
    if sub.state_updates:
        raise TraceError(f"a parameter is updated inside an npx control-flow body "
                         f"({name}; BatchNorm's running statistics?) at {_at()}: a "
                         "hybridized loop cannot write parameters; move that layer out of "
                         "the body")
    return sub, ins, result


def _body_node(sub: SubTrace, v, what) -> int:
    """A body's result as a node of the body's graph."""
    if isinstance(v, Tracer):
        if v._trace is sub:
            return v._nid
        return sub.foreign(v)
    if isinstance(v, NDArray):
        return sub.capture(v)
    raise TraceError(f"{what} must return hybrid arrays, got {type(v).__name__} at {_at()}")


def _check_carried(sub: SubTrace, initial, nodes, who, what):
    """A loop's carried values keep their type from step to step (as eagerly)."""
    for i, (a, nid) in enumerate(zip(initial, nodes)):
        if sub.graph.spec(nid) != _spec(a):
            raise ValueError(f"{who}: {what} {i} changed from {_spec(a)} to "
                             f"{sub.graph.spec(nid)}; a loop's {what}s keep their shape and "
                             "dtype (cast or reshape inside the body)")


def _seal(sub: SubTrace, n_explicit: int, outputs: list, captured: list):
    """The body as a Body: inputs = its explicit ones, then one per ``captured`` (the union
    of what all bodies of the node capture, in one order), outputs ``outputs``."""
    g = sub.graph
    explicit = g.inputs[:n_explicit]
    cap_nodes = []
    for i, t in enumerate(captured):
        nid = sub._lifted.get(t._nid)
        if nid is None:  # another body's capture: an unused input here
            nid = g.add_input(_spec(t), f"unused{i}", str(t.device))
        cap_nodes.append(nid)
    g.inputs = explicit + cap_nodes
    g.outputs = list(outputs)
    g.remove_dead()
    return Body(g)


def _union(*subs) -> list:
    seen, out = set(), []
    for s in subs:
        for t in s.captured:  # Tracers of the one enclosing trace
            if t._nid not in seen:
                seen.add(t._nid)
                out.append(t)
    return out


def _add_control(op, args, attrs) -> list:
    """Add a control node to the enclosing trace; its results as Tracers."""
    parent = _parent()
    conv = [NodeRef(a._nid) for a in args]
    try:
        tup = parent.graph.add_op(op, conv, attrs, None, str(parent.device))
    except OpError as exc:
        raise OpError(f"{exc} (at {_at()}, while hybridizing)") from None
    results = parent.graph.node(tup)["results"]
    return [_tracer(parent, parent.graph.add_op("nth", [NodeRef(tup)], {"index": k}, None,
                                                str(parent.device)))
            for k in range(len(results))]


def _in_parent(values) -> list:
    """Operands as Tracers of the enclosing trace (concrete arrays become constants)."""
    parent = _parent()
    out = []
    for v in values:
        if isinstance(v, Tracer):
            out.append(v if v._trace is parent else _tracer(parent, parent.foreign(v), v))
        else:
            out.append(_tracer(parent, parent.capture(v)))
    return out


def _spec(a) -> Spec:
    return Spec(tuple(a.shape), a._dtype)


# ============================================================ the three ops
def trace_foreach(body, data, init_states):
    seqs, data_single = _as_list(data)
    states, states_single = _as_list(init_states)
    if not seqs:
        raise ValueError("foreach needs at least one data array to iterate over")
    seqs, states = _in_parent(seqs), _in_parent(states)
    for s in seqs:
        if s.ndim == 0 or s.shape[0] != seqs[0].shape[0]:
            raise ValueError("foreach: every data array iterates over its first axis, and "
                             f"all must have the same length; got shapes "
                             f"{[tuple(a.shape) for a in seqs]}")
    row_specs = [Spec(tuple(s.shape[1:]), s._dtype) for s in seqs]
    n_data, n_states = len(seqs), len(states)
    shape = {}

    def run(ins):
        out, new = _check_body_result(
            body(_restore(ins[:n_data], data_single),
                 _restore(ins[n_data:], states_single)), "foreach body")
        outs, shape["out_single"] = _as_list(out)
        new_list, _ = _as_list(new)
        if len(new_list) != n_states:
            raise ValueError(f"foreach body returned {len(new_list)} state(s) for "
                             f"{n_states} given; a step must return as many states as it "
                             "takes")
        return outs, new_list
    sub, _, (outs, new) = _trace_body("foreach_body", run, row_specs + [_spec(s) for s in
                                                                          states],
                                      _parent().device)
    nodes = [_body_node(sub, v, "the foreach body") for v in list(outs) + list(new)]
    _check_carried(sub, states, nodes[len(outs):], "foreach body", "state")
    captured = _union(sub)
    b = _seal(sub, n_data + n_states, nodes, captured)
    res = _add_control("foreach", seqs + states + captured,
                       {"body": b, "n_data": n_data, "n_states": n_states,
                        "reverse": False, "counted": False})
    n_out = len(outs)
    return (_restore(res[:n_out], shape["out_single"]) if n_out else [],
            _restore(res[n_out:n_out + n_states], states_single))


def trace_while_loop(cond, func, loop_vars, max_iterations):
    lvars, single = _as_list(loop_vars)
    lvars = _in_parent(lvars)
    specs = [_spec(v) for v in lvars]
    nv = len(lvars)
    shape = {"out_single": False}
    csub, _, pred = _trace_body("while_cond", lambda ins: cond(*ins), specs, _parent().device)
    if isinstance(pred, (list, tuple)) and len(pred) == 1:
        pred = pred[0]

    def run(ins):
        out, new = _check_body_result(func(*ins), "while_loop func")
        outs, shape["out_single"] = _as_list(out)
        new_list, _ = _as_list(new)
        if len(new_list) != nv:
            raise ValueError(f"while_loop func returned {len(new_list)} loop variable(s) "
                             f"for {nv} given")
        return outs, new_list
    fsub, _, (outs, new) = _trace_body("while_func", run, specs, _parent().device)
    captured = _union(csub, fsub)
    cbody = _seal(csub, nv, [_body_node(csub, pred, "while_loop cond")], captured)
    fnodes = [_body_node(fsub, v, "while_loop func") for v in list(outs) + list(new)]
    _check_carried(fsub, lvars, fnodes[len(outs):], "while_loop func", "loop variable")
    fbody = _seal(fsub, nv, fnodes, captured)
    res = _add_control("while_loop", lvars + captured,
                       {"cond": cbody, "func": fbody, "n_vars": nv,
                        "max_iterations": max_iterations})
    n_out = len(outs)
    outs_r = _restore(res[:n_out], shape["out_single"]) if n_out else []
    return outs_r, _restore(res[n_out:n_out + nv], single)


def trace_cond(pred, then_func, else_func, operands):
    operands = _in_parent(operands)
    p = pred(*operands) if callable(pred) else pred
    if not isinstance(p, NDArray):
        raise TypeError(f"cond's predicate must be an array (or a function of the inputs "
                        f"giving one), got {type(p).__name__}")
    (p,) = _in_parent([p])
    specs = [_spec(v) for v in operands]
    shape = {}

    def branch(fn, key):
        def run(ins):
            out = fn(*ins)
            outs, shape[key] = _as_list(out)
            return outs
        return run
    tsub, _, touts = _trace_body("then", branch(then_func, "then"), specs, _parent().device)
    esub, _, eouts = _trace_body("else", branch(else_func, "else"), specs, _parent().device)
    if len(touts) != len(eouts) or shape["then"] != shape["else"]:
        raise ValueError(f"cond: then_func returns {len(touts)} array(s), else_func "
                         f"{len(eouts)}; both branches must return the same structure")
    captured = _union(tsub, esub)
    n = len(operands)
    tbody = _seal(tsub, n, [_body_node(tsub, v, "then_func") for v in touts], captured)
    ebody = _seal(esub, n, [_body_node(esub, v, "else_func") for v in eouts], captured)
    res = _add_control("cond", [p] + operands + captured,
                       {"then_body": tbody, "else_body": ebody})
    return _restore(res, shape["then"])


def output_specs(fn, args):
    """([(shape, dtype)], whether one array rather than a list) of what ``fn(*args)``
    returns, traced, never run (the outputs of a zero-step eager loop)."""
    from .tracing import suspended  # noqa: PLC0415

    with suspended():
        probe = Trace("probe", args[0].device if args else None)
        ins = [_tracer(probe, probe.graph.add_input(_spec(a), f"x{i}", str(a.device)), a)
               for i, a in enumerate(args)]
        loc = _state.local
        loc.trace = probe
        try:
            out = fn(*ins)
        finally:
            loc.trace = None
    outs, single = _as_list(out)
    return [(tuple(o.shape), o.dtype) for o in outs], single
