"""Allreduce through NCCL (``cupy.cuda.nccl``), for real CuPy GPUs of one process.

Which path a sum across devices takes is decided in one place, ``runtime.collective``
(``allreduce_path``); this module only says whether this CuPy has NCCL and carries out one
allreduce. One communicator clique per set of GPUs (``ncclCommInitAll``), made at first use
and kept; the per-GPU calls are issued inside one NCCL group, each on its GPU's compute
stream, so each GPU's sum runs after the kernels queued there before it and before those
queued after it, like any other GPU op here.
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from .cupy_gpu import cupy_module

_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64",
           "uint64")  # NCCL's types (its names: NCCL_FLOAT32, ...); bool has none
_cliques: dict = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def nccl_module():
    """``cupy.cuda.nccl`` where CuPy imports and was built with NCCL, else None."""
    cp = cupy_module()
    if cp is None:
        return None
    try:
        from cupy.cuda import nccl  # noqa: PLC0415 - lazy, as CuPy itself
    except Exception:  # noqa: BLE001 - no NCCL library: the copies path
        return None
    return nccl if getattr(nccl, "available", True) else None


def supports(dtype) -> bool:
    return np.dtype(dtype).name in _DTYPES


def allreduce(arrays, gpus) -> list:
    """Per GPU of ``gpus`` (CupyGPU seams, distinct), a new array holding the sum of
    ``arrays`` (one per GPU, equal shapes and dtypes); queued on each GPU's compute stream."""
    nccl = nccl_module()
    ids = tuple(g.index for g in gpus)
    with _lock:
        comm = _cliques.get(ids)
        if comm is None:
            comm = _cliques[ids] = nccl.NcclCommunicator.initAll(len(ids), list(ids))
    dtype = getattr(nccl, f"NCCL_{np.dtype(arrays[0].dtype).name.upper()}")
    held = []
    comm.groupStart()  # the calls below are queued at groupEnd, together
    try:
        for rank, (a, g) in enumerate(zip(arrays, gpus)):
            with g.activate():
                a = g.xp.ascontiguousarray(a)
                out = g.empty(a.shape, a.dtype)
            comm.setCurrentComm(rank)
            comm.allReduce(a.data.ptr, out.data.ptr, a.size, dtype, nccl.NCCL_SUM,
                           g.compute_stream.s.ptr)
            held.append((g, a, out))
    finally:
        comm.groupEnd()
    for g, a, out in held:  # after groupEnd: the event must follow the sum on the stream
        g.compute_stream.keep(a, out)
    return [out for _, _, out in held]
