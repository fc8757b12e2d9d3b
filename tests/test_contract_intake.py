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
    for _ in range(2):
        with autograd.record():
            losses = [loss_fn(net(a), b) for a, b in
                      zip(hb.split_and_load(x, devices), hb.split_and_load(y, devices))]
        for loss in losses:
            loss.backward()
        trainer.step(4)
    a, b = (d.asnumpy() for d in net[0].weight.list_data())
    np.testing.assert_array_equal(a, b)
    net.save_parameters(str(tmp_path / "p.safetensors"))
    net.load_parameters(str(tmp_path / "p.safetensors"), device=devices)
    np.testing.assert_array_equal(net[0].weight.data(hb.cpu(2)).asnumpy(), a)
