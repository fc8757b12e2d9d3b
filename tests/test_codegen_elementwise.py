"""LLVM codegen of elementwise kernels vs the registry's eager impls (and the interpreter).

Every elementwise registry op, for float32/float64 and the integer/bool dtypes it allows, on
odd shapes (0-d, 1, primes, 0-size, broadcasts) with NaN/inf/-0/subnormal values. Many cases
share one compiled Program (compiling is the slow part on this machine).
"""
import functools

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

from compiler.codegen import (Access, Const, Index, Load, LoopKernel, Output,
                              ProgramBuilder, call, interpret)
from compiler.codegen.llvm import compile_program, run_program
from compiler.codegen.testing import CaseProgram
from compiler.ops import REGISTRY, eager_apply
from compiler.ops.core import DTYPE_CLASSES

FLOATS = ("float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 88.5, -88.5, 100.0, -100.0,
           1e30, -1e30, 0.5, 1.5, 2.5, -0.5, -2.5, 1.0, -1.0, 3.0, -7.25]
# float32 tolerance by op (vs NumPy's own float32 loops; both sides round differently):
# exp/log ~1 ulp, tanh/erf ~1.5 ulp here and up to ~2 ulp in NumPy -> 2e-6 covers both.
# log1p/expm1 call libm here; NumPy takes its own SIMD loops where the CPU has AVX-512
# (1 ulp apart on an Intel Xeon, bit-equal on AMD EPYC): ~1 ulp, not exact.
RTOL32 = {"exp": 1e-6, "log": 1e-6, "tanh": 2e-6, "erf": 2e-6, "sigmoid": 2e-6,
          "sin": 1e-6, "cos": 1e-6, "pow": 2e-6, "log1p": 1e-6, "expm1": 1e-6}
EXACT = {"neg", "abs", "sign", "sqrt", "rsqrt", "square", "floor", "ceil", "round", "relu",
         "logical_not", "copy", "stop_gradient", "add", "sub", "mul", "div", "maximum",
         "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
         "logical_xor", "where", "clip", "cast", "floordiv", "mod"}


def rng(seed=0):
    return np.random.default_rng(seed)


def data(dtype, shape, seed=0, positive=False):
    r = rng(seed)
    n = int(np.prod(shape))
    if dtype in FLOATS or dtype == "float16":
        v = r.standard_normal(n) * 4
        sp = np.array(SPECIAL)
        k = min(n, len(sp))
        v[:k] = sp[r.permutation(len(sp))[:k]]
        if positive:
            v = np.abs(v) + 0.5
        return v.astype(dtype).reshape(shape)
    if dtype == "bool":
        return (r.random(n) < 0.5).reshape(shape)
    lo, hi = (0, 200) if dtype == "uint8" else (-60, 60)
    if positive:
        lo = 1
    return r.integers(lo, hi, n).astype(dtype).reshape(shape)


def close(op, got, want, dtype):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if op in EXACT or want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=op)
        return
    if want.dtype == np.float64:
        rtol = 1e-12
    else:
        rtol = RTOL32.get(op, 1e-6)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6 if dtype != "float64" else 1e-12,
                               equal_nan=True, err_msg=op)


def unary_ops():
    return [n for n, op in REGISTRY.items() if op.kind == "elementwise"
            and not op.attrs and _arity(n) == 1]  # ops with attributes have their own tests


def binary_ops():
    return [n for n, op in REGISTRY.items() if op.kind == "elementwise" and _arity(n) == 2]


def _arity(name):
    from compiler.codegen.kernel import scalar_arity
    return scalar_arity(name)


def allowed(op, dtype):
    cls = REGISTRY[op].dtypes
    if cls == "float":  # transcendentals accept integer inputs (computed in float32)
        return dtype in FLOATS or dtype in ("int32", "uint8")
    return dtype in DTYPE_CLASSES[cls]


# ------------------------------------------------------------------ unary ops
@functools.lru_cache(maxsize=None)
def unary_results():
    cases = CaseProgram()
    for dtype in FLOATS + INTS + ("bool",):
        for op in unary_ops():
            if allowed(op, dtype):
                cases.elementwise(op, [data(dtype, (29,), seed=len(op))])
    return {(c.op, c.args[0].dtype.name): (got, want) for c, got, want in cases.run()}


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in unary_ops()
                                      for dt in FLOATS + INTS + ("bool",) if allowed(op, dt)])
def test_unary_op(op, dtype):
    got, want = unary_results()[(op, dtype)]
    close(op, got, want, dtype)


