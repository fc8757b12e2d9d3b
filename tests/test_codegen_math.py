"""Accuracy of the vectorized float32 math (llvm/scalar.py: F32Math) in ulp vs float64 references.

float32 exp/log/tanh/erf/sin/cos are polynomial approximations (LLVM's intrinsics would
become scalar libm calls); here they are measured over wide samples of each function's
domain. sin/cos use NumPy's own float32 algorithm, so they must equal NumPy bit for bit
where NumPy vectorizes (|x| <= 71476).
"""
import functools

import numpy as np
import pytest

from compiler.codegen.testing import CaseProgram

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def erf64(x):
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:
        import math
        return np.vectorize(math.erf)(x)


R = np.random.default_rng(0)


def signed_log_uniform(lo, hi, n):
    mag = np.exp(R.uniform(np.log(lo), np.log(hi), n))
    return (mag * R.choice([-1.0, 1.0], n)).astype(np.float32)


N = 150_000
DOMAINS = {
    "exp": lambda: np.concatenate([R.uniform(-104, 89, N), signed_log_uniform(1e-8, 80, N)]),
    "log": lambda: np.concatenate([np.abs(signed_log_uniform(1e-45, 3e38, N)),
                                   R.uniform(0.5, 2.0, N)]),
    "tanh": lambda: np.concatenate([signed_log_uniform(1e-10, 20, N), R.uniform(-1, 1, N)]),
    "erf": lambda: np.concatenate([signed_log_uniform(1e-10, 6, N), R.uniform(-4.5, 4.5, N)]),
    "sin": lambda: np.concatenate([signed_log_uniform(1e-10, 7e4, N),
                                   signed_log_uniform(7e4, 3e38, N // 3)]),
    "cos": lambda: np.concatenate([signed_log_uniform(1e-10, 7e4, N),
                                   signed_log_uniform(7e4, 3e38, N // 3)]),
    "sigmoid": lambda: R.uniform(-30, 30, N),
}
REF = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": erf64, "sin": np.sin,
       "cos": np.cos, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}
MAX_ULP = {"exp": 1.0, "log": 1.0, "tanh": 1.5, "erf": 1.5, "sin": 1.5, "cos": 1.5,
           "sigmoid": 3.0}


@functools.lru_cache(maxsize=None)
def results():
    cases = CaseProgram()
    for op, make in DOMAINS.items():
        cases.elementwise(op, [make().astype(np.float32)])
    return {c.op: (c.args[0], got, want) for c, got, want in cases.run()}


@pytest.mark.parametrize("op", list(DOMAINS))
def test_float32_ulp_error(op):
    x, got, numpy_got = results()[op]
    ref = REF[op](x.astype(np.float64))
    ok = np.isfinite(ref) & (np.abs(ref) < 3.4e38) & (np.abs(ref) > 1.2e-38)
    spacing = np.spacing(np.abs(ref[ok]).astype(np.float32)).astype(np.float64)
    ulp = np.abs(got[ok].astype(np.float64) - ref[ok]) / spacing
    assert ulp.max() <= MAX_ULP[op], (op, ulp.max(), x[ok][np.argmax(ulp)])
    if op in ("sin", "cos"):
        inside = np.abs(x) <= 71476.0625
        np.testing.assert_array_equal(got[inside], numpy_got[inside])


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38,
                  88.72, 88.73, -87.3, -103.9, -104.5], np.float32)
    cases = CaseProgram()
    for op in ("exp", "log", "tanh", "erf", "sin", "cos", "sigmoid"):
        cases.elementwise(op, [x])
    for c, got, want in cases.run():
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=c.op)
        m = ~np.isnan(want)
        np.testing.assert_allclose(got[m], want[m], rtol=2e-6, atol=1e-38, err_msg=c.op)
        zero = m & (want == 0)
        np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]),
                                      err_msg=f"{c.op}: sign of zero")
