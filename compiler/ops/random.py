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


def _normal_impl(xp, key, shape, loc=0.0, scale=1.0, dtype="float32"):
    n = math.prod(shape)
    work = "float64" if dtype == "float64" else "float32"
    # the draws at the output's precision, the transform in float64 (see _random_normal)
    u1 = uniform01(xp, key, n, 0, work).astype("float64")
    u2 = uniform01(xp, key, n, 1, work).astype("float64")
    r = xp.sqrt(-2.0 * xp.log1p(-u1))  # 1 - u1 is in (0, 1]: log is finite
    z = r * xp.cos((2.0 * math.pi) * u2)
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
