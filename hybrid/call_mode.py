"""Where a long compiled call runs: in the caller, or on the device's engine worker.

A quick call (tracing._INLINE_US) always runs in the caller. For a longer one neither choice
wins everywhere: on the engine the front end's Python between calls overlaps the native
call, but handing the call to the worker costs a thread wake-up and GIL round trips (on a
2-core VM ~15-25 us a call). A loop doing little besides the call (the book's MLP at batch 64:
~10 us of Python per ~95 us call) is faster in the caller (115-119 -> 101-103 us a call);
a loop with much Python between calls gains from the overlap.

So each executable measures both: alternate windows of TRIAL calls on either path (engine,
caller, engine, caller), take the path with the lower time per call, and measure again every
RETRY calls in case the loop around the call changed. Either path computes the same results.
An engine window's time runs from its first call to the end of its last call's native run
(``done_at``, which the engine path records): pushes return long before the work is done.
A caller window starts by waiting for the engine to finish (its calls would otherwise compete
with the engine's backlog for the cores; the wait is spent computing that backlog); its calls
are timed start to start (the caller's Python, waits and the call itself).
"""
from __future__ import annotations

import statistics

TRIAL = 8  # calls per window
WINDOWS = 4  # windows per trial: engine, caller, engine, caller
RETRY = 4096  # calls between trials
PATIENCE = 0.25  # seconds: a gap longer than this is the loop pausing, not a call


class CallMode:
    """The path of one executable's long calls, chosen by trial (see the module docstring).
    ``direct(now, done_at, drain)`` is asked once per call, with the call's start time, when
    the latest engine-path call of the executable finished (seconds, perf_counter's clock)
    and a function that waits until the engine has nothing in flight."""

    def __init__(self):
        self.last = None
        self._restart()

    def _restart(self):
        self.calls = 0  # calls of the trial so far, or since the decision
        self.choice = None  # True: in the caller; False: the engine; None: trying
        self.engine_start = None  # when the current engine window began
        self.per_call = {True: [], False: []}

    @staticmethod
    def _window_mode(call: int) -> bool:
        return (call // TRIAL) % 2 == 1  # engine first: the path taken before any decision

    def _decide(self, choice: bool) -> bool:
        self.choice, self.calls = choice, 0
        return choice

    def direct(self, now: float, done_at, drain) -> bool:
        last, self.last = self.last, now
        if self.choice is not None:
            self.calls += 1
            if self.calls < RETRY:
                return self.choice
            self._restart()
        call = self.calls
        mode = self._window_mode(call)
        if call % TRIAL == 0:
            if mode:  # a caller window: once the engine window's calls are done
                drain()
                done_at = done_at()
                start = self.engine_start
                if start is not None and done_at is not None and \
                        0 < done_at - start < PATIENCE * TRIAL:
                    self.per_call[False].append((done_at - start) / TRIAL)
            else:
                self.engine_start = now
        elif mode and call % TRIAL != 1 and now - last < PATIENCE:  # (1: after the drain)
            self.per_call[True].append(now - last)
        if call == TRIAL * WINDOWS:
            caller, engine = self.per_call[True], self.per_call[False]
            # nothing to compare (the loop kept pausing): keep the engine
            return self._decide(bool(caller and engine) and
                                statistics.median(caller) < statistics.median(engine))
        self.calls += 1
        return mode
