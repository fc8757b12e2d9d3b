"""NDArray: a NumPy-like array whose every op is pushed to the engine and returns at once.

``apply(name, args, attrs)`` is the one door from the front end to the op registry: eagerly it
infers the output types, pushes the op with its reads and writes, and records it on the
autograd tape; while a hybridize trace is active it builds graph nodes instead.
"""
from __future__ import annotations

import math
import numbers
import operator
import sys
from functools import partial as _partial

import numpy as np
import numpy as _np

from compiler.ops import (REGISTRY, OpError, Spec, dtype_name, eager_kernel, infer_types,
                          is_scalar, result_dtype)
from compiler.ops.core import INT_RANGE, InferCache, attrs_key, is_int_scalar
from runtime import engine as _engine_mod
from runtime import transfer as _transfer_mod
from runtime.device import Device, current_device, parse_device
from runtime.memory import Buffer

from . import _state
from ._where import user_frame
from .eager_kernels import kernel_for as _kernel_for

_DTYPES = {}


def np_dtype(name: str) -> np.dtype:
    d = _DTYPES.get(name)
    if d is None:
        d = _DTYPES[name] = np.dtype(name)
    return d


_NAMES: dict = {}  # np.dtype -> its name (NumPy's dtype.name property costs ~3 us a read)


def _name_of(dt: np.dtype) -> str:
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = dt.name
    return name


_INLINE_MAX = 1 << 14  # elements: smaller ops may run in the caller when their device is idle
_INLINE_MACS = 1 << 18  # multiply-adds: a smaller matmul may run in the caller too (~10 us)
# A fresh object after every in-place rebind of any array's buffer: a compiled call's caller
# path holds its parameters' arrays while this is unchanged (dispatch.Caller). An object
# stored, not a counter bumped: a store is atomic under the GIL, and a held token stays
# unique.
rebind_token = [object()]
_VIEW_OPS = frozenset(("transpose", "broadcast_to", "slice"))  # O(1) at any size: views


def _may_inline(op, args, specs) -> bool:
    """Whether the engine may run this op in the caller when its device is idle: a cheap op,
    where a hand-off to the device's worker thread would cost more than the op itself."""
    if op.name in _VIEW_OPS:
        return True
    size = math.prod(specs[0].shape)
    if op.kind != "extern":
        return size <= _INLINE_MAX
    if op.name == "matmul":  # (..., m, k) @ (..., k, n): size * k multiply-adds
        return size * args[0].shape[-1] <= _INLINE_MACS
    return False  # convolution, pooling: their cost is not told by their output size


