"""Gluon layers: outputs vs NumPy references, gradients vs finite differences (float64)."""
import math

import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, init, nn

RNG = np.random.default_rng(1234)


def rand(*shape, dtype="float64"):
    return RNG.standard_normal(shape).astype(dtype)


def build(layer, *inputs, dtype="float64", init_=None):
    layer.initialize(init_ or init.Normal(0.5))
    layer.cast(dtype)
    layer(*[hb.array(x, dtype=x.dtype) for x in inputs])  # finish deferred init
    return layer


def pdata(p):
    return p.data().asnumpy()


def check_grads(block, inputs, train=False, eps=1e-6, rtol=2e-4, atol=1e-7, int_inputs=()):
    """Directional finite differences of sum(block(*inputs) * P) for every parameter with a
    gradient and every float input, against autograd."""
    rng = np.random.default_rng(7)
    xs = [hb.array(x, dtype=x.dtype) for x in inputs]
    for i, x in enumerate(xs):
        if i not in int_inputs:
            x.attach_grad()
    with autograd.record(train_mode=train):
        out = block(*xs)
    proj = rng.standard_normal(out.shape)

    def f(values):
        with autograd.pause(train_mode=train):
            y = block(*values)
        return float((y.asnumpy() * proj).sum())

    with autograd.record(train_mode=train):
        out = block(*xs)
        s = (out * hb.array(proj, dtype=out.dtype)).sum()
    s.backward()
    checked = 0
    for name, p in block.collect_params().items():
        if p.grad_req == "null":
            continue
        g = p.grad().asnumpy()
        orig = pdata(p).copy()
        v = rng.standard_normal(orig.shape)
        p.set_data(hb.array(orig + eps * v, dtype=orig.dtype))
        fp = f([hb.array(x, dtype=x.dtype) for x in inputs])
        p.set_data(hb.array(orig - eps * v, dtype=orig.dtype))
        fm = f([hb.array(x, dtype=x.dtype) for x in inputs])
        p.set_data(hb.array(orig, dtype=orig.dtype))
        num = (fp - fm) / (2 * eps)
        ana = float((g * v).sum())
        assert num == pytest.approx(ana, rel=rtol, abs=atol), f"parameter {name}"
        checked += 1
    for i, x in enumerate(inputs):
        if i in int_inputs:
            continue
        g = xs[i].grad.asnumpy()
        v = rng.standard_normal(x.shape)
        args_p = [hb.array(a + eps * v if j == i else a, dtype=a.dtype)
                  for j, a in enumerate(inputs)]
        args_m = [hb.array(a - eps * v if j == i else a, dtype=a.dtype)
                  for j, a in enumerate(inputs)]
        num = (f(args_p) - f(args_m)) / (2 * eps)
        assert num == pytest.approx(float((g * v).sum()), rel=rtol, abs=atol), f"input {i}"
        checked += 1
    assert checked


