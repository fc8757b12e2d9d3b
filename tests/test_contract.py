"""The contract: hybridizing never changes what a program does (DESIGN.md §3a).

Each test runs the same program eagerly and hybridized and compares what a user can observe:
outputs, the random stream, running statistics, side effects of forward, the caller's arrays
after in-place writes, the choice of compiled graph for scalar arguments, and re-tracing after
the block tree changes.
"""
from __future__ import annotations

import math
import types

import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, deploy, init, nn

BACKENDS = ["llvm", "reference"]


def _both(build, run, backend):
    """run(block) eagerly and hybridized on ``backend``, each from the same seed."""
    results = []
    for hybrid in (False, True):
        hb.random.seed(1234)
        block = build()
        if hybrid:
            block.hybridize(backend=backend)
        results.append(run(block))
    return results


# ------------------------------------------------------------------ 1. random draws
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_draws_are_fresh_every_call_and_follow_the_eager_stream(backend):
    def noisy(x):
        return x + hb.random.normal(size=x.shape) + hb.random.uniform(size=x.shape)

    x = hb.zeros((5,))
    hb.random.seed(3)
    eager = [noisy(x).asnumpy() for _ in range(3)]
    compiled = hb.hybridize(noisy, backend=backend)
    hb.random.seed(3)
    hybrid = [compiled(x).asnumpy() for _ in range(3)]
    assert not np.array_equal(hybrid[0], hybrid[1]), "the same draws at every call"
    for e, h in zip(eager, hybrid):
        np.testing.assert_array_equal(e, h)
    # and the stream goes on where eager's would: the next eager draw matches too
    hb.random.seed(3)
    for _ in range(3):
        noisy(x)
    want = hb.random.normal(size=(2,)).asnumpy()
    hb.random.seed(3)
    for _ in range(3):
        compiled(x)
    np.testing.assert_array_equal(hb.random.normal(size=(2,)).asnumpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["predict", "record"])
