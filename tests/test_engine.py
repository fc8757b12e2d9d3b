"""The dependency engine (runtime/engine.py) against its contract (DESIGN.md §4).

Random workloads are checked against serial execution in program order, bit for bit: every op
records the hash it computed from its inputs, so a single op that ran too early or too late
(a missing read-after-write, write-after-read or write-after-write edge) changes the trace.
"""
from __future__ import annotations

import os
import random
import resource
import sys
import threading
import time

import numpy as np
import pytest

from runtime import config
from runtime import engine as engine_mod
from runtime.device import cpu
from runtime.engine import AsyncOpError, Engine, EngineUnusable, Var, WaitTimeout

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads

WHERE_FILE = "workload.py"


@pytest.fixture(autouse=True)
def _busy_switching():
    """Switch threads often, so that a missing dependency shows up as a wrong interleaving;
    a hang (a lost dependency edge) fails within 30 s, naming what is pending."""
    old = sys.getswitchinterval()
    old_timeout = config.set_flag("HYBRID_WAIT_TIMEOUT", 30.0)
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)
    config.set_flag("HYBRID_WAIT_TIMEOUT", old_timeout)


def _shutdown(*engines):
    for e in engines:
        e.shutdown(timeout=30)


# ------------------------------------------------------------------ random workloads
class InjectedError(Exception):
    pass


class Workload:
    """``n_ops`` ops over ``n_vals`` values: each value is a Var plus an int cell.

    Op i reads some values (duplicates allowed), writes 1-3 (a read value sometimes among
    them, a Var now and then listed twice), records ``trace[i] = hash((i, *inputs))`` and
    writes ``hash((trace[i], j))`` into its j-th output. A few "hot" values are read very often
    and seldom written (long reader lists: pruning, write-after-many-reads).
    """

    def __init__(self, seed, n_ops, n_vals, devices, p_fail=0.0, p_inline=0.3, first_id=0,
                 p_yield=0.03):
        rng = random.Random(seed)
        self.n_vals = n_vals
        hot = list(range(min(4, n_vals)))
        cold = [v for v in range(n_vals) if v not in hot]
        self.ops = []
        for k in range(n_ops):
            i = first_id + k
            reads = []
            for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4))):
                reads.append(rng.choice(hot) if rng.random() < 0.4 else rng.randrange(n_vals))
            pool = cold if rng.random() > 0.005 else range(n_vals)
            writes = rng.sample(pool, rng.choice((1, 1, 2, 3)))
            if reads and rng.random() < 0.3:
                writes.append(rng.choice(reads))  # read-modify-write
            if rng.random() < 0.02:
                writes.append(writes[0])  # the same Var twice in writes
            self.ops.append(dict(
                id=i, reads=tuple(reads), writes=tuple(writes),
                device=rng.choice(devices), inline=rng.random() < p_inline,
                fail=rng.random() < p_fail, yield_gil=rng.random() < p_yield))

    # -- serial execution in program order: the reference
    def serial(self, cells, poison, trace):
        for op in self.ops:
            bad = next((poison[r] for r in op["reads"] if poison[r] is not None), None)
            if bad is None:
                h = hash((op["id"],) + tuple(cells[r] for r in op["reads"]))
                trace[op["id"]] = h
                if op["fail"]:
                    bad = op["id"]
                else:
                    for j, w in enumerate(op["writes"]):
                        cells[w] = hash((h, j))
            for w in op["writes"]:
                poison[w] = bad

    def origin_failures(self, poison_before):
        """Ids of the ops whose own fn raises (a failing op with a poisoned input never runs)."""
        poison = list(poison_before)
        out = []
        for op in self.ops:
            bad = next((poison[r] for r in op["reads"] if poison[r] is not None), None)
            if bad is None and op["fail"]:
                bad = op["id"]
                out.append(op["id"])
            for w in op["writes"]:
                poison[w] = bad
        return out

    # -- the same ops on the engine
    @staticmethod
    def make_fn(op, cells, trace):
        i, reads, writes, fail, yield_gil = (op["id"], op["reads"], op["writes"], op["fail"],
                                             op["yield_gil"])

        def fn():
            h = hash((i,) + tuple(cells[r] for r in reads))
            if yield_gil:
                time.sleep(0)  # let another thread run between this op's reads and writes
            trace[i] = h
            for j, w in enumerate(writes):
                cells[w] = hash((h, j))
                if fail:  # after a partial write: the value must read as failed, never stale
                    raise InjectedError(f"injected failure in op {i}")
        return fn

    def push_range(self, engine, vars_, cells, trace, lo=0, hi=None):
        for op in self.ops[lo:hi]:
            engine.push(self.make_fn(op, cells, trace),
                        tuple(vars_[r] for r in op["reads"]),
                        tuple(vars_[w] for w in op["writes"]),
                        op["device"], f"op{op['id']}", (WHERE_FILE, op["id"]), op["inline"])


