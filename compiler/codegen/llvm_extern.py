"""Extern kernels on the LLVM backend: matmul (BLAS), convolution, pooling, gather/scatter.

Semantics are those of the registry's eager impls (compiler/ops/nn.py, movement.py,
linalg.py, reduce.py); tests compare the two.

Convolution: im2col + GEMM, one image (and group) at a time, into scratch arena space: the
columns of one image stay in L2 (LeNet's second layer: 150 x 100 floats) and each image is
one ``sgemm`` W (O x CKK) @ cols (CKK x OH*OW) writing NCHW output directly. Padding goes
through a zero-bordered copy of the image so the im2col loops have no bounds checks; 1x1
stride-1 convolutions skip im2col. Exception: a forward convolution with a tiny reduction
and few filters (C*KH*KW <= 32, O <= 16: LeNet's first layer, 1x5x5 -> 6) runs as direct
loops (a loop kernel over a padded copy, vectorized and split across threads), because
256 calls of a 6 x 25 @ 25 x 784 sgemm are mostly call and packing overhead.
Measured side by side at batch 256, float32, on this 2-core machine (two runs; it is shared,
so absolute times wander):

    layer                                   direct loops    im2col + sgemm
    LeNet conv1 1x28x28 -> 6@5x5 pad 2      2.5 / 3.8 ms    4.0 / 8.6 ms
    LeNet conv2 6x14x14 -> 16@5x5           6.7 / 11.8 ms   3.9 / 3.1 ms
    ResNet 3x3, 32x64x28x28 -> 64, pad 1    83 / 90 ms      76 / 45 ms

(the eager NumPy impl: 23-44, 18-25 and 143-215 ms). Gradients always use im2col + GEMM:
dX = col2im(W^T @ g) per image, dW = sum over images of g @ cols^T (GEMMs accumulating
with beta = 1).

float32/float64 GEMMs call OpenBLAS (runtime/blas.py); other dtypes use loop GEMMs.
"""
from __future__ import annotations

import math

from llvmlite import ir

from ..ops.nn import conv_out_size
from .kernel import ALIGN, ExternKernel, KernelIRError, matmul_operand_shapes
from .llvm import for_range, kernel_function
from .llvm_scalar import F32, F64, I32, I64, PTR, LLVMScalarBuilder, mem_type, reg_type
from .scalar import FLOATS, Typed

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int,)) else tuple(int(a) for a in v)


