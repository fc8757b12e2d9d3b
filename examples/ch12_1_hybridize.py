"""D2L 12.1 Compilers and Interpreters: imperative by default, hybridize() for speed, export.

    python examples/ch12_1_hybridize.py            # the book's 1000 calls
    HYBRID_SMOKE=1 python examples/ch12_1_hybridize.py

1. The book's MLP (Dense(256, relu) -> Dense(128, relu) -> Dense(2), input (1, 512)): 1000
   calls + one waitall, eager vs hybridized with the reference backend (graph run op by op by
   the registry's NumPy implementations) vs the LLVM backend (the whole graph as one native
   call), with NumPy by hand as the floor. Same weights, same outputs.
2. Tracing: a block whose forward prints. Eagerly the print runs on every call; hybridized it
   runs once, while tracing (Python code in forward is not part of the graph). Data-dependent
   Python inside a hybridized forward (``if x.sum() > 0``, ``asnumpy()``) is refused with a
   TraceError naming the line, never traced into a silently wrong graph.
3. net.export(path) writes a graph description plus a parameter file (the book's
   my_mlp-symbol.json + my_mlp-0000.params); hb.load(path) runs it without the model's
   Python class, in this process and in a fresh one.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import _common as C  # noqa: I001 - puts the repository on sys.path first
import numpy as np

import hybrid as hb
from hybrid import nn

N_CALLS = C.smoke(1000, 100)


def get_net():
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(2))
    net.initialize()
    return net


def numpy_mlp(net):
    """The same MLP by hand in NumPy, with the net's weights: the floor for one call."""
    ws = [(d.weight.data().asnumpy(), d.bias.data().asnumpy()) for d in net]

    def f(x):
        h = np.maximum(x @ ws[0][0].T + ws[0][1], 0)
        h = np.maximum(h @ ws[1][0].T + ws[1][1], 0)
        return h @ ws[2][0].T + ws[2][1]
    return f


def bench_calls(net, x, n):
    """Seconds for n calls then one waitall (the book's d2l.Benchmark), median of 3."""
    net(x).wait_to_read()  # first call: trace + compile when hybridized (timed separately)

    def run():
        for _ in range(n):
            net(x)
    med, _ = C.timed(run, reps=C.smoke(3, 1), warmup=0)
    return med


def part1_benchmark():
    C.section(f"1. the book's MLP, {N_CALLS} calls + one waitall (input (1, 512))")
    hb.random.seed(0)
    x = hb.random.normal(size=(1, 512))
    net = get_net()
    net(x)  # finish deferred initialization
    xn = x.asnumpy()
    ref = numpy_mlp(net)

    rows = []
    outs = {}
    for label, backend in (("eager (no hybridize)", None), ("hybridize, reference backend",
                                                           "reference"),
                           ("hybridize, LLVM backend (default)", "llvm")):
        if backend is None:
            net.hybridize(active=False)
        else:
            net.hybridize(backend=backend)
        t0 = time.perf_counter()
        outs[label] = net(x).asnumpy()
        first = time.perf_counter() - t0
        sec = bench_calls(net, x, N_CALLS)
        rows.append((label, sec, first))

    t0 = time.perf_counter()
    for _ in range(N_CALLS):
        ref(xn)
    t_np = time.perf_counter() - t0

    eager = rows[0][1]
    print(f"  {'':36s}{'total s':>9s}{'us/call':>10s}{'vs eager':>10s}{'1st call':>10s}")
    for label, sec, first in rows:
        print(f"  {label:36s}{sec:9.4f}{sec / N_CALLS * 1e6:10.1f}{eager / sec:9.1f}x"
              f"{first * 1e3:8.0f}ms")
    print(f"  {'NumPy by hand (the floor)':36s}{t_np:9.4f}{t_np / N_CALLS * 1e6:10.1f}"
          f"{eager / t_np:9.1f}x")
    llvm = rows[2][1]
    C.note(f"""
The book measures 'from a few percent to more than twice the speed' for MXNet's hybridize.
Here the LLVM backend runs the whole traced graph as ONE native call per forward:
{eager / llvm:.1f}x faster than eager, {llvm / t_np:.1f}x NumPy's own time by hand (which does no
dependency tracking and returns synchronously). The reference backend runs the same graph
node by node with NumPy (a plan without the Python front end per op). The first hybridized
call traces forward and compiles (column '1st call'); later calls reuse the plan.""")
    same = all(np.allclose(o, ref(xn), rtol=1e-4, atol=1e-5) for o in outs.values())
    C.result("mlp.us_per_call.eager", eager / N_CALLS * 1e6)
    C.result("mlp.us_per_call.reference", rows[1][1] / N_CALLS * 1e6)
    C.result("mlp.us_per_call.llvm", llvm / N_CALLS * 1e6)
    C.result("mlp.us_per_call.numpy", t_np / N_CALLS * 1e6)
    C.result("mlp.speedup_llvm_vs_eager", eager / llvm)
    C.result("mlp.outputs_equal_across_modes", same)
    return net, x


