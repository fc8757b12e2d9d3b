"""A kernel-IR Program -> one CUDA C source (:class:`CudaSource`).

Each step becomes one or more kernel launches, in step order: loop kernels through
reduction.py / loops.py, extern kernels through their family's file (``EXTERN_EMITTERS``).
An extern this target has no kernel for raises KernelIRError naming it: never a wrong
answer. The text is deterministic for a given Program (the same Program, the same bytes),
so it can key caches.
"""
from __future__ import annotations

from ..kernel import KernelIRError, LoopKernel, Program
from . import conv, gather, matmul, pooling
from .prelude import prelude
from .reduction import emit_loop_kernel
from .source import CudaSource
from .writer import ModuleWriter

CODEGEN_VERSION = 1
EXTERN_EMITTERS = {**matmul.EMITTERS, **gather.EMITTERS, **pooling.EMITTERS,
                   **conv.EMITTERS}


def emit_cuda(program: Program, name: str = "program") -> CudaSource:
    """The CUDA source of ``program`` and the launches that run it."""
    program.validate()
    mw = ModuleWriter(program, name)
    conv.reserve_scratch(mw)
    for k, step in enumerate(program.steps):
        mw.step = k
        if isinstance(step, LoopKernel):
            emit_loop_kernel(mw, step)
            continue
        emitter = EXTERN_EMITTERS.get(step.op)
        if emitter is None:
            raise KernelIRError(f"the CUDA backend has no kernel for the extern {step.op!r} "
                                f"(step {k}); it covers {', '.join(sorted(EXTERN_EMITTERS))}")
        emitter(mw, step)
    return mw.source(f"// hybrid CUDA codegen v{CODEGEN_VERSION}: {mw.name}\n" + prelude())


def covered_externs() -> tuple:
    return tuple(sorted(EXTERN_EMITTERS))


__all__ = ["CudaSource", "emit_cuda", "covered_externs"]