class NDArray:
    """An n-dimensional array on a device, computed asynchronously."""

    __slots__ = ("_buf", "shape", "_dtype", "device", "_node", "_grad", "_grad_req",
                 "__weakref__")
    __array_priority__ = 100  # numpy scalars/arrays defer to our operators

    def __init__(self, buf: Buffer, shape, dtype: str, device: Device):
        self._buf = buf
        self.shape = tuple(shape)
        self._dtype = dtype
        self.device = device
        self._node = None
        self._grad = None
        self._grad_req = "null"

    # ------------------------------------------------------------ properties
    @property
    def dtype(self) -> np.dtype:
        return np_dtype(self._dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def T(self):
        return self.transpose()

    @property
    def ctx(self):  # MXNet's name
        return self.device

    @property
    def context(self):
        return self.device

    # ------------------------------------------------------------ sync points
    def wait_to_read(self, timeout: float | None = None):
        """Block until this array's value is computed (raises if its computation failed)."""
        if self._computed_here():
            return self
        _engine_mod.get_engine().wait(self._buf.var, timeout)
        if self.device.kind != "cpu":  # its op is done once queued: wait for the GPU too
            self.device.synchronize(timeout)
        return self

    def _raw(self):
        if not self._computed_here():
            _engine_mod.get_engine().wait(self._buf.var)
        return self._buf.data

    def _computed_here(self) -> bool:
        """A CPU array whose buffer was made with its data (an op run in the caller, an
        upload) and never had a Var asked for: no engine op writes it, so a wait has nothing
        to wait for (the book's synchronous ``y = x + 1`` loop: ~0.3 us of ~2.5 per op). It
        still counts as the front end's sync point (the dispatch trial reads the count)."""
        buf = self._buf
        if buf._var is not None or buf.data is None or self.device.kind != "cpu":
            return False
        eng = _engine_mod._engine
        if eng is not None:
            eng.sync_points += 1
        return True

    def asnumpy(self) -> np.ndarray:
        # on a GPU, the seam's device->host copy: ordered after the kernels writing the data
        return self.device.to_numpy(self._raw())

    def item(self):
        if self.size != 1:
            raise ValueError(f"item(): only an array of one element converts to a Python "
                             f"scalar, this one has shape {self.shape}")
        return self.asnumpy().reshape(()).item()

    def __array__(self, dtype=None, copy=None):
        a = self.asnumpy()
        return a.astype(dtype) if dtype is not None else a

    def tolist(self):
        return self.asnumpy().tolist()

    def __bool__(self):
        if self.size != 1:
            raise ValueError(f"the truth value of an array with {self.size} elements is "
                             "ambiguous; use .any() or .all()")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self._dtype not in ("int8", "uint8", "int32", "int64"):
            raise TypeError(f"only integer arrays can be used as an index, not {self._dtype}")
        return int(self.item())

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self.shape[0]):
            yield self[i]

    def __repr__(self):
        body = np.array2string(self.asnumpy(), separator=", ", prefix="array(")
        extra = "" if self._dtype == "float32" else f", dtype={self._dtype}"
        dev = "" if self.device == current_device() else f", device={self.device}"
        return f"array({body}{extra}{dev})"

    def __str__(self):
        return str(self.asnumpy())

    def __format__(self, spec):
        """As NumPy: ``f"{x:.2f}"`` formats a 0-d array's value; ``f"{x}"`` prints any."""
        return format(self.asnumpy(), spec)

    def __hash__(self):
        return id(self)

    def __reduce__(self):
        raise TypeError("hybrid arrays are not picklable: save them with hb.save() "
                        "(safetensors) or convert with asnumpy()")

    # ------------------------------------------------------------ conversions
    def astype(self, dtype, copy=True):
        name = dtype_name(dtype)
        if name == self._dtype and not copy:
            return self
        return apply("cast", (self,), {"dtype": name})

    def copy(self):
        return apply("copy", (self,), {})

    def copyto(self, other):
        """A copy on device ``other``, or a copy into the existing array ``other``."""
        if isinstance(other, NDArray):
            if other.shape != self.shape:
                raise ValueError(f"copyto: destination has shape {other.shape}, source "
                                 f"{self.shape}")
            src = self if other.device == self.device else _transfer(self, other.device)
            if src._dtype != other._dtype:
                src = src.astype(other._dtype)
            other._rebind(src if src is not self else self.copy())
            return other
        return _transfer(self, parse_device(other))

    def to(self, device, non_blocking: bool = False):
        """This array on ``device`` (a copy; the same array if already there)."""
        device = parse_device(device)
        if device == self.device:
            return self
        out = _transfer(self, device)
        if not non_blocking:
            out.wait_to_read()
        return out

    as_in_context = to
    as_in_ctx = to

    def as_np_ndarray(self):
        return self

    def _rebind(self, new: "NDArray"):
        """In-place update: this array now holds ``new``'s value (SSA renaming)."""
        if _state.tracing():
            from .tracing import inplace_rebind  # noqa: PLC0415 - tracing imports us
            inplace_rebind(self, new)
            return
        if self._grad_req != "null" and _state.is_recording():
            raise RuntimeError(
                "in-place update of an array with an attached gradient while recording: "
                "autograd cannot differentiate through it; write `x = x + v` instead of "
                f"`x += v` (at {_fmt(user_frame())})")
        if new.device != self.device:  # its buffer would be another device's memory
            raise RuntimeError(f"internal error: an in-place update of an array on "
                               f"{self.device} computed its new value on {new.device}")
        self._buf = new._buf
        self._node = new._node
        rebind_token[0] = object()  # after the store: a reader that sees the old token sees
        # the old buffer too, or re-reads

    # ------------------------------------------------------------ autograd
    def attach_grad(self, grad_req: str = "write", stype=None):
        """Allocate a gradient buffer; ``backward`` writes (or adds) into ``self.grad``."""
        if grad_req not in ("write", "add", "null"):
            raise ValueError(f"grad_req must be 'write', 'add' or 'null', got {grad_req!r}")
        self._grad_req = grad_req
        self._grad = zeros(self.shape, dtype=self._dtype, device=self.device) \
            if grad_req != "null" else None
        self._node = None
        return self

    @property
    def grad(self):
        return self._grad

    def detach(self):
        out = NDArray(self._buf, self.shape, self._dtype, self.device)
        return out

    def backward(self, out_grad=None, retain_graph: bool = False, train_mode: bool = True):
        # autograd imports this module; hybrid/__init__ imports autograd (a look-up, no import)
        sys.modules["hybrid.autograd"].backward([self], [out_grad], retain_graph=retain_graph,
                                                train_mode=train_mode)

    # ------------------------------------------------------------ operators
    def __add__(self, o): return apply("add", (self, o), {})
    def __radd__(self, o): return apply("add", (o, self), {})
    def __sub__(self, o): return apply("sub", (self, o), {})
    def __rsub__(self, o): return apply("sub", (o, self), {})
    def __mul__(self, o): return apply("mul", (self, o), {})
    def __rmul__(self, o): return apply("mul", (o, self), {})
    def __truediv__(self, o): return apply("div", (self, o), {})
    def __rtruediv__(self, o): return apply("div", (o, self), {})
    def __floordiv__(self, o): return apply("floordiv", (self, o), {})
    def __rfloordiv__(self, o): return apply("floordiv", (o, self), {})
    def __mod__(self, o): return apply("mod", (self, o), {})
    def __rmod__(self, o): return apply("mod", (o, self), {})
    def __pow__(self, o): return apply("pow", (self, o), {})
    def __rpow__(self, o): return apply("pow", (o, self), {})
    def __matmul__(self, o): return matmul(self, o)
    def __rmatmul__(self, o): return matmul(o, self)
    def __neg__(self): return apply("neg", (self,), {})
    def __pos__(self): return self
    def __abs__(self): return apply("abs", (self,), {})
    # NumPy's bitwise operators: bit by bit on integers, logical (bool results) on bools
    def __invert__(self): return apply("bitwise_not", (self,), {})
    def __and__(self, o): return apply("bitwise_and", (self, o), {})
    def __rand__(self, o): return apply("bitwise_and", (o, self), {})
    def __or__(self, o): return apply("bitwise_or", (self, o), {})
    def __ror__(self, o): return apply("bitwise_or", (o, self), {})
    def __xor__(self, o): return apply("bitwise_xor", (self, o), {})
    def __rxor__(self, o): return apply("bitwise_xor", (o, self), {})
    def __lshift__(self, o): return apply("left_shift", (self, o), {})
    def __rlshift__(self, o): return apply("left_shift", (o, self), {})
    def __rshift__(self, o): return apply("right_shift", (self, o), {})
    def __rrshift__(self, o): return apply("right_shift", (o, self), {})
    def __eq__(self, o): return apply("eq", (self, o), {})  # noqa: D105
    def __ne__(self, o): return apply("ne", (self, o), {})
    def __lt__(self, o): return apply("lt", (self, o), {})
    def __le__(self, o): return apply("le", (self, o), {})
    def __gt__(self, o): return apply("gt", (self, o), {})
    def __ge__(self, o): return apply("ge", (self, o), {})

    def _inplace(self, name, o):
        new = apply(name, (self, o), {})
        if new.shape != self.shape:  # NumPy: the result must fit the array it updates
            raise ValueError(f"{name}: in-place result of shape {new.shape} does not fit the "
                             f"array of shape {self.shape} (at {_fmt(user_frame())})")
        if new._dtype != self._dtype:
            if not np.can_cast(new._dtype, self._dtype, "same_kind"):
                raise TypeError(f"{name}: cannot store the in-place result of dtype "
                                f"{new._dtype} in an array of dtype {self._dtype} (at "
                                f"{_fmt(user_frame())})")
            new = new.astype(self._dtype)
        self._rebind(new)
        return self

    def __iadd__(self, o): return self._inplace("add", o)
    def __isub__(self, o): return self._inplace("sub", o)
    def __imul__(self, o): return self._inplace("mul", o)
    def __itruediv__(self, o): return self._inplace("div", o)
    def __ifloordiv__(self, o): return self._inplace("floordiv", o)
    def __imod__(self, o): return self._inplace("mod", o)
    def __ipow__(self, o): return self._inplace("pow", o)
    def __iand__(self, o): return self._inplace("bitwise_and", o)
    def __ior__(self, o): return self._inplace("bitwise_or", o)
    def __ixor__(self, o): return self._inplace("bitwise_xor", o)
    def __ilshift__(self, o): return self._inplace("left_shift", o)
    def __irshift__(self, o): return self._inplace("right_shift", o)

    def __getitem__(self, key):
        from .indexing import getitem  # noqa: PLC0415 - indexing imports this module
        return getitem(self, key)

    def __setitem__(self, key, value):
        from .indexing import setitem  # noqa: PLC0415
        setitem(self, key, value)

    # ------------------------------------------------------------ methods
    def reshape(self, *shape, **kw):
        shape = kw.pop("shape", shape[0] if len(shape) == 1 and not isinstance(
            shape[0], numbers.Integral) else shape)
        return reshape(self, shape)

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], numbers.Integral) else axes
        return transpose(self, axes or None)

    def sum(self, axis=None, keepdims=False): return sum(self, axis, keepdims=keepdims)
    def mean(self, axis=None, keepdims=False): return mean(self, axis, keepdims=keepdims)
    def max(self, axis=None, keepdims=False): return max(self, axis, keepdims=keepdims)
    def min(self, axis=None, keepdims=False): return min(self, axis, keepdims=keepdims)
    def prod(self, axis=None, keepdims=False): return prod(self, axis, keepdims=keepdims)
    def argmax(self, axis=None, keepdims=False): return argmax(self, axis, keepdims=keepdims)
    def argmin(self, axis=None, keepdims=False): return argmin(self, axis, keepdims=keepdims)
    def var(self, axis=None, keepdims=False, ddof=0): return var(self, axis, keepdims=keepdims, ddof=ddof)
    def std(self, axis=None, keepdims=False, ddof=0): return std(self, axis, keepdims=keepdims, ddof=ddof)
    def any(self, axis=None, keepdims=False): return sum(self.astype("bool"), axis, keepdims=keepdims) > 0

    def all(self, axis=None, keepdims=False):  # no min(): an empty array is all True
        return sum(logical_not(self), axis, keepdims=keepdims) == 0

    def flatten(self): return reshape(self, (-1,))
    def squeeze(self, axis=None): return squeeze(self, axis)
    def expand_dims(self, axis): return expand_dims(self, axis)
    def swapaxes(self, a, b): return swapaxes(self, a, b)
    def broadcast_to(self, shape): return broadcast_to(self, shape)
    def clip(self, a_min=None, a_max=None): return clip(self, a_min, a_max)
    def exp(self): return exp(self)
    def log(self): return log(self)
    def sqrt(self): return sqrt(self)
    def abs(self): return abs(self)
    def square(self): return square(self)
    def tanh(self): return tanh(self)
    def sigmoid(self): return sigmoid(self)
    def relu(self): return relu(self)
    def sign(self): return sign(self)
    def dot(self, o): return dot(self, o)
    def take(self, indices, axis=0, mode="raise"): return take(self, indices, axis, mode)
    def tile(self, reps): return tile(self, reps)
    def repeat(self, repeats, axis=None): return repeat(self, repeats, axis)
    def cumsum(self, axis=None, dtype=None): return cumsum(self, axis, dtype)
    def zeros_like(self): return zeros_like(self)
    def ones_like(self): return ones_like(self)

    # NumPy's and the Array API's methods over hybrid/numpy_ops.py (which imports this module)
    def sort(self, axis=-1, kind=None, order=None):
        """Sort in place, as NumPy's ``ndarray.sort`` (``hb.sort`` returns a sorted copy)."""
        from .numpy_ops import sort  # noqa: PLC0415
        self._rebind(sort(self, axis, kind, order))

    def argsort(self, axis=-1, kind=None, order=None):
        from .numpy_ops import argsort  # noqa: PLC0415
        return argsort(self, axis, kind, order)

    def cumprod(self, axis=None, dtype=None):
        from .numpy_ops import cumprod  # noqa: PLC0415
        return cumprod(self, axis, dtype)

    def diagonal(self, offset=0, axis1=0, axis2=1):
        from .numpy_ops import diagonal  # noqa: PLC0415
        return diagonal(self, offset, axis1, axis2)

    def trace(self, offset=0, axis1=0, axis2=1, dtype=None):
        from .numpy_ops import trace  # noqa: PLC0415
        return trace(self, offset, axis1, axis2, dtype)

    @property
    def mT(self):  # noqa: N802 - NumPy 2's and the Array API's name
        from .numpy_ops import matrix_transpose  # noqa: PLC0415
        return matrix_transpose(self)

    def to_device(self, device, /, *, stream=None):
        return self.to(device)

    def __array_namespace__(self, *, api_version=None):
        from . import array_api  # noqa: PLC0415
        return array_api


