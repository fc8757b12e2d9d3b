"""Counter-based random numbers: a value depends only on (key, element index).

So eager, reference and compiled backends draw the same numbers for the same key, a graph
stays a pure function of its inputs (the key is an input), and no RNG state is shared between
threads or devices. The generator is SplitMix64's finalizer over key + index * golden ratio.
"""
from __future__ import annotations

import math

import numpy as np

from .core import OpError, Spec, check_dtype, dtype_name, register

GOLDEN = 0x9E3779B97F4A7C15


_M64 = (1 << 64) - 1


def draw_key(counter: int) -> int:
    """The 62-bit key of a stream's draw number ``counter``: SplitMix64's finalizer of it.

    A draw's values are the finalizer of ``key + m * GOLDEN`` (m from the element index): keys
    that stepped by GOLDEN themselves would put consecutive draws on one Weyl sequence, a few
    elements apart, and a later draw would repeat an earlier one's values (seen: a uniform
    draw repeated values of the one drawn four draws before). Scrambled keys start each draw
    at an unrelated point of the 2^64-long sequence (SplitMix's own split): two draws of n
    elements overlap with probability ~4n / 2^62."""
    z = counter & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) >> 2  # non-negative in an int64


def random_bits(xp, key, n: int, stream: int):
    """n uint64 values for (key, stream); key is a uint64 0-d array or int."""
    idx = xp.arange(n, dtype="uint64")
    k = xp.asarray(key, dtype="uint64")
    z = k + (idx * xp.uint64(2) + xp.uint64(stream + 1)) * xp.uint64(GOLDEN)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(0x94D049BB133111EB)
    return z ^ (z >> xp.uint64(31))


def uniform01(xp, key, n, stream, dtype):
    """Uniform in [0, 1): the top 24 (float32) or 53 (float64) bits of each draw."""
    bits = random_bits(xp, key, n, stream)
    if dtype == "float64":
        return (bits >> xp.uint64(11)).astype("float64") * (1.0 / (1 << 53))
    return ((bits >> xp.uint64(40)).astype("float32") * xp.float32(1.0 / (1 << 24))
            ).astype(dtype)


def _check_key(key):
    check_dtype("random", "key", key.dtype, "int")
    if key.shape != ():
        raise OpError(f"random: key must be a 0-d integer array, got shape {key.shape}")


def _rand_infer(key, shape, dtype="float32", **_):
    _check_key(key)
    dt = dtype_name(dtype)
    check_dtype("random", "dtype", dt, "float")
    return Spec(tuple(int(s) for s in shape), dt)


def _randint_infer(key, shape, low=0, high=2, dtype="int64"):
    _check_key(key)
    dt = dtype_name(dtype)
    check_dtype("random_randint", "dtype", dt, "int")
    if high <= low:
        raise OpError(f"randint: high ({high}) must be greater than low ({low})")
    info = np.iinfo(dt)
    if low < info.min or high - 1 > info.max:
        raise OpError(f"randint: [{low}, {high}) does not fit dtype {dt} "
                      f"([{info.min}, {info.max}])")
    return Spec(tuple(int(s) for s in shape), dt)


def _uniform_impl(xp, key, shape, low=0.0, high=1.0, dtype="float32"):
    n = math.prod(shape)
    u = uniform01(xp, key, n, 0, dtype if dtype == "float64" else "float32")
    out = (u * (high - low) + low).astype(dtype)
    # rounding to a narrow dtype (float16) can reach `high`: keep the interval half-open
    below = xp.asarray(np.nextafter(np.asarray(high, dtype), np.asarray(low, dtype)))
    return xp.minimum(out, below).reshape(shape)


# Box-Muller's transform with IEEE basic operations only, in a fixed order (normal_transform):
# log(1 - u1) by the exponent and atanh's series on [1/sqrt(2), sqrt(2)), cos(2 pi u2) by the
# quadrant and Taylor series of sin and cos on [0, pi/4] (truncation below 1e-17; rounding
# ~2 ulp). NumPy, the LLVM code and the CUDA C code (contraction off, as the GPU emulator
# builds it) compute the same bits, and the compiled loop vectorizes: libm's log1p and cos
# were scalar calls, ~46 ns an element, most of a compiled draw's time.
_ATANH = [1.0 / (2 * k + 1) for k in range(11)]  # log(m) = 2s (1 + s^2/3 + s^4/5 + ...)
_SIN = [(-1.0) ** k / math.factorial(2 * k + 1) for k in range(1, 9)]  # x^3 .. x^17
_COS = [(-1.0) ** k / math.factorial(2 * k) for k in range(1, 9)]  # x^2 .. x^16


