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


import threading  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def dispatch_paths(monkeypatch):
    """Counts the calls of dispatch.Caller by where they ran: 'direct' (in the caller) or
    'engine' (queued through dispatch._push)."""
    from hybrid import dispatch
    hits = {"direct": 0, "engine": 0}
    real_call, real_push = dispatch.Caller.__call__, dispatch._push
    pushed = []

    def push(*args, **kwargs):
        pushed.append(1)
        return real_push(*args, **kwargs)

    def call(self, *args):
        before = len(pushed)
        out = real_call(self, *args)
        hits["engine" if len(pushed) > before else "direct"] += 1
        return out
    monkeypatch.setattr(dispatch, "_push", push)
    monkeypatch.setattr(dispatch.Caller, "__call__", call)
    return hits


def mismatches_in_threads(fn, inputs, wants, calls, rtol, atol):
    """One thread per input calls ``fn`` on it ``calls`` times, all at once; returns, per
    thread, how many results differed from its ``wants`` entry."""
    import numpy as np
    bad = [0] * len(inputs)

    def work(k):
        for _ in range(calls):
            if not np.allclose(fn(inputs[k]).asnumpy(), wants[k], rtol=rtol, atol=atol):
                bad[k] += 1
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return bad


@pytest.fixture
def emulated_gpu():
    """gpu(0) of one emulated GPU (HYBRID_GPU_EMULATE=1) for this test, restored after; on a
    machine whose environment already sets the flag, its GPUs."""
    from runtime import config
    from runtime.device import gpu
    old = config.set_flag("HYBRID_GPU_EMULATE", max(1, config.get("HYBRID_GPU_EMULATE") or 0))
    try:
        yield gpu(0)
    finally:
        config.set_flag("HYBRID_GPU_EMULATE", old)
