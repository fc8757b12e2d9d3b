"""The NDArray front end against NumPy: creation, operators, reductions, shape functions,
indexing, sync points, random streams, asynchronous errors and the naive engine."""
from __future__ import annotations

import numpy as np
import pytest

import hybrid as hb
from compiler.ops import OpError
from runtime import engine as engine_mod


def assert_same(x, expected, rtol=1.3e-6, atol=1e-6):
    """x (an NDArray) equals the NumPy result in shape and values."""
    got = x.asnumpy()
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _no_failure_left_behind():
    """A failed async op that a test did not read fails that test, not a later one."""
    yield
    hb.waitall()


# ============================================================================ creation
@pytest.mark.parametrize("data,want", [
    ([1, 2, 3], "float32"),                        # Python data: float32 by default
    ([[1.5, 2.0]], "float32"),
    (3.0, "float32"),
    ([True, False], "bool"),
    (np.array([1, 2]), "int64"),                   # NumPy data keeps its kind
    (np.array([1, 2], dtype=np.int32), "int32"),
    (np.array([1, 2], dtype=np.uint8), "uint8"),
    (np.array([1, 2], dtype=np.int16), "int64"),   # unsupported integer widths widen
    (np.array([1.0, 2.0]), "float32"),             # float64 data -> the default float
    (np.array([1.0], dtype=np.float16), "float16"),
    (np.array([True]), "bool"),
    (np.float64(2.5), "float32"),
])
def test_array_dtype_defaults(data, want):
    x = hb.array(data)
    assert x.dtype == np.dtype(want)
    assert x.asnumpy().dtype == np.dtype(want)
    np.testing.assert_array_equal(x.asnumpy(), np.asarray(data).astype(want))


def test_array_explicit_dtype_and_copies():
    src = np.arange(6).reshape(2, 3)
    x = hb.array(src, dtype="float64")
    assert x.dtype == np.float64 and x.shape == (2, 3) and x.ndim == 2 and x.size == 6
    src[0, 0] = 100  # the array copied its input
    assert x.asnumpy()[0, 0] == 0
    y = hb.array(x)  # a copy of a hybrid array
    assert y is not x and y.dtype == x.dtype
    assert_same(y, x.asnumpy())
    z = hb.array(x, dtype="int32")
    assert z.dtype == np.int32
    assert hb.asarray(x) is x  # nothing to change: the same array
    assert hb.asarray(x, dtype="float32") is not x
    assert hb.asarray([1, 2]).dtype == np.float32


def test_zeros_ones_full_empty():
    assert_same(hb.zeros((2, 3)), np.zeros((2, 3), np.float32))
    assert hb.zeros((2, 3)).dtype == np.float32
    assert_same(hb.ones(4, dtype="int32"), np.ones(4, np.int32))
    assert hb.ones(4, dtype="int32").dtype == np.int32
    assert_same(hb.full((2, 2), 7), np.full((2, 2), 7.0))
    assert hb.full((2, 2), 7).dtype == np.float32
    assert hb.full((2,), True).dtype == np.bool_
    assert hb.full((2,), 3, dtype="int64").dtype == np.int64
    assert hb.empty((3, 0)).shape == (3, 0)
    assert hb.zeros(()).shape == ()
    assert hb.zeros((2,), device=hb.cpu(1)).device == hb.cpu(1)


def test_like_functions():
    x = hb.array(np.arange(6, dtype=np.int32).reshape(2, 3))
    for fn, value in ((hb.zeros_like, 0), (hb.ones_like, 1), (hb.empty_like, 0)):
        y = fn(x)
        assert y.shape == x.shape and y.dtype == np.int32
        if fn is not hb.empty_like:
            assert_same(y, np.full((2, 3), value, np.int32))
    assert hb.full_like(x, 4).dtype == np.int32
    assert_same(hb.full_like(x, 4, dtype="float32"), np.full((2, 3), 4.0))
    assert hb.ones_like(x, dtype="float64").dtype == np.float64
    assert x.zeros_like().shape == (2, 3) and x.ones_like().dtype == np.int32


def test_arange_linspace_eye():
    assert_same(hb.arange(5), np.arange(5))
    assert hb.arange(5).dtype == np.float32  # float32 by default, as MXNet (docs/book.md)
    assert_same(hb.arange(1, 10, 3), np.arange(1, 10, 3))
    assert_same(hb.arange(5, 0, -2), np.arange(5, 0, -2))
    x = hb.arange(0.0, 1.0, 0.25)
    assert x.dtype == np.float32
    assert_same(x, np.arange(0, 1, 0.25))
    assert hb.arange(3, dtype="float64").dtype == np.float64
    assert hb.arange(3, 3).shape == (0,)
    assert_same(hb.linspace(0, 1, 5), np.linspace(0, 1, 5))
    assert_same(hb.linspace(0, 1, 4, endpoint=False), np.linspace(0, 1, 4, endpoint=False))
    assert hb.linspace(0, 1, 5).dtype == np.float32
    assert_same(hb.eye(3), np.eye(3))
    assert_same(hb.eye(2, 4, k=1), np.eye(2, 4, k=1))
    assert hb.eye(2, dtype="int32").dtype == np.int32


