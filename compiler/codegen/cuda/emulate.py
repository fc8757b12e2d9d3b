"""Run a Program's CUDA C on the emulated GPU: the CUDA target's test-facing runner, as
llvm's ``run_program`` is the LLVM target's.

``run_program_emulated(program, inputs, params)`` emits the source, builds it with the
emulator (runtime/gpu/emu: the host compiler under cuda_emu.h, cached on disk), places the
Program's slots in NumPy buffers (device memory is host memory here: io slots are the
caller's arrays, arena and scratch slots views into one arena), launches each kernel in
order and returns the outputs. Like the interpreter, the arena and the workspace start
filled with 0xFF bytes (NaN for floats), so a kernel reading what nothing wrote shows up.
"""
from __future__ import annotations

import numpy as np

from runtime.gpu.emu import build_module

from ..interp import slot_arrays
from ..kernel import Program
from .emit import emit_cuda
from .source import CudaSource

ALIGN = 256  # bytes: cudaMalloc's alignment, which the float4 paths may rely on


def device_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of emulated device memory (0xFF-filled, 256-byte aligned)."""
    raw = np.full(max(int(nbytes), 1) + ALIGN, 0xFF, dtype=np.uint8)
    off = (-raw.__array_interface__["data"][0]) % ALIGN
    return raw[off:off + max(int(nbytes), 1)]


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _contiguous(a) -> np.ndarray:
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")  # (keeps 0-d arrays 0-d)


def launch_args(launch, slot_ptrs, workspace_ptr: int) -> list:
    """A launch's arguments: device pointers (ints) and NumPy scalars."""
    out = []
    for a in launch.args:
        if a.kind == "slot":
            out.append(slot_ptrs[a.slot])
        elif a.kind == "workspace":
            out.append(workspace_ptr + a.offset)
        else:
            out.append(a.numpy_value())
    return out


def run_program_emulated(program: Program, inputs, params=(), outputs=None,
                         source: CudaSource | None = None) -> list:
    """Run ``program`` (or its already emitted ``source``) on the emulated GPU."""
    source = source or emit_cuda(program)
    module = build_module(source.text)
    if outputs is None:
        outputs = [np.empty(program.slots[i].shape, program.slots[i].dtype)
                   for i in program.slots_of("output")]
    arena = device_buffer(program.arena_bytes)
    arrays = slot_arrays(program, [_contiguous(x) for x in inputs],
                         [_contiguous(p) for p in params], outputs, arena)
    workspace = device_buffer(source.workspace_bytes)
    ptrs = [address(a) for a in arrays]
    for launch in source.launches:
        module.launch(launch.kernel, launch.grid, launch.block, launch.shared_bytes,
                      launch_args(launch, ptrs, address(workspace)))
    return list(outputs)
