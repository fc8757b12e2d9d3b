"""Worker script for tests/test_dist.py, run on N processes by ``hybrid launch``.

    python -m hybrid launch -n 2 tests/_dist_worker.py SCENARIO

Scenarios: exact (allreduce and push/pull exact, dist_sync and dist_async, mismatch
reports), train (50 data-parallel steps vs one process on the combined batch), async
(dist_async converges; the workers run different numbers of steps), killed (rank 1 dies
after step 5, on a dist_sync and a dist_async store), fewer (rank 1 has fewer batches).
Each rank prints ``RANK r OK <scenario>`` when its checks pass.
"""
import os
import signal
import sys
import time

import numpy as np

import hybrid as hb
from hybrid import autograd, nn

DEVS = [hb.cpu(0), hb.cpu(1)]


def ok(rank, what):
    print(f"RANK {rank} OK {what}", flush=True)


def expect_error(fn, *needles):
    try:
        fn()
    except hb.kv.DistributedError as exc:
        text = str(exc)
        for n in needles:
            assert n in text, f"{n!r} not in: {text}"
        return text
    raise AssertionError("no DistributedError raised")


# ---------------------------------------------------------------------- exact
def exact():
    kv = hb.kv.create("dist_sync", bucket_mb=0.001)  # tiny buckets: several per push
    r, n = kv.rank, kv.num_workers
    assert n == int(os.environ["OMPI_COMM_WORLD_SIZE"]), (n, os.environ)
    assert hb.parallel.rank() == r and hb.parallel.num_workers() == n
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    # init: rank 0's value wins on every rank
    kv.init("w", hb.array(base * (r + 1)))
    out = hb.zeros((3, 4))
    kv.pull("w", out=out)
    assert (out.asnumpy() == base).all()
    # push from two devices per rank: the sum over devices and ranks, exactly
    kv.push("w", [hb.array(base * (r + 1), device=d) * (10 ** i) for i, d in enumerate(DEVS)])
    outs = [hb.zeros((3, 4), device=d) for d in DEVS]
    kv.pull("w", out=outs)
    want = base * 11 * sum(range(1, n + 1))
    for o in outs:
        np.testing.assert_array_equal(o.asnumpy(), want)
    # pushpull of several keys and dtypes (bucketed), in place: an allreduce
    rng = np.random.default_rng(7)
    vals = {f"k{j}": rng.integers(-50, 50, size=(200 + j, 3)).astype(np.float64) for j in range(4)}
    vals["count"] = np.arange(5, dtype=np.int32)
    kv.init(list(vals), [hb.array(v, dtype=v.dtype) for v in vals.values()])
    arrays = [[hb.array(v * (r + 1), dtype=v.dtype, device=d) for d in DEVS]
              for v in vals.values()]
    kv.pushpull(list(vals), arrays)
    for v, pair in zip(vals.values(), arrays):
        for a in pair:
            np.testing.assert_array_equal(a.asnumpy(), v * 2 * sum(range(1, n + 1)))
            assert a.dtype == v.dtype
    kv.barrier()
    # a worker that pushes other keys: every rank gets a report naming the key and step
    bad = hb.kv.create("dist_sync")
    bad.init(["a", "b"], [hb.zeros(3), hb.zeros(3)])
    keys = ["a"] if r == n - 1 else ["a", "b"]
    expect_error(lambda: bad.push(keys, [hb.ones(3)] * len(keys)), "'b'", "step 1",
                 f"rank {n - 1}")
    shape_bad = hb.kv.create("dist_sync")
    shape_bad.init("s", hb.zeros((2, 2)))
    shape_bad._impl._meta["s"] = ((4,), "float32") if r == 0 else ((2, 2), "float32")
    expect_error(lambda: shape_bad.push("s", hb.ones((4,)) if r == 0 else hb.ones((2, 2))),
                 "key 's'", "(4,)", "(2, 2)")
    ok(r, "dist_sync")

    # dist_async: keys sharded over the ranks; pushes add up, exactly, after a barrier
    ps = hb.kv.create("dist_async")
    ps.init(list(range(5)), [hb.full((4,), float(k)) for k in range(5)])
    for _ in range(3):
        ps.push(list(range(5)), [hb.full((4,), float(r + 1))] * 5)
    ps.barrier()
    got = ps.pull(list(range(5)))
    total = 3 * sum(range(1, n + 1))
    for k, g in enumerate(got):
        np.testing.assert_array_equal(g.asnumpy(), np.full(4, k + total, np.float32))
    ps.set_optimizer(hb.optimizer.SGD(learning_rate=1.0))
    ps.barrier()
    ps.push(0, hb.full((4,), 1.0))
    ps.barrier()
    np.testing.assert_array_equal(ps.pull(0).asnumpy(), np.full(4, total - n, np.float32))
    ok(r, "dist_async")
    ps.close()


# ---------------------------------------------------------------------- train
def _mlp(devices):
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="tanh", in_units=8), nn.Dense(1, in_units=16))
    net.initialize(hb.init.Xavier(), device=devices)
    net.cast("float64")
    return net


def _loss(net, x, y):
    return hb.square(net(x) - y).sum()


