"""Issue 20, "hybridized means the same program": an empty batch, placement, and intake.

Each test failed before its fix. Where a choice was made it is said in the test's docstring:
NumPy / MXNet Gluon / PyTorch behaviour is the reference, and where they differ the one that
never silently changes a result wins.
"""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, nn

BACKENDS = ["eager", "reference", "llvm"]


def _hybridize(net, mode):
    if mode != "eager":
        net.hybridize(backend=mode)
    return net


# ------------------------------------------------------------ item 6: an empty batch
@pytest.mark.parametrize("mode", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 3), (0, 3, 4, 4), (2, 3, 0, 4)])
def test_empty_batch_leaves_batchnorm_running_stats(mode, shape):
    """A training call on a batch with no element per channel has no statistics: the running
    mean/var stay as they were (PyTorch does the same) instead of becoming NaN for good, and
    the output has the input's empty shape — eagerly and on every backend."""
    bn = nn.BatchNorm(in_channels=3)
    bn.initialize()
    x = hb.array(np.random.default_rng(0).standard_normal((5,) + shape[1:]))
    with autograd.record():
        bn(x)  # one real batch first: the stats are not the initial ones
    before = (bn.running_mean.data().asnumpy(), bn.running_var.data().asnumpy())
    _hybridize(bn, mode)
    empty = hb.zeros(shape)
    with autograd.record():
        y = bn(empty)
        loss = y.sum()
    loss.backward()
    assert y.shape == shape
    np.testing.assert_array_equal(bn.running_mean.data().asnumpy(), before[0])
    np.testing.assert_array_equal(bn.running_var.data().asnumpy(), before[1])
    np.testing.assert_array_equal(bn.gamma.grad().asnumpy(), np.zeros(3, "float32"))
    # and the layer still trains and predicts afterwards
    with autograd.record():
        bn(x)
    assert np.isfinite(bn.running_mean.data().asnumpy()).all()
    assert np.isfinite(bn(x).asnumpy()).all()


@pytest.mark.parametrize("mode", BACKENDS)
def test_empty_batch_through_a_net(mode):
    net = nn.HybridSequential()
    net.add(nn.Dense(4), nn.BatchNorm(), nn.Dense(2))
    net.initialize()
    net(hb.ones((2, 3)))
    _hybridize(net, mode)
    with autograd.record():
        y = net(hb.zeros((0, 3)))
    assert y.shape == (0, 2)
    np.testing.assert_array_equal(net[1].running_mean.data().asnumpy(), np.zeros(4))
    np.testing.assert_array_equal(net[1].running_var.data().asnumpy(), np.ones(4))


@pytest.mark.parametrize("bad", [0, -4, 0.0, float("nan"), None, True])
def test_trainer_step_refuses_an_empty_batch(bad):
    """``step(0)`` divided by zero (a bare ZeroDivisionError, as in Gluon); a negative size
    would silently flip the update. Both are a ValueError naming batch_size, raised before
    any gradient is summed or any weight moves."""
    net = nn.Dense(2)
    net.initialize()
    x = hb.ones((3, 4))
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    w = net.weight.data().asnumpy()
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="batch_size must be a positive number"):
        trainer.step(bad)
    np.testing.assert_array_equal(net.weight.data().asnumpy(), w)
    trainer.step(3)  # the trainer is still usable
    assert not np.array_equal(net.weight.data().asnumpy(), w)


# ------------------------------------------------------------ item 7: placement
def _exported(tmp_path, backend):
    net = nn.HybridSequential()
    net.add(nn.Dense(4, activation="relu"), nn.Dense(2))
    net.initialize()
    x = hb.array(np.random.default_rng(1).standard_normal((3, 5)))
    want = net(x).asnumpy()
    net.hybridize(backend=backend)
    path = str(tmp_path / "mlp")
    net.export(path, example_inputs=(x,))
    return path, x, want


