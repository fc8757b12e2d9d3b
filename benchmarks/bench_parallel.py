"""Many devices and many processes: sections 12.3, 12.5-12.7 of the book, measured.

    python benchmarks/bench_parallel.py              # everything
    python benchmarks/bench_parallel.py twodev copy  # some sections
    HYBRID_SMOKE=1 python benchmarks/bench_parallel.py   # tiny sizes (CI)

Sections:
  twodev     12.3: independent matmul loops on cpu(0) and cpu(1), each alone, then together
             (target: together <= 0.6 x the sum on a 2-core machine).
  copy       12.3: computing on cpu(0) while copying earlier results to cpu(1)
             (to(..., non_blocking=True)): together vs compute + copy.
  allreduce  12.7: allreduce bandwidth vs message size (4 KiB .. 64 MiB) on 2 and 4 local
             processes (started with `hybrid launch`), hybrid's dist path (the checked
             collective, and the dist_sync store's pushpull of one key and of 8 keys, the
             Trainer's gradient path) beside MPI's own Allreduce on the same NumPy buffers
             (target: within 10% for large messages). Needs mpi4py + mpirun
             (pip install 'hybrid[dist]'). BENCH_ROUNDS=N sets the rounds (5).
  lenet      12.5/12.6: LeNet (the book's 12.5 variant) data-parallel on the embedded digits
             (Digits(size=28)): 1 device vs 2 devices, and 1 process vs 2 processes
             (dist_sync), throughput and test accuracy. Each configuration runs in a fresh
             process, so each gets a clean share of the cores; "1 device on 1 core" is the
             book's comparison (one device = one unit of compute), "1 device (2 cores)" lets
             that device's BLAS use both cores.

The machine is shared and noisy: read ratios measured side by side in one run.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from runtime import config  # noqa: E402

SMOKE = bool(config.get("HYBRID_SMOKE"))
HERE = os.path.abspath(__file__)


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ============================================================== 12.3: two devices
def bench_twodev():
    import threading

    from threadpoolctl import threadpool_limits

    import hybrid as hb
    n, loops, reps = (128, 2, 1) if SMOKE else (1000, 20, 5)
    devs = [hb.cpu(0), hb.cpu(1)]
    xs = [hb.random.uniform(size=(n, n), device=d) for d in devs]
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    hb.waitall()

    def run(x):
        return [x @ x for _ in range(loops)]

    def np_work():
        for _ in range(loops):
            a @ a

    def np_two():
        ths = [threading.Thread(target=np_work) for _ in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()

    cases = {"cpu(0) alone": lambda: (run(xs[0]), hb.waitall()),
             "cpu(1) alone": lambda: (run(xs[1]), hb.waitall()),
             "both together": lambda: (run(xs[0]), run(xs[1]), hb.waitall()),
             "numpy alone": np_work, "numpy 2 threads": np_two}
    for f in cases.values():  # warm-up: both workers exist, each device has its core share
        f()
    samples = {k: [] for k in cases}
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(reps):  # interleaved, so every case sees the same machine
            for k, f in cases.items():
                t0 = time.perf_counter()
                f()
                samples[k].append(time.perf_counter() - t0)
    t = {k: statistics.median(v) for k, v in samples.items()}
    gflop = 2 * n ** 3 * loops / 1e9
    print(f"\n[12.3] {loops} x ({n}x{n} matmul) per device; each device has "
          f"{_threads()} BLAS thread(s); median of {reps}, interleaved")
    for k in ("cpu(0) alone", "cpu(1) alone", "both together"):
        v = t[k]
        print(f"  {k:<16} {v * 1e3:9.1f} ms   {gflop * (2 if 'both' in k else 1) / v:7.1f} "
              "GFLOP/s")
    ratio = t["both together"] / (t["cpu(0) alone"] + t["cpu(1) alone"])
    floor = t["numpy 2 threads"] / (2 * t["numpy alone"])
    print(f"  together / sum   {ratio:9.2f}   (target <= 0.60; 0.5 is perfect overlap)")
    print(f"  NumPy in two Python threads, same sizes: together / sum {floor:.2f} (the "
          "machine's floor while other jobs share its cores)")
    return {"together_over_sum": ratio, "numpy_threads": floor, **t}


def _threads():
    from runtime.engine import threads_per_cpu_device
    return threads_per_cpu_device()


def bench_copy():
    import hybrid as hb
    n, loops, reps = (128, 2, 1) if SMOKE else (1000, 10, 3)
    x = hb.random.uniform(size=(n, n), device=hb.cpu(0))
    big = [hb.random.uniform(size=(4 * n, 4 * n), device=hb.cpu(0)) for _ in range(loops)]
    hb.waitall()

    def compute():
        return [x @ x for _ in range(loops)]

    def copy():
        return [b.to(hb.cpu(1), non_blocking=True) for b in big]

    def both():
        ys = compute()
        return [y.to(hb.cpu(1), non_blocking=True) for y in ys], copy()

    for f in (compute, copy, both):
        f()
    hb.waitall()
    t = {name: median_time(lambda f=f: (f(), hb.waitall()), reps)
         for name, f in (("compute", compute), ("copy", copy), ("compute + copy", both))}
    print(f"\n[12.3] compute on cpu(0) ({loops} x {n}x{n} matmul) while copying to cpu(1) "
          f"({loops} x {4 * n}x{4 * n} float32, non_blocking=True)")
    for k, v in t.items():
        print(f"  {k:<16} {v * 1e3:9.1f} ms")
    ratio = t["compute + copy"] / (t["compute"] + t["copy"])
    print(f"  together / sum   {ratio:9.2f}")
    return {"together_over_sum": ratio}


# ============================================================== 12.7: allreduce across processes
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24]  # float32 elements: 4 KiB .. 64 MiB
KEYS = 8  # the "gradients" case: the same bytes as 8 arrays (bucketed like a network's grads)
METHODS = ("mpi", "mpi_inplace", "collective", "store", "store8")


def _allreduce_worker():
    """Runs on every rank (under hybrid launch); rank 0 prints JSON.

    Per size, every method runs once per round, the methods interleaved (a shared machine
    drifts: interleaving gives each method the same conditions); each rank takes the median
    over rounds, and the slowest rank's median is the collective's time.
      mpi          comm.Allreduce(a, out) on NumPy buffers (out-of-place, as for gradients:
                   the input is kept, the sum lands in another buffer)
      mpi_inplace  comm.Allreduce(IN_PLACE, buf): MPI's fastest form (no input to keep)
      collective   hybrid's checked primitive: handshake + non-blocking allreduce, polled
      store        the dist_sync store's pushpull of one key (hybrid arrays in and out)
      store8       the same bytes as 8 keys: the path hb.Trainer(kvstore='dist_sync') takes
                   for a network's gradients (kv.pushpull(keys, grads, out=grads), bucketed)
    """
    from mpi4py import MPI

    import hybrid as hb
    from runtime import collective
    comm = MPI.COMM_WORLD
    group = collective.ProcessGroup()
    kv = hb.kv.create("dist_sync")
    sizes = SIZES[:3] if SMOKE else SIZES
    rounds = 2 if SMOKE else int(os.environ.get("BENCH_ROUNDS", "5"))
    rows = []
    for i, n in enumerate(sizes):
        a = np.ones(n, np.float32)
        out = np.empty_like(a)
        buf = np.zeros(n, np.float32)  # in place: zeros stay zeros (no overflow over reps)
        arr = hb.array(a)
        kv.init(f"one{i}", arr)
        keys = [f"k{i}_{j}" for j in range(KEYS)]
        parts = [hb.array(np.ones(n // KEYS, np.float32)) for _ in keys]
        kv.init(keys, parts)
        # about 0.1 s of transfers per sample at 1 GB/s
        reps = 2 if SMOKE else max(3, min(200, int(1e8 // (n * 4))))

        def mpi():
            comm.Allreduce(a, out, op=MPI.SUM)

        def mpi_inplace():
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        def ours():
            group.handshake("allreduce", 0, [(i, (n,), "float32")])
            group.wait([group.allreduce_start(a)])

        def store():
            kv.pushpull(f"one{i}", arr)
            arr.wait_to_read()

        def store8():
            kv.pushpull(keys, parts, out=parts)
            for p in parts:
                p.wait_to_read()

        fns = dict(zip(METHODS, (mpi, mpi_inplace, ours, store, store8)))
        samples = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                samples[name].append((time.perf_counter() - t0) / reps)
        res = {"bytes": n * 4, "reps": reps, "rounds": rounds}
        for name, v in samples.items():
            res[name] = comm.allreduce(statistics.median(v), op=MPI.MAX)
        rows.append(res)
    if comm.rank == 0:
        print("JSON " + json.dumps(rows), flush=True)
    kv.close()


def bench_allreduce():
    from hybrid import launch
    try:
        import mpi4py  # noqa: F401
        launch.find_mpirun()
    except (ImportError, launch.LaunchError) as exc:
        print(f"\n[12.7] allreduce: skipped ({exc})")
        return None
    results = {}
    for n in (2, 4):
        load0 = _loadavg()
        out = _launch(n, "--allreduce-worker")
        if out is None:
            continue
        rows = out
        results[n] = rows
        print(f"\n[12.7] allreduce of float32 on {n} local processes (hybrid launch -n {n}): "
              "algorithm bandwidth in GB/s (bytes / time), slowest rank, median of "
              f"{rows[0]['rounds']} interleaved rounds; load average {load0} -> {_loadavg()}")
        print(f"  {'':>8} | {'MPI Allreduce':^13} | {'hybrid':^12} | {'dist_sync store':^27}")
        print(f"  {'size':>8} | {'out':>6} {'in pl.':>6} | {'coll.':>6} {'/MPI':>5} | "
              f"{'1 key':>6} {'/MPI':>5} | {f'{KEYS} keys':>7} {'/MPI':>5}")
        for r in rows:
            bw = {k: r["bytes"] / r[k] / 1e9 for k in METHODS}
            print(f"  {_human(r['bytes']):>8} | {bw['mpi']:6.2f} {bw['mpi_inplace']:6.2f} | "
                  f"{bw['collective']:6.2f} {bw['collective'] / bw['mpi']:5.2f} | "
                  f"{bw['store']:6.2f} {bw['store'] / bw['mpi']:5.2f} | "
                  f"{bw['store8']:7.2f} {bw['store8'] / bw['mpi']:5.2f}")
        print("  MPI = comm.Allreduce(a, out) on NumPy buffers; 'MPI in place' = "
              "Allreduce(IN_PLACE, a); hybrid coll. = handshake + polled Iallreduce; store = "
              "dist_sync pushpull (hb arrays in, new arrays out); 8 keys = the same bytes as 8 "
              "gradients, what hb.Trainer(kvstore='dist_sync') sends")
    return results


def _loadavg():
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def _human(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.0f} TiB"


def _launch(n, *args, timeout=900):
    cmd = [sys.executable, "-m", "hybrid", "launch", "-n", str(n), "--timeout", "120", HERE,
           *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("JSON "):
            return json.loads(line[5:])
    print(f"  (job of {n} failed, status {proc.returncode}):\n{proc.stdout[-2000:]}"
          f"{proc.stderr[-2000:]}")
    return None


# ============================================================== 12.5/12.6: LeNet
def _lenet(nn):
    """Section 12.5's LeNet variant (ReLU, max-pooling), in Gluon form."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=3, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(50, kernel_size=5, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Dense(128, activation="relu"),
            nn.Dense(10))
    return net


