"""Collectives: sums and broadcasts across the device copies of one process, and across
processes over MPI.

Within a process, values are :class:`Tensor` s: an engine-ordered :class:`Buffer` with its
shape, dtype and device. :func:`reduce_sum`, :func:`broadcast` and :func:`ring_allreduce` push
engine ops and return new tensors at once, so the devices work in parallel and copies overlap
with compute. :func:`ring_allreduce` is section 12.7's ring: every device's array is cut into
as many chunks as there are devices; in a reduce-scatter phase each device sends one chunk to
its neighbour per step and adds the chunk it receives, so after ``n - 1`` steps device ``d``
holds the full sum of chunk ``d + 1``; an all-gather phase passes the finished chunks around
the ring. Each chunk's sum is computed once, so every device ends with identical bits.

Across processes, :class:`ProcessGroup` rides on MPI (mpi4py, from the ``dist`` extra). Every
collective starts with a *handshake*: each rank tells every other rank what it is about to do
(the operation, the step, and a digest of its keys, shapes and dtypes). A rank that pushes
different keys or shapes, a rank that left the training loop early (fewer batches) and a rank
that died or hangs are therefore reported on every other rank, naming the rank, the key and
the step, within ``HYBRID_DIST_TIMEOUT`` seconds. Every MPI call is non-blocking and polled
against a deadline: nothing waits forever.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import threading
import time

import numpy as np

from . import config, transfer
from .device import Device
from .engine import get_engine
from .memory import Buffer

__all__ = ["Tensor", "DistributedError", "copy_to", "add", "reduce_sum", "broadcast",
           "ring_allreduce", "allreduce", "allreduce_path", "ProcessGroup", "LocalGroup",
           "world", "launched", "mpi_available", "mpi_env_defaults", "describe_keys"]


class DistributedError(RuntimeError):
    """Workers disagree, one left early, died or hangs: raised on the others, with details.

    Attributes: ``rank`` (this process), ``step``, ``key`` (the first key concerned, if
    any), ``peers`` (the ranks at fault, if known).
    """

    def __init__(self, message, rank=None, step=None, key=None, peers=()):
        super().__init__(message)
        self.rank = rank
        self.step = step
        self.key = key
        self.peers = tuple(peers)


# ====================================================================== tensors
class Tensor:
    """A value on one device: a buffer (written once, engine-ordered) and its type."""

    __slots__ = ("buf", "shape", "dtype", "device")

    def __init__(self, buf: Buffer, shape, dtype: str, device: Device):
        self.buf = buf
        self.shape = tuple(shape)
        self.dtype = str(dtype)
        self.device = device

    @classmethod
    def ready(cls, data, device: Device) -> "Tensor":
        """A tensor whose value is already computed (``data`` must not be mutated later)."""
        return cls(Buffer(data), data.shape, data.dtype.name, device)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def wait(self, timeout=None):
        """Block until computed; the raw array (numpy or cupy)."""
        get_engine().wait(self.buf.var, timeout)
        return self.buf.data

    def host(self, timeout=None) -> np.ndarray:
        """The value as a host array (the buffer itself on a CPU device: do not mutate)."""
        return self.device.to_numpy(self.wait(timeout), copy=False)

    def __repr__(self):
        return f"Tensor({self.dtype}{list(self.shape)} on {self.device})"


def _push(fn, inputs, shape, dtype, device, name) -> Tensor:
    """``fn`` of the inputs' arrays as an engine op on ``device`` (a GPU's ops run with it
    activated: see Engine._gpu_worker_loop)."""
    out = Tensor(Buffer(), shape, dtype, device)
    bufs = [t.buf for t in inputs]
    ob = out.buf

    def run():
        ob.data = fn(*[b.data for b in bufs])

    get_engine().push(run, tuple(b.var for b in bufs), (ob.var,), device, name)
    return out


def copy_to(t: Tensor, device: Device) -> Tensor:
    """``t`` on ``device`` (``t`` itself if it is there already): an engine op, on the GPU's
    copy lane when one is involved (host arrays are shared between CPU devices: buffers are
    never mutated)."""
    if t.device == device:
        return t
    return Tensor(transfer.push_copy(t.buf, t.device, device, copy=False), t.shape, t.dtype,
                  device)


def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` on ``a``'s device (``b`` is copied there first)."""
    b = copy_to(b, a.device)
    return _push(lambda x, y: x + y, [a, b], a.shape, a.dtype, a.device, "allreduce.add")


