"""Blocks: Gluon's ``Block``, ``HybridBlock``, ``Sequential`` and ``HybridSequential``.

Users subclass a block, assign layers and parameters as attributes in ``__init__`` (they are
registered as children and parameters under the attribute's name) and override ``forward``.
``collect_params()`` returns the parameters under structured names ('0.weight',
'features.1.bias'), as Gluon 2.0 does.

A ``HybridBlock`` can be hybridized: ``net.hybridize()`` makes the next call trace ``forward``
into a graph (hybrid.tracing), which is compiled and cached; later calls run the plan.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import re
import sys
import threading
import warnings

import numpy as np

from .. import _state
from .parameter import Parameter, ParameterDict, _unique, eager_scope

__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential", "Concatenate",
           "HybridConcatenate", "Lambda", "HybridLambda", "Identity"]

_counters: dict = collections.defaultdict(itertools.count)
_counter_lock = threading.Lock()

# Bumped by every change to any block tree (children, parameters, hooks, hybridize flags): a
# hybridized block's cache compares its tree's fingerprint again only then (see fingerprint).
structure_epoch = [0]


def _structure_changed():
    structure_epoch[0] += 1


def fingerprint(block) -> tuple:
    """What a traced graph of ``block`` depends on besides its inputs: every descendant
    (path, identity, type, hybridize flags, hooks) and every parameter (path, identity)."""
    out = []

    def rec(b, path):
        flags = tuple(sorted((k, repr(v)) for k, v in (getattr(b, "_hybrid_flags", None) or
                                                        {}).items()))
        out.append((path, id(b), type(b).__name__, getattr(b, "_active", None), flags,
                    tuple(b._forward_pre_hooks), tuple(b._forward_hooks)))
        for k, p in b._reg_params.items():
            out.append((path + k, id(p)))
        for k, c in b._children.items():
            rec(c, path + k + ".")
    rec(block, "")
    return tuple(out)


def describe_change(old: tuple, new: tuple) -> str:
    """The first differences between two fingerprints, in words (for the recompiles log)."""
    def index(fp):
        return {(e[0], len(e)): e for e in fp}
    a, b = index(old), index(new)
    words = []
    for key in b.keys() - a.keys():
        words.append(f"{'parameter' if key[1] == 2 else 'child'} '{key[0].rstrip('.') or '.'}'"
                     " was added")
    for key in a.keys() - b.keys():
        words.append(f"{'parameter' if key[1] == 2 else 'child'} '{key[0].rstrip('.') or '.'}'"
                     " was removed")
    for key in a.keys() & b.keys():
        if a[key] == b[key]:
            continue
        name = key[0].rstrip(".") or "the block"
        if key[1] == 2:
            words.append(f"parameter '{name}' was replaced by another Parameter")
        elif a[key][1:3] != b[key][1:3]:
            words.append(f"child '{name}' was replaced")
        elif a[key][3:5] != b[key][3:5]:
            words.append(f"the hybridize flags of {name} changed")
        else:
            words.append(f"the forward hooks of {name} changed")
    return "; ".join(sorted(words)[:4]) or "the block tree changed"


def _tracing():
    """hybrid.tracing (it imports this module): a dict look-up, cheaper than an import
    statement on every hybridized call."""
    mod = sys.modules.get("hybrid.tracing")
    if mod is None:
        from .. import tracing as mod  # noqa: PLC0415
    return mod


def _auto_name(block) -> str:
    base = type(block).__name__.lower()
    with _counter_lock:
        return f"{base}{next(_counters[base])}"


def _indent(text: str, n: int) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * n + ln for ln in lines[1:]])


class HookHandle:
    """Returned by ``register_forward_hook``; ``detach()`` removes the hook."""

    _ids = itertools.count()

    def __init__(self, hooks: dict, hook):
        self._hooks = hooks
        self._id = next(self._ids)
        hooks[self._id] = hook
        _structure_changed()

    def detach(self):
        if self._hooks.pop(self._id, None) is not None:
            _structure_changed()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()


class Block:
    """The base of all layers and models. Override ``forward``."""

    def __init__(self, prefix=None, params=None):
        object.__setattr__(self, "_children", collections.OrderedDict())
        object.__setattr__(self, "_reg_params", collections.OrderedDict())
        object.__setattr__(self, "_forward_hooks", collections.OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", collections.OrderedDict())
        object.__setattr__(self, "_name", prefix.rstrip("_") if prefix else _auto_name(self))
        if isinstance(params, Block):
            params = params.collect_params()
        object.__setattr__(self, "_shared_params", dict(params) if params else {})

    # ------------------------------------------------------------ registration
    def __setattr__(self, name, value):
        if "_children" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                               f"before assigning attributes (while setting '{name}')")
        existing = self.__dict__.get(name)
        if isinstance(existing, (Parameter, Block)) and not isinstance(value, type(existing)) \
                and value is not None:
            raise TypeError(f"changing attribute '{name}' of {type(self).__name__} from "
                            f"{type(existing).__name__} to {type(value).__name__} is not "
                            "allowed")
        if isinstance(value, Parameter):
            value = self._shared_params.get(name, value)
            self._unregister_by_name(value, name)
            self._children.pop(name, None)
            self._reg_params[name] = value
            if value._owner is None:
                value._owner = self._name
        elif isinstance(value, Block):
            self._check_child(value)
            self._reg_params.pop(name, None)
            self._children[name] = value
        elif name in self._children or name in self._reg_params:
            self._children.pop(name, None)
            self._reg_params.pop(name, None)
        else:
            object.__setattr__(self, name, value)
            return
        object.__setattr__(self, name, value)
        _structure_changed()

    def __delattr__(self, name):
        if name in self._children or name in self._reg_params:
            _structure_changed()
        self._children.pop(name, None)
        self._reg_params.pop(name, None)
        object.__delattr__(self, name)

    def _check_child(self, block):
        pass

    def register_child(self, block, name: str | None = None):
        """Register ``block`` as a child (``Sequential.add`` uses this); returns it."""
        if name is None:
            name = str(len(self._children))
        self._check_child(block)
        self._children[name] = block
        _structure_changed()
        return block

    def _register_param_by_name(self, name: str, param: Parameter):
        """A parameter made by ``self.params.get(name, ...)``: registered under ``name``,
        with no attribute (an attribute assignment later gives it that name instead)."""
        self._reg_params[name] = param
        if param._owner is None:
            param._owner = self._name
        _structure_changed()

    def _unregister_by_name(self, param: Parameter, name: str):
        # a parameter registered only by params.get has no attribute of its name: the
        # attribute it is now assigned to becomes its one name (never listed twice)
        for k, p in list(self._reg_params.items()):
            if p is param and k != name and k not in self.__dict__:
                del self._reg_params[k]

    def register_parameter(self, name: str, param: Parameter):
        setattr(self, name, param)
        return param

    @contextlib.contextmanager
    def name_scope(self):
        """Gluon 1.x compatibility: names are structured, so this does nothing."""
        yield

    @property
    def name(self) -> str:
        return self._name

    @property
    def prefix(self) -> str:
        return self._name + "_"

    @property
    def params(self) -> ParameterDict:
        """This block's own parameters (not its children's); ``get`` and ``get_constant``
        on it create parameters of this block (Gluon 1.x's way)."""
        out = ParameterDict(self._reg_params)
        out._block = self
        return out

    # ------------------------------------------------------------ printing
    def __repr__(self):
        if not self._children:
            return f"{type(self).__name__}()"
        mods = "\n".join(f"  ({k}): {_indent(repr(b), 2)}" for k, b in self._children.items())
        return f"{type(self).__name__}(\n{mods}\n)"

    def __reduce__(self):
        raise TypeError("blocks are not picklable: save parameters with "
                        "net.save_parameters() and rebuild the network in code, or "
                        "net.export() a hybridized network")

    # ------------------------------------------------------------ parameters
    def collect_params(self, select: str | None = None) -> ParameterDict:
        """Every parameter of this block and its descendants under structured names.

        ``select`` is a regular expression matched (re.match) against the names, e.g.
        ``'.*weight'`` or ``'features.0.weight|features.0.bias'``.
        """
        ret = ParameterDict()
        pattern = re.compile(select) if select is not None else None
        self._collect(ret, "", pattern)
        return ret

    def _collect(self, ret, prefix, pattern):
        self._check_containers()
        for key, p in self._reg_params.items():
            full = prefix + key
            if pattern is None or pattern.match(full):
                ret[full] = p
        for key, child in self._children.items():
            child._collect(ret, prefix + key + ".", pattern)

    def _check_containers(self):
        registered = {id(b) for b in self._children.values()}
        for k, v in self.__dict__.items():
            items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) \
                else ()
            if k.startswith("_") and k in ("_children", "_reg_params", "_shared_params"):
                continue
            if any(isinstance(b, Block) and id(b) not in registered for b in items):
                warnings.warn(f"'{k}' of {type(self).__name__} is a {type(v).__name__} holding "
                              "blocks that are not registered as children: their parameters "
                              "are not collected. Use nn.Sequential (or register_child) to "
                              "hold a list of blocks", stacklevel=4)

    def initialize(self, init=None, device=None, verbose=False, force_reinit=False, ctx=None):
        """Initialize every parameter (``init`` defaults to MXNet's ``Uniform(0.07)``;
        a parameter's own initializer, like a bias's 'zeros', takes precedence).

        device: a device or a list of devices (one copy of each parameter per device).
        Parameters whose shape is not known yet are initialized at the first forward.
        """
        self.collect_params().initialize(init, ctx if device is None else device, verbose,
                                         force_reinit)
        return self

    def zero_grad(self):
        """Set every parameter's gradient to 0 (for grad_req='add')."""
        self.collect_params().zero_grad()

    def reset_device(self, device):
        self.collect_params().reset_device(device)

    reset_ctx = reset_device

    def cast(self, dtype):
        """Cast every parameter (and gradient) to ``dtype``."""
        for child in self._children.values():
            child.cast(dtype)
        for p in self._reg_params.values():
            p.cast(dtype)
        return self

    def share_parameters(self, shared):
        """Use the parameters in ``shared`` (structured name -> Parameter, e.g. another
        block's ``collect_params()``, or that block) in place of this block's own."""
        if shared is None:
            return self
        if isinstance(shared, Block):
            shared = shared.collect_params()
        if not isinstance(shared, dict):
            raise ValueError(f"share_parameters: expected a dict of name -> Parameter or a "
                             f"Block, got {type(shared).__name__}")
        left = set(shared)
        self._share(shared, left, "")
        for name in sorted(left):
            warnings.warn(f"share_parameters: parameter '{name}' is not in this model",
                          stacklevel=2)
        return self

    def _share(self, shared, left, prefix):
        for name in list(self._reg_params):
            key = prefix + name
            if shared.get(key) is not None:
                object.__setattr__(self, name, shared[key])
                self._reg_params[name] = shared[key]
                left.discard(key)
                _structure_changed()
        for name, child in self._children.items():
            child._share(shared, left, prefix + name + ".")

    def apply(self, fn):
        """Call ``fn(block)`` on every descendant (children first) and on this block."""
        for child in self._children.values():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------ checkpoints
    def save_parameters(self, filename, deduplicate: bool = False):
        """Write every parameter to ``filename`` (safetensors, keys = structured names),
        atomically: a crash never leaves a half-written file under that name."""
        from ..checkpoint import write_safetensors  # noqa: PLC0415
        arrays, seen = {}, set()
        for name, p in self.collect_params().items():
            if deduplicate and id(p) in seen:
                continue
            seen.add(id(p))
            if p._data is None:
                raise RuntimeError(f"save_parameters: Parameter '{name}' "
                                   f"({p.full_name}) is not initialized (run one forward "
                                   "pass after net.initialize() to finish deferred "
                                   "initialization)")
            arrays[name] = p._check_and_get_numpy()
        write_safetensors(filename, arrays, {"format": "hybrid.parameters", "version": 1})

    def load_parameters(self, filename, device=None, allow_missing: bool = False,
                        ignore_extra: bool = False, cast_dtype: bool = False,
                        dtype_source: str = "current", ctx=None):
        """Load parameters written by ``save_parameters``; every problem (missing, extra or
        mis-shaped names, a truncated file) is reported before anything is changed."""
        from ..checkpoint import read_safetensors  # noqa: PLC0415
        arrays, _ = read_safetensors(filename)
        self.load_dict(arrays, ctx if device is None else device, allow_missing, ignore_extra,
                       cast_dtype, dtype_source, _source=str(filename))

    def load_dict(self, param_dict, device=None, allow_missing: bool = False,
                  ignore_extra: bool = False, cast_dtype: bool = False,
                  dtype_source: str = "current", _source: str = "load_dict"):
        """Load parameters from a dict of structured name -> array (NumPy or hybrid)."""
        if dtype_source not in ("current", "saved"):
            raise ValueError(f"dtype_source must be 'current' or 'saved', got {dtype_source!r}")
        arrays = {k: (v.asnumpy() if hasattr(v, "asnumpy") else np.asarray(v))
                  for k, v in param_dict.items()}
        params = self.collect_params()
        by_param: dict = {}
        for name, p in params.items():
            if name in arrays:
                by_param.setdefault(id(p), (p, name))
        missing = [n for n, p in params.items() if id(p) not in by_param]
        extra = [k for k in arrays if k not in params]
        bad_shape, bad_dtype = [], []
        for p, name in by_param.values():
            v = arrays[name]
            if p.shape is not None and not (len(p.shape) == v.ndim and all(
                    a == 0 or a == b for a, b in zip(p.shape, v.shape))):
                bad_shape.append(f"{name}: model has {_fmt_shape(p.shape)}, file has "
                                 f"{tuple(v.shape)}")
            elif v.dtype.name != p._dtype and not cast_dtype:
                bad_dtype.append(f"{name}: model has {p._dtype}, file has {v.dtype.name}")
        problems = []
        if missing and not allow_missing:
            problems.append(f"missing from the file ({len(missing)}): {', '.join(missing)} "
                            "(pass allow_missing=True to keep their current values)")
        if extra and not ignore_extra:
            problems.append(f"not in the model ({len(extra)}): {', '.join(extra)} "
                            "(pass ignore_extra=True to skip them)")
        if bad_shape:
            problems.append("shape mismatch: " + "; ".join(bad_shape))
        if bad_dtype:
            problems.append("dtype mismatch: " + "; ".join(bad_dtype) +
                            " (pass cast_dtype=True to cast)")
        if problems:
            raise ValueError(f"cannot load parameters from {_source} into "
                             f"{type(self).__name__}:\n  " + "\n  ".join(problems))
        for p, name in by_param.values():
            v = arrays[name]
            if cast_dtype and dtype_source == "saved" and v.dtype.name != p._dtype:
                p.cast(v.dtype)
            p._load_init(v, device)

    # ------------------------------------------------------------ calling
    def register_forward_pre_hook(self, hook) -> HookHandle:
        """``hook(block, args)`` runs before every forward."""
        return HookHandle(self._forward_pre_hooks, hook)

    def register_forward_hook(self, hook) -> HookHandle:
        """``hook(block, args, output)`` runs after every forward."""
        return HookHandle(self._forward_hooks, hook)

    def __call__(self, *args, **kwargs):
        for hook in list(self._forward_pre_hooks.values()):
            hook(self, args)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            hook(self, args, out)
        return out

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must override forward(self, ...)")

    def hybridize(self, active: bool = True, backend=None, static_alloc: bool = False,
                  static_shape: bool = False, **flags):
        """Hybridize every HybridBlock below this block (a plain Block runs eagerly)."""
        _tracing().check_flags(flags)
        for child in self._children.values():
            child.hybridize(active, backend=backend, static_alloc=static_alloc,
                            static_shape=static_shape, **flags)

    def summary(self, *inputs):
        """Print each layer's output shape and parameter count for a forward on ``inputs``
        (run eagerly, in predict mode, without recording)."""
        from .. import autograd  # noqa: PLC0415
        rows = [("Input", _shape_str(inputs), 0, 0, 0)]
        seen = set()
        hooks, saved = [], []

        def hook(block, _args, out):
            n = trainable = shared = 0
            for p in block._reg_params.values():
                size = int(np.prod(p.shape)) if p.shape is not None else 0
                n += size
                trainable += 0 if p.grad_req == "null" else size
                if id(p) in seen:
                    shared += size
                seen.add(id(p))
            rows.append((f"{type(block).__name__}-{len(rows)}", _shape_str(out), n,
                         trainable, shared))

        def register(block):
            if isinstance(block, HybridBlock):
                saved.append((block, block._active))
                block._active = False
            if not isinstance(block, (Sequential, HybridSequential)):
                hooks.append(block.register_forward_hook(hook))

        try:
            self.apply(register)
            with autograd.pause(train_mode=False):
                self(*inputs)
        finally:
            for h in hooks:
                h.detach()
            for block, active in saved:
                block._active = active
        fmt = "{:>20}  {:>42} {:>15}"
        lines = ["-" * 80, fmt.format("Layer (type)", "Output Shape", "Param #"), "=" * 80]
        lines += [fmt.format(name, shape, n) for name, shape, n, _, _ in rows]
        total = sum(r[2] for r in rows)
        trainable = sum(r[3] for r in rows)
        shared = sum(r[4] for r in rows)
        lines += ["=" * 80, "Parameters in forward computation graph, duplicate included",
                  f"   Total params: {total}", f"   Trainable params: {trainable}",
                  f"   Non-trainable params: {total - trainable}",
                  f"Shared params in forward computation graph: {shared}",
                  f"Unique parameters in model: {total - shared}", "-" * 80]
        print("\n".join(lines))


