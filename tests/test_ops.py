"""Every op in the registry, checked like PyTorch's OpInfo.

``OP_CASES`` holds one entry per registered op (a test fails when an op has none): sample
inputs for each dtype (broadcasting, 0-d, 0-size; a strided copy of every sample is checked
too), a NumPy reference, the output dtype the op must report, error inputs that must raise
``OpError``, and the dtypes that must be rejected. From the table:

* forward: ``eager_apply`` vs the NumPy reference, for every dtype the op claims;
* types: the output's shape and dtype equal ``infer_types`` and the table's expectation, and
  the raw kernel computes in a dtype of the same kind and at least the inferred precision;
* gradients: the registry's rule, run through the front end (``attach_grad``, ``record``,
  ``backward`` with a random head gradient), vs float64 central finite differences;
* errors: wrong dtypes, shapes and attributes raise ``OpError`` before anything runs.

Hypothesis draws shapes and values for the elementwise and reduction families.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hybrid as hb
from compiler.ops import OpError, Spec, eager_apply, infer_types, result_dtype
from compiler.ops import REGISTRY as _ALL_OPS
from compiler.ops.core import DTYPE_CLASSES
from hybrid.ndarray import apply

# the control-flow ops (foreach, while_loop, cond and their nth) carry whole sub-graphs and
# have several results: tests/test_control_flow.py checks them against eager runs
REGISTRY = {n: op for n, op in _ALL_OPS.items() if op.kind != "control"}

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
NUMERIC = FLOATS + INTS
ALL = NUMERIC + ("bool",)

# (rtol, atol) by output dtype. float32 elementwise: a few ulp of the float64 reference.
# float16: numpy rounds each float16 result once (half an ulp is 4.9e-4), and the reference
# sees the same float16 inputs, so 2e-3 is two ulp. float64: same formulas, summation order.
TOL = {"float16": (2e-3, 1e-3), "float32": (1.3e-6, 1e-5), "float64": (1e-9, 1e-12)}
# Reductions, matmul and convolution add up to ~100 terms whose float32 rounding errors grow
# with the number of terms (and cancel less predictably); float16 accumulates in float16.
ACC_TOL = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-5), "float64": (1e-9, 1e-12)}

HYP = settings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ============================================================================ the table
@dataclasses.dataclass
class Sample:
    args: tuple
    attrs: dict = dataclasses.field(default_factory=dict)
    out: str | None = None  # the expected output dtype, when the case's rule does not say
    match: str | None = None  # for error samples: a part of the message


@dataclasses.dataclass
class OpCase:
    name: str
    samples: Callable  # (rng, dtype) -> [Sample]
    ref: Callable | None  # NumPy reference ref(*args, **attrs)
    dtypes: tuple  # dtypes the forward test runs (every claimed one, plus accepted extras)
    out_dtype: Callable = staticmethod(lambda dt: dt)  # expected output dtype for dtype dt
    grad_samples: Callable | None = None  # rng -> [Sample] in float64; default samples(.., f64)
    errors: Callable | None = None  # rng -> [Sample] that must raise OpError
    reject: tuple = ()  # dtypes the op must refuse
    tol: dict | None = None  # (rtol, atol) by output dtype, when TOL is not right
    check: Callable | None = None  # check(outs, sample, dt), for ops without a reference
    upcast: bool = True  # compute the reference in float64 from the same inputs
    fd_eps: float = 1e-6
    grad_tol: tuple = (1e-5, 1e-7)
    zero_grad: bool = False  # the rule returns no gradient on purpose (stop_gradient)


OP_CASES: dict[str, OpCase] = {}


def case(name, samples, ref, dtypes, **kw):
    assert name not in OP_CASES, name
    OP_CASES[name] = OpCase(name, samples, ref, tuple(dtypes), **kw)


# ============================================================================ inputs
def rand(rng, shape, dt, lo=-2.0, hi=2.0):
    """Random values of dtype dt in [lo, hi] (integers: the integers in range for dt)."""
    shape = tuple(shape)
    if dt == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dt in INTS:
        info = np.iinfo(dt)
        lo_i, hi_i = max(math.ceil(lo), info.min), min(math.floor(hi), info.max)
        return np.asarray(rng.integers(lo_i, hi_i + 1, size=shape)).astype(dt)
    return np.asarray(rng.uniform(lo, hi, size=shape)).astype(dt)


def away(rng, shape, dt, lo=-3, hi=3):
    """Values at least 0.15 from every integer and half-integer (the kinks of floor, round,
    abs, relu, sign): finite differences and float32/float64 references agree there."""
    if dt not in FLOATS:
        return rand(rng, shape, dt, lo, hi)
    k = rng.integers(lo, hi, size=shape)
    frac = rng.uniform(0.15, 0.35, size=shape) + 0.5 * rng.integers(0, 2, size=shape)
    return np.asarray(k + frac).astype(dt)


def distinct(rng, shape, dt):
    """A permutation of well-separated values (no ties for max/min/argmax, pooling)."""
    n = int(np.prod(shape, dtype=np.int64))
    if dt in INTS:
        vals = rng.permutation(n) % min(np.iinfo(dt).max + 1, 1 << 20)
        return np.asarray(vals).reshape(shape).astype(dt)
    return (np.asarray(rng.permutation(n)).reshape(shape) * 0.25 - n * 0.1).astype(dt)


def strided(a):
    """The same values in a non-contiguous array (every other element of a wider one)."""
    if not isinstance(a, np.ndarray) or a.ndim == 0 or a.size < 2:
        return a
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def idx(*values):
    return np.asarray(values, dtype=np.int64)


def _float_or_f32(dt):
    return dt if dt in FLOATS else "float32"


# ============================================================================ unary
def unary_samples(lo=-2.0, hi=2.0, gen=None):
    def make(rng, dt):
        g = gen or (lambda r, s, d: rand(r, s, d, lo, hi))
        return [Sample((g(rng, (3, 4), dt),)), Sample((g(rng, (2, 3, 2), dt),)),
                Sample((g(rng, (), dt),)), Sample((g(rng, (0, 3), dt),))]
    return make


def _erf_ref(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid_ref(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _sigmoid_samples(rng, dt):
    tails = np.asarray([-60.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 60.0]).astype(dt)
    return unary_samples(-4, 4)(rng, dt) + [Sample((tails,))]


def _rsqrt_ref(x):
    return 1.0 / np.sqrt(x)


def _float_unary(name, ref, lo, hi, int_lo=None, int_hi=None, samples=None):
    """A transcendental: float dtypes keep theirs, integers compute in float32."""
    def make(rng, dt):
        if dt in FLOATS:
            return (samples or unary_samples(lo, hi))(rng, dt)
        return unary_samples(int_lo if int_lo is not None else lo,
                             int_hi if int_hi is not None else hi)(rng, dt)
    def ref64(x):  # NumPy computes 8-bit integers in float16: the reference must not
        return ref(np.asarray(x, dtype=np.float64))

    case(name, make, ref64, NUMERIC, out_dtype=_float_or_f32, reject=("bool",),
         grad_samples=lambda rng: make(rng, "float64"))


_float_unary("exp", np.exp, -3, 3, -2, 5)
_float_unary("log", np.log, 0.2, 4, 1, 9)
_float_unary("log1p", np.log1p, -0.7, 3, 0, 9)
_float_unary("expm1", np.expm1, -2, 2, -2, 5)
_float_unary("sqrt", np.sqrt, 0.2, 4, 0, 9)
_float_unary("rsqrt", _rsqrt_ref, 0.2, 4, 1, 9)
_float_unary("sin", np.sin, -4, 4)
_float_unary("cos", np.cos, -4, 4)
_float_unary("tanh", np.tanh, -3, 3)
_float_unary("sigmoid", _sigmoid_ref, -4, 4, samples=_sigmoid_samples)
_float_unary("erf", _erf_ref, -2.5, 2.5)
# inverse trigonometric and hyperbolic (hybrid/numpy_ops.py); inside each domain, away from
# the poles where finite differences blow up
_float_unary("tan", np.tan, -1.2, 1.2, -1, 1)
_float_unary("asin", np.arcsin, -0.9, 0.9, -1, 1)
_float_unary("acos", np.arccos, -0.9, 0.9, -1, 1)
_float_unary("atan", np.arctan, -3, 3)
_float_unary("sinh", np.sinh, -3, 3)
_float_unary("cosh", np.cosh, -3, 3)
_float_unary("asinh", np.arcsinh, -3, 3)
_float_unary("acosh", np.arccosh, 1.2, 4, 1, 9)
_float_unary("atanh", np.arctanh, -0.9, 0.9, 0, 0)


def _numeric_unary(name, ref, gen=None, lo=-3, hi=3):
    case(name, unary_samples(lo, hi, gen), ref, NUMERIC, reject=("bool",))


_numeric_unary("neg", np.negative)
_numeric_unary("abs", np.abs, away)
_numeric_unary("sign", np.sign, away)
_numeric_unary("square", np.square)
_numeric_unary("relu", lambda x: np.maximum(x, 0), away)
_numeric_unary("floor", np.floor, away)
_numeric_unary("ceil", np.ceil, away)
_numeric_unary("round", np.round, away)

case("logical_not", unary_samples(-1, 1), np.logical_not, ALL, out_dtype=lambda dt: "bool")
case("copy", unary_samples(), lambda x: x.copy(), ALL)
case("stop_gradient", unary_samples(), lambda x: x, ALL, zero_grad=True)


def _device_copy_samples(rng, dt):
    return [Sample(s.args, {"device": "cpu(1)", "source": "cpu(0)"})
            for s in unary_samples()(rng, dt)]


case("device_copy", _device_copy_samples, lambda x, device, source: x.copy(), ALL,
     grad_samples=lambda rng: _device_copy_samples(rng, "float64"))


def _cast_samples(rng, dt):
    # non-negative values below 100: every target (uint8 included) holds them exactly
    x = rand(rng, (3, 4), dt, 0, 99)
    return [Sample((x,), {"dtype": t}, out=t)
            for t in ("float16", "float32", "float64", "int32", "uint8", "bool")] + [
        Sample((rand(rng, (), dt, 0, 9),), {"dtype": "int64"}, out="int64"),
        Sample((rand(rng, (0, 2), dt, 0, 9),), {"dtype": np.float32}, out="float32")]


def _cast_grad_samples(rng):
    x = rand(rng, (3, 4), "float64")
    return [Sample((x,), {"dtype": "float64"}), Sample((x,), {"dtype": "float32"})]


# cast is linear: a large finite-difference step is exact up to the float32 output's rounding
case("cast", _cast_samples, lambda x, dtype: x.astype(dtype), ALL,
     grad_samples=_cast_grad_samples, fd_eps=1e-2, grad_tol=(1e-5, 1e-5),
     errors=lambda rng: [Sample((rand(rng, (2,), "float32"),), {"dtype": "complex64"},
                                match="not supported"),
                         Sample((rand(rng, (2,), "float32"),), {"dtype": "int16"})])


# ============================================================================ binary
def binary_samples(x_gen, y_gen, arith=True, float_scalar=1.5, int_scalar=2):
    """Same shapes, broadcasting, 0-d, 0-size, and Python scalars on either side."""
    def make(rng, dt):
        def fs_out(base):
            return _float_or_f32(base) if arith else None
        out = [Sample((x_gen(rng, (3, 4), dt), y_gen(rng, (3, 4), dt))),
               Sample((x_gen(rng, (2, 1, 4), dt), y_gen(rng, (3, 1), dt))),
               Sample((x_gen(rng, (), dt), y_gen(rng, (3,), dt))),
               Sample((x_gen(rng, (4, 1), dt), y_gen(rng, (), dt))),
               Sample((x_gen(rng, (0, 3), dt), y_gen(rng, (1, 3), dt)))]
        if dt != "bool":
            out.append(Sample((x_gen(rng, (2, 3), dt), int_scalar)))
            out.append(Sample((int_scalar, y_gen(rng, (2, 3), dt))))
            if float_scalar is not None:
                out.append(Sample((x_gen(rng, (2, 3), dt), float_scalar), out=fs_out(dt)))
        return out
    return make


def _binary(name, ref, x_gen, y_gen, dtypes=NUMERIC, out_dtype=lambda dt: dt, arith=True,
            float_scalar=1.5, int_scalar=2, **kw):
    samples = binary_samples(x_gen, y_gen, arith, float_scalar, int_scalar)

    def make(rng, dt):
        out = samples(rng, dt)
        for s in out:
            if s.out is not None and arith:
                s.out = out_dtype(s.out)
        return out

    def errors(rng):
        errs = [Sample((rand(rng, (2, 3), "float32"), rand(rng, (4,), "float32")),
                       match="cannot be broadcast")]
        if "bool" not in dtypes:  # bool beside a number promotes (test_bool_promotes_...)
            errs.append(Sample((rand(rng, (2,), "bool"), rand(rng, (2,), "bool")),
                               match="dtype bool"))
            errs.append(Sample((rand(rng, (2,), "bool"), True), match="dtype bool"))
        return errs

    case(name, make, ref, dtypes, out_dtype=out_dtype, errors=errors,
         reject=tuple(d for d in ALL if d not in dtypes), **kw)


def _gen(lo, hi):
    return lambda rng, shape, dt: rand(rng, shape, dt, lo, hi)


def _nonzero(rng, shape, dt):
    """Divisors: magnitude in [0.5, 3] (integers 1..3), either sign where the dtype has one."""
    if dt in INTS:
        mag = rng.integers(1, 4, size=shape)
    else:
        mag = rng.uniform(0.5, 3.0, size=shape)
    sign = 1 if dt == "uint8" else rng.choice([-1, 1], size=shape)
    return np.asarray(mag * sign).astype(dt)


_binary("add", np.add, _gen(-3, 3), _gen(-3, 3))
_binary("sub", np.subtract, _gen(-3, 3), _gen(-3, 3))
_binary("mul", np.multiply, _gen(-3, 3), _gen(-3, 3))
_binary("div", np.true_divide, _gen(-3, 3), _nonzero, out_dtype=_float_or_f32)
# floor division and modulo jump where x / y is an integer: a float64 reference can land on
# the other side of a jump than float32 arithmetic, so these compare in the input dtype.
_binary("floordiv", np.floor_divide, _gen(-5, 5), _nonzero, upcast=False)
_binary("mod", np.mod, _gen(-5, 5), _nonzero, upcast=False)
_binary("pow", np.power, _gen(0.3, 2.5),
        lambda rng, shape, dt: rand(rng, shape, dt, -2 if dt in FLOATS else 0, 2.5),
        float_scalar=0.5)  # integers to negative integer powers are an error in NumPy


def _in_f64(f):  # NumPy computes 8-bit integers in float16: the reference must not
    return lambda x, y: f(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))


# float functions of two operands: integers compute in float32 (x/y away from the kinks)
_binary("atan2", _in_f64(np.arctan2), _gen(-3, 3), _nonzero, out_dtype=_float_or_f32)
_binary("hypot", _in_f64(np.hypot), _nonzero, _nonzero, out_dtype=_float_or_f32)
_binary("copysign", _in_f64(np.copysign), _nonzero, _nonzero, out_dtype=_float_or_f32)


def _offset(rng, shape, dt):
    """Distinct values on a grid shifted from distinct()'s: x and y never tie."""
    return (distinct(rng, shape, dt) + (0.125 if dt in FLOATS else 0)).astype(dt)


