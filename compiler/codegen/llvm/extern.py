"""Extern kernels on the LLVM backend: the entry that emits one, by op, from its family's file.

- matmul.py: matmul (OpenBLAS calls, loop GEMMs; sgemm.py's register-tiled float32 loops and
  gemv.py's batch-1 loops where they apply);
- conv.py: conv2d and its gradients (im2col + GEMM, or direct loops);
- pooling.py: pool2d and its gradient;
- gather.py: take, take_grad, pick, argmax, argmin;
- extern_builder.py: what they are written with (``EB``) and their split into workers.

Semantics are those of the registry's eager impls (compiler/ops/nn.py, movement.py,
linalg.py, reduce.py); tests compare the two.

Threads: big externs split their batch into workers (how many, and their scratch: the
target-neutral plan, ../extern_plan.py) run by emit.py's parallel driver; OpenBLAS runs
single-threaded inside them. float32/float64 GEMMs call OpenBLAS (runtime/blas.py); other
dtypes use loop GEMMs.
"""
from __future__ import annotations

from llvmlite import ir

from ...passes.row_bounds import BOUNDED_EXTERNS
from .. import extern_plan
from ..kernel import ExternKernel, KernelIRError
from . import conv, gather, matmul, pooling
from .emit import kernel_function
from .extern_builder import EB
from .gemv import GEMV_CHUNKS, GEMV_PARALLEL_MIN

_EMITTERS = {**matmul.EMITTERS, **conv.EMITTERS, **pooling.EMITTERS, **gather.EMITTERS}


def extern_key() -> list:
    """The settings that split externs into workers: part of the machine-code cache key, as
    the Program shows them only through scratch sizes."""
    p = extern_plan
    return [p.max_workers(), p.PARALLEL_MIN_WORK, p.POOL_MIN_WORK, p.THIN_MIN_WORK,
            p.SCRATCH_BUDGET, GEMV_PARALLEL_MIN, GEMV_CHUNKS, p.SGEMM_PACK_MIN_ROWS,
            p.SGEMM_MAX_K, p.SGEMM_MAX_A_BYTES, p.SGEMM_MIN_WORK]


def emit_extern(mb, step: ExternKernel, fname: str, groups, bound=None) -> ir.Function:
    fn = kernel_function(mb, fname, groups)
    eb = EB(mb, fn, mb.program, groups, bound)
    if bound is not None and step.op not in BOUNDED_EXTERNS:
        raise KernelIRError(f"the LLVM backend bounds no {step.op!r} kernel by rows")
    emit = _EMITTERS.get(step.op)
    if emit is None:
        raise KernelIRError(f"the LLVM backend has no extern kernel for {step.op!r}")
    emit(eb, step, step.attr_dict)
    eb.b.ret_void()
    return fn
