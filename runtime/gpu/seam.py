"""The GPU seam: everything the project asks of a GPU, in one small interface.

Per GPU (:class:`GPU`, one object per device, from :func:`get_gpu`):

- memory: ``alloc(nbytes)`` / ``free(buf)`` raw device memory (:class:`DeviceBuffer`, which
  views as arrays), ``empty(shape, dtype)`` an array in the GPU's array module ``xp``,
  ``address(array)`` where an array's data starts;
- copies: ``copy_h2d``, ``copy_d2h``, ``copy_d2d`` (also from another GPU), each queued on a
  stream; ``to_device``, ``to_host``, ``from_gpu`` do a whole array and return when it is
  there, ordered after the kernels queued before them on the compute stream;
- streams and events: ``compute_stream`` (where eager ops and kernels run, the current
  stream of ``activate()``), ``copy_stream`` (copies, so they overlap compute),
  ``new_stream()``; ``Stream.record() -> Event``, ``Stream.wait(event)``, ``query()``,
  ``synchronize(timeout)``. Every wait has a timeout (``HYBRID_WAIT_TIMEOUT`` by default)
  and raises :class:`runtime.engine.WaitTimeout` past it: nothing hangs;
- kernels: ``load_module(cuda_source, name) -> Module``;
  ``Module.launch(kernel_name, grid, block, shared_bytes, args, stream)`` where args are
  device arrays, :class:`DeviceBuffer`, ints (device addresses) and NumPy scalars (a Python
  float is refused: the kernel's parameter decides between float and double);
- graphs: ``Stream.begin_capture()``, then the launches and copies queued on the stream are
  recorded instead of run, ``Stream.end_capture() -> Graph``, ``Graph.replay(stream)``;
- BLAS: ``gemm(a, b, out, trans_a, trans_b, alpha, beta, stream)``, row-major
  ``out = alpha * op(a) @ op(b) + beta * out`` for float32 (sgemm) and float64 (dgemm).

Implementations: :mod:`.cupy_gpu` (CuPy on an NVIDIA GPU) and :mod:`.emulated`
(``HYBRID_GPU_EMULATE=N``: N GPUs made of host memory and threads). :func:`get_gpu` picks
one; :func:`num_gpus` says how many there are, cheaply and without ever raising.
"""
from __future__ import annotations

import abc
import contextlib
import functools
import threading
import time
import typing

import numpy as np

from .. import config
from ..device import DeviceError
from ..engine import WaitTimeout


class GemmSpec(typing.NamedTuple):
    """A batched row-major GEMM over raw device addresses (what a compiled matmul asks of the
    GPU's BLAS): dtype 'float32' or 'float64'; op(A) is m x k, op(B) k x n; ``lda``/``ldb``
    are the stored rows' lengths; ``batch`` products, A's and B's ``stride_a``/``stride_b``
    elements apart (0: the same matrix for all), C's m * n apart."""
    dtype: str
    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    batch: int
    stride_a: int
    stride_b: int


class GPUError(RuntimeError):
    """A GPU operation failed (a kernel, a copy, a misuse of capture)."""


def wait_timeout(timeout) -> float:
    return config.get("HYBRID_WAIT_TIMEOUT") if timeout is None else float(timeout)


# A wait first asks ``done()`` in a tight loop for this long (CUDA's own default waits spin
# too): a sleep, however short it asks to be, costs ~60-110 us on these VMs (timer slack and
# the syscall; measured: time.sleep(5e-6) 110 us, sleep(0) 100 us on the dev box), most of a
# synchronous `y = x + 1` on a GPU (93-107 us a synced op on the H100 vs PyTorch's 18-37).
SPIN_SECONDS = 200e-6


