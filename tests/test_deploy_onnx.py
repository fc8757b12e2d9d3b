"""ONNX export: every model and a many-op function pass onnx.checker and match onnxruntime.

onnx and onnxruntime are optional (``pip install onnx onnxruntime``): without them these
tests skip with that reason; the clear error without onnx is tested either way.
"""
import sys

import numpy as np
import pytest

import hybrid as hb
from hybrid import init
from hybrid.nn import models
from hybrid.onnx_export import OnnxExportError, export_onnx

from test_deploy_fuzz import _conv_fn, _dense_fn, _wide_fn


def _need_onnx():
    return pytest.importorskip("onnx", reason="onnx is not installed (pip install onnx)")


def _run_ort(path, xs):
    ort = pytest.importorskip("onnxruntime",
                              reason="onnxruntime is not installed (pip install onnxruntime)")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {f"in{i}": x for i, x in enumerate(xs)})


def _check_file(path):
    onnx = _need_onnx()
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("name,make,shape", [
    ("mlp", lambda: models.mlp((32, 16)), (3, 20)),
    ("lenet", models.lenet, (2, 1, 28, 28)),
    ("resnet18", lambda: models.resnet18(width=8), (2, 3, 16, 16)),
])
def test_models_match_onnxruntime(tmp_path, name, make, shape):
    _need_onnx()
    hb.random.seed(0)
    net = make()
    net.initialize(init.Xavier())
    net.hybridize(backend="reference")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = net(hb.array(x)).asnumpy()
    path = net.export_onnx(tmp_path / f"{name}.onnx", example_inputs=(hb.array(x),))
    model = _check_file(path)
    assert [i.name for i in model.graph.input] == ["in0"]
    (got,) = _run_ort(path, [x])
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make,xs", [
    (_dense_fn, (np.arange(8, dtype=np.float32).reshape(2, 4),)),
    (_conv_fn, (np.random.default_rng(2).standard_normal((2, 1, 8, 8)).astype(np.float32),)),
    (_wide_fn, (np.random.default_rng(2).standard_normal((2, 6)).astype(np.float32),
                np.array([1, 4], dtype=np.int64))),
], ids=["dense", "conv", "many_ops"])
def test_functions_match_onnxruntime(tmp_path, make, xs):
    _need_onnx()
    fn = make()
    args = tuple(hb.array(x, dtype=x.dtype) for x in xs)
    want, _ = hb.tracing.flatten(fn(*args))
    path = hb.deploy.export_onnx(fn, tmp_path / "f.onnx", example_inputs=args)
    _check_file(path)
    got = _run_ort(path, list(xs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.asnumpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_more_ops_match_onnxruntime(tmp_path):
    _need_onnx()

    @hb.hybridize(backend="reference")
    def more(x, i):
        a = hb.square(x) + hb.npx.relu(x) - hb.sign(x) * hb.exp(x * 0.1) - hb.ceil(x)
        b = (x // 0.7) + (x % 0.7) + (i // 3) + (i % 3) + hb.round(x * 2)
        c = (hb.where((x != 0.5) & (i > 1), a, b) / (hb.abs(i) + 1)).astype("float32")
        d = hb.npx.pooling(data=hb.reshape(c, (-1, 1, 2, 4)), pool_type="avg", kernel=(2, 2),
                           stride=(1, 1), pad=(1, 1), count_include_pad=False)
        e = hb.npx.pooling(data=d, global_pool=True, pool_type="max", kernel=(1, 1))
        f = hb.concatenate([c[:, ::-1], c[:, 1::3]], axis=1).min(axis=1, keepdims=True)
        return d, e, f, hb.argmin(c, axis=None), x.max(), (i * 2).prod(axis=1)
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    i = np.arange(16, dtype=np.int32).reshape(2, 8) % 5
    want, _ = hb.tracing.flatten(more(hb.array(x), hb.array(i, dtype="int32")))
    path = export_onnx(more, tmp_path / "m.onnx", (hb.array(x), hb.array(i, dtype="int32")))
    _check_file(path)
    for g, w in zip(_run_ort(path, [x, i]), want):
        w = w.asnumpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_unsupported_op_is_named_and_nothing_is_written(tmp_path):
    _need_onnx()

    @hb.hybridize(backend="reference")
    def setitem(x):
        y = x * 1
        y[:, 0] = 0.0
        return y
    with pytest.raises(OnnxExportError, match="op 'slice_update'.*no ONNX mapping"):
        export_onnx(setitem, tmp_path / "s.onnx", (hb.ones((2, 3)),))
    assert not list(tmp_path.iterdir())


def test_clear_error_without_onnx(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    net = models.mlp((8,), 2)
    net.initialize()
    net.hybridize(backend="reference")
    with pytest.raises(OnnxExportError, match="pip install onnx"):
        net.export_onnx(tmp_path / "m.onnx", example_inputs=(hb.ones((1, 4)),))


def test_control_flow_exports_as_scan_loop_and_if(tmp_path):
    _need_onnx()
    w = hb.array(np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32) * 0.5)

    @hb.hybridize(backend="reference")
    def loops(x, lim):
        npx = hb.npx

        def step(row, s):  # foreach -> Scan; w is captured from outside the body
            s2 = hb.tanh(hb.dot(s, w) + row)
            return [s2 * 2.0, s2.sum()], s2
        (seq, sums), h = npx.foreach(step, x, hb.zeros((3,)))
        back, _ = npx.foreach(lambda row, s: (row + s, s + 1.0), x[::-1], hb.zeros(()))
        outs, (n, a) = npx.while_loop(  # while_loop -> Loop, rows padded to max_iterations
            lambda n, a: a.sum() < lim.sum(),
            lambda n, a: (a * 2.0, [n + 1, a + hb.sigmoid(a)]),
            [hb.zeros((), dtype="int64"), h], max_iterations=5)
        c = npx.cond(lambda v: v.sum() > 0, lambda v: v * w.sum(), lambda v: -v, [a])
        return seq, sums, h, back, outs, n, a, c  # cond -> If, with a captured w

    x = np.random.default_rng(4).standard_normal((4, 3)).astype(np.float32)
    for lim in (-1.0, 2.0, 100.0):  # zero steps, some, max_iterations
        lim_a = np.array(lim, dtype=np.float32)
        want, _ = hb.tracing.flatten(loops(hb.array(x), hb.array(lim_a)))
        path = export_onnx(loops, tmp_path / "cf.onnx", (hb.array(x), hb.array(lim_a)))
        model = _check_file(path)
        ops = {n.op_type for n in model.graph.node}
        assert {"Scan", "Loop", "If"} <= ops, ops
        got = _run_ort(path, [x, lim_a])
        assert len(got) == len(want)
        for g, w_ in zip(got, want):
            w_ = w_.asnumpy()
            assert g.shape == w_.shape and g.dtype == w_.dtype
            np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_recurrent_layers_export_as_scans(tmp_path, kind):
    _need_onnx()
    from hybrid import gluon
    layer = getattr(gluon.rnn, kind)(5, input_size=3, num_layers=2, bidirectional=True)
    layer.initialize()
    x = np.random.default_rng(5).standard_normal((6, 2, 3)).astype(np.float32)
    want = layer(hb.array(x)).asnumpy()
    layer.hybridize(backend="reference")
    path = layer.export_onnx(tmp_path / "rnn.onnx", example_inputs=(hb.array(x),))
    model = _check_file(path)
    assert sum(n.op_type == "Scan" for n in model.graph.node) == 4  # 2 layers x 2 directions
    (got,) = _run_ort(path, [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
