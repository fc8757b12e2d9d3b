"""The scalar builder protocol: what a registry ``scalar`` expression may call on ``b``.

Each elementwise op defines its meaning once, as ``scalar(b, *xs, **attrs)`` over a builder
``b``; each backend provides a builder. Values are :class:`Typed` (a backend value and its
dtype name) or :class:`Weak` (a Python number from ``b.const(v)`` that adopts the dtype of
the typed operand it meets, as Python scalars do in JAX and NumPy 2).

The protocol (every method returns a value; ``x``, ``y`` are values):

=================================  ==============================================================
``const(value, dtype=None)``       a weak constant, or a typed one when ``dtype`` is given;
                                   ``value`` may be ``'inf'`` / ``'-inf'`` / ``'nan'``
``neg abs sign``                   -x, \\|x\\|, sign (NaN stays NaN; same dtype)
``floor ceil round``               round toward -inf / +inf / half to even (ints: identity)
``exp log log1p expm1 sqrt``       float math; integer and bool operands compute in float32
``tanh sin cos erf tan``           (the registry's convention for transcendentals)
``asin acos atan sinh cosh``
``asinh acosh atanh``
``atan2(y, x) hypot copysign``     float functions of two operands (integers: float32)
``add sub mul``                    NumPy promotion between typed operands; integers wrap
``div``                            true division (integers divide in float32)
``floordiv mod``                   floored (Python/NumPy) semantics; integer x // 0 and x % 0
                                   give 0 as NumPy does
``pow``                            x ** y (integer y < 0, where NumPy raises: 1/x**-y
                                   truncated, i.e. 0 unless x is 1 or -1)
``max min``                        NaN-propagating like ``np.maximum`` / ``np.minimum``
``cmp(name, x, y)``                name in eq ne lt le gt ge; bool result (NaN != NaN)
``logical_and/or/xor(x, y)``       on truth values (x != 0); bool result
``logical_not(x)``
``select(c, x, y)``                x where c else y (c by truth value)
``cast(x, dtype)``                 ``astype`` semantics; float -> int truncates toward 0
``index()``                        the element's int64 index (source ops: arange, random)
``shr(x, n)`` ``bitxor(x, y)``     integer bit operations (the counter-based RNG, and
``bitand`` ``bitor``                NumPy's bitwise_and/or/xor/invert on integers and bools)
=================================  ==============================================================

:func:`eval_call` applies one ``Call`` node: when the call's result dtype is a float,
integer/bool operands are first cast to it (so ``mul(int_array, 2.5)`` typed float32 computes
in float32, as the graph's type rule says), the registry's expression runs, and the result is
cast to the call's dtype. Random ops, which have no registry ``scalar``, are expressed here
(:data:`RANDOM_SCALAR`) over the same builder methods, reproducing compiler/ops/random.py.

:class:`NumpyScalarBuilder` evaluates expressions on NumPy arrays: the oracle that backends are
tested against, and the engine of the reference interpreter (interp.py).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from ..ops.core import FLOAT_DTYPES, REGISTRY
from ..ops.random import GOLDEN, normal_transform
from .kernel import RANDOM_OPS, SOURCE_OPS, Call, scalar_arity

FLOATS = frozenset(FLOAT_DTYPES)
SIGNED = frozenset(("int8", "int32", "int64"))
UNSIGNED = frozenset(("uint8", "uint64"))
INTEGERS = SIGNED | UNSIGNED


class Weak:
    """A weakly typed Python constant."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Weak({self.value!r})"


class Typed:
    """A backend value with its dtype name."""
    __slots__ = ("v", "dtype")

    def __init__(self, v, dtype: str):
        self.v = v
        self.dtype = dtype

    def __repr__(self):
        return f"Typed({self.dtype})"


def parse_number(value):
    if isinstance(value, str):
        return float(value)
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


