"""Functions composed from primitives, written once over an op namespace ``F``.

They serve gradient rules, the front end's NumPy-named functions and the layers alike, so
their gradients and code generation come from the primitives (tinygrad's discipline).
``F`` is a :class:`compiler.ops.core.OpNamespace`; values carry ``.shape`` and ``.dtype``.
"""
from __future__ import annotations

import math
import numbers

from .core import INT_DTYPES, normalize_axis, spec_of


def _shape(v):
    return tuple(v.shape)


def sum_to(F, g, shape):
    """Sum a broadcast gradient ``g`` back down to ``shape``."""
    shape = tuple(shape)
    gshape = _shape(g)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and gshape[lead + i] != 1)
    if axes:
        g = F.sum(g, axis=axes, keepdims=True)
    return F.reshape(g, shape=shape) if _shape(g) != shape else g


def zeros_like_grad(F, x):
    """A zero gradient for x (ops like floor or sign whose derivative is 0 almost everywhere)."""
    return F.full(shape=_shape(x), value=0.0, dtype=spec_of(x).dtype)


def reduced_shape(shape, axis, keepdims):
    axes = normalize_axis(axis, len(shape))
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def count(shape, axis) -> int:
    axes = normalize_axis(axis, len(shape))
    return int(math.prod(shape[a] for a in axes))


def mean(F, x, axis=None, keepdims=False):
    n = count(_shape(x), axis)
    s = F.sum(x, axis=axis, keepdims=keepdims)
    if not spec_of(x).dtype.startswith("float"):
        s = F.cast(s, dtype="float32")
    return F.div(s, float(max(n, 1))) if n else F.div(s, float("nan"))


def var(F, x, axis=None, keepdims=False, ddof=0):
    n = count(_shape(x), axis)
    mu = mean(F, x, axis=axis, keepdims=True)
    d = F.sub(x, mu)
    s = F.sum(F.mul(d, d), axis=axis, keepdims=keepdims)
    return F.div(s, float(max(n - ddof, 0)) or float("nan"))


def std(F, x, axis=None, keepdims=False, ddof=0):
    return F.sqrt(var(F, x, axis=axis, keepdims=keepdims, ddof=ddof))


def log_softmax(F, x, axis=-1):
    m = F.stop_gradient(F.max(x, axis=axis, keepdims=True))
    shifted = F.sub(x, m)
    return F.sub(shifted, F.log(F.sum(F.exp(shifted), axis=axis, keepdims=True)))


def softmax(F, x, axis=-1, temperature=None):
    if temperature is not None and temperature != 1:
        x = F.div(x, float(temperature))
    m = F.stop_gradient(F.max(x, axis=axis, keepdims=True))
    e = F.exp(F.sub(x, m))
    return F.div(e, F.sum(e, axis=axis, keepdims=True))


def one_hot(F, indices, depth, on_value=1.0, off_value=0.0, dtype="float32"):
    idt = spec_of(indices).dtype
    if idt in INT_DTYPES and idt != "int64":  # positions in int8/uint8 would wrap (259 is 3)
        indices, idt = F.cast(indices, dtype="int64"), "int64"
    idx = F.reshape(indices, shape=_shape(indices) + (1,))
    hot = F.eq(idx, F.arange(start=0, stop=depth, step=1, dtype=idt))
    if on_value == 1.0 and off_value == 0.0:
        return F.cast(hot, dtype=dtype)
    return F.cast(F.where(hot, float(on_value), float(off_value)), dtype=dtype)


def expand_dims(F, x, axis):
    """NumPy's expand_dims: a new size-1 axis at each of ``axis`` (an int or a tuple), which
    must be in range for the result (an out-of-range axis is an error, never clamped)."""
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    nd = len(_shape(x)) + len(axes)
    axes = normalize_axis(axes, nd, "expand_dims")
    dims = iter(_shape(x))
    return F.reshape(x, shape=tuple(1 if i in axes else next(dims) for i in range(nd)))


def squeeze(F, x, axis=None):
    shape = _shape(x)
    if axis is None:
        axes = tuple(i for i, n in enumerate(shape) if n == 1)
    else:
        axes = normalize_axis(axis, len(shape), "squeeze")
        bad = [a for a in axes if shape[a] != 1]
        if bad:
            raise ValueError(f"squeeze: axis {bad[0]} has size {shape[bad[0]]}, not 1")
    return F.reshape(x, shape=tuple(n for i, n in enumerate(shape) if i not in axes))


