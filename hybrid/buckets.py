"""Shape buckets: one compiled graph serves a range of batch sizes (or sequence lengths).

A hybridized block compiles its first input size exactly. When a second size arrives along
one axis for the same arguments otherwise (the last, smaller batch of an epoch on axis 0;
sentences of another length, on axis 0 time-major or axis 1 batch-major as the book's
(batch, num_steps) tokens), the call runs the graph of a *bucket* — the next size on ``LADDER`` — on
its inputs padded with copies of their last row, and slices the real rows out of the
results: the batch sizes 1..40 take 7 graphs (a power of two each), no call computing more
than twice its rows. Where a ``foreach`` scans the padded axis (an RNN's time steps) the
bucket is ``SCAN_BUCKET`` steps where that costs at most twice the work of the real size, or
little (``PAD_WORK_FREE``): the loop runs the real steps only, but what the graph computes
outside it (a language model's embedding and decoder) runs for every padded step — so an LSTM
whose loop is most of the work, or a small model, serves lengths 10..50 from one bucket, and
a language model whose decoder is most of a large step takes the ladder's buckets (length 10
in the 64-step bucket took 3.8x the exact graph's step).

**Row bounds.** Along axis 0 a bucket's graph also reads the real size (``valid_rows``,
its last input), and on the LLVM backend its programs - inference, and a training call's
forward and backward - compute the real rows only, every kernel bounded or none
(compiler/passes/row_bounds.py): then a padded call costs about its real size's work,
and one bucket serves every smaller size. A family expected to take them (LLVM on a CPU;
loops, 2-D products, gathers, convolutions and pooling, counted scans over the axis)
gets one bucket of at least ``BOUNDED_ROWS`` rows - the 64-step bucket where a scan counts
the steps, whatever the rest costs - and later sizes the smallest bounded bucket that holds
them: 40 MLP batch sizes take one bucket (2 compiles in all), a language model's lengths
10..50 one (forward and backward). A family whose compiled bucket took no bounds keeps the
ladder. Rows no program reads are left unfilled: an unrecorded call gives its program the
real rows only (rounded up to the GEMM loops' row tile, those filled with copies), a
training call's padded gradient its real rows. ``HYBRID_ROW_BOUNDS=0`` turns bounds off.

A size above ``HYBRID_BUCKET_ROWS`` (512) runs that largest bucket's graph on consecutive
pieces of its rows, the last one padded, and joins the pieces' results: a language model's
loss over T*N tokens (320..1600 rows for lengths 10..50 at batch 32) takes one graph, not
three, and no piece computes more than the bucket's rows. Pieces need every output to have
the padded axis (a value computed from parameters alone would be returned once per piece) and
no scan over it (a foreach's state would not carry from one piece to the next); a training
call's parameter gradients are then the sum of the pieces' (autograd adds them, as for a
parameter used twice), in another order than one product over all rows: equal up to
rounding, like the padded buckets' sums.

Only where that is the same program: each size is traced (not compiled) and its trace must
equal its bucket's but for the sizes (a Python branch on the size runs that size's own
graph), the bucket's must equal the first size's, and compiler/passes/batch_axis.py must find that
every op keeps rows apart (no reduction over the batch, no BatchNorm statistics in training,
no random draw, no gather across rows). A ``foreach`` scanning over the padded axis (an
RNN's time steps) is made to stop after the real steps, so its final states are exact.
Otherwise each size compiles exactly, as before, and the recompiles log says why once.
Padding rows are copies of a real row, so they compute finite values, and their zero
output gradients contribute nothing to any parameter's gradient.

``hybridize(static_shape=True)`` (MXNet's flag) or ``HYBRID_BUCKETS=0`` turns buckets off;
the ``reference`` backend (the NumPy oracle) never uses them: it runs every size exactly.
"""
from __future__ import annotations

import bisect
import json
import math

import numpy as np

from compiler.ops import Spec
from compiler.passes.batch_axis import UNIFORM, batch_axes
from compiler.passes.work import graph_work
from runtime import config
from runtime.executable import Executable, PartitionedExecutable
from runtime.memory import host_pool

