"""Where a compiled call runs: in the caller, or as one op on its device's engine.

A call that autograd does not record and that touches no state (CachedFunction's ``direct``
entries, deployed models) runs in the caller when it is quick (or the device's DispatchTrial
found the loop faster so, call_mode.py) and its inputs are computed: no dependency tracking
is lost, as buffers are immutable and its outputs are fresh. Everything else is pushed to the
engine, which orders it after the ops writing its inputs. At batch 1 the Python around one
native call is most of the cost, so the caller's path reads state held per executable
(:class:`Caller`) and checks only what can change between calls.
"""
from __future__ import annotations

from operator import attrgetter
from time import perf_counter, thread_time

import numpy as np

from runtime import engine as _engine_mod
from runtime import transfer as _transfer_mod
from runtime.device import parse_device
from runtime.executable import PartitionedExecutable
from runtime.memory import Buffer

from ._where import user_frame
from .call_mode import EAGER_ENGINE_MARGIN, EAGER_RETRY, DispatchTrial
from .ndarray import NDArray, rebind_token
from .nn.parameter import data_epoch

_INLINE_US = 60.0  # a compiled call this quick runs in the caller when its device is idle
_SAMPLE_EVERY = 16  # a compiled call's cost is steady: the caller's path times one call in 16
_buf_of = attrgetter("_buf")
_trials: dict = {}  # device (or (device, 'eager')) -> DispatchTrial


class Caller:
    """Runs one executable's calls, keeping what they share: its cost estimate's dict, the
    parameters' arrays (re-read only when the parameter list, a Parameter's arrays or some
    array's buffer changed: every in-place update leaves a new rebind token), the output
    specs, a call count for sampling the cost. Held by whoever holds the executable (a
    CachedFunction's entry, a deployed model), never by the executable: no reference cycle
    keeps a dropped executable's arena alive."""

    __slots__ = ("exe", "device", "timing", "run", "xp", "outs", "out_shape", "out_dtype",
                 "held", "calls", "direct")

    def __init__(self, exe, device):
        self.exe, self.device, self.timing = exe, device, exe.report
        self.run = getattr(exe, "run", None)  # a PartitionedExecutable has none: its parts
        # run on the engine (it never gets a cost estimate, so _inline stays False)
        self.xp = device.xp
        # a GPU's call runs where the GPU is activated (its worker, or the engine's inline
        # run): the caller's thread has no current GPU stream
        self.direct = device.kind == "cpu"
        self.outs = [(tuple(s.shape), s.dtype) for s in exe.out_specs]
        self.out_shape, self.out_dtype = self.outs[0] if self.outs else (None, None)
        # (params list, rebind token, data epoch, their buffers, their arrays): one tuple,
        # replaced by one store, so a thread never sees the fields of two different reads
        self.held = (None, None, None, None, None)
        self.calls = 0

    def __call__(self, args, params, name):
        """The output arrays. Computed right here when _inline says so and the inputs and
        parameters are computed already: buffers are immutable, so nothing queued can change
        them, and the outputs are fresh buffers no queued op knows, so skipping dependency
        tracking loses no ordering (the batch-1 path: one frame). Else (a pending input, a
        failure: the engine re-runs it and reports the error where the result is read, as
        always) queued on the engine."""
        us = self.timing.get("avg_us")
        if us is not None and us < _INLINE_US and _engine_mod._engine is not None and \
                _engine_mod._engine.inline:  # _inline's common case, spelled out: per call
            inline = True
        else:
            inline = _inline(self.exe, self.device)
        if inline and self.direct:
            ins = []
            for a in args:
                d = a._buf.data
                if d is None:
                    break
                ins.append(d)
            else:
                held = self.held
                ps = held[4] if params is held[0] and rebind_token[0] is held[1] and \
                    data_epoch[0] == held[2] else self.param_data(params)
                if ps is not None:
                    calls = self.calls = self.calls + 1
                    t0 = None if calls % _SAMPLE_EVERY else thread_time()
                    try:
                        res = self.run(self.xp, ins, ps)
                    except Exception:  # noqa: BLE001 - re-run through the engine: it reports
                        res = None
                    if res is not None:
                        if t0 is not None:
                            _note_cost(self.timing, thread_time() - t0)
                        device = self.device
                        if len(res) == 1:
                            return [NDArray(Buffer(res[0]), self.out_shape, self.out_dtype,
                                            device)]
                        return [NDArray(Buffer(r), shape, dt, device)
                                for r, (shape, dt) in zip(res, self.outs)]
        return _push(self.exe, self.device, [a._buf for a in args],
                     list(map(_buf_of, params)), self.exe.out_specs, name, inline)

    def param_data(self, params):
        """The parameters' arrays, or None while one is still being computed; the same list
        object while the buffers are the same (NativeRun's binding check is then a single
        identity test). A call skips this while nothing changed (see the class)."""
        token, epoch = rebind_token[0], data_epoch[0]  # read before the buffers
        bufs = tuple(map(_buf_of, params))
        held = self.held
        data = held[4]
        if bufs != held[3]:  # buffers are immutable: the same buffers hold the same data
            data = []
            for b in bufs:
                d = b.data
                if d is None:
                    return None
                data.append(d)
        self.held = (params, token, epoch, bufs, data)
        return data