def _fmt(where):
    return f"{where[0]}:{where[1]}" if where else "?"


# ============================================================== the one door
def apply(name: str, args, attrs: dict):
    """Apply registry op ``name``: eagerly on the engine, or into the active trace."""
    if _local.trace is not None:
        from .tracing import trace_apply  # noqa: PLC0415
        return trace_apply(name, args, attrs)
    return _eager(name, args, attrs)


_local = _state.local
_get_op = REGISTRY.get
# What an eager call derives from its types, keyed by (op, shape/dtype of each array argument,
# type of each scalar, attrs): (output Specs, may-run-inline). A hit skips shape inference.
_INFER = InferCache(4096)
_infer_get = _INFER._map.get
_infer_touch = _INFER._map.move_to_end
_INFER_MAP = _INFER._map
# Hits re-order the LRU only once the cache is half full: an entry used since then is kept
# over the older ones when it fills (a move_to_end per eager op cost ~0.2 us)
_TOUCH_ABOVE = _INFER.maxsize // 2
_record_op = None  # hybrid.autograd.record_op, bound at the first recorded op
_DEVICES: dict = {}  # one Device object per device, so argument checks compare with ``is``


def _canon_device(device: Device) -> Device:
    d = _DEVICES.get(device)
    if d is None:
        d = _DEVICES.setdefault(device, device)
    return d


