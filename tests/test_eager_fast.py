"""The eager fast paths (issue 23): each asserts through a counter, never a timing, so a
broken fast path fails here even where it would only be slower.

- a small op whose inputs are computed runs in the caller without an engine op, with NumPy's
  result, and a pending or failed input still takes the engine's path (ordering and errors);
- convolutions, their gradients and pooling run compiled single-op kernels from a
  signature's second call (hybrid/eager_kernels.py), agreeing with NumPy's implementation.
"""
import contextlib

import numpy as np
import pytest

import hybrid as hb
from compiler.ops import eager_apply
from hybrid import autograd, eager_kernels
from runtime import config
from runtime import engine as engine_mod


def _pushes():
    return engine_mod.get_engine()._seq


# ------------------------------------------------------------------ the caller's path
def test_small_op_runs_in_the_caller_with_numpy_result():
    a = np.array([[0.5, -1.25]], np.float32)
    x = hb.array(a)
    hb.waitall()  # the device idle: an earlier test's ops may still be in flight
    before = _pushes()
    y = x + 1
    z = hb.tanh(y) * 3
    assert _pushes() == before, "a small op on computed inputs went through the engine"
    assert y._buf.data is not None  # computed at once
    np.testing.assert_array_equal(z.asnumpy(), np.tanh(a + 1) * np.float32(3))
    assert z.dtype == np.float32


def test_a_matrix_transpose_is_numpys_view_and_still_recorded_and_checked():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = hb.array(a)
    hb.waitall()
    before, entries = _pushes(), len(hb.ndarray._INFER_MAP)
    t = w.T
    assert _pushes() == before and len(hb.ndarray._INFER_MAP) == entries  # no inference
    assert np.shares_memory(t._buf.data, w._buf.data) and t.shape == (3, 2)
    np.testing.assert_array_equal((t @ hb.ones((2, 1))).asnumpy(), a.T @ np.ones((2, 1)))
    w.attach_grad()
    with autograd.record():  # recorded: the general path, with its gradient
        y = (hb.npx.fully_connected(hb.ones((4, 3)), w, None, no_bias=True) * 2).sum()
    y.backward()
    np.testing.assert_array_equal(w.grad.asnumpy(), np.full((2, 3), 8, np.float32))
    with pytest.raises(Exception, match="transpose"):
        hb.ndarray.apply("transpose", (w,), {"axes": (0, 0)})  # still type-checked


def test_multi_output_and_recorded_ops_on_the_caller_path():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = hb.array(a)
    x.attach_grad()
    with autograd.record():
        y = (x * x).sum()
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), 2 * a)


def test_pending_input_takes_the_engine_path():
    eng = engine_mod.get_engine()
    x = hb.ones((2, 2))
    gate = __import__("threading").Event()
    slow = hb.NDArray(engine_mod_buffer(), (2, 2), "float32", x.device)
    eng.push(lambda: (gate.wait(5), setattr(slow._buf, "data", np.full((2, 2), 2,
                                                                        np.float32))),
             (), (slow._buf.var,), x.device, "slow")
    before = _pushes()
    y = slow + 1  # its input is pending: queued after the op writing it
    assert _pushes() == before + 1
    gate.set()
    np.testing.assert_array_equal(y.asnumpy(), np.full((2, 2), 3, np.float32))


def engine_mod_buffer():
    from runtime.memory import Buffer
    return Buffer()


def test_failed_input_stays_failed():
    eng = engine_mod.get_engine()
    x = hb.ones((2,))
    bad = hb.NDArray(engine_mod_buffer(), (2,), "float32", x.device)

    def fail():
        raise ValueError("boom")
    eng.push(fail, (), (bad._buf.var,), x.device, "fail")
    y = bad + 1
    with pytest.raises(Exception, match="boom"):
        y.asnumpy()
    with pytest.raises(Exception, match="boom"):
        (y * 2).asnumpy()
    with contextlib.suppress(Exception):  # leave no unreported error to the next test
        hb.waitall()


