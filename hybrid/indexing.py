"""NumPy indexing on NDArrays, lowered to registry ops (slice, reshape, take, slice_update).

Basic indexing (ints, slices, None, Ellipsis) and integer-array indexing on consecutive
leading axes work eagerly and in traces; boolean masks need the mask's value, so they work
eagerly only (a data-dependent shape cannot be traced).
"""
from __future__ import annotations

import numbers

import numpy as np

from . import _state
from .ndarray import NDArray, apply, array, reshape


def _is_array_index(k) -> bool:
    return isinstance(k, (NDArray, np.ndarray, list, range))


def _expand(key, ndim):
    """key -> list over axes of ('int', i) | ('slice', s) | ('new',) | ('array', a)."""
    key = key if isinstance(key, tuple) else (key,)
    n_used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_used > ndim:
        raise IndexError(f"too many indices for an array of {ndim} dimension(s): "
                         f"{n_used} were given")
    out = []
    for k in key:
        if k is Ellipsis:
            out.extend(("slice", slice(None)) for _ in range(ndim - n_used))
        elif k is None:
            out.append(("new",))
        elif isinstance(k, slice):
            out.append(("slice", k))
        elif isinstance(k, (bool, np.bool_)):
            raise IndexError("a Python bool is not a valid index")
        elif isinstance(k, numbers.Integral):
            out.append(("int", int(k)))
        elif _is_array_index(k):
            out.append(("array", k))
        else:
            raise IndexError(f"only integers, slices, None, Ellipsis and integer arrays are "
                             f"valid indices, got {type(k).__name__}")
    used = sum(1 for e in out if e[0] != "new")
    out.extend(("slice", slice(None)) for _ in range(ndim - used))
    return out


def _basic(x, entries):
    """Apply int/slice/None entries: returns (result, shape of the selected region)."""
    begin, end, step, final = [], [], [], []
    axis = 0
    for e in entries:
        if e[0] == "new":
            final.append(1)
            continue
        n = x.shape[axis]
        if e[0] == "int":
            i = e[1]
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            i %= n
            begin.append(i), end.append(i + 1), step.append(1)
        else:
            b, en, st = e[1].indices(n)
            final.append(len(range(b, en, st)))
            if en < 0:  # a reverse slice through index 0: -1 would mean the last element
                en = -n - 1
            begin.append(b), end.append(en), step.append(st)
        axis += 1
    return tuple(begin), tuple(end), tuple(step), tuple(final)


def _index_array(k, device):
    if isinstance(k, NDArray):
        if k._dtype == "bool":
            raise IndexError("boolean masks are handled separately")
        return k.astype("int64", copy=False) if k._dtype != "int64" else k
    a = np.asarray(list(k) if isinstance(k, range) else k)
    if a.dtype == bool:
        raise IndexError("boolean masks are handled separately")
    if a.dtype.kind not in "iu":
        raise IndexError(f"arrays used as indices must be of integer type, got {a.dtype}")
    return array(a, dtype="int64", device=device)


def getitem(x: NDArray, key):
    if isinstance(key, NDArray) and key._dtype == "bool" or (
            isinstance(key, np.ndarray) and key.dtype == bool):
        return _mask_getitem(x, key)
    entries = _expand(key, x.ndim)
    arrays = [i for i, e in enumerate(entries) if e[0] == "array"]
    if not arrays:
        begin, end, step, final = _basic(x, entries)
        out = x
        if any((b, e, s) != (0, n, 1) for b, e, s, n in zip(begin, end, step, x.shape)):
            out = apply("slice", (x,), {"begin": begin, "end": end, "step": step})
        return reshape(out, final) if tuple(out.shape) != final else out
    return _advanced(x, entries, arrays)


