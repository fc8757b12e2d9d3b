"""Compiled matmuls through the GPU's BLAS (compiler/codegen/cuda/matmul.py's ``Launch.blas``,
runtime/gpu/seam.py's ``gemm_strided``) on an emulated GPU, whose BLAS is NumPy's matmul on
the same device addresses: the row-major to column-major argument swap, transposed operands
folded into the product, batch strides (0 where an operand broadcasts) and float64 are all
checked against NumPy, and HYBRID_CUDA_BLAS=0 keeps the generated GEMM kernel.
"""
import numpy as np
import pytest

import hybrid as hb
from runtime import config
from runtime.gpu import emulated

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def blas_calls(monkeypatch):
    """The GemmSpecs the emulated GPU's BLAS was asked for."""
    calls = []
    real = emulated.EmulatedGPU.gemm_strided

    def spy(self, spec, a, b, c, stream=None):
        calls.append(spec)
        return real(self, spec, a, b, c, stream)

    monkeypatch.setattr(emulated.EmulatedGPU, "gemm_strided", spy)
    old = config.get("HYBRID_CUDA_BLAS")
    yield calls
    config.set_flag("HYBRID_CUDA_BLAS", old)


CASES = {  # name: (function, operand shapes)
    "plain": (lambda a, b: a @ b, ((5, 7), (7, 3))),
    "a transposed": (lambda a, b: a.T @ b, ((7, 5), (7, 3))),
    "b transposed": (lambda a, b: a @ b.T, ((5, 7), (3, 7))),
    "both transposed": (lambda a, b: a.T @ b.T, ((7, 5), (3, 7))),
    "batched": (lambda a, b: a @ b, ((4, 5, 7), (4, 7, 3))),
    "b broadcast": (lambda a, b: a @ b, ((4, 5, 7), (7, 3))),
    "a broadcast": (lambda a, b: a @ b, ((5, 7), (2, 7, 3))),
    "vector rows": (lambda a, b: a @ b, ((1, 64), (64, 33))),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_matmul_through_the_blas_equals_numpy(emulated_gpu, blas_calls, case, dtype):
    fn, shapes = CASES[case]
    rng = np.random.default_rng(len(case))
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    want = fn(a, b)
    got = {}
    for flag in (1, 0):
        config.set_flag("HYBRID_CUDA_BLAS", flag)
        f = hb.hybridize(lambda x, y: fn(x, y), backend="cuda")
        before = len(blas_calls)
        out = f(hb.array(a, dtype=dtype, device=emulated_gpu),
                hb.array(b, dtype=dtype, device=emulated_gpu))
        got[flag] = out.asnumpy()
        assert (len(blas_calls) > before) == bool(flag), (case, flag)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for flag in (1, 0):
        np.testing.assert_allclose(got[flag], want, rtol=tol, atol=tol)
        assert got[flag].dtype == want.dtype


def test_mixed_dtypes_keep_the_generated_kernel(emulated_gpu, blas_calls):
    """cuBLAS's sgemm/dgemm take one dtype throughout: an integer product stays a kernel."""
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    f = hb.hybridize(lambda x, y: x @ y, backend="cuda")
    out = f(hb.array(a, device=emulated_gpu), hb.array(a.T.copy(), device=emulated_gpu))
    np.testing.assert_array_equal(out.asnumpy(), a @ a.T)
    assert blas_calls == []


def test_training_step_through_the_blas_equals_the_generated_kernels(emulated_gpu, blas_calls):
    """A Dense net's forward, backward (transposed products) and update, both ways."""
    from hybrid import autograd, nn

    def train(flag):
        config.set_flag("HYBRID_CUDA_BLAS", flag)
        hb.random.seed(0)
        net = nn.HybridSequential()
        net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(3, in_units=16))
        net.initialize(hb.init.Xavier(), device=emulated_gpu)
        net.hybridize(backend="cuda")
        tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        rng = np.random.default_rng(1)
        for _ in range(3):
            x = hb.array(rng.standard_normal((6, 8)).astype(np.float32), device=emulated_gpu)
            with autograd.record():
                loss = (net(x) ** 2).sum()
            loss.backward()
            tr.step(6)
        return [p.data().asnumpy() for p in net.collect_params().values()]

    with_blas = train(1)
    assert blas_calls, "the BLAS was never asked"
    n = len(blas_calls)
    kernels = train(0)
    assert len(blas_calls) == n
    for p, q in zip(with_blas, kernels):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_convolutions_as_im2col_and_blas_train_as_on_the_cpu(emulated_gpu, blas_calls, dtype):
    """Convolutions (padded 3x3, strided, 1x1) run as im2col + GEMM on the GPU: forward,
    data and weight gradients each ask the BLAS for their product (the forward's batched
    over the images, the weight gradient's over groups of images where its output has few
    tiles: partial products summed after), and three training steps equal eager ones
    (NumPy's convolutions; the same initial weights), with the BLAS and with the generated
    GEMM alike."""
    from hybrid import autograd, nn

    def train(flag=1, hybridize=True):
        device = emulated_gpu
        config.set_flag("HYBRID_CUDA_BLAS", flag)
        hb.random.seed(0)
        net = nn.HybridSequential()
        net.add(nn.Conv2D(4, kernel_size=3, padding=1, in_channels=3, activation="relu"),
                nn.Conv2D(6, kernel_size=3, strides=2, padding=1, in_channels=4),
                nn.Conv2D(5, kernel_size=1, in_channels=6, activation="tanh"),
                nn.Dense(3))
        net.initialize(hb.init.Xavier(), device=device)
        net.cast(dtype)
        if hybridize:
            net.hybridize(backend="cuda")
        tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        rng = np.random.default_rng(1)
        for _ in range(3):
            x = hb.array(rng.standard_normal((4, 3, 9, 7)), dtype=dtype, device=device)
            with autograd.record():
                loss = (net(x) ** 2).sum()
            loss.backward()
            tr.step(4)
        return [p.data().asnumpy() for p in net.collect_params().values()]

    graphs = config.set_flag("HYBRID_CUDA_GRAPHS", 0)  # (a captured graph runs no BLAS)
    try:
        eager = train(hybridize=False)
        with_blas = train()
        kernels = train(0)
    finally:
        config.set_flag("HYBRID_CUDA_GRAPHS", graphs)
    products = {(s.m, s.n, s.k, s.batch) for s in blas_calls}
    assert (4, 9 * 7, 3 * 9, 4) in products, "the first convolution's forward"
    # the strided one's weight gradient: 6 x 36 has one tile, so four partial products,
    # one per image (each 5 * 4 positions deep), summed after
    assert (6, 3 * 3 * 4, 5 * 4, 4) in products, "the strided one's weight gradient"
    assert (3 * 3 * 4, 5 * 4, 6, 4) in products, "the strided one's data gradient"
    assert (6, 5 * 4, 5, 4) in products, "the 1x1 convolution's data gradient"
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for p, q, c in zip(with_blas, kernels, eager):
        np.testing.assert_allclose(p, c, **tol)
        np.testing.assert_allclose(q, c, **tol)
