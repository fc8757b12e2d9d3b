"""A hybridized graph spanning devices: x.to(device) inside forward cuts the compiled graph
into per-device parts (compiler/passes/partition.py) that run as separate engine ops, at
once where no path orders them; values, gradients and training equal eager."""
import threading
import time

import numpy as np
import pytest

import hybrid as hb
from compiler.graph import Graph, NodeRef
from compiler.ops import Spec
from compiler.passes.partition import partition
from compiler.reference import run_reference
from hybrid import autograd, nn, tracing

C0, C1 = hb.cpu(0), hb.cpu(1)
BACKENDS = ["reference", pytest.param("llvm", marks=pytest.mark.skipif(
    not tracing._llvm_available(), reason="llvmlite is not installed"))]


# ------------------------------------------------------------------ the pass (pure)
def _op(g, name, *args, on="cpu(0)", **attrs):
    return g.add_op(name, [NodeRef(a) if isinstance(a, int) else a for a in args], attrs,
                    device=on)


def test_partition_stages_make_a_dag_even_when_values_come_back():
    """cpu0 -> cpu1 -> back to cpu0: three parts (the return trip is a later stage, so no
    part both feeds and reads another), and the parts compute what the whole graph does."""
    g = Graph("trip")
    x = g.add_input(Spec((3, 4), "float32"), "x", "cpu(0)")
    w = g.add_param(Spec((4, 4), "float32"), "w", "cpu(1)")
    a = _op(g, "tanh", x)
    b = _op(g, "device_copy", a, on="cpu(1)", device="cpu(1)", source="cpu(0)")
    c = _op(g, "matmul", b, w, on="cpu(1)")
    d = _op(g, "device_copy", c, device="cpu(0)", source="cpu(1)")
    e = _op(g, "add", d, a)
    f = _op(g, "exp", x)  # independent of cpu(1): stays in the first part
    g.outputs = [e, c, f, x]
    split = partition(g)
    assert [p.device for p in split.parts] == ["cpu(0)", "cpu(1)", "cpu(0)"]
    assert split.parts[1].inputs == [("part", 0, 0)] and split.parts[1].params == [("param", 0)]
    assert ("part", 1, 0) in split.parts[2].inputs and ("part", 0, 0) in split.parts[2].inputs
    for p in split.parts:  # boundaries are inputs, never ops of the receiving part
        assert "device_copy" not in {p.graph.op(n) for n in p.graph.op_nodes()}
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    wv = rng.standard_normal((4, 4)).astype(np.float32)
    want = run_reference(g, [xv], [wv])
    outs = []
    for p in split.parts:
        ins = [xv if r[0] == "input" else outs[r[1]][r[2]] for r in p.inputs]
        outs.append(run_reference(p.graph, ins, [wv for _ in p.params]))
    got = [outs[r[1]][r[2]] if r[0] == "part" else xv for r in split.outputs]
    for a_, b_ in zip(got, want):
        np.testing.assert_allclose(a_, b_, rtol=1e-6)


def test_one_device_is_one_part():
    g = Graph("one")
    x = g.add_input(Spec((2,), "float32"), "x")
    g.outputs = [_op(g, "exp", _op(g, "tanh", x))]
    split = partition(g)
    assert len(split.parts) == 1 and split.outputs == [("part", 0, 0)]


# ------------------------------------------------------------------ hybridized
def _two_chains(x, y):
    a, b = x, y
    for _ in range(3):
        a = hb.tanh(hb.dot(a, x) / 100)
        b = hb.tanh(hb.dot(b, y) / 100)
    return a.sum() + b.to(C0).sum(), b


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_device_forward_equals_eager(backend):
    x = hb.random.normal(size=(64, 64), device=C0)
    y = hb.random.normal(size=(64, 64), device=C1)
    s_eager, b_eager = _two_chains(x, y)
    f = hb.hybridize(_two_chains, backend=backend)
    s, b = f(x, y)
    assert s.device == C0 and b.device == C1
    np.testing.assert_allclose(s.asnumpy(), s_eager.asnumpy(), rtol=1e-4)
    np.testing.assert_allclose(b.asnumpy(), b_eager.asnumpy(), rtol=1e-5, atol=1e-6)
    (entry,) = f.cache.entries.values()
    assert [p.device for p in entry.exe.parts] == ["cpu(0)", "cpu(1)", "cpu(0)"]
    assert "part 1 on cpu(1)" in hb.explain(f, x, y)