@pytest.mark.parametrize("backend", ["reference", "llvm"])
def test_load_runs_on_the_device_asked_for(tmp_path, backend):
    """``hb.load(path, device=cpu(1))`` ran the graph on the exporter's cpu(0) (the nodes
    keep the device they were traced on) and returned arrays there. Now every node, weight
    and output is on cpu(1), at the exported batch size and at any other."""
    path, x, want = _exported(tmp_path, backend)
    dev = hb.cpu(1)
    deployed = hb.load(path, device=dev, backend=backend)
    g = deployed.graph
    assert {g.node(n).get("device") for n in g.g.nodes} == {"cpu(1)"}
    assert all(p.device == dev for p in deployed.params)
    y = deployed(x.copyto(dev))
    assert y.device == dev
    np.testing.assert_allclose(y.asnumpy(), want, rtol=1e-5, atol=1e-6)
    y7 = deployed(hb.ones((7, 5), device=dev))
    assert y7.device == dev and y7.shape == (7, 2)
    with hb.cpu(2):  # no device: the current one
        assert hb.load(path, backend=backend)(x.copyto(hb.cpu(2))).device == hb.cpu(2)


def test_load_refuses_inputs_on_another_device(tmp_path):
    """An input on another device than the loaded model's is refused with a ValueError that
    names both devices and the fix (as an eager op on two devices is), never copied behind
    the caller's back nor computed on the input's device."""
    path, x, _ = _exported(tmp_path, "reference")
    deployed = hb.load(path, device=hb.cpu(1))
    with pytest.raises(ValueError, match=r"input 0 is on cpu\(0\).*loaded on cpu\(1\).*copyto"):
        deployed(x)


def test_parameter_data_without_device_on_several_devices():
    """Gluon: with one copy, data() is that copy; with several, the current device must hold
    one, else an error naming the devices. Before, cpu(1)'s copy came back silently from
    ``with hb.cpu(2):`` and from the default cpu(0)."""
    p = nn.Parameter("x", shape=(2,))
    p.initialize(device=[hb.cpu(1), hb.cpu(2)])
    with pytest.raises(RuntimeError, match=r"'x' was not initialized on device cpu\(0\).*"
                                           r"copies on \[cpu\(1\), cpu\(2\)\].*pass device="):
        p.data()
    with pytest.raises(RuntimeError, match="pass device="):
        p.grad()
    with hb.cpu(2):
        assert p.data() is p.list_data()[1]
        assert p.grad() is p.list_grad()[1]
    with hb.cpu(1):
        assert p.data() is p.list_data()[0]
    assert p.data(hb.cpu(2)) is p.list_data()[1]
    assert len(p.list_data()) == 2 and p.list_device() == [hb.cpu(1), hb.cpu(2)]
    one = nn.Parameter("y", shape=(2,))
    one.initialize(device=hb.cpu(1))
    assert one.data().device == hb.cpu(1)  # the only copy, whatever the current device


def test_multi_device_training_still_names_its_devices(tmp_path):
    """The internal callers (Trainer, the kvstore, save/load) pass their device: a net on
    cpu(1) and cpu(2) only trains, saves and reloads from the default device cpu(0)."""
    devices = [hb.cpu(1), hb.cpu(2)]
    net = nn.HybridSequential()
    net.add(nn.Dense(3), nn.BatchNorm(), nn.Dense(2))
    net.initialize(device=devices)
    net.hybridize(backend="reference")
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x = hb.array(np.random.default_rng(2).standard_normal((4, 5)))
    y = hb.array([0, 1, 1, 0])
    loss_fn = hb.loss.SoftmaxCrossEntropyLoss()
    parts = list(zip(hb.split_and_load(x, devices), hb.split_and_load(y, devices)))
    for _ in range(2):
        with autograd.record():
            losses = [loss_fn(net(a), b) for a, b in parts]
        autograd.backward(losses)
        trainer.step(4)
    a, b = (d.asnumpy() for d in net[0].weight.list_data())
    np.testing.assert_array_equal(a, b)
    net.save_parameters(str(tmp_path / "p.safetensors"))
    net.load_parameters(str(tmp_path / "p.safetensors"), device=devices)
    np.testing.assert_array_equal(net[0].weight.data(hb.cpu(2)).asnumpy(), a)


# ------------------------------------------------------------ item 9: intake
def _both(fn, *args):
    """fn's result eagerly and inside a hybridized function (reference and llvm)."""
    outs = [fn(*args)]
    for backend in ("reference", "llvm"):
        outs.append(hb.hybridize(fn, backend=backend)(*args))
    return outs


@pytest.mark.parametrize("value", [1 + 2j, [1 + 2j, 3], np.complex64(1 - 1j),
                                   np.array([1j], dtype=np.complex128)])