# ============================================================================ operators
BINARY_OPS = [("+", np.add), ("-", np.subtract), ("*", np.multiply), ("/", np.true_divide),
              ("//", np.floor_divide), ("%", np.mod), ("**", np.power)]


@pytest.mark.parametrize("op,ref", BINARY_OPS)
def test_binary_operators_broadcast(op, ref, rng):
    a = rng.uniform(0.5, 2.0, (2, 1, 4)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (3, 1)).astype(np.float32)
    x, y = hb.array(a), hb.array(b)
    f = eval(f"lambda p, q: p {op} q")  # noqa: S307 - the operator under test
    assert_same(f(x, y), ref(a, b), rtol=2e-6)
    assert_same(f(x, 1.5), ref(a, np.float32(1.5)), rtol=2e-6)   # Python scalar right
    assert_same(f(2.0, y), ref(np.float32(2.0), b), rtol=2e-6)   # and left (reflected)
    assert f(x, y).dtype == np.float32 and f(x, 2).dtype == np.float32


def test_unary_operators_and_comparisons(rng):
    a = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
    b = rng.uniform(-2, 2, (4,)).astype(np.float32)
    x, y = hb.array(a), hb.array(b)
    assert_same(-x, -a)
    assert_same(+x, a)
    assert_same(abs(x), np.abs(a))
    for got, want in ((x < y, a < b), (x <= y, a <= b), (x > y, a > b), (x >= y, a >= b),
                      (x == y, a == b), (x != y, a != b), (x > 0, a > 0)):
        assert got.dtype == np.bool_
        assert_same(got, want)
    m, n = x > 0, y > 0
    assert_same(m & n, (a > 0) & (b > 0))
    assert_same(m | n, (a > 0) | (b > 0))
    assert_same(m ^ n, (a > 0) ^ (b > 0))
    assert_same(~m, ~(a > 0))


def test_integer_arithmetic_and_promotion():
    i = hb.array(np.array([7, -7, 3], dtype=np.int32))
    assert_same(i // 2, np.array([3, -4, 1]))
    assert_same(i % 3, np.array([1, 2, 0]))
    assert (i / 2).dtype == np.float32  # true division of integers: float32
    assert_same(i / 2, np.array([3.5, -3.5, 1.5]))
    assert (i * 2).dtype == np.int32 and (i * 2.5).dtype == np.float32
    assert (i + hb.array(np.array([1], dtype=np.int64))).dtype == np.int64
    assert (hb.array(np.array([1], np.int8)) + hb.array(np.array([1], np.uint8))).dtype \
        == np.int32


@pytest.mark.parametrize("op,ref", BINARY_OPS)
def test_inplace_operators(op, ref, rng):
    a = rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (3,)).astype(np.float32)
    x = hb.array(a)
    before = x * 1  # queued before the update: must see the old value
    alias = x
    exec(f"x {op}= hb.array(b)")  # noqa: S102 - the in-place operator under test
    assert alias is x and x.shape == (2, 3) and x.dtype == np.float32
    assert_same(x, ref(a, b), rtol=2e-6)
    assert_same(before, a)


def test_inplace_keeps_shape_and_dtype():
    x = hb.zeros((3,))
    with pytest.raises(ValueError, match="in-place"):
        x += hb.ones((2, 3))  # the result would not fit x
    assert x.shape == (3,)
    i = hb.array(np.arange(3))
    with pytest.raises(TypeError, match="int64"):
        i += 1.5  # NumPy refuses float -> int in place
    with pytest.raises(TypeError):
        i /= 2
    assert i.dtype == np.int64
    assert_same(i, np.arange(3))
    i += 2
    assert i.dtype == np.int64
    assert_same(i, np.arange(3) + 2)
    f = hb.ones((2,))
    f += hb.array(np.array([0.5, 1.5]), dtype="float64")  # same kind: cast back
    assert f.dtype == np.float32 and f.asnumpy().dtype == np.float32
    assert_same(f, [1.5, 2.5])
    s = hb.array(np.array([1, 2], dtype=np.int32))
    s *= hb.array(np.array([3, 4]))  # int64 operand, int32 array: stays int32
    assert s.dtype == np.int32
    assert_same(s, [3, 8])