def _run_one(kernel, xp, bufs, attrs, ob):
    """An eager op's engine function (bound with functools.partial: no closure cells)."""
    ob.data = kernel(xp, [b.data if isinstance(b, Buffer) else b for b in bufs], attrs)[0]


def _run_many(kernel, xp, bufs, attrs, out_bufs):
    for ob, r in zip(out_bufs, kernel(xp, [b.data if isinstance(b, Buffer) else b for b in bufs],
                                      attrs)):
        ob.data = r


def _eager(name, args, attrs):
    if name == "transpose" and not _local.recording:  # Dense's W.T at every eager call
        view = _matrix_transpose(args[0], attrs)
        if view is not None:
            return view
    device = None
    key = [name]
    vals = []  # the operands' data: an op whose inputs are all computed may run right here
    ready = True
    op = None  # looked up only for a scalar operand or a signature seen for the first time
    for a in args:
        if isinstance(a, NDArray):
            d = a.device
            if device is None:
                device = d
            elif d is not device and d != device:
                raise ValueError(
                    f"{name}: arguments are on different devices ({device} and {d}); "
                    f"move one with .copyto(device) or .to(device) "
                    f"(at {_fmt(user_frame())})")
            data = a._buf.data
            if data is None:
                ready = False
            vals.append(data)
            key += a.shape, a._dtype
        elif is_scalar(a):
            vals.append(a)
            # Type rules see a scalar's kind only (weak typing); other kinds key on the value,
            # and so does an integer that does not fit every integer dtype (0..127 fit all):
            # whether it fits the array's dtype is checked at inference (check_int_fits).
            t = type(a)
            if op is None:
                op = _get_op(name)
            if op is not None and op.kind == "elementwise" and (
                    t is float or t is bool or 0 <= a <= 127 or not is_int_scalar(a)):
                key.append(t)
            else:
                key.append((t, a))
        else:
            raise TypeError(f"{name}: arguments must be hybrid arrays or Python numbers, got "
                            f"{type(a).__name__} (wrap NumPy data with hb.array) "
                            f"(at {_fmt(user_frame())})")
    if device is None:
        device = _canon_device(current_device())
    on_cpu = device.kind == "cpu"
    if not on_cpu:  # a GPU's signature has its own entry: its compiled eager kernels
        key.append(device)  # are that GPU's (eager_kernels)
    if attrs:
        akey = attrs_key(attrs)
        entry = None
        if akey is not None:
            key.append(akey)
            key = tuple(key)
            entry = _infer_get(key)
    else:
        akey = ()
        key.append(())
        key = tuple(key)
        entry = _infer_get(key)
    if entry is not None:
        if len(_INFER_MAP) > _TOUCH_ABOVE:  # LRU order matters only near the bound
            try:
                _infer_touch(key)
            except KeyError:  # evicted meanwhile by another front-end thread
                pass
    else:
        entry = _infer_entry(name, args, attrs, key if akey is not None else None, device)
    specs, small, kernel = entry
    if on_cpu and (ready or not small):
        # The caller's path: a small op whose inputs are computed runs right here while its
        # device is idle, without an engine op. Buffers are immutable and the outputs fresh,
        # so no queued op can be ordered before or after it: the engine would run it in
        # this thread anyway (its inline rule), at the cost of an op record, two lock round
        # trips and the user's line. A failure takes the engine's path below, which reports
        # it at the sync point with the op's name and line, as always. (Engine.idle, spelled
        # out: this is the per-op hot path.) A long op (a big matmul) too when the device's
        # dispatch trial found the loop faster so, as for a long compiled call; the trial
        # is told of every long op, ready or not (it counts a loop's iterations by them).
        eng = _engine_mod._engine
        if eng is not None and eng.inline and not eng._broken and (
                small or _long_in_caller(entry, device, eng)) and ready:
            w = eng._workers.get(device)
            if w is None or (w.active == 0 and not w.queue):
                try:
                    res = kernel(_np, vals, attrs)  # a CPU's array module
                except Exception:  # noqa: BLE001 - re-run on the engine: it reports
                    res = None
                if res is not None:
                    return _made_here(name, args, attrs, specs, res, device)
    elif ready and device.kind == "gpu":
        # A GPU op runs in the caller too, of any size: it only queues kernels on the GPU's
        # compute stream (stream order is the op order), and the hand-off to the GPU's worker
        # thread cost more than the op (~45 vs ~20 us per eager op on an H100). Only while
        # the GPU's worker (made by its first op, so that waitall synchronizes the GPU) has
        # nothing queued or running, which a later op would otherwise overtake.
        eng = _engine_mod._engine
        if eng is not None and eng.inline and not eng._broken:
            w = eng._workers.get(device)
            if w is not None and w.active == 0 and not w.queue:
                try:
                    with device.activate():
                        res = kernel(device.xp, vals, attrs)
                except Exception:  # noqa: BLE001 - re-run on the engine: it reports
                    res = None
                if res is not None:
                    return _made_here(name, args, attrs, specs, res, device)
    xp = device.xp
    out = None
    # the engine's path: the operands' buffers (read when the op runs) and their Vars
    bufs = [a._buf if isinstance(a, NDArray) else a for a in args]
    reads = [b.var for b in bufs if isinstance(b, Buffer)]
    if len(specs) == 1:
        s = specs[0]
        out = NDArray(Buffer(), s.shape, s.dtype, device)
        ob = out._buf
        writes = (ob.var,)
        run = _partial(_run_one, kernel, xp, bufs, attrs, ob)
    else:
        outs = tuple(NDArray(Buffer(), s.shape, s.dtype, device) for s in specs)
        out_bufs = [o._buf for o in outs]
        writes = tuple(b.var for b in out_bufs)
        run = _partial(_run_many, kernel, xp, bufs, attrs, out_bufs)

    # The user's line, for the engine's error messages. Start above apply: _eager is entered
    # only through apply, and frames skipped by depth are not materialized (cheaper walk).
    _engine_mod.get_engine().push(run, tuple(reads), writes, device, name, user_frame(3),
                                  small)
    if _local.recording:
        _record(name, args, attrs, [out] if out is not None else list(outs))
    return out if out is not None else outs


