"""Writes that leave nothing behind and follow the umask (checkpoints, artifacts, ONNX,
the compile cache): a killed writer's temporary is removed by the next write to the same
place, a live writer's never; files are 0666 and directories 0777 minus the umask."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hybrid as hb
from hybrid import nn
from runtime.atomic import sweep_dead, temp_sibling, write_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _litter(path, pid, kind="tmp", directory=False):
    name = temp_sibling(path, kind).name.replace(f"-{os.getpid()}-", f"-{pid}-")
    p = path.parent / name
    if directory:
        p.mkdir()
        (p / "weights.safetensors").write_bytes(b"x" * 100)
    else:
        p.write_bytes(b"x" * 100)
    return p


def _net():
    net = nn.HybridSequential()
    net.add(nn.Dense(3))
    net.initialize()
    net(hb.ones((1, 4)))
    return net


def test_a_dead_writers_temporaries_are_removed_by_the_next_save(tmp_path):
    target = tmp_path / "model.safetensors"
    dead = _litter(target, _dead_pid())
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = _litter(target, live.pid)
        other = _litter(tmp_path / "other.safetensors", _dead_pid())
        _net().save_parameters(str(target))
        assert not dead.exists(), "a dead writer's temporary stayed"
        assert alive.exists(), "a live writer's temporary was removed"
        assert other.exists(), "another file's temporary was touched"
    finally:
        live.kill()
        live.wait()


def test_a_killed_save_leaves_litter_that_the_next_save_removes(tmp_path):
    """A child process dies (os._exit) between writing the temporary and renaming it."""
    target = tmp_path / "model.safetensors"
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        import hybrid as hb
        from hybrid import nn
        net = nn.Dense(3, in_units=4)
        net.initialize()
        os.replace = lambda *a: os._exit(9)  # killed just before the rename
        net.save_parameters({str(target)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 9
    left = [p for p in tmp_path.iterdir() if p.name != target.name]
    assert left and not target.exists()
    _net().save_parameters(str(target))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_dead_exports_staging_directories_are_removed(tmp_path):
    net = _net()
    net.hybridize()
    net(hb.ones((1, 4)))
    target = tmp_path / "mlp"
    pid = _dead_pid()
    staged = _litter(target, pid, "staging", directory=True)
    nested = tmp_path / f".{staged.name}.tmp-{pid}-0a1b2c3d"  # the writer's own temporary
    nested.mkdir()
    net.export(str(target), example_inputs=(hb.ones((1, 4)),))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp"]


def test_sweep_ignores_names_that_only_look_alike(tmp_path):
    target = tmp_path / "a.bin"
    keep = [tmp_path / ".a.bin.tmp-notapid-00", tmp_path / "a.bin.tmp-1-00",
            tmp_path / ".b.bin.tmp-1-00ff"]
    for p in keep:
        p.write_bytes(b"")
    assert sweep_dead(target) == []
    assert all(p.exists() for p in keep)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_modes_follow_the_umask(tmp_path, umask_022):
    net = _net()
    net.save_parameters(str(tmp_path / "w.safetensors"))
    assert _mode(tmp_path / "w.safetensors") == 0o644
    net.hybridize()
    net(hb.ones((1, 4)))
    net.export(str(tmp_path / "art"), example_inputs=(hb.ones((1, 4)),))
    assert _mode(tmp_path / "art") == 0o755
    assert {_mode(p) for p in (tmp_path / "art").iterdir()} == {0o644}
    write_bytes(tmp_path / "raw.bin", b"abc")
    assert _mode(tmp_path / "raw.bin") == 0o644
    os.umask(0o077)
    write_bytes(tmp_path / "private.bin", b"abc")
    assert _mode(tmp_path / "private.bin") == 0o600
    np.testing.assert_array_equal(np.frombuffer((tmp_path / "raw.bin").read_bytes(), "u1"),
                                  [97, 98, 99])
