"""Buffers: an array's storage and the engine Var that orders access to it.

A buffer is written once, by the op that produces it, and never mutated afterwards. In-place
updates on the front end (``x[:] = v``, ``x += 1``) compute a new buffer and rebind the
array to it (SSA renaming), so ops queued earlier still read the old contents and raw
buffers can be shared freely between arrays, gradients and executables.
"""
from __future__ import annotations

import sys as _sys
import threading

import numpy as np

from .engine import Var


class Buffer:
    __slots__ = ("data", "var")

    def __init__(self, data=None):
        self.data = data
        self.var = Var()

    def __repr__(self):
        state = "pending" if self.data is None else f"{self.data.dtype}{list(self.data.shape)}"
        return f"Buffer({state})"


class HostPool:
    """Recycled host blocks for compiled calls' outputs (MXNet's pooled CPU storage, PyTorch's
    caching allocator on the host).

    Outputs are fresh arrays, but freshly mapped memory costs a page fault per 4 KiB on
    first touch: ~0.15 ms for one 800 KB weight update, several times a training step. The
    pool keeps the 64-byte-aligned base array of every block it hands out; a block is free
    again when nothing but the pool refers to its base (every view of it holds a
    reference: CPython's reference count tells), and the next request of the same size takes
    it, its pages mapped and likely still in cache. At most ``HYBRID_HOST_POOL_MB`` is held;
    past that, requests get plain fresh memory.
    """

    ALIGN = 64
    PER_SIZE = 8  # blocks of one size scanned per request: a caller keeping thousands of
    # outputs alive never makes a request slow; past this, that size is not pooled

    def __init__(self, limit_bytes: int):
        self.limit = int(limit_bytes)
        self.held = 0
        self.blocks: dict[int, list] = {}
        self.lock = threading.Lock()

    def empty(self, shape, dtype, nbytes: int):
        """(array, address): an uninitialized C-contiguous array on a 64-byte boundary."""
        with self.lock:
            same = self.blocks.get(nbytes)
            if same is None:
                same = self.blocks[nbytes] = []
            for base, addr in same:
                if _refs(base) <= _FREE_REFS:
                    return _view(base, addr, shape, dtype, nbytes), addr
            pooled = len(same) < self.PER_SIZE and self.held + nbytes <= self.limit
            base = np.empty(nbytes + self.ALIGN, dtype=np.uint8)
            addr0 = base.__array_interface__["data"][0]
            off = (-addr0) % self.ALIGN
            if pooled:
                same.append((base, addr0 + off))
                self.held += nbytes + self.ALIGN
        return _view(base, addr0 + off, shape, dtype, nbytes), addr0 + off

    def release(self) -> int:
        """Drop the blocks nothing refers to (like torch.cuda.empty_cache); bytes freed."""
        freed = 0
        with self.lock:
            for size, same in self.blocks.items():
                keep = []
                for base, addr in same:
                    if _refs(base) > _FREE_REFS:
                        keep.append((base, addr))
                freed += (len(same) - len(keep)) * (size + self.ALIGN)
                same[:] = keep
            self.held -= freed
        return freed


def _view(base, addr, shape, dtype, nbytes):
    off = addr - base.__array_interface__["data"][0]
    return base[off:off + nbytes].view(dtype).reshape(shape)


def _refs(base) -> int:
    return _sys.getrefcount(base)


def _free_refs() -> int:
    """The count _refs reads for a block nobody uses, taken where the pool takes it (a list
    entry, a loop variable): calibrated, since CPython versions count frames differently.
    -1 (never free) where reference counts mean nothing."""
    if _sys.implementation.name != "cpython":
        return -1
    for base, _addr in [(np.empty(1), 0)]:
        return _refs(base)
    return -1


_FREE_REFS = _free_refs()
_pool: dict = {}


def host_pool() -> HostPool | None:
    """The process's host pool (None when HYBRID_HOST_POOL_MB is 0)."""
    from . import config  # noqa: PLC0415
    mb = config.get("HYBRID_HOST_POOL_MB")
    pool = _pool.get(mb)
    if pool is None and mb > 0:
        pool = _pool.setdefault(mb, HostPool(mb * (1 << 20)))
    return pool
