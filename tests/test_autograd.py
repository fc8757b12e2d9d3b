"""hybrid.autograd: recording scopes, grad_req, head gradients, retain_graph, detach,
stop_gradient, gradients through indexing, autograd.grad(), and an MLP vs finite
differences."""
from __future__ import annotations

import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd


def leaf(values, dtype="float64"):
    x = hb.array(np.asarray(values), dtype=dtype)
    x.attach_grad()
    return x


@pytest.fixture(autouse=True)
def _quiet_engine():
    """Every test leaves the scopes as it found them and no failed op unreported."""
    yield
    hb.waitall()
    assert not autograd.is_recording() and not autograd.is_training()


# ============================================================================ scopes
def test_record_pause_and_modes():
    assert not autograd.is_recording() and not autograd.is_training()
    with autograd.record():
        assert autograd.is_recording() and autograd.is_training()
        with autograd.pause():
            assert not autograd.is_recording() and not autograd.is_training()
            with autograd.train_mode():
                assert autograd.is_training() and not autograd.is_recording()
        with autograd.predict_mode():
            assert autograd.is_recording() and not autograd.is_training()
        with autograd.pause(train_mode=True):
            assert autograd.is_training() and not autograd.is_recording()
        assert autograd.is_recording() and autograd.is_training()
    with autograd.record(train_mode=False):
        assert autograd.is_recording() and not autograd.is_training()
    assert not autograd.is_recording() and not autograd.is_training()


def test_scopes_restore_after_an_exception():
    with pytest.raises(KeyError):
        with autograd.record():
            with autograd.train_mode():
                raise KeyError("boom")
    assert not autograd.is_recording() and not autograd.is_training()


def test_set_recording_and_set_training_return_the_old_state():
    assert autograd.set_recording(True) is False
    assert autograd.is_recording()
    assert autograd.set_training(True) is False
    assert autograd.set_recording(False) is True
    assert autograd.set_training(False) is True


def test_pause_records_nothing():
    x = leaf([1.0, 2.0])
    with autograd.record():
        y = x * 2
        with autograd.pause():
            z = x * 3
    assert y._node is not None and z._node is None
    with pytest.raises(RuntimeError, match="nothing to differentiate"):
        z.backward()
    w = x * 4  # outside record: nothing either
    assert w._node is None


def test_training_mode_switches_dropout():
    x = hb.ones((2000,))
    with autograd.record():
        a = hb.npx.dropout(x, 0.5)
    with autograd.record(train_mode=False):
        b = hb.npx.dropout(x, 0.5)
    with autograd.train_mode():
        c = hb.npx.dropout(x, 0.5)
    kept = a.asnumpy()
    assert 0.4 < np.mean(kept == 0) < 0.6
    np.testing.assert_array_equal(np.unique(kept), [0.0, 2.0])  # inverted dropout
    np.testing.assert_array_equal(b.asnumpy(), 1.0)
    assert 0.4 < np.mean(c.asnumpy() == 0) < 0.6


# ============================================================================ grad_req
def test_grad_req_write_overwrites():
    x = leaf([1.0, 2.0, 3.0])
    assert x.grad is not None and x.grad.shape == (3,) and x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.asnumpy(), 0.0)  # attach_grad starts at zero
    for _ in range(2):
        with autograd.record():
            y = (x * x).sum()
        y.backward()
        np.testing.assert_allclose(x.grad.asnumpy(), 2 * np.array([1.0, 2.0, 3.0]))


def test_grad_req_add_accumulates():
    x = hb.array([1.0, 2.0])
    x.attach_grad(grad_req="add")
    g = x.grad
    for _ in range(3):
        with autograd.record():
            y = (x * x).sum()
        y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 3 * 2 * np.array([1.0, 2.0]))
    assert x.grad is g  # the same array, updated


def test_grad_req_null_and_bad_req():
    x = hb.array([1.0, 2.0])
    x.attach_grad("null")
    assert x.grad is None
    with autograd.record():
        y = (x * x).sum()
    assert y._node is None
    with pytest.raises(ValueError, match="grad_req"):
        x.attach_grad("sometimes")


def test_mixed_grad_reqs():
    a, b, c = hb.array([1.0]), hb.array([2.0]), hb.array([3.0])
    a.attach_grad("write")
    b.attach_grad("add")
    c.attach_grad("null")
    for _ in range(2):
        with autograd.record():
            y = a * b * c
        y.backward()
    np.testing.assert_allclose(a.grad.asnumpy(), [6.0])
    np.testing.assert_allclose(b.grad.asnumpy(), [6.0])  # 3 + 3
    assert c.grad is None


