"""The hoist pass (compiler/passes/loop_invariants.py): a foreach body's values computed from
captured arrays alone are computed once before the loop, with the same results; values that
would grow, random draws and training graphs' forward loops stay in the body."""
import numpy as np

import hybrid as hb
from compiler.graph import Graph, NodeRef
from compiler.ops import Spec
from compiler.ops.control import Body
from compiler.passes.loop_invariants import hoist_loop_invariants
from compiler.pipeline import compile as compile_graph

F32 = "float32"


def _loop(extra_attrs=None, scaled=False):
    """x (5, 2, 4) scanned with a state s (2, 3), captured w (3, 4) and b (3,):
    s' = tanh(x_t @ w.T [* 2] + broadcast(b) + s); outputs s' stacked and the final s."""
    body = Graph("body")
    x_t = body.add_input(Spec((2, 4), F32), "x_t")
    s = body.add_input(Spec((2, 3), F32), "s")
    w = body.add_input(Spec((3, 4), F32), "w")
    b = body.add_input(Spec((3,), F32), "b")
    wt = body.add_op("transpose", [NodeRef(w)], {"axes": (1, 0)})
    if scaled:  # a chain of invariants: the transpose of a scaled weight
        wt = body.add_op("mul", [NodeRef(wt), 2.0], {})
    y = body.add_op("matmul", [NodeRef(x_t), NodeRef(wt)], {})
    bb = body.add_op("broadcast_to", [NodeRef(b)], {"shape": (2, 3)})
    z = body.add_op("add", [NodeRef(y), NodeRef(bb)], {})
    new = body.add_op("tanh", [NodeRef(body.add_op("add", [NodeRef(z), NodeRef(s)], {}))],
                      {})
    body.outputs = [new, new]
    g = Graph("loop")
    ins = [g.add_input(Spec(shape, F32), name) for shape, name in
           (((5, 2, 4), "x"), ((2, 3), "s0"), ((3, 4), "w"), ((3,), "b"))]
    loop = g.add_op("foreach", [NodeRef(i) for i in ins],
                    dict({"body": Body(body), "n_data": 1, "n_states": 1}, **(extra_attrs or {})))
    g.outputs = [g.add_op("nth", [NodeRef(loop)], {"index": k}) for k in (0, 1)]
    return g


def _body_ops(g):
    (loop,) = [n for n in g.g.nodes if g.op(n) == "foreach"]
    body = g.node(loop)["attrs"]["body"].graph
    return [body.op(n) for n in body.topo_order()]


def _run(g, inputs):
    exe = compile_graph(g, "reference", passes=[])  # no pass: the graph as it is
    run = getattr(exe, "run_in_order", None) or exe.run  # parts: the loop and before it
    return [np.asarray(o) for o in run(np, inputs, [])]


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(F32) for s in ((5, 2, 4), (2, 3), (3, 4), (3,))]


def test_a_captured_weights_transpose_is_computed_once_before_the_loop():
    for scaled in (False, True):
        g = _loop(scaled=scaled)
        before = [g.op(n) for n in g.g.nodes]
        out, rep = hoist_loop_invariants(g)
        assert rep["hoisted"] == 1, rep
        assert [g.op(n) for n in g.g.nodes] == before  # pure: the input graph is unchanged
        ops = _body_ops(out)
        assert "transpose" not in ops and "mul" not in ops, ops
        assert "broadcast_to" in ops, ops  # larger than the bias it reads: stays a view
        assert "transpose" in [out.op(n) for n in out.g.nodes]
        # w is read by the hoisted transpose only: the body no longer takes it
        (loop,) = [n for n in out.g.nodes if out.op(n) == "foreach"]
        body = out.node(loop)["attrs"]["body"].graph
        assert [str(body.spec(i)) for i in body.inputs] == \
            ["f32[2,4]", "f32[2,3]", "f32[3]", "f32[4,3]"]
        assert len(out.arg_ids(loop)) == len(body.inputs)  # x, s0, b, w.T
        for a, b in zip(_run(g, _inputs()), _run(out, _inputs()), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        again, rep2 = hoist_loop_invariants(out)
        assert rep2["hoisted"] == 0  # nothing left to move


def test_a_training_graphs_forward_loop_stays_as_it_is():
    g = _loop()
    body = g.node(next(n for n in g.g.nodes if g.op(n) == "foreach"))["attrs"]["body"]
    g = _loop({"vjp": body})  # its vjp refers to the body's inputs by position
    out, rep = hoist_loop_invariants(g)
    assert rep["hoisted"] == 0 and "transpose" in _body_ops(out)


def test_a_hybridized_scan_with_an_invariant_in_its_body_equals_eager():
    """End to end on LLVM: a body computing w.T * 0.5 at every step, forward and gradients."""
    from hybrid import autograd, npx

    def fn(x, h, w):
        def body(d, s):
            s2 = hb.tanh(s @ (w.T * 0.5) + d)
            return s2, s2
        return npx.foreach(body, x, h)

    rng = np.random.default_rng(3)
    x, h, w = (rng.standard_normal(s).astype(F32) for s in ((6, 2, 3), (2, 3), (3, 3)))
    results = []
    for compiled in (False, True):
        f = hb.hybridize(fn, backend="llvm") if compiled else fn
        args = [hb.array(a) for a in (x, h, w)]
        for a in args:
            a.attach_grad()
        with autograd.record():
            out, final = f(*args)
            loss = (out * out).sum() + final.sum()
        loss.backward()
        results.append([out.asnumpy(), final.asnumpy()] + [a.grad.asnumpy() for a in args])
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_checked_gather_stays_in_the_body():
    """take(mode='raise') from captured arrays is invariant but can fail: hoisted, a loop of
    zero steps would raise where eager runs no step at all."""
    from hybrid import npx

    def fn(x, w, idx):
        def body(d, st):
            s = st[0] + hb.take(w, idx, mode="raise").sum() + d.sum()
            return s, [s]
        return npx.foreach(body, x, [hb.zeros((1,))])[1][0]

    w, bad = hb.array(np.ones((3, 2), F32)), hb.array(np.array([5]), dtype="int64")
    empty = hb.array(np.zeros((0, 2), F32))
    for f in (fn, hb.hybridize(fn, backend="llvm")):
        np.testing.assert_array_equal(f(empty, w, bad).asnumpy(), [0.0])  # no step, no error
