"""A process-wide pool of threads for the parallel loops of generated code.

``i32 hybrid_pool_run(void (*task)(ptr ctx, i64 chunk), ptr ctx, i64 nchunks, i64 nthreads)``
runs ``task(ctx, c)`` for every c in [0, nchunks): the caller and up to nthreads - 1 pool
threads claim chunks from one shared counter, so a pool thread that is late (asleep, or its
core busy with another process) only leaves more chunks to the others instead of holding
everyone at a join. Returns 0 and runs nothing when another caller holds the pool (the
parallel driver then starts threads of its own, as before the pool). Programs reach it through
their ``<symbol>.pool`` pointer, which CompiledProgram sets: the pool is compiled once, when
the first threaded program loads.

Why: starting and joining threads costs ~50 us per parallel loop on a 2-core VM, and LeNet's
training step has ~14 such loops. Pool threads poll for the next job (``sched_yield``, which
gives the core away when something else wants it) for ~SPIN_YIELDS rounds, then sleep on a
condition variable; the next caller wakes them.

The job is one 64-bit word, ``state = gen << 32 | n << 16 | next`` (job number, chunk count,
first unclaimed chunk); a thread claims chunk ``next`` by compare-and-swap of the whole word,
so a thread that saw an older job can never take a chunk of a newer one. ``task``, ``ctx`` and
``done`` are written before the word is published and stay put until every chunk is done.
After a fork the child starts over with no pool threads (the pid is checked per call).
"""
from __future__ import annotations


POOL_VERSION = 1
SYMBOL = "hybrid_pool_run"
MAX_CHUNKS = 0xFFFF  # chunks of one job (16 bits of the state word)
MAX_HELPERS = 63
SPIN_YIELDS = 2000  # polls (sched_yield) before a pool thread sleeps: ~0.5-1 ms
SYNC_BYTES = 128  # room for a pthread mutex or condition variable on any platform we run on

_state: dict = {}


def address() -> int:
    """The pool's entry point, compiled (or loaded from the disk cache) on first use."""
    addr = _state.get("addr")
    if addr is None:
        from runtime import native  # noqa: PLC0415

        def emit(triple, data_layout):  # only on a compile (threadpool_ir.py)
            from .threadpool_ir import emit_pool_ir  # noqa: PLC0415
            return emit_pool_ir(triple, data_layout)
        mod = native.builtin_module(
            "hybrid_pool", emit, f"hybrid_pool/{POOL_VERSION}/{SPIN_YIELDS}/{MAX_HELPERS}/"
                                 f"{MAX_CHUNKS}", [SYMBOL], quick=True)
        _state["module"] = mod
        addr = _state["addr"] = mod.address(SYMBOL)
    return addr


def native_module():
    """The pool's runtime.native module, once loaded (None before)."""
    return _state.get("module")