def _fmt_shape(shape):
    return "(" + ", ".join(str(s) if s else "?" for s in shape) + \
        ("," if len(shape) == 1 else "") + ")"


def _shape_str(x):
    if isinstance(x, (list, tuple)):
        parts = [_shape_str(v) for v in x]
        return parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    shape = getattr(x, "shape", None)
    return str(tuple(shape)) if shape is not None else type(x).__name__


class HybridBlock(Block):
    """A block whose ``forward`` uses only hybrid ops, so it can be traced and compiled.

    ``hybridize()`` turns tracing on for the next call (this block and every child);
    inside a traced forward, Python control flow on array values is an error.
    """

    def __init__(self, prefix=None, params=None):
        super().__init__(prefix, params)
        self._active = False
        self._hybrid_flags = {}
        self._cached = None

    def _check_child(self, block):
        if not isinstance(block, HybridBlock):
            raise ValueError(f"children of a HybridBlock must be HybridBlocks too, but "
                             f"{type(self).__name__} got a {type(block).__name__}; use a "
                             "HybridBlock (or nn.HybridLambda), or make the parent a Block")

    def cast(self, dtype):
        """Cast every parameter to ``dtype``; graphs compiled for the old dtype are dropped
        (the compiled-signature cache is keyed by the inputs, not the parameters), so the
        next hybridized call computes in the new dtype, as the eager call does."""
        self._cached = None
        return super().cast(dtype)

    def hybridize(self, active: bool = True, backend=None, static_alloc: bool = False,
                  static_shape: bool = False, **flags):
        """Trace and compile on the next call. backend: 'llvm', 'cuda' or 'reference'."""
        _tracing().check_flags(flags)
        self._active = active
        self._hybrid_flags = dict(backend=backend, static_alloc=static_alloc,
                                  static_shape=static_shape, **flags)
        for child in self._children.values():
            child.hybridize(active, backend=backend, static_alloc=static_alloc,
                            static_shape=static_shape, **flags)
        self._cached = None
        _structure_changed()

    def __call__(self, *args, **kwargs):
        if self._forward_pre_hooks:
            for hook in list(self._forward_pre_hooks.values()):
                hook(self, args)
        if self._active and _state.local.trace is None:
            cache = self._cached  # None until the first hybridized call builds it
            out = cache(args, kwargs) if cache is not None else \
                _tracing().call_cached(self, args, kwargs)
        else:
            out = self.forward(*args, **kwargs)
        if self._forward_hooks:
            for hook in list(self._forward_hooks.values()):
                hook(self, args, out)
        return out

    def forward(self, *args, **kwargs):
        if getattr(type(self), "hybrid_forward", None) is None:
            raise NotImplementedError(f"{type(self).__name__} must override "
                                      "forward(self, ...)")
        import hybrid as F  # noqa: PLC0415 - Gluon 1.x style hybrid_forward(F, x, **params)
        dev = next((getattr(a, "device", None) for a in args if hasattr(a, "shape")), None)
        params = {k: p.data(dev) for k, p in self._reg_params.items()}
        return self.hybrid_forward(F, *args, **kwargs, **params)

    def export(self, path, example_inputs=None, **kw):
        """Write the deployment artifact (see hybrid.deploy.export)."""
        from .. import deploy  # noqa: PLC0415 - deployment is optional at import time
        return deploy.export(self, path, example_inputs, **kw)

    def export_onnx(self, path, example_inputs=None, **kw):
        """Write an ONNX model (see hybrid.onnx_export.export_onnx; needs ``onnx``)."""
        from ..onnx_export import export_onnx  # noqa: PLC0415 - optional dependency
        return export_onnx(self, path, example_inputs, **kw)

    def infer_shape(self, *args):
        """Finish deferred initialization by running forward once eagerly (no recording)."""
        from .. import autograd  # noqa: PLC0415
        with eager_scope(), autograd.pause(train_mode=False):
            self.forward(*args)


