"""The CUDA C scalar builder: the protocol of ../scalar.py emitted as C statements.

Every primitive writes one ``const <type> tN = <expression>;`` line into a :class:`Code`
buffer and returns the name ``tN`` (constants are returned as literals), so a value used
many times is computed once and the text grows linearly with the expression.

Registers and memory (:data:`REG_CTYPES`, :data:`MEM_CTYPES`): float16 lives in memory as
its IEEE bits (``unsigned short``) and in registers as a ``float`` holding a value that
float16 represents; every float16 operation rounds its float result back to float16
(``hyb_rh``, prelude.py), which for + - * / and sqrt gives exactly float16 arithmetic.
bool is ``unsigned char`` 0/1 in memory and ``bool`` in registers.

Integer arithmetic that could overflow a signed C type runs in the unsigned type of the same
width (C leaves signed overflow undefined; NumPy wraps). Literals carry their C type exactly
(``5LL``, ``(signed char)5``, ``0x1.8p+1f``), so overloaded helpers never see ambiguous calls.
"""
from __future__ import annotations

import contextlib
import math

from ..kernel import KernelIRError
from ..scalar import FLOATS, SIGNED, ScalarBuilder

REG_CTYPES = {"float16": "float", "float32": "float", "float64": "double",
              "int8": "signed char", "uint8": "unsigned char", "int32": "int",
              "int64": "long long", "uint64": "unsigned long long", "bool": "bool"}
MEM_CTYPES = dict(REG_CTYPES, float16="unsigned short", bool="unsigned char")
# the unsigned type that wrapping arithmetic of each signed type runs in
_WRAP = {"int32": "unsigned", "int64": "unsigned long long"}
_TAGS = {"float16": "f16", "float32": "f32", "float64": "f64", "int8": "i8", "uint8": "u8",
         "int32": "i32", "int64": "i64", "bool": "b"}


def reg_ctype(dtype: str) -> str:
    return REG_CTYPES[dtype]


def mem_ctype(dtype: str) -> str:
    return MEM_CTYPES[dtype]


def load_expr(dtype: str, ref: str) -> str:
    """The register value of memory reference ``ref`` (e.g. ``s3[i]``) of ``dtype``."""
    if dtype == "float16":
        return f"hyb_h2f({ref})"
    if dtype == "bool":
        return f"({ref} != 0)"
    return ref


def dtype_tag(dtype: str) -> str:
    """A short name of ``dtype`` for helper and kernel names (f32, i64, ...)."""
    return _TAGS[dtype]


def store_acc(dtype: str, acc: str) -> str:
    """The memory form of accumulator ``acc`` (float, double or an unsigned integer that
    holds the sum modulo 2^bits) as ``dtype``."""
    if dtype == "float16":
        return f"hyb_f2h({acc})"
    return f"({MEM_CTYPES[dtype]})({acc})"


def store_expr(dtype: str, value: str) -> str:
    """The memory form of register value ``value`` of ``dtype``."""
    if dtype == "float16":
        return f"hyb_f2h({value})"
    if dtype == "bool":
        return f"(unsigned char)({value})"
    return value


def float_literal(value: float, dtype: str) -> str:
    """An exact C literal of ``value`` as ``dtype`` (float16 and float32: a float)."""
    value = float(value)
    single = dtype != "float64"
    if math.isnan(value):
        return "__uint_as_float(0x7fc00000u)" if single else \
            "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(value):
        if single:
            return f"__uint_as_float({'0xff800000u' if value < 0 else '0x7f800000u'})"
        bits = "(long long)0xfff0000000000000ULL" if value < 0 else "0x7ff0000000000000LL"
        return f"__longlong_as_double({bits})"
    text = value.hex() + ("f" if single else "")
    return f"({text})" if text.startswith("-") else text


def int_literal(value: int, dtype: str) -> str:
    """An exact C literal of integer ``value`` (already in range) as ``dtype``."""
    value = int(value)
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "uint64":
        return f"{value}ULL"
    if dtype == "int64":
        if value == -(1 << 63):
            return "(-9223372036854775807LL - 1LL)"
        return f"({value}LL)" if value < 0 else f"{value}LL"
    if dtype == "int32":
        if value == -(1 << 31):
            return "(-2147483647 - 1)"
        return f"({value})" if value < 0 else str(value)
    return f"(({REG_CTYPES[dtype]}){value})"


def literal(value, dtype: str) -> str:
    if dtype in FLOATS:
        return float_literal(value, dtype)
    return int_literal(value, dtype)


