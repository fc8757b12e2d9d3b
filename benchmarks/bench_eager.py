"""Eager dispatch: what one front-end op costs, the book's 12.2 ``y = x + 1`` experiment, and
the book's 12.1 MLP forward without ``hybridize()``.

    python benchmarks/bench_eager.py                    # full sizes
    HYBRID_SMOKE=1 python benchmarks/bench_eager.py     # tiny sizes (CI)

1. The book's 12.2(ii): 10,000 x ``y = x + 1`` on a (1, 2) float32 array, synchronous
   (``wait_to_read()`` after each) vs asynchronous (one ``waitall()`` at the end), us/op;
   NumPy's ``a + 1`` beside.
2. Dispatch of single small ops, asynchronous: ``x + 1``, ``hb.tanh(x)``, ``x @ w`` (2x2) vs
   the same in NumPy; the difference is the front end's (and the engine's) cost per op.
3. The book's MLP (Dense(256, relu) -> Dense(128, relu) -> Dense(2), float32) run eagerly at
   batch 1 and 64: 1000 forward calls then one ``waitall()``, us/call; NumPy by hand with the
   same weights beside (outputs checked equal).
4. Eager random draws, 1000 x 1000 float32 (the book's 12.2(i) draws): ``hb.random.normal``
   and ``hb.random.uniform`` (compiled from a signature's second call: hybrid/eager_kernels.py)
   vs NumPy's ``default_rng`` (a sequential stream, not counter-based: beside, not the same
   numbers), ms per draw.
5. torch and JAX, the same computations (eager torch; JAX ops without jit), each in a process
   of its own under its own interpreter (``--torch-python`` / ``--jax-python``, or
   ``BENCH_TORCH_PYTHON`` / ``BENCH_JAX_PYTHON``, or the venvs /work/venv-torch and
   /work/venv-jax: see benchmarks/peers.py), with the same inputs and weights; otherwise
   'not installed'. Ratios to the peers measured in this run close the report.

Peer figures from /work/shared/PERF.md are printed beside, labelled as such: they were measured
on a machine like this one, not in this run. This machine is shared and noisy: read the ratios
measured side by side in this run; each figure is the median of a few repetitions after a
warm-up, with the fastest in brackets. The load average is printed at the start and the end.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

peers.adopt_host_path()  # a peer's venv: hybrid and its dependencies from the parent's path

import numpy as np  # noqa: E402

import hybrid as hb  # noqa: E402
from hybrid import nn  # noqa: E402
from runtime import config  # noqa: E402
from runtime import engine as engine_mod  # noqa: E402

SMOKE = bool(config.get("HYBRID_SMOKE"))
N_BOOK = 200 if SMOKE else 10_000
N_OP = 200 if SMOKE else 5_000
N_MLP = 20 if SMOKE else 1000
DRAW = 64 if SMOKE else 1000  # the draws' side
N_DRAW = 3 if SMOKE else 10
REPS = 1 if SMOKE else 3

# /work/shared/PERF.md (quick run / full run), on a machine like this one: NOT this run.
PEER_BOOK = {
    "sync": "torch 3.0/4.3; JAX 17.3/16.4; MXNet 27.4/110",
    "async": "JAX 14.2/9.8; MXNet 23.3/45",
    "numpy": "NumPy 0.7/1.1",
}
PEER_MLP = {
    1: "NumPy 24.9/21.4; torch eager 77/71; MXNet eager 283/163",
    64: "NumPy 196/212; torch eager 276/225",
}


def timed(fn, n, reps=REPS):
    """(median, min) us per iteration of ``fn(n)`` over ``reps`` runs, after one warm-up."""
    fn(max(1, n // 10))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(n)
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times), min(times)


def fmt(t):
    med, best = t
    return f"{med:9.2f} [{best:8.2f}]"


def load():
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average n/a"


# ------------------------------------------------------------ 1. the book's experiment
def bench_book():
    """The default engine (a small op runs in the caller when its device is idle), then an
    engine with inlining off, where every op is handed to the device's worker thread: the
    book's picture of a front end queueing work for a back end."""
    x = hb.ones((1, 2))
    a = np.ones((1, 2), np.float32)

    def sync(n):
        for _ in range(n):
            y = x + 1
            y.wait_to_read()

    def asynchronous(n):
        for _ in range(n):
            y = x + 1
        hb.waitall()
        return y

    def numpy(n):
        for _ in range(n):
            a + 1

    assert np.array_equal(asynchronous(1).asnumpy(), a + 1)
    out = {"sync": timed(sync, N_BOOK), "async": timed(asynchronous, N_BOOK),
           "numpy": timed(numpy, N_BOOK)}
    old_flag = config.set_flag("HYBRID_INLINE", False)
    try:
        eng = engine_mod.Engine()
    finally:
        config.set_flag("HYBRID_INLINE", old_flag)
    old = engine_mod.set_engine(eng)
    try:
        out["sync, workers"] = timed(sync, N_BOOK)
        out["async, workers"] = timed(asynchronous, N_BOOK)
    finally:
        engine_mod.set_engine(old)
        eng.shutdown()
    return out


