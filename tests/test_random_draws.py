"""The counter-based generator's transforms (compiler/ops/random.py): the normal draw's
Box-Muller transform with basic IEEE operations only, against libm's log1p and cos; the same
bits from NumPy, LLVM and the reference backend; uniform draws stay in [low, high) compiled
as eagerly."""
import math

import numpy as np
import pytest

import hybrid as hb
from compiler.codegen.scalar import NumpyScalarBuilder, Typed
from compiler.ops.random import _normal_impl, normal_transform, uniform01
from hybrid import nn


def _transform(u1, u2):
    return normal_transform(NumpyScalarBuilder(), Typed(np.asarray(u1, np.float64), "float64"),
                            Typed(np.asarray(u2, np.float64), "float64")).v


def _libm(u1, u2):
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos((2.0 * math.pi) * u2)


@pytest.mark.parametrize("work", ["float32", "float64"])
def test_the_transform_is_libms_to_a_few_ulps_and_draws_a_standard_normal(work):
    key, n = np.int64(987654321), 1 << 20
    u1 = uniform01(np, key, n, 0, work).astype(np.float64)
    u2 = uniform01(np, key, n, 1, work).astype(np.float64)
    z, ref = _transform(u1, u2), _libm(u1, u2)
    # absolute error ~ the radius (up to ~8.6) times a few ulps of 1: the quadrant reduction
    # is exact, the series' truncation below 1e-17
    assert np.max(np.abs(z - ref)) < 4e-15
    assert np.mean(z.astype(np.float32) == ref.astype(np.float32)) > 0.99999
    assert abs(z.mean()) < 0.005 and abs(z.std() - 1.0) < 0.005
    assert abs(np.mean(z ** 4) - 3.0) < 0.03  # kurtosis: tails drawn as often as they should


def test_the_transform_at_the_ends_of_its_domain():
    ends = [0.0, 2.0 ** -53, 2.0 ** -24, 0.125, 0.25, 0.5, 0.75, 1 - 2.0 ** -24, 1 - 2.0 ** -53]
    u1, u2 = np.meshgrid(ends, ends)
    u1, u2 = u1.ravel(), u2.ravel()
    z = _transform(u1, u2)
    ref = np.array([math.sqrt(-2.0 * math.log1p(-a)) * math.cos(2 * math.pi * b)
                    for a, b in zip(u1, u2)])
    np.testing.assert_allclose(z, ref, rtol=0, atol=4e-15)
    assert np.all(z[u1 == 0.0] == 0.0)  # radius 0: exactly 0, as libm's formula gives
    # exact zeros of the cosine where libm's rounded 2 pi u2 gives ~1e-16
    assert np.all(z[(u2 == 0.25) | (u2 == 0.75)] == 0.0)


def test_a_gpu_array_module_keeps_libms_functions_and_agrees_to_rounding():
    """On a GPU (an array module that is not NumPy) the eager draw calls the module's log1p
    and cos (one kernel each) instead of ~60 basic-op launches: the same numbers to a few
    ulps of float64, identical in float32 all but never."""
    class NotNumpy:
        def __getattr__(self, name):
            return getattr(np, name)
    key = np.int64(42)
    gpu = _normal_impl(NotNumpy(), key, (300, 300), dtype="float64")
    cpu = _normal_impl(np, key, (300, 300), dtype="float64")
    np.testing.assert_allclose(gpu, cpu, rtol=0, atol=4e-15)
    assert not np.array_equal(gpu, cpu)  # (it did take the other path)


@pytest.mark.parametrize("dtype,low,high", [("float16", -3.0, 5.0),
                                            ("float32", 1.0, 1.0 + 2.0 ** -10)])
@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_hybridized_uniform_draws_stay_below_high_as_eagerly(dtype, low, high, backend):
    """Rounding to the dtype reaches `high` for these ranges: eager draws are clamped below
    it (NumPy's Generator's [low, high)), and so are compiled ones: the same numbers."""
    class Draw(nn.HybridBlock):
        def forward(self, x):
            return x + hb.random.uniform(low, high, size=(64, 64), dtype=dtype)
    net = Draw()
    x = hb.zeros((64, 64), dtype=dtype)
    hb.random.seed(0)
    eager = [net(x).asnumpy() for _ in range(3)]
    net.hybridize(backend=backend)
    hb.random.seed(0)
    compiled = [net(x).asnumpy() for _ in range(3)]
    for e, c in zip(eager, compiled):
        np.testing.assert_array_equal(c, e)
        assert c.max() < np.asarray(high, dtype) and c.min() >= low


def test_consecutive_draws_share_no_random_bits():
    """A draw's values are a hash of key + element offset along one Weyl sequence: keys that
    stepped along that sequence too made later draws repeat earlier ones' values (a uniform
    draw four draws after another repeated its values). Scrambled keys share none."""
    from compiler.ops.random import random_bits
    hb.random.seed(3)
    bits = [random_bits(np, hb.random.next_key(hb.cpu()), 512, stream)
            for _ in range(64) for stream in (0, 1)]
    allbits = np.concatenate(bits)
    assert np.unique(allbits).size == allbits.size


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_loop_of_draws_repeats_no_value(hybridize):
    """The user's view of the same: float64 draws in a loop, eager or from a hybridized
    block (its keys come from the same stream), never repeat a value."""
    class Draw(nn.HybridBlock):
        def forward(self, x):
            return hb.np.random.uniform(size=(4, 6), dtype="float64") + x * 0

    net = Draw()
    if hybridize:
        net.hybridize()
    hb.random.seed(7)
    x = hb.np.zeros((4, 6), dtype="float64")
    seen = np.concatenate([net(x).asnumpy().ravel() for _ in range(40)] +
                          [hb.np.random.normal(size=7, dtype="float64").asnumpy()
                           for _ in range(40)])
    assert np.unique(seen).size == seen.size
