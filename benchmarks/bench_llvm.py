"""The PERF.md workloads, side by side in one run: hybrid (LLVM backend) vs eager vs NumPy,
and PyTorch / JAX when they are importable in this environment.

    python benchmarks/bench_llvm.py            # HYBRID_SMOKE=1 for a quick pass
    python benchmarks/bench_llvm.py --torch-python /work/venv-torch/bin/python \
        --jax-python /work/venv-jax/bin/python   # peers in venvs of their own

PyTorch and JAX run under their own interpreters when they are not importable here:
``--torch-python`` / ``--jax-python``, or ``BENCH_TORCH_PYTHON`` / ``BENCH_JAX_PYTHON``, or the
venvs ``/work/venv-torch`` and ``/work/venv-jax`` when they exist (benchmarks/peers.py).

Each framework is measured in a process of its own, one after another (``--part hybrid``,
``numpy``, ``torch``, ``jax``), as PERF.md measured the peers: a framework's worker threads
(OpenMP's and XLA's spin for a while after their last job) never take cores from the next
one's measurement. The parent prints one table; with ``--rounds N`` (default 2) it runs the
processes N times, interleaved, and keeps each figure's best round.

A. the book's MLP forward, batch 1 and 64 (µs/call, 1000 calls then one sync)
C. training step at batch 256: MLP 784-256-10 and LeNet (ms/step)
D. y = tanh(x*a + b) * sigmoid(x) + 1 on 4,194,304 float32 (ms; GB/s vs memory copy)
E. first-call latency: trace + compile, cold (empty cache) and warm (a new process)
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

peers.adopt_host_path()  # a peer's venv: hybrid and its dependencies from the parent's path

import numpy as np  # noqa: E402

import hybrid as hb  # noqa: E402
from hybrid import autograd, loss, nn  # noqa: E402
from hybrid.nn import models  # noqa: E402

SMOKE = bool(hb.config.get("HYBRID_SMOKE"))
REPS = 5
# torch.compile / jit.script variants (BENCH_COMPILED_PEERS=0 skips them: minutes of Inductor
# compiles when only the eager comparison is wanted)
COMPILED_PEERS = os.environ.get("BENCH_COMPILED_PEERS", "1") != "0"
PARTS = ("hybrid", "numpy", "torch", "jax")
PART = "hybrid"  # the framework this process measures (--part)


def timeit(fn, n, sync=hb.waitall, warmup=None):
    for _ in range(n if warmup is None else warmup):  # warm-up, one untimed repetition: JIT
        fn()  # compiles, caches, thread pools, buffer pools and averages settle (PERF.md)
    sync()
    runs = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs)


def book_mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def _torch():
    if PART != "torch":
        return None
    try:
        import torch  # noqa: PLC0415
        return torch
    except ImportError:
        return None


def _jax():
    if PART != "jax":
        return None
    try:
        import jax  # noqa: PLC0415
        return jax
    except ImportError:
        return None


def _installed(name) -> bool:
    return peers.interpreter(name) is not None


# ------------------------------------------------------------------------- A
def bench_mlp(rows):
    n = 100 if SMOKE else 1000
    for bs in (1, 64):
        hb.random.seed(bs)
        x = hb.random.normal(size=(bs, 512))
        res = {}
        net = book_mlp()
        net(x)  # deferred initialization: every part reads the same weights
        if PART == "hybrid":
            res["hybrid eager"] = timeit(lambda: net(x), n)
            net.hybridize(backend="llvm")
            res["hybrid llvm"] = timeit(lambda: net(x), n)
        w = [p.data().asnumpy() for p in net.collect_params().values()]
        xn = x.asnumpy()

        def np_mlp():
            h = np.maximum(xn @ w[0].T + w[1], 0)
            h = np.maximum(h @ w[2].T + w[3], 0)
            return h @ w[4].T + w[5]
        if PART == "numpy":
            res["numpy"] = timeit(np_mlp, n, sync=lambda: None)
        torch = _torch()
        if torch is not None:
            tnet = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                       torch.nn.Linear(128, 2)).eval()
            tx = torch.from_numpy(xn)
            with torch.no_grad():
                res["torch eager"] = timeit(lambda: tnet(tx), n, sync=lambda: None)
                if COMPILED_PEERS:
                    scripted = torch.jit.script(tnet)
                    res["torch jit.script"] = timeit(lambda: scripted(tx), n,
                                                     sync=lambda: None)
        jax = _jax()
        if jax is not None:
            import jax.numpy as jnp  # noqa: PLC0415
            jw = [jnp.asarray(a) for a in w]

            @jax.jit
            def jmlp(x):
                h = jnp.maximum(x @ jw[0].T + jw[1], 0)
                h = jnp.maximum(h @ jw[2].T + jw[3], 0)
                return h @ jw[4].T + jw[5]
            jx = jnp.asarray(xn)
            res["jax jit"] = timeit(lambda: jmlp(jx).block_until_ready(), n, sync=lambda: None)
        for k, v in res.items():
            rows.append((f"A. MLP b{bs}", k, v * 1e6, "µs/call"))


# ------------------------------------------------------------------------- C
def bench_train(rows):
    steps = 3 if SMOKE else 20
    for name in ("mlp", "lenet"):
        hb.random.seed(0)
        x = hb.random.normal(size=(256, 1, 28, 28))
        y = hb.array(np.arange(256) % 10, dtype="int32")
        for mode in ("eager", "llvm") if PART == "hybrid" else ():
            net = models.mlp(num_outputs=10) if name == "mlp" else models.lenet()
            net.initialize(hb.init.Xavier())
            net(x)
            loss_fn = loss.SoftmaxCrossEntropyLoss()
            if mode == "llvm":  # as a Gluon user would: the network and the loss hybridized
                net.hybridize(backend="llvm")
                loss_fn.hybridize(backend="llvm")
            trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})

            def step():
                with autograd.record():
                    l = loss_fn(net(x), y)
                l.backward()
                trainer.step(256)
            label = "hybrid eager" if mode == "eager" else "hybrid llvm (net + loss, fused step)"
            # warm-up: the device's dispatch trial (hybrid/call_mode.py) takes ~70 iterations
            rows.append((f"C. {name} train b256", label, timeit(
                step, steps, warmup=None if SMOKE or mode == "eager" else 5 * steps) * 1e3,
                "ms/step"))
            if mode == "llvm":  # a loop that reads its loss every batch syncs every step (the
                # peers' steps below are synchronous anyway)
                # warm-up: the loop changed (it syncs now), so the trial runs again
                rows.append((f"C. {name} train b256", "hybrid llvm, sync every step",
                             timeit(lambda: (step(), hb.waitall()), steps,
                                    warmup=None if SMOKE else 5 * steps) * 1e3, "ms/step"))
        xn, yn = x.asnumpy(), y.asnumpy()
        for label, fn in _peer_train_steps(name, xn, yn):
            try:  # torch.compile needs a working C++ toolchain: its failure is a row, not a
                # lost part
                t = timeit(fn, steps, sync=lambda: None) * 1e3
            except Exception as exc:  # noqa: BLE001
                rows.append((f"C. {name} train b256", label, float("nan"),
                             f"failed: {type(exc).__name__}"))
                continue
            rows.append((f"C. {name} train b256", label, t, "ms/step"))


def _peer_train_steps(name, xn, yn):
    """(label, step) for PyTorch (eager, torch.compile of the model) and JAX (jit of the whole
    step), when installed: forward + softmax cross-entropy + backward + SGD, as in PERF.md."""
    out = []
    torch = _torch()
    if torch is not None:
        tnn = torch.nn
        for label in ("torch eager", "torch.compile") if COMPILED_PEERS else ("torch eager",):
            torch.manual_seed(0)
            if name == "mlp":
                model = tnn.Sequential(tnn.Flatten(), tnn.Linear(784, 256), tnn.ReLU(),
                                       tnn.Linear(256, 10))
            else:
                model = tnn.Sequential(
                    tnn.Conv2d(1, 6, 5, padding=2), tnn.Sigmoid(), tnn.AvgPool2d(2, 2),
                    tnn.Conv2d(6, 16, 5), tnn.Sigmoid(), tnn.AvgPool2d(2, 2), tnn.Flatten(),
                    tnn.Linear(400, 120), tnn.Sigmoid(), tnn.Linear(120, 84), tnn.Sigmoid(),
                    tnn.Linear(84, 10))
            fwd = torch.compile(model) if label == "torch.compile" else model
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            tx, ty = torch.from_numpy(xn), torch.from_numpy(yn.astype(np.int64))
            lossf = tnn.CrossEntropyLoss()

            def tstep(fwd=fwd, opt=opt, tx=tx, ty=ty, lossf=lossf):
                opt.zero_grad(set_to_none=True)
                lossf(fwd(tx), ty).backward()
                opt.step()
            out.append((label, tstep))
    jax = _jax()
    if jax is not None:
        import jax.numpy as jnp  # noqa: PLC0415
        rng = np.random.default_rng(0)

        def glorot(*shape):
            fan = shape[0] * int(np.prod(shape[2:])) + shape[1] * int(np.prod(shape[2:]))
            return jnp.asarray(rng.uniform(-1, 1, shape).astype(np.float32) *
                               np.sqrt(6 / fan))
        if name == "mlp":
            params = [glorot(784, 256), jnp.zeros(256), glorot(256, 10), jnp.zeros(10)]

            def forward(p, x):
                h = jax.nn.relu(x.reshape(x.shape[0], -1) @ p[0] + p[1])
                return h @ p[2] + p[3]
        else:
            params = [glorot(6, 1, 5, 5), jnp.zeros(6), glorot(16, 6, 5, 5), jnp.zeros(16),
                      glorot(400, 120), jnp.zeros(120), glorot(120, 84), jnp.zeros(84),
                      glorot(84, 10), jnp.zeros(10)]

            def conv(x, w, b, pad):
                y = jax.lax.conv_general_dilated(x, w, (1, 1), [(pad, pad), (pad, pad)])
                return y + b[None, :, None, None]

            def pool(x):
                return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 1, 2, 2),
                                             (1, 1, 2, 2), "VALID") / 4

            def forward(p, x):
                h = pool(jax.nn.sigmoid(conv(x, p[0], p[1], 2)))
                h = pool(jax.nn.sigmoid(conv(h, p[2], p[3], 0))).reshape(x.shape[0], -1)
                h = jax.nn.sigmoid(h @ p[4] + p[5])
                h = jax.nn.sigmoid(h @ p[6] + p[7])
                return h @ p[8] + p[9]

        def objective(p, x, y):
            logp = jax.nn.log_softmax(forward(p, x))
            return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

        @jax.jit
        def jstep(p, x, y):
            g = jax.grad(objective)(p, x, y)
            return [a - 0.1 * b for a, b in zip(p, g)]
        jx, jy = jnp.asarray(xn), jnp.asarray(yn)
        state = {"p": params}

        def run():
            state["p"] = jstep(state["p"], jx, jy)
            state["p"][0].block_until_ready()
        out.append(("jax jit (whole step)", run))
    return out


# ------------------------------------------------------------------------- D
def bench_chain(rows):
    n = 1 << (16 if SMOKE else 22)
    reps = 5 if SMOKE else 20
    rng = np.random.default_rng(0)
    xn, an, bn = (rng.standard_normal(n).astype(np.float32) for _ in range(3))

    @hb.hybridize(backend="llvm")
    def chain(x, a, b):
        return hb.tanh(x * a + b) * hb.sigmoid(x) + 1
    x, a, b = hb.array(xn), hb.array(an), hb.array(bn)
    if PART == "hybrid":
        t = timeit(lambda: chain(x, a, b), reps)
        rows.append(("D. ewise chain 4M", "hybrid llvm (1 kernel)", t * 1e3, "ms"))
    if PART == "numpy":
        rows.append(("D. ewise chain 4M", "numpy", timeit(
            lambda: np.tanh(xn * an + bn) / (1 + np.exp(-xn)) + 1, reps,
            sync=lambda: None) * 1e3, "ms"))
        src = np.empty(32 << 20, np.float64)
        dst = np.empty_like(src)
        tc = timeit(lambda: np.copyto(dst, src), 5, sync=lambda: None)
        rows.append(("F. memory copy 256 MiB", "numpy copyto", 2 * src.nbytes / tc / 1e9,
                     "GB/s"))
    torch = _torch()
    if torch is not None and hasattr(torch, "compile") and COMPILED_PEERS:
        tx, ta, tb = (torch.from_numpy(v) for v in (xn, an, bn))
        fn = torch.compile(lambda x, a, b: torch.tanh(x * a + b) * torch.sigmoid(x) + 1)
        try:
            rows.append(("D. ewise chain 4M", "torch.compile", timeit(
                lambda: fn(tx, ta, tb), reps, sync=lambda: None) * 1e3, "ms"))
        except Exception as exc:  # noqa: BLE001 - a broken toolchain: a row, not a lost part
            rows.append(("D. ewise chain 4M", "torch.compile", float("nan"),
                         f"failed: {type(exc).__name__}"))


# ------------------------------------------------------------------------- E
_FIRST_CALL = """
import time, hybrid as hb
from hybrid.nn import models
name = {name!r}
net = models.mlp(num_outputs=10) if name == "mlp" else models.lenet()
net.initialize()
x = hb.random.normal(size=(1, 1, 28, 28))
net(x)
net.hybridize(backend="llvm")
t0 = time.perf_counter()
net(x).wait_to_read()
print(time.perf_counter() - t0)
"""


def bench_compile(rows):
    if PART != "hybrid":
        return
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, HYBRID_CACHE_DIR=cache)
        for name in ("mlp", "lenet"):
            for label in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(name=name)],
                                     env=env, capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    rows.append((f"E. first call {name}", label, float("nan"), out.stderr[-200:]))
                    continue
                rows.append((f"E. first call {name} (predict)", f"{label} cache",
                             float(out.stdout.split()[-1]) * 1e3, "ms"))


def _achieved(rows):
    """The chain's bandwidth against the copy floor, both measured in this run."""
    vals = {(w, v): val for w, v, val, _ in rows}
    t = vals.get(("D. ewise chain 4M", "hybrid llvm (1 kernel)"))
    copy_gbs = vals.get(("F. memory copy 256 MiB", "numpy copyto"))
    if t and copy_gbs:
        n = 1 << (16 if SMOKE else 22)
        gbs = 4 * 4 * n / (t * 1e-3) / 1e9
        rows.append(("D. ewise chain 4M", "achieved (3 reads + 1 write)", gbs,
                     f"GB/s ({100 * gbs / copy_gbs:.0f}% of copy)"))


