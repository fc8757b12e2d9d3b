"""Random numbers, deterministic per seed and per device (hb.random.seed).

Draws are counter-based (compiler/ops/random.py): each call takes the next key of its
device's stream, so results do not depend on thread timing or on other devices' draws.
"""
from __future__ import annotations

import math
import numbers
import threading

import numpy as np

from compiler.ops.random import draw_key
from runtime.device import parse_device
from runtime.memory import Buffer

from . import _state
from .ndarray import NDArray, _from_numpy, apply, array

_lock = threading.Lock()
_seed = [np.random.SeedSequence().entropy % (1 << 62)]
_counters: dict = {}


def seed(seed_state: int, device=None):
    """Seed the streams (all devices, or just ``device``)."""
    with _lock:
        if device is None:
            _seed[0] = int(seed_state) % (1 << 62)
            _counters.clear()
        else:
            _counters[parse_device(device)] = int(seed_state) * 1_000_003 % (1 << 62)


def stream_state() -> dict:
    """Where every device's stream stands: a trace that is thrown away (a shape bucket that
    does not apply) puts it back with :func:`restore_stream`, so the draws it took are taken
    again by the trace that stays, where the eager program takes them."""
    with _lock:
        return dict(_counters)


def restore_stream(state: dict):
    with _lock:
        _counters.clear()
        _counters.update(state)


def next_key(device) -> int:
    """The next 62-bit key of ``device``'s stream."""
    device = parse_device(device)
    with _lock:
        n = _counters.get(device)
        if n is None:
            n = (_seed[0] * 6364136223846793005 + (device.index + 1) * 1442695040888963407
                 + (0 if device.kind == "cpu" else 7)) % (1 << 62)
        _counters[device] = (n + 0x9E3779B97F4A7C15) % (1 << 62)
    return draw_key(n)


def key_array(device) -> NDArray:
    """The key of one random op: the stream's next key, or inside a hybridized forward an
    input of the graph that every call fills with the stream's next key (never a constant
    baked into the graph, which would draw the same numbers at every call)."""
    if _state.tracing():
        from .tracing import random_key  # noqa: PLC0415 - tracing imports this module
        return random_key(device)
    return device_key(next_key(device), device)


def device_key(key: int, device) -> NDArray:
    """``key`` as the 0-d int64 array a random op reads on ``device``."""
    if device.kind == "gpu":
        # written by a fill kernel on the GPU's compute stream, the key its argument: an
        # upload would take a pinned buffer, a copy and a copy-stream sync on every draw
        # (most of an eager GPU draw's time); kernels queued after it see it in stream order
        with device.activate():
            return NDArray(Buffer(device.xp.full((), key, dtype=np.int64)), (), "int64",
                           device)
    # (array()'s intake checks are for user data: a key is a 62-bit int64 by construction)
    return _from_numpy(np.array(key, dtype=np.int64), device)


def _shape(size):
    if size is None:
        return ()
    return (size,) if isinstance(size, numbers.Integral) else tuple(size)


def uniform(low=0.0, high=1.0, size=None, dtype=None, device=None, ctx=None):
    # refused as NumPy refuses them, before a key is drawn: an infinite or NaN range
    # (np.random.uniform: OverflowError) and high < low (np.random.Generator.uniform)
    if not math.isfinite(float(high) - float(low)):  # (math: NumPy's scalar calls cost us)
        raise OverflowError(f"uniform: high - low must be finite, got low={low!r}, "
                            f"high={high!r} (NumPy: range exceeds valid bounds)")
    if float(high) < float(low):
        raise ValueError(f"uniform: high ({high!r}) < low ({low!r}); NumPy's Generator "
                         "refuses it (high - low < 0): swap them")
    device = parse_device(device or ctx)
    with device:
        return apply("random_uniform", (key_array(device),),
                     {"shape": _shape(size), "low": float(low), "high": float(high),
                      "dtype": dtype or "float32"})


def normal(loc=0.0, scale=1.0, size=None, dtype=None, device=None, ctx=None):
    if math.copysign(1.0, float(scale)) < 0 and not math.isnan(float(scale)):  # -0.0 too
        raise ValueError(f"normal: scale < 0 (got {scale!r}); the standard deviation must "
                         "be non-negative")
    device = parse_device(device or ctx)
    with device:
        return apply("random_normal", (key_array(device),),
                     {"shape": _shape(size), "loc": float(loc), "scale": float(scale),
                      "dtype": dtype or "float32"})


def rand(*size, dtype=None, device=None, ctx=None):
    """Uniform in [0, 1) of shape ``size`` (NumPy's and MXNet's ``rand(2, 5)``)."""
    return uniform(0.0, 1.0, size=size, dtype=dtype, device=device, ctx=ctx)


def randn(*size, dtype=None, device=None, ctx=None):
    """Standard normal of shape ``size`` (NumPy's and MXNet's ``randn(2, 5)``)."""
    return normal(0.0, 1.0, size=size, dtype=dtype, device=device, ctx=ctx)


def multinomial(n, pvals, size=None, device=None, ctx=None):
    """Counts of ``n`` draws among ``len(pvals)`` categories (int64, shape ``size + (k,)``),
    as NumPy's. Composed from registry ops: each draw is a uniform number placed among the
    cumulative probabilities, so it hybridizes and follows the seed like every other draw."""
    from .ndarray import cumsum, one_hot, sum as _sum  # noqa: PLC0415 - ndarray is loaded
    if int(n) < 0:
        raise ValueError(f"multinomial: n must be >= 0, got {n!r}")
    if not isinstance(pvals, NDArray):
        p = np.asarray(pvals, dtype=np.float64)
        if p.ndim != 1 or p.size == 0:
            raise ValueError(f"multinomial: pvals must be a non-empty 1-d sequence, got "
                             f"shape {p.shape}")
        if np.any(p < 0) or np.any(p > 1) or p[:-1].sum() > 1.0 + 1e-12:
            raise ValueError("multinomial: pvals must lie in [0, 1] and sum(pvals[:-1]) "
                             "must not exceed 1 (the last category takes the remainder)")
        pvals = p
    device = parse_device(device or ctx)
    k = len(pvals)
    cdf = cumsum(array(pvals, dtype="float64", device=device))[:-1]
    u = uniform(size=_shape(size) + (int(n),), dtype="float64", device=device)
    category = _sum(u.reshape(u.shape + (1,)) >= cdf, axis=-1)  # how many bounds u passed
    return _sum(one_hot(category, k, dtype="int64"), axis=-2)


def randint(low, high=None, size=None, dtype=None, device=None, ctx=None):
    if high is None:
        low, high = 0, low
    device = parse_device(device or ctx)
    with device:
        return apply("random_randint", (key_array(device),),
                     {"shape": _shape(size), "low": int(low), "high": int(high),
                      "dtype": dtype or "int64"})


def shuffle(x: NDArray) -> None:
    """Permute x along its first axis, in place (like numpy.random.shuffle)."""
    perm = permutation(x.shape[0], device=x.device)
    x._rebind(x[array(perm, dtype="int64", device=x.device)])


def permutation(n: int, device=None) -> np.ndarray:
    """A permutation of range(n) drawn from the stream (a NumPy array, for data loaders)."""
    return np.argsort(np.asarray(uniform(size=(n,), device=device, dtype="float64")),
                      kind="stable")

