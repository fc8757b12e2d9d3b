"""Key-value stores (section 12.7): ``push`` aggregates, ``pull`` fetches.

Every key holds one value. ``push(keys, values)`` sums the values given for a key (one per
device, and over every worker process for the ``dist_*`` stores: aggregation is a commutative
sum) and then either stores the sum or, when an *updater* is set (``set_updater``, the
optimizer of ``update_on_kvstore``), applies ``updater(key, sum, stored, rescale)`` to the
stored value. ``pull`` copies the stored value to the devices asked for; ``pushpull`` does both
in one call (without an updater the stored value is just the sum, so it is an allreduce).

Store types register in one registry (:func:`register`, :func:`create`):

=============  ===================================================================
``local``      one process; sums on ``cpu(0)``, then copies to every device
``device``     one process; sums on the devices themselves: the ring allreduce of
               section 12.7 across device copies (small arrays: reduce + broadcast)
``dist_sync``  many processes over MPI: every push is an allreduce of the gradients
               across processes (bucketed into large flat buffers, each started as soon
               as its gradients are computed), the updater runs on every rank with the
               same numbers, so the stored values stay identical without a server
``dist_async`` many processes over MPI: a parameter server. Keys are sharded over the
               ranks (round-robin in ``init`` order); each rank runs a server thread for
               its share; workers push gradients and pull weights without any barrier
``fake``       a test double: a local store that records every call and can act as
               ``num_workers`` identical workers
=============  ===================================================================

Values are :class:`runtime.collective.Tensor` s; results are new tensors (buffers are never
mutated), which the front end binds to its arrays. This module never imports the front end.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from . import collective
from .collective import DistributedError, Tensor, copy_to, describe_keys, reduce_sum
from .device import Device, cpu

__all__ = ["KVStore", "LocalStore", "DeviceStore", "DistSyncStore", "DistAsyncStore",
           "FakeStore", "register", "create", "registered", "DistributedError"]

_REGISTRY: dict = {}


def register(name: str, *aliases: str):
    """Class decorator: make a store type available to ``create(name)``."""
    def deco(cls):
        for n in (name, *aliases):
            key = n.lower()
            if key in _REGISTRY and _REGISTRY[key] is not cls:
                raise ValueError(f"a key-value store type named {n!r} is already registered "
                                 f"({_REGISTRY[key].__name__})")
            _REGISTRY[key] = cls
        cls.type = name
        return cls
    return deco


def create(name: str = "local", **kwargs) -> "KVStore":
    """A new store of a registered type ('local', 'device', 'dist_sync', 'dist_async',
    'fake', ...)."""
    if not isinstance(name, str):
        raise TypeError(f"kvstore type must be a string, got {type(name).__name__}")
    cls = _REGISTRY.get(name.lower())
    if cls is None:
        raise ValueError(f"unknown key-value store type {name!r}; known: "
                         f"{', '.join(registered())}")
    return cls(**kwargs)


def registered() -> list:
    return sorted(_REGISTRY)


def _pull_local(values: dict, keys, devices) -> list:
    """Copies of the stored values on each requested device (stores that hold values here)."""
    out = []
    for k, devs in zip(keys, devices):
        if k not in values:
            raise KeyError(f"kvstore.pull: key {k!r} was not initialized; call "
                           "kv.init(key, value) first")
        out.append([copy_to(values[k], d) for d in devs])
    return out


class KVStore:
    """The interface. ``keys`` are lists of ints or strings; ``values`` hold, per key, a
    list of tensors (one per device); ``devices`` hold, per key, the devices to pull to."""

    type = "base"

    def __init__(self):
        self._updater = None
        self._meta: dict = {}  # key -> (shape, dtype)
        self._step = 0
        self._closed = False

    # ------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        return 0

    @property
    def num_workers(self) -> int:
        return 1

    @property
    def step(self) -> int:
        """How many push/pushpull calls this store has served (the training step)."""
        return self._step

    def set_updater(self, updater):
        """``updater(key, merged: Tensor, stored: Tensor, rescale) -> Tensor``: applied to
        the stored value at each push instead of storing the sum."""
        self._updater = updater

    @property
    def has_updater(self) -> bool:
        return self._updater is not None

    # ------------------------------------------------------------ checks
    def _check_new(self, key, value: Tensor):
        if key in self._meta:
            raise ValueError(f"kvstore.init: key {key!r} is already initialized")
        self._meta[key] = (tuple(int(d) for d in value.shape), str(value.dtype))

    def _check_values(self, op, key, values):
        if self._closed:
            raise RuntimeError(f"kvstore.{op}: this '{self.type}' store is closed")
        meta = self._meta.get(key)
        if meta is None:
            raise KeyError(f"kvstore.{op}: key {key!r} was not initialized; call "
                           "kv.init(key, value) first")
        if not values:
            raise ValueError(f"kvstore.{op}: no values given for key {key!r}")
        for v in values:
            if tuple(v.shape) != meta[0] or v.dtype != meta[1]:
                raise ValueError(f"kvstore.{op}: key {key!r} was initialized as "
                                 f"{meta[1]}{list(meta[0])}, got {v.dtype}{list(v.shape)} "
                                 f"on {v.device}")

    def _sig(self, keys):
        return [(k, self._meta[k][0], self._meta[k][1]) for k in keys]

    # ------------------------------------------------------------ operations
    def init(self, keys, values):
        raise NotImplementedError(f"{type(self).__name__} must implement init(keys, values)")

    def push(self, keys, values, rescale=None):
        raise NotImplementedError(f"{type(self).__name__} must implement push(keys, values, rescale)")

    def pull(self, keys, devices) -> list:
        raise NotImplementedError(f"{type(self).__name__} must implement pull(keys, devices)")

    def pushpull(self, keys, values, devices, rescale=None) -> list:
        self.push(keys, values, rescale)
        return self.pull(keys, devices)

    def broadcast(self, keys, values, devices) -> list:
        """init(keys, values) then pull: every device (and worker) gets the first worker's
        values."""
        self.init(keys, values)
        return self.pull(keys, devices)

    def barrier(self):
        """Wait until every worker gets here (a no-op in one process)."""

    def close(self):
        self._closed = True

    def __repr__(self):
        return (f"<{type(self).__name__} '{self.type}' rank {self.rank} of "
                f"{self.num_workers}, {len(self._meta)} keys>")


# ====================================================================== one process
class _InProcessStore(KVStore):
    """Stores values on a home device; sums device copies with engine ops."""

    home: Device | None = None  # None: the device of the value given to init
    method = "reduce"

    def __init__(self):
        super().__init__()
        self._values: dict = {}

    def _home(self, value: Tensor) -> Device:
        return self.home or value.device

    def _across_workers(self, key, tensor: Tensor) -> Tensor:
        return tensor

    def init(self, keys, values):
        for k, v in zip(keys, values):
            self._check_new(k, v)
            self._values[k] = copy_to(v, self._home(v))

    def _update(self, key, merged: Tensor, rescale):
        stored = self._values[key]
        if self._updater is None:
            self._values[key] = merged
        else:
            self._values[key] = self._updater(key, copy_to(merged, stored.device), stored,
                                              rescale)

    def push(self, keys, values, rescale=None):
        for k, vals in zip(keys, values):
            self._check_values("push", k, vals)
        self._step += 1
        for k, vals in zip(keys, values):
            merged = reduce_sum(vals, self._values[k].device)
            self._update(k, self._across_workers(k, merged), rescale)

    def pull(self, keys, devices) -> list:
        return _pull_local(self._values, keys, devices)

    def pushpull(self, keys, values, devices, rescale=None) -> list:
        if self._updater is not None:
            return super().pushpull(keys, values, devices, rescale)
        for k, vals in zip(keys, values):
            self._check_values("pushpull", k, vals)
        self._step += 1
        out = []
        for k, vals, devs in zip(keys, values, devices):
            here = [v.device for v in vals]
            if self.method == "ring" and list(devs) == here and len(set(here)) == len(here):
                sums = collective.allreduce(vals, "ring")
                sums = [self._across_workers(k, s) for s in sums]
            else:
                total = self._across_workers(k, reduce_sum(vals, self._values[k].device))
                sums = [copy_to(total, d) for d in devs]
            self._values[k] = copy_to(sums[0], self._values[k].device)
            out.append(sums)
        return out


@register("local")
class LocalStore(_InProcessStore):
    """One process: values live on cpu(0); pushes are summed there."""

    home = cpu(0)
    method = "reduce"


@register("device")
class DeviceStore(_InProcessStore):
    """One process: values live on the device they were initialized from; pushes are summed
    on the devices (ring allreduce across the device copies)."""

    method = "ring"


@register("fake")
class FakeStore(_InProcessStore):
    """A test double. Records every call in ``calls`` as ``(op, keys, step)``; behaves like
    ``num_workers`` identical workers (each push counts ``num_workers`` times); with
    ``fail_on=("push", 3)`` the third push raises a :class:`DistributedError`."""

    def __init__(self, num_workers: int = 1, rank: int = 0, fail_on=None):
        super().__init__()
        if num_workers < 1 or not 0 <= rank < num_workers:
            raise ValueError(f"fake store: need 0 <= rank < num_workers, got rank {rank}, "
                             f"num_workers {num_workers}")
        self._workers = int(num_workers)
        self._rank = int(rank)
        self._fail_on = fail_on
        self.calls: list = []

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def num_workers(self) -> int:
        return self._workers

    def _record(self, op, keys):
        self.calls.append((op, list(keys), self._step))
        n = sum(1 for c in self.calls if c[0] == op)
        if self._fail_on is not None and tuple(self._fail_on) == (op, n):
            raise DistributedError(f"fake store: injected failure at {op} #{n} of "
                                   f"{describe_keys(keys)}", rank=self._rank, step=self._step,
                                   key=(list(keys) or [None])[0])

    def _across_workers(self, key, tensor):
        if self._workers == 1:
            return tensor
        n = self._workers
        return collective._push(lambda x: x * n, [tensor], tensor.shape, tensor.dtype,
                                tensor.device, "fake.workers")

    def init(self, keys, values):
        self._record("init", keys)
        super().init(keys, values)

    def push(self, keys, values, rescale=None):
        self._record("push", keys)
        super().push(keys, values, rescale)

    def pull(self, keys, devices):
        self._record("pull", keys)
        return super().pull(keys, devices)

    def pushpull(self, keys, values, devices, rescale=None):
        self._record("pushpull", keys)
        return super().pushpull(keys, values, devices, rescale)

    def barrier(self):
        self._record("barrier", [])


# ====================================================================== processes
class _DistStore(KVStore):
    def __init__(self, timeout: float | None = None):
        super().__init__()
        self._group = collective.world(timeout)

    @property
    def rank(self) -> int:
        return self._group.rank

    @property
    def num_workers(self) -> int:
        return self._group.size

    def _broadcast_init(self, keys, values):
        """Collective: check every rank inits the same keys; rank 0's values win."""
        for k, v in zip(keys, values):
            self._check_new(k, v)
        self._group.handshake("init", self._step, self._sig(keys))
        hosts = [v.host() for v in values]
        return self._group.broadcast(hosts, 0, "init", self._step, keys)


