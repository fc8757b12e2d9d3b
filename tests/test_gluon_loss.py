"""Losses vs NumPy references; label reshaping, weighting, numerical stability, gradients."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, loss

RNG = np.random.default_rng(5)


def f64(a):
    return hb.array(a, dtype="float64")


def log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def grad_check(lossfn, pred, label, eps=1e-6, **kw):
    p = f64(pred)
    p.attach_grad()
    with autograd.record():
        out = lossfn(p, label, **kw)
    out.backward()
    g = p.grad.asnumpy()
    v = RNG.standard_normal(pred.shape)
    fp = lossfn(f64(pred + eps * v), label, **kw).asnumpy().sum()
    fm = lossfn(f64(pred - eps * v), label, **kw).asnumpy().sum()
    assert (fp - fm) / (2 * eps) == pytest.approx(float((g * v).sum()), rel=1e-5, abs=1e-8)


def test_l2_loss_and_label_reshape():
    pred = RNG.standard_normal((5, 1))
    label = RNG.standard_normal(5)
    out = loss.L2Loss()(f64(pred), f64(label))
    assert out.shape == (5,)  # per sample, never a (5, 5) broadcast
    np.testing.assert_allclose(out.asnumpy(), 0.5 * (pred[:, 0] - label) ** 2, rtol=1e-12)
    pred = RNG.standard_normal((4, 3, 2))
    label = RNG.standard_normal((4, 6))
    out = loss.L2Loss(weight=2.0)(f64(pred), f64(label)).asnumpy()
    np.testing.assert_allclose(out, ((pred - label.reshape(4, 3, 2)) ** 2).mean(axis=(1, 2)),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="same number of elements"):
        loss.L2Loss()(f64(np.zeros((5, 1))), f64(np.zeros(4)))
    grad_check(loss.L2Loss(), pred, f64(label))


def test_l1_loss_sample_weight_and_batch_axis():
    pred = RNG.standard_normal((3, 4))
    label = RNG.standard_normal((3, 4))
    sw = RNG.uniform(size=(3, 1))
    out = loss.L1Loss()(f64(pred), f64(label), f64(sw)).asnumpy()
    np.testing.assert_allclose(out, (np.abs(pred - label) * sw).mean(axis=1), rtol=1e-12)
    out = loss.L1Loss(batch_axis=1)(f64(pred), f64(label)).asnumpy()
    np.testing.assert_allclose(out, np.abs(pred - label).mean(axis=0), rtol=1e-12)
    grad_check(loss.L1Loss(), pred, f64(label))


def test_softmax_cross_entropy_sparse_dense_and_logits():
    pred = RNG.standard_normal((6, 5))
    label = RNG.integers(0, 5, size=6)
    ref = -log_softmax(pred)[np.arange(6), label]
    L = loss.SoftmaxCrossEntropyLoss()
    for lab in (hb.array(label, dtype="int32"), hb.array(label, dtype="int64"),
                hb.array(label, dtype="float32"), hb.array(label.reshape(6, 1), dtype="int32")):
        np.testing.assert_allclose(L(f64(pred), lab).asnumpy(), ref, rtol=1e-12)
    dense = np.eye(5)[label] * 0.7 + 0.06
    out = loss.SoftmaxCrossEntropyLoss(sparse_label=False)(f64(pred), f64(dense)).asnumpy()
    np.testing.assert_allclose(out, -(log_softmax(pred) * dense).sum(axis=1), rtol=1e-12)
    lp = log_softmax(pred)
    out = loss.SoftmaxCrossEntropyLoss(from_logits=True)(f64(lp), hb.array(label)).asnumpy()
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    w = RNG.uniform(size=(6, 1))
    out = loss.SoftmaxCELoss(weight=3.0)(f64(pred), hb.array(label), f64(w)).asnumpy()
    np.testing.assert_allclose(out, 3.0 * ref * w[:, 0], rtol=1e-12)
    grad_check(L, pred, hb.array(label))
    with pytest.raises(ValueError, match="one class index per sample"):
        L(f64(pred), hb.array(np.zeros(5), dtype="int32"))


def test_softmax_cross_entropy_axis_and_stability():
    pred = RNG.standard_normal((2, 4, 3))
    label = RNG.integers(0, 4, size=(2, 3))
    out = loss.SoftmaxCrossEntropyLoss(axis=1)(f64(pred), hb.array(label)).asnumpy()
    lp = log_softmax(pred, axis=1)
    ref = -np.take_along_axis(lp, label[:, None, :], axis=1)[:, 0, :].mean(axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    big = hb.array([[1000.0, -1000.0, 0.0], [-5e4, 5e4, 0.0]])
    out = loss.SoftmaxCrossEntropyLoss()(big, hb.array([1, 1])).asnumpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [2000.0, 0.0], atol=1e-3)


def test_sigmoid_bce_logits_stable_and_from_sigmoid():
    pred = RNG.standard_normal((4, 3)) * 3
    label = RNG.integers(0, 2, size=(4, 3)).astype(float)
    ref = np.maximum(pred, 0) - pred * label + np.log1p(np.exp(-np.abs(pred)))
    out = loss.SigmoidBinaryCrossEntropyLoss()(f64(pred), f64(label)).asnumpy()
    np.testing.assert_allclose(out, ref.mean(axis=1), rtol=1e-12)
    p = 1 / (1 + np.exp(-pred))
    out = loss.SigmoidBCELoss(from_sigmoid=True)(f64(p), f64(label)).asnumpy()
    np.testing.assert_allclose(out, -(label * np.log(p + 1e-12) + (1 - label) *
                                      np.log(1 - p + 1e-12)).mean(axis=1), rtol=1e-9)
    huge = hb.array([[500.0, -500.0]])
    out = loss.SigmoidBCELoss()(huge, hb.array([[0.0, 1.0]])).asnumpy()
    np.testing.assert_allclose(out, [500.0], rtol=1e-6)
    pw = 2.5
    out = loss.SigmoidBCELoss()(f64(pred), f64(label), pos_weight=pw).asnumpy()
    sig = 1 / (1 + np.exp(-pred))
    np.testing.assert_allclose(out, -(pw * label * np.log(sig) + (1 - label) *
                                      np.log(1 - sig)).mean(axis=1), rtol=1e-9)
    grad_check(loss.SigmoidBCELoss(), pred, f64(label))


def test_huber_hinge_logistic_kl():
    pred = RNG.standard_normal((5, 2)) * 2
    label = RNG.standard_normal((5, 2))
    d = np.abs(label - pred)
    out = loss.HuberLoss(rho=0.7)(f64(pred), f64(label)).asnumpy()
    np.testing.assert_allclose(out, np.where(d > 0.7, d - 0.35, 0.5 / 0.7 * d ** 2).mean(1),
                               rtol=1e-12)
    grad_check(loss.HuberLoss(rho=0.7), pred, f64(label))
    sign = np.sign(label)
    out = loss.HingeLoss()(f64(pred), f64(sign)).asnumpy()
    np.testing.assert_allclose(out, np.maximum(0, 1 - pred * sign).mean(1), rtol=1e-12)
    out = loss.LogisticLoss()(f64(pred), f64(sign)).asnumpy()
    np.testing.assert_allclose(out, np.log1p(np.exp(-pred * sign)).mean(1), rtol=1e-12)
    q = np.exp(log_softmax(label))
    out = loss.KLDivLoss(from_logits=False)(f64(pred), f64(q)).asnumpy()
    np.testing.assert_allclose(out, (q * (np.log(q + 1e-12) - log_softmax(pred))).mean(1),
                               rtol=1e-9)


def test_losses_are_hybrid_blocks_without_params():
    for cls in (loss.L2Loss, loss.L1Loss, loss.SoftmaxCrossEntropyLoss, loss.HuberLoss,
                loss.SigmoidBinaryCrossEntropyLoss):
        L = cls()
        assert isinstance(L, hb.nn.HybridBlock) and not L.collect_params()


# ---------------------------------------------------------------- eager losses run compiled
from runtime import config  # noqa: E402


def _run(lossfn, pred, label, *extra, record=True):
    p = hb.array(pred)
    p.attach_grad()
    with autograd.record():
        out = lossfn(p, hb.array(label), *extra)
    out.backward()
    return out.asnumpy(), p.grad.asnumpy()


def _compiled(lossfn):
    state = lossfn.__dict__.get("_eager_fn")
    return state is not None and bool(state[1])


@pytest.mark.parametrize("make,label_of", [
    (lambda: loss.SoftmaxCrossEntropyLoss(), lambda r, p: r.integers(0, p.shape[1], p.shape[0])),
    (lambda: loss.SoftmaxCrossEntropyLoss(sparse_label=False, weight=0.5),
     lambda r, p: np.abs(r.standard_normal(p.shape)).astype(np.float32)),
    (lambda: loss.L2Loss(), lambda r, p: r.standard_normal(p.shape).astype(np.float32)),
    (lambda: loss.SigmoidBinaryCrossEntropyLoss(),
     lambda r, p: (r.random(p.shape) > 0.5).astype(np.float32)),
    (lambda: loss.HuberLoss(rho=0.5), lambda r, p: r.standard_normal(p.shape).astype(np.float32)),
])
def test_builtin_loss_called_eagerly_runs_compiled_in_a_loop(make, label_of, monkeypatch):
    """Values and gradients as op by op (HYBRID_EAGER_KERNELS=0), the first call op by op,
    later calls through one compiled function, a new batch size too (compiling from the
    second call here; a loop's 16th by default)."""
    monkeypatch.setattr(loss, "COMPILE_AFTER", 2)
    r = np.random.default_rng(1)
    old = config.get("HYBRID_EAGER_KERNELS")
    try:
        config.set_flag("HYBRID_EAGER_KERNELS", 0)
        plain = make()
        config.set_flag("HYBRID_EAGER_KERNELS", 1)
        fast = make()
        for batch in (6, 6, 6, 9):
            pred = r.standard_normal((batch, 4)).astype(np.float32)
            label = label_of(r, pred)
            config.set_flag("HYBRID_EAGER_KERNELS", 0)
            want = _run(plain, pred, label)
            config.set_flag("HYBRID_EAGER_KERNELS", 1)
            got = _run(fast, pred, label)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        assert _compiled(fast) and not _compiled(plain)
    finally:
        config.set_flag("HYBRID_EAGER_KERNELS", old)


def test_eager_loss_stays_op_by_op_where_compiling_could_change_what_runs(monkeypatch):
    """A user's subclass (its forward may print or branch), a hooked loss, keyword arguments:
    every call runs the Python (here where a plain loss compiles from its second call)."""
    monkeypatch.setattr(loss, "COMPILE_AFTER", 2)
    class Mine(loss.L2Loss):
        def forward(self, pred, label):
            seen.append(1)
            return super().forward(pred, label)

    seen = []
    x, y = hb.array(np.ones((2, 3), np.float32)), hb.array(np.zeros((2, 3), np.float32))
    mine = Mine()
    for _ in range(3):
        mine(x, y)
    assert len(seen) == 3 and not _compiled(mine)
    hooked = loss.L2Loss()
    calls = []
    hooked.register_forward_hook(lambda blk, args, out: calls.append(1))
    for _ in range(3):
        hooked(x, y)
    assert len(calls) == 3 and not _compiled(hooked)
    kw = loss.L2Loss()
    for _ in range(3):
        kw(x, y, sample_weight=hb.array(np.ones((2, 1), np.float32)))
    assert not _compiled(kw)


def test_a_loss_called_a_few_times_is_never_compiled():
    """Compiling costs ~0.5 s with an empty cache: a script's handful of calls runs op by op;
    a loop's COMPILE_AFTER-th call compiles."""
    lf = loss.L2Loss()
    x, y = hb.array(np.ones((2, 3), np.float32)), hb.array(np.zeros((2, 3), np.float32))
    for _ in range(loss.COMPILE_AFTER - 1):
        lf(x, y)
    assert not _compiled(lf)
    lf(x, y)
    assert _compiled(lf)


def test_eager_compiled_loss_follows_a_changed_setting_and_reports_errors(monkeypatch):
    monkeypatch.setattr(loss, "COMPILE_AFTER", 2)
    lf = loss.L2Loss()
    x, y = hb.array(np.ones((2, 3), np.float32)), hb.array(np.zeros((2, 3), np.float32))
    for _ in range(3):
        np.testing.assert_allclose(lf(x, y).asnumpy(), [0.5, 0.5])
    assert _compiled(lf)
    lf._weight = 4.0  # what the trace read: traced again
    np.testing.assert_allclose(lf(x, y).asnumpy(), [2.0, 2.0])
    with pytest.raises(ValueError, match="does not match the prediction"):
        lf(x, hb.array(np.zeros((2, 4), np.float32)))
    assert _compiled(lf)  # a user's error is no reason to stop compiling


def test_eager_compiled_loss_on_an_emulated_gpu(emulated_gpu, monkeypatch):
    monkeypatch.setattr(loss, "COMPILE_AFTER", 2)
    lf, r = loss.SoftmaxCrossEntropyLoss(), np.random.default_rng(2)
    pred = r.standard_normal((5, 3)).astype(np.float32)
    label = r.integers(0, 3, 5)
    want = _run(loss.SoftmaxCrossEntropyLoss(), pred, label)
    for _ in range(3):
        p = hb.array(pred, device=emulated_gpu)
        p.attach_grad()
        with autograd.record():
            out = lf(p, hb.array(label, device=emulated_gpu))
        out.backward()
        np.testing.assert_allclose(out.asnumpy(), want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p.grad.asnumpy(), want[1], rtol=1e-5, atol=1e-6)
    assert _compiled(lf)