def test_functions_match_numpy(rng):
    a = rng.uniform(0.1, 2.0, (3, 4)).astype(np.float32)
    x = hb.array(a)
    for name in ("exp", "log", "log1p", "expm1", "sqrt", "square", "sin", "cos", "tanh",
                 "abs", "sign", "floor", "ceil", "round"):
        assert_same(getattr(hb, name)(x), getattr(np, name)(a), rtol=2e-6)
    assert_same(hb.rsqrt(x), 1 / np.sqrt(a), rtol=2e-6)
    assert_same(hb.sigmoid(x), 1 / (1 + np.exp(-a)), rtol=2e-6)
    assert_same(hb.relu(x - 1), np.maximum(a - 1, 0))
    assert_same(hb.negative(x), -a)
    assert_same(hb.clip(x, 0.5, 1.0), np.clip(a, 0.5, 1.0))
    assert_same(x.clip(a_min=1.0), np.clip(a, 1.0, None))
    assert_same(hb.where(x > 1, x, 0.0), np.where(a > 1, a, 0.0))
    assert_same(hb.maximum(x, 1.0), np.maximum(a, 1.0))
    assert_same(hb.power(x, 2), a ** 2, rtol=2e-6)
    assert_same(x.exp(), np.exp(a), rtol=2e-6)
    assert_same(hb.stop_gradient(x), a)


def test_astype_and_copy():
    x = hb.array([1.7, -2.2, 0.0])
    assert_same(x.astype("int32"), np.array([1, -2, 0]))
    assert x.astype("bool").dtype == np.bool_
    assert x.astype("float32", copy=False) is x
    assert x.astype("float32") is not x
    c = x.copy()
    x += 1
    assert_same(c, [1.7, -2.2, 0.0])


# ============================================================================ reductions
REDUCTIONS = ["sum", "mean", "max", "min", "prod"]
AXES = [None, 0, 1, -1, (0, 2), ()]


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, axis, keepdims, rng):
    a = rng.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    x = hb.array(a)
    want = getattr(np, name)(a, axis=axis, keepdims=keepdims)
    # float32 sums of up to 24 terms: NumPy's pairwise order differs from float64's
    assert_same(getattr(hb, name)(x, axis=axis, keepdims=keepdims), want, rtol=1e-5)
    assert_same(getattr(x, name)(axis=axis, keepdims=keepdims), want, rtol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_var_std(axis, rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    x = hb.array(a)
    assert_same(x.var(axis=axis), a.var(axis=axis), rtol=1e-5)
    assert_same(hb.std(x, axis=axis, ddof=1), a.std(axis=axis, ddof=1), rtol=1e-5)
    assert_same(hb.var(x, axis=axis, keepdims=True), a.var(axis=axis, keepdims=True),
                rtol=1e-5)


def test_arg_reductions_and_integer_sums(rng):
    a = rng.permutation(24).reshape(2, 3, 4).astype(np.float32)
    x = hb.array(a)
    for axis in (None, 0, -1):
        assert_same(hb.argmax(x, axis=axis), np.argmax(a, axis=axis))
        assert_same(x.argmin(axis=axis, keepdims=True), np.argmin(a, axis=axis, keepdims=True))
    assert hb.argmax(x).dtype == np.int64
    i = hb.array(np.array([[1, 2], [3, 4]], dtype=np.int32))
    assert hb.sum(i).dtype == np.int64 and hb.sum(i).item() == 10
    assert hb.mean(i).dtype == np.float32 and hb.mean(i).item() == 2.5
    b = hb.array([[True, False], [True, True]])
    assert_same(hb.sum(b, axis=0), [2, 1])
    assert hb.amax is hb.max and hb.amin is hb.min


def test_any_all():
    a = np.array([[0.0, 1.0], [0.0, 0.0]], dtype=np.float32)
    x = hb.array(a)
    assert_same(x.any(), a.any())
    assert_same(x.all(), a.all())
    assert_same(x.any(axis=1), a.any(axis=1))
    assert_same(x.all(axis=0, keepdims=True), a.all(axis=0, keepdims=True))
    assert bool(hb.ones((2, 2)).all())
    empty = hb.zeros((0, 3))
    assert bool(empty.all()) is True and bool(empty.any()) is False  # as NumPy


def test_reduction_errors_name_the_op():
    with pytest.raises(OpError, match=r"max: zero-size.*test_ndarray\.py"):
        hb.max(hb.zeros((0,)))
    with pytest.raises(OpError, match="sum: axis 3 is out of range"):
        hb.zeros((2, 2)).sum(axis=3)


# ============================================================================ matmul
@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)),
                                   ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)),
                                   ((2, 1, 2, 3), (4, 3, 2)), ((3,), (2, 3, 4))])
def test_matmul_shapes(sa, sb, rng):
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    x, y = hb.array(a), hb.array(b)
    assert_same(hb.matmul(x, y), np.matmul(a, b), rtol=1e-5, atol=1e-5)
    assert_same(x @ y, a @ b, rtol=1e-5, atol=1e-5)


