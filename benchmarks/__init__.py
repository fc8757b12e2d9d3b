"""The project's benchmarks: ``python -m benchmarks`` runs every ``benchmarks/bench_*.py``.

Each script is a standalone program (``python benchmarks/bench_x.py``; ``HYBRID_SMOKE=1`` for
tiny sizes) that prints its figures for people. The suite (``benchmarks/__main__.py``) runs
each in its own subprocess with a timeout, tolerates scripts that fail, time out or are not
there, and prints one ratios table.

How a script's figures reach the table -- the first that applies:

1. **records** (preferred): the script calls :func:`record` for each figure. Outside the
   suite it is a no-op; under the suite (``HYBRID_BENCH_RESULTS`` names a file) each call
   appends one JSON line ``{"workload", "variant", "value", "unit"}``::

       from benchmarks import record
       record("A. MLP b1", "hybrid llvm", 41.2, "us/call")
       record("A. MLP b1", "numpy", 24.9, "us/call")

   Variants whose name starts with ``hybrid`` are ours; the table compares the best hybrid
   variant (``llvm`` / ``hybridized`` / ``compiled`` preferred) with every other variant of
   the same workload and unit (NumPy, torch, JAX, eager, ...).
2. **a results table** in the output: a header line ``workload  variant  value  unit`` and
   rows whose columns are separated by two or more spaces (benchmarks/bench_llvm.py's format).
3. **quoted ratios**: lines of the output that state a ratio (``... 4.82x``, ``ratio 8.3x``,
   or a ``ratio`` column of a table) are quoted as they are.
"""
from __future__ import annotations

import json
import os
import threading

__all__ = ["record", "RESULTS_ENV"]

RESULTS_ENV = "HYBRID_BENCH_RESULTS"
_lock = threading.Lock()


def record(workload: str, variant: str, value: float, unit: str, **extra) -> None:
    """Report one figure to ``python -m benchmarks`` (a no-op when run alone).

    unit: a time per item (``us/call``, ``ms/step``, ``ms``, ``s``) -- lower is better -- or
    a rate (``GB/s``, ``GFLOP/s``, ``samples/s``) -- higher is better.
    """
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    row = {"workload": str(workload), "variant": str(variant), "value": float(value),
           "unit": str(unit)}
    row.update({k: v for k, v in extra.items() if isinstance(v, (str, int, float, bool))})
    with _lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
