"""D2L 12.3 Automatic Parallelism: independent work on two devices runs at the same time, and
copies overlap with compute -- without the program saying so.

    python examples/ch12_3_auto_parallelism.py
    HYBRID_SMOKE=1 python examples/ch12_3_auto_parallelism.py

Devices: two GPUs when this machine has them, else the logical CPU devices cpu(0) and cpu(1)
(each an engine worker with its share of the cores: one BLAS thread each on 2 cores).

1. run(x) = K matmuls on device 1, the same on device 2, then both together: the engine runs
   the two independent chains in parallel, so the total is less than the sum.
2. Compute and copy: K matmuls on device 1, copying each result to cpu(0) as soon as it is
   ready (``to(device, non_blocking=True)``), vs computing then copying: total vs sum.
3. The dependency graph of a two-layer MLP split over devices, as the engine sees it.
"""
from __future__ import annotations

import time

import _common as C  # noqa: I001 - puts the repository on sys.path first
import numpy as np

import hybrid as hb

N = C.smoke(1000, 256)
K = C.smoke(10, 4)


def devices():
    if hb.num_gpus() >= 2:
        return [hb.gpu(0), hb.gpu(1)], hb.cpu(0)
    return [hb.cpu(0), hb.cpu(1)], hb.cpu(0)


def run(x):
    return [hb.dot(x, x) for _ in range(K)]


def chain(x):
    y = x
    for _ in range(K):
        y = hb.dot(y, x) / N  # each matmul reads the last: nothing to deduplicate
    return y


def bench(fn, reps=None):
    """Median seconds of fn() + waitall() (the book's d2l.Benchmark, repeated)."""
    med, _ = C.timed(fn, reps=reps or C.smoke(3, 2), warmup=1)
    return med


def part1_two_devices(devs):
    C.section(f"1. {K} x ({N}x{N} matmul) on {devs[0]}, on {devs[1]}, and on both at once")
    hb.random.seed(0)
    x1 = hb.random.uniform(size=(N, N), device=devs[0])
    x2 = hb.random.uniform(size=(N, N), device=devs[1])
    t1 = bench(lambda: run(x1))
    t2 = bench(lambda: run(x2))
    t12 = bench(lambda: (run(x1), run(x2)))
    # hybridized: K *dependent* matmuls per device (K copies of one x @ x would be folded
    # into one by the compiler's common-subexpression rule), alone on each device, then both
    # chains as ONE call whose graph spans both devices: one compiled part per device,
    # pushed as one engine op each, so the parts run at once too
    one = hb.hybridize(chain)
    both = hb.hybridize(lambda a, b: (chain(a), chain(b)))
    t1h = bench(lambda: one(x1))
    t2h = bench(lambda: one(x2))
    th = bench(lambda: both(x1, x2))
    gflop = 2 * N ** 3 * K / 1e9
    for label, t, work in ((f"{devs[0]} alone", t1, gflop), (f"{devs[1]} alone", t2, gflop),
                           ("sum of the two", t1 + t2, None),
                           ("both, queued together", t12, 2 * gflop),
                           (f"hybridized chain, {devs[0]}", t1h, None),
                           (f"hybridized chain, {devs[1]}", t2h, None),
                           ("both, one hybridized call", th, 2 * gflop)):
        rate = f"  ({work / t:6.1f} GFLOP/s)" if work else ""
        print(f"  {label:26s}{t * 1e3:9.1f} ms{rate}")
    ratio = t12 / (t1 + t2)
    if ratio < 0.9:
        verdict = f"each device's worker ran its chain at the same time: total / sum = {ratio:.2f}"
    else:
        verdict = (f"total / sum = {ratio:.2f}: little or no gain this time -- the two workers "
                   f"were ready to run at once, but this machine's 2 cores are shared with "
                   f"other work ({C.load()})")
    C.note(f"""
The front end queued {K} matmuls for {devs[0]} and {K} for {devs[1]} and returned; {verdict}
(1.0 = no parallelism, 0.5 = perfect on two devices). Nothing in the program asked for
parallel execution: the chains share no data, so the engine found no dependency between them.
On CPU devices each worker owns a share of the cores (one BLAS thread each on 2 cores), so one
device alone runs with half the machine -- that is the price of partitioning. Hybridized, the
same work is one call whose graph spans both devices: the compiler cuts it into one part per
device and the parts run at once as well (total / sum = {th / (t1h + t2h):.2f}).""")
    C.result("two_devices.ms_device1", t1 * 1e3)
    C.result("two_devices.ms_device2", t2 * 1e3)
    C.result("two_devices.ms_both", t12 * 1e3)
    C.result("two_devices.total_over_sum", t12 / (t1 + t2))
    C.result("two_devices.ms_hybridized", th * 1e3)
    C.result("two_devices.hybridized_over_sum", th / (t1h + t2h))


