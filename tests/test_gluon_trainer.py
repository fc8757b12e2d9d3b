"""Trainer and optimizers vs NumPy implementations; lr schedules; multi-device gradient
summing; stale gradients; optimizer state checkpoints."""
import math

import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, init, lr_scheduler, nn, optimizer

RNG = np.random.default_rng(3)


# ------------------------------------------------------------------ NumPy references
def np_sgd(w, g, s, t, lr, momentum=0.0, wd=0.0, rescale=1.0, clip=None):
    g = g * rescale
    if clip:
        g = np.clip(g, -clip, clip)
    g = g + wd * w
    if momentum:
        s["m"] = momentum * s.get("m", 0) - lr * g
        return w + s["m"]
    return w - lr * g


def np_nag(w, g, s, t, lr, momentum=0.9, wd=0.0, rescale=1.0, clip=None):
    g = g * rescale + wd * w
    s["m"] = momentum * s.get("m", 0) - lr * g
    return w + momentum * s["m"] - lr * g


def np_adam(w, g, s, t, lr, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0.0, rescale=1.0,
            clip=None):
    g = g * rescale
    if clip:
        g = np.clip(g, -clip, clip)
    g = g + wd * w
    s["m"] = beta1 * s.get("m", 0) + (1 - beta1) * g
    s["v"] = beta2 * s.get("v", 0) + (1 - beta2) * g * g
    mhat = s["m"] / (1 - beta1 ** t)
    vhat = s["v"] / (1 - beta2 ** t)
    # MXNet folds the correction into the rate: epsilon is scaled by sqrt(1 - beta2^t)
    return w - lr * mhat / (np.sqrt(vhat) + epsilon / math.sqrt(1 - beta2 ** t))


def np_adamw(w, g, s, t, lr, beta1=0.9, beta2=0.999, epsilon=1e-6, wd=0.0, rescale=1.0,
             clip=None):
    g = g * rescale
    s["m"] = beta1 * s.get("m", 0) + (1 - beta1) * g
    s["v"] = beta2 * s.get("v", 0) + (1 - beta2) * g * g
    mhat = s["m"] / (1 - beta1 ** t)
    vhat = s["v"] / (1 - beta2 ** t)
    return w - lr * (mhat / (np.sqrt(vhat) + epsilon) + wd * w)


def np_rmsprop(w, g, s, t, lr, rho=0.9, momentum=0.9, epsilon=1e-8, centered=False, wd=0.0,
               rescale=1.0, clip=None):
    g = g * rescale + wd * w
    s["v"] = rho * s.get("v", 0) + (1 - rho) * g * g
    if not centered:
        return w - lr * g / (np.sqrt(s["v"]) + epsilon)
    s["mean"] = rho * s.get("mean", 0) + (1 - rho) * g
    s["mom"] = momentum * s.get("mom", 0) - lr * g / (np.sqrt(s["v"] - s["mean"] ** 2)
                                                    + epsilon)
    return w + s["mom"]


def np_adagrad(w, g, s, t, lr, epsilon=1e-6, wd=0.0, rescale=1.0, clip=None):
    g = g * rescale + wd * w
    s["h"] = s.get("h", 0) + g * g
    return w - lr * g / (np.sqrt(s["h"]) + epsilon)


CASES = [
    ("sgd", np_sgd, {"learning_rate": 0.1}),
    ("sgd", np_sgd, {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}),
    ("sgd", np_sgd, {"learning_rate": 0.05, "clip_gradient": 0.3, "wd": 0.1}),
    ("nag", np_nag, {"learning_rate": 0.1, "momentum": 0.8, "wd": 0.01}),
    ("adam", np_adam, {"learning_rate": 0.01}),
    ("adam", np_adam, {"learning_rate": 0.01, "wd": 0.01, "clip_gradient": 0.2}),
    ("adamw", np_adamw, {"learning_rate": 0.01, "wd": 0.05}),
    ("rmsprop", np_rmsprop, {"learning_rate": 0.01}),
    ("rmsprop", np_rmsprop, {"learning_rate": 0.01, "centered": True, "momentum": 0.5}),
    ("adagrad", np_adagrad, {"learning_rate": 0.1, "wd": 0.01}),
]