@contextlib.contextmanager
def _engine_inline_off():
    """The process's engine replaced, for the block, by one made with HYBRID_INLINE off."""
    old = config.set_flag("HYBRID_INLINE", False)
    try:
        eng = engine_mod.Engine()
    finally:
        config.set_flag("HYBRID_INLINE", old)
    prev = engine_mod.set_engine(eng)
    try:
        yield eng
    finally:
        engine_mod.set_engine(prev)
        eng.shutdown()


def test_inline_off_goes_through_the_engine():
    with _engine_inline_off() as eng:
        x = hb.ones((1, 2))
        before = eng._seq
        y = x + 1
        assert eng._seq == before + 1
        np.testing.assert_array_equal(y.asnumpy(), np.full((1, 2), 2, np.float32))


@pytest.mark.parametrize("in_caller", [True, False])
def test_long_op_path_chosen_by_the_trial_gives_the_same_result(monkeypatch, in_caller):
    """A matmul too big to run in the caller always asks the device's dispatch trial (as a
    long compiled call does); either answer computes NumPy's result."""
    from hybrid import dispatch
    asked = []

    def decide(key, device, engine, eager=False):
        asked.append(eager)
        return in_caller
    monkeypatch.setattr(dispatch, "long_call_direct", decide)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 512)).astype(np.float32)
    w = rng.standard_normal((512, 256)).astype(np.float32)
    x, wx = hb.array(a), hb.array(w)
    hb.waitall()
    before = _pushes()
    y = x @ wx
    assert asked == [True], "a long op did not ask the eager ops' trial"
    assert (_pushes() == before) == in_caller
    # (NumPy's sums at the signature's first call, the generated GEMM's later: to rounding)
    np.testing.assert_allclose(y.asnumpy(), a @ w, rtol=1e-5, atol=1e-4)
    # a long op on a pending input tells the trial too (it counts a loop's iterations by
    # them) and is queued whatever the answer
    gate = __import__("threading").Event()
    slow = hb.NDArray(engine_mod_buffer(), (64, 512), "float32", x.device)
    engine_mod.get_engine().push(
        lambda: (gate.wait(5), setattr(slow._buf, "data", a)), (), (slow._buf.var,),
        x.device, "slow")
    before = _pushes()
    z = slow @ wx
    assert len(asked) == 2 and _pushes() == before + 1
    gate.set()  # (the signature's second call: the generated GEMM's sums, to rounding)
    np.testing.assert_allclose(z.asnumpy(), a @ w, rtol=1e-5, atol=1e-4)


def _dense_by_ops(layer, x):
    """What the eager Dense computes op by op: npx.fully_connected, then its activation."""
    from hybrid import npx
    b = layer.bias.data() if layer.bias is not None else None
    y = npx.fully_connected(x, layer.weight.data(), b, no_bias=b is None)
    return npx.activation(y, act_type=layer.act._act_type) if layer.act is not None else y


@pytest.mark.parametrize("act, use_bias", [("relu", True), ("sigmoid", False),
                                           ("tanh", True), (None, True), ("gelu", True)])
def test_an_eager_dense_is_one_call_with_its_ops_bits(act, use_bias):
    """An unrecorded eager Dense on an idle CPU runs its product, bias and activation in one
    call (hybrid.ndarray.eager_linear: no array per op), with the very kernels of those ops
    in their order: the same bits. A composite activation (gelu) keeps its own ops."""
    from hybrid import nn
    rng = np.random.default_rng(5)
    layer = nn.Dense(7, activation=act, use_bias=use_bias, in_units=5)
    layer.initialize()
    for batch in (1, 3):
        x = hb.array(rng.standard_normal((batch, 5)).astype(np.float32) * 3)
        want = _dense_by_ops(layer, x).asnumpy()  # (the ops' signatures seen: now fused)
        hb.waitall()
        calls = []
        orig = hb.ndarray._made_here
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(hb.ndarray, "_made_here", lambda *a: calls.append(a[0]) or orig(*a))
            got = layer(x).asnumpy()
        np.testing.assert_array_equal(got, want)
        assert bool(calls) == (act == "gelu"), calls  # an array made per op: not fused