def poll(done, timeout, what: str):
    """Wait until ``done()``: spinning for SPIN_SECONDS, then with a growing sleep (CUDA's
    own waits have no timeout)."""
    spin_end = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < spin_end:
        if done():
            return
    timeout = wait_timeout(timeout)
    deadline = time.monotonic() + timeout
    pause = 5e-6
    while not done():
        if time.monotonic() > deadline:
            raise WaitTimeout(f"waited {timeout:g}s for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class Event(abc.ABC):
    """A position in a stream. A new event, never recorded, counts as done (as in CUDA)."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Whether the work before the recorded position is done (never blocks)."""

    @abc.abstractmethod
    def synchronize(self, timeout=None):
        """Block until the work before the recorded position is done; raises its failure."""


class Graph(abc.ABC):
    """Work captured on a stream, replayable as one unit."""

    @abc.abstractmethod
    def replay(self, stream=None):
        """Queue the captured work again, on ``stream`` (default: the compute stream)."""


class Stream(abc.ABC):
    """An ordered queue of GPU work: items run in the order they were queued."""

    gpu: "GPU"
    name: str

    @abc.abstractmethod
    def record(self, event: Event | None = None) -> Event:
        """Mark the current end of this stream (in ``event``, or a new one)."""

    @abc.abstractmethod
    def wait(self, event: Event):
        """Work queued on this stream from now on runs after ``event``'s position."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Whether everything queued so far is done."""

    @abc.abstractmethod
    def synchronize(self, timeout=None):
        """Block until everything queued so far is done; raises a failure of that work."""

    @abc.abstractmethod
    def begin_capture(self):
        """Record the work queued on this stream from now on, instead of running it."""

    @abc.abstractmethod
    def end_capture(self) -> Graph:
        """Stop recording; the recorded work as a :class:`Graph`."""

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} of gpu({self.gpu.index})>"


class Module(abc.ABC):
    """Compiled CUDA C: its ``extern "C" __global__`` kernels, launched by name."""

    name: str

    @abc.abstractmethod
    def launch(self, kernel_name: str, grid, block, shared_bytes: int, args, stream=None):
        """Queue one launch on ``stream`` (default: the compute stream)."""


class DeviceBuffer:
    """Raw device memory of ``nbytes`` bytes at device address ``ptr``; ``view`` it as an
    array of the GPU's array module. ``free()`` gives it back (views made before must not
    be used afterwards, as with cudaFree)."""

    __slots__ = ("gpu", "nbytes", "ptr", "_mem")

    def __init__(self, gpu, nbytes: int, ptr: int, mem):
        self.gpu, self.nbytes, self.ptr, self._mem = gpu, int(nbytes), int(ptr), mem

    def view(self, shape, dtype, offset: int = 0):
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._mem is None:
            raise GPUError(f"{self!r} was freed")
        if offset < 0 or offset + n > self.nbytes or offset % dtype.itemsize:
            raise ValueError(f"view of {n} bytes at offset {offset} does not fit {self!r} "
                             f"(or is not aligned to {dtype.itemsize} bytes)")
        return self.gpu._view(self._mem, shape, dtype, offset)

    def free(self):
        self._mem = None

    def __repr__(self):
        state = "" if self._mem is not None else ", freed"
        return f"DeviceBuffer({self.nbytes} bytes on gpu({self.gpu.index}){state})"


