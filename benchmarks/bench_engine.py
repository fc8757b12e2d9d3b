"""The dependency engine's costs, and the book's asynchronous-vs-synchronous experiment.

    python benchmarks/bench_engine.py          # full sizes
    HYBRID_SMOKE=1 python benchmarks/bench_engine.py   # tiny sizes (CI)

1. Per-op cost of push + run for a trivial op on the raw engine (push only, and push + run).
2. The book's 12.2(ii): 10,000 x ``y = x + 1`` on a (1, 2) array, synchronous (wait after each)
   vs asynchronous (one wait at the end), through the front end and on the raw engine; with
   the inline fast path on and off. MXNet 1.9.1's figures on a machine like this one
   (/work/shared/PERF.md): async 23 us/op, sync 27 us/op.
3. Two independent 2000x2000 float32 matmul loops on cpu(0) and cpu(1): together vs the sum
   of each alone (NumPy releases the GIL, so the devices really run in parallel).

Times are the median of a few repetitions; this machine is shared and noisy, so read ratios
measured side by side in one run.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import hybrid as hb  # noqa: E402
from runtime import config  # noqa: E402
from runtime import engine as engine_mod  # noqa: E402
from runtime.device import cpu  # noqa: E402
from runtime.engine import Engine, Var  # noqa: E402

SMOKE = bool(config.get("HYBRID_SMOKE"))
N_TRIVIAL = 2_000 if SMOKE else 200_000
N_BOOK = 200 if SMOKE else 10_000
MM_SIZE = 256 if SMOKE else 2000
MM_LOOP = 2 if SMOKE else 5
REPS = 1 if SMOKE else 3

MXNET = {"async": 23.3, "sync": 27.4}  # us/op, PERF.md B(ii), quick run


def median_time(fn, reps=REPS):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _engine(inline=True, workers=1):
    old = config.set_flag("HYBRID_INLINE", inline)
    try:
        return Engine(workers_per_device=workers)
    finally:
        config.set_flag("HYBRID_INLINE", old)


# ------------------------------------------------------------ 1. trivial ops
def bench_trivial():
    eng = _engine()
    dev = cpu(0)
    vs = [Var() for _ in range(8)]
    noop = lambda: None  # noqa: E731
    push = eng.push
    eng.push(noop, (), (), dev)
    eng.wait_all()

    def push_only():
        for i in range(N_TRIVIAL):
            push(noop, (vs[(i + 3) & 7],), (vs[i & 7],), dev, "noop")

    res = {}
    push_only()  # warm-up
    eng.wait_all()
    t0 = time.perf_counter()
    push_only()
    res["push (no wait)"] = time.perf_counter() - t0
    eng.wait_all()
    res["push + run"] = median_time(lambda: (push_only(), eng.wait_all()))
    res["push + run, inline"] = median_time(lambda: [
        push(noop, (vs[(i + 3) & 7],), (vs[i & 7],), dev, "noop", None, True)
        for i in range(N_TRIVIAL)] and eng.wait_all())
    eng.shutdown()
    return {k: v / N_TRIVIAL * 1e6 for k, v in res.items()}


# ------------------------------------------------------------ 2. the book's experiment
def bench_book():
    """us/op: (front end | raw engine) x (inline on | off) x (sync | async)."""
    out = {}
    x_np = np.ones((1, 2), np.float32)
    for inline in (True, False):
        eng = _engine(inline=inline)
        old = engine_mod.set_engine(eng)
        try:
            x = hb.ones((1, 2))

            def fe_sync():
                for _ in range(N_BOOK):
                    y = x + 1
                    y.wait_to_read()

            def fe_async():
                for _ in range(N_BOOK):
                    y = x + 1
                hb.waitall()
                return y

            fe_async()  # warm-up
            tag = "inline" if inline else "workers"
            out[("front end", tag, "sync")] = median_time(fe_sync) / N_BOOK * 1e6
            out[("front end", tag, "async")] = median_time(fe_async) / N_BOOK * 1e6

            # the raw engine: the same numpy work (y = x + 1) with hand-made Vars
            xv, yv, cell = Var(), Var(), [None]
            dev = cpu(0)

            def add():
                cell[0] = x_np + 1

            def raw_sync():
                for _ in range(N_BOOK):
                    eng.push(add, (xv,), (yv,), dev, "add", None, True)
                    eng.wait(yv)

            def raw_async():
                for _ in range(N_BOOK):
                    eng.push(add, (xv,), (yv,), dev, "add", None, True)
                eng.wait_all()

            raw_async()
            out[("raw engine", tag, "sync")] = median_time(raw_sync) / N_BOOK * 1e6
            out[("raw engine", tag, "async")] = median_time(raw_async) / N_BOOK * 1e6
        finally:
            engine_mod.set_engine(old)
            eng.shutdown()

    def numpy_only():
        for _ in range(N_BOOK):
            x_np + 1
    out[("numpy", "-", "eager")] = median_time(numpy_only) / N_BOOK * 1e6
    return out


# ------------------------------------------------------------ 3. two devices
def bench_devices():
    rng = np.random.default_rng(0)
    a = [rng.standard_normal((MM_SIZE, MM_SIZE), dtype=np.float32) for _ in range(2)]
    b = [rng.standard_normal((MM_SIZE, MM_SIZE), dtype=np.float32) for _ in range(2)]
    ref = [a[k] @ b[k] for k in range(2)]

    def numpy_all_cores():  # before the engine gives each device its share of the cores
        for k in range(2):
            for _ in range(MM_LOOP):
                a[k] @ b[k]
    numpy_all_cores()  # warm-up
    t_numpy = median_time(numpy_all_cores)

    eng = _engine(inline=False)
    out = [None, None]
    vs = [Var("mm0"), Var("mm1")]

    def push_loop(k):
        def mm():
            out[k] = a[k] @ b[k]
        for _ in range(MM_LOOP):
            eng.push(mm, (), (vs[k],), cpu(k), f"matmul{k}")

    for k in range(2):  # both devices exist: BLAS threads are now shared between them
        push_loop(k)
    eng.wait_all()

    def alone(k):
        push_loop(k)
        eng.wait_all()

    def together():
        push_loop(0)
        push_loop(1)
        eng.wait_all()

    t0 = median_time(lambda: alone(0))
    t1 = median_time(lambda: alone(1))
    t_both = median_time(together)
    for k in range(2):
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-3, atol=1e-2)
    eng.shutdown()
    return t_numpy, t0, t1, t_both, engine_mod.threads_per_cpu_device()


def main():
    print(f"hybrid engine benchmark{' (HYBRID_SMOKE: tiny sizes)' if SMOKE else ''}; "
          f"{os.cpu_count()} CPU(s), Python {sys.version.split()[0]}, NumPy {np.__version__}")

    triv = bench_trivial()
    print(f"\n1. trivial op (fn = lambda: None, 1 read + 1 write), {N_TRIVIAL:,} ops")
    print(f"   {'':28s}{'us/op':>8s}")
    for k, v in triv.items():
        print(f"   {k:28s}{v:8.2f}")

    book = bench_book()
    print(f"\n2. the book's y = x + 1 on a (1, 2) array, {N_BOOK:,} ops: sync (wait after each) "
          "vs async (one wait at the end)")
    print(f"   {'':24s}{'sync us/op':>11s}{'async us/op':>12s}{'sync/async':>11s}")
    for who in ("front end", "raw engine"):
        for tag in ("inline", "workers"):
            s, a = book[(who, tag, "sync")], book[(who, tag, "async")]
            print(f"   {who + ', ' + tag:24s}{s:11.2f}{a:12.2f}{s / a:11.2f}")
    print(f"   {'MXNet 1.9.1 (PERF.md)':24s}{MXNET['sync']:11.2f}{MXNET['async']:12.2f}"
          f"{MXNET['sync'] / MXNET['async']:11.2f}")
    print(f"   {'NumPy alone':24s}{book[('numpy', '-', 'eager')]:11.2f}")
    fe = book[("front end", "inline", "async")]
    print(f"   front end async (inline) vs MXNet async: {MXNET['async'] / fe:.2f}x "
          f"{'faster' if fe < MXNET['async'] else 'slower'}")

    t_numpy, t0, t1, t_both, threads = bench_devices()
    print(f"\n3. two independent loops of {MM_LOOP} x {MM_SIZE}x{MM_SIZE} float32 matmul "
          f"({threads} BLAS thread(s) per device)")
    print(f"   {'':32s}{'ms':>9s}")
    print(f"   {'cpu(0) alone':32s}{t0 * 1e3:9.1f}")
    print(f"   {'cpu(1) alone':32s}{t1 * 1e3:9.1f}")
    print(f"   {'sum alone':32s}{(t0 + t1) * 1e3:9.1f}")
    print(f"   {'cpu(0) and cpu(1) together':32s}{t_both * 1e3:9.1f}")
    print(f"   {'NumPy, both loops, all cores':32s}{t_numpy * 1e3:9.1f}")
    print(f"   speed-up of together over sum alone: {(t0 + t1) / t_both:.2f}x")


if __name__ == "__main__":
    main()