def _host_sum(vals) -> Tensor:
    """The sum of a key's device copies, on the first device (an engine op)."""
    return reduce_sum(vals, vals[0].device)


_SOLO_BYTES = 1 << 20  # dist_sync: a key this large is not packed into a bucket


@register("dist_sync", "dist_sync_device", "dist_device_sync")
class DistSyncStore(_DistStore):
    """Synchronous data parallelism over MPI: each push is an allreduce across processes.

    Gradients are summed over the local devices, then packed into flat host buffers of about
    ``HYBRID_DIST_BUCKET_MB`` MiB (a gradient of 1 MiB or more is sent from its own buffer,
    without a packing copy); each bucket's allreduce starts as soon as its gradients
    are computed (keys in the order given: pass the last layers first to overlap with the
    rest of the backward pass). The updater, if any, runs on every rank with the same sums,
    so the stored values stay identical everywhere and ``pull`` needs no communication.
    """

    def __init__(self, timeout: float | None = None, bucket_mb: float | None = None):
        super().__init__(timeout)
        self._values: dict = {}
        self._bucket_mb = bucket_mb

    def init(self, keys, values):
        keys, values = list(keys), list(values)
        arrays = self._broadcast_init(keys, values)
        for k, v, a in zip(keys, values, arrays):
            self._values[k] = copy_to(Tensor.ready(a, cpu(0)), v.device)

    def _buckets(self, keys):
        """Keys grouped into allreduce messages, in the order given. Small keys are packed
        into flat buckets of about ``limit`` bytes (one message each, latency amortized); a
        key of ``min(limit, 1 MiB)`` or more travels alone, summed straight from its own
        buffer: packing it would add a full copy of it to a transfer that is bound by memory
        bandwidth (on one machine, a copy costs about half an allreduce of the same size)."""
        from . import config  # noqa: PLC0415
        limit = float(self._bucket_mb or config.get("HYBRID_DIST_BUCKET_MB")) * (1 << 20)
        solo = min(limit, _SOLO_BYTES)
        buckets, cur, size, dt = [], [], 0, None
        for k in keys:
            shape, dtype = self._meta[k]
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            if nbytes >= solo:
                buckets.append([k])
                continue
            if cur and (dtype != dt or size + nbytes > limit):
                buckets.append(cur)
                cur, size = [], 0
            cur.append(k)
            size += nbytes
            dt = dtype
        if cur:
            buckets.append(cur)
        return buckets

    def _allreduce(self, op, keys, values) -> dict:
        """Sum each key's values over devices and processes: key -> host array."""
        keys = list(keys)
        for k, vals in zip(keys, values):
            self._check_values(op, k, vals)
        self._step += 1
        step = self._step
        local = {k: _host_sum(vals) for k, vals in zip(keys, values)}
        group = self._group
        group.handshake(op, step, self._sig(keys))
        pending, layout = [], []
        for bucket in self._buckets(keys):
            parts = [_wait_polling(local[k], group, pending) for k in bucket]
            dtype = parts[0].dtype
            wide = dtype if dtype.kind != "f" or dtype.itemsize >= 4 else np.dtype("float32")
            flat = np.concatenate([p.reshape(-1).astype(wide, copy=False) for p in parts]) \
                if len(parts) > 1 else parts[0].reshape(-1).astype(wide, copy=False)
            pending.append(group.allreduce_start(flat))
            layout.append((bucket, dtype))
        results = group.wait(pending, op, step, keys)
        out = {}
        for (bucket, dtype), flat in zip(layout, results):
            off = 0
            for k in bucket:
                shape = self._meta[k][0]
                n = math.prod(shape)
                out[k] = flat[off:off + n].reshape(shape).astype(dtype, copy=False)
                off += n
        return out

    def push(self, keys, values, rescale=None):
        sums = self._allreduce("push", keys, values)
        for k in keys:
            self._store(k, sums[k], rescale)

    def _store(self, key, total: np.ndarray, rescale):
        stored = self._values[key]
        merged = copy_to(Tensor.ready(total, cpu(0)), stored.device)
        self._values[key] = merged if self._updater is None else \
            self._updater(key, merged, stored, rescale)

    def pull(self, keys, devices) -> list:
        return _pull_local(self._values, keys, devices)

    def pushpull(self, keys, values, devices, rescale=None) -> list:
        if self._updater is not None:
            return super().pushpull(keys, values, devices, rescale)
        sums = self._allreduce("pushpull", keys, values)
        out = []
        for k, devs in zip(keys, devices):
            total = Tensor.ready(sums[k], cpu(0))
            self._values[k] = copy_to(total, self._values[k].device)
            out.append([copy_to(total, d) for d in devs])
        return out

    def barrier(self):
        self._group.handshake("barrier", self._step, [])

    def close(self):
        if not self._closed:
            self._closed = True
            self._group.leave(self._step)