def _ref_kwargs(params):
    kw = dict(params)
    lr = kw.pop("learning_rate")
    if "clip_gradient" in kw:
        kw["clip"] = kw.pop("clip_gradient")
    return lr, kw


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
@pytest.mark.parametrize("name,ref,params", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_optimizer_matches_numpy(name, ref, params, fused):
    w0 = RNG.standard_normal((3, 4))
    p = nn.Parameter("weight", shape=(3, 4), dtype="float64")
    p.initialize(init.Constant(w0))
    trainer = hb.Trainer([p], name, dict(params, use_fused_step=fused))
    lr, kw = _ref_kwargs(params)
    w, state = w0.copy(), {}
    batch = 4
    for t in range(1, 6):
        g = RNG.standard_normal((3, 4))
        with autograd.record():
            out = (p.data() * hb.array(g, dtype="float64")).sum()
        out.backward()
        trainer.step(batch)
        w = ref(w, g, state, t, lr, rescale=1.0 / batch, **kw)
        np.testing.assert_allclose(p.data().asnumpy(), w, rtol=1e-10, atol=1e-12)
    # the fused path compiles one update (never re-traced as the step count grows)
    fns = trainer._fused._fns if trainer._fused is not None else {}
    assert len(fns) == (1 if fused else 0)
    assert all(len(f.cache.entries) == 1 for f in fns.values())


def test_unknown_optimizer_and_bad_params():
    p = nn.Parameter("weight", shape=(2,))
    with pytest.raises(ValueError, match="unknown optimizer"):
        hb.Trainer([p], "sgdd")
    with pytest.raises(TypeError):
        hb.Trainer([p], "sgd", {"learning_rat": 0.1})
    with pytest.raises(TypeError, match="dict"):
        hb.Trainer(p, "sgd")
    assert isinstance(optimizer.create("Adam"), optimizer.Adam)


# ------------------------------------------------------------------ schedules
def test_schedulers():
    f = lr_scheduler.FactorScheduler(step=10, factor=0.5, base_lr=1.0)
    assert [f(n) for n in (0, 1, 10, 11, 20, 21, 31)] == [1, 1, 1, 0.5, 0.5, 0.25, 0.125]
    f = lr_scheduler.FactorScheduler(step=1, factor=0.1, base_lr=1.0, stop_factor_lr=1e-3)
    assert f(100) == 1e-3
    m = lr_scheduler.MultiFactorScheduler(step=[5, 8], factor=0.1, base_lr=1.0)
    assert [m(n) for n in (5, 6, 8, 9)] == pytest.approx([1, 0.1, 0.1, 0.01])
    c = lr_scheduler.CosineScheduler(max_update=20, base_lr=1.0, final_lr=0.1,
                                     warmup_steps=5, warmup_begin_lr=0.0)
    assert c(0) == 0 and c(1) == pytest.approx(0.2) and c(5) == pytest.approx(1.0)
    assert c(20) == pytest.approx(0.1) and c(100) == 0.1
    assert c(12.5) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)
    p = lr_scheduler.PolyScheduler(max_update=10, base_lr=1.0, pwr=2)
    assert p(5) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        lr_scheduler.CosineScheduler(max_update=5, warmup_steps=5)