def _advanced(x, entries, arrays):
    if any(e[0] == "new" for e in entries) or arrays != list(range(arrays[0], arrays[-1] + 1)):
        raise IndexError("integer-array indices must sit on consecutive axes without None "
                         "(e.g. x[idx], x[:, idx] or x[rows, cols])")
    first = arrays[0]
    # basic slicing on the other axes first; integer entries become length-1 arrays
    pre = []
    for i, e in enumerate(entries):
        if e[0] == "array":
            pre.append(("slice", slice(None)))
        else:
            pre.append(("slice", slice(e[1], e[1] + 1 or None)) if e[0] == "int" else e)
    begin, end, step, _ = _basic(x, pre)
    if any((b, e, s) != (0, n, 1) for b, e, s, n in zip(begin, end, step, x.shape)):
        x = apply("slice", (x,), {"begin": begin, "end": end, "step": step})
    idx = [_index_array(entries[i][1], x.device) for i in arrays]
    dims = [x.shape[i] for i in arrays]
    if len(idx) == 1:
        flat = idx[0]
    else:
        shape = np.broadcast_shapes(*[tuple(i.shape) for i in idx])
        flat = None
        for i, (ix, n) in enumerate(zip(idx, dims)):
            stride = int(np.prod(dims[i + 1:], dtype=np.int64))
            # each array checked against its own axis (IndexError out of [-n, n), eagerly
            # and compiled) and counted from the end when negative: take from arange(n)
            with x.device:  # a source op: on x's device, beside the index arrays
                axis_range = apply("arange", (), {"start": 0, "stop": n, "step": 1,
                                                  "dtype": ix.dtype})
            term = apply("take", (axis_range, ix), {"axis": 0, "mode": "raise"}) * stride
            flat = term if flat is None else flat + term
        flat = apply("broadcast_to", (flat,), {"shape": tuple(shape)})
    lead = x.shape[:first]
    rest = x.shape[first + len(arrays):]
    merged = reshape(x, lead + (int(np.prod(dims, dtype=np.int64)),) + rest)
    out = apply("take", (merged, flat), {"axis": first, "mode": "raise"})
    drop = [i for i, e in enumerate(entries) if e[0] == "int"]
    if drop:
        shape = list(out.shape)
        nidx = len(flat.shape)
        for i in sorted(drop, reverse=True):
            pos = i if i < first else i - len(arrays) + nidx
            shape.pop(pos)
        out = reshape(out, tuple(shape))
        group = sorted(drop + arrays)  # NumPy: integers count as advanced indices too,
        if group != list(range(group[0], group[-1] + 1)):  # and a split group goes first
            pos = sum(1 for i in range(first) if entries[i][0] != "int")
            nidx = len(flat.shape)
            axes = list(range(pos, pos + nidx)) + list(range(pos)) + \
                list(range(pos + nidx, len(out.shape)))
            out = apply("transpose", (out,), {"axes": tuple(axes)})
    return out


def _mask_getitem(x, mask):
    if _state.tracing():
        raise IndexError("boolean-mask indexing has a data-dependent shape and cannot be "
                         "hybridized; use hb.where(mask, x, 0) or index outside the block")
    m = mask.asnumpy() if isinstance(mask, NDArray) else np.asarray(mask)
    if m.shape != x.shape[:m.ndim]:
        raise IndexError(f"boolean index of shape {m.shape} does not match the array's "
                         f"leading shape {x.shape[:m.ndim]}")
    rows = np.flatnonzero(m.reshape(-1))
    merged = reshape(x, (int(np.prod(m.shape)),) + x.shape[m.ndim:])
    return apply("take", (merged, array(rows, dtype="int64", device=x.device)),
                 {"axis": 0, "mode": "clip"})


def setitem(x: NDArray, key, value):
    entries = _expand(key, x.ndim)
    if any(e[0] == "array" for e in entries) or isinstance(key, NDArray):
        raise IndexError("assignment through integer-array or boolean indices is not supported;"
                         " use hb.where(mask, value, x) for masks, or basic slices")
    begin, end, step, final = _basic(x, entries)
    region = tuple(len(range(*slice(b, e, s).indices(n)))
                   for b, e, s, n in zip(begin, end, step, x.shape))
    if not isinstance(value, NDArray) and not np.isscalar(value) and \
            not _state.tracing():
        value = array(value, dtype=x._dtype, device=x.device)
    if isinstance(value, NDArray):
        if value.device != x.device and not _state.tracing():
            raise ValueError(f"setitem: the value is on {value.device} and the array on "
                             f"{x.device}; move the value first: value.copyto({x.device})")
        if value._dtype != x._dtype:
            value = value.astype(x._dtype)
        if tuple(value.shape) != region:
            try:
                value = apply("broadcast_to", (value,), {"shape": final})
            except ValueError:
                raise ValueError(f"setitem: could not broadcast a value of shape {value.shape}"
                                 f" into the selection of shape {final}") from None
            value = reshape(value, region)
    if all((b, e, s) == (0, n, 1) for b, e, s, n in zip(begin, end, step, x.shape)):
        if isinstance(value, NDArray):
            new = apply("broadcast_to", (value, ), {"shape": x.shape})
        else:  # a source op: made on x's device (the current one may be another)
            with x.device:
                new = apply("full", (), {"shape": x.shape, "value": value, "dtype": x._dtype})
        if new is value:
            new = apply("copy", (value,), {})
    else:
        new = apply("slice_update", (x, value), {"begin": begin, "end": end, "step": step})
    if new._dtype != x._dtype:
        new = new.astype(x._dtype)
    x._rebind(new)