class _SequentialMixin:
    def add(self, *blocks):
        """Append blocks; they run in order."""
        for b in blocks:
            self.register_child(b)
        return self

    def forward(self, x, *args):
        for block in self._children.values():
            x = block(x, *args)
            args = ()
            if isinstance(x, (tuple, list)):
                args = tuple(x[1:])
                x = x[0]
        if args:
            x = (x,) + tuple(args)
        return x

    def __getitem__(self, key):
        layers = list(self._children.values())[key]
        if isinstance(key, slice):
            net = type(self)()
            net.add(*layers)
            return net
        return layers

    def __len__(self):
        return len(self._children)

    def __iter__(self):
        return iter(list(self._children.values()))


class Sequential(_SequentialMixin, Block):
    """Blocks run one after another (eagerly)."""

    def __init__(self, prefix=None, params=None):
        Block.__init__(self, prefix, params)


class HybridSequential(_SequentialMixin, HybridBlock):
    """HybridBlocks run one after another; hybridizes as one graph."""

    def __init__(self, prefix=None, params=None):
        HybridBlock.__init__(self, prefix, params)


class _ConcatenateMixin(_SequentialMixin):
    def __init__(self, axis=-1, prefix=None, params=None):
        self._base.__init__(self, prefix, params)
        self._axis = axis

    def forward(self, x):
        """Every child sees ``x``; their outputs are joined along ``axis``."""
        from ..ndarray import concatenate  # noqa: PLC0415 - ndarray is loaded by now
        return concatenate([block(x) for block in self._children.values()], axis=self._axis)

    def __getitem__(self, key):
        layers = list(self._children.values())[key]
        if isinstance(key, slice):
            net = type(self)(axis=self._axis)
            net.add(*layers)
            return net
        return layers


