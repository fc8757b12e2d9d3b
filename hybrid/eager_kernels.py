"""Eager kernels from the compiler: an eager op whose NumPy implementation is slow runs a
compiled single-op kernel from the same code generator as hybridized graphs.

JAX runs every eager primitive as a compiled one-op program; here only the ops where that
pays: convolutions and their two gradients, pooling and its gradient (NumPy's im2col +
strided-window code spends more time moving windows than multiplying), and transcendental
elementwise ops on large arrays (sigmoid, tanh, exp, log, erf: NumPy's scalar loops vs a
vectorized one), large random draws (the counter-based generator in one pass instead of
~15 array passes, bit for bit the same numbers), and float32 products at the sizes the
register-tiled loops take (``MATMUL_COMPILED``). Other elementwise ops, reductions and other
products stay NumPy (one ufunc or BLAS call: nothing to gain).

A signature (op, operand shapes and dtypes, attributes) is the eager front end's inference
key, so the kernel lives in the same cache entry as the op's inferred types. Its first call
runs NumPy (a one-off call, as in a test, never waits for a compile); its second builds a
one-node graph, compiles it through ``compiler.pipeline.compile(graph, "llvm")`` (the native
code cache makes that a disk hit in a later process) and runs the executable from then on.
A compile that fails falls back to NumPy for good, logged on ``HYBRID_LOG=compile``.

On a GPU only the random draws compile (``GPU_OPS``), through the CUDA backend for that GPU
(one kernel per draw where CuPy runs the generator as ~20 elementwise kernels, each a launch
and a pass over the array: the book's 12.2 draws); CuPy's other ops are one kernel or one
cuBLAS call already. Signatures key their cache entry by device there, so each GPU (and the
CPU) holds its own executable.

Measured (LeNet's shapes at batch 256, this 2-vCPU VM): conv2d 256x6x14x14 NumPy 30 ms ->
3.3 ms compiled, sigmoid of 1.2M floats 14 -> 0.9 ms; ``HYBRID_EAGER_KERNELS=0`` turns them
off.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from runtime import config

_log = config.logger("compile")
_flag = config.get

# the ops whose compiled kernel beats NumPy's implementation at any size
COMPILED_OPS = frozenset(("conv2d", "conv2d_grad_data", "conv2d_grad_weight", "pool2d",
                          "pool2d_grad"))
# transcendental elementwise ops: a vectorized (and, when large, threaded) loop beats NumPy's
# ufuncs from a few thousand elements (measured at 30K-1.2M float32 elements: sigmoid 8-15x,
# erf 20x, tanh/exp/log 3x); below LARGE_MIN elements the op runs in the caller on NumPy
# (ndarray._INLINE_MAX), where a native call's fixed cost would not pay
LARGE_OPS = frozenset(("sigmoid", "tanh", "exp", "log", "erf"))
# random draws, at any size: NumPy computes the counter-based generator
# (compiler/ops/random.py) as ~15 array ops (uint64 hashing, then the float transform), the
# compiled loop in one threaded pass, with the same bits (the transform calls the same libm
# functions): measured at 1000 x 1000, uniform 13.6 -> 0.6 ms, normal 77 -> 26 ms (its libm
# log1p and cos per element are most of what is left); a (2, 3) draw ~40 -> ~25 us
RANDOM_OPS = frozenset(("random_uniform", "random_normal", "random_randint"))
# float32 products at the sizes the generated GEMM loops take (extern_plan.matmul_plan: not a
# batch-1 GEMV, not a huge product; and a classifier's x @ W.T with fewer columns than a
# vector's lanes, one GEMV per row): they beat OpenBLAS there (the book's MLP at batch 64
# on a 2-vCPU Xeon: 64x512 @ 512x256 112 -> 66 us, 64x256 @ 256x128 41 -> 19 us).
# A transposed operand (Dense's x @ W.T is a view of W) is read as its base with the
# product's transpose flag, never copied. The thin products matter beyond their own time:
# while they ran on NumPy's OpenBLAS, its thread kept spinning on the second core after
# each, and the MLP training step's 51M-multiply-add products, compiled, ran single-threaded
# (620 vs 310 us alone): with every product of the step compiled it runs at 1.61-1.68 ms,
# with the big ones on OpenBLAS 1.78-1.89.
MATMUL_COMPILED = "matmul"
MATMUL_MIN_MACS = 1 << 16  # below, NumPy's call costs less than an executable's (~1.5 us)
# the ops compiled on a GPU (the random draws: see the module's docstring)
GPU_OPS = RANDOM_OPS
LARGE_MIN = 1 << 14
MIN_CALLS = 2  # a signature compiles on its call number MIN_CALLS; earlier calls run NumPy
# A small random draw saves ~50 us a call but its compile costs ~50-100 ms with an empty
# cache: it compiles on this call only (a loop drawing the same shape), never for a script
# drawing it a few times.
SMALL_DRAW_CALLS = 16
stats = {"compiles": 0, "native_calls": 0, "numpy_calls": 0, "failures": 0}


def kernel_for(name, args, attrs, out_specs, fallback, device=None):
    """The eager kernel ``run(xp, args, attrs)`` of this signature on ``device`` (None: the
    CPU): ``fallback`` (NumPy, or CuPy on a GPU) unless the op compiles there (COMPILED_OPS,
    LARGE_OPS by size, RANDOM_OPS; on a GPU, GPU_OPS). HYBRID_EAGER_KERNELS is read at every
    call."""
    on_gpu = device is not None and device.kind == "gpu"
    if on_gpu:
        if name not in GPU_OPS:
            return fallback
    elif name == MATMUL_COMPILED:
        if not _plain_product(args, out_specs):
            return fallback
    elif name not in COMPILED_OPS and not _compiled_by_size(name, out_specs):
        return fallback
    operands = []
    for a in args:
        shape = getattr(a, "shape", None)
        if shape is None or not hasattr(a, "_dtype"):
            return fallback  # a scalar operand: none of these ops takes one
        operands.append((tuple(shape), a._dtype))
    return CompiledKernel(name, operands, dict(attrs), out_specs, fallback,
                          device if on_gpu else None)


def _plain_product(args, out_specs) -> bool:
    """A 2-D float32 product, not batch 1, of MATMUL_MIN_MACS or more (whether the GEMM loops
    take it is asked when it compiles: the plan reads the host's vector width, which loads
    LLVM, and a first call never waits for that)."""
    shapes = [tuple(getattr(a, "shape", ())) for a in args]
    if any(len(s) != 2 for s in shapes) or \
            {getattr(a, "_dtype", None) for a in args} | {out_specs[0].dtype} != {"float32"}:
        return False
    (m, k), n = shapes[0], shapes[1][1]
    return m > 1 and m * k * n >= MATMUL_MIN_MACS


def _gemm_loops_take(shapes, layout) -> bool:
    """The register-tiled GEMM takes it, or, with fewer columns than a vector's lanes, a
    product x @ W.T runs as one GEMV per row (a classifier's 10 classes)."""
    from compiler.codegen.extern_plan import matmul_plan  # noqa: PLC0415 - compiler: lazily
    from compiler.codegen.llvm.gemv import thin_applies  # noqa: PLC0415
    (m, k), n = shapes[0], shapes[1][1]
    return matmul_plan(shapes, ["float32"] * 2, "float32", {}) is not None or \
        thin_applies("float32", m, n, k, *layout)


def _compiled_by_size(name, out_specs) -> bool:
    if len(out_specs) != 1:
        return False
    if name in RANDOM_OPS:  # ~15 NumPy ops at any size: one native call pays from 1 element
        return True
    return name in LARGE_OPS and out_specs[0].dtype in ("float32", "float64") and \
        math.prod(out_specs[0].shape) >= LARGE_MIN


class CompiledKernel:
    """One signature's kernel on one device: the array module's implementation for its first
    calls, then the compiled executable (LLVM on the CPU, CUDA C on ``gpu``)."""

    __slots__ = ("name", "operands", "attrs", "out_specs", "fallback", "calls", "exe", "lock",
                 "min_calls", "gpu", "layouts")

    def __init__(self, name, operands, attrs, out_specs, fallback, gpu=None):
        self.name = name
        self.operands = operands
        self.attrs = attrs
        self.out_specs = out_specs
        self.fallback = fallback
        self.gpu = gpu  # the GPU Device it runs on; None: the CPU
        self.calls = 0
        small = math.prod(out_specs[0].shape) < LARGE_MIN
        self.min_calls = SMALL_DRAW_CALLS if small and name in RANDOM_OPS else MIN_CALLS
        self.exe = None  # the Executable; False once a compile failed
        self.lock = threading.Lock()
        self.layouts = {}  # a product's (transpose_a, transpose_b) -> its Executable / False

    def __call__(self, xp, args, attrs):
        if self.gpu is None and self.name == MATMUL_COMPILED:
            return self._product(args, attrs)
        exe = self.exe
        if not _flag("HYBRID_EAGER_KERNELS"):
            exe = None
        elif exe is None:
            self.calls += 1
            if self.calls >= self.min_calls:
                exe = self.build()
        if not exe:
            stats["numpy_calls"] += 1
            return self.fallback(xp, args, attrs)
        stats["native_calls"] += 1
        if self.gpu is None:
            return tuple(exe.run(np, [np.ascontiguousarray(a) for a in args], []))
        return tuple(exe.run(xp, list(args), []))  # queued on the GPU's compute stream

    def _product(self, args, attrs):
        """A product whose operands may be transposed views: the executable of their layout
        (read as their bases with the product's transpose flags), compiled at its
        MIN_CALLS-th call; NumPy before, and for a view neither layout describes."""
        layout, bases = [], []
        for a in args:
            t = not a.flags.c_contiguous
            if t and not a.T.flags.c_contiguous:
                layout = None
                break
            layout.append(t)
            bases.append(a.T if t else a)
        exe = None
        if layout is not None and _flag("HYBRID_EAGER_KERNELS"):
            layout = tuple(layout)
            exe = self.layouts.get(layout)
            if exe is None:
                self.calls += 1
                if self.calls >= self.min_calls:
                    with self.lock:
                        exe = self.layouts.get(layout)
                        if exe is None:
                            exe = self.layouts[layout] = _gemm_loops_take(
                                [s for s, _ in self.operands], layout) and self._compile(
                                [(tuple(b.shape), self.operands[i][1])
                                 for i, b in enumerate(bases)], self.attrs, layout)
        if not exe:
            stats["numpy_calls"] += 1
            return self.fallback(np, args, attrs)
        stats["native_calls"] += 1
        return tuple(exe.run(np, bases, []))

    def _compile(self, operands, attrs, transposed=()):
        """compile_op's executable for these operands, or False (logged) where it fails or
        disagrees with the signature's inferred shapes."""
        try:
            exe = compile_op(self.name, operands, attrs, self.gpu, transposed)
            stats["compiles"] += 1
        except Exception as exc:  # noqa: BLE001 - the array module still computes it
            stats["failures"] += 1
            _log.info("eager %s%s on %s: no compiled kernel (%s: %s); %s runs it",
                      self.name, operands, self.gpu or "cpu", type(exc).__name__, exc,
                      "NumPy" if self.gpu is None else "the GPU's array module")
            return False
        specs = [tuple(s.shape) for s in exe.out_specs]
        return exe if specs == [tuple(s.shape) for s in self.out_specs] else False

    def build(self):
        with self.lock:
            if self.exe is None:
                self.exe = self._compile(self.operands, self.attrs)
        return self.exe


def compile_op(name, operands, attrs, gpu=None, transposed=()):
    """An executable for one op applied to fresh inputs of the given (shape, dtype): LLVM for
    the CPU, or CUDA C for the GPU Device ``gpu``. ``transposed[i]``: the op reads input i's
    2-D transpose (the lowering folds it into a product's operand)."""
    from compiler import pipeline  # noqa: PLC0415 - the compiler loads on first use
    from compiler.graph import Graph, NodeRef  # noqa: PLC0415
    from compiler.ops import Spec  # noqa: PLC0415

    where = str(gpu) if gpu is not None else "cpu(0)"
    g = Graph(f"eager_{name}")
    ins = [NodeRef(g.add_input(Spec(shape, dtype), f"x{i}", device=where))
           for i, (shape, dtype) in enumerate(operands)]
    ins = [NodeRef(g.add_op("transpose", [a], {"axes": (1, 0)}, device=where))
           if i < len(transposed) and transposed[i] else a for i, a in enumerate(ins)]
    g.outputs = [g.add_op(name, ins, attrs, device=where)]
    return pipeline.compile(g, "llvm" if gpu is None else "cuda", gpu)
