"""benchmarks/gpu_check.sh, the script a short lease of a real GPU runs, kept working here:
GPU_CHECK_SMOKE=1 runs its whole plumbing (dependency check, the GPU tests, bench_gpu.py,
gpu_report.py) on two emulated GPUs with tiny sizes, labelled emulated, judging no target.
A lease is ~15 minutes: a script broken since the last one would waste it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_gpu_check_smoke_runs_every_step_and_writes_its_json(tmp_path):
    env = dict(os.environ, GPU_CHECK_SMOKE="1", RESULTS_DIR=str(tmp_path),
               PYTHON=sys.executable, HYBRID_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["emulated"] is True
    for name, counts in result["tests"].items():
        assert counts["failed"] == 0 and counts["errors"] == 0, (name, counts)
    assert result["tests"]["gpu_file"]["passed"] > 100
    assert all(step["rc"] == 0 for step in result["steps"].values()), result["steps"]
    figures = result["figures"]
    for key in ("A. MLP b1 | hybrid cuda", "C. MLP 784-256-10 train b16 | hybrid cuda",
                "C. MLP 784-256-10 train b16 | hybrid cuda +loss", "D. chain 64K | hybrid cuda"):
        assert figures[key]["value"] > 0, (key, figures.get(key))
    targets = result["targets_met"]
    assert all(v is None for k, v in targets.items() if k != "why"), targets
    assert "EMULATED" in done.stdout