@pytest.mark.parametrize("act, use_bias", [("relu", True), ("sigmoid", True),
                                           ("tanh", False), (None, True)])
def test_a_recorded_eager_dense_is_one_tape_node_with_its_ops_gradients(act, use_bias):
    """Under record() an eager Dense is one op and one tape node (hybrid.ndarray
    eager_linear); its backward gives what the layer's four recorded ops give, bit for bit:
    the input's, the weight's and the bias's gradients, through two layers."""
    from hybrid import nn
    rng = np.random.default_rng(8)
    l1 = nn.Dense(6, activation=act, use_bias=use_bias, in_units=5)
    l2 = nn.Dense(3, activation="relu", in_units=6)
    for layer in (l1, l2):
        layer.initialize()
    x = hb.array(rng.standard_normal((4, 5)).astype(np.float32))
    x.attach_grad()
    params = [p for layer in (l1, l2) for p in layer.collect_params().values()]

    def grads(forward):
        with autograd.record():
            y = forward(x)
            loss = (y * y).sum()
        loss.backward()
        return [x.grad.asnumpy()] + [p.grad().asnumpy().copy() for p in params], y
    want, _ = grads(lambda v: _dense_by_ops(l2, _dense_by_ops(l1, v)))
    made = []
    orig = autograd.record_custom
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(autograd, "record_custom", lambda name, *a: made.append(name) or
                   orig(name, *a))
        got, y = grads(lambda v: l2(l1(v)))
    assert made == ["dense", "dense"], made
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_dense_on_images_flattens_them_and_is_one_op_too():
    """A Dense on (N, C, H, W) flattens its input, as linear() does, then runs as one op:
    LeNet's and the book's MLP's first layer; gradients equal the ops' path."""
    from hybrid import nn
    rng = np.random.default_rng(9)
    layer = nn.Dense(5, activation="relu", in_units=12)
    layer.initialize()
    x = hb.array(rng.standard_normal((3, 1, 3, 4)).astype(np.float32))
    x.attach_grad()
    params = list(layer.collect_params().values())

    def grads(forward):
        with autograd.record():
            loss = (forward(x) ** 2).sum()
        loss.backward()
        return [x.grad.asnumpy()] + [p.grad().asnumpy().copy() for p in params]
    want = grads(lambda v: _dense_by_ops(layer, v.reshape((3, 12))))
    made = []
    orig = autograd.record_custom
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(autograd, "record_custom", lambda name, *a: made.append(name) or
                   orig(name, *a))
        got = grads(layer)
    assert made == ["dense"]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_eager_dense_takes_its_ops_path_where_they_would_not_run_as_one():
    """A first signature (inference checks it), a 3-D input, a hook on the activation, or
    inlining off: the layer's ops run as before, with the same values; an input still
    being computed makes one engine op, ordered after it."""
    from hybrid import nn
    rng = np.random.default_rng(6)
    layer = nn.Dense(4, activation="relu", in_units=6)
    layer.initialize()
    x = hb.array(rng.standard_normal((2, 6)).astype(np.float32))
    first = layer(x).asnumpy()  # first signature: the ops' own path
    np.testing.assert_array_equal(first, _dense_by_ops(layer, x).asnumpy())
    seen = []
    layer.act.register_forward_hook(lambda blk, args, out: seen.append(out.shape))
    np.testing.assert_array_equal(layer(x).asnumpy(), first)
    assert seen == [(2, 4)], "the activation's hook ran"
    x3 = hb.array(rng.standard_normal((2, 2, 3)).astype(np.float32))
    np.testing.assert_array_equal(layer(x3).asnumpy(),
                                  layer(x3.reshape((2, 6))).asnumpy())
    from hybrid.ndarray import eager_linear
    w, b = layer.weight.data(), layer.bias.data()
    hb.waitall()
    eng = engine_mod.get_engine()
    before = _pushes()
    assert eager_linear(x, w, b, "relu") is not None and _pushes() == before  # in the caller
    gate = __import__("threading").Event()
    slow = hb.NDArray(engine_mod_buffer(), (2, 6), "float32", x.device)
    eng.push(lambda: (gate.wait(5), setattr(slow._buf, "data", x.asnumpy())), (),
             (slow._buf.var,), x.device, "slow")
    try:
        before = _pushes()
        y = eager_linear(slow, w, b, "relu")  # pending input: one engine op after it
        assert _pushes() == before + 1
    finally:
        gate.set()
    np.testing.assert_array_equal(y.asnumpy(), first)
    with _engine_inline_off():
        assert eager_linear(x, w, b, "relu") is None