def test_trainer_with_scheduler_and_learning_rate():
    p = nn.Parameter("weight", shape=(2,), dtype="float64")
    p.initialize(init.Zero())
    sched = lr_scheduler.FactorScheduler(step=2, factor=0.5)
    tr = hb.Trainer([p], "sgd", {"learning_rate": 1.0, "lr_scheduler": sched})
    deltas = []
    for _ in range(5):
        before = p.data().asnumpy()
        with autograd.record():
            s = p.data().sum()
        s.backward()
        tr.step(1)
        deltas.append(float(before[0] - p.data().asnumpy()[0]))
    assert deltas == pytest.approx([1, 1, 0.5, 0.5, 0.25])
    with pytest.raises(RuntimeError, match="lr_scheduler"):
        tr.set_learning_rate(0.1)
    q = nn.Parameter("weight", shape=(2,))
    q.initialize()
    tr2 = hb.Trainer([q], "sgd", {"learning_rate": 0.3})
    assert tr2.learning_rate == 0.3
    tr2.set_learning_rate(0.05)
    assert tr2.learning_rate == 0.05


# ------------------------------------------------------------------ devices and staleness
def test_multi_device_trainer_sums_gradients():
    devs = [hb.cpu(0), hb.cpu(1)]
    net = nn.Dense(3, in_units=4)
    net.initialize(init.Xavier(), device=devs)
    net.cast("float64")
    ref = nn.Dense(3, in_units=4)
    ref.initialize(device=hb.cpu(0))
    ref.cast("float64")
    ref.weight.set_data(net.weight.data(hb.cpu(0)))
    ref.bias.set_data(net.bias.data(hb.cpu(0)))
    tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    tr_ref = hb.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for step in range(3):
        x = RNG.standard_normal((8, 4))
        y = RNG.standard_normal((8, 3))
        shards = [(x[:4], y[:4]), (x[4:], y[4:])]
        losses = []
        with autograd.record():
            for d, (xs, ys) in zip(devs, shards):
                out = net(hb.array(xs, dtype="float64", device=d))
                # hb.square, not ** 2: the pow gradient puts its scalar exponent on cpu(0)
                losses.append(hb.square(out - hb.array(ys, dtype="float64", device=d)).sum())
        for l in losses:
            l.backward()
        if step == 0:
            tr.allreduce_grads()  # the split form: allreduce, then update
            g0, g1 = net.weight.list_grad()
            np.testing.assert_array_equal(g0.asnumpy(), g1.asnumpy())
            tr.update(8)
        else:
            tr.step(8)
        with autograd.record():
            l_ref = hb.square(ref(hb.array(x, dtype="float64")) -
                              hb.array(y, dtype="float64")).sum()
        l_ref.backward()
        tr_ref.step(8)
        for p, q in zip(net.collect_params().values(), ref.collect_params().values()):
            a, b = p.list_data()
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
            np.testing.assert_allclose(a.asnumpy(), q.data().asnumpy(), rtol=1e-12)


def test_stale_gradient_detection():
    net = nn.HybridSequential()
    net.add(nn.Dense(2, in_units=2), nn.Dense(2, in_units=2))
    net.initialize()
    tr = hb.Trainer(net.collect_params(), "sgd")
    with pytest.raises(hb.trainer.StaleGradientError, match="0.weight"):
        tr.step(1)  # no backward yet
    with autograd.record():
        y = net[0](hb.ones((1, 2))).sum()  # layer 1 unused
    y.backward()
    with pytest.raises(hb.trainer.StaleGradientError, match="1.weight"):
        tr.step(1)
    w1 = net[1].weight.data().asnumpy()
    w0 = net[0].weight.data().asnumpy()
    with autograd.record():
        y = net[0](hb.ones((1, 2))).sum()
    y.backward()
    tr.step(1, ignore_stale_grad=True)
    np.testing.assert_array_equal(net[1].weight.data().asnumpy(), w1)
    assert not np.array_equal(net[0].weight.data().asnumpy(), w0)


