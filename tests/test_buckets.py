"""Shape buckets: a hybridized block seeing many batch sizes (or sequence lengths) compiles a
few padded graphs, with every result equal to eager; where padding would change a result,
each size compiles exactly. And compiler/passes/batch_axis.py, tested without a device."""
import numpy as np
import pytest

import hybrid as hb
from compiler.graph import Graph, NodeRef
from compiler.ops import Spec
from compiler.passes.batch_axis import batch_axes
from hybrid import autograd, gluon, nn
from hybrid.buckets import bucket_of

RNG = np.random.default_rng(0)


def arr(shape, dtype="float32"):
    return hb.array(RNG.standard_normal(shape).astype(dtype))


def mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
    net.initialize()
    return net


def _eager_and_hybrid(net, calls):
    """(eager outputs, hybridized outputs, compiles) of net over calls (lists of arrays)."""
    want = [net(*c).asnumpy() for c in calls]
    net.hybridize()
    c0 = hb.num_compiles()
    got = [net(*c).asnumpy() for c in calls]
    return want, got, hb.num_compiles() - c0


def test_forty_batch_sizes_take_a_few_compiles_and_equal_eager():
    net = mlp()
    calls = [[arr((b, 5))] for b in range(1, 41)]
    want, got, compiles = _eager_and_hybrid(net, calls)
    for w, g in zip(want, got):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # the first size, then one bucket of 64 rows whose program computes the real rows only
    # (compiler/passes/row_bounds.py): every size 2..40
    assert compiles == 2, compiles
    assert bucket_of(33) == 64 and bucket_of(1) == 1


def test_training_gradients_through_a_bucket_equal_eager():
    def step(net, x):
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        return [p.grad().asnumpy().copy() for p in net.collect_params().values()]
    hb.random.seed(1)
    eager_net, hyb_net = mlp(), mlp()
    eager_net(arr((1, 5)))
    hyb_net(arr((1, 5)))  # deferred shapes known: the weights can be copied
    for p, q in zip(eager_net.collect_params().values(), hyb_net.collect_params().values()):
        q.set_data(p.data())
    hyb_net.hybridize()
    for b in (4, 5, 7, 3, 11):  # 4 compiles exactly; the others run buckets 8, 8, 4 (the
        # first graph: 4 is its own bucket), 16
        x = arr((b, 5))
        want, got = step(eager_net, x), step(hyb_net, x)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert hyb_net._cached.buckets and not hyb_net._cached.no_buckets


class MaxCentered(nn.HybridBlock):
    """Each row minus the batch's maximum: padding rows could change every result."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4)

    def forward(self, x):
        return self.dense(x - x.max(axis=0, keepdims=True))


class MeanCentered(MaxCentered):
    """The batch mean: its divisor is a value computed from the size."""

    def forward(self, x):
        return self.dense(x - x.mean(axis=0, keepdims=True))


class BranchOnSize(nn.HybridBlock):
    def forward(self, x):
        return x * 2 if x.shape[0] > 4 else x - 1


@pytest.mark.parametrize("make,why", [
    (MaxCentered, "reduces over the batch axis"),
    (MeanCentered, "a value computed from it"),
    (BranchOnSize, "differs between sizes"),
])
def test_where_padding_would_change_results_each_size_compiles(make, why):
    net = make()
    net.initialize()
    calls = [[arr((b, 3))] for b in (2, 3, 5, 6, 7)]
    want, got, compiles = _eager_and_hybrid(net, calls)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    reasons = list(net._cached.no_buckets.values())
    assert len(reasons) == 1 and why in reasons[0], reasons
    assert compiles >= 4


@pytest.mark.parametrize("make", [MaxCentered, MeanCentered])
def test_a_first_size_that_is_a_bucket_is_not_reused_where_rows_mix(make):
    """8 then 5: 8 is 5's bucket, but padding 5 rows to 8 changes a batch statistic (found
    by the program fuzzer: a training graph's sum over the batch)."""
    net = make()
    net.initialize()
    want, got, compiles = _eager_and_hybrid(net, [[arr((b, 3))] for b in (8, 5, 3)])
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert compiles == 3 and net._cached.no_buckets and not net._cached.buckets