def test_gradient_dtype_follows_the_variable():
    x = leaf([1.0, 2.0], dtype="float32")
    with autograd.record():
        y = (x.astype("float64") * 3).sum()
    y.backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.asnumpy(), [3.0, 3.0])


def test_mark_variables():
    x = hb.array([1.0, 2.0])
    g = hb.zeros((2,))
    autograd.mark_variables([x], [g])
    with autograd.record():
        y = (x * 5).sum()
    y.backward()
    np.testing.assert_allclose(g.asnumpy(), [5.0, 5.0])
    assert x.grad is g


# ============================================================================ heads
def test_head_gradient():
    x = leaf([1.0, 2.0, 3.0])
    with autograd.record():
        y = x * x
    head = hb.array(np.array([1.0, -2.0, 0.5]), dtype="float64")
    y.backward(head)
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * np.array([1.0, 2.0, 3.0]) * [1, -2, 0.5])


def test_default_head_gradient_is_ones():
    x = leaf([[1.0, 2.0], [3.0, 4.0]])
    with autograd.record():
        y = x * 3  # not a scalar: the head gradient is ones, as MXNet
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.full((2, 2), 3.0))


def test_head_gradient_of_wrong_shape_is_refused():
    x = leaf([1.0, 2.0, 3.0])
    with autograd.record():
        y = x * 2
    with pytest.raises(ValueError, match="head gradient has shape"):
        y.backward(hb.ones((2, 3), dtype="float64"))


def test_several_heads():
    x = leaf([1.0, 2.0])
    with autograd.record():
        a = x * x
        b = (x * 3).sum()
    autograd.backward([a, b], [hb.array(np.array([1.0, 2.0]), dtype="float64"), None])
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * np.array([1.0, 2.0]) * [1, 2] + 3)


def test_a_leaf_as_its_own_head():
    x = leaf([1.0, 2.0])
    x.backward(hb.array(np.array([4.0, 5.0]), dtype="float64"))
    np.testing.assert_allclose(x.grad.asnumpy(), [4.0, 5.0])


def test_backward_of_unrecorded_array_raises():
    x = hb.array([1.0])
    with pytest.raises(RuntimeError, match="autograd.record"):
        (x * 2).backward()


def test_reused_input_accumulates():
    x = leaf([1.0, -2.0])
    with autograd.record():
        y = (x * x + x * 3 - x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * np.array([1.0, -2.0]) + 2)


def test_unused_variable_gets_zero():
    x, w = leaf([1.0]), leaf([7.0, 8.0])
    with autograd.record():
        y = x * 2
    y.backward()
    np.testing.assert_array_equal(w.grad.asnumpy(), [0.0, 0.0])


# ============================================================================ retain_graph
def test_retain_graph_allows_a_second_backward():
    x = leaf([1.0, 2.0])
    x.attach_grad("add")
    with autograd.record():
        y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * 2 * np.array([1.0, 2.0]))


def test_second_backward_without_retain_graph_says_why():
    x = leaf([1.0, 2.0])
    with autograd.record():
        y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True") as info:
        y.backward()
    assert "freed" in str(info.value)
    np.testing.assert_allclose(x.grad.asnumpy(), [2.0, 4.0])  # the first one stands


def test_shared_subgraph_freed_by_the_first_backward():
    x = leaf([1.0, 2.0])
    with autograd.record():
        y = hb.exp(x)
        a = (y * 2).sum()
        b = (y * 3).sum()
    a.backward()
    with pytest.raises(RuntimeError, match="freed"):
        b.backward()
    with autograd.record():  # a fresh recording works again
        c = (hb.exp(x) * 3).sum()
    c.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 3 * np.exp([1.0, 2.0]))


# ============================================================================ cutting
def test_detach():
    x = leaf([1.0, 2.0])
    with autograd.record():
        y = x * x
        z = (y.detach() * x).sum()  # y is a constant here
    z.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [1.0, 4.0])
    d = x.detach()
    assert d._node is None and d.grad is None
    np.testing.assert_array_equal(d.asnumpy(), x.asnumpy())


def test_stop_gradient():
    x = leaf([1.0, 2.0])
    with autograd.record():
        y = (hb.stop_gradient(x * x) + x * 5).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [5.0, 5.0])


def test_non_differentiable_ops_cut_the_graph():
    x = leaf([0.5, 1.5, 2.5])
    with autograd.record():
        m = (x > 1).astype("float64")  # a comparison has no gradient
        y = (m * x + hb.floor(x) * x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [0.0 + 0.0, 1.0 + 1.0, 1.0 + 2.0])


def test_inplace_update_of_a_recorded_leaf_is_refused():
    x = leaf([1.0, 2.0])
    with autograd.record():
        with pytest.raises(RuntimeError, match="in-place"):
            x += 1
        with pytest.raises(RuntimeError, match="test_autograd.py"):
            x[0] = 5.0
    x += 1  # outside record it is fine
    np.testing.assert_allclose(x.asnumpy(), [2.0, 3.0])


