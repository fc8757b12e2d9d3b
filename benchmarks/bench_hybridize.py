"""What ``hybridize()`` costs and what it buys: the book's 12.1 experiment.

    python benchmarks/bench_hybridize.py                    # full sizes
    HYBRID_SMOKE=1 python benchmarks/bench_hybridize.py     # tiny sizes (CI)

1. First-call latency of a hybridized block: trace + compile (+ the one run), for the book's
   MLP (Dense(256, relu) -> Dense(128, relu) -> Dense(2), input (1, 512)) and LeNet
   (hybrid.nn.models.lenet(), input (1, 1, 28, 28)); cold (an empty on-disk compile cache, in
   a temporary directory) and warm (a second network of the same architecture, cache filled).
   The trace and compile times the compiled entry reports are printed beside the wall time.
2. Per-call cost of the hybridized MLP at batch 1 and 64: 1000 calls + one ``waitall()``,
   us/call, vs the same network run eagerly and vs NumPy by hand (same weights).

Backends: whatever ``net.hybridize()`` picks by default (its name is printed), then
``backend="reference"`` explicitly (the NumPy interpreter the compiler is tested against).
Peer figures from /work/shared/PERF.md are printed beside, labelled as such: they were measured
on a machine like this one, not in this run. Figures are the median of a few repetitions after
a warm-up, with the fastest in brackets; the load average is printed at the start and the end.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import hybrid as hb  # noqa: E402
from hybrid.nn import models  # noqa: E402
from runtime import config  # noqa: E402

SMOKE = bool(config.get("HYBRID_SMOKE"))
N_CALLS = 20 if SMOKE else 1000
REPS = 1 if SMOKE else 3
BATCHES = (1, 64)

# /work/shared/PERF.md (quick run / full run), on a machine like this one: NOT this run.
PEER_FIRST = {
    "MLP": "TorchScript 0.04; JAX jit 0.13 cold / 0.015 warm; MXNet 0.003 (no codegen); "
           "torch.compile 16.5 / 4.2",
    "LeNet": "(train step) JAX jit 1.08 / 0.23; MXNet 0.08 (no codegen); torch.compile 20-25",
}
PEER_CALL = {
    1: "NumPy 24.9/21.4; JAX jit 43/36; TorchScript 53/52; MXNet hybridize 66/62; "
       "torch eager 77/71; MXNet eager 283/163",
    64: "NumPy 196/212; TorchScript 231/209; torch eager 276/225; JAX jit 274/294; "
        "MXNet hybridize 363/322",
}


def load():
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average n/a"


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
    return f"{t[0]:9.1f} [{t[1]:8.1f}]"


def compiled_info(net):
    """(backend, trace s, compile s) of the block's newest compiled entry, where it tells."""
    cache = getattr(net, "_cached", None)
    entries = list(getattr(cache, "entries", {}).values())
    if not entries:
        return getattr(cache, "backend", "?"), None, None
    entry = entries[-1]
    report = getattr(getattr(entry, "exe", None), "report", None) or {}
    return (getattr(entry, "backend", "?"), getattr(entry, "trace_seconds", None),
            report.get("compile_seconds"))


def make(name):
    if name == "MLP":
        net, shape = models.mlp((256, 128), 2), (1, 512)
    else:
        net, shape = models.lenet(), (1, 1, 28, 28)
    net.initialize(hb.init.Xavier())
    x = hb.array(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
    net(x)  # eager: finishes the deferred initialization, so the first call below only traces
    hb.waitall()
    return net, x


def first_call(name, backend):
    """Wall seconds of the first hybridized call, and what the compiled entry reports."""
    net, x = make(name)
    want = net(x).asnumpy()
    net.hybridize(backend=backend)
    t0 = time.perf_counter()
    got = net(x)
    hb.waitall()
    wall = time.perf_counter() - t0
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-5)
    return (wall,) + compiled_info(net)