_binary("maximum", np.maximum, distinct, _offset)
_binary("minimum", np.minimum, distinct, _offset)


def _coarse(rng, shape, dt):
    """Few distinct values, so comparisons and logical ops see ties and zeros."""
    if dt == "bool":
        return rand(rng, shape, dt)
    vals = rng.integers(-2, 3, size=shape)
    if dt == "uint8":
        vals = np.abs(vals)
    return np.asarray(vals * (0.5 if dt in FLOATS else 1)).astype(dt)


for _name, _ref in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                    ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                    ("logical_and", np.logical_and), ("logical_or", np.logical_or),
                    ("logical_xor", np.logical_xor)):
    _binary(_name, _ref, _coarse, _coarse, dtypes=ALL, out_dtype=lambda dt: "bool",
            arith=False, float_scalar=0.5, int_scalar=1)


# NumPy's bitwise operators: integers bit by bit, bools logically; floats refused
def _bitwise_errors(binary):
    def errors(rng):
        f = rand(rng, (2,), "float32")
        if not binary:
            return [Sample((f,), match="dtype")]
        i = rand(rng, (2, 3), "int32")
        return [Sample((f, f), match="dtype"), Sample((i, 1.5), match="dtype"),
                Sample((i, rand(rng, (4,), "int32")), match="cannot be broadcast")]
    return errors