def test_a_branch_on_the_size_between_a_size_and_its_bucket_is_caught():
    class Threshold(nn.HybridBlock):  # sizes up to 5 take one branch, 6 and more the other
        def forward(self, x):
            return x * 2 if x.shape[0] > 5 else x - 1
    net = Threshold()
    calls = [[arr((b, 3))] for b in (7, 8, 5)]  # 5 would run the bucket of 8 (traced x * 2)
    want, got, _ = _eager_and_hybrid(net, calls)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_size_in_the_first_sizes_bucket_runs_the_first_graph():
    """The last, smaller batch of an epoch whose batch size is a power of two compiles
    nothing: the first size's graph is that bucket's."""
    net = mlp()
    sizes = (64, 40, 64, 17, 33)
    data = [RNG.standard_normal((b, 5)).astype("float32") for b in sizes]

    def run():
        out = []
        for x in data:
            x = hb.array(x)
            x.attach_grad()
            with autograd.record():
                loss = (net(x) ** 2).sum()
            loss.backward()
            out.append([loss.asnumpy(), x.grad.asnumpy()] +
                       [p.grad().asnumpy().copy() for p in net.collect_params().values()])
        return out
    net(hb.array(data[0]))
    want = run()
    net.hybridize()
    c0 = hb.num_compiles()
    got = run()
    assert hb.num_compiles() - c0 == 4  # a forward and a backward for 64, and for 32 (17)
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    first = next(e for e in net._cached.entries.values() if not hasattr(e, "pieces"))
    assert [e.entry is first for e in net._cached.entries.values()
            if hasattr(e, "pieces")] == [True, False, True]


def test_batchnorm_buckets_in_predict_mode_not_in_training():
    net = nn.HybridSequential()
    net.add(nn.Dense(6), nn.BatchNorm(), nn.Dense(2))
    net.initialize()
    for b in (4, 8):  # running statistics that are not all zeros and ones
        with autograd.record():
            net(arr((b, 3)))
    calls = [[arr((b, 3))] for b in (2, 3, 5)]
    want, got, compiles = _eager_and_hybrid(net, calls)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # 2 exactly, then one row-bounded bucket (predict mode: BatchNorm is a row-wise affine)
    assert compiles == 2 and not net._cached.no_buckets
    for b in (3, 5):  # training: the batch statistics mix rows and update parameters
        with autograd.record():
            net(arr((b, 3)))
    reasons = [why for family, why in net._cached.no_buckets.items() if family[1]]
    assert len(reasons) == 1 and "updates parameters" in reasons[0], reasons


def test_lstm_sequence_lengths_share_buckets_with_exact_final_states():
    lstm = gluon.rnn.LSTM(8, input_size=3, num_layers=2)
    lstm.initialize()
    xs = [arr((t, 2, 3)) for t in (10, 13, 23, 35, 50, 17)]
    states = [arr((2, 2, 8)) for _ in range(2)]
    want = [lstm(x, states) for x in xs]
    lstm.hybridize()
    c0 = hb.num_compiles()
    for x, (w, ws) in zip(xs, want):
        out, new = lstm(x, states)
        np.testing.assert_allclose(out.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)
        for a, b in zip(new, ws):  # the scan stopped after the real steps
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)
    assert hb.num_compiles() - c0 == 2  # 10 exactly, then one bucket of 64 steps (the loop
    # stops after the real steps; padding the rest of this small LSTM costs little)


@pytest.mark.parametrize("free", [0.0, None])  # None: PAD_WORK_FREE as it is
def test_the_64_step_bucket_only_where_padding_is_cheap(free, monkeypatch):
    """Without row bounds (every padded step computed): a loop-dominated LSTM serves lengths
    10..50 from one 64-step bucket; a language model whose decoder runs on every padded step
    takes the ladder's buckets for short lengths, unless the padded work is too small to
    matter (these models are: PAD_WORK_FREE). With them: tests/test_row_bounds.py."""
    from hybrid import buckets
    from hybrid.buckets import _family, _first_axes, _scan_bucket
    if free is not None:
        monkeypatch.setattr(buckets, "PAD_WORK_FREE", free)
    from runtime import config
    old = config.set_flag("HYBRID_ROW_BOUNDS", False)
    try:
        _lengths_and_buckets(free)
    finally:
        config.set_flag("HYBRID_ROW_BOUNDS", old)