def test_computed_buffer_makes_its_var_on_demand():
    """An op run in the caller makes no engine Var; waits and later engine ops reading the
    value (a pending op's output depends on it) still work, and a pending buffer has one."""
    from runtime.memory import Buffer
    x = hb.array(np.ones((2, 2), np.float32))
    x.wait_to_read()
    y = x + 1
    assert y._buf._var is None
    eng = engine_mod.get_engine()
    syncs = eng.sync_points
    y.wait_to_read()  # nothing to wait for: no Var made, still a sync point
    assert y._buf._var is None and eng.sync_points == syncs + 1
    np.testing.assert_array_equal(y.asnumpy(), np.full((2, 2), 2, np.float32))
    assert y._buf.var is y._buf.var  # made when asked for
    assert Buffer()._var is not None
    gate = __import__("threading").Event()
    slow = hb.NDArray(Buffer(), (2, 2), "float32", x.device)
    eng.push(lambda: (gate.wait(5), setattr(slow._buf, "data", np.full((2, 2), 3,
                                                                        np.float32))),
             (), (slow._buf.var,), x.device, "slow")
    z = x * 2
    w = slow + z  # queued: reads the pending value and the computed one
    gate.set()
    np.testing.assert_array_equal(w.asnumpy(), np.full((2, 2), 5, np.float32))


def test_masked_where_is_numpy_where_bit_for_bit():
    """where(cond, g, 0.0) (ReLU's gradient) runs branch-free on the bits: the same bits
    as NumPy's where, NaN payloads, infinities and signed zeros included, and NumPy's where
    itself wherever the mask does not apply (-0.0, broadcasting, non-contiguous)."""
    from compiler.ops.elementwise import _where_impl
    rng = np.random.default_rng(1)
    for dt in (np.float32, np.float64, np.float16):
        g = rng.standard_normal((16, 33)).astype(dt)
        g[0, :6] = [np.nan, -np.inf, np.inf, -0.0, 0.0, -np.nan]
        c = rng.random((16, 33)) > 0.5
        for args in [(c, g, 0.0), (c, 0.0, g), (c, g, 0), (c, g, -0.0), (c, -0.0, g),
                     (c, g[:, :1], 0.0), (c.T, g.T, 0.0), (c, g, 2.0),
                     (np.asfortranarray(c), g, 0.0)]:
            got, want = _where_impl(np, *args), np.where(*args)
            assert got.dtype == want.dtype and got.strides == want.strides
            assert got.tobytes() == want.tobytes()
    x = hb.array(rng.standard_normal((8, 8)).astype(np.float32))
    x.attach_grad()
    with autograd.record():
        y = hb.relu(x)
    y.backward()
    xn = x.asnumpy()
    np.testing.assert_array_equal(x.grad.asnumpy(), np.where(xn > 0, 1, 0).astype(np.float32))