def _initial(n_vals):
    return [v * 7919 + 1 for v in range(n_vals)]


def _run_and_check(engine, seed, n_ops, n_vals, devices):
    wl = Workload(seed, n_ops, n_vals, devices)
    vars_ = [Var(f"v{k}") for k in range(n_vals)]
    cells, trace = _initial(n_vals), [None] * n_ops
    wl.push_range(engine, vars_, cells, trace)
    engine.wait_all(timeout=30)  # a lost dependency edge deadlocks: fail fast, naming it
    ref_cells, ref_trace = _initial(n_vals), [None] * n_ops
    wl.serial(ref_cells, [None] * n_vals, ref_trace)
    bad = [i for i in range(n_ops) if trace[i] != ref_trace[i]]
    assert not bad, (f"seed {seed}: {len(bad)} op(s) saw inputs different from serial "
                     f"execution, first op{bad[0]}")
    assert cells == ref_cells, f"seed {seed}: final values differ from serial execution"
    for v in vars_:  # every value readable afterwards, no error
        engine.wait(v)


SEEDS = range(20)
# (mode, workers per device, devices, ops per seed, values). The first keeps the full size:
# 20 seeds x 10,000 ops over 128 values on two CPU devices.
CONFIGS = {
    "threaded-w1-2dev-10k": ("threaded", 1, (cpu(0), cpu(1)), 10_000, 128),
    "threaded-w1-1dev": ("threaded", 1, (cpu(0),), 2_000, 128),
    "threaded-w2-1dev": ("threaded", 2, (cpu(0),), 2_000, 128),
    "threaded-w4-1dev": ("threaded", 4, (cpu(0),), 2_000, 128),
    "threaded-w2-2dev": ("threaded", 2, (cpu(0), cpu(1)), 2_000, 128),
    "threaded-w4-2dev": ("threaded", 4, (cpu(0), cpu(1)), 2_000, 128),
    "naive-2dev": ("naive", 1, (cpu(0), cpu(1)), 3_000, 128),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_random_workload_matches_serial(cfg):
    mode, workers, devices, n_ops, n_vals = CONFIGS[cfg]
    engine = Engine(mode=mode, workers_per_device=workers)
    try:
        for seed in SEEDS:
            _run_and_check(engine, seed, n_ops, n_vals, devices)
        assert engine.inflight == 0
    finally:
        _shutdown(engine)


@pytest.mark.timeout(60)
def test_random_workload_without_inline_flag():
    """HYBRID_INLINE off: inline=True requests run on the workers; same results."""
    old = config.set_flag("HYBRID_INLINE", False)
    try:
        engine = Engine(workers_per_device=1)
    finally:
        config.set_flag("HYBRID_INLINE", old)
    try:
        assert engine.inline is False
        for seed in range(5):
            _run_and_check(engine, 100 + seed, 2_000, 128, (cpu(0), cpu(1)))
    finally:
        _shutdown(engine)


@pytest.mark.timeout(60)
def test_random_workload_all_inline():
    """Every op asks for the inline fast path: ordering is unchanged."""
    engine = Engine(workers_per_device=1)
    try:
        for seed in range(5):
            wl = Workload(200 + seed, 2_000, 128, (cpu(0), cpu(1)), p_inline=1.0)
            vars_ = [Var() for _ in range(128)]
            cells, trace = _initial(128), [None] * 2_000
            wl.push_range(engine, vars_, cells, trace)
            engine.wait_all()
            ref_cells, ref_trace = _initial(128), [None] * 2_000
            wl.serial(ref_cells, [None] * 128, ref_trace)
            assert trace == ref_trace and cells == ref_cells, f"seed {200 + seed}"
    finally:
        _shutdown(engine)


@pytest.mark.timeout(60)
def test_several_pushing_threads():
    """Threads push at once into one engine, each on its own values (plus shared read-only
    ones); each thread's values equal its own serial run."""
    engine = Engine(workers_per_device=2)
    n_threads, n_ops, n_vals = 4, 1_500, 40
    shared = [Var(f"shared{k}") for k in range(4)]
    shared_cells = [11, 22, 33, 44]
    errors = []

    def body(t):
        try:
            wl = Workload(300 + t, n_ops, n_vals, (cpu(0), cpu(1)), first_id=t * n_ops)
            rng = random.Random(t)
            for op in wl.ops:  # some ops also read the shared values, which nobody writes
                if rng.random() < 0.3:
                    op["reads"] += (n_vals + rng.randrange(4),)
            vars_ = [Var() for _ in range(n_vals)] + shared
            cells = _initial(n_vals) + shared_cells
            trace = {}
            wl.push_range(engine, vars_, cells, trace)
            for v in vars_:
                engine.wait(v)
            ref_cells, ref_trace = _initial(n_vals) + shared_cells, {}
            wl.serial(ref_cells, [None] * (n_vals + 4), ref_trace)
            assert trace == ref_trace and cells == ref_cells, f"thread {t}"
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        assert not errors, errors[0]
        engine.wait_all()
    finally:
        _shutdown(engine)


@pytest.mark.timeout(30)
def test_inline_op_orders_ops_pushed_from_another_thread():
    """An op running inline in one thread must be waited for by a dependent op that another
    thread pushes meanwhile on the same device (it is not in the device's FIFO queue)."""
    engine = Engine(workers_per_device=1)
    assert engine.inline
    v, out = Var("v"), Var("out")
    cell = {"v": 0, "seen": None}
    started = threading.Event()

    def slow():
        started.set()
        time.sleep(0.2)
        cell["v"] = 1

    def reader():
        cell["seen"] = cell["v"]

    try:
        t = threading.Thread(target=lambda: engine.push(slow, (), (v,), cpu(0), "slow",
                                                        inline=True))
        t.start()
        assert started.wait(10)
        engine.push(reader, (v,), (out,), cpu(0), "reader")
        engine.wait(out)
        t.join()
        assert cell["seen"] == 1
    finally:
        _shutdown(engine)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [1, 4])
