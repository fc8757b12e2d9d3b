"""Where long compiled calls run: in the caller, or on the device's engine worker.

A quick call (dispatch._INLINE_US) always runs in the caller when its device is idle. For
longer ones neither choice wins everywhere: on the engine the front end's Python overlaps the
native calls, but handing a call to the worker costs a thread wake-up and GIL round trips,
and on a 2-core machine the Python and a 2-thread GEMM slow each other down. Measured on a
2-vCPU Xeon: the book's MLP at batch 64 (~10 us of Python per ~95 us call) runs at 101-104 us
a call in the caller vs 115-119 on the engine; an MLP training step (~290 us of Python, ~1 ms
of native calls) at 1.31-1.38 ms in the caller vs 1.46 on the engine when the loop syncs every
step (a d2l loop reading its loss), but 1.33-1.37 vs 1.22 when it syncs every 20 steps.

So each device measures both: the first long executable called is the *anchor*, and a window
runs from one anchor call to the TRIAL-th next (a loop's iterations, whatever else they
call). After an untimed warm-up window, windows alternate between the engine and the caller;
each ends by waiting for the device's engine to go idle (so it counts all the work it pushed)
and is timed to that point.
After WINDOWS windows the faster path is kept for every long call on the device, and measured
again after RETRY long calls, or as soon as the loop's rate of sync points (waits for
results, per iteration) moves by SYNC_SHIFT from what it was during the trial: a loop that
starts or stops reading its loss every iteration. Either path computes the same
results.
"""
from __future__ import annotations

TRIAL = 12  # anchor calls (loop iterations) per window: an engine window loses its pipeline fill
# (the first iteration overlaps nothing), ~2% of the window at the MLP training step
WINDOWS = 7  # windows per trial: a warm-up on the engine (compiles, page faults, pools
# filling: not timed), then engine and caller three times each, interleaved (the machine's
# speed drifts by ~10% over seconds: each path's best window is compared)
RETRY = 4096  # long calls between trials
ANCHOR_GAP = 128  # long calls without the anchor: the loop moved on, start over with a new one
DRAIN_TIMEOUT = 1.0  # seconds a window's end waits for the engine (other threads may keep it
# busy): past it the trial gives up and keeps the engine
PATIENCE = 0.25  # seconds per iteration: longer is the loop pausing, not computing
SYNC_SHIFT = 0.5  # sync points per iteration: a change this large re-runs the trial
# Eager ops' trials keep the engine only where it is clearly faster: their windows measured
# both paths alike (~278 us an iteration) at the book's MLP at batch 64, eager, where the
# caller then runs at ~165-212 us and the engine at ~290 (2-vCPU Xeon): a tie there was a coin
# toss that, lost, cost 35%. A loop over two devices still overlaps on the engine (~2x).
EAGER_ENGINE_MARGIN = 0.85  # the engine's best window must be this fraction of the caller's
# ... and run again only after this many long calls: a trial's windows ran that loop at
# 250-700 us an iteration (both paths), a window's drain and the switches between paths
# included; after RETRY long calls every other block of 1000 iterations was 35-60% slower
EAGER_RETRY = 16 * RETRY


class DispatchTrial:
    """The path of one device's long calls, chosen by trial (see the module docstring).
    ``direct(key, clock, drain, syncs)`` is asked once per long call: ``key`` names the
    executable, ``clock()`` reads seconds, ``drain(timeout)`` waits until the engine is idle
    (False: it was not within timeout seconds) and ``syncs()`` counts the front end's sync
    points so far (drain's own not included)."""

    def __init__(self, engine_margin: float = 1.0, retry: int = RETRY):
        self.engine_margin = engine_margin  # the engine is kept when its best window is
        self.retry = retry                  # below this fraction of the caller's
        self._restart()

    def _restart(self):
        self.calls = 0  # long calls of the trial so far, or since the decision
        self.since_anchor = 0  # long calls since the anchor's last one
        self.choice = None  # True: in the caller; False: the engine; None: trying
        self.anchor = None
        self.anchors = 0
        self.window = 0
        self.start = None
        self.per_iter = {True: [], False: []}  # seconds per anchor call, by window
        self.sync_rate = None  # sync points per iteration during the trial
        self.mark = None  # (anchors, syncs) when the trial, or the current check, began

    def _decide(self, choice: bool) -> bool:
        self.choice, self.calls = choice, 0
        return choice

    def _loop_changed(self, syncs) -> bool:
        """At a decided anchor call: whether the loop's sync rate moved (every TRIAL)."""
        self.anchors += 1
        if self.anchors % TRIAL or self.sync_rate is None:  # (None: the trial gave up)
            return False
        anchors, before = self.mark
        self.mark = (self.anchors, syncs())
        rate = (self.mark[1] - before) / (self.anchors - anchors)
        return abs(rate - self.sync_rate) >= SYNC_SHIFT

    def direct(self, key, clock, drain, syncs) -> bool:
        self.since_anchor = 0 if key == self.anchor else self.since_anchor + 1
        if self.choice is not None:
            self.calls += 1
            if self.calls < self.retry and self.since_anchor < ANCHOR_GAP and not (
                    key == self.anchor and self._loop_changed(syncs)):
                return self.choice
            self._restart()
        elif self.since_anchor >= ANCHOR_GAP:  # the anchor is not called any more
            self._restart()
        self.calls += 1
        if self.anchor is None:
            self.anchor = key
        if key == self.anchor:
            if self.anchors % TRIAL == 0:  # a window boundary
                if self.start is None:
                    self.mark = (0, syncs())
                else:
                    n = syncs()  # before the drain: its wait is not the loop's
                    if not drain(DRAIN_TIMEOUT):
                        return self._decide(False)
                    per = (clock() - self.start) / TRIAL
                    if per < PATIENCE and self.window:
                        self.per_iter[self.window % 2 == 0].append(per)
                    self.window += 1
                    if self.window == WINDOWS:
                        self.sync_rate = (n - self.mark[1]) / self.anchors
                        self.mark, self.anchors = (0, n), 0
                        caller, engine = self.per_iter[True], self.per_iter[False]
                        # nothing to compare (the loop kept pausing): keep the engine
                        return self._decide(bool(caller and engine) and
                                            min(caller) < min(engine) / self.engine_margin)
                self.start = clock()
            self.anchors += 1
        return self.window % 2 == 0 and self.window > 0  # the engine first
