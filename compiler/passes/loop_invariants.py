"""hoist: what a foreach body computes from its captured values alone moves out of the loop.

A body runs once per step; a value it derives from captured arrays only (a weight's
transpose, a scaled or reshaped parameter) is the same at every step. This pass computes
such values once, before the loop, and hands them to the body as captured inputs of their
own. The gradient of a recurrent layer is where it pays: its reverse scan multiplies by the
recurrent weight *transposed* at every step (``dh = dgates @ (W_h2h.T).T``), so each step
re-read the weight through a transposing copy; hoisted, simplify folds the two transposes
away and every step reads the stored weight as it is.

What moves: the body nodes that consume variant values (a step's data, a state) and are
themselves invariant — the *frontier* — together with the invariant nodes they need.
Nothing grows: a frontier value larger than the captured arrays it reads (a bias broadcast
to the batch) stays in the body, where it is a stride-0 read, not a buffer re-read at every
step. Random draws, device copies, nested control flow and checked gathers (hoisted, an index out
of range would raise even where the loop takes no step) stay too, as do training graphs'
forward loops (their ``vjp`` refers to body inputs by position).
Pure: returns a new graph; the input graph is not changed.
"""
from __future__ import annotations

from ..graph import Graph
from ..ops import REGISTRY
from ..ops.control import Body
from .index_checks import is_checked_gather


def _stays(body: Graph, m) -> bool:
    """Ops never hoisted: random draws (source ops with a key), control flow and its nth,
    device copies, and what can fail at run time (hoisted, it would run, and raise, even
    where the loop takes no step)."""
    op = body.op(m)
    return REGISTRY[op].kind in ("source", "control") or op == "device_copy" or \
        is_checked_gather(body, m)


def hoist_loop_invariants(graph: Graph):
    """Returns (graph, report) with every eligible foreach's invariants hoisted."""
    loops = [n for n in graph.topo_order() if graph.op(n) == "foreach"
             and graph.node(n)["attrs"].get("vjp") is None]
    hoisted = 0
    if not loops:
        return graph, {"summary": "no loop", "hoisted": 0}
    out = graph.copy()
    for n in loops:
        hoisted += _hoist(out, n)
    return out, {"summary": f"{hoisted} value(s) computed once instead of at every step",
                 "hoisted": hoisted}


def _frontier(body: Graph, n_variant: int) -> list:
    """In topological order, the invariant nodes (computed from the captured inputs, body
    inputs past the first ``n_variant``, and constants only) that a variant node or an
    output reads."""
    invariant = set(body.inputs[n_variant:])
    order = body.topo_order()
    for m in order:
        op = body.op(m)
        if op == "const":
            invariant.add(m)
        elif op not in ("input", "param") and body.arg_ids(m) and not _stays(body, m) \
                and all(a in invariant for a in body.arg_ids(m)):
            invariant.add(m)
    outputs = set(body.outputs)
    return [m for m in order if m in invariant and body.op(m) not in ("input", "const")
            and (m in outputs or any(u not in invariant for u in body.users(m)))]


def _captured_size(body: Graph, m, captured: set) -> int:
    """Elements of the captured inputs ``m`` is computed from."""
    seen, todo, total = set(), [m], 0
    while todo:
        k = todo.pop()
        if k in seen:
            continue
        seen.add(k)
        if k in captured:
            total += body.spec(k).size
        else:
            todo.extend(body.arg_ids(k))
    return total


def _hoist(graph: Graph, n) -> int:
    d = graph.node(n)
    attrs = d["attrs"]
    body: Graph = attrs["body"].graph
    counted = 1 if attrs.get("counted") else 0
    n_variant = attrs["n_data"] + attrs["n_states"]
    args = graph.arg_ids(n)  # every foreach operand is an array
    captured_args = args[counted + n_variant:]
    captured = set(body.inputs[n_variant:])
    frontier = [m for m in _frontier(body, n_variant)
                if body.spec(m).size <= _captured_size(body, m, captured)]
    if not frontier:
        return 0
    # the frontier's invariant nodes, copied before the loop (captured inputs -> operands)
    outer = dict(zip(body.inputs[n_variant:], captured_args))
    need = set()
    todo = list(frontier)
    while todo:
        k = todo.pop()
        if k not in need and k not in outer:
            need.add(k)
            todo.extend(body.arg_ids(k))
    for m in body.topo_order():
        if m in need:
            outer[m] = graph.copy_node(body, m, outer, d["device"])
    # the body reads each frontier value as a new captured input
    new_body = body.copy()
    for k, m in enumerate(frontier):
        inp = new_body.add_input(new_body.spec(m), f"hoisted{k}", new_body.node(m)["device"])
        new_body.replace_uses(m, inp)
    new_body.remove_dead()
    # a captured array only the hoisted values read is no longer the body's to take
    operands = dict(zip(new_body.inputs[n_variant:], captured_args + [outer[m] for m in frontier]))
    for inp in list(operands):
        if not new_body.users(inp) and inp not in new_body.outputs:
            new_body.inputs.remove(inp)
            new_body.g.remove_node(inp)
            del operands[inp]
    graph.replace_control_node(n, args[:counted + n_variant] + list(operands.values()),
                               dict(attrs, body=Body(new_body)))
    return len(frontier)
