"""The CUDA C target, proven on the CPU: generated sources run on the emulated GPU
(runtime/gpu/emu: the host compiler under cuda_emu.h) against the NumPy interpreter and the
registry's eager impls, and every source compiles with nvcc for sm_80 and sm_90.

Compiling is the slow part (the host compiler and nvcc each take a few seconds per source),
so each source carries many cases: a loop kernel computes every unary op of a dtype at
once, one source holds every binary op, one every matmul, and random graphs are lowered
and merged into one Program. Sources are built once (``source_case``) and shared by the
emulator tests and the compile test.
"""
import dataclasses
import functools
import math

import numpy as np
import pytest

from compiler.codegen import (Access, Const, Index, Load,
                              LoopKernel, Output, Program, ProgramBuilder, call, interpret)
from compiler.codegen.cuda import emit_cuda
from compiler.codegen.cuda.compile_check import available_compiler, check_compiles_all
from compiler.codegen.cuda.emulate import run_program_emulated
from compiler.codegen.kernel import scalar_arity
from compiler.ops import REGISTRY, eager_apply, infer_types
from compiler.ops.core import DTYPE_CLASSES
from test_codegen_elementwise import RANDOM_CASES
from test_codegen_extern import POOLS

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLOATS = ("float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 88.5, -88.5, 100.0, 1e30, -1e30, 0.5,
           1.5, 2.5, -0.5, -2.5, 1.0, -1.0, 3.0, -7.25]
EXACT = {"neg", "abs", "sign", "sqrt", "square", "floor", "ceil", "round", "relu",
         "logical_not", "copy", "device_copy", "stop_gradient", "add", "sub", "mul", "div",
         "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
         "logical_or", "logical_xor", "where", "clip", "cast", "floordiv", "mod"}

SOURCES = {}  # name -> a cached builder returning a Run (shared with the compile test)


def source_case(fn):
    cached = functools.lru_cache(maxsize=None)(fn)
    SOURCES[fn.__name__] = cached
    return cached


@dataclasses.dataclass
class Run:
    program: Program
    source: object
    outputs: list  # the emulator's, one per output slot
    reference: list  # the interpreter's
    checks: list  # (label, output slot, expected or None)

    def out(self, slot):
        return self.outputs[self.program.slots_of("output").index(slot)]

    def ref(self, slot):
        return self.reference[self.program.slots_of("output").index(slot)]


def run(pb_or_program, inputs, params=(), checks=()) -> Run:
    prog = pb_or_program.build() if isinstance(pb_or_program, ProgramBuilder) else pb_or_program
    src = emit_cuda(prog, "test")
    outs = run_program_emulated(prog, inputs, params, source=src)
    ref = interpret(prog, inputs, params)
    return Run(prog, src, outs, ref, list(checks))


def data(dtype, shape, seed=0, positive=False):
    r = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype in FLOATS or dtype == "float16":
        v = r.standard_normal(n) * 4
        k = min(n, len(SPECIAL))
        v[:k] = np.array(SPECIAL)[r.permutation(len(SPECIAL))[:k]]
        if positive:
            v = np.abs(v) + 0.5
        with np.errstate(all="ignore"):
            return v.astype(dtype).reshape(shape)
    if dtype == "bool":
        return (r.random(n) < 0.5).reshape(shape)
    lo, hi = (0, 200) if dtype == "uint8" else (-60, 60)
    return r.integers(1 if positive else lo, hi, n).astype(dtype).reshape(shape)


def close(label, got, want, rtol=None, exact=False, atol=None):
    assert got.shape == want.shape, (label, got.shape, want.shape)
    assert got.dtype == want.dtype, (label, got.dtype, want.dtype)
    if exact or want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=label)
        return
    if rtol is None:
        rtol = {np.float64: 1e-12, np.float32: 2e-6, np.float16: 1e-3}[want.dtype.type]
    if atol is None:
        atol = {np.float64: 1e-12, np.float32: 1e-6, np.float16: 1e-3}[want.dtype.type]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol, equal_nan=True, err_msg=label)


def check_run(r: Run, rtol=None, exact_ops=EXACT, vs_interp_rtol=None):
    """Every output equals the interpreter's; checked ones also the eager expectation."""
    for s in r.program.slots_of("output"):
        close(f"slot {s} vs interpreter", r.out(s), r.ref(s), rtol=vs_interp_rtol or rtol)
    for label, s, want in r.checks:
        if want is not None:
            op = label.split("-")[0]
            close(label, r.out(s), np.asarray(want), rtol=rtol, exact=op in exact_ops)


class Cases:
    """Many registry-op cases in one Program: shared inputs, one loop kernel per group."""

    def __init__(self):
        self.pb = ProgramBuilder()
        self.inputs = []
        self.checks = []

    def input(self, a):
        a = np.ascontiguousarray(a)
        s = self.pb.input(a.shape, a.dtype.name)
        self.inputs.append(a)
        return s

    def kernel(self, args, ops, label=""):
        """ONE loop kernel computing op(*args) for every (op, attrs) in ``ops``."""
        shape = np.broadcast_shapes(*[np.shape(a) for a in args if isinstance(a, np.ndarray)])
        loads, operands = [], []
        for a in args:
            if isinstance(a, np.ndarray):
                loads.append(self.pb.access(self.input(a), shape))
                operands.append(Load(len(loads) - 1))
            else:
                operands.append(Const(a, None))
        outs = []
        for op, attrs in ops:
            spec = infer_types(op, args, attrs)[0]
            with np.errstate(all="ignore"):
                (want,) = eager_apply(np, op, args, attrs)
            o = self.pb.output(shape, spec.dtype)
            outs.append(Output(self.pb.access(o), call(op, *operands, dtype=spec.dtype,
                                                       attrs=attrs)))
            self.checks.append((f"{op}-{label}", o, want))
        self.pb.loop(shape, loads, outs, name=label or ops[0][0])

    def run(self):
        return run(self.pb, self.inputs, checks=self.checks)


def arity(op):
    return scalar_arity(op)


def ops_of_arity(n):
    return [o for o, spec in REGISTRY.items() if spec.kind == "elementwise" and not spec.attrs
            and arity(o) == n]


def allowed(op, dtype):
    cls = REGISTRY[op].dtypes
    if cls == "float":  # transcendentals accept integers (computed in float32)
        return dtype in FLOATS + ("float16", "int32", "uint8")
    return dtype in DTYPE_CLASSES[cls]


