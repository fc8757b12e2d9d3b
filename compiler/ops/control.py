"""Control-flow ops: ``foreach``, ``while_loop`` and ``cond`` carry their bodies as sub-graphs.

A control op has several results, and graphs hold one-output ops, so in a graph it is a
*tuple node* (an empty placeholder value, ``TUPLE_SPEC``) whose results are read by ``nth``
nodes (``index=k``). The bodies are :class:`Body` attributes: a Graph compared, hashed and
written to JSON by its content, so CSE, cache keys and ``export`` treat it as plain data.

Operands (graph argument order) and results, with bodies' inputs and outputs:

``foreach(counted?, data..., init_states..., captured...)`` attrs ``body``, ``n_data``,
    ``n_states``, ``reverse``, ``counted``. ``body(data_t..., states..., captured...) ->
    (out_t..., new_states...)``. Results: each ``out`` stacked over the steps, the final
    states, then the states each step started from, stacked (what a gradient reads back).
    ``counted``: a leading int64 scalar ``n`` runs only steps ``0..n-1`` (rows after stay
    zero), the reverse scan of a ``while_loop``'s gradient. ``reverse``: steps go from the
    last row to the first, each writing its own row.
    A training graph's foreach (``compiler.control_flow.training_form``) also saves what its
    body's backward reads: its body's step outputs are the user's ``n_outputs``, then the
    saved residuals; ``vjp`` is the body's backward, ``residuals`` where each of its inputs
    comes from, ``wrt`` the body inputs it differentiates.
``while_loop(vars..., captured...)`` attrs ``cond``, ``func``, ``n_vars``,
    ``max_iterations``. ``cond(vars..., captured...) -> (pred,)``; ``func(vars...,
    captured...) -> (out..., new_vars...)``. Results: each out stacked over
    ``max_iterations`` rows (zeros after the last step), the final vars, the number of steps
    taken (int64), the vars each step started from, stacked.
``cond(pred, operands...)`` attrs ``then_body``, ``else_body``; each branch maps the operands
    to the results (same types from both).

What the ops *do* lives in :mod:`compiler.control_flow` (one loop runner serves the NumPy
interpreter and every compiled backend); their gradients are built there too.
"""
from __future__ import annotations

import hashlib

from .core import OpError, Spec, register

TUPLE_SPEC = Spec((0,), "uint8")  # the tuple node's own value: empty; its results are nth's
CONTROL_OPS = ("foreach", "while_loop", "cond")


class Body:
    """A sub-graph as an op attribute: equal, hashed and printed by its content."""

    __slots__ = ("graph", "_text", "_digest", "_n_vals")

    def __init__(self, graph):
        if graph.params:
            raise OpError("a control-flow body takes its parameters as inputs (captured)")
        self.graph = graph
        self._text = graph.to_json(with_constants=True)
        self._digest = hashlib.sha256(self._text.encode()).hexdigest()

    @property
    def in_specs(self) -> list:
        return [self.graph.spec(n) for n in self.graph.inputs]

    @property
    def out_specs(self) -> list:
        return [self.graph.spec(n) for n in self.graph.outputs]

    def to_json(self) -> str:
        return self._text

    def __eq__(self, other):
        return isinstance(other, Body) and other._digest == self._digest

    def __hash__(self):
        return hash(self._digest)

    def __repr__(self):
        return f"Body({self.graph.name}: {len(self.graph.inputs)} in, " \
               f"{len(self.graph.outputs)} out, {self._digest[:10]})"


def _check_args(op, body_specs, arg_specs, what):
    if len(body_specs) != len(arg_specs):
        raise OpError(f"{op}: {what} takes {len(body_specs)} value(s), {len(arg_specs)} given")
    for i, (want, have) in enumerate(zip(body_specs, arg_specs)):
        if tuple(want.shape) != tuple(have.shape) or want.dtype != have.dtype:
            raise OpError(f"{op}: {what} input {i} is {want}, the operand is {have}")


def _stacked(n, specs):
    return [Spec((n,) + tuple(s.shape), s.dtype) for s in specs]


