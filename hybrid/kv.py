"""Key-value stores (``hb.kv``): gradients pushed, weights pulled, as in section 12.7.

    kv = hb.kv.create("device")            # 'local', 'device', 'dist_sync', 'dist_async'
    kv.init("w", w)                        # w: an array (for dist stores: rank 0's wins)
    kv.push("w", [g0, g1])                 # one gradient per device: summed (and over workers)
    kv.pull("w", out=[w0, w1])             # the stored value, copied into every array
    kv.pushpull("w", [g0, g1], out=[g0, g1])   # allreduce: every array gets the sum
    kv.set_optimizer(hb.optimizer.SGD(learning_rate=0.1))   # update on the store

Keys are ints or strings, or lists of them with one value (or list of values) each. Pushes
are commutative sums over the arrays given and, for ``dist_sync``/``dist_async``, over every
worker process (``hybrid launch -n N script.py``). ``rank`` and ``num_workers`` tell who this
worker is. The stores themselves live in ``runtime.kvstore`` (one registry of store types;
``hb.kv.registered()`` lists them, including the ``fake`` test double).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading

from runtime import kvstore as _rt
from runtime.collective import DistributedError, Tensor

from .ndarray import NDArray
from .nn.parameter import eager_scope

__all__ = ["KVStore", "create", "registered", "register", "DistributedError"]

_open_stores: list = []
_open_lock = threading.Lock()


def create(name: str = "local", **kwargs) -> "KVStore":
    """A new key-value store: 'local' (sums on cpu(0)), 'device' (sums on the devices,
    ring allreduce), 'dist_sync' (allreduce across processes over MPI every push),
    'dist_async' (a parameter server sharded over the processes), or 'fake' (a test double
    recording every call; ``num_workers=`` acts as that many identical workers)."""
    if isinstance(name, KVStore):
        return name
    store = KVStore(_rt.create(name, **kwargs))
    if name.startswith("dist"):
        with _open_lock:
            if not _open_stores and not _close_at_exit.registered:
                # registered after MPI started, so it runs before MPI's own finalization
                atexit.register(_close_at_exit)
                _close_at_exit.registered = True
            _open_stores.append(store)
    return store


def registered() -> list:
    """The names ``create`` accepts."""
    return _rt.registered()


def register(name: str, *aliases: str):
    """Register a store class (a ``runtime.kvstore.KVStore`` subclass) under ``name``."""
    return _rt.register(name, *aliases)


def _tensor(a: NDArray) -> Tensor:
    return Tensor(a._buf, a.shape, a._dtype, a.device)


def _array(t: Tensor) -> NDArray:
    return NDArray(t.buf, t.shape, t.dtype, t.device)


def _check_key(k):
    if isinstance(k, bool) or not isinstance(k, (int, str)):
        raise TypeError(f"kvstore keys must be ints or strings, got {type(k).__name__} {k!r}")
    return k


def _as_list(v, what, key):
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals:
        raise ValueError(f"kvstore.{what}: an empty list of values for key {key!r}")
    for a in vals:
        if not isinstance(a, NDArray):
            raise TypeError(f"kvstore.{what}: values for key {key!r} must be hybrid arrays "
                            f"(or lists of them, one per device), got {type(a).__name__}")
    return vals


def _normalize(key, value, what, allow_none=False):
    """(keys, [list of arrays per key])."""
    if isinstance(key, (list, tuple)):
        keys = [_check_key(k) for k in key]
        if value is None and allow_none:
            return keys, [None] * len(keys)
        if not isinstance(value, (list, tuple)) or len(value) != len(keys):
            raise ValueError(f"kvstore.{what}: {len(keys)} keys need a list of {len(keys)} "
                             f"values (one array, or one list of arrays, per key)")
        return keys, [_as_list(v, what, k) for k, v in zip(keys, value)]
    _check_key(key)
    if value is None and allow_none:
        return [key], [None]
    return [key], [_as_list(value, what, key)]


def _bind(outs, results, what):
    for o_list, r_list in zip(outs, results):
        for o, t in zip(o_list, r_list):
            if tuple(o.shape) != tuple(t.shape):
                raise ValueError(f"kvstore.{what}: out has shape {o.shape}, the stored value "
                                 f"{t.shape}")
            new = _array(t)
            if new._dtype != o._dtype:
                new = new.astype(o._dtype)
            o._rebind(new)


class KVStore:
    """The front end of a store: takes hybrid arrays, binds the results in place."""

    def __init__(self, impl: _rt.KVStore):
        self._impl = impl
        self._optimizer = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ identity
    @property
    def type(self) -> str:
        return self._impl.type

    @property
    def rank(self) -> int:
        """This worker's index, 0 .. num_workers - 1."""
        return self._impl.rank

    @property
    def num_workers(self) -> int:
        """How many worker processes push to this store."""
        return self._impl.num_workers

    @property
    def step(self) -> int:
        return self._impl.step

    @property
    def impl(self) -> _rt.KVStore:
        return self._impl

    def is_capable(self, capability: str) -> bool:
        """'optimizer': updates can run on the store (set_optimizer)."""
        return capability.lower() == "optimizer"

    # ------------------------------------------------------------ operations
    def init(self, key, value):
        """Give each key its first value (for dist stores: collective, rank 0's value wins)."""
        keys, vals = _normalize(key, value, "init")
        with eager_scope():
            self._impl.init(keys, [_tensor(v[0]) for v in vals])

    def push(self, key, value, priority: int = 0):
        """Sum the values (one per device; and over workers) into the store; with an
        optimizer set, apply it to the stored value instead of storing the sum."""
        keys, vals = _normalize(key, value, "push")
        with eager_scope():
            self._impl.push(keys, [[_tensor(a) for a in v] for v in vals], self._rescale())

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True):
        """Copy the stored values into ``out`` (an array or a list of arrays per key). With
        ``out=None`` the values are returned (on cpu(0) unless the store keeps them
        elsewhere)."""
        keys, outs = _normalize(key, out, "pull", allow_none=True)
        if outs[0] is None:
            from runtime.device import current_device  # noqa: PLC0415
            with eager_scope():
                res = self._impl.pull(keys, [[current_device()] for _ in keys])
            got = [_array(r[0]) for r in res]
            return got if isinstance(key, (list, tuple)) else got[0]
        with eager_scope():
            res = self._impl.pull(keys, [[o.device for o in ol] for ol in outs])
            _bind(outs, res, "pull")
        return None

    def pushpull(self, key, value, out=None, priority: int = 0):
        """push then pull in one call; without an optimizer it is an allreduce: ``out``
        (``value`` itself by default) gets the sum."""
        keys, vals = _normalize(key, value, "pushpull")
        outs = vals if out is None else _normalize(key, out, "pushpull")[1]
        with eager_scope():
            res = self._impl.pushpull(keys, [[_tensor(a) for a in v] for v in vals],
                                      [[o.device for o in ol] for ol in outs], self._rescale())
            _bind(outs, res, "pushpull")

    def broadcast(self, key, value, out, priority: int = 0):
        """init(key, value), then pull into ``out``: every device and worker starts from the
        first worker's value."""
        keys, vals = _normalize(key, value, "broadcast")
        outs = _normalize(key, out, "broadcast")[1]
        with eager_scope():
            res = self._impl.broadcast(keys, [_tensor(v[0]) for v in vals],
                                       [[o.device for o in ol] for ol in outs])
            _bind(outs, res, "broadcast")

    def set_optimizer(self, optimizer, key_index=None):
        """Run ``optimizer`` on the store: a push applies it to the stored weight with the
        summed gradient (Gluon's ``update_on_kvstore``). For dist_async every server rank
        uses its own worker's optimizer for the keys it serves. ``key_index`` maps keys to
        the optimizer's parameter indices (for per-parameter lr_mult / wd_mult)."""
        from . import optimizer as _opt  # noqa: PLC0415
        if isinstance(optimizer, str):
            optimizer = _opt.create(optimizer)
        if not isinstance(optimizer, _opt.Optimizer):
            raise TypeError(f"set_optimizer: expected an Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizer = optimizer
        self._updater = _make_updater(optimizer, key_index or {})
        self._impl.set_updater(self._updater)

    def optimizer_states(self) -> dict:
        """key -> the optimizer state the store keeps for it (the dict itself: assigning
        to it restores states). Only where updates run in this process: a dist_async store
        updates on its server ranks, whose states this worker cannot see."""
        if getattr(self, "_updater", None) is None:
            raise RuntimeError("this store has no optimizer (call set_optimizer first)")
        if self.type == "dist_async":
            raise RuntimeError("a dist_async store keeps optimizer states on its server "
                               "ranks; save and load them there, or train with "
                               "kvstore='dist_sync' to keep states on every worker")
        return self._updater.states

    def _rescale(self):
        return None if self._optimizer is None else self._optimizer.rescale_grad

    def set_gradient_compression(self, compression_params):
        raise ValueError("gradient compression is not supported by hybrid's key-value stores; "
                         "push full-precision gradients")

    def barrier(self):
        """Wait for every worker (dist_async: after this worker's pushes are applied)."""
        self._impl.barrier()

    _barrier = barrier

    def close(self):
        """Leave: dist stores tell the other workers (who then fail fast if they still
        push); dist_async keeps serving until every worker has closed. Called at exit."""
        with _open_lock:
            if self in _open_stores:
                _open_stores.remove(self)
        self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<hb.kv.KVStore '{self.type}' rank {self.rank} of {self.num_workers}>"


def _make_updater(optimizer, key_index: dict):
    """An updater for the runtime store: runs ``optimizer`` on (merged grad, stored weight)."""
    states: dict = {}
    lock = threading.Lock()

    def updater(key, grad: Tensor, stored: Tensor, rescale):
        w, g = _array(stored), _array(grad)
        index = key_index.get(key, key)
        with lock, eager_scope():
            if rescale is not None:
                optimizer.rescale_grad = rescale
            if key not in states:
                states[key] = optimizer.create_state(index, w)
            optimizer.update(index, [w], [g], [states[key]])
        return _tensor(w)

    updater.states = states
    return updater


def _close_at_exit():
    """Close the dist stores still open; a failure (a worker died or hangs) is printed and
    the process exits with status 1, so the launcher sees it."""
    failed = False
    for store in list(_open_stores):
        try:
            store.close()
        except Exception as exc:  # noqa: BLE001 - at exit, report
            print(f"hybrid: closing the '{store.type}' store at exit: {exc}", file=sys.stderr)
            failed = True
    if failed:
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


_close_at_exit.registered = False