# ------------------------------------------------------------------ elementwise ops
RTOL32 = {"exp": 2e-6, "log": 2e-6, "tanh": 4e-6, "erf": 4e-6, "sigmoid": 4e-6, "sin": 2e-6,
          "cos": 2e-6, "pow": 4e-6, "log1p": 2e-6, "expm1": 2e-6, "rsqrt": 2e-6}


@source_case
def unary_ops():
    cases = Cases()
    for dtype in FLOATS + INTS + ("bool", "float16"):
        ops = [(op, {}) for op in ops_of_arity(1) if allowed(op, dtype)]
        cases.kernel([data(dtype, (29,), seed=len(dtype))], ops, label=dtype)
    return cases.run()


def _op_rtol(label):
    return RTOL32.get(label.split("-")[0])


def check_per_op(r: Run):
    for s in r.program.slots_of("output"):
        close(f"slot {s} vs interpreter", r.out(s), r.ref(s), rtol=4e-6)
    for label, s, want in r.checks:
        op = label.split("-")[0]
        close(label, r.out(s), np.asarray(want), rtol=_op_rtol(label), exact=op in EXACT)


def test_every_unary_op_every_dtype():
    check_per_op(unary_ops())


BINARY_SHAPES = [((7, 1), (1, 5)), ((13,), ())]


@source_case
def binary_ops():
    cases = Cases()
    for dtype in FLOATS + INTS + ("bool", "float16"):
        ops = [(op, {}) for op in ops_of_arity(2) if allowed(op, dtype)
               and not (op == "pow" and dtype in INTS)]
        for k, (sa, sb) in enumerate(BINARY_SHAPES):
            cases.kernel([data(dtype, sa, seed=k), data(dtype, sb, seed=k + 7)], ops,
                         label=f"{dtype}-{k}")
        if dtype in INTS:  # integer powers: small non-negative exponents
            cases.kernel([data(dtype, (11,), seed=3), (data(dtype, (11,), seed=4) % 4)
                          .astype(dtype)], [("pow", {})], label=f"{dtype}-pow")
        if dtype != "bool":  # a weak Python scalar on either side
            s = 3 if dtype in INTS else 2.5
            scalar_ops = [o for o in ops if o[0] != "pow"]
            cases.kernel([data(dtype, (11,), seed=3), s], scalar_ops, label=f"{dtype}-rs")
            cases.kernel([s, data(dtype, (11,), seed=4, positive=True)], scalar_ops,
                         label=f"{dtype}-ls")
    cases.kernel([data("int32", (9,)), data("float32", (9,), 1)], [("add", {})], "promote")
    cases.kernel([data("uint8", (9,)), data("int32", (9,), 2)], [("mul", {})], "promote")
    cases.kernel([data("int32", (9,)), 2.5], [("mul", {})], "promote")
    cases.kernel([data("bool", (3, 1)), data("float32", (1, 9), 1), -1.0], [("where", {})],
                 "where")
    cases.kernel([data("bool", (9,)), data("int32", (9,)), data("float64", (9,), 2)],
                 [("where", {})], "where")
    return cases.run()


def test_every_binary_op_every_dtype_with_broadcasts_and_weak_scalars():
    check_per_op(binary_ops())


@source_case
def attribute_ops():
    cases = Cases()
    src = {"float32": np.array([0.0, -0.0, 1.5, -2.5, 7.9, -7.9, 100.25, 1e-3], np.float32),
           "float64": np.array([0.0, 1.5, -2.5, 126.9, -127.9, 3.25, 1e-300, 2.0]),
           "float16": np.array([0.0, 1.5, -2.5, 65504, -0.001, 3.25, 6e-8, 2.0], np.float16),
           "int8": np.array([0, 1, -1, 127, -128, 5, 7, -9], np.int8),
           "uint8": np.array([0, 1, 255, 128, 5, 7, 9, 200], np.uint8),
           "int32": np.array([0, 1, -1, 100, -100, 2 ** 24 + 1, 7, 9], np.int32),
           "int64": np.array([0, 1, -1, 100, -100, 2 ** 40, 7, 9], np.int64),
           "bool": np.array([0, 1, 1, 0, 1, 0, 0, 1], bool)}
    for s, x in src.items():
        ops = []
        for d in FLOATS + INTS + ("bool", "float16"):
            if s in FLOATS + ("float16",) and d in ("uint8", "int8"):
                continue  # out of range: C leaves it undefined, NumPy wraps
            ops.append(("cast", {"dtype": d}))
        cases.kernel([x], ops, label=f"from_{s}")
    for s in ("float32", "float64"):  # float -> 8-bit integers, values in range
        x = np.array([0.0, 1.5, -2.5, 7.9, -7.9, 100.25, 127.0, -128.0], s)
        cases.kernel([x], [("cast", {"dtype": "int8"})], f"{s}_to_int8")
        cases.kernel([np.abs(x)], [("cast", {"dtype": "uint8"})], f"{s}_to_uint8")
    # rounding to float16: halfway cases, subnormals, overflow, NaN
    h = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65519.0, 65520.0, 2 ** -25, 3 * 2 ** -26,
                  -2 ** -24, 1e-9, np.nan, -np.inf, 2049.0, 2051.0], np.float64)
    cases.kernel([h], [("cast", {"dtype": "float16"})], "f64_to_f16")
    cases.kernel([h.astype(np.float32)], [("cast", {"dtype": "float16"})], "f32_to_f16")
    cases.kernel([data("float32", (17,))], [("clip", {"a_min": -1.0, "a_max": 2.0})], "clip")
    cases.kernel([data("int32", (17,))], [("clip", {"a_min": -5})], "clip")
    cases.kernel([data("float64", (3, 5))], [("clip", {"a_max": 0.25})], "clip")
    h16 = (np.random.default_rng(1).standard_normal(19) * 2).astype(np.float16)
    cases.kernel([h16, h16[::-1].copy()], [(op, {}) for op in ("add", "mul", "div", "maximum")],
                 "f16")
    return cases.run()


def test_casts_clip_and_float16_rounding():
    r = attribute_ops()
    check_per_op(r)


