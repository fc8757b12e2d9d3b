"""Where a GPU call's time goes: host-side profiles of hybrid on gpu(0), for the short device run.

    python benchmarks/gpu_profile.py [--out profile.txt]       # a real GPU (or an emulated one)

Prints, for an eager ``y = x + 1``, the hybridized MLP training step of bench_gpu.py and the
hybridized elementwise chain: wall time per call with a sync at the end, the same call's GPU
time alone (events around it, after a sync), and cProfile's top functions by own time. The
gap between wall and GPU time is host overhead (Python, the engine, CuPy's launches).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hybrid as hb  # noqa: E402
from benchmarks import bench_gpu  # noqa: E402
from hybrid import autograd  # noqa: E402
from hybrid.nn import models  # noqa: E402


def profile(title, fn, n, out, top=22):
    wall = bench_gpu.per_call(fn, n, hb.waitall, 1)
    gpu = hb.gpu(0).seam
    gpu_ms = None
    if gpu.implementation == "cupy":  # the compute stream's span, timed by CUDA events
        try:
            import cupy  # noqa: PLC0415
            s = gpu.compute_stream
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            with gpu.device:
                a.record(s.s)
                for _ in range(n):
                    fn()
                hb.waitall()
                b.record(s.s)
                b.synchronize()
            gpu_ms = cupy.cuda.get_elapsed_time(a, b) / n
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            print(f"  (event timing failed: {exc})", file=out)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    hb.waitall()
    pr.disable()
    print(f"\n=== {title}: {wall * 1e3:.3f} ms/call wall ({n} calls, one sync); compute "
          f"stream span {gpu_ms if gpu_ms is None else round(gpu_ms, 3)} ms/call", file=out)
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    print("\n".join(buf.getvalue().splitlines()[4:]), file=out)
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(top)
    print("\n".join(buf.getvalue().splitlines()[4:]), file=out)


def kernel_times(title, fn, n, out):
    """GPU time of each generated kernel over ``n`` calls of ``fn`` (timing events around
    every launch; a real GPU only), and the eager ops' count: is the step GPU- or host-bound?"""
    try:
        import cupy  # noqa: PLC0415

        from runtime.gpu import cupy_gpu  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return
    if hb.gpu(0).seam.implementation != "cupy":
        return
    spans = []
    orig = cupy_gpu.CupyModule.launch

    def timed(self, kernel_name, grid, block, shared_bytes, args, stream=None):
        st = stream or self.gpu.compute_stream
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        st.run("t0", lambda s: a.record(s.s))
        orig(self, kernel_name, grid, block, shared_bytes, args, stream)
        st.run("t1", lambda s: b.record(s.s))
        spans.append((kernel_name, grid, a, b))

    fn()
    hb.waitall()
    cupy_gpu.CupyModule.launch = timed
    try:
        for _ in range(n):
            fn()
        hb.waitall()
        hb.gpu(0).seam.synchronize()
    finally:
        cupy_gpu.CupyModule.launch = orig
    total = {}
    for name, grid, a, b in spans:
        b.synchronize()
        t, c, g = total.get(name, (0.0, 0, grid))
        total[name] = (t + cupy.cuda.get_elapsed_time(a, b), c + 1, g)
    print(f"\n=== {title}: generated kernels' GPU time per call (ms), {n} calls", file=out)
    for name, (t, c, g) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        print(f"  {t / n:8.4f}  x{c // n:<3d} grid {g}  {name}", file=out)
    print(f"  {sum(t for t, _, _ in total.values()) / n:8.4f}  all generated kernels",
          file=out)


def matmul_peers(out):
    """The MLP step's products through CuPy (cuBLAS) and hybrid's generated GEMM, ms each."""
    try:
        import cupy  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return
    if hb.gpu(0).seam.implementation != "cupy":
        return
    print("\n=== products: cupy (cuBLAS) vs hybridized (generated GEMM), ms", file=out)
    for m, k, n in ((256, 784, 256), (256, 256, 10), (784, 256, 256), (1, 512, 256)):
        a = cupy.random.standard_normal((m, k), dtype=cupy.float32)
        b = cupy.random.standard_normal((k, n), dtype=cupy.float32)
        f = hb.hybridize(lambda x, y: hb.np.matmul(x, y), backend="cuda")
        xa, xb = hb.ones((m, k), device=hb.gpu(0)), hb.ones((k, n), device=hb.gpu(0))
        def sync():
            hb.waitall()
            cupy.cuda.Device().synchronize()

        for name, call in (("cupy", lambda: a @ b), ("hybrid", lambda: f(xa, xb))):
            dt = bench_gpu.per_call(call, 50, sync, 1) * 1e3
            print(f"  {m}x{k}x{n} {name}: {dt:.4f} ms/call wall", file=out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115
    dev = hb.gpu(0)
    x = hb.ones((256,), device=dev)
    profile("eager y = x + 1", lambda: x + 1, 300, out)
    w = hb.random.normal(size=(1000, 1000), device=dev)

    def draw_and_multiply():  # the book's 12.2 loop body
        return hb.np.dot(hb.random.normal(size=(1000, 1000), device=dev), w)
    profile("eager 1000x1000 normal draw + matmul (12.2)", draw_and_multiply, 50, out)
    eager_mlp = models.mlp((256, 128), 2)
    eager_mlp.initialize(hb.init.Xavier(), device=dev)
    x1e = hb.random.normal(size=(1, 512), device=dev)
    profile("eager MLP b1 forward", lambda: eager_mlp(x1e), 200, out, top=30)

    net = models.mlp(256, 10)
    net.initialize(hb.init.Xavier(), device=dev)
    net.hybridize(backend="cuda")
    b = args.batch
    xb = hb.random.normal(size=(b, 784), device=dev)
    yb = hb.random.randint(0, 10, size=(b,), device=dev)
    loss_fn = hb.loss.SoftmaxCrossEntropyLoss()
    tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})

    def step():
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        tr.step(b)

    profile(f"hybridized MLP train step b{b}", step, 30, out, top=30)
    kernel_times(f"hybridized MLP train step b{b}", step, 10, out)
    mlp1 = models.mlp((256, 128), 2)
    mlp1.initialize(hb.init.Xavier(), device=dev)
    mlp1.hybridize(backend="cuda")
    x1 = hb.random.normal(size=(1, 512), device=dev)
    profile("hybridized MLP b1 forward", lambda: mlp1(x1), 300, out, top=30)
    kernel_times("hybridized MLP b1 forward", lambda: mlp1(x1), 50, out)
    matmul_peers(out)
    for run in _cuda_runs(net):
        print(f"  executable {run.source.name}: {len(run.source.launches)} launches, "
              f"graph stats {run.graph.stats}", file=out)
    fn = hb.hybridize(bench_gpu.chain_fn, backend="cuda")
    xc = hb.random.uniform(-1, 1, size=(1 << 24,), device=dev)
    profile("hybridized chain 16M", lambda: fn(xc), 20, out, top=12)
    if out is not sys.stdout:
        out.close()


def _cuda_runs(net):
    """The CudaRun objects the net's cache holds (best effort: for the report only)."""
    import gc  # noqa: PLC0415

    from compiler.codegen.cuda.exec import CudaRun  # noqa: PLC0415
    return [o for o in gc.get_objects() if isinstance(o, CudaRun)]


if __name__ == "__main__":
    main()