def test_dependencies_across_devices_wait_for_slow_ops(workers):
    """RAW, WAR and WAW across devices with a slow first op: the later op starts after."""
    engine = Engine(workers_per_device=workers)
    log = []
    a, b = Var("a"), Var("b")

    def step(name, delay=0.0):
        def fn():
            log.append(("start", name))
            time.sleep(delay)
            log.append(("end", name))
        return fn

    try:
        engine.push(step("w1", 0.1), (), (a,), cpu(0), "w1")       # write a
        engine.push(step("r1", 0.1), (a,), (b,), cpu(1), "r1")     # RAW on a
        engine.push(step("r2"), (a,), (), cpu(0), "r2")             # RAW on a
        engine.push(step("w2"), (), (a,), cpu(1), "w2")             # WAR after r1, r2; WAW
        engine.push(step("w3"), (), (b,), cpu(0), "w3")             # WAW after r1
        engine.wait_all()
        order = {ev: k for k, ev in enumerate(log)}
        for before, after in [("w1", "r1"), ("w1", "r2"), ("r1", "w2"), ("r2", "w2"),
                              ("w1", "w2"), ("r1", "w3")]:
            assert order[("end", before)] < order[("start", after)], (before, after, log)
    finally:
        _shutdown(engine)


# ------------------------------------------------------------------ injected failures
def _failure_run(engine, devices, seed=7, n_ops=10_000, n_vals=128, chunk=50):
    """~1% of ops raise. wait_all after every chunk: it raises once per chunk with failures,
    naming its failing ops, and never one of an earlier chunk."""
    wl = Workload(seed, n_ops, n_vals, devices, p_fail=0.01)
    vars_ = [Var(f"v{k}") for k in range(n_vals)]
    cells, trace = _initial(n_vals), [None] * n_ops
    poison = [None] * n_vals
    ref_cells, ref_trace = _initial(n_vals), [None] * n_ops
    n_failed = n_reported = 0
    for lo in range(0, n_ops, chunk):
        part = Workload.__new__(Workload)
        part.ops, part.n_vals = wl.ops[lo:lo + chunk], n_vals
        failing = part.origin_failures(poison)
        part.serial(ref_cells, poison, ref_trace)
        wl.push_range(engine, vars_, cells, trace, lo, lo + chunk)
        if not failing:
            engine.wait_all()
            continue
        n_failed += len(failing)
        with pytest.raises(AsyncOpError) as info:
            engine.wait_all()
        msg = str(info.value)
        first = int(info.value.op_name[2:])
        assert first in failing, (msg, failing)
        assert info.value.where == (WHERE_FILE, first)
        assert f"op '{info.value.op_name}' (queued at {WHERE_FILE}:{first}) failed" in msg
        assert "InjectedError: injected failure in op" in msg
        assert isinstance(info.value.original, InjectedError)
        assert isinstance(info.value.__cause__, InjectedError)
        if len(failing) > 1:
            assert f"(and {len(failing) - 1} more failed op(s): " in msg, msg
        named = {int(x.split("'")[0]) for x in msg.split("op 'op")[1:]}
        assert named <= set(failing), (named, failing)  # no op of an earlier chunk again
        n_reported += len(failing)
        engine.wait_all()  # a second wait_all is clean
    assert n_failed >= 20, n_failed  # ~1% of 10,000 ops fail; a failing op with a failed
    # input does not run, so fewer raise themselves
    assert n_reported == n_failed
    assert trace == ref_trace  # the ops that ran saw exactly their serial inputs

    # every value that depends on a failure raises at every read, naming the failed op;
    # every other value is readable and correct
    n_poisoned = 0
    for k, v in enumerate(vars_):
        if poison[k] is None:
            engine.wait(v)
            engine.wait(v)
            assert cells[k] == ref_cells[k], f"value {k}"
        else:
            n_poisoned += 1
            for _ in range(3):
                with pytest.raises(AsyncOpError) as info:
                    engine.wait(v)
                assert info.value.op_name == f"op{poison[k]}"
                assert f"{WHERE_FILE}:{poison[k]}" in str(info.value)
    assert 0 < n_poisoned < n_vals
    engine.wait_all()  # reading poisoned values does not queue errors for wait_all

    # the engine keeps working: new ops (no failures) overwrite everything and clear poison
    wl2 = Workload(seed + 1000, 3_000, n_vals, devices, first_id=n_ops)
    trace2 = {}
    wl2.push_range(engine, vars_, cells, trace2)
    for k in range(n_vals):  # a write of every value: none stays poisoned
        engine.push(lambda k=k: cells.__setitem__(k, k), (), (vars_[k],), devices[k % len(devices)],
                    "reset", (WHERE_FILE, -1))
    engine.wait_all()
    ref2, ref_trace2 = list(ref_cells), {}
    wl2.serial(ref2, list(poison), ref_trace2)
    assert trace2 == ref_trace2
    for k, v in enumerate(vars_):
        engine.wait(v)
        assert cells[k] == k


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,workers,devices", [
    ("threaded", 1, (cpu(0), cpu(1))),
    ("threaded", 4, (cpu(0), cpu(1))),
    ("threaded", 2, (cpu(0),)),
    ("naive", 1, (cpu(0), cpu(1))),
])
def test_injected_failures(mode, workers, devices):
    engine = Engine(mode=mode, workers_per_device=workers)
    try:
        _failure_run(engine, devices)
    finally:
        _shutdown(engine)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("inline", [False, True])
