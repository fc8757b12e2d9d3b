"""The ``hybrid`` command: look into, run and time deployment artifacts; launch jobs.

    hybrid inspect ARTIFACT [--json]
    hybrid run ARTIFACT --input x.npy [--input ...] [--output y.npy ...]
    hybrid bench ARTIFACT [--batch-size N] [--iters N] [--repeats N]
    hybrid sysinfo
    hybrid launch -n N [--hosts H1:S1,H2:S2] [...] SCRIPT [SCRIPT ARGS...]

Also ``python -m hybrid ...``. Exit status: 0 on success, 2 for bad usage or a refused
artifact (the reason on stderr, no traceback). Inputs are read with
``numpy.load(allow_pickle=False)``. ``hybrid launch`` is :func:`hybrid.launch.launch_main`:
everything after the script path goes to the script untouched, and the exit status is the
job's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np


class UsageError(Exception):
    """Bad arguments or inputs: printed on stderr, exit status 2."""


# ---------------------------------------------------------------- helpers
def _load(args):
    import hybrid as hb  # noqa: PLC0415
    return hb.load(args.artifact, backend=getattr(args, "backend", None))


def _fmt_spec(shape, dtype, dynamic=False) -> str:
    dims = [str(d) for d in shape]
    if dynamic and dims:
        dims[0] = "N"
    return f"{dtype}[{', '.join(dims)}]"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _structure(t) -> str:
    """A treedef as Python-like text: arrays are '*'."""
    kind = t[0]
    if kind == "a":
        return "*"
    if kind == "t":
        inner = ", ".join(_structure(x) for x in t[1])
        return f"({inner}{',' if len(t[1]) == 1 else ''})"
    if kind == "l":
        return "[" + ", ".join(_structure(x) for x in t[1]) + "]"
    if kind == "d":
        return "{" + ", ".join(f"{k!r}: {_structure(x)}" for k, x in zip(t[1], t[2])) + "}"
    return repr(t[1])


def _call_structure(t) -> str:
    """The (args, kwargs) treedef of a call as a signature: ``(*, {'a': *}, scale=*)``."""
    if t[0] == "t" and len(t[1]) == 2 and t[1][0][0] == "t" and t[1][1][0] == "d":
        (_, args), (_, keys, vals) = t[1]
        parts = [_structure(a) for a in args] + [f"{k}={_structure(v)}"
                                                 for k, v in zip(keys, vals)]
        return "(" + ", ".join(parts) + ")"
    return _structure(t)


def _batch_dynamic_dims(dep, nid) -> bool:
    """Whether the leading dimension of node ``nid`` follows the batch size."""
    if not dep.dynamic_batch:
        return False
    # Graph.from_json numbers nodes in the order of graph.json's node list, which is what a
    # rule's path indexes
    return any(p[1] == nid and p[2] == "shape" and p[3] == 0 and a != 0
               for p, a, _ in dep._rules)


# ---------------------------------------------------------------- inspect
def inspect_artifact(path, backend=None) -> dict:
    """Everything ``hybrid inspect`` prints, as a dict."""
    import hybrid as hb  # noqa: PLC0415
    from compiler.pipeline import run_passes  # noqa: PLC0415
    dep = hb.load(path, backend=backend)
    g, man = dep.graph, dep.manifest
    params = [g.spec(n) for n in g.params]
    consts = list(g.constants.values())
    counts = {k: v for k, v in sorted(g.op_counts().items())
              if k not in ("input", "param", "const")}
    _, reports = run_passes(g)
    info = {
        "artifact": str(path),
        "format": f"{man['format']} version {man['format_version']}",
        "producer": man.get("producer", "?"),
        "exported_backend": man.get("backend", "?"),
        "target": man.get("target", {}),
        "native_code": False,
        "batch": {"dynamic": dep.dynamic_batch, "exported": dep.batch_size,
                  "reason": man.get("batch", {}).get("reason")},
        "input_structure": _call_structure(dep.in_tree),
        "output_structure": _structure(dep.out_tree),
        "inputs": [{"name": g.node(n)["attrs"].get("name"), "shape": list(g.spec(n).shape),
                    "dtype": g.spec(n).dtype, "batch_dim": _batch_dynamic_dims(dep, n)}
                   for n in g.inputs],
        "outputs": [{"shape": list(g.spec(n).shape), "dtype": g.spec(n).dtype,
                     "batch_dim": _batch_dynamic_dims(dep, n)}
                    for n in g.outputs[:dep.n_outputs]],
        "ops": counts,
        "n_op_nodes": sum(counts.values()),
        "parameters": {"tensors": len(params), "count": sum(math.prod(s.shape) for s in params),
                       "bytes": sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize
                                    for s in params)},
        "constants": {"tensors": len(consts), "bytes": sum(c.nbytes for c in consts)},
        "passes": [{"pass": r["pass"], "summary": r.get("summary", "")} for r in reports],
        "parts": {k: v.get("bytes") for k, v in man["parts"].items()},
    }
    mem = next((r for r in reports if r["pass"] == "memory"), {})
    info["memory_plan"] = {k: mem.get(k) for k in ("arena_bytes", "naive_bytes",
                                                  "peak_live_bytes", "inplace")}
    return info


def cmd_inspect(args) -> int:
    info = inspect_artifact(args.artifact, args.backend)
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    b = info["batch"]
    lines = [f"artifact  {info['artifact']}",
             f"format    {info['format']}, written by {info['producer']} "
             f"(exported with backend {info['exported_backend']})"]
    tgt = info["target"]
    if tgt:
        lines.append(f"target    {tgt.get('triple', tgt.get('machine', '?'))} "
                     f"cpu {tgt.get('cpu', '?')} (informational: no native code shipped; "
                     "kernels are generated on the loading machine)")
    if b["dynamic"]:
        lines.append(f"batch     any batch size N >= 1 (exported at N={b['exported']})")
    else:
        lines.append(f"batch     fixed at {b['exported']}"
                     + (f" ({b['reason']})" if b.get("reason") else ""))
    lines.append(f"inputs    {info['input_structure']}")
    for i, s in enumerate(info["inputs"]):
        lines.append(f"  [{i}] {s['name']}: {_fmt_spec(s['shape'], s['dtype'], s['batch_dim'])}")
    lines.append(f"outputs   {info['output_structure']}")
    for i, s in enumerate(info["outputs"]):
        lines.append(f"  [{i}] {_fmt_spec(s['shape'], s['dtype'], s['batch_dim'])}")
    p = info["parameters"]
    lines.append(f"params    {p['count']:,} values in {p['tensors']} tensors, "
                 f"{_fmt_bytes(p['bytes'])}"
                 + (f"; {info['constants']['tensors']} constant(s), "
                    f"{_fmt_bytes(info['constants']['bytes'])}"
                    if info["constants"]["tensors"] else ""))
    lines.append(f"ops       {info['n_op_nodes']} nodes: "
                 + ", ".join(f"{k}={v}" for k, v in info["ops"].items()))
    lines.append("passes (at the exported batch size):")
    for r in info["passes"]:
        lines.append(f"  {r['pass']:<9} {r['summary']}")
    m = info["memory_plan"]
    if m.get("arena_bytes") is not None:
        lines.append(f"memory    arena {_fmt_bytes(m['arena_bytes'])} (naive "
                     f"{_fmt_bytes(m['naive_bytes'])}, peak live "
                     f"{_fmt_bytes(m['peak_live_bytes'])}, {m['inplace']} in place)")
    lines.append("parts     " + ", ".join(f"{k} ({_fmt_bytes(v)})"
                                          for k, v in info["parts"].items()))
    print("\n".join(lines))
    return 0


# ---------------------------------------------------------------- run
def _read_npy(path):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--input {path}: cannot read a .npy array ({exc})") from None


def cmd_run(args) -> int:
    import hybrid as hb  # noqa: PLC0415
    from .tracing import flatten  # noqa: PLC0415
    dep = _load(args)
    arrays = [_read_npy(p) for p in args.input]
    if len(arrays) != len(dep.graph.inputs):
        raise UsageError(f"the artifact takes {len(dep.graph.inputs)} input(s) "
                         f"({', '.join(str(s) for s in dep.input_specs)}); got {len(arrays)} "
                         "--input")
    leaves = []
    for i, (a, spec) in enumerate(zip(arrays, dep.input_specs)):
        if a.dtype.name != spec.dtype:
            if not args.cast:
                raise UsageError(f"--input {args.input[i]} is {a.dtype.name}, the artifact "
                                 f"wants {spec.dtype} (pass --cast to convert)")
            a = a.astype(spec.dtype)
        leaves.append(hb.array(a, dtype=spec.dtype, device=dep.device))
    from .tracing import unflatten  # noqa: PLC0415
    call_args, call_kwargs = unflatten(dep.in_tree, leaves)
    t0 = time.perf_counter()
    outs, _ = flatten(dep(*call_args, **call_kwargs))
    results = [o.asnumpy() for o in outs]
    dt = time.perf_counter() - t0
    if args.output:
        if len(args.output) == len(results):
            for p, r in zip(args.output, results):
                np.save(p, r, allow_pickle=False)
        elif len(args.output) == 1 and args.output[0].endswith(".npz"):
            np.savez(args.output[0], **{f"out{i}": r for i, r in enumerate(results)})
        else:
            raise UsageError(f"the artifact has {len(results)} outputs: give one --output per "
                             "output, or one .npz path")
    print(f"structure {_structure(dep.out_tree)}; ran in {dt * 1e3:.2f} ms "
          f"(including compilation)")
    for i, r in enumerate(results):
        line = f"output {i}: {r.dtype.name}{list(r.shape)}"
        if args.output:
            where = args.output[i] if len(args.output) == len(results) else \
                f"{args.output[0]}:out{i}"
            line += f" -> {where}"
        print(line)
        if not args.output:
            with np.printoptions(precision=5, threshold=12, edgeitems=3, linewidth=100):
                print("  " + np.array2string(r, prefix="  "))
    return 0


# ---------------------------------------------------------------- bench
def bench_artifact(path, batch_size=None, iters=20, repeats=5, backend=None) -> dict:
    """Load time, first call (compile), per-call latency and throughput (medians)."""
    import hybrid as hb  # noqa: PLC0415
    t0 = time.perf_counter()
    dep = hb.load(path, backend=backend)
    load_s = time.perf_counter() - t0
    n = dep.batch_size if batch_size is None else batch_size
    rng = np.random.default_rng(0)
    leaves = []
    for spec in dep.input_specs:
        shape = ((n,) + tuple(spec.shape[1:])) if spec.ndim else ()
        v = rng.standard_normal(shape) if spec.dtype.startswith("float") else np.zeros(shape)
        leaves.append(hb.array(np.asarray(v, dtype=spec.dtype), dtype=spec.dtype,
                               device=dep.device))
    from .tracing import unflatten  # noqa: PLC0415
    a, kw = unflatten(dep.in_tree, leaves)
    hb.waitall()
    t0 = time.perf_counter()
    dep(*a, **kw)
    hb.waitall()
    first = time.perf_counter() - t0
    lat, thr = [], []
    for _ in range(repeats):
        samples = []
        for _ in range(iters):  # latency: one call, then wait for it
            t0 = time.perf_counter()
            dep(*a, **kw)
            hb.waitall()
            samples.append(time.perf_counter() - t0)
        lat.append(float(np.median(samples)))
        t0 = time.perf_counter()  # throughput: calls queued back to back, one wait
        for _ in range(iters):
            dep(*a, **kw)
        hb.waitall()
        thr.append(n * iters / (time.perf_counter() - t0))
    return {"artifact": str(path), "backend": dep.backend, "batch_size": n, "iters": iters,
            "repeats": repeats, "load_s": load_s, "first_call_s": first,
            "latency_s": float(np.median(lat)), "latency_min_s": float(np.min(lat)),
            "throughput_per_s": float(np.median(thr))}


def cmd_bench(args) -> int:
    if args.iters < 1 or args.repeats < 1 or (args.batch_size is not None and
                                              args.batch_size < 1):
        raise UsageError("--iters, --repeats and --batch-size must be at least 1")
    r = bench_artifact(args.artifact, args.batch_size, args.iters, args.repeats, args.backend)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['artifact']}: backend {r['backend']}, batch size {r['batch_size']}")
    print(f"  load            {r['load_s'] * 1e3:9.2f} ms")
    print(f"  first call      {r['first_call_s'] * 1e3:9.2f} ms (compiles this shape)")
    print(f"  latency         {r['latency_s'] * 1e3:9.3f} ms per call (median of {r['repeats']} "
          f"x {r['iters']}; min {r['latency_min_s'] * 1e3:.3f} ms)")
    print(f"  throughput      {r['throughput_per_s']:9.1f} samples/s (calls queued back to back, "
          "median)")
    return 0


# ---------------------------------------------------------------- sysinfo
def sysinfo() -> dict:
    import hybrid as hb  # noqa: PLC0415
    from runtime import config  # noqa: PLC0415
    info = {"hybrid": hb.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "machine": platform.machine(),
            "numpy": np.__version__, "cpu_count": os.cpu_count()}
    for mod in ("llvmlite", "networkx", "safetensors", "scipy", "cupy", "onnx", "onnxruntime",
                "torch"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", "installed")
        except Exception:  # noqa: BLE001 - absent or broken optional package
            info[mod] = None
    try:
        import llvmlite.binding as llvm  # noqa: PLC0415
        info["target_triple"] = llvm.get_process_triple()
        info["host_cpu"] = llvm.get_host_cpu_name()
    except Exception:  # noqa: BLE001
        pass
    try:
        from .tracing import _llvm_available  # noqa: PLC0415
        info["default_backend"] = "llvm" if _llvm_available() else "reference"
    except Exception:  # noqa: BLE001
        pass
    try:
        info["num_gpus"] = hb.num_gpus()
    except Exception as exc:  # noqa: BLE001 - a broken CUDA install is reported, not raised
        info["num_gpus"] = f"unknown ({exc})"
    info["flags"] = config.describe()
    return info


def cmd_sysinfo(args) -> int:
    info = sysinfo()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    flags = info.pop("flags")
    width = max(len(k) for k in info)
    for k, v in info.items():
        print(f"{k:<{width}}  {v if v is not None else 'not installed'}")
    print("flags:")
    print("  " + flags.replace("\n", "\n  "))
    return 0


# ---------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybrid", description="Inspect, run and time hybrid "
                                "deployment artifacts (written by net.export()); launch "
                                "scripts on several processes over MPI.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def backend_opt(sp):
        sp.add_argument("--backend", choices=("reference", "llvm", "cuda"), default=None,
                        help="code generator (default: as hb.load chooses)")

    sp = sub.add_parser("inspect", help="signatures, ops, sizes, memory plan, target")
    sp.add_argument("artifact")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    backend_opt(sp)
    sp.set_defaults(fn=cmd_inspect)

    sp = sub.add_parser("run", help="run on inputs from .npy files")
    sp.add_argument("artifact")
    sp.add_argument("--input", "-i", action="append", default=[], metavar="X.npy",
                    help="one per array input, in order")
    sp.add_argument("--output", "-o", action="append", default=[], metavar="Y.npy",
                    help="one per output (or one .npz for all); without it, print a preview")
    sp.add_argument("--cast", action="store_true", help="convert inputs to the wanted dtype")
    backend_opt(sp)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("bench", help="per-call latency and throughput")
    sp.add_argument("artifact")
    sp.add_argument("--batch-size", "-b", type=int, default=None,
                    help="batch size (default: the exported one)")
    sp.add_argument("--iters", "-n", type=int, default=20, help="calls per repeat")
    sp.add_argument("--repeats", "-r", type=int, default=5, help="repeats (median reported)")
    sp.add_argument("--json", action="store_true")
    backend_opt(sp)
    sp.set_defaults(fn=cmd_bench)

    sp = sub.add_parser("sysinfo", help="versions, CPUs, flags, GPUs")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_sysinfo)

    # listed for `hybrid --help`; main() hands `hybrid launch ...` to hybrid.launch before
    # this parser sees it, so the script's own arguments pass through untouched
    sp = sub.add_parser("launch", add_help=False,
                        help="run a script on N worker processes over MPI (wraps mpirun; "
                             "hybrid launch --help for its options)")
    sp.add_argument("argv", nargs=argparse.REMAINDER)
    sp.set_defaults(fn=lambda args: cmd_launch(args.argv))
    return p


def cmd_launch(argv) -> int:
    """``hybrid launch ARGS``: :func:`hybrid.launch.launch_main` (its own parser and help)."""
    from .launch import launch_main  # noqa: PLC0415
    return launch_main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # before argparse: `--help` and the script's args are its own
        return cmd_launch(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    from runtime.artifact import ArtifactError  # noqa: PLC0415
    try:
        return args.fn(args)
    except ArtifactError as exc:
        print(f"hybrid {args.command}: artifact refused: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hybrid inspect A | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, ValueError, OSError) as exc:
        print(f"hybrid {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
