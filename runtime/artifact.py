"""The deployment artifact on disk: a directory of parts plus manifest.json with a sha256 of
every part. Written atomically (a temp directory, then rename); read back as untrusted data:
a missing, truncated, tampered or wrong-version part is refused with a message naming it."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

FORMAT = "hybrid.artifact"
FORMAT_VERSION = 1
MAX_PART_BYTES = 4 << 30
MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """An artifact cannot be read or trusted; the message names the part and the reason."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_artifact(path, parts: dict, manifest: dict) -> Path:
    """Write ``parts`` (name -> bytes) and the manifest to directory ``path`` atomically."""
    path = Path(path)
    for name in parts:
        if "/" in name or "\\" in name or name.startswith(".") or name == MANIFEST:
            raise ArtifactError(f"part name {name!r} is not a plain file name")
    doc = dict(manifest)
    doc.update({"format": FORMAT, "format_version": FORMAT_VERSION,
                "parts": {n: {"sha256": _sha256(b), "bytes": len(b)} for n, b in parts.items()}})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        for name, data in list(parts.items()) + [(MANIFEST, json.dumps(doc, indent=1,
                                                                        sort_keys=True).encode())]:
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_artifact(path) -> tuple[dict, dict]:
    """(manifest, parts) after checking the format, version, sizes and checksums."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: no such artifact directory (export writes a directory)")
    try:
        raw = (path / MANIFEST).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: manifest.json cannot be read: {exc}") from None
    if len(raw) > 16 << 20:
        raise ArtifactError(f"{path}: manifest.json is {len(raw)} bytes, too large to be real")
    try:
        man = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: manifest.json is not valid JSON: {exc}") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise ArtifactError(f"{path}: manifest.json does not describe a hybrid artifact")
    if man.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {man.get('format_version')!r}; "
                            f"this hybrid reads version {FORMAT_VERSION}")
    parts = {}
    listed = man.get("parts")
    if not isinstance(listed, dict):
        raise ArtifactError(f"{path}: manifest.json lists no parts")
    for name, meta in listed.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise ArtifactError(f"{path}: part name {name!r} would escape the artifact")
        try:
            size, digest = int(meta["bytes"]), str(meta["sha256"])
        except (KeyError, TypeError, ValueError):
            raise ArtifactError(f"{path}: manifest entry for {name} is malformed") from None
        if size > MAX_PART_BYTES:
            raise ArtifactError(f"{path}: part {name} claims {size} bytes, over the limit")
        try:
            data = (path / name).read_bytes()
        except OSError:
            raise ArtifactError(f"{path}: part {name} is missing") from None
        if len(data) != size:
            raise ArtifactError(f"{path}: part {name} has {len(data)} bytes, the manifest says "
                                f"{size} (truncated or replaced)")
        if _sha256(data) != digest:
            raise ArtifactError(f"{path}: part {name} fails its sha256 check (damaged or "
                                "tampered)")
        parts[name] = data
    return man, parts
