"""LLVM codegen of reductions (sum/prod/max/min) vs the eager impls, over many axes."""
import functools

import numpy as np
import pytest

from compiler.codegen import Access, Load, Output, ProgramBuilder, call, interpret
from compiler.codegen.llvm import compile_program, run_program
from compiler.codegen.testing import CaseProgram

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SHAPES_AXES = [((17,), None), ((17,), 0), ((5, 7), 0), ((5, 7), 1), ((5, 7), (0, 1)),
               ((3, 4, 5), 1), ((3, 4, 5), (0, 2)), ((3, 4, 5), (1, 2)), ((2, 3, 4, 5), (1, 3)),
               ((1, 9), 0), ((6, 1), 1), ((0, 4), 0), ((4, 0), 1), ((3, 0, 2), (0, 2)),
               ((), None), ((1000,), None), ((33, 65), 1), ((65, 33), 0)]
OPS = ("sum", "prod", "max", "min")


def data(dtype, shape, seed):
    r = np.random.default_rng(seed)
    if dtype.startswith("float"):
        return (r.standard_normal(shape) * 2 + 0.3).astype(dtype)
    if dtype == "bool":
        return r.random(shape) < 0.5
    return r.integers(-4, 5, shape).astype(dtype)


def empty_ok(op, shape, axis):
    if op not in ("max", "min"):
        return True
    from compiler.ops.core import normalize_axis
    axes = normalize_axis(axis, len(shape))
    return not any(shape[a] == 0 for a in axes) and (axis is not None or np.prod(shape) > 0)


@functools.lru_cache(maxsize=None)
def results():
    cases = CaseProgram()
    # every shape for float32 (keepdims too); a sample for the other dtypes (compile time)
    plan = {"float32": range(len(SHAPES_AXES)), "float64": (1, 3, 6, 11, 15, 16),
            "int32": (0, 2, 5, 7, 8, 12, 16), "int8": (0, 4, 6), "bool": (0, 4, 6)}
    for dtype, which in plan.items():
        for op in OPS:
            if dtype in ("bool", "int8") and op not in ("sum", "max"):
                continue
            if dtype == "bool" and op != "sum":
                continue
            for k in which:
                shape, axis = SHAPES_AXES[k]
                if not empty_ok(op, shape, axis):
                    continue
                x = data(dtype, shape, k)
                if op == "prod" and dtype.startswith("float"):
                    x = (np.abs(x) * 0.2 + 0.9).astype(dtype)  # keep products finite
                for keep in ((False, True) if dtype == "float32" else (k % 2 == 1,)):
                    cases.reduction(op, x, axis, keep, label=f"{op}-{dtype}-{k}-{keep}")
    return {c.label: (c, got, want) for c, got, want in cases.run()}


@pytest.mark.parametrize("dtype", ("float32", "float64", "int32", "int8", "bool"))
@pytest.mark.parametrize("op", OPS)
def test_reduction(op, dtype):
    found = [v for k, v in results().items() if k.startswith(f"{op}-{dtype}-")]
    if (dtype == "bool" and op != "sum") or (dtype == "int8" and op not in ("sum", "max")):
        assert not found
        return
    assert found
    for c, got, want in found:
        assert got.shape == want.shape and got.dtype == want.dtype, c
        if dtype.startswith("float"):
            tol = 2e-6 if dtype == "float32" else 1e-13
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10, err_msg=str(c))
        else:
            np.testing.assert_array_equal(got, want, err_msg=str(c))


def test_nan_propagates_through_max_min():
    x = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 2.0], [-1.0, -2.0, np.nan]],
                 np.float32)
    x = np.tile(x, (1, 7))  # rows of 21 (vector bodies and remainders)
    cases = CaseProgram()
    for op in OPS:
        for axis in (0, 1, None):
            cases.reduction(op, x, axis)
    for c, got, want in cases.run():
        np.testing.assert_array_equal(got, want, err_msg=str(c))