def _matrix_transpose(a, attrs):
    """The transpose of a computed 2-D CPU array, not recorded: NumPy's view, without type
    inference (the rule has nothing to check: any 2-D array transposes; ~1.3 of ~2.1 us per
    call). None for any other case, which the general path takes."""
    data = a._buf.data if isinstance(a, NDArray) else None
    if data is None or data.ndim != 2 or a.device.kind != "cpu" or \
            attrs.get("axes") not in (None, (1, 0)) or len(attrs) > 1:
        return None
    view = data.T
    return NDArray(Buffer(view), view.shape, a._dtype, a.device)


def eager_linear(x, weight, bias, act=None):
    """``act(x @ weight.T + bias)`` (bias and act optional; act 'relu', 'sigmoid' or
    'tanh') as one eager op where the layer's separate ops would each be one: a Dense layer
    is four eager ops of ~3 us dispatch each (and four tape nodes under ``record()``),
    PyTorch's Linear one. The same kernels those ops run, in their order, so the same bits:
    in the caller when the operands are computed and the device idle (a long product only
    where the device's dispatch trial runs it there), else one engine op. Recorded as one
    tape node whose backward is the ops' own gradient rules, fewer ops (the product's
    transposes cancel: dW = g^T x). Only for CPU 2-D operands outside a trace, with the
    ops' signatures already inferred (their first call checks them); None otherwise: the
    caller takes the ops' own path."""
    if _local.trace is not None or type(x) is not NDArray or type(weight) is not NDArray:
        return None
    device = x.device
    if device.kind != "cpu" or weight.device != device or len(x.shape) != 2 or \
            len(weight.shape) != 2 or bias is not None and (
                type(bias) is not NDArray or bias.device != device):
        return None
    eng = _engine_mod._engine
    if eng is None or not eng.inline or eng._broken:
        return None
    xdt, wdt = x._dtype, weight._dtype
    mm = _infer_get(("matmul", x.shape, xdt, weight.shape[::-1], wdt, ()))
    if mm is None:
        return None
    (spec,) = mm[0]
    steps = [mm]
    if bias is not None:
        add = _infer_get(("add", spec.shape, spec.dtype, bias.shape, bias._dtype, ()))
        if add is None or not add[1]:
            return None
        (spec,) = add[0]
        steps.append(add)
    if act is not None:
        fn = _infer_get((act, spec.shape, spec.dtype, ()))
        if fn is None or not fn[1]:
            return None
        (spec,) = fn[0]
        steps.append(fn)
    kernels = tuple(e[2] for e in steps)
    bufs = (x._buf, weight._buf) + ((bias._buf,) if bias is not None else ())
    out = None
    # (a long product tells the device's trial of every call, ready or not, as _eager does)
    in_caller = mm[1] or _long_in_caller(mm, device, eng)
    if in_caller and all(b.data is not None for b in bufs) and eng.idle(device):
        try:
            y = _linear_chain(kernels, [b.data for b in bufs])
        except Exception:  # noqa: BLE001 - the ops' own path reports it, with its names
            return None
        out = NDArray(Buffer(y), spec.shape, spec.dtype, device)
    if out is None:  # one engine op, after the ops writing the operands
        out = NDArray(Buffer(), spec.shape, spec.dtype, device)
        ob = out._buf
        eng.push(_partial(_run_linear, kernels, bufs, ob), tuple(b.var for b in bufs),
                 (ob.var,), device, "dense", user_frame(2), mm[1])
    if _local.recording:
        _record_linear(x, weight, bias, act, out)
    return out


def _linear_chain(kernels, data):
    x, w = data[0], data[1]
    y = kernels[0](_np, [x, w.T], _NO_ATTRS)[0]
    if len(data) > 2:
        y = kernels[1](_np, [y, data[2]], _NO_ATTRS)[0]
    if len(kernels) > len(data) - 1:  # the activation
        y = kernels[-1](_np, [y], _NO_ATTRS)[0]
    return y


def _run_linear(kernels, bufs, ob):
    ob.data = _linear_chain(kernels, [b.data for b in bufs])


def _record_linear(x, weight, bias, act, out):
    """One tape node for eager_linear's output. Its backward: the activation's own rule,
    then what the recorded product, its W.T and the bias add give: dx = g @ W, dW = g^T @ x
    (the product's rule for a transposed operand, transposed back by the transpose's), and
    db = g summed over the rows."""
    from .autograd import _needs_grad, record_custom  # noqa: PLC0415 - autograd imports us
    inputs = [x, weight] + ([bias] if bias is not None else [])
    needs = [_needs_grad(a) for a in inputs]  # (a frozen weight: no product for it)
    xs, ws, ys = (NDArray(a._buf, a.shape, a._dtype, a.device) for a in (x, weight, out))
    rule = REGISTRY[act].grad if act is not None else None

    def backward_fn(grads):
        (g,) = grads
        if rule is not None:
            (g,) = rule(F, (None,), ys, g)
        res = [F.matmul(g, ws) if needs[0] else None,
               F.matmul(F.transpose(g, axes=(1, 0)), xs) if needs[1] else None]
        if bias is not None:
            res.append(F.sum(g, axis=(0,)) if needs[2] else None)
        return res
    record_custom("dense", inputs, [out], backward_fn)


