"""Row bounds: a shape bucket's program computes its real rows only (compiler/passes/
row_bounds.py, then the LLVM backend's bounded loops and products).

The pass is tested on kernel IR without a device; the native programs run with their padded
rows set to NaN, so a step that read one (a sum over the batch, a product contracting the
rows) would show it; and end to end, many batch sizes through one hybridized net take one
bucket, equal to eager."""
import dataclasses

import numpy as np
import pytest

import hybrid as hb
from compiler.codegen.kernel import Load, Output, ProgramBuilder, call
from compiler.passes.row_bounds import row_bounds
from hybrid import autograd, gluon, nn


def dense_program(P, C, H):
    """x (P, C) -> relu(x @ W.T + b) (P, H), its row sums (P,), its column sums (a sum over
    the batch, (H,)), x^T y (a product contracting the rows, (C, H)) and y @ W (P, C)."""
    pb = ProgramBuilder()
    x, count = pb.input((P, C)), pb.input((), "int64")
    w, b = pb.param((H, C)), pb.param((H,))
    t = pb.temp((P, H))
    pb.extern("matmul", [x, w], [t], transpose_b=True)
    y = pb.output((P, H))
    pb.loop((P, H), [pb.access(t), pb.access(b, (P, H))],
            [Output(pb.access(y), call("relu", call("add", Load(0), Load(1), dtype="float32"),
                                       dtype="float32"))])
    row_sum, col_sum = pb.output((P,)), pb.output((H,))
    pb.loop((P, H), [pb.access(y)], [Output(pb.access(row_sum, strides=(1, 0)), Load(0), "sum")])
    pb.loop((P, H), [pb.access(y)], [Output(pb.access(col_sum, strides=(0, 1)), Load(0), "sum")])
    xty, yw = pb.output((C, H)), pb.output((P, C))
    pb.extern("matmul", [x, y], [xty], transpose_a=True)
    pb.extern("matmul", [y, w], [yw])
    return pb.build(), x, count


def test_every_step_of_a_dense_layer_and_its_gradients_is_bounded():
    prog, x, _ = dense_program(64, 40, 48)
    assert row_bounds(prog, {x: 40}, 64) == (
        (0, ("m",), 1), (1, ("loop", 0), 1), (2, ("loop", 0), 1), (3, ("loop", 0), 1),
        (4, ("k",), 1), (5, ("m",), 1))
    # a (T*N, C) value of T units: N rows of C per unit
    assert row_bounds(prog, {x: 8 * 40}, 8)[0] == (0, ("m",), 8)


def _program(loop_shape, load_strides, out_shape, out_strides, reduce=None, P=8, C=4):
    pb = ProgramBuilder()
    x = pb.input((P, C))
    w = pb.param((P, C))
    out = pb.output(out_shape)
    loads = [pb.access(x, strides=load_strides[0])] + \
        ([pb.access(w, strides=load_strides[1])] if len(load_strides) > 1 else [])
    expr = call("add", Load(0), Load(1), dtype="float32") if len(loads) > 1 else Load(0)
    pb.loop(loop_shape, loads, [Output(pb.access(out, strides=out_strides), expr, reduce)])
    return pb.build(), x


@pytest.mark.parametrize("case, why", [
    (((8, 4), [(4, 1), (4, 1)], (8, 4), (4, 1)), "a batch-free value read along the batch"),
    (((4, 8), [(8, 1)], (4, 8), (8, 1)), "two units per iteration"),
    (((4, 8), [(1, 4)], (4, 8), (8, 1)), "the batch walked on another axis of its value"),
])
def test_steps_the_pass_cannot_bound_leave_the_program_unbounded(case, why):
    prog, x = _program(*case)
    assert row_bounds(prog, {x: 4}, 8) == (), why


def test_an_embedding_gather_and_its_scatter_are_bounded_a_gather_of_batch_rows_is_not():
    pb = ProgramBuilder()
    idx, table = pb.input((8, 3), "int64"), pb.param((10, 4))
    rows, grad = pb.output((8, 3, 4)), pb.output((10, 4))
    pb.extern("take", [table, idx], [rows], axis=0, mode="clip")
    pb.extern("take_grad", [rows, idx], [grad], axis=0, dim=10, mode="clip")
    assert row_bounds(pb.build(), {idx: 3}, 8) == ((0, ("take",), 3), (1, ("take",), 3))
    pb = ProgramBuilder()
    x, idx = pb.input((8, 4)), pb.input((5,), "int64")
    out = pb.output((5, 4))
    pb.extern("take", [x, idx], [out], axis=0, mode="clip")  # rows of the batch move
    assert row_bounds(pb.build(), {x: 4}, 8) == ()


