"""``python -m benchmarks``: run every benchmarks/bench_*.py and print one ratios table.

    python -m benchmarks                  # full sizes (minutes; each script has a timeout)
    python -m benchmarks --smoke          # HYBRID_SMOKE=1: tiny sizes (what CI runs)
    python -m benchmarks --only eager llvm --timeout 300 --json results.json
    python -m benchmarks --list

Every script runs in its own subprocess (a fresh interpreter, so one script's threads, caches
and BLAS settings never touch another's), with a timeout; a script that fails, times out or
is missing is reported and the suite goes on. See benchmarks/__init__.py for how a script's
figures reach the table. Exit status: 0 when every script that ran succeeded, 1 otherwise
(``--keep-going-status`` always exits 0).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS_ENV = "HYBRID_BENCH_RESULTS"

TIME_UNITS = ("us", "µs", "ms", "s", "ns", "sec", "min")
RATE_HINTS = ("/s", "gflop", "gb/s", "samples", "per s", "throughput")


# ---------------------------------------------------------------- discovery and running
def discover(directory: Path, only=None) -> list:
    scripts = sorted(directory.glob("bench_*.py"))
    if only:
        scripts = [s for s in scripts if any(o in s.stem for o in only)]
    return scripts


def _kill_tree(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass


def run_script(script: Path, timeout: float, smoke: bool, extra_env=None) -> dict:
    """Run one script; returns its status, output, seconds and recorded rows."""
    fd, results = tempfile.mkstemp(prefix=f"bench-{script.stem}-", suffix=".jsonl")
    os.close(fd)
    env = dict(os.environ)
    env[RESULTS_ENV] = results
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if smoke:
        env["HYBRID_SMOKE"] = "1"
    env.update(extra_env or {})
    out = {"script": script.name, "status": "ok", "returncode": None, "seconds": 0.0,
           "output": "", "rows": []}
    if not script.exists():
        out["status"] = "missing"
        return out
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=str(ROOT), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    except OSError as exc:
        out.update(status="failed", output=f"could not start: {exc}")
        return out
    try:
        text, _ = proc.communicate(timeout=timeout)
        out["returncode"] = proc.returncode
        if proc.returncode != 0:
            out["status"] = "failed"
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        try:
            text, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            text = ""
        out["status"] = "timeout"
    out["seconds"] = time.perf_counter() - t0
    out["output"] = text or ""
    try:
        with open(results, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if {"workload", "variant", "value", "unit"} <= set(row):
                    out["rows"].append(row)
    finally:
        try:
            os.unlink(results)
        except OSError:
            pass
    if not out["rows"]:
        out["rows"] = parse_table(out["output"])
    out["quotes"] = parse_ratio_lines(out["output"])
    return out


# ---------------------------------------------------------------- parsing printed output
_HEADER = re.compile(r"^\s*workload\s+variant\s+value\s+unit\s*$", re.I)
_NUM = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def parse_table(text: str) -> list:
    """Rows of a printed 'workload  variant  value  unit' table (columns: 2+ spaces)."""
    rows = []
    active = False
    for line in text.splitlines():
        if _HEADER.match(line):
            active = True
            continue
        if not active:
            continue
        if not line.strip():
            active = False
            continue
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) < 3:
            continue
        value_idx = next((i for i in range(len(cols) - 1, 0, -1)
                          if _NUM.match(cols[i].split()[0] if cols[i].split() else "")), None)
        if value_idx is None or value_idx < 2 - (len(cols) == 3):
            continue
        head = cols[:value_idx]
        parts = cols[value_idx].split(None, 1)
        value = float(parts[0])
        unit = " ".join(([parts[1]] if len(parts) > 1 else []) + cols[value_idx + 1:])
        if len(head) == 1:
            head = [head[0], ""]
        rows.append({"workload": head[0], "variant": " ".join(head[1:]), "value": value,
                     "unit": unit.strip()})
    return rows


_RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b|\bratio\s+\d+(?:\.\d+)?")


def parse_ratio_lines(text: str, limit: int = 16) -> list:
    """Lines of the output that state a ratio ('... 4.82x'), and 'ratio' columns."""
    quotes = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith(("Traceback", "File ")):
            continue
        if _RATIO.search(s) and len(s) < 160:
            quotes.append(re.sub(r"\s{2,}", "  ", s))
        cols = s.split()
        if ("ratio" in [c.lower() for c in cols] and len(cols) >= 3
                and not any(_NUM.match(c.rstrip("x")) for c in cols)):  # a table header
            quotes.append("table: " + " ".join(cols))
            for row in lines[i + 1:]:
                if len(row.split()) != len(cols):
                    break
                quotes.append("       " + " ".join(row.split())[:100])
    return quotes[:limit]


# ---------------------------------------------------------------- ratios
def is_rate(unit: str) -> bool:
    u = unit.lower()
    return any(h in u for h in RATE_HINTS) and not u.startswith(("us/", "µs/", "ms/", "s/"))


def _is_ours(variant: str) -> bool:
    return variant.lower().startswith("hybrid")


def _ours_rank(variant: str) -> int:
    v = variant.lower()
    for i, key in enumerate(("llvm", "hybridized", "compiled", "cuda", "reference")):
        if key in v:
            return i
    return 9


def ratios(rows: list) -> list:
    """One line per (workload, unit): the best hybrid variant against each other variant.

    speed-up > 1 means hybrid is faster (a time per item smaller, or a rate larger)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["workload"], r["unit"]), []).append(r)
    out = []
    for (workload, unit), rs in groups.items():
        ours = sorted((r for r in rs if _is_ours(r["variant"])),
                      key=lambda r: (_ours_rank(r["variant"]), r["value"]))
        if not ours:
            out.append({"workload": workload, "unit": unit, "hybrid": None,
                        "value": None, "peers": [(r["variant"], r["value"], None) for r in rs]})
            continue
        h = ours[0]
        peers = []
        for r in rs:
            if r is h:
                continue
            if h["value"] <= 0 or r["value"] <= 0:
                sp = None
            elif is_rate(unit):
                sp = h["value"] / r["value"]
            else:
                sp = r["value"] / h["value"]
            peers.append((r["variant"], r["value"], sp))
        out.append({"workload": workload, "unit": unit, "hybrid": h["variant"],
                    "value": h["value"], "peers": peers})
    return out