# -------------------------------------------------------------- sources, random, index
SOURCE_OPS = [("arange", dict(start=3, stop=40, step=2, dtype="float32"), (19,)),
              ("arange", dict(start=-1.5, stop=2.0, step=0.25, dtype="float64"), (14,)),
              ("arange", dict(start=5, stop=-6, step=-3, dtype="int32"), (4,)),
              ("full", dict(shape=(3, 4), value=2.5, dtype="float32"), (3, 4)),
              ("full", dict(shape=(5,), value=7, dtype="int8"), (5,))]


@source_case
def sources_random_index():
    pb = ProgramBuilder()
    key = np.array(12345, np.int64)
    sk = pb.input((), "int64")
    checks = []
    for op, attrs in RANDOM_CASES:
        shape = attrs["shape"]
        o = pb.output(shape, attrs["dtype"])
        pb.loop(shape, [Access(sk, (0,) * len(shape))],
                [Output(pb.access(o), call(op, Load(0), dtype=attrs["dtype"], attrs=attrs))])
        checks.append((op, o, eager_apply(np, op, [key], attrs)[0]))
    for op, attrs, shape in SOURCE_OPS:
        o = pb.output(shape, attrs["dtype"])
        pb.loop(shape, [], [Output(pb.access(o), call(op, dtype=attrs["dtype"], attrs=attrs))])
        checks.append((op, o, eager_apply(np, op, [], attrs)[0]))
    o1, o2 = pb.output((4, 5), "int64"), pb.output((4, 5), "int64")
    pb.loop((4, 5), [], [Output(pb.access(o1), Index(None)),
                         Output(pb.access(o2), call("add", call("mul", Index(0), Const(10, None),
                                                                dtype="int64"), Index(1),
                                                    dtype="int64"))])
    checks += [("index", o1, np.arange(20).reshape(4, 5)),
               ("index", o2, np.add.outer(np.arange(4) * 10, np.arange(5)))]
    # dropout-like: a random draw indexed through a transposed walk
    x = data("float32", (6, 9))
    sx = pb.input(x.shape)
    attrs = dict(shape=(9, 6), low=0.0, high=1.0, dtype="float32")
    so = pb.output((9, 6))
    idx = call("add", call("mul", Index(0), Const(6, None), dtype="int64"), Index(1),
               dtype="int64")
    u = call("random_uniform", Load(0), idx, dtype="float32", attrs=attrs)
    keep = call("lt", u, Const(0.7, None), dtype="bool")
    pb.loop((9, 6), [Access(sk, (0, 0)), Access(sx, (1, 9))],
            [Output(pb.access(so), call("where", keep, call("div", Load(1), Const(0.7, None),
                                                            dtype="float32"),
                                        Const(0.0, None), dtype="float32"))])
    (u_ref,) = eager_apply(np, "random_uniform", [key], attrs)
    checks.append(("dropout", so, np.where(u_ref < 0.7, x.T / np.float32(0.7), 0)
                   .astype(np.float32)))
    return run(pb, [key, x], checks=checks)


def test_random_draws_are_bit_exact_and_source_ops_and_indices():
    r = sources_random_index()
    for label, s, want in r.checks:
        got = r.out(s)
        np.testing.assert_array_equal(r.ref(s), want, err_msg=f"interp {label}")
        if label == "random_normal" and got.dtype == np.float64:  # libm's cos/log1p
            np.testing.assert_allclose(got, want, rtol=1e-15, err_msg=label)
        else:
            np.testing.assert_array_equal(got, want, err_msg=label)


@source_case
def layouts():
    """Strided, broadcast, in-place and vectorized kernels."""
    x = data("float32", (6, 10))
    big = np.random.default_rng(3).standard_normal(4099).astype(np.float32)
    ints = np.arange(-2000, 2051, dtype=np.int32)
    pb = ProgramBuilder()
    sx, sb, si = pb.input(x.shape), pb.input(big.shape), pb.input(ints.shape, "int32")
    t, s, r = pb.output((10, 6)), pb.output((3, 4)), pb.output((4, 15))
    cat = pb.output((6, 13))
    e = call("exp", Load(0), dtype="float32")
    pb.loop((10, 6), [Access(sx, (1, 10))], [Output(pb.access(t), e)])  # transpose
    pb.loop((3, 4), [Access(sx, (-20, 2), 51)], [Output(pb.access(s), Load(0))])  # x[5:0:-2, 1:9:2]
    pb.loop((4, 15), [Access(sx, (15, 1))], [Output(pb.access(r), call("neg", Load(0),
                                                                         dtype="float32"))])
    pb.loop((6, 10), [pb.access(sx)], [Output(Access(cat, (13, 1)), Load(0))])
    pb.loop((6, 3), [Access(sx, (10, 1))],
            [Output(Access(cat, (13, 1), 10), call("mul", Load(0), Const(2.0, None),
                                                  dtype="float32"))])
    # vectorized (float4 / int4): aligned, shifted by one element (the scalar path), with a
    # broadcast scalar operand, and in place through an arena slot
    v1, v2, v3 = pb.output((4099,)), pb.output((4098,)), pb.output((4051,), "int32")
    tmp = pb.temp((4099,))
    f = lambda op, *a, dt="float32": call(op, *a, dtype=dt)  # noqa: E731
    pb.loop((4099,), [pb.access(sb), Access(sx, (0,), 7)],
            [Output(pb.access(v1), f("add", f("tanh", Load(0)), Load(1)))])
    pb.loop((4098,), [Access(sb, (1,), 1)], [Output(pb.access(v2), f("sigmoid", Load(0)))])
    pb.loop((4051,), [pb.access(si)], [Output(pb.access(v3), f("mul", Load(0), Load(0),
                                                                dt="int32"))])
    pb.loop((4099,), [pb.access(sb)], [Output(pb.access(tmp), f("exp", Load(0)))])
    pb.loop((4099,), [pb.access(tmp)], [Output(pb.access(tmp), f("neg", Load(0)))])
    v4 = pb.output((4099,))
    pb.loop((4099,), [pb.access(tmp), pb.access(sb)], [Output(pb.access(v4),
                                                              f("add", Load(0), Load(1)))])
    from compiler.ops import eager_apply as ea
    sig = ea(np, "sigmoid", [big[1:]], {})[0]
    checks = [("exp", t, np.exp(x.T)), ("copy", s, x[5:0:-2, 1:9:2]), ("neg", r, -x.reshape(4, 15)),
              ("cat", cat, np.concatenate([x, x[:, :3] * 2], axis=1)),
              ("tanh", v1, np.tanh(big) + x.reshape(-1)[7]), ("sigmoid", v2, sig),
              ("mul", v3, ints * ints), ("exp", v4, big - np.exp(big))]
    return run(pb, [x, big, ints], checks=checks)


