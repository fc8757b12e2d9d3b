"""The LLVM scalar builder: the protocol of ../scalar.py emitted as LLVM IR (llvmlite.ir).

Code is emitted per element, straight-line (selects, no branches) so LLVM's loop vectorizer
turns loops over it into SIMD code. LLVM's own ``llvm.exp.f32`` and friends do not vectorize
here (they become scalar libm calls), so float32 exp, log, tanh, erf, sin and cos are
polynomial approximations written with FMA (see :class:`F32Math`; measured against float64
references by tests/test_codegen_math.py). float64 math calls libm (correctly rounded or
nearly so, as NumPy's float64 loops do); float16 computes in float32.
"""
from __future__ import annotations

import struct

from llvmlite import ir

from ..kernel import KernelIRError
from ..scalar import FLOATS, SIGNED, UNSIGNED, ScalarBuilder

F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
REG_TYPES = {"float16": F16, "float32": F32, "float64": F64, "int8": I8, "uint8": I8,
             "int32": I32, "int64": I64, "uint64": I64, "bool": I1}
MEM_TYPES = dict(REG_TYPES, bool=I8)


def reg_type(dtype: str):
    return REG_TYPES[dtype]


def mem_type(dtype: str):
    return MEM_TYPES[dtype]


def int_const(ty, value: int):
    bits = ty.width
    value = int(value) & ((1 << bits) - 1)
    if value >= 1 << (bits - 1):
        value -= 1 << bits
    return ir.Constant(ty, value)


def fconst(ty, value: float):
    return ir.Constant(ty, float(value))


def hexf(text: str) -> float:
    return float.fromhex(text)


