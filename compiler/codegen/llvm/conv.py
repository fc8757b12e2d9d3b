"""The convolution externs on the LLVM backend: conv2d and its data and weight gradients.

Convolution, im2col + GEMM: one image (and group) at a time into the worker's scratch: the
columns of one image stay in L2 (LeNet's second layer: 150 x 100 floats) and each image is
one ``sgemm`` W (O x CKK) @ cols (CKK x OH*OW) writing NCHW output directly; gradients are
dX = col2im(W^T @ g) per image and dW = sum over images of g @ cols^T (GEMMs accumulating
with beta = 1). Padding goes through a zero-bordered copy of the image so the im2col loops
have no bounds checks; 1x1 stride-1 convolutions skip im2col. Several images per GEMM (8
for LeNet's second layer: 16 x 150 @ 150 x 800) measured no faster: what the wider GEMM
gains, packing the wider columns gives back.

Direct convolution: stride-1 float convolutions with a tiny reduction and few filters
(C*KH*KW <= 32, O <= 16: LeNet's first layer) run the forward and the weight gradient as
vectorized loops over the flat zero-padded image (_conv2d_direct, _grad_weight_direct), as
their GEMMs (6 x 25 @ 25 x 784 per image) are too thin for BLAS.

Measured at batch 256, float32, on this 2-core machine, each kernel alone (min ms; before:
the loop kernel and per-image GEMMs this replaced, one thread):

    kernel                                  before    now, 1 thread    now, 2 threads
    LeNet conv1 forward (direct)            9.5       1.05-1.47        0.59
    LeNet conv1 weight gradient (direct)    4.4       0.99             0.68
    LeNet conv2 data gradient               7.2       2.76             1.50
      (col2im without masked tail loops: see extern_builder.TINY_TRIP)
    LeNet conv2 forward (BLAS-bound)        2.4       2.31             1.20
    LeNet conv2 weight gradient (BLAS)      2.8       2.73             1.47

Workers, their scratch and the choice between direct loops and im2col come from the plan
(extern_plan.conv_plan), which also sizes the scratch slot.
"""
from __future__ import annotations

from llvmlite import ir

from ..extern_plan import conv_geometry, conv_plan, direct_1x1, slack
from ..kernel import contiguous_strides, itemsize
from ..scalar import Typed
from .emit import for_range
from .extern_builder import EB, run_workers, slot_of, worker_range
from .matmul import gemm
from .scalar import reg_type


def _images(e, g):
    """The images a worker split covers: all, or the real ones under a row bound."""
    return e.bounded(g["n"]) if e.bound is not None else g["n"]


def _im2col(eb, g, src, dt, src_dims, cols):
    """cols[(c, kh, kw), (oh, ow)] = src[c, oh*s + kh*d, ow*s + kw*d] for one image/group.

    src_dims: (rows, cols) of the (padded) image planes src points into."""
    hs, ws = src_dims
    sh, sw = g["stride"]
    dh, dw = g["dil"]
    ext = [g["cg"], g["kh"], g["kw"], g["oh"], g["ow"]]
    src_st = [hs * ws, dh * ws, dw, sh * ws, sw]
    dst_st = contiguous_strides(ext)
    eb.copy_nest(ext, cols, dt, dst_st, src, dt, src_st)


def _col2im(eb, g, cols, dt, dst, dst_dims):
    """dst[c, oh*s + kh*d, ow*s + kw*d] += cols[(c, kh, kw), (oh, ow)]."""
    hs, ws = dst_dims
    sh, sw = g["stride"]
    dh, dw = g["dil"]
    ext = [g["cg"], g["kh"], g["kw"], g["oh"], g["ow"]]
    eb.copy_nest(ext, dst, dt, [hs * ws, dh * ws, dw, sh * ws, sw], cols, dt,
                 contiguous_strides(ext), accumulate=True)


def _to_padded(eb, g, dt, img, dst):
    """Copy image ``img`` (c x h x w) into the interior of ``dst`` (c planes of hp x wp whose
    border is already zero)."""
    ph, pw = g["pad"]
    eb.copy_nest([g["c"], g["h"], g["w"]], eb.gep(dst, dt, ph * g["wp"] + pw), dt,
                 [g["hp"] * g["wp"], g["wp"], 1], img, dt, [g["h"] * g["w"], g["w"], 1])


def _image(e, g, slot, i):
    return e.slot_ptr(slot, e.mul(i, g["c"] * g["h"] * g["w"]))