# ----------------------------------------------------------------- binary ops
BINARY_SHAPES = [((7, 1), (1, 5)), ((13,), ()), ((), (2, 3)), ((1,), (1,))]


@functools.lru_cache(maxsize=None)
def binary_results():
    cases = CaseProgram()
    for dtype in FLOATS + INTS + ("bool",):
        for op in binary_ops():
            if not allowed(op, dtype):
                continue
            for k, (sa, sb) in enumerate(BINARY_SHAPES):
                a = data(dtype, sa, seed=k)
                b = data(dtype, sb, seed=k + 7, positive=(op == "pow" and dtype in INTS))
                if op == "pow" and dtype in INTS:
                    b = (b % 4).astype(dtype)
                cases.elementwise(op, [a, b], label=f"{op}-{dtype}-{k}")
            if dtype != "bool":  # a weak Python scalar on either side
                s = 3 if dtype in INTS else 2.5
                if op == "pow" and dtype in INTS:
                    s = 2
                cases.elementwise(op, [data(dtype, (11,), seed=3), s],
                                  label=f"{op}-{dtype}-rs")
                cases.elementwise(op, [s, data(dtype, (11,), seed=4, positive=True)],
                                  label=f"{op}-{dtype}-ls")
    return [(c.label, got, want) for c, got, want in cases.run()]


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in binary_ops()
                                      for dt in FLOATS + INTS + ("bool",) if allowed(op, dt)])
def test_binary_op(op, dtype):
    found = [r for r in binary_results() if r[0].startswith(f"{op}-{dtype}-")]
    assert found
    for label, got, want in found:
        close(op, got, want, dtype)


def test_mixed_dtype_promotion():
    cases = CaseProgram()
    i32 = data("int32", (9,))
    f32 = data("float32", (9,), seed=1)
    f64 = data("float64", (9,), seed=2)
    u8 = data("uint8", (9,), seed=3)
    cases.elementwise("add", [i32, f32])     # float64 (NumPy promotion)
    cases.elementwise("mul", [f32, f64])
    cases.elementwise("add", [u8, i32])      # int32
    cases.elementwise("div", [i32, data("int32", (9,), seed=5, positive=True)])  # float32
    cases.elementwise("mul", [i32, 2.5])     # int array * float scalar -> float32
    cases.elementwise("exp", [data("int32", (9,), seed=6) % 20])
    cases.elementwise("where", [data("bool", (3, 1)), f32.reshape(1, 9), -1.0])
    cases.elementwise("where", [data("bool", (9,)), i32, f64])
    for c, got, want in cases.run():
        assert got.dtype == want.dtype, c
        np.testing.assert_allclose(got, want, rtol=2e-7, equal_nan=True, err_msg=str(c))


def test_cast_matrix():
    cases = CaseProgram()
    src = {"float32": np.array([0.0, -0.0, 1.5, -2.5, 7.9, -7.9, 100.25, 1e-3], np.float32),
           "float64": np.array([0.0, 1.5, -2.5, 126.9, -127.9, 3.25, 1e-300, 2.0]),
           "int8": np.array([0, 1, -1, 127, -128, 5, 7, -9], np.int8),
           "uint8": np.array([0, 1, 255, 128, 5, 7, 9, 200], np.uint8),
           "int32": np.array([0, 1, -1, 100, -100, 2 ** 24 + 1, 7, 9], np.int32),
           "int64": np.array([0, 1, -1, 100, -100, 2 ** 40, 7, 9], np.int64),
           "bool": np.array([0, 1, 1, 0, 1, 0, 0, 1], bool)}
    for s, x in src.items():
        for d in FLOATS + INTS + ("bool", "float16"):
            if s in FLOATS and d in ("uint8", "int8"):
                x2 = np.clip(x, 0 if d == "uint8" else -128, 127)
            else:
                x2 = x
            cases.elementwise("cast", [x2], dtype=d)
    for c, got, want in cases.run():
        np.testing.assert_array_equal(got, want, err_msg=str(c))