# (their templates have no float argument to turn into a rejected dtype: the float
# refusals are error samples)
for _name, _ref in (("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                    ("bitwise_xor", np.bitwise_xor)):
    case(_name, binary_samples(rand, rand, True, None), _ref, INTS + ("bool",),
         errors=_bitwise_errors(True))
case("bitwise_not", unary_samples(), np.invert, INTS + ("bool",),
     errors=_bitwise_errors(False))


def _shift_count(rng, shape, dt):  # in range, negative and past the width (NumPy: 0 or -1)
    bits = np.dtype(dt).itemsize * 8
    lo = -3 if np.iinfo(dt).min < 0 else 0
    return rng.integers(lo, bits + 3, size=shape).astype(dt)


def _shift_errors(rng):
    b = rand(rng, (2,), "bool")
    return _bitwise_errors(True)(rng) + [Sample((b, b), match="dtype")]


for _name, _ref in (("left_shift", np.left_shift), ("right_shift", np.right_shift)):
    case(_name, binary_samples(rand, _shift_count, True, None, 3), _ref, INTS,
         errors=_shift_errors)


# ------------------------------------------------------------------ where and clip
def _where_samples(rng, dt):
    c = lambda *s: rand(rng, s, "bool")  # noqa: E731
    x = lambda *s: rand(rng, s, dt, -3, 3)  # noqa: E731
    scalar_out = "int64" if dt == "bool" else dt
    return [Sample((c(3, 4), x(3, 4), x(3, 4))),
            Sample((c(3, 1), x(1, 4), x(3, 4))),
            Sample((c(), x(2, 3), x(3))),
            Sample((c(0, 2), x(1, 2), x(0, 1))),
            Sample((c(2, 3), x(2, 3), 1), out=scalar_out),
            Sample((c(2, 3), 0, x(3)), out=scalar_out)]


case("where", _where_samples, np.where, ALL,
     errors=lambda rng: [Sample((rand(rng, (2, 3), "bool"), rand(rng, (2, 3), "float32"),
                                 rand(rng, (4,), "float32")), match="cannot be broadcast")])


def _clip_samples(rng, dt):
    lo, hi = (1, 3) if dt == "uint8" else (-1, 1)
    if dt in FLOATS:
        lo, hi = -0.7, 0.9
    x = lambda *s: rand(rng, s, dt, -3, 3) if dt in INTS else away(rng, s, dt)  # noqa: E731
    return [Sample((x(3, 4),), {"a_min": lo, "a_max": hi}),
            Sample((x(2, 3),), {"a_min": lo}),
            Sample((x(5,),), {"a_max": hi}),
            Sample((x(),), {"a_min": lo, "a_max": hi}),
            Sample((x(0, 2),), {"a_min": lo, "a_max": hi})]


def _clip_ref(x, a_min=None, a_max=None):
    return np.clip(x, a_min, a_max)


case("clip", _clip_samples, _clip_ref, NUMERIC, reject=("bool",),
     errors=lambda rng: [Sample((rand(rng, (2,), "float32"),), {}, match="a_min, a_max")])


# ============================================================================ reductions
def reduce_samples(gen):
    def make(rng, dt):
        x = gen(rng, (2, 3, 4), dt)
        return [Sample((x,), {}), Sample((x,), {"axis": 0}),
                Sample((x,), {"axis": -1, "keepdims": True}),
                Sample((x,), {"axis": (0, 2)}), Sample((x,), {"axis": None, "keepdims": True}),
                Sample((gen(rng, (), dt),), {}),
                Sample((gen(rng, (3, 0), dt),), {"axis": 0})]
    return make


def _sum_dtype(dt):
    return "int64" if dt in ("bool", "int8", "uint8", "int32") else dt


def _reduce_errors(name, empty_ok):
    def errors(rng):
        x = rand(rng, (2, 3), "float32")
        errs = [Sample((x,), {"axis": 2}, match="out of range"),
                Sample((x,), {"axis": (0, -2)}, match="repeated axis")]
        if not empty_ok:
            errs.append(Sample((rand(rng, (0, 3), "float32"),), {}, match="zero-size"))
            errs.append(Sample((rand(rng, (0, 3), "float32"),), {"axis": 0}, match="zero-size"))
        return errs
    return errors


def _sum_samples(rng, dt):
    out = reduce_samples(lambda r, s, d: rand(r, s, d, -2, 2))(rng, dt)
    return out + [Sample((rand(rng, (0, 3), dt),), {"axis": None})]


case("sum", _sum_samples, lambda x, axis=None, keepdims=False: np.sum(
         x, axis=axis, keepdims=keepdims), ALL, out_dtype=_sum_dtype, tol=ACC_TOL,
     errors=_reduce_errors("sum", True))
def _prod_grad_samples(rng):
    x = rand(rng, (2, 3, 4), "float64", 0.5, 1.5)
    x[0, 1, 2] = x[1, 0, 0] = x[1, 0, 3] = 0.0  # a lone zero in some rows, two in others
    return reduce_samples(lambda r, s, d: rand(r, s, d, 0.5, 1.5))(rng, "float64") + [
        Sample((x,), {"axis": a}) for a in (None, 0, 2, (0, 2))]


case("prod", reduce_samples(lambda r, s, d: rand(r, s, d, 0.5, 1.5) if d in FLOATS
                            else rand(r, s, d, 1, 3)),
     lambda x, axis=None, keepdims=False: np.prod(x, axis=axis, keepdims=keepdims),
     NUMERIC, out_dtype=_sum_dtype, tol=ACC_TOL, reject=("bool",),
     grad_samples=_prod_grad_samples,
     errors=_reduce_errors("prod", True))
for _name, _ref in (("max", np.max), ("min", np.min)):
    case(_name, reduce_samples(distinct),
         (lambda f: lambda x, axis=None, keepdims=False: f(x, axis=axis, keepdims=keepdims))(
             _ref), NUMERIC, reject=("bool",), errors=_reduce_errors(_name, False))


def _arg_samples(rng, dt):
    x = distinct(rng, (3, 4, 2), dt)
    return [Sample((x,), {}), Sample((x,), {"axis": 1}), Sample((x,), {"axis": -1,
                                                                       "keepdims": True}),
            Sample((x,), {"keepdims": True}), Sample((distinct(rng, (), dt),), {}),
            Sample((rand(rng, (5, 3), dt, -1, 1),), {"axis": 0})]  # ties: the first wins


def _arg_ref(f):
    def ref(x, axis=None, keepdims=False):
        return f(x, axis=axis, keepdims=keepdims)
    return ref


def _arg_errors(rng):
    return [Sample((rand(rng, (2, 3), "float32"),), {"axis": (0, 1)}, match="axis must be"),
            Sample((rand(rng, (0, 3), "float32"),), {"axis": 1}, match="empty"),
            Sample((rand(rng, (2, 3), "float32"),), {"axis": 2}, match="out of range")]


case("argmax", _arg_samples, _arg_ref(np.argmax), NUMERIC, out_dtype=lambda dt: "int64",
     reject=("bool",), errors=_arg_errors)
case("argmin", _arg_samples, _arg_ref(np.argmin), NUMERIC, out_dtype=lambda dt: "int64",
     reject=("bool",), errors=_arg_errors)


# ============================================================================ movement
def _reshape_samples(rng, dt):
    r = lambda *s: rand(rng, s, dt)  # noqa: E731
    return [Sample((r(2, 3, 4),), {"shape": (4, -1)}), Sample((r(6),), {"shape": (2, 3)}),
            Sample((r(),), {"shape": (1, 1)}), Sample((r(0, 3),), {"shape": (3, 0)}),
            Sample((r(1),), {"shape": ()}), Sample((r(2, 3),), {"shape": 6})]


case("reshape", _reshape_samples, lambda x, shape: np.reshape(x, shape), ALL,
     errors=lambda rng: [Sample((rand(rng, (2, 3), "float32"),), {"shape": (4, -1)}),
                         Sample((rand(rng, (2, 3), "float32"),), {"shape": (-1, -1)},
                                match="only one"),
                         Sample((rand(rng, (2, 3), "float32"),), {"shape": (5,)})])


def _transpose_samples(rng, dt):
    x = rand(rng, (2, 3, 4), dt)
    return [Sample((x,), {"axes": None}), Sample((x,), {"axes": (1, 0, 2)}),
            Sample((x,), {"axes": (-1, 0, 1)}), Sample((rand(rng, (), dt),), {"axes": ()}),
            Sample((rand(rng, (0, 2), dt),), {})]


case("transpose", _transpose_samples, lambda x, axes=None: np.transpose(x, axes), ALL,
     errors=lambda rng: [Sample((rand(rng, (2, 3), "float32"),), {"axes": (0,)},
                                match="permutation"),
                         Sample((rand(rng, (2, 3), "float32"),), {"axes": (0, 0)}),
                         Sample((rand(rng, (2, 3), "float32"),), {"axes": (0, 5)},
                                match="out of range")])


def _broadcast_samples(rng, dt):
    return [Sample((rand(rng, (3, 1), dt),), {"shape": (2, 3, 4)}),
            Sample((rand(rng, (), dt),), {"shape": (2, 3)}),
            Sample((rand(rng, (1,), dt),), {"shape": (0,)}),
            Sample((rand(rng, (2, 3), dt),), {"shape": [2, 3]})]


case("broadcast_to", _broadcast_samples, lambda x, shape: np.broadcast_to(x, tuple(shape)),
     ALL, errors=lambda rng: [Sample((rand(rng, (3,), "float32"),), {"shape": (4,)}),
                              Sample((rand(rng, (2, 3), "float32"),), {"shape": (3,)})])

SLICES = [((5, 6), (0, 1), (2, 5), (1, 2)),      # x[0:2, 1:5:2]
          ((5, 6), (4, 5), (-6, -7), (-1, -2)),  # reverse through index 0 on both axes
          ((6,), (-2,), (1,), (-2,)),           # negative begin, backwards
          ((4, 3), (3, 0), (1, 3), (1, 1)),     # an empty region
          ((4, 3), (-100, 1), (100, -1), (1, 1)),  # out-of-range bounds clamp
          ((0, 3), (0, 0), (0, 3), (1, 1))]     # 0-size input


def _slice_key(begin, end, step):
    return tuple(slice(b, e, s) for b, e, s in zip(begin, end, step))


def _slice_samples(rng, dt):
    return [Sample((rand(rng, shape, dt),), {"begin": b, "end": e, "step": s})
            for shape, b, e, s in SLICES]


case("slice", _slice_samples, lambda x, begin, end, step: x[_slice_key(begin, end, step)], ALL,
     errors=lambda rng: [Sample((rand(rng, (3, 4), "float32"),),
                                {"begin": (0,), "end": (1,), "step": (1,)}, match="entries"),
                         Sample((rand(rng, (3,), "float32"),),
                                {"begin": (0,), "end": (3,), "step": (0,)}, match="step")])


def _region(shape, b, e, s):
    return np.zeros(shape)[_slice_key(b, e, s)].shape


def _slice_scatter_samples(rng, dt):
    return [Sample((rand(rng, _region(shape, b, e, s), dt),),
                   {"shape": shape, "begin": b, "end": e, "step": s})
            for shape, b, e, s in SLICES]


def _slice_scatter_ref(g, shape, begin, end, step):
    out = np.zeros(shape, dtype=g.dtype)
    out[_slice_key(begin, end, step)] = g
    return out


case("slice_scatter", _slice_scatter_samples, _slice_scatter_ref, ALL,
     errors=lambda rng: [Sample((rand(rng, (2,), "float32"),),
                                {"shape": (4,), "begin": (0,), "end": (3,), "step": (1,)},
                                match="do not fit")])


def _slice_update_samples(rng, dt):
    out = []
    for shape, b, e, s in SLICES:
        region = _region(shape, b, e, s)
        out.append(Sample((rand(rng, shape, dt), rand(rng, region, dt)),
                          {"begin": b, "end": e, "step": s}))
    out.append(Sample((rand(rng, (4, 3), dt), rand(rng, (3,), dt)),
                      {"begin": (1, 0), "end": (3, 3), "step": (1, 1)}))  # broadcast value
    out.append(Sample((rand(rng, (4, 3), dt), True if dt == "bool" else 1),
                      {"begin": (0, 1), "end": (4, 3), "step": (2, 1)}))  # scalar value
    return out


def _slice_update_ref(x, v, begin, end, step):
    out = x.copy()
    out[_slice_key(begin, end, step)] = v
    return out


case("slice_update", _slice_update_samples, _slice_update_ref, ALL,
     errors=lambda rng: [Sample((rand(rng, (4,), "float32"), rand(rng, (3,), "float32")),
                                {"begin": (0,), "end": (2,), "step": (1,)},
                                match="cannot be broadcast")])


def _concat_samples(rng, dt):
    r = lambda *s: rand(rng, s, dt)  # noqa: E731
    return [Sample((r(2, 3), r(1, 3), r(4, 3)), {"axis": 0}),
            Sample((r(2, 3), r(2, 1)), {"axis": -1}),
            Sample((r(2, 0), r(2, 2)), {"axis": 1}),
            Sample((r(3),), {})]


case("concatenate", _concat_samples, lambda *xs, axis=0: np.concatenate(xs, axis=axis), ALL,
     errors=lambda rng: [Sample((), {}, match="at least one"),
                         Sample((rand(rng, (), "float32"), rand(rng, (), "float32"))),
                         Sample((rand(rng, (2, 3), "float32"), rand(rng, (2, 4), "float32")),
                                {"axis": 0}, match="does not match"),
                         Sample((rand(rng, (2, 3), "float32"), rand(rng, (2, 3, 1),
                                                                         "float32"))),
                         Sample((rand(rng, (2, 3), "float32"),), {"axis": 2},
                                match="out of range")])


# ------------------------------------------------------------------ gather/scatter
def _take_samples(rng, dt):
    x = rand(rng, (4, 3), dt)
    return [Sample((x, idx(0, 3, 1, 1)), {"axis": 0}),
            Sample((x, idx([2, 0], [1, 1])), {"axis": 1}),
            Sample((x, idx(-1, 5, 2)), {"axis": 0, "mode": "clip"}),
            Sample((x, idx(-1, 5, 7)), {"axis": -1, "mode": "wrap"}),
            Sample((x, np.asarray(2, dtype=np.int32)), {"axis": 0, "mode": "raise"}),
            Sample((rand(rng, (2, 3, 2), dt), idx(1, 0, 2).astype(np.uint8)), {"axis": 1}),
            Sample((x, np.zeros(0, dtype=np.int64)), {"axis": 0})]


def _take_ref(x, indices, axis=0, mode="clip"):
    return np.take(x, indices, axis=axis, mode=mode)


case("take", _take_samples, _take_ref, ALL,
     errors=lambda rng: [Sample((rand(rng, (3,), "float32"), rand(rng, (2,), "float32")),
                                {}, match="indices"),
                         Sample((rand(rng, (3,), "float32"), idx(0)), {"mode": "nearest"},
                                match="mode"),
                         Sample((rand(rng, (3,), "float32"), idx(0)), {"axis": 1},
                                match="out of range"),
                         Sample((rand(rng, (3, 2), "float32"), idx(0)), {"axis": None},
                                match="axis must be an int")])


def _take_grad_samples(rng, dt):
    out = []
    for xshape, indices, axis, mode in (((4, 3), idx(0, 3, 1, 1), 0, "clip"),
                                        ((4, 3), idx([2, 0], [1, 1]), 1, "clip"),
                                        ((4, 3), idx(-1, 5, 2), 0, "clip"),
                                        ((4, 3), idx(-1, 5, 7), -1, "wrap"),
                                        ((2, 3, 2), idx(1, 0, 2), 1, "raise")):
        a = axis % len(xshape)
        gshape = xshape[:a] + indices.shape + xshape[a + 1:]
        out.append(Sample((rand(rng, gshape, dt, -3, 3), indices),
                          {"axis": a, "dim": xshape[a], "mode": mode}))
    return out


def _take_grad_ref(g, indices, axis, dim, mode="clip"):
    """Dense: a one-hot matrix of the (clipped or wrapped) indices, contracted with g."""
    pos = np.mod(indices, dim) if mode == "wrap" else np.clip(indices, 0, dim - 1)
    hot = (pos.reshape(-1, 1) == np.arange(dim)).astype(np.int64)  # (N, dim)
    lead, rest = g.shape[:axis], g.shape[axis + indices.ndim:]
    gm = np.moveaxis(g.reshape(lead + (-1,) + rest), axis, 0)  # (N, *lead, *rest)
    work = np.float64 if g.dtype.kind == "f" else np.int64
    out = np.tensordot(hot.T, gm.astype(work), axes=1)  # (dim, *lead, *rest)
    out = np.moveaxis(out, 0, axis)
    return out > 0 if g.dtype == bool else out.astype(g.dtype)


case("take_grad", _take_grad_samples, _take_grad_ref, ALL, upcast=False)


def _pick_samples(rng, dt):
    x = rand(rng, (3, 4), dt)
    return [Sample((x, idx(0, 3, 1)), {"axis": -1}),
            Sample((x, idx(2, 0, 1, 1)), {"axis": 0}),
            Sample((x, idx(1, 2, 3)), {"axis": 1, "keepdims": True}),
            Sample((x, idx([0], [3], [2])), {"axis": 1}),  # index with the picked axis as 1
            Sample((x, idx(-2, 9, 1)), {"axis": -1}),  # out of range: clipped
            Sample((rand(rng, (2, 3, 2), dt), idx([1, 0], [2, 2]).astype(np.int32)),
                   {"axis": 1})]


def _pick_ref(x, index, axis=-1, keepdims=False):
    axis = axis % x.ndim
    want = x.shape[:axis] + x.shape[axis + 1:]
    pos = np.clip(index.reshape(want), 0, x.shape[axis] - 1)
    grid = list(np.indices(want))
    grid.insert(axis, pos)
    out = x[tuple(grid)]
    return np.expand_dims(out, axis) if keepdims else out


case("pick", _pick_samples, _pick_ref, ALL,
     errors=lambda rng: [Sample((rand(rng, (3, 4), "float32"), rand(rng, (3,), "float32")),
                                {}, match="index"),
                         Sample((rand(rng, (3, 4), "float32"), idx(0, 1)), {},
                                match="does not match"),
                         Sample((rand(rng, (3, 4), "float32"), idx(0, 1, 2)), {"axis": 2},
                                match="out of range")])


# ------------------------------------------------------------------ sources
def _full_samples(rng, dt):
    value = True if dt == "bool" else (3 if dt in INTS else 1.5)
    return [Sample((), {"shape": (2, 3), "value": value, "dtype": dt}),
            Sample((), {"shape": (), "value": 0, "dtype": dt}),
            Sample((), {"shape": (0, 4), "value": value, "dtype": dt}),
            Sample((), {"shape": [3], "value": 1, "dtype": np.dtype(dt)})]


case("full", _full_samples, lambda shape, value, dtype: np.full(shape, value, dtype=dtype),
     ALL, errors=lambda rng: [Sample((), {"shape": (2,), "value": 1, "dtype": "int16"})])


def _arange_samples(rng, dt):
    out = [Sample((), {"start": 0, "stop": 5, "step": 1, "dtype": dt}),
           Sample((), {"start": 1, "stop": 10, "step": 3, "dtype": dt}),
           Sample((), {"start": 5, "stop": 0, "step": -1, "dtype": dt}),
           Sample((), {"start": 3, "stop": 3, "dtype": dt})]
    if dt in FLOATS:
        out.append(Sample((), {"start": 0, "stop": 1, "step": 0.25, "dtype": dt}))
        out.append(Sample((), {"start": -1.5, "stop": 1.0, "step": 0.5, "dtype": dt}))
    return out


def _arange_ref(start, stop, step=1, dtype="float32"):
    return np.arange(start, stop, step, dtype=np.float64).astype(dtype)


case("arange", _arange_samples, _arange_ref, ALL,
     errors=lambda rng: [Sample((), {"start": 0, "stop": 3, "step": 0}, match="step"),
                         Sample((), {"start": 0, "stop": 3, "dtype": "complex128"})])


# ============================================================================ linalg
def _matmul_samples(rng, dt):
    r = lambda *s: rand(rng, s, dt, -3, 3)  # noqa: E731
    return [Sample((r(2, 3), r(3, 4))), Sample((r(2, 1, 3, 4), r(5, 4, 2))),
            Sample((r(3, 3, 2), r(2, 1))), Sample((r(0, 3), r(3, 2))),
            Sample((r(2, 0), r(0, 3)))]


def _matmul_ref(a, b):
    if a.dtype.kind in "iub":  # wrap like the integer kernel does
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(
            result_dtype(a, b))
    return np.matmul(a, b)


case("matmul", _matmul_samples, _matmul_ref, NUMERIC, tol=ACC_TOL, reject=("bool",),
     errors=lambda rng: [Sample((rand(rng, (3,), "float32"), rand(rng, (3, 2), "float32")),
                                match="2+ dimensions"),
                         Sample((rand(rng, (2, 3), "float32"), rand(rng, (4, 2), "float32")),
                                match="inner dimensions"),
                         Sample((rand(rng, (2, 2, 3), "float32"),
                                 rand(rng, (3, 3, 2), "float32")), match="broadcast"),
                         Sample((rand(rng, (2, 2), "bool"), rand(rng, (2, 2), "bool")),
                                match="dtype bool")])


# ============================================================================ nn
def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv_ref(x, w, stride=1, pad=0, dilation=1, groups=1):
    """Direct cross-correlation, one output pixel at a time."""
    s, p, d = _pair(stride), _pair(pad), _pair(dilation)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xpad = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    out = np.zeros((n, o, oh, ow), dtype=np.result_type(x, w))
    og = o // groups
    for oc in range(o):
        ch = slice(oc // og * cg, (oc // og + 1) * cg)
        for i in range(oh):
            for j in range(ow):
                patch = xpad[:, ch, i * s[0]:i * s[0] + d[0] * (kh - 1) + 1:d[0],
                             j * s[1]:j * s[1] + d[1] * (kw - 1) + 1:d[1]]
                out[:, oc, i, j] = np.sum(patch * w[oc], axis=(1, 2, 3))
    return out


CONVS = [((2, 3, 6, 6), (4, 3, 3, 3), {}),
         ((1, 2, 7, 6), (3, 2, 3, 2), {"stride": 2, "pad": 1}),
         ((1, 2, 7, 7), (2, 2, 3, 3), {"dilation": 2, "pad": (2, 1), "stride": (1, 2)}),
         ((2, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "pad": 1}),
         ((1, 1, 3, 3), (1, 1, 1, 1), {})]


def _conv_samples(rng, dt):
    return [Sample((rand(rng, xs, dt), rand(rng, ws, dt)), dict(a)) for xs, ws, a in CONVS]


def _out_hw(xs, ws, a):
    return _conv_ref(np.zeros(xs), np.zeros(ws), **a).shape


def _conv_grad_data_samples(rng, dt):
    return [Sample((rand(rng, _out_hw(xs, ws, a), dt), rand(rng, ws, dt)),
                   dict(a, data_shape=xs)) for xs, ws, a in CONVS]


def _conv_grad_data_ref(g, w, data_shape, stride=1, pad=0, dilation=1, groups=1):
    """The adjoint of _conv_ref: every output pixel's gradient spread over its patch."""
    s, p, d = _pair(stride), _pair(pad), _pair(dilation)
    n, c, h, wd = data_shape
    o, cg, kh, kw = w.shape
    dx = np.zeros((n, c, h + 2 * p[0], wd + 2 * p[1]), dtype=np.float64)
    og = o // groups
    for oc in range(o):
        ch = slice(oc // og * cg, (oc // og + 1) * cg)
        for i in range(g.shape[2]):
            for j in range(g.shape[3]):
                dx[:, ch, i * s[0]:i * s[0] + d[0] * (kh - 1) + 1:d[0],
                   j * s[1]:j * s[1] + d[1] * (kw - 1) + 1:d[1]] += \
                    g[:, oc, i, j][:, None, None, None] * w[oc]
    return dx[:, :, p[0]:p[0] + h, p[1]:p[1] + wd]


def _conv_grad_weight_samples(rng, dt):
    return [Sample((rand(rng, xs, dt), rand(rng, _out_hw(xs, ws, a), dt)),
                   dict(a, weight_shape=ws)) for xs, ws, a in CONVS]


def _conv_grad_weight_ref(x, g, weight_shape, stride=1, pad=0, dilation=1, groups=1):
    s, p, d = _pair(stride), _pair(pad), _pair(dilation)
    o, cg, kh, kw = weight_shape
    xpad = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    dw = np.zeros(weight_shape, dtype=np.float64)
    og = o // groups
    for oc in range(o):
        ch = slice(oc // og * cg, (oc // og + 1) * cg)
        for i in range(g.shape[2]):
            for j in range(g.shape[3]):
                patch = xpad[:, ch, i * s[0]:i * s[0] + d[0] * (kh - 1) + 1:d[0],
                             j * s[1]:j * s[1] + d[1] * (kw - 1) + 1:d[1]]
                dw[oc] += np.tensordot(g[:, oc, i, j], patch, axes=1)
    return dw


def _conv_errors(rng):
    x = rand(rng, (1, 2, 5, 5), "float32")
    w = rand(rng, (3, 2, 3, 3), "float32")
    return [Sample((x.astype(np.int32), w), match="dtype int32"),
            Sample((x, w.astype(np.int64)), match="weight"),
            Sample((x[0], w), match="(N, C, H, W)"),
            Sample((x, rand(rng, (3, 4, 3, 3), "float32")), match="channels"),
            Sample((x, w), {"groups": 0}, match="groups"),
            Sample((x, w), {"stride": 0}, match="stride"),
            Sample((x, w), {"pad": -1}, match="pad"),
            Sample((x, w), {"dilation": (1, 0)}, match="dilation"),
            Sample((x, w), {"stride": (1, 2, 3)}, match="pair"),
            Sample((x, rand(rng, (3, 2, 6, 6), "float32")), match="does not fit")]


# float16 convolution multiplies in float16: 1e-2 as for other accumulations
case("conv2d", _conv_samples, _conv_ref, FLOATS, tol=ACC_TOL, reject=INTS + ("bool",),
     errors=_conv_errors)
case("conv2d_grad_data", _conv_grad_data_samples, _conv_grad_data_ref, FLOATS, tol=ACC_TOL)
case("conv2d_grad_weight", _conv_grad_weight_samples, _conv_grad_weight_ref, FLOATS,
     tol=ACC_TOL)

POOLS = [((2, 3, 6, 6), {"pool_type": "max", "kernel": 2}),
         ((1, 2, 7, 6), {"pool_type": "max", "kernel": 3, "stride": 2, "pad": 1}),
         ((1, 2, 6, 5), {"pool_type": "avg", "kernel": (2, 3), "stride": (2, 1)}),
         ((1, 2, 7, 6), {"pool_type": "avg", "kernel": 3, "stride": 2, "pad": 1}),
         ((1, 2, 7, 6), {"pool_type": "avg", "kernel": 3, "stride": 2, "pad": 1,
                         "count_include_pad": False}),
         ((2, 3, 4, 5), {"pool_type": "max", "global_pool": True}),
         ((2, 3, 4, 5), {"pool_type": "avg", "global_pool": True})]


def _pool_geometry(shape, kernel=2, stride=None, pad=0, global_pool=False, **_):
    if global_pool:
        return tuple(shape[2:]), (1, 1), (0, 0)
    k = _pair(kernel)
    return k, _pair(k if stride is None else stride), _pair(pad)


def _pool_windows(x, k, s, p, fill):
    xpad = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    oh = (x.shape[2] + 2 * p[0] - k[0]) // s[0] + 1
    ow = (x.shape[3] + 2 * p[1] - k[1]) // s[1] + 1
    for i in range(oh):
        for j in range(ow):
            yield i, j, (slice(None), slice(None), slice(i * s[0], i * s[0] + k[0]),
                         slice(j * s[1], j * s[1] + k[1])), xpad


def _pool_ref(x, pool_type="max", count_include_pad=True, **geo):
    k, s, p = _pool_geometry(x.shape, **geo)
    oh = (x.shape[2] + 2 * p[0] - k[0]) // s[0] + 1
    ow = (x.shape[3] + 2 * p[1] - k[1]) // s[1] + 1
    out = np.zeros(x.shape[:2] + (oh, ow), dtype=np.float64)
    inside = np.pad(np.ones(x.shape[2:]), ((p[0], p[0]), (p[1], p[1])))
    fill = -np.inf if pool_type == "max" else 0.0
    for i, j, win, xpad in _pool_windows(x, k, s, p, fill):
        if pool_type == "max":
            out[:, :, i, j] = xpad[win].max(axis=(2, 3))
        else:
            n = k[0] * k[1] if count_include_pad else inside[win[2:]].sum()
            out[:, :, i, j] = xpad[win].sum(axis=(2, 3)) / n
    return out


def _pool_samples(rng, dt):
    return [Sample((distinct(rng, xs, dt),), dict(a)) for xs, a in POOLS]


def _pool_grad_samples(rng, dt):
    out = []
    for xs, a in POOLS:
        x = distinct(rng, xs, dt)
        y = eager_apply(np, "pool2d", (x,), a)[0]
        out.append(Sample((rand(rng, y.shape, dt), x, y), dict(a)))
    return out


def _pool_grad_ref(g, x, out, pool_type="max", count_include_pad=True, **geo):
    k, s, p = _pool_geometry(x.shape, **geo)
    fill = -np.inf if pool_type == "max" else 0.0
    inside = np.pad(np.ones(x.shape[2:]), ((p[0], p[0]), (p[1], p[1])))
    dx = np.zeros(x.shape[:2] + (x.shape[2] + 2 * p[0], x.shape[3] + 2 * p[1]))
    for i, j, win, xpad in _pool_windows(x, k, s, p, fill):
        if pool_type == "max":  # the window's first maximum takes the whole gradient
            w = xpad[win].reshape(x.shape[:2] + (-1,))
            first = np.argmax(w, axis=-1)
            hot = np.zeros_like(w)
            np.put_along_axis(hot, first[..., None], 1.0, axis=-1)
            dx[win] += hot.reshape(xpad[win].shape) * g[:, :, i, j][:, :, None, None]
        else:
            n = k[0] * k[1] if count_include_pad else inside[win[2:]].sum()
            dx[win] += g[:, :, i, j][:, :, None, None] / n
    return dx[:, :, p[0]:p[0] + x.shape[2], p[1]:p[1] + x.shape[3]]


def _pool_errors(rng):
    x = rand(rng, (1, 2, 4, 4), "float32")
    return [Sample((x,), {"pool_type": "sum"}, match="pool_type"),
            Sample((x.astype(np.int32),), {}, match="dtype int32"),
            Sample((x[0],), {}, match="(N, C, H, W)"),
            Sample((x,), {"kernel": 5}, match="does not fit"),
            Sample((x,), {"kernel": 2, "stride": 0}, match="stride"),
            Sample((x,), {"kernel": 0}, match="kernel"),
            Sample((x,), {"kernel": 2, "pad": -1}, match="pad")]


case("pool2d", _pool_samples, _pool_ref, FLOATS, tol=ACC_TOL, reject=INTS + ("bool",),
     errors=_pool_errors)
case("pool2d_grad", _pool_grad_samples, _pool_grad_ref, FLOATS, tol=ACC_TOL)


# ============================================================================ random
def _key(k):
    return np.asarray(k, dtype=np.int64)


def _random_samples(extra):
    def make(rng, dt):
        a = dict(extra, low=0) if dt == "uint8" else extra
        return [Sample((_key(7),), dict(a, shape=(1000,), dtype=dt)),
                Sample((_key(2**40 + 3),), dict(a, shape=(40, 25), dtype=dt)),
                Sample((_key(11).astype(np.int32),), dict(a, shape=(), dtype=dt)),
                Sample((_key(5),), dict(a, shape=(0, 3), dtype=dt))]
    return make


_RANDOM_OPS = {"uniform": "random_uniform", "normal": "random_normal",
               "randint": "random_randint"}


def _random_check(kind):
    """No NumPy reference for counter-based draws: check range, moments and determinism."""
    def check(outs, sample, dt):
        (y,) = outs
        a = sample.attrs
        again = eager_apply(np, _RANDOM_OPS[kind], sample.args, a)[0]
        np.testing.assert_array_equal(y, again)  # same key: the same numbers
        if y.size < 100:
            return
        other = eager_apply(np, _RANDOM_OPS[kind], (sample.args[0] + 1,), a)[0]
        assert np.mean(y != other) > 0.5  # another key: other numbers
        v = y.astype(np.float64)
        if kind == "uniform":
            assert v.min() >= a["low"] and v.max() < a["high"]
            assert abs(v.mean() - (a["low"] + a["high"]) / 2) < 0.1 * (a["high"] - a["low"])
        elif kind == "normal":
            assert abs(v.mean() - a["loc"]) < 0.15 * a["scale"]
            assert abs(v.std() - a["scale"]) < 0.15 * a["scale"]
        else:
            assert set(np.unique(v)) == set(range(a["low"], a["high"]))
    return check


def _random_errors(extra, dt):
    def errors(rng):
        bad_dt = "int32" if dt == "float32" else "float32"
        return [Sample((np.asarray(1.0),), dict(extra, shape=(2,)), match="key"),
                Sample((idx(1, 2),), dict(extra, shape=(2,)), match="0-d"),
                Sample((_key(1),), dict(extra, shape=(2,), dtype=bad_dt),
                       match=f"dtype {bad_dt}")]
    return errors


_UNI = {"low": -2.0, "high": 3.0}
_NORM = {"loc": 1.0, "scale": 2.0}
_INT = {"low": -2, "high": 4}
case("random_uniform", _random_samples(_UNI), None, FLOATS, check=_random_check("uniform"),
     errors=_random_errors(_UNI, "float32"), reject=INTS + ("bool",))
case("random_normal", _random_samples(_NORM), None, FLOATS, check=_random_check("normal"),
     errors=_random_errors(_NORM, "float32"), reject=INTS + ("bool",))
case("random_randint", _random_samples(_INT), None, INTS, check=_random_check("randint"),
     reject=FLOATS + ("bool",),
     errors=lambda rng: _random_errors(_INT, "int64")(rng) + [
         Sample((_key(1),), {"shape": (2,), "low": 3, "high": 3}, match="greater")])


@pytest.mark.parametrize("dt", FLOATS)
def test_random_uniform_never_reaches_high(dt):
    """[low, high): float16 rounding of draws just below high must not give high."""
    for low, high in ((0.0, 1.0), (-2.0, 3.0)):
        y = eager_apply(np, "random_uniform", (_key(3),),
                        {"shape": (200_000,), "low": low, "high": high, "dtype": dt})[0]
        assert y.dtype == dt and y.min() >= low and y.max() < high


# ============================================================================ helpers
def _grad_samples_for(c, rng):
    if c.grad_samples is not None:
        return c.grad_samples(rng)
    return c.samples(rng, "float64")


def _is_float_array(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def _ref_args(c, args, dt):
    if not c.upcast:
        return args
    return tuple(a.astype(np.float64) if _is_float_array(a) and a.dtype != np.float64 else a
                 for a in args)


def _assert_matches(actual, expected, out_dt, tol, what):
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if out_dt in FLOATS:
        rtol, atol = tol[out_dt]
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                       rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected.astype(actual.dtype), err_msg=what)


def _kind(dtype) -> str:
    k = np.dtype(dtype).kind
    return "i" if k in "iu" else k


def _expected_dtype(c, sample, dt):
    return sample.out if sample.out is not None else c.out_dtype(dt)


def _run_forward(c, sample, dt, what):
    op = REGISTRY[c.name]
    specs = infer_types(c.name, sample.args, sample.attrs)
    with np.errstate(all="ignore"):
        outs = eager_apply(np, c.name, sample.args, sample.attrs)
        raw = op.impl(np, *sample.args, **sample.attrs)
    raw = (raw,) if op.num_outputs == 1 else raw
    assert len(outs) == len(specs) == op.num_outputs
    for out, spec, r in zip(outs, specs, raw):
        r = np.asarray(r)
        assert out.shape == spec.shape, f"{what}: infer says {spec}, kernel gives {out.shape}"
        assert r.shape == spec.shape, f"{what}: infer says {spec}, raw kernel {r.shape}"
        assert out.dtype.name == spec.dtype
        assert spec.dtype == _expected_dtype(c, sample, dt), f"{what}: infer says {spec}"
        # the kernel computes in the inferred kind and at least the inferred precision
        assert _kind(r.dtype) == _kind(spec.dtype), f"{what}: kernel computes in {r.dtype}"
        if _kind(spec.dtype) == "f":
            assert r.dtype.itemsize >= np.dtype(spec.dtype).itemsize, \
                f"{what}: kernel computes in {r.dtype}, below {spec.dtype}"
    return outs


# ============================================================================ the tests
def test_every_registered_op_has_a_case():
    missing = sorted(set(REGISTRY) - set(OP_CASES))
    extra = sorted(set(OP_CASES) - set(REGISTRY))
    assert not missing, f"ops without an entry in OP_CASES: {missing}"
    assert not extra, f"OP_CASES entries for ops that are not registered: {extra}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_table_covers_claimed_dtypes(name):
    """Every dtype an op claims is run by the forward test, and none it rejects is claimed."""
    c, op = OP_CASES[name], REGISTRY[name]
    claimed = set(DTYPE_CLASSES[op.dtypes])
    assert claimed <= set(c.dtypes), f"{name} claims {sorted(claimed - set(c.dtypes))} untested"
    assert not claimed & set(c.reject), f"{name} claims dtypes it must reject"


FORWARD = [(name, dt) for name in sorted(OP_CASES) for dt in OP_CASES[name].dtypes]


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("name,dt", FORWARD)
def test_forward_matches_numpy(name, dt, layout):
    c = OP_CASES[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}/{dt}".encode()))
    samples = c.samples(rng, dt)
    assert samples
    for i, s in enumerate(samples):
        if layout == "strided":
            s = dataclasses.replace(s, args=tuple(strided(a) for a in s.args))
        what = f"{name}[{dt}] sample {i} ({layout})"
        outs = _run_forward(c, s, dt, what)
        if c.check is not None:
            c.check(outs, s, dt)
            continue
        with np.errstate(all="ignore"):
            expected = c.ref(*_ref_args(c, s.args, dt), **s.attrs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for out, exp in zip(outs, expected):
            _assert_matches(out, exp, out.dtype.name, c.tol or TOL, what)


@pytest.mark.parametrize("name", sorted(n for n in OP_CASES if OP_CASES[n].reject))
def test_rejected_dtypes_raise(name):
    c = OP_CASES[name]
    rng = np.random.default_rng(1)
    template = c.samples(rng, c.dtypes[0])[0]
    for dt in c.reject:
        if name.startswith("random_") or name in ("full", "arange"):
            args, attrs = template.args, dict(template.attrs, dtype=dt)
        else:  # the data arguments (the floating ones of a float16 sample) become dt
            args = tuple(a.astype(dt) if _is_float_array(a) else a for a in template.args)
            attrs = template.attrs
        with pytest.raises(OpError, match=r"dtype"):
            infer_types(name, args, attrs)


ERROR_NAMES = {"slice_update": "setitem"}


@pytest.mark.parametrize("name", sorted(n for n in OP_CASES if OP_CASES[n].errors))
def test_error_inputs_raise_operror(name):
    rng = np.random.default_rng(2)
    for s in OP_CASES[name].errors(rng):
        with pytest.raises(OpError) as info:
            eager_apply(np, name, s.args, s.attrs)
        msg = str(info.value)
        if s.match:
            assert s.match in msg, msg
        if "dtype" in msg and "not supported" in msg:
            continue  # an unknown dtype name: the message names the dtype
        # every "no" names the op (slice_update is the front end's setitem)
        names = {name, name.split("_")[0], name.split("_")[-1], ERROR_NAMES.get(name)}
        assert any(n and n in msg for n in names), f"the message does not name {name}: {msg}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_unknown_attribute_raises(name):
    c = OP_CASES[name]
    s = c.samples(np.random.default_rng(3), c.dtypes[0])[0]
    with pytest.raises(OpError, match="unknown attribute"):
        infer_types(name, s.args, dict(s.attrs, no_such_attribute=1))


def test_unknown_op_raises():
    with pytest.raises(OpError, match="not in the op registry"):
        infer_types("no_such_op", (), {})


# ------------------------------------------------------------------ gradients
DIFFERENTIABLE = sorted(n for n, op in REGISTRY.items() if op.differentiable)


def _to_hybrid(a, grad):
    if not isinstance(a, np.ndarray):
        return a
    x = hb.array(a, dtype=a.dtype.name)
    if grad:
        x.attach_grad()
    return x


def _fd_grad(name, args, attrs, i, head, eps):
    """d/d args[i] of sum(head * op(args)), by float64 central differences."""
    x = args[i]
    g = np.zeros(x.shape, dtype=np.float64)
    for j in np.ndindex(x.shape):
        vals = []
        for step in (eps, -eps):
            xp = x.copy()
            xp[j] += step
            a = args[:i] + (xp,) + args[i + 1:]
            with np.errstate(all="ignore"):
                out = eager_apply(np, name, a, attrs)[0]
            vals.append(np.sum(head * out.astype(np.float64)))
        g[j] = (vals[0] - vals[1]) / (2 * eps)
    return g


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradient_matches_finite_differences(name):
    c = OP_CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    samples = _grad_samples_for(c, rng)
    checked = 0
    for k, s in enumerate(samples):
        diff = [i for i, a in enumerate(s.args) if _is_float_array(a)]
        if not diff:
            continue
        assert all(s.args[i].dtype == np.float64 for i in diff), "gradient samples are float64"
        hargs = tuple(_to_hybrid(a, i in diff) for i, a in enumerate(s.args))
        with hb.autograd.record():
            out = apply(name, hargs, s.attrs)
        expected_fwd = eager_apply(np, name, s.args, s.attrs)[0]
        np.testing.assert_allclose(out.asnumpy(), expected_fwd, rtol=1e-12, atol=1e-12)
        head = rng.standard_normal(out.shape)
        if out.dtype.kind != "f":
            continue
        out.backward(hb.array(head, dtype=out.dtype.name))
        for i in diff:
            got = hargs[i].grad.asnumpy()
            assert got.shape == s.args[i].shape and got.dtype == s.args[i].dtype
            if c.zero_grad:
                want = np.zeros_like(got)
            else:
                want = _fd_grad(name, s.args, s.attrs, i, head, c.fd_eps)
            np.testing.assert_allclose(got, want, rtol=c.grad_tol[0], atol=c.grad_tol[1],
                                       err_msg=f"{name} sample {k}: d/d arg {i}")
            checked += 1
    assert checked, f"{name} is differentiable but no sample checked its gradient"


@pytest.mark.parametrize("name", sorted(n for n, op in REGISTRY.items()
                                        if not op.differentiable))
def test_non_differentiable_ops_record_nothing(name):
    c = OP_CASES[name]
    dt = "float64" if "float64" in c.dtypes else c.dtypes[-1]
    s = c.samples(np.random.default_rng(4), dt)[0]
    hargs = tuple(_to_hybrid(a, True) for a in s.args)
    with hb.autograd.record():
        out = apply(name, hargs, s.attrs)
    assert out._node is None
    with pytest.raises(RuntimeError, match="nothing to differentiate"):
        out.backward()


@pytest.mark.parametrize("values,want", [
    ([2.0, 0.0, 3.0], [0.0, 6.0, 0.0]),   # a lone zero: the product of the others
    ([2.0, 0.0, 0.0], [0.0, 0.0, 0.0]),   # two zeros: every partial product has a zero
    ([2.0, 4.0, 0.5], [2.0, 1.0, 8.0]),
])
def test_prod_gradient_with_zeros(values, want):
    x = hb.array(np.array(values), dtype="float64")
    x.attach_grad()
    with hb.autograd.record():
        y = hb.prod(x)
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), want)


# ------------------------------------------------------------------ type promotion
@pytest.mark.parametrize("args,want", [
    ((np.zeros(2, np.int8), np.zeros(2, np.uint8)), "int32"),  # NumPy says int16
    ((np.zeros(2, np.int32), 2.5), "float32"),
    ((np.zeros(2, np.uint8), 7), "uint8"),
    ((np.zeros(2, bool), 1), "int64"),
    ((np.zeros(2, np.float16), np.zeros(2, np.float32)), "float32"),
    ((np.zeros(2, np.int32), np.zeros(2, np.int64)), "int64"),
    ((np.zeros(2, np.float32), np.zeros(2, np.float64)), "float64"),
    ((np.zeros(2, np.float32), 2), "float32"),
    ((1, 2.0), "float32"),  # Python scalars alone: the default float, as for arrays
    ((True, 3), "int64"),
])
def test_result_dtype(args, want):
    assert result_dtype(*args) == want
    if not any(isinstance(a, (bool, np.ndarray)) and np.asarray(a).dtype == bool
               for a in args):
        assert infer_types("add", args, {})[0].dtype == want


ARITH = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum")


@pytest.mark.parametrize("name", ARITH)
def test_bool_promotes_beside_numbers(name):
    """Arithmetic takes a bool array beside a number as NumPy does (True is 1), eagerly and
    hybridized (issue 25: the book's ``data *= np.abs(data) >= 5``); bool with bool is
    refused."""
    rng = np.random.default_rng(5)
    f, i = rand(rng, (3, 4), "float32", 0.5, 2), rand(rng, (3, 4), "int32", 1, 3)
    m = rng.random((3, 4)) < 0.5
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
           "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power,
           "maximum": np.maximum, "minimum": np.minimum}[name]

    class Net(hb.nn.HybridBlock):
        def forward(self, a, b):
            return apply(name, (a, b), {})

    for a, b in ((f, m), (m, f), (i, m), (m, i), (m, 2), (m, 1.5)):
        if name in ("floordiv", "mod") and not isinstance(b, np.ndarray) or \
                name in ("floordiv", "mod", "div") and b is m:
            continue  # x // False, x % False: a division by zero
        want = infer_types(name, (a, b), {})[0].dtype
        with np.errstate(divide="ignore", invalid="ignore"):
            expect = ref(a, b)
        args = tuple(hb.array(v) if isinstance(v, np.ndarray) else v for v in (a, b))
        got = apply(name, args, {})
        assert got.dtype == want and want != "bool"
        np.testing.assert_allclose(got.asnumpy(), expect.astype(want), rtol=1e-6)
        if all(isinstance(v, np.ndarray) for v in (a, b)):
            net = Net()
            net.hybridize()
            np.testing.assert_allclose(net(*args).asnumpy(), got.asnumpy(), rtol=1e-6)
    with pytest.raises(OpError, match="dtype bool"):
        infer_types(name, (m, m), {})


def test_infer_types_accepts_specs():
    (out,) = infer_types("matmul", (Spec((5, 2, 3), "float32"), Spec((3, 4), "float32")), {})
    assert out == Spec((5, 2, 4), "float32") and str(out) == "f32[5,2,4]"


# ============================================================================ hypothesis
UNARY = sorted(n for n, c in OP_CASES.items() if REGISTRY[n].kind == "elementwise"
               and len(c.samples(np.random.default_rng(0), c.dtypes[-1])[0].args) == 1
               and not REGISTRY[n].attrs)
DOMAINS = {"log": (0.05, 50), "sqrt": (0, 50), "rsqrt": (0.05, 50), "log1p": (-0.9, 50),
           "exp": (-30, 30), "expm1": (-30, 30), "sigmoid": (-80, 80)}


@st.composite
def _arrays(draw, dtypes, lo=-20.0, hi=20.0, shape=None):
    dt = draw(st.sampled_from(dtypes))
    if shape is None:
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    if dt == "bool":
        elems = st.booleans()
    elif dt in INTS:
        info = np.iinfo(dt)
        elems = st.integers(max(int(lo), info.min), min(int(hi), info.max))
    else:
        width = 32 if dt == "float32" else 64
        if width == 32:  # bounds representable in float32, inside [lo, hi]
            lo, hi = float(np.nextafter(np.float32(lo), np.float32(hi))), \
                float(np.nextafter(np.float32(hi), np.float32(lo)))
        elems = st.floats(lo, hi, width=width)
    return draw(hnp.arrays(dt, shape, elements=elems))


@pytest.mark.parametrize("name", UNARY)
@HYP
@given(data=st.data())
def test_unary_hypothesis(name, data):
    c = OP_CASES[name]
    lo, hi = DOMAINS.get(name, (-20.0, 20.0))
    dtypes = [d for d in ("float32", "float64", "int32", "int8", "bool") if d in c.dtypes]
    x = data.draw(_arrays(dtypes, lo, hi))
    _check_against_ref(c, (x,), {}, x.dtype.name)


def _check_against_ref(c, args, attrs, dt):
    s = Sample(args, attrs)
    outs = _run_forward(c, s, dt, f"{c.name}[{dt}]")
    with np.errstate(all="ignore"):
        expected = c.ref(*_ref_args(c, args, dt), **attrs)
    _assert_matches(outs[0], expected, outs[0].dtype.name, c.tol or TOL, c.name)


BINARY = sorted(n for n, c in OP_CASES.items() if REGISTRY[n].kind == "elementwise"
                and n != "where" and len(c.samples(np.random.default_rng(0),
                                                   c.dtypes[-1])[0].args) == 2)


@pytest.mark.parametrize("name", BINARY)
@HYP
@given(data=st.data())
def test_binary_hypothesis(name, data):
    c = OP_CASES[name]
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0,
                                                        max_dims=3, max_side=4))
    dtypes = [d for d in ("float32", "float64", "int32", "int64", "bool") if d in c.dtypes]
    dt = data.draw(st.sampled_from(dtypes))
    lo, hi = (0.25, 3.0) if name == "pow" else (-20.0, 20.0)
    x = data.draw(_arrays([dt], lo, hi, shapes.input_shapes[0]))
    y = data.draw(_arrays([dt], -3.0 if name == "pow" else lo, 3.0 if name == "pow" else hi,
                          shapes.input_shapes[1]))
    if name in ("div", "floordiv", "mod"):
        y = np.asarray(np.where(np.abs(y) < 0.5, 1, y), dt)  # keep clear of division by ~0
    if name == "pow" and dt in INTS:
        # no negative integer powers, no overflow (asarray: abs of a 0-d array is a scalar)
        x, y = np.asarray(np.abs(x) % 4, dt), np.asarray(np.abs(y) % 4, dt)
    out = _run_forward(c, Sample((x, y)), dt, name)[0]
    assert out.shape == shapes.result_shape
    with np.errstate(all="ignore"):
        expected = c.ref(*_ref_args(c, (x, y), dt))
    _assert_matches(out, expected, out.dtype.name, c.tol or TOL, name)


@st.composite
def _reduction_input(draw, dtypes, allow_empty=True):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0 if allow_empty else 1,
                                  max_side=4))
    nd = len(shape)
    axis = draw(st.one_of(st.none(), st.integers(-nd, nd - 1) if nd else st.none(),
                          st.lists(st.integers(0, nd - 1), unique=True, max_size=nd).map(tuple)
                          if nd else st.none()))
    keepdims = draw(st.booleans())
    x = draw(_arrays(dtypes, -3.0, 3.0, shape))
    return x, axis, keepdims


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min"])
@HYP
@given(data=st.data())
def test_reduction_hypothesis(name, data):
    c = OP_CASES[name]
    dtypes = [d for d in ("float32", "float64", "int32", "int8", "bool") if d in c.dtypes]
    x, axis, keepdims = data.draw(_reduction_input(dtypes, allow_empty=name in ("sum",
                                                                                "prod")))
    attrs = {"axis": axis, "keepdims": keepdims}
    _check_against_ref(c, (x,), attrs, x.dtype.name)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@HYP
