"""The `hybrid` command, run as a subprocess: inspect, run, bench, sysinfo, exit codes."""
import json
import os
import subprocess
import sys

import numpy as np

from conftest import fresh_process_threads
import pytest

import hybrid as hb
from hybrid import init
from hybrid.nn import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(hb.__file__)))


def cli(*args, timeout=180):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "hybrid.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def lenet_artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    hb.random.seed(0)
    net = models.lenet()
    net.initialize(init.Xavier())
    net.hybridize(backend="reference")
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    net.export(root / "lenet", example_inputs=(hb.array(x),))
    x3 = np.random.default_rng(1).standard_normal((3, 1, 28, 28)).astype(np.float32)
    np.save(root / "x3.npy", x3)
    with fresh_process_threads():  # compared bitwise with the CLI's fresh process
        np.save(root / "y3.npy", net(hb.array(x3)).asnumpy())
    return root


@pytest.fixture(scope="module")
def dict_artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-dict")
    w = hb.array(np.ones((4, 3), np.float32))

    @hb.hybridize(backend="reference")
    def two(x, scale):
        return {"a": x @ w * scale, "b": x.sum(axis=1)}
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    hb.deploy.export(two, root / "two", example_inputs=(hb.array(x), hb.full((2, 1), 2.0)))
    np.save(root / "x.npy", x)
    np.save(root / "s.npy", np.full((2, 1), 2.0, np.float32))
    np.save(root / "s64.npy", np.full((2, 1), 2.0, np.float64))
    return root


def test_inspect_text(lenet_artifact):
    res = cli("inspect", lenet_artifact / "lenet")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "hybrid.artifact version 1" in out and "hybrid 0.1.0" in out
    assert "float32[N, 1, 28, 28]" in out and "float32[N, 10]" in out
    assert "any batch size" in out
    assert "61,706 values in 10 tensors" in out
    assert "conv2d=2" in out and "pool2d=2" in out
    assert "arena" in out and "memory" in out


