"""The op registry's core: what an op is, its types, and how dtypes promote.

An op is defined once (see ``OpDef``): its type rule, its eager implementation over an array
module ``xp`` (numpy or cupy), its gradient rule written with registry ops, and how code
generators lower it (a scalar expression for elementwise ops, an extern kernel otherwise).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, NamedTuple

import numpy as np

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int8", "uint8", "int32", "int64")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES
DTYPE_CLASSES = {"float": FLOAT_DTYPES, "int": INT_DTYPES, "numeric": NUMERIC_DTYPES,
                 "all": ALL_DTYPES, "intbool": INT_DTYPES + ("bool",)}
DEFAULT_FLOAT = "float32"


class OpError(ValueError):
    """An op was applied to arguments it does not accept (shape, dtype or attribute)."""


class Spec(NamedTuple):
    """The static type of a value: shape and dtype name."""
    shape: tuple
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    def __str__(self):
        short = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32",
                 "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "bool"}
        return f"{short.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"


# Canonical names of what dtype_name saw before (str, np.dtype, scalar types): the hot path is
# one dict lookup. Bounded: only successful conversions are kept, and at most _NAMES_MAX.
_NAMES: dict = {}
_NAMES_MAX = 256
for _n in ALL_DTYPES:
    _NAMES[_n] = _n
    _NAMES[np.dtype(_n)] = _n
    _NAMES[np.dtype(_n).type] = _n
del _n


def dtype_name(dtype) -> str:
    """Canonical dtype name ('float32', ...) from anything NumPy understands."""
    try:
        name = _NAMES.get(dtype)
    except TypeError:  # unhashable: let NumPy decide
        name = None
    if name is not None:
        return name
    if dtype is None:
        return DEFAULT_FLOAT
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise OpError(f"unknown dtype {dtype!r}; supported: {', '.join(ALL_DTYPES)}") from None
    if name not in ALL_DTYPES:
        raise OpError(f"dtype {name} is not supported; supported: {', '.join(ALL_DTYPES)}")
    if len(_NAMES) < _NAMES_MAX:
        try:
            _NAMES[dtype] = name
        except TypeError:
            pass
    return name


# Real numbers only: a complex scalar (Python's or NumPy's) is no operand, since no dtype here
# holds its imaginary part (it would be dropped silently).
_SCALAR_TYPES = (bool, int, float, np.integer, np.floating, np.bool_)
# Exact scalar type -> its weak dtype; filled lazily for NumPy scalar types.
_SCALAR_KIND: dict = {bool: "bool", int: "int64", float: DEFAULT_FLOAT}


def is_scalar(v) -> bool:
    """A Python/NumPy number used directly as an operand (a 'weak' type, as in JAX)."""
    return type(v) in _SCALAR_KIND or isinstance(v, _SCALAR_TYPES)


def scalar_kind(v):
    """The weak dtype of a scalar operand ('bool', 'int64' or 'float32'), None otherwise."""
    t = type(v)
    kind = _SCALAR_KIND.get(t)
    if kind is None and isinstance(v, _SCALAR_TYPES):
        kind = _SCALAR_KIND[t] = _scalar_dtype(v)
    return kind


def spec_of(v) -> Spec:
    kind = scalar_kind(v)
    if kind is not None:
        return Spec((), kind)
    return Spec(tuple(v.shape), dtype_name(v.dtype))


def _scalar_dtype(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int64"
    return DEFAULT_FLOAT


_WIDEN = {"int16": "int32", "uint16": "int32", "uint32": "int64"}
_PROMOTE: dict = {}  # tuple of array dtype names -> their promoted name


def _promote(arrays: tuple) -> str:
    dt = _PROMOTE.get(arrays)
    if dt is None:
        dt = np.result_type(*arrays).name
        dt = _WIDEN.get(dt, dt)  # int8 with uint8 is int16 in NumPy, which we do not support
        if len(_PROMOTE) < 4096:
            _PROMOTE[arrays] = dt
    return dt


def result_dtype(*args) -> str:
    """NumPy promotion among arrays; Python scalars are weak (they do not widen arrays).

    An integer or bool array meeting a float scalar gives float32 (the framework default,
    as in MXNet), not NumPy's float64.
    """
    arrays = []
    kinds = []
    for a in args:
        kind = scalar_kind(a)
        if kind is None:
            arrays.append(spec_of(a).dtype)
        else:
            kinds.append(kind)
    if not arrays:  # weak types alone: the widest kind, at its default width
        return next(k for k in (DEFAULT_FLOAT, "int64", "bool") if k in kinds)
    dt = arrays[0]
    if len(arrays) > 1:
        for other in arrays:
            if other != dt:
                dt = _promote(tuple(arrays))
                break
        else:
            dt = _WIDEN.get(dt, dt)
    for kind in kinds:
        if kind == DEFAULT_FLOAT and dt not in FLOAT_DTYPES:
            dt = DEFAULT_FLOAT
        elif kind == "int64" and dt == "bool":
            dt = "int64"
    if dt in INT_DTYPES:
        for a in args:
            check_int_fits(a, dt)
    return dt


INT_RANGE = {n: (int(np.iinfo(n).min), int(np.iinfo(n).max)) for n in INT_DTYPES}


def is_int_scalar(v) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_int_fits(v, dtype: str, what: str = "Python integer"):
    """An integer scalar meeting an integer dtype must fit it (NumPy 2 raises OverflowError
    for ``uint8_array + 300``); it would wrap around silently in a kernel."""
    if is_int_scalar(v):
        lo, hi = INT_RANGE[dtype]
        if not lo <= v <= hi:
            raise OpError(f"{what} {int(v)} is out of bounds for {dtype} ([{lo}, {hi}]); "
                          "cast the array to a wider dtype first")


def broadcast_shapes(*shapes, op: str = "op") -> tuple:
    first = ()
    for other in shapes:  # the common cases without NumPy: equal shapes, or scalars
        if other != first and other != ():
            if first != ():
                break
            first = other
    else:
        first = tuple(first)
        for n in first:
            if type(n) is not int or n < 0:
                break  # let NumPy convert or refuse it
        else:
            return first
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise OpError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be "
                      "broadcast together (trailing dimensions must be equal or 1)") from None


def normalize_axis(axis, ndim: int, op: str = "op") -> tuple:
    """A tuple of non-negative axes from None / int / sequence."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 1) and not (ndim == 0 and a in (0, -1)):
            raise OpError(f"{op}: axis {a} is out of range for an array of {ndim} dimension(s)"
                          f" (valid: {-max(ndim, 1)} to {max(ndim, 1) - 1})")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise OpError(f"{op}: repeated axis in {axis}")
    return tuple(sorted(out))


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One primitive, defined once.

    kind: 'elementwise' (one output, same shape as broadcast inputs, lowered from ``scalar``),
          'reduce', 'movement' (reshape/transpose/slice/...), 'extern' (a library kernel:
          matmul, conv, pooling), 'index' (gather/scatter), 'source' (creation and random).
    infer(*specs, **attrs) -> Spec | tuple[Spec]: the type rule (raises OpError).
    impl(xp, *args, **attrs): the eager implementation over numpy or cupy.
    grad(F, inputs, out, g, **attrs) -> tuple: input gradients built with registry ops
          through ``F`` (eager arrays or graph symbols alike); None for no gradient. A rule
          whose gradients are costly (matmul, conv2d) may take a keyword-only ``needs`` (a
          bool per input) and return None where False: eager autograd has no dead-code
          elimination and says which inputs need one (a first layer's data needs none);
          graph autodiff passes nothing and prunes what is unused.
    scalar(b, *xs, **attrs): for elementwise ops, the expression code generators lower.
    work(out, *in_specs, **attrs) -> int: multiply-adds of one application, for ops that do
          more than one per output element (products, convolutions); by default an
          output element each, none for movement ops (``op_work``).
    """
    name: str
    kind: str
    infer: Callable
    impl: Callable
    grad: Callable | None = None
    scalar: Callable | None = None
    num_outputs: int = 1
    dtypes: str = "all"
    doc: str = ""
    attrs: tuple = ()
    work: Callable | None = None

    @property
    def differentiable(self) -> bool:
        return self.grad is not None

    def check_attrs(self, attrs: dict):
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise OpError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; "
                          f"accepted: {list(self.attrs) or 'none'}")


REGISTRY: dict[str, OpDef] = {}


def register(name: str, kind: str, *, infer, impl, grad=None, scalar=None, num_outputs=1,
             dtypes="all", doc="", attrs=(), work=None) -> OpDef:
    if name in REGISTRY:
        raise ValueError(f"op {name!r} is registered twice")
    op = OpDef(name, kind, infer, impl, grad, scalar, num_outputs, dtypes, doc, tuple(attrs),
               work)
    REGISTRY[name] = op
    return op


def op_work(name: str, out: Spec, in_specs, attrs: dict) -> int:
    """Multiply-adds (or elements) one application of op ``name`` costs: its ``work`` rule,
    else one per output element, none for a movement op (a view or a copy)."""
    op = get_op(name)
    if op.work is not None:
        return op.work(out, *in_specs, **attrs)
    return 0 if op.kind == "movement" else out.size


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise OpError(f"unknown op {name!r}; it is not in the op registry") from None


def check_dtype(op: str, arg: str, dtype: str, allowed: str):
    if dtype not in DTYPE_CLASSES[allowed]:
        raise OpError(f"{op}: argument '{arg}' has dtype {dtype}, but {op} accepts "
                      f"{allowed} dtypes ({', '.join(DTYPE_CLASSES[allowed])})")


def infer_types(name: str, args, attrs: dict) -> tuple:
    """The output Specs of applying op ``name`` to ``args`` (arrays, Specs or scalars)."""
    op = get_op(name)
    op.check_attrs(attrs)
    specs = [a if isinstance(a, Spec) or is_scalar(a) else spec_of(a) for a in args]
    out = op.infer(*specs, **attrs)
    return out if isinstance(out, tuple) and not isinstance(out, Spec) else (out,)


# ------------------------------------------------------------ a cache of inferred types
class _Unhashable(Exception):
    pass


_PLAIN = frozenset((int, float, bool, complex, str, bytes, type(None), type, np.dtype))


def _value_key(v):
    """A hashable key for one attribute value that tells 1, 1.0 and True apart (they are equal
    in Python but may infer differently); raises _Unhashable for anything else."""
    t = type(v)
    if t is str or v is None:
        return v
    if t is int or t is float or t is bool:
        return (t, v)
    if t is tuple or t is list:
        for e in v:
            if type(e) is not int:
                return (t,) + tuple(_value_key(e) for e in v)
        return (t,) + tuple(v)  # ints (a shape, axes): no element of a typed key is an int
    if t in _PLAIN or isinstance(v, (np.number, np.bool_, np.dtype, type)):
        return (t, v)
    raise _Unhashable  # arrays, user objects: their equality is not a plain value compare


def attrs_key(attrs: dict):
    """A hashable key for an op's attributes, or None when one is not a plain value (then the
    caller does not cache). Values are typed: ``{"axis": 1}`` and ``{"axis": True}`` differ."""
    if not attrs:
        return ()
    parts = []
    try:
        for k, v in attrs.items():
            parts.append(k)
            parts.append(_value_key(v))
    except _Unhashable:
        return None
    return tuple(parts)


class InferCache:
    """A bounded LRU map from an inference key (op name, argument types, attrs key) to what
    the eager front end derives from ``infer_types``. Only successes are stored, so a hit
    means the same call was accepted before; errors are raised afresh on every call."""

    def __init__(self, maxsize: int = 4096):
        self.maxsize = maxsize
        self._map: collections.OrderedDict = collections.OrderedDict()

    def get(self, key):
        entry = self._map.get(key)
        if entry is not None:
            try:
                self._map.move_to_end(key)
            except KeyError:  # evicted meanwhile by another front-end thread
                pass
        return entry

    def put(self, key, entry):
        m = self._map
        m[key] = entry
        if len(m) > self.maxsize:
            m.popitem(last=False)

    def clear(self):
        self._map.clear()

    def __len__(self):
        return len(self._map)


class OpNamespace:
    """``F.add(x, y)``-style access to registry ops through an ``apply(name, args, attrs)``.

    Gradient rules and composite functions receive one of these, so the same rule builds
    eager arrays (hybrid) or graph nodes (compiler.autodiff).
    """

    def __init__(self, apply: Callable[[str, tuple, dict], Any]):
        self._apply = apply

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        get_op(name)
        apply = self._apply

        def call(*args, **attrs):
            return apply(name, args, attrs)
        call.__name__ = name
        setattr(self, name, call)
        return call