def test_complex_data_is_refused(value):
    """No hybrid dtype holds an imaginary part: complex data was cast to its real part with
    at most a warning (``hb.asarray(1+2j)`` gave 1.0). Now a TypeError saying so."""
    with pytest.raises(TypeError, match="complex"):
        hb.asarray(value)
    with pytest.raises(TypeError, match="complex"):
        hb.array(value, dtype="float32")


def test_complex_scalars_are_not_operands():
    """A NumPy complex scalar counted as a number operand (np.number) and lost its
    imaginary part in ``x + np.complex128(1+2j)``; it is refused like Python's 1j."""
    x = hb.ones((2,))
    for c in (np.complex128(1 + 2j), 1j):
        with pytest.raises(TypeError, match="complex"):
            x + c
    with pytest.raises(TypeError, match="complex"):
        hb.full((2,), np.complex64(1j))


def test_uint64_keeps_its_value_or_is_refused():
    """uint64 is not a hybrid dtype: NumPy uint64 data was cast to int64, so 2**64 - 1
    became -1. Values that fit int64 convert exactly; larger ones are refused (OverflowError,
    NumPy's type for an integer out of range), and so is dtype='uint64'."""
    with pytest.raises(OverflowError, match="uint64 value 18446744073709551615"):
        hb.array(np.uint64(2 ** 64 - 1))
    with pytest.raises(OverflowError, match="does not fit int64"):
        hb.array(np.array([1, 2 ** 63], dtype=np.uint64))
    with pytest.raises(ValueError, match="uint64 is not supported"):
        hb.array([2 ** 64 - 1], dtype="uint64")
    small = hb.array(np.array([5, 2 ** 63 - 1], dtype=np.uint64))
    assert small.dtype == np.int64
    np.testing.assert_array_equal(small.asnumpy(), [5, 2 ** 63 - 1])
    assert hb.array(np.array([], dtype=np.uint64)).shape == (0,)


@pytest.mark.parametrize("value, dtype", [([300], "uint8"), ([-1], "uint8"),
                                          (2 ** 40, "int32"), ([2 ** 64 - 1], "int64"),
                                          ([2 ** 63], "int64")])
def test_python_integers_that_do_not_fit_the_dtype_are_refused(value, dtype):
    """Python data with a dtype went through int64 first and wrapped around
    (``hb.array([300], dtype='uint8')`` gave 44); NumPy raises OverflowError, and so do we.
    (NumPy arrays keep NumPy's astype semantics, as in NumPy.)"""
    with pytest.raises(OverflowError):
        hb.array(value, dtype=dtype)
    np.testing.assert_array_equal(hb.array(np.array([300]), dtype="uint8").asnumpy(),
                                  np.array([300]).astype("uint8"))


def test_integer_scalars_that_do_not_fit_the_array_are_refused():
    """``uint8_array + 300`` wrapped around in a compiled kernel (and failed late eagerly);
    NumPy 2 raises. Refused at inference, eagerly (also after the same op with a small
    scalar was cached) and when tracing; likewise fills and item assignment."""
    x = hb.array(np.array([1, 2], dtype=np.uint8))
    np.testing.assert_array_equal((x + 1).asnumpy(), [2, 3])
    for bad in (300, -1, np.int64(256)):
        with pytest.raises(ValueError, match="out of bounds for uint8"):
            x + bad
    f = hb.hybridize(lambda a: a + 300, backend="reference")
    with pytest.raises(ValueError, match="out of bounds for uint8"):
        f(x)
    with pytest.raises(ValueError, match="out of bounds for int32"):
        hb.array(np.array([1], np.int32)) * 2 ** 40
    with pytest.raises(ValueError, match="out of bounds for uint8"):
        hb.full((2,), 300, dtype="uint8")
    with pytest.raises(ValueError, match="out of bounds for uint8"):
        x[0] = 300
    x[0] = 255
    np.testing.assert_array_equal(x.asnumpy(), [255, 2])


def test_shapes_are_integers():
    """A float size was truncated (``hb.zeros((2.5,))`` had 2 elements); NumPy refuses it.
    A negative size fails at the call, not at the first read."""
    with pytest.raises(TypeError, match="integer"):
        hb.zeros((2.5,))
    with pytest.raises(ValueError, match="integers"):
        hb.ones((4,)).reshape((2.0, 2))
    with pytest.raises(ValueError, match="negative dimensions"):
        hb.ones((-1,))