def reduce_sum(tensors, device: Device | None = None) -> Tensor:
    """The sum of ``tensors`` (one per device) on ``device`` (the first one's by default),
    added in list order."""
    tensors = list(tensors)
    _check_same(tensors)
    device = device or tensors[0].device
    total = copy_to(tensors[0], device)
    for t in tensors[1:]:
        total = add(total, t)
    return total


def broadcast(t: Tensor, devices) -> list:
    """A copy of ``t`` on each of ``devices``."""
    return [copy_to(t, d) for d in devices]


def _check_same(tensors):
    if not tensors:
        raise ValueError("allreduce: no values given")
    t0 = tensors[0]
    for t in tensors[1:]:
        if t.shape != t0.shape or t.dtype != t0.dtype:
            raise ValueError(f"allreduce: values differ in shape or dtype: {t0.dtype}"
                             f"{list(t0.shape)} on {t0.device} and {t.dtype}{list(t.shape)} "
                             f"on {t.device}")


def _slice(t: Tensor, lo: int, hi: int) -> Tensor:
    return _push(lambda x: x.reshape(-1)[lo:hi], [t], (hi - lo,), t.dtype, t.device,
                 "allreduce.chunk")


def _join(chunks, shape, dtype, device) -> Tensor:
    def join(*parts):
        return device.xp.concatenate(parts).reshape(shape)
    return _push(join, chunks, shape, dtype, device, "allreduce.join")


