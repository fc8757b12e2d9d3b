"""Deployment costs for the MLP, LeNet and the ResNet-18 variant: export, load (cold and warm)
and first-call latency, then `hybrid bench` figures beside the in-process hybridized call.

    python benchmarks/bench_deploy.py                      # default backend, full sizes
    python benchmarks/bench_deploy.py --backend reference
    HYBRID_SMOKE=1 python benchmarks/bench_deploy.py       # tiny sizes (CI)

- export: trace at two more batch sizes, write atomically, load back and compare outputs.
- load cold: a fresh process with an empty compile cache (import hybrid timed separately);
  load warm: a second fresh process sharing that compile cache (what the on-disk cache buys
  for the LLVM backend), and a second load inside one process.
- first call: load + the first call, which re-runs the passes and generates code here.
- bench: `hybrid bench` (median per-call latency with a wait after each call, and throughput
  with calls queued back to back) next to the same model's in-process hybridized call.
PyTorch's torch.jit.load / torch.export are timed beside when torch is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import hybrid as hb  # noqa: E402
from hybrid import init  # noqa: E402
from hybrid.cli import bench_artifact  # noqa: E402
from hybrid.nn import models  # noqa: E402
from runtime import config  # noqa: E402

SMOKE = bool(config.get("HYBRID_SMOKE"))

COLD = r'''
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import hybrid as hb
t1 = time.perf_counter()
m = hb.load(sys.argv[1], backend=sys.argv[2] if sys.argv[2] != "default" else None)
t2 = time.perf_counter()
x = hb.array(np.load(sys.argv[3]))
t3 = time.perf_counter()
m(x).wait_to_read()
t4 = time.perf_counter()
m(x).wait_to_read()
t5 = time.perf_counter()
t6 = time.perf_counter()
hb.load(sys.argv[1])
t7 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first_call": t4 - t3,
                  "second_call": t5 - t4, "reload_in_process": t7 - t6,
                  "backend": m.backend}))
'''


def model_specs():
    if SMOKE:
        return [("mlp", lambda: models.mlp((64,)), (2, 20)),
                ("lenet", models.lenet, (2, 1, 28, 28)),
                ("resnet18", lambda: models.resnet18(width=8), (2, 3, 16, 16))]
    return [("mlp", models.mlp, (64, 784)),
            ("lenet", models.lenet, (64, 1, 28, 28)),
            ("resnet18", models.resnet18, (8, 3, 32, 32))]


def fresh_process(path, backend, x_path, cache_dir):
    env = dict(os.environ, HYBRID_CACHE_DIR=cache_dir, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", COLD, str(path), backend or "default",
                          str(x_path)], capture_output=True, text=True, env=env, timeout=600)
    if res.returncode:
        raise RuntimeError(res.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])


def in_process_latency(net, x, iters, repeats):
    lat = []
    for _ in range(repeats):
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            net(x)
            hb.waitall()
            samples.append(time.perf_counter() - t0)
        lat.append(statistics.median(samples))
    return statistics.median(lat)


def torch_note():
    try:
        import torch  # noqa: F401,PLC0415
    except ImportError:
        return "torch is not installed: no torch.jit.load / torch.export figures beside these"
    return "torch is installed, but a matching TorchScript model is not built here yet"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default=None, help="reference | llvm (default: hybrid's)")
    ap.add_argument("--iters", type=int, default=3 if SMOKE else 10)
    ap.add_argument("--repeats", type=int, default=1 if SMOKE else 3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-deploy-")
    print(f"bench_deploy: backend {args.backend or 'default'}, "
          f"{'smoke sizes' if SMOKE else 'full sizes'}, {os.cpu_count()} CPUs; work dir {work}")
    rows = []
    for name, make, shape in model_specs():
        hb.random.seed(0)
        net = make()
        net.initialize(init.Xavier())
        net.hybridize(backend=args.backend)
        x = hb.array(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        net(x).wait_to_read()
        path = os.path.join(work, name)
        t0 = time.perf_counter()
        net.export(path, example_inputs=(x,))
        export_s = time.perf_counter() - t0
        x_path = os.path.join(work, f"{name}_x.npy")
        np.save(x_path, x.asnumpy())
        cache = tempfile.mkdtemp(prefix="cache-", dir=work)
        cold = fresh_process(path, args.backend, x_path, cache)
        warm = fresh_process(path, args.backend, x_path, cache)
        b = bench_artifact(path, None, args.iters, args.repeats, args.backend)
        ref = in_process_latency(net, x, args.iters, args.repeats)
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        rows.append((name, shape, export_s, size, cold, warm, b, ref))
    print()
    print(f"{'model':<9} {'input':<16} {'export':>8} {'size':>9} | {'import':>7} "
          f"{'load':>7} {'1st call':>9} {'2nd call':>9} | warm: {'load':>7} {'1st call':>9} "
          f"{'reload':>7}")
    for name, shape, export_s, size, cold, warm, b, ref in rows:
        print(f"{name:<9} {str(list(shape)):<16} {export_s * 1e3:7.0f}ms {size / 2**20:7.2f}MB"
              f" | {cold['import'] * 1e3:5.0f}ms {cold['load'] * 1e3:5.0f}ms "
              f"{cold['first_call'] * 1e3:7.1f}ms {cold['second_call'] * 1e3:7.1f}ms | "
              f"      {warm['load'] * 1e3:5.0f}ms {warm['first_call'] * 1e3:7.1f}ms "
              f"{warm['reload_in_process'] * 1e3:5.0f}ms")
    print()
    print(f"{'model':<9} {'backend':<10} {'batch':>5} {'latency':>10} {'throughput':>14} "
          f"{'hybridized':>11} {'ratio':>6}")
    for name, shape, export_s, size, cold, warm, b, ref in rows:
        print(f"{name:<9} {b['backend']:<10} {b['batch_size']:>5} "
              f"{b['latency_s'] * 1e3:8.2f}ms {b['throughput_per_s']:10.1f}/s "
              f"{ref * 1e3:9.2f}ms {b['latency_s'] / ref:6.2f}")
    print("\nratio: deployed latency / in-process hybridized latency (same backend, same run)")
    print(torch_note())


if __name__ == "__main__":
    main()