def _source(e, g, step, lay, w, dt, x_slot, i):
    """(pointer, plane dims) of image i as the im2col loops read it: worker w's zero-bordered
    copy when the convolution pads."""
    if g["pad"] == (0, 0):
        return _image(e, g, x_slot, i), (g["h"], g["w"])
    xp = e.region(step, lay, w, "pad")
    _to_padded(e, g, dt, _image(e, g, x_slot, i), xp)
    return xp, (g["hp"], g["wp"])


def _image_columns(e, g, step, lay, w, dt, x_slot, workers):
    """For each image n of worker w's share and each group gi: (n, gi, cols), the im2col
    matrix (CKK x OH*OW) of that image and group (the image itself for 1x1 stride-1), emitted
    inside the loop over images; the caller emits its GEMM per item. Forward and weight
    gradient share it."""
    _zero_pad_region(e, g, step, lay, w, dt)
    lo, hi = worker_range(e, w, _images(e, g), workers)
    with for_range(e.b, hi, start=lo) as n:
        src, dims = _source(e, g, step, lay, w, dt, x_slot, n)
        for gi in range(g["groups"]):
            gsrc = e.gep(src, dt, gi * g["cg"] * dims[0] * dims[1])
            if direct_1x1(g):
                cols = gsrc
            else:
                cols = e.region(step, lay, w, "cols")
                _im2col(e, g, gsrc, dt, dims, cols)
            yield n, gi, cols


def _zero_pad_region(e, g, step, lay, w, dt):
    if g["pad"] != (0, 0):  # the border stays zero: images only overwrite the interior
        e.fill(e.region(step, lay, w, "pad"), dt, g["c"] * g["hp"] * g["wp"], 0)


OBLOCK = 8  # filters per direct-conv loop: 8 vector accumulators + operands fit in registers


def _taps(g):
    """(index in a filter, offset in the flat padded planes) of each tap, in W's order."""
    plane = g["hp"] * g["wp"]
    dh, dw = g["dil"]
    return [((c * g["kh"] + i) * g["kw"] + j, c * plane + i * dh * g["wp"] + j * dw)
            for c in range(g["cg"]) for i in range(g["kh"]) for j in range(g["kw"])]


def _conv2d_direct(eb: EB, step, g, dt, workers, lay):
    """Stride-1 direct convolution over the flat zero-padded planes: with p = oh * wp + ow,
    out[o, p] = sum_t w[o, t] * x[p + off_t], one vectorizable loop over p per image (up to
    OBLOCK filters at once, every tap unrolled, weights in registers). Columns ow >= OW of
    that flat output are garbage, computed anyway (no remainder loops: 896 lanes instead of
    28 rows of 28 for LeNet) and dropped by the copy out."""
    sx, sw_ = step.in_slots
    so = step.out_slots[0]
    o_, ohw, flat = g["o"], g["oh"] * g["ow"], g["oh"] * g["wp"]
    taps = _taps(g)
    ckk = len(taps)

    def work(e, w):
        xf, out = e.region(step, lay, w, "x"), e.region(step, lay, w, "out")
        e.fill(xf, dt, g["c"] * g["hp"] * g["wp"] + slack(g), 0)
        lo, hi = worker_range(e, w, _images(e, g), workers)
        with for_range(e.b, hi, start=lo) as i:
            _to_padded(e, g, dt, _image(e, g, sx, i), xf)
            for o0 in range(0, o_, OBLOCK):
                filt = range(o0, min(o_, o0 + OBLOCK))
                wv = {(o, t): e.load(e.slot_ptr(sw_, o * ckk + t), dt).v
                      for o in filt for t in range(ckk)}
                with for_range(e.b, flat) as p:
                    accs = {}  # tap-major: each x vector feeds every filter, then dies
                    for t, (_, off) in enumerate(taps):
                        xv = e.load(e.gep(xf, dt, e.add(p, off)), dt).v
                        for o in filt:
                            accs[o] = e.b.fmul(wv[o, t], xv) if t == 0 else \
                                e.fmuladd(wv[o, t], xv, accs[o], dt)
                    for o in filt:
                        e.b.store(accs[o], e.gep(out, dt, e.add(p, o * flat)),
                                  align=itemsize(dt))
            e.copy_nest([o_, g["oh"], g["ow"]], e.slot_ptr(so, e.mul(i, o_ * ohw)), dt,
                        [ohw, g["ow"], 1], out, dt, [flat, g["wp"], 1])
    run_workers(eb, workers, work)


