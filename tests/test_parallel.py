"""Automatic and data parallelism on several CPU devices (sections 12.3, 12.5, 12.6).

No timings are asserted here (the machine is shared): concurrency is shown by ops that could
not finish if the devices ran one after the other, and overlap of copies by a copy that
returns before its source is computed. benchmarks/bench_parallel.py measures the speed.
"""
import threading

import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, nn
from runtime import collective
from runtime.engine import get_engine
from runtime.memory import Buffer

DEVS = [hb.cpu(0), hb.cpu(1)]
RNG = np.random.default_rng(0)


# ------------------------------------------------------------------ automatic parallelism
def test_two_devices_run_at_the_same_time():
    """An op on cpu(0) waits for an event that only an op on cpu(1) sets: if the devices ran
    one after the other, the first op would wait forever (it gives up after 20 s)."""
    eng = get_engine()
    started, answered = threading.Event(), threading.Event()
    seen = {}

    def on_cpu0():
        started.set()
        seen["answered"] = answered.wait(20)

    def on_cpu1():
        assert started.wait(20)
        answered.set()

    a, b = Buffer(), Buffer()
    eng.push(on_cpu0, (), (a.var,), hb.cpu(0), "wait_for_cpu1")
    eng.push(on_cpu1, (), (b.var,), hb.cpu(1), "answer_cpu0")
    eng.wait(a.var, timeout=30)
    eng.wait(b.var, timeout=30)
    assert seen["answered"]


def test_independent_matmul_loops_on_two_devices():
    """The book's 12.3 workload on cpu(0) and cpu(1): queued together, correct results."""
    x = RNG.standard_normal((64, 64)).astype(np.float32)
    xs = [hb.array(x, device=d) for d in DEVS]
    ys = []
    for xd in xs:
        y = xd
        for _ in range(5):
            y = hb.tanh(y @ xd) * 0.1
        ys.append(y)
    hb.waitall()
    want = x
    for _ in range(5):
        want = np.tanh(want @ x) * 0.1
    for y, d in zip(ys, DEVS):
        assert y.device == d
        np.testing.assert_allclose(y.asnumpy(), want, rtol=1e-4, atol=1e-6)


def test_non_blocking_copy_returns_before_its_source_is_computed():
    release = threading.Event()
    buf = Buffer()
    src = np.arange(6, dtype=np.float32).reshape(2, 3)

    def slow():
        assert release.wait(20)
        buf.data = src

    get_engine().push(slow, (), (buf.var,), hb.cpu(0), "slow_producer")
    x = hb.NDArray(buf, (2, 3), "float32", hb.cpu(0))
    y = x.to(hb.cpu(1), non_blocking=True)  # queued behind the producer; returns at once
    z = y * 2  # compute on cpu(1) queued behind the copy
    assert not release.is_set() and buf.data is None
    release.set()
    np.testing.assert_array_equal(z.asnumpy(), src * 2)
    assert y.device == hb.cpu(1)


# ------------------------------------------------------------------ splitting batches
def test_split_and_load_even_and_uneven():
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    parts = hb.split_and_load(data, DEVS)
    assert [p.device for p in parts] == DEVS
    np.testing.assert_array_equal(parts[0].asnumpy(), data[:3])
    np.testing.assert_array_equal(parts[1].asnumpy(), data[3:])
    nd = hb.array(data)
    parts = hb.split_and_load(nd, DEVS, batch_axis=1)
    np.testing.assert_array_equal(parts[1].asnumpy(), data[:, 2:])
    assert parts[1].device == hb.cpu(1)
    with pytest.raises(ValueError, match="evenly split"):
        hb.split_and_load(data[:5], DEVS)
    parts = hb.split_and_load(data[:5], DEVS, even_split=False)
    assert [p.shape[0] for p in parts] == [2, 3]  # the last slice takes the remainder
    parts = hb.parallel.split_data(data, 3)
    assert [p.shape for p in parts] == [(2, 4)] * 3
    one = hb.split_and_load(nd, hb.cpu(1))
    assert len(one) == 1 and one[0].device == hb.cpu(1)
    with pytest.raises(ValueError, match="batch_axis"):
        hb.parallel.split_data(data, 2, batch_axis=2)


def test_split_batch():
    X = RNG.standard_normal((8, 3)).astype(np.float32)
    y = np.arange(8)
    xs, ys = hb.split_batch(X, y, DEVS)
    assert [a.shape for a in xs] == [(4, 3), (4, 3)]
    assert [a.device for a in ys] == DEVS
    np.testing.assert_array_equal(ys[1].asnumpy(), y[4:])
    with pytest.raises(ValueError, match="samples"):
        hb.split_batch(X, y[:6], DEVS)


# ------------------------------------------------------------------ parameters on devices
def test_initialize_on_a_list_of_devices():
    net = nn.HybridSequential()
    net.add(nn.Dense(5, in_units=3), nn.Dense(2))
    net.initialize(hb.init.Xavier(), device=DEVS)
    net(hb.ones((1, 3), device=hb.cpu(1)))  # finishes the deferred one on both devices
    for p in net.collect_params().values():
        assert p.list_device() == DEVS
        a, b = p.list_data()
        assert (a.device, b.device) == tuple(DEVS)
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        assert [g.device for g in p.list_grad()] == DEVS


# ------------------------------------------------------------------ allreduce
def test_book_allreduce_from_scratch():
    data = [hb.array(np.full((2, 3), i + 1.0), device=d) for i, d in enumerate(DEVS)]
    out = hb.parallel.allreduce(data)
    assert out[0] is data[0]
    for a, d in zip(data, DEVS):
        assert a.device == d
        np.testing.assert_array_equal(a.asnumpy(), np.full((2, 3), 3.0))