def test_parameter_data_fast_path_and_its_errors():
    """Parameter.data's one-copy shortcut returns what the full look-up returns, and a
    device the parameter has no copy on still raises the same error."""
    from hybrid import nn
    layer = nn.Dense(3, in_units=2)
    layer.initialize()
    p = layer.weight
    assert p.data() is p.data(hb.cpu(0)) is p.data("cpu(0)") is p.data(ctx=hb.cpu(0))
    assert p.data() is p.list_data()[0]
    with pytest.raises(RuntimeError, match=r"was not initialized on cpu\(1\); it has copies"):
        p.data(hb.cpu(1))
    fresh = nn.Dense(3)
    fresh.initialize()
    with pytest.raises(hb.nn.DeferredInitializationError if hasattr(
            hb.nn, "DeferredInitializationError") else RuntimeError):
        fresh.weight.data()
    with pytest.raises(ValueError, match="has shape"):
        layer.weight._finish_deferred_init((3, 5))
    layer.weight._finish_deferred_init((3, 2))  # the same shape: nothing to do


# ------------------------------------------------------------------ compiled kernels
def _rnd(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


CASES = [
    ("conv2d", [(4, 3, 9, 9), (5, 3, 3, 3)], {"stride": (1, 1), "pad": (1, 1)}),
    ("conv2d", [(2, 4, 8, 8), (6, 2, 3, 3)], {"stride": (2, 2), "pad": (0, 0), "groups": 2}),
    ("conv2d_grad_data", [(4, 5, 9, 9), (5, 3, 3, 3)],
     {"data_shape": (4, 3, 9, 9), "stride": (1, 1), "pad": (1, 1)}),
    ("conv2d_grad_weight", [(4, 3, 9, 9), (4, 5, 9, 9)],
     {"weight_shape": (5, 3, 3, 3), "stride": (1, 1), "pad": (1, 1)}),
    ("pool2d", [(3, 4, 8, 8)], {"pool_type": "max", "kernel": (2, 2), "stride": (2, 2)}),
    ("pool2d", [(3, 4, 9, 9)], {"pool_type": "avg", "kernel": (3, 3), "stride": (2, 2),
                                "pad": (1, 1), "count_include_pad": False}),
]


@pytest.mark.parametrize("name,shapes,attrs", CASES, ids=[c[0] for c in CASES])
def test_compiled_kernel_matches_numpy(name, shapes, attrs):
    raw = [_rnd(s, i) for i, s in enumerate(shapes)]
    want = eager_apply(np, name, raw, attrs)
    arrays = [hb.array(r) for r in raw]
    first = hb.ndarray.apply(name, arrays, attrs)  # the signature's first call: NumPy
    np.testing.assert_array_equal(first.asnumpy(), want[0])
    before = dict(eager_kernels.stats)
    for _ in range(2):
        got = hb.ndarray.apply(name, arrays, attrs)
        np.testing.assert_allclose(got.asnumpy(), want[0], rtol=1e-5, atol=1e-5)
        assert got.dtype == want[0].dtype and got.shape == want[0].shape
    assert eager_kernels.stats["native_calls"] >= before["native_calls"] + 2, \
        "the compiled kernel did not run"


@pytest.mark.parametrize("name", sorted(eager_kernels.LARGE_OPS))
def test_large_transcendental_compiled_close_to_numpy(name):
    a = _rnd((64, 1024), 7)
    if name == "log":
        a = np.abs(a) + 0.05
    want = eager_apply(np, name, [a], {})[0]
    x = hb.array(a)
    before = eager_kernels.stats["native_calls"]
    for _ in range(3):
        got = hb.ndarray.apply(name, (x,), {}).asnumpy()
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
        assert got.dtype == want.dtype
    assert eager_kernels.stats["native_calls"] >= before + 2
    small = hb.array(a[:2])  # under LARGE_MIN: NumPy's own result, bit for bit
    for _ in range(3):
        np.testing.assert_array_equal(hb.ndarray.apply(name, (small,), {}).asnumpy(),
                                      eager_apply(np, name, [a[:2]], {})[0])


def test_pool_grad_compiled_matches_numpy():
    x = _rnd((2, 3, 8, 8), 1)
    attrs = {"pool_type": "max", "kernel": (2, 2), "stride": (2, 2)}
    out = eager_apply(np, "pool2d", [x], attrs)[0]
    g = _rnd(out.shape, 2)
    want = eager_apply(np, "pool2d_grad", [g, x, out], attrs)[0]
    args = [hb.array(g), hb.array(x), hb.array(out)]
    before = eager_kernels.stats["native_calls"]
    for _ in range(3):
        got = hb.ndarray.apply("pool2d_grad", args, attrs)
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6, atol=1e-6)
    assert eager_kernels.stats["native_calls"] >= before + 2


