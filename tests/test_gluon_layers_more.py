"""The layers of the book's chapters 5-11 that issue 25 adds (deliverable 2): each against a
NumPy reference, eagerly and hybridized, and its gradient where a composition could get it
wrong. They are composed from registry ops (compiler/ops/composite_nn.py), so the op matrix
(tests/test_ops.py) covers the primitives underneath."""
import itertools

import numpy
import pytest

import hybrid as hb
from hybrid import autograd, nn, npx

RNG = numpy.random.default_rng(25)


def close(a, b, rtol=1e-5, atol=1e-5):
    numpy.testing.assert_allclose(numpy.asarray(a), numpy.asarray(b), rtol=rtol, atol=atol)


def eager_and_hybridized(block, *xs):
    """The block's output eagerly and hybridized (they must agree); returns the eager one."""
    args = [hb.array(x) if isinstance(x, numpy.ndarray) else x for x in xs]
    eager = block(*args)
    block.hybridize()
    close(block(*args), eager)
    block.hybridize(active=False)
    return eager.asnumpy()


# --------------------------------------------------------------------- references
def conv_ref(x, w, stride, pad, dilation, groups):
    """Cross-correlation of (N, C, *S) with (O, C/g, *K), any rank, by loops."""
    nd = x.ndim - 2
    x = numpy.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    o, cg = w.shape[:2]
    og = o // groups
    out_sp = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in
              zip(x.shape[2:], w.shape[2:], stride, dilation)]
    out = numpy.zeros((x.shape[0], o) + tuple(out_sp))
    for pos in itertools.product(*[range(n) for n in out_sp]):
        for kpos in itertools.product(*[range(k) for k in w.shape[2:]]):
            src = tuple(p * s + k * d for p, s, k, d in zip(pos, stride, kpos, dilation))
            for gi in range(groups):
                xs = x[(slice(None), slice(gi * cg, (gi + 1) * cg)) + src]  # (N, cg)
                ws = w[(slice(gi * og, (gi + 1) * og), slice(None)) + kpos]  # (og, cg)
                out[(slice(None), slice(gi * og, (gi + 1) * og)) + pos] += xs @ ws.T
    return out


def deconv_ref(x, w, stride, pad, dilation, groups, adj):
    """Transposed convolution: every input value scatters its kernel into the output."""
    nd = x.ndim - 2
    cin, cg = w.shape[:2]
    ig = cin // groups
    full = [(n - 1) * s + d * (k - 1) + 1 + a for n, s, d, k, a in
            zip(x.shape[2:], stride, dilation, w.shape[2:], adj)]
    out = numpy.zeros((x.shape[0], cg * groups) + tuple(full))
    for pos in itertools.product(*[range(n) for n in x.shape[2:]]):
        for kpos in itertools.product(*[range(k) for k in w.shape[2:]]):
            dst = tuple(p * s + k * d for p, s, k, d in zip(pos, stride, kpos, dilation))
            for gi in range(groups):
                xs = x[(slice(None), slice(gi * ig, (gi + 1) * ig)) + pos]  # (N, ig)
                ws = w[(slice(gi * ig, (gi + 1) * ig), slice(None)) + kpos]  # (ig, cg)
                out[(slice(None), slice(gi * cg, (gi + 1) * cg)) + dst] += xs @ ws
    crop = tuple(slice(p, p + f - 2 * p) for p, f in zip(pad, full))
    return out[(slice(None), slice(None)) + crop]