def _align(n):
    return -(-n // ALIGN) * ALIGN


# ---------------------------------------------------------------------- scratch
def conv_geometry(x_shape, w_shape, attrs):
    n, c, h, wd = x_shape
    o, cg, kh, kw = w_shape
    stride, pad, dil = (_pair(attrs.get("stride", 1)), _pair(attrs.get("pad", 0)),
                        _pair(attrs.get("dilation", 1)))
    groups = int(attrs.get("groups", 1))
    oh = conv_out_size(h, kh, stride[0], pad[0], dil[0])
    ow = conv_out_size(wd, kw, stride[1], pad[1], dil[1])
    return dict(n=n, c=c, h=h, w=wd, o=o, cg=cg, kh=kh, kw=kw, stride=stride, pad=pad,
                dil=dil, groups=groups, oh=oh, ow=ow, og=o // groups,
                hp=h + 2 * pad[0], wp=wd + 2 * pad[1])


def _direct_1x1(g):
    return (g["kh"], g["kw"]) == (1, 1) and g["stride"] == (1, 1) and g["pad"] == (0, 0)


def _conv_scratch(g, itemsize):
    cols = 0 if _direct_1x1(g) else g["cg"] * g["kh"] * g["kw"] * g["oh"] * g["ow"] * itemsize
    padded = g["c"] * g["hp"] * g["wp"] * itemsize if g["pad"] != (0, 0) else 0
    return _align(cols), padded


def scratch_bytes(op, attrs, in_specs, out_specs) -> int:
    import numpy as np  # noqa: PLC0415
    if op == "conv2d":
        g = conv_geometry(in_specs[0].shape, in_specs[1].shape, attrs)
        size = np.dtype(in_specs[0].dtype).itemsize
        if _use_direct(g):
            return g["n"] * g["c"] * g["hp"] * g["wp"] * size if g["pad"] != (0, 0) else 0
        cols, padded = _conv_scratch(g, size)
        return cols + padded
    if op == "conv2d_grad_data":
        g = conv_geometry(out_specs[0].shape, in_specs[1].shape, attrs)
        size = np.dtype(in_specs[0].dtype).itemsize
        cols = _align(g["cg"] * g["kh"] * g["kw"] * g["oh"] * g["ow"] * size)
        padded = g["c"] * g["hp"] * g["wp"] * size if g["pad"] != (0, 0) else 0
        return cols + padded
    if op == "conv2d_grad_weight":
        g = conv_geometry(in_specs[0].shape, out_specs[0].shape, attrs)
        cols, padded = _conv_scratch(g, np.dtype(in_specs[0].dtype).itemsize)
        return cols + padded
    return 0


# ------------------------------------------------------------------- emission aid
class EB:
    """Emission helpers for one extern kernel function."""

    def __init__(self, mb, fn, program, groups):
        self.mb = mb
        self.fn = fn
        self.program = program
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.sb = LLVMScalarBuilder(self.b, mb.intr)
        self.base = {}
        for arg, grp in zip(fn.args, groups):
            for s in grp.slots:
                self.base[s] = arg

    @staticmethod
    def c(v):
        return ir.Constant(I64, int(v))

    def i64(self, v):
        return v if isinstance(v, ir.Value) else self.c(v)

    def add(self, *xs):
        acc = self.i64(xs[0])
        for x in xs[1:]:
            if isinstance(x, int) and x == 0:
                continue
            acc = self.b.add(acc, self.i64(x))
        return acc

    def mul(self, x, k):
        if isinstance(k, int) and k == 1:
            return self.i64(x)
        return self.b.mul(self.i64(x), self.i64(k))

    def gep(self, ptr, dtype, off):
        return self.b.gep(ptr, [self.i64(off)], inbounds=True, source_etype=mem_type(dtype))

    def slot_ptr(self, slot, off=0):
        return self.gep(self.base[slot], self.program.slots[slot].dtype, off)

    def scratch(self, slot, byte_off):
        return self.b.gep(self.base[slot], [self.c(byte_off)], inbounds=True,
                          source_etype=ir.IntType(8))

    def load(self, ptr, dtype):
        v = self.b.load(ptr, typ=mem_type(dtype), align=_isize(dtype))
        if dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        return Typed(v, dtype)

    def store(self, ptr, v: Typed, dtype):
        v = self.sb.typed(v, dtype).v
        if dtype == "bool":
            v = self.b.zext(v, mem_type("bool"))
        self.b.store(v, ptr, align=_isize(dtype))

    def fill(self, ptr, dtype, n, value):
        if n <= 0:
            return
        v = self.sb.const(value, dtype)
        with for_range(self.b, n) as i:
            self.store(self.gep(ptr, dtype, i), v, dtype)

    def copy_nest(self, extents, dst, dst_dt, dst_strides, src, src_dt, src_strides,
                  accumulate=False):
        """dst[sum i*ds] (+)= src[sum i*ss] over a loop nest (innermost last)."""
        if any(n == 0 for n in extents):
            return
        b = self.b

        def nest(d, doff, soff):
            if d == len(extents):
                v = self.load(self.gep(src, src_dt, soff), src_dt)
                p = self.gep(dst, dst_dt, doff)
                if accumulate:  # NumPy adds booleans as a logical or (True + True is True)
                    acc = self.sb.logical_or if dst_dt == "bool" else self.sb.add
                    v = acc(self.load(p, dst_dt), self.sb.typed(v, dst_dt))
                self.store(p, v, dst_dt)
                return
            with for_range(b, extents[d]) as i:
                nest(d + 1, self.add(doff, self.mul(i, dst_strides[d])),
                     self.add(soff, self.mul(i, src_strides[d])))
        nest(0, self.c(0), self.c(0))

    def clamp(self, v, lo, hi):
        b = self.b
        v = b.select(b.icmp_signed("<", v, self.i64(lo)), self.i64(lo), v)
        return b.select(b.icmp_signed(">", v, self.i64(hi)), self.i64(hi), v)

    def smax(self, x, y):
        x, y = self.i64(x), self.i64(y)
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def smin(self, x, y):
        x, y = self.i64(x), self.i64(y)
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    # -- GEMM --------------------------------------------------------------------
    def gemm(self, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate=False,
             a_dt=None, b_dt=None):
        """C (m x n, row stride ldc) (+)= op(A) @ op(B); op = transpose when ta/tb."""
        a_dt, b_dt = a_dt or dt, b_dt or dt
        if m == 0 or n == 0:
            return
        if k == 0:
            if not accumulate:
                with for_range(self.b, m) as i:
                    self.fill(self.gep(cp, dt, self.mul(i, ldc)), dt, n, 0)
            return
        if dt in ("float32", "float64") and a_dt == dt and b_dt == dt:
            self._blas_gemm(dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate)
        else:
            self._loop_gemm(dt, a_dt, b_dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc,
                            accumulate)

    def _blas_gemm(self, dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc, accumulate):
        self.mb.uses_blas = True
        fty = F32 if dt == "float32" else F64
        p = "s" if dt == "float32" else "d"
        i32 = lambda v: ir.Constant(I32, int(v))  # noqa: E731
        beta = ir.Constant(fty, 1.0 if accumulate else 0.0)
        one = ir.Constant(fty, 1.0)
        if m == 1 and ldc >= 1:  # row vector: y(n) = op(B)^T x
            gemv = self.mb.intr.get(f"hybrid_cblas_{p}gemv", ir.VoidType(),
                                    [I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty, PTR,
                                     I32], readnone=False)
            incx = lda if ta else 1
            if tb:  # B stored (n, k): y = B x
                args = [CBLAS_NO_TRANS, n, k]
            else:  # B stored (k, n): y = B^T x
                args = [CBLAS_TRANS, k, n]
            self.b.call(gemv, [i32(CBLAS_ROW_MAJOR), i32(args[0]), i32(args[1]), i32(args[2]),
                               one, bp, i32(ldb), a, i32(incx), beta, cp, i32(1)])
            return
        if n == 1:  # column vector: y(m) = op(A) x
            gemv = self.mb.intr.get(f"hybrid_cblas_{p}gemv", ir.VoidType(),
                                    [I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty, PTR,
                                     I32], readnone=False)
            incx = 1 if tb else ldb
            args = [CBLAS_TRANS, k, m] if ta else [CBLAS_NO_TRANS, m, k]
            self.b.call(gemv, [i32(CBLAS_ROW_MAJOR), i32(args[0]), i32(args[1]), i32(args[2]),
                               one, a, i32(lda), bp, i32(incx), beta, cp, i32(ldc)])
            return
        gemm = self.mb.intr.get(f"hybrid_cblas_{p}gemm", ir.VoidType(),
                                [I32, I32, I32, I32, I32, I32, fty, PTR, I32, PTR, I32, fty,
                                 PTR, I32], readnone=False)
        self.b.call(gemm, [i32(CBLAS_ROW_MAJOR), i32(CBLAS_TRANS if ta else CBLAS_NO_TRANS),
                           i32(CBLAS_TRANS if tb else CBLAS_NO_TRANS), i32(m), i32(n), i32(k),
                           one, a, i32(lda), bp, i32(ldb), beta, cp, i32(ldc)])

    def _loop_gemm(self, dt, a_dt, b_dt, ta, tb, m, n, k, a, lda, bp, ldb, cp, ldc,
                   accumulate):
        b, sb = self.b, self.sb
        with for_range(b, m) as i:
            crow = self.gep(cp, dt, self.mul(i, ldc))
            if not accumulate:
                self.fill(crow, dt, n, 0)
            with for_range(b, k) as kk:
                aoff = self.add(self.mul(kk, lda), i) if ta else self.add(self.mul(i, lda), kk)
                av = sb.typed(self.load(self.gep(a, a_dt, aoff), a_dt), dt)
                with for_range(b, n) as j:
                    boff = self.add(self.mul(j, ldb), kk) if tb else \
                        self.add(self.mul(kk, ldb), j)
                    bv = sb.typed(self.load(self.gep(bp, b_dt, boff), b_dt), dt)
                    pc = self.gep(crow, dt, j)
                    self.store(pc, sb.add(self.load(pc, dt), sb.mul(av, bv)), dt)


def _isize(dtype):
    return {"float16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
            "int64": 8, "uint64": 8, "bool": 1}[dtype]


def _strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return list(reversed(out))


# -------------------------------------------------------------------------- entry
def emit_extern(mb, step: ExternKernel, fname: str, groups) -> ir.Function:
    fn = kernel_function(mb, fname, groups)
    eb = EB(mb, fn, mb.program, groups)
    emit = _EMITTERS.get(step.op)
    if emit is None:
        raise KernelIRError(f"the LLVM backend has no extern kernel for {step.op!r}")
    emit(eb, step, step.attr_dict)
    eb.b.ret_void()
    return fn


def _slot(eb, s):
    return eb.program.slots[s]


# ------------------------------------------------------------------------- matmul
def _matmul(eb: EB, step, attrs):
    sa, sbb = step.in_slots
    so = step.out_slots[0]
    A, B, C = _slot(eb, sa), _slot(eb, sbb), _slot(eb, so)
    ashape, bshape = matmul_operand_shapes([A.shape, B.shape], attrs)
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    m, k = ashape[-2], ashape[-1]
    n = bshape[-1]
    lda = A.shape[-1]
    ldb = B.shape[-1]
    batch = tuple(C.shape[:-2])
    nb = len(batch)

    def bstrides(shape):  # element strides of a batch index into an operand (0: broadcast)
        own = list(shape[:-2])
        mat = shape[-2] * shape[-1]
        st = _strides(own) if own else []
        st = [s * mat for s in st]
        st = [0 if own[i] == 1 else st[i] for i in range(len(own))]
        return [0] * (nb - len(own)) + st
    sa_st, sb_st = bstrides(A.shape), bstrides(B.shape)
    sc_st = [s * m * n for s in _strides(batch)] if batch else []
    if math.prod(batch) == 0:
        return

    def body(aoff, boff, coff):
        eb.gemm(C.dtype, ta, tb, m, n, k, eb.slot_ptr(sa, aoff), lda, eb.slot_ptr(sbb, boff),
                ldb, eb.slot_ptr(so, coff), n, a_dt=A.dtype, b_dt=B.dtype)

    def nest(d, aoff, boff, coff):
        if d == nb:
            body(aoff, boff, coff)
            return
        with for_range(eb.b, batch[d]) as i:
            nest(d + 1, eb.add(aoff, eb.mul(i, sa_st[d])), eb.add(boff, eb.mul(i, sb_st[d])),
                 eb.add(coff, eb.mul(i, sc_st[d])))
    nest(0, eb.c(0), eb.c(0), eb.c(0))


# ---------------------------------------------------------------------- convolution
def _im2col(eb, g, src, dt, src_dims, cols):
    """cols[(c, kh, kw), (oh, ow)] = src[c, oh*s + kh*d, ow*s + kw*d] for one image/group.

    src_dims: (rows, cols) of the (padded) image planes src points into."""
    hs, ws = src_dims
    sh, sw = g["stride"]
    dh, dw = g["dil"]
    ext = [g["cg"], g["kh"], g["kw"], g["oh"], g["ow"]]
    src_st = [hs * ws, dh * ws, dw, sh * ws, sw]
    dst_st = _strides(ext)
    eb.copy_nest(ext, cols, dt, dst_st, src, dt, src_st)


def _col2im(eb, g, cols, dt, dst, dst_dims):
    """dst[c, oh*s + kh*d, ow*s + kw*d] += cols[(c, kh, kw), (oh, ow)]."""
    hs, ws = dst_dims
    sh, sw = g["stride"]
    dh, dw = g["dil"]
    ext = [g["cg"], g["kh"], g["kw"], g["oh"], g["ow"]]
    eb.copy_nest(ext, dst, dt, [hs * ws, dh * ws, dw, sh * ws, sw], cols, dt, _strides(ext),
                 accumulate=True)


def _padded_source(eb, g, step, x_slot, dt, n_index):
    """Pointer to image n's planes, zero-bordered in scratch when the conv pads."""
    plane = g["h"] * g["w"]
    img = eb.slot_ptr(x_slot, eb.mul(n_index, g["c"] * plane))
    if g["pad"] == (0, 0):
        return img, (g["h"], g["w"])
    cols_bytes, _ = _conv_scratch(g, _isize(dt))
    xp = eb.scratch(step.scratch, cols_bytes)
    ph, pw = g["pad"]
    inner = eb.gep(xp, dt, ph * g["wp"] + pw)
    eb.copy_nest([g["c"], g["h"], g["w"]], inner, dt, [g["hp"] * g["wp"], g["wp"], 1],
                 img, dt, [plane, g["w"], 1])
    return xp, (g["hp"], g["wp"])


def _zero_border(eb, g, step, dt):
    if g["pad"] == (0, 0):
        return
    cols_bytes, _ = _conv_scratch(g, _isize(dt))
    eb.fill(eb.scratch(step.scratch, cols_bytes), dt, g["c"] * g["hp"] * g["wp"], 0)


def _use_direct(g) -> bool:
    """Direct loops for convolutions with a tiny reduction and few filters (LeNet's first
    layer: C*KH*KW = 25, O = 6), where per-image sgemm calls of 6 x 25 @ 25 x 784 are all
    overhead; im2col + GEMM otherwise (see the module docstring for measurements)."""
    return g["groups"] == 1 and g["cg"] * g["kh"] * g["kw"] <= 32 and g["o"] <= 16 and \
        not _direct_1x1(g)


def _conv2d_direct(eb: EB, step, g, dt):
    """out[n, o, oh, ow] = sum_{c,kh,kw} xpad[n, c, oh*s + kh*d, ow*s + kw*d] w[o, c, kh, kw]
    as a loop kernel (vectorized, split across threads) over a zero-padded copy of x."""
    from .kernel import Access, Load, LoopKernel, Output, Slot, call  # noqa: PLC0415
    from .llvm import LoopEmitter, param_groups  # noqa: PLC0415
    import dataclasses  # noqa: PLC0415
    sx, sw_ = step.in_slots
    so = step.out_slots[0]
    prog = eb.program
    n, c, o = g["n"], g["c"], g["o"]
    hp, wp = (g["hp"], g["wp"]) if g["pad"] != (0, 0) else (g["h"], g["w"])
    src = sx
    if g["pad"] != (0, 0):
        sc = prog.slots[step.scratch]
        prog = dataclasses.replace(prog, slots=prog.slots + (
            Slot(dt, (n * c * hp * wp,), "scratch", sc.offset, "xpad"),))
        src = len(prog.slots) - 1
        xpad = eb.scratch(step.scratch, 0)
        eb.fill(xpad, dt, n * c * hp * wp, 0)
        ph, pw = g["pad"]
        eb.copy_nest([n * c, g["h"], g["w"]], eb.gep(xpad, dt, ph * wp + pw), dt,
                     [hp * wp, wp, 1], eb.slot_ptr(sx), dt, [g["h"] * g["w"], g["w"], 1])
    (sh, sw), (dh, dw) = g["stride"], g["dil"]
    kh, kw, oh, ow = g["kh"], g["kw"], g["oh"], g["ow"]
    loop = (n, o, oh, ow, c, kh, kw)
    kernel = LoopKernel(loop, (
        Access(src, (c * hp * wp, 0, sh * wp, sw, hp * wp, dh * wp, dw)),
        Access(sw_, (0, c * kh * kw, 0, 0, kh * kw, kw, 1))),
        (Output(Access(so, (o * oh * ow, oh * ow, ow, 1, 0, 0, 0)),
                call("mul", Load(0), Load(1), dtype=dt), "sum"),), "conv2d_direct")
    groups = param_groups(prog, [src, sw_, so])
    fn = LoopEmitter(eb.mb, kernel, eb.fn.name + ".direct", groups, prog).emit()
    ptrs = []
    for grp in groups:
        s0 = grp.slots[0]
        ptrs.append(eb.scratch(step.scratch, 0) if s0 == src and src != sx else eb.base[s0])
    eb.b.call(fn, ptrs)


def _conv2d(eb: EB, step, attrs):
    sx, sw_ = step.in_slots
    so = step.out_slots[0]
    X, W = _slot(eb, sx), _slot(eb, sw_)
    dt = X.dtype
    g = conv_geometry(X.shape, W.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    if g["n"] == 0 or g["o"] == 0 or ohw == 0:
        return
    if _use_direct(g):
        _conv2d_direct(eb, step, g, dt)
        return
    _zero_border(eb, g, step, dt)
    with for_range(eb.b, g["n"]) as n:
        src, dims = _padded_source(eb, g, step, sx, dt, n)
        for gi in range(g["groups"]):
            plane = dims[0] * dims[1]
            gsrc = eb.gep(src, dt, gi * g["cg"] * plane)
            if _direct_1x1(g):
                cols = gsrc
            else:
                cols = eb.scratch(step.scratch, 0)
                _im2col(eb, g, gsrc, dt, dims, cols)
            out = eb.slot_ptr(so, eb.add(eb.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            wg = eb.slot_ptr(sw_, gi * g["og"] * ckk)
            eb.gemm(dt, False, False, g["og"], ohw, ckk, wg, ckk, cols, ohw, out, ohw)


def _conv2d_grad_data(eb: EB, step, attrs):
    sg, sw_ = step.in_slots
    so = step.out_slots[0]
    G, W, DX = _slot(eb, sg), _slot(eb, sw_), _slot(eb, so)
    dt = G.dtype
    g = conv_geometry(DX.shape, W.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    plane = g["h"] * g["w"]
    if g["n"] == 0 or g["c"] == 0 or plane == 0:
        return
    padded = g["pad"] != (0, 0)
    cols = eb.scratch(step.scratch, 0)
    cols_bytes = _align(ckk * ohw * _isize(dt))
    with for_range(eb.b, g["n"]) as n:
        img = eb.slot_ptr(so, eb.mul(n, g["c"] * plane))
        if padded:
            dst = eb.scratch(step.scratch, cols_bytes)
            dims = (g["hp"], g["wp"])
        else:
            dst, dims = img, (g["h"], g["w"])
        eb.fill(dst, dt, g["c"] * dims[0] * dims[1], 0)
        for gi in range(g["groups"]):
            gin = eb.slot_ptr(sg, eb.add(eb.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            wg = eb.slot_ptr(sw_, gi * g["og"] * ckk)
            # dcols (CKK x OHW) = W_g^T (CKK x og) @ g_n (og x OHW)
            eb.gemm(dt, True, False, ckk, ohw, g["og"], wg, ckk, gin, ohw, cols, ohw)
            _col2im(eb, g, cols, dt, eb.gep(dst, dt, gi * g["cg"] * dims[0] * dims[1]), dims)
        if padded:
            ph, pw = g["pad"]
            eb.copy_nest([g["c"], g["h"], g["w"]], img, dt, [plane, g["w"], 1],
                         eb.gep(dst, dt, ph * g["wp"] + pw), dt,
                         [g["hp"] * g["wp"], g["wp"], 1])


def _conv2d_grad_weight(eb: EB, step, attrs):
    sx, sg = step.in_slots
    so = step.out_slots[0]
    X, DW = _slot(eb, sx), _slot(eb, so)
    dt = X.dtype
    g = conv_geometry(X.shape, DW.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    eb.fill(eb.slot_ptr(so), dt, DW.size, 0)
    if g["n"] == 0 or ohw == 0 or DW.size == 0:
        return
    _zero_border(eb, g, step, dt)
    with for_range(eb.b, g["n"]) as n:
        src, dims = _padded_source(eb, g, step, sx, dt, n)
        for gi in range(g["groups"]):
            plane = dims[0] * dims[1]
            gsrc = eb.gep(src, dt, gi * g["cg"] * plane)
            if _direct_1x1(g):
                cols = gsrc
            else:
                cols = eb.scratch(step.scratch, 0)
                _im2col(eb, g, gsrc, dt, dims, cols)
            gin = eb.slot_ptr(sg, eb.add(eb.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            dw = eb.slot_ptr(so, gi * g["og"] * ckk)
            # dW_g (og x CKK) += g_n (og x OHW) @ cols^T (OHW x CKK)
            eb.gemm(dt, False, True, g["og"], ckk, ohw, gin, ohw, cols, ohw, dw, ckk,
                    accumulate=True)


# -------------------------------------------------------------------------- pooling
def _pool_geometry(x_shape, attrs):
    n, c, h, w = x_shape
    if attrs.get("global_pool"):
        k, s, p = (h, w), (1, 1), (0, 0)
    else:
        k = _pair(attrs.get("kernel", 2))
        st = attrs.get("stride")
        s = k if st is None else _pair(st)
        p = _pair(attrs.get("pad", 0))
    oh = conv_out_size(h, k[0], s[0], p[0], 1)
    ow = conv_out_size(w, k[1], s[1], p[1], 1)
    return dict(nc=n * c, h=h, w=w, k=k, s=s, p=p, oh=oh, ow=ow,
                kind=attrs.get("pool_type", "max"),
                include_pad=bool(attrs.get("count_include_pad", True)))


def _window(eb, g, oh, ow):
    """(ih0, iw0, kh range, kw range) of output position (oh, ow), ranges clipped to x."""
    ih0 = eb.add(eb.mul(oh, g["s"][0]), -g["p"][0])
    iw0 = eb.add(eb.mul(ow, g["s"][1]), -g["p"][1])
    b = eb.b
    kh_lo = eb.smax(b.sub(eb.c(0), ih0), 0)
    kh_hi = eb.smin(b.sub(eb.c(g["h"]), ih0), g["k"][0])
    kw_lo = eb.smax(b.sub(eb.c(0), iw0), 0)
    kw_hi = eb.smin(b.sub(eb.c(g["w"]), iw0), g["k"][1])
    return ih0, iw0, (kh_lo, kh_hi), (kw_lo, kw_hi)


def _count(eb, g, dt, khr, kwr):
    if g["include_pad"] or g["p"] == (0, 0):
        return eb.sb.const(float(g["k"][0] * g["k"][1]), dt)
    b = eb.b
    cnt = b.mul(eb.smax(b.sub(khr[1], khr[0]), 0), eb.smax(b.sub(kwr[1], kwr[0]), 0))
    return eb.sb.typed(Typed(b.sitofp(cnt, F32), "float32"), dt)


def _pool2d(eb: EB, step, attrs):
    sx, so = step.in_slots[0], step.out_slots[0]
    X = _slot(eb, sx)
    dt = X.dtype
    g = _pool_geometry(X.shape, attrs)
    if g["nc"] * g["oh"] * g["ow"] == 0:
        return
    b, sb = eb.b, eb.sb
    acc = b.alloca(reg_type(dt))
    with for_range(b, g["nc"]) as p:
        xplane = eb.slot_ptr(sx, eb.mul(p, g["h"] * g["w"]))
        oplane = eb.slot_ptr(so, eb.mul(p, g["oh"] * g["ow"]))
        with for_range(b, g["oh"]) as oh:
            with for_range(b, g["ow"]) as ow:
                ih0, iw0, khr, kwr = _window(eb, g, oh, ow)
                init = "-inf" if g["kind"] == "max" else 0.0
                b.store(sb.const(init, dt).v, acc)
                with for_range(b, khr[1], start=khr[0]) as kh:
                    row = eb.add(eb.mul(eb.add(ih0, kh), g["w"]), iw0)
                    with for_range(b, kwr[1], start=kwr[0]) as kw:
                        v = eb.load(eb.gep(xplane, dt, eb.add(row, kw)), dt)
                        a = Typed(b.load(acc, typ=reg_type(dt)), dt)
                        r = sb.max(a, v) if g["kind"] == "max" else sb.add(a, v)
                        b.store(sb.typed(r, dt).v, acc)
                res = Typed(b.load(acc, typ=reg_type(dt)), dt)
                if g["kind"] == "avg":
                    res = sb.div(res, _count(eb, g, dt, khr, kwr))
                eb.store(eb.gep(oplane, dt, eb.add(eb.mul(oh, g["ow"]), ow)), res, dt)


def _pool2d_grad(eb: EB, step, attrs):
    sg, sx, sout = step.in_slots
    so = step.out_slots[0]
    X = _slot(eb, sx)
    dt = X.dtype
    g = _pool_geometry(X.shape, attrs)
    b, sb = eb.b, eb.sb
    eb.fill(eb.slot_ptr(so), dt, _slot(eb, so).size, 0)
    if g["nc"] * g["oh"] * g["ow"] == 0:
        return
    taken = b.alloca(ir.IntType(1))
    with for_range(b, g["nc"]) as p:
        xplane = eb.slot_ptr(sx, eb.mul(p, g["h"] * g["w"]))
        dplane = eb.slot_ptr(so, eb.mul(p, g["h"] * g["w"]))
        gplane = eb.slot_ptr(sg, eb.mul(p, g["oh"] * g["ow"]))
        oplane = eb.slot_ptr(sout, eb.mul(p, g["oh"] * g["ow"]))
        with for_range(b, g["oh"]) as oh:
            with for_range(b, g["ow"]) as ow:
                o_off = eb.add(eb.mul(oh, g["ow"]), ow)
                gv = eb.load(eb.gep(gplane, dt, o_off), dt)
                ih0, iw0, khr, kwr = _window(eb, g, oh, ow)
                if g["kind"] == "avg":
                    share = sb.div(gv, _count(eb, g, dt, khr, kwr))
                    with for_range(b, khr[1], start=khr[0]) as kh:
                        row = eb.add(eb.mul(eb.add(ih0, kh), g["w"]), iw0)
                        with for_range(b, kwr[1], start=kwr[0]) as kw:
                            pd = eb.gep(dplane, dt, eb.add(row, kw))
                            eb.store(pd, sb.add(eb.load(pd, dt), share), dt)
                else:
                    _max_grad_window(eb, g, dt, taken, xplane, dplane, oplane, o_off, gv,
                                     ih0, iw0)


def _max_grad_window(eb, g, dt, taken, xplane, dplane, oplane, o_off, gv, ih0, iw0):
    """Max pooling's gradient for one window: the first maximum (in the padded window, as
    the eager impl scans it) takes all of g."""
    b, sb = eb.b, eb.sb
    ov = eb.load(eb.gep(oplane, dt, o_off), dt)
    b.store(ir.Constant(ir.IntType(1), 0), taken)
    with for_range(b, g["k"][0]) as kh:
        ih = eb.add(ih0, kh)
        vh = b.and_(b.icmp_signed(">=", ih, eb.c(0)),
                    b.icmp_signed("<", ih, eb.c(g["h"])))
        with for_range(b, g["k"][1]) as kw:
            iw = eb.add(iw0, kw)
            valid = b.and_(vh, b.and_(b.icmp_signed(">=", iw, eb.c(0)),
                                      b.icmp_signed("<", iw, eb.c(g["w"]))))
            off = eb.add(eb.mul(eb.clamp(ih, 0, g["h"] - 1), g["w"]),
                         eb.clamp(iw, 0, g["w"] - 1))
            xv = eb.load(eb.gep(xplane, dt, off), dt)
            xv = sb.select(Typed(valid, "bool"), xv, sb.const("-inf", dt))
            t = b.load(taken, typ=ir.IntType(1))
            hit = b.and_(sb.cmp("eq", xv, ov).v, b.xor(t, ir.Constant(t.type, 1)))
            b.store(b.or_(t, hit), taken)
            pd = eb.gep(dplane, dt, off)
            add = sb.select(Typed(b.and_(hit, valid), "bool"), gv,
                            sb.const(0.0, dt))
            eb.store(pd, sb.add(eb.load(pd, dt), add), dt)


# --------------------------------------------------------------- gather / scatter
def _axis(axis, ndim):
    return int(axis) % ndim if ndim else 0


def _index_of(eb, idx_ptr, idx_dt, j, dim, mode):
    v = eb.sb.typed(eb.load(eb.gep(idx_ptr, idx_dt, j), idx_dt), "int64")
    if mode == "wrap":
        return eb.sb.mod(v, eb.sb.const(dim, "int64")).v
    return eb.clamp(v.v, 0, dim - 1)


def _take(eb: EB, step, attrs):
    sx, si = step.in_slots
    so = step.out_slots[0]
    X, IDX = _slot(eb, sx), _slot(eb, si)
    mode = attrs.get("mode", "clip")
    if mode not in ("clip", "wrap"):
        raise KernelIRError("take: mode='raise' cannot raise inside compiled code; use "
                            "mode='clip' or 'wrap' (or run it eagerly)")
    ax = _axis(attrs.get("axis", 0), len(X.shape))
    lead = math.prod(X.shape[:ax])
    dim = X.shape[ax]
    rest = math.prod(X.shape[ax + 1:])
    nj = IDX.size
    if lead * nj * rest == 0:
        return
    if dim == 0:
        raise KernelIRError("take: cannot take from an empty axis")
    b = eb.b
    with for_range(b, lead) as l_:
        with for_range(b, nj) as j:
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, j, dim, mode)
            src = eb.slot_ptr(sx, eb.mul(eb.add(eb.mul(l_, dim), i), rest))
            dst = eb.slot_ptr(so, eb.mul(eb.add(eb.mul(l_, nj), j), rest))
            eb.copy_nest([rest], dst, X.dtype, [1], src, X.dtype, [1])


def _take_grad(eb: EB, step, attrs):
    sg, si = step.in_slots
    so = step.out_slots[0]
    G, IDX, OUT = _slot(eb, sg), _slot(eb, si), _slot(eb, so)
    mode = attrs.get("mode", "clip")
    ax = int(attrs["axis"])
    dim = int(attrs["dim"])
    lead = math.prod(OUT.shape[:ax])
    rest = math.prod(OUT.shape[ax + 1:])
    nj = IDX.size
    eb.fill(eb.slot_ptr(so), OUT.dtype, OUT.size, 0)
    if lead * nj * rest * dim == 0:
        return
    b = eb.b
    with for_range(b, lead) as l_:
        with for_range(b, nj) as j:
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, j, dim, mode)
            dst = eb.slot_ptr(so, eb.mul(eb.add(eb.mul(l_, dim), i), rest))
            src = eb.slot_ptr(sg, eb.mul(eb.add(eb.mul(l_, nj), j), rest))
            eb.copy_nest([rest], dst, OUT.dtype, [1], src, G.dtype, [1], accumulate=True)


def _pick(eb: EB, step, attrs):
    sx, si = step.in_slots
    so = step.out_slots[0]
    X, IDX = _slot(eb, sx), _slot(eb, si)
    ax = _axis(attrs.get("axis", -1), len(X.shape))
    lead = math.prod(X.shape[:ax])
    dim = X.shape[ax]
    rest = math.prod(X.shape[ax + 1:])
    if lead * rest == 0:
        return
    b = eb.b
    with for_range(b, lead) as l_:
        with for_range(b, rest) as r:
            pos = eb.add(eb.mul(l_, rest), r)
            i = _index_of(eb, eb.slot_ptr(si), IDX.dtype, pos, dim, "clip")
            v = eb.load(eb.slot_ptr(sx, eb.add(eb.mul(eb.add(eb.mul(l_, dim), i), rest), r)),
                        X.dtype)
            eb.store(eb.slot_ptr(so, pos), v, X.dtype)


def _argext(kind):
    def emit(eb: EB, step, attrs):
        sx, so = step.in_slots[0], step.out_slots[0]
        X = _slot(eb, sx)
        axis = attrs.get("axis")
        if axis is None:
            lead, dim, rest = 1, X.size, 1
        else:
            ax = _axis(axis, len(X.shape))
            lead, dim, rest = (math.prod(X.shape[:ax]), X.shape[ax],
                               math.prod(X.shape[ax + 1:]))
        if lead * rest == 0 or dim == 0:
            return
        b, sb = eb.b, eb.sb
        dt = X.dtype
        best = b.alloca(reg_type(dt))
        besti = b.alloca(I64)
        with for_range(b, lead) as l_:
            with for_range(b, rest) as r:
                base = eb.add(eb.mul(l_, dim * rest), r)
                b.store(eb.load(eb.slot_ptr(sx, base), dt).v, best)
                b.store(eb.c(0), besti)
                if dim > 1:
                    with for_range(b, dim, start=1) as kk:
                        v = eb.load(eb.slot_ptr(sx, eb.add(base, eb.mul(kk, rest))), dt)
                        cur = Typed(b.load(best, typ=reg_type(dt)), dt)
                        better = sb.cmp("gt" if kind == "argmax" else "lt", v, cur).v
                        if dt in FLOATS:  # the first NaN wins, as in NumPy
                            vnan = b.fcmp_unordered("uno", v.v, v.v)
                            cnan = b.fcmp_unordered("uno", cur.v, cur.v)
                            better = b.or_(better, b.and_(vnan, b.xor(
                                cnan, ir.Constant(cnan.type, 1))))
                        b.store(b.select(better, v.v, cur.v), best)
                        b.store(b.select(better, kk, b.load(besti, typ=I64)), besti)
                eb.store(eb.slot_ptr(so, eb.add(eb.mul(l_, rest), r)),
                         Typed(b.load(besti, typ=I64), "int64"), "int64")
    return emit


_EMITTERS = {"matmul": _matmul, "conv2d": _conv2d, "conv2d_grad_data": _conv2d_grad_data,
             "conv2d_grad_weight": _conv2d_grad_weight, "pool2d": _pool2d,
             "pool2d_grad": _pool2d_grad, "take": _take, "take_grad": _take_grad,
             "pick": _pick, "argmax": _argext("argmax"), "argmin": _argext("argmin")}
