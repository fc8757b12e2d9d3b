"""Across processes over MPI, launched on this machine with ``python -m hybrid.launch``
(what ``hybrid launch`` runs): allreduce and push/pull exact on 2 and 4 processes, 50 steps
of data-parallel training equal to one process on the combined batch, dist_async
convergence, and clear reports on the survivors when a rank dies or has fewer batches.

Skipped, with the reason, when mpi4py or an MPI launcher is missing (pip install
'hybrid[dist]'). The workers' code is tests/_dist_worker.py.
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hybrid import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "_dist_worker.py")


def _mpi_missing():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'hybrid[dist]')"
    try:
        launch.find_mpirun()
    except launch.LaunchError as exc:
        return str(exc)
    return None


MISSING = _mpi_missing()
needs_mpi = pytest.mark.skipif(MISSING is not None, reason=f"no MPI: {MISSING}")


def run_job(n, *scenarios, timeout=20.0, limit=80):
    env = dict(os.environ)
    env.pop("HYBRID_WAIT_TIMEOUT", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "hybrid.launch", "-n", str(n), "--timeout", str(timeout),
           WORKER, *scenarios]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=limit)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def _assert_ok(rc, out, n, *what):
    assert rc == 0, out[-4000:]
    for w in what:
        for r in range(n):
            assert f"RANK {r} OK {w}" in out, out[-4000:]


# ------------------------------------------------------------------ launcher (no job)
def test_launch_arguments(capsys, tmp_path):
    assert launch.launch_main(["-n", "2", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.launch_main(["script.py"])  # -n is required


def test_mpi_env_defaults_keep_the_users_setting(monkeypatch):
    """Workers start MPI with the settings hybrid's allreduce is measured with (Open MPI's
    ring for non-blocking allreduce); a value the user set is kept."""
    from runtime import collective
    name = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"
    monkeypatch.delenv(name, raising=False)
    collective.mpi_env_defaults()
    assert os.environ[name] == "ring"
    monkeypatch.setenv(name, "binomial")
    collective.mpi_env_defaults()
    assert os.environ[name] == "binomial"


@needs_mpi
def test_launch_dry_run_command(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    rc = launch.launch_main(["-n", "3", "--hosts", "a:2,b:1", "--timeout", "7", "-x", "FOO=1",
                             "--dry-run", str(script), "--epochs", "2"])
    assert rc == 0
    cmd = capsys.readouterr().out
    assert " -n 3 " in cmd and "a:2,b:1" in cmd and "FOO" in cmd and "HYBRID_DIST_TIMEOUT" in cmd
    assert cmd.rstrip().endswith(f"-m hybrid.launch --worker {script} --epochs 2")


# ------------------------------------------------------------------ the `hybrid launch` CLI
# a tiny user script: an allreduce (the dist_sync store's pushpull, the path gradients take)
# of float64 values chosen so that the sum is exact; each rank prints what it got
ALLREDUCE_SCRIPT = """\
import sys
import numpy as np
import hybrid as hb
kv = hb.kv.create("dist_sync")
r, n = kv.rank, kv.num_workers
x = hb.array(np.arange(6, dtype=np.float64) * (r + 1) + 0.25, dtype="float64")
kv.init("x", hb.zeros(6, dtype="float64"))
kv.pushpull("x", x)
print(f"RANK {r} OF {n} ARGS {sys.argv[1:]} SUM {x.asnumpy().tolist()}", flush=True)
kv.close()
"""


@needs_mpi
def test_hybrid_launch_cli_allreduce_on_2_processes(tmp_path):
    """`python -m hybrid launch -n 2 script.py ARGS` (the console script's entry, main()):
    both ranks get the exact sum, and the script's arguments (launcher-like options
    included) reach it untouched."""
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    env = dict(os.environ)
    env.pop("HYBRID_WAIT_TIMEOUT", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    script_args = ["-n", "5", "--timeout", "x", "-h", "--", "tail"]
    proc = subprocess.run([sys.executable, "-m", "hybrid", "launch", "-n", "2", "--timeout",
                           "20", str(script), *script_args],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=80)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    n = 2
    want = (np.arange(6, dtype=np.float64) * (n * (n + 1) // 2) + 0.25 * n).tolist()
    for r in range(n):
        assert f"RANK {r} OF {n} ARGS {script_args} SUM {want}" in out, out[-4000:]


# ------------------------------------------------------------------ jobs
@pytest.fixture(scope="module")
def two_process_job():
    if MISSING:
        pytest.skip(f"no MPI: {MISSING}")
    return run_job(2, "exact", "train", "async")


@needs_mpi
def test_allreduce_and_push_pull_exact_on_2_processes(two_process_job):
    rc, out, _ = two_process_job
    _assert_ok(rc, out, 2, "dist_sync", "dist_async")


@needs_mpi
def test_data_parallel_training_on_2_processes_equals_one_process(two_process_job):
    rc, out, _ = two_process_job
    _assert_ok(rc, out, 2, "train")
    diffs = [float(line.split("maxdiff=")[1].split()[0]) for line in out.splitlines()
             if line.startswith("TRAIN maxdiff=")]
    assert len(diffs) == 2 and max(diffs) < 1e-9, out[-3000:]


@needs_mpi
def test_dist_async_converges(two_process_job):
    rc, out, _ = two_process_job
    _assert_ok(rc, out, 2, "async")


@needs_mpi
def test_allreduce_and_push_pull_exact_on_4_processes():
    rc, out, _ = run_job(4, "exact")
    _assert_ok(rc, out, 4, "dist_sync", "dist_async")


@needs_mpi
def test_a_killed_rank_ends_the_job_at_once_naming_the_signal():
    """Rank 1 is killed (SIGKILL, as the OOM killer does) after step 5: the launcher names
    the rank and the signal and ends the job with a failing status within seconds (mpirun
    alone kept it running until the others timed out, then reported status 0)."""
    rc, out, elapsed = run_job(2, "killed", timeout=300, limit=120)
    assert rc == 128 + 9, (rc, out[-3000:])
    assert "rank 1 of 2 was killed by signal 9 (SIGKILL)" in out, out[-3000:]
    assert "rank 0 finished step 8" not in out
    assert elapsed < 60, elapsed  # not the 300 s dist timeout


@needs_mpi
def test_a_hung_rank_is_reported_by_the_survivor_within_the_timeout():
    """Rank 1 hangs after step 5: rank 0 reports it on a dist_sync store and on a dist_async
    store (whose server for 'bias' was rank 1), 4 s later each."""
    rc, out, elapsed = run_job(2, "hung", timeout=4)
    assert rc != 0, out[-3000:]
    assert "rank 0 finished step 5" in out, out[-3000:]
    assert "SURVIVOR dist_sync: rank 0: pushpull of 'bias', 'weight' at step 6: no word " \
           "from rank(s) 1 within 4s" in out, out[-3000:]
    # the parameter server on rank 1 serves 'bias' (keys are sharded round-robin)
    assert "SURVIVOR dist_async: rank 0: pull of key 'bias' at step 6: server rank 1 did " \
           "not answer within 4s" in out, out[-3000:]
    assert "rank 0 finished step 6" not in out
    assert elapsed < 60, elapsed


@needs_mpi
def test_a_rank_with_fewer_batches_is_reported_at_once():
    rc, out, elapsed = run_job(2, "fewer", timeout=60)
    assert rc != 0, out[-3000:]
    assert "rank 1 ran out of batches" in out
    assert "DistributedError: rank 0: pushpull of 'bias', 'weight' at step 6: rank 1 has " \
           "left (it closed its store after its step 5)" in out, out[-3000:]
    assert elapsed < 50, elapsed  # the report does not wait for the 60 s timeout
