"""Kernel-level benchmarks of the LLVM backend, side by side with NumPy in one run.

    python benchmarks/bench_kernels.py            # full sizes
    HYBRID_SMOKE=1 python benchmarks/bench_kernels.py   # tiny sizes (CI)

1. The elementwise chain y = tanh(x*a+b) * sigmoid(x) + 1 on 4,194,304 float32 (PERF.md,
   workload D) as ONE LLVM kernel, vs NumPy (temporaries) and NumPy with out= buffers, and
   as achieved GB/s against this machine's copy bandwidth (np.copyto of 256 MiB, same run).
2. sgemm GFLOP/s through the generated code's BLAS path vs NumPy's ``@``.
3. The book's MLP at batch 1 (PERF.md workload A: 512 -> 256 relu -> 128 relu -> 2) as one
   native call per forward: microseconds per call vs NumPy.
4. LeNet's convolutions at batch 256 (im2col + GEMM extern) vs the eager NumPy impl.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.codegen import Const, Load, Output, ProgramBuilder, call  # noqa: E402
from compiler.codegen.llvm.emit import aligned_empty, compile_program  # noqa: E402
from compiler.ops import eager_apply  # noqa: E402
from runtime import config  # noqa: E402

SMOKE = bool(config.get("HYBRID_SMOKE"))


def timeit(fn, reps=7, warmup=2, inner=1):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts), min(ts)


def copy_bandwidth():
    nbytes = (4 if SMOKE else 256) << 20
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    med, best = timeit(lambda: np.copyto(dst, src), reps=5)
    return 2 * nbytes / med / 1e9, 2 * nbytes / best / 1e9


def chain(copy_gbs):
    n = 65536 if SMOKE else 4194304
    rng = np.random.default_rng(0)
    x, a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    pb = ProgramBuilder()
    sx, sa, sb, sy = pb.input((n,)), pb.param((n,)), pb.param((n,)), pb.output((n,))
    f = lambda op, *xs: call(op, *xs, dtype="float32")  # noqa: E731
    expr = f("add", f("mul", f("tanh", f("add", f("mul", Load(0), Load(1)), Load(2))),
                      f("sigmoid", Load(0))), Const(1.0, None))
    pb.loop((n,), [pb.access(sx), pb.access(sa), pb.access(sb)], [Output(pb.access(sy), expr)])
    t0 = time.perf_counter()
    compiled = compile_program(pb.build(), "bench_chain")
    compile_s = time.perf_counter() - t0
    runner = compiled.runner([a, b])
    # preallocated output (like NumPy's out=): only the call
    import ctypes
    y, yptr = aligned_empty((n,), np.float32)
    io = (ctypes.c_void_p * 4)(x.ctypes.data, a.ctypes.data, b.ctypes.data, yptr)
    t_llvm_fresh = timeit(lambda: runner(x))
    t_llvm = timeit(lambda: compiled(io))
    threads = compiled.threads
    compiled.set_threads(1)
    t_llvm1 = timeit(lambda: compiled(io))
    compiled.set_threads(threads)

    def numpy_plain():
        return np.tanh(x * a + b) * (1 / (1 + np.exp(-x))) + 1
    t1, t2 = np.empty_like(x), np.empty_like(x)
    out = np.empty_like(x)

    def numpy_out():
        np.multiply(x, a, out=t1)
        np.add(t1, b, out=t1)
        np.tanh(t1, out=t1)
        np.negative(x, out=t2)
        np.exp(t2, out=t2)
        np.add(t2, 1, out=t2)
        np.divide(t1, t2, out=t1)
        np.add(t1, 1, out=out)
    with np.errstate(all="ignore"):
        t_np = timeit(numpy_plain, reps=5)
        t_np_out = timeit(numpy_out, reps=5)
        ref = numpy_plain()
    err = float(np.max(np.abs(y - ref)))
    gbs = 16 * n / t_llvm[0] / 1e9
    print(f"\n[1] elementwise chain tanh(x*a+b)*sigmoid(x)+1, n={n:,} float32, one kernel")
    print(f"    compile (cold or disk cache): {compile_s * 1e3:.0f} ms; max |err| vs NumPy "
          f"{err:.1e}")
    rows = [(f"LLVM kernel, {threads} thread(s)", t_llvm), ("LLVM kernel, 1 thread", t_llvm1),
            ("LLVM runner (fresh output array)", t_llvm_fresh),
            ("NumPy", t_np), ("NumPy with out= buffers", t_np_out)]
    for name, (med, best) in rows:
        print(f"    {name:32s} {med * 1e3:8.2f} ms (best {best * 1e3:.2f})  "
              f"x{t_np[0] / med:5.1f} vs NumPy")
    print(f"    achieved {gbs:.1f} GB/s (16 B/element) = {100 * gbs / copy_gbs:.0f}% of copy "
          f"bandwidth {copy_gbs:.1f} GB/s -> compute-bound (transcendentals), as PERF.md says")


def sgemm():
    from runtime import blas
    sizes = (128, 256) if SMOKE else (1024, 2048)
    print(f"\n[2] sgemm (OpenBLAS threads: {blas.get_threads()}; NumPy's own OpenBLAS for @)")
    for n in sizes:
        rng = np.random.default_rng(1)
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        pb = ProgramBuilder()
        sa, sb, sc = pb.input((n, n)), pb.input((n, n)), pb.output((n, n))
        pb.extern("matmul", [sa, sb], [sc])
        compiled = compile_program(pb.build(), f"bench_sgemm{n}")
        c, cptr = aligned_empty((n, n), np.float32)
        import ctypes
        io = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, cptr)
        reps = 3 if n >= 2048 else 5
        t_ours = timeit(lambda: compiled(io), reps=reps, warmup=1)
        t_np = timeit(lambda: a @ b, reps=reps, warmup=1)
        flop = 2 * n ** 3
        np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-2)
        print(f"    {n}x{n}: generated code -> BLAS {flop / t_ours[0] / 1e9:7.1f} GFLOP/s, "
              f"NumPy @ {flop / t_np[0] / 1e9:7.1f} GFLOP/s")


def mlp_b1():
    rng = np.random.default_rng(2)
    dims = [512, 256, 128, 2]
    ws = [(rng.standard_normal((o, i)) * 0.05).astype(np.float32)
          for i, o in zip(dims[:-1], dims[1:])]
    bs = [(rng.standard_normal(o) * 0.05).astype(np.float32) for o in dims[1:]]
    pb = ProgramBuilder()
    h = pb.input((1, 512))
    params = []
    for k, (w, b) in enumerate(zip(ws, bs)):
        sw, sbias = pb.param(w.shape), pb.param(b.shape)
        params += [w, b]
        o = w.shape[0]
        t = pb.temp((1, o))
        pb.extern("matmul", [h, sw], [t], transpose_b=True)
        last = k == len(ws) - 1
        nxt = pb.output((1, o)) if last else pb.temp((1, o))
        e = call("add", Load(0), Load(1), dtype="float32")
        if not last:
            e = call("relu", e, dtype="float32")
        pb.loop((1, o), [pb.access(t), pb.access(sbias, (1, o))], [Output(pb.access(nxt), e)])
        h = nxt
    compiled = compile_program(pb.build(), "bench_mlp")
    x = rng.standard_normal((1, 512)).astype(np.float32)
    runner = compiled.runner(params)

    def numpy_fwd():
        y = np.maximum(x @ ws[0].T + bs[0], 0)
        y = np.maximum(y @ ws[1].T + bs[1], 0)
        return y @ ws[2].T + bs[2]
    np.testing.assert_allclose(runner(x)[0], numpy_fwd(), rtol=1e-4, atol=1e-5)
    inner = 200 if SMOKE else 1000
    t_ours = timeit(lambda: runner(x), reps=5, inner=inner)
    t_np = timeit(numpy_fwd, reps=5, inner=inner)
    print("\n[3] the book's MLP (512-256-128-2) at batch 1, one native call per forward")
    print(f"    LLVM program (3 GEMV + fused bias/relu), Runner: {t_ours[0] * 1e6:6.1f} us/call "
          f"(best {t_ours[1] * 1e6:.1f}); NumPy: {t_np[0] * 1e6:6.1f} us/call "
          f"(PERF.md floor 12.7 us)")


def lenet_conv():
    batch = 16 if SMOKE else 256
    print(f"\n[4] LeNet convolutions, batch {batch}, float32 (im2col + sgemm per image; conv1 "
          "forward: direct loops)")
    for name, xs, ws, attrs in [("conv1 1x28x28 -> 6@5x5 pad 2", (batch, 1, 28, 28),
                                 (6, 1, 5, 5), {"pad": 2}),
                                ("conv2 6x14x14 -> 16@5x5", (batch, 6, 14, 14),
                                 (16, 6, 5, 5), {})]:
        rng = np.random.default_rng(3)
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        (y,) = eager_apply(np, "conv2d", [x, w], attrs)
        g = rng.standard_normal(y.shape).astype(np.float32)
        row = []
        for op, args, extra in [("conv2d", (x, w), {}),
                                ("conv2d_grad_data", (g, w), {"data_shape": xs}),
                                ("conv2d_grad_weight", (x, g), {"weight_shape": ws})]:
            pb = ProgramBuilder()
            ins = [pb.input(a.shape) for a in args]
            from compiler.codegen import extern_out_specs
            (spec,) = extern_out_specs(op, dict(attrs, **extra),
                                       [pb.slots[s].spec for s in ins])
            out = pb.output(spec.shape)
            pb.extern(op, ins, [out], **attrs, **extra)
            runner = compile_program(pb.build(), f"bench_{op}").runner()
            t_ours = timeit(lambda: runner(*args), reps=5)
            t_np = timeit(lambda: eager_apply(np, op, list(args), dict(attrs, **extra)), reps=3)
            row.append(f"{op} {t_ours[0] * 1e3:.2f} ms (NumPy {t_np[0] * 1e3:.2f})")
        print(f"    {name}: " + "; ".join(row))


def main():
    print(f"bench_kernels: {'SMOKE sizes' if SMOKE else 'full sizes'}; "
          f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} "
          "(this machine is shared: compare ratios, not absolute times)")
    copy_med, copy_best = copy_bandwidth()
    print(f"\n[0] memory copy (np.copyto, read + write): {copy_med:.1f} GB/s "
          f"(best {copy_best:.1f})")
    chain(copy_med)
    sgemm()
    mlp_b1()
    lenet_conv()


if __name__ == "__main__":
    main()
