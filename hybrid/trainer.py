"""``hb.Trainer``: applies an optimizer to a set of Parameters, Gluon's way.

    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    with autograd.record():
        l = loss(net(x), y)
    l.backward()
    trainer.step(batch_size)        # grads are rescaled by 1 / batch_size

A parameter with copies on several devices (``net.initialize(device=[cpu(0), cpu(1)])``)
has its gradients summed across devices first (``allreduce_grads``, through the key-value
store: ``kvstore='device'`` sums on the devices with a ring allreduce, ``'local'`` on cpu(0)),
then every copy gets the same update (``update``), so the copies stay identical.

Across processes (``hybrid launch -n N script.py``): ``kvstore='dist_sync'`` sums the
gradients of every worker each step (the first step broadcasts rank 0's weights, so all
workers start equal; create the Trainer after ``net.initialize()`` and a first forward pass
for deferred shapes, or the first step's gradients come from each worker's own initial
weights); ``step(batch_size)`` takes each worker's own batch size and the sum is
divided by the number of workers, so N workers with batch b train like one process with
batch N * b. ``kvstore='dist_async'`` updates on a parameter server (``update_on_kvstore``):
each step pushes this worker's gradients and pulls the current weights, with no barrier.
"""
from __future__ import annotations

import numbers

from . import kv as _kv
from . import optimizer as _opt
from .checkpoint import read_safetensors, write_safetensors
from .fused_update import FusedUpdate
from .ndarray import NDArray, array
from .nn.parameter import Parameter, eager_scope

__all__ = ["Trainer", "StaleGradientError"]


class StaleGradientError(RuntimeError):
    """A parameter's gradient was not written by backward since the last update."""


