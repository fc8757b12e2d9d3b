"""npx.foreach / while_loop / cond: eager semantics against NumPy, hybridized (one graph node
carrying sub-graphs) against eager on every CPU backend and an emulated GPU, gradients
against eager autograd and finite differences, export and load, and the errors."""
import json

import numpy as np
import pytest

import hybrid as hb
from compiler.graph import Graph
from hybrid import autograd, nn, npx
from hybrid.tracing import TraceError

BACKENDS = ["reference", "llvm"]


def arr(a, dtype="float32"):
    return hb.array(np.asarray(a), dtype=dtype)


def rand(*shape, seed=0, dtype="float32"):
    return arr(np.random.default_rng(seed).standard_normal(shape), dtype)


class Fn(nn.HybridBlock):
    """A block around a plain function of its inputs (and an optional Dense)."""

    def __init__(self, fn, units=0):
        super().__init__()
        self.fn = fn
        if units:
            self.dense = nn.Dense(units, in_units=units)

    def forward(self, *args):
        return self.fn(self, *args)


def _np(v):
    if isinstance(v, (list, tuple)):
        return [_np(x) for x in v]
    return v.asnumpy()


def _flat(v):
    if isinstance(v, (list, tuple)):
        return [y for x in v for y in _flat(x)]
    return [v]


def _close(a, b, tol=1e-5):
    for x, y in zip(_flat(_np(a)), _flat(_np(b)), strict=True):
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


# ====================================================================== eager semantics
def test_foreach_eager_matches_a_numpy_scan():
    x = np.random.default_rng(0).standard_normal((5, 3)).astype("float32")

    def body(d, s):
        s2 = hb.tanh(s + d)
        return [s2 * 2, s2.sum()], s2
    (outs, sums), final = npx.foreach(body, arr(x), hb.zeros((3,)))
    s, want = np.zeros(3, "float32"), []
    for row in x:
        s = np.tanh(s + row)
        want.append(s * 2)
    np.testing.assert_allclose(outs.asnumpy(), np.stack(want), rtol=1e-6)
    np.testing.assert_allclose(final.asnumpy(), s, rtol=1e-6)
    assert sums.shape == (5,)


def test_foreach_zero_steps_gives_empty_outputs_and_the_initial_states():
    outs, final = npx.foreach(lambda d, s: (d * s, s + d), hb.zeros((0, 4)), hb.ones((4,)))
    assert outs.shape == (0, 4)
    np.testing.assert_array_equal(final.asnumpy(), np.ones(4))


def test_while_loop_eager_pads_to_max_iterations_with_zeros():
    outs, (i, acc) = npx.while_loop(lambda i, a: i < 3, lambda i, a: (a * 1, [i + 1, a + i.astype("float32")]),
                                    [arr(0, "int64"), arr(1.0)], max_iterations=5)
    np.testing.assert_array_equal(outs.asnumpy(), [1, 1, 2, 0, 0])
    assert int(i.asnumpy()) == 3 and float(acc.asnumpy()) == 4.0


def test_cond_eager_runs_only_the_branch_taken():
    ran = []

    def then(a):
        ran.append("then")
        return a * 2

    def other(a):
        ran.append("else")
        return a - 1
    x = arr([1.0, 2.0])
    np.testing.assert_array_equal(npx.cond(lambda a: a.sum() > 0, then, other, [x]).asnumpy(),
                                  [2, 4])
    assert ran == ["then"]
    # MXNet 1's spelling: the predicate an array, the branches closures of no argument
    np.testing.assert_array_equal(npx.cond(x.sum() < 0, lambda: x * 2, lambda: x - 1)
                                  .asnumpy(), [0, 1])


# ====================================================================== hybridized == eager
def _rnn_like(block, x, h):
    def body(d, s):
        s2 = hb.tanh(block.dense(s) + d)
        return s2 * 2, s2
    out, final = npx.foreach(body, x, h)
    return out, final