@pytest.mark.parametrize("n,size", [(2, 50_000), (3, 7), (3, 40_001), (2, 1)])
def test_ring_allreduce_exact_and_identical(n, size):
    devs = [hb.cpu(i) for i in range(n)]
    vals = [RNG.integers(-1000, 1000, size).astype(np.float32).reshape(-1, 1) for _ in devs]
    arrays = [hb.array(v, device=d) for v, d in zip(vals, devs)]
    hb.parallel.ring_allreduce(arrays)
    want = sum(vals)
    for a, d in zip(arrays, devs):
        assert a.device == d and a.shape == (size, 1)
        np.testing.assert_array_equal(a.asnumpy(), want)  # integers: exact in float32


def test_runtime_allreduce_methods_give_identical_bits():
    vals = [RNG.standard_normal(70_000).astype(np.float32) for _ in range(3)]
    devs = [hb.cpu(i) for i in range(3)]
    for method in ("ring", "reduce"):
        ts = [collective.Tensor.ready(v, d) for v, d in zip(vals, devs)]
        outs = [t.host() for t in collective.allreduce(ts, method)]
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])
        np.testing.assert_allclose(outs[0], vals[0] + vals[1] + vals[2], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shape or dtype"):
        collective.allreduce([collective.Tensor.ready(vals[0], devs[0]),
                              collective.Tensor.ready(vals[1][:5], devs[1])])


# ------------------------------------------------------------------ training, 12.5 and 12.6
def _lenet_params(rng):
    scale = 0.1
    shapes = [(6, 1, 3, 3), (6,), (16, 6 * 8 * 8), (16,), (4, 16), (4,)]
    return [rng.standard_normal(s).astype(np.float64) * scale for s in shapes]


def _forward(params, X):
    W1, b1, W2, b2, W3, b3 = params
    h = hb.npx.convolution(data=X, weight=W1, bias=b1, kernel=(3, 3), num_filter=6)
    h = hb.npx.relu(h).reshape((X.shape[0], -1))
    h = hb.npx.relu(h @ W2.T + b2)
    return h @ W3.T + b3


def _train_batch(X, y, device_params, devices, lr):
    """Section 12.5's train_batch: record per shard, backward, allreduce, SGD per device."""
    X_shards, y_shards = hb.split_batch(X, y, devices)
    with autograd.record():
        ls = [hb.square(_forward(p, Xs) - ys).sum()
              for Xs, ys, p in zip(X_shards, y_shards, device_params)]
    for l in ls:
        l.backward()
    for i in range(len(device_params[0])):
        hb.parallel.allreduce([device_params[c][i].grad for c in range(len(devices))])
    for params in device_params:
        for p in params:
            p[:] = p - lr / X.shape[0] * p.grad


def test_book_data_parallel_training_matches_one_device():
    rng = np.random.default_rng(3)
    init = _lenet_params(rng)
    runs = {}
    for devices in ([hb.cpu(0)], DEVS):
        device_params = [hb.parallel.get_params([hb.array(a, dtype="float64") for a in init], d)
                         for d in devices]
        data = np.random.default_rng(4)
        for _ in range(3):
            X = data.standard_normal((8, 1, 10, 10))
            y = data.standard_normal((8, 4))
            _train_batch(hb.array(X, dtype="float64"), hb.array(y, dtype="float64"),
                         device_params, devices, lr=0.05)
        for copy in device_params[1:]:  # the copies stay identical
            for a, b in zip(device_params[0], copy):
                np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        runs[len(devices)] = [p.asnumpy() for p in device_params[0]]
    for a, b in zip(runs[1], runs[2]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kvstore", ["device", "local", None])
def test_concise_multi_device_training_matches_one_device(kvstore):
    """Section 12.6: initialize on the device list, split, Trainer sums across devices."""
    def make(devices):
        hb.random.seed(11)
        net = nn.HybridSequential()
        net.add(nn.Dense(8, activation="relu", in_units=6), nn.Dense(3, in_units=8))
        net.initialize(hb.init.Xavier(), device=devices)
        net.cast("float64")
        return net

    one, many = make(hb.cpu(0)), make(DEVS)
    many.hybridize()
    loss = hb.loss.SoftmaxCrossEntropyLoss()
    t1 = hb.Trainer(one.collect_params(), "sgd", {"learning_rate": 0.2}, kvstore=kvstore)
    t2 = hb.Trainer(many.collect_params(), "sgd", {"learning_rate": 0.2}, kvstore=kvstore)
    data = np.random.default_rng(5)
    for _ in range(4):
        X = data.standard_normal((10, 6))
        y = data.integers(0, 3, 10)
        with autograd.record():
            l1 = loss(one(hb.array(X, dtype="float64")), hb.array(y))
        l1.backward()
        t1.step(10)
        xs, ys = hb.split_batch(hb.array(X, dtype="float64"), hb.array(y), DEVS)
        with autograd.record():
            ls = [loss(many(a), b) for a, b in zip(xs, ys)]
        for l in ls:
            l.backward()
        t2.step(10)
    for p, q in zip(one.collect_params().values(), many.collect_params().values()):
        a, b = q.list_data()
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        np.testing.assert_allclose(p.data().asnumpy(), a.asnumpy(), rtol=1e-9, atol=1e-12)
    if kvstore == "device":
        assert t2.kvstore is not None and t2.kvstore.type == "device"
    assert t1.kvstore is None  # one device, one process: nothing to aggregate