def test_strided_broadcast_in_place_and_vectorized_kernels():
    r = layouts()
    assert "float4" in r.source.text and "int4" in r.source.text
    check_per_op(r)


# ------------------------------------------------------------------------ reductions
SHAPES_AXES = [((17,), None), ((5, 7), 0), ((5, 7), 1), ((5, 7), (0, 1)), ((3, 4, 5), 1),
               ((3, 4, 5), (0, 2)), ((2, 3, 4, 5), (1, 3)), ((1, 9), 0), ((0, 4), 0),
               ((3, 0, 2), (0, 2)), ((), None), ((33, 65), 1), ((65, 33), 0),
               # several blocks / strategies: a block per row, thread per column, split
               ((3, 5000), 1), ((5000, 3), 0), ((200003,), None), ((20, 40000), 1),
               ((1300, 40), 1), ((64, 70), 0)]


def _reduce_kernel(pb, x, axis, variants, expr_op=None):
    """ONE loop kernel over x with an output per (op, keepdims) in ``variants`` (all reduce
    the same axes); returns [(label, output slot, expected)]."""
    from compiler.codegen.kernel import contiguous_strides
    from compiler.ops.core import normalize_axis
    sx = pb.input(x.shape, x.dtype.name)
    axes = normalize_axis(axis, x.ndim)
    kept = [d for d in range(x.ndim) if d not in axes]
    xin = x if expr_op is None else eager_apply(np, expr_op, [x], {})[0]
    expr = Load(0) if expr_op is None else call(expr_op, Load(0),
                                                dtype=infer_types(expr_op, [x], {})[0].dtype)
    outs, checks = [], []
    for op, keepdims in variants:
        attrs = {"axis": axis, "keepdims": keepdims}
        spec = infer_types(op, [x], attrs)[0]
        (want,) = eager_apply(np, op, [xin], attrs)
        out = pb.output(spec.shape, spec.dtype)
        own = contiguous_strides(spec.shape)
        strides = [0 if d in axes else own[d if keepdims else kept.index(d)]
                   for d in range(x.ndim)]
        outs.append(Output(Access(out, tuple(strides)), expr, op))
        checks.append((f"{op}-{x.dtype}-{x.shape}-{axis}-{keepdims}", out, want))
    pb.loop(x.shape, [pb.access(sx)], outs)
    return checks


def _red_data(dtype, shape, seed, op):
    r = np.random.default_rng(seed)
    if dtype == "bool":
        return r.random(shape) < 0.5
    if dtype.startswith("float"):
        x = (r.standard_normal(shape) * 2 + 0.3).astype(dtype)
        return (np.abs(x) * 0.2 + 0.9).astype(dtype) if op == "prod" else x
    return r.integers(-4, 5, shape).astype(dtype)


@source_case
def reductions():
    pb = ProgramBuilder()
    inputs, checks = [], []
    plan = {"float32": range(len(SHAPES_AXES)), "float64": (1, 4, 11, 13, 15),
            "int32": (2, 5, 6, 12, 14), "int8": (0, 4), "bool": (0, 5), "float16": (1, 2)}
    for dtype, which in plan.items():
        ops = {"bool": ("sum",), "int8": ("sum", "max", "min"),
               "float16": ("sum", "max", "min")}.get(dtype, ("sum", "prod", "max", "min"))
        for k in which:
            shape, axis = SHAPES_AXES[k]
            big = math.prod(shape) > 10000
            if big and dtype not in ("float32", "int32"):
                continue
            keeps = (False, True) if dtype == "float32" else (k % 2 == 1,)
            variants = [(op, keep) for op in ops for keep in keeps
                        if not (op == "prod" and big) and not (op in ("max", "min") and
                                                               0 in shape)]
            x = _red_data(dtype, shape, k, "prod" if "prod" in ops and not big else "sum")
            checks += _reduce_kernel(pb, x, axis, variants)
            inputs.append(x)
    x = _red_data("float32", (7, 300), 5, "sum")
    checks += [("sum-exp", s, w) for _, s, w in
               _reduce_kernel(pb, x, 1, [("sum", False)], expr_op="exp")]  # sum(exp(x))
    inputs.append(x)
    return run(pb, inputs, checks=checks)


def test_reductions_over_each_axis_every_strategy():
    r = reductions()
    src = r.source.text
    assert "__shfl_down_sync" in src and "_partial" in src and "_final" in src
    for s in r.program.slots_of("output"):  # float16 sums round every partial sum
        close(f"slot {s} vs interpreter", r.out(s), r.ref(s),
              rtol=2e-2 if r.out(s).dtype == np.float16 else 1e-4)
    for label, s, want in r.checks:
        rtol = 2e-2 if "float16" in label else (1e-4 if "float32" in label or label == "sum-exp"
                                                 else 1e-12)
        close(label, r.out(s), np.asarray(want), rtol=rtol)


@source_case
def mixed_reductions():
    """Outputs of one kernel reducing different dimensions (a single thread walks it), a
    plain output beside a reduction over nothing, and an empty loop space."""
    x = _rnd((4, 6), "float32", 2)
    pb = ProgramBuilder()
    sx = pb.input(x.shape)
    rows, cols, plain = pb.output((4,)), pb.output((6,)), pb.output((4, 6))
    pb.loop((4, 6), [pb.access(sx)], [Output(Access(rows, (1, 0)), Load(0), "sum"),
                                      Output(Access(cols, (0, 1)), Load(0), "max"),
                                      Output(pb.access(plain), call("exp", Load(0),
                                                                    dtype="float32"))])
    one, same = pb.output((4, 6)), pb.output((4, 6))
    pb.loop((4, 6, 1), [Access(sx, (6, 1, 0))], [Output(Access(one, (6, 1, 0)), Load(0), "max"),
                                                 Output(Access(same, (6, 1, 0)), Load(0))])
    empty = pb.output((3,))
    pb.loop((3, 0), [], [Output(Access(empty, (1, 0)), Const(1.0, "float32"), "prod")])
    checks = [("sum", rows, x.sum(1)), ("max", cols, x.max(0)), ("exp", plain, np.exp(x)),
              ("max", one, x), ("copy", same, x), ("prod", empty, np.ones(3, np.float32))]
    return run(pb, [x], checks=checks)


