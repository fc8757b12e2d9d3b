"""LLVM extern kernels vs the registry's eager impls: matmul (BLAS and loops), conv2d and its
gradients (im2col + GEMM), pooling and its gradient, take/take_grad/pick, argmax/argmin."""
import functools

import numpy as np
import pytest

from compiler.codegen import ProgramBuilder, interpret
from compiler.codegen.llvm import compile_program, run_program
from compiler.codegen.testing import CaseProgram
from compiler.ops import eager_apply

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def rnd(shape, dtype="float32", seed=0):
    r = np.random.default_rng(seed)
    if dtype.startswith("float"):
        return r.standard_normal(shape).astype(dtype)
    return r.integers(-5, 6, shape).astype(dtype)


def check(results, rtol=2e-5, atol=1e-5):
    for c, got, want in results:
        got = got if isinstance(got, list) else [got]
        want = want if isinstance(want, (list, tuple)) else [want]
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (c, g.shape, w.shape, g.dtype,
                                                                 w.dtype)
            if g.dtype.kind in "biu":
                np.testing.assert_array_equal(g, w, err_msg=str(c))
            else:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=str(c),
                                           equal_nan=True)


# ------------------------------------------------------------------------ matmul
MATMULS = [((5, 7), (7, 3), {}), ((1, 512), (512, 256), {}), ((9, 4), (4, 1), {}),
           ((1, 6), (6, 1), {}), ((3, 0), (0, 4), {}), ((4, 5, 6), (4, 6, 7), {}),
           ((3, 1, 5, 6), (2, 6, 7), {}), ((5, 6), (3, 6, 2), {}),
           ((7, 5), (7, 3), {"transpose_a": True}), ((5, 7), (3, 7), {"transpose_b": True}),
           ((2, 7, 5), (2, 3, 7), {"transpose_a": True, "transpose_b": True}),
           ((1, 64), (10, 64), {"transpose_b": True}), ((64, 1), (64, 3), {"transpose_a": True}),
           ((33, 65), (65, 17), {})]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8"])
def test_matmul(dtype):
    cases = CaseProgram()
    for k, (sa, sb, attrs) in enumerate(MATMULS):
        if dtype in ("int32", "int8") and (sa[-1] > 100 or sa[0] > 100):
            continue
        cases.extern("matmul", [rnd(sa, dtype, k), rnd(sb, dtype, k + 50)], **attrs)
    check(cases.run(), rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-4)


def test_matmul_mixed_dtypes_and_interp():
    cases = CaseProgram()
    cases.extern("matmul", [rnd((4, 5), "int32"), rnd((5, 3), "float32", 1)])  # -> float64
    cases.extern("matmul", [rnd((4, 5), "float32"), rnd((5, 3), "float64", 1)])
    check(cases.run(), rtol=1e-6)
    check(cases.run("interp"), rtol=1e-6)


# ------------------------------------------------------------------ convolution
CONVS = [  # (x shape, w shape, attrs)
    ((8, 1, 28, 28), (6, 1, 5, 5), dict(pad=2)),           # LeNet conv1
    ((8, 6, 14, 14), (16, 6, 5, 5), {}),                   # LeNet conv2
    ((2, 8, 9, 9), (8, 8, 3, 3), dict(pad=1)),             # ResNet 3x3
    ((2, 8, 9, 9), (16, 8, 3, 3), dict(pad=1, stride=2)),  # ResNet downsample
    ((2, 8, 7, 7), (12, 8, 1, 1), {}),                     # 1x1 (no im2col)
    ((2, 4, 9, 8), (6, 2, 3, 2), dict(pad=(1, 0), stride=(2, 1), dilation=(2, 1), groups=2)),
    ((1, 3, 5, 5), (2, 3, 5, 5), {}),                      # one output pixel
    ((2, 2, 11, 10), (4, 2, 3, 3), dict(pad=1, stride=2, dilation=(1, 2))),  # direct loops
    ((2, 3, 6, 6), (5, 3, 3, 3), {}),                      # direct loops, no padding
]


def conv_cases(convs, dtype="float32"):
    """Forward and both gradients of each convolution, as one program."""
    cases = CaseProgram()
    for k, (xs, ws, attrs) in enumerate(convs):
        x, w = rnd(xs, dtype, seed=k), rnd(ws, dtype, seed=k + 9)
        (y,) = eager_apply(np, "conv2d", [x, w], attrs)
        g = rnd(y.shape, dtype, seed=k + 21)
        cases.extern("conv2d", [x, w], label=f"fwd{k}", **attrs)
        cases.extern("conv2d_grad_data", [g, w], label=f"gdata{k}", data_shape=xs, **attrs)
        cases.extern("conv2d_grad_weight", [x, g], label=f"gweight{k}", weight_shape=ws,
                     **attrs)
    return cases


@functools.lru_cache(maxsize=None)
def conv_results():
    return conv_cases(CONVS).run()


@pytest.mark.parametrize("op", ["conv2d", "conv2d_grad_data", "conv2d_grad_weight"])
def test_conv(op):
    check([r for r in conv_results() if r[0].op == op], rtol=1e-4, atol=1e-4)