def _check_batch_size(batch_size):
    """An empty batch (or a negative size, which would flip the update) has no step to take:
    refused by name (Gluon divides by it and raises a bare ZeroDivisionError)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Real) or \
            not batch_size > 0:
        raise ValueError(f"Trainer.step: batch_size must be a positive number (the gradients "
                         f"are divided by it), got {batch_size!r}; an empty batch has no "
                         "gradient to apply: skip the step")


class Trainer:
    """params: a dict (``net.collect_params()``) or list of Parameters; optimizer: a name
    ('sgd', 'nag', 'adam', 'adamw', 'rmsprop', 'adagrad') or an Optimizer;
    optimizer_params: its arguments (learning_rate, wd, momentum, clip_gradient,
    lr_scheduler, ...). kvstore: 'device' (default), 'local', 'dist_sync', 'dist_async',
    any name ``hb.kv.registered()`` lists, an ``hb.kv.KVStore``, or None (multi-device
    gradients are then summed in process without a store). update_on_kvstore: run the
    optimizer on the store (default: only for dist_async, which needs it)."""

    def __init__(self, params, optimizer, optimizer_params=None, kvstore="device",
                 compression_params=None, update_on_kvstore=None):
        if isinstance(params, dict):
            items = list(params.items())
        elif isinstance(params, (list, tuple)):
            items = [(None, p) for p in params]
        else:
            raise TypeError(f"Trainer: params must be a dict (net.collect_params()) or a list "
                            f"of Parameters, got {type(params).__name__}")
        self._params, self._names, seen = [], [], set()
        for name, p in items:
            if not isinstance(p, Parameter):
                raise TypeError(f"Trainer: expected Parameters, got {type(p).__name__}"
                                + (f" for '{name}'" if name else ""))
            if id(p) in seen:  # a shared parameter listed under two names
                continue
            seen.add(id(p))
            self._params.append(p)
            self._names.append(name or p.full_name)
        if len(set(self._names)) != len(self._names):
            self._names = [f"{i}.{n}" for i, n in enumerate(self._names)]
        # keys on the kvstore: the same on every worker (structured names, or position)
        self._kv_keys = list(self._names) if isinstance(params, dict) else \
            [f"{i}.{p.name}" for i, p in enumerate(self._params)]
        if isinstance(kvstore, str):
            if kvstore.lower() not in _kv.registered():
                raise ValueError(f"Trainer: unknown kvstore {kvstore!r}; known: "
                                 f"{', '.join(_kv.registered())} (or None)")
        elif kvstore is not None and not isinstance(kvstore, _kv.KVStore):
            raise TypeError(f"Trainer: kvstore must be a store name, an hb.kv.KVStore or None, "
                            f"got {type(kvstore).__name__}")
        self._kvstore = kvstore
        self._kv = None            # the store, made at the first step (parameters are known)
        self._kv_ready = False
        self._update_on_kvstore = update_on_kvstore
        self._workers = 1          # gradients are summed over this many workers
        if compression_params:
            raise ValueError("Trainer: gradient compression is not supported")
        param_dict = dict(enumerate(self._params))
        if isinstance(optimizer, _opt.Optimizer):
            if optimizer_params:
                raise ValueError("Trainer: optimizer_params must be empty when an Optimizer "
                                 "instance is given")
            optimizer.param_dict = param_dict
            self._optimizer = optimizer
        else:
            self._optimizer = _opt.create(optimizer, param_dict=param_dict,
                                          **dict(optimizer_params or {}))
        self._scale = self._optimizer.rescale_grad
        self._states: dict = {}
        self._fused = None  # the compiled update (see hybrid.fused_update)
        self._fresh = None
        dist = isinstance(kvstore, str) and kvstore.lower().startswith("dist") or \
            isinstance(kvstore, _kv.KVStore) and kvstore.num_workers > 1
        if dist and all(p._data is not None for p in self._params if p.grad_req != "null"):
            # now, not at the first step: the first gradients must already be computed
            # from rank 0's weights on every worker
            self._init_kvstore()

    # ------------------------------------------------------------ properties
    @property
    def optimizer(self) -> _opt.Optimizer:
        return self._optimizer

    @property
    def learning_rate(self) -> float:
        return self._optimizer.learning_rate

    def set_learning_rate(self, lr: float):
        self._optimizer.set_learning_rate(lr)

    # ------------------------------------------------------------ steps
    @property
    def kvstore(self):
        """The key-value store (None before the first step or when none is needed)."""
        return self._kv

    def _init_kvstore(self):
        """Make the store at the first step: init every trainable parameter on it (for dist
        stores rank 0's values, pulled into every copy so all workers start equal)."""
        if self._kv_ready:
            return
        params = list(self._trainable())
        spec = self._kvstore
        multi = any(len(p._data) > 1 for _, p in params)
        kv = None
        if isinstance(spec, _kv.KVStore):
            kv = spec
        elif isinstance(spec, str) and (multi or spec.lower() not in ("local", "device")):
            kv = _kv.create(spec)
        uok = self._update_on_kvstore
        if kv is not None and kv.type == "dist_async":
            if uok is False:
                raise ValueError("Trainer: kvstore='dist_async' updates on the store; "
                                 "update_on_kvstore=False is not possible with it")
            uok = True
        uok = bool(uok) and kv is not None
        if kv is not None:
            keys = [self._kv_keys[i] for i, _ in params]
            kv.init(keys, [p._data[0] for _, p in params])
            kv.pull(keys, out=[list(p._data) for _, p in params])
            if uok:
                kv.set_optimizer(self._optimizer,
                                 key_index={k: i for i, k in enumerate(self._kv_keys)})
            # synchronous stores sum over the workers: divide, so step(b) on N workers trains
            # like step(N * b) in one process
            self._workers = kv.num_workers if kv.type != "dist_async" else 1
        self._kv = kv
        self._uok = uok
        self._kv_ready = True

    def _grad_lists(self):
        """(keys, grads per key): the last parameters first, as backward computes them."""
        items = list(self._trainable())[::-1]
        return ([self._kv_keys[i] for i, _ in items], [[a.grad for a in p._data] for _, p in items],
                items)

    def step(self, batch_size, ignore_stale_grad: bool = False):
        """allreduce_grads() then update(batch_size): one optimizer step with gradients
        rescaled by 1 / batch_size (and by 1 / num_workers for synchronous dist stores).
        With update_on_kvstore: push the gradients, pull the updated weights."""
        _check_batch_size(batch_size)  # before any gradient is summed
        self._init_kvstore()
        if self._uok:
            self._step_on_kvstore(batch_size, ignore_stale_grad)
            return
        self.allreduce_grads()
        self.update(batch_size, ignore_stale_grad)

    def _step_on_kvstore(self, batch_size, ignore_stale_grad):
        fresh = self._freshness()
        for i, p in self._trainable():
            flags = fresh.get(i, [True] * len(p._data))
            if not all(flags) and not ignore_stale_grad:
                self._stale_error(i, p, flags)
        self._optimizer.rescale_grad = self._rescale(batch_size)
        keys, grads, items = self._grad_lists()
        self._kv.push(keys, grads)
        self._kv.pull(keys, out=[list(p._data) for _, p in items])
        for _, p in items:
            p._stale = {a.device: a.grad._buf for a in p._data}

    def _rescale(self, batch_size) -> float:
        """The gradients' scale for a step over ``batch_size`` samples."""
        _check_batch_size(batch_size)
        return self._scale / (batch_size * self._workers)

    def _stale_error(self, i, p, flags):
        dev = p._data[flags.index(False)].device
        raise StaleGradientError(
            f"the gradient of Parameter '{self._names[i]}' on {dev} has not been "
            "written by backward since the last update: the parameter is not used in "
            "the forward pass, or backward was not called. Call "
            "step(batch_size, ignore_stale_grad=True) to skip such parameters, or set "
            "their grad_req='null'")

    def _trainable(self):
        for i, p in enumerate(self._params):
            if p.grad_req == "null":
                continue
            if p._data is None:
                raise RuntimeError(f"Trainer: Parameter '{self._names[i]}' is not initialized"
                                   " (call net.initialize() and run one forward pass to finish"
                                   " deferred initialization)")
            yield i, p

    def _freshness(self) -> dict:
        out = {}
        for i, p in self._trainable():
            stale = p._stale
            out[i] = [a.grad._buf is not stale.get(a.device) for a in p._data]
        return out

    def allreduce_grads(self):
        """Sum each parameter's gradients over its devices (and workers, for dist stores)
        and give every copy the sum (a no-op for single-device parameters in one process)."""
        self._init_kvstore()
        if self._uok:
            raise RuntimeError("Trainer: allreduce_grads() is not possible when parameters "
                               "are updated on the kvstore (update_on_kvstore); call step()")
        self._fresh = self._freshness()
        if self._kv is not None:
            keys, grads, _ = self._grad_lists()
            self._kv.pushpull(keys, grads, out=grads)
            return
        with eager_scope():
            for _, p in self._trainable():
                if len(p._data) < 2:
                    continue
                grads = [a.grad for a in p._data]
                home = grads[0].device
                total = grads[0]
                for g in grads[1:]:
                    total = total + g.copyto(home)
                for g in grads:
                    total.copyto(g)

    def update(self, batch_size, ignore_stale_grad: bool = False):
        """Apply the optimizer to every parameter (call after allreduce_grads)."""
        self._init_kvstore()
        if self._uok:
            raise RuntimeError("Trainer: update() is not possible when parameters are updated "
                               "on the kvstore (update_on_kvstore); call step()")
        rescale = self._rescale(batch_size)
        fresh = self._fresh if self._fresh is not None else self._freshness()
        self._fresh = None
        self._optimizer.rescale_grad = rescale
        todo = []
        for i, p in self._trainable():
            flags = fresh.get(i)
            if flags is not None and not all(flags):
                if ignore_stale_grad:
                    continue
                self._stale_error(i, p, flags)
            todo.append((i, p, p._data))
        with eager_scope():
            items = []
            all_states = self._states
            for i, _, data in todo:
                states = all_states.get(i)
                if states is None or len(states) != len(data):
                    states = all_states[i] = [self._optimizer.create_state(i, w)
                                              for w in data]
                items.append((i, data, [a.grad for a in data], states))
            if self._fused is None or self._fused.optimizer is not self._optimizer:
                self._fused = FusedUpdate(self._optimizer)
            if self._fused.available():
                self._fused.step(items)
            else:
                for item in items:
                    self._optimizer.update(*item)
            for _, p, data in todo:
                p._stale = {a.device: a.grad._buf for a in data}

    # ------------------------------------------------------------ states
    def save_states(self, fname):
        """Write the optimizer's states (momenta, moving averages, update counts and
        hyper-parameters) to ``fname`` (safetensors + JSON metadata; atomic)."""
        arrays, layout, counts = {}, {}, {}
        table = self._state_table()
        for i, name in enumerate(self._names):
            if i in self._optimizer._index_update_count:
                counts[name] = self._optimizer._index_update_count[i]
            states = table.get(i)
            if states is None:
                continue
            s = states[0]
            if s is None:
                layout[name] = 0
            elif isinstance(s, NDArray):
                layout[name] = -1
                arrays[name] = s
            else:
                layout[name] = len(s)
                for k, a in enumerate(s):
                    arrays[f"{name}/{k}"] = a
        meta = {"format": "hybrid.trainer_states", "version": 1,
                "optimizer": type(self._optimizer).__name__.lower(),
                "hyper": dict(self._optimizer.hyper(), rescale_grad=self._scale),
                "num_update": self._optimizer.num_update,
                "counts": counts, "layout": layout}
        write_safetensors(fname, arrays, meta)

    def load_states(self, fname):
        """Restore states written by ``save_states`` (parameters must be initialized)."""
        arrays, meta = read_safetensors(fname)
        if meta.get("format") != "hybrid.trainer_states":
            raise ValueError(f"'{fname}' does not hold trainer states (written by "
                             "Trainer.save_states)")
        want = type(self._optimizer).__name__.lower()
        if meta.get("optimizer") != want:
            raise ValueError(f"'{fname}' holds states of optimizer '{meta.get('optimizer')}', "
                             f"but this trainer uses '{want}'")
        index = {n: i for i, n in enumerate(self._names)}
        layout = meta.get("layout", {})
        unknown = sorted(set(layout) - set(index))
        if unknown:
            raise ValueError(f"'{fname}' has states for parameters this trainer does not "
                             f"have: {', '.join(unknown)}")
        new_states = {}
        for name, kind in layout.items():
            i = index[name]
            p = self._params[i]
            keys = [name] if kind == -1 else [f"{name}/{k}" for k in range(kind)]
            for k in keys:
                if k not in arrays:
                    raise ValueError(f"'{fname}' is missing state '{k}'")
                if p.shape is not None and tuple(arrays[k].shape) != tuple(p.shape):
                    raise ValueError(f"'{fname}': state '{k}' has shape {arrays[k].shape}, "
                                     f"parameter has {p.shape}")
            devices = p.list_device() if p._data is not None else None
            if devices is None:
                raise RuntimeError(f"load_states: Parameter '{name}' is not initialized; "
                                   "initialize the network (and run a forward pass) first")
            per_dev = []
            for d in devices:
                vals = [array(arrays[k], dtype=arrays[k].dtype, device=d) for k in keys]
                per_dev.append(None if kind == 0 else vals[0] if kind == -1 else tuple(vals))
            new_states[i] = per_dev
        opt = self._optimizer
        for k, v in meta.get("hyper", {}).items():
            if hasattr(opt, k):
                setattr(opt, k, v)
        self._scale = opt.rescale_grad
        opt.num_update = int(meta.get("num_update", opt.num_update))
        opt._index_update_count = {index[n]: int(c) for n, c in meta.get("counts", {}).items()
                                   if n in index}
        self._init_kvstore()
        if self._uok:  # the store runs the updates: its table gets the states
            on_store = self._kv.optimizer_states()
            on_store.clear()
            on_store.update({self._kv_keys[i]: per_dev[0] for i, per_dev in new_states.items()})
        else:
            self._states = new_states

    def _state_table(self) -> dict:
        """index -> per-device optimizer states: the Trainer's own, or the store's when the
        store runs the updates (update_on_kvstore; one copy, the store's)."""
        if not (self._kv_ready and self._uok):  # no store yet: nothing ran on one
            return self._states
        index = {k: i for i, k in enumerate(self._kv_keys)}
        return {index[k]: [s] for k, s in self._kv.optimizer_states().items() if k in index}
