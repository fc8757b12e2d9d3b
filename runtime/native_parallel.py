"""A module's shards compiled on several cores at once, each worker in an LLVM context of its own.

llvmlite runs every LLVM call under one process-wide lock, which is what keeps users of
LLVM's *global* context (and of objects shared between threads) safe; LLVM itself compiles
different contexts on different threads concurrently (that is what a context is for). A
worker thread here parses its shards into a context of its own and optimizes them and turns
them into object files with a target machine of its own; nothing else touches those, so the
worker may skip llvmlite's lock (``_ThreadPrivateLock``); every other LLVM call in the
process (MCJIT loading, the global context) still takes it. The shards' objects are joined
by the system linker into one relocatable object (``ld -r``), the object that the one-module
path makes: the same functions, each optimized and compiled from the same IR (shards are
optimized one by one in both paths), so the cache entry, loading and shared libraries are
unchanged.

Where llvmlite's lock is not the expected object, or there is no ``ld``, or one core, the
caller compiles the shards one at a time under the lock as before (native._compile); so it
does, with a warning, when the linker fails.
"""
from __future__ import annotations

import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

from . import config

_private = threading.local()  # .active: this thread uses only LLVM objects of its own
_installed: list = []
LINK_TIMEOUT = 60.0  # seconds: ld -r of a few objects takes milliseconds


class _ThreadPrivateLock:
    """llvmlite's lock, skipped by a thread marked ``_private.active``."""

    def __init__(self, real):
        self._real = real

    def acquire(self, *args, **kwargs):
        if getattr(_private, "active", False):
            return True
        return self._real.acquire(*args, **kwargs)

    def release(self):
        if not getattr(_private, "active", False):
            self._real.release()


def _install() -> bool:
    """Put the thread-private bypass around llvmlite's lock, once; False where llvmlite's
    lock is not the ``_LLVMLock`` holding a ``threading.RLock`` this was written against."""
    if _installed:
        return _installed[0]
    ok = False
    try:
        from llvmlite.binding import ffi  # noqa: PLC0415
        outer = ffi.lib._lock
        inner = getattr(outer, "_lock", None)
        if isinstance(inner, _ThreadPrivateLock):
            ok = True
        elif inner is not None and type(inner) is type(threading.RLock()):
            outer._lock = _ThreadPrivateLock(inner)
            ok = True
    except Exception:  # noqa: BLE001 - another llvmlite: compile one shard at a time
        ok = False
    _installed.append(ok)
    return ok


def threads() -> int:
    """Compile threads: HYBRID_LLVM_THREADS, by default one per core (at most 8)."""
    n = config.get("HYBRID_LLVM_THREADS")
    if n:
        return n
    from .device import cpu_count  # noqa: PLC0415
    return max(1, min(cpu_count(), 8))


def available() -> bool:
    return threads() > 1 and shutil.which("ld") is not None and _install()


class LinkError(RuntimeError):
    """``ld -r`` could not join the shards' objects (``texts``: the shards, compiled again
    one at a time by the caller)."""

    def __init__(self, message, texts):
        super().__init__(message)
        self.texts = texts


def compile_shards(llvm, make_tm, optimize, shards, meanwhile=None) -> tuple[bytes, dict]:
    """(one relocatable object, times) for the IR texts ``shards`` (an iterable, possibly
    generated while earlier shards compile): each shard parsed, verified, optimized
    (``optimize(llvm, tm, module)``) and compiled on one of ``threads()`` workers, each with
    a target machine of its own (``make_tm()``). The first error, the producer's or a
    worker's, is raised once every worker stopped (each finishes the shard it has: bounded
    work). ``meanwhile()``, if given, runs on this thread once every shard is queued (under
    llvmlite's lock, which the workers do not take). Times: CPU seconds of each phase summed
    over the workers, and the link's. A link that fails raises LinkError holding the shards'
    texts."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    objects: dict = {}
    errors: list = []
    clocks: list = []

    def worker():
        _private.active = True
        clock = {"parse": 0.0, "optimize": 0.0, "codegen": 0.0}
        clocks.append(clock)
        tm = ctx = None
        try:
            while (item := todo.get()) is not None:
                if errors:
                    continue
                k, text = item
                try:
                    if tm is None:
                        tm, ctx = make_tm(), llvm.create_context()
                    objects[k] = _compile_one(llvm, tm, ctx, optimize, text, clock)
                except BaseException as exc:  # noqa: BLE001 - raised by the caller
                    errors.append(exc)
        finally:
            if ctx is not None:
                ctx.close()  # after its modules (each closed by _compile_one)
            _private.active = False

    workers = [threading.Thread(target=worker, name=f"hybrid-llvm-{i}", daemon=True)
               for i in range(threads())]
    for w in workers:
        w.start()
    texts = []
    try:
        for text in shards:
            todo.put((len(texts), text))
            texts.append(text)
            if errors:
                break
        if meanwhile is not None and not errors:
            meanwhile()
    finally:
        for _ in workers:
            todo.put(None)
        for w in workers:
            w.join()
    if errors:
        raise errors[0]
    times = {k: sum(c[k] for c in clocks) for k in ("parse", "optimize", "codegen")}
    t = time.perf_counter()
    objs = [objects[k] for k in range(len(texts))]
    try:
        obj = objs[0] if len(objs) == 1 else link_relocatable(objs)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise LinkError(str(exc), texts) from exc
    times["link"] = time.perf_counter() - t
    return obj, times


def _compile_one(llvm, tm, ctx, optimize, text: str, clock: dict) -> bytes:
    """One shard's object, on a worker's own target machine and context."""
    t0 = time.perf_counter()
    mod = llvm.parse_assembly(text, context=ctx)
    try:
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
        t1 = time.perf_counter()
        optimize(llvm, tm, mod)
        t2 = time.perf_counter()
        obj = tm.emit_object(mod)
        clock["parse"] += t1 - t0
        clock["optimize"] += t2 - t1
        clock["codegen"] += time.perf_counter() - t2
        return obj
    finally:
        mod.close()  # before its context


def link_relocatable(objs: list) -> bytes:
    """Object files joined into one by ``ld -r`` (symbols defined in one and used in
    another are resolved by whoever loads the result: MCJIT or the shared-library link)."""
    with tempfile.TemporaryDirectory(prefix="hybrid-ld-") as tmp:
        names = []
        for k, data in enumerate(objs):
            path = os.path.join(tmp, f"s{k}.o")
            with open(path, "wb") as f:
                f.write(data)
            names.append(path)
        out = os.path.join(tmp, "module.o")
        proc = subprocess.run([shutil.which("ld") or "ld", "-r", "-o", out, *names],
                              capture_output=True, timeout=LINK_TIMEOUT, check=False)
        if proc.returncode != 0:
            raise RuntimeError("ld -r could not join a module's shards: "
                               + proc.stderr.decode(errors="replace").strip()[:500])
        with open(out, "rb") as f:
            return f.read()