def _lengths_and_buckets(free):
    from hybrid.buckets import _family, _first_axes, _scan_bucket

    class LanguageModel(nn.HybridBlock):
        def __init__(self, decoder):
            super().__init__()
            self.lstm = gluon.rnn.LSTM(16, input_size=2)
            self.dense = nn.Dense(decoder, in_units=16) if decoder else None

        def forward(self, x):
            y = self.lstm(x)
            return self.dense(y.reshape((-1, 16))) if self.dense else y
    ladder = {10: 16, 13: 16, 23: 32, 50: 64} if free == 0.0 else dict.fromkeys((10, 13, 23, 50),
                                                                                64)
    for decoder, want in ((0, dict.fromkeys((10, 13, 23, 50), 64)), (512, ladder)):
        net = LanguageModel(decoder)
        net.initialize()
        xs = {t: arr((t, 2, 2)) for t in (10,) + tuple(want)}
        eager = {t: net(x).asnumpy() for t, x in xs.items()}
        net.hybridize()
        net(xs[10])
        (sig, first), = net._cached.entries.items()
        family, _ = _family(sig, 0)
        axes = _first_axes(first, family)
        got = {t: max(bucket_of(t), _scan_bucket(first, axes, t, 10)) for t in want}
        assert got == want, (decoder, got)
        for t in want:  # and the calls run those buckets, equal to eager
            np.testing.assert_allclose(net(xs[t]).asnumpy(), eager[t], rtol=1e-5, atol=1e-6)
        assert sorted({e.padded for e in net._cached.entries.values()
                       if hasattr(e, "pieces")}) == sorted(set(want.values()))


def test_lstm_gradients_through_a_counted_scan_equal_eager():
    def run(hybridize):
        hb.random.seed(3)
        lstm = gluon.rnn.LSTM(5, input_size=3)
        lstm.initialize()
        if hybridize:
            lstm.hybridize()
        grads = []
        for t in (6, 9):  # 9 runs the bucket of 16, its scan stopping after 9 steps
            x = hb.array(np.linspace(-1, 1, t * 2 * 3, dtype="float32").reshape(t, 2, 3))
            x.attach_grad()
            with autograd.record():
                loss = (lstm(x) ** 2).sum()
            loss.backward()
            grads.append([x.grad.asnumpy()] + [p.grad().asnumpy().copy()
                                               for p in lstm.collect_params().values()])
        return grads
    for w, g in zip(run(False), run(True)):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_static_shape_compiles_every_size():
    net = mlp()
    net(arr((1, 5)))
    net.hybridize(static_shape=True)
    c0 = hb.num_compiles()
    for b in (1, 2, 3, 5):
        net(arr((b, 5)))
    assert hb.num_compiles() - c0 == 4 and not net._cached.buckets


def test_dropout_in_training_is_never_bucketed():
    net = nn.HybridSequential()
    net.add(nn.Dense(4), nn.Dropout(0.5))
    net.initialize()
    net.hybridize()
    for b in (2, 3, 5):
        with autograd.record():
            net(arr((b, 3)))
    assert net._cached.no_buckets and not net._cached.buckets


# ------------------------------------------------------------------ the pass, no device
def _g(*specs):
    g = Graph("t")
    ins = [g.add_input(Spec(s, "float32"), f"x{i}") for i, s in enumerate(specs)]
    return g, ins


def test_pass_follows_reshapes_that_merge_the_batch_with_the_next_axis():
    g, (x, w) = _g((8, 2, 3), (3, 4))
    flat = g.add_op("reshape", [NodeRef(x)], {"shape": (16, 3)})
    y = g.add_op("matmul", [NodeRef(flat), NodeRef(w)], {})
    back = g.add_op("reshape", [NodeRef(y)], {"shape": (8, 2, 4)})
    g.outputs = [y, back]
    got = batch_axes(g, {x: 0}, 8)
    assert got.ok and got.outputs == [(0, 2), (0, 1)]


@pytest.mark.parametrize("op,attrs,reason", [
    ("sum", {"axis": 0}, "reduces over the batch axis"),
    ("slice", {"begin": (1, 0), "end": (8, 3), "step": (1, 1)}, "slices along the batch"),
    ("transpose", {"axes": (1, 0)}, None),
])
def test_pass_names_what_mixes_rows(op, attrs, reason):
    g, (x,) = _g((8, 3))
    g.outputs = [g.add_op(op, [NodeRef(x)], attrs)]
    got = batch_axes(g, {x: 0}, 8)
    if reason is None:
        assert got.ok and got.outputs == [(1, 1)]
    else:
        assert not got.ok and reason in got.reason


def test_pass_refuses_a_constant_with_one_row_per_example():
    g, (x,) = _g((4, 3))
    c = g.add_const(np.arange(12, dtype="float32").reshape(4, 3))
    g.outputs = [g.add_op("add", [NodeRef(x), NodeRef(c)], {})]
    got = batch_axes(g, {x: 0}, 4)
    assert not got.ok and "batch-free value" in got.reason