class GPU(abc.ABC):
    """One GPU. Subclasses implement the abstract methods; the whole-array helpers and the
    checks are written once here."""

    implementation: str  # "cupy" or "emulated"
    xp = None  # the array module of this GPU's arrays
    index: int
    compute_stream: Stream
    copy_stream: Stream

    # ---------------------------------------------------------------- memory
    @abc.abstractmethod
    def alloc(self, nbytes: int) -> DeviceBuffer: ...

    def free(self, buf: DeviceBuffer):
        buf.free()

    @abc.abstractmethod
    def _view(self, mem, shape, dtype, offset): ...

    @abc.abstractmethod
    def address(self, array) -> int:
        """The device address of ``array``'s first element (an array of this GPU)."""

    def empty(self, shape, dtype):
        """An uninitialized array on this GPU."""
        with self.activate():
            return self.xp.empty(tuple(shape), dtype=np.dtype(dtype))

    # ---------------------------------------------------------------- copies
    @abc.abstractmethod
    def copy_h2d(self, dst, src: np.ndarray, stream: Stream | None = None): ...

    @abc.abstractmethod
    def copy_d2h(self, dst: np.ndarray, src, stream: Stream | None = None): ...

    @abc.abstractmethod
    def copy_d2d(self, dst, src, stream: Stream | None = None):
        """``src`` may live on another GPU of the same implementation."""

    def to_device(self, host) -> object:
        """A copy of host array ``host`` on this GPU, there when this returns."""
        host = np.asarray(host)
        if not host.flags.c_contiguous:  # (ascontiguousarray would make a 0-d array 1-d)
            host = np.ascontiguousarray(host)
        out = self.empty(host.shape, host.dtype)
        stream = self.copy_stream
        self.copy_h2d(out, host, stream)
        stream.record().synchronize()
        return out

    def to_host(self, src) -> np.ndarray:
        """A host copy of ``src`` (an array on this GPU), taken after every kernel queued
        on the compute stream before this call (a kernel may still be writing it)."""
        return self._copied(src, self, self.host_empty, self.copy_d2h)

    def from_gpu(self, src, src_gpu: "GPU"):
        """A copy on this GPU of ``src``, an array on ``src_gpu`` (this one or another)."""
        return self._copied(src, src_gpu, self.empty, self.copy_d2d)

    def _copied(self, src, src_gpu, alloc, copy):
        """``copy`` of ``src`` into a new ``alloc`` array on the copy stream, after the
        kernels queued on ``src_gpu`` that may write it; waits until it is done."""
        stream = self.copy_stream
        ready, src = src_gpu._ready(src)
        stream.wait(ready)
        out = alloc(src.shape, src.dtype)
        copy(out, src, stream)
        stream.record().synchronize()
        return out

    def _ready(self, src):
        """(an event after the kernels that may write ``src``, ``src`` laid out contiguously:
        made on the compute stream after them where it is not)."""
        with self.activate():
            if not src.flags.c_contiguous:
                src = self.xp.ascontiguousarray(src)
            return self.compute_stream.record(), src

    def host_empty(self, shape, dtype) -> np.ndarray:
        """A host array that copies from this GPU land in (pinned memory where it helps)."""
        return np.empty(shape, dtype)

    @staticmethod
    def check_copy(what: str, dst, src):
        if tuple(dst.shape) != tuple(src.shape) or np.dtype(dst.dtype) != np.dtype(src.dtype):
            raise ValueError(f"{what}: destination {np.dtype(dst.dtype)}{list(dst.shape)} "
                             f"does not match source {np.dtype(src.dtype)}{list(src.shape)}")
        if not (dst.flags.c_contiguous and src.flags.c_contiguous):
            raise ValueError(f"{what}: copies take C-contiguous arrays (make a contiguous "
                             "copy first)")

    # ---------------------------------------------------------------- streams
    @abc.abstractmethod
    def new_stream(self, name: str = "stream") -> Stream: ...

    @abc.abstractmethod
    def new_event(self) -> Event: ...

    @abc.abstractmethod
    def synchronize(self, timeout=None):
        """Block until all work queued on this GPU's streams is done."""

    @abc.abstractmethod
    def activate(self):
        """A context manager: this GPU and its compute stream are current in this thread (the
        engine's workers for the GPU run inside it)."""

    # ---------------------------------------------------------------- kernels, BLAS
    @abc.abstractmethod
    def load_module(self, cuda_source: str, name: str = "module") -> Module: ...

    @abc.abstractmethod
    def gemm(self, a, b, out, trans_a: bool = False, trans_b: bool = False,
             alpha: float = 1.0, beta: float = 0.0, stream: Stream | None = None): ...

    @abc.abstractmethod
    def gemm_strided(self, spec: "GemmSpec", a: int, b: int, c: int,
                     stream: Stream | None = None):
        """Queue ``spec``'s batched row-major GEMM on device addresses ``a``, ``b``, ``c``
        (C[z] = op(A[z]) @ op(B[z]); C dense, z's matrices ``spec.stride_a``/``stride_b``
        elements apart, 0 to broadcast one)."""

    @staticmethod
    def check_gemm(a, b, out, trans_a, trans_b):
        """(m, n, k) of a row-major GEMM, after checking shapes and dtypes."""
        if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
            raise ValueError("gemm: a, b and out must be 2-D")
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        k2, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
        dt = np.dtype(a.dtype)
        if dt not in (np.float32, np.float64) or b.dtype != dt or out.dtype != dt:
            raise TypeError(f"gemm: a, b and out must all be float32 (sgemm) or float64 "
                            f"(dgemm), got {a.dtype}, {b.dtype}, {out.dtype}")
        if k != k2 or tuple(out.shape) != (m, n):
            raise ValueError(f"gemm: op(a) is {m}x{k}, op(b) {k2}x{n}, out "
                             f"{'x'.join(map(str, out.shape))}")
        return m, n, k

    def __repr__(self):
        return f"<{self.implementation} gpu({self.index})>"