def test_concatenate_axis_none_flattens():
    """NumPy flattens the inputs for axis=None; the registry op took None as axis 0 (eager
    gave a (4, 2)-typed value of 8 elements, the trace crashed)."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = np.concatenate([a, a], axis=None)
    for out in _both(lambda x: hb.concatenate([x, x], axis=None), hb.array(a)):
        assert out.shape == want.shape
        np.testing.assert_array_equal(out.asnumpy(), want)
    mixed = hb.concatenate([hb.array(a), hb.array(np.float32(7))], axis=None)
    np.testing.assert_array_equal(mixed.asnumpy(), np.append(a, 7))
    with pytest.raises(ValueError, match="axis must be an int"):
        hb.apply("concatenate", (hb.array(a),), {"axis": None})


@pytest.mark.parametrize("fn, args", [
    (hb.expand_dims, (-3,)), (hb.expand_dims, (2,)), (hb.stack, None),
    (hb.swapaxes, (0, 5)), (hb.split, (2, 3)), (hb.repeat, (2, -2))])
def test_out_of_range_axes_raise_like_numpy(fn, args):
    """``expand_dims`` of a 1-D array at axis -3 wrapped to axis 1 (and stack, swapaxes,
    split, repeat wrapped theirs); NumPy raises AxisError naming the axis and the range."""
    x = hb.arange(4.0)
    call = (lambda a: hb.stack([a, a], axis=-3)) if args is None else \
        (lambda a: fn(a, *args))
    with pytest.raises(ValueError, match=r"axis -?\d is out of range .* \(valid: -\d to \d\)"):
        call(x)
    for backend in ("reference", "llvm"):
        with pytest.raises(ValueError, match="out of range"):
            hb.hybridize(call, backend=backend)(x)


def test_expand_dims_in_range_and_tuple_axes():
    x = np.arange(6.0).reshape(2, 3)
    for axis in (0, 1, 2, -1, -3, (0, 3), (-1, 0)):
        want = np.expand_dims(x, axis)
        for out in _both(lambda a: hb.expand_dims(a, axis), hb.array(x)):
            assert out.shape == want.shape


def test_clip_with_no_bound_is_a_copy():
    """NumPy 2.1+ accepts ``np.clip(a)`` and returns a copy of ``a``; hb.clip(x) raised."""
    x = np.arange(5.0, dtype=np.float32)
    assert np.array_equal(np.clip(x), x)
    for out in _both(lambda a: hb.clip(a), hb.array(x)):
        np.testing.assert_array_equal(out.asnumpy(), x)


def test_clip_with_array_bounds_eager_hybridized_and_grad():
    """Array bounds broadcast as in NumPy (they gave a shape/data mismatch eagerly and a
    TypeError hybridized); hb.clip composes maximum and minimum, so the gradient is theirs:
    1 where x is inside its bounds, else to the bound it met."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    lo = np.full((3, 1), -0.5, np.float32)
    hi = rng.uniform(0.1, 1.0, (4,)).astype(np.float32)
    want = np.clip(x, lo, hi)
    for out in _both(lambda a, b, c: hb.clip(a, b, c), hb.array(x), hb.array(lo),
                     hb.array(hi)):
        np.testing.assert_array_equal(out.asnumpy(), want)
    np.testing.assert_array_equal(hb.clip(hb.array(x), None, hb.array(hi)).asnumpy(),
                                  np.clip(x, None, hi))
    np.testing.assert_array_equal(hb.array(x).clip(lo, 0.3).asnumpy(), np.clip(x, lo, 0.3))
    xa, la, ha = hb.array(x), hb.array(lo), hb.array(hi)
    for arr in (xa, la, ha):
        arr.attach_grad()
    with autograd.record():
        y = hb.clip(xa, la, ha).sum()
    y.backward()
    inside = (x >= lo) & (x <= hi)
    np.testing.assert_array_equal(xa.grad.asnumpy(), inside.astype(np.float32))
    np.testing.assert_array_equal(la.grad.asnumpy(), (x < lo).sum(1, keepdims=True)
                                  .astype(np.float32))


