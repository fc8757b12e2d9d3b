"""``hb.Trainer``: applies an optimizer to a set of Parameters, Gluon's way.

    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    with autograd.record():
        l = loss(net(x), y)
    l.backward()
    trainer.step(batch_size)        # grads are rescaled by 1 / batch_size

A parameter with copies on several devices (``net.initialize(device=[cpu(0), cpu(1)])``)
has its gradients summed across devices first (``allreduce_grads``: the sum is copied to
every device with ``copyto``), then every copy gets the same update (``update``), so the
copies stay identical.
"""
from __future__ import annotations

from . import optimizer as _opt
from .checkpoint import read_safetensors, write_safetensors
from .ndarray import NDArray, array
from .nn.parameter import Parameter, eager_scope

__all__ = ["Trainer", "StaleGradientError"]


class StaleGradientError(RuntimeError):
    """A parameter's gradient was not written by backward since the last update."""


class Trainer:
    """params: a dict (``net.collect_params()``) or list of Parameters; optimizer: a name
    ('sgd', 'nag', 'adam', 'adamw', 'rmsprop', 'adagrad') or an Optimizer;
    optimizer_params: its arguments (learning_rate, wd, momentum, clip_gradient,
    lr_scheduler, ...). kvstore: 'device' or 'local' (gradients are summed in process)."""

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
        if kvstore not in (None, "device", "local") and not isinstance(kvstore, str):
            kvstore = "device"
        if isinstance(kvstore, str) and kvstore.startswith("dist"):
            raise ValueError(f"Trainer: kvstore={kvstore!r} is not supported; use 'device' "
                             "(gradients of multi-device parameters are summed in process)")
        self._kvstore = kvstore
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
        self._fresh = None

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
    def step(self, batch_size, ignore_stale_grad: bool = False):
        """allreduce_grads() then update(batch_size): one optimizer step with gradients
        rescaled by 1 / batch_size."""
        self.allreduce_grads()
        self.update(batch_size, ignore_stale_grad)

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
        return {i: [a.grad._buf is not p._stale.get(a.device) for a in p._data]
                for i, p in self._trainable()}

    def allreduce_grads(self):
        """Sum each parameter's gradients over its devices and copy the sum to every
        device (a no-op for single-device parameters)."""
        self._fresh = self._freshness()
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
        fresh = self._fresh if self._fresh is not None else self._freshness()
        self._fresh = None
        self._optimizer.rescale_grad = self._scale / batch_size
        todo = []
        for i, p in self._trainable():
            flags = fresh.get(i, [True] * len(p._data))
            if not all(flags):
                if ignore_stale_grad:
                    continue
                dev = p._data[flags.index(False)].device
                raise StaleGradientError(
                    f"the gradient of Parameter '{self._names[i]}' on {dev} has not been "
                    "written by backward since the last update: the parameter is not used in "
                    "the forward pass, or backward was not called. Call "
                    "step(batch_size, ignore_stale_grad=True) to skip such parameters, or set "
                    "their grad_req='null'")
            todo.append((i, p))
        with eager_scope():
            for i, p in todo:
                states = self._states.get(i)
                if states is None or len(states) != len(p._data):
                    states = self._states[i] = [self._optimizer.create_state(i, w)
                                                for w in p._data]
                self._optimizer.update(i, p._data, [a.grad for a in p._data], states)
                p._stale = {a.device: a.grad._buf for a in p._data}

    # ------------------------------------------------------------ states
    def save_states(self, fname):
        """Write the optimizer's states (momenta, moving averages, update counts and
        hyper-parameters) to ``fname`` (safetensors + JSON metadata; atomic)."""
        arrays, layout, counts = {}, {}, {}
        for i, name in enumerate(self._names):
            if i in self._optimizer._index_update_count:
                counts[name] = self._optimizer._index_update_count[i]
            states = self._states.get(i)
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
        self._states = new_states