def _inline(exe, device) -> bool:
    """Whether a call may run in the caller: a quick one always (when its device is idle), a
    long one when the device's DispatchTrial found the loop faster so (call_mode.py)."""
    engine = _engine_mod._engine or _engine_mod.get_engine()
    us = exe.report.get("avg_us")
    if us is None or not engine.inline:  # the first call: its cost is not known yet
        return False
    if us < _INLINE_US:
        return True
    return long_call_direct(id(exe), device, engine)


def long_call_direct(key, device, engine, eager: bool = False) -> bool:
    """Whether a long call runs in the caller when its device is idle: a DispatchTrial of
    the device decides, timing the loop both ways (call_mode.py); ``key`` names the call
    (the same key at every iteration of a loop). Eager ops too big to run in the caller
    always (ndarray._may_inline) have a trial of their own (``eager``): a loop's many long
    eager ops never crowd out the anchor of its compiled calls' trial."""
    where = (device, "eager") if eager else device
    trial = _trials.get(where)
    if trial is None:
        trial = _trials[where] = DispatchTrial(EAGER_ENGINE_MARGIN, EAGER_RETRY) if eager \
            else DispatchTrial()
    return trial.direct(key, perf_counter, engine.wait_idle, engine.count_sync_points)


def _push(exe, device, in_bufs, param_bufs, out_specs, name, inline=None):
    """Queue one compiled call on the engine (inline: whether it may run in the caller when
    its device is idle; None: decide with _inline)."""
    if isinstance(exe, PartitionedExecutable):
        return _push_parts(exe, in_bufs, param_bufs, name)
    outs = [NDArray(Buffer(), s.shape, s.dtype, device) for s in out_specs]
    out_bufs = [o._buf for o in outs]
    xp = device.xp
    timing = exe.report

    def run():
        t0 = thread_time()  # CPU time: waiting for the GIL or a busy core does not count
        res = exe(xp, [b.data for b in in_bufs], [b.data for b in param_bufs])
        for ob, r in zip(out_bufs, res):
            ob.data = r
        # decides whether later calls may run inline (no thread hand-off)
        _note_cost(timing, thread_time() - t0)

    if inline is None:
        inline = _inline(exe, device)
    _engine_mod.get_engine().push(
        run, tuple(b.var for b in in_bufs) + tuple(b.var for b in param_bufs),
        tuple(b.var for b in out_bufs), device, name, user_frame(), inline)
    return outs


def _push_parts(exe, in_bufs, param_bufs, name):
    """A graph spanning devices: one engine op per part on its own device; the engine orders
    a part after the parts whose outputs it reads, and runs the others at once."""
    outs = []
    moved: dict = {}  # (buffer id, device) -> its copy there, made once per call
    for part in exe.parts:
        device = parse_device(part.device)
        ins = [in_bufs[r[1]] if r[0] == "input" else outs[r[1]][r[2]]._buf
               for r in part.inputs]
        ins = [_moved(b, src, device, moved, name)
               for b, src in zip(ins, part.input_devices or [part.device] * len(ins))]
        ps = [param_bufs[r[1]] for r in part.params]
        outs.append(_push(part.exe, device, ins, ps, part.exe.out_specs,
                          f"{name}@{part.device}"))
    results = []
    for ref, spec in zip(exe.outputs, exe.out_specs):
        if ref[0] == "part":
            results.append(outs[ref[1]][ref[2]])
        elif ref[0] == "const":
            results.append(NDArray(Buffer(np.array(ref[1])), spec.shape, spec.dtype,
                                   exe.device))
        else:  # an input or parameter handed back: buffers are immutable, share it
            buf = (in_bufs if ref[0] == "input" else param_bufs)[ref[1]]
            results.append(NDArray(buf, spec.shape, spec.dtype, exe.device))
    return results


def _moved(buf, src, device, moved, name):
    """``buf`` (on device ``src``) where a part on ``device`` can read it: the buffer itself
    on the same device or between CPU devices (they share memory), else a copy queued on the
    engine (a GPU part cannot read host memory, nor a CPU part a GPU's)."""
    src = parse_device(src)
    if src == device or (src.kind == "cpu" and device.kind == "cpu"):
        return buf
    key = (id(buf), device)
    if key not in moved:
        moved[key] = (buf, _transfer_mod.push_copy(buf, src, device, f"{name}:to {device}",
                                                   user_frame()))
    return moved[key][1]  # (the source is held beside its copy: its id stays unique)


def _note_cost(timing: dict, seconds: float):
    """Update a compiled call's cost estimate (``avg_us``), which decides whether it runs
    in the caller. A decayed minimum, not a mean: a sample inflated by a busy core (a pool
    thread preempted while the caller waits for its chunk) must not flip a quick call onto
    the engine path, where hand-offs keep inflating the samples (measured: 13 -> 32 us per
    batch-1 call, stuck). A call that really got slower still moves up, 10% per sample."""
    us = seconds * 1e6
    timing["avg_us"] = min(us, 1.1 * timing.get("avg_us", us))
