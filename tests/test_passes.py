"""Compiler passes: golden before/after text, targets, and random graphs vs the reference."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from compiler.graph import Graph, NodeRef
from compiler.ops import Spec
from compiler.passes import check_plan, fuse, plan_memory, schedule, simplify
from compiler.pipeline import PIPELINE, run_passes
from compiler.reference import run_reference
from compiler.verify import verify


def _g(*inputs):
    g = Graph("t")
    ids = [g.add_input(Spec(s, "float32"), f"x{i}") for i, s in enumerate(inputs)]
    return g, ids


def op(g, name, *args, **attrs):
    """Ints are node ids; write scalars as floats."""
    return g.add_op(name, [NodeRef(a) if isinstance(a, int) else a for a in args], attrs)


def body(graph):
    return "\n".join(graph.format().splitlines()[1:])


def test_simplify_golden():
    g, (x,) = _g((2, 3))
    a = op(g, "mul", x, 1.0)
    b = op(g, "add", a, -0.0)  # the IEEE identity (x + 0.0 is +0.0 for x = -0.0)
    t = op(g, "transpose", b, axes=(1, 0))
    t2 = op(g, "transpose", t, axes=(1, 0))
    r = op(g, "reshape", t2, shape=(6,))
    r2 = op(g, "reshape", r, shape=(2, 3))
    e1 = op(g, "exp", r2)
    e2 = op(g, "exp", r2)
    g.outputs = [op(g, "add", e1, e2)]
    out, rep = simplify(g)
    assert body(out) == ("  %7:f32[2,3] = exp(%0)\n  %9:f32[2,3] = add(%7, %7)\n"
                         "  return %9")
    assert rep["hits"]["common subexpression"] == 1
    assert rep["hits"]["transpose(transpose(x))"] == 1
    assert "x*1" in rep["hits"] and "x+0" in rep["hits"]


def test_simplify_keeps_float_additions_of_positive_zero():
    g, (x,) = _g((2,))
    g.outputs = [op(g, "add", x, 0.0), op(g, "sub", x, -0.0)]
    out, rep = simplify(g)
    assert "add(%0, 0.0)" in out.format() and "sub(%0, -0.0)" in out.format()
    neg = np.array([-0.0, 1.0], np.float32)
    for got in run_reference(out, [neg]):
        assert np.signbit(got[0]) == np.signbit(np.float32(-0.0) + np.float32(0.0))


def test_simplify_keeps_x_times_zero_for_floats_and_folds_constants():
    g, (x,) = _g((3,))
    c = g.add_const(np.array([1.0, 2.0, 3.0], np.float32))
    c2 = op(g, "mul", c, 2.0)
    y = op(g, "mul", x, 0.0)
    g.outputs = [op(g, "add", y, c2)]
    out, rep = simplify(g)
    assert "mul(%0, 0.0)" in out.format()  # NaN * 0 is NaN: not folded away
    assert rep["hits"]["constant folding"] == 1
    xs = np.array([np.nan, 1, np.inf], np.float32)
    np.testing.assert_array_equal(run_reference(out, [xs])[0], run_reference(g, [xs])[0])


def test_elementwise_chain_is_one_kernel():
    g, (x, a, b) = _g((64,), (64,), (64,))
    y = op(g, "add", op(g, "mul", op(g, "tanh", op(g, "add", op(g, "mul", x, a), b)),
                        op(g, "sigmoid", x)), 1.0)
    g.outputs = [y]
    out, rep = fuse(g)
    assert rep["kernels"] == 1
    assert out.meta["fusion"]["groups"][0]["kind"] == "elementwise"


def test_mlp_dense_is_matmul_with_bias_relu_epilogue():
    g = Graph("mlp")
    x = g.add_input(Spec((1, 512), "float32"), "x")
    cur = x
    for i, (o, k) in enumerate(((256, 512), (128, 256), (2, 128))):
        w = g.add_param(Spec((o, k), "float32"), f"w{i}")
        b = g.add_param(Spec((o,), "float32"), f"b{i}")
        y = op(g, "add", op(g, "matmul", cur, op(g, "transpose", w, axes=(1, 0))), b)
        cur = op(g, "relu", y) if i < 2 else y
    g.outputs = [cur]
    out, rep = fuse(g)
    kernels = [k for k in out.meta["fusion"]["groups"] if k["kind"] != "view"]
    assert [k["ops"] for k in kernels] == [["matmul", "add", "relu"]] * 2 + [["matmul", "add"]]
    assert all(k["kind"] == "extern" for k in kernels)
    assert len(out.meta["fusion"]["epilogues"]) == 3


@pytest.mark.parametrize("axis", [None, 1])
def test_a_reduction_after_an_extern_epilogue_reads_it_from_memory(axis):
    """matmul -> div -> sum: the reduction must not join the matmul's in-place epilogue (the
    LLVM lowering only runs elementwise epilogues there); results equal the reference."""
    g, (x,) = _g((6, 6))
    y = op(g, "div", op(g, "matmul", x, x), 10.0)
    g.outputs = [op(g, "sum", y, axis=axis)]
    out, _ = fuse(g)
    groups = out.meta["fusion"]["groups"]
    assert [grp["kind"] for grp in groups] == ["extern", "reduce"]
    assert "reduces it" in out.meta["fusion"]["materialized"][groups[0]["root"]]
    pytest.importorskip("llvmlite")
    from compiler.pipeline import compile as compile_graph
    xv = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32)
    got = compile_graph(g, "llvm").run(np, [xv], [])[0]
    np.testing.assert_allclose(got, run_reference(g, [xv])[0], rtol=1e-5)


def test_fusion_refuses_broadcast_recompute_and_says_why():
    g, (x,) = _g((4, 1))
    e = op(g, "exp", x)
    y = op(g, "add", e, op(g, "full", shape=(4, 8), value=1.0, dtype="float32"))
    g.outputs = [y]
    out, _ = fuse(g)
    (n, users, why) = out.meta["fusion"]["refused"][0]
    assert n == e and "broadcasts" in why


def _saved_cell(n, h):
    """An LSTM cell as a training forward leaves it: every gate and the new cell state are
    graph outputs (saved for the backward) and read by the rest of the chain."""
    g = Graph("cell")
    x = g.add_input(Spec((n, 4 * h), "float32"), "x")
    c = g.add_input(Spec((n, h), "float32"), "c")
    sl = [op(g, "slice", x, begin=(0, k * h), end=(n, (k + 1) * h), step=(1, 1))
          for k in range(4)]
    i, f, o = (op(g, "sigmoid", s) for s in sl[:3])
    t = op(g, "tanh", sl[3])
    c2 = op(g, "add", op(g, "mul", f, c), op(g, "mul", i, t))
    tc = op(g, "tanh", c2)
    h2 = op(g, "mul", o, tc)
    g.outputs = [h2, i, f, o, t, c2, tc]
    return g


@pytest.fixture
def stored_on_cpus_too(monkeypatch):
    """Saved values stored by their consumer's kernel on CPU graphs too (by default only on
    GPUs), so that the LLVM backend runs such kernels here."""
    from compiler.passes import fusion
    monkeypatch.setattr(fusion, "STORED_IN_CONSUMER_ON", ("gpu", "cpu"))


def test_saved_values_are_stored_by_their_consumers_kernel_on_a_gpu_only():
    """On a GPU graph the cell is one kernel (a launch per kernel per time step costs more
    than the re-reads); on a CPU graph, the default, the chain splits at its saved values."""
    g = _saved_cell(6, 8)
    assert fuse(g)[1]["kernels"] == 7
    for n in g.g.nodes:
        g.node(n)["device"] = "gpu(0)"
    fused, report = fuse(g)
    assert report["kernels"] == 1, report["summary"]


def test_values_saved_for_the_backward_are_stored_by_their_consumers_kernel(
        stored_on_cpus_too):
    """A graph output read by one elementwise consumer is computed in that consumer's loop
    and stored there too (multi-output fusion): the cell is one kernel with seven outputs,
    not seven kernels each reading the last one's result back; the results are unchanged on
    the reference interpreter and the LLVM backend."""
    from compiler.pipeline import compile as compile_graph
    g = _saved_cell(6, 8)
    fused, report = fuse(g)
    loops = [grp for grp in fused.meta["fusion"]["groups"] if grp["kind"] != "view"]
    assert report["kernels"] == 1, report["summary"]
    (grp,) = loops
    assert grp["root"] == g.outputs[0] and sorted(grp["extra_outputs"]) == sorted(g.outputs[1:])
    assert "graph output" not in "".join(why for _, _, why in fused.meta["fusion"]["refused"])
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(g.spec(n).shape).astype(np.float32) for n in g.inputs]
    expect = run_reference(g, ins)
    out, _ = run_passes(g)
    check_plan(out)
    for e, r in zip(expect, run_reference(out, ins)):
        np.testing.assert_array_equal(r, e)
    for e, r in zip(expect, compile_graph(g, "llvm")(np, ins, [])):
        np.testing.assert_allclose(r, e, rtol=1e-6, atol=1e-6)


def test_a_saved_value_in_a_reductions_prologue_is_stored_by_the_reduction(stored_on_cpus_too):
    """The consumer's group may end in a reduction: the saved value is a full-shape output
    of the reduction's loop (a softmax's exp, saved, and its sum)."""
    from compiler.pipeline import compile as compile_graph
    g, (x,) = _g((5, 7))
    e = op(g, "exp", x)
    s = op(g, "sum", op(g, "mul", e, 2.0), axis=1, keepdims=True)
    g.outputs = [s, e]
    fused, report = fuse(g)
    assert report["kernels"] == 1, report["summary"]
    ins = [np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)]
    expect = run_reference(g, ins)
    for e_, r in zip(expect, compile_graph(g, "llvm")(np, ins, [])):
        np.testing.assert_allclose(r, e_, rtol=1e-6, atol=1e-6)


def test_a_saved_value_whose_consumer_ends_an_extern_epilogue_keeps_its_own_kernel(
        stored_on_cpus_too):
    """mask * (x @ w), the mask saved (a training dropout after a Dense layer): the product
    becomes the matmul's epilogue, which stores one output, so the mask is computed by a
    kernel of its own (found by the program fuzzer: the mask had no slot)."""
    from compiler.pipeline import compile as compile_graph
    g, (x, w, y) = _g((4, 3), (3, 5), (4, 5))
    m = op(g, "sigmoid", y)
    g.outputs = [op(g, "mul", m, op(g, "matmul", x, w)), m]
    grp = fuse(g)[0].meta["fusion"]["groups"]
    assert all(not grp_["extra_outputs"] for grp_ in grp)
    ins = [np.random.default_rng(2).standard_normal(g.spec(i).shape).astype(np.float32)
           for i in g.inputs]
    for e, r in zip(run_reference(g, ins), compile_graph(g, "llvm")(np, ins, [])):
        np.testing.assert_allclose(r, e, rtol=1e-6, atol=1e-6)


def test_a_saved_value_read_by_two_consumers_or_broadcast_keeps_its_own_kernel(
        stored_on_cpus_too):
    g, (x, y) = _g((4, 3), (1, 3))
    s = op(g, "sigmoid", x)
    a = op(g, "add", s, 1.0)
    b = op(g, "mul", s, x)
    t = op(g, "tanh", y)  # read by a consumer that broadcasts it
    g.outputs = [a, b, s, t, op(g, "add", t, x)]
    grp = fuse(g)[0].meta["fusion"]["groups"]
    assert all(not grp_["extra_outputs"] for grp_ in grp)


def test_schedule_prefers_freeing_memory_and_plan_reuses_buffers():
    g, (x,) = _g((256, 256))
    a = op(g, "exp", x)
    s1 = op(g, "sum", a, axis=0, keepdims=True)
    b = op(g, "tanh", x)
    s2 = op(g, "sum", b, axis=0, keepdims=True)
    c = op(g, "sin", x)
    s3 = op(g, "sum", c, axis=0, keepdims=True)
    g.outputs = [op(g, "add", op(g, "add", s1, s2), s3)]
    out, reports = run_passes(g)
    check_plan(out)
    mem = out.meta["memory"]
    assert mem["arena_bytes"] <= mem["naive_bytes"]


# ------------------------------------------------------------------ random graphs
UNARY = ["exp", "tanh", "sigmoid", "relu", "neg", "abs", "square", "sin"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


@st.composite
def random_graphs(draw):
    shape = draw(st.sampled_from([(3, 4), (5, 1), (2, 3)]))
    n_in = draw(st.integers(1, 3))
    g, ids = _g(*[shape] * n_in)
    vals = list(ids)
    for _ in range(draw(st.integers(2, 30))):
        kind = draw(st.sampled_from(["u", "b", "b", "s", "r", "t", "m", "rs"]))
        a = draw(st.sampled_from(vals))
        sa = g.spec(a).shape
        try:
            if kind == "u":
                v = op(g, draw(st.sampled_from(UNARY)), a)
            elif kind == "b":
                b = draw(st.sampled_from(vals))
                v = op(g, draw(st.sampled_from(BINARY)), a, b)
            elif kind == "s":
                v = op(g, draw(st.sampled_from(BINARY)), a, draw(st.sampled_from([0.0, 1.0, 0.5])))
            elif kind == "r" and len(sa) == 2:
                v = op(g, draw(st.sampled_from(["sum", "max"])), a,
                       axis=draw(st.sampled_from([0, 1, None])), keepdims=True)
            elif kind == "t" and len(sa) == 2:
                v = op(g, "transpose", a, axes=(1, 0))
            elif kind == "m" and len(sa) == 2:
                other = draw(st.sampled_from([x for x in vals if g.spec(x).shape[:1] ==
                                              (sa[1],) and len(g.spec(x).shape) == 2] or [a]))
                if g.spec(other).shape[0] != sa[1]:
                    continue
                v = op(g, "matmul", a, other)
            elif kind == "rs":
                v = op(g, "reshape", a, shape=(-1,) if len(sa) == 2 else shape)
                if len(g.spec(v).shape) == 1 and g.spec(v).shape[0] != shape[0] * shape[1]:
                    continue
            else:
                continue
        except ValueError:
            continue
        vals.append(v)
    outs = draw(st.lists(st.sampled_from(vals[n_in:] or vals), min_size=1, max_size=3,
                         unique=True))
    g.outputs = outs
    return g


@settings(max_examples=150, deadline=None)
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_passes_preserve_results(g, seed):
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(g.spec(i).shape).astype(np.float32) for i in g.inputs]
    expect = run_reference(g, inputs)
    out, _ = run_passes(g)  # verifier runs between passes (HYBRID_CHECK=1 under pytest)
    verify(out)
    check_plan(out)
    got = run_reference(out, inputs)
    for e, r in zip(expect, got):
        np.testing.assert_allclose(r, e, rtol=1e-6, atol=1e-6)
    for name, fn in PIPELINE:  # idempotent
        again, _ = fn(out)
        assert again.format() == out.format(), name
    # each pass alone also preserves results
    for name, fn in PIPELINE:
        single, _ = fn(g)
        for e, r in zip(expect, run_reference(single, inputs)):
            np.testing.assert_allclose(r, e, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_long(g, seed):
    test_random_graphs_passes_preserve_results.hypothesis.inner_test(g, seed)


@settings(max_examples=40, deadline=None)
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_llvm_backend_matches_reference(g, seed):
    from compiler.pipeline import compile as compile_graph
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(g.spec(i).shape).astype(np.float32) for i in g.inputs]
    expect = run_reference(g, inputs)
    got = compile_graph(g, "llvm")(np, inputs, [])
    for e, r in zip(expect, got):
        assert r.shape == e.shape and r.dtype == e.dtype
        np.testing.assert_allclose(r, e, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_with_values_stored_by_their_consumers_match_reference(g, seed):
    """The same on the LLVM backend with saved values stored by their consumers' kernels
    (what GPU graphs get): the lowering of kernels with several outputs."""
    from unittest import mock

    from compiler.passes import fusion
    with mock.patch.object(fusion, "STORED_IN_CONSUMER_ON", ("gpu", "cpu")):
        test_random_graphs_llvm_backend_matches_reference.hypothesis.inner_test(g, seed)


@pytest.mark.parametrize("where", ["input", "arena"])
def test_matmul_reads_a_reshaped_then_transposed_operand_with_its_flag(where):
    """A (T, N, H) value reshaped to (T*N, H) and transposed feeds a matmul through its
    transpose flag (a view slot of the stored shape), not a materialized transposed copy: the
    recurrent weight's gradient A^T B after a reverse scan. From an input and from a value
    computed in the arena."""
    from compiler.codegen.lower import lower
    from compiler.pipeline import compile as compile_graph
    g, (a, b) = _g((5, 4, 6), (20, 3))
    src = op(g, "tanh", a) if where == "arena" else a
    flat = op(g, "reshape", src, shape=(20, 6))
    g.outputs = [op(g, "matmul", op(g, "transpose", flat, axes=(1, 0)), b)]
    program, _ = lower(run_passes(g)[0])
    mm = [s for s in program.steps if getattr(s, "op", None) == "matmul"]
    assert len(mm) == 1 and mm[0].attr_dict.get("transpose_a")
    assert not [s for s in program.steps if getattr(s, "name", "") == "copy"]
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(np.float32) for s in ((5, 4, 6), (20, 3))]
    got = compile_graph(g, "llvm")(np, ins, [])[0]
    x = np.tanh(ins[0]) if where == "arena" else ins[0]
    np.testing.assert_allclose(got, x.reshape(20, 6).T @ ins[1], rtol=1e-5, atol=1e-5)


def _scatter(g, v, shape, begin, end):
    return op(g, "slice_scatter", v, shape=shape, begin=begin, end=end,
              step=(1,) * len(shape))


def test_sum_of_disjoint_slice_scatters_is_a_concatenate():
    """The gradient of splitting a value into blocks (an LSTM's gates): the scatters' sum
    becomes one concatenate, a gap filled with zeros, a -0.0 still summed to +0.0."""
    g, (a, b, c) = _g((2, 3), (2, 2), (2, 1))
    s1 = _scatter(g, a, (2, 8), (0, 0), (2, 3))
    s2 = _scatter(g, b, (2, 8), (0, 5), (2, 7))  # columns 3-4 and 7: a gap each
    s3 = _scatter(g, c, (2, 8), (0, 7), (2, 8))
    g.outputs = [op(g, "add", op(g, "add", s1, s2), s3)]
    out, rep = simplify(g)
    ops = [out.op(n) for n in out.op_nodes()]
    assert "slice_scatter" not in ops and ops.count("concatenate") == 1, ops
    assert rep["hits"].get("sum of disjoint slice_scatters") == 1
    ins = [np.array([[-0.0, 1, 2], [3, 4, 5]], np.float32),
           np.full((2, 2), 7, np.float32), np.full((2, 1), -0.0, np.float32)]
    want, got = run_reference(g, ins)[0], run_reference(out, ins)[0]
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got).any() and not np.signbit(want).any()


@pytest.mark.parametrize("overlap", [True, False])
def test_scatters_that_overlap_or_leave_two_axes_partial_still_add(overlap):
    g, (a, b) = _g((2, 3), (2, 3) if overlap else (1, 3))
    s1 = _scatter(g, a, (2, 6), (0, 0), (2, 3))
    s2 = _scatter(g, b, (2, 6), (0, 2), (2, 5)) if overlap else \
        _scatter(g, b, (2, 6), (1, 3), (2, 6))
    g.outputs = [op(g, "add", s1, s2)]
    out, _ = simplify(g)
    assert [out.op(n) for n in out.op_nodes()].count("slice_scatter") == 2


def test_a_value_read_only_after_a_loop_is_computed_in_the_part_after_it():
    """On one device an op joins the latest part it can: a transposed input read only after
    a foreach is computed in the part after the loop (fused into its reader there), not
    exported from the part before as a materialized copy."""
    from compiler.ops.control import Body
    from compiler.passes.partition import partition
    body = Graph("body")
    d = body.add_input(Spec((3,), "float32"), "d")
    s = body.add_input(Spec((3,), "float32"), "s")
    ns = op(body, "add", d, s)
    body.outputs = [ns, ns]
    g, (x, w) = _g((4, 3), (3, 5))
    h0 = op(g, "tanh", op(g, "sum", x, axis=0))
    loop = op(g, "foreach", x, h0, body=Body(body), n_data=1, n_states=1)
    final = op(g, "nth", loop, index=1)
    wt = op(g, "transpose", w, axes=(1, 0))
    g.outputs = [op(g, "matmul", wt, op(g, "reshape", final, shape=(3, 1)))]
    split = partition(g)
    assert len(split.parts) == 3
    where = {p.graph.op(n): i for i, p in enumerate(split.parts) for n in p.graph.op_nodes()}
    assert where["tanh"] == 0 and where["foreach"] == 1 and where["transpose"] == 2


def _lstm_cell(n, h):
    g = Graph("cell")
    x = g.add_input(Spec((n, 4 * h), "float32"), "x")
    hs = g.add_input(Spec((n, h), "float32"), "h")
    c = g.add_input(Spec((n, h), "float32"), "c")
    w = g.add_input(Spec((h, 4 * h), "float32"), "w")
    gates = op(g, "add", x, op(g, "matmul", hs, w))
    sl = [op(g, "slice", gates, begin=(0, k * h), end=(n, (k + 1) * h), step=(1, 1))
          for k in range(4)]
    i, f, o = (op(g, "sigmoid", s) for s in sl[:3])
    c2 = op(g, "add", op(g, "mul", f, c), op(g, "mul", i, op(g, "tanh", sl[3])))
    h2 = op(g, "mul", o, op(g, "tanh", c2))
    back = _scatter(g, h2, (n, 2 * h), (0, h), (n, 2 * h))  # rows kept apart
    g.outputs = [op(g, "reshape", op(g, "reshape", h2, shape=(n, 2, h // 2)), shape=(n, h)),
                 h2, c2, back]
    return g, [x, hs, c]


def test_resize_batch_computes_the_same_rows_on_a_slice_of_the_batch():
    from compiler.passes.resize import resize_batch
    g, batched = _lstm_cell(6, 4)
    half = resize_batch(g, batched, 3)
    assert [half.spec(o).shape for o in half.outputs] == [(3, 4), (3, 4), (3, 4), (3, 8)]
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(g.spec(n).shape).astype(np.float32) for n in g.inputs]
    full = run_reference(g, ins)
    for lo in (0, 3):
        part = run_reference(half, [a[lo:lo + 3] if j < 3 else a for j, a in enumerate(ins)])
        for a, b in zip(full, part):
            np.testing.assert_array_equal(a[lo:lo + 3], b)


def test_resize_batch_refuses_rows_that_mix_and_captured_rows():
    from compiler.passes.resize import NotResizable, resize_batch
    g, (x,) = _g((6, 4))
    g.outputs = [op(g, "add", x, op(g, "sum", x, axis=0, keepdims=True))]
    with pytest.raises(NotResizable, match="reduces over the batch"):
        resize_batch(g, [x], 3)
    g, (x, m) = _g((6, 4), (6, 4))  # m carries the batch but is not said to
    g.outputs = [op(g, "mul", x, m)]
    with pytest.raises(NotResizable, match="batch-free value"):
        resize_batch(g, [x], 3)
    g, (q, k) = _g((6, 1, 4), (6, 4, 5))  # attention: captured keys with a row per example
    g.outputs = [op(g, "matmul", q, k)]
    with pytest.raises(NotResizable, match="matmul"):
        resize_batch(g, [q], 3)


@pytest.mark.parametrize("keepdims", [True, False])
def test_pick_of_a_log_softmax_picks_before_the_subtractions(keepdims):
    """A softmax cross-entropy's pick(x - max - log(sum)) becomes x[i] - max - log(sum): the
    log-softmax is no longer written for every class, the exp-sum reads x once, and the
    result is the same bits (the same operations on the same elements)."""
    g = Graph("t")
    x = g.add_input(Spec((5, 7), "float32"), "x")
    i = g.add_input(Spec((5,), "int64"), "i")
    m = op(g, "max", x, axis=-1, keepdims=True)
    d = op(g, "sub", x, m)
    lse = op(g, "log", op(g, "sum", op(g, "exp", d), axis=-1, keepdims=True))
    g.outputs = [op(g, "pick", op(g, "sub", d, lse), i, axis=1, keepdims=keepdims)]
    out, rep = simplify(g)
    assert rep["hits"].get("pick of elementwise") == 2
    picked = [n for n in out.op_nodes() if out.op(n) == "pick"]
    assert [out.arg_ids(n)[0] for n in picked] == [out.inputs[0]], "pick reads x itself"
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal((5, 7)).astype(np.float32) * 30,
           np.array([0, 6, 3, 9, -2], np.int64)]  # out of range clips, as pick does
    want, got = run_reference(g, ins)[0], run_reference(out, ins)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_saved_value_a_reduction_reads_is_stored_by_the_reduction_on_a_cpu_too():
    """exp(x - max), saved for the backward and summed (a softmax cross-entropy's forward):
    on a CPU graph too, by default, the sum's loop stores it (one pass over the rows, not
    one that writes it and one that reads it back); an elementwise consumer still splits
    there on a CPU. Results unchanged on the LLVM backend."""
    from compiler.pipeline import compile as compile_graph
    g, (x,) = _g((6, 9))
    e = op(g, "exp", op(g, "sub", x, op(g, "max", x, axis=-1, keepdims=True)))
    s = op(g, "sum", e, axis=-1, keepdims=True)
    g.outputs = [s, e]
    fused, report = fuse(g)
    assert report["kernels"] == 2, report["summary"]  # the max, then exp and sum
    (grp,) = [grp for grp in fused.meta["fusion"]["groups"] if grp["extra_outputs"]]
    assert grp["kind"] == "reduce" and grp["extra_outputs"] == [e]
    ins = [np.random.default_rng(2).standard_normal((6, 9)).astype(np.float32) * 5]
    for want, got in zip(run_reference(g, ins), compile_graph(g, "llvm")(np, ins, [])):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    g2, (x2,) = _g((6, 9))  # an argmax keeps its input in a kernel of its own
    e2 = op(g2, "exp", x2)
    g2.outputs = [op(g2, "argmax", e2, axis=-1), e2]
    assert fuse(g2)[1]["kernels"] == 2


def _one_hot_sum(rows=5, depth=7, *, clipped=True, start=0, neg=True, axis_sum=1,
                 keepdims=True):
    """sum([-]where(clip(i) == arange, v, 0)): a pick's gradient summed along its axis (the
    log-softmax backward of a softmax cross-entropy)."""
    g = Graph("t")
    i = g.add_input(Spec((rows,), "int64"), "i")
    v = g.add_input(Spec((rows, 1), "float32"), "v")
    pos = op(g, "reshape", op(g, "arange", start=start, stop=start + depth, step=1,
                              dtype="int64"), shape=(1, depth))
    idx = op(g, "clip", i, a_min=0, a_max=depth - 1) if clipped else i
    hot = op(g, "where", op(g, "eq", op(g, "reshape", idx, shape=(rows, 1)), pos), v, 0.0)
    if neg:
        hot = op(g, "neg", hot)
    g.outputs = [op(g, "sum", hot, axis=(axis_sum,), keepdims=keepdims)]
    return g


@pytest.mark.parametrize("neg", [True, False])
@pytest.mark.parametrize("keepdims", [True, False])
def test_the_sum_of_a_one_hot_is_its_one_value(neg, keepdims):
    """Exactly one element per row is v (the index clipped into range, the positions
    0..depth-1): the sum is v (+ 0.0, as the sum's zeros make of -0.0), and the one-hot
    rows are no longer written and read back to be summed."""
    g = _one_hot_sum(neg=neg, keepdims=keepdims)
    out, rep = simplify(g)
    assert rep["hits"].get("sum of a one-hot") == 1, rep["summary"]
    assert not [n for n in out.op_nodes() if out.op(n) in ("sum", "where", "eq")]
    ins = [np.array([0, 6, 3, 9, -2], np.int64),  # out of range clips, as pick does
           np.array([[1.5], [-2.0], [np.inf], [np.nan], [3e-39]], np.float32)]
    want, got = run_reference(g, ins)[0], run_reference(out, ins)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", [dict(clipped=False), dict(start=1), dict(axis_sum=0)])
def test_a_sum_that_is_not_of_a_one_hot_row_is_left_alone(case):
    """An index that may fall outside (its row is all zeros), positions not from 0, or a
    sum along another axis: no rewrite."""
    out, rep = simplify(_one_hot_sum(**case))
    assert "sum of a one-hot" not in rep["hits"]


def test_a_sum_of_a_comparison_with_a_number_is_left_alone():
    """where(positions == 3, v, 0): one column, not one element per row chosen by an index."""
    g = Graph("t")
    v = g.add_input(Spec((5, 1), "float32"), "v")
    pos = op(g, "reshape", op(g, "arange", start=0, stop=7, step=1, dtype="int64"),
             shape=(1, 7))
    hot = op(g, "where", op(g, "eq", pos, 3.0), v, 0.0)
    g.outputs = [op(g, "sum", hot, axis=(1,), keepdims=True)]
    out, rep = simplify(g)
    assert "sum of a one-hot" not in rep["hits"]
    ins = [np.arange(5, dtype=np.float32).reshape(5, 1)]
    np.testing.assert_array_equal(run_reference(out, ins)[0], run_reference(g, ins)[0])


def test_pick_of_an_operand_broadcast_along_another_axis_is_left_alone():
    g = Graph("t")
    x = g.add_input(Spec((5, 7), "float32"), "x")
    row = g.add_input(Spec((1, 7), "float32"), "row")  # varies along the picked axis
    i = g.add_input(Spec((5,), "int64"), "i")
    g.outputs = [op(g, "pick", op(g, "mul", x, row), i, axis=1)]
    out, rep = simplify(g)
    assert "pick of elementwise" not in rep["hits"]


def test_work_counts_multiply_adds_of_products_and_convolutions():
    """graph_work (compiler/passes/work.py): a shape bucket's padded work against the real
    size's. A convolution's rule once multiplied by its weight Spec's dtype name (a Spec is
    a tuple): found by the program fuzzer on a scan beside a convolution."""
    from compiler.ops.core import op_work
    from compiler.passes.work import graph_work
    g = Graph("t")
    x = g.add_input(Spec((2, 3, 7, 7), "float32"), "x")
    w = g.add_input(Spec((6, 3, 3, 3), "float32"), "w")
    m = g.add_input(Spec((4, 5), "float32"), "m")
    k = g.add_input(Spec((5, 8), "float32"), "k")
    c = op(g, "conv2d", x, w, stride=(1, 1), pad=(0, 0))
    p = op(g, "matmul", m, k)
    g.outputs = [op(g, "tanh", c), p]
    taps = 2 * 6 * 5 * 5 * 3 * 3 * 3
    assert op_work("conv2d", g.spec(c), [g.spec(x), g.spec(w)], {}) == taps
    assert op_work("conv2d_grad_weight", g.spec(w), [g.spec(x), g.spec(c)],
                   {"weight_shape": (6, 3, 3, 3)}) == taps
    assert op_work("conv2d_grad_data", g.spec(x), [g.spec(c), g.spec(w)],
                   {"data_shape": (2, 3, 7, 7)}) == taps
    rows, other, inside = graph_work(g, frozenset([c]))
    assert (rows, other, inside) == (taps, 4 * 8 * 5 + 2 * 6 * 5 * 5, 0)
