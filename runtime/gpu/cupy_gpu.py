"""The GPU seam on a real NVIDIA GPU, through CuPy.

CuPy is imported lazily and found by its module name, never by its wheel's (a machine may
have cupy-cuda12x or cupy-cuda13x). Per GPU: a compute stream and a copy stream, both
non-blocking (the legacy default stream would serialize them, and copies could not overlap
compute); kernels from CUDA C through NVRTC (``cupy.RawModule``); graphs through
``cupy.cuda`` stream capture where this CuPy has it, else by recording the launches and
launching them again; GEMM through cuBLAS (``cupy.cublas.gemm``); host sides of copies staged
through pinned memory, so the copy engine moves them asynchronously.

CUDA's waits have no timeout: ours poll ``done`` with a growing sleep until theirs.
"""
from __future__ import annotations

import collections
import functools
import threading
import weakref

import numpy as np

from . import seam
from .seam import poll


@functools.lru_cache(maxsize=1)
def cupy_module():
    """CuPy if it imports, else None (never raises)."""
    try:
        import cupy  # noqa: PLC0415 - lazy on purpose
        return cupy
    except Exception:  # noqa: BLE001 - a broken install counts as none
        return None


def device_count() -> int:
    cp = cupy_module()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no driver, no device
        return 0


class CupyEvent(seam.Event):
    __slots__ = ("ev", "where")

    def __init__(self, ev, where="an event"):
        self.ev, self.where = ev, where

    def query(self) -> bool:
        return self.ev is None or bool(self.ev.done)  # never recorded: done, as in CUDA

    def synchronize(self, timeout=None):
        if self.ev is None:
            return
        poll(lambda: self.ev.done, timeout, self.where)
        self.ev.synchronize()  # done already: raises a failure of the work before it


class CupyGraph(seam.Graph):
    """A CUDA graph (native capture), or the launches recorded where CuPy has no capture."""

    def __init__(self, gpu, graph=None, recorded=None):
        self.gpu, self.graph, self.recorded = gpu, graph, recorded

    def replay(self, stream=None):
        stream = stream or self.gpu.compute_stream
        if self.graph is not None:
            with self.gpu.device:
                self.graph.launch(stream.s)
            return
        for fn in self.recorded:
            fn(stream)


class CupyStream(seam.Stream):
    def __init__(self, gpu, name):
        self.gpu, self.name = gpu, name
        cp = gpu.cp
        with gpu.device:
            self.s = cp.cuda.Stream(non_blocking=True)
        self._recording = None  # launches recorded during a capture CuPy cannot do
        self._kept = collections.deque()  # (event, objects) held until the event is done

    def keep(self, *objs):
        """Hold ``objs`` (the memory of a copy queued here) until the work queued so far is
        done: the caller may drop them now, and no pool hands them out while in use."""
        kept = self._kept
        while kept and kept[0][0].done:
            kept.popleft()
        ev = self.gpu.cp.cuda.Event(disable_timing=True)
        ev.record(self.s)
        kept.append((ev, objs))

    def run(self, label, fn):
        """Run ``fn(stream)`` now, or record it while a fallback capture is on."""
        if self._recording is not None:
            self._recording.append(fn)
            return
        with self.gpu.device:
            fn(self)

    def record(self, event=None):
        event = event or CupyEvent(None)
        with self.gpu.device:
            if event.ev is None:
                event.ev = self.gpu.cp.cuda.Event(disable_timing=True)
            event.ev.record(self.s)
        event.where = f"an event on {self}"
        return event

    def wait(self, event):
        if event.ev is not None:
            self.s.wait_event(event.ev)

    def query(self) -> bool:
        return bool(self.s.done)

    def synchronize(self, timeout=None):
        poll(lambda: self.s.done, timeout, str(self))
        self.s.synchronize()  # raises a failure of the work queued

    def begin_capture(self):
        if hasattr(self.s, "begin_capture"):
            with self.gpu.device:
                self.s.begin_capture()
        else:
            self._recording = []

    def end_capture(self):
        if self._recording is not None:
            recorded, self._recording = self._recording, None
            return CupyGraph(self.gpu, recorded=recorded)
        with self.gpu.device:
            return CupyGraph(self.gpu, graph=self.s.end_capture())


class CupyModule(seam.Module):
    def __init__(self, gpu, name, raw):
        self.gpu, self.name, self.raw = gpu, name, raw
        self._kernels = {}

    def launch(self, kernel_name, grid, block, shared_bytes, args, stream=None):
        kern = self._kernels.get(kernel_name)
        if kern is None:
            kern = self._kernels[kernel_name] = self.raw.get_function(kernel_name)
        conv = []
        for a in seam.check_launch_args(args):
            if isinstance(a, seam.DeviceBuffer):
                a = np.uint64(a.ptr)
            elif isinstance(a, (int, np.integer)) and not isinstance(a, np.generic):
                a = np.uint64(a)  # an address: 8 bytes, as the kernel's pointer parameter
            conv.append(a)
        grid, block = seam.launch_dims(grid), seam.launch_dims(block)
        shared = int(shared_bytes)
        (stream or self.gpu.compute_stream).run(
            f"kernel {kernel_name}",
            lambda s: kern(grid, block, tuple(conv), shared_mem=shared, stream=s.s))