def test_mixed_reductions_and_empty_loop_space():
    r = mixed_reductions()
    assert "_serial" in r.source.text and "_identity" in r.source.text
    check_per_op(r)


# -------------------------------------------------------------------------- externs
MATMULS = [((5, 7), (7, 3), {}), ((1, 512), (512, 256), {}), ((9, 4), (4, 1), {}),
           ((3, 0), (0, 4), {}), ((4, 5, 6), (4, 6, 7), {}), ((3, 1, 5, 6), (2, 6, 7), {}),
           ((5, 6), (3, 6, 2), {}), ((7, 5), (7, 3), {"transpose_a": True}),
           ((5, 7), (3, 7), {"transpose_b": True}),
           ((2, 7, 5), (2, 3, 7), {"transpose_a": True, "transpose_b": True}),
           ((65, 1), (65, 130), {"transpose_a": True}), ((33, 65), (65, 17), {}),
           ((130, 70), (70, 129), {})]


def _rnd(shape, dtype, seed):
    r = np.random.default_rng(seed)
    if dtype.startswith("float"):
        return r.standard_normal(shape).astype(dtype)
    return r.integers(-5, 6, shape).astype(dtype)


def _matmul_expected(a, b, attrs):
    if attrs.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    return eager_apply(np, "matmul", [a, b], {})[0]


@source_case
def matmuls():
    from compiler.codegen.kernel import extern_out_specs
    pb = ProgramBuilder()
    inputs, checks = [], []
    # every case in float32; the other dtypes without transposes (one GEMM kernel each),
    # float64 also with both; mixed dtypes promote (int32 @ float32 -> float64)
    plan = [("float32", "float32", MATMULS)]
    plain = [m for m in MATMULS if not m[2]]
    plan += [("float64", "float64", plain + [MATMULS[9]]),
             ("int32", "int32", [m for m in plain if max(m[0] + m[1]) <= 100]),
             ("int8", "int8", [m for m in plain if max(m[0] + m[1]) <= 100][:4]),
             ("int32", "float32", plain[:2]), ("float32", "float64", plain[5:7])]
    for da, db, cases in plan:
        for k, (sa, sb, attrs) in enumerate(cases):
            a, b = _rnd(sa, da, k), _rnd(sb, db, k + 50)
            ia, ib = pb.input(a.shape, da), pb.input(b.shape, db)
            spec = extern_out_specs("matmul", attrs, [pb.slots[ia].spec, pb.slots[ib].spec])[0]
            o = pb.output(spec.shape, spec.dtype)
            pb.extern("matmul", [ia, ib], [o], **attrs)
            inputs += [a, b]
            checks.append((f"matmul-{da}-{db}-{sa}-{sb}-{attrs}", o,
                           _matmul_expected(a, b, attrs)))
    return run(pb, inputs, checks=checks)


def test_matmul_tiled_gemm_with_transposes_batches_and_odd_sizes():
    r = matmuls()  # sums of up to 512 products: float32 cancels to ~1e-5 absolute
    for s in r.program.slots_of("output"):
        close(f"slot {s} vs interpreter", r.out(s), r.ref(s), rtol=1e-4, atol=1e-4)
    for label, s, want in r.checks:
        rtol = 1e-12 if "float64-float64" in label else 1e-4
        close(label, r.out(s), np.asarray(want), rtol=rtol, atol=1e-4)


@source_case
def gathers():
    pb = ProgramBuilder()
    inputs, checks = [], []

    def inp(a):
        inputs.append(np.ascontiguousarray(a))
        return pb.input(a.shape, a.dtype.name)

    def ext(op, args, attrs, want_args=None):
        from compiler.codegen.kernel import extern_out_specs
        ins = [inp(a) for a in args]
        (spec,) = extern_out_specs(op, attrs, [pb.slots[s].spec for s in ins])
        o = pb.output(spec.shape, spec.dtype)
        pb.extern(op, ins, [o], **attrs)
        checks.append((f"{op}-{attrs}", o, eager_apply(np, op, want_args or args, attrs)[0]))
    x = _rnd((5, 7, 3), "float32", 0)
    for axis, mode in ((0, "clip"), (1, "wrap"), (2, "clip"), (-1, "wrap")):
        ext("take", [x, np.array([[0, 4], [-1, 9]], np.int64)], dict(axis=axis, mode=mode))
    ext("take", [_rnd((6, 4), "float16", 1), np.array([5, 0, 2], np.int32)], dict(axis=0))
    ext("take", [data("bool", (6, 4)), np.array([5, 0, 2], np.uint8)], dict(axis=1))
    for dt in ("float32", "float64", "int32", "int64", "float16", "int8"):
        g = _rnd((4, 6, 3), dt, 2)
        for mode in ("clip", "wrap"):
            ext("take_grad", [g, np.array([1, -2, 7, 1, 0, 1], np.int64)],
                dict(axis=1, dim=5, mode=mode))
    ext("pick", [x, np.array([[0, 1, 2], [6, 2, 0], [1, 1, 1], [-3, 9, 3], [2, 2, 2]],
                             np.int32)], dict(axis=1))
    ext("pick", [x[:, :, 0].copy(), np.array([0, 3, 6, 9, 1], np.int64)], dict(axis=-1))
    for op in ("argmax", "argmin"):
        for xs, axis in (((5, 7, 3), 1), ((5, 7, 3), None), ((4, 3000), 1), ((3000, 2), 0)):
            v = _rnd(xs, "float32", 3)
            v.reshape(-1)[[3, 11]] = np.nan
            v.reshape(-1)[5] = v.reshape(-1)[4]  # a tie: the first wins
            ext(op, [v], dict(axis=axis))
        ext(op, [_rnd((9, 4000), "int32", 4)], dict(axis=1))
        ext(op, [_rnd((7, 5), "int8", 5)], dict(axis=0))
    return run(pb, inputs, checks=checks)


def test_take_take_grad_pick_argmax_argmin():
    r = gathers()
    assert "atomicAdd" in r.source.text
    for s in r.program.slots_of("output"):
        close(f"slot {s} vs interpreter", r.out(s), r.ref(s), rtol=1e-5)
    for label, s, want in r.checks:
        close(label, r.out(s), np.asarray(want), rtol=2e-3 if "float16" in label else 1e-5)


