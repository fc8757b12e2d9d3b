"""The process-wide thread pool of parallel loops (compiler/codegen/llvm/threadpool.py): every chunk
runs once whatever the thread count, pool threads asleep or awake, callers concurrent (the
busy pool's fallback: threads of their own), and in a forked child (a pool of its own)."""
import os
import threading
import time

import numpy as np
import pytest

from compiler.codegen import Load, Output, ProgramBuilder, call
from compiler.codegen.llvm.emit import PARALLEL_MIN_ELEMENTS, compile_program, run_program

ROWS = 37  # outer extent: uneven chunks for any thread count


def _program(name, scale):
    """y = x * x: a loop big enough to run in parallel, every element checkable."""
    cols = -(-PARALLEL_MIN_ELEMENTS // ROWS)
    pb = ProgramBuilder()
    x, y = pb.input((ROWS, cols)), pb.output((ROWS, cols))
    pb.loop((ROWS, cols), [pb.access(x)],
            [Output(pb.access(y), call("mul", Load(0), Load(0), dtype="float32"))])
    compiled = compile_program(pb.build(), name)
    assert compiled._nthreads is not None, "the loop must be parallel"
    xs = np.random.default_rng(scale).standard_normal((ROWS, cols)).astype(np.float32)
    return compiled, xs, xs * xs


def test_every_chunk_runs_once_for_any_thread_count():
    compiled, x, want = _program("pool_counts", 1)
    for n in (1, 2, 3, 8, 64, 2, 1, 4):
        compiled.set_threads(n)
        for pause in (0, 0, 0.02):  # 20 ms: pool threads stop polling and sleep
            time.sleep(pause)
            (got,) = run_program(compiled, [x])
            np.testing.assert_array_equal(got, want)


def test_concurrent_callers():
    """One caller holds the pool; the others start threads of their own, at the same time."""
    progs = [_program(f"pool_conc{k}", k) for k in range(4)]
    errors = []

    def run(compiled, x, want):
        compiled.set_threads(2)
        try:
            for _ in range(150):
                (got,) = run_program(compiled, [x])
                np.testing.assert_array_equal(got, want)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=p) for p in progs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_pool_of_its_own():
    compiled, x, want = _program("pool_fork", 3)
    compiled.set_threads(2)
    (got,) = run_program(compiled, [x])  # the parent's pool has threads now
    np.testing.assert_array_equal(got, want)
    pid = os.fork()
    if pid == 0:  # the child: no pool threads exist here until it starts its own
        ok = True
        try:
            for _ in range(20):
                (got,) = run_program(compiled, [x])
                ok = ok and bool(np.array_equal(got, want))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
