"""Each pitfall of hybridizing, with today's behaviour asserted (tinygrad's footgun file)."""
import logging

import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd


def test_python_if_on_a_traced_value_is_refused_with_the_line():
    @hb.hybridize
    def f(x):
        if x.sum() > 0:  # the line the error must name
            return x
        return -x
    with pytest.raises(hb.TraceError, match=r"test_hybridize_footguns.py:\d+.*hb.where"):
        f(hb.ones((2,)))


@pytest.mark.parametrize("method", ["asnumpy", "item", "wait_to_read"])
def test_sync_points_inside_a_trace_are_refused(method):
    @hb.hybridize
    def f(x):
        getattr(x.sum(), method)()
        return x
    with pytest.raises(hb.TraceError, match=method):
        f(hb.ones((2,)))


def test_numpy_conversion_inside_a_trace_is_refused():
    @hb.hybridize
    def f(x):
        return hb.array(np.asarray(x) * 2)
    with pytest.raises(hb.TraceError, match="np.asarray"):
        f(hb.ones((2,)))


def test_inplace_update_inside_forward_is_correct():
    @hb.hybridize(backend="reference")
    def f(x):
        y = x * 1
        y += 1
        y[0] = 10.0
        return y
    out = f(hb.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(out.asnumpy(), [10.0, 3.0, 4.0])
    out = f(hb.array([5.0, 5.0, 5.0]))
    np.testing.assert_array_equal(out.asnumpy(), [10.0, 6.0, 6.0])


def test_print_runs_only_while_tracing(capsys):
    @hb.hybridize
    def f(x):
        print("tracing f")
        return x + 1
    for _ in range(3):
        f(hb.ones((2,)))
    hb.waitall()
    assert capsys.readouterr().out.count("tracing f") == 1


def test_changed_argument_structure_retraces_and_says_why(caplog):
    calls = []

    @hb.hybridize(static_shape=True)  # every size its own trace (no shape buckets, whose
    def f(x, scale):                  # new bucket traces twice: tests/test_buckets.py)
        calls.append(scale)
        return x * scale
    x = hb.ones((2,))
    np.testing.assert_array_equal(f(x, 2.0).asnumpy(), [2, 2])
    np.testing.assert_array_equal(f(x, 3.0).asnumpy(), [3, 3])  # a static value: new trace
    f(hb.ones((3,)), 3.0)
    f(hb.ones((3,)), 3.0)
    assert calls == [2.0, 3.0, 3.0]
    reasons = [r for r, _ in f.cache.retraces]
    assert reasons[0] == "the argument structure changed"
    assert reasons[1] == "array argument 0 changed shape: (2,) -> (3,)"


def test_new_value_does_not_retrace():
    @hb.hybridize
    def f(x):
        return x * 2
    f(hb.ones((2,)))
    f(hb.zeros((2,)))
    assert len(f.cache.entries) == 1


def test_captured_array_is_a_constant_frozen_at_trace_time():
    c = hb.array([1.0, 2.0])

    @hb.hybridize(backend="reference")
    def f(x):
        return x + c
    np.testing.assert_array_equal(f(hb.zeros((2,))).asnumpy(), [1, 2])
    c[:] = 100.0  # not seen: the graph holds the value from trace time
    np.testing.assert_array_equal(f(hb.zeros((2,))).asnumpy(), [1, 2])


def test_traced_value_leaking_out_of_forward_is_refused():
    leaked = []

    @hb.hybridize
    def f(x):
        leaked.append(x * 2)
        return x + 1
    f(hb.ones((2,)))

    @hb.hybridize
    def g(x):
        return x + leaked[0]
    with pytest.raises(hb.TraceError, match="another trace"):
        g(hb.ones((2,)))


def test_returning_a_constant_is_refused():
    c = hb.ones((2,))

    @hb.hybridize
    def f(x):
        return c
    with pytest.raises(hb.TraceError, match="not computed from its inputs"):
        f(hb.ones((2,)))


def test_shape_error_is_raised_at_trace_time_with_line():
    @hb.hybridize
    def f(x, y):
        return x @ y
    with pytest.raises(ValueError, match=r"inner dimensions.*test_hybridize_footguns.py:\d+"):
        f(hb.ones((2, 3)), hb.ones((4, 5)))


def test_gradient_of_hybridized_function_equals_eager():
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    wv = rng.standard_normal((4, 2)).astype(np.float32)

    def f(x, w):
        return (hb.sigmoid(x @ w) * hb.tanh(x).sum(axis=1, keepdims=True)).mean()
    grads = []
    for fn in (f, hb.hybridize(f, backend="reference")):
        x, w = hb.array(xv), hb.array(wv)
        x.attach_grad()
        w.attach_grad()
        with autograd.record():
            y = fn(x, w)
        y.backward()
        grads.append((y.asnumpy(), x.grad.asnumpy(), w.grad.asnumpy()))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_nested_structures_are_preserved():
    @hb.hybridize
    def f(d):
        return {"sum": d["a"] + d["b"][0], "pair": (d["a"] * 2, [d["b"][1] - 1])}
    out = f({"a": hb.ones((2,)), "b": [hb.ones((2,)), hb.zeros((2,))]})
    assert set(out) == {"sum", "pair"}
    np.testing.assert_array_equal(out["sum"].asnumpy(), [2, 2])
    np.testing.assert_array_equal(out["pair"][1][0].asnumpy(), [-1, -1])


def test_error_inside_compiled_call_surfaces_at_sync_point():
    @hb.hybridize(backend="reference")
    def f(x, idx):
        return hb.take(x, idx, mode="raise")
    out = f(hb.ones((3,)), hb.array(np.array([7]), dtype="int64"))  # returns at once
    with pytest.raises(hb.AsyncOpError, match="f"):
        out.asnumpy()
    hb.waitall()


def test_logging_of_captured_constants(caplog):
    logging.getLogger("hybrid.recompiles").propagate = True
    c = hb.ones((2,))
    hb.config.set_flag("HYBRID_LOG", frozenset({"recompiles"}))
    try:
        import runtime.config as rc
        rc.logger("recompiles")
        with caplog.at_level(logging.INFO, logger="hybrid.recompiles"):
            hb.hybridize(lambda x: x + c)(hb.ones((2,)))
        assert any("captured a concrete array" in r.message for r in caplog.records)
    finally:
        hb.config.set_flag("HYBRID_LOG", frozenset())
        rc.logger("recompiles")
        logging.getLogger("hybrid.recompiles").propagate = False
