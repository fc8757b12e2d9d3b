"""The LLVM CPU target: kernel-IR Programs -> native code through llvmlite, loaded by
runtime.native.

- emit.py: the module builder (loop kernels, the parallel driver), compile_program,
  run_program, Runner;
- scalar.py: the scalar builder protocol (../scalar.py) emitted as LLVM IR, vector math;
- extern.py: extern kernels by op, one file per family: matmul.py (with sgemm.py's
  register-tiled float32 loops and gemv.py's batch-1 loops), conv.py, pooling.py,
  gather.py; extern_builder.py what they are written with. Their geometry, worker split
  and scratch come from the target-neutral plan, ../extern_plan.py;
- threadpool.py: the process-wide native thread pool the parallel driver hands chunks to;
- exec.py: the executable of a compiled graph (``llvm_compile``, one native call a call);
- loaded.py: what runs loaded code (CompiledProgram, NativeRun), without llvmlite.ir: a warm
  start (a disk cache hit, compiler/exe_cache.py) imports only it.

The names below load emit.py (and llvmlite.ir) on first use, not with the package.
"""
__all__ = ["CompiledProgram", "Runner", "compile_program", "emit_ir", "run_program"]


def __getattr__(name):
    if name in __all__:
        from . import emit  # noqa: PLC0415
        return getattr(emit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