class Code:
    """Lines of C with indentation and fresh names (one buffer per function)."""

    def __init__(self, indent: int = 1):
        self.lines: list = []
        self.depth = indent
        self.count = 0

    def line(self, text: str):
        self.lines.append("    " * self.depth + text)

    def fresh(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    @contextlib.contextmanager
    def block(self, head: str):
        """``head {`` ... ``}``: a for, if or plain scope."""
        self.line(head + " {")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            self.line("}")

    def text(self) -> str:
        return "\n".join(self.lines)


def _fsuffix(dt: str) -> str:
    return "" if dt == "float64" else "f"


_F_UNARY = {"abs": "fabs", "floor": "floor", "ceil": "ceil", "round": "rint", "sqrt": "sqrt",
            "exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1", "tanh": "tanh",
            "sin": "sin", "cos": "cos", "erf": "erf", "tan": "tan", "asin": "asin",
            "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
            "acosh": "acosh", "atanh": "atanh"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


class CudaScalarBuilder(ScalarBuilder):
    """Emits scalar expressions as C statements into ``code``."""

    def __init__(self, code: Code):
        super().__init__()
        self.code = code

    def emit(self, dt: str, expr: str) -> str:
        name = self.code.fresh()
        self.code.line(f"const {REG_CTYPES[dt]} {name} = {expr};")
        return name

    def _half(self, dt: str, expr: str) -> str:
        """A float16 result is rounded to float16 (see the module docstring)."""
        return self.emit(dt, f"hyb_rh({expr})" if dt == "float16" else expr)

    # -------------------------------------------------------------- primitives
    def _const(self, value, dt):
        return literal(value, dt)

    def _cast(self, v, src, dst):
        if src == dst:
            return v
        if dst == "bool":
            return self.emit(dst, f"({v} != 0)")
        if dst == "float16":
            if src == "float64":
                return self.emit(dst, f"hyb_h2f(hyb_d2h({v}))")
            return self.emit(dst, f"hyb_rh((float)({v}))")
        ct = REG_CTYPES[dst]
        if src in FLOATS and dst in ("int8", "uint8"):
            return self.emit(dst, f"({ct})(int)({v})")  # like C: through int, then wrap
        return self.emit(dst, f"({ct})({v})")

    def _unary(self, name, v, dt):
        if dt in FLOATS:
            if name == "neg":
                return self.emit(dt, f"(-{v})")
            if name == "sign":
                return self.emit(dt, f"(({v}) > 0 ? {literal(1.0, dt)} : "
                                     f"(({v}) < 0 ? {literal(-1.0, dt)} : ({v})))")
            fn = _F_UNARY.get(name)
            if fn is None:
                raise KernelIRError(f"the CUDA backend has no {name} for {dt}")
            return self._half(dt, f"{fn}{_fsuffix(dt)}({v})")
        ct = REG_CTYPES[dt]
        unsigned = dt not in SIGNED
        if name == "neg":
            w = _WRAP.get(dt)
            return self.emit(dt, f"({ct})(0u - ({w}){v})" if w else f"({ct})(-{v})")
        if name == "abs":
            if unsigned:
                return v
            neg = self._unary("neg", v, dt)
            return self.emit(dt, f"({v} < 0 ? {neg} : {v})")
        if name == "sign":
            if unsigned:
                return self.emit(dt, f"({ct})({v} != 0)")
            return self.emit(dt, f"({ct})(({v} > 0) - ({v} < 0))")
        raise KernelIRError(f"the CUDA backend has no {name} for {dt}")

    def _binary(self, name, x, y, dt):
        if dt in FLOATS:
            if name in _ARITH:
                return self._half(dt, f"({x} {_ARITH[name]} {y})")
            if name in ("max", "min"):
                return self.emit(dt, f"hyb_f{name}({x}, {y})")
            if name == "pow":
                return self._half(dt, f"pow{_fsuffix(dt)}({x}, {y})")
            if name in ("floordiv", "mod"):
                return self._half(dt, f"hyb_{name}({x}, {y})")
            if name in ("atan2", "hypot", "copysign"):
                return self._half(dt, f"{name}{_fsuffix(dt)}({x}, {y})")
            raise KernelIRError(f"the CUDA backend has no {name} for {dt}")
        ct = REG_CTYPES[dt]
        if name in ("add", "sub", "mul"):
            op = _ARITH[name]
            w = _WRAP.get(dt)
            if w:
                return self.emit(dt, f"({ct})(({w}){x} {op} ({w}){y})")
            return self.emit(dt, f"({ct})({x} {op} {y})")
        if name in ("bitxor", "bitand", "bitor", "shl", "shr"):
            op = {"bitxor": "^", "bitand": "&", "bitor": "|", "shl": "<<", "shr": ">>"}[name]
            return self.emit(dt, f"({ct})({x} {op} {y})")
        if name in ("max", "min"):
            return self.emit(dt, f"({x} {'>' if name == 'max' else '<'} {y} ? {x} : {y})")
        if name in ("floordiv", "mod", "pow"):
            if dt == "bool":
                raise KernelIRError(f"the CUDA backend has no {name} for bool")
            return self.emit(dt, f"hyb_{'ipow' if name == 'pow' else name}({x}, {y})")
        raise KernelIRError(f"the CUDA backend has no {name} for {dt}")

    def _shr(self, v, n, dt):
        return self.emit(dt, f"({REG_CTYPES[dt]})({v} >> {int(n)})")

    def _cmp(self, name, x, y, dt):
        return self.emit("bool", f"({x} {_CMP[name]} {y})")

    def _select(self, c, x, y, dt):
        return self.emit(dt, f"({c} ? {x} : {y})")

    def _logical(self, name, x, y):
        op = {"and": "&&", "or": "||", "xor": "!="}[name]
        return self.emit("bool", f"({x} {op} {y})")

    def _not(self, v):
        return self.emit("bool", f"(!{v})")
