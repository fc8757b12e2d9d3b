"""The deployment artifact on disk: a directory of parts plus manifest.json with a sha256 of
every part. Written atomically (a temp directory, then rename); read back as untrusted data:
a missing, truncated, tampered or wrong-version part is refused with a message naming it.

Format version 1 (the only one so far) knows two parts, ``graph.json`` and
``weights.safetensors``. Anything else listed in the manifest is refused, never ignored and
never read: in particular native code (``*.so``, ``*.o``, ...) is not part of the format,
whatever ``trust_native_code`` says. Files in the directory that the manifest does not list
are never opened. Reading is bounded: the manifest and every part are checked with ``lstat``
(a regular file, not a link, of the claimed size) before a byte is read.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

from .atomic import make_staging_dir, publish_dir, restore_replaced, sweep_dead, temp_sibling

FORMAT = "hybrid.artifact"
FORMAT_VERSION = 1
MAX_PART_BYTES = 4 << 30
MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_DEPTH = 64
MANIFEST = "manifest.json"
KNOWN_PARTS = ("graph.json", "weights.safetensors")
NATIVE_SUFFIXES = (".so", ".o", ".obj", ".dll", ".dylib", ".a", ".bc", ".ll", ".ptx", ".cubin",
                   ".fatbin", ".hsaco", ".exe", ".bin")
_PART_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


class ArtifactError(ValueError):
    """An artifact cannot be read or trusted; the message names the part and the reason."""


def clip(text, limit: int = 200) -> str:
    """A value from the artifact, cut short for an error message."""
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= limit else text[:limit - 20] + f"... ({len(text)} chars)"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plain_part_name(name) -> bool:
    """A part name is one plain file name: letters, digits, '.', '_', '-'; no path."""
    return isinstance(name, str) and bool(_PART_NAME.match(name)) and name != MANIFEST \
        and ".." not in name


def write_artifact(path, parts: dict, manifest: dict) -> Path:
    """Write ``parts`` (name -> bytes) and the manifest to directory ``path`` atomically."""
    path = Path(path)
    for name in parts:
        if not plain_part_name(name):
            raise ArtifactError(f"part name {name!r} is not a plain file name")
    doc = dict(manifest)
    doc.update({"format": FORMAT, "format_version": FORMAT_VERSION,
                "parts": {n: {"sha256": _sha256(b), "bytes": len(b)} for n, b in parts.items()}})
    tmp = make_staging_dir(path, "tmp")
    try:
        for name, data in list(parts.items()) + [(MANIFEST, json.dumps(doc, indent=1,
                                                                        sort_keys=True).encode())]:
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        publish(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def staging_path(path) -> Path:
    """A fresh sibling directory name to write an artifact to before :func:`publish` (what
    a dead writer left beside ``path`` is removed first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead(path)
    return temp_sibling(path, "staging")


publish = publish_dir  # move a complete artifact directory into place


def parse_json(raw: bytes, what: str, max_depth: int = MAX_JSON_DEPTH):
    """Parse untrusted JSON: UTF-8 only, no duplicate keys, at most ``max_depth`` levels;
    every failure is an ArtifactError naming ``what``."""
    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ArtifactError(f"{what} repeats the key {clip(repr(k))} (ambiguous; refused)")
            out[k] = v
        return out
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        doc = json.loads(text, object_pairs_hook=no_duplicates)
    except ArtifactError:
        raise
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{what} is not valid JSON: not UTF-8 ({exc})") from None
    except RecursionError:
        raise ArtifactError(f"{what} is not valid JSON: nested too deeply") from None
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise ArtifactError(f"{what} is not valid JSON: {clip(str(exc), 300)}") from None
    if json_depth(doc) > max_depth:
        raise ArtifactError(f"{what} is nested more than {max_depth} levels deep; refused")
    return doc


def json_depth(doc) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    depth, stack = 0, [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in v)
    return depth


def _regular_file(path: Path, what: str, limit: int) -> int:
    """Size of ``path`` after checking it is a regular file (not a link, FIFO or device)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ArtifactError(f"{what} is missing ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise ArtifactError(f"{what} is a symbolic link; artifact parts must be plain files "
                            "inside the artifact")
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{what} is not a regular file")
    if st.st_size > limit:
        raise ArtifactError(f"{what} is {st.st_size} bytes, over the limit of {limit}")
    return st.st_size


def _read_exactly(path: Path, size: int, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ArtifactError(f"{what} cannot be opened: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArtifactError(f"{what} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(size + 1)  # one more byte than claimed: a file that grew is caught
    finally:
        os.close(fd)
    return data


def _check_part_name(path, name, known, trust_native_code):
    if not plain_part_name(name):
        raise ArtifactError(f"{path}: part name {clip(repr(name))} would escape the artifact "
                            "or is not a plain file name (letters, digits, '.', '_', '-')")
    if known is None or name in known:
        return
    if name.lower().endswith(NATIVE_SUFFIXES):
        if trust_native_code:
            raise ArtifactError(
                f"{path}: part {name} is native code. trust_native_code=True was given, but "
                "running native code shipped in an artifact is not implemented in this hybrid "
                "(kernels are always generated on the loading machine); refusing the artifact "
                "rather than ignoring the part. Remove the part from the artifact or re-export.")
        raise ArtifactError(
            f"{path}: part {name} is native code; hybrid never loads or runs code shipped in "
            "an artifact (trust_native_code=False), and format version "
            f"{FORMAT_VERSION} has no native-code part. Refused; re-export the model.")
    raise ArtifactError(f"{path}: part {name} is not part of artifact format version "
                        f"{FORMAT_VERSION} (known parts: {', '.join(known)}); refusing rather "
                        "than ignoring what this hybrid does not understand")


def read_manifest(path) -> dict:
    """The parsed, checked manifest of the artifact at ``path`` (no part is read)."""
    path = Path(path)
    if not path.is_dir():
        restore_replaced(path)  # an export killed mid-publish left the old one aside
    if not path.is_dir():
        raise ArtifactError(f"{path}: no such artifact directory (export writes a directory)")
    size = _regular_file(path / MANIFEST, f"{path}: manifest.json", MAX_MANIFEST_BYTES)
    raw = _read_exactly(path / MANIFEST, size, f"{path}: manifest.json")
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ArtifactError(f"{path}: manifest.json is too large to be real")
    man = parse_json(raw, f"{path}: manifest.json")
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise ArtifactError(f"{path}: manifest.json does not describe a hybrid artifact "
                            f"(format is not {FORMAT!r})")
    ver = man.get("format_version")
    if not isinstance(ver, int) or isinstance(ver, bool):
        raise ArtifactError(f"{path}: manifest.json has no valid format_version "
                            f"({clip(repr(ver), 40)}); "
                            f"this hybrid reads version {FORMAT_VERSION}")
    if ver > FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {ver} was written by a newer "
                            f"hybrid; this hybrid reads version {FORMAT_VERSION}: upgrade "
                            "hybrid to load it")
    if ver != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {ver} is unknown; this hybrid "
                            f"reads version {FORMAT_VERSION} (re-export the model)")
    if not isinstance(man.get("parts"), dict) or not man["parts"]:
        raise ArtifactError(f"{path}: manifest.json lists no parts")
    return man


def read_artifact(path, known=KNOWN_PARTS, trust_native_code: bool = False) -> tuple[dict, dict]:
    """(manifest, parts) after checking the format, version, part names, sizes and checksums.

    ``known``: the part names this reader understands (None accepts any plain name); every
    name is checked before any part is read, so a refused part is never opened.
    """
    path = Path(path)
    man = read_manifest(path)
    listed = man["parts"]
    for name in listed:
        _check_part_name(path, name, known, trust_native_code)
    parts = {}
    total = 0
    for name, meta in listed.items():
        if not isinstance(meta, dict):
            raise ArtifactError(f"{path}: manifest entry for {name} is malformed")
        size, digest = meta.get("bytes"), meta.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ArtifactError(f"{path}: manifest entry for {name} has no valid size "
                                f"({clip(repr(size), 40)})")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ArtifactError(f"{path}: manifest entry for {name} has no valid sha256")
        if size > MAX_PART_BYTES:
            raise ArtifactError(f"{path}: part {name} claims {size} bytes, over the limit of "
                                f"{MAX_PART_BYTES}")
        total += size
        if total > MAX_PART_BYTES:
            raise ArtifactError(f"{path}: the parts claim {total} bytes together, over the "
                                f"limit of {MAX_PART_BYTES}")
        actual = _regular_file(path / name, f"{path}: part {name}", MAX_PART_BYTES)
        if actual != size:
            raise ArtifactError(f"{path}: part {name} has {actual} bytes, the manifest says "
                                f"{size} (truncated or replaced)")
        data = _read_exactly(path / name, size, f"{path}: part {name}")
        if len(data) != size:
            raise ArtifactError(f"{path}: part {name} has {len(data)} bytes, the manifest says "
                                f"{size} (truncated or replaced)")
        if _sha256(data) != digest:
            raise ArtifactError(f"{path}: part {name} fails its sha256 check (damaged or "
                                "tampered)")
        parts[name] = data
    return man, parts