# ------------------------------------------------------------ 2. single ops
def bench_ops():
    x = hb.array([[0.5, -1.0]])
    w = hb.array([[1.0, 2.0], [3.0, 4.0]])
    a, wn = x.asnumpy(), w.asnumpy()
    cases = {
        "x + 1": (lambda: x + 1, lambda: a + 1),
        "hb.tanh(x)": (lambda: hb.tanh(x), lambda: np.tanh(a)),
        "x @ w": (lambda: x @ w, lambda: a @ wn),
    }
    out = {}
    for name, (hyb, ref) in cases.items():
        np.testing.assert_allclose(hyb().asnumpy(), ref(), rtol=1e-6)

        def run_hyb(n, f=hyb):
            for _ in range(n):
                f()
            hb.waitall()

        def run_ref(n, f=ref):
            for _ in range(n):
                f()
        out[name] = (timed(run_hyb, N_OP), timed(run_ref, N_OP))
    return out


# ------------------------------------------------------------ 3. the MLP
def make_mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize(hb.init.Xavier())
    net(hb.zeros((1, 512)))  # finish the deferred initialization
    hb.waitall()
    return net


def numpy_weights(net):
    return [(blk.weight.data().asnumpy(), blk.bias.data().asnumpy())
            for blk in net._children.values()]


def numpy_mlp(weights, a):
    h = a
    last = len(weights) - 1
    for i, (w, b) in enumerate(weights):
        h = h @ w.T + b
        if i < last:
            h = np.maximum(h, 0)
    return h


def bench_mlp(net, batch):
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 512), dtype=np.float32)
    x = hb.array(a)
    weights = numpy_weights(net)
    np.testing.assert_allclose(net(x).asnumpy(), numpy_mlp(weights, a), rtol=1e-4, atol=1e-5)

    def eager(n):
        for _ in range(n):
            net(x)
        hb.waitall()

    def by_hand(n):
        for _ in range(n):
            numpy_mlp(weights, a)
    return {"hybrid eager": timed(eager, N_MLP), "numpy": timed(by_hand, N_MLP)}, a, weights


# ------------------------------------------------------------ 4. random draws
def bench_draws():
    """ms per eager 1000 x 1000 float32 draw, hybrid and NumPy."""
    rng = np.random.default_rng(0)

    def ours(f):
        def run(n):
            for _ in range(n):
                f(size=(DRAW, DRAW)).wait_to_read()
        return run

    def numpy(f):
        def run(n):
            for _ in range(n):
                f((DRAW, DRAW), dtype=np.float32)
        return run
    us = {"normal": timed(ours(hb.random.normal), N_DRAW),
          "uniform": timed(ours(hb.random.uniform), N_DRAW),
          "NumPy normal": timed(numpy(rng.standard_normal), N_DRAW),
          "NumPy uniform": timed(numpy(rng.random), N_DRAW)}
    return {k: (med / 1e3, best / 1e3) for k, (med, best) in us.items()}