def _grads(backend, fn, inputs, units=4, seed=0):
    hb.random.seed(seed)
    net = Fn(fn, units)
    net.initialize()
    for a in inputs:
        a.attach_grad()
    if backend:
        net.hybridize(backend=backend)
    with autograd.record():
        outs = net(*inputs)
        loss = sum((o * o).sum() for o in _flat(outs))
    loss.backward()
    params = [p.grad().asnumpy() for p in net.collect_params().values()]
    return _np(outs), [a.grad.asnumpy() for a in inputs], params, net


@pytest.mark.parametrize("backend", BACKENDS)
def test_foreach_hybridized_equals_eager_with_gradients(backend):
    x, h = rand(6, 2, 4, seed=1), rand(2, 4, seed=2)
    want = _grads(None, _rnn_like, [x, h])
    got = _grads(backend, _rnn_like, [rand(6, 2, 4, seed=1), rand(2, 4, seed=2)])
    for a, b in zip(_flat(want[:3]), _flat(got[:3])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_foreach_traces_its_body_once_not_unrolled():
    net = Fn(_rnn_like, 4)
    net.initialize()
    net.hybridize(backend="llvm")
    net(rand(7, 2, 4), hb.zeros((2, 4)))
    ops = _traced_ops(net)
    assert ops.count("foreach") == 1 and "tanh" not in ops, ops


def _traced_ops(net):
    cache = net._cached
    (entry,) = cache.entries.values()
    return [entry.graph.op(n) for n in entry.graph.g.nodes]


def test_foreach_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((4, 3))
    h0 = rng.standard_normal(3)
    w0 = rng.standard_normal((3, 3)) * 0.5

    def f(x, h, w):
        def body(d, s):
            s2 = hb.tanh(hb.dot(w, s) + d)
            return s2 * s2, s2
        out, final = npx.foreach(body, x, h)
        return out.sum() + final.sum()

    class Block(nn.HybridBlock):
        def forward(self, x, h, w):
            return f(x, h, w)
    net = Block()
    net.hybridize(backend="llvm")
    args = [hb.array(a, dtype="float64") for a in (x0, h0, w0)]
    for a in args:
        a.attach_grad()
    with autograd.record():
        y = net(*args)
    y.backward()
    eps = 1e-6
    for k, base in enumerate((x0, h0, w0)):
        fd = np.zeros_like(base)
        for j in np.ndindex(base.shape):
            vals = []
            for step in (eps, -eps):
                moved = [a.copy() for a in (x0, h0, w0)]
                moved[k][j] += step
                vals.append(float(f(*[hb.array(a, dtype="float64") for a in moved])
                                  .asnumpy()))
            fd[j] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(args[k].grad.asnumpy(), fd, rtol=1e-6, atol=1e-7)


def _while_net(block, x, lim):
    def cond(i, a):
        return a.sum() < lim.sum()

    def func(i, a):  # each step adds between 0 and 1 to each of the 6 elements
        a2 = hb.sigmoid(block.dense(a)) + a
        return a2 * 1.0, [i + 1, a2]
    outs, (i, a) = npx.while_loop(cond, func, [hb.zeros((), dtype="int64"), x],
                                  max_iterations=6)
    return outs, i, a


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_steps_are_data_dependent_inside_one_graph(backend):
    x = rand(2, 3, seed=4) * 0.1
    net = Fn(_while_net, 3)
    net.initialize()
    net.hybridize(backend=backend)
    steps = []
    for lim in (-100.0, 2.0, 8.0, 100.0):  # zero steps, some, more, max_iterations reached
        outs, i, a = net(x, arr(lim))
        eager = _while_net(net, x, arr(lim))
        _close([outs, i, a], list(eager))
        steps.append(int(i.asnumpy()))
        n = steps[-1]
        assert not outs.asnumpy()[n:].any()  # rows after the last step are zeros
    assert steps[0] == 0 and steps[-1] == 6 and len(set(steps)) >= 3, steps
    assert len(net._cached.entries) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lim", [-1.0, 5.0, 100.0])
def test_while_loop_gradients_equal_eager(backend, lim):
    def fn(block, x):
        return _while_net(block, x, arr(lim))
    want = _grads(None, fn, [rand(2, 3, seed=5) * 0.1], units=3)
    got = _grads(backend, fn, [rand(2, 3, seed=5) * 0.1], units=3)
    for a, b in zip(_flat(want[:3]), _flat(got[:3])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def _cond_net(block, x, flag):
    return npx.cond(lambda a, f: f.sum() > 0,
                    lambda a, f: hb.tanh(block.dense(a)) * 3,
                    lambda a, f: a * a - 1, [x, flag])


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_branch_is_chosen_per_call_inside_one_graph(backend):
    net = Fn(_cond_net, 3)
    net.initialize()
    net.hybridize(backend=backend)
    x = rand(2, 3, seed=6)
    for flag in (1.0, -1.0, 1.0):
        _close(net(x, arr(flag)), _cond_net(net, x, arr(flag)))
    assert len(net._cached.entries) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flag", [1.0, -1.0])
def test_cond_differentiates_the_branch_taken(backend, flag):
    def fn(block, x):
        return _cond_net(block, x, arr(flag))
    want = _grads(None, fn, [rand(2, 3, seed=7)], units=3)
    got = _grads(backend, fn, [rand(2, 3, seed=7)], units=3)
    for a, b in zip(_flat(want[:3]), _flat(got[:3])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    if flag < 0:  # the Dense is only in the branch not taken: its gradient is zero
        assert not any(p.any() for p in got[2])


def test_nested_control_flow_and_outer_values_in_bodies():
    def fn(block, x, h):
        scale = x.mean()  # computed before the loop, read inside the inner body

        def outer(row, s):
            def inner(v, t):
                return v * scale, t + npx.cond(lambda a: a > 0, lambda a: a, lambda a: -a,
                                               [v])
            vs, t = npx.foreach(inner, row, hb.zeros(()))
            return vs, s + t
        return npx.foreach(outer, x, hb.zeros(()))
    net = Fn(fn)
    net.hybridize(backend="llvm")
    x = rand(3, 4, seed=8)
    _close(net(x, hb.zeros(())), fn(net, x, hb.zeros(())))
    want = _grads(None, fn, [rand(3, 4, seed=8), hb.zeros(())], units=0)
    got = _grads("llvm", fn, [rand(3, 4, seed=8), hb.zeros(())], units=0)
    for a, b in zip(_flat(want[:2]), _flat(got[:2])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_cuda_backend_runs_control_flow_on_an_emulated_gpu(emulated_gpu):
    x, h = rand(4, 2, 4, seed=9), rand(2, 4, seed=10)
    net = Fn(_rnn_like, 4)
    net.initialize()
    want = _np(net(x, h))
    net.reset_device(emulated_gpu)
    net.hybridize(backend="cuda")
    got = _np(net(x.to(emulated_gpu), h.to(emulated_gpu)))
    for a, b in zip(_flat(want), _flat(got)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# ====================================================================== artifacts
def test_graph_json_round_trip_keeps_the_bodies():
    net = Fn(_while_net, 3)
    net.initialize()
    net.hybridize(backend="reference")
    net(rand(2, 3), arr(1.0))
    (entry,) = net._cached.entries.values()
    text = entry.graph.to_json()
    back = Graph.from_json(text)
    assert back.to_json() == text
    assert "__body__" in json.dumps(json.loads(text))


def test_export_and_load_run_control_flow_without_the_python_code(tmp_path):
    net = Fn(_cond_net, 3)
    net.initialize()
    x = rand(2, 3, seed=11)
    net.hybridize(backend="llvm")
    hb.deploy.export(net, tmp_path / "a", example_inputs=(x, arr(1.0)), dynamic_batch=False)
    m = hb.load(tmp_path / "a")
    for flag in (1.0, -1.0):
        _close(m(x, arr(flag)), _cond_net(net, x, arr(flag)))


# ====================================================================== errors
def test_python_if_on_a_traced_value_names_npx_cond():
    class Branchy(nn.HybridBlock):
        def forward(self, x):
            return x if x.sum() > 0 else -x
    net = Branchy()
    net.hybridize()
    with pytest.raises(TraceError, match="npx.cond"):
        net(hb.ones((2,)))


def test_random_draw_in_a_hybridized_body_says_what_to_do():
    def fn(block, x):
        return npx.foreach(lambda d, s: (d * hb.random.uniform(size=d.shape), s), x,
                           hb.zeros(()))
    net = Fn(fn)
    net.hybridize()
    with pytest.raises(TraceError, match="draw the random values before the loop"):
        net(hb.ones((3, 2)))


def test_state_changing_shape_is_refused_in_both_modes():
    def body(d, s):
        return d, s.reshape((1, -1))
    with pytest.raises(ValueError, match="state 0 changed"):
        npx.foreach(body, hb.ones((2, 3)), hb.ones((3,)))
    net = Fn(lambda blk, x, s: npx.foreach(body, x, s))
    net.hybridize()
    with pytest.raises(ValueError, match="state 0 changed"):
        net(hb.ones((2, 3)), hb.ones((3,)))


def test_while_loop_needs_max_iterations():
    with pytest.raises(ValueError, match="max_iterations"):
        npx.while_loop(lambda a: a < 1, lambda a: ([], [a + 1]), [hb.zeros(())])


def test_branches_of_different_types_are_refused_when_hybridized():
    net = Fn(lambda blk, x: npx.cond(lambda a: a.sum() > 0, lambda a: a, lambda a: a.sum(),
                                     [x]))
    net.hybridize()
    with pytest.raises(ValueError, match="same"):
        net(hb.ones((2,)))


@pytest.mark.parametrize("native", [True, False])
def test_llvm_loop_runs_in_one_native_call_or_into_preallocated_rows(monkeypatch, native):
    """All steps in one native call (codegen/llvm/steps.py); where that declines, each step
    writes into its rows (no allocation per step)."""
    from compiler.codegen.llvm.exec import NativeRun
    calls = {"steps": [], "into": []}
    real_steps, real_into = NativeRun.run_steps, NativeRun.run_into

    def steps(self, n, ins, outs):
        ok = native and real_steps(self, n, ins, outs)
        calls["steps"].append((n, ok))
        return ok

    def into(self, xp, inputs, targets):
        ok = real_into(self, xp, inputs, targets)
        calls["into"].append(ok)
        return ok
    monkeypatch.setattr(NativeRun, "run_steps", steps)
    monkeypatch.setattr(NativeRun, "run_into", into)
    net = Fn(_rnn_like, 4)
    net.initialize()
    x, h = rand(7, 2, 4, seed=12), rand(2, 4, seed=13)
    want = _np(net(x, h))
    net.hybridize(backend="llvm")
    got = _np(net(x, h))
    if native:
        assert calls == {"steps": [(7, True)], "into": []}
    else:
        assert calls == {"steps": [(7, False)], "into": [True] * 7}
    for a, b in zip(_flat(want), _flat(got)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reverse_scan_writes_each_row_once(monkeypatch):
    """The recurrent weight's gradient is one product after the reverse scan, its operands
    the stacked rows the loops already have (the states each step started from, the scan's
    own per-step gradient): the reverse scan's body outputs no residual again and no value
    twice, so a native step writes no copies."""
    from compiler.codegen.llvm.exec import NativeRun
    programs = []
    real = NativeRun.run_steps

    def steps(self, n, ins, outs):
        programs.append((self.compiled.symbol, self.compiled.program))
        return real(self, n, ins, outs)
    monkeypatch.setattr(NativeRun, "run_steps", steps)
    x, h = rand(6, 2, 4, seed=1), rand(2, 4, seed=2)
    want = _grads(None, _rnn_like, [x, h])
    got = _grads("llvm", _rnn_like, [rand(6, 2, 4, seed=1), rand(2, 4, seed=2)])
    for a, b in zip(_flat(want[:3]), _flat(got[:3])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    scans = [p for name, p in programs if "_scan" in name]
    assert scans, [name for name, _ in programs]
    for p in scans:
        names = [getattr(s, "name", "") for s in p.steps]
        # the state's gradient is the one product per step; the weight's (s @ W.T: its
        # gradient the transposed sum) is not
        assert len([n for n in names if n.endswith("matmul")]) == 1, names
        assert not [n for n in names if n.endswith("copy")], names