def _lenet_run(num_devices: int, dist: bool):
    """Train and evaluate; prints JSON on rank 0."""
    import hybrid as hb
    from hybrid import autograd, nn
    from hybrid.data import vision
    rank, workers = hb.parallel.rank(), hb.parallel.num_workers()
    devices = [hb.cpu(i) for i in range(num_devices)]
    epochs = 1 if SMOKE else 8
    global_batch = 256
    batch = global_batch // workers
    train = vision.Digits(train=True, size=28)
    test = vision.Digits(train=False, size=28)
    X = np.stack([train[i][0] for i in range(len(train))])
    y = np.array([train[i][1] for i in range(len(train))], np.int32)
    Xt = np.stack([test[i][0] for i in range(len(test))])
    yt = np.array([test[i][1] for i in range(len(test))], np.int32)
    if SMOKE:
        X, y = X[:512], y[:512]
    hb.random.seed(0)
    net = _lenet(nn)
    net.initialize(hb.init.Xavier(), device=devices)
    net.hybridize()
    net(hb.zeros((2, 1, 28, 28), device=devices[0]))
    for d in devices[1:]:
        net(hb.zeros((2, 1, 28, 28), device=d))
    loss = hb.loss.SoftmaxCrossEntropyLoss()
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2},
                         kvstore="dist_sync" if dist else "device")
    order = np.random.default_rng(0)
    steps_per_epoch = len(X) // global_batch
    seen, elapsed = 0, 0.0
    for epoch in range(epochs):
        perm = order.permutation(len(X))
        hb.waitall()
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            idx = perm[s * global_batch:(s + 1) * global_batch][rank * batch:(rank + 1) * batch]
            xs, ys = hb.split_batch(X[idx], y[idx], devices)
            with autograd.record():
                ls = [loss(net(a), b) for a, b in zip(xs, ys)]
            for l in ls:
                l.backward()
            trainer.step(batch)
        hb.waitall()
        if epoch > 0 or epochs == 1:  # the first epoch includes compilation
            elapsed += time.perf_counter() - t0
            seen += steps_per_epoch * global_batch
    correct = 0
    for lo in range(0, len(Xt), 256):
        xs = hb.split_and_load(Xt[lo:lo + 256], devices, even_split=False)
        preds = np.concatenate([net(a).argmax(axis=1).asnumpy() for a in xs])
        correct += int((preds == yt[lo:lo + 256]).sum())
    if rank == 0:
        print("JSON " + json.dumps({"samples_per_s": seen / elapsed,
                                    "accuracy": correct / len(Xt),
                                    "epochs": epochs}), flush=True)
    if trainer.kvstore is not None and dist:
        trainer.kvstore.close()