# ============================================================================ indexing
def _grad_of(fn, values):
    x = leaf(values)
    with autograd.record():
        y = fn(x)
    y.backward()
    return x.grad.asnumpy()


A = np.arange(12.0).reshape(3, 4) / 10


@pytest.mark.parametrize("key", [
    1, (slice(None), 2), (slice(1, 3), slice(None, None, 2)), (slice(None, None, -1),),
    (Ellipsis, slice(3, 0, -2)), ([0, 2, 0],), (slice(None), [3, 3, 1]), ([2, 0], [1, 3]),
    (1, [0, -1]), (None, 2), A > 0.5, (0, slice(None), None),
], ids=lambda k: repr(k)[:30])
def test_gradients_through_indexing(key):
    """d sum(w * x[key]) / dx scatters w back into x's shape (repeats accumulate)."""
    w = np.random.default_rng(0).standard_normal(A[key].shape)
    got = _grad_of(lambda x: (x[key] * hb.array(w, dtype="float64")).sum(), A)
    want = np.zeros(A.size)
    for i in range(A.size):  # indexing is linear: its transpose, one basis vector at a time
        e = np.zeros(A.size)
        e[i] = 1.0
        want[i] = np.sum(e.reshape(A.shape)[key] * w)
    np.testing.assert_allclose(got, want.reshape(A.shape), rtol=1e-12)


def test_gradients_through_shape_functions():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3))
    w = rng.standard_normal((3, 4))
    got = _grad_of(lambda x: (hb.concatenate([x, x * 2], axis=0).T.reshape(3, 4)
                               * hb.array(w, dtype="float64")).sum(), a)
    wt = w.T  # the gradient of the concatenated (4, 3) array
    np.testing.assert_allclose(got, wt[:2] + 2 * wt[2:], rtol=1e-12)
    got = _grad_of(lambda x: hb.stack([x, x], axis=1).sum(axis=(1, 2)).prod(), a)
    s = 2 * a.sum(axis=1)
    np.testing.assert_allclose(got, np.broadcast_to((s.prod() / s * 2)[:, None], (2, 3)))
    got = _grad_of(lambda x: sum(p.sum() * (k + 1) for k, p in enumerate(hb.split(x, 3, 1))),
                   a)
    np.testing.assert_allclose(got, np.broadcast_to([1.0, 2.0, 3.0], (2, 3)))
    got = _grad_of(lambda x: hb.tile(x, (2, 1)).sum() + hb.repeat(x, 3, axis=1).sum(), a)
    np.testing.assert_allclose(got, np.full((2, 3), 5.0))


def test_gradient_through_a_device_copy():
    x = hb.array([1.0, 2.0], dtype="float64", device=hb.cpu(1))
    x.attach_grad()
    with autograd.record():
        y = (x.to(hb.cpu(0)) * 3).sum()
    y.backward()
    assert x.grad.device == hb.cpu(1)
    np.testing.assert_allclose(x.grad.asnumpy(), [3.0, 3.0])


# ============================================================================ grad()
def test_autograd_grad_returns_without_touching_dot_grad():
    x = leaf([1.0, 2.0, 3.0])
    with autograd.record():
        y = (x * x).sum()
    g = autograd.grad(y, x)
    np.testing.assert_allclose(g.asnumpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(x.grad.asnumpy(), 0.0)
    assert x._grad_req == "write"


def test_autograd_grad_several_variables_and_head_grads():
    x, w = leaf([1.0, 2.0]), leaf([3.0, -1.0])
    w.attach_grad("add")
    with autograd.record():
        y = x * w
    gx, gw = autograd.grad([y], [x, w], head_grads=[hb.array(np.array([1.0, 10.0]),
                                                             dtype="float64")])
    np.testing.assert_allclose(gx.asnumpy(), [3.0, -10.0])
    np.testing.assert_allclose(gw.asnumpy(), [1.0, 20.0])
    assert w._grad_req == "add"  # restored


def test_autograd_grad_retain_graph_and_create_graph():
    x = leaf([2.0])
    with autograd.record():
        y = x * x * x
    g1 = autograd.grad(y, x, retain_graph=True)
    g2 = autograd.grad(y, x)
    np.testing.assert_allclose(g1.asnumpy(), [12.0])
    np.testing.assert_allclose(g2.asnumpy(), [12.0])
    with pytest.raises(RuntimeError, match="freed"):
        autograd.grad(y, x)
    with autograd.record():
        z = x * 2
    with pytest.raises(ValueError, match="create_graph"):
        autograd.grad(z, x, create_graph=True)


# ============================================================================ an MLP
def _mlp_numpy(params, x, labels):
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1.T + b1)
    z = h @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


