"""Differential-testing helpers: many registry-op cases in ONE Program, compiled once.

    cases = CaseProgram()
    cases.elementwise("exp", [x])
    cases.extern("matmul", [a, b], transpose_b=True)
    results = cases.run()            # [(case, native output, eager expected), ...]

Each case gets its own input slots, one kernel and one output slot; the expected value comes
from the registry's eager impl (``compiler.ops.eager_apply``) on NumPy.
"""
from __future__ import annotations

import numpy as np

from ..ops import eager_apply, infer_types, is_scalar
from .interp import interpret
from .kernel import Access, Const, Load, Output, ProgramBuilder, call, contiguous_strides


class Case:
    def __init__(self, op, args, attrs, out_slots, expected, label):
        self.op = op
        self.args = args
        self.attrs = attrs
        self.out_slots = out_slots
        self.expected = expected
        self.label = label

    def __repr__(self):
        shapes = [getattr(a, "shape", a) for a in self.args]
        dts = [getattr(a, "dtype", type(a).__name__) for a in self.args]
        return f"{self.label or self.op}({shapes}, {dts}, {self.attrs})"


class CaseProgram:
    def __init__(self):
        self.pb = ProgramBuilder()
        self.inputs = []
        self.cases = []

    def _input(self, a):
        a = np.asarray(a)
        if not a.flags.c_contiguous:
            a = a.copy()
        s = self.pb.input(a.shape, a.dtype.name)
        self.inputs.append(a)
        return s

    def elementwise(self, op, args, label="", **attrs):
        """A one-kernel case: out = op(*args) over the broadcast shape (scalars stay weak)."""
        spec = infer_types(op, args, attrs)[0]
        with np.errstate(all="ignore"):
            expected = eager_apply(np, op, args, attrs)[0]
        shape = tuple(spec.shape)
        loads, operands = [], []
        for a in args:
            if is_scalar(a):
                operands.append(Const(a.item() if isinstance(a, np.generic) else a, None))
                continue
            s = self._input(a)
            loads.append(self.pb.access(s, shape))
            operands.append(Load(len(loads) - 1))
        out = self.pb.output(shape, spec.dtype)
        self.pb.loop(shape, loads, [Output(self.pb.access(out),
                                           call(op, *operands, dtype=spec.dtype, attrs=attrs))],
                     name=op)
        self.cases.append(Case(op, args, attrs, [out], expected, label))
        return self.cases[-1]

    def reduction(self, op, x, axis=None, keepdims=False, label="", expr_op=None):
        """out = op(x [, expr_op applied first], axis, keepdims) as one reducing loop."""
        from ..ops.core import normalize_axis  # noqa: PLC0415
        attrs = {"axis": axis, "keepdims": keepdims}
        spec = infer_types(op, [x], attrs)[0]
        xin = x if expr_op is None else eager_apply(np, expr_op, [x], {})[0]
        with np.errstate(all="ignore"):
            expected = eager_apply(np, op, [xin], attrs)[0]
        sx = self._input(x)
        axes = normalize_axis(axis, x.ndim)
        out = self.pb.output(spec.shape, spec.dtype)
        kept = [d for d in range(x.ndim) if d not in axes]
        own = contiguous_strides(spec.shape)
        strides = []
        for d in range(x.ndim):
            if d in axes:
                strides.append(0)
            elif keepdims:
                strides.append(own[d])
            else:
                strides.append(own[kept.index(d)])
        expr = Load(0)
        if expr_op is not None:
            expr = call(expr_op, expr, dtype=infer_types(expr_op, [x], {})[0].dtype)
        self.pb.loop(x.shape, [self.pb.access(sx)],
                     [Output(Access(out, tuple(strides)), expr, op)], name=op)
        self.cases.append(Case(op, [x], attrs, [out], expected, label))
        return self.cases[-1]

    def extern(self, op, args, label="", expected=None, **attrs):
        """A one-extern case; ``expected`` defaults to the eager impl (transposes undone)."""
        from .kernel import extern_out_specs  # noqa: PLC0415
        ins = [self._input(a) for a in args]
        specs = extern_out_specs(op, attrs, [self.pb.slots[s].spec for s in ins])
        outs = [self.pb.output(sp.shape, sp.dtype) for sp in specs]
        self.pb.extern(op, ins, outs, name=op, **attrs)
        if expected is None:
            eargs = list(args)
            if attrs.get("transpose_a"):
                eargs[0] = np.swapaxes(eargs[0], -1, -2)
            if attrs.get("transpose_b"):
                eargs[1] = np.swapaxes(eargs[1], -1, -2)
            reg = {k: v for k, v in attrs.items() if k not in ("transpose_a", "transpose_b")}
            expected = eager_apply(np, op, eargs, reg)
            expected = expected[0] if len(expected) == 1 else expected
        self.cases.append(Case(op, args, attrs, outs, expected, label))
        return self.cases[-1]

    def program(self):
        return self.pb.build()

    def run(self, backend="llvm", name="cases"):
        prog = self.program()
        if backend == "llvm":
            from .llvm import compile_program, run_program  # noqa: PLC0415
            outs = run_program(compile_program(prog, name), self.inputs)
        else:
            outs = interpret(prog, self.inputs)
        out_pos = {s: i for i, s in enumerate(prog.slots_of("output"))}
        results = []
        for c in self.cases:
            got = [outs[out_pos[s]] for s in c.out_slots]
            results.append((c, got[0] if len(got) == 1 else got, c.expected))
        return results

