"""Emulated GPUs (``HYBRID_GPU_EMULATE=N``): the GPU seam on the CPU.

Device memory is host memory, held as :class:`DeviceArray` (a NumPy subclass that host code
may not take for its own, as CuPy's arrays are not NumPy's; ``xp`` is NumPy making its arrays
on the GPU), kernels are the CUDA C that would run on a GPU, built for the host by
``runtime.gpu.emu`` and launched through it, GEMM is NumPy's. What makes it a GPU to the code
above is the stream model, kept exactly:

- the compute stream runs its work in the thread that queues it, as eager NumPy ops run in the
  engine's worker for the GPU; so a kernel queued there and an eager op after it keep
  program order, as they would on one CUDA stream;
- every other stream (the copy stream, ``new_stream``) is a queue with a worker thread of its
  own: queuing returns at once, work runs in order, ``wait(event)`` holds the queue until the
  event's position is reached, events complete as the worker passes them. A failed item
  poisons the stream: the work queued behind it is skipped (it would read garbage), every
  event after it carries the error, and the next ``synchronize()`` raises it (and clears it);
- capture records the stream's work (launches, copies, GEMMs, event records and waits) instead
  of running it; replay queues the recording again.
"""
from __future__ import annotations

import collections
import ctypes
import threading
import weakref

import numpy as np

from ..engine import WaitTimeout
from . import seam
from .seam import GPUError, wait_timeout

_ALIGN = 256  # cudaMalloc's alignment: generated kernels may rely on it
_IDLE_EXIT = 5.0  # seconds an idle stream worker lingers before its thread ends


