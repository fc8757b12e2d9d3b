"""The eager front end's fast path: the cache of inferred types must never change an answer.

A repeated call with the same argument types and attributes reuses its inferred output types;
everything that could change them is part of the key (shapes, dtypes, a scalar's type, typed
attribute values), unhashable attributes bypass the cache, and errors are never cached.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import hybrid as hb
from compiler.ops import OpError
from compiler.ops.core import InferCache, attrs_key, dtype_name, result_dtype
from hybrid import ndarray as nd
from runtime import engine as engine_mod
from runtime.engine import AsyncOpError, Engine


@pytest.fixture(autouse=True)
def _drain():
    yield
    hb.waitall()


# ------------------------------------------------------------------ attribute keys
def test_attrs_key_tells_equal_but_different_values_apart():
    keys = [attrs_key({"a": v}) for v in (1, 1.0, True, (1,), [1], "1", None, np.int64(1),
                                          np.float32(1), (1.0,), (True,))]
    assert len(set(keys)) == len(keys)
    assert attrs_key({}) == ()
    assert attrs_key({"axes": (1, 0)}) == attrs_key({"axes": (1, 0)})
    assert attrs_key({"a": 1, "b": 2}) != attrs_key({"a": 2, "b": 1})


def test_attrs_key_refuses_values_without_plain_equality():
    assert attrs_key({"a": np.ones(2)}) is None
    assert attrs_key({"a": (1, np.ones(2))}) is None
    assert attrs_key({"a": object()}) is None
    assert attrs_key({"a": {"k": 1}}) is None


def test_infer_cache_is_a_bounded_lru():
    c = InferCache(maxsize=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the most recent
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3
    assert len(c) == 2


# ------------------------------------------------------------------ types via the cache
def test_repeated_op_hits_the_cache_and_stays_correct():
    x = hb.array([[1.0, 2.0]])
    first = (x + 1).asnumpy()
    n = len(nd._INFER)
    for _ in range(5):
        np.testing.assert_array_equal((x + 1).asnumpy(), first)
    assert len(nd._INFER) == n


def test_scalar_type_is_part_of_the_key():
    i = hb.array(np.array([1, 2], dtype=np.int32))
    assert (i + 1).dtype == np.int32
    assert (i + 1.5).dtype == np.float32  # a float scalar after an int one: not the cached int
    np.testing.assert_allclose((i + 1.5).asnumpy(), [2.5, 3.5])
    assert (i + np.float64(0.5)).dtype == np.float32
    assert (i + True).dtype == np.int32  # a bool beside a number: NumPy's 1
    np.testing.assert_array_equal(i + True, [2, 3])
    b = hb.array(np.array([True, False]))
    assert (b + 1).dtype == np.int64
    with pytest.raises(OpError, match="bool"):
        b + True  # add refuses bool with bool: the int64 entry of ``b + 1`` must not answer
    assert hb.where(b, b, True).dtype == np.bool_
    assert hb.where(b, b, 1).dtype == np.int64
    assert hb.where(b, b, 1.0).dtype == np.float32
    np.testing.assert_array_equal(hb.where(b, b, 7).asnumpy(), [1, 7])


def test_shapes_and_dtypes_are_part_of_the_key():
    a = hb.ones((2, 3))
    assert (a + 1).shape == (2, 3)
    assert (hb.ones((4,)) + 1).shape == (4,)
    assert (a.astype("float64") + 1).dtype == np.float64
    assert (a + hb.ones((3,))).shape == (2, 3)
    assert (a + hb.ones((1, 3))).shape == (2, 3)


def test_attribute_values_are_part_of_the_key():
    x = hb.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert hb.sum(x, axis=0).shape == (3,)
    assert hb.sum(x, axis=1).shape == (2,)
    assert hb.sum(x, axis=1, keepdims=True).shape == (2, 1)
    assert hb.sum(x, axis=(0, 1)).shape == ()
    assert hb.transpose(x, (1, 0)).shape == (3, 2)
    assert hb.transpose(x, [1, 0]).shape == (3, 2)
    assert x.reshape(3, 2).shape == (3, 2)
    assert x.reshape(6).shape == (6,)


def test_errors_are_raised_every_time_with_the_users_line():
    x, y = hb.ones((2, 3)), hb.ones((4,))
    src, start = inspect.getsourcelines(test_errors_are_raised_every_time_with_the_users_line)
    for _ in range(3):
        with pytest.raises(OpError) as info:
            x * y  # the line the message must point at
        msg = str(info.value)
        line = int(msg.rsplit("test_eager_dispatch.py:", 1)[1].split(")")[0])
        assert line == start + next(i for i, s in enumerate(src) if "x * y  #" in s)
    assert (x * hb.ones((3,))).shape == (2, 3)  # a good call after bad ones


def test_unknown_attribute_is_refused_every_time():
    x = hb.ones((2,))
    for _ in range(2):
        with pytest.raises(OpError, match="unknown attribute"):
            nd.apply("add", (x, x), {"bogus": 1})


def test_unhashable_attribute_skips_the_cache():
    nd._INFER._map.clear()  # a full cache (4096 signatures, after the fuzzer) would not grow
    x = hb.array([[1.0, 5.0]])
    lo = np.float32(2.0)
    out = nd.apply("clip", (x,), {"a_min": lo, "a_max": None})
    np.testing.assert_allclose(out.asnumpy(), [[2.0, 5.0]])
    n = len(nd._INFER)
    out = nd.apply("reshape", (x,), {"shape": [2, 1]})  # a list: a typed key
    np.testing.assert_allclose(out.asnumpy(), [[1.0], [5.0]])
    assert len(nd._INFER) == n + 1


def test_async_failure_names_the_users_line():
    old = engine_mod.set_engine(Engine(mode="naive"))
    try:
        x = hb.array([1.0, 2.0])
        with np.errstate(divide="raise"):
            y = x / 0.0  # fails inside the op
        line = inspect.currentframe().f_lineno - 1
        with pytest.raises(AsyncOpError) as info:
            y.wait_to_read()
        assert info.value.where == (__file__, line)
    finally:
        engine_mod.set_engine(old)


def test_multi_output_and_gradients_still_work():
    x = hb.array([[1.0, -2.0, 3.0]])
    x.attach_grad()
    with hb.autograd.record():
        y = (hb.relu(x) * 2 + 1).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), [[2.0, 0.0, 2.0]])


# ------------------------------------------------------------------ the fast paths in core
def test_dtype_name_fast_path_matches_numpy():
    for d in ("float32", np.float32, np.dtype("float32"), "f4", "<f4", float, int, bool,
              np.int8, "uint8", np.dtype("int64"), None):
        want = "float32" if d is None else np.dtype(d).name
        assert dtype_name(d) == want
    with pytest.raises(OpError):
        dtype_name("complex64")
    with pytest.raises(OpError):
        dtype_name("no such dtype")


@pytest.mark.parametrize("args,want", [
    (("float32", "float32"), "float32"),
    (("int8", "uint8"), "int32"),
    (("int32", "float16"), "float64"),  # NumPy's rule
    (("int64", 1.0), "float32"),
    (("bool", 1), "int64"),
    ((True, 1), "int64"),
    ((1.0, 1), "float32"),
])
def test_result_dtype(args, want):
    arrays = [np.zeros(1, a) if isinstance(a, str) else a for a in args]
    assert result_dtype(*arrays) == want