def check_launch_args(args) -> list:
    """Launch arguments as the implementations take them; refuses what has no fixed C type."""
    out = []
    for i, a in enumerate(args):
        if isinstance(a, (bool, float, complex)):
            raise TypeError(f"launch: argument {i} is a Python {type(a).__name__}; pass a NumPy "
                            "scalar (np.float32(x), np.int32(n), ...): the kernel's parameter "
                            "type decides its width")
        out.append(a)
    return out


def as_array(x):
    """A :class:`DeviceBuffer` as the GPU's array of its bytes; an array as it is."""
    return x.view((x.nbytes,), np.uint8) if isinstance(x, DeviceBuffer) else x


def launch_dims(d) -> tuple:
    """A grid or block as three ints (an int or a shorter tuple padded with 1s)."""
    d = (int(d),) if isinstance(d, (int, np.integer)) else tuple(int(x) for x in d)
    return (d + (1, 1))[:3]


# ------------------------------------------------------------------- choosing an implementation
_gpus: dict = {}
_gpus_lock = threading.Lock()


def _emulated_count() -> int:
    return config.get("HYBRID_GPU_EMULATE")


@functools.lru_cache(maxsize=1)
def _cupy_count() -> int:
    from . import cupy_gpu  # noqa: PLC0415 - CuPy is imported only when asked about
    return cupy_gpu.device_count()


def implementation() -> str:
    """'emulated' (HYBRID_GPU_EMULATE set), 'cupy' (CuPy sees a GPU) or 'none'."""
    if _emulated_count():
        return "emulated"
    return "cupy" if _cupy_count() else "none"


def num_gpus() -> int:
    """How many GPUs :func:`get_gpu` serves; 0 when none (never raises)."""
    try:
        return _emulated_count() or _cupy_count()
    except Exception:  # noqa: BLE001 - a bad HYBRID_GPU_EMULATE value: get_gpu says why
        return 0


def get_gpu(index: int) -> GPU:
    """The GPU ``index`` of the chosen implementation; DeviceError saying the fix if absent."""
    n = _emulated_count()
    impl = "emulated" if n else "cupy"
    gpu = _gpus.get((impl, index))
    if gpu is not None:
        return gpu
    if not n:
        from . import cupy_gpu  # noqa: PLC0415
        n = _cupy_count()
        if n == 0:
            why = ("CuPy is not installed" if cupy_gpu.cupy_module() is None
                   else "CuPy sees 0 GPU(s): no NVIDIA driver or device")
            raise DeviceError(
                f"gpu({index}) was used, but no GPU is available here ({why}); install "
                "hybrid[gpu] (pip install cupy-cuda13x or the CuPy of your CUDA version) on "
                "a machine with an NVIDIA GPU, set HYBRID_GPU_EMULATE=N for N emulated GPUs, "
                "or use hb.cpu()")
    if index >= n:
        how = f" (emulated: HYBRID_GPU_EMULATE={n})" if impl == "emulated" else ""
        raise DeviceError(f"gpu({index}) was used, but this machine has {n} GPU(s){how}; "
                          f"use hb.gpu(i) with i < {n}, or hb.cpu()")
    with _gpus_lock:
        gpu = _gpus.get((impl, index))
        if gpu is None:
            if impl == "emulated":
                from .emulated import EmulatedGPU as cls  # noqa: PLC0415
            else:
                from .cupy_gpu import CupyGPU as cls  # noqa: PLC0415
            gpu = _gpus[(impl, index)] = cls(index)
    return gpu


NOTHING = contextlib.nullcontext()  # activate() of a GPU that keeps no state per thread