def ring_allreduce(tensors) -> list:
    """Section 12.7's ring allreduce over device copies: one new tensor per input, each
    holding the sum, with identical bits on every device."""
    tensors = list(tensors)
    _check_same(tensors)
    n = len(tensors)
    if n == 1:
        return tensors
    devices = [t.device for t in tensors]
    shape, dtype = tensors[0].shape, tensors[0].dtype
    size = tensors[0].size
    bounds = [size * i // n for i in range(n + 1)]
    chunks = [[_slice(t, bounds[c], bounds[c + 1]) for c in range(n)] for t in tensors]
    for s in range(n - 1):  # reduce-scatter: device d sends chunk d - s to d + 1
        sends = []
        for d in range(n):
            c, dst = (d - s) % n, (d + 1) % n
            sends.append((dst, c, copy_to(chunks[d][c], devices[dst])))
        for dst, c, x in sends:
            chunks[dst][c] = _push(lambda a, b: a + b, [chunks[dst][c], x], x.shape, dtype,
                                   devices[dst], "allreduce.add")
    for s in range(n - 1):  # all-gather: device d holds the finished chunk d + 1 - s
        sends = []
        for d in range(n):
            c, dst = (d + 1 - s) % n, (d + 1) % n
            sends.append((dst, c, copy_to(chunks[d][c], devices[dst])))
        for dst, c, x in sends:
            chunks[dst][c] = x
    return [_join(chunks[d], shape, dtype, devices[d]) for d in range(n)]


_RING_MIN_ELEMENTS = 1 << 14  # smaller arrays: reduce on one device, then broadcast


def allreduce_path(tensors) -> str:
    """How a sum over these device copies runs: the one place that decides.

    'nccl' where NCCL can do it: two or more distinct GPUs, all real CuPy GPUs (an emulated
    GPU's memory is host memory, which NCCL cannot read), a CuPy built with NCCL and a dtype
    NCCL has; else 'copies' (``method``'s ring or reduce over device copies, which works on
    every device kind).
    """
    devices = [t.device for t in tensors]
    if len(devices) < 2 or len(set(devices)) != len(devices):
        return "copies"
    if any(d.kind != "gpu" or d.seam.implementation != "cupy" for d in devices):
        return "copies"
    from .gpu import nccl  # noqa: PLC0415 - imports CuPy: only once every device is a CuPy GPU
    if nccl.nccl_module() is None or not nccl.supports(tensors[0].dtype):
        return "copies"
    return "nccl"


def _nccl_allreduce(tensors) -> list:
    """One engine op (on the first GPU) that queues NCCL's allreduce on every GPU's compute
    stream: the sums are ready in stream order, as every GPU op's results are."""
    from .gpu import nccl  # noqa: PLC0415
    outs = [Tensor(Buffer(), t.shape, t.dtype, t.device) for t in tensors]
    ins = [t.buf for t in tensors]

    def run():
        sums = nccl.allreduce([b.data for b in ins], [t.device.seam for t in tensors])
        for o, s in zip(outs, sums):
            o.buf.data = s

    get_engine().push(run, tuple(b.var for b in ins), tuple(o.buf.var for o in outs),
                      tensors[0].device, "allreduce.nccl")
    return outs


def allreduce(tensors, method: str = "ring") -> list:
    """Sum over device copies; every device gets the sum (identical bits everywhere).

    Through NCCL where :func:`allreduce_path` says so; else over device copies by
    ``method``: 'ring' (section 12.7; small arrays fall back to 'reduce') or 'reduce' (sum
    on the first device, then copy to the others, as in section 12.5).
    """
    tensors = list(tensors)
    _check_same(tensors)
    if len(tensors) == 1:
        return tensors
    if method not in ("ring", "reduce"):
        raise ValueError(f"allreduce: method must be 'ring' or 'reduce', got {method!r}")
    if allreduce_path(tensors) == "nccl":
        return _nccl_allreduce(tensors)
    if method == "ring" and tensors[0].size >= _RING_MIN_ELEMENTS * len(tensors):
        return ring_allreduce(tensors)
    total = reduce_sum(tensors)
    return broadcast(total, [t.device for t in tensors])


# ====================================================================== processes
def launched() -> tuple:
    """(rank, size) from the MPI launcher's environment; (0, 1) outside one."""
    env = os.environ
    for rk, sz in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                   ("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", "HYBRID_WORLD_SIZE")):
        if env.get(rk) is not None and env.get(sz) is not None:
            try:
                return int(env[rk]), int(env[sz])
            except ValueError:
                pass
    return 0, 1


def mpi_available() -> tuple:
    """(True, '') if mpi4py imports, else (False, why)."""
    try:
        import mpi4py  # noqa: F401,PLC0415 - optional dependency, imported lazily
    except ImportError as exc:
        return False, f"mpi4py is not installed ({exc}): pip install 'hybrid[dist]'"
    return True, ""