def _foreach_infer(*specs, body, n_data, n_states, reverse=False, counted=False, vjp=None,
                   residuals=(), wrt=(), n_outputs=None):
    if counted:
        if specs[0].shape != () or specs[0].dtype != "int64":
            raise OpError(f"foreach(counted): the step count must be an int64 scalar, got "
                          f"{specs[0]}")
        specs = specs[1:]
    if n_data < 1:
        raise OpError("foreach needs at least one data array to iterate over")
    data = specs[:n_data]
    if any(not s.shape or s.shape[0] != data[0].shape[0] for s in data):
        raise OpError("foreach: every data array iterates over its first axis, and all must "
                      f"have the same length; got {[str(s) for s in data]}")
    steps = data[0].shape[0]
    step_specs = [Spec(tuple(s.shape[1:]), s.dtype) for s in data]
    _check_args("foreach", body.in_specs, step_specs + list(specs[n_data:]), "the body")
    outs = body.out_specs
    n_out = len(outs) - n_states
    states = list(specs[n_data:n_data + n_states])
    _check_args("foreach", outs[n_out:], states, "the body's new states")
    return tuple(_stacked(steps, outs[:n_out]) + states + _stacked(steps, states))


def _while_infer(*specs, cond, func, n_vars, max_iterations):
    if max_iterations < 0:
        raise OpError(f"while_loop: max_iterations must be >= 0, got {max_iterations}")
    _check_args("while_loop", cond.in_specs, list(specs), "cond")
    _check_args("while_loop", func.in_specs, list(specs), "func")
    if len(cond.out_specs) != 1 or cond.out_specs[0].size != 1:
        raise OpError(f"while_loop: cond must return one scalar, got "
                      f"{[str(s) for s in cond.out_specs]}")
    outs = func.out_specs
    n_out = len(outs) - n_vars
    lvars = list(specs[:n_vars])
    _check_args("while_loop", outs[n_out:], lvars, "func's new loop variables")
    return tuple(_stacked(max_iterations, outs[:n_out]) + lvars + [Spec((), "int64")]
                 + _stacked(max_iterations, lvars))


def _cond_infer(pred, *specs, then_body, else_body):
    if pred.size != 1:
        raise OpError(f"cond: the predicate must be one value, got {pred}")
    _check_args("cond", then_body.in_specs, list(specs), "then_func")
    _check_args("cond", else_body.in_specs, list(specs), "else_func")
    a, b = then_body.out_specs, else_body.out_specs
    if [tuple(s) for s in a] != [tuple(s) for s in b]:
        raise OpError("cond: both branches must return the same number of arrays with the "
                      f"same shapes and dtypes; then_func gives {[str(s) for s in a]}, "
                      f"else_func {[str(s) for s in b]}")
    return tuple(a)


def _nth_infer(tup, index):
    raise OpError("nth reads a result of a control-flow node; Graph.add_op types it from the "
                  "node it reads")


def _impl(name):
    def impl(xp, *args, **attrs):
        from ..control_flow import run_reference_control  # noqa: PLC0415 - needs reference
        return run_reference_control(xp, name, args, attrs)
    return impl


def _nth_impl(xp, tup, index):
    return tup[index]


def _grad(name):
    def grad(F, inputs, out, g, **attrs):
        from ..control_flow import control_grad  # noqa: PLC0415 - builds graphs
        return control_grad(F, name, inputs, out, g, attrs)
    return grad


register("foreach", "control", infer=_foreach_infer, impl=_impl("foreach"),
         grad=_grad("foreach"), num_outputs=0,
         attrs=("body", "n_data", "n_states", "reverse", "counted", "vjp", "residuals", "wrt",
                "n_outputs"),
         doc="scan a body over the first axis of data, carrying states")
register("while_loop", "control", infer=_while_infer, impl=_impl("while_loop"),
         grad=_grad("while_loop"), num_outputs=0,
         attrs=("cond", "func", "n_vars", "max_iterations"),
         doc="run func while cond holds, at most max_iterations times")
register("cond", "control", infer=_cond_infer, impl=_impl("cond"), grad=_grad("cond"),
         num_outputs=0, attrs=("then_body", "else_body"),
         doc="run one of two branches on the same operands")
register("nth", "control", infer=_nth_infer, impl=_nth_impl, attrs=("index",),
         doc="result k of a control-flow node")
