"""What the CUDA target produces: a :class:`CudaSource`.

``text`` is one CUDA C translation unit: the prelude (prelude.py), the kernels (each an
``extern "C" __global__`` function) and, under ``#ifdef HYBRID_EMULATE``, one launch stub per
kernel for the emulated GPU (runtime/gpu/emu). ``launches`` lists what to run, in order, to
carry out the Program: per launch the kernel's name, grid, block, dynamic shared bytes and
its arguments (:class:`KernelArg`):

- ``slot``: a pointer to the Program slot ``slot`` (io slots: the caller's buffer; arena and
  scratch slots: the arena's base plus the slot's offset);
- ``workspace``: a pointer ``offset`` bytes into the source's own workspace, device memory
  the CUDA kernels need besides the Program's arena (partial results of reductions split
  across blocks); ``workspace_bytes`` long, allocated by whoever runs the source;
- ``scalar``: ``value`` passed as C type ``ctype`` (``NUMPY_SCALARS`` maps it to NumPy).

The text depends only on the Program, so it can serve as a cache key (``key()``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Union

import numpy as np

NUMPY_SCALARS = {"int": np.int32, "unsigned": np.uint32, "long long": np.int64,
                 "unsigned long long": np.uint64, "float": np.float32, "double": np.float64}


@dataclasses.dataclass(frozen=True)
class KernelArg:
    kind: str  # 'slot' | 'workspace' | 'scalar'
    slot: Union[int, None] = None
    offset: int = 0
    ctype: str = ""
    value: Union[int, float, None] = None

    def to_dict(self):
        return dataclasses.asdict(self)

    def numpy_value(self):
        """A scalar argument as the NumPy scalar of its C type."""
        return NUMPY_SCALARS[self.ctype](self.value)


@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple
    block: tuple
    shared_bytes: int
    args: tuple  # of KernelArg
    step: int  # the Program step it carries out (part of)
    # A GEMM the GPU's BLAS may run instead (runtime.gpu.seam.GemmSpec's fields; args 0-2
    # are A, B, C), or () for a kernel only
    blas: tuple = ()

    def to_dict(self):
        d = {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
             "shared_bytes": self.shared_bytes, "args": [a.to_dict() for a in self.args],
             "step": self.step}
        if self.blas:
            d["blas"] = list(self.blas)
        return d


@dataclasses.dataclass(frozen=True)
class CudaSource:
    name: str
    text: str
    launches: tuple  # of Launch
    kernels: tuple  # names of the kernels defined in text, in order
    arena_bytes: int
    workspace_bytes: int

    def key(self) -> str:
        record = {"text": self.text, "launches": [x.to_dict() for x in self.launches],
                  "workspace_bytes": self.workspace_bytes}
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