def weak_kind(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    return "float"


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    return np.result_type(a, b).name


def const_value(value, dtype: str):
    """``value`` converted to ``dtype`` as a NumPy scalar (wrapping integers like astype)."""
    value = parse_number(value)
    if dtype == "bool":
        return np.bool_(bool(value))
    if dtype in INTEGERS:
        if isinstance(value, float):
            if math.isinf(value):
                info = np.iinfo(dtype)
                return np.dtype(dtype).type(info.max if value > 0 else info.min)
            if math.isnan(value):
                return np.dtype(dtype).type(0)
            value = int(value)
        return np.array(int(value)).astype(np.int64 if int(value) < 2 ** 63 else np.uint64
                                           ).astype(dtype)[()]
    return np.array(value, dtype=np.float64).astype(dtype)[()]


class ScalarBuilder:
    """Typing rules shared by every backend; subclasses implement the ``_`` primitives.

    Primitives receive backend values already converted to one dtype ``dt``:
    ``_const(value, dt)``, ``_cast(v, src, dst)``, ``_unary(name, v, dt)``,
    ``_binary(name, x, y, dt)`` (add sub mul div floordiv mod pow max min bitxor bitand bitor shl shr),
    ``_shr(v, n, dt)``, ``_cmp(name, x, y, dt)`` (bool result), ``_select(c, x, y, dt)``
    (``c`` is bool), ``_logical(name, x, y)`` on bools, ``_not(v)``.
    """

    def __init__(self):
        self._index_stack = []
        self.reassoc = False  # set while a reduction combines (backends may reassociate)

    # ---------------------------------------------------------------- typing helpers
    def typed(self, x, dtype: str | None = None) -> Typed:
        """``x`` as a Typed value (of ``dtype`` if given)."""
        if isinstance(x, Weak):
            dt = dtype or {"bool": "bool", "int": "int64", "float": "float64"}[
                weak_kind(parse_number(x.value))]
            return Typed(self._const(const_value(x.value, dt), dt), dt)
        if dtype is not None and x.dtype != dtype:
            return Typed(self._cast(x.v, x.dtype, dtype), dtype)
        return x

    def _adopt(self, typed_dtype: str, weak: Weak) -> str:
        kind = weak_kind(parse_number(weak.value))
        if kind == "float" and not is_float(typed_dtype):
            return "float32"
        if kind == "int" and typed_dtype == "bool":
            return "int64"
        return typed_dtype

    def _unify(self, *xs) -> tuple:
        typed = [x.dtype for x in xs if isinstance(x, Typed)]
        if typed:
            dt = typed[0]
            for d in typed[1:]:
                dt = promote(dt, d)
            for x in xs:
                if isinstance(x, Weak):
                    dt = self._adopt(dt, x)
        else:
            kinds = {weak_kind(parse_number(x.value)) for x in xs}
            dt = "float64" if "float" in kinds else ("int64" if "int" in kinds else "bool")
        return tuple(self.typed(x, dt).v for x in xs) + (dt,)

    def _float_arg(self, x) -> Typed:
        x = self.typed(x)
        return x if is_float(x.dtype) else self.typed(x, "float32")

    def _bool(self, x):
        x = self.typed(x)
        if x.dtype == "bool":
            return x.v
        return self._cast(x.v, x.dtype, "bool")

    # -------------------------------------------------------------------- protocol
    def const(self, value, dtype: str | None = None):
        if dtype is None:
            return Weak(parse_number(value))
        return Typed(self._const(const_value(value, dtype), dtype), dtype)

    def index(self):
        if not self._index_stack:
            raise RuntimeError("b.index() outside an indexed (source op) expression")
        return self._index_stack[-1]

    @contextlib.contextmanager
    def indexed(self, index):
        self._index_stack.append(self.typed(index, "int64"))
        try:
            yield
        finally:
            self._index_stack.pop()

    def _same(self, name, x):
        x = self.typed(x)
        return Typed(self._unary(name, x.v, x.dtype), x.dtype)

    def neg(self, x):
        return self._same("neg", x)

    def abs(self, x):
        return self._same("abs", x)

    def sign(self, x):
        return self._same("sign", x)

    def floor(self, x):
        x = self.typed(x)
        return x if not is_float(x.dtype) else self._same("floor", x)

    def ceil(self, x):
        x = self.typed(x)
        return x if not is_float(x.dtype) else self._same("ceil", x)

    def round(self, x):
        x = self.typed(x)
        return x if not is_float(x.dtype) else self._same("round", x)

    def _math(self, name, x):
        x = self._float_arg(x)
        return Typed(self._unary(name, x.v, x.dtype), x.dtype)

    def exp(self, x):
        return self._math("exp", x)

    def log(self, x):
        return self._math("log", x)

    def log1p(self, x):
        return self._math("log1p", x)

    def expm1(self, x):
        return self._math("expm1", x)

    def sqrt(self, x):
        return self._math("sqrt", x)

    def tanh(self, x):
        return self._math("tanh", x)

    def sin(self, x):
        return self._math("sin", x)

    def cos(self, x):
        return self._math("cos", x)

    def erf(self, x):
        return self._math("erf", x)

    # inverse trigonometric and hyperbolic functions (each one libm call on LLVM and CUDA)
    def tan(self, x):
        return self._math("tan", x)

    def asin(self, x):
        return self._math("asin", x)

    def acos(self, x):
        return self._math("acos", x)

    def atan(self, x):
        return self._math("atan", x)

    def sinh(self, x):
        return self._math("sinh", x)

    def cosh(self, x):
        return self._math("cosh", x)

    def asinh(self, x):
        return self._math("asinh", x)

    def acosh(self, x):
        return self._math("acosh", x)

    def atanh(self, x):
        return self._math("atanh", x)

    def _fbin(self, name, x, y):
        """A float function of two operands: integers and bools compute in float32."""
        xv, yv, dt = self._unify(x, y)
        if not is_float(dt):
            xv, yv = self._cast(xv, dt, "float32"), self._cast(yv, dt, "float32")
            dt = "float32"
        return Typed(self._binary(name, xv, yv, dt), dt)

    def atan2(self, y, x):
        return self._fbin("atan2", y, x)

    def hypot(self, x, y):
        return self._fbin("hypot", x, y)

    def copysign(self, x, y):
        return self._fbin("copysign", x, y)

    def _bin(self, name, x, y):
        xv, yv, dt = self._unify(x, y)
        return Typed(self._binary(name, xv, yv, dt), dt)

    def add(self, x, y):
        return self._bin("add", x, y)

    def sub(self, x, y):
        return self._bin("sub", x, y)

    def mul(self, x, y):
        return self._bin("mul", x, y)

    def div(self, x, y):
        return self._fbin("div", x, y)

    def floordiv(self, x, y):
        return self._bin("floordiv", x, y)

    def mod(self, x, y):
        return self._bin("mod", x, y)

    def pow(self, x, y):
        return self._bin("pow", x, y)

    def max(self, x, y):
        return self._bin("max", x, y)

    def min(self, x, y):
        return self._bin("min", x, y)

    def bitxor(self, x, y):
        return self._bin("bitxor", x, y)

    def bitand(self, x, y):
        return self._bin("bitand", x, y)

    def shift(self, name, x, y):
        """NumPy's left_shift/right_shift (``name`` 'shl' | 'shr') of integers: a shift by
        the width or more, or by a negative count, gives 0 (a negative x shifted right: -1)
        where C and LLVM leave it undefined; the count used is clamped first."""
        xv, yv, dt = self._unify(x, y)
        x, y = Typed(xv, dt), Typed(yv, dt)
        bits = np.dtype(dt).itemsize * 8
        ok = self.logical_and(self.cmp("ge", y, self.const(0, dt)),
                              self.cmp("lt", y, self.const(bits, dt)))
        count = self.select(ok, y, self.const(0, dt))
        moved = Typed(self._binary(name, x.v, count.v, dt), dt)
        if name == "shr" and np.dtype(dt).kind == "i":
            spill = self.select(self.cmp("lt", x, self.const(0, dt)), self.const(-1, dt),
                                self.const(0, dt))
        else:
            spill = self.const(0, dt)
        return self.select(ok, moved, spill)

    def bitor(self, x, y):
        return self._bin("bitor", x, y)

    def shr(self, x, n: int):
        x = self.typed(x)
        return Typed(self._shr(x.v, int(n), x.dtype), x.dtype)

    def cmp(self, name, x, y):
        if name not in ("eq", "ne", "lt", "le", "gt", "ge"):
            raise ValueError(f"cmp: unknown comparison {name!r}")
        xv, yv, dt = self._unify(x, y)
        return Typed(self._cmp(name, xv, yv, dt), "bool")

    def logical_and(self, x, y):
        return Typed(self._logical("and", self._bool(x), self._bool(y)), "bool")

    def logical_or(self, x, y):
        return Typed(self._logical("or", self._bool(x), self._bool(y)), "bool")

    def logical_xor(self, x, y):
        return Typed(self._logical("xor", self._bool(x), self._bool(y)), "bool")

    def logical_not(self, x):
        return Typed(self._not(self._bool(x)), "bool")

    def select(self, c, x, y):
        cv = self._bool(c)
        xv, yv, dt = self._unify(x, y)
        return Typed(self._select(cv, xv, yv, dt), dt)

    def cast(self, x, dtype):
        return self.typed(x, np.dtype(dtype).name)


# ---------------------------------------------------------------- calls and RNG
def _random_bits(b, key, stream: int):
    idx = b.cast(b.index(), "uint64")
    k = b.cast(key, "uint64")
    z = b.add(k, b.mul(b.add(b.mul(idx, b.const(2)), b.const(stream + 1)), b.const(GOLDEN)))
    z = b.mul(b.bitxor(z, b.shr(z, 30)), b.const(0xBF58476D1CE4E5B9))
    z = b.mul(b.bitxor(z, b.shr(z, 27)), b.const(0x94D049BB133111EB))
    return b.bitxor(z, b.shr(z, 31))


def _uniform01(b, key, stream, dtype, in_float64=False):
    """The top 53 (float64) or 24 bits of a draw, times 2^-53 or 2^-24: exact in either
    precision, so ``in_float64`` computes a float32 draw's value as a float64 directly (the
    normal draw's transform: a loop without float32 values vectorizes at float64's width)."""
    bits = _random_bits(b, key, stream)
    if dtype == "float64":
        top = b.cast(b.shr(bits, 11), "int64")
        return b.mul(b.cast(top, "float64"), b.const(1.0 / (1 << 53)))
    # (as int32: the same values, and CPUs convert those to floats in vector registers)
    top = b.cast(b.shr(bits, 40), "int32")
    if in_float64:
        return b.mul(b.cast(top, "float64"), b.const(1.0 / (1 << 24), "float64"))
    u = b.mul(b.cast(top, "float32"), b.const(1.0 / (1 << 24), "float32"))
    return b.cast(u, dtype)


def _random_uniform(b, key, shape=(), low=0.0, high=1.0, dtype="float32"):
    u = _uniform01(b, key, 0, dtype if dtype == "float64" else "float32")
    out = b.cast(b.add(b.mul(u, b.const(high - low)), b.const(low)), dtype)
    # rounding to the dtype can reach `high` (float16 always can): [low, high) as eagerly
    below = np.nextafter(np.asarray(high, dtype), np.asarray(low, dtype))
    return b.min(out, b.const(float(below), dtype))


def _random_normal(b, key, shape=(), loc=0.0, scale=1.0, dtype="float32"):
    work = "float64" if dtype == "float64" else "float32"
    # The transform runs in float64 for every output dtype, with basic operations only
    # (compiler/ops/random.py normal_transform): NumPy, LLVM and CUDA C draw the same bits.
    u1 = _uniform01(b, key, 0, work, in_float64=True)
    u2 = _uniform01(b, key, 1, work, in_float64=True)
    z = normal_transform(b, u1, u2)  # basic operations only: the same bits everywhere
    return b.cast(b.add(b.mul(z, b.const(scale)), b.const(loc)), dtype)


def _random_randint(b, key, shape=(), low=0, high=2, dtype="int64"):
    bits = _random_bits(b, key, 0)
    r = b.add(b.cast(b.mod(bits, b.const(high - low)), "int64"), b.const(low))
    return b.cast(r, dtype)


RANDOM_SCALAR = {"random_uniform": _random_uniform, "random_normal": _random_normal,
                 "random_randint": _random_randint}
assert set(RANDOM_SCALAR) == set(RANDOM_OPS)


def reduce_scalar(name: str):
    """(combine(b, acc, x), identity) of a reduction from the registry."""
    op = REGISTRY[name]
    if op.kind != "reduce" or not isinstance(op.scalar, tuple):
        raise ValueError(f"{name!r} is not a reduction with a scalar combine")
    return op.scalar


def eval_call(b: ScalarBuilder, node: Call, args: list, index=None):
    """Apply ``node`` (a Call) to evaluated ``args`` with builder ``b``.

    ``index``: a thunk giving the default element index for source ops (``Index(None)``).
    """
    n = scalar_arity(node.op)
    operands = list(args[:n])
    if is_float(node.dtype) and node.op not in RANDOM_OPS:
        operands = [b.typed(a, node.dtype) if isinstance(a, Typed) and not is_float(a.dtype)
                    else a for a in operands]
    attrs = node.attr_dict
    if node.op in SOURCE_OPS:
        idx = args[n] if len(args) > n else index()
        with b.indexed(idx):
            if node.op in RANDOM_OPS:
                res = RANDOM_SCALAR[node.op](b, *operands, **attrs)
            else:
                res = REGISTRY[node.op].scalar(b, *operands, **attrs)
    else:
        res = REGISTRY[node.op].scalar(b, *operands, **attrs)
    return b.typed(res, node.dtype)


# --------------------------------------------------------------- the NumPy builder
def _erf_np(x):
    try:
        from scipy.special import erf  # noqa: PLC0415 - optional, as in the eager impl
        return erf(x).astype(x.dtype, copy=False)
    except ImportError:
        return np.vectorize(math.erf, otypes=[x.dtype])(x)


_NP_UNARY = {"neg": np.negative, "abs": np.abs, "sign": np.sign, "floor": np.floor,
             "ceil": np.ceil, "round": np.round, "exp": np.exp, "log": np.log,
             "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "tanh": np.tanh,
             "sin": np.sin, "cos": np.cos, "erf": _erf_np, "tan": np.tan,
             "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
             "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh}
_NP_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
              "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power,
              "max": np.maximum, "min": np.minimum, "bitxor": np.bitwise_xor,
              "bitand": np.bitwise_and, "bitor": np.bitwise_or, "shl": np.left_shift,
              "shr": np.right_shift,
              "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign}
_NP_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}
_NP_LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _int_pow(x, y, dt):
    """Integer x ** y; y < 0 (NumPy raises) gives 1 / x**|y| truncated: 0 unless x is +-1."""
    x, y = np.broadcast_arrays(x, y)
    neg = y < 0
    out = np.power(x, np.where(neg, 0, y)).astype(dt)
    if neg.any():
        odd = (np.abs(y) % 2) == 1
        alt = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(dt)
        out = np.where(neg, alt, out).astype(dt)
    return out


class NumpyScalarBuilder(ScalarBuilder):
    """Evaluates scalar expressions elementwise on NumPy arrays (broadcasting)."""

    def _const(self, value, dt):
        return np.asarray(value, dtype=dt)

    def _cast(self, v, src, dst):
        return np.asarray(v).astype(dst)

    def _unary(self, name, v, dt):
        with np.errstate(all="ignore"):
            return np.asarray(_NP_UNARY[name](v)).astype(dt, copy=False)

    def _binary(self, name, x, y, dt):
        with np.errstate(all="ignore"):
            if name == "pow" and dt in INTEGERS:
                return _int_pow(np.asarray(x), np.asarray(y), dt)
            return np.asarray(_NP_BINARY[name](x, y)).astype(dt, copy=False)

    def _shr(self, v, n, dt):
        return np.right_shift(v, np.asarray(n, dtype=dt)).astype(dt, copy=False)

    def _cmp(self, name, x, y, dt):
        with np.errstate(all="ignore"):
            return np.asarray(_NP_CMP[name](x, y))

    def _select(self, c, x, y, dt):
        return np.asarray(np.where(c, x, y)).astype(dt, copy=False)

    def _logical(self, name, x, y):
        return np.asarray(_NP_LOGICAL[name](x, y))

    def _not(self, v):
        return np.logical_not(v)
