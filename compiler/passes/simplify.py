"""simplify: constant folding, CSE, algebraic rules and DCE, run to a fixpoint.

Algebraic rules are data: a table of (name, rewrite) where ``rewrite(graph, node)`` returns
the node that replaces ``node`` or None. Hits are counted per rule in the report.
"""
from __future__ import annotations

import math

import numpy as np

from ..graph import SOURCE_OPS, Graph, NodeRef
from ..ops import REGISTRY, eager_apply
from ..ops.movement import normalize_slice

FOLD_MAX_ELEMENTS = 1 << 16  # fold constants up to 256 KiB of float32; bigger stay computed


def _scalar_arg(graph, n, pos):
    a = graph.args(n)[pos]
    return None if isinstance(a, NodeRef) else a


def _same_type(graph, a, n):
    return graph.spec(a) == graph.spec(n)


def _identity_binary(op, unit, side, zero_sign=0):
    """x op unit -> x (for side 1) or unit op x -> x (side 0), when the type is unchanged.

    zero_sign: for a float result, the sign the zero unit must have to be an identity under
    IEEE rules (x + -0.0 and x - 0.0 are x; x + 0.0 is +0.0 for x = -0.0)."""
    def rule(graph, n):
        if graph.op(n) != op:
            return None
        args = graph.args(n)
        other = 1 - side
        if isinstance(args[side], NodeRef) or args[side] != unit:
            return None
        if zero_sign and graph.spec(n).dtype.startswith("float") and \
                math.copysign(1.0, args[side]) != zero_sign:
            return None
        if not isinstance(args[other], NodeRef) or not _same_type(graph, args[other].id, n):
            return None
        return args[other].id
    return rule


def _mul_zero_int(graph, n):
    """x * 0 -> zeros, for integer x only (for floats, NaN * 0 is NaN: not safe)."""
    if graph.op(n) != "mul" or graph.spec(n).dtype.startswith("float"):
        return None
    args = graph.args(n)
    if 0 not in [a for a in args if not isinstance(a, NodeRef)]:
        return None
    spec = graph.spec(n)
    return graph.add_op("full", [], {"shape": spec.shape, "value": 0, "dtype": spec.dtype},
                        graph.node(n).get("where"), graph.node(n)["device"])


def _double_transpose(graph, n):
    if graph.op(n) != "transpose":
        return None
    (a,) = graph.arg_ids(n)
    if graph.op(a) != "transpose":
        return None
    (src,) = graph.arg_ids(a)
    nd = len(graph.spec(src).shape)
    p1 = graph.node(a)["attrs"]["axes"] or tuple(reversed(range(nd)))
    p2 = graph.node(n)["attrs"]["axes"] or tuple(reversed(range(nd)))
    composed = tuple(p1[i] for i in p2)
    if composed == tuple(range(nd)):
        return src
    return graph.add_op("transpose", [NodeRef(src)], {"axes": composed},
                        graph.node(n).get("where"), graph.node(n)["device"])


def _transpose_of_matmul(graph, n):
    """(a @ b).T -> b.T @ a.T for matrices: the transposes become BLAS flags, not copies."""
    if graph.op(n) != "transpose" or len(graph.spec(n).shape) != 2:
        return None
    (m,) = graph.arg_ids(n)
    if graph.op(m) != "matmul" or len(graph.users(m)) != 1 or m in graph.outputs:
        return None
    a, b = graph.arg_ids(m)
    if len(graph.spec(a).shape) != 2 or len(graph.spec(b).shape) != 2:
        return None
    where, dev = graph.node(n).get("where"), graph.node(n)["device"]
    bt = graph.add_op("transpose", [NodeRef(b)], {"axes": (1, 0)}, where, dev)
    at = graph.add_op("transpose", [NodeRef(a)], {"axes": (1, 0)}, where, dev)
    return graph.add_op("matmul", [NodeRef(bt), NodeRef(at)], {}, where, dev)


def _reshape_chain(graph, n):
    if graph.op(n) != "reshape":
        return None
    (a,) = graph.arg_ids(n)
    if graph.spec(a).shape == graph.spec(n).shape:
        return a
    if graph.op(a) != "reshape":
        return None
    (src,) = graph.arg_ids(a)
    if graph.spec(src).shape == graph.spec(n).shape:
        return src
    return graph.add_op("reshape", [NodeRef(src)], {"shape": graph.spec(n).shape},
                        graph.node(n).get("where"), graph.node(n)["device"])


