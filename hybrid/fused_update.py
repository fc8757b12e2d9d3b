"""One compiled optimizer step for every parameter of a device (MXNet's ``use_fused_step``).

The optimizer's own rule (``Optimizer._rule``, the code the eager path runs) is traced once
over all parameters of one device and dtype, with this step's scalars (learning rate, bias
corrections, 1 / batch size) as a small input matrix: a learning-rate schedule or a growing
step count changes inputs, never the compiled code. The whole update is then one native
call instead of several eager ops per parameter, and its loops fuse per parameter.
"""
from __future__ import annotations

import numpy as np

from runtime import config

from . import tracing
from .ndarray import NDArray, array
from .optimizer import Coefs

_log = config.logger("compile")


class FusedUpdate:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._fns: dict = {}
        self._broken: set = set()  # static keys whose rule could not be traced

    def available(self) -> bool:
        return self.optimizer.fusable() and tracing._llvm_available()

    def step(self, items):
        """``items``: (index, weights, grads, states) per parameter, one entry per device copy
        in each list; the same bookkeeping as ``Optimizer.update``, then one compiled call per
        (device, dtype) group."""
        opt = self.optimizer
        groups: dict = {}
        for index, weights, grads, states in items:
            t = opt._count(index)
            lr, wd = opt._lr_wd(index)
            c = opt.coefficients(index, lr, wd, t)
            for w, g, s in zip(weights, grads, states):
                groups.setdefault((w.device, w._dtype), []).append((w, g, s, c))
        for (device, dtype), members in groups.items():
            self._run_group(device, dtype, members)

    def _run_group(self, device, dtype, members):
        opt = self.optimizer
        names = tuple(members[0][3].values)
        flags = tuple((c.wd_on, c.rescale_on) for *_, c in members)
        key = (opt.static_key(), names, flags)
        if key in self._broken:
            return _eager(opt, members)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = tracing.HybridFunction(_traced_rule(opt, names, flags))
        coefs = array(np.array([[c.values[n] for n in names] for *_, c in members]),
                      dtype=dtype, device=device)
        ws = [m[0] for m in members]
        gs = [m[1] for m in members]
        ss = [m[2] for m in members]
        try:
            new_ws, new_ss = fn(ws, gs, ss, coefs)
        except tracing.TraceError as exc:  # a rule written with non-traceable Python
            _log.warning("optimizer %s: the update rule cannot be compiled (%s); running it "
                         "eagerly", type(opt).__name__, exc)
            self._broken.add(key)
            return _eager(opt, members)
        for w, nw in zip(ws, new_ws):
            w._rebind(nw)
        for s, ns in zip(ss, new_ss):
            for a, na in zip(_leaves(s), _leaves(ns)):
                a._rebind(na)


def _traced_rule(opt, names, flags):
    def fused_update(ws, gs, ss, coefs):
        for k, (w, g, s) in enumerate(zip(ws, gs, ss)):
            c = Coefs({n: coefs[k, j] for j, n in enumerate(names)}, *flags[k])
            opt._rule(w, g, s, c)  # in-place assignments rebind the traced values
        return ws, ss
    fused_update.__name__ = f"{type(opt).__name__.lower()}_update"
    return fused_update


def _eager(opt, members):
    for w, g, s, c in members:
        opt._rule(w, g, s, c)


def _leaves(state):
    if state is None:
        return ()
    if isinstance(state, NDArray):
        return (state,)
    return tuple(state)