def _lenet_like_grads():
    hb.random.seed(3)
    x = hb.random.normal(size=(4, 1, 12, 12))
    w1 = hb.random.normal(size=(3, 1, 5, 5))
    w2 = hb.random.normal(size=(4, 3, 3, 3))
    for p in (w1, w2):
        p.attach_grad()
    with autograd.record():
        h = hb.npx.convolution(data=x, weight=w1, kernel=(5, 5), num_filter=3, pad=2,
                               no_bias=True)
        h = hb.npx.pooling(data=hb.sigmoid(h), kernel=(2, 2), stride=(2, 2), pool_type="avg")
        h = hb.npx.convolution(data=h, weight=w2, kernel=(3, 3), num_filter=4, no_bias=True)
        h = hb.npx.pooling(data=h, kernel=(2, 2), stride=(2, 2), pool_type="max")
        loss = (h * h).sum()
    loss.backward()
    return loss.asnumpy(), w1.grad.asnumpy(), w2.grad.asnumpy()


def test_training_gradients_match_numpy_kernels():
    old = config.set_flag("HYBRID_EAGER_KERNELS", False)
    try:
        want = _lenet_like_grads()
    finally:
        config.set_flag("HYBRID_EAGER_KERNELS", old)
    before = eager_kernels.stats["native_calls"]
    for _ in range(3):  # from the second step on, compiled kernels run
        got = _lenet_like_grads()
    assert eager_kernels.stats["native_calls"] > before
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("layout", [(False, False), (False, True), (True, False),
                                    (True, True)])
def test_products_run_the_generated_gemm_in_their_operands_layout(layout):
    # Dense's x @ W.T (a view of W) and a weight gradient's g.T @ x: each layout has its own
    # executable reading the views' bases, never a copy; results as NumPy's, to rounding
    m, k, n = 48, 96, 64
    _compiled_product(m, k, n, layout)


def test_a_classifiers_thin_product_runs_compiled_too():
    _compiled_product(96, 128, 10, (False, True))  # x @ W.T, 10 classes: one GEMV per row


def _compiled_product(m, k, n, layout):
    a = _rnd((k, m) if layout[0] else (m, k), 11)
    b = _rnd((n, k) if layout[1] else (k, n), 12)
    want = (a.T if layout[0] else a) @ (b.T if layout[1] else b)
    x, w = hb.array(a), hb.array(b)
    x, w = (x.T if layout[0] else x), (w.T if layout[1] else w)
    before = dict(eager_kernels.stats)
    for _ in range(3):
        got = (x @ w).asnumpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert eager_kernels.stats["native_calls"] >= before["native_calls"] + 2
    assert eager_kernels.stats["failures"] == before["failures"]


def test_products_the_generated_gemm_does_not_take_stay_numpy():
    rng = np.random.default_rng(13)
    cases = [((1, 512), (512, 256)),  # batch 1: NumPy's GEMV
             ((64, 128), (128, 2)),  # fewer columns than a vector's lanes
             ((512, 1024), (1024, 64))]  # A of 2 MB: OpenBLAS (extern_plan.SGEMM_MAX_A_BYTES)
    for sa, sb in cases:
        a, b = (rng.standard_normal(s).astype(np.float32) for s in (sa, sb))
        x, w = hb.array(a), hb.array(b)
        before = eager_kernels.stats["native_calls"]
        for _ in range(3):
            np.testing.assert_allclose((x @ w).asnumpy(), a @ b, rtol=1e-5, atol=1e-4)
        assert eager_kernels.stats["native_calls"] == before, (sa, sb)