def _cast_chain(graph, n):
    if graph.op(n) != "cast":
        return None
    (a,) = graph.arg_ids(n)
    if graph.spec(a).dtype == graph.spec(n).dtype:
        return a
    if graph.op(a) != "cast":
        return None
    (src,) = graph.arg_ids(a)
    order = ("bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64")
    mid, dst, srcd = graph.spec(a).dtype, graph.spec(n).dtype, graph.spec(src).dtype
    # only drop the middle cast when it cannot lose information (a widening)
    if srcd.startswith("float") == mid.startswith("float") and order.index(mid) >= \
            order.index(srcd):
        if dst == srcd:
            return src
        return graph.add_op("cast", [NodeRef(src)], {"dtype": dst},
                            graph.node(n).get("where"), graph.node(n)["device"])
    return None


def _no_op(op):
    """Ops that are the identity in a compiled graph (autodiff already ran)."""
    def rule(graph, n):
        if graph.op(n) != op:
            return None
        (a,) = graph.arg_ids(n)
        return a if _same_type(graph, a, n) else None
    return rule


def _broadcast_noop(graph, n):
    if graph.op(n) != "broadcast_to":
        return None
    (a,) = graph.arg_ids(n)
    return a if graph.spec(a) == graph.spec(n) else None


def _scatter_sum(graph, n):
    """s1 + s2 + ... of slice_scatters into disjoint step-1 blocks along one axis ->
    concatenate of their values (zeros filling any gap): the gradient of splitting a value
    (an LSTM's four gates) without zero-filling the whole shape once per block and summing
    them. Float values get ``+ 0.0`` (fused into their producers): in the sum a block's -0.0
    met +0.0 from the other blocks' zeros, and stays +0.0 here too."""
    if graph.op(n) != "add":
        return None
    spec = graph.spec(n)
    users = graph.users(n)
    if len(users) == 1 and n not in graph.outputs and graph.op(users[0]) == "add" and \
            graph.spec(users[0]) == spec:
        return None  # not the top of its sum: the whole sum is rewritten at its top
    leaves: list = []

    def collect(m, top):
        if graph.op(m) == "add" and graph.spec(m) == spec and (
                top or len(graph.users(m)) == 1 and m not in graph.outputs):
            args = graph.args(m)
            return all(isinstance(a, NodeRef) and collect(a.id, False) for a in args)
        leaves.append(m)
        return True
    if not collect(n, True) or len(leaves) < 2 or any(
            graph.op(m) != "slice_scatter" or graph.spec(m) != spec for m in leaves):
        return None
    shape = spec.shape
    blocks, axes = [], set()
    for m in leaves:
        a = graph.node(m)["attrs"]
        b, e, st = normalize_slice(shape, a["begin"], a["end"], a["step"])
        if any(s != 1 for s in st):
            return None
        partial = [j for j in range(len(shape)) if (b[j], e[j]) != (0, shape[j])]
        if len(partial) != 1:
            return None
        axes.add(partial[0])
        blocks.append((b[partial[0]], e[partial[0]], graph.arg_ids(m)[0]))
    if len(axes) != 1:
        return None
    (axis,) = axes
    blocks.sort(key=lambda t: t[0])
    where, dev = graph.node(n).get("where"), graph.node(n)["device"]
    pieces, at = [], 0
    for b, e, value in blocks:
        if b < at:
            return None  # overlapping blocks really add
        if b > at:
            gap = shape[:axis] + (b - at,) + shape[axis + 1:]
            pieces.append(graph.add_op("full", [], {"shape": gap, "value": 0,
                                                    "dtype": spec.dtype}, where, dev))
        if spec.dtype.startswith("float"):
            value = graph.add_op("add", [NodeRef(value), 0.0], {}, where, dev)
        pieces.append(value)
        at = e
    if at < shape[axis]:
        gap = shape[:axis] + (shape[axis] - at,) + shape[axis + 1:]
        pieces.append(graph.add_op("full", [], {"shape": gap, "value": 0, "dtype": spec.dtype},
                                   where, dev))
    return graph.add_op("concatenate", [NodeRef(p) for p in pieces], {"axis": axis}, where, dev)