from .ndarray import NDArray, _eager, array, concatenate
from ._state import is_recording
from .random import restore_stream, stream_state

_log = config.logger("recompiles")

LADDER = tuple(1 << k for k in range(13))  # 1, 2, 4, ... 4096: a few graphs, <= 2x the rows


# a family whose inference programs take row bounds costs the real rows whatever its bucket:
# one bucket of at least this many rows serves every smaller size (_rows_bucket)
BOUNDED_ROWS = 64


# a size family whose padded axis a foreach scans (an RNN's time steps): the loop runs the
# real steps only, so one coarse bucket serves the usual sentence lengths where padding the
# rest of the graph is cheap (_scan_bucket)
SCAN_BUCKET = 64


# multiply-adds a padded call may add whatever its ratio to the real size's (~0.3 ms on one
# core): a small model's steps cost their calls' overhead, not their arithmetic
PAD_WORK_FREE = 2e7


def _scan_bucket(first, axes, size: int, first_size: int) -> int:
    """SCAN_BUCKET where its padded steps cost at most the real size's work again, or little
    (the loop stops after the real steps; the graph's other work on the padded axis runs for
    every padded step), else 0 (the ladder's bucket). The work per step is the first
    trace's (``first_size`` steps)."""
    rows, other, inside = graph_work(first.graph, axes.batched)
    rows_per, inside_per = rows / first_size, inside / first_size
    exact = (rows_per + inside_per) * size + other
    extra = rows_per * (SCAN_BUCKET - size)
    return SCAN_BUCKET if extra <= max(exact, PAD_WORK_FREE) else 0


def _rows_bucket(cf, family, size: int, padded: int, least: int) -> int:
    """The bucket of ``size`` in a family whose programs are expected to take row bounds
    (compiler/passes/row_bounds.py): the smallest bucket already compiled with them that
    holds it; else one of at least ``least`` rows (it costs the real rows only, so it serves
    every smaller size); the ladder's ``padded`` where a compiled bucket showed they do
    not."""
    mine = [(p, _bounded(e)) for (fam, p), (e, _) in cf.buckets.items() if fam == family]
    fits = [p for p, bounded in mine if bounded and p >= size]
    if fits:
        return min(fits)
    if any(bounded is False for _, bounded in mine):
        return padded
    return max(padded, least)


def _bounded(entry):
    """Whether ``entry``'s programs compute the real rows only (None: none compiled yet)."""
    for exe in [entry.compiled_exe] + [t[1] for t in entry.train.values()]:
        if exe is not None:
            return bool(exe.report.get("row_bounds"))
    return None


def _boundable(first, axes) -> bool:
    """Whether a bucket of ``first``'s graph is expected to take row bounds: a CPU graph for
    the LLVM backend of the kernels row_bounds.py bounds (loops, 2-D products, gathers,
    convolutions, pooling), whose loops are scans over the padded axis."""
    if first.backend != "llvm" or not str(first.device or "cpu").startswith("cpu") or \
            not config.get("HYBRID_ROW_BOUNDS"):
        return False
    from compiler.codegen.kernel import EXTERN_OPS  # noqa: PLC0415 - not at import time
    from compiler.passes.row_bounds import BOUNDED_EXTERNS  # noqa: PLC0415
    unbounded = frozenset(EXTERN_OPS) - BOUNDED_EXTERNS  # (a bucket of them: the ladder)
    g = first.graph
    for n in g.op_nodes():
        op = g.op(n)
        if op == "matmul":
            if any(g.spec(a).ndim != 2 for a in g.arg_ids(n)):
                return False
        elif op in unbounded or op in ("while_loop", "cond") or \
                op == "foreach" and n not in axes.scans:
            return False
    return True


def _first_axes(first, family):
    """batch_axes of the family's first traced graph along the family's axis."""
    g = first.graph
    batched = [n for n, b in zip(g.inputs, family[2]) if b]
    return batch_axes(g, dict.fromkeys(batched, family[-1]), _size_of(first, family))


