"""The CUDA C target, beside the LLVM CPU target (../llvm/): kernel-IR Programs -> CUDA C.

It reads the same kernel IR (../kernel.py) and gets what an op means only from the registry,
through the scalar builder protocol (../scalar.py), written here as C text.

- emit.py: ``emit_cuda(program, name) -> CudaSource`` (source.py: the text and the launches);
- scalar.py: the CUDA C scalar builder; prelude.py: the device helpers every source starts
  with (float16 conversions, NumPy's division and extrema, shuffles);
- writer.py: the module and kernel writers; loops.py: elementwise kernels (grid-stride,
  float4); reduction.py: reductions (thread, block tree with warp shuffles, split across
  blocks);
- externs, one file per family: matmul.py (tiled GEMM), gather.py (take, take_grad, pick,
  argmax, argmin), pooling.py (pool2d and its gradient), conv.py (conv2d and its gradients,
  direct kernels); an extern without a kernel is refused by name (emit.py);
- compile_check.py: compile a source for a GPU architecture (nvcc, or NVRTC through CuPy);
- emulate.py: ``run_program_emulated``: run a Program's source on the emulated GPU
  (runtime/gpu/emu), the test-facing runner.
"""
from .emit import covered_externs, emit_cuda
from .source import CudaSource, KernelArg, Launch

__all__ = ["CudaSource", "KernelArg", "Launch", "covered_externs", "emit_cuda"]