def test_conv_lenet_full_batch_matches_eager():
    """The book's LeNet first layer at batch 256, float32, with scratch in the arena."""
    x, w = rnd((256, 1, 28, 28), seed=1), rnd((6, 1, 5, 5), seed=2)
    cases = CaseProgram()
    cases.extern("conv2d", [x, w], pad=2)
    check(cases.run(), rtol=1e-4, atol=1e-4)


def test_conv_float64():
    cases = CaseProgram()
    x, w = rnd((2, 3, 8, 8), "float64"), rnd((4, 3, 3, 3), "float64", 1)
    (y,) = eager_apply(np, "conv2d", [x, w], {"pad": 1})
    cases.extern("conv2d", [x, w], pad=1)
    cases.extern("conv2d_grad_data", [y, w], pad=1, data_shape=x.shape)
    cases.extern("conv2d_grad_weight", [x, y], pad=1, weight_shape=w.shape)
    check(cases.run(), rtol=1e-11, atol=1e-11)


# ------------------------------------------------------------- split across workers
@pytest.fixture
def split(monkeypatch):
    """Every extern splits into 3 workers however small it is: uneven shares, a worker per
    image or plane, per-worker scratch and partial sums."""
    from compiler.codegen import extern_plan
    monkeypatch.setattr(extern_plan, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(extern_plan, "max_workers", lambda: 3)


SPLIT_CONVS = CONVS + [
    ((1, 1, 28, 28), (6, 1, 5, 5), dict(pad=2)),                           # one image
    ((7, 2, 13, 11), (11, 2, 3, 3), dict(pad=(1, 2), dilation=(2, 1))),   # direct, 8 + 3 filters
    ((5, 3, 7, 6), (4, 3, 3, 2), {}),                                      # direct, no padding
    ((5, 3, 11, 7), (5, 3, 3, 2), dict(stride=2, pad=1)),                  # im2col, 5 over 3
    ((4, 4, 9, 8), (6, 2, 3, 2), dict(pad=(1, 0), dilation=(2, 1), groups=2)),
    ((3, 8, 5, 5), (4, 8, 1, 1), {}),                                      # 1x1
    ((11, 3, 8, 8), (4, 3, 3, 3), dict(pad=1)),                            # 3, 4, 4 images
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv_split_across_workers(split, dtype):
    tol = 1e-4 if dtype == "float32" else 1e-11
    check(conv_cases(SPLIT_CONVS, dtype).run(), rtol=tol, atol=tol)


def test_split_results_do_not_depend_on_threads(split):
    """Workers fix every sum's order: 1 or 3 threads give the same bits."""
    cases = conv_cases(SPLIT_CONVS[-5:-1])
    cases.extern("matmul", [rnd((100, 37)), rnd((37, 40), seed=1)])
    cases.extern("pool2d", [rnd((3, 4, 8, 8))], pool_type="avg", kernel=2, stride=2)
    compiled = compile_program(cases.program(), "split_threads")
    runs = []
    for n in (1, 3, 2):
        compiled.set_threads(n)
        runs.append(run_program(compiled, cases.inputs))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_direct_conv_grad_weight_ignores_garbage_columns(split):
    """The direct gradient reads wrapped-around neighbours in its garbage columns: an inf
    there must not turn 0 * inf into NaN where the eager impl has finite sums."""
    x, w = rnd((3, 2, 9, 10), seed=1), rnd((5, 2, 3, 3), seed=2)
    x[1, 0, 4, 0] = np.inf  # column 0: only taps kw = 0 reach it
    x[2, 1, 6, 9] = -np.inf  # last column: only kw = 2
    (y,) = eager_apply(np, "conv2d", [x, w], {})
    cases = CaseProgram()
    cases.extern("conv2d_grad_weight", [x, rnd(y.shape, seed=3)], weight_shape=w.shape)
    (res,) = cases.run()
    assert np.isfinite(res[2][..., 1]).all()
    check([res], rtol=1e-4, atol=1e-4)


SPLIT_MATMULS = MATMULS + [((100, 7), (7, 5), {}),                      # rows over 3
                           ((3, 7), (7, 130), {}),                      # columns over 3
                           ((1, 9), (9, 70), {}),                       # gemv, columns
                           ((70, 9), (9, 1), {}),                       # gemv, rows
                           ((9, 100), (5, 9), {"transpose_a": True, "transpose_b": True}),
                           ((7, 40, 6), (6, 3), {})]                    # 7 batches over 3


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_matmul_split_across_workers(split, dtype):
    cases = CaseProgram()
    for k, (sa, sb, attrs) in enumerate(SPLIT_MATMULS):
        cases.extern("matmul", [rnd(sa, dtype, k), rnd(sb, dtype, k + 50)], **attrs)
    check(cases.run(), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------- pooling
POOLS = [((8, 6, 28, 28), dict(pool_type="avg", kernel=2, stride=2)),   # LeNet
         ((8, 6, 28, 28), dict(pool_type="max", kernel=2, stride=2)),
         ((2, 3, 9, 9), dict(pool_type="max", kernel=3, stride=2, pad=1)),   # ResNet stem
         ((2, 3, 9, 9), dict(pool_type="avg", kernel=3, stride=2, pad=1)),
         ((2, 3, 9, 9), dict(pool_type="avg", kernel=3, stride=2, pad=1,
                             count_include_pad=False)),
         ((2, 3, 7, 5), dict(pool_type="avg", global_pool=True)),
         ((2, 3, 7, 5), dict(pool_type="max", global_pool=True)),
         ((1, 2, 6, 6), dict(pool_type="max", kernel=3, stride=1)),
         ((3, 2, 7, 9), dict(pool_type="avg", kernel=2, stride=2)),   # an uncovered edge
         ((3, 2, 7, 9), dict(pool_type="max", kernel=2, stride=3)),   # gaps between windows
         ((2, 3, 9, 8), dict(pool_type="avg", kernel=3, stride=2))]   # overlapping windows


@pytest.mark.parametrize("backend", ["llvm", "interp", "split"])
def test_pool(backend, request):
    if backend == "split":
        request.getfixturevalue("split")
    cases = CaseProgram()
    for k, (xs, attrs) in enumerate(POOLS):
        x = rnd(xs, seed=k)
        if k == 1:
            x[0, 0, :2, :2] = 1.0  # ties: the first maximum takes the gradient
        (y,) = eager_apply(np, "pool2d", [x], attrs)
        g = rnd(y.shape, seed=k + 3)
        cases.extern("pool2d", [x], **attrs)
        cases.extern("pool2d_grad", [g, x, y], **attrs)
    check(cases.run("interp" if backend == "interp" else "llvm"), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- gather / scatter
def test_take_take_grad_pick():
    cases = CaseProgram()
    emb = rnd((10, 7), seed=1)
    idx = np.array([[0, 3, 9], [12, -2, 3]], np.int64)  # out of range: clipped
    cases.extern("take", [emb, idx], axis=0)
    cases.extern("take", [emb, idx.astype(np.int32)], axis=0, mode="wrap")
    cases.extern("take", [rnd((3, 5, 4), seed=2), np.array([4, 0, 0, 2], np.int32)], axis=1)
    cases.extern("take", [rnd((3, 5, 4), seed=3), np.array(2, np.int64)], axis=2)
    g = rnd((2, 3, 7), seed=4)
    cases.extern("take_grad", [g, idx], axis=0, dim=10)
    cases.extern("take_grad", [g, idx], axis=0, dim=10, mode="wrap")
    cases.extern("take_grad", [rnd((3, 4, 4), seed=5), np.array([4, 0, 0, 2], np.int32)],
                 axis=1, dim=5)
    x = rnd((6, 10), seed=6)
    lab = np.array([0, 9, 3, 3, 11, -1], np.int64)
    cases.extern("pick", [x, lab], axis=-1)
    cases.extern("pick", [x, lab.reshape(6, 1)], axis=1, keepdims=True)
    cases.extern("pick", [x, np.array([5, 0, 2, 1, 1, 0, 3, 4, 5, 2], np.int32)], axis=0)
    check(cases.run(), rtol=1e-6)
    check(cases.run("interp"), rtol=1e-6)


def test_argmax_argmin():
    cases = CaseProgram()
    x = rnd((5, 9), seed=1)
    x[2, 4] = np.nan
    x[3, :] = 1.0  # ties: the first index
    for op in ("argmax", "argmin"):
        for axis, keep in ((None, False), (0, False), (1, True), (-1, False)):
            cases.extern(op, [x], axis=axis, keepdims=keep)
        cases.extern(op, [rnd((4, 6), "int32", 2)], axis=1)
    check(cases.run())


def test_extern_and_loop_in_one_program_dense_relu():
    """y = relu(x @ W.T + b): BLAS extern (transpose_b) + a fused epilogue loop."""
    from compiler.codegen import Load, Output, call
    x, w, b = rnd((64, 512)), rnd((256, 512), seed=1), rnd((256,), seed=2)
    pb = ProgramBuilder()
    sx, sw, sb = pb.input(x.shape), pb.param(w.shape), pb.param(b.shape)
    t, y = pb.temp((64, 256)), pb.output((64, 256))
    pb.extern("matmul", [sx, sw], [t], transpose_b=True)
    add = call("add", Load(0), Load(1), dtype="float32")
    pb.loop((64, 256), [pb.access(t), pb.access(sb, (64, 256))],
            [Output(pb.access(y), call("relu", add, dtype="float32"))])
    prog = pb.build()
    compiled = compile_program(prog, "dense_relu")
    (got,) = run_program(compiled, [x], [w, b])
    np.testing.assert_allclose(got, np.maximum(x @ w.T + b, 0), rtol=1e-4, atol=1e-4)
    (ref,) = interpret(prog, [x], [w, b])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    runner = compiled.runner([w, b])
    for _ in range(3):
        (again,) = runner(x)
        np.testing.assert_array_equal(again, got)
        assert again.ctypes.data % 64 == 0
