"""The GPU check's report: ``gpu_check.json`` from the steps of benchmarks/gpu_check.sh.

    python benchmarks/gpu_report.py --out gpu_check.json --bench bench.json \
        --junit gpu_marked=junit_gpu.xml --junit gpu_file=junit_file.xml \
        --step tests_gpu_marked=0:41.2 --nvidia-smi "NVIDIA H100 80GB HBM3, 580.159.04, ..."

Reads what the steps left (JUnit XML of each pytest run, bench_gpu.py's JSON; a missing file
is reported as missing, never as a pass), writes one JSON (device, date, tests passed/failed,
every figure, targets_met, each step's exit status and seconds) and prints the figures'
table. Imports nothing of the project, so it reports even when the project does not import.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import xml.etree.ElementTree as ET

VARIANTS = ("hybrid eager", "hybrid cuda", "hybrid cuda +loss", "torch eager", "torch.compile ro",
            "jax jit")


def junit_counts(path: str) -> dict:
    """passed / failed / errors / skipped of one pytest --junitxml file."""
    if not os.path.exists(path):
        return {"missing": f"{path} was not written (the run died or timed out first)"}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"missing": f"{path} is not valid XML: {exc}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites)
             for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites
              for c in s.iter("testcase") if c.find("failure") is not None
              or c.find("error") is not None]
    return {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            "failed": total["failures"], "errors": total["errors"],
            "skipped": total["skipped"], "failed_tests": failed[:50]}


def table(figures: dict) -> str:
    """The figures as a workload x variant table (skipped variants listed with why)."""
    workloads = []
    for key in figures:
        w = key.split(" | ")[0]
        if w not in workloads:
            workloads.append(w)
    wide = max([28] + [len(w) for w in workloads])
    head = f"{'workload':{wide}s}" + "".join(f"{v:>18s}" for v in VARIANTS) + "  unit"
    lines = [head, "-" * len(head)]
    for w in workloads:
        unit, cells = "", []
        for v in VARIANTS:
            row = figures.get(f"{w} | {v}")
            if row is None:
                cells.append(f"{'':>18s}")
            elif "value" in row:
                unit = row["unit"]
                cells.append(f"{row['value']:18.3f}")
            else:
                cells.append(f"{'skipped':>18s}")
        extra = [f"{k.split(' | ')[1]} {r['value']} {r['unit']}" for k, r in figures.items()
                 if k.startswith(w + " | ") and k.split(" | ")[1] not in VARIANTS
                 and "value" in r]
        lines.append(f"{w:{wide}s}" + "".join(cells) + f"  {unit}" +
                     (f"   ({'; '.join(extra)})" if extra else ""))
    skipped = [f"  {k}: {r['skipped']}" for k, r in figures.items() if "skipped" in r]
    if skipped:
        lines += ["skipped:"] + skipped
    return "\n".join(lines)


def _pairs(items, what):
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"gpu_report: --{what} takes NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", help="bench_gpu.py's --json file")
    ap.add_argument("--junit", action="append", help="NAME=PATH of a pytest --junitxml file")
    ap.add_argument("--step", action="append", help="NAME=RC:SECONDS of a step of the check")
    ap.add_argument("--nvidia-smi", default="", help="nvidia-smi's line for the GPU")
    ap.add_argument("--note", action="append", help="NAME=TEXT, kept as given")
    args = ap.parse_args(argv)

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": {"nvidia_smi": args.nvidia_smi or "not available"}}
    bench = None
    if args.bench and os.path.exists(args.bench):
        with open(args.bench, encoding="utf-8") as f:
            bench = json.load(f)
        report["device"].update(bench.get("device", {}))
    report["emulated"] = bool(bench and bench.get("emulated"))
    report["tests"] = {name: junit_counts(path)
                       for name, path in _pairs(args.junit, "junit").items()}
    steps = {}
    for name, value in _pairs(args.step, "step").items():
        rc, _, seconds = value.partition(":")
        steps[name] = {"rc": int(rc), "seconds": float(seconds or 0),
                       "timed_out": int(rc) in (124, 137)}
    report["steps"] = steps
    report["notes"] = _pairs(args.note, "note")
    if bench is None:
        report["figures"] = {}
        report["targets_met"] = {"why": f"no benchmark results ({args.bench} missing)"}
    else:
        for key in ("cuda_backend", "sizes", "figures", "targets_met", "smoke", "seconds"):
            report[key] = bench.get(key)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, args.out)

    if report["emulated"]:
        print("EMULATED GPU: NOT GPU figures (the plumbing of the check, on the CPU)")
    print(f"device: {report['device'].get('name', report['device']['nvidia_smi'])}")
    for name, counts in report["tests"].items():
        print(f"tests {name}: " + (counts["missing"] if "missing" in counts else
                                    f"{counts['passed']} passed, {counts['failed']} failed, "
                                    f"{counts['errors']} errors, {counts['skipped']} skipped"))
    for name, s in steps.items():
        print(f"step {name}: rc {s['rc']}{' (timed out)' if s['timed_out'] else ''}, "
              f"{s['seconds']:.0f} s")
    print(table(report["figures"] or {}))
    print("targets_met:", json.dumps(report["targets_met"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