def f32(value: float) -> float:
    """``value`` rounded to float32 (as a Python float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


# float math with no vectorizable version here: libm's scalar calls at every float width
LIBM_ONLY = frozenset(("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                       "atanh"))


# integer bit operations: one LLVM instruction each (shr depends on the sign)
_BIT_OPS = {"bitxor": "xor", "bitand": "and_", "bitor": "or_", "shl": "shl"}


class Intrinsics:
    """Declarations of intrinsics and libm functions in one module."""

    def __init__(self, module: ir.Module):
        self.module = module

    def get(self, name: str, ret, args, readnone=True):
        g = self.module.globals.get(name)
        if g is None:
            g = ir.Function(self.module, ir.FunctionType(ret, list(args)), name)
            if readnone and not name.startswith("llvm."):
                g.attributes.add("nounwind")
        return g

    def unary(self, name, ty):
        suffix = {F16: "f16", F32: "f32", F64: "f64"}[ty]
        return self.get(f"llvm.{name}.{suffix}", ty, [ty])

    def binary(self, name, ty):
        suffix = {F16: "f16", F32: "f32", F64: "f64"}[ty]
        return self.get(f"llvm.{name}.{suffix}", ty, [ty, ty])

    def fma(self, ty):
        suffix = {F16: "f16", F32: "f32", F64: "f64"}[ty]
        return self.get(f"llvm.fma.{suffix}", ty, [ty, ty, ty])

    def libm(self, name, ty):
        return self.get(name, ty, [ty])


class LLVMScalarBuilder(ScalarBuilder):
    """Emits scalar expressions at the builder's insertion point."""

    def __init__(self, irb: ir.IRBuilder, intrinsics: Intrinsics):
        super().__init__()
        self.b = irb
        self.intr = intrinsics
        self.m = F32Math(self)
        self.wide_flag = None  # an i1 alloca: float32 sin/cos take the fast path, flag misses
        self.wide_used = 0

    # -------------------------------------------------------------- primitives
    def _const(self, value, dt):
        ty = reg_type(dt)
        if dt in FLOATS:
            return fconst(ty, float(value))
        if dt == "bool":
            return ir.Constant(I1, int(bool(value)))
        return int_const(ty, int(value))

    def _cast(self, v, src, dst):
        b = self.b
        if src == dst:
            return v
        # float16 converts only to/from float32 (F16C); other pairs would need compiler-rt
        if src == "float16" and dst != "float32":
            return self._cast(b.fpext(v, F32), "float32", dst)
        if dst == "float16" and src != "float32":
            if src == "float64":
                return b.fptrunc(self._round_to_odd_f32(v), F16)
            return b.fptrunc(self._cast(v, src, "float32"), F16)
        if dst == "bool":
            if src in FLOATS:
                return b.fcmp_unordered("!=", v, fconst(v.type, 0.0))
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        tdst = reg_type(dst)
        if src == "bool":
            return b.uitofp(v, tdst) if dst in FLOATS else b.zext(v, tdst)
        if src in FLOATS and dst in FLOATS:
            wsrc, wdst = _fwidth(src), _fwidth(dst)
            return b.fpext(v, tdst) if wdst > wsrc else b.fptrunc(v, tdst)
        if dst in FLOATS:
            return b.sitofp(v, tdst) if src in SIGNED else b.uitofp(v, tdst)
        if src in FLOATS:
            if dst == "uint64":
                return b.fptoui(v, tdst)
            if tdst.width < 32:  # like C: through int, then wrap (NumPy's astype)
                return b.trunc(b.fptosi(v, I32), tdst)
            return b.fptosi(v, tdst)
        tsrc = reg_type(src)
        if tdst.width == tsrc.width:
            return v
        if tdst.width < tsrc.width:
            return b.trunc(v, tdst)
        return b.sext(v, tdst) if src in SIGNED else b.zext(v, tdst)

    def _round_to_odd_f32(self, d):
        """double -> float rounded to odd: a later float -> half rounding is then exact
        (no double rounding), as NumPy's direct double -> half conversion."""
        b = self.b
        f = b.fptrunc(d, F32)
        fabs = self.intr.unary("fabs", F64)
        up = b.fcmp_ordered(">", b.call(fabs, [b.fpext(f, F64)]), b.call(fabs, [d]))
        bits = b.bitcast(f, I32)
        bits = b.select(up, b.sub(bits, ir.Constant(I32, 1)), bits)
        ft = b.bitcast(bits, F32)
        inexact = b.fcmp_ordered("!=", b.fpext(ft, F64), d)
        bits = b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits)
        return b.bitcast(bits, F32)

    def _unary(self, name, v, dt):
        b = self.b
        if dt in FLOATS:
            ty = v.type
            if name == "neg":
                return b.fneg(v)
            if name in ("abs", "floor", "ceil", "sqrt"):
                return b.call(self.intr.unary({"abs": "fabs"}.get(name, name), ty), [v])
            if name == "round":
                return b.call(self.intr.unary("roundeven", ty), [v])
            if name == "sign":
                one, zero = fconst(ty, 1.0), fconst(ty, 0.0)
                neg = b.select(b.fcmp_ordered("<", v, zero), fconst(ty, -1.0), v)
                return b.select(b.fcmp_ordered(">", v, zero), one, neg)
            return self._float_math(name, v, dt)
        ty = v.type
        zero = ir.Constant(ty, 0)
        if name == "neg":
            return b.sub(zero, v)
        if name == "abs":
            if dt in UNSIGNED or dt == "bool":
                return v
            return b.select(b.icmp_signed("<", v, zero), b.sub(zero, v), v)
        if name == "sign":
            one = ir.Constant(ty, 1)
            if dt in UNSIGNED or dt == "bool":
                return b.select(b.icmp_unsigned("!=", v, zero), one, zero)
            neg = b.select(b.icmp_signed("<", v, zero), int_const(ty, -1), zero)
            return b.select(b.icmp_signed(">", v, zero), one, neg)
        raise KernelIRError(f"the LLVM backend has no {name} for {dt}")

    def _float_math(self, name, v, dt):
        b = self.b
        if dt == "float16":
            r = self._float_math(name, b.fpext(v, F32), "float32")
            return b.fptrunc(r, F16)
        if dt == "float32":
            if name in ("log1p", "expm1") or name in LIBM_ONLY:  # NumPy calls libm too
                return b.call(self.intr.libm(name + "f", F32), [v])
            return getattr(self.m, name)(v)
        if name in ("exp", "log", "sin", "cos"):
            return b.call(self.intr.unary(name, F64), [v])
        return b.call(self.intr.libm(name, F64), [v])  # tanh erf log1p expm1

    def _binary(self, name, x, y, dt):
        b = self.b
        if dt in FLOATS:
            if name in ("add", "sub", "mul", "div"):
                op = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[name]
                r = op(x, y)
                if self.reassoc and name in ("add", "mul"):
                    r.flags.append("reassoc")
                return r
            if name in ("max", "min"):
                return b.call(self.intr.binary({"max": "maximum", "min": "minimum"}[name],
                                               x.type), [x, y])
            if name == "pow":
                if dt == "float16":
                    return b.fptrunc(self._binary("pow", b.fpext(x, F32), b.fpext(y, F32),
                                                  "float32"), F16)
                return b.call(self.intr.binary("pow", x.type), [x, y])
            if name in ("floordiv", "mod"):
                return self._float_divmod(name, x, y)
            if name == "copysign":
                return b.call(self.intr.binary("copysign", x.type), [x, y])
            if name in ("atan2", "hypot"):  # libm: scalar calls (they do not vectorize)
                if dt == "float16":
                    return b.fptrunc(self._binary(name, b.fpext(x, F32), b.fpext(y, F32),
                                                  "float32"), F16)
                fn = name + ("f" if dt == "float32" else "")
                return b.call(self.intr.get(fn, x.type, [x.type, x.type]), [x, y])
            raise KernelIRError(f"the LLVM backend has no {name} for {dt}")
        signed = dt in SIGNED
        if name == "add":
            return b.add(x, y)
        if name == "sub":
            return b.sub(x, y)
        if name == "mul":
            return b.mul(x, y)
        if name in _BIT_OPS:
            return getattr(b, _BIT_OPS[name])(x, y)
        if name == "shr":
            return b.ashr(x, y) if signed else b.lshr(x, y)
        if name in ("max", "min"):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp(">" if name == "max" else "<", x, y), x, y)
        if name in ("floordiv", "mod"):
            return self._int_divmod(name, x, y, signed)
        if name == "pow":
            return self._int_pow(x, y, signed)
        raise KernelIRError(f"the LLVM backend has no {name} for {dt}")

    def _float_divmod(self, name, a, bb):
        """NumPy's npy_divmod / npy_floor_divide / npy_remainder for floats."""
        b = self.b
        ty = a.type
        zero = fconst(ty, 0.0)
        mod = b.frem(a, bb)
        bzero = b.fcmp_ordered("==", bb, zero)
        fixup = b.and_(b.fcmp_unordered("!=", mod, zero),
                       b.xor(b.fcmp_ordered("<", bb, zero), b.fcmp_ordered("<", mod, zero)))
        copysign = self.intr.binary("copysign", ty)
        if name == "mod":
            m2 = b.select(fixup, b.fadd(mod, bb), mod)
            m2 = b.select(b.fcmp_ordered("==", mod, zero), b.call(copysign, [zero, bb]), m2)
            return b.select(bzero, mod, m2)
        div = b.fdiv(b.fsub(a, mod), bb)
        div = b.select(fixup, b.fsub(div, fconst(ty, 1.0)), div)
        fl = b.call(self.intr.unary("floor", ty), [div])
        fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), fconst(ty, 0.5)),
                      b.fadd(fl, fconst(ty, 1.0)), fl)
        q = b.fdiv(a, bb)
        fl = b.select(b.fcmp_ordered("==", div, zero), b.call(copysign, [zero, q]), fl)
        return b.select(bzero, q, fl)

    def _int_divmod(self, name, x, y, signed):
        b = self.b
        ty = x.type
        zero, one = ir.Constant(ty, 0), ir.Constant(ty, 1)
        yzero = b.icmp_unsigned("==", y, zero)
        if not signed:
            ys = b.select(yzero, one, y)
            r = b.udiv(x, ys) if name == "floordiv" else b.urem(x, ys)
            return b.select(yzero, zero, r)
        minv = int_const(ty, -(1 << (ty.width - 1)))
        overflow = b.and_(b.icmp_unsigned("==", x, minv),
                          b.icmp_unsigned("==", y, int_const(ty, -1)))
        ys = b.select(b.or_(yzero, overflow), one, y)  # x // 1 == x: MIN // -1 wraps to MIN
        q = b.sdiv(x, ys)
        r = b.srem(x, ys)
        adjust = b.and_(b.icmp_unsigned("!=", r, zero),
                        b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", ys, zero)))
        if name == "floordiv":
            res = b.select(adjust, b.sub(q, one), q)
        else:
            res = b.select(adjust, b.add(r, ys), r)
        return b.select(yzero, zero, res)

    def _int_pow(self, x, y, signed):
        fn = int_pow_function(self.intr.module, x.type, signed)
        return self.b.call(fn, [x, y])

    def _shr(self, v, n, dt):
        c = ir.Constant(v.type, n)
        return self.b.lshr(v, c) if dt in UNSIGNED or dt == "bool" else self.b.ashr(v, c)

    def _cmp(self, name, x, y, dt):
        b = self.b
        op = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
        if dt in FLOATS:
            if name == "ne":
                return b.fcmp_unordered("!=", x, y)
            return b.fcmp_ordered(op, x, y)
        if dt in SIGNED:
            return b.icmp_signed(op, x, y)
        return b.icmp_unsigned(op, x, y)

    def _select(self, c, x, y, dt):
        return self.b.select(c, x, y)

    def _logical(self, name, x, y):
        return {"and": self.b.and_, "or": self.b.or_, "xor": self.b.xor}[name](x, y)

    def _not(self, v):
        return self.b.xor(v, ir.Constant(I1, 1))


def _fwidth(dt):
    return {"float16": 16, "float32": 32, "float64": 64}[dt]


def int_pow_function(module: ir.Module, ty, signed: bool):
    """x ** y for integers by squaring; y < 0 gives 1/x**|y| truncated (0 unless x is +-1)."""
    name = f"hybrid.ipow.{'s' if signed else 'u'}{ty.width}"
    fn = module.globals.get(name)
    if fn is not None:
        return fn
    fn = ir.Function(module, ir.FunctionType(ty, [ty, ty]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    x, y = fn.args
    entry = fn.append_basic_block("entry")
    neg = fn.append_basic_block("neg")
    loop = fn.append_basic_block("loop")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    zero, one = ir.Constant(ty, 0), ir.Constant(ty, 1)
    if signed:
        b.cbranch(b.icmp_signed("<", y, zero), neg, loop)
    else:
        b.branch(loop)
    b.position_at_end(neg)
    minus1 = int_const(ty, -1)
    odd = b.icmp_unsigned("!=", b.and_(y, one), zero)
    r_m1 = b.select(odd, minus1, one)
    r = b.select(b.icmp_unsigned("==", x, one), one,
                 b.select(b.icmp_unsigned("==", x, minus1), r_m1, zero))
    b.ret(r)
    b.position_at_end(loop)
    acc = b.phi(ty)
    base = b.phi(ty)
    e = b.phi(ty)
    acc.add_incoming(one, entry)
    base.add_incoming(x, entry)
    e.add_incoming(y, entry)
    bit = b.icmp_unsigned("!=", b.and_(e, one), zero)
    acc2 = b.select(bit, b.mul(acc, base), acc)
    base2 = b.mul(base, base)
    e2 = b.lshr(e, one)
    acc.add_incoming(acc2, loop)
    base.add_incoming(base2, loop)
    e.add_incoming(e2, loop)
    b.cbranch(b.icmp_unsigned("!=", e2, zero), loop, done)
    b.position_at_end(done)
    b.ret(acc2)
    # y == 0: the loop runs once with e = 0: bit false, acc2 = 1
    return fn


class F32Math:
    """Vectorizable float32 transcendentals (straight-line code with FMA).

    exp: SLEEF's expf_u10 scheme (Cody-Waite reduction by ln 2, degree-6 polynomial, 2^k
    applied in two halves so subnormal results are right); about 1 ulp.
    log: FreeBSD/musl logf (reduction to [sqrt(2)/2, sqrt(2)], s = f/(2+f), degree-4
    polynomial in s^2); below 1 ulp.
    tanh: x + x^3 P(x^2) (degree-5 minimax fit) for |x| < 0.625, else
    sign(x) (1 - 2 / (exp(2|x|) + 1)); about 1.5 ulp.
    erf: x + x P(x^2) (degree 6) for |x| < 1; a degree-12 polynomial in |x| - 2.5 on
    [1, 4]; 1 beyond; about 1.5 ulp.
    sin, cos: NumPy's own float32 algorithm (Cody-Waite by pi/2 in three float parts, its
    minimax polynomials), so results are bitwise NumPy's for |x| <= 71476 (117435 for sin);
    larger arguments reduce in float64 (accurate up to |x| ~ 1e15).
    """

    TANH_P = (-0.3333333432674408, 0.13333304226398468, -0.05395940691232681,
              0.02176997996866703, -0.008347033523023129, 0.0022958957124501467)
    ERF_SMALL = (0.12837916612625122, -0.3761262595653534, 0.11283597350120544,
                 -0.02685433067381382, 0.005189315415918827, -0.0008018887019716203,
                 7.882603676989675e-05)
    ERF_BIG = (0.9995930790901184, 0.00217798026278615, -0.005447072442620993,
               0.008354315534234047, -0.008612764067947865, 0.006100049242377281,
               -0.002823787974193692, 0.0005741760251112282, 0.0002920323458965868,
               -0.00028085915255360305, 5.9399309975560755e-05, 2.140381002391223e-05,
               -8.707086635695305e-06)

    def __init__(self, sb: LLVMScalarBuilder):
        self.sb = sb

    # helpers
    @property
    def b(self):
        return self.sb.b

    def c(self, v, ty=F32):
        return fconst(ty, v)

    def fma(self, x, y, z):
        return self.b.call(self.sb.intr.fma(x.type), [x, y, z])

    def call(self, name, *args):
        ty = args[0].type
        fn = self.sb.intr.unary(name, ty) if len(args) == 1 else self.sb.intr.binary(name, ty)
        return self.b.call(fn, list(args))

    def poly(self, coeffs, z):
        """coeffs[0] + z*coeffs[1] + ... by Horner with FMA."""
        ty = z.type
        acc = self.c(coeffs[-1], ty)
        for cf in reversed(coeffs[:-1]):
            acc = self.fma(acc, z, self.c(cf, ty))
        return acc

    def nan_through(self, x, r):
        return self.b.select(self.b.fcmp_unordered("uno", x, x), x, r)

    # exp
    def exp(self, x):
        b = self.b
        xc = self.call("minnum", self.call("maxnum", x, self.c(-104.0)), self.c(104.0))
        q = self.call("roundeven", b.fmul(xc, self.c(f32(1.442695040888963407359924681))))
        s = self.fma(q, self.c(-0.693145751953125), xc)
        s = self.fma(q, self.c(-1.428606765330187045e-06), s)
        u = self.poly((0.5, 0.166666671633720397949219, 0.0416664853692054748535156,
                       0.00833336077630519866943359, 0.00139304355252534151077271,
                       0.000198527617612853646278381), s)
        u = b.fadd(self.c(1.0), self.fma(b.fmul(s, s), u, s))
        qi = b.fptosi(q, I32)
        h = b.ashr(qi, ir.Constant(I32, 1))
        p1 = b.bitcast(b.shl(b.add(h, ir.Constant(I32, 127)), ir.Constant(I32, 23)), F32)
        p2 = b.bitcast(b.shl(b.add(b.sub(qi, h), ir.Constant(I32, 127)),
                             ir.Constant(I32, 23)), F32)
        return self.nan_through(x, b.fmul(b.fmul(u, p1), p2))

    # log
    def log(self, x):
        b = self.b
        sub = b.fcmp_ordered("<", x, self.c(hexf("0x1p-126")))
        xs = b.select(sub, b.fmul(x, self.c(33554432.0)), x)
        k0 = b.select(sub, ir.Constant(I32, -25), ir.Constant(I32, 0))
        ix = b.add(b.bitcast(xs, I32), ir.Constant(I32, 0x3f800000 - 0x3f3504f3))
        k = b.add(k0, b.sub(b.ashr(ix, ir.Constant(I32, 23)), ir.Constant(I32, 0x7f)))
        ix = b.add(b.and_(ix, ir.Constant(I32, 0x007fffff)), ir.Constant(I32, 0x3f3504f3))
        m = b.bitcast(ix, F32)
        f = b.fsub(m, self.c(1.0))
        s = b.fdiv(f, b.fadd(self.c(2.0), f))
        z = b.fmul(s, s)
        w = b.fmul(z, z)
        lg1, lg2 = hexf("0xaaaaaa.0p-24"), hexf("0xccce13.0p-25")
        lg3, lg4 = hexf("0x91e9ee.0p-25"), hexf("0xf89e26.0p-26")
        t1 = b.fmul(w, b.fadd(self.c(lg2), b.fmul(w, self.c(lg4))))
        t2 = b.fmul(z, b.fadd(self.c(lg1), b.fmul(w, self.c(lg3))))
        r = b.fadd(t2, t1)
        hfsq = b.fmul(b.fmul(self.c(0.5), f), f)
        dk = b.sitofp(k, F32)
        out = b.fadd(b.fmul(s, b.fadd(hfsq, r)), b.fmul(dk, self.c(9.0580006145e-06)))
        out = b.fadd(b.fsub(out, hfsq), f)
        out = b.fadd(out, b.fmul(dk, self.c(6.9313812256e-01)))
        zero = self.c(0.0)
        out = b.select(b.fcmp_ordered("==", x, self.c(float("inf"))), x, out)
        out = b.select(b.fcmp_ordered("<", x, zero), self.c(float("nan")), out)
        out = b.select(b.fcmp_ordered("==", x, zero), self.c(float("-inf")), out)
        return self.nan_through(x, out)

    # tanh
    def tanh(self, x):
        b = self.b
        a = self.call("fabs", x)
        z = b.fmul(x, x)
        small = self.fma(b.fmul(x, z), self.poly(self.TANH_P, z), x)
        e = self.exp(b.fmul(a, self.c(2.0)))
        big = b.fsub(self.c(1.0), b.fdiv(self.c(2.0), b.fadd(e, self.c(1.0))))
        r = b.select(b.fcmp_ordered("<", a, self.c(0.625)), small, big)
        return self.call("copysign", r, x)  # tanh(-0) = -0; NaN stays NaN

    # erf
    def erf(self, x):
        b = self.b
        a = self.call("fabs", x)
        small = self.fma(x, self.poly(self.ERF_SMALL, b.fmul(x, x)), x)
        t = b.fsub(self.call("minnum", a, self.c(4.0)), self.c(2.5))
        big = self.call("minnum", self.poly(self.ERF_BIG, t), self.c(1.0))
        big = self.call("copysign", big, x)
        r = b.select(b.fcmp_ordered("<", a, self.c(1.0)), small, big)
        return self.nan_through(x, r)

    # sin / cos
    def sin(self, x):
        return self._sincos(x, cos=False)

    def cos(self, x):
        return self._sincos(x, cos=True)

    def _sincos(self, x, cos):
        b = self.b
        zero = self.c(0.0)
        limit = self.c(71476.0625 if cos else 117435.992)
        a = self.call("fabs", x)
        inrange = b.fcmp_ordered("<=", a, limit)
        xr = b.select(inrange, x, zero)
        magic = self.c(hexf("0x1.8p+23"))
        # NumPy's build contracts x * (2/pi) + magic into one FMA; so do we (bitwise equal)
        q = b.fsub(self.fma(xr, self.c(hexf("0x1.45f306p-1")), magic), magic)
        r = self.fma(q, self.c(hexf("-0x1.921fb0p+00")), xr)
        r = self.fma(q, self.c(hexf("-0x1.5110b4p-22")), r)
        r = self.fma(q, self.c(hexf("-0x1.846988p-48")), r)
        r2 = b.fmul(r, r)
        cpoly = self.poly((1.0, -0.5, hexf("0x1.55553cp-05"), hexf("-0x1.6c06dcp-10"),
                           hexf("0x1.98e616p-16")), r2)
        sp = self.fma(self.poly((hexf("-0x1.555556p-03"), hexf("0x1.11119ap-07"),
                                 hexf("-0x1.a06bbap-13"), hexf("0x1.7d3bbcp-19")), r2),
                      r2, zero)
        spoly = self.fma(sp, r, r)
        iq = b.fptosi(q, I32)
        if cos:
            iq = b.add(iq, ir.Constant(I32, 1))
        use_sin = b.icmp_unsigned("==", b.and_(iq, ir.Constant(I32, 1)), ir.Constant(I32, 0))
        res = b.select(use_sin, spoly, cpoly)
        negate = b.icmp_unsigned("!=", b.and_(iq, ir.Constant(I32, 2)), ir.Constant(I32, 0))
        res = b.select(negate, b.fsub(zero, res), res)
        flag = self.sb.wide_flag
        if flag is not None:  # fast version of a versioned loop: record misses only
            outside = b.fcmp_ordered(">", a, limit)
            b.store(b.or_(b.load(flag, typ=outside.type), outside), flag)
            self.sb.wide_used += 1
        else:
            res = b.select(inrange, res, self._sincos_wide(x, cos))
        return self.nan_through(x, res)

    def _sincos_wide(self, x, cos):
        """sin/cos of |x| > 71476 (float32): exact pre-reduction modulo 2 pi, then pi/2.

        |x| >= 2^24 is an integer M * 2^E (M < 2^24); since 2^E = q * 2pi + T[E] with
        T[E] = 2^E mod 2pi tabulated in double-double, x = M * T[E] (mod 2pi) exactly enough
        (< 2^24 * 2pi). The rest reduces by pi/2 in float64 with FMA (a 3-part pi/2).
        """
        b = self.b
        a = self.call("fabs", x)
        bits = b.bitcast(a, I32)
        bexp = b.lshr(bits, ir.Constant(I32, 23))
        big = b.icmp_signed(">=", bexp, ir.Constant(I32, 151))
        e = b.sub(bexp, ir.Constant(I32, 150))
        e = b.select(b.icmp_signed(">", e, ir.Constant(I32, 104)), ir.Constant(I32, 104), e)
        e = b.zext(b.select(big, e, ir.Constant(I32, 0)), I64)
        mant = b.or_(b.and_(bits, ir.Constant(I32, 0x7FFFFF)), ir.Constant(I32, 0x800000))
        md = b.sitofp(mant, F64)
        hi_t, lo_t = _twopi_tables(self.sb.intr.module)
        th = b.load(b.gep(hi_t, [ir.Constant(I64, 0), e], inbounds=True), typ=F64)
        tl = b.load(b.gep(lo_t, [ir.Constant(I64, 0), e], inbounds=True), typ=F64)
        p = b.fmul(md, th)
        perr = self.fma(md, th, b.fneg(p))
        ad = b.fpext(a, F64)
        yh = b.select(big, p, ad)
        yl = b.select(big, b.fadd(perr, b.fmul(md, tl)), fconst(F64, 0.0))
        k = self.call("roundeven", b.fmul(yh, fconst(F64, 0.63661977236758134308)))
        nk = b.fneg(k)
        r = self.fma(nk, fconst(F64, hexf("0x1.921fb54442d18p0")), yh)
        r = self.fma(nk, fconst(F64, hexf("0x1.1a62633145c07p-54")), r)
        r = b.fadd(r, yl)
        r = self.fma(nk, fconst(F64, hexf("-0x1.f1976b7ed8fbcp-110")), r)
        z = b.fmul(r, r)
        w = b.fmul(z, z)
        s1, s2 = -0.166666666416265235595, 0.0083333293858894631756
        s3, s4 = -0.000198393348360966317347, 0.0000027183114939898219064
        rr = b.fadd(fconst(F64, s3), b.fmul(z, fconst(F64, s4)))
        s = b.fmul(z, r)
        sinr = b.fadd(b.fadd(r, b.fmul(s, b.fadd(fconst(F64, s1), b.fmul(z, fconst(F64, s2))))),
                      b.fmul(b.fmul(s, w), rr))
        c0, c1 = -0.499999997251031003120, 0.0416666233237390631894
        c2, c3 = -0.00138867637746099294692, 0.0000243904487962774090654
        rc = b.fadd(fconst(F64, c2), b.fmul(z, fconst(F64, c3)))
        cosr = b.fadd(b.fadd(b.fadd(fconst(F64, 1.0), b.fmul(z, fconst(F64, c0))),
                             b.fmul(w, fconst(F64, c1))), b.fmul(b.fmul(w, z), rc))
        ni = b.fptosi(k, I32)  # k < 2^27
        if cos:
            ni = b.add(ni, ir.Constant(I32, 1))
        use_sin = b.icmp_unsigned("==", b.and_(ni, ir.Constant(I32, 1)), ir.Constant(I32, 0))
        res = b.select(use_sin, sinr, cosr)
        negate = b.icmp_unsigned("!=", b.and_(ni, ir.Constant(I32, 2)), ir.Constant(I32, 0))
        if not cos:  # sin(-x) = -sin(x)
            negate = b.xor(negate, b.fcmp_ordered("<", x, self.c(0.0)))
        res = b.select(negate, b.fneg(res), res)
        res = b.fptrunc(res, F32)
        return b.select(b.fcmp_ordered("==", a, self.c(float("inf"))), self.c(float("nan")),
                        res)


_PI_DIGITS = ("3.14159265358979323846264338327950288419716939937510582097494459230781640628"
              "6208998628034825342117067982148086513282306647093844609550582231725359408128")


def _twopi_tables(module):
    """Globals hi[E], lo[E] (E = 0..104): 2^E mod 2pi as a double-double."""
    g = module.globals.get("hybrid.twopi_mod_hi")
    if g is not None:
        return g, module.globals["hybrid.twopi_mod_lo"]
    from fractions import Fraction  # noqa: PLC0415
    two_pi = 2 * Fraction(_PI_DIGITS)
    his, los = [], []
    for e in range(105):
        t = Fraction(2 ** e)
        t -= (t // two_pi) * two_pi
        hi = float(t)
        his.append(hi)
        los.append(float(t - Fraction(hi)))
    out = []
    for name, vals in (("hybrid.twopi_mod_hi", his), ("hybrid.twopi_mod_lo", los)):
        ty = ir.ArrayType(F64, len(vals))
        gv = ir.GlobalVariable(module, ty, name)
        gv.initializer = ir.Constant(ty, [fconst(F64, v) for v in vals])
        gv.global_constant = True
        gv.linkage = "internal"
        out.append(gv)
    return out