# ------------------------------------------------------------ 5. peers, when installed
def bench_torch(mlp_inputs):
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    torch.set_grad_enabled(False)
    x = torch.ones((1, 2))

    def add(n):
        for _ in range(n):
            x + 1
    out = {"x + 1 (sync)": timed(add, N_BOOK)}
    for name, f in (("normal", torch.randn), ("uniform", torch.rand)):
        def draw(n, f=f):
            for _ in range(n):
                f(DRAW, DRAW)
        med, best = timed(draw, N_DRAW)
        out[f"{name} {DRAW}x{DRAW}, ms"] = (med / 1e3, best / 1e3)
    for batch, (a, weights) in mlp_inputs.items():
        layers = []
        for i, (w, b) in enumerate(weights):
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
            layers.append(lin)
            if i < len(weights) - 1:
                layers.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*layers).eval()
        t = torch.from_numpy(a)

        def fwd(n, model=model, t=t):
            for _ in range(n):
                model(t)
        out[f"MLP b{batch}"] = timed(fwd, N_MLP)
    return out


def bench_jax(mlp_inputs):
    try:
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415
    except ImportError:
        return None
    x = jnp.ones((1, 2), jnp.float32)

    def add_sync(n):
        for _ in range(n):
            (x + 1).block_until_ready()

    def add_async(n):
        for _ in range(n):
            y = x + 1
        y.block_until_ready()
    out = {"x + 1 (sync)": timed(add_sync, N_BOOK), "x + 1 (async)": timed(add_async, N_BOOK)}
    for batch, (a, weights) in mlp_inputs.items():
        jw = [(jnp.asarray(w), jnp.asarray(b)) for w, b in weights]
        t = jnp.asarray(a)

        def fwd(n, jw=jw, t=t):
            for _ in range(n):
                h = t
                for i, (w, b) in enumerate(jw):
                    h = h @ w.T + b
                    if i < len(jw) - 1:
                        h = jax.nn.relu(h)
            h.block_until_ready()
        out[f"MLP b{batch} (ops, no jit)"] = timed(fwd, N_MLP)
    return out


