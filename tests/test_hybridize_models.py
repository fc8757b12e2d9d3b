"""Eager vs hybridized for the book's models: outputs, gradients and training steps."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, loss
from hybrid.nn import models

BACKENDS = ["reference", "llvm"]


def _build(name):
    hb.random.seed(7)
    if name == "mlp":
        net, shape = models.mlp(num_outputs=10), (4, 1, 28, 28)
    elif name == "lenet":
        net, shape = models.lenet(), (4, 1, 28, 28)
    else:
        net, shape = models.resnet18(num_classes=10), (2, 3, 16, 16)
    net.initialize(hb.init.Xavier())
    x = hb.random.normal(size=shape)
    net(x)  # finish deferred initialization eagerly
    return net, x


def _step(net, x, y):
    with autograd.record():
        out = net(x)
        l = loss.SoftmaxCrossEntropyLoss()(out, y)
    l.backward()
    params = net.collect_params()
    return out.asnumpy(), {k: p.grad().asnumpy() for k, p in params.items()
                           if p.grad_req != "null"}


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet18"])
def test_hybridized_outputs_and_gradients_equal_eager(name, backend):
    net, x = _build(name)
    y = hb.array(np.arange(x.shape[0]) % 10, dtype="int32")
    eager_pred = net(x).asnumpy()
    net.hybridize(backend=backend)
    hyb_pred = net(x).asnumpy()  # same parameters and running statistics as eager_pred
    net.hybridize(active=False)
    eager_out, eager_grads = _step(net, x, y)
    net.hybridize(backend=backend)
    hyb_out, hyb_grads = _step(net, x, y)
    np.testing.assert_allclose(hyb_pred, eager_pred, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hyb_out, eager_out, rtol=1e-5, atol=1e-5)
    assert set(hyb_grads) == set(eager_grads)
    for k in eager_grads:
        # float32 sums in a different order (vector partial sums vs NumPy's pairwise) through
        # up to 18 batch-norm layers: relative to each gradient's scale, 1e-3 for ResNet
        # (a conv bias feeding batch norm has an exactly-zero gradient: noise of ~1e-7)
        scale = max(float(np.abs(eager_grads[k]).max()), 1e-2)
        tol = 1e-3 if name == "resnet18" else 1e-4
        np.testing.assert_allclose(hyb_grads[k], eager_grads[k], rtol=tol, atol=tol * scale,
                                   err_msg=k)


def test_training_loop_hybridized_equals_eager(backend):
    results = []
    for hybridize in (False, True):
        net, x = _build("mlp")
        if hybridize:
            net.hybridize(backend=backend)
        y = hb.array(np.arange(4) % 10, dtype="int32")
        trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        for _ in range(5):
            with autograd.record():
                l = loss.SoftmaxCrossEntropyLoss()(net(x), y)
            l.backward()
            trainer.step(4)
        results.append({k: p.data().asnumpy() for k, p in net.collect_params().items()})
    for k in results[0]:
        np.testing.assert_allclose(results[1][k], results[0][k], rtol=1e-5, atol=1e-6)


def test_parameters_updated_by_trainer_are_seen_without_retracing(backend):
    net, x = _build("mlp")
    net.hybridize(backend=backend)
    before = net(x).asnumpy()
    for p in net.collect_params().values():
        p.data()[:] = p.data() * 0.5
    after = net(x).asnumpy()
    assert not np.allclose(before, after)
    assert len(net._cached.entries) == 1


def test_explain_shows_graph_kernels_and_memory(backend):
    net, x = _build("mlp")
    net.hybridize(backend=backend)
    text = hb.explain(net, x)
    assert "matmul" in text and "kernel" in text and "memory: arena" in text


def test_lenet_training_step_arena_at_most_half_of_naive(backend="reference"):
    from compiler.autodiff import split_joint
    from compiler.pipeline import run_passes
    net, x = _build("lenet")
    net.hybridize(backend=backend)
    y = hb.array(np.arange(4) % 10, dtype="int32")
    _step(net, x, y)
    entry = [e for e in net._cached.entries.values() if e.train][0]
    tg = next(iter(entry.train.values()))[0]
    naive = arena = 0
    for g in (tg.forward, tg.backward):
        out, _ = run_passes(g)
        naive += out.meta["memory"]["naive_bytes"]
        arena += out.meta["memory"]["arena_bytes"]
    assert arena <= 0.5 * naive, (arena, naive)


def test_gradients_only_for_what_needs_them(backend):
    """The batch needs no gradient unless attached: the backward then has one output per
    parameter; with x.attach_grad() it gains x's gradient, equal to eager."""
    net, x = _build("mlp")
    y = hb.array(np.arange(4) % 10, dtype="int32")
    net.hybridize(backend=backend)
    _step(net, x, y)
    entry = [e for e in net._cached.entries.values() if e.train][0]
    (needs, (tg, *_)), = entry.train.items()
    n_params = len(entry.params)
    assert needs == (False,) + (True,) * n_params
    assert len(tg.backward.outputs) == n_params
    x.attach_grad()
    with autograd.record():
        l = loss.SoftmaxCrossEntropyLoss()(net(x), y)
    l.backward()
    assert len(entry.train) == 2
    hybrid_grad = x.grad.asnumpy()
    eager, _ = _build("mlp")
    x2 = hb.array(x.asnumpy())
    x2.attach_grad()
    with autograd.record():
        l2 = loss.SoftmaxCrossEntropyLoss()(eager(x2), y)
    l2.backward()
    np.testing.assert_allclose(hybrid_grad, x2.grad.asnumpy(), rtol=1e-4, atol=1e-6)