ORDER = ("A. MLP b1", "A. MLP b64", "D. ewise chain 4M", "F. memory copy 256 MiB",
         "C. mlp train b256", "C. lenet train b256", "E. first call mlp (predict)",
         "E. first call lenet (predict)")


def measure_part() -> list:
    rows = []
    for bench in (bench_mlp, bench_chain, bench_train, bench_compile):
        bench(rows)
    return rows


def main(argv=None):
    import argparse  # noqa: PLC0415
    import json  # noqa: PLC0415
    global PART
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=PARTS, help="measure one framework and print JSON rows")
    ap.add_argument("--rounds", type=int, default=1 if SMOKE else 2,
                    help="run every framework's process this many times, interleaved, and keep "
                         "each figure's best round (these machines drift by +-10%% between "
                         "minutes; every framework gets the same chances)")
    ap.add_argument("--torch-python", help="the interpreter of a venv with torch "
                    "(default: $BENCH_TORCH_PYTHON, this one, /work/venv-torch)")
    ap.add_argument("--jax-python", help="the interpreter of a venv with jax "
                    "(default: $BENCH_JAX_PYTHON, this one, /work/venv-jax)")
    args = ap.parse_args(argv)
    peers.choose("torch", args.torch_python)
    peers.choose("jax", args.jax_python)
    if args.part:
        PART = args.part
        print(json.dumps(measure_part()))
        return None
    best: dict = {}  # (workload, variant) -> (value, unit); lower is better but for GB/s
    order = []
    failed = []
    for _ in range(max(1, args.rounds)):
        for part in PARTS:
            if part in ("torch", "jax") and not _installed(part):
                continue
            out = subprocess.run([peers.interpreter(part), __file__, "--part", part],
                                 capture_output=True, text=True, timeout=1800, check=False,
                                 env=peers.child_env())
            if out.returncode != 0:
                failed.append(("(failed)", part, float("nan"), out.stderr.strip()[-300:]))
                continue
            for w, v, val, unit in json.loads(out.stdout.strip().splitlines()[-1]):
                key = (w, v)
                if key not in best:
                    order.append(key)
                higher = "GB/s" in unit
                old = best.get(key)
                if old is None or (val > old[0] if higher else val < old[0]):
                    best[key] = (val, unit)
    rows = [(w, v, *best[(w, v)]) for w, v in order] + failed
    _achieved(rows)
    rank = {w: i for i, w in enumerate(ORDER)}
    rows.sort(key=lambda r: rank.get(r[0], len(ORDER)))  # stable: parts in order per row
    print(f"\nhybrid benchmarks (load average {os.getloadavg()[0]:.1f}; each framework in its "
          f"own process; torch {peers.version('torch') or peers.interpreter('torch') or 'not installed'}"
          f", jax {peers.version('jax') or peers.interpreter('jax') or 'not installed'})")
    print(f"{'workload':32s} {'variant':30s} {'value':>10s}  unit")
    for w, v, val, unit in rows:
        print(f"{w:32s} {v:30s} {val:10.2f}  {unit}")
    return rows


if __name__ == "__main__":
    main()
