"""The CUDA backend's executable: a lowered graph's CUDA source, loaded on a GPU through the
runtime's seam (runtime/gpu/seam.py; a real GPU through CuPy, or an emulated one), and the
launches that run it, queued on the GPU's compute stream.

Per executable: the module (compiled once by the seam: NVRTC on a GPU, the host compiler
under the emulator), ONE device allocation holding the Program's arena and the source's
workspace, and the Program's constants copied to the device. Per call: inputs and parameters
as they come (made contiguous only where they are not), fresh output arrays, and the
Program's launches in order: replayed as one CUDA graph captured at the first call, with
the io copied through static buffers (replay.py says why), or with HYBRID_CUDA_GRAPHS=0 one
launch per kernel on the caller's pointers. Stream order keeps them, and the next call's,
in sequence. The call returns once the work is queued; the outputs are ready in stream
order, as every GPU op's are.
"""
from __future__ import annotations


import threading
import time
from pathlib import Path

import numpy as np

from runtime import config
from runtime.executable import Executable
from runtime.gpu.seam import GemmSpec

from ..lower import gather_outputs, lower
from .emit import emit_cuda
from .replay import StaticGraph, alias_view
from .writer import WORKSPACE_ALIGN

_log = config.logger("compile")


def gpu_device(device):
    """The GPU Device a 'cuda' executable runs on (gpu(0) when the call names none)."""
    from runtime.device import gpu, parse_device  # noqa: PLC0415
    if device is None:
        return gpu(0)
    if isinstance(device, str):  # a part of a partitioned graph names its device
        device = parse_device(device)
    if getattr(device, "kind", None) != "gpu":
        raise ValueError(f"backend='cuda' compiles for GPUs, but this graph runs on {device}; "
                         "put its inputs and parameters on hb.gpu(i), or hybridize with "
                         "backend='llvm' for the CPU")
    return device