def pool_ref(x, kind, kernel, stride, pad, count_include_pad=True):
    fill = -numpy.inf if kind == "max" else 0.0
    xp = numpy.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad], constant_values=fill)
    ones = numpy.pad(numpy.ones(x.shape[2:]), [(p, p) for p in pad])
    out_sp = [(n + 2 * p - k) // s + 1 for n, k, s, p in zip(x.shape[2:], kernel, stride, pad)]
    out = numpy.zeros(x.shape[:2] + tuple(out_sp))
    for pos in itertools.product(*[range(n) for n in out_sp]):
        win = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, stride, kernel))
        block = xp[(slice(None), slice(None)) + win].reshape(x.shape[:2] + (-1,))
        if kind == "max":
            out[(slice(None), slice(None)) + pos] = block.max(-1)
        else:
            count = numpy.prod(kernel) if count_include_pad else ones[win].sum()
            out[(slice(None), slice(None)) + pos] = block.sum(-1) / count
    return out


# ---------------------------------------------------------------- convolutions
@pytest.mark.parametrize("kw", [
    dict(kernel_size=3), dict(kernel_size=3, strides=2, padding=1),
    dict(kernel_size=2, dilation=2, groups=2, padding=2)])
def test_conv1d(kw):
    x = RNG.standard_normal((2, 4, 11)).astype("float32")
    layer = nn.Conv1D(6, **kw)
    layer.initialize()
    y = eager_and_hybridized(layer, x)
    w, b = layer.weight.data().asnumpy(), layer.bias.data().asnumpy()
    one = lambda v: (v,) if isinstance(v, int) else v  # noqa: E731
    want = conv_ref(x, w, one(kw.get("strides", 1)), one(kw.get("padding", 0)),
                    one(kw.get("dilation", 1)), kw.get("groups", 1)) + b[:, None]
    close(y, want)
    assert w.shape == (6, 4 // kw.get("groups", 1), kw["kernel_size"])


@pytest.mark.parametrize("nd,kw", [
    (2, dict(kernel_size=3)), (2, dict(kernel_size=(3, 2), strides=2, padding=1)),
    (2, dict(kernel_size=3, strides=2, output_padding=1)),
    (2, dict(kernel_size=2, strides=(2, 1), dilation=2, groups=2, padding=(1, 0))),
    (1, dict(kernel_size=4, strides=2, padding=1)),
    (1, dict(kernel_size=3, strides=3, output_padding=2, groups=2))])
def test_conv_transpose(nd, kw):
    cls = nn.Conv2DTranspose if nd == 2 else nn.Conv1DTranspose
    x = RNG.standard_normal((2, 4) + (5,) * nd).astype("float32")
    layer = cls(6, **kw)
    layer.initialize()
    y = eager_and_hybridized(layer, x)
    w, b = layer.weight.data().asnumpy(), layer.bias.data().asnumpy()
    tup = lambda v: (v,) * nd if isinstance(v, int) else v  # noqa: E731
    want = deconv_ref(x, w, tup(kw.get("strides", 1)), tup(kw.get("padding", 0)),
                      tup(kw.get("dilation", 1)), kw.get("groups", 1),
                      tup(kw.get("output_padding", 0)))
    close(y, want + b.reshape((1, -1) + (1,) * nd))
    assert w.shape[:2] == (4, 6 // kw.get("groups", 1))


def test_conv2d_transpose_undoes_the_shape_of_a_strided_conv_and_trains():
    # the book's 14.10 (FCN): a transposed conv of stride s brings an s-strided map back
    x = hb.random.normal(size=(1, 3, 16, 16))
    conv = nn.Conv2D(10, kernel_size=3, padding=1, strides=2)
    tconv = nn.Conv2DTranspose(3, kernel_size=4, padding=1, strides=2)
    conv.initialize()
    tconv.initialize()
    assert tconv(conv(x)).shape == x.shape
    trainer = hb.Trainer(tconv.collect_params(), "sgd", {"learning_rate": 0.1})
    target = hb.random.normal(size=(1, 3, 16, 16))
    h = conv(x)
    losses = []
    for _ in range(5):
        with autograd.record():
            l = ((tconv(h) - target) ** 2).mean()
        l.backward()
        trainer.step(1)
        losses.append(float(l))
    assert losses[-1] < losses[0]


def test_conv_transpose_gradients_match_finite_differences():
    x = RNG.standard_normal((1, 2, 3, 3))
    w = RNG.standard_normal((2, 3, 2, 2))
    head = RNG.standard_normal((1, 3, 7, 7))  # (3 - 1) * 2 + (2 - 1) + 1 + adj 1
    xa, wa = hb.array(x, dtype="float64"), hb.array(w, dtype="float64")
    xa.attach_grad()
    wa.attach_grad()
    with autograd.record():
        y = npx.deconvolution(xa, wa, stride=2, pad=0, adj=1)
        l = (y * hb.array(head)).sum()
    l.backward()

    def f(xv, wv):
        return float((deconv_ref(xv, wv, (2, 2), (0, 0), (1, 1), 1, (1, 1)) * head).sum())

    for arr, got, which in ((x, xa.grad, 0), (w, wa.grad, 1)):
        fd = numpy.zeros_like(arr)
        for idx in numpy.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += 1e-6
            minus[idx] -= 1e-6
            args_p = (plus, w) if which == 0 else (x, plus)
            args_m = (minus, w) if which == 0 else (x, minus)
            fd[idx] = (f(*args_p) - f(*args_m)) / 2e-6
        close(got, fd, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------- pooling
@pytest.mark.parametrize("cls,nd,kind,kw", [
    (nn.MaxPool1D, 1, "max", dict(pool_size=3, strides=2, padding=1)),
    (nn.AvgPool1D, 1, "avg", dict(pool_size=2)),
    (nn.AvgPool1D, 1, "avg", dict(pool_size=3, strides=1, padding=1, count_include_pad=False)),
    (nn.MaxPool3D, 3, "max", dict(pool_size=2)),
    (nn.MaxPool3D, 3, "max", dict(pool_size=(2, 3, 2), strides=(1, 2, 2), padding=(1, 1, 0))),
    (nn.AvgPool3D, 3, "avg", dict(pool_size=3, strides=2, padding=1)),
    (nn.AvgPool3D, 3, "avg", dict(pool_size=3, strides=2, padding=1, count_include_pad=False))])
def test_pooling_1d_3d(cls, nd, kind, kw):
    x = RNG.standard_normal((2, 3) + (7,) * nd).astype("float32")
    y = eager_and_hybridized(cls(**kw), x)
    tup = lambda v: (v,) * nd if isinstance(v, int) else v  # noqa: E731
    k = tup(kw["pool_size"])
    want = pool_ref(x, kind, k, tup(kw.get("strides", k)), tup(kw.get("padding", 0)),
                    kw.get("count_include_pad", True))
    close(y, want)


@pytest.mark.parametrize("cls,nd,fn", [
    (nn.GlobalMaxPool1D, 1, numpy.max), (nn.GlobalAvgPool1D, 1, numpy.mean),
    (nn.GlobalMaxPool3D, 3, numpy.max), (nn.GlobalAvgPool3D, 3, numpy.mean)])
def test_global_pooling_1d_3d(cls, nd, fn):
    x = RNG.standard_normal((2, 3) + (5,) * nd).astype("float32")
    y = eager_and_hybridized(cls(), x)
    close(y, fn(x, axis=tuple(range(2, 2 + nd)), keepdims=True))


def test_avg_pool3d_gradient_spreads_evenly():
    x = hb.array(RNG.standard_normal((1, 1, 4, 4, 4)), dtype="float64")
    x.attach_grad()
    with autograd.record():
        y = npx.pooling(x, kernel=(2, 2, 2), stride=(2, 2, 2), pool_type="avg")
    y.backward()
    close(x.grad, numpy.full((1, 1, 4, 4, 4), 1 / 8))


# --------------------------------------------------------------- normalization
@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(groups):
    x = RNG.standard_normal((3, 6, 4, 5)).astype("float32") * 3 + 1
    layer = nn.GroupNorm(num_groups=groups, in_channels=6)
    layer.initialize()
    layer.gamma.set_data(hb.array(RNG.uniform(0.5, 2, 6)))
    layer.beta.set_data(hb.array(RNG.uniform(-1, 1, 6)))
    y = eager_and_hybridized(layer, x)
    g = x.reshape(3, groups, -1).astype("float64")
    norm = ((g - g.mean(-1, keepdims=True)) / numpy.sqrt(g.var(-1, keepdims=True) + 1e-5))
    want = norm.reshape(x.shape) * layer.gamma.data().asnumpy().reshape(1, 6, 1, 1) + \
        layer.beta.data().asnumpy().reshape(1, 6, 1, 1)
    close(y, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="do not split"):
        nn.GroupNorm(4)(hb.array(x))


def test_instance_norm():
    x = RNG.standard_normal((2, 3, 7)).astype("float32") * 2 - 1
    layer = nn.InstanceNorm(scale=True)
    layer.initialize()
    y = eager_and_hybridized(layer, x)
    x64 = x.astype("float64")
    close(y, (x64 - x64.mean(-1, keepdims=True)) / numpy.sqrt(x64.var(-1, keepdims=True) + 1e-5),
          rtol=1e-4, atol=1e-4)


def test_group_norm_gradient():
    x = hb.array(RNG.standard_normal((2, 4, 3)), dtype="float64")
    x.attach_grad()
    gamma, beta = hb.array(numpy.ones(4), dtype="float64"), hb.zeros(4, dtype="float64")
    from compiler.ops import composite_nn  # noqa: PLC0415
    head = RNG.standard_normal((2, 4, 3))
    with autograd.record():
        l = (composite_nn.group_norm(hb.ndarray.F, x, gamma, beta, 2) * hb.array(head)).sum()
    l.backward()

    def f(v):
        g = v.reshape(2, 2, -1)
        return float((((g - g.mean(-1, keepdims=True)) /
                       numpy.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(v.shape)
                      * head).sum())

    v = x.asnumpy()
    fd = numpy.zeros_like(v)
    for idx in numpy.ndindex(v.shape):
        p, m = v.copy(), v.copy()
        p[idx] += 1e-6
        m[idx] -= 1e-6
        fd[idx] = (f(p) - f(m)) / 2e-6
    close(x.grad, fd, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- activations
ERF = numpy.vectorize(__import__("math").erf)


@pytest.mark.parametrize("layer,ref", [
    (nn.ELU(), lambda x: numpy.where(x > 0, x, numpy.expm1(x))),
    (nn.ELU(alpha=0.5), lambda x: numpy.where(x > 0, x, 0.5 * numpy.expm1(x))),
    (nn.SELU(), lambda x: 1.0507009873554805 * numpy.where(
        x > 0, x, 1.6732632423543772 * numpy.expm1(x))),
    (nn.GELU(), lambda x: 0.5 * x * (1 + ERF(x / numpy.sqrt(2)))),
    (nn.SiLU(), lambda x: x / (1 + numpy.exp(-x))),
    (nn.Swish(beta=2.0), lambda x: x / (1 + numpy.exp(-2 * x))),
    (nn.Activation("silu"), lambda x: x / (1 + numpy.exp(-x))),
    (nn.PReLU(), lambda x: numpy.where(x > 0, x, 0.25 * x))])
def test_activations(layer, ref):
    x = RNG.uniform(-4, 4, (3, 5)).astype("float32")
    layer.initialize()
    close(eager_and_hybridized(layer, x), ref(x.astype("float64")), rtol=1e-5, atol=1e-6)


def test_prelu_per_channel_learns_its_slope():
    layer = nn.PReLU(in_channels=3)
    layer.initialize()
    x = hb.array(-numpy.ones((2, 3, 4)))
    with autograd.record():
        y = layer(x).sum()
    y.backward()
    close(layer.alpha.grad(), [-8.0, -8.0, -8.0])  # d/dalpha of alpha * x, x = -1, 8 each
    close(layer(x), numpy.full((2, 3, 4), -0.25))


def test_elu_is_finite_for_large_inputs():
    # exp of a large positive x would overflow in the branch where() discards
    x = hb.array([100.0, -100.0, 0.0])
    x.attach_grad()
    with autograd.record():
        y = npx.leaky_relu(x, act_type="elu", slope=1.0).sum()
    y.backward()
    close(x.grad, [1.0, 0.0, 1.0])


# ------------------------------------------------------------- containers, attention
def test_hybrid_concatenate():
    net = nn.HybridConcatenate(axis=1)
    net.add(nn.Dense(3), nn.Dense(2, activation="relu"), nn.Identity())
    net.initialize()
    x = RNG.standard_normal((4, 5)).astype("float32")
    y = eager_and_hybridized(net, x)
    parts = [net[0](hb.array(x)).asnumpy(), net[1](hb.array(x)).asnumpy(), x]
    close(y, numpy.concatenate(parts, axis=1))
    seq = nn.Concatenate(axis=0)
    seq.add(nn.Identity(), nn.Identity())
    assert seq(hb.ones((2, 3))).shape == (4, 3)


def _mha_ref(m, q, k, v, valid_lens):
    heads = m.num_heads

    def dense(layer, x):
        return x @ layer.weight.data().asnumpy().T

    def split(x):
        b, n, h = x.shape
        return x.reshape(b, n, heads, h // heads).transpose(0, 2, 1, 3).reshape(
            b * heads, n, h // heads)

    Q, K, V = split(dense(m.W_q, q)), split(dense(m.W_k, k)), split(dense(m.W_v, v))
    scores = Q @ K.transpose(0, 2, 1) / numpy.sqrt(Q.shape[-1])
    if valid_lens is not None:
        lens = numpy.repeat(valid_lens, heads, axis=0)
        if lens.ndim == 1:
            lens = numpy.repeat(lens[:, None], scores.shape[1], axis=1)
        mask = numpy.arange(scores.shape[-1])[None, None, :] < lens[:, :, None]
        scores = numpy.where(mask, scores, -1e6)
    w = numpy.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = w @ V
    bh, n, d = out.shape
    out = out.reshape(bh // heads, heads, n, d).transpose(0, 2, 1, 3).reshape(
        bh // heads, n, heads * d)
    return dense(m.W_o, out)


@pytest.mark.parametrize("valid_lens", [None, numpy.array([3, 2]),
                                        numpy.array([[1, 2, 3, 4], [4, 4, 1, 2]])])
def test_multi_head_attention_matches_the_books_formula(valid_lens):
    m = nn.MultiHeadAttention(num_hiddens=12, num_heads=3, dropout=0.5)
    m.initialize()
    q = RNG.standard_normal((2, 4, 5)).astype("float32")
    kv = RNG.standard_normal((2, 6, 7)).astype("float32")
    args = (q, kv, kv) + (() if valid_lens is None else (hb.array(valid_lens),))
    y = eager_and_hybridized(m, *args)  # dropout is off outside autograd.record()
    assert y.shape == (2, 4, 12)
    close(y, _mha_ref(m, q, kv, kv, valid_lens), rtol=1e-4, atol=1e-5)


def test_multi_head_attention_trains():
    m = nn.MultiHeadAttention(num_hiddens=8, num_heads=2)
    m.initialize()
    x = hb.random.normal(size=(3, 5, 8))
    target = hb.random.normal(size=(3, 5, 8))
    trainer = hb.Trainer(m.collect_params(), "adam", {"learning_rate": 0.05})
    losses = []
    for _ in range(20):
        with autograd.record():
            l = ((m(x, x, x, hb.array([5, 3, 2])) - target) ** 2).mean()
        l.backward()
        trainer.step(1)
        losses.append(float(l))
    assert losses[-1] < 0.8 * losses[0]
    with pytest.raises(ValueError, match="multiple of num_heads"):
        nn.MultiHeadAttention(10, 3)