def test_error_semantics_of_one_failed_op(inline):
    engine = Engine(workers_per_device=1)
    a, b, c, d = Var("a"), Var("b"), Var("c"), Var("d")
    cells = {}

    def boom():
        raise ValueError("bad shape")

    try:
        engine.push(boom, (), (a,), cpu(0), "boom", ("model.py", 12), inline)
        engine.push(lambda: cells.setdefault("b", 1), (a,), (b,), cpu(1), "use", None, inline)
        engine.push(lambda: cells.setdefault("c", 2), (), (c,), cpu(0), "fine", None, inline)
        with pytest.raises(AsyncOpError, match=r"op 'boom' \(queued at model.py:12\) failed: "
                                               r"ValueError: bad shape"):
            engine.wait_all()
        engine.wait_all()
        for var in (a, b, a, b):  # every read raises again: never stale data
            with pytest.raises(AsyncOpError, match="'boom'"):
                engine.wait(var)
        assert "b" not in cells  # the dependent op did not run
        engine.wait(c)
        assert cells["c"] == 2
        # an op that reads a failed value and writes another propagates the error
        engine.push(lambda: None, (b,), (d,), cpu(0), "later", None, inline)
        with pytest.raises(AsyncOpError, match="'boom'"):
            engine.wait(d)
        engine.wait_all()  # propagated errors are not new failures
        # writing the value afresh clears it
        engine.push(lambda: cells.__setitem__("a", 5), (), (a,), cpu(1), "rewrite", None, inline)
        engine.wait(a)
        assert cells["a"] == 5
    finally:
        _shutdown(engine)


