"""Where a long compiled call runs (hybrid/call_mode.py): a trial of both paths on synthetic
clocks, then the real thing: a call measured long runs either way with the same results."""
import numpy as np

import hybrid as hb
from hybrid import call_mode, nn, tracing
from hybrid.call_mode import PATIENCE, RETRY, TRIAL, WINDOWS, CallMode


class Loop:
    """A loop calling one executable: caller calls take `caller_us` start to start; an engine
    window's calls finish `engine_us` apart after the window starts."""

    def __init__(self, caller_us, engine_us, gap_us=5.0):
        self.mode, self.now = CallMode(), 0.0
        self.caller, self.engine, self.gap = caller_us * 1e-6, engine_us * 1e-6, gap_us * 1e-6
        self.done_at, self.drains, self.paths = None, 0, []

    def drain(self):
        self.drains += 1
        if self.done_at is not None:
            self.now = max(self.now, self.done_at)

    def call(self):
        direct = self.mode.direct(self.now, lambda: self.done_at, self.drain)
        self.paths.append(direct)
        if direct:
            self.now += self.caller
        else:  # a push returns at once; the work finishes engine_us after the previous
            self.done_at = max(self.done_at or 0.0, self.now) + self.engine
            self.now += self.gap
        return direct

    def run(self, n):
        for _ in range(n):
            self.call()
        return self


def test_trial_alternates_windows_then_keeps_the_faster_path():
    loop = Loop(caller_us=100, engine_us=130).run(TRIAL * WINDOWS + 50)
    trial = loop.paths[:TRIAL * WINDOWS]
    assert trial == [(i // TRIAL) % 2 == 1 for i in range(TRIAL * WINDOWS)]
    assert loop.mode.choice is True and all(loop.paths[TRIAL * WINDOWS:])
    assert loop.drains == WINDOWS // 2  # once per caller window
    assert abs(np.median(loop.mode.per_call[True]) - 100e-6) < 1e-9
    assert abs(np.median(loop.mode.per_call[False]) - 130e-6) < 5e-6


def test_the_engine_wins_when_it_overlaps_the_callers_python():
    loop = Loop(caller_us=100, engine_us=70).run(TRIAL * WINDOWS + 10)
    assert loop.mode.choice is False and not any(loop.paths[TRIAL * WINDOWS:])


def test_a_pausing_loop_keeps_the_engine():
    loop = Loop(caller_us=PATIENCE * 2e6, engine_us=PATIENCE * 2e6).run(TRIAL * WINDOWS + 1)
    assert loop.mode.choice is False


def test_the_trial_is_repeated_every_retry_calls():
    loop = Loop(caller_us=100, engine_us=130).run(TRIAL * WINDOWS + 1)
    assert loop.mode.choice is True
    loop.caller = 200e-6  # the loop around the call changed: the caller is slower now
    loop.run(RETRY + TRIAL * WINDOWS + 1)
    assert loop.mode.choice is False


def test_long_calls_give_the_same_results_on_either_path(monkeypatch):
    monkeypatch.setattr(tracing, "_INLINE_US", 0.0)  # every call counts as long
    monkeypatch.setattr(call_mode, "RETRY", TRIAL * WINDOWS)  # try both paths again and again
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(4))
    net.initialize()
    x = hb.random.normal(size=(16, 20))
    want = net(x).asnumpy()  # eager
    net.hybridize()
    outs = [net(x) for _ in range(5 * TRIAL * WINDOWS)]
    for o in outs:
        np.testing.assert_allclose(o.asnumpy(), want, rtol=1e-5, atol=1e-6)
    entry = next(iter(net._cached.entries.values()))
    mode = entry.exe.report["call_mode"]
    assert mode.per_call[True] or mode.per_call[False]  # the trial measured calls
