"""Helpers shared by the chapter-12 examples (not part of the hybrid API).

Each example imports this first: it puts the repository root on ``sys.path`` (so the examples
run from a checkout without ``pip install -e .``), reads the smoke flag, and prints results in
one format. Lines of the form ``  [result] key = value`` are the example's claims; the tests
(tests/test_examples.py) read them. Measured speeds are printed, never asserted.
"""
from __future__ import annotations

import os
import statistics
import sys
import textwrap
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import hybrid as hb  # noqa: E402

SMOKE = bool(hb.config.get("HYBRID_SMOKE"))


def smoke(full, small):
    """``small`` under HYBRID_SMOKE=1 (CI), else ``full``."""
    return small if SMOKE else full


def load() -> str:
    a, b, c = os.getloadavg()
    return f"load average {a:.2f} {b:.2f} {c:.2f} on {os.cpu_count()} CPU(s)"


def header(section: str, title: str, doc: str | None = None):
    print("=" * 78)
    print(f"Dive into Deep Learning {section} -- {title}, on hybrid {hb.__version__}")
    print(f"{load()}{'; HYBRID_SMOKE=1: reduced sizes' if SMOKE else ''}")
    if SMOKE:
        print("(smoke mode shrinks every size so the script runs in seconds; run without "
              "HYBRID_SMOKE for the book's sizes)")
    print("=" * 78)
    if doc:
        print(doc.strip())


def section(title: str):
    print(f"\n--- {title} " + "-" * max(0, 73 - len(title)))


def result(key: str, value):
    """A claim of the example, in a fixed format the tests read."""
    if isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = str(value)
    print(f"  [result] {key} = {text}", flush=True)


def note(text: str):
    for line in text.strip().splitlines():
        for part in textwrap.wrap(line, 94) or [""]:
            print(f"  {part}")


def skip(what: str, why: str):
    print(f"  SKIPPED {what}: {why}")
    result("skipped", what)


def missing(module: str, attr: str | None = None):
    """The attribute (or module) if this checkout has it, else None (with a message)."""
    try:
        mod = __import__(module, fromlist=["_"])
    except ImportError as exc:
        print(f"  NOTE: {module} is not available in this checkout ({exc}); "
              "the part that needs it is skipped")
        return None
    if attr is None:
        return mod
    obj = getattr(mod, attr, None)
    if obj is None:
        print(f"  NOTE: {module}.{attr} is not available in this checkout; "
              "the part that needs it is skipped")
    return obj


def timed(fn, reps: int = 3, warmup: int = 1, sync=None):
    """Median and fastest seconds of ``fn()`` (then ``sync()``) over ``reps`` runs."""
    sync = sync or hb.waitall
    for _ in range(warmup):
        fn()
        sync()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), min(runs)


def footer():
    print(f"\n{load()} (at end)")