def _pick_of_elementwise(graph, n):
    """pick(f(a, b, ...), i) -> f(pick(a, i), b', ...) for an elementwise f: each operand
    of f's shape is picked, one broadcast along the picked axis is taken as it is. The
    same operations on the same elements, so the same bits; a softmax cross-entropy's
    log-softmax is then computed for the picked class only, not written for every class
    and read back (f stays for its other users, recomputed for one element per row)."""
    if graph.op(n) != "pick":
        return None
    x, index = graph.arg_ids(n)
    op = REGISTRY.get(graph.op(x))
    if op is None or op.kind != "elementwise" or op.num_outputs != 1:
        return None
    attrs = graph.node(n)["attrs"]
    shape = graph.spec(x).shape
    axis = attrs.get("axis", -1) % len(shape)
    where, dev = graph.node(n).get("where"), graph.node(n)["device"]
    args = []
    for a in graph.args(x):
        if not isinstance(a, NodeRef):
            args.append(a)
            continue
        s = graph.spec(a.id).shape
        if s == shape:
            args.append(NodeRef(graph.add_op("pick", [a, NodeRef(index)],
                                             {"axis": axis, "keepdims": True}, where, dev)))
        elif len(s) == len(shape) and s[axis] == 1:
            args.append(a)  # broadcast along the axis: every class reads the same value
        else:
            return None
    out = graph.add_op(graph.op(x), args, dict(graph.node(x)["attrs"]), where, dev)
    if attrs.get("keepdims"):
        return out
    return graph.add_op("reshape", [NodeRef(out)], {"shape": graph.spec(n).shape}, where, dev)


def _through_reshapes(graph, n):
    while graph.op(n) == "reshape":
        (n,) = graph.arg_ids(n)
    return n


def _positions_along(graph, n, axis, shape) -> bool:
    """``n`` is arange(0, shape[axis]) laid along ``axis`` of ``shape`` (1 elsewhere)."""
    s = graph.spec(n).shape
    want = tuple(shape[axis] if d == axis else 1 for d in range(len(shape)))
    if tuple((1,) * (len(shape) - len(s)) + tuple(s)) != want:
        return False
    src = _through_reshapes(graph, n)
    a = graph.node(src)["attrs"]
    return graph.op(src) == "arange" and graph.spec(src).shape == (shape[axis],) and \
        a.get("start", 0) == 0 and a.get("step", 1) == 1


def _index_within(graph, n, axis, shape) -> bool:
    """``n`` is an integer index of shape 1 along ``axis``, clipped to [0, shape[axis])."""
    s = graph.spec(n).shape
    if len(s) != len(shape) or s[axis] != 1:
        return False
    src = _through_reshapes(graph, n)
    a = graph.node(src)["attrs"]
    return graph.op(src) == "clip" and a.get("a_min") == 0 and \
        a.get("a_max") == shape[axis] - 1 and not graph.spec(src).dtype.startswith("float")


def _sum_of_one_hot(graph, n):
    """sum([-]where(index == positions, v, 0), axis) -> [-]v + 0.0 (v broadcast to the
    result): along the axis exactly one element is v (the index is clipped into range and
    the positions are 0..n-1), the rest are zeros, so the sum is that element. A softmax
    cross-entropy's gradient sums the pick's one-hot gradient for the log-softmax's
    backward; it then no longer writes the one-hot rows out to read them back. ``+ 0.0``:
    the sum's zeros turn a -0.0 element into +0.0."""
    if graph.op(n) != "sum":
        return None
    (x,) = graph.arg_ids(n)
    shape = graph.spec(x).shape
    axes = graph.node(n)["attrs"].get("axis")
    if axes is None or not shape:
        return None
    axes = [a % len(shape) for a in ((axes,) if isinstance(axes, int) else axes)]
    if len(axes) != 1:
        return None
    (axis,) = axes
    negate = graph.op(x) == "neg"
    hot = graph.arg_ids(x)[0] if negate else x
    if graph.op(hot) != "where":
        return None
    cond, v, zero = graph.args(hot)
    if not (isinstance(cond, NodeRef) and isinstance(v, NodeRef)) or \
            isinstance(zero, NodeRef) or zero != 0 or graph.op(cond.id) != "eq":
        return None
    out_spec = graph.spec(n)
    vs = graph.spec(v.id)
    if graph.spec(hot).shape != shape or vs.dtype != out_spec.dtype or \
            graph.spec(hot).dtype != vs.dtype or not vs.dtype.startswith("float"):
        return None
    kshape = tuple(1 if d == axis else shape[d] for d in range(len(shape)))
    vpad = (1,) * (len(shape) - len(vs.shape)) + tuple(vs.shape)
    if vpad[axis] != 1:
        return None
    pair = graph.args(cond.id)
    if len(pair) != 2 or not all(isinstance(a, NodeRef) for a in pair):
        return None  # (compared with a number: one position, not a one-hot row)
    p, q = (a.id for a in pair)
    if not any(_index_within(graph, i, axis, shape) and _positions_along(graph, j, axis, shape)
               for i, j in ((p, q), (q, p))):
        return None
    where, dev = graph.node(n).get("where"), graph.node(n)["device"]
    out = v.id
    if negate:
        out = graph.add_op("neg", [NodeRef(out)], {}, where, dev)
    out = graph.add_op("add", [NodeRef(out), 0.0], {}, where, dev)
    if vpad != kshape:
        out = graph.add_op("broadcast_to", [NodeRef(out)], {"shape": kshape}, where, dev)
    if tuple(out_spec.shape) != graph.spec(out).shape:
        out = graph.add_op("reshape", [NodeRef(out)], {"shape": tuple(out_spec.shape)}, where,
                           dev)
    return out