def normal_transform(b, u1, u2):
    """``sqrt(-2 log(1 - u1)) * cos(2 pi u2)`` for float64 values u1, u2 in [0, 1), on a
    scalar builder ``b`` (compiler/codegen/scalar.py's protocol: NumPy arrays, LLVM IR or
    CUDA C)."""
    def c(v):
        return b.const(v, "float64")

    def horner(x, coeffs):  # coeffs[0] + x (coeffs[1] + x (...))
        acc = c(coeffs[-1])
        for a in reversed(coeffs[:-1]):
            acc = b.add(c(a), b.mul(x, acc))
        return acc
    # v = 1 - u1 in (0, 1] (exact) as m 2^e, m in [1/sqrt(2), sqrt(2)): exact scalings
    v, e = b.sub(c(1.0), u1), c(0.0)
    for k in (32, 16, 8, 4, 2, 1):  # v >= 2^-53: these bring it into [1/2, 1]
        low = b.cmp("lt", v, c(2.0 ** -k))
        v = b.select(low, b.mul(v, c(2.0 ** k)), v)
        e = b.select(low, b.sub(e, c(float(k))), e)
    low = b.cmp("lt", v, c(math.sqrt(0.5)))
    v = b.select(low, b.add(v, v), v)
    e = b.select(low, b.sub(e, c(1.0)), e)
    f = b.sub(v, c(1.0))  # exact (Sterbenz)
    s = b.div(f, b.add(c(2.0), f))
    log_v = b.add(b.mul(e, c(math.log(2.0))), b.mul(b.add(s, s), horner(b.mul(s, s), _ATANH)))
    r = b.sqrt(b.mul(c(-2.0), log_v))
    # cos(2 pi u2) = cos(pi/2 (q + g)): quadrant q, g in [0, 1); h = min(g, 1 - g) (exact)
    t = b.mul(u2, c(4.0))
    q = b.floor(t)
    g = b.sub(t, q)
    upper = b.cmp("gt", g, c(0.5))
    x = b.mul(b.select(upper, b.sub(c(1.0), g), g), c(math.pi / 2))  # in [0, pi/4]
    x2 = b.mul(x, x)
    sin_x = b.add(x, b.mul(b.mul(x, x2), horner(x2, _SIN)))
    cos_x = b.add(c(1.0), b.mul(x2, horner(x2, _COS)))
    cos_g = b.select(upper, sin_x, cos_x)  # cos(pi g / 2)
    sin_g = b.select(upper, cos_x, sin_x)  # sin(pi g / 2)
    quad = b.select(b.cmp("lt", q, c(2.0)), b.select(b.cmp("lt", q, c(1.0)), cos_g,
                                                      b.neg(sin_g)),
                    b.select(b.cmp("lt", q, c(3.0)), b.neg(cos_g), sin_g))
    return b.mul(r, quad)


def _normal_impl(xp, key, shape, loc=0.0, scale=1.0, dtype="float32"):
    n = math.prod(shape)
    work = "float64" if dtype == "float64" else "float32"
    # the draws at the output's precision, the transform in float64 (see _random_normal)
    u1 = uniform01(xp, key, n, 0, work).astype("float64")
    u2 = uniform01(xp, key, n, 1, work).astype("float64")
    if xp is np:  # the compiled code's transform, bit for bit
        from ..codegen.scalar import NumpyScalarBuilder, Typed  # noqa: PLC0415 - a cycle
        z = normal_transform(NumpyScalarBuilder(), Typed(u1, "float64"),
                             Typed(u2, "float64")).v
    else:  # a GPU's array module: its log1p and cos are one kernel each, where the series
        # would be ~60 launches; the same numbers to rounding (as GPU code is anyway: FMA)
        z = xp.sqrt(-2.0 * xp.log1p(-u1)) * xp.cos((2.0 * math.pi) * u2)
    return (z * scale + loc).astype(dtype).reshape(shape)


def _randint_impl(xp, key, shape, low=0, high=2, dtype="int64"):
    if high <= low:
        raise OpError(f"randint: high ({high}) must be greater than low ({low})")
    n = math.prod(shape)
    bits = random_bits(xp, key, n, 0)
    return (bits % xp.uint64(high - low)).astype("int64").__add__(low).astype(dtype).reshape(
        shape)


register("random_uniform", "source", infer=_rand_infer, impl=_uniform_impl, dtypes="float",
         attrs=("shape", "low", "high", "dtype"), doc="uniform in [low, high) at key")
register("random_normal", "source", infer=_rand_infer, impl=_normal_impl, dtypes="float",
         attrs=("shape", "loc", "scale", "dtype"), doc="normal(loc, scale) at key (Box-Muller)")
register("random_randint", "source", infer=_randint_infer, impl=_randint_impl, dtypes="int",
         attrs=("shape", "low", "high", "dtype"), doc="integers in [low, high) at key")