def test_long_sum_accuracy():
    """float32 sums accumulate in several vector partial sums: close to NumPy's pairwise."""
    x = np.random.default_rng(0).random(1 << 20).astype(np.float32)
    cases = CaseProgram()
    cases.reduction("sum", x)
    cases.reduction("sum", x.reshape(1024, 1024), 1)
    cases.reduction("sum", x.reshape(1024, 1024), 0)
    exact = [x.astype(np.float64).sum(), x.reshape(1024, 1024).astype(np.float64).sum(1),
             x.reshape(1024, 1024).astype(np.float64).sum(0)]
    for (c, got, want), ex in zip(cases.run(), exact):
        np.testing.assert_allclose(got, ex, rtol=2e-6)


def test_fused_reduction_with_elementwise_and_two_outputs():
    """softmax pieces in one kernel: e = exp(x - m) stored AND row sums of e reduced."""
    x = np.random.default_rng(1).standard_normal((9, 37)).astype(np.float32)
    m = x.max(axis=1, keepdims=True)
    pb = ProgramBuilder()
    sx, sm = pb.input(x.shape), pb.input(m.shape)
    se, ss = pb.output(x.shape), pb.output((9, 1))
    e = call("exp", call("sub", Load(0), Load(1), dtype="float32"), dtype="float32")
    pb.loop(x.shape, [pb.access(sx), pb.access(sm, x.shape)],
            [Output(pb.access(se), e), Output(Access(ss, (1, 0)), e, "sum")])
    prog = pb.build()
    got_e, got_s = run_program(compile_program(prog, "softmax_parts"), [x, m])
    want_e = np.exp(x - m)
    np.testing.assert_allclose(got_e, want_e, rtol=1e-6)
    np.testing.assert_allclose(got_s, want_e.sum(axis=1, keepdims=True), rtol=2e-6)
    ref_e, ref_s = interpret(prog, [x, m])
    np.testing.assert_allclose(got_s, ref_s, rtol=2e-6)


def test_reduce_over_broadcast_and_transposed_input():
    """sum over axis 0 of x.T (a strided walk) and of a broadcast operand."""
    x = np.random.default_rng(2).standard_normal((8, 13)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((13,)).astype(np.float32)
    pb = ProgramBuilder()
    sx, sb = pb.input(x.shape), pb.input(b.shape)
    o1, o2 = pb.output((8,)), pb.output((13,))
    # o1[i] = sum_j x.T[j, i]: loop (13, 8) reading x with strides (1, 13)
    pb.loop((13, 8), [Access(sx, (1, 13))], [Output(Access(o1, (0, 1)), Load(0), "sum")])
    # o2[j] = sum_i (x[i, j] * b[j])
    pb.loop((8, 13), [pb.access(sx), pb.access(sb, (8, 13))],
            [Output(Access(o2, (0, 1)), call("mul", Load(0), Load(1), dtype="float32"),
                    "sum")])
    g1, g2 = run_program(compile_program(pb.build(), "red_strided"), [x, b])
    np.testing.assert_allclose(g1, x.T.sum(0), rtol=1e-5)
    np.testing.assert_allclose(g2, (x * b).sum(0), rtol=1e-5, atol=1e-6)


def test_threaded_kernels_match_single_threaded():
    """Big kernels split their outer loop across threads; results equal one thread's."""
    r = np.random.default_rng(4)
    x = r.standard_normal((64, 64, 64)).astype(np.float32)
    big = (r.standard_normal(1 << 18) * 1e5).astype(np.float32)  # some |x| > 71476: sin's
    pb = ProgramBuilder()                                          # general path runs too
    sx, sb = pb.input(x.shape), pb.input(big.shape)
    o1, o2, o3 = pb.output((64, 64)), pb.output((64, 64)), pb.output(big.shape)
    pb.loop(x.shape, [pb.access(sx)], [Output(Access(o1, (64, 0, 1)), Load(0), "sum")])
    pb.loop(x.shape, [pb.access(sx)], [Output(Access(o2, (64, 1, 0)), Load(0), "max")])
    pb.loop(big.shape, [pb.access(sb)], [Output(pb.access(o3), call("sin", Load(0),
                                                                     dtype="float32"))])
    compiled = compile_program(pb.build(), "threaded")
    assert compiled._nthreads is not None
    results = []
    for n in (1, 3):
        compiled.set_threads(n)
        assert compiled.threads == n
        results.append(run_program(compiled, [x, big]))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(results[0][0], x.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(results[0][1], x.max(axis=2))
    np.testing.assert_allclose(results[0][2], np.sin(big), rtol=1e-6, atol=1e-6)