class Printing(nn.HybridBlock):
    """The book's demo: a block whose forward has Python side effects."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        print(f"    forward ran in Python (x is a {type(x).__name__})")
        return hb.relu(self.dense(x))


class DataDependent(nn.HybridBlock):
    """Python control flow on an array's value: fine eagerly, refused when hybridized."""

    def forward(self, x):
        if x.sum() > 0:  # needs the value: the trace cannot know it
            return x * 2
        return -x


def part2_tracing():
    C.section("2. tracing: Python in forward runs only while tracing")
    x = hb.ones((2, 3))
    blk = Printing()
    blk.initialize()
    print("  eager, 3 calls:")
    for _ in range(3):
        blk(x)
    eager_calls = blk.calls
    blk.calls = 0
    blk.hybridize()
    print("  hybridized, 3 calls:")
    for _ in range(3):
        blk(x)
    hb.waitall()
    traced_calls = blk.calls
    C.note(f"""
Eagerly, forward ran {eager_calls} times in 3 calls. Hybridized, it ran {traced_calls} time(s):
the first call traced it into a graph (the print ran then), later calls ran the graph.""")
    C.result("trace.python_runs_eager", eager_calls)
    C.result("trace.python_runs_hybridized", traced_calls)
    blk(hb.ones((5, 3)))
    C.note("A call with a new input shape traces again (it printed once more above); "
           "hb.explain(block) lists the signatures and re-trace reasons:")
    for line in hb.explain(blk).splitlines()[:3]:
        print(f"    {line}")

    dd = DataDependent()
    print(f"  eager data-dependent block: {dd(hb.ones((2,))).asnumpy()}")
    dd.hybridize()
    try:
        dd(hb.ones((2,)))
        hb.waitall()
        refused = False
        print("  UNEXPECTED: the data-dependent forward was traced without an error")
    except hb.TraceError as exc:
        refused = True
        print(f"  hybridized: hb.TraceError: {str(exc)[:300]}")
    C.result("trace.data_dependent_refused", refused)


def part3_export(net, x):
    C.section("3. export, then load without the model's Python code")
    out_dir = tempfile.mkdtemp(prefix="ch12_1-")
    path = os.path.join(out_dir, "my_mlp")
    net.hybridize()
    expected = net(x).asnumpy()
    t0 = time.perf_counter()
    net.export(path, example_inputs=(x,))
    t_export = time.perf_counter() - t0
    for name in sorted(os.listdir(path)):
        print(f"    {name:24s}{os.path.getsize(os.path.join(path, name)):>10,d} bytes")
    print(f"  exported to {path} in {t_export * 1e3:.0f} ms (graph description + weights + "
          "a manifest with checksums)")

    deployed = hb.load(path)
    got = deployed(x).asnumpy()
    same_here = bool(np.array_equal(got, expected))
    print(f"  hb.load in this process: {deployed!r}")
    print(f"  predictions equal to the live net (bitwise): {same_here}")
    batch = hb.random.normal(size=(5, 512))
    got5 = deployed(batch).asnumpy()
    close5 = bool(np.allclose(got5, net(batch).asnumpy(), rtol=1e-5, atol=1e-6))
    print(f"  the artifact also runs at batch 5 (dynamic batch): {got5.shape}, equal: {close5}")

    np.save(os.path.join(out_dir, "x.npy"), x.asnumpy())
    code = ("import sys, numpy as np, hybrid as hb\n"
            "d = hb.load(sys.argv[1])\n"
            "y = d(hb.array(np.load(sys.argv[2]))).asnumpy()\n"
            "np.save(sys.argv[3], y)\n"
            "own = [m for m in sys.modules if m.startswith(('ch12', '_common'))]\n"
            "print('fresh process: loaded', repr(d), '; example modules imported:',"
            " own or 'none')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = C._ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, path, os.path.join(out_dir, "x.npy"),
                           os.path.join(out_dir, "y.npy")], capture_output=True, text=True,
                          timeout=300, env=env)
    if proc.returncode != 0:
        print(f"  fresh process FAILED:\n{proc.stderr[-2000:]}")
        same_fresh = False
    else:
        print(f"  {proc.stdout.strip()}")
        same_fresh = bool(np.array_equal(np.load(os.path.join(out_dir, "y.npy")), expected))
        print(f"  predictions of the fresh process equal (bitwise): {same_fresh}")
    C.result("export.equal_in_process", same_here)
    C.result("export.equal_other_batch", close5)
    C.result("export.equal_fresh_process", same_fresh)


def main():
    C.header("12.1", "compilers and interpreters: hybridize()", None)
    net, x = part1_benchmark()
    part2_tracing()
    part3_export(net, x)
    C.footer()


if __name__ == "__main__":
    main()