CONVS = [  # (x shape, w shape, attrs)
    ((2, 1, 12, 12), (6, 1, 5, 5), dict(pad=2)),            # LeNet conv1 (smaller)
    ((2, 6, 9, 9), (4, 6, 5, 5), {}),                       # LeNet conv2
    ((2, 8, 9, 9), (8, 8, 3, 3), dict(pad=1)),              # ResNet 3x3
    ((2, 8, 9, 9), (16, 8, 3, 3), dict(pad=1, stride=2)),   # ResNet downsample
    ((2, 8, 7, 7), (12, 8, 1, 1), {}),                      # 1x1
    ((2, 4, 9, 8), (6, 2, 3, 2), dict(pad=(1, 0), stride=(2, 1), dilation=(2, 1), groups=2)),
    ((1, 3, 5, 5), (2, 3, 5, 5), {}),                       # one output pixel
]


@source_case
def convs_and_pools():
    pb = ProgramBuilder()
    inputs, checks = [], []

    def ext(op, args, attrs):
        from compiler.codegen.kernel import extern_out_specs
        ins = []
        for a in args:
            inputs.append(np.ascontiguousarray(a))
            ins.append(pb.input(a.shape, a.dtype.name))
        (spec,) = extern_out_specs(op, attrs, [pb.slots[s].spec for s in ins])
        o = pb.output(spec.shape, spec.dtype)
        pb.extern(op, ins, [o], **attrs)
        checks.append((f"{op}-{attrs}", o, eager_apply(np, op, args, attrs)[0]))
    for k, (xs, ws, attrs) in enumerate(CONVS):
        dt = "float64" if k == 2 else "float32"
        x, w = _rnd(xs, dt, k), _rnd(ws, dt, k + 9)
        (y,) = eager_apply(np, "conv2d", [x, w], attrs)
        g = _rnd(y.shape, dt, k + 21)
        ext("conv2d", [x, w], attrs)
        ext("conv2d_grad_data", [g, w], dict(attrs, data_shape=xs))
        ext("conv2d_grad_weight", [x, g], dict(attrs, weight_shape=ws))
    for k, (xs, attrs) in enumerate(POOLS):
        x = _rnd(xs, "float32", k)
        if attrs["pool_type"] == "max":  # ties: the first maximum takes the gradient
            x.reshape(-1)[1::7] = x.reshape(-1)[0:-1:7]
        (y,) = eager_apply(np, "pool2d", [x], attrs)
        ext("pool2d", [x], attrs)
        ext("pool2d_grad", [_rnd(y.shape, "float32", k + 5), x, y], attrs)
    x = _rnd((2, 3, 6, 6), "float16", 1)
    ext("pool2d", [x], dict(pool_type="avg", kernel=2, stride=2))
    ext("conv2d", [x, _rnd((2, 3, 3, 3), "float16", 2)], dict(pad=1))
    return run(pb, inputs, checks=checks)


def test_convolutions_and_pooling_with_gradients():
    r = convs_and_pools()
    for s in r.program.slots_of("output"):
        dt = r.out(s).dtype
        close(f"slot {s} vs interpreter", r.out(s), r.ref(s),
              rtol=1e-2 if dt == np.float16 else 1e-4, atol=1e-2 if dt == np.float16 else 1e-4)
    for label, s, want in r.checks:
        f16 = r.out(s).dtype == np.float16
        close(label, r.out(s), np.asarray(want), rtol=1e-2 if f16 else 1e-4,
              atol=1e-2 if f16 else 1e-4)


def test_take_raise_reads_indices_as_numpy():
    """mode='raise' compiles: in-range indices count from the end as NumPy's (the range is
    checked after the call by passes/index_checks.py, on every backend)."""
    pb = ProgramBuilder()
    x, i = pb.input((4,)), pb.input((3,), "int64")
    y = pb.output((3,))
    pb.extern("take", [x, i], [y], axis=0, mode="raise")
    xs = np.array([10, 11, 12, 13], np.float32)
    (got,) = run_program_emulated(pb.build(), [xs, np.array([-1, 2, -4])], [])
    np.testing.assert_array_equal(got, [13, 12, 10])


def test_source_is_deterministic():
    prog = reductions().program
    assert emit_cuda(prog, "test").text == reductions().source.text


# --------------------------------------------------------------- random graphs
def _random_graph(seed):
    from compiler.graph import Graph, NodeRef
    from compiler.ops import Spec
    rng = np.random.default_rng(seed)
    shape = [(3, 4), (5, 1), (2, 3), (33, 300), (6, 6)][seed % 5]
    g = Graph(f"r{seed}")
    vals = [g.add_input(Spec(shape, "float32"), f"x{i}") for i in range(rng.integers(1, 4))]
    n_in = len(vals)

    def op(name, *args, **attrs):
        return g.add_op(name, [NodeRef(a) if isinstance(a, (int, np.integer)) else a
                               for a in args], attrs)
    unary = ["exp", "tanh", "sigmoid", "relu", "neg", "abs", "square", "sin", "erf"]
    binary = ["add", "sub", "mul", "maximum", "minimum"]
    for _ in range(rng.integers(3, 16)):
        kind = rng.choice(["u", "b", "b", "s", "r", "t", "m", "rs", "sl", "bc"])
        a = int(rng.choice(vals))
        sa = g.spec(a).shape
        try:
            if kind == "u":
                v = op(str(rng.choice(unary)), a)
            elif kind == "b":
                v = op(str(rng.choice(binary)), a, int(rng.choice(vals)))
            elif kind == "s":
                v = op(str(rng.choice(binary)), a, float(rng.choice([0.0, 1.0, 0.5])))
            elif kind == "r" and len(sa) == 2:
                axis = [0, 1, None][rng.integers(3)]
                v = op(str(rng.choice(["sum", "max", "min", "prod"])), a, axis=axis,
                       keepdims=bool(rng.integers(2)))
            elif kind == "t" and len(sa) == 2:
                v = op("transpose", a, axes=(1, 0))
            elif kind == "m" and len(sa) == 2:
                other = [x for x in vals if len(g.spec(x).shape) == 2
                         and g.spec(x).shape[0] == sa[1]]
                if not other:
                    continue
                v = op("matmul", a, int(rng.choice(other)))
            elif kind == "rs" and len(sa) == 2:
                v = op("reshape", a, shape=(-1,))
            elif kind == "sl" and len(sa) == 2 and sa[0] > 1:
                v = op("slice", a, begin=(1, 0), end=(sa[0], sa[1]), step=(1, 1))
            elif kind == "bc" and len(sa) == 2 and sa[1] == 1:
                v = op("broadcast_to", a, shape=(sa[0], 4))
            else:
                continue
        except (ValueError, KeyError):
            continue
        vals.append(v)
    pool = vals[n_in:] or vals
    g.outputs = sorted({int(x) for x in rng.choice(pool, size=min(3, len(pool)))})
    return g