def bench_lenet():
    rows = []
    configs = (("1 device (2 cores)", ["--lenet", "1"]),
               ("1 device on 1 core", ["--lenet", "1", "--one-core"]),
               ("2 devices (cpu(0), cpu(1))", ["--lenet", "2"]))
    for label, args in configs:
        proc = subprocess.run([sys.executable, HERE, *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=1800)
        res = next((json.loads(line[5:]) for line in proc.stdout.splitlines()
                    if line.startswith("JSON ")), None)
        if res is None:
            print(f"  {label}: failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
            continue
        rows.append((label, res))
    from hybrid import launch
    try:
        import mpi4py  # noqa: F401
        launch.find_mpirun()
        for n in (1, 2):
            res = _launch(n, "--lenet-dist", timeout=1800)
            if res is not None:
                rows.append((f"{n} process{'es' if n > 1 else ''} (dist_sync)", res))
    except (ImportError, launch.LaunchError) as exc:
        print(f"  processes: skipped ({exc})")
    print("\n[12.5/12.6] LeNet (12.5 variant), Digits 28x28, global batch 256, SGD lr 0.2, "
          f"{rows[0][1]['epochs'] if rows else '?'} epochs; throughput after the first epoch")
    base = rows[0][1]["samples_per_s"] if rows else None
    for label, r in rows:
        speed = r["samples_per_s"]
        print(f"  {label:<28} {speed:9.0f} samples/s  x{speed / base:4.2f}"
              f"   test accuracy {r['accuracy']:.3f}")
    return rows


SECTIONS = {"twodev": bench_twodev, "copy": bench_copy, "allreduce": bench_allreduce,
            "lenet": bench_lenet}


def main(argv):
    if argv[:1] == ["--allreduce-worker"]:
        return _allreduce_worker()
    if argv[:1] == ["--lenet"]:
        if "--one-core" in argv and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
        return _lenet_run(int(argv[1]), dist=False)
    if argv[:1] == ["--lenet-dist"]:
        return _lenet_run(1, dist=True)
    names = argv or list(SECTIONS)
    for name in names:
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
    print(f"bench_parallel: {os.cpu_count()} cores{' (smoke sizes)' if SMOKE else ''}")
    for name in names:
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