@pytest.mark.timeout(30)
def test_error_raised_by_wait_is_not_raised_again_by_wait_all():
    """The first sync point that touches a failed value reports it; wait_all does not repeat
    it (the value itself keeps raising)."""
    engine = Engine(workers_per_device=1)
    a = Var("a")
    try:
        engine.push(lambda: 1 / 0, (), (a,), cpu(0), "div")
        with pytest.raises(AsyncOpError, match="ZeroDivisionError"):
            engine.wait(a)
        engine.wait_all()
        with pytest.raises(AsyncOpError, match="ZeroDivisionError"):
            engine.wait(a)
    finally:
        _shutdown(engine)


# ------------------------------------------------------------------ back-pressure
def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@pytest.mark.timeout(180)
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_back_pressure_bounds_inflight_and_memory():
    """1,000,000 pushes of a trivial op with no sync: in flight never exceeds the window and
    RSS stays flat. (11-16 s on the shared 2-core test machine: a push is ~7-15 us.)"""
    n, window = 1_000_000, 512
    engine = Engine(window=window, workers_per_device=1)
    vs = [Var() for _ in range(8)]
    noop = lambda: None  # noqa: E731
    push = engine.push
    dev = cpu(0)
    peak = 0
    rss0 = None
    # The first op holds the worker for 0.3 s: the pusher surely fills the window and blocks.
    gate = threading.Event()
    push(gate.wait, (), (vs[0],), dev, "gate")
    threading.Timer(0.3, gate.set).start()
    t0 = time.perf_counter()
    try:
        for i in range(n):
            push(noop, (vs[(i + 3) & 7],), (vs[i & 7],), dev, "noop")
            k = engine.inflight
            if k > peak:
                peak = k
            if i == n // 10:
                rss0 = _rss_bytes()
        engine.wait_all()
        elapsed = time.perf_counter() - t0
        growth = _rss_bytes() - rss0
        print(f"\n{n} pushes in {elapsed:.1f} s ({elapsed / n * 1e6:.1f} us/op), peak in flight "
              f"{peak}/{window}, RSS growth {growth / 2**20:.1f} MiB")
        assert peak <= window
        assert peak == window  # the pusher got ahead: back-pressure was exercised
        assert growth < 50 * 2**20
    finally:
        gate.set()
        _shutdown(engine)