def _wait_polling(t: Tensor, group, pending) -> np.ndarray:
    """Wait for a tensor while keeping started MPI transfers moving; its host array."""
    op = t.buf.var.last_write
    if pending and group.is_mpi and op is not None and not op.done:
        MPI = group.MPI
        reqs = [p.req for p in pending if hasattr(p, "req")]
        while not op.done:
            MPI.Request.Testall(reqs)
            time.sleep(5e-5)
    return t.host()


# ---------------------------------------------------------------- parameter server
_PUSH, _PULL, _DONE, _FLUSH = 1, 2, 3, 4
_OK, _ERR = 0, 1
_REQ, _REPLY = 2, 3  # tag offsets in the group's block
_HEAD = 64  # bytes of a request header: int64[8] (kind, key, step, nbytes, rescale, ...)
_RHEAD = 32  # bytes of a reply header: int64[4] (status, key, version, nbytes)


@register("dist_async")
class DistAsyncStore(_DistStore):
    """Asynchronous data parallelism: a parameter server sharded over the ranks.

    ``init`` is collective (rank 0's values win). Key ``i`` (in init order) is served by rank
    ``i % num_workers``: a server thread on that rank applies every push as it arrives
    (the updater, or a sum) and answers pulls with the current value. Workers never wait for
    each other: ``push`` returns once the gradient is sent, ``pull`` waits only for the
    servers' replies (up to ``HYBRID_DIST_TIMEOUT``, then an error naming the server rank and
    key). ``barrier()`` flushes this worker's pushes and waits for every worker; ``close()``
    keeps serving until every worker has closed.
    """

    def __init__(self, timeout: float | None = None):
        super().__init__(timeout)
        self._keys: list = []
        self._index: dict = {}
        self._served: dict = {}    # key -> np.ndarray (the keys this rank serves)
        self._version: dict = {}   # key -> updates applied
        self._lock = threading.Lock()
        self._thread = None
        self._server_error = None
        self._done: set = set()
        self._heard: dict = {}     # rank -> time of its last message
        self._stopping = False
        self._sends: list = []     # (request, buffer) of the worker's pushes in flight
        self._barriers = 0

    def _owner(self, key) -> int:
        return self._index[key] % self._group.size

    # ------------------------------------------------------------ collective setup
    def init(self, keys, values):
        keys, values = list(keys), list(values)
        arrays = self._broadcast_init(keys, values)
        with self._lock:
            for k, a in zip(keys, arrays):
                self._index[k] = len(self._keys)
                self._keys.append(k)
                if self._owner(k) == self.rank:
                    self._served[k] = np.array(a, copy=True)
                    self._version[k] = 0
        if self._group.size > 1 and self._thread is None:
            self._heard = {r: time.monotonic() for r in range(self._group.size)}
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name=f"hybrid-kvserver-{self.rank}")
            self._thread.start()
        # every server knows the new keys before any worker pushes them
        self._group.handshake("init-done", self._step, [])

    # ------------------------------------------------------------ the server
    def _apply(self, key, grad: np.ndarray, rescale):
        stored = self._served[key]
        if self._updater is None:
            new = stored + grad
        else:
            dev = cpu(0)
            new = self._updater(key, Tensor.ready(grad, dev), Tensor.ready(stored, dev),
                                rescale).host()
        self._served[key] = new
        self._version[key] += 1

    def _serve(self):
        g = self._group
        MPI, comm = g.MPI, g.comm
        status = MPI.Status()
        replies = []
        pause = 0.0
        try:
            while True:
                msg = comm.Improbe(MPI.ANY_SOURCE, g.tag + _REQ, status)
                if msg is not None:
                    src = status.Get_source()
                    buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                    msg.Recv([buf, MPI.BYTE])
                    self._heard[src] = time.monotonic()
                    reply = self._handle(src, buf)
                    if reply is not None:
                        replies.append((comm.Isend([reply, MPI.BYTE], dest=src,
                                                   tag=g.tag + _REPLY), reply))
                    pause = 0.0
                    continue
                replies = [(r, b) for r, b in replies if not r.Test()]
                if self._stopping and not replies and len(self._done) >= g.size:
                    return
                if self._stopping == "abort":
                    return
                pause = min(1e-3, pause * 2 if pause else 2e-5)
                time.sleep(pause)
        except BaseException as exc:  # noqa: BLE001 - reported to the worker thread
            self._server_error = exc

    def _handle(self, src, buf):
        head = buf[:_HEAD].view(np.int64)
        kind, idx, wstep, nbytes = (int(x) for x in head[:4])
        rescale = float(head[4:5].view(np.float64)[0])
        if kind == _DONE:
            self._done.add(src)
            return None
        try:
            if not 0 <= idx < len(self._keys):
                raise KeyError(f"key #{idx} is not known to server rank {self.rank} (was "
                               "init called on every worker?)")
            key = self._keys[idx]
            if kind == _FLUSH:
                return _reply(_OK, idx, 0, b"")
            with self._lock:
                if key not in self._served:
                    raise KeyError(f"key {key!r} is served by rank {self._owner(key)}, not "
                                   f"rank {self.rank}")
                shape, dtype = self._meta[key]
                if kind == _PUSH:
                    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                    if nbytes != want:
                        raise ValueError(f"rank {src} pushed {nbytes} bytes for key {key!r} "
                                         f"at its step {wstep}; expected {dtype}"
                                         f"{list(shape)} ({want} bytes)")
                    grad = buf[_HEAD:_HEAD + nbytes].view(dtype).reshape(shape)
                    self._apply(key, grad, None if np.isnan(rescale) else rescale)
                    return None
                if kind == _PULL:
                    value = self._served[key]
                    return _reply(_OK, idx, self._version[key],
                                  np.ascontiguousarray(value).view(np.uint8).reshape(-1))
            raise ValueError(f"unknown request kind {kind} from rank {src}")
        except Exception as exc:  # noqa: BLE001 - sent back to the worker that asked
            msg = f"server rank {self.rank}: {type(exc).__name__}: {exc}"
            if kind == _PUSH:  # nobody waits for a push: report at this worker's next call
                self._server_error = DistributedError(msg, rank=self.rank, step=wstep)
                return None
            return _reply(_ERR, idx, 0, msg.encode())

    # ------------------------------------------------------------ the worker
    def _check_server(self):
        if self._server_error is not None:
            err = self._server_error
            if isinstance(err, DistributedError):
                raise err
            raise DistributedError(f"rank {self.rank}: the key-value server thread failed: "
                                   f"{type(err).__name__}: {err}", rank=self.rank) from err

    def _request(self, kind, key, step, rescale=None, payload=None) -> np.ndarray:
        n = 0 if payload is None else payload.nbytes
        buf = np.empty(_HEAD + n, np.uint8)
        head = buf[:_HEAD].view(np.int64)
        head[:] = 0
        head[0], head[1], head[2], head[3] = kind, self._index.get(key, 0), step, n
        head[4:5].view(np.float64)[0] = np.nan if rescale is None else rescale
        if n:
            buf[_HEAD:] = np.ascontiguousarray(payload).view(np.uint8).reshape(-1)
        return buf

    def push(self, keys, values, rescale=None):
        self._check_server()
        keys = list(keys)
        for k, vals in zip(keys, values):
            self._check_values("push", k, vals)
        self._step += 1
        g = self._group
        self._sends = [(r, b) for r, b in self._sends if not r.Test()]
        for k, vals in zip(keys, values):
            grad = _host_sum(vals).host()
            owner = self._owner(k)
            if owner == self.rank or g.size == 1:
                with self._lock:
                    self._apply(k, grad, rescale)
                continue
            buf = self._request(_PUSH, k, self._step, rescale, grad)
            self._sends.append((g.comm.Isend([buf, g.MPI.BYTE], dest=owner,
                                              tag=g.tag + _REQ), buf))

    def _ask(self, kind, keys) -> dict:
        """Send a request per key to its server and wait for the replies: key -> (array or
        None)."""
        g = self._group
        out, waits = {}, []
        for k in keys:
            owner = self._owner(k) if k in self._index else self.rank
            if owner == self.rank or g.size == 1:
                if kind == _PULL:
                    with self._lock:
                        out[k] = self._served[k]
                continue
            shape, dtype = self._meta[k]
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize \
                if kind == _PULL else 0
            reply = np.empty(_RHEAD + max(nbytes, 4096), np.uint8)
            rreq = g.comm.Irecv([reply, g.MPI.BYTE], source=owner, tag=g.tag + _REPLY)
            buf = self._request(kind, k, self._step)
            sreq = g.comm.Isend([buf, g.MPI.BYTE], dest=owner, tag=g.tag + _REQ)
            waits.append((k, owner, rreq, sreq, reply, buf))
        if not waits:
            return out
        what = "pull" if kind == _PULL else "barrier"

        def timed_out():
            late = [(k, o) for k, o, r, _, _, _ in waits if not r.Test()]
            self._stopping = "abort"
            g._fail(f"rank {self.rank}: {what} of key {late[0][0]!r} at step {self._step}: "
                    f"server rank {late[0][1]} did not answer within {g.timeout:g}s: it died "
                    f"or hangs ({len(late)} request(s) unanswered, from rank(s) "
                    f"{', '.join(sorted({str(o) for _, o in late}))})",
                    step=self._step, key=late[0][0], peers=sorted({o for _, o in late}))

        deadline = time.monotonic() + g.timeout
        g.poll([w[2] for w in waits] + [w[3] for w in waits], deadline, timed_out)
        for k, owner, _, _, reply, _ in waits:
            status, _, _, nbytes = (int(x) for x in reply[:_RHEAD].view(np.int64))
            body = reply[_RHEAD:_RHEAD + nbytes]
            if status != _OK:
                text = bytes(body).decode(errors="replace")
                g._fail(f"rank {self.rank}: {what} of key {k!r} at step {self._step}: {text}",
                        step=self._step, key=k, peers=[owner])
            if kind == _PULL:
                shape, dtype = self._meta[k]
                out[k] = body.copy().view(dtype).reshape(shape)
        return out

    def pull(self, keys, devices) -> list:
        self._check_server()
        keys = list(keys)
        for k in keys:
            if k not in self._meta:
                raise KeyError(f"kvstore.pull: key {k!r} was not initialized; call "
                               "kv.init(key, value) first")
        values = self._ask(_PULL, keys)
        return [[copy_to(Tensor.ready(values[k], cpu(0)), d) for d in devs]
                for k, devs in zip(keys, devices)]

    def barrier(self):
        """Flush this worker's pushes to every server, then wait for every worker."""
        self._check_server()
        g = self._group
        if g.size == 1:
            return
        firsts = {}
        for k in self._keys:
            firsts.setdefault(self._owner(k), k)
        self._ask(_FLUSH, [k for o, k in firsts.items() if o != self.rank])
        # workers run different numbers of steps here: number the barriers instead
        self._barriers += 1
        g.handshake("barrier", self._barriers, [])

    def close(self):
        """Tell every server this worker is done; keep serving until all workers are."""
        if self._closed:
            return
        self._closed = True
        g = self._group
        if g.size == 1 or self._thread is None or getattr(g, "_broken", None):
            self._stopping = "abort"
            return
        sends = [(g.comm.Isend([self._request(_DONE, None, self._step), g.MPI.BYTE],
                               dest=r, tag=g.tag + _REQ)) for r in range(g.size)
                 if r != self.rank]
        self._done.add(self.rank)
        self._stopping = True
        while self._thread.is_alive():
            self._thread.join(0.05)
            now = time.monotonic()
            quiet = [r for r in range(g.size)
                     if r not in self._done and now - self._heard.get(r, now) > g.timeout]
            if quiet:
                self._stopping = "abort"
                self._thread.join(1.0)
                g._fail(f"rank {self.rank}: closing the dist_async store at step "
                        f"{self._step}: rank(s) {', '.join(map(str, quiet))} have not "
                        f"finished and sent nothing for {g.timeout:g}s: they died or hang",
                        step=self._step, peers=quiet)
        g.poll(sends + [r for r, _ in self._sends], time.monotonic() + g.timeout,
               lambda: None)
        self._check_server()


def _reply(status, idx, version, body) -> np.ndarray:
    body = np.frombuffer(body, np.uint8) if isinstance(body, bytes) else body
    out = np.empty(_RHEAD + body.nbytes, np.uint8)
    out[:_RHEAD].view(np.int64)[:] = (status, idx, version, body.nbytes)
    out[_RHEAD:] = body
    return out
