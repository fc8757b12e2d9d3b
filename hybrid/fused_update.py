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
from .ndarray import NDArray, _from_numpy
from .optimizer import Coefs

_log = config.logger("compile")


class FusedUpdate:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._fns: dict = {}
        self._coefs: dict = {}  # (key, device, dtype) -> (the scalars, their array)
        self._broken: set = set()  # static keys whose rule could not be traced

    def available(self) -> bool:
        return self.optimizer.fusable() and tracing._llvm_available()

    def step(self, items):
        """``items``: (index, weights, grads, states) per parameter, one entry per device copy
        in each list; the same bookkeeping as ``Optimizer.update``, then one compiled call per
        (device, dtype) group."""
        opt = self.optimizer
        static = opt.static_key()  # once per step: hyper-parameters may change between steps
        groups: dict = {}
        for index, weights, grads, states in items:
            t = opt._count(index)
            lr, wd = opt._lr_wd(index)
            c = opt.coefficients(index, lr, wd, t)
            for w, g, s in zip(weights, grads, states):
                key = (w.device, w._dtype)
                members = groups.get(key)
                if members is None:
                    members = groups[key] = []
                members.append((w, g, s, c))
        for (device, dtype), members in groups.items():
            self._run_group(device, dtype, members, static)

    def _run_group(self, device, dtype, members, static):
        opt = self.optimizer
        names = tuple(members[0][3].values)
        flags = tuple([(c.wd_on, c.rescale_on) for *_, c in members])
        states = [m[2] for m in members]
        layouts = tuple(_layout(s) for s in states)
        key = (static, names, flags, layouts)
        if key in self._broken:
            return _eager(opt, members)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = tracing.HybridFunction(
                _traced_rule(opt, names, flags, layouts))
        values = tuple([tuple(map(c.values.__getitem__, names)) for *_, c in members])
        held = self._coefs.get((key, device, dtype))  # a constant learning rate: the same
        if held is None or held[0] != values:  # array every step (arrays are immutable)
            held = self._coefs[(key, device, dtype)] = (
                values, _from_numpy(np.array(values, dtype=dtype), device))
        coefs = held[1]
        ws = [m[0] for m in members]
        leaves = [a for s in states for a in _leaves(s)]
        try:  # flat positional arrays in and out: the compiled call's fast path
            outs = fn(*ws, *(m[1] for m in members), *leaves, coefs)
        except tracing.TraceError as exc:  # a rule written with non-traceable Python
            _log.warning("optimizer %s: the update rule cannot be compiled (%s); running it "
                         "eagerly", type(opt).__name__, exc)
            self._broken.add(key)
            return _eager(opt, members)
        for a, new in zip(ws + leaves, outs):
            a._rebind(new)


def _traced_rule(opt, names, flags, layouts):
    n = len(flags)

    def fused_update(*args):
        ws, gs, coefs = list(args[:n]), args[n:2 * n], args[-1]
        rest = iter(args[2 * n:-1])
        ss = [_rebuild(layout, rest) for layout in layouts]
        for k in range(n):
            c = Coefs({name: coefs[k, j] for j, name in enumerate(names)}, *flags[k])
            opt._rule(ws[k], gs[k], ss[k], c)  # in-place assignments rebind the traced values
        return tuple(ws) + tuple(a for s in ss for a in _leaves(s))
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


def _layout(state):
    """How a state is built from its leaves: None, one array, or a tuple/list of arrays."""
    if state is None or isinstance(state, NDArray):
        return None if state is None else "a"
    return (type(state), len(state))


def _rebuild(layout, leaves):
    if layout is None:
        return None
    if layout == "a":
        return next(leaves)
    kind, count = layout
    return kind(next(leaves) for _ in range(count))
