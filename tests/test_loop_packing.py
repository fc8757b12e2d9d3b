"""The packing pass (compiler/passes/loop_packing.py): a foreach body's product of a thin
operand with a captured float32 matrix reads that matrix packed panel by panel, packed once
before the loop, with the same results bit for bit; what does not pay stays as it is."""
import numpy as np
import pytest

import hybrid as hb
from compiler.graph import Graph, NodeRef
from compiler.ops import Spec
from compiler.ops.control import Body
from compiler.passes.loop_packing import MAX_ROWS, pack_loop_products
from compiler.pipeline import compile as compile_graph

F32 = "float32"
PANEL = 4


def _loop(rows=2, cols=12, k=3, device="cpu(0)", extra_attrs=None, dtype=F32):
    """x (5, rows, cols) scanned with a state s (rows, k), captured w (k, cols) and u
    (cols, k): y = tanh(s @ w + x_t); s' = y @ u; outputs y stacked and the final s."""
    body = Graph("body")
    x_t = body.add_input(Spec((rows, cols), dtype), "x_t", device)
    s = body.add_input(Spec((rows, k), dtype), "s", device)
    w = body.add_input(Spec((k, cols), dtype), "w", device)
    u = body.add_input(Spec((cols, k), dtype), "u", device)
    prod = body.add_op("matmul", [NodeRef(s), NodeRef(w)], {}, device=device)
    y = body.add_op("tanh", [NodeRef(body.add_op("add", [NodeRef(prod), NodeRef(x_t)], {},
                                                 device=device))], {}, device=device)
    body.outputs = [y, body.add_op("matmul", [NodeRef(y), NodeRef(u)], {}, device=device)]
    g = Graph("loop")
    ins = [g.add_input(Spec(shape, dtype), name, device) for shape, name in
           (((5, rows, cols), "x"), ((rows, k), "s0"), ((k, cols), "w"), ((cols, k), "u"))]
    loop = g.add_op("foreach", [NodeRef(i) for i in ins],
                    dict({"body": Body(body), "n_data": 1, "n_states": 1},
                         **(extra_attrs or {})), device=device)
    g.outputs = [g.add_op("nth", [NodeRef(loop)], {"index": i}, device=device)
                 for i in (0, 1)]
    return g


def _body(g):
    (loop,) = [n for n in g.g.nodes if g.op(n) == "foreach"]
    return loop, g.node(loop)["attrs"]["body"].graph


def _run(g, inputs):
    exe = compile_graph(g, "reference", passes=[])  # no pass: the graph as it is
    run = getattr(exe, "run_in_order", None) or exe.run
    return [np.asarray(o) for o in run(np, inputs, [])]


def _inputs(rows=2, cols=12, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(F32) for s in
            ((5, rows, cols), (rows, k), (k, cols), (cols, k))]


def test_a_captured_matrix_is_packed_once_and_the_results_are_the_same():
    g = _loop()
    before = [g.op(n) for n in g.g.nodes]
    out, rep = pack_loop_products(g, PANEL)
    assert rep["packed"] == 1, rep  # s @ w; y @ u has 3 columns: not two panels
    assert [g.op(n) for n in g.g.nodes] == before  # pure: the input graph is unchanged
    loop, body = _body(out)
    # the packed operand is appended: every operand keeps its position (a vjp's references)
    assert [str(body.spec(i)) for i in body.inputs] == \
        ["f32[2,12]", "f32[2,3]", "f32[3,12]", "f32[12,3]", "f32[3,3,4]"]
    assert len(out.arg_ids(loop)) == len(body.inputs)
    packed = out.arg_ids(loop)[-1]
    assert out.op(packed) == "transpose" and out.op(out.arg_ids(packed)[0]) == "reshape"
    products = [n for n in body.topo_order() if body.op(n) == "matmul"]
    assert [str(body.spec(n)) for n in products] == ["f32[3,2,4]", "f32[2,3]"]
    for a, b in zip(_run(g, _inputs()), _run(out, _inputs()), strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit on the reference
    again, rep2 = pack_loop_products(out, PANEL)
    assert rep2["packed"] == 0 and again is out  # nothing left to pack


@pytest.mark.parametrize("case", ["wide state", "one panel", "ragged", "gpu", "float64"])
def test_products_that_do_not_pay_stay_as_they_are(case):
    kw = {"wide state": {"rows": MAX_ROWS + 1}, "one panel": {"cols": PANEL},
          "ragged": {"cols": 10}, "gpu": {"device": "gpu(0)"},
          "float64": {"dtype": "float64"}}[case]
    g = _loop(**kw)
    out, rep = pack_loop_products(g, PANEL)
    assert rep["packed"] == 0 and out is g


def test_a_training_forward_loop_is_packed_its_operands_in_place():
    g = _loop()
    _, body = _body(g)
    out, rep = pack_loop_products(_loop(extra_attrs={"vjp": Body(body)}), PANEL)
    assert rep["packed"] == 1
    loop, new_body = _body(out)
    assert new_body.inputs[:4] == body.inputs[:4]  # x_t, s, w, u where the vjp reads them
    assert out.node(loop)["attrs"]["vjp"].graph.to_json() == body.to_json()


def test_lstm_training_on_llvm_reads_packed_weights_and_equals_the_reference():
    """End to end: a gluon LSTM's forward and reverse scans (h @ W_h2h.T: 4 * 64 gate
    columns; dgates @ W_h2h: 64 columns, two panels on any host) trained hybridized on LLVM
    equal the NumPy reference backend."""
    from hybrid import autograd, gluon
    import compiler.pipeline as pipeline
    hits = []
    real = pipeline.pack_loop_products

    def spy(graph, panel):
        out, rep = real(graph, panel)
        hits.append(rep["packed"])
        return out, rep
    pipeline.pack_loop_products = spy
    try:
        results = []
        for backend in ("reference", "llvm"):
            hb.random.seed(7)
            lstm = gluon.rnn.LSTM(64, input_size=3)
            lstm.initialize()
            lstm.hybridize(backend=backend)
            x = hb.array(np.linspace(-1, 1, 7 * 2 * 3, dtype=F32).reshape(7, 2, 3))
            x.attach_grad()
            with autograd.record():
                loss = (lstm(x) ** 2).sum()
            loss.backward()
            results.append([x.grad.asnumpy()] + [p.grad().asnumpy().copy()
                                                 for p in lstm.collect_params().values()])
    finally:
        pipeline.pack_loop_products = real
    assert sum(hits) >= 2, hits  # the forward loop's h @ W_h2h.T and the reverse scan's
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