def _conv2d(eb: EB, step, attrs):
    sx, sw_ = step.in_slots
    so = step.out_slots[0]
    X, W = slot_of(eb, sx), slot_of(eb, sw_)
    dt = X.dtype
    g = conv_geometry(X.shape, W.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    if g["n"] == 0 or g["o"] == 0 or ohw == 0:
        return
    direct, workers, lay = conv_plan("conv2d", g, dt)
    if direct:
        _conv2d_direct(eb, step, g, dt, workers, lay)
        return

    def work(e, w):
        for n, gi, cols in _image_columns(e, g, step, lay, w, dt, sx, workers):
            out = e.slot_ptr(so, e.add(e.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            wg = e.slot_ptr(sw_, gi * g["og"] * ckk)
            gemm(e, dt, False, False, g["og"], ohw, ckk, wg, ckk, cols, ohw, out, ohw)
    run_workers(eb, workers, work)


def _conv2d_grad_data(eb: EB, step, attrs):
    sg, sw_ = step.in_slots
    so = step.out_slots[0]
    G, W, DX = slot_of(eb, sg), slot_of(eb, sw_), slot_of(eb, so)
    dt = G.dtype
    g = conv_geometry(DX.shape, W.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    plane = g["h"] * g["w"]
    if g["n"] == 0 or g["c"] == 0 or plane == 0:
        return
    _, workers, lay = conv_plan("conv2d_grad_data", g, dt)
    padded = g["pad"] != (0, 0)

    def work(e, w):
        cols = e.region(step, lay, w, "cols")
        lo, hi = worker_range(e, w, _images(e, g), workers)
        with for_range(e.b, hi, start=lo) as n:
            img = _image(e, g, so, n)
            if padded:
                dst, dims = e.region(step, lay, w, "pad"), (g["hp"], g["wp"])
            else:
                dst, dims = img, (g["h"], g["w"])
            e.fill(dst, dt, g["c"] * dims[0] * dims[1], 0)
            for gi in range(g["groups"]):
                gin = e.slot_ptr(sg, e.add(e.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
                wg = e.slot_ptr(sw_, gi * g["og"] * ckk)
                # dcols (CKK x OHW) = W_g^T (CKK x og) @ g_n (og x OHW)
                gemm(e, dt, True, False, ckk, ohw, g["og"], wg, ckk, gin, ohw, cols, ohw)
                _col2im(e, g, cols, dt, e.gep(dst, dt, gi * g["cg"] * dims[0] * dims[1]), dims)
            if padded:
                ph, pw = g["pad"]
                e.copy_nest([g["c"], g["h"], g["w"]], img, dt, [plane, g["w"], 1],
                            e.gep(dst, dt, ph * g["wp"] + pw), dt,
                            [g["hp"] * g["wp"], g["wp"], 1])
    run_workers(eb, workers, work)


def _conv2d_grad_weight(eb: EB, step, attrs):
    """dW = sum over images of g_n @ cols_n^T: each worker sums its images (into dW itself
    when it is the only one, else into its scratch, added up in worker order at the end)."""
    sx, sg = step.in_slots
    so = step.out_slots[0]
    X, DW = slot_of(eb, sx), slot_of(eb, so)
    dt = X.dtype
    g = conv_geometry(X.shape, DW.shape, attrs)
    ckk = g["cg"] * g["kh"] * g["kw"]
    ohw = g["oh"] * g["ow"]
    if g["n"] == 0 or ohw == 0 or DW.size == 0:
        eb.fill(eb.slot_ptr(so), dt, DW.size, 0)
        return
    direct, workers, lay = conv_plan("conv2d_grad_weight", g, dt)

    def partial(e, w):
        if workers == 1:
            return e.slot_ptr(so)
        return e.region(step, lay, w, "dw")

    def work(e, w):
        dw = partial(e, w)
        e.fill(dw, dt, DW.size, 0)
        if direct:
            _grad_weight_direct(e, step, g, dt, lay, w, workers, dw)
            return
        for n, gi, cols in _image_columns(e, g, step, lay, w, dt, sx, workers):
            gin = e.slot_ptr(sg, e.add(e.mul(n, g["o"] * ohw), gi * g["og"] * ohw))
            # dW_g (og x CKK) += g_n (og x OHW) @ cols^T (OHW x CKK)
            gemm(e, dt, False, True, g["og"], ckk, ohw, gin, ohw, cols, ohw,
                 e.gep(dw, dt, gi * g["og"] * ckk), ckk, accumulate=True)
    run_workers(eb, workers, work)
    if workers > 1:
        with for_range(eb.b, DW.size) as i:
            acc = None
            for w in range(workers):
                v = eb.load(eb.gep(partial(eb, eb.c(w)), dt, i), dt)
                acc = v if acc is None else eb.sb.add(acc, v)
            eb.store(eb.slot_ptr(so, i), acc, dt)


def _grad_weight_direct(e: EB, step, g, dt, lay, w, workers, dw):
    """Worker w's images of a direct (stride-1) convolution: with g_n copied to the flat
    layout (zero garbage columns), dw[o, t] += sum_p g[o, p] * (x[p + off_t] & mask[p]), one
    vectorizable reduction loop per tap. The mask zeroes x where p is a garbage column (there
    x is a wrapped-around neighbour that may be inf or NaN, and 0 * inf is NaN)."""
    sx, sg = step.in_slots
    o_, ohw, flat = g["o"], g["oh"] * g["ow"], g["oh"] * g["wp"]
    taps = _taps(g)
    ckk = len(taps)
    b = e.b
    ity = ir.IntType(8 * itemsize(dt))
    ity_name = "int32" if itemsize(dt) == 4 else "int64"
    xf, gf, mask = (e.region(step, lay, w, r) for r in ("x", "g", "mask"))
    e.fill(xf, dt, g["c"] * g["hp"] * g["wp"] + slack(g), 0)
    e.fill(gf, dt, o_ * flat, 0)
    with for_range(b, g["oh"]) as r:
        with for_range(b, g["wp"]) as col:
            keep = b.icmp_signed("<", col, e.c(g["ow"]))
            bits = b.select(keep, ir.Constant(ity, -1), ir.Constant(ity, 0))
            b.store(bits, e.gep(mask, ity_name, e.add(e.mul(r, g["wp"]), col)))
    # Register blocks of filters x taps: each p loads ob g values and tb x values (one mask)
    # for ob * tb FMAs into as many vector accumulators (12: 6 x 2 for LeNet, 9 loads
    # instead of 16 for the same 12 FMAs tap by tap).
    ob = min(o_, 6)
    tb = max(1, 12 // ob)
    accs = [e.entry_alloca(reg_type(dt)) for _ in range(ob * tb)]
    zero = e.sb.const(0.0, dt).v
    lo, hi = worker_range(e, w, _images(e, g), workers)
    with for_range(b, hi, start=lo) as i:
        _to_padded(e, g, dt, _image(e, g, sx, i), xf)
        e.copy_nest([o_, g["oh"], g["ow"]], gf, dt, [flat, g["wp"], 1],
                    e.slot_ptr(sg, e.mul(i, o_ * ohw)), dt, [ohw, g["ow"], 1])
        for t0 in range(0, ckk, tb):
            tblock = taps[t0:t0 + tb]
            for o0 in range(0, o_, ob):
                pairs = [(o, t) for o in range(o0, min(o_, o0 + ob))
                         for t in range(t0, t0 + len(tblock))]
                for a in accs[:len(pairs)]:
                    b.store(zero, a)
                with for_range(b, flat) as p:
                    keep = b.load(e.gep(mask, ity_name, p), typ=ity, align=itemsize(dt))
                    xs = {}
                    for t, off in tblock:
                        xv = b.load(e.gep(xf, dt, e.add(p, off)), typ=ity, align=itemsize(dt))
                        xs[t] = b.bitcast(b.and_(xv, keep), reg_type(dt))
                    gs = {}
                    for (o, t), a in zip(pairs, accs):
                        if o not in gs:
                            gs[o] = e.load(e.gep(gf, dt, e.add(p, o * flat)), dt).v
                        b.store(e.fmuladd(gs[o], xs[t], b.load(a, typ=reg_type(dt)), dt), a)
                for (o, t), a in zip(pairs, accs):
                    pd = e.gep(dw, dt, o * ckk + t)
                    total = Typed(b.load(a, typ=reg_type(dt)), dt)
                    e.store(pd, e.sb.add(e.load(pd, dt), total), dt)


EMITTERS = {"conv2d": _conv2d, "conv2d_grad_data": _conv2d_grad_data,
            "conv2d_grad_weight": _conv2d_grad_weight}