def test_export_of_a_size_a_bucket_served_is_its_own_graph(tmp_path):
    net = mlp()
    net.hybridize()
    for b in (2, 3):  # 3 runs the bucket of 4
        net(arr((b, 5)))
    x = arr((3, 5))
    net.export(str(tmp_path / "m"), example_inputs=(x,))
    m = hb.load(str(tmp_path / "m"))
    np.testing.assert_allclose(m(x).asnumpy(), net(x).asnumpy(), rtol=1e-6, atol=1e-6)
    (g,) = [e.graph for s, e in net._cached.entries.items() if s[1][0][0] == (3, 5)]
    assert g.spec(g.inputs[0]).shape == (3, 5)  # the exact graph, not the padded one


def test_no_retrace_warning_while_buckets_serve_the_sizes_and_one_that_says_why_otherwise():
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        net = mlp()
        net.hybridize()
        for b in range(1, 41):
            net(arr((b, 5)))
        assert not [w for w in seen if "re-traced" in str(w.message)]
        net = MaxCentered()
        net.initialize()
        net.hybridize()
        for b in range(1, 12):
            net(arr((b, 3)))
    (w,) = [w for w in seen if "re-traced" in str(w.message)]
    assert "shape buckets do not apply" in str(w.message) and "batch axis" in str(w.message)


def test_a_bucket_refused_for_its_random_draws_leaves_the_stream_as_eager():
    # found by the program fuzzer: the refused bucket's trace took a key, and the exact
    # trace after it took the next one, so the hybridized Dropout masks ran one key ahead
    def run(hybridize):
        hb.random.seed(5)
        net = nn.HybridSequential()
        net.add(nn.Dropout(0.5))
        if hybridize:
            net.hybridize()
        outs = []
        for b in (1, 1, 2, 3):
            with autograd.record():
                outs.append(net(hb.ones((b, 4))).asnumpy())
        return outs, hb.random.normal(size=(3,)).asnumpy()
    (want, after_e), (got, after_h) = run(False), run(True)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(after_h, after_e)