def test_clip_promotes_like_numpy():
    """An integer array clipped at 1.5 was clipped in integers (1); NumPy promotes to float
    (here float32, the framework default). Integer bounds beyond the dtype clip nothing, as
    in NumPy; the registry op itself refuses a bound that would promote."""
    x = np.arange(5, dtype=np.int32)
    for out in _both(lambda a: hb.clip(a, 1.5, 3.5), hb.array(x)):
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out.asnumpy(), np.clip(x, 1.5, 3.5))
    u = np.array([1, 200], np.uint8)
    out = hb.clip(hb.array(u), -5, 300)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out.asnumpy(), u)
    with pytest.raises(ValueError, match="would promote int32"):
        hb.apply("clip", (hb.array(x),), {"a_min": 1.5})


def test_random_arguments_numpy_refuses():
    """``hb.random.normal(0, -1)`` drew numbers; NumPy raises ValueError('scale < 0'), also
    for -0.0. uniform: an infinite or NaN range raises OverflowError (np.random.uniform);
    high < low, which NumPy's legacy uniform accepts but Generator.uniform refuses, is
    refused too: the op gave a constant 1e-45 for it, a silent wrong answer. A refused call
    takes no key from the stream."""
    hb.random.seed(7)
    want = hb.random.normal(0, 1, size=(3,)).asnumpy()
    hb.random.seed(7)
    for scale in (-1, -0.0):
        with pytest.raises(ValueError, match="scale < 0"):
            hb.random.normal(0, scale, size=(3,))
    for low, high in ((0, float("inf")), (0, float("nan")), (-float("inf"), 0)):
        with pytest.raises(OverflowError, match="finite"):
            hb.random.uniform(low, high, size=(3,))
    with pytest.raises(ValueError, match="high .* < low"):
        hb.random.uniform(1, 0, size=(3,))
    np.testing.assert_array_equal(hb.random.normal(0, 1, size=(3,)).asnumpy(), want)
    assert np.isnan(hb.random.normal(0, float("nan"), size=(2,)).asnumpy()).all()  # as NumPy
    np.testing.assert_array_equal(hb.random.uniform(2, 2, size=(2,)).asnumpy(), [2, 2])


@pytest.mark.parametrize("mode", ["eager", "reference", "llvm"])
@pytest.mark.parametrize("layer, shape", [(lambda: nn.Dense(3), (2, 4)),
                                          (lambda: nn.Conv2D(2, 3), (1, 1, 5, 5)),
                                          (lambda: nn.BatchNorm(), (2, 3)),
                                          (lambda: nn.LayerNorm(), (2, 3))])
def test_integer_input_to_a_float_layer_is_refused(mode, layer, shape):
    """An int64 input to Dense met float32 weights and NumPy's promotion ran the whole net in
    float64 (int64 with float32 gives float64). PyTorch raises on int @ float; MXNet's
    FullyConnected needs one dtype. Choice: a TypeError naming the layer and the fix
    ``x.astype('float32')``, not a silent cast to the weights' dtype: that cast would round
    integers above 2**24 in float32 behind the user's back. Eager and hybridized alike."""
    net = nn.HybridSequential()
    net.add(layer(), nn.Dense(2))
    net.initialize()
    xf = hb.array(np.arange(np.prod(shape)).reshape(shape), dtype="float32")
    assert net(xf).dtype == np.float32
    _hybridize(net, mode)
    xi = hb.array(np.arange(np.prod(shape)).reshape(shape))
    assert xi.dtype == np.int64
    with pytest.raises(TypeError, match=r"input has dtype int64.*x.astype\('float32'\)"):
        net(xi)
    assert net(xi.astype("float32")).dtype == np.float32


@pytest.mark.parametrize("dt", ["uint8", "int8", "int32"])
def test_narrow_integer_indices_address_wide_axes(dt):
    """one_hot and pick's gradient compared indices with positions made in the index's own
    dtype: with uint8/int8 indices and an axis over 256 (128) long, position 259 wrapped to
    3, so one_hot(3, 300) had two hot entries and pick's gradient went to two places. The
    positions are int64 now, eagerly and hybridized."""
    idx = hb.array(np.array([3, 100], dtype=dt))
    want = np.zeros((2, 300), np.float32)
    want[0, 3] = want[1, 100] = 1
    for out in _both(lambda i: hb.one_hot(i, 300), idx):
        np.testing.assert_array_equal(out.asnumpy(), want)
    x = hb.array(np.random.default_rng(4).standard_normal((2, 300)))
    x.attach_grad()
    with autograd.record():
        y = hb.pick(x, idx, axis=1).sum()
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), want)