def test_clip_and_source_ops():
    cases = CaseProgram()
    cases.elementwise("clip", [data("float32", (17,))], a_min=-1.0, a_max=2.0)
    cases.elementwise("clip", [data("int32", (17,))], a_min=-5)
    cases.elementwise("clip", [data("float64", (3, 5))], a_max=0.25)
    for c, got, want in cases.run():
        np.testing.assert_array_equal(got, want)
    pb = ProgramBuilder()
    specs = [("arange", dict(start=3, stop=40, step=2, dtype="float32"), (19,)),
             ("arange", dict(start=-1.5, stop=2.0, step=0.25, dtype="float64"), (14,)),
             ("arange", dict(start=5, stop=-6, step=-3, dtype="int32"), (4,)),
             ("full", dict(shape=(3, 4), value=2.5, dtype="float32"), (3, 4)),
             ("full", dict(shape=(5,), value=7, dtype="int8"), (5,))]
    outs = []
    for op, attrs, shape in specs:
        o = pb.output(shape, attrs["dtype"])
        outs.append(o)
        pb.loop(shape, [], [Output(pb.access(o), call(op, dtype=attrs["dtype"], attrs=attrs))])
    prog = pb.build()
    got = run_program(compile_program(prog, "sources"), [])
    for (op, attrs, shape), g in zip(specs, got):
        (want,) = eager_apply(np, op, [], attrs)
        np.testing.assert_array_equal(g, want)


# ---------------------------------------------------------------- loop shapes
@pytest.mark.parametrize("shape", [(), (1,), (2,), (7,), (17,), (31,), (33,), (1, 1, 1),
                                   (0,), (3, 0, 4), (5, 1, 3), (2, 3, 5, 7)])
def test_odd_shapes(shape):
    cases = CaseProgram()
    x = data("float32", shape)
    y = data("float32", shape, seed=1)
    cases.elementwise("exp", [x])
    cases.elementwise("mul", [x, y])
    cases.elementwise("tanh", [data("float64", shape)])
    cases.elementwise("add", [data("int8", shape), data("int8", shape, seed=2)])
    for c, got, want in cases.run():
        close(c.op, got, want, c.args[0].dtype.name)


def test_nan_inf_propagation():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, np.nan], np.float32)
    y = np.array([1.0, np.nan, np.inf, np.inf, -np.inf, np.nan, 0.0, np.nan], np.float32)
    cases = CaseProgram()
    for op in ("maximum", "minimum", "add", "mul", "div", "pow", "floordiv", "mod", "eq",
               "ne", "lt", "ge"):
        cases.elementwise(op, [x, y])
    for op in ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "sqrt", "sign", "round",
               "relu", "abs", "log1p", "expm1"):
        cases.elementwise(op, [x])
    for c, got, want in cases.run():
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str(c))
        finite = ~np.isnan(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, err_msg=str(c))


def test_fused_chain_is_one_kernel():
    """tanh(x*a+b)*sigmoid(x)+1 with a broadcast row and column: ONE LoopKernel."""
    x = data("float32", (33, 7))
    a = data("float32", (7,), seed=1)
    b = data("float32", (33, 1), seed=2)
    pb = ProgramBuilder()
    sx, sa, sb = pb.input(x.shape), pb.param(a.shape), pb.param(b.shape)
    sy = pb.output(x.shape)
    f = lambda op, *xs: call(op, *xs, dtype="float32")  # noqa: E731
    expr = f("add", f("mul", f("tanh", f("add", f("mul", Load(0), Load(1)), Load(2))),
                      f("sigmoid", Load(0))), Const(1.0, None))
    pb.loop(x.shape, [pb.access(sx, x.shape), pb.access(sa, x.shape), pb.access(sb, x.shape)],
            [Output(pb.access(sy), expr)])
    prog = pb.build()
    assert len(prog.steps) == 1 and isinstance(prog.steps[0], LoopKernel)
    (got,) = run_program(compile_program(prog, "chain"), [x], [a, b])
    want = np.tanh(x * a + b) * eager_apply(np, "sigmoid", [x], {})[0] + 1
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    (ref,) = interpret(prog, [x], [a, b])
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6)