def test_random_draws_in_a_block(backend, mode):
    class Noisy(nn.HybridBlock):
        def forward(self, x):
            return x * hb.random.uniform(size=x.shape)

    def run(block):
        x = hb.ones((4,))
        outs = []
        for _ in range(3):
            if mode == "record":
                with autograd.record():
                    outs.append(block(x).asnumpy())
            else:
                outs.append(block(x).asnumpy())
        return outs

    eager, hybrid = _both(Noisy, run, backend)
    assert not np.array_equal(hybrid[0], hybrid[1])
    for e, h in zip(eager, hybrid):
        np.testing.assert_array_equal(e, h)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_masks_match_eager_with_deferred_initialization(backend):
    """The initializers' draws (deferred: at the first call) and Dropout's interleave in
    program order; hybridized takes them from the stream in the same order."""
    def build():
        net = nn.HybridSequential()
        net.add(nn.Dense(16), nn.Dropout(0.5), nn.Dense(8), nn.Dropout(0.3), nn.Dense(2))
        net.initialize(init.Xavier())
        return net

    def run(net):
        x = hb.ones((3, 5))
        outs = []
        for _ in range(3):
            with autograd.record():
                y = net(x)
            y.backward()
            outs.append((y.asnumpy(), net[0].weight.grad().asnumpy()))
        return outs

    eager, hybrid = _both(build, run, backend)
    for (ye, ge), (yh, gh) in zip(eager, hybrid):
        np.testing.assert_allclose(yh, ye, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gh, ge, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ 2. side effects once
@pytest.mark.parametrize("backend", BACKENDS)
def test_first_training_call_moves_batchnorm_statistics_once(backend):
    def build():
        net = nn.HybridSequential()
        net.add(nn.Dense(6), nn.BatchNorm(), nn.Dense(3), nn.BatchNorm())
        net.initialize()
        return net

    def run(net):
        x = hb.array(np.random.default_rng(0).normal(size=(8, 5)).astype("float32") * 3 + 1)
        stats = []
        for _ in range(2):
            with autograd.record():
                net(x)
            stats.append([p.data().asnumpy() for name, p in net.collect_params().items()
                          if "running" in name])
        return stats

    eager, hybrid = _both(build, run, backend)
    for se, sh in zip(eager, hybrid):
        for a, b in zip(se, sh):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_print_in_forward_runs_once_on_the_first_call(capsys):
    class Loud(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(3)  # deferred: the first call infers its input size

        def forward(self, x):
            print("forward ran")
            return self.dense(x)

    net = Loud()
    net.initialize()
    net.hybridize()
    with autograd.record():
        net(hb.ones((2, 4)))
    assert capsys.readouterr().out.count("forward ran") == 1


# ------------------------------------------------------------------ 3. stale graphs
def test_adding_a_child_after_the_first_call_retraces():
    net = nn.HybridSequential()
    net.add(nn.Dense(4, flatten=False))
    net.initialize()
    net.hybridize()
    x = hb.ones((2, 3, 2))
    assert net(x).shape == (2, 3, 4)
    net.add(nn.Flatten())
    assert net(x).shape == (2, 12)
    assert "child '1' was added" in hb.explain(net)


class _Two(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.body = nn.Dense(4)
        self.head = nn.Dense(3)

    def forward(self, x):
        return self.head(self.body(x))


def test_replacing_a_child_or_a_parameter_retraces():
    net = _Two()
    net.initialize()
    net.hybridize()
    x = hb.ones((2, 5))
    assert net(x).shape == (2, 3)
    net.head = nn.Dense(6)
    net.head.initialize()
    assert net(x).shape == (2, 6)
    ones = nn.Parameter("weight", shape=(6, 4))
    ones.initialize(init.One())
    net.head.weight = ones
    want = net.body(x).asnumpy() @ np.ones((4, 6), "float32") + net.head.bias.data().asnumpy()
    np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5)
    assert "parameter 'head.weight' was replaced" in hb.explain(net)


def test_sharing_parameters_after_the_first_call_retraces():
    a, b = _Two(), _Two()
    for net in (a, b):
        net.initialize()
        net.hybridize()
    x = hb.ones((2, 5))
    a(x), b(x)
    b.share_parameters(a.collect_params())
    np.testing.assert_allclose(b(x).asnumpy(), a(x).asnumpy(), rtol=1e-6)


def test_a_hook_registered_after_the_first_call_runs():
    net = _Two()
    net.initialize()
    net.hybridize()
    x = hb.ones((2, 5))
    net(x)
    seen = []
    net.head.register_forward_hook(lambda block, args, out: seen.append(out.shape))
    net(x)
    assert seen == [(2, 3)]


# ------------------------------------------------------------------ 4. writes to inputs
class _Writes(nn.HybridBlock):
    def forward(self, x, y):
        x[:] = x + 1
        x += 1
        x[:2] = 0
        y *= 3
        return x * 2 + y


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_to_inputs_reach_the_callers_arrays(backend):
    def run(block):
        x = hb.arange(4).astype("float32")
        y = hb.ones((4,))
        seen = []
        for _ in range(2):
            out = block(x, y)
            seen.append((out.asnumpy(), x.asnumpy(), y.asnumpy()))
        return seen

    eager, hybrid = _both(_Writes, run, backend)
    for e, h in zip(eager, hybrid):
        for a, b in zip(e, h):
            np.testing.assert_array_equal(b, a)


# ------------------------------------------------------------------ 5. scalar keys
def test_a_scalar_argument_is_keyed_by_type_and_bits():
    @hb.hybridize
    def f(x, c):
        return x + c

    xi = hb.array([1, 2], dtype="int32")
    assert f(xi, 2).dtype == (xi + 2).dtype
    assert f(xi, 2.0).dtype == (xi + 2.0).dtype
    neg = hb.zeros((1,)) * -1  # -0.0
    for c in (0.0, -0.0):
        got = f(neg, c).asnumpy()
        assert math.copysign(1, got[0]) == math.copysign(1, (neg + c).asnumpy()[0]), c
    nan_before = len(f.cache.entries)
    for _ in range(3):
        assert np.isnan(f(xi, float("nan")).asnumpy()).all()
    assert len(f.cache.entries) == nan_before + 1, "a NaN scalar must find its graph again"


def test_simplify_keeps_the_sign_of_zero():
    @hb.hybridize
    def plus_zero(x):
        return x + 0.0, 0.0 + x, x - 0.0, x - (-0.0), x + (-0.0)

    neg = hb.zeros((1,)) * -1
    eager = [v.asnumpy() for v in plus_zero.__wrapped__(neg)]
    hybrid = [v.asnumpy() for v in plus_zero(neg)]
    for e, h in zip(eager, hybrid):
        assert math.copysign(1, h[0]) == math.copysign(1, e[0])


def test_unhashable_static_arguments_reach_forward_unchanged():
    @hb.hybridize
    def pick(x, opts):
        return x * opts.scale

    opts = types.SimpleNamespace(scale=3.0)  # unhashable: keyed by its repr
    np.testing.assert_array_equal(pick(hb.ones((2,)), opts).asnumpy(), [3, 3])


# ------------------------------------------------------------------ found by the program fuzzer
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_written_in_forward_trains_again_next_call(backend):
    """The written-back input is not an autograd node of the call when what was written
    does not depend on anything tracked (eager: no node either), so the next recorded call
    does not reach back into the first one's freed graph."""
    class WriteThenDense(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(2)

        def forward(self, x):
            x[:] = x * 0.5 + 1
            return self.dense(x)

    def run(net):
        x = hb.ones((2, 3))
        grads = []
        for _ in range(2):
            with autograd.record():
                y = net(x)
            y.backward()
            grads.append(net.dense.weight.grad().asnumpy())
        return grads + [x.asnumpy()]

    eager, hybrid = _both(_init(WriteThenDense), run, backend)
    for e, h in zip(eager, hybrid):
        np.testing.assert_allclose(h, e, rtol=1e-6)


def _init(cls):
    def build():
        net = cls()
        net.initialize()
        return net
    return build


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_computed_from_nothing_tracked_refuses_backward_as_eager(backend):
    class Overwrite(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(1)

        def forward(self, x):
            h = self.dense(x) * 1.0
            h[:, :1] = 2  # every column: the output no longer depends on the weights
            return h

    def run(net):
        with autograd.record():
            y = net(hb.ones((2, 3)))
        with pytest.raises(RuntimeError, match="nothing to differentiate"):
            y.backward()
        return y.asnumpy()

    eager, hybrid = _both(_init(Overwrite), run, backend)
    np.testing.assert_array_equal(hybrid, eager)


def test_a_cheap_value_with_two_consumers_compiles():
    """fusion: a `full` read by two kernels is materialized, not inlined into both (which
    crashed the pass: it expected one consumer)."""
    @hb.hybridize
    def f(x):
        h = x * 1.0
        h[:, :1] = 2  # the whole array: a `full`
        return h + h * hb.random.uniform(size=h.shape)

    assert f(hb.ones((2, 1))).shape == (2, 1)


def test_export_keeps_static_outputs_and_refuses_input_writes(tmp_path):
    @hb.hybridize
    def two(x):
        return x * 2, 3, None

    x = hb.ones((2,))
    two(x)
    two_path = str(tmp_path / "two")
    deploy.export(two, two_path)
    y, three, none = hb.load(two_path)(x)
    assert (three, none) == (3, None) and type(three) is int

    net = _Writes()
    net.hybridize()
    net(hb.ones((4,)), hb.ones((4,)))
    with pytest.raises(ValueError, match="writes to its input arrays"):
        net.export(str(tmp_path / "writes"))


# ------------------------------------------------------------------ 8. out-of-range indices
def _int(v):
    return hb.array(v, dtype="int64")


@pytest.mark.parametrize("backend", [None] + BACKENDS)
def test_an_embedding_token_past_the_table_raises(backend):
    emb = nn.Embedding(50, 4)
    emb.initialize()
    if backend:
        emb.hybridize(backend=backend)
    np.testing.assert_array_equal(emb(_int([49])).asnumpy(), emb.weight.data().asnumpy()[49:])
    with pytest.raises(IndexError, match="60 is out of bounds for axis 0 with size 50"):
        emb(_int([3, 60])).asnumpy()


@pytest.mark.parametrize("backend", [None] + BACKENDS)
def test_fancy_indexing_out_of_range_raises_and_negative_counts_from_the_end(backend):
    def index(x, i):
        return x[i]

    fn = hb.hybridize(index, backend=backend) if backend else index
    x = hb.arange(10).astype("float32")
    np.testing.assert_array_equal(fn(x, _int([-1, -10, 3])).asnumpy(), [9, 0, 3])
    for bad in (100, 10, -11):
        with pytest.raises(IndexError, match=f"{bad} is out of bounds"):
            fn(x, _int([1, bad])).asnumpy()
    grid = hb.arange(12).astype("float32").reshape((3, 4))
    pair = hb.hybridize(lambda g, r, c: g[r, c], backend=backend) if backend else \
        (lambda g, r, c: g[r, c])
    np.testing.assert_array_equal(pair(grid, _int([2, -1]), _int([-1, 0])).asnumpy(), [11, 8])
    with pytest.raises(IndexError, match="4 is out of bounds"):
        pair(grid, _int([1]), _int([4])).asnumpy()  # flat index 8 is in range: still wrong


@pytest.mark.parametrize("backend", BACKENDS)
def test_take_clips_or_wraps_only_when_asked(backend):
    x = hb.arange(5).astype("float32")
    i = _int([7, -7])
    for mode, want in (("clip", [4, 0]), ("wrap", [2, 3])):
        f = hb.hybridize(lambda x, i, mode=mode: x.take(i, mode=mode), backend=backend)
        np.testing.assert_array_equal(f(x, i).asnumpy(), want)
    with pytest.raises(IndexError):
        hb.take(x, i).asnumpy()


def test_the_gradient_of_a_negative_index_goes_to_its_row():
    x = hb.arange(4).astype("float32")
    for fn in (lambda x: x[_int([-1])], hb.hybridize(lambda x: x[_int([-1])])):
        x.attach_grad()
        with autograd.record():
            y = fn(x).sum()
        y.backward()
        np.testing.assert_array_equal(x.grad.asnumpy(), [0, 0, 0, 1])


def test_resnet18_running_statistics_move_once_on_the_first_training_call():
    """The issue's case: the deepest BatchNorm of resnet18 moved 4.1x too far."""
    from hybrid.nn import models

    def build():
        net = models.resnet18(num_classes=4, width=8)
        net.initialize(init.Xavier())
        return net

    def run(net):
        x = hb.array(np.random.default_rng(1).normal(size=(2, 3, 16, 16)).astype("float32"))
        with autograd.record():
            net(x)
        return [p.data().asnumpy() for k, p in net.collect_params().items()
                if "running_mean" in k]

    eager, hybrid = _both(build, run, "llvm")
    for e, h in zip(eager, hybrid):
        np.testing.assert_allclose(h, e, rtol=1e-3, atol=1e-4)


def test_num_compiles_counts_each_compiled_graph_once():
    net = _init(_Two)()
    net.hybridize()
    x = hb.ones((2, 5))
    before = hb.num_compiles()
    net(x)
    net(x)
    assert hb.num_compiles() == before + 1
    for _ in range(2):
        with autograd.record():
            y = net(x)
        y.backward()
    # the training graph's forward and backward pair; its inference executable compiles
    # only when a call needs one (Compiled.exe): a training step never does
    assert hb.num_compiles() == before + 3


def test_indices_out_of_range_raise_on_the_cuda_backend(emulated_gpu):
    emb = nn.Embedding(10, 3)
    emb.initialize(device=emulated_gpu)
    emb.hybridize()
    tokens = hb.array([1, -1, 9], dtype="int64", device=emulated_gpu)
    np.testing.assert_array_equal(emb(tokens).asnumpy(),
                                  emb.weight.data(emulated_gpu).asnumpy()[[1, 9, 9]])
    assert next(iter(emb._cached.entries.values())).backend == "cuda"
    with pytest.raises(IndexError, match="10 is out of bounds for axis 0 with size 10"):
        emb(hb.array([1, 10], dtype="int64", device=emulated_gpu)).asnumpy()


# ------------------------------------------------------------------ gradients not reached
class _Overwritten(nn.HybridBlock):
    """A layer whose output is overwritten whole: nothing after it depends on it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Dense(2)
        self.b = nn.Dense(1)

    def forward(self, x):
        h = self.a(x) * 1.0
        h[:] = 2.0
        return self.b(h)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_backward_never_reaches_keeps_its_gradient_as_eagerly(backend):
    """Eager autograd never reaches ``a``'s parameters (their output is overwritten), so their
    gradients keep what they held; the compiled backward computes zeros for them but leaves
    them alone too (it used to write the zeros)."""
    x = hb.array(np.arange(6, dtype=np.float32).reshape(3, 2))

    def run(net):
        net(x)  # deferred shapes
        for p in net.a.collect_params().values():
            p.grad()[:] = 5.0  # what an earlier step left there
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        return {k: p.grad().asnumpy() for k, p in net.collect_params().items()}
    def build():
        net = _Overwritten()
        net.initialize()
        return net
    eager, hybrid = _both(build, run, backend)
    assert eager.keys() == hybrid.keys()
    for k in eager:
        np.testing.assert_allclose(hybrid[k], eager[k], rtol=1e-6, atol=1e-6, err_msg=k)
    assert all(np.all(v == 5.0) for k, v in hybrid.items() if k.startswith("a."))