@given(data=st.data())
def test_arg_reduction_hypothesis(name, data):
    c = OP_CASES[name]
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    x = data.draw(_arrays(["float32", "int32"], -3.0, 3.0, shape))
    _check_against_ref(c, (x,), {"axis": axis, "keepdims": data.draw(st.booleans())},
                       x.dtype.name)


@HYP
@given(data=st.data())
def test_sum_gradient_hypothesis(data):
    """Reduction gradients over drawn shapes and axes (sum and max through the front end)."""
    x, axis, keepdims = data.draw(_reduction_input(["float64"], allow_empty=False))
    xs = np.empty(x.size)
    xs[np.argsort(x, axis=None, kind="stable")] = np.arange(x.size) * 0.5  # no ties for max
    xs = xs.reshape(x.shape)
    for name in ("sum", "max"):
        hx = hb.array(xs, dtype="float64")
        hx.attach_grad()
        with hb.autograd.record():
            y = apply(name, (hx,), {"axis": axis, "keepdims": keepdims})
        head = np.ones(y.shape)
        y.backward(hb.array(head, dtype="float64"))
        want = _fd_grad(name, (xs,), {"axis": axis, "keepdims": keepdims}, 0, head, 1e-6)
        np.testing.assert_allclose(hx.grad.asnumpy(), want, rtol=1e-6, atol=1e-7)