# ------------------------------------------------------------------ timeouts
@pytest.mark.timeout(60)
def test_timeouts_name_the_pending_op_and_recover():
    engine = Engine(workers_per_device=1, window=4)
    gate = threading.Event()
    a, b, c = Var("a"), Var("b"), Var("c")
    cells = {}
    try:
        engine.push(lambda: (gate.wait(30), cells.setdefault("a", 1)), (), (a,), cpu(0),
                    "blocker", ("train.py", 3))
        engine.push(lambda: cells.setdefault("b", cells["a"] + 1), (a,), (b,), cpu(1),
                    "after_blocker", ("train.py", 4))
        with pytest.raises(WaitTimeout, match=r"value written by 'blocker' on cpu\(0\) "
                                              r"queued at train.py:3") as info:
            engine.wait(a, timeout=0.2)
        assert "running 'blocker'" in str(info.value)
        with pytest.raises(WaitTimeout, match="'after_blocker'"):
            engine.wait(b, timeout=0.2)
        with pytest.raises(WaitTimeout, match=r"all ops.*2 op\(s\) in flight.*'blocker'"):
            engine.wait_all(timeout=0.2)
        # the flag is the default timeout
        old = config.set_flag("HYBRID_WAIT_TIMEOUT", 0.2)
        try:
            with pytest.raises(WaitTimeout, match="'blocker'"):
                engine.wait(a)
            with pytest.raises(WaitTimeout):
                engine.wait_all()
            # back-pressure waits time out too: the window (4) fills up
            engine.push(lambda: None, (), (c,), cpu(0), "p1")
            engine.push(lambda: None, (), (c,), cpu(0), "p2")
            with pytest.raises(WaitTimeout, match=r"room in the engine window \(4 ops"):
                engine.push(lambda: None, (), (c,), cpu(0), "p3")
        finally:
            config.set_flag("HYBRID_WAIT_TIMEOUT", old)
        gate.set()
        engine.wait_all(timeout=30)
        engine.wait(b)
        assert cells == {"a": 1, "b": 2}
        engine.push(lambda: cells.setdefault("c", 3), (), (c,), cpu(0), "p4")
        engine.wait(c)
        assert cells["c"] == 3
    finally:
        gate.set()
        _shutdown(engine)