RULES = [
    ("x*1", _identity_binary("mul", 1, 1)),
    ("1*x", _identity_binary("mul", 1, 0)),
    ("x+0", _identity_binary("add", 0, 1, zero_sign=-1)),
    ("0+x", _identity_binary("add", 0, 0, zero_sign=-1)),
    ("x-0", _identity_binary("sub", 0, 1, zero_sign=1)),
    ("x/1", _identity_binary("div", 1, 1)),
    ("x*0 (integers)", _mul_zero_int),
    ("transpose(transpose(x))", _double_transpose),
    ("transpose(a @ b)", _transpose_of_matmul),
    ("reshape chain", _reshape_chain),
    ("cast chain", _cast_chain),
    ("stop_gradient", _no_op("stop_gradient")),
    ("copy", _no_op("copy")),
    ("broadcast to same shape", _broadcast_noop),
    ("sum of disjoint slice_scatters", _scatter_sum),
    ("pick of elementwise", _pick_of_elementwise),
    ("sum of a one-hot", _sum_of_one_hot),
]


def _fold(graph: Graph, n, hits) -> int | None:
    d = graph.node(n)
    if d["op"] in SOURCE_OPS or REGISTRY[d["op"]].kind == "source" and d["op"] != "full":
        return None
    if d["spec"].size > FOLD_MAX_ELEMENTS:
        return None
    args = graph.args(n)
    if any(isinstance(a, NodeRef) and graph.op(a.id) != "const" for a in args):
        return None
    if d["op"] == "full" and graph.users(n) and all(
            graph.op(u) not in SOURCE_OPS and REGISTRY[graph.op(u)].kind == "elementwise"
            for u in graph.users(n)):
        return None  # a fill feeding elementwise ops fuses into them for free
    raw = [graph.constants[graph.node(a.id)["attrs"]["name"]] if isinstance(a, NodeRef) else a
           for a in args]
    value = eager_apply(np, d["op"], raw, d["attrs"], (d["spec"],))[0]
    hits["constant folding"] = hits.get("constant folding", 0) + 1
    return graph.add_const(np.asarray(value), device=d["device"])


def _cse_key(graph, n):
    d = graph.node(n)
    # a scalar by its repr: 0.0 and -0.0 are == but different operands
    args = tuple(("n", a.id) if isinstance(a, NodeRef) else ("s", type(a).__name__, repr(a))
                 for a in graph.args(n))
    return (d["op"], args, repr(sorted(d["attrs"].items())), d["device"])


def simplify(graph: Graph):
    """Graph -> (Graph, report). Pure: the input graph is not modified."""
    g = graph.copy()
    hits: dict[str, int] = {}
    changed = True
    rounds = 0
    while changed and rounds < 20:
        changed = False
        rounds += 1
        seen: dict = {}
        for n in g.topo_order():
            if n not in g.g:
                continue
            op = g.op(n)
            if op in SOURCE_OPS:
                continue
            key = _cse_key(g, n)
            if REGISTRY[op].kind != "source" or op in ("full", "arange"):
                if key in seen:
                    g.replace_uses(n, seen[key])
                    hits["common subexpression"] = hits.get("common subexpression", 0) + 1
                    changed = True
                    continue
                seen[key] = n
            new = _fold(g, n, hits)
            if new is None:
                for name, rule in RULES:
                    new = rule(g, n)
                    if new is not None:
                        hits[name] = hits.get(name, 0) + 1
                        break
            if new is not None and new != n:
                g.replace_uses(n, new)
                changed = True
        removed = g.remove_dead()
        if removed:  # fewer users can enable rules that need a single user
            hits["dead code"] = hits.get("dead code", 0) + removed
            changed = True
    before, after = len(graph.op_nodes()), len(g.op_nodes())
    return g, {"hits": hits, "summary": f"{before} -> {after} op nodes, rules "
               + (", ".join(f"{k}x{v}" for k, v in sorted(hits.items())) or "none")}