_NO_ATTRS: dict = {}


def _made_here(name, args, attrs, specs, res, device):
    """The outputs of an op the caller ran itself (its results ``res``), recorded for
    autograd where recording."""
    if len(specs) == 1:
        s = specs[0]
        out = NDArray(Buffer(res[0]), s.shape, s.dtype, device)
        if _local.recording:
            _record(name, args, attrs, [out])
        return out
    outs = tuple(NDArray(Buffer(r), s.shape, s.dtype, device) for r, s in zip(res, specs))
    if _local.recording:
        _record(name, args, attrs, list(outs))
    return outs


_dispatch = None  # hybrid.dispatch (it imports this module), bound at the first long op


def _long_in_caller(entry, device, engine) -> bool:
    global _dispatch
    if _dispatch is None:
        from . import dispatch as _dispatch  # noqa: PLC0415
    return _dispatch.long_call_direct(id(entry), device, engine, eager=True)


def _infer_entry(name, args, attrs, key, device):
    """(output Specs, may-run-inline, kernel) of a signature not in the cache on ``device``:
    inferred (a refused call raises OpError naming the user's line), and cached under ``key``
    (None: an attribute that is no plain value, never cached)."""
    try:
        specs = infer_types(name, args, attrs)
    except OpError as exc:
        raise OpError(f"{exc} (at {_fmt(user_frame())})") from None
    specs = tuple(Spec(tuple(s.shape), s.dtype) for s in specs)
    kernel = eager_kernel(name, specs)
    if key is not None:  # a cached signature may get a compiled kernel (eager_kernels)
        kernel = _kernel_for(name, args, attrs, specs, kernel, device)
    entry = (specs, _may_inline(_get_op(name), args, specs), kernel)
    if key is not None:
        _INFER.put(key, entry)
    return entry


def _record(name, args, attrs, outs):
    global _record_op
    if _record_op is None:
        from .autograd import record_op  # noqa: PLC0415 - autograd imports this module
        _record_op = record_op
    _record_op(name, args, attrs, outs)


def _transfer(x: NDArray, device: Device) -> NDArray:
    """A copy of x on another device, as an engine op (overlaps with compute)."""
    if _state.tracing():
        raise RuntimeError("moving arrays between devices inside a hybridized forward is not "
                           "supported; move inputs before calling the block")
    out = NDArray(_transfer_mod.push_copy(x._buf, x.device, device, "copyto", user_frame()),
                  x.shape, x._dtype, device)
    if _state.is_recording() and (x._node is not None or x._grad_req != "null"):
        from .autograd import record_custom  # noqa: PLC0415
        record_custom("copyto", [x], [out], lambda gs: [_transfer(gs[0], x.device)])
    return out


# ============================================================== creation
def _from_numpy(data: np.ndarray, device: Device) -> NDArray:
    device = _canon_device(device)
    return NDArray(_transfer_mod.upload(data, device), data.shape, _name_of(data.dtype), device)


def array(obj, dtype=None, device=None, ctx=None) -> NDArray:
    """A new array from a list, NumPy array or hybrid array (float32 by default for floats).

    Nothing is changed silently on the way in: complex data is refused (no dtype here holds
    an imaginary part), Python integers that do not fit the dtype asked for raise NumPy's
    OverflowError, and NumPy integers wider than int64's range (uint64 above 2**63 - 1; no
    uint64 dtype here) are refused instead of wrapping around."""
    device = parse_device(device or ctx)
    if isinstance(obj, NDArray):
        out = obj.copyto(device) if obj.device != device else obj.copy()
        return out.astype(dtype) if dtype is not None else out
    from_numpy = isinstance(obj, (np.ndarray, np.generic))
    if hasattr(obj, "get") and not from_numpy:
        obj = obj.get()  # cupy
    name = None if dtype is None else dtype_name(dtype)
    if name is not None and not from_numpy:
        data = _python_data(obj, name)  # NumPy's intake rules for the dtype asked for
    else:
        data = np.asarray(obj)
        _check_real(data)
    if name is None:
        # MXNet's rule: Python data is float32 by default; NumPy data keeps its kind
        if data.dtype == bool:
            name = "bool"
        elif not from_numpy or data.dtype.kind == "f" and data.dtype != np.float16:
            name = "float32"
        elif data.dtype.kind in "iu" and data.dtype.name not in ("int8", "uint8", "int32",
                                                                 "int64"):
            name = "int64"  # int16/uint16/uint32 widen exactly; uint64 only if it fits
            if data.dtype == np.uint64 and data.size and data.max() > np.iinfo(np.int64).max:
                raise OverflowError(
                    f"array: uint64 value {int(data.max())} does not fit int64, the widest "
                    "integer dtype here (uint64 is not supported); convert it to float64 "
                    "(inexact above 2**53) or reduce it first")
        else:
            name = dtype_name(data.dtype)
    return _from_numpy(np.array(data, dtype=name, copy=True), device)


def _check_real(data: np.ndarray):
    if data.dtype.kind == "c":
        _complex_refused("array", f"the data ({data.dtype})")


def _complex_refused(who: str, what: str):
    raise TypeError(f"{who}: {what} is complex, and no hybrid dtype holds an imaginary part; "
                    "pass its .real, .imag or abs() explicitly")


def _python_data(obj, name: str) -> np.ndarray:
    """Python numbers or lists converted straight to dtype ``name`` by NumPy: an integer out
    of the dtype's range raises OverflowError (a round trip through int64 would wrap it)."""
    try:
        return np.array(obj, dtype=name)
    except (TypeError, ValueError):
        _check_real(np.asarray(obj))  # complex: say so, in our words
        raise


def asarray(obj, dtype=None, device=None) -> NDArray:
    if isinstance(obj, NDArray) and (dtype is None or dtype_name(dtype) == obj._dtype) and \
            (device is None or parse_device(device) == obj.device):
        return obj
    return array(obj, dtype=dtype, device=device)


