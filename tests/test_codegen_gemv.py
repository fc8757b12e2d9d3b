"""Batch-1 Dense layers run as generated vector loops (compiler/codegen/llvm_gemv.py):
every row-block and tail shape, both float dtypes, against NumPy, forward and backward."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, nn

pytest.importorskip("llvmlite")


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("float64", 1e-12)])
# (512, 257), (1024, 77), (300, 260): split into chunks of row blocks (>= GEMV_PARALLEL_MIN
# weights) with a tail of rows and of columns for the last chunk
@pytest.mark.parametrize("k,n", [(512, 256), (1, 1), (7, 3), (8, 4), (13, 5), (33, 9),
                                 (16, 17), (3, 130), (512, 257), (1024, 77), (300, 260)])
def test_batch1_dense_matches_numpy(k, n, dtype, tol):
    net = nn.Dense(n, in_units=k, dtype=dtype)
    net.initialize()
    x = hb.random.normal(size=(1, k)).astype(dtype)
    w, bias = net.weight.data().asnumpy(), net.bias.data().asnumpy()
    net.hybridize(backend="llvm")
    out = net(x)
    np.testing.assert_allclose(out.asnumpy(), x.asnumpy() @ w.T + bias, rtol=tol, atol=tol)
    x.attach_grad()
    with autograd.record():
        y = net(x)
    y.backward(hb.ones((1, n), dtype=dtype))
    np.testing.assert_allclose(x.grad.asnumpy(), np.ones((1, n)) @ w, rtol=tol, atol=tol)


def test_gemv_rows_propagates_nan_and_inf():
    net = nn.Dense(5, in_units=9)
    net.initialize()
    x = np.ones((1, 9), np.float32)
    x[0, 3] = np.nan
    x[0, 8] = np.inf  # in the scalar tail (9 = one vector of 8 + 1)
    net.hybridize(backend="llvm")
    out = net(hb.array(x)).asnumpy()
    w = net.weight.data().asnumpy()
    ref = x @ w.T + net.bias.data().asnumpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