def test_inspect_json(lenet_artifact):
    res = cli("inspect", lenet_artifact / "lenet", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["parameters"]["count"] == 61706
    assert info["parameters"]["bytes"] == 61706 * 4
    assert info["ops"]["conv2d"] == 2 and info["batch"]["dynamic"]
    assert info["inputs"][0]["shape"] == [2, 1, 28, 28] and info["inputs"][0]["batch_dim"]
    assert info["memory_plan"]["arena_bytes"] > 0
    assert [p["pass"] for p in info["passes"]] == ["simplify", "fuse", "schedule", "memory"]


def test_run_saves_outputs_at_another_batch_size(lenet_artifact, tmp_path):
    out = tmp_path / "y.npy"
    res = cli("run", lenet_artifact / "lenet", "--input", lenet_artifact / "x3.npy",
              "--output", out)
    assert res.returncode == 0, res.stderr
    assert "output 0: float32[3, 10]" in res.stdout
    np.testing.assert_array_equal(np.load(out), np.load(lenet_artifact / "y3.npy"))


def test_run_previews_without_output(dict_artifact):
    res = cli("run", dict_artifact / "two", "-i", dict_artifact / "x.npy",
              "-i", dict_artifact / "s.npy")
    assert res.returncode == 0, res.stderr
    assert "{'a': *, 'b': *}" in res.stdout
    assert "output 0: float32[2, 3]" in res.stdout and "output 1: float32[2]" in res.stdout
    assert "12." in res.stdout  # (0+1+2+3) * 2, the first row of 'a'


def test_run_npz_and_cast(dict_artifact, tmp_path):
    res = cli("run", dict_artifact / "two", "-i", dict_artifact / "x.npy",
              "-i", dict_artifact / "s64.npy", "-o", tmp_path / "all.npz")
    assert res.returncode == 2 and "pass --cast" in res.stderr
    res = cli("run", dict_artifact / "two", "-i", dict_artifact / "x.npy",
              "-i", dict_artifact / "s64.npy", "-o", tmp_path / "all.npz", "--cast")
    assert res.returncode == 0, res.stderr
    z = np.load(tmp_path / "all.npz")
    np.testing.assert_array_equal(z["out1"], np.array([6.0, 22.0], np.float32))


@pytest.mark.parametrize("args,match", [
    (["run", "{art}", "-i", "{d}/x3.npy", "-i", "{d}/x3.npy"], "takes 1 input"),
    (["run", "{art}", "-i", "{d}/missing.npy"], "cannot read"),
    (["run", "{art}", "-i", "{d}/bad.npy"], "exported for inputs"),
    (["run", "{art}", "-i", "{d}/x3.npy", "-o", "a.npy", "-o", "b.npy"], "one --output"),
    (["bench", "{art}", "--iters", "0"], "at least 1"),
    (["inspect", "{d}/nowhere"], "no such artifact"),
])
def test_bad_usage_exits_2_without_traceback(lenet_artifact, capsys, args, match):
    """In process (main() is what the console script calls), to keep the suite quick."""
    from hybrid.cli import main
    np.save(lenet_artifact / "bad.npy", np.zeros((2, 3), np.float32))
    args = [a.format(art=lenet_artifact / "lenet", d=lenet_artifact) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_refused_artifact_exits_2_with_reason(lenet_artifact, tmp_path):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(lenet_artifact / "lenet", bad)
    data = bytearray((bad / "weights.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (bad / "weights.safetensors").write_bytes(bytes(data))
    res = cli("inspect", bad)
    assert res.returncode == 2
    assert "artifact refused" in res.stderr and "weights.safetensors" in res.stderr
    assert "sha256" in res.stderr and "Traceback" not in res.stderr


def test_argparse_usage_errors_exit_2():
    assert cli().returncode == 2
    assert cli("frobnicate").returncode == 2
    res = cli("run")
    assert res.returncode == 2 and "usage" in res.stderr


def test_bench_reports_latency_and_throughput(lenet_artifact):
    res = cli("bench", lenet_artifact / "lenet", "--batch-size", "4", "--iters", "3",
              "--repeats", "2", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["batch_size"] == 4 and r["iters"] == 3 and r["repeats"] == 2
    assert r["latency_s"] > 0 and r["throughput_per_s"] > 0 and r["first_call_s"] > 0
    res = cli("bench", lenet_artifact / "lenet", "-n", "2", "-r", "1")
    assert res.returncode == 0, res.stderr
    assert "latency" in res.stdout and "samples/s" in res.stdout


def test_sysinfo():
    res = cli("sysinfo")
    assert res.returncode == 0, res.stderr
    for word in ("python", "numpy", "llvmlite", "cpu_count", "num_gpus", "HYBRID_ENGINE"):
        assert word in res.stdout
    info = json.loads(cli("sysinfo", "--json").stdout)
    assert info["cpu_count"] == os.cpu_count() and info["numpy"] == np.__version__


def test_console_script_entry_point():
    from importlib.metadata import entry_points
    eps = [e for e in entry_points(group="console_scripts") if e.name == "hybrid"]
    if not eps:
        pytest.skip("the package is not installed (pip install -e .), so no console script")
    assert eps[0].value == "hybrid.cli:main"
    from hybrid.cli import main
    assert main(["sysinfo", "--json"]) == 0


# ---------------------------------------------------------------- launch (no MPI job here:
# tests/test_dist.py runs `python -m hybrid launch -n 2` on loopback)
def test_launch_help_through_both_entries():
    env = dict(os.environ, PYTHONPATH=ROOT)
    for entry in (["-m", "hybrid"], ["-m", "hybrid.cli"]):
        res = subprocess.run([sys.executable, *entry, "launch", "--help"], capture_output=True,
                             text=True, timeout=120, env=env)
        assert res.returncode == 0, res.stderr
        assert "usage: hybrid launch" in res.stdout and "mpirun" in res.stdout
        assert "--hosts" in res.stdout and "untouched" in res.stdout
    res = cli("--help")
    assert res.returncode == 0 and "launch" in res.stdout


def test_launch_bad_usage_exits_2_with_reason(capsys, tmp_path):
    from hybrid.cli import main
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert main(["launch", "-n", "0", str(script)]) == 2
    assert "-n must be at least 1, got 0" in capsys.readouterr().err
    assert main(["launch", "-n", "2", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: -n is not a number
        main(["launch", "-n", "two", str(script)])
    assert exc.value.code == 2 and "invalid int value" in capsys.readouterr().err
    assert main(["launch", "-n", "2", "--mpirun", str(tmp_path / "nompirun"), str(script)]) == 2
    assert "no such executable" in capsys.readouterr().err


def test_launch_without_mpirun_says_how_to_get_one(capsys, tmp_path, monkeypatch):
    from hybrid import launch
    from hybrid.cli import main
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    # no mpirun beside this Python nor on the PATH
    monkeypatch.setattr(launch.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setattr(launch.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    assert main(["launch", "-n", "2", str(script), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "no MPI launcher found" in err and "pip install 'hybrid[dist]'" in err
    assert "Traceback" not in err


def test_launch_passes_script_arguments_untouched(capsys, tmp_path):
    """Options after the script belong to it, even those the launcher also has."""
    from hybrid import launch
    from hybrid.cli import main
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    try:
        launch.find_mpirun()
    except launch.LaunchError as exc:
        pytest.skip(f"no MPI launcher: {exc}")
    args = ["-n", "5", "--dry-run", "-h", "--hosts", "x", "--", "end"]
    assert main(["launch", "-n", "2", "--dry-run", str(script), *args]) == 0
    cmd = capsys.readouterr().out.strip()
    assert cmd.endswith(f"-m hybrid.launch --worker {script} -n 5 --dry-run -h --hosts x -- end")
