"""``with hb.Benchmark("name"):`` — time a block after the back end has caught up."""
from __future__ import annotations

import time

from runtime.engine import get_engine


class Benchmark:
    """Waits for every queued op before reading the clock, at entry and at exit (the book's
    d2l.Benchmark, made correct for an asynchronous engine)."""

    def __init__(self, description: str = "Done", quiet: bool = False):
        self.description = description
        self.quiet = quiet
        self.elapsed = None

    def __enter__(self):
        get_engine().wait_all()
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            get_engine().wait_all()
        self.elapsed = time.perf_counter() - self._start
        if not self.quiet and exc_type is None:
            print(f"{self.description}: {self.elapsed:.4f} sec")
        return False
