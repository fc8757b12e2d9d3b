"""Batch-1 Dense layers run as generated vector loops (compiler/codegen/llvm/gemv.py):
every row-block and tail shape, both float dtypes, against NumPy, forward and backward."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, nn

from conftest import mismatches_in_threads

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


# --------------------------------------------------------------------- packed weights
def _packed_dense(k, n, dtype):
    net = nn.Dense(n, in_units=k, dtype=dtype)
    net.initialize()
    net.hybridize(backend="llvm")
    return net


def _states(net):
    from compiler.codegen.llvm.exec import NativeRun  # noqa: PLC0415
    entry = next(iter(net._cached.entries.values()))
    run = entry.exe.run
    assert isinstance(run, NativeRun)
    return [int(s[0]) for s in run._pack_states]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k,n", [(512, 256), (16, 8), (33, 9), (300, 260), (1024, 77)])
def test_packed_weights_give_the_same_bits_as_reading_in_place(k, n, dtype):
    """From a binding's second call the weights come from the packed copy: the same FMA
    chains in the same order, so every bit of the result is the same."""
    from compiler.codegen.llvm.gemv import PACK_READY, PACK_SEEN  # noqa: PLC0415
    net = _packed_dense(k, n, dtype)
    x = hb.random.normal(size=(1, k)).astype(dtype)
    in_place = net(x).asnumpy()  # the binding's first call: weights read in place
    assert _states(net) == [PACK_SEEN]
    packing = net(x).asnumpy()  # the second packs them, then reads the copy
    assert _states(net) == [PACK_READY]
    packed = net(x).asnumpy()
    np.testing.assert_array_equal(packing, in_place)
    np.testing.assert_array_equal(packed, in_place)
    w, b = net.weight.data().asnumpy(), net.bias.data().asnumpy()
    tol = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(packed, x.asnumpy() @ w.T + b, rtol=tol, atol=tol)


def test_new_weights_are_packed_again():
    """Every binding of new parameter arrays (set_data, an optimizer step, an in-place
    update) starts over: the next call reads the new weights, never a stale copy."""
    net = _packed_dense(64, 32, "float32")
    x = hb.random.normal(size=(1, 64))
    for _ in range(4):
        net(x).wait_to_read()
    w = net.weight.data()

    from compiler.codegen.llvm.gemv import PACK_READY  # noqa: PLC0415
    assert _states(net) == [PACK_READY]  # the old weights' copy is in use

    def check():
        for _ in range(3):  # in place, packing, packed
            ref = x.asnumpy() @ net.weight.data().asnumpy().T + net.bias.data().asnumpy()
            np.testing.assert_allclose(net(x).asnumpy(), ref, rtol=2e-5, atol=2e-5)
        assert _states(net) == [PACK_READY]
    net.weight.set_data(w * 2)
    check()
    net.weight.data()[:] = net.weight.data() - 1
    check()
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(1)
    check()


def test_arenas_without_a_binding_owner_never_use_a_packed_copy():
    """A program run with other parameters each call (run_program, a second thread's
    private arena) reads the weights in place: its arena's pack states stay zero."""
    from compiler.codegen.llvm import run_program  # noqa: PLC0415
    net = _packed_dense(64, 16, "float32")
    x = hb.random.normal(size=(1, 64))
    for _ in range(3):
        net(x).wait_to_read()
    entry = next(iter(net._cached.entries.values()))
    compiled = entry.exe.run.compiled
    rng = np.random.default_rng(0)
    xa = x.asnumpy()
    for _ in range(3):
        w = rng.standard_normal((16, 64)).astype(np.float32)
        b = rng.standard_normal(16).astype(np.float32)
        by_shape = {(16, 64): w, (16,): b}
        params = [by_shape[tuple(entry.graph.spec(p).shape)] for p in entry.graph.params]
        (out,) = run_program(compiled, [xa], params)
        np.testing.assert_allclose(out, xa @ w.T + b, rtol=2e-5, atol=2e-5)
    from compiler.codegen.llvm.gemv import pack_states  # noqa: PLC0415
    offsets = pack_states(compiled.program)
    assert offsets and not any(compiled.arena[o:o + 8].any() for o in offsets)
    want = [None, None]
    xs = [hb.random.normal(size=(1, 64)) for _ in range(2)]
    for k in range(2):
        want[k] = xs[k].asnumpy() @ net.weight.data().asnumpy().T + net.bias.data().asnumpy()
    # two threads: one of them runs in a private arena while the other holds the shared one
    bad = mismatches_in_threads(net, xs, want, 300, rtol=2e-5, atol=2e-5)
    assert bad == [0, 0]


# ------------------------------------------------------------------ thin products
@pytest.mark.parametrize("dtype,tol", [("float32", 3e-5), ("float64", 1e-12)])
# n below one vector (the classifier's 10 classes, 2, 1, 15); m and k with tails; (256, 256,
# 10) and (300, 128, 7) split their rows between the caller and the pool
@pytest.mark.parametrize("m,k,n", [(256, 256, 10), (64, 128, 2), (2, 1, 1), (3, 17, 15),
                                   (300, 128, 7), (5, 300, 9), (9, 16, 3)])
def test_thin_dense_matches_numpy_forward_and_backward(m, k, n, dtype, tol):
    """x @ W.T with fewer outputs than vector lanes runs as one GEMV per row of x
    (llvm/gemv.py: thin_applies)."""
    from compiler.codegen.extern_plan import vector_lanes  # noqa: PLC0415
    from compiler.codegen.llvm.gemv import thin_applies  # noqa: PLC0415
    # (where n fills a vector of this dtype on this host, the register-tiled GEMM or BLAS
    # runs it: the same check, another path)
    assert thin_applies(dtype, m, n, k, False, True) == (n < vector_lanes(dtype))
    net = nn.Dense(n, in_units=k, dtype=dtype)
    net.initialize()
    x = hb.random.normal(size=(m, k)).astype(dtype)
    w, bias = net.weight.data().asnumpy(), net.bias.data().asnumpy()
    net.hybridize(backend="llvm")
    for _ in range(2):
        out = net(x)
        np.testing.assert_allclose(out.asnumpy(), x.asnumpy() @ w.T + bias, rtol=tol,
                                   atol=tol)
    x.attach_grad()
    with autograd.record():
        y = net(x)
    y.backward(hb.ones((m, n), dtype=dtype))
    np.testing.assert_allclose(x.grad.asnumpy(), np.ones((m, n)) @ w, rtol=tol, atol=tol)
    np.testing.assert_allclose(net.weight.grad().asnumpy(), np.ones((n, m)) @ x.asnumpy(),
                               rtol=tol * 10, atol=tol * 10)