class _BatchMajorLM(nn.HybridBlock):
    """The book's RNNModel: (batch, num_steps) tokens, transposed inside to time-major."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(11, 4)
        self.lstm = gluon.rnn.LSTM(6, input_size=4)
        self.dense = nn.Dense(11, in_units=6)

    def forward(self, tokens, state):
        y, state = self.lstm(self.embedding(tokens.T), state)
        return self.dense(y.reshape((-1, 6))), state


def test_batch_major_sequence_lengths_share_a_bucket_along_axis_1():
    """Lengths on axis 1 (the book's (batch, num_steps) tokens, NTC) take buckets like axis
    0's: the first length exactly, then buckets, outputs, final states and gradients as
    eager."""
    net = _BatchMajorLM()
    net.initialize()
    rng = np.random.default_rng(5)
    toks = [hb.array(rng.integers(0, 11, (3, t))) for t in (9, 13, 23, 40, 17)]
    state = [arr((1, 3, 6)), arr((1, 3, 6))]

    def run():
        res = []
        for x in toks:
            with autograd.record():
                out, new = net(x, state)
                loss = (out * out).sum() + new[1].sum()
            loss.backward()
            res.append([out.asnumpy(), new[0].asnumpy(), new[1].asnumpy()] +
                       [p.grad().asnumpy().copy() for p in net.collect_params().values()])
        return res
    want = run()
    net.hybridize()
    c0 = hb.num_compiles()
    got = run()
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    # length 9 exactly, then buckets on axis 1 (the ladder's where the decoder on padded
    # steps would cost more than twice the work, else 64 steps): each a forward and backward
    padded = {e.padded for e in net._cached.entries.values() if hasattr(e, "pieces")}
    assert padded and padded <= {16, 32, 64}, padded
    assert hb.num_compiles() - c0 == 2 * (1 + len(padded))
    assert all(e.axis == 1 for e in net._cached.entries.values() if hasattr(e, "pieces"))


# ------------------------------------------------------------------ pieces of the largest bucket
@pytest.fixture
def largest_bucket_8():
    """HYBRID_BUCKET_ROWS=8: sizes above 8 run in pieces of 8 rows (512 by default)."""
    from runtime import config
    old = config.set_flag("HYBRID_BUCKET_ROWS", 8)
    yield
    config.set_flag("HYBRID_BUCKET_ROWS", old)


def test_sizes_above_the_largest_bucket_run_in_pieces_of_one_graph(largest_bucket_8):
    net = mlp()
    sizes = (5, 20, 33, 8, 3, 17, 64)
    calls = [[arr((b, 5))] for b in sizes]
    want, got, compiles = _eager_and_hybrid(net, calls)
    for w, g in zip(want, got):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # 5 exactly; the row-bounded bucket of 8 for the others (20, 33, 17, 64 in pieces)
    assert compiles == 2, compiles
    pieces = {e.size: e.pieces for e in net._cached.entries.values() if hasattr(e, "pieces")}
    assert pieces == {20: 3, 33: 5, 8: 1, 3: 1, 17: 3, 64: 8}, pieces


def test_training_gradients_through_pieces_equal_eager(largest_bucket_8):
    def step(net, x):
        x.attach_grad()
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        return [x.grad.asnumpy().copy()] + \
            [p.grad().asnumpy().copy() for p in net.collect_params().values()]
    eager_net, hyb_net = mlp(), mlp()
    eager_net(arr((1, 5)))
    hyb_net(arr((1, 5)))
    for p, q in zip(eager_net.collect_params().values(), hyb_net.collect_params().values()):
        q.set_data(p.data())
    hyb_net.hybridize()
    for b in (4, 19, 8, 26):  # 19 and 26: three and four pieces of the bucket of 8
        x = arr((b, 5))
        want = step(eager_net, hb.array(x.asnumpy()))
        got = step(hyb_net, hb.array(x.asnumpy()))
        for w, g in zip(want, got):  # the pieces' parameter gradients are summed
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # an input that went through a bucket keeps its own history (8: the bucket's own size)
    for b in (8, 19):
        x = hb.array(RNG.standard_normal((b, 5)).astype("float32"))
        x.attach_grad()
        with autograd.record():
            y = x * 2
            loss = (hyb_net(y) ** 2).sum() + (y ** 2).sum()
        loss.backward()
        with autograd.record():
            want = (eager_net(x * 2) ** 2).sum() + ((x * 2) ** 2).sum()
        grad = x.grad.asnumpy().copy()
        x.attach_grad()
        want.backward()
        np.testing.assert_allclose(grad, x.grad.asnumpy(), rtol=1e-5, atol=1e-5)
    assert [e.pieces for e in hyb_net._cached.entries.values() if hasattr(e, "pieces")] == \
        [3, 1, 4]  # 19, 8, 26


def test_a_loss_over_many_token_counts_takes_one_bucket_in_pieces(largest_bucket_8):
    """The language model's case: a per-token loss over T*N rows of logits, T varying."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    sizes = (12, 20, 30, 9, 50, 41)
    data = [(RNG.standard_normal((n, 7)).astype("float32"),
             RNG.integers(0, 7, n).astype("float32")) for n in sizes]

    def run():
        out = []
        for x, y in data:
            logits = hb.array(x)
            logits.attach_grad()
            with autograd.record():
                loss = loss_fn(logits, hb.array(y))
            loss.backward()
            out.append((loss.asnumpy(), logits.grad.asnumpy()))
        return out
    want = run()
    loss_fn.hybridize()
    c0 = hb.num_compiles()
    got = run()
    assert hb.num_compiles() - c0 == 4, hb.num_compiles() - c0  # a forward and a backward
    # for 12 rows exactly, and for the bucket of 8 (every other size in pieces)
    for (wl, wg), (gl, gg) in zip(want, got):
        np.testing.assert_allclose(gl, wl, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gg, wg, rtol=1e-5, atol=1e-6)


def test_no_pieces_for_a_scan_over_the_axis_or_an_output_without_it(largest_bucket_8):
    lstm = gluon.rnn.LSTM(4, input_size=3)  # a foreach scans the time axis: pieces would
    lstm.initialize()                       # lose the state between them
    xs = [arr((t, 2, 3)) for t in (5, 20)]
    want = [lstm(x).asnumpy() for x in xs]
    lstm.hybridize()
    for x, w in zip(xs, want):
        np.testing.assert_allclose(lstm(x).asnumpy(), w, rtol=1e-5, atol=1e-6)
    assert [e.pieces for e in lstm._cached.entries.values() if hasattr(e, "pieces")] == [1]

    class WithNorm(nn.HybridBlock):  # a second output computed from a parameter alone
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(3, in_units=5)

        def forward(self, x):
            return self.dense(x), (self.dense.weight.data() ** 2).sum()
    net = WithNorm()
    net.initialize()
    xs = [arr((b, 5)) for b in (4, 20)]
    want = [[v.asnumpy() for v in net(x)] for x in xs]
    net.hybridize()
    for x, w in zip(xs, want):
        for a, b in zip(net(x), w):
            np.testing.assert_allclose(a.asnumpy(), b, rtol=1e-5, atol=1e-6)
    assert [e.padded for e in net._cached.entries.values() if hasattr(e, "pieces")] == [32]