def run_peer(part, inputs):
    """``bench_<part>`` in a process of its own, under the peer's interpreter; None when the
    peer is not installed. The MLP inputs and weights travel in an .npz file."""
    py = peers.interpreter(part)
    if py is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.npz")
        arrays = {}
        for batch, (a, weights) in inputs.items():
            arrays[f"a{batch}"] = a
            for i, (w, b) in enumerate(weights):
                arrays[f"w{batch}_{i}"], arrays[f"b{batch}_{i}"] = w, b
        np.savez(path, **arrays)
        out = subprocess.run([py, os.path.abspath(__file__), "--peer", part, path],
                             capture_output=True, text=True, timeout=1800, check=False,
                             env=peers.child_env())
    if out.returncode != 0:
        print(f"   {part}: failed: {out.stderr.strip()[-300:]}")
        return None
    return {k: tuple(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def _peer_main(part, path):
    data = np.load(path)
    inputs = {}
    for batch in (1, 64):
        n = sum(1 for k in data.files if k.startswith(f"w{batch}_"))
        inputs[batch] = (data[f"a{batch}"], [(data[f"w{batch}_{i}"], data[f"b{batch}_{i}"])
                                             for i in range(n)])
    res = (bench_torch if part == "torch" else bench_jax)(inputs)
    print(json.dumps(res))


def main(argv=None):
    import argparse  # noqa: PLC0415
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", nargs=2, metavar=("PART", "NPZ"), help=argparse.SUPPRESS)
    ap.add_argument("--torch-python", help="the interpreter of a venv with torch")
    ap.add_argument("--jax-python", help="the interpreter of a venv with jax")
    args = ap.parse_args(argv)
    if args.peer:
        return _peer_main(*args.peer)
    peers.choose("torch", args.torch_python)
    peers.choose("jax", args.jax_python)
    print(f"hybrid eager benchmark{' (HYBRID_SMOKE: tiny sizes)' if SMOKE else ''}; "
          f"{os.cpu_count()} CPU(s), Python {sys.version.split()[0]}, NumPy {np.__version__}, "
          f"engine {config.get('HYBRID_ENGINE')}, inline {bool(config.get('HYBRID_INLINE'))}")
    print(f"{load()} (at start)")
    print("us per op or call: median of the repetitions [fastest]")

    book = bench_book()
    print(f"\n1. The book's 12.2: {N_BOOK:,} x y = x + 1 on a (1, 2) array")
    print(f"   {'':34s}{'median':>9s} {'[fastest]':>10s}  PERF.md peers (NOT this run)")
    rows = (("synchronous (wait_to_read each)", "sync", PEER_BOOK["sync"]),
            ("asynchronous (one waitall)", "async", PEER_BOOK["async"]),
            ("  inline off: synchronous", "sync, workers", ""),
            ("  inline off: asynchronous", "async, workers", ""),
            ("NumPy a + 1", "numpy", PEER_BOOK["numpy"]))
    for label, key, peer in rows:
        print(f"   {label:34s}{fmt(book[key])}  {peer}")
    print(f"   sync / async {book['sync'][0] / book['async'][0]:.2f}x (inline on: both run in "
          f"the caller), {book['sync, workers'][0] / book['async, workers'][0]:.2f}x (inline "
          f"off); async / NumPy {book['async'][0] / book['numpy'][0]:.1f}x")

    ops = bench_ops()
    print(f"\n2. Single small ops, asynchronous, {N_OP:,} each (1x2 operands)")
    print(f"   {'':14s}{'hybrid':>20s}{'NumPy':>21s}{'dispatch':>11s}")
    for name, (h, r) in ops.items():
        print(f"   {name:14s}{fmt(h)} {fmt(r)} {h[0] - r[0]:9.2f}")

    print(f"\n3. The book's MLP 512 -> 256 relu -> 128 relu -> 2, eager, {N_MLP:,} calls + one "
          "waitall")
    net = make_mlp()
    inputs = {}
    mlp = {}
    for batch in (1, 64):
        res, a, weights = bench_mlp(net, batch)
        inputs[batch] = (a, weights)
        h, r = res["hybrid eager"], res["numpy"]
        mlp[batch] = h
        print(f"   batch {batch:<3d} hybrid eager {fmt(h)}  NumPy by hand {fmt(r)}  "
              f"ratio {h[0] / r[0]:5.1f}x")
        print(f"             PERF.md peers (NOT this run): {PEER_MLP[batch]}")

    draws = bench_draws()
    print(f"\n4. Eager random draws, {DRAW}x{DRAW} float32, ms per draw")
    for kind in ("normal", "uniform"):
        print(f"   hb.random.{kind:8s}{fmt(draws[kind])}   NumPy default_rng "
              f"{fmt(draws['NumPy ' + kind])}")

    print("\n5. Peers in this run (each in its own process)")
    peer = {}
    for name, part in (("torch", "torch"), ("JAX", "jax")):
        res = run_peer(part, inputs)
        if res is None:
            print(f"   {name}: not installed")
            continue
        peer[part] = res
        print(f"   {name} {peers.version(part)}")
        for k, v in res.items():
            print(f"   {name:6s}{k:26s}{fmt(v)}")
    t = peer.get("torch")
    if t:
        print("\n6. Ratios to PyTorch eager, this run (issue 23's target: <= 1.5x)")
        print(f"   y = x + 1, synchronous      {book['sync'][0] / t['x + 1 (sync)'][0]:6.2f}x")
        for batch in (1, 64):
            print(f"   MLP b{batch:<3d} eager            "
                  f"{mlp[batch][0] / t[f'MLP b{batch}'][0]:6.2f}x")
        for kind in ("normal", "uniform"):
            print(f"   {kind} draw {DRAW}x{DRAW}      "
                  f"{draws[kind][0] / t[f'{kind} {DRAW}x{DRAW}, ms'][0]:6.2f}x")
    print(f"\n{load()} (at end)")


if __name__ == "__main__":
    main()