# ------------------------------------------------------------------ fork
def _in_child(body):
    """Run body() in a forked child; returns its exit code (0 = passed)."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 99
        try:
            code = body()
        except BaseException:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            code = 98
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _child_uses(engine):
    """0 when ``engine`` computes correctly in this process."""
    x, cell = Var("x"), []
    for k in range(100):
        engine.push(lambda k=k: cell.append(k), (), (x,), cpu(k % 2), "child_op")
    engine.wait(x)
    engine.wait_all()
    return 0 if cell == list(range(100)) else 3


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "fork"),
                    reason="os.fork on Linux")
def test_fork_without_pending_work():
    engine = Engine(workers_per_device=2)
    try:
        assert _child_uses(engine) == 0
        engine_mod.get_engine().wait_all()

        def child():
            if _child_uses(engine) != 0:  # the parent's engine, fresh workers in the child
                return 3
            if _child_uses(Engine()) != 0:  # a new engine
                return 4
            return _child_uses(engine_mod.get_engine()) and 5  # the process engine
        assert _in_child(child) == 0
        assert _child_uses(engine) == 0  # the parent is unaffected
    finally:
        _shutdown(engine)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "fork"),
                    reason="os.fork on Linux")
def test_fork_with_pending_work_makes_the_engine_unusable_in_the_child():
    engine = Engine(workers_per_device=1)
    gate = threading.Event()
    a, b = Var("a"), Var("b")
    cells = {}
    try:
        engine.push(lambda: (gate.wait(30), cells.setdefault("a", 1)), (), (a,), cpu(0), "slow")

        def child():
            def expect_unusable(call):
                try:
                    call()
                except EngineUnusable as exc:
                    msg = str(exc)
                    return "forked" in msg and "1 op(s) were in flight" in msg and \
                        "waitall" in msg
                return False
            if not expect_unusable(lambda: engine.wait(a, timeout=5)):
                return 3
            if not expect_unusable(lambda: engine.wait_all(timeout=5)):
                return 4
            if not expect_unusable(lambda: engine.push(lambda: None, (), (b,), cpu(0), "x")):
                return 5
            if _child_uses(Engine()) != 0:  # a fresh engine works in the child
                return 6
            return 0
        assert _in_child(child) == 0
        gate.set()
        engine.wait(a, timeout=30)
        assert cells == {"a": 1}
    finally:
        gate.set()
        _shutdown(engine)


# ------------------------------------------------------------------ parallel devices
@pytest.mark.timeout(120)
def test_gil_releasing_matmuls_on_two_devices():
    """Two 1500x1500 float32 matmuls on cpu(0) and cpu(1): results checked, times printed.
    (Speed-up is not asserted: the test machine's 2 cores are shared.)"""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1500, 1500), dtype=np.float32) for _ in range(2)]
    refs = [x @ x for x in xs]
    engine = Engine(workers_per_device=1)
    out = [None, None]
    vs = [Var("m0"), Var("m1")]

    def mm(k):
        def fn():
            out[k] = xs[k] @ xs[k]
        return fn

    try:
        for k in range(2):  # warm-up: workers and BLAS threads exist
            engine.push(mm(k), (), (vs[k],), cpu(k), f"mm{k}")
        engine.wait_all()
        t0 = time.perf_counter()
        for k in range(2):
            engine.push(mm(k), (), (vs[k],), cpu(k), f"mm{k}")
            engine.wait(vs[k])
        alone = time.perf_counter() - t0
        out[:] = [None, None]
        t0 = time.perf_counter()
        for k in range(2):
            engine.push(mm(k), (), (vs[k],), cpu(k), f"mm{k}")
        engine.wait_all()
        together = time.perf_counter() - t0
        print(f"\nmatmul 1500^2 x2: one after the other {alone * 1e3:.0f} ms, on cpu(0) and "
              f"cpu(1) together {together * 1e3:.0f} ms (ratio {alone / together:.2f})")
        for k in range(2):
            np.testing.assert_allclose(out[k], refs[k], rtol=1e-4, atol=1e-3)
    finally:
        _shutdown(engine)


# ------------------------------------------------------------------ lifecycle
@pytest.mark.timeout(60)
def test_shutdown_finishes_work_and_joins_threads():
    before = set(threading.enumerate())
    engine = Engine(workers_per_device=2)
    cell = []
    x = Var()
    for k in range(200):
        engine.push(lambda k=k: (time.sleep(0.0005), cell.append(k)), (), (x,), cpu(k % 2), "w")
    ours = set(threading.enumerate()) - before
    assert len(ours) == 4, ours  # 2 devices x 2 workers
    engine.shutdown()
    assert sorted(cell) == list(range(200)) and cell == list(range(200))
    alive = ours & set(threading.enumerate())
    assert not alive, alive
    assert all(not t.is_alive() for t in ours)
    engine.shutdown()  # idempotent
    with pytest.raises(EngineUnusable, match="shut down"):
        engine.push(lambda: None, (), (x,), cpu(0), "late")


@pytest.mark.timeout(30)
def test_set_engine_replaces_a_shut_down_engine():
    mine = Engine(workers_per_device=1)
    old = engine_mod.set_engine(mine)
    try:
        assert engine_mod.get_engine() is mine
        mine.shutdown()
    finally:
        assert engine_mod.set_engine(old) is mine  # no wait on the shut-down engine
    assert engine_mod.get_engine() is old


@pytest.mark.timeout(30)
def test_bad_arguments():
    with pytest.raises(ValueError, match="HYBRID_ENGINE"):
        Engine(mode="eager")
    engine = Engine(workers_per_device=1)
    try:
        with pytest.raises(TypeError, match="hb.cpu"):
            engine.push(lambda: None, (), (), "cpu:0", "op")
        engine.wait(Var())  # a value never written: nothing to wait for
        engine.wait_all()
    finally:
        _shutdown(engine)


def test_wait_idle_waits_reports_nothing_and_never_raises():
    eng = Engine()
    try:
        v = Var()
        eng.push(lambda: time.sleep(0.3), writes=(v,), device=cpu(0), name="slow")
        assert eng.wait_idle(0.02) is False  # timed out: no WaitTimeout
        assert eng.wait_idle(10.0) is True and eng.inflight == 0

        def fail():
            raise RuntimeError("boom")
        eng.push(fail, writes=(Var(),), device=cpu(0), name="failing")
        assert eng.wait_idle(10.0) is True  # the error is left for the next sync point
        with pytest.raises(AsyncOpError, match="boom"):
            eng.wait_all()
        syncs = eng.sync_points
        eng.wait_all()
        eng.wait(v)
        assert eng.sync_points == syncs + 2  # wait_idle is not one of the loop's syncs
    finally:
        eng.shutdown()


def test_wait_all_waits_for_what_was_queued_before_it_not_after():
    """Another thread that keeps queuing cannot keep waitall from returning (it used to wait
    until nothing at all was in flight)."""
    eng = Engine(workers_per_device=1)
    try:
        slow_done = threading.Event()
        eng.push(lambda: (time.sleep(0.3), slow_done.set()), device=cpu(0), name="slow")
        stop = threading.Event()

        def keep_queuing():
            while not stop.is_set():
                eng.push(lambda: time.sleep(0.002), device=cpu(1), name="tick")
                time.sleep(0.001)
        feeder = threading.Thread(target=keep_queuing)
        feeder.start()
        try:
            time.sleep(0.05)
            t0 = time.perf_counter()
            eng.wait_all(timeout=20)
            waited = time.perf_counter() - t0
            assert slow_done.is_set(), "returned before an op queued earlier finished"
            assert waited < 5, f"waited {waited:.1f}s: for the other thread's later ops too"
        finally:
            stop.set()
            feeder.join()
        eng.wait_all(timeout=20)
    finally:
        _shutdown(eng)


def test_ctrl_c_in_a_wait_drops_the_threads_queued_ops():
    """A KeyboardInterrupt reaching wait_all drops the ops this thread queued that have not
    started: the next op waits only for the one running, the dropped ops' values say why,
    and the next wait_all does not raise for them."""
    import signal
    eng = Engine(workers_per_device=1)
    try:
        dev = cpu(0)
        eng.push(lambda: time.sleep(1.0), device=dev, name="running")
        dropped = Var("dropped")
        for _ in range(40):
            eng.push(lambda: time.sleep(0.1), writes=(dropped,), device=dev, name="queued")
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            eng.wait_all(timeout=60)
        timer.join()
        ran = []
        nxt = Var("next")
        eng.push(lambda: ran.append(1), writes=(nxt,), device=dev, name="next")
        eng.wait(nxt, timeout=60)
        assert ran and time.perf_counter() - t0 < 2.5, "the next op waited for dropped ops"
        with pytest.raises(AsyncOpError, match="interrupted"):
            eng.wait(dropped, timeout=60)
        eng.wait_all(timeout=60)  # nothing unreported: the thread got its KeyboardInterrupt
    finally:
        _shutdown(eng)


def test_exit_after_ctrl_c_does_not_wait_for_the_dropped_work(tmp_path):
    import subprocess
    import textwrap
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, threading, time
        sys.path.insert(0, %r)
        import hybrid as hb
        from runtime import engine
        eng = engine.get_engine()
        for _ in range(30):
            eng.push(lambda: time.sleep(0.5), device=hb.cpu(0), name="long")
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        hb.waitall()
    """ % os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    took = time.perf_counter() - t0
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    assert took < 6, f"exit took {took:.1f}s: it waited for the dropped work (15 s of it)"
