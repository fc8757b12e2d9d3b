"""Gluon's utilities (the book's ``gluon.utils``): ``split_and_load`` and ``split_data``
(hybrid/parallel.py's), ``clip_global_norm`` and ``download``."""
from __future__ import annotations

import hashlib
import math
import os
import urllib.error
import urllib.request
import warnings

from runtime.atomic import write_bytes

from .ndarray import NDArray, minimum, sqrt
from .ndarray import sum as _sum
from .parallel import split_and_load, split_data  # noqa: F401 - gluon.utils names

__all__ = ["split_and_load", "split_data", "clip_global_norm", "download", "check_sha1",
           "DownloadError"]


class DownloadError(RuntimeError):
    """A file could not be fetched; ``reason`` says why, the message what to do instead."""

    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


def clip_global_norm(arrays, max_norm, check_isfinite=True):
    """Scale ``arrays`` (gradients, usually) in place so that their joint 2-norm is at most
    ``max_norm``; returns that norm before scaling. With ``check_isfinite`` (the default, as
    in Gluon) the norm comes back as a Python float, which waits for it, and a NaN or inf
    norm warns; otherwise it is an array and nothing waits."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("clip_global_norm: no arrays given")
    if not all(isinstance(a, NDArray) for a in arrays):
        raise TypeError("clip_global_norm: arrays must be hybrid arrays")
    device = arrays[0].device
    total = None
    for a in arrays:
        f = a if a._dtype.startswith("float") else a.astype("float32")
        sq = _sum(f * f)
        sq = sq if sq.device == device else sq.to(device)
        total = sq if total is None else total + sq
    norm = sqrt(total)
    # min(1, max_norm / norm): computed on the engine, so scaling never waits for the norm
    scale = minimum(float(max_norm) / (norm + 1e-8), 1.0)
    for a in arrays:
        s = scale if a.device == device else scale.to(a.device)
        a[:] = a * s.astype(a._dtype)
    if not check_isfinite:
        return norm
    value = float(norm)
    if not math.isfinite(value):
        warnings.warn(f"clip_global_norm: the norm is {value}; the arrays now hold "
                      "non-finite values", UserWarning, stacklevel=2)
    return value


def check_sha1(filename, sha1_hash) -> bool:
    """Whether the file's SHA-1 is ``sha1_hash``."""
    h = hashlib.sha1()
    with open(filename, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest() == sha1_hash


def download(url, path=None, overwrite=False, sha1_hash=None, retries=5, verify_ssl=True,
             timeout=30):
    """Fetch ``url`` to ``path`` and return the file's path. ``path`` is a file, or a folder
    (existing, or ending in a separator) for the URL's file name; the current folder by
    default. A file already there (with the right SHA-1, when given) is used as it is, so a
    reader without network places it by hand: a failed fetch raises an error naming the
    file and where to put it. The file is written whole or not at all (runtime/atomic.py)."""
    name = url.split("/")[-1].split("?")[0] or "download"
    path = os.path.expanduser(os.fspath(path)) if path is not None else ""
    if not path or os.path.isdir(path) or path.endswith(os.sep):
        fname = os.path.join(path, name)  # a folder: the file keeps the URL's name
    else:
        fname = path
    fname = os.path.abspath(fname)
    if os.path.exists(fname) and not overwrite and (sha1_hash is None or
                                                     check_sha1(fname, sha1_hash)):
        return fname
    errors = []
    for _ in range(max(1, int(retries))):
        try:
            blob = _fetch(url, timeout, verify_ssl)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            errors.append(str(exc))
            if not _transient(exc):
                break
            continue
        if sha1_hash is not None and hashlib.sha1(blob).hexdigest() != sha1_hash:
            errors.append(f"the downloaded file's SHA-1 is not {sha1_hash}")
            continue
        write_bytes(fname, blob)
        return fname
    raise DownloadError(
        f"download: could not fetch {url} ({errors[-1]}). Without network access, fetch "
        f"'{name}' elsewhere and place it at {fname}; it is then used as it is"
        + (f" (its SHA-1 must be {sha1_hash})" if sha1_hash else "") + ".", errors[-1])


def _fetch(url, timeout, verify_ssl):
    kwargs = {}
    if not verify_ssl and url.startswith("https:"):
        import ssl  # noqa: PLC0415 - only for this request
        kwargs["context"] = ssl._create_unverified_context()  # noqa: S323 - asked for
    with urllib.request.urlopen(url, timeout=timeout, **kwargs) as resp:
        return resp.read()


def _transient(exc) -> bool:
    """A failure worth retrying: a timeout or a server error, not a missing host or file."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, TimeoutError)