# ------------------------------------------------------------------ states
def _train(net, tr, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = hb.array(rng.standard_normal((4, 3)), dtype="float64")
        with autograd.record():
            l = (net(x) ** 2).sum()
        l.backward()
        tr.step(4)


@pytest.mark.parametrize("name", ["adam", "sgd", "rmsprop"])
def test_save_load_states_resumes_exactly(tmp_path, name):
    params = {"learning_rate": 0.01, "momentum": 0.9} if name == "sgd" else \
        {"learning_rate": 0.01}

    def make():
        net = nn.Dense(2, in_units=3)
        net.initialize(init.Constant(0.3))
        net.cast("float64")
        return net, hb.Trainer(net.collect_params(), name, params)

    a, ta = make()
    _train(a, ta, 3, 0)
    ta.save_states(tmp_path / "t.states")
    a.save_parameters(tmp_path / "p.safetensors")
    _train(a, ta, 2, 1)
    b, tb = make()
    b.load_parameters(tmp_path / "p.safetensors")
    tb.load_states(tmp_path / "t.states")
    assert tb.optimizer.num_update == 3
    _train(b, tb, 2, 1)
    for p, q in zip(a.collect_params().values(), b.collect_params().values()):
        np.testing.assert_array_equal(p.data().asnumpy(), q.data().asnumpy())
    c, tc = make()
    _train(c, tc, 1, 0)
    with pytest.raises(ValueError, match="optimizer 'adam'|optimizer 'sgd'|optimizer 'rmsprop'"):
        other = "sgd" if name != "sgd" else "adam"
        hb.Trainer(c.collect_params(), other).load_states(tmp_path / "t.states")
    with open(tmp_path / "t.states", "rb") as f:
        assert b"pickle" not in f.read()


@pytest.mark.parametrize("opt,params", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}),
    ("adam", {"learning_rate": 0.01}),
])
def test_fused_step_matches_eager_across_devices_and_a_schedule(opt, params):
    """The compiled update equals the eager one for a float32 network whose parameters live
    on two devices, while a schedule changes the rate every step (no re-trace)."""
    devices = [hb.cpu(0), hb.cpu(1)]
    x = hb.random.normal(size=(8, 5))
    y = hb.array(np.arange(8) % 3, dtype="int32")
    results = []
    for fused in (False, True):
        hb.random.seed(3)
        net = nn.HybridSequential()
        net.add(nn.Dense(6, activation="relu"), nn.Dense(3))
        net.initialize(init.Xavier(), device=devices)
        sched = lr_scheduler.FactorScheduler(step=1, factor=0.9)
        trainer = hb.Trainer(net.collect_params(), opt,
                             dict(params, lr_scheduler=sched, use_fused_step=fused))
        loss_fn = hb.loss.SoftmaxCrossEntropyLoss()
        for _ in range(6):
            with autograd.record():
                losses = [loss_fn(net(xs), ys) for xs, ys in
                          zip(hb.split_and_load(x, devices), hb.split_and_load(y, devices))]
            for l in losses:
                l.backward()
            trainer.step(8)
        results.append({k: [d.asnumpy() for d in p.list_data()]
                        for k, p in net.collect_params().items()})
        if fused:
            (fn,) = trainer._fused._fns.values()
            assert len(fn.cache.entries) == 2  # one per device, traced once each
    for k in results[0]:
        for a, b in zip(results[0][k], results[1][k]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=k)


def test_an_optimizer_with_its_own_update_is_never_fused():
    """A subclass that overrides update() (to log, to freeze a parameter) keeps its logic:
    the fused path only runs optimizers whose whole step is the built-in one."""
    calls = []

    class Frozen(optimizer.SGD):
        def update(self, index, weights, grads, states):
            calls.append(index)  # freezes every parameter: no update at all

    p = nn.Parameter("weight", shape=(3,), dtype="float32")
    p.initialize(init.Constant(np.ones(3)))
    opt = Frozen(learning_rate=0.5)
    assert not opt.fusable()
    trainer = hb.Trainer([p], opt)
    with autograd.record():
        l = (p.data() * 2).sum()
    l.backward()
    trainer.step(1)
    assert calls == [0]
    np.testing.assert_array_equal(p.data().asnumpy(), np.ones(3))