class Concatenate(_ConcatenateMixin, Block):
    """Blocks that all see the same input; their outputs are concatenated along ``axis``
    (Gluon's Concatenate, the branches of an Inception block)."""

    _base = Block


class HybridConcatenate(_ConcatenateMixin, HybridBlock):
    """Concatenate of HybridBlocks; hybridizes as one graph."""

    _base = HybridBlock


def _resolve_fn(function, who):
    """A callable from a function or a hybrid function's name; a Gluon 1.x style function
    whose first parameter is ``F`` gets the hybrid module as ``F``."""
    if isinstance(function, str):
        import hybrid  # noqa: PLC0415
        fn = getattr(hybrid, function, None) or getattr(hybrid.npx, function, None)
        if fn is None or not callable(fn):
            raise ValueError(f"{who}: no hybrid function named {function!r}")
        return fn
    if not callable(function):
        raise ValueError(f"{who}: expected a function or a function name, got "
                         f"{type(function).__name__}")
    try:
        first = next(iter(inspect.signature(function).parameters), None)
    except (TypeError, ValueError):
        first = None
    if first == "F":
        import hybrid  # noqa: PLC0415
        return functools.wraps(function)(lambda *args: function(hybrid, *args))
    return function


class Lambda(Block):
    """Wrap a function (or the name of a hybrid function) as a Block."""

    def __init__(self, function, prefix=None):
        super().__init__(prefix)
        self._func = _resolve_fn(function, "Lambda")
        self._func_name = getattr(self._func, "__name__", type(self._func).__name__)

    def forward(self, *args):
        return self._func(*args)

    def __repr__(self):
        return f"{type(self).__name__}({self._func_name})"


class HybridLambda(HybridBlock):
    """Wrap a function of hybrid ops (or such a function's name) as a HybridBlock."""

    def __init__(self, function, prefix=None):
        super().__init__(prefix)
        self._func = _resolve_fn(function, "HybridLambda")
        self._func_name = getattr(self._func, "__name__", type(self._func).__name__)

    def forward(self, *args):
        return self._func(*args)

    def __repr__(self):
        return f"{type(self).__name__}({self._func_name})"


class Identity(HybridBlock):
    """Returns its input."""

    def forward(self, x):
        return x


def unique_params(params):
    """Parameters of a dict or list, each once (shared parameters appear under two names)."""
    vals = params.values() if isinstance(params, dict) else params
    return list(_unique(vals))