def _size_of(entry, family) -> int:
    """The size along the family's axis of ``entry``'s first padded argument."""
    batched = next(n for n, b in zip(entry.graph.inputs, family[2]) if b)
    return entry.graph.spec(batched).shape[family[-1]]


def _in_pieces(axes, n_user_out) -> bool:
    """Whether consecutive pieces of the rows may run one after another: rows kept apart,
    no foreach scanning the axis, every output along it."""
    return axes.ok and not axes.scans and \
        all(o is not None and o != UNIFORM for o in axes.outputs[:n_user_out])


def bucket_of(n: int) -> int | None:
    """The smallest ladder size >= n (None past the ladder's end: exact compiles)."""
    i = bisect.bisect_left(LADDER, n)
    return LADDER[i] if i < len(LADDER) else None


def _family(sig, axis=0):
    """What must match for two signatures to share buckets along ``axis``: everything but
    the size along it of the batched arguments (those whose size there is the first such
    argument's). Axis 0 is a batch size or a time-major length; axis 1 a batch-major
    length (the book's (batch, num_steps) tokens, NTC layouts)."""
    tree, specs, training = sig
    ref = next((s for s, _, _ in specs if len(s) > axis), None)
    if ref is None:
        return None, None
    size = ref[axis]
    batched = tuple(len(s) > axis and s[axis] == size for s, _, _ in specs)
    rest = tuple((s[:axis] + s[axis + 1:] if b else s, d, dev)
                 for (s, d, dev), b in zip(specs, batched))
    return (tree, training, batched, rest, axis), size


def _first_of_family(cf, sig):
    """(family, size, first): the family of ``sig`` along the first axis where an exact
    entry of the same family has another size, and that entry; (None, None, None)."""
    ndim = max((len(s) for s, _, _ in sig[1]), default=0)
    for axis in range(ndim):
        family, size = _family(sig, axis)
        if family is None or family in cf.no_buckets:
            continue
        first = next((e for s, e in cf.entries.items() if not isinstance(e, Bucketed)
                      and _family(s, axis) != (family, size)
                      and _family(s, axis)[0] == family), None)
        if first is not None:
            return family, size, first
    return None, None, None