def test_independent_parts_run_at_the_same_time(monkeypatch):
    """The two chains are parts with no path between them: each runs on its device's worker
    and their native calls overlap in time (the book's 12.3 experiment, hybridized)."""
    x = hb.random.normal(size=(400, 400), device=C0)
    y = hb.random.normal(size=(400, 400), device=C1)

    def chains(x, y):
        a, b = x, y
        for _ in range(12):
            a = hb.dot(a, x) / 400
            b = hb.dot(b, y) / 400
        return a, b
    f = hb.hybridize(chains, backend="reference")
    f(x, y)
    hb.waitall()  # both parts of the first call done: the timed call's start on an idle pair
    (entry,) = f.cache.entries.values()
    spans = {}
    lock = threading.Lock()
    for part in entry.exe.parts:
        run = part.exe.run

        def timed(xp, ins, ps, run=run, dev=part.device):
            t0 = time.perf_counter()
            out = run(xp, ins, ps)
            with lock:
                spans[dev] = (t0, time.perf_counter(), threading.current_thread().name)
            return out
        monkeypatch.setattr(part.exe, "run", timed)
    a, b = f(x, y)
    a.wait_to_read()
    b.wait_to_read()
    (s0, e0, t0), (s1, e1, t1) = spans["cpu(0)"], spans["cpu(1)"]
    assert t0 != t1, "both parts ran on one thread"
    assert s0 < e1 and s1 < e0, f"the parts did not overlap: {spans}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_parallel_training_equals_eager(backend):
    """A network split across devices (first layer on cpu(0), second on cpu(1)): outputs,
    parameter gradients and the input gradient equal eager, through the device copies."""
    class Split(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(8, activation="tanh", in_units=5)
            self.b = nn.Dense(3, in_units=8)

        def forward(self, x):
            return self.b(self.a(x).to(C1)).to(C0)

    def build():
        hb.random.seed(5)
        net = Split()
        net.a.initialize(hb.init.Xavier(), device=C0)
        net.b.initialize(hb.init.Xavier(), device=C1)
        return net
    x = hb.random.normal(size=(6, 5), device=C0)
    results = []
    for hybridized in (False, True):
        net = build()
        if hybridized:
            net.hybridize(backend=backend)
        xx = hb.array(x.asnumpy(), device=C0)
        xx.attach_grad()
        with autograd.record():
            out = net(xx)
            loss = (out * out).sum()
        loss.backward()
        grads = {k: p.grad(p.list_device()[0]).asnumpy()
                 for k, p in net.collect_params().items()}
        results.append((out.asnumpy(), xx.grad.asnumpy(), grads))
    (o1, gx1, g1), (o2, gx2, g2) = results
    np.testing.assert_allclose(o2, o1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx2, gx1, rtol=1e-5, atol=1e-6)
    for k in g1:
        np.testing.assert_allclose(g2[k], g1[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_mixed_devices_without_a_copy_is_a_clear_error():
    f = hb.hybridize(lambda x, y: x + y)
    with pytest.raises(tracing.TraceError, match=r"different devices .*\.to\(device\)"):
        f(hb.ones((2,), device=C0), hb.ones((2,), device=C1))


def test_a_graph_wholly_on_another_device_runs_and_lands_there():
    f = hb.hybridize(lambda x: x.to(C1) * 2)
    out = f(hb.ones((3,), device=C0))
    assert out.device == C1
    np.testing.assert_array_equal(out.asnumpy(), np.full(3, 2, np.float32))


def test_export_refuses_a_graph_spanning_devices(tmp_path):
    f = hb.hybridize(lambda x: (x.to(C1) * 2).to(C0) + 1)
    x = hb.ones((2, 3), device=C0)
    f(x)
    with pytest.raises(ValueError, match="spans devices cpu\\(0\\), cpu\\(1\\)"):
        hb.deploy.export(f, str(tmp_path / "art"), example_inputs=(x,))


def test_gradient_sums_are_made_on_the_device_of_their_value():
    """Where two gradient paths meet (an output listed twice, as a loop body's step output
    that is also its next state; a value read on two devices), their sum is made on the
    value's device, not the builder's default cpu(0): a GPU loop body's backward with an
    add on cpu(0) was refused at compile time (training a gluon LSTM on the CUDA backend)."""
    from compiler.autodiff import differentiate
    g = Graph("t")
    x = g.add_input(Spec((2, 3), "float32"), "x", "gpu(0)")
    y = _op(g, "tanh", x, on="gpu(0)")
    z = _op(g, "device_copy", y, device="cpu(1)", source="gpu(0)", on="cpu(1)")
    back = _op(g, "device_copy", _op(g, "exp", z, on="cpu(1)"), device="gpu(0)",
               source="cpu(1)", on="gpu(0)")
    g.outputs = [y, y, _op(g, "mul", y, back, on="gpu(0)")]
    joint, _, grads, _ = differentiate(g, [x])
    new = set(joint.g.nodes) - set(g.g.nodes)
    adds = [n for n in new if joint.op(n) == "add"]
    assert adds and all(joint.node(n)["device"] == "gpu(0)" for n in adds)
    assert joint.node(grads[0])["device"] == "gpu(0)"