def numpy_mlp(weights, a):
    h = a
    for i, (w, b) in enumerate(weights):
        h = h @ w.T + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0)
    return h


def per_call(backends):
    net, _ = make("MLP")
    weights = [(blk.weight.data().asnumpy(), blk.bias.data().asnumpy())
               for blk in net._children.values()]
    hybrid_nets = {}
    for backend in backends:
        hnet, _ = make("MLP")
        for src, dst in zip(net.collect_params().values(), hnet.collect_params().values()):
            dst.set_data(src.data())
        hnet.hybridize(backend=backend)
        hybrid_nets[backend] = hnet
    out = {}
    for batch in BATCHES:
        a = np.random.default_rng(batch).standard_normal((batch, 512), dtype=np.float32)
        x = hb.array(a)
        want = numpy_mlp(weights, a)
        row = {}

        def run(n, f):
            for _ in range(n):
                f(x)
            hb.waitall()

        np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-4, atol=1e-5)
        row["eager"] = timed(lambda n: run(n, net), N_CALLS)
        for backend, hnet in hybrid_nets.items():
            np.testing.assert_allclose(hnet(x).asnumpy(), want, rtol=1e-4, atol=1e-5)
            row[f"hybridized ({backend})"] = timed(lambda n, h=hnet: run(n, h), N_CALLS)

        def by_hand(n):
            for _ in range(n):
                numpy_mlp(weights, a)
        row["NumPy by hand"] = timed(by_hand, N_CALLS)
        out[batch] = row
    return out


def main():
    cache_dir = tempfile.mkdtemp(prefix="hybrid-bench-cache-")
    config.set_flag("HYBRID_CACHE_DIR", cache_dir)  # cold: nothing compiled yet
    probe, _ = make("MLP")
    probe.hybridize()
    default = getattr(getattr(probe, "_cached", None), "backend", None)
    if default is None:
        probe(hb.zeros((1, 512)))
        default = compiled_info(probe)[0]
    backends = [default] + (["reference"] if default != "reference" else [])

    print(f"hybrid hybridize benchmark{' (HYBRID_SMOKE: tiny sizes)' if SMOKE else ''}; "
          f"{os.cpu_count()} CPU(s), Python {sys.version.split()[0]}, NumPy {np.__version__}")
    print(f"{load()} (at start)")
    print(f"default backend of net.hybridize(): {default}; also measured: "
          f"{', '.join(backends[1:]) or '-'}; compile cache {cache_dir} (empty at start)")

    print("\n1. First hybridized call (after one eager call that finished initialization), "
          "seconds")
    print(f"   {'model':7s}{'backend':11s}{'cache':7s}{'wall':>8s}{'trace':>8s}{'compile':>9s}")
    for name in ("MLP", "LeNet"):
        for backend in backends:
            for cache in ("cold", "warm"):
                wall, used, trace_s, compile_s = first_call(name, backend)
                ts = f"{trace_s:8.3f}" if trace_s is not None else f"{'?':>8s}"
                cs = f"{compile_s:9.3f}" if compile_s is not None else f"{'?':>9s}"
                print(f"   {name:7s}{used:11s}{cache:7s}{wall:8.3f}{ts}{cs}")
        print(f"          PERF.md peers (NOT this run), s: {PEER_FIRST[name]}")

    print(f"\n2. The MLP per call: {N_CALLS:,} calls + one waitall, us/call "
          "(median [fastest])")
    res = per_call(backends)
    for batch, row in res.items():
        eager = row["eager"][0]
        print(f"   batch {batch}")
        for k, v in row.items():
            ratio = "" if k == "eager" else f"  eager / this {eager / v[0]:5.2f}x"
            print(f"     {k:26s}{fmt(v)}{ratio}")
        print(f"     PERF.md peers (NOT this run): {PEER_CALL[batch]}")
    print(f"\n{load()} (at end)")


if __name__ == "__main__":
    main()