def part2_compute_and_copy(devs, host):
    src = devs[1]
    C.section(f"2. compute on {src} and copy the results to {host}")
    x = hb.random.uniform(size=(N, N), device=src)

    def copy_to(ys, non_blocking):
        return [y.to(host, non_blocking=non_blocking) for y in ys]

    y = run(x)
    hb.waitall()
    t_run = bench(lambda: run(x))
    t_copy = bench(lambda: copy_to(y, True))
    t_both = bench(lambda: copy_to(run(x), True))
    ys = run(x)
    got = copy_to(ys, True)
    same = all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(ys, got))
    mb = K * N * N * 4 / 2 ** 20
    print(f"  {'run on ' + str(src):34s}{t_run * 1e3:9.1f} ms")
    print(f"  {'copy to ' + str(host) + f' ({mb:.0f} MiB)':34s}{t_copy * 1e3:9.1f} ms  "
          f"({mb / 1024 / max(t_copy, 1e-9):.1f} GiB/s)")
    print(f"  {'sum':34s}{(t_run + t_copy) * 1e3:9.1f} ms")
    print(f"  {'run and copy, queued together':34s}{t_both * 1e3:9.1f} ms")
    ratio = t_both / (t_run + t_copy)
    if ratio < 0.95:
        verdict = f"total / sum = {ratio:.2f}: copying overlapped with computing."
    else:
        verdict = (f"total / sum = {ratio:.2f}: no overlap here. A copy between CPU devices "
                   f"runs on the source device's worker, in its FIFO queue behind the "
                   f"matmuls, and it is a memcpy at memory bandwidth, small next to them.")
    C.note(f"""
Each copy depends only on its own matmul, so the engine may start copying result i while
result i+1 is being computed. {verdict} The book's case is a GPU, where copies to the host
run on their own stream over PCIe while the next kernels run (rerun on a GPU machine).
Copied values equal the originals: {same}.""")
    C.result("compute_copy.ms_run", t_run * 1e3)
    C.result("compute_copy.ms_copy", t_copy * 1e3)
    C.result("compute_copy.ms_both", t_both * 1e3)
    C.result("compute_copy.copies_equal", same)


def part3_graph(devs, host):
    C.section("3. a two-layer MLP's dependency graph spread over devices")
    hb.random.seed(1)
    b = C.smoke(256, 64)
    x = hb.random.normal(size=(b, 256), device=host)
    w1h = hb.random.normal(size=(256, 256), device=host) * 0.05
    w2h = hb.random.normal(size=(256, 10), device=host) * 0.05
    w1 = [w1h.to(d) for d in devs]            # the same weights, one copy per device
    w2 = [w2h.to(d) for d in devs]
    hb.waitall()
    t0 = time.perf_counter()
    # data parallel: each device gets half the batch and its own copy of the weights
    half = [x[:b // 2].to(devs[0], non_blocking=True), x[b // 2:].to(devs[1], non_blocking=True)]
    hidden = [hb.relu(hb.dot(h, w)) for h, w in zip(half, w1)]
    outs = [hb.dot(h, w) for h, w in zip(hidden, w2)]
    back = [o.to(host, non_blocking=True) for o in outs]
    y = hb.concatenate(back, axis=0)
    t_queue = time.perf_counter() - t0
    y.wait_to_read()
    t_total = time.perf_counter() - t0
    ref = np.concatenate([np.maximum(half_np @ w1[0].asnumpy(), 0) @ w2[0].asnumpy()
                          for half_np in (x.asnumpy()[:b // 2], x.asnumpy()[b // 2:])])
    ok = bool(np.allclose(y.asnumpy(), ref, rtol=1e-4, atol=1e-4))
    print(f"""    x on {host} --split--> x[:{b // 2}] -> {devs[0]} : relu(x W1) -> (.) W2 --copy--+
                        x[{b // 2}:] -> {devs[1]} : relu(x W1) -> (.) W2 --copy--+-> concat on {host}""")
    C.note(f"""
The front end queued the 9 ops in {t_queue * 1e3:.2f} ms and returned; the two branches share
nothing until the concat, so each device ran its branch while the other ran its own
(total {t_total * 1e3:.1f} ms). Result equals NumPy's: {ok}.""")
    C.result("mlp_graph.equal_numpy", ok)


def main():
    C.header("12.3", "automatic parallelism", None)
    devs, host = devices()
    print(f"devices: {devs[0]}, {devs[1]} (GPUs: {hb.num_gpus()})")
    part1_two_devices(devs)
    part2_compute_and_copy(devs, host)
    part3_graph(devs, host)
    C.footer()


if __name__ == "__main__":
    main()
