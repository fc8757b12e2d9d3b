"""Test set-up: the graph verifier runs between passes; a private compile cache per session."""
import os
import tempfile

os.environ.setdefault("HYBRID_CHECK", "1")
os.environ.setdefault("HYBRID_CACHE_DIR", tempfile.mkdtemp(prefix="hybrid-test-cache-"))
os.environ.setdefault("HYBRID_WAIT_TIMEOUT", "120")


import contextlib  # noqa: E402


@contextlib.contextmanager
def fresh_process_threads():
    """BLAS and native kernels with the threads a fresh process uses (one CPU device).

    Float sums in BLAS depend on the thread count, and earlier tests may have used cpu(1),
    which halves each device's share: outputs compared bitwise against a fresh process must be
    computed with the same share.
    """
    from runtime import engine
    from runtime.device import cpu_count
    prev = engine.threads_per_cpu_device()
    engine._share_cores(1)
    try:
        yield
    finally:
        engine._share_cores(max(1, cpu_count() // max(1, prev)))