def test_one_unit_or_a_slot_of_another_size_leaves_the_program_unbounded():
    prog, x, _ = dense_program(1, 4, 4)
    assert row_bounds(prog, {x: 4}, 1) == ()  # nothing to save
    prog, x, _ = dense_program(8, 4, 4)
    assert row_bounds(prog, {x: 5}, 8) == ()  # the slot is not 8 units of 5


@pytest.mark.parametrize("P, C, H", [
    (64, 40, 48),     # the generated GEMM loops, one worker
    (512, 300, 512),  # loops split across threads, GEMM panels among workers
    (256, 64, 3),     # a thin product: one GEMV per row
    (1024, 64, 1000),
    (8, 1200, 700),   # BLAS
])
def test_bounded_programs_compute_the_real_rows_and_never_read_the_others(P, C, H):
    from compiler.codegen.llvm.emit import compile_program, run_program
    prog, x, count = dense_program(P, C, H)
    rows = row_bounds(prog, {x: C}, P)
    compiled = compile_program(dataclasses.replace(prog, count_slot=count, rows=rows),
                               f"row_bounds_{P}_{C}_{H}")
    rng = np.random.default_rng(P + C + H)
    w = rng.standard_normal((H, C)).astype(np.float32)
    b = rng.standard_normal(H).astype(np.float32)
    for n in sorted({0, 1, 3, P // 2 + 1, P - 1, P}):
        xv = np.full((P, C), np.nan, np.float32)  # a padded row read anywhere: NaN out
        xv[:n] = rng.standard_normal((n, C))
        y, row_sum, col_sum, xty, yw = run_program(compiled, [xv, np.array(n, np.int64)],
                                                   [w, b])
        want = np.maximum(xv[:n] @ w.T + b, 0)
        tol = dict(rtol=2e-5, atol=2e-5 * (1 + np.abs(want).max(initial=0)) * max(C, H, n))
        np.testing.assert_allclose(y[:n], want, **tol)
        np.testing.assert_allclose(row_sum[:n], want.sum(1), **tol)
        np.testing.assert_allclose(col_sum, want.sum(0), **tol)
        np.testing.assert_allclose(xty, xv[:n].T @ want, **tol)
        np.testing.assert_allclose(yw[:n], want @ w, **tol)


def test_a_count_past_the_bucket_is_clamped_to_it():
    from compiler.codegen.llvm.emit import compile_program, run_program
    prog, x, count = dense_program(16, 8, 8)
    compiled = compile_program(dataclasses.replace(
        prog, count_slot=count, rows=row_bounds(prog, {x: 8}, 16)), "row_bounds_clamp")
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((16, 8)).astype(np.float32)
    w, b = rng.standard_normal((8, 8)).astype(np.float32), np.zeros(8, np.float32)
    for n in (16, 99, -5):
        col_sum = run_program(compiled, [xv, np.array(n, np.int64)], [w, b])[2]
        rows = min(max(n, 0), 16)
        np.testing.assert_allclose(col_sum, np.maximum(xv[:rows] @ w.T, 0).sum(0), rtol=1e-5,
                                   atol=1e-5)


def _eager_then_hybrid(net, xs):
    want = [net(x).asnumpy() for x in xs]
    net.hybridize()
    c0 = hb.num_compiles()
    got = [net(x).asnumpy() for x in xs]
    return want, got, hb.num_compiles() - c0


def test_every_batch_size_up_to_the_bucket_runs_one_row_bounded_graph():
    rng = np.random.default_rng(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(10))
    net.initialize()
    xs = [hb.array(rng.standard_normal((b, 20)).astype("float32")) for b in
          list(range(1, 65)) + [100, 70, 128, 3]]
    want, got, compiles = _eager_then_hybrid(net, xs)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # the first size exactly; 2..64 the 64-row bucket; 100, 70, 128 the 128-row one
    assert compiles == 3, compiles
    buckets = [e for e, _ in net._cached.buckets.values()]
    assert sorted(e.rows["units"] for e in buckets) == [64, 128]
    assert all(e.compiled_exe.report["row_bounds"] > 0 for e in buckets)
    text = hb.explain(net)  # and explain says so, per size
    assert "runs the shape bucket of 64 rows: its program computes the real rows only" in text


def test_a_graph_row_bounds_cannot_take_pads_the_ladders_way():
    class Classes(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4, in_units=3)

        def forward(self, x):
            return self.dense(x).argmax(axis=1)
    rng = np.random.default_rng(1)
    net = Classes()
    net.initialize()
    xs = [hb.array(rng.standard_normal((b, 3)).astype("float32")) for b in (1, 2, 3, 5)]
    want, got, compiles = _eager_then_hybrid(net, xs)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    assert compiles == 4  # exactly 1; the buckets of 2, 4 and 8: an argmax is not bounded
    assert all(not e.compiled_exe.report.get("row_bounds")
               for e, _ in net._cached.buckets.values())


def _train(net, xs, loss_of):
    """Per call: the loss and every parameter's gradient."""
    out = []
    for x in xs:
        with autograd.record():
            loss = loss_of(net(x))
        loss.backward()
        out.append([loss.asnumpy()] + [p.grad().asnumpy().copy()
                                       for p in net.collect_params().values()])
    return out


def _twins(make):
    hb.random.seed(7)
    a = make()
    hb.random.seed(7)
    b = make()
    return a, b


def _trains_in_one_bounded_bucket(make, xs, loss_of, rtol, atol):
    """Twin nets trained on ``xs``, eagerly and hybridized: equal losses and gradients, the
    first size compiled exactly and one bucket for the others, both halves of its training
    graphs row-bounded. Returns (eager, hybrid)."""
    eager, hybrid = _twins(make)
    want = _train(eager, xs, loss_of)
    hybrid.hybridize()
    c0 = hb.num_compiles()
    got = _train(hybrid, xs, loss_of)
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    assert hb.num_compiles() - c0 == 4  # forward and backward, of each
    (entry, _), = hybrid._cached.buckets.values()
    (train,) = entry.train.values()
    assert train[1].report["row_bounds"] and train[2].report["row_bounds"]
    return eager, hybrid


def _mlp(hidden, activation, in_units, outputs):
    """A maker of initialized two-layer MLPs (one per call: _twins seeds them alike)."""
    def make():
        net = nn.HybridSequential()
        net.add(nn.Dense(hidden, activation=activation, in_units=in_units),
                nn.Dense(outputs, in_units=hidden))
        net.initialize()
        return net
    return make


def test_training_steps_of_every_batch_size_run_one_bounded_bucket_equal_to_eager():
    make = _mlp(16, "relu", 6, 3)
    rng = np.random.default_rng(2)
    xs = [hb.array(rng.standard_normal((b, 6)).astype("float32")) for b in (7, 1, 5, 33, 2, 64)]
    # 7 exactly (forward and backward), then one 64-row bucket for every other size
    _trains_in_one_bounded_bucket(make, xs, lambda y: (y * y).sum(), 1e-4, 1e-5)


def test_a_language_models_lengths_train_in_one_bounded_bucket_equal_to_eager():
    """Time-major tokens: the embedding, the input projection, the LSTM's counted scan and
    the decoder all stop after the real steps, forward and backward."""
    class LanguageModel(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(30, 8)
            self.lstm = gluon.rnn.LSTM(12, input_size=8)
            self.dense = nn.Dense(30, in_units=12)

        def forward(self, tokens):
            return self.dense(self.lstm(self.embedding(tokens)).reshape((-1, 12)))

    def make():
        net = LanguageModel()
        net.initialize()
        return net
    rng = np.random.default_rng(3)
    xs = [hb.array(rng.integers(0, 30, (t, 4)), dtype="int64") for t in (35, 10, 50, 23, 64)]
    # 35 exactly; one 64-step bucket for 10, 50, 23, 64
    eager, hybrid = _trains_in_one_bounded_bucket(make, xs, lambda y: (y * y).mean(), 2e-4,
                                                  2e-5)
    # and predicting: the same bucket's inference executable, equal to eager
    for t in (12, 40):
        x = hb.array(rng.integers(0, 30, (t, 4)), dtype="int64")
        np.testing.assert_allclose(hybrid(x).asnumpy(), eager(x).asnumpy(), rtol=1e-4,
                                   atol=1e-5)


def test_a_bucket_that_predicted_then_trains_in_predict_mode_sums_the_real_rows_only():
    """autograd.record(train_mode=False) keeps the predict-mode signature: its bucket has an
    inference executable (given a count rounded up to the GEMM's row tile) and now trains
    too, with the exact count (rows past it are gradient rows no one filled)."""
    make = _mlp(8, "tanh", 5, 2)
    rng = np.random.default_rng(4)
    xs = [hb.array(rng.standard_normal((b, 5)).astype("float32")) for b in (3, 5, 11)]
    eager, hybrid = _twins(make)
    hybrid.hybridize()
    for x in xs:  # predicting first: the bucket and its inference executable
        np.testing.assert_allclose(hybrid(x).asnumpy(), eager(x).asnumpy(), rtol=1e-5,
                                   atol=1e-6)

    def train(net):
        out = []
        for x in xs:
            with autograd.record(train_mode=False):
                loss = (net(x) ** 2).sum()
            loss.backward()
            out.append([p.grad().asnumpy().copy() for p in net.collect_params().values()])
        return out
    for w, g in zip(train(eager), train(hybrid)):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def conv_program(P):
    """x (P, 2, 8, 8) -> y = conv2d(x, w) (P, 3, 6, 6) -> pooled (P, 3, 3, 3); with dy = the
    pooled values: the pooling's gradient, both of the convolution's (dx and dw, a sum over
    the images)."""
    pb = ProgramBuilder()
    x, count = pb.input((P, 2, 8, 8)), pb.input((), "int64")
    w = pb.param((3, 2, 3, 3))
    conv = dict(stride=(1, 1), pad=(0, 0), dilation=(1, 1), groups=1)
    pool = dict(pool_type="max", kernel=(2, 2), stride=(2, 2), pad=(0, 0), global_pool=False,
                count_include_pad=True)
    y, pooled = pb.output((P, 3, 6, 6)), pb.output((P, 3, 3, 3))
    dy, dx, dw = pb.output((P, 3, 6, 6)), pb.output((P, 2, 8, 8)), pb.output((3, 2, 3, 3))
    pb.extern("conv2d", [x, w], [y], **conv)
    pb.extern("pool2d", [y], [pooled], **pool)
    pb.extern("pool2d_grad", [pooled, y, pooled], [dy], **pool)
    pb.extern("conv2d_grad_data", [dy, w], [dx], data_shape=(P, 2, 8, 8), **conv)
    pb.extern("conv2d_grad_weight", [x, dy], [dw], weight_shape=(3, 2, 3, 3), **conv)
    return pb.build(), x, count


@pytest.mark.parametrize("P", [8, 64])
def test_convolutions_and_pooling_bounded_read_no_padded_image(P):
    from compiler.codegen.llvm.emit import compile_program, run_program
    prog, x, count = conv_program(P)
    rows = row_bounds(prog, {x: 2 * 8 * 8}, P)
    assert [what for _, what, _ in rows] == [("conv2d",), ("pool2d",), ("pool2d_grad",),
                                             ("conv2d_grad_data",), ("conv2d_grad_weight",)]
    bounded = compile_program(dataclasses.replace(prog, count_slot=count, rows=rows),
                              f"row_bounds_conv_{P}")
    full = compile_program(prog, f"row_bounds_conv_full_{P}")
    rng = np.random.default_rng(P)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    for n in sorted({1, 3, P // 2 + 1, P}):
        real = rng.standard_normal((n, 2, 8, 8)).astype(np.float32)
        nan_padded = np.full((P, 2, 8, 8), np.nan, np.float32)
        nan_padded[:n] = real
        zero_padded = np.zeros((P, 2, 8, 8), np.float32)  # zero images add nothing to dw
        zero_padded[:n] = real
        got = run_program(bounded, [nan_padded, np.array(n, np.int64)], [w])
        want = run_program(full, [zero_padded, np.array(P, np.int64)], [w])
        for g, wv in zip(got[:4], want[:4]):
            np.testing.assert_allclose(g[:n], wv[:n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[4], want[4], rtol=1e-4, atol=1e-4)


def test_a_conv_net_predicts_and_trains_every_batch_size_in_one_bounded_bucket():
    def make():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(4, 3, activation="relu", in_channels=1), nn.MaxPool2D(2),
                nn.Dense(5, in_units=4 * 3 * 3))
        net.initialize()
        return net
    rng = np.random.default_rng(5)
    xs = [hb.array(rng.standard_normal((b, 1, 8, 8)).astype("float32")) for b in (6, 1, 9, 40)]
    _trains_in_one_bounded_bucket(make, xs, lambda y: (y * y).sum(), 1e-4, 1e-5)
    net = make()
    want, got, compiles = _eager_then_hybrid(net, xs)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert compiles == 2  # 6 exactly, then one bounded 64-row bucket