class Bucketed:
    """A signature answered by a bucket's compiled entry: pad, run, slice."""

    direct = False

    def __init__(self, entry, size, padded, batched, axis, out_axes, counted):
        self.entry = entry  # the bucket's Compiled entry
        self.size, self.padded = size, padded
        self.batched, self.axis = batched, axis  # per argument: padded (along axis) or not
        self.out_axes = out_axes  # per output: (axis, rows per example) or None
        self.counted = counted  # the graph takes the real size as a last input
        self.pieces = -(-size // padded)  # > 1: rows run in consecutive pieces (_in_pieces)
        self._fused = None  # (the bucket's inference executable, the call that pads for it)

    def __getattr__(self, name):  # report/explain read the bucket entry's fields
        return getattr(self.__dict__["entry"], name)

    def bucket_run(self, leaves, name):
        """The bucket's graph on each piece of the rows (one piece unless the size is above
        the largest bucket), padded to the bucket; the real rows of the results. Padding,
        pieces and joins are one recorded node each way, so a training call's backward
        copies each gradient once (as slices and concatenates recorded op by op, it did
        several full-size copies and zero-fills: ~3x the loss's own time at 1600 rows)."""
        from .tracing import _run, flatten, unflatten  # noqa: PLC0415 - tracing imports us
        if self.pieces == 1 and not is_recording() and not isinstance(
                self.entry.compiled_exe or self.entry.exe, PartitionedExecutable):
            return self._infer(leaves, name)
        bounds = [(lo, min(lo + self.padded, self.size))
                  for lo in range(0, self.size, self.padded)]
        split = [_split_rows(a, self.axis, bounds, self.padded) if b else None
                 for a, b in zip(leaves, self.batched)]
        runs = []
        for k, (lo, hi) in enumerate(bounds):
            ins = [a if parts is None else parts[k] for a, parts in zip(leaves, split)]
            if self.counted:  # (a recorded call's count is exact: its gradients sum rows)
                n = hi - lo if is_recording() else _count(self.entry, hi - lo, self.padded)
                ins.append(array(n, dtype="int64", device=leaves[0].device))
            outs, tree = flatten(_run(self.entry, ins, name))
            runs.append(outs)
        # a training call's backward reads no padded row where every backward is bounded
        unread = bool(self.entry.train) and all(t[8] for t in self.entry.train.values())
        outs = [parts[0] if ax is None else _join_rows(list(parts), ax, bounds, unread)
                for parts, ax in zip(zip(*runs), self.out_axes)]
        return outs[0] if len(outs) == 1 and tree == ("a",) else unflatten(tree, outs)

    def _infer(self, leaves, name):
        """An unrecorded call: ONE compiled call that pads, runs the bucket's executable and
        slices the real rows, through a Caller as an exact size's call (three engine ops
        and their Python cost ~70 us more on a small model's call)."""
        from .dispatch import Caller  # noqa: PLC0415
        from .tracing import _param_handles, unflatten  # noqa: PLC0415
        entry = self.entry
        exe = entry.compiled_exe or entry.exe
        if self._fused is None or self._fused[0] is not exe:
            self._fused = exe, Caller(self._padded_call(exe), leaves[0].device)
        outs = self._fused[1](leaves, _param_handles(entry), name)
        if entry.out_tree == ("a",):
            return outs[0]
        return unflatten(entry.out_tree, outs[:entry.n_user_out])

    def _padded_call(self, exe):
        """An Executable over the real rows running ``exe`` on the padded ones."""
        size, padded, axis, counted = self.size, self.padded, self.axis, self.counted
        batched, out_axes = self.batched, self.out_axes
        # rows the executable reads: below the count it is given, or all (no row bounds);
        # those past the real ones are copies of the last, the rest are never read
        count = _count(self.entry, size, padded)
        # a row-bounded native program takes its padded inputs with only the rows below its
        # count (no copy at all where the real size is a multiple of the GEMM's row tile)
        short = exe.report.get("row_bounds") and axis == 0 and \
            getattr(exe.run, "short_inputs", None)
        rows = count if short else padded
        filled = count if exe.report.get("row_bounds") else padded

        def run(xp, inputs, params):
            ins = [_pad_rows(xp, a, axis, rows, filled) if b else a
                   for a, b in zip(inputs, batched)]
            if counted:
                ins.append(xp.asarray(count, dtype="int64"))
            res = exe.run(xp, ins, params)
            return [r if ax is None else r[(slice(None),) * ax[0] + (slice(0, size * ax[1]),)]
                    for r, ax in zip(res, out_axes)]
        out_specs = [s if ax is None else Spec(tuple(s.shape[:ax[0]]) + (size * ax[1],) +
                                               tuple(s.shape[ax[0] + 1:]), s.dtype)
                     for s, ax in zip(exe.out_specs, out_axes)]
        in_specs = [s if not b else Spec(tuple(s.shape[:axis]) + (size,) +
                                         tuple(s.shape[axis + 1:]), s.dtype)
                    for s, b in zip(exe.in_specs, batched)]
        return Executable(run, exe.backend, in_specs, exe.param_specs, out_specs, exe.device,
                          {"bucket": padded})


def _pad_rows(xp, a, axis: int, padded: int, filled: int):
    """``a`` with ``padded`` rows along ``axis``: its own, copies of its last row up to row
    ``filled``, then rows no one reads."""
    n = a.shape[axis]
    if n == padded:
        return a
    shape = a.shape[:axis] + (padded,) + a.shape[axis + 1:]
    pool = host_pool() if xp is np else None  # recycled pages: no page faults per call
    out = pool.empty(shape, a.dtype, math.prod(shape) * a.dtype.itemsize)[0] if pool else \
        xp.empty(shape, a.dtype)
    lead = (slice(None),) * axis
    out[lead + (slice(0, n),)] = a
    if filled > n:
        out[lead + (slice(n, filled),)] = a[lead + (slice(n - 1, n),)]
    return out


def _unread_rows(a: NDArray, extra: int, axis: int) -> NDArray:
    """``a`` with ``extra`` more rows along ``axis`` that no program reads: one engine op
    copying ``a``'s own rows only."""
    from .dispatch import _push  # noqa: PLC0415
    n = a.shape[axis]
    shape = tuple(a.shape[:axis]) + (n + extra,) + tuple(a.shape[axis + 1:])
    exe = Executable(lambda xp, ins, params: [_pad_rows(xp, ins[0], axis, n + extra, n)],
                     "host", [Spec(a.shape, a._dtype)], [], [Spec(shape, a._dtype)], a.device)
    return _push(exe, a.device, [a._buf], [], exe.out_specs, "bucket_rows")[0]


def _count(entry, n: int, padded: int) -> int:
    """The row count a bucket's graph is given for ``n`` real rows: with row bounds, ``n``
    rounded up to the executable's row granule (a GEMM's row tile then reads only rows the
    program wrote), at most ``padded``; exactly ``n`` where a scan counts the steps."""
    if getattr(entry, "scanned", False):
        return n
    exe = entry.compiled_exe  # (an unrecorded call's: a recorded call's count is exact)
    g = exe.report.get("row_granule", 1) if exe is not None else 1
    return min(padded, -(-n // g) * g)


def _unrecorded():
    from . import autograd  # noqa: PLC0415 - autograd imports the front end
    return autograd.pause(train_mode=autograd.is_training())


def _record(name, inputs, outputs, backward_fn):
    from . import autograd  # noqa: PLC0415
    autograd.record_custom(name, inputs, outputs, backward_fn)


def _split_rows(a: NDArray, axis: int, bounds, padded: int) -> list:
    """``a``'s rows ``lo:hi`` for each of ``bounds``, each padded to ``padded`` rows; one
    recorded node whose backward joins the pieces' real rows."""
    n = a.shape[axis]
    if bounds == [(0, padded)]:  # the bucket's own size: the array as it is (recording a
        return [a]               # node with ``a`` as its output would rewire a's history)
    with _unrecorded():
        parts = [_pad(a if (lo, hi) == (0, n) else _rows(a, axis, lo, hi),
                      padded - (hi - lo), axis) for lo, hi in bounds]

    def backward(grads):
        real = [_rows(g, axis, 0, hi - lo) for g, (lo, hi) in zip(grads, bounds)]
        return [real[0] if len(real) == 1 else concatenate(real, axis=axis)]
    _record("bucket_rows", [a], parts, backward)
    return parts


def _join_rows(parts: list, ax, bounds, unread: bool = False) -> NDArray:
    """The real rows of each piece's output, joined along the output's axis; one recorded
    node whose backward gives each piece its rows of the gradient, zeros after them (rows
    no one reads where the bucket's programs compute the real rows only, ``unread``: zeros
    and a concatenate of a language model's (2048, 1000) logits' gradient cost ~6 ms)."""
    axis, per = ax
    if len(parts) == 1 and parts[0].shape[axis] == (bounds[0][1] - bounds[0][0]) * per:
        return parts[0]
    with _unrecorded():
        real = [_take_rows(p, ax, hi - lo) for p, (lo, hi) in zip(parts, bounds)]
        out = real[0] if len(real) == 1 else concatenate(real, axis=axis)

    def backward(grads):
        from .ndarray import zeros  # noqa: PLC0415
        res = []
        for p, (lo, hi) in zip(parts, bounds):
            g = _rows(grads[0], axis, lo * per, hi * per)
            extra = p.shape[axis] - (hi - lo) * per
            if extra and unread:
                g = _unread_rows(g, extra, axis)
            elif extra:
                shape = p.shape[:axis] + (extra,) + p.shape[axis + 1:]
                g = concatenate([g, zeros(shape, dtype=p._dtype, device=p.device)], axis=axis)
            res.append(g)
        return res
    _record("bucket_rows", parts, [out], backward)
    return out


def _rows(a: NDArray, axis: int, lo: int, hi: int) -> NDArray:
    """Rows ``lo:hi`` of ``a`` along ``axis``: one slice op (indexing's parsing cost ~4 us
    more on a bucketed call's path)."""
    nd = a.ndim
    begin, end = [None] * nd, [None] * nd
    begin[axis], end[axis] = lo, hi
    return _eager("slice", [a], {"begin": tuple(begin), "end": tuple(end),
                                 "step": (None,) * nd})


_PAD_ROWS: dict = {}  # (rows, padded rows, device) -> the gather's row indices


def _pad(a: NDArray, extra: int, axis: int = 0) -> NDArray:
    """``a`` with ``extra`` copies of its last row along ``axis`` appended: one gather of
    rows 0..n-1, n-1, ..., n-1 (a slice, a broadcast and a concatenate cost ~37 us on a
    small bucketed call, the gather ~8)."""
    if not extra:
        return a
    n = a.shape[axis]
    key = (n, n + extra, a.device)
    idx = _PAD_ROWS.get(key)
    if idx is None:
        if len(_PAD_ROWS) > 256:
            _PAD_ROWS.clear()
        idx = _PAD_ROWS[key] = array(list(range(n)) + [n - 1] * extra, dtype="int64",
                                     device=a.device)
    return _eager("take", [a, idx], {"axis": axis, "mode": "clip"})


def _take_rows(o: NDArray, axis, size):
    ax, per = axis
    return _rows(o, ax, 0, size * per)


def lookup(cf, sig, leaves, tree, args, kwargs):
    """The entry answering ``sig``: a Bucketed one, or this size's own compiled entry when
    its trace differs from its bucket's; None when buckets do not apply (then the caller
    compiles it exactly)."""
    if cf.flags.get("static_shape") or not config.get("HYBRID_BUCKETS"):
        return None
    family, size, first = _first_of_family(cf, sig)
    if first is None:
        return None  # the first size of this family: compiled exactly
    if first.backend == "reference":  # the oracle runs each size as it is, bit for bit
        return None
    axes = _first_axes(first, family)
    largest = config.get("HYBRID_BUCKET_ROWS")
    if size > largest and _in_pieces(axes, first.n_user_out):
        padded = largest  # consecutive pieces of the largest bucket's rows
    else:
        padded = bucket_of(size)
        if padded is None:
            return None
        if axes.ok and family[-1] == 0 and _boundable(first, axes):
            # its programs compute the real rows only: one bucket for the smaller sizes
            padded = _rows_bucket(cf, family, size, padded,
                                  SCAN_BUCKET if axes.scans else min(BOUNDED_ROWS, largest))
        elif axes.ok and axes.scans:  # a scan stops after the real steps: pad more where cheap
            padded = max(padded, _scan_bucket(first, axes, size, _size_of(first, family)))
    key = (family, padded)
    got = cf.buckets.get(key)
    if got is None and padded == _size_of(first, family) and axes.ok and not axes.scans \
            and not _refuse(first, first):
        # the first size is this bucket's size: its graph is the bucket (nothing compiles)
        first.out_axes, first.counted = axes.outputs[:first.n_user_out], False
        first.scanned = False
        got = cf.buckets[key] = first, _Ref(first.graph.copy(), first.out_tree,
                                             first.n_user_out)
    if got is None:
        got = _build_bucket(cf, sig, family, padded, first, leaves, tree, args, kwargs)
        if got is None:
            return None
        cf.buckets[key] = got
    entry, ref = got
    if size != padded:  # the same program at this size? its trace (not compiled) must be
        why = []        # the bucket's but for the sizes: a Python branch on the size differs

        def check(own):
            reason = _refuse(own, ref)
            if reason:
                why.append(reason)
                return own  # compiled: this size runs its own graph
            return None
        own = cf._build(sig, leaves, tree, args, kwargs, prepare=check)
        if own is not None:
            _log.info("%s: size %d compiles its own graph: %s", cf.name, size, why[0])
            cf.entries[sig] = own
            return own
    b = Bucketed(entry, size, padded, family[2], family[-1], entry.out_axes, entry.counted)
    if b.pieces > 1 and (entry.scanned or any(ax is None for ax in b.out_axes)):
        return None  # (the first size's trace said pieces apply; its bucket's disagrees)
    _log.info("%s: size %d runs the bucket of size %d%s", cf.name, size, padded,
              f" in {b.pieces} pieces" if b.pieces > 1 else "")
    cf.entries[sig] = b
    return b


def _build_bucket(cf, sig, family, padded, first, leaves, tree, args, kwargs):
    """(the bucket's compiled entry, its trace before rewriting) or None, with the reason
    kept in ``cf.no_buckets``."""
    tree_, specs, training = sig
    axis = family[-1]
    psig = (tree_, tuple((tuple(s[:axis]) + (padded,) + tuple(s[axis + 1:]) if b else s, d,
                          dev) for (s, d, dev), b in zip(specs, family[2])), training)
    from .ndarray import zeros  # noqa: PLC0415
    pleaves = [zeros(s, dtype=d, device=dev) for s, d, dev in psig[1]]
    why, refs = [], []

    def prepare(entry):
        reason = _refuse(entry, first)
        if reason:
            why.append(reason)
            return None
        g = entry.graph
        batched = {n: axis for n, b in zip(g.inputs, family[2]) if b}
        axes = batch_axes(g, batched, padded)
        if not axes.ok:
            why.append(f"padding would change its results: {axes.reason}")
            return None
        refs.append(_Ref(g.copy(), entry.out_tree, entry.n_user_out))
        entry.out_axes, entry.scanned = axes.outputs[:entry.n_user_out], bool(axes.scans)
        entry.counted = bool(axes.scans) or axis == 0  # the graph reads the real size
        if entry.counted:
            valid = g.add_input(Spec((), "int64"), "valid_rows",
                                g.node(g.inputs[0])["device"])
        if axes.scans:
            _count_scans(g, axes.scans, valid)
        if entry.counted and axis == 0 and entry.backend == "llvm" and \
                config.get("HYBRID_ROW_BOUNDS"):
            # its programs may compute the real rows only
            entry.rows = {"count": len(g.inputs) - 1, "units": padded, "batched": [
                i for i, b in enumerate(family[2]) if b]}
        return entry
    stream = stream_state()
    entry = cf._build(psig, pleaves, tree, args, kwargs, prepare=prepare)
    if entry is None:  # thrown away: the random draws its trace took are taken again
        restore_stream(stream)
        cf.no_buckets[family] = why[0]
        _log.info("%s: no shape buckets (each size compiles): %s", cf.name, why[0])
        return None
    return entry, refs[0]


class _Ref:
    """A trace to compare another with: its graph and output structure."""

    def __init__(self, graph, out_tree, n_user_out):
        self.graph, self.out_tree, self.n_user_out = graph, out_tree, n_user_out


def _refuse(entry, ref) -> str:
    """Why ``entry``'s trace is not ``ref``'s program at another size ('' when it is)."""
    if entry.uses_key or entry.state_updates or entry.input_writes:
        return "it draws random numbers, updates parameters or writes its inputs"
    if entry.out_tree != ref.out_tree or entry.n_user_out != ref.n_user_out:
        return "its output structure depends on the size"
    from .deploy import _diff, _fmt_path, _rule_path, _same_constants, _short, _strip  # noqa: PLC0415,E501
    same = _same_constants(ref.graph, entry.graph)
    if same:
        return same
    d0 = json.loads(ref.graph.to_json(with_constants=False))
    d1 = json.loads(entry.graph.to_json(with_constants=False))
    for path, v0, v1 in _diff(_strip(d0), _strip(d1)):
        if not (isinstance(v0, int) and isinstance(v1, int)) or not _rule_path(path):
            return "the traced graph differs between sizes beyond the sizes themselves " \
                   f"(a Python branch on the size, or a value computed from it?) at " \
                   f"{_fmt_path(path)}: {_short(v0)} vs {_short(v1)}"
    return ""


def _count_scans(g, scans, valid: int):
    """Each foreach scanning over the padded axis stops after the real steps: a counted
    foreach reading the real size from the graph's input ``valid``."""
    for n in scans:
        g.replace_control_node(n, [valid] + g.arg_ids(n), dict(g.node(n)["attrs"], counted=True))
