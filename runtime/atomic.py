"""Atomic writes that leave nothing behind and follow the umask.

Every file or directory the project writes for a user (checkpoints, artifacts, ONNX models,
compiled code in the cache) is written under a temporary sibling name and renamed into place,
so a crash never leaves half a file under the real name. The temporary name carries the
writer's process id: the next write to the same place removes what a dead writer left (a
killed ``save_parameters`` no longer leaves its bytes on disk for good), and never touches a
live writer's. Files are created 0666 and directories 0777 minus the umask, as any file a
user's program writes (mkstemp's 0600 hid checkpoints from the rest of a group).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

# .<target name>.<kind>-<pid>-<random>: the pattern every temporary sibling follows
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|staging|old)-(?P<pid>\d+)-[0-9a-f]+$")


def temp_sibling(path, kind: str = "tmp") -> Path:
    """A fresh name beside ``path`` for this process to write to before renaming."""
    path = Path(path)
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _unwrap(name: str):
    """(the target's name, the writers' pids) of a temporary sibling, through nested ones
    (an export stages a directory and writes it through a temporary of its own)."""
    pids = []
    m = _TEMP.match(name)
    while m is not None:
        pids.append(int(m["pid"]))
        name = m["name"]
        m = _TEMP.match(name)
    return name, pids


def restore_replaced(path) -> bool:
    """Put back the old ``path`` that a writer killed between publish_dir's two renames left
    under its 'old' name (the target is missing then); returns whether it did."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        return False
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return False
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m and m["kind"] == "old" and m["name"] == path.name and not _alive(int(m["pid"])):
            try:
                os.replace(entry.path, path)
                return True
            except OSError:
                return False  # another process restored it first
    return False


def sweep_dead(path) -> list:
    """Remove the temporaries that writers which have since died left beside ``path``
    (first putting back a replaced original, see restore_replaced); returns what was
    removed. A live writer's temporaries stay."""
    path = Path(path)
    restore_replaced(path)
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        target, pids = _unwrap(entry.name)
        if not pids or target != path.name or any(_alive(p) for p in pids):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            pass  # another process swept it first
    return removed


def write_bytes(path, data: bytes, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (temp sibling, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead(path)
    tmp = temp_sibling(path)
    # O_EXCL: never follow or reuse an existing name; 0o666: the umask decides the mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def make_staging_dir(path, kind: str = "staging") -> Path:
    """A new empty directory beside ``path`` (mode 0777 minus the umask) to build a
    directory in before :func:`publish_dir`; dead writers' leftovers are swept first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead(path)
    tmp = temp_sibling(path, kind)
    os.mkdir(tmp, 0o777)
    return tmp


def publish_dir(staged, path):
    """Move the complete directory ``staged`` to ``path``, replacing an old one."""
    staged, path = Path(staged), Path(path)
    old = None
    if path.exists() or path.is_symlink():
        old = temp_sibling(path, "old")
        os.replace(path, old)
    os.replace(staged, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