# MPI settings hybrid's collectives are measured with, applied before MPI starts (MPI_Init
# reads them from the environment); a value the user set wins. Open MPI's non-blocking
# allreduce (libnbc, which every allreduce here uses: it is polled against a deadline) picks
# a binomial tree for fewer than 4 processes and for in-place calls: the whole message goes
# up the tree and back down, one rank at a time. Its ring (reduce-scatter + all-gather, each
# rank sending 1/N of the message per step, as in section 12.7) measured 1.3-3x faster on
# 2 and 4 local processes from 1 MiB up (benchmarks/bench_parallel.py allreduce), and as
# fast as the blocking MPI_Allreduce. Other MPIs ignore the variable.
MPI_ENV_DEFAULTS = {"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "ring"}


def mpi_env_defaults():
    """Set :data:`MPI_ENV_DEFAULTS` in this process's environment unless set already (call
    before MPI starts: importing ``mpi4py.MPI`` initializes it)."""
    for name, value in MPI_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def _mpi():
    ok, why = mpi_available()
    if not ok:
        raise DistributedError(f"this process was started by an MPI launcher, but {why}")
    if "mpi4py.MPI" not in sys.modules:
        mpi_env_defaults()
    from mpi4py import MPI  # noqa: PLC0415
    return MPI


def describe_keys(keys, limit: int = 3) -> str:
    keys = [repr(k) for k in keys]
    if not keys:
        return "no keys"
    head = ", ".join(keys[:limit])
    return head if len(keys) <= limit else f"{head} and {len(keys) - limit} more"


def _sig_text(op: str, step: int, sig) -> str:
    return json.dumps({"op": op, "step": int(step),
                       "keys": [[str(k), list(map(int, s)), str(d)] for k, s, d in sig]})


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


def _explain_mismatch(me: int, mine: dict, peer: int, theirs: dict) -> tuple:
    """(message, first key concerned) for two ranks' signatures that differ."""
    if mine["op"] != theirs["op"] or mine["step"] != theirs["step"]:
        return (f"rank {peer} is doing '{theirs['op']}' at its step {theirs['step']} while rank "
                f"{me} is doing '{mine['op']}' at step {mine['step']}: the workers call the "
                "store in different orders", (mine["keys"] or [[None]])[0][0])
    a = {k: (tuple(s), d) for k, s, d in mine["keys"]}
    b = {k: (tuple(s), d) for k, s, d in theirs["keys"]}
    for k, s, d in mine["keys"]:
        if k not in b:
            return f"rank {me} pushes key '{k}' but rank {peer} does not", k
        if b[k] != (tuple(s), d):
            bs, bd = b[k]
            return (f"key '{k}' is {d}{tuple(s)} on rank {me} but {bd}{bs} on rank {peer}", k)
    for k, _, _ in theirs["keys"]:
        if k not in a:
            return f"rank {peer} pushes key '{k}' but rank {me} does not", k
    order_a = [k for k, _, _ in mine["keys"]]
    order_b = [k for k, _, _ in theirs["keys"]]
    for x, y in zip(order_a, order_b):
        if x != y:
            return (f"rank {me} pushes key '{x}' where rank {peer} pushes '{y}': the keys "
                    "come in different orders", x)
    return f"ranks {me} and {peer} disagree", None


_MAGIC = 0x4879627269  # "Hybri"
_SYNC, _BYE = 1, 2
_HDR, _SIG = 0, 1  # tag offsets inside a group's tag block
TAG_BLOCK = 16
_groups = [0]
_groups_lock = threading.Lock()


class LocalGroup:
    """The group of one process: every collective is the identity (no MPI needed)."""

    rank = 0
    size = 1
    is_mpi = False

    def handshake(self, op, step, sig):
        return None

    def allreduce_start(self, array):
        return _Done(array)

    def wait(self, pendings, op="allreduce", step=0, keys=()):
        return [p.result for p in pendings]

    def broadcast(self, arrays, root=0, op="broadcast", step=0, keys=()):
        return list(arrays)

    def leave(self, step=0):
        return None


class _Done:
    __slots__ = ("result",)

    def __init__(self, result):
        self.result = result


class _Pending:
    __slots__ = ("req", "result", "source")

    def __init__(self, req, result, source):
        self.req = req
        self.result = result
        self.source = source  # keep the send buffer alive until done


class ProcessGroup:
    """All ranks of ``MPI.COMM_WORLD``, with a private block of message tags and a sequence
    number that every collective advances (handshakes catch ranks out of step).

    Create groups in the same order on every rank (stores do, at creation).
    """

    is_mpi = True

    def __init__(self, comm=None, timeout: float | None = None):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._timeout = timeout
        with _groups_lock:
            index = _groups[0]
            _groups[0] += 1
        self.tag = 100 + TAG_BLOCK * index
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        if self.tag + TAG_BLOCK > tag_ub:
            raise DistributedError(f"too many distributed stores in this process ({index}); "
                                   "reuse one store")
        self._seq = 0
        self._broken = None
        self._left = False
        self._peers = [r for r in range(self.size) if r != self.rank]
        self._pool = _OutputPool()
        _install_abort_hook(MPI)

    @property
    def timeout(self) -> float:
        return self._timeout if self._timeout is not None else \
            float(config.get("HYBRID_DIST_TIMEOUT"))

    # ------------------------------------------------------------------ polling
    def poll(self, reqs, deadline: float, on_timeout, spin: float = 2e-3) -> bool:
        """Test ``reqs`` until all are complete (True); at the deadline call ``on_timeout()``
        (which usually raises) and return False. Spins for ``spin`` seconds, then backs off
        to 1 ms naps (a waiting rank must not steal the cores of the ranks it waits for)."""
        reqs = [r for r in reqs if r is not None]
        if not reqs:
            return True
        testall = self.MPI.Request.Testall
        if testall(reqs):
            return True
        start = time.monotonic()
        pause = 0.0
        yield_ = getattr(os, "sched_yield", lambda: time.sleep(0))
        while True:
            if testall(reqs):
                return True
            now = time.monotonic()
            if now > deadline:
                on_timeout()
                return False
            if now - start > spin:
                pause = min(1e-3, pause * 2 if pause else 2e-5)
                time.sleep(pause)
            elif now - start > 2e-4:
                yield_()  # a peer on the same core (more ranks than cores) gets to run

    def _fail(self, message, step=None, key=None, peers=()):
        self._broken = message
        raise DistributedError(message, rank=self.rank, step=step, key=key, peers=peers)

    def _check(self):
        if self._broken:
            raise DistributedError(f"rank {self.rank}: this distributed store is unusable after "
                                   f"an earlier error: {self._broken}", rank=self.rank)
        if self._left:
            raise DistributedError(f"rank {self.rank}: this distributed store was closed",
                                   rank=self.rank)

    @staticmethod
    def _cancel(reqs):
        for r in reqs:
            try:
                if r is not None and not r.Test():
                    r.Cancel()
            except Exception:  # noqa: BLE001 - best effort after a failure
                pass

    # ------------------------------------------------------------------ handshake
    def handshake(self, op: str, step: int, sig):
        """Check that every rank is about to do the same ``op`` at the same ``step`` with the
        same keys, shapes and dtypes (``sig``: a list of (key, shape, dtype)); raise a
        :class:`DistributedError` naming the rank, key and step otherwise."""
        self._check()
        if self.size == 1:
            return
        self._seq += 1
        # the digest covers the operation and the keys; the step travels beside it
        digest = _digest(repr((op, sig)))
        mine = np.array([_MAGIC, _SYNC, self._seq, step, digest, 0, 0, 0], np.int64)
        peers = self._peers
        heads = {r: np.empty(8, np.int64) for r in peers}
        comm, tag = self.comm, self.tag + _HDR
        rreqs = {r: comm.Irecv(heads[r], source=r, tag=tag) for r in peers}
        sreqs = [comm.Isend(mine, dest=r, tag=tag) for r in peers]
        first = sig[0][0] if sig else None
        what = f"{op} of {describe_keys([k for k, _, _ in sig])}" if sig else op
        deadline = time.monotonic() + self.timeout

        def timed_out():
            missing = [r for r, q in rreqs.items() if not q.Test()]
            self._cancel(list(rreqs.values()) + sreqs)
            self._fail(
                f"rank {self.rank}: {what} at step {step}: no word from rank(s) "
                f"{', '.join(map(str, missing))} within {self.timeout:g}s: they died, hang, "
                "or stopped calling the store (fewer batches than this rank?). Every worker "
                "must push the same keys every step (HYBRID_DIST_TIMEOUT sets the wait).",
                step=step, key=first, peers=missing)

        self.poll(list(rreqs.values()) + sreqs, deadline, timed_out)
        left = [(r, h) for r, h in heads.items() if h[1] == _BYE]
        if left:
            r, h = left[0]
            self._fail(
                f"rank {self.rank}: {what} at step {step}: rank {r} has left (it closed its "
                f"store after its step {int(h[3])}): the workers run different numbers of "
                "steps. Give every worker the same number of batches (equal shards, "
                "last_batch='discard').", step=step, key=first, peers=[r])
        bad = [r for r, h in heads.items()
               if h[0] != _MAGIC or h[2] != self._seq or h[3] != step or h[4] != digest]
        if bad:
            self._explain(op, step, sig, heads, bad, deadline, first)

    def _explain(self, op, step, sig, heads, bad, deadline, first):
        """Second round after a mismatch: swap the signatures and say what differs."""
        text = _sig_text(op, step, sig)
        raw = text.encode()
        comm, tag = self.comm, self.tag + _SIG
        peers = list(heads)
        size = np.array([len(raw)], np.int64)
        sizes = {r: np.empty(1, np.int64) for r in peers}

        def sizes_timed_out():
            self._fail(f"rank {self.rank}: at step {step} the workers disagree on '{op}' "
                       f"(rank(s) {', '.join(map(str, bad))} differ), and the details could "
                       "not be exchanged in time", step=step, key=first, peers=bad)

        reqs = [comm.Irecv(sizes[r], source=r, tag=tag) for r in peers]
        reqs += [comm.Isend(size, dest=r, tag=tag) for r in peers]
        self.poll(reqs, deadline, sizes_timed_out)
        bufs = {r: bytearray(int(sizes[r][0])) for r in peers}
        rreqs = {r: comm.Irecv(bufs[r], source=r, tag=tag) for r in peers}
        sreqs = [comm.Isend(raw, dest=r, tag=tag) for r in peers]

        def timed_out():
            self._fail(f"rank {self.rank}: at step {step} the workers disagree on '{op}' "
                       f"(rank(s) {', '.join(map(str, bad))} differ), and the details could "
                       "not be exchanged in time", step=step, key=first, peers=bad)

        self.poll(list(rreqs.values()) + sreqs, deadline, timed_out)
        mine = json.loads(text)
        r = bad[0]
        try:
            theirs = json.loads(bytes(bufs[r]).decode())
        except ValueError:
            self._fail(f"rank {self.rank}: rank {r} sent a malformed handshake at step {step}: "
                       "is it running the same program?", step=step, peers=[r])
        why, key = _explain_mismatch(self.rank, mine, r, theirs)
        self._fail(f"rank {self.rank}: step {step} ('{op}'): the workers do not push the same "
                   f"keys with the same shapes: {why}", step=step, key=key, peers=bad)

    # ------------------------------------------------------------------ data
    def allreduce_start(self, array: np.ndarray) -> _Pending:
        """Start summing a host array over all ranks (call after a handshake). The sum lands
        in a new array (from :class:`_OutputPool`: a buffer of an earlier sum that nothing
        references any more, when there is one)."""
        self._check()
        array = np.ascontiguousarray(array)
        if self.size == 1:
            return _Done(array)
        out = self._pool.take(array.shape, array.dtype)
        req = self.comm.Iallreduce(array, out, op=self.MPI.SUM)
        return _Pending(req, out, array)

    def wait(self, pendings, op="allreduce", step=0, keys=()):
        """Wait for started collectives; their results, in order."""
        reqs = [p.req for p in pendings if isinstance(p, _Pending)]

        def timed_out():
            self._cancel(reqs)
            self._fail(f"rank {self.rank}: {op} of {describe_keys(keys)} at step {step} did "
                       f"not complete within {self.timeout:g}s after every rank had arrived: "
                       "a rank died or hangs in the middle of the transfer",
                       step=step, key=(list(keys) or [None])[0])

        self.poll(reqs, time.monotonic() + self.timeout, timed_out, spin=0.05)
        return [p.result for p in pendings]

    def broadcast(self, arrays, root=0, op="broadcast", step=0, keys=()):
        """Rank ``root``'s arrays on every rank (new arrays; call after a handshake)."""
        self._check()
        if self.size == 1:
            return list(arrays)
        pend = []
        for a in arrays:
            buf = np.array(a, copy=True, order="C") if self.rank == root else \
                np.empty(a.shape, a.dtype)
            pend.append(_Pending(self.comm.Ibcast(buf, root=root), buf, None))
        return self.wait(pend, op, step, keys)

    def leave(self, step=0):
        """Tell the other ranks this one is done (they fail fast if they still push)."""
        self._pool.clear()
        if self._left or self._broken or self.size == 1:
            self._left = True
            return
        self._left = True
        mine = np.array([_MAGIC, _BYE, self._seq + 1, step, 0, 0, 0, 0], np.int64)
        reqs = []
        try:
            reqs = [self.comm.Isend(mine, dest=r, tag=self.tag + _HDR)
                    for r in range(self.size) if r != self.rank]
            deadline = time.monotonic() + min(2.0, self.timeout)
            self.poll(reqs, deadline, lambda: None)
        except Exception:  # noqa: BLE001 - peers may be gone already
            self._cancel(reqs)


class _OutputPool:
    """Output buffers of large allreduces, reused once nothing references them any more.

    A fresh buffer costs its page faults inside the transfer (the first write to each page;
    under MPI's shared-memory transport, from the peer's copy into this process): about 30%
    of the time of a 64 MiB allreduce on 2 local processes. Training sums the same bucket
    sizes every step, and a step's sums are dropped by the next one (the gradients and the
    store's copy are replaced), so keeping the last two buffers of each size gives the
    next-but-one step pages that are already mapped. A buffer is reused only when the pool
    holds the sole reference (every array viewing it, numpy's views included, references
    it), so a sum still in use is never overwritten. Buffers under ``MIN_BYTES`` are left to
    the allocator; a buffer is kept per (size, dtype) at most ``PER_SIZE`` times, and
    ``MAX_SIZES`` sizes at most (the least recently used go first).
    """

    MIN_BYTES = 1 << 20
    PER_SIZE = 2
    MAX_SIZES = 64

    def __init__(self):
        self._bufs: dict = {}  # (elements, dtype) -> [1-D arrays], most recently used last
        self._lock = threading.Lock()

    def take(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = math.prod(shape)
        if n * dtype.itemsize < self.MIN_BYTES:
            return np.empty(shape, dtype)
        key = (n, dtype.str)
        with self._lock:
            bufs = self._bufs.pop(key, [])
            self._bufs[key] = bufs  # most recently used last
            for i in range(len(bufs)):
                # 2: the pool's list and getrefcount's argument; anything more is a user
                if sys.getrefcount(bufs[i]) <= 2:
                    return bufs[i].reshape(shape)
            buf = np.empty(n, dtype)
            if len(bufs) < self.PER_SIZE:
                bufs.append(buf)
            while len(self._bufs) > self.MAX_SIZES:
                del self._bufs[next(iter(self._bufs))]
            return buf.reshape(shape)

    def clear(self):
        with self._lock:
            self._bufs.clear()


def _install_abort_hook(MPI):
    """An uncaught exception on one rank ends the whole job (after printing it): the process
    exits with status 1 at once, which makes mpirun stop the other ranks, so they are not
    left waiting. ``hybrid launch`` workers do the same themselves."""
    if getattr(sys.excepthook, "_hybrid_mpi_exit", False) or \
            os.environ.get("HYBRID_LAUNCH_WORKER"):
        return
    previous = sys.excepthook

    def hook(tp, value, tb):
        previous(tp, value, tb)
        try:
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            os._exit(1)

    hook._hybrid_mpi_exit = True
    sys.excepthook = hook


def world(timeout: float | None = None):
    """A new group over every process of the job: a :class:`ProcessGroup` under an MPI
    launcher with more than one process, else a :class:`LocalGroup`."""
    _, size = launched()
    if size <= 1:
        return LocalGroup()
    return ProcessGroup(timeout=timeout)
