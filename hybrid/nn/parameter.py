"""Parameters: named, possibly deferred-shape arrays with one copy (and gradient) per device.

A :class:`Parameter` is created by a layer with the dimensions it knows; unknown dimensions are
0 (or -1) until the layer sees its first input and calls ``_finish_deferred_init(shape)``.
``initialize`` draws the values on the first device and copies them to the others, so every
device starts from the same numbers. Each device copy is an NDArray with ``attach_grad``.
"""
from __future__ import annotations

import contextlib
import itertools
import re
import threading
import warnings

import numpy as np

from compiler.ops import dtype_name
from runtime.device import Device, current_device, parse_device

from .. import _state
from ..ndarray import NDArray, array

_local = _state.local

__all__ = ["Parameter", "Constant", "ParameterDict", "DeferredInitializationError",
           "shape_is_known"]


class DeferredInitializationError(RuntimeError):
    """A parameter's shape is not known yet: its layer has not seen an input."""


def shape_is_known(shape) -> bool:
    return shape is not None and all(int(s) > 0 for s in shape)


def _norm_shape(shape):
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    return tuple(0 if int(s) < 0 else int(s) for s in shape)


def _devices(device) -> list:
    if device is None:
        return [current_device()]
    if isinstance(device, (list, tuple)):
        if not device:
            raise ValueError("device list is empty")
        out = [parse_device(d) for d in device]
        if len(set(out)) != len(out):
            raise ValueError(f"device list has duplicates: {out}")
        return out
    return [parse_device(device)]


@contextlib.contextmanager
def eager_scope():
    """Run parameter creation eagerly: outside any active trace and not recorded."""
    loc = _state.local
    saved = (loc.trace, loc.recording)
    loc.trace, loc.recording = None, False
    try:
        yield
    finally:
        loc.trace, loc.recording = saved


# Bumped whenever any Parameter's list of per-device arrays is replaced (initialize, cast,
# reset): compiled calls cache their parameter arrays and re-check them only then (in-place
# updates rebind an array's buffer, never the list, so they need no bump).
data_epoch = [0]

_uid = itertools.count()
_uid_lock = threading.Lock()