class CudaRun:
    """``run(xp, inputs, params) -> outputs`` of one compiled Program on one GPU."""

    def __init__(self, gpu, module, source, program, binding):
        self.gpu, self.module, self.source, self.program = gpu, module, source, program
        arena = -(-program.arena_bytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        self.memory = gpu.alloc(max(arena + source.workspace_bytes, 1))
        self.workspace_ptr = self.memory.ptr + arena
        io = program.io_slots()
        self.slot_pos = {s: pos for pos, s in enumerate(io)}
        self.entries = list(binding.io)
        self.outputs = binding.outputs
        self.want = [(tuple(program.slots[s].shape), np.dtype(program.slots[s].dtype))
                     for s in io]
        self.consts = {pos: gpu.to_device(np.ascontiguousarray(e[1], dtype=self.want[pos][1])
                                          .reshape(self.want[pos][0]))
                       for pos, e in enumerate(self.entries) if e[0] == "const"}
        self.out_consts = [gpu.to_device(np.asarray(v)) if kind == "const" else None
                           for kind, v in self.outputs]
        self.arena_ptrs = {s: self.memory.ptr + slot.offset
                           for s, slot in enumerate(program.slots) if slot.in_arena}
        # one call at a time queues its work: the arena and the graph's static io are shared
        self.lock = threading.Lock()
        self.blas = bool(config.get("HYBRID_CUDA_BLAS"))
        # per launch (by identity: the source holds them), its arguments made once — NumPy
        # scalars, workspace and arena addresses — with the io positions a call fills in, and
        # its GemmSpec: a call only copies the list and sets its io (an MLP forward's 4
        # launches, 32 arguments: 14.3 -> 2.3 us a call on this box)
        self._plans = {id(launch): self._plan(launch) for launch in source.launches}
        self.graph = StaticGraph(self)

    def _plan(self, launch):
        template, fills = [], []
        for i, a in enumerate(launch.args):
            if a.kind == "slot":
                pos = self.slot_pos.get(a.slot)
                if pos is None:
                    template.append(self.arena_ptrs[a.slot])
                else:
                    template.append(None)
                    fills.append((i, pos))
            elif a.kind == "workspace":
                template.append(self.workspace_ptr + a.offset)
            else:
                template.append(a.numpy_value())
        return template, tuple(fills), GemmSpec(*launch.blas) if launch.blas else None

    def _prepare(self, xp, a, want):
        shape, dt = want
        if a.dtype != dt or not a.flags.c_contiguous:
            a = xp.ascontiguousarray(a, dtype=dt)
        return a if tuple(a.shape) == shape else a.reshape(shape)

    def __call__(self, xp, inputs, params):
        io = [None] * len(self.entries)
        outs = {}
        for pos, (kind, v) in enumerate(self.entries):
            if kind == "input":
                io[pos] = self._prepare(xp, inputs[v], self.want[pos])
            elif kind == "param":
                io[pos] = self._prepare(xp, params[v], self.want[pos])
            elif kind == "const":
                io[pos] = self.consts[pos]
            elif kind == "output":
                io[pos] = outs[v] = self.gpu.empty(*self.want[pos])
        for pos, (kind, v) in enumerate(self.entries):
            if kind == "alias":  # the same buffer under another shape
                io[pos] = alias_view(io[v], self.want[pos][0])
        with self.lock:
            if self.graph.usable():
                self.graph.call(io)
            else:
                self.graph.plain(io)
        return gather_outputs(self.outputs, outs, inputs, params, self.out_consts)

    def launch(self, launch, bufs, stream=None, blas=True):
        """Queue ``launch`` on ``bufs`` (io position -> array): its kernel, or the GPU's BLAS
        where the launch describes a GEMM, HYBRID_CUDA_BLAS is on and ``blas`` (a graph
        capture passes False: CuPy refuses cuBLAS calls under stream capture, so a replayed
        graph runs the generated GEMM)."""
        template, fills, gemm = self._plans[id(launch)]
        args = template.copy()
        for i, pos in fills:
            args[i] = bufs[pos]
        if gemm is not None and self.blas and blas:
            address = self.gpu.address
            a, b, c = (x if isinstance(x, int) else address(x) for x in args[:3])
            self.gpu.gemm_strided(gemm, a, b, c, stream)
            return
        self.module.launch(launch.kernel, launch.grid, launch.block, launch.shared_bytes,
                           args, stream)


def _dump(source):
    """HYBRID_DUMP_DIR: the executable's CUDA C, as <name>.cu (the name is sanitized)."""
    where = config.get("HYBRID_DUMP_DIR")
    if where:
        path = Path(where)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{source.name}.cu").write_text(source.text)
        _log.info("%s: dumped %s.cu to %s", source.name, source.name, path)


def cuda_compile(graph, device, in_specs, param_specs) -> Executable:
    device = gpu_device(device)
    t0 = time.perf_counter()
    program, binding = lower(graph)
    name = f"{graph.name or 'hybrid'}_{program.key()[:16]}"
    source = emit_cuda(program, name)
    t1 = time.perf_counter()
    _dump(source)
    gpu = device.seam
    module = gpu.load_module(source.text, name)
    t2 = time.perf_counter()
    _log.info("%s: lowered to %d kernel(s), %d launch(es) in %.1f ms, module built in %.1f ms",
              graph.name, len(program.steps), len(source.launches), (t1 - t0) * 1e3,
              (t2 - t1) * 1e3)
    run = CudaRun(gpu, module, source, program, binding)
    report = {"kernels": len(source.kernels), "launches": len(source.launches),
              "arena_bytes": program.arena_bytes, "workspace_bytes": source.workspace_bytes,
              "lower_seconds": t1 - t0, "codegen_seconds": t2 - t1, "program": program,
              "cuda_source": source, "cuda_graphs": run.graph.stats}
    return Executable(run, "cuda", in_specs, param_specs,
                      [graph.spec(o) for o in graph.outputs], device, report)