class CupyGPU(seam.GPU):
    implementation = "cupy"

    def __init__(self, index: int):
        cp = cupy_module()
        self.cp = self.xp = cp
        self.index = index
        self.device = cp.cuda.Device(index)
        self.compute_stream = CupyStream(self, "compute")
        self.copy_stream = CupyStream(self, "copy")
        self._streams = weakref.WeakSet((self.compute_stream, self.copy_stream))
        self._modules = {}
        self._lock = threading.Lock()
        self._staging = {}  # (thread id, direction) -> pinned host bytes, grown as needed

    # memory
    def alloc(self, nbytes):
        with self.device:
            mem = self.cp.cuda.alloc(int(nbytes))
        return seam.DeviceBuffer(self, nbytes, mem.ptr, mem)

    def _view(self, mem, shape, dtype, offset):
        return self.cp.ndarray(shape, dtype, memptr=mem + offset)

    def address(self, array):
        return array.data.ptr

    def host_empty(self, shape, dtype):
        # pinned: the copy engine writes it directly, without the driver's bounce buffer
        import cupyx  # noqa: PLC0415
        return cupyx.empty_pinned(shape, dtype)

    # copies: cudaMemcpyAsync on the stream (pinned host memory makes them asynchronous)
    def copy_h2d(self, dst, src, stream=None):
        dst = seam.as_array(dst)
        self.check_copy("copy host->device", dst, src)
        src = self._pinned_copy(src)
        (stream or self.copy_stream).run(
            "copy host->device",
            lambda s: (dst.data.copy_from_host_async(src.ctypes.data, src.nbytes, s.s),
                       s.keep(dst, src)))

    def copy_d2h(self, dst, src, stream=None):
        src = seam.as_array(src)
        self.check_copy("copy device->host", dst, src)
        (stream or self.copy_stream).run(
            "copy device->host",
            lambda s: (src.data.copy_to_host_async(dst.ctypes.data, src.nbytes, s.s),
                       s.keep(dst, src)))

    def copy_d2d(self, dst, src, stream=None):
        dst, src = seam.as_array(dst), seam.as_array(src)
        self.check_copy("copy device->device", dst, src)
        # cudaMemcpyDefault under unified addressing: also between two GPUs
        (stream or self.copy_stream).run(
            "copy device->device",
            lambda s: (dst.data.copy_from_device_async(src.data, src.nbytes, s.s),
                       s.keep(dst, src)))

    def _pinned_copy(self, host: np.ndarray) -> np.ndarray:
        """A copy of ``host`` in pinned memory (held by the stream until the copy is done)."""
        import cupyx  # noqa: PLC0415
        out = cupyx.empty_pinned(host.shape, host.dtype)
        np.copyto(out, host)
        return out

    # streams
    def new_stream(self, name="stream"):
        s = CupyStream(self, name)
        self._streams.add(s)  # weakly: a dropped stream has nothing left to wait for
        return s

    def new_event(self):
        return CupyEvent(None)

    def synchronize(self, timeout=None):
        for s in list(self._streams):
            s.synchronize(timeout)

    def activate(self):
        return _Active(self)

    # kernels, BLAS
    def load_module(self, cuda_source, name="module"):
        with self._lock:
            mod = self._modules.get(cuda_source)
            if mod is None:
                with self.device:
                    raw = self.cp.RawModule(code=cuda_source, options=("--std=c++17",),
                                            backend="nvrtc")
                    raw.compile()  # errors here, with NVRTC's log, not at first launch
                mod = self._modules[cuda_source] = CupyModule(self, name, raw)
        return mod

    def gemm(self, a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=None):
        self.check_gemm(a, b, out, trans_a, trans_b)
        from cupy import cublas  # noqa: PLC0415

        def run(s):
            with s.s:  # cuBLAS takes the current stream
                cublas.gemm("T" if trans_a else "N", "T" if trans_b else "N", a, b, out=out,
                            alpha=alpha, beta=beta)

        (stream or self.compute_stream).run("gemm", run)

    def gemm_strided(self, spec, a, b, c, stream=None):
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415
        f64 = spec.dtype == "float64"
        fn = cublas.dgemmStridedBatched if f64 else cublas.sgemmStridedBatched
        one, zero = _ONE_ZERO[f64]
        op_t, op_n = cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N
        # cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major
        # C^T = op(B)^T op(A)^T, i.e. the same call with the operands swapped
        args = (op_t if spec.trans_b else op_n, op_t if spec.trans_a else op_n,
                spec.n, spec.m, spec.k, one.ctypes.data, int(b), spec.ldb, spec.stride_b,
                int(a), spec.lda, spec.stride_a, zero.ctypes.data, int(c), spec.n,
                spec.m * spec.n, spec.batch)

        def run(s):
            handle = self.cp.cuda.device.get_cublas_handle()
            cublas.setStream(handle, s.s.ptr)
            fn(handle, *args)

        (stream or self.compute_stream).run("gemm", run)


# cuBLAS reads alpha and beta through host pointers (its default pointer mode), at the call
_ONE_ZERO = {False: (np.ones((), np.float32), np.zeros((), np.float32)),
             True: (np.ones((), np.float64), np.zeros((), np.float64))}


class _Active:
    """This GPU and its compute stream current in this thread (CuPy's are per thread)."""

    __slots__ = ("gpu",)

    def __init__(self, gpu):
        self.gpu = gpu

    def __enter__(self):
        self.gpu.device.__enter__()
        self.gpu.compute_stream.s.__enter__()
        return self.gpu

    def __exit__(self, *exc):
        self.gpu.compute_stream.s.__exit__(*exc)
        self.gpu.device.__exit__(*exc)