def full(shape, fill_value, dtype=None, device=None, ctx=None) -> NDArray:
    # operator.index: a float size (2.5) is refused as NumPy refuses it, never truncated
    shape = (shape,) if isinstance(shape, numbers.Integral) else \
        tuple(operator.index(s) for s in shape)
    if isinstance(fill_value, (complex, np.complexfloating)):
        _complex_refused("full", f"fill_value {fill_value!r}")
    device = parse_device(device or ctx)
    if dtype is None:
        dtype = "float32" if isinstance(fill_value, float) or not is_scalar(fill_value) \
            else ("bool" if isinstance(fill_value, bool) else "float32")
    with device:
        return apply("full", (), {"shape": shape, "value": fill_value,
                                  "dtype": dtype_name(dtype)})


def zeros(shape, dtype=None, device=None, ctx=None) -> NDArray:
    return full(shape, 0, dtype or "float32", device or ctx)


def ones(shape, dtype=None, device=None, ctx=None) -> NDArray:
    return full(shape, 1, dtype or "float32", device or ctx)


def empty(shape, dtype=None, device=None, ctx=None) -> NDArray:
    return zeros(shape, dtype, device or ctx)


def zeros_like(x, dtype=None): return zeros(x.shape, dtype or x._dtype, x.device)
def ones_like(x, dtype=None): return ones(x.shape, dtype or x._dtype, x.device)
def full_like(x, v, dtype=None): return full(x.shape, v, dtype or x._dtype, x.device)
def empty_like(x, dtype=None): return zeros_like(x, dtype)


def arange(start, stop=None, step=1, dtype=None, device=None, ctx=None) -> NDArray:
    """Evenly spaced values in [start, stop): float32 unless ``dtype`` says otherwise, as in
    MXNet's np (NumPy gives int64 for integer arguments). The book relies on it: its
    ``X = np.arange(12).reshape(3, 4)`` later takes ``X += Y`` with float Y, which an integer
    X would refuse. Pass ``dtype="int64"`` for integers."""
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        dtype = "float32"
    with parse_device(device or ctx):
        return apply("arange", (), {"start": start, "stop": stop, "step": step,
                                    "dtype": dtype_name(dtype)})


def linspace(start, stop, num=50, endpoint=True, dtype=None, device=None) -> NDArray:
    return array(np.linspace(start, stop, num, endpoint=endpoint), dtype=dtype or "float32",
                 device=device)


def eye(n, m=None, k=0, dtype=None, device=None) -> NDArray:
    return array(np.eye(n, m, k), dtype=dtype or "float32", device=device)


# ============================================================== functions
from compiler.ops import composite as _composite  # noqa: E402
from compiler.ops.core import OpNamespace  # noqa: E402

F = OpNamespace(apply)


def _unary_fn(name):
    def fn(x):
        return apply(name, (x,), {})
    fn.__name__ = name
    fn.__doc__ = REGISTRY[name].doc or f"elementwise {name}"
    return fn


for _n in ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "square", "sin", "cos", "tanh",
           "sigmoid", "relu", "abs", "sign", "floor", "ceil", "round", "erf", "logical_not"):
    globals()[_n] = _unary_fn(_n)
absolute = abs  # noqa: F821 - defined just above
negative = _unary_fn("neg")
stop_gradient = _unary_fn("stop_gradient")


def _binary_fn(name):
    def fn(x, y):
        return apply(name, (x, y), {})
    fn.__name__ = name
    return fn


for _n, _op in (("add", "add"), ("subtract", "sub"), ("multiply", "mul"), ("divide", "div"),
                ("true_divide", "div"), ("floor_divide", "floordiv"), ("mod", "mod"),
                ("power", "pow"), ("maximum", "maximum"), ("minimum", "minimum"),
                ("equal", "eq"), ("not_equal", "ne"), ("less", "lt"), ("less_equal", "le"),
                ("greater", "gt"), ("greater_equal", "ge"), ("logical_and", "logical_and"),
                ("logical_or", "logical_or"), ("logical_xor", "logical_xor"),
                ("bitwise_and", "bitwise_and"), ("bitwise_or", "bitwise_or"),
                ("bitwise_xor", "bitwise_xor"), ("left_shift", "left_shift"),
                ("right_shift", "right_shift"), ("bitwise_left_shift", "left_shift"),
                ("bitwise_right_shift", "right_shift")):
    globals()[_n] = _binary_fn(_op)
invert = bitwise_not = bitwise_invert = _unary_fn("bitwise_not")  # NumPy's and the Array API's


def where(cond, x, y):
    return apply("where", (cond, x, y), {})


def clip(x, a_min=None, a_max=None):
    """NumPy's clip: ``minimum(maximum(x, a_min), a_max)``; each bound a number, an array
    broadcast against x, or None; with neither bound, a copy of x (NumPy 2.1 and later).

    Number bounds of x's own kind are the one ``clip`` op. Array bounds, and bounds that
    promote x (an integer array clipped at 1.5 gives floats, as in NumPy), compose the
    ``maximum`` and ``minimum`` ops, whose promotion and gradients apply."""
    bounds = [a_min, a_max]
    for i, b in enumerate(bounds):
        if b is not None and not is_scalar(b) and not isinstance(b, NDArray) and \
                not _state.tracing():
            bounds[i] = asarray(b, device=x.device)
    lo, hi = bounds
    dt = getattr(x, "_dtype", None)
    if dt in INT_RANGE:  # an integer bound beyond the dtype's range clips nothing
        low, high = INT_RANGE[dt]
        lo = None if is_int_scalar(lo) and lo < low else lo
        hi = None if is_int_scalar(hi) and hi > high else hi
    if lo is None and hi is None:
        return apply("copy", (x,), {})
    scalars = [b for b in (lo, hi) if b is not None]
    if all(is_scalar(b) for b in scalars) and result_dtype(x, *scalars) == dt:
        return apply("clip", (x,), {"a_min": lo, "a_max": hi})
    out = x
    if lo is not None:
        out = apply("maximum", (out, lo), {})
    if hi is not None:
        out = apply("minimum", (out, hi), {})
    return out