def _mlp_hybrid(params, x, labels):
    w1, b1, w2, b2 = params
    h = hb.tanh(hb.npx.fully_connected(x, w1, b1))
    z = hb.npx.fully_connected(h, w2, b2)
    return -hb.pick(hb.log_softmax(z), labels).mean()


def test_mlp_gradient_matches_finite_differences():
    rng = np.random.default_rng(5)
    shapes = [(6, 4), (6,), (3, 6), (3,)]
    values = [rng.standard_normal(s) * 0.7 for s in shapes]
    x = rng.standard_normal((5, 4))
    labels = np.array([0, 2, 1, 1, 2])
    params = [leaf(v) for v in values]
    with autograd.record():
        loss = _mlp_hybrid(params, hb.array(x, dtype="float64"), hb.array(labels))
    loss.backward()
    np.testing.assert_allclose(loss.item(), _mlp_numpy(values, x, labels), rtol=1e-12)
    eps = 1e-6
    for p, v in zip(params, values):
        fd = np.zeros_like(v)
        for j in np.ndindex(v.shape):
            hi, lo = [u.copy() for u in values], [u.copy() for u in values]
            k = next(i for i, u in enumerate(values) if u is v)
            hi[k][j] += eps
            lo[k][j] -= eps
            fd[j] = (_mlp_numpy(hi, x, labels) - _mlp_numpy(lo, x, labels)) / (2 * eps)
        np.testing.assert_allclose(p.grad.asnumpy(), fd, rtol=1e-6, atol=1e-9)


def test_mlp_training_lowers_the_loss():
    """Plain SGD on the tape: the gradients point downhill."""
    rng = np.random.default_rng(6)
    x = hb.array(rng.standard_normal((32, 4)), dtype="float32")
    labels = hb.array((rng.standard_normal(32) > 0).astype(np.int64))
    params = [leaf(rng.standard_normal(s) * 0.5, "float32") for s in [(8, 4), (8,), (2, 8),
                                                                       (2,)]]
    losses = []
    for _ in range(30):
        with autograd.record():
            loss = _mlp_hybrid(params, x, labels)
        loss.backward()
        losses.append(loss.item())
        for p in params:
            p[:] = p - 0.5 * p.grad  # outside record: an update, not recorded
    assert losses[-1] < 0.7 * losses[0]


def test_a_value_of_a_freed_graph_is_a_constant_in_a_new_recording():
    # chapter 9's RNN training carries the state from batch to batch; MXNet's
    # `for s in state: s.detach()` does not detach in place, and training runs there
    w = leaf([0.5, -0.25])
    w.attach_grad()
    state = leaf([1.0, 1.0])
    grads = []
    for _ in range(3):
        with autograd.record():
            state = hb.tanh(state * w)
            loss = (state * state).sum()
        loss.backward()
        grads.append(w.grad.asnumpy().copy())
    s0 = np.tanh(np.tanh(np.array([1.0, 1.0]) * [0.5, -0.25]) * [0.5, -0.25])
    s1 = np.tanh(s0 * [0.5, -0.25])  # the third batch: d/dw with s0 a constant
    np.testing.assert_allclose(grads[2], 2 * s1 * (1 - s1 ** 2) * s0, rtol=1e-6)
    with pytest.raises(RuntimeError, match="freed"):  # the same graph twice still refuses
        loss.backward()


def test_matmul_gradient_of_a_transposed_operand_takes_its_layout():
    """Dense computes x @ W.T; W.T is an eager transpose's view, stored transposed. Its
    gradient is computed as (g^T x)^T, so the transpose's gradient hands W a C-contiguous
    array (the fused update copied a transposed one every step before); values as NumPy's,
    and the same bits whether or not W.T was computed when the backward ran (the recording,
    not the data, tells)."""
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((5, 7)), rng.standard_normal((3, 7))
    grads = []
    for sync in (True, False):
        x, w = hb.array(xs), hb.array(ws)
        w.attach_grad()
        x.attach_grad()
        with autograd.record():
            wt = w.T
            if sync:
                wt.wait_to_read()
            loss = (hb.matmul(x, wt) ** 2).sum()
        loss.backward()
        g = 2 * (xs @ ws.T)
        np.testing.assert_allclose(w.grad.asnumpy(), g.T @ xs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(x.grad.asnumpy(), g @ ws, rtol=1e-5, atol=1e-5)
        assert w.grad._raw().flags.c_contiguous
        grads.append((w.grad.asnumpy().tobytes(), x.grad.asnumpy().tobytes()))
    assert grads[0] == grads[1]