# ------------------------------------------------------------------ NumPy references
def np_conv2d(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * stride[0]:i * stride[0] + dil[0] * (kh - 1) + 1:dil[0],
                           j * stride[1]:j * stride[1] + dil[1] * (kw - 1) + 1:dil[1]]
                out[:, oc, i, j] = (patch * w[oc]).sum(axis=(1, 2, 3))
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def np_pool(x, k, s, p, kind, count_include_pad=True):
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    ones = np.pad(np.ones((h, w)), ((p[0], p[0]), (p[1], p[1])))
    oh = (h + 2 * p[0] - k[0]) // s[0] + 1
    ow = (w + 2 * p[1] - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = k[0] * k[1] if count_include_pad else \
                    ones[i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum()
                out[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return out


ACTS = {"relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "tanh": np.tanh, "softrelu": lambda x: np.log1p(np.exp(x)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))}


# ------------------------------------------------------------------ Dense
@pytest.mark.parametrize("act", [None, "relu", "tanh"])
def test_dense_matches_numpy_and_grads(act):
    x = rand(4, 2, 3)
    layer = build(nn.Dense(5, activation=act), x)
    assert layer.weight.shape == (5, 6)
    ref = x.reshape(4, -1) @ pdata(layer.weight).T + pdata(layer.bias)
    ref = ACTS[act](ref) if act else ref
    np.testing.assert_allclose(layer(hb.array(x, dtype="float64")).asnumpy(), ref, rtol=1e-12)
    check_grads(layer, [x])


def test_dense_no_flatten_and_no_bias():
    x = rand(2, 3, 4)
    layer = build(nn.Dense(5, flatten=False, use_bias=False), x)
    assert layer.bias is None and list(layer.collect_params()) == ["weight"]
    out = layer(hb.array(x, dtype="float64")).asnumpy()
    np.testing.assert_allclose(out, x @ pdata(layer.weight).T, rtol=1e-12)
    check_grads(layer, [x])


def test_dense_wrong_input_size_after_init_is_clear():
    layer = nn.Dense(3, in_units=4)
    layer.initialize()
    with pytest.raises(ValueError, match=r"shape \(3, 4\).*needs \(3, 5\)"):
        layer(hb.zeros((2, 5)))


# ------------------------------------------------------------------ Conv2D
@pytest.mark.parametrize("kw", [
    dict(kernel_size=3),
    dict(kernel_size=(3, 2), strides=2, padding=1),
    dict(kernel_size=2, dilation=2, padding=(1, 0)),
    dict(kernel_size=3, groups=2, padding=1, use_bias=False),
])
def test_conv2d_matches_numpy_and_grads(kw):
    x = rand(2, 4, 6, 5)
    layer = build(nn.Conv2D(4, **kw), x)
    w = pdata(layer.weight)
    b = pdata(layer.bias) if layer.bias is not None else None
    k = layer._kernel
    ref = np_conv2d(x, w, b, layer._strides, layer._padding, layer._dilation, layer._groups)
    assert w.shape == (4, 4 // layer._groups) + k
    np.testing.assert_allclose(layer(hb.array(x, dtype="float64")).asnumpy(), ref, rtol=1e-10,
                               atol=1e-12)
    check_grads(layer, [x])


def test_conv2d_activation_and_layout_errors():
    with pytest.raises(ValueError, match="layout"):
        nn.Conv2D(2, 3, layout="NHWC")
    layer = nn.Conv2D(2, 3, activation="sigmoid")
    layer.initialize()
    out = layer(hb.ones((1, 1, 4, 4))).asnumpy()
    assert out.shape == (1, 2, 2, 2) and (out > 0).all() and (out < 1).all()
    with pytest.raises(ValueError, match="NCHW"):
        layer(hb.ones((4, 4)))


# ------------------------------------------------------------------ pooling
@pytest.mark.parametrize("cls,kind", [(nn.MaxPool2D, "max"), (nn.AvgPool2D, "avg")])
@pytest.mark.parametrize("kw", [dict(), dict(pool_size=3, strides=2, padding=1),
                                dict(pool_size=(2, 3), strides=(1, 2))])
def test_pooling_matches_numpy_and_grads(cls, kind, kw):
    x = rand(2, 3, 7, 6)
    layer = cls(**kw)
    out = layer(hb.array(x, dtype="float64")).asnumpy()
    k = layer._size
    ref = np_pool(x, k, layer._strides, layer._padding, kind)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    check_grads(_Wrap(layer), [x])


def test_avgpool_count_include_pad_false():
    x = rand(1, 2, 5, 5)
    layer = nn.AvgPool2D(3, 2, 1, count_include_pad=False)
    np.testing.assert_allclose(layer(hb.array(x, dtype="float64")).asnumpy(),
                               np_pool(x, (3, 3), (2, 2), (1, 1), "avg", False), rtol=1e-12)


def test_global_pools():
    x = rand(2, 3, 4, 5)
    a = nn.GlobalAvgPool2D()(hb.array(x, dtype="float64")).asnumpy()
    m = nn.GlobalMaxPool2D()(hb.array(x, dtype="float64")).asnumpy()
    np.testing.assert_allclose(a, x.mean(axis=(2, 3), keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(m, x.max(axis=(2, 3), keepdims=True), rtol=1e-12)
    check_grads(_Wrap(nn.GlobalAvgPool2D()), [x])
    check_grads(_Wrap(nn.GlobalMaxPool2D()), [x])


class _Wrap(nn.HybridBlock):
    """A parameter-free layer wrapped so check_grads sees a block."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args)


# ------------------------------------------------------------------ BatchNorm
def test_batchnorm_train_predict_and_running_stats():
    x = rand(6, 3, 2, 2) * 2 + 1
    bn = nn.BatchNorm(momentum=0.8)
    bn.initialize()
    bn.cast("float64")
    gamma = np.array([1.5, 0.5, 2.0])
    beta = np.array([0.1, -0.2, 0.3])
    bn.gamma.set_data(hb.array(gamma, dtype="float64"))
    bn.beta.set_data(hb.array(beta, dtype="float64"))
    xa = hb.array(x, dtype="float64")
    # predict mode before training: running stats are (0, 1)
    out = bn(xa).asnumpy()
    np.testing.assert_allclose(out, x / np.sqrt(1 + 1e-5) * gamma.reshape(1, 3, 1, 1)
                               + beta.reshape(1, 3, 1, 1), rtol=1e-12)
    mu = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    with autograd.record():
        out = bn(xa)
    ref = (x - mu.reshape(1, 3, 1, 1)) / np.sqrt(var.reshape(1, 3, 1, 1) + 1e-5) \
        * gamma.reshape(1, 3, 1, 1) + beta.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(out.asnumpy(), ref, rtol=1e-10)
    np.testing.assert_allclose(pdata(bn.running_mean), 0.2 * mu, rtol=1e-12)
    np.testing.assert_allclose(pdata(bn.running_var), 0.8 + 0.2 * var, rtol=1e-12)
    # predict mode uses the running statistics
    rm, rv = 0.2 * mu, 0.8 + 0.2 * var
    out = bn(xa).asnumpy()
    np.testing.assert_allclose(out, (x - rm.reshape(1, 3, 1, 1)) / np.sqrt(
        rv.reshape(1, 3, 1, 1) + 1e-5) * gamma.reshape(1, 3, 1, 1) + beta.reshape(1, 3, 1, 1),
        rtol=1e-10)
    assert bn.running_mean.grad_req == "null" and bn.running_var.grad_req == "null"
    assert "in_channels=3" in repr(bn)


def test_batchnorm_grads_train_and_predict():
    x = rand(4, 2, 3, 3)
    bn = build(nn.BatchNorm(), x)
    check_grads(bn, [x], train=True)
    check_grads(bn, [x], train=False)


def test_batchnorm_dense_axis_and_no_scale():
    x = rand(5, 4)
    bn = build(nn.BatchNorm(axis=-1, scale=False, center=False), x)
    assert bn.gamma.grad_req == "null" and bn.beta.grad_req == "null"
    with autograd.record():
        out = bn(hb.array(x, dtype="float64")).asnumpy()
    np.testing.assert_allclose(out, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), rtol=1e-10)


# ------------------------------------------------------------------ others
def test_layernorm():
    x = rand(3, 4, 5)
    ln = build(nn.LayerNorm(), x)
    g, b = pdata(ln.gamma), pdata(ln.beta)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(ln(hb.array(x, dtype="float64")).asnumpy(), ref, rtol=1e-10)
    check_grads(ln, [x])


@pytest.mark.parametrize("act", sorted(ACTS))
def test_activation(act):
    x = rand(3, 4)
    layer = nn.Activation(act)
    np.testing.assert_allclose(layer(hb.array(x, dtype="float64")).asnumpy(), ACTS[act](x),
                               rtol=1e-6, atol=1e-12)
    check_grads(_Wrap(layer), [x])
    assert repr(layer) == f"Activation({act})"


def test_activation_rejects_unknown():
    with pytest.raises(ValueError, match="activation must be one of"):
        nn.Activation("swishy")


def test_leaky_relu():
    x = rand(3, 4)
    out = nn.LeakyReLU(0.1)(hb.array(x, dtype="float64")).asnumpy()
    np.testing.assert_allclose(out, np.where(x > 0, x, 0.1 * x))
    check_grads(_Wrap(nn.LeakyReLU(0.1)), [x])


def test_flatten():
    x = rand(2, 3, 4)
    out = nn.Flatten()(hb.array(x, dtype="float64"))
    assert out.shape == (2, 12)
    np.testing.assert_array_equal(out.asnumpy(), x.reshape(2, 12))
    check_grads(_Wrap(nn.Flatten()), [x])


def test_dropout_train_and_predict():
    hb.random.seed(3)
    layer = nn.Dropout(0.25)
    x = hb.ones((200, 50), dtype="float64")
    np.testing.assert_array_equal(layer(x).asnumpy(), x.asnumpy())  # predict: identity
    x.attach_grad()
    with autograd.record():
        y = layer(x)
    y.backward()
    yv = y.asnumpy()
    kept = yv != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(yv[kept], 1 / 0.75)
    np.testing.assert_allclose(x.grad.asnumpy(), kept / 0.75)
    with pytest.raises(ValueError):
        nn.Dropout(1.0)


def test_embedding():
    emb = nn.Embedding(10, 4)
    emb.initialize()
    emb.cast("float64")
    idx = np.array([[1, 3], [3, 9]])
    out = emb(hb.array(idx, dtype="int32")).asnumpy()
    w = pdata(emb.weight)
    np.testing.assert_array_equal(out, w[idx])
    check_grads(emb, [idx], int_inputs=(0,))
    with autograd.record():
        s = emb(hb.array(idx, dtype="int64")).sum()
    s.backward()
    counts = np.bincount(idx.ravel(), minlength=10)[:, None] * np.ones((1, 4))
    np.testing.assert_allclose(emb.weight.grad().asnumpy(), counts)


def test_lambda_layers():
    x = rand(2, 3)
    assert np.allclose(nn.HybridLambda("tanh")(hb.array(x)).asnumpy(), np.tanh(x), atol=1e-6)
    assert np.allclose(nn.Lambda(lambda a: a * 2)(hb.array(x)).asnumpy(), 2 * x, atol=1e-6)
    f = nn.HybridLambda(lambda F, a: F.relu(a))  # Gluon 1.x style
    assert np.allclose(f(hb.array(x)).asnumpy(), np.maximum(x, 0), atol=1e-6)
    with pytest.raises(ValueError, match="no hybrid function"):
        nn.Lambda("not_a_function")


# ------------------------------------------------------------------ models
def test_lenet_shapes_params_and_grads():
    net = nn.models.lenet()
    net.initialize(init.Xavier())
    x = hb.random.uniform(size=(2, 1, 28, 28))
    assert net(x).shape == (2, 10)
    n = sum(int(np.prod(p.shape)) for p in net.collect_params().values())
    assert n == 61706  # the book's LeNet
    small = nn.HybridSequential()
    small.add(nn.Conv2D(2, 3, padding=1, activation="sigmoid"), nn.AvgPool2D(2, 2),
              nn.Dense(3, activation="sigmoid"), nn.Dense(2))
    check_grads(build(small, rand(2, 1, 6, 6)), [rand(2, 1, 6, 6)])


def test_resnet18_variant_and_mlp():
    net = nn.models.resnet18(10, width=4)
    net.initialize(init.Xavier())
    x = hb.random.uniform(size=(2, 1, 16, 16))
    with autograd.record():
        out = net(x)
    assert out.shape == (2, 10)
    out.backward()
    names = list(net.collect_params())
    assert names[0] == "0.weight" and "3.0.conv1.weight" in names and \
        "4.0.conv3.weight" in names and "3.0.conv3.weight" not in names
    assert "4.0.bn1.running_mean" in names
    m = nn.models.mlp((256, 128), 2)
    m.initialize()
    assert m(hb.zeros((1, 512))).shape == (1, 2)


# ------------------------------------------------------------------ hybridized
def test_layers_hybridized_match_eager_forward_grads_and_running_stats():
    """The layers trace (hybrid.tracing): same outputs, gradients and BatchNorm updates."""
    def make():
        hb.random.seed(21)
        net = nn.HybridSequential()
        net.add(nn.Conv2D(3, 3, padding=1, activation="relu"), nn.BatchNorm(),
                nn.MaxPool2D(2), nn.Flatten(), nn.Dense(5, activation="tanh"),
                nn.LayerNorm(), nn.Dense(2))
        net.initialize(init.Xavier())
        net(hb.zeros((1, 2, 6, 6)))  # deferred initialization draws now, for both nets alike
        net.cast("float64")
        return net

    x = hb.array(rand(4, 2, 6, 6), dtype="float64")
    eager, hyb = make(), make()
    hyb.hybridize(backend="reference")
    np.testing.assert_allclose(hyb(x).asnumpy(), eager(x).asnumpy(), rtol=1e-10)
    for net in (eager, hyb):
        with autograd.record():
            out = net(x)
            s = (out * out).sum()
        s.backward()
    for (k, p), q in zip(eager.collect_params().items(), hyb.collect_params().values()):
        np.testing.assert_allclose(q.data().asnumpy(), p.data().asnumpy(), rtol=1e-10,
                                   err_msg=k)
        if p.grad_req != "null":
            np.testing.assert_allclose(q.grad().asnumpy(), p.grad().asnumpy(), rtol=1e-8,
                                       atol=1e-12, err_msg=k)
    assert np.abs(hyb[1].running_mean.data().asnumpy()).sum() > 0