def _reduction(name):
    def fn(x, axis=None, keepdims=False):
        return apply(name, (x,), {"axis": axis, "keepdims": bool(keepdims)})
    fn.__name__ = name
    return fn


sum = _reduction("sum")  # noqa: A001 - NumPy's names
prod = _reduction("prod")
max = _reduction("max")  # noqa: A001
min = _reduction("min")  # noqa: A001
amax, amin = max, min


def argmax(x, axis=None, keepdims=False):
    return apply("argmax", (x,), {"axis": axis, "keepdims": bool(keepdims)})


def argmin(x, axis=None, keepdims=False):
    return apply("argmin", (x,), {"axis": axis, "keepdims": bool(keepdims)})


def mean(x, axis=None, keepdims=False):
    return _composite.mean(F, x, axis=axis, keepdims=keepdims)


def var(x, axis=None, keepdims=False, ddof=0):
    return _composite.var(F, x, axis=axis, keepdims=keepdims, ddof=ddof)


def std(x, axis=None, keepdims=False, ddof=0):
    return _composite.std(F, x, axis=axis, keepdims=keepdims, ddof=ddof)


def matmul(a, b):
    """NumPy's matmul: 1-D operands are promoted to matrices and the extra axis dropped."""
    a = a if isinstance(a, NDArray) or _state.tracing() else asarray(a)
    b = b if isinstance(b, NDArray) or _state.tracing() else asarray(b)
    a1, b1 = a.ndim == 1, b.ndim == 1
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must not be 0-d (use * for scalars)")
    if a1:
        a = reshape(a, (1, a.shape[0]))
    if b1:
        b = reshape(b, (b.shape[0], 1))
    out = apply("matmul", (a, b), {})
    if a1 and b1:
        return reshape(out, ())
    if a1:
        return reshape(out, out.shape[:-2] + out.shape[-1:])
    if b1:
        return reshape(out, out.shape[:-1])
    return out


def dot(a, b):
    """NumPy's dot for 0-2-D operands (the book's uses); higher ranks follow matmul."""
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    return matmul(a, b)


def reshape(x, shape):
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    return apply("reshape", (x,), {"shape": shape})


def transpose(x, axes=None):
    return apply("transpose", (x,), {"axes": None if axes is None else tuple(axes)})


def broadcast_to(x, shape):
    return apply("broadcast_to", (x,), {"shape": tuple(shape)})


def concatenate(arrays, axis=0):
    """NumPy's concatenate; ``axis=None`` joins the flattened arrays."""
    arrays = tuple(arrays)
    if axis is None:
        arrays = tuple(reshape(a, (-1,)) for a in arrays)
        axis = 0
    return apply("concatenate", arrays, {"axis": axis})


concat = concatenate


def expand_dims(x, axis): return _composite.expand_dims(F, x, axis)
def squeeze(x, axis=None): return _composite.squeeze(F, x, axis)
def swapaxes(x, a, b): return _composite.swapaxes(F, x, a, b)
def stack(arrays, axis=0): return _composite.stack(F, list(arrays), axis)
def split(x, indices_or_sections, axis=0): return _composite.split(F, x, indices_or_sections, axis)
def tile(x, reps): return _composite.tile(F, x, reps)
def repeat(x, repeats, axis=None): return _composite.repeat(F, x, repeats, axis)
def flatten(x): return _composite.flatten(F, x)
def cumsum(x, axis=None, dtype=None):
    return _composite.cumsum(F, x, axis, None if dtype is None else dtype_name(dtype))


def softmax(x, axis=-1): return _composite.softmax(F, x, axis)
def log_softmax(x, axis=-1): return _composite.log_softmax(F, x, axis)


def one_hot(indices, depth, on_value=1.0, off_value=0.0, dtype="float32"):
    with indices.device:  # the positions it compares with are made where the indices are
        return _composite.one_hot(F, indices, depth, on_value, off_value, dtype_name(dtype))


def take(x, indices, axis=0, mode="raise"):
    """NumPy's take: an index out of [-n, n) raises IndexError (eagerly and compiled) unless
    ``mode`` is 'clip' or 'wrap'."""
    if not isinstance(indices, NDArray) and not _state.tracing():
        indices = array(indices, dtype="int64", device=x.device)
    return apply("take", (x, indices), {"axis": axis, "mode": mode})


def pick(x, index, axis=-1, keepdims=False):
    return apply("pick", (x, index), {"axis": axis, "keepdims": keepdims})


def waitall(timeout: float | None = None):
    """Block until every queued op is done; raises the first failure not yet raised."""
    _engine_mod.get_engine().wait_all(timeout)




__all__ = ['NDArray', 'array', 'asarray', 'full', 'zeros', 'ones', 'empty', 'zeros_like', 'ones_like', 'full_like', 'empty_like', 'arange', 'linspace', 'eye', 'exp', 'log', 'log1p', 'expm1', 'sqrt', 'rsqrt', 'square', 'sin', 'cos', 'tanh', 'sigmoid', 'relu', 'abs', 'absolute', 'sign', 'floor', 'ceil', 'round', 'erf', 'logical_not', 'negative', 'stop_gradient', 'add', 'subtract', 'multiply', 'divide', 'true_divide', 'floor_divide', 'mod', 'power', 'maximum', 'minimum', 'equal', 'not_equal', 'less', 'less_equal', 'greater', 'greater_equal', 'logical_and', 'logical_or', 'logical_xor', 'bitwise_and', 'bitwise_or', 'bitwise_xor', 'left_shift', 'right_shift', 'bitwise_left_shift', 'bitwise_right_shift', 'invert', 'bitwise_not', 'bitwise_invert', 'where', 'clip', 'sum', 'prod', 'max', 'min', 'amax', 'amin', 'argmax', 'argmin', 'mean', 'var', 'std', 'matmul', 'dot', 'reshape', 'transpose', 'broadcast_to', 'concatenate', 'concat', 'expand_dims', 'squeeze', 'swapaxes', 'stack', 'split', 'tile', 'repeat', 'flatten', 'cumsum', 'softmax', 'log_softmax', 'one_hot', 'take', 'pick', 'waitall']