class Parameter:
    """A model parameter (Gluon's ``Parameter``).

    name: the local name ('weight', 'bias', ...); ``collect_params`` keys are the structured
        names ('0.weight'). shape: unknown dimensions are 0 (or -1) until inferred.
    init: an initializer (or its name) that takes precedence over ``net.initialize(init)``.
    grad_req: 'write', 'add' or 'null' (no gradient).
    """

    @property
    def _data(self):
        return self.__dict__["_data"]

    @_data.setter
    def _data(self, arrays):
        self.__dict__["_data"] = arrays
        data_epoch[0] += 1

    def __init__(self, name: str = "weight", shape=None, dtype="float32", init=None,
                 grad_req: str = "write", allow_deferred_init: bool = True,
                 lr_mult: float = 1.0, wd_mult: float = 1.0, differentiable: bool = True,
                 **kwargs):
        for k in ("stype", "grad_stype"):
            if kwargs.pop(k, "default") != "default":
                raise ValueError(f"Parameter: sparse storage ({k}) is not supported")
        if kwargs:
            raise TypeError(f"Parameter: unexpected argument(s) {sorted(kwargs)}")
        self.name = name
        self._shape = _norm_shape(shape)
        self._dtype = dtype_name(dtype)
        self.init = init
        self._check_grad_req(grad_req)
        self._grad_req = grad_req if differentiable else "null"
        self._differentiable = differentiable
        self._allow_deferred_init = allow_deferred_init
        self.lr_mult = lr_mult
        self.wd_mult = wd_mult
        self._data = None            # list of NDArray, one per device
        self._devices = None         # list of Device, same order
        self._deferred_init = None   # (init, devices, default_init) while the shape is unknown
        self._owner = None           # the auto name of the first block it was assigned to
        self._stale = {}             # device -> grad buffer seen at the last update (Trainer)
        with _uid_lock:
            self._uid = next(_uid)

    # ------------------------------------------------------------ naming
    @property
    def full_name(self) -> str:
        return f"{self._owner}.{self.name}" if self._owner else self.name

    def __repr__(self):
        shape = "(" + ", ".join(str(s) if s else "-1" for s in self._shape) + \
            ("," if len(self._shape) == 1 else "") + ")" if self._shape is not None else "None"
        return f"Parameter {self.full_name} (shape={shape}, dtype={self._dtype})"

    def __reduce__(self):
        raise TypeError("Parameters are not picklable: save them with net.save_parameters() "
                        "(safetensors)")

    # ------------------------------------------------------------ properties
    @property
    def shape(self):
        return self._shape

    @shape.setter
    def shape(self, new_shape):
        new_shape = _norm_shape(new_shape)
        if self._shape is None:
            self._shape = new_shape
            return
        ok = len(new_shape) == len(self._shape) and all(
            a == 0 or a == b for a, b in zip(self._shape, new_shape))
        if not ok:
            raise ValueError(f"Parameter '{self.full_name}': cannot change shape from "
                             f"{self._shape} to {new_shape} (only unknown dimensions, 0, "
                             f"can be filled in)")
        self._shape = new_shape

    @property
    def dtype(self):
        return np.dtype(self._dtype)

    @dtype.setter
    def dtype(self, dtype):
        self.cast(dtype)

    @property
    def grad_req(self) -> str:
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req: str):
        self._check_grad_req(req)
        if not self._differentiable:
            req = "null"
        if req == self._grad_req:
            return
        self._grad_req = req
        if self._data is not None:
            with eager_scope():
                for d in self._data:
                    d.attach_grad(req)
            self._mark_stale()

    @staticmethod
    def _check_grad_req(req):
        if req not in ("write", "add", "null"):
            raise ValueError(f"grad_req must be 'write', 'add' or 'null', got {req!r}")

    @property
    def initialized(self) -> bool:
        return self._data is not None

    # ------------------------------------------------------------ initialization
    def initialize(self, init=None, device=None, default_init=None, force_reinit=False,
                   ctx=None):
        """Create the values on ``device`` (a device or a list: one copy per device).

        ``init`` (or else this parameter's own ``init``, or else ``default_init``) fills them.
        With an unknown shape, initialization waits for the layer's first input.
        """
        from .. import init as _init  # noqa: PLC0415 - hybrid.init imports nothing of ours
        device = ctx if device is None else device
        if self._data is not None and not force_reinit:
            warnings.warn(f"Parameter '{self.full_name}' is already initialized, ignoring. "
                          "Set force_reinit=True to re-initialize.", stacklevel=2)
            return
        devices = _devices(device)
        if default_init is None:
            default_init = _init.Uniform()
        if init is None:
            init = default_init if self.init is None else self.init
        self._data = None
        self._devices = None
        self._deferred_init = (init, devices, default_init)
        if not shape_is_known(self._shape):
            if self._allow_deferred_init:
                return
            raise ValueError(f"cannot initialize Parameter '{self.full_name}' because its shape "
                             f"{self._shape} is not known and deferred initialization is off")
        self._finish_deferred_init()

    def _finish_deferred_init(self, shape=None):
        """Fill in the inferred ``shape`` and, if initialization was deferred, do it now.

        Layers call this at every forward with the shape their input implies; it is a no-op
        once the parameter has values of that shape.
        """
        if shape is not None:
            if shape == self._shape and self.__dict__.get("_data") is not None:
                return  # (every forward: a tuple of ints equal to the shape is normalized)
            shape = _norm_shape(shape)
            if self._data is not None:
                if shape == self._shape:
                    return
                raise ValueError(f"Parameter '{self.full_name}' has shape {self._shape}, but "
                                 f"the layer's input needs {shape}: the input's shape does "
                                 "not match the one the layer was built or initialized for")
            self.shape = shape
        if self._deferred_init is None or self._data is not None:
            return
        if not shape_is_known(self._shape):
            raise DeferredInitializationError(
                f"Parameter '{self.full_name}' still has an unknown shape {self._shape} after "
                "its layer saw an input")
        init, devices, default_init = self._deferred_init
        from .. import init as _init  # noqa: PLC0415
        with eager_scope():
            data = _init.fill(default_init, init, self.name, self._shape, self._dtype,
                              devices[0])
            self._init_impl(data, devices)

    def _init_impl(self, data: NDArray, devices):
        """Set the values from ``data`` (on any device): a copy on every device, with grads."""
        copies = []
        for dev in devices:
            arr = data.copy() if data.device == dev else data.copyto(dev)
            if arr._dtype != self._dtype:
                arr = arr.astype(self._dtype)
            if self._grad_req != "null":
                arr.attach_grad(self._grad_req)
            copies.append(arr)
        self._data = copies
        self._devices = list(devices)
        self._deferred_init = None
        self._mark_stale()

    def _mark_stale(self):
        """Remember the current gradient buffers: the Trainer treats a gradient whose buffer
        is still one of these as not written by backward since (a stale gradient)."""
        self._stale = {a.device: a.grad._buf for a in self._data or () if a.grad is not None}

    # ------------------------------------------------------------ access
    def _check_initialized(self):
        if self._data is None:
            if self._deferred_init is not None:
                raise DeferredInitializationError(
                    f"Parameter '{self.full_name}' has not been initialized yet because "
                    "initialization was deferred: its shape is learned from the first input. "
                    "Pass one batch of data through the network before accessing it.")
            raise RuntimeError(f"Parameter '{self.full_name}' has not been initialized; call "
                               "net.initialize()")

    def _index(self, device):
        """The position of ``device``'s copy. With no device: the only copy, else the current
        device's (``with hb.cpu(1):``), as Gluon does; a parameter with copies on several
        devices but not on the current one is an error, never some other device's copy."""
        self._check_initialized()
        current = device is None
        if current:
            if len(self._devices) == 1:
                return 0
            device = current_device()
        elif not isinstance(device, Device):
            device = parse_device(device)
        try:
            return self._devices.index(device)
        except ValueError:
            if current:
                where = f"device {device} (the current device)"
                hint = "pass device= (or use list_data() for every copy)"
            else:
                where = str(device)
                hint = "initialize the network with device=[...] listing every device you use"
            raise RuntimeError(f"Parameter '{self.full_name}' was not initialized on {where}; "
                               f"it has copies on {self._devices}; {hint}") from None

    def data(self, device=None, ctx=None):
        """This parameter's value on ``device`` (the only or current device by default)."""
        if device is None:
            device = ctx
        # the common case first (a layer's forward asks at every call): one copy, on the
        # device asked for (devices are interned: ``is``), outside a trace
        arrays = self.__dict__.get("_data")
        if arrays is not None and _local.trace is None:
            devices = self._devices
            if len(devices) == 1 and (device is None or device is devices[0]):
                return arrays[0]
        if _local.trace is not None:
            from .. import tracing  # noqa: PLC0415 - tracing imports the front end
            return tracing.param_symbol(self, device)
        return self._data[self._index(device)]

    def list_data(self) -> list:
        self._check_initialized()
        return list(self._data)

    def grad(self, device=None, ctx=None):
        if self._grad_req == "null":
            raise RuntimeError(f"Parameter '{self.full_name}' has grad_req='null': it has no "
                               "gradient")
        return self._data[self._index(device if device is not None else ctx)].grad

    def list_grad(self) -> list:
        if self._grad_req == "null":
            raise RuntimeError(f"Parameter '{self.full_name}' has grad_req='null': it has no "
                               "gradient")
        self._check_initialized()
        return [d.grad for d in self._data]

    def list_device(self) -> list:
        if self._data is None:
            if self._deferred_init is not None:
                return list(self._deferred_init[1])
            raise RuntimeError(f"Parameter '{self.full_name}' has not been initialized; call "
                               "net.initialize()")
        return list(self._devices)

    list_ctx = list_device

    def set_data(self, data):
        """Overwrite the value on every device (engine-ordered in-place writes)."""
        with eager_scope():
            if not isinstance(data, NDArray):
                data = array(data, dtype=self._dtype)
            if self._shape is not None:
                self.shape = data.shape
            if self._data is None:
                if self._deferred_init is not None:
                    devices = self._deferred_init[1]
                else:
                    devices = [data.device]
                self._shape = tuple(data.shape)
                self._init_impl(data, devices)
                return
            if tuple(data.shape) != tuple(self._shape):
                raise ValueError(f"Parameter '{self.full_name}': set_data got shape "
                                 f"{data.shape}, expected {self._shape}")
            for arr in self._data:
                src = data if data.device == arr.device else data.copyto(arr.device)
                arr[:] = src

    def zero_grad(self):
        """Set the gradient on every device to 0."""
        if self._data is None or self._grad_req == "null":
            return
        with eager_scope():
            for arr in self._data:
                if arr.grad is not None:
                    arr.grad[:] = 0
                    self._stale[arr.device] = arr.grad._buf

    def reset_device(self, device):
        """Move the values to ``device`` (a device or a list)."""
        devices = _devices(device)
        if self._data is not None:
            with eager_scope():
                self._init_impl(self._data[0], devices)
        elif self._deferred_init is not None:
            init, _, default = self._deferred_init
            self._deferred_init = (init, devices, default)

    reset_ctx = reset_device

    def cast(self, dtype):
        """Change the dtype of the values (and gradients)."""
        self._dtype = dtype_name(dtype)
        if self._data is None:
            return
        with eager_scope():
            new = []
            for arr in self._data:
                c = arr.astype(self._dtype)
                if self._grad_req != "null":
                    c.attach_grad(self._grad_req)
                new.append(c)
        self._data = new
        self._mark_stale()

    # ------------------------------------------------------------ loading
    def _load_init(self, value: np.ndarray, device=None, cast_dtype=False):
        """Set from a loaded NumPy array (validated by the caller)."""
        if value.dtype.name != self._dtype:
            value = value.astype(self._dtype)
        with eager_scope():
            if self._data is not None:
                self.set_data(array(value, dtype=self._dtype, device=self._devices[0]))
                return
            if device is not None:
                devices = _devices(device)
            elif self._deferred_init is not None:
                devices = self._deferred_init[1]
            else:
                devices = [current_device()]
            self._shape = tuple(value.shape)
            self._init_impl(array(value, dtype=self._dtype, device=devices[0]), devices)

    def _check_and_get_numpy(self) -> np.ndarray:
        self._check_initialized()
        return self._data[0].asnumpy()