# ---------------------------------------------------------------- device memory
class DeviceArray(np.ndarray):
    """An emulated GPU's array: host memory that host code may not take for its own.

    On a real GPU a CuPy array is not a NumPy array: a CuPy op given a host array, or a kernel
    launched with one, raises, and native CPU code handed GPU memory crashes. Were emulated
    GPU memory plain NumPy arrays, each of those bugs would run here by accident (two did,
    until a GPU showed them). So an emulated GPU's arrays are this subclass: an op mixing
    them with host arrays raises TypeError as CuPy does, a launch takes no host array, and
    the LLVM backend refuses them (``__device_memory__``). NumPy scalars and 0-d arrays mix
    freely, as with CuPy.
    """

    __device_memory__ = True
    __array_priority__ = 100.0

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _refuse_host(ufunc.__name__, inputs + (out or ()))
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        res = getattr(ufunc, method)(*(_plain(a) for a in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _on_device(res)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host(func.__name__, (args, kwargs))
        return _on_device(func(*_plain_tree(args), **_plain_tree(kwargs)))


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def _plain_tree(v):
    if isinstance(v, DeviceArray):
        return v.view(np.ndarray)
    if isinstance(v, (list, tuple)):
        return type(v)(_plain_tree(x) for x in v)
    if isinstance(v, dict):
        return {k: _plain_tree(x) for k, x in v.items()}
    return v


def _on_device(v):
    if isinstance(v, np.ndarray) and not isinstance(v, DeviceArray):
        return v.view(DeviceArray)
    if isinstance(v, tuple):
        return tuple(_on_device(x) for x in v)
    if isinstance(v, list):
        return [_on_device(x) for x in v]
    return v


def _host_arrays(v):
    if isinstance(v, DeviceArray):
        return
    if isinstance(v, np.ndarray):
        if v.ndim:
            yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _host_arrays(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _host_arrays(x)


def _refuse_host(what, values):
    host = next(_host_arrays(values), None)
    if host is not None:
        raise TypeError(f"{what}: a host array ({host.dtype}{list(host.shape)}) beside an "
                        "emulated GPU's arrays; a real GPU's CuPy refuses it too: move it "
                        "to the GPU first")


class DeviceNumPy:
    """An emulated GPU's array module: NumPy whose arrays are made on the GPU (DeviceArray),
    as CuPy's ``cupy.asarray``/``empty``/... are."""

    ndarray = DeviceArray

    def __init__(self, module=np):
        self._module = module

    def __getattr__(self, name):
        v = getattr(self._module, name)
        if isinstance(v, (type, np.ufunc)) or not callable(v):  # ufuncs: __array_ufunc__
            if type(v).__name__ == "module":
                return DeviceNumPy(v)
            return v

        def on_device(*args, **kwargs):
            return _on_device(v(*args, **kwargs))
        on_device.__name__ = name
        return on_device


class _Mark:
    """One recorded position: done once the stream's work before it ran; ``error``, the
    failure that poisoned the stream before it, if any."""

    __slots__ = ("done", "error", "where")

    def __init__(self, where: str):
        self.done = threading.Event()
        self.error = None
        self.where = where


_DONE = _Mark("an event never recorded")
_DONE.done.set()


class EmulatedEvent(seam.Event):
    __slots__ = ("_mark",)

    def __init__(self):
        self._mark = _DONE  # never recorded: done, as in CUDA

    def query(self) -> bool:
        return self._mark.done.is_set()

    def synchronize(self, timeout=None):
        _wait_mark(self._mark, timeout, "")


def _wait_mark(mark: _Mark, timeout, who: str):
    timeout = wait_timeout(timeout)
    if not mark.done.wait(timeout):
        raise WaitTimeout(f"{who}waited {timeout:g}s for {mark.where}")
    if mark.error is not None:
        raise GPUError(f"{who}work before {mark.where} failed: {mark.error}") from mark.error


class EmulatedGraph(seam.Graph):
    def __init__(self, stream, items):
        self.stream, self.items = stream, list(items)

    def replay(self, stream=None):
        """Queue the recording; its event records and waits take their positions now, as
        a CUDA graph launch's do."""
        stream = stream or self.stream.gpu.compute_stream
        for kind, label, payload in self.items:
            if kind == "record":
                stream.record(payload)
            elif kind == "wait":
                stream.wait(payload)
            else:
                stream._queue_item((kind, label, payload))

    def __len__(self):
        return len(self.items)


class EmulatedStream(seam.Stream):
    """One stream; see the module's docstring for its two kinds. Items queued are
    ("run", label, fn), ("record", None, mark) and ("wait", None, mark)."""

    def __init__(self, gpu, name: str, synchronous: bool):
        self.gpu, self.name, self.synchronous = gpu, name, synchronous
        self._cv = threading.Condition(threading.Lock())
        self._run_lock = threading.RLock()  # the synchronous kind: held while work runs
        self._items = collections.deque()
        self._running = 0  # items taken by the worker and not finished
        self._thread = None
        self._error = None
        self._capture = None  # the recording while capturing: (kind, label, fn or event)

    # ------------------------------------------------------------- queueing
    def submit(self, label: str, fn):
        """Queue ``fn()`` (one launch, copy, ...); ``label`` names it in errors."""
        self._queue_item(("run", label, fn))

    def _queue_item(self, item):
        with self._cv:
            if self._capture is not None:
                self._capture.append(item)
                return
            if not self.synchronous:
                self._items.append(item)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, daemon=True,
                        name=f"hybrid-emulated-gpu{self.gpu.index}-{self.name}")
                    self._thread.start()
                else:
                    self._cv.notify_all()
                return
        kind, label, payload = item
        with self._run_lock:  # synchronous: here, now, after the work running already
            if kind == "run":
                try:
                    payload()
                except Exception as exc:
                    raise GPUError(f"{label} on {self} failed: {type(exc).__name__}: "
                                   f"{exc}") from exc
            elif kind == "record":
                payload.done.set()
            else:
                _wait_mark(payload, None, f"{self} ")

    def _work(self):
        cv, items = self._cv, self._items
        while True:
            with cv:
                while not items:
                    if not cv.wait(_IDLE_EXIT) and not items:
                        self._thread = None  # the next item starts a new worker
                        return
                kind, label, payload = items.popleft()
                self._running += 1
                error = self._error
            try:
                if kind == "record":
                    payload.error = error
                    payload.done.set()
                elif error is not None:
                    pass  # poisoned: skipped until synchronize() reports the error
                elif kind == "run":
                    payload()
                else:
                    _wait_mark(payload, None, f"{self} ")
            except Exception as exc:  # noqa: BLE001 - raised by synchronize / later events
                if kind == "run":
                    exc = GPUError(f"{label} on {self} failed: {type(exc).__name__}: {exc}")
                with cv:
                    self._error = exc
            with cv:
                self._running -= 1
                if not items and not self._running:
                    cv.notify_all()

    # ------------------------------------------------------------- events
    def record(self, event=None):
        event = event or EmulatedEvent()
        if self._capture is not None:  # takes its position when the graph is replayed
            self._capture.append(("record", None, event))
            return event
        mark = event._mark = _Mark(f"an event on {self}")
        self._queue_item(("record", None, mark))
        return event

    def wait(self, event):
        if self._capture is not None:
            self._capture.append(("wait", None, event))
            return
        self._queue_item(("wait", None, event._mark))  # the position recorded by now

    def query(self) -> bool:
        if self.synchronous:
            if not self._run_lock.acquire(blocking=False):
                return False
            self._run_lock.release()
            return True
        with self._cv:
            return not self._items and not self._running

    def synchronize(self, timeout=None):
        if self._capture is not None:
            raise GPUError(f"synchronize() on {self} while it captures a graph (CUDA refuses "
                           "it too): end_capture() first")
        timeout = wait_timeout(timeout)
        if self.synchronous:
            if not self._run_lock.acquire(timeout=timeout):
                raise WaitTimeout(f"waited {timeout:g}s for {self}")
            self._run_lock.release()
            return
        with self._cv:
            if not self._cv.wait_for(lambda: not self._items and not self._running, timeout):
                raise WaitTimeout(f"waited {timeout:g}s for {self} ({len(self._items)} "
                                  "item(s) queued)")
            error, self._error = self._error, None
        if error is not None:
            raise GPUError(f"{self}: {error}") from error

    # ------------------------------------------------------------- capture
    def begin_capture(self):
        with self._cv:
            if self._capture is not None:
                raise GPUError(f"{self} is capturing already")
            self._capture = []

    def end_capture(self):
        with self._cv:
            if self._capture is None:
                raise GPUError(f"end_capture() on {self}, which is not capturing")
            items, self._capture = self._capture, None
        return EmulatedGraph(self, items)


class EmulatedModule(seam.Module):
    def __init__(self, gpu, name, built):
        self.gpu, self.name, self._built = gpu, name, built

    def launch(self, kernel_name, grid, block, shared_bytes, args, stream=None):
        conv = []  # held by the closure: the memory stays alive until the launch ran
        for a in seam.check_launch_args(args):
            if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                raise ValueError(f"launch {kernel_name}: array arguments must be C-contiguous")
            if isinstance(a, seam.DeviceBuffer):
                if a._mem is None:
                    raise GPUError(f"launch {kernel_name}: {a!r} was freed")
                a = a._mem  # the emulator passes an array's address
            elif isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
                raise TypeError(f"launch {kernel_name}: argument {len(conv)} is a host array "
                                f"({a.dtype}{list(a.shape)}); kernels take GPU memory")
            conv.append(a)
        built = self._built
        grid, block = seam.launch_dims(grid), seam.launch_dims(block)
        shared = int(shared_bytes)
        (stream or self.gpu.compute_stream).submit(
            f"kernel {kernel_name} ({self.name})",
            lambda: built.launch(kernel_name, grid, block, shared, conv))


def _strided(address: int, dt, batch: int, stride: int, rows: int, ld: int, cols: int):
    """A (batch, rows, cols) NumPy view of host memory at ``address``: rows ``ld`` elements
    apart, matrices ``stride`` apart."""
    span = (batch - 1) * stride + (rows - 1) * ld + cols if batch and rows and cols else 0
    raw = (ctypes.c_char * (span * dt.itemsize)).from_address(address)
    flat = np.frombuffer(raw, dtype=dt)
    return np.lib.stride_tricks.as_strided(
        flat, (batch, rows, cols), (stride * dt.itemsize, ld * dt.itemsize, dt.itemsize))


def _build(cuda_source: str):
    """The emulator's module of ``cuda_source`` (it caches them, in memory and on disk)."""
    try:
        from .emu.build import build_module  # noqa: PLC0415 - built only when a kernel is
    except ImportError as exc:
        raise GPUError("load_module on an emulated GPU needs runtime.gpu.emu (the CUDA C "
                       f"emulator), which does not import: {exc}") from exc
    return build_module(cuda_source)


class EmulatedGPU(seam.GPU):
    implementation = "emulated"
    xp = DeviceNumPy()

    def __init__(self, index: int):
        self.index = index
        self.compute_stream = EmulatedStream(self, "compute", synchronous=True)
        self.copy_stream = EmulatedStream(self, "copy", synchronous=False)
        self._streams = weakref.WeakSet((self.compute_stream, self.copy_stream))

    # memory
    def alloc(self, nbytes):
        nbytes = int(nbytes)
        raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
        off = (-raw.__array_interface__["data"][0]) % _ALIGN
        mem = raw[off:off + nbytes].view(DeviceArray)
        return seam.DeviceBuffer(self, nbytes, mem.__array_interface__["data"][0], mem)

    def _view(self, mem, shape, dtype, offset):
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return _plain(mem)[offset:offset + n].view(dtype).reshape(shape).view(DeviceArray)

    def empty(self, shape, dtype):
        return np.empty(tuple(shape), dtype=np.dtype(dtype)).view(DeviceArray)

    def address(self, array):
        return array.__array_interface__["data"][0]

    def gemm_strided(self, spec, a, b, c, stream=None):
        """NumPy's matmul on the matrices at those host addresses (device memory is host
        memory here): the same row-major meaning the CuPy seam gives cuBLAS's call."""
        dt = np.dtype(spec.dtype)
        rows_a, rows_b = (spec.k, spec.m) if spec.trans_a else (spec.m, spec.k), \
            (spec.n, spec.k) if spec.trans_b else (spec.k, spec.n)
        A = _strided(int(a), dt, spec.batch, spec.stride_a, rows_a[0], spec.lda, rows_a[1])
        B = _strided(int(b), dt, spec.batch, spec.stride_b, rows_b[0], spec.ldb, rows_b[1])
        C = _strided(int(c), dt, spec.batch, spec.m * spec.n, spec.m, spec.n, spec.n)

        def run():
            opa = A.transpose(0, 2, 1) if spec.trans_a else A
            opb = B.transpose(0, 2, 1) if spec.trans_b else B
            np.matmul(opa, opb, out=C)

        (stream or self.compute_stream).submit("gemm", run)

    # copies: one memcpy each, queued on the stream
    def _copy(self, what, dst, src, stream):
        dst, src = seam.as_array(dst), seam.as_array(src)
        self.check_copy(what, dst, src)
        self._check_sides(what, dst, src)
        (stream or self.copy_stream).submit(what, lambda: np.copyto(_plain(dst), _plain(src)))

    @staticmethod
    def _check_sides(what, dst, src):
        """A copy's ends are on the sides its direction says (as cudaMemcpy's kinds)."""
        want = {"copy host->device": (True, False), "copy device->host": (False, True),
                "copy device->device": (True, True)}[what]
        got = (isinstance(dst, DeviceArray), isinstance(src, DeviceArray))
        if got != want:
            side = {True: "GPU", False: "host"}
            raise TypeError(f"{what}: the destination is {side[got[0]]} memory and the source "
                            f"{side[got[1]]} memory")

    def copy_h2d(self, dst, src, stream=None):
        self._copy("copy host->device", dst, src, stream)

    def copy_d2h(self, dst, src, stream=None):
        self._copy("copy device->host", dst, src, stream)

    def copy_d2d(self, dst, src, stream=None):
        self._copy("copy device->device", dst, src, stream)

    # streams
    def new_stream(self, name="stream"):
        s = EmulatedStream(self, name, synchronous=False)
        self._streams.add(s)  # weakly: a dropped stream has nothing left to wait for
        return s

    def new_event(self):
        return EmulatedEvent()

    def synchronize(self, timeout=None):
        for s in list(self._streams):
            s.synchronize(timeout)

    def activate(self):
        return seam.NOTHING

    # kernels, BLAS
    def load_module(self, cuda_source, name="module"):
        return EmulatedModule(self, name, _build(cuda_source))

    def gemm(self, a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=None):
        self.check_gemm(a, b, out, trans_a, trans_b)
        a, b, out = _plain(a), _plain(b), _plain(out)  # the emulator's own work: host views

        def run():
            prod = np.matmul(a.T if trans_a else a, b.T if trans_b else b)
            if alpha != 1.0:
                prod *= out.dtype.type(alpha)
            if beta != 0.0:
                prod += out.dtype.type(beta) * out
            out[...] = prod

        (stream or self.compute_stream).submit("gemm", run)