def _digits_batches(n_steps, batch=32):
    from hybrid.data import vision
    train = vision.Digits(train=True, size=28)
    loader = hb.data.DataLoader(train, batch_size=batch, shuffle=False, last_batch="discard")
    out = []
    for X, y in loader:  # the images are float32: a DataLoader batch stays float32
        out.append((X, y))
        if len(out) == n_steps:
            return out
    return out


@pytest.mark.parametrize("input_dtype", ["float32", "float64"])
def test_float64_lenet_trains_alike_eager_and_hybridized(backend, input_dtype):
    """LeNet cast to float64, trained with hb.Trainer (SGD) on the digits, the batches as the
    DataLoader gives them (float32) or cast to float64: the hybridized losses equal eager's.
    Regression: with float32 batches and float64 weights, the LLVM backend's conv2d read the
    float64 weights as float32 (the loss was NaN from the first step)."""
    batches = _digits_batches(6)
    runs = []
    for hybridize in (False, True):
        hb.random.seed(0)
        net = models.lenet()
        net.initialize(hb.init.Xavier())
        net.cast("float64")  # before the first forward: deferred parameters become float64
        if hybridize:
            net.hybridize(backend=backend)
        trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.9})
        losses = []
        for X, y in batches:
            X = X.astype(input_dtype)
            with autograd.record():
                l = loss.SoftmaxCrossEntropyLoss()(net(X), y)
            l.backward()
            trainer.step(X.shape[0])
            losses.append(float(l.mean().asnumpy()))
        assert all(p.data().dtype == np.float64 for p in net.collect_params().values())
        runs.append(np.array(losses))
    eager, hybrid = runs
    assert np.isfinite(eager).all() and np.isfinite(hybrid).all(), (eager, hybrid)
    np.testing.assert_allclose(hybrid, eager, rtol=1e-9, atol=1e-9)


def test_cast_after_hybridize_recompiles(backend):
    """net.cast() after a hybridized call: the next call computes in the new dtype, as eager
    does (the compiled graph for the old dtype is dropped, as MXNet's cast does)."""
    net, x = _build("lenet")
    net.hybridize(backend=backend)
    assert net(x).dtype == np.float32
    net.cast("float64")
    hyb = net(x)
    net.hybridize(active=False)
    eager = net(x)
    assert eager.dtype == np.float64 and hyb.dtype == np.float64
    np.testing.assert_allclose(hyb.asnumpy(), eager.asnumpy(), rtol=1e-10, atol=1e-12)