def test_eager_kernels_off_means_numpy():
    old = config.set_flag("HYBRID_EAGER_KERNELS", False)
    try:
        x, w = hb.array(_rnd((2, 2, 6, 6), 5)), hb.array(_rnd((3, 2, 3, 3), 6))
        before = eager_kernels.stats["native_calls"]
        for _ in range(3):
            y = hb.ndarray.apply("conv2d", (x, w), {"stride": (1, 1), "pad": (0, 0)})
        np.testing.assert_array_equal(
            y.asnumpy(), eager_apply(np, "conv2d", [x.asnumpy(), w.asnumpy()],
                                     {"stride": (1, 1), "pad": (0, 0)})[0])
        assert eager_kernels.stats["native_calls"] == before
    finally:
        config.set_flag("HYBRID_EAGER_KERNELS", old)


# ------------------------------------------------------------------ the first call
def test_warm_disk_cache_hit_generates_no_ir(tmp_path):
    """A process whose compile cache holds the object code loads it: no IR is generated and
    LLVM compiles nothing (counted by runtime.native.stats, never timed)."""
    from runtime import native

    old = config.set_flag("HYBRID_CACHE_DIR", str(tmp_path))
    try:
        def first_call():
            net = hb.nn.HybridSequential()
            net.add(hb.nn.Dense(7, activation="relu"), hb.nn.Dense(3))
            net.initialize(hb.init.Constant(0.25))
            x = hb.ones((2, 5))
            want = net(x).asnumpy()
            net.hybridize(backend="llvm")
            np.testing.assert_array_equal(net(x).asnumpy(), want)

        first_call()  # cold: compiled, written to the cache
        native._loaded.clear()  # as a new process: only the disk cache is left
        before = dict(native.stats)
        first_call()
        # loaded from the object (MCJIT) or from its linked shared library (dlopen)
        assert native.stats["disk_hits"] + native.stats["shared_loads"] > \
            before["disk_hits"] + before["shared_loads"]
        assert native.stats["compiles"] == before["compiles"]
        assert native.stats["ir_generated"] == before["ir_generated"]
    finally:
        config.set_flag("HYBRID_CACHE_DIR", old)


def test_extern_key_is_the_emitters_own():
    """emit.extern_key (read on every compile without importing the extern emitters) is the
    list extern.py's emitters are built from."""
    from compiler.codegen.llvm import emit, extern
    assert emit.extern_key() == extern.extern_key()


