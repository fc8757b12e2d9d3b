"""Key-value stores in one process: every store type, the registry, the test double, the
Trainer on a store, and the consistency reports of the dist stores (their explanations are
pure functions; tests/test_dist.py runs them across processes)."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, nn
from runtime import collective, kvstore as rt_kv

DEVS = [hb.cpu(0), hb.cpu(1)]
STORES = ["local", "device", "fake", "dist_sync", "dist_async"]
RNG = np.random.default_rng(0)


def test_registry():
    names = hb.kv.registered()
    for n in STORES + ["dist_device_sync"]:
        assert n in names
    with pytest.raises(ValueError, match="unknown key-value store type 'nope'.*local"):
        hb.kv.create("nope")

    @hb.kv.register("test_custom_store")
    class Custom(rt_kv.LocalStore):
        pass

    kv = hb.kv.create("test_custom_store")
    assert kv.type == "test_custom_store" and isinstance(kv.impl, Custom)
    with pytest.raises(ValueError, match="already registered"):
        hb.kv.register("local")(Custom)


@pytest.mark.parametrize("name", STORES)
def test_init_push_pull_exact(name):
    kv = hb.kv.create(name)
    assert (kv.rank, kv.num_workers, kv.type) == (0, 1, name)
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    kv.init("w", hb.array(base))
    kv.init(7, hb.array(base * 0))
    out = [hb.zeros((2, 3), device=d) for d in DEVS]
    kv.pull("w", out=out)
    for o, d in zip(out, DEVS):
        assert o.device == d
        np.testing.assert_array_equal(o.asnumpy(), base)
    kv.push(["w", 7], [[hb.array(base, device=d) * (i + 1) for i, d in enumerate(DEVS)],
                       hb.ones((2, 3))])
    kv.pull(["w", 7], out=[out, hb.zeros((2, 3))])
    # dist_async without an optimizer adds every push into the stored value
    want = base * 3 + (base if name == "dist_async" else 0)
    for o in out:
        np.testing.assert_array_equal(o.asnumpy(), want)
    np.testing.assert_array_equal(kv.pull(7).asnumpy(), np.ones((2, 3)))
    kv.close()


@pytest.mark.parametrize("name", ["local", "device", "fake", "dist_sync"])
def test_pushpull_is_an_allreduce(name):
    kv = hb.kv.create(name)
    big = RNG.integers(-100, 100, (300, 200)).astype(np.float32)  # ring-sized, exact sums
    kv.init(["big", "small"], [hb.zeros((300, 200)), hb.zeros(3, dtype="int32")])
    bigs = [hb.array(big * (i + 1), device=d) for i, d in enumerate(DEVS)]
    smalls = [hb.array([1, 2, 3], dtype="int32", device=d) for d in DEVS]
    kv.pushpull(["big", "small"], [bigs, smalls])
    for b, s, d in zip(bigs, smalls, DEVS):
        assert b.device == d and s.dtype == np.int32
        np.testing.assert_array_equal(b.asnumpy(), big * 3)
        np.testing.assert_array_equal(s.asnumpy(), [2, 4, 6])
    outs = [hb.zeros((300, 200), device=d) for d in DEVS]
    kv.pushpull("big", bigs, out=outs)  # into other arrays
    np.testing.assert_array_equal(outs[1].asnumpy(), big * 6)
    kv.pull("big", out=outs[0])  # the stored value is the last sum
    np.testing.assert_array_equal(outs[0].asnumpy(), big * 6)


@pytest.mark.parametrize("name", STORES)
def test_set_optimizer_updates_on_the_store(name):
    kv = hb.kv.create(name)
    assert kv.is_capable("optimizer")
    w0 = RNG.standard_normal((4,)).astype(np.float32)
    kv.init(3, hb.array(w0))
    kv.set_optimizer(hb.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    g = RNG.standard_normal((4,)).astype(np.float32)
    m = np.zeros(4, np.float32)
    w = w0.copy()
    for _ in range(3):
        kv.push(3, [hb.array(g, device=d) for d in DEVS])
        m = 0.9 * m - 0.5 * (2 * g)
        w = w + m
    np.testing.assert_allclose(kv.pull(3).asnumpy(), w, rtol=1e-5, atol=1e-6)
    out = [hb.zeros(4, device=d) for d in DEVS]
    kv.pushpull(3, [hb.zeros(4, device=d) for d in DEVS], out=out)  # push then pull
    m = 0.9 * m
    np.testing.assert_allclose(out[1].asnumpy(), w + m, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["local", "device", "dist_sync"])
def test_broadcast(name):
    kv = hb.kv.create(name)
    v = hb.array([[1.0, 2.0]])
    outs = [hb.zeros((1, 2), device=d) for d in DEVS]
    kv.broadcast("b", v, out=outs)
    for o in outs:
        np.testing.assert_array_equal(o.asnumpy(), [[1.0, 2.0]])


@pytest.mark.parametrize("name", STORES)
def test_bad_calls_say_what_is_wrong(name):
    kv = hb.kv.create(name)
    kv.init("w", hb.zeros((2, 2)))
    with pytest.raises(ValueError, match="already initialized"):
        kv.init("w", hb.zeros((2, 2)))
    with pytest.raises(KeyError, match="'nope' was not initialized"):
        kv.push("nope", hb.zeros((2, 2)))
    with pytest.raises(KeyError, match="not initialized"):
        kv.pull("nope", out=hb.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"'w' was initialized as float32\[2, 2\], got "
                                         r"float32\[3\]"):
        kv.push("w", hb.zeros(3))
    with pytest.raises(TypeError, match="hybrid arrays"):
        kv.push("w", np.zeros((2, 2)))
    with pytest.raises(TypeError, match="ints or strings"):
        kv.push(1.5, hb.zeros((2, 2)))
    with pytest.raises(ValueError, match="2 keys need a list of 2"):
        kv.push(["w", "w"], hb.zeros((2, 2)))
    with pytest.raises(ValueError, match="out has shape"):
        kv.pull("w", out=hb.zeros(4))


def test_fake_store_records_and_fails_on_demand():
    kv = hb.kv.create("fake", num_workers=3, rank=1, fail_on=("push", 2))
    assert (kv.rank, kv.num_workers) == (1, 3)
    kv.init("a", hb.zeros(2))
    kv.push("a", hb.ones(2))
    np.testing.assert_array_equal(kv.pull("a").asnumpy(), [3.0, 3.0])  # 3 identical workers
    with pytest.raises(hb.kv.DistributedError, match="injected failure at push #2"):
        kv.push("a", hb.ones(2))
    assert [c[0] for c in kv.impl.calls] == ["init", "push", "pull", "push"]
    with pytest.raises(ValueError, match="rank"):
        hb.kv.create("fake", num_workers=2, rank=2)


# ------------------------------------------------------------------ the Trainer on a store
def _net(devices, seed=3):
    hb.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(4, activation="tanh", in_units=3), nn.Dense(2, in_units=4))
    net.initialize(hb.init.Xavier(), device=devices)
    net.cast("float64")
    return net


def _train(net, trainer, devices, steps=3, batch=8, start=0):
    data = np.random.default_rng(9)
    for step in range(start + steps):
        X = hb.array(data.standard_normal((batch, 3)), dtype="float64")
        Y = hb.array(data.standard_normal((batch, 2)), dtype="float64")
        if step < start:  # the batches an earlier run trained on
            continue
        xs, ys = hb.split_batch(X, Y, devices)
        with autograd.record():
            ls = [hb.square(net(a) - b).sum() for a, b in zip(xs, ys)]
        for l in ls:
            l.backward()
        trainer.step(batch)
    return [p.data(devices[0]).asnumpy() for p in net.collect_params().values()]


@pytest.mark.parametrize("store,uok", [("device", False), ("local", False), ("device", True),
                                       ("dist_sync", False), ("dist_async", None),
                                       ("fake", True)])
def test_trainer_on_stores_matches_one_device(store, uok):
    opt = {"learning_rate": 0.1, "momentum": 0.9}
    one = _net(hb.cpu(0))
    ref = _train(one, hb.Trainer(one.collect_params(), "sgd", opt), [hb.cpu(0)])
    many = _net(DEVS)
    tr = hb.Trainer(many.collect_params(), "sgd", opt, kvstore=store, update_on_kvstore=uok)
    got = _train(many, tr, DEVS)
    assert tr.kvstore.type == store
    for a, b in zip(ref, got):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for p in many.collect_params().values():
        c0, c1 = p.list_data()
        np.testing.assert_array_equal(c0.asnumpy(), c1.asnumpy())


def test_trainer_divides_by_the_workers_of_a_synchronous_store():
    """A fake store acting as 4 identical workers: the sum is 4x, the trainer divides by 4."""
    opt = {"learning_rate": 0.1}
    one = _net(hb.cpu(0))
    ref = _train(one, hb.Trainer(one.collect_params(), "sgd", opt), [hb.cpu(0)])
    net = _net(hb.cpu(0))
    kv = hb.kv.create("fake", num_workers=4)
    tr = hb.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    got = _train(net, tr, [hb.cpu(0)])
    for a, b in zip(ref, got):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    ops = [c[0] for c in kv.impl.calls]
    assert ops == ["init", "pull"] + ["pushpull"] * 3
    # the last layer's gradients first: backward computes them first
    assert kv.impl.calls[2][1] == ["1.bias", "1.weight", "0.bias", "0.weight"]


def test_trainer_store_errors():
    net = _net(DEVS)
    with pytest.raises(ValueError, match="unknown kvstore 'nccl'"):
        hb.Trainer(net.collect_params(), "sgd", kvstore="nccl")
    with pytest.raises(TypeError, match="kvstore must be"):
        hb.Trainer(net.collect_params(), "sgd", kvstore=3)
    tr = hb.Trainer(net.collect_params(), "sgd", kvstore="device", update_on_kvstore=True)
    with pytest.raises(RuntimeError, match="update_on_kvstore"):
        tr.allreduce_grads()
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        hb.Trainer(net.collect_params(), "sgd", kvstore="dist_async", update_on_kvstore=False)
    kv = hb.kv.create("fake", fail_on=("pushpull", 1))
    tr = hb.Trainer(net.collect_params(), "sgd", kvstore=kv)
    with pytest.raises(hb.kv.DistributedError, match="injected"):
        _train(net, tr, DEVS, steps=1)


# ------------------------------------------------------------------ consistency reports
def _sig(op, step, keys):
    return {"op": op, "step": step, "keys": [[k, list(s), d] for k, s, d in keys]}


def test_mismatch_explanations_name_rank_key_and_step():
    mine = _sig("push", 7, [("w", (3, 4), "float32"), ("b", (4,), "float32")])
    why, key = collective._explain_mismatch(
        0, mine, 1, _sig("push", 7, [("w", (4, 4), "float32"), ("b", (4,), "float32")]))
    assert key == "w" and "key 'w' is float32(3, 4) on rank 0 but float32(4, 4) on rank 1" in why
    why, key = collective._explain_mismatch(0, mine, 2, _sig("push", 7, [("w", (3, 4),
                                                                         "float32")]))
    assert key == "b" and "rank 0 pushes key 'b' but rank 2 does not" in why
    why, key = collective._explain_mismatch(
        0, mine, 1, _sig("push", 7, [("b", (4,), "float32"), ("w", (3, 4), "float32")]))
    assert "different orders" in why and key == "w"
    why, _ = collective._explain_mismatch(0, mine, 1, _sig("barrier", 9, []))
    assert "rank 1 is doing 'barrier' at its step 9 while rank 0 is doing 'push' at step 7" \
        in why
    assert collective.describe_keys(["a", "b", "c", "d", "e"]) == "'a', 'b', 'c' and 2 more"


def test_dist_sync_buckets_pack_small_keys_and_send_large_ones_alone():
    """Small gradients share flat buckets (one message); a gradient of min(bucket, 1 MiB) or
    more is sent from its own buffer (packing it would copy it first), in the order given;
    a bucket holds one dtype. The sums are the same either way."""
    kv = hb.kv.create("dist_sync")
    sizes = {"a": 512, "big1": 1 << 18, "b": 100, "c64": 50, "big2": 300_000, "d": 10}
    dtypes = {"c64": "float64"}
    kv.init(list(sizes), [hb.zeros(n, dtype=dtypes.get(k, "float32")) for k, n in sizes.items()])
    assert kv.impl._buckets(list(sizes)) == [["big1"], ["a", "b"], ["big2"], ["c64"], ["d"]]
    small = hb.kv.create("dist_sync", bucket_mb=0.001)  # ~1 KiB buckets: a 2 KiB key alone
    small.init(list(sizes), [hb.zeros(n, dtype=dtypes.get(k, "float32"))
                             for k, n in sizes.items()])
    assert small.impl._buckets(list(sizes)) == [["a"], ["big1"], ["b"], ["big2"], ["c64"],
                                                ["d"]]
    vals = [[hb.array(RNG.integers(-9, 9, n), dtype=dtypes.get(k, "float32"), device=d)
             for d in DEVS] for k, n in sizes.items()]
    want = [v[0].asnumpy() + v[1].asnumpy() for v in vals]
    kv.pushpull(list(sizes), vals)
    for pair, w in zip(vals, want):
        for a in pair:
            np.testing.assert_array_equal(a.asnumpy(), w)
            assert a.dtype == w.dtype
    kv.close()
    small.close()


def test_allreduce_output_pool_reuses_only_unreferenced_buffers():
    """The output buffers of large allreduces are reused (their pages are mapped already),
    but never while any array still views them."""
    pool = collective._OutputPool()
    n = (1 << 20) // 4  # 1 MiB of float32: pooled
    a = pool.take((n,), "float32")
    a[:] = 1.0
    b = pool.take((n,), np.float32)  # a is alive: another buffer
    assert not np.shares_memory(a, b)
    kept = {a.ctypes.data, b.ctypes.data}
    view = a[10:20].reshape(2, 5)  # a view keeps a's buffer in use
    del a
    c = pool.take((n // 2, 2), "float32")
    assert not np.shares_memory(c, view) and c.shape == (n // 2, 2)
    assert (view == 1.0).all()
    del view, c
    d = pool.take((n,), "float32")  # a's buffer is free again (b, c: not pooled, 2 kept)
    assert d.ctypes.data in kept and len(pool._bufs[(n, "<f4")]) == 2
    assert not np.shares_memory(d, b)
    small = pool.take((100,), "float32")
    assert small.base is None and (100, "<f4") not in pool._bufs  # left to the allocator
    pool.clear()
    assert not pool._bufs


def test_launch_environment_and_single_process_group():
    assert collective.launched() == (0, 1)
    g = collective.world()
    assert isinstance(g, collective.LocalGroup) and (g.rank, g.size) == (0, 1)
    assert hb.parallel.rank() == 0 and hb.parallel.num_workers() == 1


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_save_and_load_states_with_updates_on_the_store(tmp_path, opt):
    """update_on_kvstore: the optimizer states live in the store; save_states writes them and
    load_states puts them back, so a resumed run continues exactly like an unbroken one."""
    params = {"learning_rate": 0.05, "momentum": 0.9} if opt == "sgd" else \
        {"learning_rate": 0.01}
    ref_net = _net(DEVS)
    ref_tr = hb.Trainer(ref_net.collect_params(), opt, params, kvstore="device",
                        update_on_kvstore=True)
    ref = _train(ref_net, ref_tr, DEVS, steps=6)

    net = _net(DEVS)
    tr = hb.Trainer(net.collect_params(), opt, params, kvstore="device",
                    update_on_kvstore=True)
    _train(net, tr, DEVS, steps=3)
    assert tr.kvstore.optimizer_states()  # the states are on the store, not the trainer
    tr.save_states(tmp_path / "t.states")
    net.save_parameters(str(tmp_path / "net.params"))

    resumed = _net(DEVS)
    resumed.load_parameters(str(tmp_path / "net.params"), device=DEVS)
    tr2 = hb.Trainer(resumed.collect_params(), opt, params, kvstore="device",
                     update_on_kvstore=True)
    tr2.load_states(tmp_path / "t.states")
    got = _train(resumed, tr2, DEVS, steps=3, start=3)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
