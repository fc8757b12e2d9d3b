"""Code generation: the backend-neutral kernel IR and its backends.

- kernel.py: the IR (Program, Slot, LoopKernel, ExternKernel, Access, expressions) and a
  ProgramBuilder;
- scalar.py: the scalar builder protocol registry expressions are written against, and the
  NumPy builder;
- interp.py: the NumPy reference interpreter (the oracle);
- lower.py: a fused graph -> a Program;
- extern_plan.py: each extern kernel's geometry, worker split and scratch (the scratch slots
  the Program carries), which every target carries out;
- testing.py: differential-testing helpers (many registry-op cases in one Program);
- one package per target: llvm/ (LLVM CPU code through llvmlite, loaded by runtime.native)
  and cuda/ (CUDA C, loaded and launched through the runtime's GPU seam, runtime/gpu).

Lowering a fused group: see kernel.py's docstring, or ``compile_program`` below::

    pb = ProgramBuilder()
    x, w, bias = pb.input((64, 512)), pb.param((256, 512)), pb.param((256,))
    t, y = pb.temp((64, 256)), pb.output((64, 256))
    pb.extern("matmul", [x, w], [t], transpose_b=True)              # t = x @ w.T (BLAS)
    add = call("add", Load(0), Load(1), dtype="float32")
    pb.loop((64, 256), [pb.access(t), pb.access(bias, (64, 256))],     # bias broadcast
            [Output(pb.access(y), call("relu", add, dtype="float32"))])
    compiled = compile_program(pb.build(), "dense_relu")
    (out,) = run_program(compiled, [x_np], [w_np, b_np])
"""

__all__ = ["Access", "Call", "Const", "ExternKernel", "Index", "KernelIRError", "Load",
           "LoopKernel", "Output", "Program", "ProgramBuilder", "Slot", "broadcast_strides",
           "call", "contiguous_strides", "extern_out_specs", "extern_scratch_bytes",
           "make_attrs", "NumpyScalarBuilder", "ScalarBuilder", "interpret",
           "compile_program", "run_program", "emit_ir", "CompiledProgram", "Runner"]


_HOME = {"interpret": "interp", "NumpyScalarBuilder": "scalar", "ScalarBuilder": "scalar",
         "compile_program": "llvm", "run_program": "llvm", "emit_ir": "llvm",
         "CompiledProgram": "llvm", "Runner": "llvm"}  # the rest: kernel


def __getattr__(name):
    # every name is loaded on first use: a warm start (compiler/exe_cache.py) imports
    # codegen/llvm/loaded.py alone, and the LLVM backend loads llvmlite only when asked for
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib  # noqa: PLC0415
    return getattr(importlib.import_module(f".{_HOME.get(name, 'kernel')}", __name__), name)


def backend_compile(graph, backend, device, in_specs, param_specs, rows=None):
    """Lower an optimized graph and build its executable for ``backend`` (``rows``: see
    compiler.pipeline.compile; the LLVM backend bounds its kernels by them, CUDA computes
    every padded row)."""
    if backend == "llvm":
        from .llvm.exec import llvm_compile  # noqa: PLC0415
        return llvm_compile(graph, device, in_specs, param_specs, rows)
    if backend == "cuda":
        from .cuda.exec import cuda_compile  # noqa: PLC0415
        return cuda_compile(graph, device, in_specs, param_specs)
    raise ValueError(f"backend {backend!r} has no code generator; use backend='llvm', 'cuda' "
                     "or 'reference'")