def test_strided_accesses():
    """Transposes, slices with negative steps, reshapes and writes into a region."""
    x = data("float32", (6, 10))
    pb = ProgramBuilder()
    sx = pb.input(x.shape)
    t = pb.output((10, 6))       # transpose
    s = pb.output((3, 4))        # x[5:0:-2, 1:9:2]
    r = pb.output((4, 15))       # reshape of the contiguous buffer
    cat = pb.output((6, 13))     # concatenate([x, x[:, :3] * 2], axis=1)
    e = call("exp", Load(0), dtype="float32")
    pb.loop((10, 6), [Access(sx, (1, 10))], [Output(pb.access(t), e)])
    pb.loop((3, 4), [Access(sx, (-20, 2), 51)], [Output(pb.access(s), Load(0))])
    pb.loop((4, 15), [Access(sx, (15, 1))], [Output(pb.access(r), call("neg", Load(0),
                                                                         dtype="float32"))])
    pb.loop((6, 10), [pb.access(sx)], [Output(Access(cat, (13, 1)), Load(0))])
    pb.loop((6, 3), [Access(sx, (10, 1))],
            [Output(Access(cat, (13, 1), 10), call("mul", Load(0), Const(2.0, None),
                                                  dtype="float32"))])
    prog = pb.build()
    got = run_program(compile_program(prog, "strided"), [x])
    want = [np.exp(x.T), x[5:0:-2, 1:9:2], -x.reshape(4, 15),
            np.concatenate([x, x[:, :3] * 2], axis=1)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    for g, w in zip(interpret(prog, [x]), want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("shape, axes", [
    ((256, 1024), (1, 0)),      # a weight's transpose, split across threads
    ((37, 53), (1, 0)),         # tails along both axes
    ((16, 16), (1, 0)),         # one block
    ((15, 40), (1, 0)),         # fewer rows than a block: element by element
    ((3, 40, 70), (0, 2, 1)),   # an outer level around the blocks
    ((40, 3, 70), (2, 1, 0)),   # the contiguous level not next to the innermost
    ((256, 32, 32), (1, 0, 2)),  # moving whole rows: no transpose in registers
])
def test_transposing_copies_match_numpy(shape, axes):
    """A copy that loads along one level and stores along another runs in blocks
    transposed in registers (emit.LoopEmitter._transpose_plan): every element lands where
    NumPy puts it, for NaN, -0.0 and subnormal payloads too, with and without tails."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[:4] = [np.nan, -0.0, 1e-40, np.inf]
    want = np.ascontiguousarray(np.transpose(x, axes))
    pb = ProgramBuilder()
    sx = pb.input(shape)
    so = pb.output(want.shape)
    in_strides = [s // 4 for s in x.strides]
    pb.loop(want.shape, [Access(sx, tuple(in_strides[a] for a in axes))],
            [Output(pb.access(so), Load(0))])
    prog = pb.build()
    (got,) = run_program(compile_program(prog, f"transpose_{shape}_{axes}"), [x])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    from compiler.codegen.extern_plan import vector_lanes
    from compiler.codegen.llvm.emit import emit_ir
    lanes = vector_lanes("float32")  # blocks: both levels at least this long
    blocks = axes[-1] != len(shape) - 1 and min(shape[axes[-1]], shape[-1]) >= lanes
    assert ("shufflevector" in emit_ir(prog, "t")) == blocks, (shape, axes)


def test_in_place_and_arena_reuse():
    """Two arena slots at one offset (the planner's reuse): y = relu(exp(x)) in place."""
    x = data("float32", (100,))
    pb = ProgramBuilder()
    sx = pb.input((100,))
    t1 = pb.temp((100,), offset=0)
    t2 = pb.temp((100,), offset=0)
    sy = pb.output((100,))
    pb.loop((100,), [pb.access(sx)], [Output(pb.access(t1), call("exp", Load(0),
                                                                  dtype="float32"))])
    pb.loop((100,), [pb.access(t1)], [Output(pb.access(t2), call("neg", Load(0),
                                                                  dtype="float32"))])
    pb.loop((100,), [pb.access(t2), pb.access(sx)],
            [Output(pb.access(sy), call("add", Load(0), Load(1), dtype="float32"))])
    prog = pb.build()
    (got,) = run_program(compile_program(prog, "inplace"), [x])
    np.testing.assert_allclose(got, x - np.exp(x), rtol=1e-6, atol=1e-6, equal_nan=True)


def test_index_nodes():
    pb = ProgramBuilder()
    o1 = pb.output((4, 5), "int64")
    o2 = pb.output((4, 5), "int64")
    pb.loop((4, 5), [], [Output(pb.access(o1), Index(None)),
                         Output(pb.access(o2), call("add", call("mul", Index(0), Const(10, None),
                                                                dtype="int64"), Index(1),
                                                    dtype="int64"))])
    got = run_program(compile_program(pb.build(), "index"), [])
    np.testing.assert_array_equal(got[0], np.arange(20).reshape(4, 5))
    np.testing.assert_array_equal(got[1], np.add.outer(np.arange(4) * 10, np.arange(5)))


# ---------------------------------------------------------------------- random
RANDOM_CASES = [
    ("random_uniform", dict(shape=(1000,), low=-2.0, high=3.0, dtype="float32")),
    ("random_uniform", dict(shape=(7, 13), low=0.0, high=1.0, dtype="float64")),
    ("random_uniform", dict(shape=(37,), low=0.0, high=1.0, dtype="float16")),
    # rounding reaches `high` here (float16 in ~1 draw of 2000; float32 over a range of
    # 2^-10 at 1.0): clamped below it, as eagerly ([low, high), NumPy's Generator)
    ("random_uniform", dict(shape=(4096,), low=-3.0, high=5.0, dtype="float16")),
    ("random_uniform", dict(shape=(4096,), low=1.0, high=1.0 + 2.0 ** -10, dtype="float32")),
    ("random_normal", dict(shape=(4097,), loc=0.5, scale=2.0, dtype="float32")),
    ("random_normal", dict(shape=(3, 333), loc=0.0, scale=1.0, dtype="float64")),
    ("random_randint", dict(shape=(999,), low=-5, high=17, dtype="int64")),
    ("random_randint", dict(shape=(64,), low=0, high=200, dtype="uint8")),
    ("random_randint", dict(shape=(64,), low=-3, high=3, dtype="int32")),
]


@pytest.mark.parametrize("key_dtype,key", [("int64", 12345), ("int64", -7), ("int32", 99)])
def test_random_bit_exact(key_dtype, key):
    keyarr = np.array(key, dtype=key_dtype)
    pb = ProgramBuilder()
    sk = pb.input((), key_dtype)
    outs = []
    for op, attrs in RANDOM_CASES:
        shape = attrs["shape"]
        o = pb.output(shape, attrs["dtype"])
        outs.append(o)
        pb.loop(shape, [Access(sk, (0,) * len(shape))],
                [Output(pb.access(o), call(op, Load(0), dtype=attrs["dtype"], attrs=attrs))])
    prog = pb.build()
    got = run_program(compile_program(prog, "random"), [keyarr])
    ref = interpret(prog, [keyarr])
    for (op, attrs), g, r in zip(RANDOM_CASES, got, ref):
        (want,) = eager_apply(np, op, [keyarr], attrs)
        np.testing.assert_array_equal(r, want, err_msg=f"interp {op} {attrs}")
        # (float64 normals too: the transform is basic operations, no libm: bit for bit)
        np.testing.assert_array_equal(g, want, err_msg=f"{op} {attrs}")
        if op == "random_uniform":
            assert g.max() < attrs["high"] and g.min() >= attrs["low"], (op, attrs)


def test_random_fused_dropout_mask_and_explicit_index():
    """Dropout-like fusion: mask = uniform(key) < p, with the random element index given
    explicitly (the kernel walks the transposed output)."""
    key = np.array(2024, np.int64)
    x = data("float32", (6, 9))
    attrs = dict(shape=(9, 6), low=0.0, high=1.0, dtype="float32")
    pb = ProgramBuilder()
    sk, sx = pb.input((), "int64"), pb.input(x.shape)
    so = pb.output((9, 6))
    # loop over (i, j) of the (9, 6) output; element index of the random draw = i*6 + j
    idx = call("add", call("mul", Index(0), Const(6, None), dtype="int64"), Index(1),
               dtype="int64")
    u = call("random_uniform", Load(0), idx, dtype="float32", attrs=attrs)
    keep = call("lt", u, Const(0.7, None), dtype="bool")
    pb.loop((9, 6), [Access(sk, (0, 0)), Access(sx, (1, 9))],
            [Output(pb.access(so), call("where", keep, call("div", Load(1), Const(0.7, None),
                                                            dtype="float32"),
                                        Const(0.0, None), dtype="float32"))])
    (got,) = run_program(compile_program(pb.build(), "dropout"), [key, x])
    (u_ref,) = eager_apply(np, "random_uniform", [key], attrs)
    want = np.where(u_ref < 0.7, x.T / np.float32(0.7), 0).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_float16_elementwise():
    cases = CaseProgram()
    x = (rng().standard_normal(19) * 2).astype(np.float16)
    y = (rng(1).standard_normal(19) * 2).astype(np.float16)
    for op in ("add", "mul", "div", "maximum"):
        cases.elementwise(op, [x, y])
    for op in ("exp", "tanh", "sqrt", "neg"):
        cases.elementwise(op, [np.abs(x) if op == "sqrt" else x])
    for c, got, want in cases.run():
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=1e-3, atol=1e-3, err_msg=str(c))


def test_interpreter_agrees_on_all_unary_cases():
    cases = CaseProgram()
    for op in ("exp", "sigmoid", "floor", "erf"):
        cases.elementwise(op, [data("float32", (23,))])
    for (c, got, want), (_, ref, _) in zip(cases.run(), cases.run("interp")):
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6, equal_nan=True)