class Constant(Parameter):
    """A parameter that never changes (grad_req='null'), initialized to ``value``."""

    def __init__(self, value, name: str = "const"):
        from .. import init as _init  # noqa: PLC0415
        value = value.asnumpy() if isinstance(value, NDArray) else np.asarray(value)
        dt = "float32" if value.dtype.kind == "f" and value.dtype != np.float64 else \
            value.dtype.name
        super().__init__(name, shape=value.shape, dtype=dt, grad_req="null",
                         differentiable=False, init=_init.Constant(value))
        self.value = value

    def __repr__(self):
        return f"Constant {self.full_name} (shape={self._shape}, dtype={self._dtype})"


class ParameterDict(dict):
    """An ordered ``structured name -> Parameter`` dict with Gluon's helpers.

    ``block.params`` is one bound to its block: ``get`` and ``get_constant`` there create
    parameters and register them with the block (Gluon 1.x's way, the book's custom layers:
    ``self.weight = self.params.get('weight', shape=(in_units, units))``)."""

    _block = None  # the block whose own parameters these are (``Block.params``), if any

    def get(self, name, default=None, **kwargs):
        """The parameter ``name``; if there is none, a new ``Parameter(name, **kwargs)``
        (made when attributes are given, or always on a block's ``params``). Attributes
        given for an existing parameter must agree with it (an unknown dimension, 0, is
        filled in). Without attributes, on a dict no block owns, a missing name gives
        ``default``, as ``dict.get`` does."""
        p = dict.get(self, name)
        if p is not None:
            _check_attrs(p, kwargs)
            return p
        if not kwargs and self._block is None:
            return default
        return self._add(name, Parameter(name, **kwargs))

    def get_constant(self, name, value=None):
        """The constant ``name``; if there is none, a new :class:`Constant` holding
        ``value`` (never trained: grad_req 'null')."""
        p = dict.get(self, name)
        if p is not None:
            if not isinstance(p, Constant):
                raise TypeError(f"get_constant: '{name}' is a Parameter, not a Constant")
            return p
        if value is None:
            raise KeyError(f"get_constant: no constant '{name}' yet; give its value")
        return self._add(name, Constant(value, name=name))

    def _add(self, name, param):
        self[name] = param
        if self._block is not None:
            self._block._register_param_by_name(name, param)
        return param

    def initialize(self, init=None, device=None, verbose=False, force_reinit=False, ctx=None):
        device = ctx if device is None else device
        from .. import init as _init  # noqa: PLC0415
        default = _init.create(init) if init is not None else _init.Uniform()
        if verbose:
            default.set_verbosity(True)
        for p in _unique(self.values()):
            p.initialize(None, device, default_init=default, force_reinit=force_reinit)

    def zero_grad(self):
        for p in _unique(self.values()):
            p.zero_grad()

    def reset_device(self, device):
        for p in _unique(self.values()):
            p.reset_device(device)

    reset_ctx = reset_device

    def setattr(self, name: str, value):
        """Set attribute ``name`` (e.g. 'grad_req', 'lr_mult') on every parameter."""
        for p in _unique(self.values()):
            setattr(p, name, value)

    def select(self, pattern: str) -> "ParameterDict":
        reg = re.compile(pattern)
        return ParameterDict((k, v) for k, v in self.items() if reg.match(k))

    def __repr__(self):
        body = "\n".join(f"  {k}: {v!r}" for k, v in self.items())
        return f"ParameterDict(\n{body}\n)" if body else "ParameterDict()"


def _check_attrs(p: Parameter, attrs: dict):
    for k, v in attrs.items():
        if k == "shape":
            p.shape = v  # fills unknown dimensions; raises on a conflict
        elif k == "dtype":
            if dtype_name(v) != p._dtype:
                raise ValueError(f"Parameter '{p.full_name}' has dtype {p._dtype}, not "
                                 f"{dtype_name(v)}")
        elif k in ("grad_req", "lr_mult", "wd_mult") and getattr(p, k) != v:
            raise ValueError(f"Parameter '{p.full_name}' has {k}={getattr(p, k)!r}, not {v!r}")


def _unique(params):
    seen = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            yield p
