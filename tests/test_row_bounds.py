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
from hybrid import nn


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


def test_a_gather_or_one_unit_leaves_the_program_unbounded():
    pb = ProgramBuilder()
    idx, table = pb.input((8,), "int64"), pb.param((10, 3))
    out = pb.output((8, 3))
    pb.extern("take", [table, idx], [out], axis=0, mode="clip")
    assert row_bounds(pb.build(), {idx: 1}, 8) == ()
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


def test_a_graph_row_bounds_cannot_take_pads_the_ladders_way():
    rng = np.random.default_rng(1)
    net = nn.HybridSequential()
    net.add(nn.Embedding(50, 8), nn.Dense(4, flatten=False))
    net.initialize()
    xs = [hb.array(rng.integers(0, 50, (b, 3)), dtype="int64") for b in (1, 2, 3, 5, 9)]
    want, got, compiles = _eager_then_hybrid(net, xs)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert compiles == 5  # exactly 1; the buckets of 2, 4, 8 and 16: a gather is not bounded
    assert all(not e.compiled_exe.report.get("row_bounds")
               for e, _ in net._cached.buckets.values())