def flatten(F, x):
    """(N, ...) -> (N, prod(...)), Gluon's Flatten."""
    shape = _shape(x)
    rest = int(math.prod(shape[1:])) if len(shape) > 1 else 1
    return F.reshape(x, shape=(shape[0] if shape else 1, rest))


def swapaxes(F, x, a, b):
    nd = len(_shape(x))
    axes = list(range(nd))
    a, b = (normalize_axis(v, nd, "swapaxes")[0] for v in (a, b))
    axes[a], axes[b] = axes[b], axes[a]
    return F.transpose(x, axes=tuple(axes))


def stack(F, xs, axis=0):
    nd = len(_shape(xs[0])) + 1
    axis = normalize_axis(axis, nd, "stack")[0]
    return F.concatenate(*[expand_dims(F, x, axis) for x in xs], axis=axis)


def split(F, x, indices_or_sections, axis=0):
    shape = _shape(x)
    axis = normalize_axis(axis, len(shape), "split")[0]
    n = shape[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ValueError(f"split: axis {axis} of size {n} does not divide into "
                             f"{indices_or_sections} equal sections")
        step = n // indices_or_sections
        bounds = [i * step for i in range(indices_or_sections + 1)]
    else:
        bounds = [0] + [int(i) for i in indices_or_sections] + [n]
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        begin = [0] * len(shape)
        end = list(shape)
        begin[axis], end[axis] = lo, max(lo, hi)
        outs.append(F.slice(x, begin=tuple(begin), end=tuple(end),
                            step=(1,) * len(shape)))
    return outs


def tile(F, x, reps):
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    shape = _shape(x)
    nd = max(len(shape), len(reps))
    shape = (1,) * (nd - len(shape)) + shape
    reps = (1,) * (nd - len(reps)) + reps
    x = F.reshape(x, shape=tuple(v for n in shape for v in (1, n)))
    x = F.broadcast_to(x, shape=tuple(v for r, n in zip(reps, shape) for v in (r, n)))
    return F.reshape(x, shape=tuple(r * n for r, n in zip(reps, shape)))


def repeat(F, x, repeats, axis=None):
    if axis is None:
        x = F.reshape(x, shape=(int(math.prod(_shape(x))),))
        axis = 0
    shape = _shape(x)
    axis = normalize_axis(axis, len(shape), "repeat")[0]
    inner = shape[:axis + 1] + (1,) + shape[axis + 1:]
    x = F.reshape(x, shape=inner)
    x = F.broadcast_to(x, shape=shape[:axis + 1] + (repeats,) + shape[axis + 1:])
    return F.reshape(x, shape=shape[:axis] + (shape[axis] * repeats,) + shape[axis + 1:])


_SCAN_BLOCK = 256  # elements summed by one triangular matmul (a 256 x 256 mask: 64K values)


def scan_operand(F, x, axis, dtype, who):
    """(x, axis, dtype) of a cumulative sum or product, as NumPy: bool and small integers
    accumulate in int64 unless ``dtype`` says otherwise, axis None scans the flattened
    array; ``axis`` comes back non-negative (0 for a 0-d x)."""
    dt = dtype or spec_of(x).dtype
    if dtype is None and dt in ("bool", "int8", "uint8", "int32"):
        dt = "int64"
    if spec_of(x).dtype != dt:
        x = F.cast(x, dtype=dt)
    if axis is None:
        x = F.reshape(x, shape=(int(math.prod(_shape(x))),))
        axis = 0
    nd = len(_shape(x))
    return x, (normalize_axis(axis, nd, who)[0] if nd else 0), dt


def cumsum(F, x, axis=None, dtype=None):
    """NumPy's cumsum, composed: a prefix sum is a product with a triangular matrix of ones,
    taken per block of ``_SCAN_BLOCK`` with the blocks' totals scanned the same way (work
    O(n * block), memory O(n)). No scan primitive is needed, so gradients (the reversed
    scan) and code generation come from matmul, slice and add. Bool and small integers add
    up in int64, as in NumPy."""
    x, axis, dt = scan_operand(F, x, axis, dtype, "cumsum")
    nd = len(_shape(x))
    if nd == 0:
        return F.reshape(x, shape=(1,))  # NumPy: the 0-d array as a 1-element scan
    if axis != nd - 1:
        x = swapaxes(F, x, axis, -1)
    out = _cumsum_last(F, x, dt)
    return swapaxes(F, out, axis, -1) if axis != nd - 1 else out


def _upper_ones(F, n, dtype):
    """U with U[j, i] = 1 where j <= i: (x @ U)[i] = x[0] + ... + x[i]."""
    pos = F.arange(start=0, stop=n, step=1, dtype="int64")
    return F.cast(F.le(F.reshape(pos, shape=(n, 1)), F.reshape(pos, shape=(1, n))), dtype=dtype)


def _last(F, x, lo, hi):
    shape = _shape(x)
    nd = len(shape)
    return F.slice(x, begin=(0,) * (nd - 1) + (lo,), end=shape[:-1] + (hi,), step=(1,) * nd)


def _cumsum_last(F, x, dt):
    shape = _shape(x)
    n, lead = shape[-1], shape[:-1]
    if not lead:  # the matmul primitive takes matrices
        return F.reshape(_cumsum_last(F, F.reshape(x, shape=(1, n)), dt), shape=(n,))
    if n <= _SCAN_BLOCK:
        return F.matmul(x, _upper_ones(F, n, dt))
    b = _SCAN_BLOCK
    m = -(-n // b)
    if m * b != n:
        x = F.concatenate(x, F.full(shape=lead + (m * b - n,), value=0, dtype=dt), axis=-1)
    inner = F.matmul(F.reshape(x, shape=lead + (m, b)), _upper_ones(F, b, dt))
    totals = F.reshape(_last(F, inner, b - 1, b), shape=lead + (m,))
    before = F.sub(_cumsum_last(F, totals, dt), totals)  # the sum of the earlier blocks
    out = F.add(inner, F.reshape(before, shape=lead + (m, 1)))
    return _last(F, F.reshape(out, shape=lead + (m * b,)), 0, n)


def batch_dot(F, a, b, transpose_a=False, transpose_b=False):
    """MXNet's batch_dot: matmul over the last two axes, either operand transposed first."""
    if transpose_a:
        a = swapaxes(F, a, -1, -2)
    if transpose_b:
        b = swapaxes(F, b, -1, -2)
    return F.matmul(a, b)


def sequence_mask(F, data, length, value=0.0, axis=0):
    """MXNet's SequenceMask: along ``axis`` (0: (seq, batch, ...); 1: (batch, seq, ...)),
    entries at positions >= length[b] become ``value``."""
    shape = _shape(data)
    nd = len(shape)
    if axis not in (0, 1) or nd < 2:
        raise ValueError(f"sequence_mask: axis must be 0 or 1 of a 2+-d array, got axis={axis} "
                         f"for shape {shape}")
    batch = 1 - axis
    if _shape(length) != (shape[batch],):
        raise ValueError(f"sequence_mask: sequence_length must have shape ({shape[batch]},) "
                         f"(the batch axis {batch} of {shape}), got {_shape(length)}")
    pos = F.arange(start=0, stop=shape[axis], step=1, dtype=spec_of(length).dtype)
    pos = F.reshape(pos, shape=tuple(shape[axis] if i == axis else 1 for i in range(nd)))
    length = F.reshape(length, shape=tuple(shape[batch] if i == batch else 1
                                            for i in range(nd)))
    return F.where(F.lt(pos, length), data, value)


def topk(F, data, axis=-1, k=1, ret_typ="indices", is_ascend=False, dtype="float32"):
    """MXNet's topk, composed: k rounds of argmax (argmin when ascending), each masking the
    position it found, so ties go to the first position as in a stable sort. Values come by
    ``pick``, which carries the gradient. k < 1 sorts the whole axis (k = its length)."""
    if ret_typ not in ("value", "indices", "mask", "both"):
        raise ValueError(f"topk: ret_typ must be 'value', 'indices', 'mask' or 'both', got "
                         f"{ret_typ!r}")
    shape = _shape(data)
    nd = len(shape)
    axis = normalize_axis(axis, nd, "topk")[0]
    n = shape[axis]
    k = n if k < 1 else int(k)
    if k > n:
        raise ValueError(f"topk: k={k} is larger than axis {axis} of length {n}")
    x = swapaxes(F, data, axis, -1) if axis != nd - 1 else data
    dt = spec_of(data).dtype
    # the search runs on a float copy, where a found position can be masked with -inf (+inf)
    work = x if dt.startswith("float") else F.cast(x, dtype="float64")
    find, fill = (F.argmin, float("inf")) if is_ascend else (F.argmax, float("-inf"))
    found, hots = [], []
    for _ in range(k):
        i = find(work, axis=-1)
        hot = one_hot(F, i, n, dtype="bool")
        work = F.where(hot, fill, work)
        found.append(i)
        hots.append(hot)
    back = (lambda v: swapaxes(F, v, axis, -1)) if axis != nd - 1 else (lambda v: v)
    if ret_typ == "mask":
        mask = hots[0]
        for hot in hots[1:]:
            mask = F.logical_or(mask, hot)
        return back(F.cast(mask, dtype=dt))
    idx = stack(F, found, axis=-1)
    values = stack(F, [F.pick(x, i, axis=-1) for i in found], axis=-1)
    indices = back(F.cast(idx, dtype=dtype) if dtype != "int64" else idx)
    if ret_typ == "indices":
        return indices
    if ret_typ == "value":
        return back(values)
    return back(values), indices


def linear(F, x, weight, bias=None, flatten_input=True):
    """Gluon's Dense: x @ weight.T + bias, weight of shape (units, in_units)."""
    if flatten_input and len(_shape(x)) != 2:
        x = flatten(F, x)
    y = F.matmul(x, F.transpose(weight, axes=(1, 0)))
    return F.add(y, bias) if bias is not None else y


def batch_norm_train(F, x, gamma, beta, axis=1, eps=1e-5):
    """Normalize with the batch statistics; returns (y, batch_mean, batch_var)."""
    nd = len(_shape(x))
    axis = axis % nd
    red = tuple(i for i in range(nd) if i != axis)
    bshape = tuple(n if i == axis else 1 for i, n in enumerate(_shape(x)))
    mu = mean(F, x, axis=red, keepdims=True)
    d = F.sub(x, mu)
    v = mean(F, F.mul(d, d), axis=red, keepdims=True)
    y = F.mul(d, F.rsqrt(F.add(v, float(eps))))
    y = F.add(F.mul(y, F.reshape(gamma, shape=bshape)), F.reshape(beta, shape=bshape))
    c = (_shape(x)[axis],)
    return y, F.reshape(mu, shape=c), F.reshape(v, shape=c)


def batch_norm_running(F, x, running, batch, axis=1, momentum=0.9):
    """A running statistic after the training batch ``x``: ``momentum * running + (1 -
    momentum) * batch``, cut off from the differentiated graph.

    A batch with no element per channel (0 rows, or an empty spatial extent) has no
    statistics (its mean is NaN): ``running`` itself is returned, unchanged, as PyTorch
    leaves it. The count is static (shapes are part of every graph's key), so each backend
    sees either the plain update or no op at all."""
    nd = len(_shape(x))
    if count(_shape(x), tuple(i for i in range(nd) if i != axis % nd)) == 0:
        return running
    return F.add(F.mul(F.stop_gradient(running), momentum),
                 F.mul(F.stop_gradient(batch), 1 - momentum))


def batch_norm_infer(F, x, gamma, beta, running_mean, running_var, axis=1, eps=1e-5):
    nd = len(_shape(x))
    axis = axis % nd
    bshape = tuple(n if i == axis else 1 for i, n in enumerate(_shape(x)))
    scale = F.mul(gamma, F.rsqrt(F.add(running_var, float(eps))))
    shift = F.sub(beta, F.mul(running_mean, scale))
    return F.add(F.mul(x, F.reshape(scale, shape=bshape)), F.reshape(shift, shape=bshape))


def layer_norm(F, x, gamma, beta, axis=-1, eps=1e-5):
    nd = len(_shape(x))
    axis = axis % nd
    mu = mean(F, x, axis=axis, keepdims=True)
    d = F.sub(x, mu)
    v = mean(F, F.mul(d, d), axis=axis, keepdims=True)
    bshape = tuple(n if i == axis else 1 for i, n in enumerate(_shape(x)))
    y = F.mul(d, F.rsqrt(F.add(v, float(eps))))
    return F.add(F.mul(y, F.reshape(gamma, shape=bshape)), F.reshape(beta, shape=bshape))


def gelu(F, x):
    return F.mul(F.mul(x, 0.5), F.add(F.erf(F.mul(x, 1.0 / math.sqrt(2.0))), 1.0))


def softrelu(F, x):
    """log(1 + exp(x)), computed stably as max(x, 0) + log1p(exp(-|x|))."""
    return F.add(F.relu(x), F.log1p(F.exp(F.neg(F.abs(x)))))


def dropout(F, x, p, key):
    """Inverted dropout with a keep mask drawn from the counter-based RNG at ``key``."""
    if p <= 0:
        return x
    u = F.random_uniform(key, shape=_shape(x), low=0.0, high=1.0, dtype=spec_of(x).dtype)
    return F.where(F.ge(u, float(p)), F.mul(x, 1.0 / (1.0 - p)), 0.0)
