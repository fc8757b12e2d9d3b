"""Array checkpoints in safetensors: ``hb.save(path, arrays)`` / ``hb.load_arrays(path)``.

No pickle: safetensors stores raw little-endian tensors behind a JSON header. Files are
written atomically (a temporary file in the same directory, fsync, then ``os.replace``), so a
crash leaves either the old file or the new one. Reading checks the header against the
file's size first, so a truncated or damaged file is refused with a message saying why.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np

from runtime.atomic import write_bytes

from .ndarray import NDArray, array

__all__ = ["save", "load_arrays", "write_safetensors", "read_safetensors", "CheckpointError"]

_META_KEY = "hybrid"
_SUM_KEY = "hybrid.sha256"
_DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "F32": 4, "I32": 4, "U32": 4, "F64": 8, "I64": 8, "U64": 8}


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, damaged or not what was expected."""


def _numpy(v) -> np.ndarray:
    if isinstance(v, NDArray):
        return v.asnumpy()
    if hasattr(v, "get") and not isinstance(v, np.ndarray):  # cupy
        return v.get()
    return np.asarray(v)


def write_safetensors(path, arrays: dict, meta: dict | None = None):
    """Write ``{name: array}`` and a JSON ``meta`` entry to ``path`` atomically."""
    from safetensors.numpy import save as _st_save  # noqa: PLC0415
    path = os.fspath(path)
    tensors = {}
    for k, v in arrays.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"checkpoint keys must be non-empty strings, got {k!r}")
        a = np.ascontiguousarray(_numpy(v))
        if a.dtype == object:
            raise TypeError(f"checkpoint entry '{k}' is not a numeric array")
        tensors[k] = a
    meta = dict(meta or {})
    meta["keys"] = list(tensors)  # safetensors sorts its entries; keep the caller's order
    # safetensors checks framing, not data: a flipped bit in a weight would load silently
    meta["sha256"] = _digest(tensors, meta["keys"])
    # the checksum twice, in two places: damage that renames one still leaves the other
    metadata = {_META_KEY: json.dumps(meta, sort_keys=True), _SUM_KEY: meta["sha256"]}
    blob = _st_save(tensors, metadata=metadata)
    write_bytes(path, blob)


def _digest(arrays: dict, order) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in ``order``."""
    h = hashlib.sha256()
    for k in order:
        a = np.ascontiguousarray(arrays[k])
        h.update(json.dumps([k, a.dtype.str, list(a.shape)]).encode())
        h.update(memoryview(a).cast("B") if a.size else b"")
    return h.hexdigest()


def _validate(blob: bytes, path: str) -> dict:
    """Check the safetensors framing against the file's size; returns the header."""
    n = len(blob)
    if n < 8:
        raise CheckpointError(f"'{path}' is not a checkpoint: {n} bytes is shorter than the "
                              "8-byte safetensors header length (empty or truncated file)")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > n - 8:
        raise CheckpointError(f"'{path}' is truncated or not a safetensors file: its header "
                              f"claims {hlen} bytes but only {n - 8} follow")
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"'{path}' is damaged or not a safetensors file: its header is "
                              f"not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"'{path}' is damaged: its header is not a JSON object")
    data_len = n - 8 - hlen
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            lo, hi = (int(o) for o in info["data_offsets"])
            shape = [int(s) for s in info["shape"]]
            size = _DTYPE_SIZES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"'{path}' is damaged: bad header entry for '{name}'") \
                from None
        if hi - lo != size * int(np.prod(shape, dtype=np.int64)) or lo < 0 or hi < lo:
            raise CheckpointError(f"'{path}' is damaged: entry '{name}' has inconsistent "
                                  "offsets for its shape and dtype")
        end = max(end, hi)
    if end > data_len:
        raise CheckpointError(f"'{path}' is truncated: its tensors need {end} bytes of data "
                              f"but the file holds {data_len}")
    if end < data_len:
        raise CheckpointError(f"'{path}' is damaged: {data_len - end} unexpected bytes after "
                              "the tensor data")
    return header


def read_safetensors(path):
    """``({name: numpy array}, meta dict)`` from a file written by ``write_safetensors``
    (or any safetensors file); refuses truncated or damaged files with a clear message."""
    from safetensors.numpy import load as _st_load  # noqa: PLC0415
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint '{path}' does not exist") from None
    header = _validate(blob, path)
    try:
        arrays = _st_load(blob)
    except Exception as exc:  # safetensors raises its own error type
        raise CheckpointError(f"'{path}' could not be read as safetensors: {exc}") from None
    meta = {}
    st_meta = header.get("__metadata__") or {}
    raw = st_meta.get(_META_KEY) if isinstance(st_meta, dict) else None
    if raw:
        try:
            meta = json.loads(raw)
        except json.JSONDecodeError:
            raise CheckpointError(f"'{path}' is damaged: its hybrid metadata is not valid "
                                  "JSON") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"'{path}' is damaged: its hybrid metadata is not an object")
    order = meta.pop("keys", None)
    digests = {d for d in (meta.pop("sha256", None), isinstance(st_meta, dict) and
                           st_meta.get(_SUM_KEY)) if d}
    if digests and (not isinstance(order, list) or sorted(map(str, order)) != sorted(arrays)
                    or {_digest(arrays, order)} != digests):
        raise CheckpointError(f"'{path}' is damaged: its tensors do not match the checksum "
                              "written with them (a changed byte); restore it from a copy")
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(arrays):
        order = sorted(arrays, key=lambda k: header[k]["data_offsets"][0])
    return {k: arrays[k] for k in order}, meta


def save(path, data):
    """Save an array, a list of arrays or a dict of name -> array (MXNet's ``npx.save``)."""
    if isinstance(data, dict):
        kind, arrays = "dict", {str(k): v for k, v in data.items()}
    elif isinstance(data, (list, tuple)):
        kind, arrays = "list", {str(i): v for i, v in enumerate(data)}
    else:
        kind, arrays = "array", {"0": data}
    write_safetensors(path, arrays, {"format": "hybrid.arrays", "version": 1, "kind": kind})


def load_arrays(path, device=None):
    """Arrays saved by ``hb.save``: an array, a list or a dict, as saved (hybrid arrays on
    ``device``). Any other safetensors file loads as a dict."""
    arrays, meta = read_safetensors(path)
    out = {k: array(v, dtype=v.dtype, device=device) for k, v in arrays.items()}
    kind = meta.get("kind") if meta.get("format") == "hybrid.arrays" else "dict"
    if kind == "array":
        return out["0"]
    if kind == "list":
        return [out[str(i)] for i in range(len(out))]
    return out