class _NoModeXp:
    """NumPy as CuPy's ``take`` sees it: no ``mode`` (out-of-range indices wrap)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def take(x, indices, axis=None):
        return np.take(x, indices, axis=axis, mode="wrap")


@pytest.mark.parametrize("mode", ["clip", "wrap", "raise"])
def test_take_keeps_numpys_modes_where_the_array_module_has_none(mode):
    """CuPy's take has no mode (found on an H100): the op clips or checks the indices itself,
    so gpu(0) gives NumPy's answer, and 'raise' NumPy's IndexError."""
    from compiler.ops.movement import _take_impl
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([0, 3, -1, 1]) if mode == "raise" else np.array([0, 5, -2, 1, -7])
    for axis in (0, 1, -1):
        want = np.take(x, np.clip(idx, -3, 2) if mode == "raise" else idx, axis=axis,
                       mode=mode)
        got = _take_impl(_NoModeXp(), x, np.clip(idx, -3, 2) if mode == "raise" else idx,
                         axis=axis, mode=mode)
        np.testing.assert_array_equal(got, want)
    if mode == "raise":
        with pytest.raises(IndexError, match="index 7 is out of bounds for axis 0 with size 4"):
            _take_impl(_NoModeXp(), x, np.array([0, 7]), axis=0, mode="raise")
        with pytest.raises(IndexError, match="index -5 is out of bounds"):
            _take_impl(_NoModeXp(), x, np.array([-5, 1]), axis=0, mode="raise")