def merge_programs(progs):
    """One Program running ``progs`` one after another (slots renumbered, arenas side by
    side): one source, one build, one nvcc run for many random graphs."""
    slots, steps, arena = [], [], 0
    for p in progs:
        base, shift = len(slots), -(-arena // 256) * 256
        for s in p.slots:
            slots.append(dataclasses.replace(s, offset=s.offset + shift) if s.in_arena else s)

        def acc(a):
            return dataclasses.replace(a, slot=a.slot + base)
        for k in p.steps:
            if isinstance(k, LoopKernel):
                steps.append(dataclasses.replace(
                    k, loads=tuple(acc(a) for a in k.loads),
                    outputs=tuple(dataclasses.replace(o, access=acc(o.access))
                                  for o in k.outputs)))
            else:
                steps.append(dataclasses.replace(
                    k, in_slots=tuple(s + base for s in k.in_slots),
                    out_slots=tuple(s + base for s in k.out_slots),
                    scratch=None if k.scratch is None else k.scratch + base))
        arena = shift + p.arena_bytes
    return Program(tuple(slots), arena, tuple(steps)).validate()


def _io_arrays(program, binding, inputs):
    """Arrays for a lowered program's io slots by role (aliases share their buffers)."""
    io = program.io_slots()
    arrays = [None] * len(io)
    for pos, (s, entry) in enumerate(zip(io, binding.io)):
        slot = program.slots[s]
        if entry[0] == "input":
            arrays[pos] = inputs[entry[1]]
        elif entry[0] == "const":
            arrays[pos] = np.ascontiguousarray(entry[1], slot.dtype).reshape(slot.shape)
        elif entry[0] == "output":
            arrays[pos] = np.empty(slot.shape, slot.dtype)
    for pos, (s, entry) in enumerate(zip(io, binding.io)):
        if entry[0] == "alias":
            arrays[pos] = arrays[entry[1]].reshape(program.slots[s].shape)
    by_role = {"input": [], "param": [], "output": [], "numbered": {}}
    for pos, s in enumerate(io):
        by_role[program.slots[s].role].append(arrays[pos])
        if binding.io[pos][0] == "output":  # the binding's ('slot', k) outputs
            by_role["numbered"][binding.io[pos][1]] = arrays[pos]
    return by_role


N_RANDOM_GRAPHS = 24


@source_case
def random_graphs():
    from compiler.codegen.lower import lower
    from compiler.pipeline import run_passes
    from compiler.reference import run_reference
    progs, expects = [], []
    emu_io, int_io = {"input": [], "param": [], "output": []}, {"input": [], "param": [],
                                                                 "output": []}
    for seed in range(N_RANDOM_GRAPHS):
        g = _random_graph(seed)
        rng = np.random.default_rng(seed)
        inputs = [rng.standard_normal(g.spec(i).shape).astype(np.float32) for i in g.inputs]
        optimized, _ = run_passes(g)
        prog, binding = lower(optimized)
        progs.append(prog)
        for io in (emu_io, int_io):  # each run its own outputs (aliases share them)
            arrays = _io_arrays(prog, binding, inputs)
            for role in io:
                io[role] += arrays[role]
        expects.append((run_reference(g, inputs), binding, arrays["numbered"]))
    merged = merge_programs(progs)
    src = emit_cuda(merged, "random")
    run_program_emulated(merged, emu_io["input"], emu_io["param"], emu_io["output"],
                         source=src)
    interpret(merged, int_io["input"], int_io["param"], int_io["output"])
    return merged, src, emu_io["output"], int_io["output"], expects


def test_random_graphs_lowered_match_interpreter_and_reference():
    merged, src, emulated, interp_outs, expects = random_graphs()
    assert len(merged.steps) > 3 * N_RANDOM_GRAPHS // 2
    for got, ref in zip(emulated, interp_outs):
        close("vs interpreter", got, ref, rtol=1e-4)
    for want, binding, outs in expects:  # each graph's outputs, through its binding
        for w, (kind, k) in zip(want, binding.outputs):
            if kind == "slot":
                close("interpreter vs reference", outs[k], np.asarray(w), rtol=1e-4)


# ------------------------------------------------------------------ nvcc, every source
@pytest.mark.parametrize("name", sorted(SOURCES) + ["emulator_kernels"])
def test_every_source_compiles_for_sm80_and_sm90(name):
    if available_compiler() is None:
        pytest.skip("no CUDA compiler (nvcc or CuPy's NVRTC) on this machine")
    if name == "emulator_kernels":
        text = EMU_KERNELS
    else:
        built = SOURCES[name]()
        text = (built.source if isinstance(built, Run) else built[1]).text
    check_compiles_all(text, ("sm_80", "sm_90"))


# --------------------------------------------------------- the emulator, by hand
EMU_KERNELS = r"""
extern "C" __global__ void reverse(float* a, int n) {
    __shared__ float buf[1024];
    const int t = threadIdx.x;
    if (t < n) buf[t] = a[t];
    __syncthreads();  /* without it, thread t reads buf[n - 1 - t] before it is written */
    if (t < n) a[t] = buf[n - 1 - t];
}
extern "C" __global__ void warp_sums(const float* x, float* down, float* xr, int* up,
                                     int* bcast) {
    const int t = threadIdx.x + blockIdx.x * blockDim.x;
    float v = x[t], w = x[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    int s = (int)threadIdx.x;
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31u) >= (unsigned)o) s += n;
    }
    if ((threadIdx.x & 31u) == 0) down[t / 32] = v;
    xr[t] = w;
    up[t] = s;
    bcast[t] = __shfl_sync(0xffffffffu, (int)threadIdx.x * 10, 5);
}
extern "C" __global__ void atomics(const int* x, int n, int* total, int* biggest,
                                   float* ftotal, unsigned long long* count, int* cas) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        atomicAdd(total, x[i]);
        atomicMax(biggest, x[i]);
        atomicAdd(ftotal, 0.5f);
        atomicAdd(count, 1ull);
        atomicCAS(cas, 0, i + 1);
    }
}
extern "C" __global__ void grid_ids(int* out) {
    const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int nthreads = blockDim.x * blockDim.y * blockDim.z;
    out[bid * nthreads + tid] = bid * 1000 + tid;
}
extern "C" __global__ void dynamic_shared(float* a, float scale) {
    HYB_DYNAMIC_SHARED(float, buf);
    buf[threadIdx.x] = a[blockIdx.x * blockDim.x + threadIdx.x] * scale;
    __syncthreads();
    a[blockIdx.x * blockDim.x + threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}
extern "C" __global__ void deadlock(int* a) {
    if (threadIdx.x == 0) __syncthreads();  /* the others never arrive: a GPU would hang */
    else __syncwarp();
    a[threadIdx.x] = 1;
}
#ifdef HYBRID_EMULATE
HYB_EMU_STUB(reverse)
HYB_EMU_STUB(warp_sums)
HYB_EMU_STUB(atomics)
HYB_EMU_STUB(grid_ids)
HYB_EMU_STUB(dynamic_shared)
HYB_EMU_STUB(deadlock)
#endif
"""
EMU_PRELUDE = "#ifndef HYBRID_EMULATE\n#define HYB_DYNAMIC_SHARED(type, name) " \
              "extern __shared__ float name[]\n#endif\n"
EMU_KERNELS = EMU_PRELUDE + EMU_KERNELS


@pytest.fixture(scope="module", params=["fibers", "ucontext"])
def emu(request):
    from runtime.gpu.emu import build_module
    return build_module(EMU_KERNELS, () if request.param == "fibers" else ("HYB_EMU_UCONTEXT",))


def test_emulator_syncthreads_orders_shared_memory(emu):
    a = np.arange(1000, dtype=np.float32)
    emu.launch("reverse", 1, 1000, 0, [a, np.int32(1000)])
    np.testing.assert_array_equal(a, np.arange(1000, dtype=np.float32)[::-1])


def test_emulator_warp_shuffles(emu):
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    down, xr = np.zeros(8, np.float32), np.zeros(256, np.float32)
    up, bcast = np.zeros(256, np.int32), np.zeros(256, np.int32)
    emu.launch("warp_sums", 2, 128, 0, [x, down, xr, up, bcast])
    warps = x.reshape(8, 32).astype(np.float64)
    np.testing.assert_allclose(down, warps.sum(1), rtol=1e-5)
    np.testing.assert_allclose(xr, np.repeat(warps.sum(1), 32), rtol=1e-5)
    lanes = np.arange(128) % 32
    prefix = np.concatenate([np.cumsum(np.arange(w * 32, (w + 1) * 32)) for w in range(4)])
    np.testing.assert_array_equal(up, np.tile(prefix, 2))
    np.testing.assert_array_equal(bcast, np.tile((np.arange(128) - lanes + 5) * 10, 2))


def test_emulator_atomics_across_blocks(emu):
    x = np.random.default_rng(1).integers(-100, 100, 5000).astype(np.int32)
    total, biggest, cas = np.zeros(1, np.int32), np.full(1, -1000, np.int32), np.zeros(1, np.int32)
    ftotal, count = np.zeros(1, np.float32), np.zeros(1, np.uint64)
    emu.launch("atomics", 7, 96, 0, [x, np.int32(x.size), total, biggest, ftotal, count, cas])
    assert total[0] == x.sum() and biggest[0] == x.max()
    assert ftotal[0] == 2500.0 and count[0] == 5000
    assert 1 <= cas[0] <= 5000


def test_emulator_3d_grids_and_blocks(emu):
    out = np.full(2 * 3 * 2 * 4 * 2 * 3, -1, np.int32)
    emu.launch("grid_ids", (2, 3, 2), (4, 2, 3), 0, [out])
    nthreads = 24
    want = [b * 1000 + t for b in range(12) for t in range(nthreads)]
    np.testing.assert_array_equal(out, want)


def test_emulator_dynamic_shared_memory(emu):
    a = np.arange(512, dtype=np.float32)
    emu.launch("dynamic_shared", 2, 256, 256 * 4, [a, np.float32(2.0)])
    np.testing.assert_array_equal(a, (np.arange(512, dtype=np.float32) * 2)
                                  .reshape(2, 256)[:, ::-1].reshape(-1))


def test_emulator_errors_are_clear(emu):
    from runtime.gpu.emu import EmuLaunchError
    a = np.zeros(64, np.int32)
    with pytest.raises(EmuLaunchError, match="deadlock"):
        emu.launch("deadlock", 1, 64, 0, [a])
    with pytest.raises(ValueError, match="1024"):
        emu.launch("reverse", 1, (32, 33), 0, [a, np.int32(1)])
    with pytest.raises(KeyError, match="no_such_kernel"):
        emu.launch("no_such_kernel", 1, 1, 0, [])
    with pytest.raises(EmuLaunchError, match="takes 2 argument"):
        emu.launch("reverse", 1, 1, 0, [a])
    with pytest.raises(EmuLaunchError, match="bytes wide"):
        emu.launch("reverse", 1, 1, 0, [a, np.int64(1)])
    with pytest.raises(TypeError, match="NumPy scalar"):
        emu.launch("dynamic_shared", 1, 1, 4, [a, 2.0])
    with pytest.raises(EmuLaunchError, match="shared"):
        emu.launch("dynamic_shared", 1, 1, 1 << 20, [a, np.float32(1)])
    emu.launch("reverse", 1, 4, 0, [a, np.int32(4)])  # still usable afterwards


def test_emulator_build_errors_and_cache():
    from runtime.gpu.emu import EmuBuildError, build_module
    from runtime.gpu.emu.build import _library_path
    with pytest.raises(EmuBuildError, match="undeclared|not declared"):
        build_module('extern "C" __global__ void k(float* a) { a[0] = nope; }\n')
    m = build_module(EMU_KERNELS)
    assert build_module(EMU_KERNELS) is m and _library_path(m.digest).exists()
