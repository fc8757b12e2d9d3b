"""The dependency engine: MXNet's ``PushAsync`` contract in Python.

``push(fn, reads, writes, device, name)`` queues ``fn`` and returns at once. Ops that touch
the same :class:`Var` keep program order (a read waits for the last write; a write waits for
the last write and every read since), independent ops run in parallel on per-device workers.

Errors: an exception inside an op poisons every value it writes; ops that read a poisoned
value do not run and poison their own outputs. The original error is raised at the first sync
point that touches a poisoned value (``wait``) or by ``wait_all``, once for ``wait_all``; a
poisoned value stays poisoned, so every later read raises again (never stale data).

Every wait has a timeout (``HYBRID_WAIT_TIMEOUT``) that raises :class:`WaitTimeout` naming what
was still pending. The number of ops in flight is bounded (``HYBRID_ENGINE_WINDOW``): a front
end far ahead blocks instead of filling memory.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import sys
import threading
import time
import weakref

from . import config
from .device import CopyLane, Device, cpu, cpu_count

_log = config.logger("engine")


class AsyncOpError(RuntimeError):
    """An op queued on the engine failed; raised at a sync point that depends on it."""

    def __init__(self, op_name: str, where, original: BaseException):
        self.op_name = op_name
        self.where = where
        self.original = original
        at = f" (queued at {where[0]}:{where[1]})" if where else ""
        super().__init__(f"op '{op_name}'{at} failed: {type(original).__name__}: {original}")


    @staticmethod
    def of(op_name: str, where, original: BaseException) -> "AsyncOpError":
        """The error to raise at a sync point: also an instance of the original's type, so
        ``except IndexError`` catches an IndexError raised inside a queued op."""
        return _error_class(type(original))(op_name, where, original)


@functools.lru_cache(maxsize=None)
def _error_class(original: type) -> type:
    if not issubclass(original, Exception) or issubclass(AsyncOpError, original) or \
            original is AsyncOpError:
        return AsyncOpError
    try:
        return type(original.__name__, (AsyncOpError, original), {"__module__": __name__})
    except TypeError:  # a base whose instance layout conflicts: the plain error
        return AsyncOpError


class WaitTimeout(TimeoutError):
    """A sync point waited longer than its timeout."""


class EngineUnusable(RuntimeError):
    """The engine cannot run ops in this process (for example after fork with work pending)."""


SPIN_WAIT = 100e-6  # seconds a sync point polls for the last op in flight before it sleeps


class Var:
    """A dependency tag for one value (an array's buffer)."""

    __slots__ = ("last_write", "readers", "error", "name", "__weakref__")

    def __init__(self, name: str | None = None):
        self.last_write = None
        self.readers = []
        self.error = None
        self.name = name

    def __repr__(self):
        return f"Var({self.name or hex(id(self))})"


class _Op:
    __slots__ = ("fn", "name", "where", "device", "pending", "dependents", "done",
                 "error", "origin", "reads", "writes", "queued", "awaited", "gen", "seq",
                 "thread")

    def __init__(self, fn, name, where, device, reads, writes):
        self.fn = fn
        self.name = name
        self.where = where
        self.device = device
        self.reads = reads
        self.writes = writes
        self.pending = 0
        self.dependents = []
        self.done = False
        self.error = None
        self.origin = False  # True when this op's own fn raised (not a propagated error)
        self.queued = False  # in a worker's FIFO queue (or running)
        self.awaited = False  # a sync point waits for this op: wake it when done
        self.gen = 0  # the wait_all generation it was pushed in (see Engine.wait_all)
        self.seq = 0  # push order, engine-wide
        self.thread = threading.get_ident()  # the pushing thread (see Engine.interrupt)

    def describe(self) -> str:
        at = f" queued at {self.where[0]}:{self.where[1]}" if self.where else ""
        return f"'{self.name}' on {self.device}{at}"


class _Worker:
    """The ready queue and threads of one device."""

    __slots__ = ("device", "queue", "cv", "threads", "active", "sleeping", "batches")

    def __init__(self, device, lock):
        self.device = device
        self.queue = collections.deque()
        self.cv = threading.Condition(lock)
        self.threads = []
        self.active = 0
        self.sleeping = 0  # threads waiting on cv: notify only then (a wake-up is costly)
        self.batches = {}  # thread index -> the batch it runs (for WaitTimeout messages)


class Engine:
    def __init__(self, mode: str | None = None, window: int | None = None,
                 workers_per_device: int | None = None):
        mode = mode or config.get("HYBRID_ENGINE")
        if mode not in ("threaded", "naive"):
            raise ValueError(f"engine mode must be 'threaded' or 'naive', got {mode!r} "
                             "(set HYBRID_ENGINE)")
        self.mode = mode
        self.window = int(window or config.get("HYBRID_ENGINE_WINDOW"))
        self.workers_per_device = int(workers_per_device or config.get("HYBRID_CPU_WORKERS"))
        self.inline = bool(config.get("HYBRID_INLINE"))
        self._switch_interval = config.get("HYBRID_SWITCH_INTERVAL")  # validated here, early
        self._fifo = self.workers_per_device == 1
        self._reset_state()
        self._pid = os.getpid()
        self._broken = None
        _all_engines.add(self)  # every engine, not only the process one, is reset after fork

    def _reset_state(self):
        self._lock = threading.Lock()
        self._done_cv = threading.Condition(self._lock)
        self._space_cv = threading.Condition(self._lock)
        self._workers: dict[Device, _Worker] = {}
        self._inflight = 0
        # in-flight ops per wait_all generation: wait_all waits for the generations up to
        # its own, never for work another thread queues after it began
        self._gen = 0
        self._gen_inflight: dict[int, int] = {}
        self._seq = 0
        # thread id -> push seq: that thread's ops pushed before it are dropped unless they
        # started (a KeyboardInterrupt in one of its waits; see interrupt)
        self._dropped_before: dict[int, int] = {}
        self._unreported = []
        self._waiters = 0  # threads in wait_all: woken when nothing is in flight
        self._worker_threads = set()
        self.sync_points = 0  # calls of wait and wait_all: how often the front end syncs
        self._closed = False
        self._interrupted = False  # a KeyboardInterrupt reached a wait: exit without waiting

    # ------------------------------------------------------------------ push
    def push(self, fn, reads=(), writes=(), device: Device | None = None, name: str = "op",
             where=None, inline: bool = False):
        """Queue ``fn()`` to run after the ops it depends on; returns at once.

        reads/writes: the :class:`Var` s the op reads and writes. ``inline`` lets a small op run in
        the caller when its inputs are ready and its device is idle (same ordering and errors).
        """
        device = _canonical.get(device) or _canon(device)
        op = _Op(fn, name, where, device, reads, writes)
        if self.mode == "naive":
            self._check_usable()
            with self._lock:
                self._register(op)
                self._count_in(op)
                worker = self._workers.get(device) or self._make_worker(device, start=False)
                worker.active += 1
            self._execute_here(op)
            self._complete(op, worker)
            return op
        run_here = False
        with self._lock:
            if self._broken:
                self._check_usable()
            if self._inflight >= self.window:
                self._wait_for_space()
            deps = self._register(op)
            self._count_in(op)
            worker = self._workers.get(device) or self._make_worker(device)
            if deps == 0:
                if inline and self.inline and worker.active == 0 and not worker.queue:
                    # Runs in this thread, outside the device's FIFO: op.queued stays False so
                    # an op pushed meanwhile from another thread waits for it for real.
                    worker.active += 1
                    run_here = True
                else:
                    op.queued = True
                    worker.queue.append(op)
                    if worker.sleeping:
                        worker.cv.notify()
        if run_here:
            self._execute_here(op)
            self._complete(op, worker)
        return op

    def _count_in(self, op):
        """Under the lock: one more op in flight, in the current wait_all generation."""
        op.seq = self._seq
        self._seq += 1
        self._inflight += 1
        gen = op.gen = self._gen
        counts = self._gen_inflight
        counts[gen] = counts.get(gen, 0) + 1

    def _execute_here(self, op):
        """Run op in this thread: a GPU's op inside its activation (as its worker runs)."""
        if op.device.kind == "cpu":
            self._execute(op)
        else:
            with _activation(op.device):
                self._execute(op)

    def _register(self, op) -> int:
        """Link ``op`` after the ops it must follow; returns how many it waits for.

        With one worker per device, the device's queue is FIFO like a CUDA stream: an op
        that is already queued on the same device runs first anyway, so it is no dependency.
        """
        deps = 0
        writes = op.writes
        fifo_device = op.device if self._fifo else None
        for v in op.reads:
            if v in writes:
                continue
            w = v.last_write
            if w is not None and not w.done and not (w.queued and w.device is fifo_device):
                w.dependents.append(op)
                deps += 1
            readers = v.readers
            n = len(readers)
            if n >= 32 and not n & (n - 1):  # prune at powers of two: amortized O(1)
                readers[:] = [r for r in readers if not r.done]
            readers.append(op)
        for v in writes:
            w = v.last_write
            if w is op:  # the same Var listed twice in writes: never wait for yourself
                continue
            if w is not None and not w.done and not (w.queued and w.device is fifo_device):
                w.dependents.append(op)
                deps += 1
            for r in v.readers:
                if not r.done and not (r.queued and r.device is fifo_device):
                    r.dependents.append(op)
                    deps += 1
            v.readers = []
            v.last_write = op
        op.pending = deps
        return deps

    def _wait_for_space(self):
        try:
            self._wait_for_space_until()
        except KeyboardInterrupt:
            self._drop_queued(threading.get_ident())  # the lock is held
            raise

    def _wait_for_space_until(self):
        timeout = config.get("HYBRID_WAIT_TIMEOUT")
        deadline = time.monotonic() + timeout
        while self._inflight >= self.window:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    f"push waited {timeout:.0f}s for room in the engine window "
                    f"({self.window} ops in flight): {self._pending_summary()}")
            self._space_cv.wait(left)

    # ------------------------------------------------------------- workers
    def _make_worker(self, device, start=True) -> _Worker:
        worker = _Worker(device, self._lock)
        self._workers[device] = worker
        if start:
            # a worker returning from a native call (GIL released) needs the GIL back while
            # the front end runs Python; with Python's 5 ms switch interval it would stall
            if sys.getswitchinterval() > self._switch_interval:
                sys.setswitchinterval(self._switch_interval)
            n = self.workers_per_device if device.kind == "cpu" else 1
            for i in range(n):
                loop = self._worker_loop if device.kind == "cpu" else self._gpu_worker_loop
                t = threading.Thread(target=loop, args=(worker, i, n),
                                     name=f"hybrid-{device}-{i}", daemon=True)
                worker.threads.append(t)
                self._worker_threads.add(t)
                t.start()
        if device.kind == "cpu":
            _share_cores(sum(1 for d in self._workers if d.kind == "cpu"))
        return worker

    def _gpu_worker_loop(self, worker: _Worker, index: int = 0, nthreads: int = 1):
        """A GPU's worker (or its copy lane's) runs with the GPU activated: its ops queue their
        kernels on the GPU's compute stream."""
        with _activation(worker.device):
            self._worker_loop(worker, index, nthreads)

    def _worker_loop(self, worker: _Worker, index: int = 0, nthreads: int = 1):
        lock = self._lock
        queue = worker.queue
        execute = self._execute
        batches = worker.batches
        while True:
            with lock:
                while not queue:
                    if self._closed:
                        return
                    worker.sleeping += 1
                    worker.cv.wait()
                    worker.sleeping -= 1
                # Take a batch: one lock round trip for many small ops. With several threads
                # per device take a share only, or one thread would run everything ready.
                n = min(len(queue), 64)
                if nthreads > 1:
                    n = max(1, n // nthreads)
                batch = [queue.popleft() for _ in range(n)]
                worker.active += n
                batches[index] = batch
            for op in batch:
                execute(op)
            self._complete_many(batch, worker)
            batches[index] = None

    def _execute(self, op):
        err = None
        for v in op.reads:
            if v.error is not None:
                err = v.error
                break
        dropped = self._dropped_before
        if err is None and dropped and op.seq < dropped.get(op.thread, -1):
            # its thread was interrupted while waiting: it never runs, its outputs say why
            # (not an unreported error: the thread already got its KeyboardInterrupt)
            err = AsyncOpError(op.name, op.where, KeyboardInterrupt(
                "dropped before it ran: the thread that queued it was interrupted (Ctrl-C)"))
        if err is None:
            try:
                op.fn()
            except BaseException as exc:  # noqa: BLE001 - every failure is reported at a sync point
                err = AsyncOpError.of(op.name, op.where, exc)
                err.__cause__ = exc
                op.origin = True
                if config.log_enabled("engine"):
                    _log.info("op %s failed: %r", op.describe(), exc)
        op.error = err
        for v in op.writes:  # visible now: a later op of the same FIFO batch may read it
            v.error = err
        op.fn = None  # drop captured arrays as soon as the op is done

    def _complete(self, op, worker):
        self._complete_many((op,), worker)

    def _complete_many(self, ops, worker):
        with self._lock:
            workers = self._workers
            counts = self._gen_inflight
            drained = False  # a generation's last op: a wait_all may be waiting for it
            for op in ops:
                op.done = True
                left = counts[op.gen] - 1
                if left:
                    counts[op.gen] = left
                else:
                    del counts[op.gen]
                    drained = True
                if op.origin:
                    self._unreported.append(op.error)
                for d in op.dependents:
                    d.pending -= 1
                    if d.pending == 0:
                        w = workers[d.device]
                        w.queue.append(d)
                        if w.sleeping:
                            w.cv.notify()
                op.dependents = ()
                op.reads = op.writes = ()  # break the op <-> Var cycle: freed by refcount
            n = len(ops)
            worker.active -= n
            self._inflight -= n
            if self._inflight < self.window:
                self._space_cv.notify()
            # wake a waiter only when what it waits for may be done: every wake-up costs
            # the waiter a thread switch and the GIL, which the workers want meanwhile
            if (self._waiters and drained) or any(op.awaited for op in ops):
                self._done_cv.notify_all()

    # --------------------------------------------------------------- waits
    def wait(self, var: Var, timeout: float | None = None):
        """Block until the last write of ``var`` is done; raise its error if it failed."""
        op = var.last_write
        self.sync_points += 1
        if op is not None and not op.done:
            with self._lock:
                op.awaited = True
                self._wait_until(lambda: op.done, timeout, f"value written by {op.describe()}",
                                 counted=False)
        err = var.error
        if err is not None:
            self._raise(err)

    def wait_all(self, timeout: float | None = None):
        """Block until every op queued before this call is done (ops that other threads
        queue meanwhile are not waited for); raise the first error not raised yet (once)."""
        self._check_usable()
        with self._lock:
            self.sync_points += 1
            gen = self._gen
            self._gen += 1  # ops pushed from now on belong to later waits
            counts = self._gen_inflight
            if self._inflight:
                # list(): the spin phase of _wait_until reads this without the lock, while
                # workers add and delete generations (copying a dict is one GIL-held step)
                self._wait_until(lambda: not any(g <= gen for g in list(counts)), timeout,
                                 "all ops queued before waitall")
            errors = self._unreported
            self._unreported = []
            gpus = [d for d in self._workers if d.kind == "gpu"]
        for d in gpus:  # a GPU's ops are done when queued: wait until its streams ran them
            try:
                d.synchronize(timeout)
            except Exception as exc:  # noqa: BLE001 - reported with the engine's errors
                errors.append(AsyncOpError(f"synchronize {d}", None, exc))
        if errors:
            first = errors[0]
            if len(errors) > 1:
                others = "; ".join(str(e) for e in errors[1:4])
                first = AsyncOpError.of(first.op_name, first.where, first.original)
                first.args = (f"{first.args[0]} (and {len(errors) - 1} more failed op(s): "
                              f"{others})",)
            self._raise(first)

    def count_sync_points(self) -> int:
        """Calls of wait and wait_all so far: how often the front end syncs."""
        return self.sync_points

    def idle(self, device) -> bool:
        """Whether a small op may run in the caller now, outside the engine: inlining is on,
        the engine usable and ``device`` has nothing queued or running (the rule ``push``
        applies to an ``inline`` op with no pending dependency). Read without the lock: a
        caller asks only for an op whose inputs are computed and whose outputs are fresh,
        which no queued op can be ordered against, so a stale answer costs overlap, never
        order."""
        if not self.inline or self._broken:
            return False
        w = self._workers.get(device)
        return w is None or (w.active == 0 and not w.queue)

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is in flight (at most ``timeout`` s), like wait_all, but leave
        errors to the next sync point and never raise WaitTimeout: for callers that only want
        the cores to themselves. Returns whether the engine went idle."""
        if threading.current_thread() in self._worker_threads:
            return False  # an op that waited for every op would wait for itself
        with self._lock:
            if self._inflight:
                try:
                    self._wait_until(lambda: self._inflight == 0, timeout, "all ops")
                except WaitTimeout:
                    return False
        return True

    def interrupt(self, thread: int | None = None):
        """Drop the ops that ``thread`` (this one by default) queued and that have not
        started: they complete at once as failed values naming the interrupt, so the next op
        waits only for what is running. Called when a KeyboardInterrupt reaches a wait."""
        with self._lock:
            self._drop_queued(threading.get_ident() if thread is None else thread)

    def _drop_queued(self, thread: int):
        """Under the lock: ``thread``'s ops pushed so far are dropped unless started."""
        self._dropped_before[thread] = self._seq
        self._interrupted = True

    def _wait_until(self, ready, timeout, what, counted=True):
        """Wait on _done_cv until ready(); counted: a wait for all ops (see _waiters).
        A KeyboardInterrupt here drops this thread's queued work (see interrupt)."""
        try:
            self._wait_until_ready(ready, timeout, what, counted)
        except KeyboardInterrupt:
            self._drop_queued(threading.get_ident())  # the lock is held
            raise

    def _wait_until_ready(self, ready, timeout, what, counted):
        self._check_usable()
        timeout = config.get("HYBRID_WAIT_TIMEOUT") if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self._waiters += counted
        try:
            if not ready() and self._inflight <= 1:
                # one op left (often a step's last, short one): a sleeping thread wakes ~50 us
                # after the notify on a VM, so poll a little first, the lock released
                self._lock.release()
                try:
                    t_end = time.perf_counter() + SPIN_WAIT
                    while not ready() and time.perf_counter() < t_end:
                        time.sleep(0)
                finally:
                    self._lock.acquire()
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(f"waited {timeout:g}s for {what}; still pending: "
                                      f"{self._pending_summary()}")
                self._done_cv.wait(left)
        finally:
            self._waiters -= counted

    def _raise(self, err: AsyncOpError):
        with self._lock:
            if err in self._unreported:
                self._unreported.remove(err)
        fresh = AsyncOpError.of(err.op_name, err.where, err.original)
        fresh.args = err.args
        raise fresh from err.original

    def _pending_summary(self) -> str:
        parts = []
        for dev, w in self._workers.items():
            head = f"next {w.queue[0].describe()}" if w.queue else "queue empty"
            # In a batch, the ops already run have fn None: the first with fn is running.
            running = [next((op for op in b if op.fn is not None), None)
                       for b in list(w.batches.values()) if b]
            running = [op.describe() for op in running if op is not None]
            if running:
                head += "; running " + ", ".join(running)
            parts.append(f"{dev}: {len(w.queue)} ready, {w.active} running ({head})")
        return f"{self._inflight} op(s) in flight; " + "; ".join(parts)

    # ------------------------------------------------------------ lifecycle
    @property
    def inflight(self) -> int:
        return self._inflight

    def _check_usable(self):
        if self._broken:
            raise EngineUnusable(self._broken)

    def _after_fork(self):
        pending = self._inflight
        self._pid = os.getpid()
        self._reset_state()
        if pending:
            self._broken = (f"this process was forked while {pending} op(s) were in flight; "
                            "their results cannot be computed here. Call hb.waitall() before "
                            "fork(), or start workers with the 'spawn' method.")

    def shutdown(self, timeout: float = 10.0):
        """Finish pending work (up to ``timeout`` s) and stop the worker threads."""
        if os.getpid() != self._pid or self._broken:
            return
        try:
            # after Ctrl-C only what is already running is left: wait for it briefly
            self.wait_all(timeout=min(timeout, 1.0) if self._interrupted else timeout)
        except Exception as exc:  # noqa: BLE001 - at exit, report and go on
            print(f"hybrid: at exit: {exc}", file=sys.stderr)
        with self._lock:
            self._closed = True
            for w in self._workers.values():
                w.cv.notify_all()
            threads = [t for w in self._workers.values() for t in w.threads]
        for t in threads:
            t.join(timeout=1.0)
        self._broken = ("this engine was shut down (Engine.shutdown() or interpreter exit); "
                        "create a new Engine() (runtime.engine.set_engine) to run more ops")


def _activation(device):
    """``device.activate()``; for a GPU that cannot be activated (gone, or its emulation
    switched off since), nothing: its ops then raise DeviceError themselves."""
    try:
        return device.activate()
    except Exception:  # noqa: BLE001 - each op reports it
        return contextlib.nullcontext()


def _share_cores(n_cpu_devices: int):
    """Give each CPU device its share of cores for BLAS (never oversubscribe)."""
    threads = max(1, cpu_count() // max(1, n_cpu_devices))
    if threads == _share_cores.current:
        return
    _share_cores.current = threads
    for hook in list(_share_cores.hooks):
        hook(threads)


_share_cores.current = None
_share_cores.hooks = []


def on_core_share(hook):
    """Register ``hook(threads_per_device)``; called now and whenever the share changes."""
    _share_cores.hooks.append(hook)
    if _share_cores.current is not None:
        hook(_share_cores.current)


def threads_per_cpu_device() -> int:
    return _share_cores.current or cpu_count()


def _numpy_blas_threads(n: int):
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=n, user_api="blas")
    except Exception:  # noqa: BLE001 - without threadpoolctl BLAS keeps its own default
        pass


on_core_share(_numpy_blas_threads)

# ----------------------------------------------------------------- the engine
_engine: Engine | None = None
_engine_lock = threading.Lock()
_all_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def get_engine() -> Engine:
    global _engine
    eng = _engine
    if eng is None:
        with _engine_lock:
            if _engine is None:
                _engine = Engine()
            eng = _engine
    return eng


def set_engine(engine: Engine) -> Engine:
    """Replace the process engine (waits for the old one first); returns the old one."""
    global _engine
    old = _engine
    if old is not None and not old._broken:  # a forked-away or shut-down engine runs nothing
        old.wait_all()
    _engine = engine
    return old


def _at_exit():
    if _engine is not None:
        _engine.shutdown()


def _after_fork_in_child():
    for eng in list(_all_engines):
        eng._after_fork()


_canonical: dict = {None: cpu(0)}


def _canon(device: Device) -> Device:
    """One Device object per device, so the hot path compares with ``is``."""
    if not isinstance(device, (Device, CopyLane)):
        raise TypeError(f"device must be a hybrid Device (hb.cpu(i)/hb.gpu(i)), got {device!r}")
    return _canonical.setdefault(device, device)


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
