"""The README's main job (examples/train.py), run as a newcomer would, in smoke size."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(600)
def test_the_main_job_reports_compile_time_apart_and_leaves_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    blocker = tmp_path / "blocker"  # a package dir named matplotlib that fails to import
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('not here')\n")
    env = dict(os.environ, HYBRID_SMOKE="1", EPOCHS="2", TMPDIR=str(tmp),
               PYTHONPATH=os.pathsep.join([str(blocker), REPO]))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "train.py"),
                           "--model", "mlp"], env=env, capture_output=True, text=True,
                          timeout=540, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "s tracing and compiling)" in out
    assert "samples/s" in out
    assert "curves: skipped (matplotlib is not installed" in out
    assert "predictions equal: True" in out
    assert [p.name for p in tmp.iterdir() if p.name.startswith("hybrid-train-")] == [], \
        "the run left its folder in the temporary directory"
