"""D2L 12.4 Hardware: this machine's own floors, measured.

    python examples/ch12_4_hardware.py
    HYBRID_SMOKE=1 python examples/ch12_4_hardware.py

The book lists latencies and bandwidths (L1 ~1.5 ns, DRAM 20-25 GB/s per module, PCIe 4.0 x16
32 GB/s, NVLink 300 GB/s ...). A compiler is judged against the floors of the machine it runs
on, so this script measures them here:

1. the CPU and its caches (from the OS);
2. memory bandwidth: np.copyto at working sets from L2 to DRAM (read + write counted), and
   the STREAM triad a = b + s * c (NumPy's two passes vs hybrid's one fused LLVM kernel);
3. sgemm GFLOP/s on 1 and 2 threads (NumPy's OpenBLAS) and through a hybridized matmul;
4. the per-call overhead of a hybridized tiny function, beside an eager op and NumPy;
5. host <-> GPU copy bandwidth, when there is a GPU.
"""
from __future__ import annotations

import os
import platform
import time

import _common as C  # noqa: I001 - puts the repository on sys.path first
import numpy as np

import hybrid as hb


def best_of(fn, reps, inner=1):
    """Fastest seconds of one call of ``fn`` over ``reps * inner`` timed calls: a floor (on a
    shared machine the fastest call is the one least disturbed by other work)."""
    fn()
    best = float("inf")
    for _ in range(reps * inner):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def part1_cpu():
    C.section("1. the processor")
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        flags = ", ".join(x for x in ("avx2", "avx512f", "fma") if f" {x}" in text)
    except OSError:
        pass
    print(f"  {model}, {os.cpu_count()} logical CPU(s), {platform.machine()}; SIMD: {flags or '?'}")
    caches = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            level = open(f"{base}/{idx}/level").read().strip()
            kind = open(f"{base}/{idx}/type").read().strip()
            size = open(f"{base}/{idx}/size").read().strip()
        except OSError:
            continue
        if kind != "Instruction":
            caches.append(f"L{level} {size}")
    print(f"  caches (per core unless shared): {', '.join(caches) or 'unknown'}")
    try:
        mem = [x for x in open("/proc/meminfo") if x.startswith("MemTotal")][0].split()[1]
        print(f"  memory: {int(mem) / 2 ** 20:.1f} GiB")
    except (OSError, IndexError):
        pass
    C.result("cpu.count", os.cpu_count())