def train():
    steps, per_rank = 50, 8
    rank, n = hb.parallel.rank(), hb.parallel.num_workers()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((steps, per_rank * n, 8))
    Y = np.sin(X.sum(axis=2, keepdims=True))
    opt = {"learning_rate": 0.05, "momentum": 0.9}
    hb.random.seed(100 + rank)  # different initial weights: the store broadcasts rank 0's
    dp = _mlp(hb.cpu(0))
    dp2 = _mlp(DEVS)  # two devices per process as well: 2 * n shards in all
    ref = _mlp(hb.cpu(0))
    for a, b in zip(ref.collect_params().values(), dp.collect_params().values()):
        a.set_data(b.data())
    ref2 = _mlp(hb.cpu(0))
    for a, b in zip(ref2.collect_params().values(), dp2.collect_params().values()):
        a.set_data(b.data(hb.cpu(0)))
    tr = hb.Trainer(dp.collect_params(), "sgd", opt, kvstore="dist_sync")
    tr2 = hb.Trainer(dp2.collect_params(), "sgd", opt, kvstore="dist_sync")
    tr_ref = hb.Trainer(ref.collect_params(), "sgd", opt, kvstore=None)
    tr_ref2 = hb.Trainer(ref2.collect_params(), "sgd", opt, kvstore=None)
    for s in range(steps):
        lo, hi = rank * per_rank, (rank + 1) * per_rank
        x = hb.array(X[s, lo:hi], dtype="float64")
        y = hb.array(Y[s, lo:hi], dtype="float64")
        with autograd.record():
            l = _loss(dp, x, y)
        l.backward()
        tr.step(per_rank)
        xs, ys = hb.split_batch(x, y, DEVS)
        with autograd.record():
            ls = [_loss(dp2, a, b) for a, b in zip(xs, ys)]
        for l2 in ls:
            l2.backward()
        tr2.step(per_rank)
        if rank == 0:
            for net, trr in ((ref, tr_ref), (ref2, tr_ref2)):
                xa, ya = hb.array(X[s], dtype="float64"), hb.array(Y[s], dtype="float64")
                with autograd.record():
                    lr = _loss(net, xa, ya)
                lr.backward()
                trr.step(per_rank * n)
    assert tr.kvstore.num_workers == n and tr.kvstore.step == steps
    # every rank holds the same weights; rank 0 checks them against one process
    for net in (dp, dp2):
        flat = np.concatenate([p.data().asnumpy().ravel() for p in net.collect_params().values()])
        check = hb.kv.create("dist_sync")
        check.init("flat", hb.array(flat, dtype="float64"))
        mine = hb.array(flat, dtype="float64")
        check.pushpull("flat", mine)
        np.testing.assert_allclose(mine.asnumpy(), n * flat, rtol=0, atol=1e-12)
        check.close()
    if rank == 0:
        for net, refnet in ((dp, ref), (dp2, ref2)):
            diffs = [np.abs(p.data().asnumpy() - q.data().asnumpy()).max()
                     for p, q in zip(net.collect_params().values(),
                                     refnet.collect_params().values())]
            moved = [np.abs(q.data().asnumpy()).max() for q in refnet.collect_params().values()]
            print(f"TRAIN maxdiff={max(diffs):.3e} (weights up to {max(moved):.3f})", flush=True)
            assert max(diffs) < 1e-9, diffs
    ok(rank, "train")


# ---------------------------------------------------------------------- async
def async_():
    rank, n = hb.parallel.rank(), hb.parallel.num_workers()
    rng = np.random.default_rng(1)
    w_true = rng.standard_normal((4, 1))
    X = rng.standard_normal((n * 400, 4))
    Y = X @ w_true
    net = nn.Dense(1, in_units=4, use_bias=False)
    hb.random.seed(rank)
    net.initialize(hb.init.Normal(1.0))
    tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="dist_async")
    Xr, Yr = X[rank::n], Y[rank::n]
    steps = 60 + 30 * rank  # async: workers need not run the same number of steps
    for s in range(steps):
        lo = (s * 20) % len(Xr)
        x = hb.array(Xr[lo:lo + 20])
        y = hb.array(Yr[lo:lo + 20])
        with autograd.record():
            l = hb.square(net(x) - y).sum() * 0.5
        l.backward()
        tr.step(20)
    tr.kvstore.barrier()
    tr.kvstore.pull("weight", out=net.weight.data())
    err = np.abs(net.weight.data().asnumpy().T - w_true).max()
    print(f"ASYNC rank {rank} steps {steps} |w - w*| = {err:.2e}", flush=True)
    assert err < 1e-3, err
    ok(rank, "async")


# ---------------------------------------------------------------------- failures
def _failing(how: str):
    """Rank 1 stops after step 5 (killed by SIGKILL, hung, or out of batches); rank 0 goes
    on to step 8. When rank 1 hangs, rank 0 also trains a second model on a dist_async
    store and reports both the dist_sync and the parameter-server failure."""
    rank = hb.parallel.rank()
    kill = how in ("killed", "hung")
    stores = ["dist_sync", "dist_async"] if kill else ["dist_sync"]
    runs = []
    for store in stores:
        net = nn.Dense(2, in_units=3)
        net.initialize()
        runs.append((net, hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                     kvstore=store)))
    steps = 5 if rank == 1 else 8
    for s in range(1, steps + 1):
        errors = []
        for net, tr in runs:
            with autograd.record():
                l = net(hb.ones((4, 3))).sum()
            l.backward()
            try:
                tr.step(4)
            except hb.kv.DistributedError as exc:
                print(f"SURVIVOR {tr.kvstore.type}: {exc}", flush=True)
                errors.append(exc)
        if errors:
            raise errors[-1]
        print(f"rank {rank} finished step {s}", flush=True)
        if kill and rank == 1 and s == 5:
            time.sleep(0.3)  # let the launcher forward this rank's output first
            if how == "hung":  # stopped, not dead: the others' timeouts report it
                os.kill(os.getpid(), signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGKILL)
    print(f"rank {rank} ran out of batches", flush=True)


SCENARIOS = {"exact": exact, "train": train, "async": async_,
             "killed": lambda: _failing("killed"), "hung": lambda: _failing("hung"),
             "fewer": lambda: _failing("fewer")}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        SCENARIOS[name]()