def _fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def print_report(results: list, load_start, load_end, smoke: bool, file=sys.stdout):
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p("\n" + "=" * 100)
    p(f"hybrid benchmark suite{' (HYBRID_SMOKE=1: tiny sizes, not for quoting)' if smoke else ''}")
    p(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python "
      f"{platform.python_version()}; load average {load_start[0]:.2f} at start, "
      f"{load_end[0]:.2f} at end (a loaded, shared machine: compare ratios, not times)")
    peers = [name for name, mod in (("torch", "torch"), ("JAX", "jax"), ("MXNet", "mxnet"))
             if importlib.util.find_spec(mod) is not None]
    p(f"peers importable here: {', '.join(peers) or 'none (NumPy only)'}")
    p("=" * 100)
    p(f"{'script':22s}{'status':>10s}{'seconds':>9s}{'figures':>9s}")
    for r in results:
        extra = ""
        if r["status"] == "failed":
            tail = [x for x in r["output"].strip().splitlines() if x.strip()][-1:]
            extra = f"  exit {r['returncode']}: {tail[0][:60] if tail else ''}"
        p(f"{r['script']:22s}{r['status']:>10s}{r['seconds']:9.1f}{len(r['rows']):9d}{extra}")
    table = [(r["script"], line) for r in results for line in ratios(r["rows"])]
    if table:
        p("\nratios: hybrid's figure and its speed-up over each other variant "
          "(> 1: hybrid faster; same workload, same run)")
        p(f"{'script':18s}{'workload':30s}{'hybrid variant':24s}{'value':>10s} {'unit':10s} "
          "speed-up vs")
        for script, t in table:
            vs = ", ".join(f"{name} {_fmt(sp)}x" if sp is not None else f"{name} {_fmt(v)}"
                           for name, v, sp in t["peers"]) or "-"
            p(f"{script[:17]:18s}{t['workload'][:29]:30s}{(t['hybrid'] or '(no hybrid row)')[:23]:24s}"
              f"{_fmt(t['value']):>10s} {t['unit'][:10]:10s} {vs}")
    quotes = [(r["script"], q) for r in results for q in r.get("quotes", [])
              if not r["rows"]]
    if quotes:
        p("\nratios the scripts printed (quoted; scripts without a results table):")
        for script, q in quotes:
            p(f"  {script[:20]:20s} {q}")
    p("")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="HYBRID_SMOKE=1: tiny sizes")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per script")
    ap.add_argument("--only", nargs="*", default=None, help="run scripts whose name contains these")
    ap.add_argument("--dir", default=str(HERE), help="where the bench_*.py scripts are")
    ap.add_argument("--json", default=None, help="also write every result to this JSON file")
    ap.add_argument("--list", action="store_true", help="list the scripts and exit")
    ap.add_argument("--show-output", action="store_true", help="print each script's output")
    ap.add_argument("--keep-going-status", action="store_true",
                    help="exit 0 even when a script failed or timed out")
    args = ap.parse_args(argv)
    scripts = discover(Path(args.dir), args.only)
    if args.list:
        for s in scripts:
            print(s.name)
        return 0
    if not scripts:
        print(f"no bench_*.py scripts in {args.dir}"
              + (f" matching {args.only}" if args.only else ""))
        return 0
    load_start = os.getloadavg()
    results = []
    for s in scripts:
        print(f"[benchmarks] running {s.name} (timeout {args.timeout:.0f} s) ...", flush=True)
        r = run_script(s, args.timeout, args.smoke)
        print(f"[benchmarks]   {r['status']} in {r['seconds']:.1f} s, {len(r['rows'])} figure(s)",
              flush=True)
        if args.show_output or r["status"] != "ok":
            tail = r["output"] if args.show_output else "\n".join(r["output"].splitlines()[-15:])
            print("\n".join("    | " + x for x in tail.splitlines()), flush=True)
        results.append(r)
    load_end = os.getloadavg()
    print_report(results, load_start, load_end, args.smoke)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"load_start": load_start, "load_end": load_end, "smoke": args.smoke,
                       "results": [{k: v for k, v in r.items() if k != "output"}
                                   for r in results]}, f, indent=1)
    bad = [r for r in results if r["status"] != "ok"]
    return 0 if (not bad or args.keep_going_status) else 1


if __name__ == "__main__":
    sys.exit(main())