# ------------------------------------------------------------------ re-traces
def test_block_retracing_again_and_again_warns_once():
    import warnings

    from hybrid import tracing

    net = hb.nn.HybridSequential()
    net.add(hb.nn.Dense(4))
    net.initialize()
    # static_shape: every size compiles (no shape buckets, which would serve these sizes
    # with 5 graphs: tests/test_buckets.py)
    net.hybridize(backend="reference", static_shape=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in range(1, tracing.RETRACE_WARN + 4):
            net(hb.ones((batch, 3))).wait_to_read()
    mine = [w for w in seen if "re-traced" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in seen]
    text = str(mine[0].message)
    assert "changed shape" in text and "batch size" in text


# ------------------------------------------------------------------ autograd's needs
@pytest.mark.parametrize("op", ["matmul", "conv2d"])
def test_backward_skips_the_gradient_of_an_input_that_takes_none(monkeypatch, op):
    """A first layer's data needs no gradient: eager backward does not compute it (a 51M
    multiply-add GEMM per MLP step); the gradients it computes are the same either way."""
    from hybrid import ndarray
    calls = []
    real = ndarray._eager

    def counting(name, args, attrs):
        calls.append(name)
        return real(name, args, attrs)
    monkeypatch.setattr(ndarray, "_eager", counting)
    rng = np.random.default_rng(2)
    if op == "matmul":
        xa, wa = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
        heavy = ("matmul",)
        f = lambda x, w: (x @ w).sum()  # noqa: E731
    else:
        xa, wa = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
        heavy = ("conv2d_grad_data", "conv2d_grad_weight")
        f = lambda x, w: hb.npx.convolution(x, w, None, kernel=(3, 3), num_filter=4,  # noqa: E731
                                           no_bias=True).sum()
    grads = {}
    for with_x in (False, True):
        x, w = hb.array(xa.astype(np.float32)), hb.array(wa.astype(np.float32))
        w.attach_grad()
        if with_x:
            x.attach_grad()
        with autograd.record():
            y = f(x, w)
        calls.clear()
        y.backward()
        grads[with_x] = (w.grad.asnumpy(), sum(calls.count(h) for h in heavy))
    assert grads[False][1] == 1 and grads[True][1] == 2
    # (a convolution's gradient kernels switch from NumPy to compiled code at a signature's
    # second call: eager_kernels.MIN_CALLS)
    np.testing.assert_allclose(grads[False][0], grads[True][0], rtol=1e-5, atol=1e-6)


_DRAWS = [
    ("uniform", dict(low=-2.0, high=3.0), "float32"),
    ("uniform", dict(low=0.0, high=1.0), "float64"),
    ("normal", dict(loc=1.0, scale=2.0), "float32"),
    ("normal", dict(loc=0.0, scale=1.0), "float64"),
    ("normal", dict(loc=0.0, scale=1.0), "float16"),
    ("uniform", dict(low=-3.0, high=5.0), "float16"),
    ("randint", dict(low=-5, high=7), "int64"),
    ("randint", dict(low=0, high=255), "int32"),
]


@pytest.mark.parametrize("kind,attrs,dtype", _DRAWS,
                         ids=[f"{k}-{d}" for k, _, d in _DRAWS])
def test_large_random_draws_compiled_are_numpys_draws_bit_for_bit(kind, attrs, dtype):
    """An eager draw of LARGE_MIN elements or more runs the compiled generator from its
    signature's second call: the same numbers as the NumPy implementation, call after call
    (each call a fresh key), and the stream goes on as it would have."""
    from compiler.ops.random import _normal_impl, _randint_impl, _uniform_impl  # noqa: PLC0415
    impl = {"uniform": _uniform_impl, "normal": _normal_impl, "randint": _randint_impl}[kind]
    draw = getattr(hb.random, kind)
    shape = (129, 257)  # odd extents: the compiled loop's remainder iterations
    hb.random.seed(11)
    keys = [hb.random.next_key(hb.cpu()) for _ in range(4)]
    hb.random.seed(11)
    before = eager_kernels.stats["native_calls"]
    for key in keys:
        if kind == "randint":
            got = draw(attrs["low"], attrs["high"], size=shape, dtype=dtype)
        else:
            got = draw(size=shape, dtype=dtype, **attrs)
        want = impl(np, np.int64(key), shape, dtype=dtype, **attrs)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.asnumpy(), want)
    assert eager_kernels.stats["native_calls"] >= before + 3, "the compiled draw did not run"
    assert hb.random.next_key(hb.cpu()) != keys[-1]


def test_small_random_draws_compile_too_and_the_flag_keeps_numpy():
    """A draw is ~15 NumPy ops at any size, so a small one compiles as well, from its
    signature's SMALL_DRAW_CALLS-th call (a loop, not a script drawing it a few times);
    HYBRID_EAGER_KERNELS=0 keeps NumPy's; the same numbers either way."""
    def draws():
        hb.random.seed(5)
        return [hb.random.normal(size=(2, 3)).asnumpy() for _ in range(20)]
    before = eager_kernels.stats["native_calls"]
    compiled = draws()  # (calls 1-15 NumPy, then compiled: SMALL_DRAW_CALLS)
    assert eager_kernels.stats["native_calls"] >= before + 20 - eager_kernels.SMALL_DRAW_CALLS
    old = config.set_flag("HYBRID_EAGER_KERNELS", False)
    try:
        before = eager_kernels.stats["native_calls"]
        numpy_drawn = draws()
        assert eager_kernels.stats["native_calls"] == before
    finally:
        config.set_flag("HYBRID_EAGER_KERNELS", old)
    for a, b in zip(compiled, numpy_drawn):
        np.testing.assert_array_equal(a, b)