def test_dot(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    v = rng.standard_normal(3).astype(np.float32)
    x, u = hb.array(a), hb.array(v)
    assert_same(hb.dot(u, u), np.dot(v, v), rtol=1e-5)
    assert hb.dot(u, u).shape == ()
    assert_same(hb.dot(x, u), np.dot(a, v), rtol=1e-5)
    assert_same(x.dot(x.T), a.dot(a.T), rtol=1e-5)
    s = hb.array(2.0)
    assert_same(hb.dot(s, x), 2 * a)  # a 0-d operand multiplies
    with pytest.raises(ValueError, match="0-d"):
        hb.matmul(s, x)
    with pytest.raises(OpError, match=r"matmul: inner dimensions differ.*test_ndarray\.py"):
        x @ x


# ============================================================================ shapes
def test_reshape_transpose_swapaxes(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x = hb.array(a)
    assert_same(x.reshape(4, 6), a.reshape(4, 6))
    assert_same(x.reshape((-1, 4)), a.reshape(-1, 4))
    assert_same(x.reshape(shape=(24,)), a.reshape(24))
    assert_same(hb.reshape(x, (3, -1)), a.reshape(3, -1))
    assert_same(x.transpose(), a.transpose())
    assert_same(x.transpose(1, 0, 2), a.transpose(1, 0, 2))
    assert_same(x.transpose((2, 0, 1)), a.transpose(2, 0, 1))
    assert_same(hb.transpose(x, (0, 2, 1)), np.transpose(a, (0, 2, 1)))
    assert_same(x.T, a.T)
    assert_same(x.swapaxes(0, 2), a.swapaxes(0, 2))
    assert_same(hb.swapaxes(x, -1, 1), np.swapaxes(a, -1, 1))
    with pytest.raises(OpError, match=r"reshape.*test_ndarray\.py"):
        x.reshape(5, 5)


def test_expand_squeeze_broadcast_flatten(rng):
    a = rng.standard_normal((3, 1, 4)).astype(np.float32)
    x = hb.array(a)
    for axis in (0, 1, -1, 3):
        assert_same(hb.expand_dims(x, axis), np.expand_dims(a, axis))
    assert_same(x.squeeze(), a.squeeze())
    assert_same(hb.squeeze(x, axis=1), np.squeeze(a, axis=1))
    with pytest.raises(ValueError, match="size 3"):
        hb.squeeze(x, axis=0)
    assert_same(hb.broadcast_to(x, (2, 3, 5, 4)), np.broadcast_to(a, (2, 3, 5, 4)))
    assert_same(x.broadcast_to((3, 2, 4)), np.broadcast_to(a, (3, 2, 4)))
    with pytest.raises(OpError, match="broadcast_to"):
        hb.broadcast_to(x, (3, 2, 3))
    assert_same(x.flatten(), a.flatten())          # NumPy's flatten: 1-D
    assert_same(hb.flatten(x), a.reshape(3, 4))     # Gluon's Flatten: (N, rest)
    assert hb.flatten(hb.ones((5,))).shape == (5, 1)


def test_concatenate_stack_split(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((4, 3)).astype(np.float32)
    x, y = hb.array(a), hb.array(b)
    assert_same(hb.concatenate([x, y]), np.concatenate([a, b]))
    assert_same(hb.concat([x, x], axis=1), np.concatenate([a, a], axis=1))
    assert_same(hb.stack([x, x, x]), np.stack([a, a, a]))
    assert_same(hb.stack([x, x], axis=-1), np.stack([a, a], axis=-1))
    assert_same(hb.stack([x, x], axis=1), np.stack([a, a], axis=1))
    for parts, want in ((hb.split(y, 2), np.split(b, 2)),
                        (hb.split(y, [1, 3]), np.split(b, [1, 3])),
                        (hb.split(y, 3, axis=1), np.split(b, 3, axis=1)),
                        (hb.split(y, [2, 2], axis=0), np.split(b, [2, 2], axis=0))):
        assert len(parts) == len(want)
        for p, w in zip(parts, want):
            assert_same(p, w)
    with pytest.raises(ValueError, match="equal sections"):
        hb.split(y, 3)
    with pytest.raises(OpError, match="concatenate"):
        hb.concatenate([x, hb.ones((2, 2))])


@pytest.mark.parametrize("reps", [2, (2, 1), (1, 3), (2, 1, 2)])
def test_tile(reps, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    assert_same(hb.tile(hb.array(a), reps), np.tile(a, reps))
    assert_same(hb.array(a).tile(reps), np.tile(a, reps))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_repeat(axis, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    assert_same(hb.repeat(hb.array(a), 3, axis=axis), np.repeat(a, 3, axis=axis))
    assert_same(hb.array(a).repeat(2, axis), np.repeat(a, 2, axis=axis))


# ============================================================================ nn-ish
def _np_softmax(a, axis):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_log_softmax(axis, rng):
    a = (rng.standard_normal((3, 5)) * 10).astype(np.float32)
    x = hb.array(a)
    assert_same(hb.softmax(x, axis=axis), _np_softmax(a, axis), rtol=1e-5, atol=1e-7)
    assert_same(hb.log_softmax(x, axis=axis), np.log(_np_softmax(a.astype(np.float64), axis)),
                rtol=1e-5, atol=1e-5)
    big = hb.array([[1000.0, 1000.0, -1000.0]])  # stable: no overflow
    assert_same(hb.softmax(big), [[0.5, 0.5, 0.0]])
    assert_same(hb.npx.softmax(x, axis=axis), _np_softmax(a, axis), rtol=1e-5, atol=1e-7)


def test_one_hot():
    idx = hb.array(np.array([0, 2, 1, 2]))
    assert_same(hb.one_hot(idx, 3), np.eye(3, dtype=np.float32)[[0, 2, 1, 2]])
    assert hb.one_hot(idx, 3).dtype == np.float32
    h = hb.one_hot(idx, 4, on_value=5.0, off_value=-1.0, dtype="int32")
    assert h.dtype == np.int32
    assert_same(h, np.where(np.eye(4)[[0, 2, 1, 2]] > 0, 5, -1))
    labels = hb.array([1.0, 0.0])  # float labels, as data loaders give them
    assert_same(hb.one_hot(labels, 2), [[0, 1], [1, 0]])


def test_take_and_pick(rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    x = hb.array(a)
    assert_same(hb.take(x, [0, 3, 3]), np.take(a, [0, 3, 3], axis=0))
    assert_same(x.take(hb.array(np.array([[2, 0]])), axis=1), np.take(a, [[2, 0]], axis=1))
    assert_same(hb.take(x, [-1, 9], mode="clip"), np.take(a, [-1, 9], axis=0, mode="clip"))
    with pytest.raises(IndexError, match="9 is out of bounds"):  # NumPy's default: raise
        hb.take(x, [-1, 9]).asnumpy()
    assert_same(hb.take(x, [-1, 5], mode="wrap"), np.take(a, [-1, 5], axis=0, mode="wrap"))
    i = hb.array(np.array([2, 0, 1, 0]))
    assert_same(hb.pick(x, i), a[np.arange(4), [2, 0, 1, 0]])
    assert_same(hb.pick(x, hb.array(np.array([1, 3, 0])), axis=0), a[[1, 3, 0], [0, 1, 2]])
    assert_same(hb.npx.pick(x, i, keepdims=True), a[np.arange(4), [2, 0, 1, 0]][:, None])
    assert_same(hb.pick(x, hb.array(np.array([5, -1, 1, 0]))),  # out of range: clipped
                a[np.arange(4), [2, 0, 1, 0]])


# ============================================================================ indexing
A = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
GET_KEYS = [
    0, -1, (1, 2), (1, 2, 3), (-1, -1, -1), slice(None), slice(1, None), (slice(None), 1),
    (Ellipsis, 2), (0, Ellipsis), (None, 0), (slice(None), None, 1), (1, slice(None, None, 2), -1),
    (slice(None, None, -1),), (slice(None), slice(None, None, -1)),           # reversed
    (slice(None), slice(2, 0, -1), slice(3, None, -2)), (Ellipsis, slice(-2, None, -1)),
    (slice(5, 9),), (slice(None), slice(1, 1)),                              # empty
    ([0, 1],), ([1, 0, 1],), (slice(None), [2, 0]), ([1, 0], [2, 1]), (0, [1, 2]),
    ([1, 0], 0), (slice(None), [0, 1], [1, 2]), ([-1],), (Ellipsis, [-1, 0]),
    (np.array([[0, 1], [1, 0]]),), (slice(None), np.array([2, 1, 2])), (range(2),),
    (1, slice(None), [3, 0]), ([1, 0], slice(None), 2),  # split groups: array axes first
    (1, slice(None), [[3], [0]]), (0, slice(None), np.array(2)),
]


@pytest.mark.parametrize("key", GET_KEYS, ids=[str(i) for i in range(len(GET_KEYS))])
def test_getitem_matches_numpy(key):
    x = hb.array(A)
    assert_same(x[key], A[key])


def test_getitem_with_hybrid_index_and_mask():
    x = hb.array(A)
    assert_same(x[hb.array(np.array([1, 0]))], A[[1, 0]])
    assert_same(x[:, hb.array(np.array(2))], A[:, 2])  # a 0-d integer array
    mask = A[..., 0] > 5
    assert_same(x[mask], A[mask])
    assert_same(x[hb.array(mask)], A[mask])
    flat = hb.array(A.reshape(-1))
    assert_same(flat[flat > 10], A.reshape(-1)[A.reshape(-1) > 10])


@pytest.mark.parametrize("key,exc", [((0, 0, 0, 0), IndexError), (2, IndexError),
                                     ((0, -4), IndexError), ((Ellipsis, Ellipsis), IndexError),
                                     (1.5, IndexError), (True, IndexError),
                                     (([0], None, [1]), IndexError)])
def test_getitem_errors(key, exc):
    with pytest.raises(exc):
        hb.array(A)[key]


SET_CASES = [
    (0, 5.0), ((1, 2), -1.0), ((1, 2, 3), 7.0), (slice(None), 0.0),
    ((slice(None), 1), np.arange(4)), ((Ellipsis, 0), np.arange(3)),
    ((slice(None), slice(None), 0), np.ones((2, 3))), ((0, slice(None, None, 2)), 9.0),
    ((slice(None, None, -1),), np.arange(24).reshape(2, 3, 4)),          # reversed
    ((slice(None), slice(None, None, -1), 0), np.array([1.0, 2.0, 3.0])),
    ((1, slice(2, 0, -1)), np.arange(8).reshape(2, 4)),
    ((slice(None), slice(1, 1)), 3.0),                                     # empty region
    ((None, 0), np.arange(12).reshape(1, 3, 4)),
]


@pytest.mark.parametrize("key,value", SET_CASES, ids=[str(i) for i in range(len(SET_CASES))])
def test_setitem_matches_numpy(key, value):
    want = A.copy()
    want[key] = value
    x = hb.array(A)
    before = x + 0  # queued before the assignment: must keep the old value
    x[key] = value if np.isscalar(value) else hb.array(np.asarray(value, np.float32))
    assert_same(x, want)
    assert_same(before, A)
    y = hb.array(A)
    y[key] = value if np.isscalar(value) else np.asarray(value)  # NumPy values too
    assert_same(y, want)
    assert y.dtype == np.float32


def test_setitem_casts_and_errors():
    i = hb.array(np.zeros((2, 3), dtype=np.int32))
    i[0] = 2.7  # cast to the array's dtype, as NumPy
    i[1, 1:] = hb.array([5.0, 6.0])
    assert i.dtype == np.int32
    assert_same(i, [[2, 2, 2], [0, 5, 6]])
    x = hb.zeros((2, 3))
    with pytest.raises(ValueError, match="broadcast"):
        x[0] = hb.ones((2,))
    with pytest.raises(IndexError, match="integer-array"):
        x[[0, 1]] = 1.0
    with pytest.raises(IndexError):
        x[5] = 1.0


# ============================================================================ sync points
def test_sync_points():
    x = hb.array([[1.5, 2.5]])
    a = x.asnumpy()
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    a[0, 0] = 100  # a copy: the array is unchanged
    assert x.asnumpy()[0, 0] == 1.5
    np.testing.assert_array_equal(np.asarray(x), [[1.5, 2.5]])
    assert np.array(x, dtype=np.float64).dtype == np.float64
    assert x.tolist() == [[1.5, 2.5]]
    assert hb.array([[3.5]]).item() == 3.5
    assert isinstance(hb.array(np.array([2])).item(), int)
    with pytest.raises(ValueError, match="one element"):
        x.item()
    assert float(hb.array([2.5])) == 2.5 and int(hb.array([3.0])) == 3
    assert [10, 20, 30][hb.array(np.array(1))] == 20
    with pytest.raises(TypeError):
        [1, 2][hb.array(1.0)]
    assert x.wait_to_read() is x
    hb.waitall()


def test_bool_len_iter():
    assert bool(hb.array([1.0])) is True
    assert bool(hb.array(0.0)) is False
    with pytest.raises(ValueError, match="ambiguous"):
        bool(hb.array([1.0, 2.0]))
    assert len(hb.zeros((4, 2))) == 4
    with pytest.raises(TypeError, match="0-d"):
        len(hb.array(1.0))
    with pytest.raises(TypeError):
        iter(hb.array(1.0)).__next__()
    rows = list(hb.array(np.arange(6).reshape(3, 2)))
    assert len(rows) == 3 and rows[2].tolist() == [4, 5]


def test_repr_and_str():
    r = repr(hb.array([1.0, 2.0]))
    assert r.startswith("array(") and "1." in r and "2." in r and "dtype" not in r
    assert "dtype=int64" in repr(hb.array(np.array([1, 2])))
    assert "device=cpu(1)" in repr(hb.array([1.0], device=hb.cpu(1)))
    assert str(hb.array([1.0, 2.0])) == str(np.array([1.0, 2.0], dtype=np.float32))
    with pytest.raises(TypeError, match="picklable"):
        import pickle
        pickle.dumps(hb.array([1.0]))


def test_program_order_across_rebinds():
    """In-place updates rebind the array; ops queued earlier still see the old value."""
    x = hb.ones((64, 64))
    outs = []
    for k in range(20):
        outs.append(x * 1)
        x += 1
        x[0, 0] = -k
    for k, o in enumerate(outs):
        want = np.full((64, 64), k + 1.0, dtype=np.float32)
        if k:
            want[0, 0] = -(k - 1)
        assert_same(o, want)
    hb.waitall()


# ============================================================================ devices
def test_device_placement_and_copies():
    x = hb.array([1.0, 2.0], device=hb.cpu(1))
    assert x.device == hb.cpu(1) and x.ctx == hb.cpu(1) and x.context == hb.cpu(1)
    y = x.to(hb.cpu(0))
    assert y.device == hb.cpu(0)
    assert_same(y, [1.0, 2.0])
    assert x.to("cpu:1") is x
    z = x.copyto(hb.cpu(0))
    assert z.device == hb.cpu(0)
    dst = hb.zeros((2,), dtype="float64")
    x.copyto(dst)
    assert dst.dtype == np.float64
    assert_same(dst, [1.0, 2.0])
    with hb.cpu(1):
        w = hb.ones((2,))
    assert w.device == hb.cpu(1)
    assert (w + x).device == hb.cpu(1)


def test_device_mismatch_names_both_devices():
    x = hb.ones((2,), device=hb.cpu(0))
    y = hb.ones((2,), device=hb.cpu(1))
    with pytest.raises(ValueError) as info:
        x + y
    msg = str(info.value)
    assert "cpu(0)" in msg and "cpu(1)" in msg and "add" in msg
    assert "test_ndarray.py" in msg


def test_shape_error_names_op_and_user_line():
    x, y = hb.ones((2, 3)), hb.ones((4,))
    with pytest.raises(OpError) as info:
        x * y  # the line the message must point at
    msg = str(info.value)
    assert msg.startswith("mul:") and "(2, 3)" in msg and "(4,)" in msg
    assert "test_ndarray.py:" in msg
    line = int(msg.rsplit("test_ndarray.py:", 1)[1].split(")")[0])
    import inspect
    src = inspect.getsourcelines(test_shape_error_names_op_and_user_line)
    offset = next(i for i, s in enumerate(src[0]) if "x * y" in s)
    assert line == src[1] + offset


def test_non_array_operand_is_refused():
    with pytest.raises(TypeError, match="hb.array"):
        hb.ones((2,)) + np.ones(2).tolist()


# ============================================================================ random
def test_random_same_seed_same_numbers():
    hb.random.seed(42)
    a = hb.random.normal(size=(5, 4)).asnumpy()
    b = hb.random.uniform(-1, 1, size=(3,)).asnumpy()
    c = hb.random.randint(0, 10, size=(8,)).asnumpy()
    hb.random.seed(42)
    np.testing.assert_array_equal(hb.random.normal(size=(5, 4)).asnumpy(), a)
    np.testing.assert_array_equal(hb.random.uniform(-1, 1, size=(3,)).asnumpy(), b)
    np.testing.assert_array_equal(hb.random.randint(0, 10, size=(8,)).asnumpy(), c)
    assert not np.array_equal(hb.random.normal(size=(5, 4)).asnumpy(), a)  # the stream moves
    hb.random.seed(43)
    assert not np.array_equal(hb.random.normal(size=(5, 4)).asnumpy(), a)
    assert a.dtype == np.float32 and c.dtype == np.int64
    assert b.min() >= -1 and b.max() < 1 and c.min() >= 0 and c.max() < 10


def test_random_devices_have_their_own_streams():
    hb.random.seed(7)
    a0 = hb.random.uniform(size=(6,), device=hb.cpu(0)).asnumpy()
    hb.random.seed(7)
    a1 = hb.random.uniform(size=(6,), device=hb.cpu(1))
    assert a1.device == hb.cpu(1)
    assert not np.array_equal(a0, a1.asnumpy())  # another device: another stream
    hb.random.seed(7)
    hb.random.uniform(size=(6,), device=hb.cpu(1))  # a draw elsewhere does not shift cpu(0)
    np.testing.assert_array_equal(hb.random.uniform(size=(6,), device=hb.cpu(0)).asnumpy(), a0)
    hb.random.seed(5, device=hb.cpu(1))  # seeding one device only
    b = hb.random.normal(size=(4,), device=hb.cpu(1)).asnumpy()
    hb.random.seed(5, device=hb.cpu(1))
    np.testing.assert_array_equal(hb.random.normal(size=(4,), device=hb.cpu(1)).asnumpy(), b)


def test_random_shuffle_and_permutation():
    hb.random.seed(3)
    p = hb.random.permutation(10)
    assert sorted(p.tolist()) == list(range(10))
    x = hb.array(np.arange(8.0))
    hb.random.shuffle(x)
    assert sorted(x.asnumpy().tolist()) == list(range(8))
    with pytest.raises(OpError, match="high"):
        hb.random.randint(5, 5)


# ============================================================================ async errors
def test_async_error_surfaces_at_the_sync_point():
    x = hb.array([1.0, 2.0, 3.0])
    y = hb.take(x, hb.array(np.array([0, 5])), mode="raise")  # returns at once
    z = y * 2  # depends on the failed op: does not run, fails the same way
    with pytest.raises(hb.AsyncOpError) as info:
        y.asnumpy()
    msg = str(info.value)
    assert "'take'" in msg and "out of bounds" in msg and "test_ndarray.py" in msg
    assert info.value.op_name == "take"
    with pytest.raises(hb.AsyncOpError, match="'take'"):
        z.wait_to_read()
    with pytest.raises(hb.AsyncOpError):  # a failed value stays failed
        y.asnumpy()
    hb.waitall()  # already reported: waitall does not raise it again
    assert_same(x + 1, [2.0, 3.0, 4.0])  # the engine goes on
    assert_same(hb.take(x, [2, 0], mode="raise"), [3.0, 1.0])


def test_async_error_reported_by_waitall_once():
    x = hb.array([1.0])
    hb.take(x, hb.array(np.array([3])), mode="raise")  # nobody reads it
    with pytest.raises(hb.AsyncOpError, match="'take'"):
        hb.waitall()
    hb.waitall()
    assert_same(x * 3, [3.0])


# ============================================================================ naive engine
def _workload():
    """A bit of everything; returns NumPy results."""
    hb.random.seed(11)
    x = hb.random.normal(size=(8, 5))
    w = hb.random.uniform(-1, 1, size=(5, 3))
    y = hb.tanh(x @ w) + 1
    y[0] = 0.0
    y += hb.sum(x, axis=1, keepdims=True) * 0.1
    w.attach_grad()
    with hb.autograd.record():
        loss = (hb.softmax(x @ w) * hb.one_hot(hb.array(np.arange(8) % 3), 3)).sum()
    loss.backward()
    return {"y": y.asnumpy(), "idx": x[[1, 3], 2:].asnumpy(), "grad": w.grad.asnumpy(),
            "max": hb.argmax(y, axis=0).asnumpy(), "loss": loss.asnumpy(),
            "r": hb.random.randint(0, 100, size=(6,)).asnumpy()}


@pytest.fixture
def naive_engine():
    engine_mod.get_engine()
    old = engine_mod.set_engine(engine_mod.Engine(mode="naive"))
    try:
        yield engine_mod.get_engine()
    finally:
        engine_mod.set_engine(old)


def test_naive_engine_gives_identical_results(naive_engine):
    assert engine_mod.get_engine().mode == "naive"
    naive = _workload()
    engine_mod.set_engine(_threaded := engine_mod.Engine(mode="threaded"))
    try:
        threaded = _workload()
    finally:
        engine_mod.set_engine(naive_engine)
        _threaded.shutdown()
    assert naive.keys() == threaded.keys()
    for k in naive:
        np.testing.assert_array_equal(naive[k], threaded[k], err_msg=k)


def test_naive_engine_errors_and_recovery(naive_engine):
    x = hb.array([1.0, 2.0])
    y = hb.take(x, hb.array(np.array([7])), mode="raise")  # runs now, in the caller
    with pytest.raises(hb.AsyncOpError, match="'take'"):
        y.asnumpy()
    assert_same(x * 2, [2.0, 4.0])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "bool"])
def test_bitwise_operators_are_numpys(dtype):
    # they were logical on every dtype: 5 & 3 gave True where NumPy gives 1
    rng = np.random.default_rng(0)
    if dtype == "bool":
        a, b = rng.random(6) < 0.5, rng.random(6) < 0.5
    else:
        info = np.iinfo(dtype)
        a, b = (rng.integers(info.min, info.max, 6, dtype=dtype) for _ in range(2))
    x, y = hb.array(a, dtype=dtype), hb.array(b, dtype=dtype)
    for got, want in ((x & y, a & b), (x | y, a | b), (x ^ y, a ^ b), (~x, ~a),
                      (hb.bitwise_and(x, y), np.bitwise_and(a, b)),
                      (hb.invert(x), np.invert(a))):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.asnumpy(), want)
    if dtype != "bool":
        k = (np.arange(6) % 9).astype(dtype)  # counts up to and past the width of int8
        s = hb.array(k, dtype=dtype)
        for got, want in ((x << s, a << k), (x >> s, a >> k), (hb.right_shift(x, 1), a >> 1),
                          (1 << s, 1 << k)):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.asnumpy(), want)
        np.testing.assert_array_equal((1 & x).asnumpy(), 1 & a)  # reflected, weak scalar
        z = hb.array(a, dtype=dtype)
        z |= y
        np.testing.assert_array_equal(z.asnumpy(), a | b)

    @hb.hybridize(backend="llvm")
    def f(p, q):
        return (p & q) ^ ~p | q
    np.testing.assert_array_equal(f(x, y).asnumpy(), (a & b) ^ ~a | b)


def test_bitwise_operators_refuse_floats_as_numpy_does():
    from compiler.ops import OpError
    with pytest.raises(OpError, match="bitwise_and.*dtype float32"):
        hb.array([1.5]) & hb.array([2.0])
