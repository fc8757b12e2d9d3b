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