def part2_bandwidth():
    C.section("2. memory bandwidth (GB/s = 1e9 bytes/s; copy counts read + write)")
    sizes = [(256 << 10, "L2"), (4 << 20, "L3"), (C.smoke(256 << 20, 64 << 20), "DRAM")]
    gbs = {}
    for nbytes, where in sizes:
        a = _array(nbytes // 4)
        b = _array(nbytes // 4, 0.0, skew=1)
        inner = max(1, min(100, (64 << 20) // nbytes)) if where != "DRAM" else 1
        t = best_of(lambda: np.copyto(b, a), reps=C.smoke(5, 3), inner=inner)
        gbs[where] = 2 * nbytes / t / 1e9
        print(f"  copy {nbytes / 2 ** 20:8.2f} MiB (fits {where:4s}) {gbs[where]:7.1f} GB/s")
    dram = sizes[-1][0]
    n = dram // 4
    b = _array(n)
    c = _array(n, skew=1)
    a = _array(n, 0.0, skew=2)
    s = np.float32(3.0)

    def np_triad():
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)
    t_np = best_of(np_triad, reps=C.smoke(5, 3))
    triad_gbs_np = 3 * dram / t_np / 1e9
    t_np_fresh = best_of(lambda: b + s * c, reps=C.smoke(5, 3))
    triad = hb.hybridize(lambda x, y: x + 3.0 * y)
    hbb, hbc = hb.array(b), hb.array(c)
    t_hb = best_of(lambda: triad(hbb, hbc).wait_to_read(), reps=C.smoke(5, 3))
    triad_gbs_hb = 3 * dram / t_hb / 1e9
    print(f"  triad a = b + s*c, {dram / 2 ** 20:.0f} MiB arrays (3 arrays counted):")
    print(f"    NumPy into an existing a (out=, 2 passes)   {triad_gbs_np:7.1f} GB/s")
    print(f"    NumPy b + s * c (fresh result, 2 passes)    {3 * dram / t_np_fresh / 1e9:7.1f} GB/s")
    print(f"    hybridized (1 fused LLVM kernel, fresh)     {triad_gbs_hb:7.1f} GB/s")
    C.note(f"""
The book's DRAM figure is 20-25 GB/s per module; this machine copies at {gbs['DRAM']:.0f} GB/s
from DRAM and {gbs['L2']:.0f} GB/s inside L2. An elementwise kernel moving B bytes cannot beat
B / {gbs['DRAM']:.0f} GB/s from DRAM: that is the floor benchmarks/bench_kernels.py compares
fused kernels against. A fresh result array (NumPy's b + s * c, or a hybridized call, whose
outputs always belong to the caller) pays the operating system's first-touch page faults on
every call at this size, which an out= loop into the same array does not.""")
    C.result("bandwidth.copy_dram_gbs", gbs["DRAM"])
    C.result("bandwidth.copy_l2_gbs", gbs["L2"])
    C.result("bandwidth.triad_numpy_gbs", triad_gbs_np)
    C.result("bandwidth.triad_hybrid_gbs", triad_gbs_hb)
    return gbs


def _array(n, value=1.0, skew=0):
    """n float32 at an address skewed by ``skew`` KiB + 64 B within a page: source and
    destination of a copy must not sit at the same offset in their pages (4K aliasing makes
    memcpy up to 10x slower; STREAM offsets its arrays for the same reason)."""
    off = (skew * 1024 + (64 if skew else 0)) // 4
    buf = np.empty(n + 4096, np.float32)
    start = (-buf.ctypes.data % 4096) // 4 + off      # page-aligned, then skewed
    a = buf[start:start + n]
    a[:] = value
    return a


def _set_blas_threads(n):
    try:
        from threadpoolctl import threadpool_limits  # noqa: PLC0415
    except ImportError:
        return None
    return threadpool_limits(limits=n, user_api="blas")


def part3_gemm():
    n = C.smoke(2048, 512)
    C.section(f"3. sgemm {n}x{n} float32 (2 n^3 flops)")
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    flop = 2 * n ** 3
    res = {}
    for threads in (1, 2):
        if threads > (os.cpu_count() or 1):
            continue
        lim = _set_blas_threads(threads)
        if lim is None and threads == 1:
            print("  (threadpoolctl is not installed: BLAS threads cannot be set; "
                  "pip install threadpoolctl)")
        t = best_of(lambda: a @ a, reps=C.smoke(3, 2))
        res[threads] = flop / t / 1e9
        print(f"  NumPy (OpenBLAS), {threads} thread(s)           {res[threads]:7.1f} GFLOP/s")
        if lim is not None:
            lim.restore_original_limits()
    mm = hb.hybridize(lambda x, y: hb.matmul(x, y))
    ha = hb.array(a)
    t = best_of(lambda: mm(ha, ha).wait_to_read(), reps=C.smoke(3, 2))
    res["hybrid"] = flop / t / 1e9
    print(f"  hybridized matmul on cpu(0) (LLVM -> BLAS)  {res['hybrid']:7.1f} GFLOP/s")
    C.note("""
PERF.md measured 91 GFLOP/s on 1 thread and 176-188 on 2 for 2048^2 on a quiet machine like
this one; a loaded machine (see the load average) gives less. A matmul-heavy model cannot run
faster than these figures allow: LeNet's training step at batch 256 is a few GFLOP.""")
    for k, v in res.items():
        C.result(f"sgemm.gflops_{k}", v)


def part4_call_overhead():
    n = C.smoke(20_000, 2_000)
    C.section(f"4. per-call overhead: y = x + 1 on a (1, 2) array, {n:,} calls")
    x = hb.ones((1, 2))
    f = hb.hybridize(lambda v: v + 1)
    f(x).wait_to_read()
    xn = np.ones((1, 2), np.float32)

    def calls(fn):
        def run():
            for _ in range(n):
                fn()
            hb.waitall()
        return best_of(run, reps=C.smoke(3, 2)) / n * 1e6

    def sync_calls(fn):
        def run():
            for _ in range(n):
                fn().wait_to_read()
        return best_of(run, reps=C.smoke(3, 2)) / n * 1e6
    rows = [("NumPy x + 1", calls(lambda: xn + 1), None),
            ("hybrid eager op x + 1", calls(lambda: x + 1), sync_calls(lambda: x + 1)),
            ("hybridized function, one native call", calls(lambda: f(x)),
             sync_calls(lambda: f(x)))]
    print(f"  {'':40s}{'async us/call':>14s}{'sync us/call':>14s}")
    for label, a, s in rows:
        print(f"  {label:40s}{a:14.2f}{'' if s is None else f'{s:14.2f}'}")
    C.note("""
The fixed cost of one call into the engine -- signature lookup, pointer setup, the push -- is
the floor for small models: below it, nothing the compiler does to the kernels matters.
PERF.md's probe put one ctypes call of a JIT-compiled function at ~13 us here.""")
    C.result("overhead.numpy_us", rows[0][1])
    C.result("overhead.eager_async_us", rows[1][1])
    C.result("overhead.hybridized_async_us", rows[2][1])
    C.result("overhead.hybridized_sync_us", rows[2][2])


def part5_gpu():
    C.section("5. host <-> GPU copies")
    if hb.num_gpus() == 0:
        print("  no GPU on this machine (the book: PCIe 4.0 x16 ~32 GB/s, NVLink up to "
              "300 GB/s): skipped")
        return
    nbytes = C.smoke(512 << 20, 32 << 20)
    x = hb.ones((nbytes // 4,), device=hb.cpu(0))
    t_h2d = best_of(lambda: x.to(hb.gpu(0)), reps=3)
    y = x.to(hb.gpu(0))
    t_d2h = best_of(lambda: y.to(hb.cpu(0)), reps=3)
    print(f"  host -> gpu(0): {nbytes / t_h2d / 1e9:6.1f} GB/s; gpu(0) -> host: "
          f"{nbytes / t_d2h / 1e9:6.1f} GB/s ({nbytes >> 20} MiB)")
    C.result("gpu.h2d_gbs", nbytes / t_h2d / 1e9)


def main():
    C.header("12.4", "hardware: this machine's floors", None)
    part1_cpu()
    part2_bandwidth()
    part3_gemm()
    part4_call_overhead()
    part5_gpu()
    C.footer()


if __name__ == "__main__":
    main()
