"""Buffers: an array's storage and the engine Var that orders access to it.

A buffer is written once, by the op that produces it, and never mutated afterwards. In-place
updates on the front end (``x[:] = v``, ``x += 1``) compute a new buffer and rebind the
array to it (SSA renaming), so ops queued earlier still read the old contents and raw
buffers can be shared freely between arrays, gradients and executables.
"""
from __future__ import annotations

import os
import sys as _sys
import threading

import numpy as np

from .config import get as _config_get
from .engine import Var


class Buffer:
    __slots__ = ("data", "_var")

    def __init__(self, data=None):
        self.data = data
        # A buffer made with its data (an op run in the caller, an upload to the host) is
        # never written by an engine op: its Var only answers waits (nothing pending, no
        # error) and collects readers that no write waits for, so it is made when first
        # asked for (most never are: ~0.2 us per eager op). A pending buffer's is made now.
        self._var = Var() if data is None else None

    @property
    def var(self) -> Var:
        """The engine's dependency tag of this buffer."""
        v = self._var
        if v is None:  # two threads may both make one here: harmless, as said above
            v = self._var = Var()
        return v

    def __repr__(self):
        state = "pending" if self.data is None else f"{self.data.dtype}{list(self.data.shape)}"
        return f"Buffer({state})"


class HostPool:
    """Recycled host blocks for compiled calls' outputs (MXNet's pooled CPU storage, PyTorch's
    caching allocator on the host).

    Outputs are fresh arrays, but freshly mapped memory costs a page fault per 4 KiB on
    first touch: ~0.15 ms for one 800 KB weight update, several times a training step. The
    pool keeps the 64-byte-aligned base array of every block it hands out, and the array it
    last handed out for it; a block is free again when nothing but the pool refers to either
    (a view of the handed-out array refers to the base: CPython's reference counts tell).
    The next request of the same size takes it, its pages mapped and likely still in cache,
    as the very array object when the shape and dtype match (no array to build per call).
    At most ``HYBRID_HOST_POOL_MB`` is held; past that, requests get plain fresh memory.
    """

    ALIGN = 64
    PER_SIZE = 32  # blocks of one size scanned per request: a caller keeping thousands of
    # outputs alive never makes a request slow; past this, that size is not pooled

    def __init__(self, limit_bytes: int):
        self.limit = int(limit_bytes)
        self.held = 0
        self.blocks: dict[int, list] = {}
        self.lock = threading.Lock()

    def empty(self, shape, dtype, nbytes: int):
        """(array, address): an uninitialized C-contiguous array on a 64-byte boundary."""
        key = (shape, dtype)
        with self.lock:
            same = self.blocks.get(nbytes)
            if same is None:
                same = self.blocks[nbytes] = []
            for i, block in enumerate(same):
                if _is_free(block):
                    view = block.view
                    if block.key != key or not view.flags.writeable:
                        view = block.view = _view(block, shape, dtype, nbytes)
                        block.key = key
                    if i + 1 < len(same):  # least recently handed out first: the next scan
                        del same[i]        # meets blocks freed long ago, not ones in use
                        same.append(block)
                    return view, block.addr
            block = _Block(nbytes + self.ALIGN)
            view = _view(block, shape, dtype, nbytes)
            if len(same) < self.PER_SIZE and (self.held + nbytes <= self.limit or
                                              self._trim(nbytes)):
                block.view, block.key = view, key
                same.append(block)
                self.held += nbytes + self.ALIGN
        return view, block.addr

    def _trim(self, nbytes: int) -> bool:
        """Drop free blocks of other sizes, largest first, until ``nbytes`` more fit under
        the limit (what an earlier workload left must not keep this one unpooled)."""
        for size in sorted(self.blocks, reverse=True):
            same = self.blocks[size]
            keep = [block for block in same if not _is_free(block)]
            self.held -= (len(same) - len(keep)) * (size + self.ALIGN)
            same[:] = keep
            if self.held + nbytes <= self.limit:
                return True
        return False

    def release(self) -> int:
        """Drop the blocks nothing refers to (like torch.cuda.empty_cache); bytes freed."""
        freed = 0
        with self.lock:
            for size, same in self.blocks.items():
                keep = [block for block in same if not _is_free(block)]
                freed += (len(same) - len(keep)) * (size + self.ALIGN)
                same[:] = keep
            self.held -= freed
        return freed


class _Block:
    __slots__ = ("base", "addr", "off", "view", "key")

    def __init__(self, nbytes: int):
        self.base = np.empty(nbytes, dtype=np.uint8)
        addr = self.base.__array_interface__["data"][0]
        self.off = (-addr) % HostPool.ALIGN
        self.addr = addr + self.off
        self.view = self.base[:0]  # replaced by the first array handed out
        self.key = None


def _view(block, shape, dtype, nbytes):
    return block.base[block.off:block.off + nbytes].view(dtype).reshape(shape)


def _is_free(block) -> bool:
    return _sys.getrefcount(block.base) <= _FREE_REFS[0] and \
        _sys.getrefcount(block.view) <= _FREE_REFS[1]


def _free_refs():
    """The counts _is_free reads for a block nobody uses (its base, its handed-out array):
    calibrated, since CPython versions count references on the stack differently.
    (-1, -1), never free, where reference counts mean nothing."""
    if _sys.implementation.name != "cpython":
        return (-1, -1)
    block = _Block(64 + HostPool.ALIGN)
    block.view = _view(block, (16,), np.float32, 64)
    return (_sys.getrefcount(block.base), _sys.getrefcount(block.view))


_FREE_REFS = _free_refs()


def _after_fork_in_child():
    """A fork copies a lock another thread may have held mid-allocation: the child starts
    with fresh ones (the blocks themselves are the child's own copies)."""
    for pool in _pool.values():
        pool.lock = threading.Lock()
_pool: dict = {}


def host_pool() -> HostPool | None:
    """The process's host pool (None when HYBRID_HOST_POOL_MB is 0). Called per compiled
    call: one flag look-up, no import."""
    mb = _config_get("HYBRID_HOST_POOL_MB")
    pool = _pool.get(mb)
    if pool is None and mb > 0:
        pool = _pool.setdefault(mb, HostPool(mb * (1 << 20)))
    return pool


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
