"""The direct path of a quick hybridized call (no engine hand-off): same results, parameter
updates seen, pending or failed inputs still go through the engine and report as usual."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, nn, tracing
from hybrid.ndarray import NDArray
from runtime import engine
from runtime.memory import Buffer

from conftest import mismatches_in_threads


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
    net.initialize()
    return net


def _warm_mlp(calls):
    """(net, x, its cache entry) after ``calls`` hybridized calls, each waited for."""
    net = _mlp()
    x = hb.random.normal(size=(1, 8))
    net.hybridize(backend="llvm")
    for _ in range(calls):
        net(x).wait_to_read()
    return net, x, next(iter(net._cached.entries.values()))


def _expected(net, x):
    w = [p.data().asnumpy() for p in net.collect_params().values()]
    h = np.maximum(x @ w[0].T + w[1], 0)
    return h @ w[2].T + w[3]


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_direct_calls_match_and_see_parameter_updates(backend, dispatch_paths):
    net = _mlp()
    x = hb.random.normal(size=(1, 8))
    net.hybridize(backend=backend)
    for _ in range(40):  # each call waited for: its time, once known, allows the direct path
        out = net(x)
        out.wait_to_read()
    np.testing.assert_allclose(out.asnumpy(), _expected(net, x.asnumpy()), rtol=1e-5,
                               atol=1e-6)
    if backend == "llvm":  # a native call this small takes the direct path once timed
        assert dispatch_paths["direct"] > 0
    w = net[1].weight
    w.set_data(w.data() * 2)  # a rebound parameter must be seen by the next direct call
    np.testing.assert_allclose(net(x).asnumpy(), _expected(net, x.asnumpy()), rtol=1e-5,
                               atol=1e-6)
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    with hb.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(1)  # in-place updates rebind each parameter array's buffer
    np.testing.assert_allclose(net(x).asnumpy(), _expected(net, x.asnumpy()), rtol=1e-5,
                               atol=1e-6)


def test_direct_calls_see_in_place_updates_of_parameter_arrays(dispatch_paths):
    """The caller's path holds its parameters' arrays until some array is rebound: each
    in-place form (slice assignment, augmented assignment, copyto) must be seen at once."""
    net = _mlp()
    x = hb.random.normal(size=(1, 8))
    net.hybridize(backend="llvm")
    for _ in range(40):
        net(x).wait_to_read()
    w, b = net[0].weight.data(), net[1].bias.data()
    updates = [lambda: w.__setitem__(slice(None), w * 0.5),
               lambda: b.__iadd__(1.0),
               lambda: (w * -1).copyto(w)]
    for update in updates:
        before = dispatch_paths["direct"]
        update()
        hb.waitall()  # the update computed: the call can run in the caller
        np.testing.assert_allclose(net(x).asnumpy(), _expected(net, x.asnumpy()), rtol=1e-5,
                                   atol=1e-6)
        assert dispatch_paths["direct"] == before + 1  # and it ran in the caller


def test_failed_input_is_reported_where_it_is_read(dispatch_paths):
    net = _mlp()
    x = hb.random.normal(size=(1, 8))
    net.hybridize(backend="llvm")
    for _ in range(40):
        net(x).wait_to_read()
    bad = hb.array(np.ones((2, 4), np.float32)).reshape((1, 8))
    hb.waitall()
    # an input whose computation failed: the call queues through the engine and the error
    # surfaces at the read, naming the failed op, as for any asynchronous op
    buf = Buffer()

    def fail():
        raise RuntimeError("boom in producer")
    engine.get_engine().push(fail, (), (buf.var,), x.device, "producer")
    broken = NDArray(buf, (1, 8), "float32", x.device)
    before = dispatch_paths["engine"]
    out = net(broken)
    assert dispatch_paths["engine"] == before + 1
    with pytest.raises(Exception, match="producer"):
        out.asnumpy()
    hb.waitall()  # the failure was reported at the read, once
    np.testing.assert_allclose(net(bad).asnumpy(), _expected(net, bad.asnumpy()), rtol=1e-5,
                               atol=1e-6)


def test_deployed_model_takes_the_direct_path(tmp_path, dispatch_paths):
    net = _mlp()
    x = hb.random.normal(size=(1, 8))
    net.hybridize(backend="llvm")
    net(x)
    net.export(str(tmp_path / "mlp"), example_inputs=(x,))
    deployed = hb.load(str(tmp_path / "mlp"))
    for _ in range(40):
        out = deployed(x)
        out.wait_to_read()
    assert dispatch_paths["direct"] > 0
    np.testing.assert_allclose(out.asnumpy(), _expected(net, x.asnumpy()), rtol=1e-5,
                               atol=1e-6)


def test_a_parameter_cast_alone_is_a_clear_error_not_a_stale_graph():
    net = _mlp()
    x = hb.random.normal(size=(1, 8))
    net.hybridize(backend="llvm")
    net(x).wait_to_read()
    net[0].weight.cast("float64")
    with pytest.raises(RuntimeError, match=r"was float32\[16, 8\] when the graph was compiled"):
        net(x)
    net.cast("float64")  # the block's cast drops its graphs: re-traced, float64 out
    assert net(x.astype("float64")).dtype == np.float64


def test_a_queued_call_and_direct_calls_of_one_net_never_mix_their_pointers():
    """One call waits on the engine for a pending input while the next runs directly in this
    thread (and two threads call one net): each call's pointers are its own."""
    net = _mlp()
    xr = hb.array(np.full((1, 8), 0.5, np.float32))
    big = hb.array(np.random.default_rng(0).random((96, 96)).astype(np.float32))
    net(xr)  # finish deferred initialization
    net.hybridize(backend="llvm")
    want_r = _expected(net, xr.asnumpy())
    for _ in range(40):
        net(xr).wait_to_read()
    for _ in range(300):
        xp = hb.dot(big, big)[:1, :8] / 100  # pending when the net is called
        o1, o2 = net(xp), net(xr)
        np.testing.assert_allclose(o1.asnumpy(), _expected(net, xp.asnumpy()), rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(o2.asnumpy(), want_r, rtol=1e-4, atol=1e-5)
    xs = [hb.array(np.full((1, 8), float(k), np.float32)) for k in range(2)]
    wants = [_expected(net, x.asnumpy()) for x in xs]
    bad = mismatches_in_threads(net, xs, wants, 2000, rtol=1e-4, atol=1e-5)
    assert bad == [0, 0]


def test_a_block_without_inputs_can_be_called_again():
    class Const(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter("w", shape=(3,), init=hb.init.One())

        def forward(self):
            return self.w.data() * 2

    net = Const()
    net.initialize()
    net.hybridize(backend="llvm")
    for _ in range(20):
        out = net()
        out.wait_to_read()
    np.testing.assert_array_equal(out.asnumpy(), np.full(3, 2, np.float32))


def test_cost_estimate_ignores_outliers_but_follows_a_real_slowdown():
    """The direct-call decision (a call under _INLINE_US runs in the caller): a few samples
    inflated by a busy core must not flip a quick call onto the engine path; a call that
    really became slow must leave it."""
    from hybrid.dispatch import _INLINE_US, _note_cost
    timing = {}
    _note_cost(timing, 12e-6)
    for _ in range(3):
        _note_cost(timing, 300e-6)  # preempted: a spike
    assert timing["avg_us"] < _INLINE_US
    _note_cost(timing, 11e-6)
    assert timing["avg_us"] == 11.0
    for _ in range(40):
        _note_cost(timing, 500e-6)  # really slow now
    assert timing["avg_us"] >= _INLINE_US


def test_direct_calls_follow_each_training_step():
    """The direct path reuses its parameter data while the parameter buffers are the same
    objects: every optimizer step rebinds them, and the next prediction must see it."""
    from hybrid import loss
    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu"), nn.Dense(3))
    net.initialize()
    x = hb.random.normal(size=(1, 20))
    xb = hb.random.normal(size=(32, 20))
    yb = hb.array(np.arange(32) % 3, dtype="int32")
    net(x)
    net.hybridize(backend="llvm")
    lf = loss.SoftmaxCrossEntropyLoss()
    tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    for _ in range(30):
        with autograd.record():
            l = lf(net(xb), yb)
        l.backward()
        tr.step(32)
        for _ in range(3):  # quick calls: the direct path once its cost is known
            y = net(x).asnumpy()
        w = [p.data().asnumpy() for p in net.collect_params().values()]
        ref = np.maximum(x.asnumpy() @ w[0].T + w[1], 0) @ w[2].T + w[3]
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_a_dropped_executable_is_freed_without_the_cycle_collector():
    """What a call path keeps per executable (dispatch.Caller) hangs off the cache entry,
    never off the executable: re-hybridizing frees the old arena and its parameter arrays at
    once, not at the next garbage collection."""
    import gc
    import weakref
    net, x, entry = _warm_mlp(20)
    assert entry.caller is not None  # the direct path made it
    exe = weakref.ref(entry.exe)
    del entry
    hb.waitall()
    gc.disable()
    try:
        net.hybridize(backend="llvm")  # drops the compiled signatures
        assert exe() is None
    finally:
        gc.enable()


def test_a_failed_parameter_binding_is_never_trusted_by_the_next_call():
    """A parameter that cannot be converted fails its call; a later call with the earlier,
    good parameters binds them again instead of running on half-rewritten pointers."""
    net, x, entry = _warm_mlp(5)
    run = entry.exe.run
    params = [h._buf.data for h in tracing._param_handles(entry)]
    xd = x._buf.data
    want = run(np, [xd], params)[0]
    first, last = run.params[0][1], run.params[-1][1]  # in the order they are bound
    bad = list(params)
    bad[first] = params[first] + 1  # its pointer is rewritten before the failure
    bad[last] = np.ones((7, 7), np.float32)  # cannot be reshaped to that parameter's shape
    with pytest.raises(ValueError):
        run(np, [xd], bad)
    np.testing.assert_array_equal(run(np, [xd], params)[0], want)


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_backward_uses_the_arrays_of_its_forward(backend):
    """A recorded call keeps its residuals as they were: a parameter or input updated in
    place between forward and backward does not change that call's gradients."""
    net = nn.Dense(3, in_units=4)
    net.initialize()
    net.hybridize(backend=backend)
    x = hb.random.normal(size=(2, 4))
    x.attach_grad()
    for _ in range(3):  # past the first calls (tracing, timing): the caller's path
        with autograd.record():
            y = net(x)
        y.backward()
    w0, x0 = net.weight.data().asnumpy(), x.asnumpy()
    with autograd.record():
        y = net(x)
    net.weight.data()[:] = net.weight.data() * 10  # outside record: allowed, rebinds
    x[:] = x * 3
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.ones((2, 3)) @ w0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.weight.grad().asnumpy(), np.ones((3, 2)) @ x0, rtol=1e-5,
                               atol=1e-6)
