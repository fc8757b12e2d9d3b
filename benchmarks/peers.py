"""Where the peer frameworks live: PyTorch and JAX each in a virtual environment of its own.

The benchmarks measure every framework in a process of its own. A peer that is not importable
here runs under its own interpreter, named by an argument or an environment variable:

    python -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch==2.13.0 numpy
    python -m venv /work/venv-jax && /work/venv-jax/bin/pip install jax jaxlib
    BENCH_TORCH_PYTHON=/work/venv-torch/bin/python BENCH_JAX_PYTHON=/work/venv-jax/bin/python \\
        python benchmarks/bench_llvm.py           # or --torch-python / --jax-python

(``/work/venv-torch`` and ``/work/venv-jax`` are also found without being named; ``none``
leaves a peer out, and ``BENCH_COMPILED_PEERS=0`` skips torch.compile / jit.script in
bench_llvm.py.) The peer's
process imports hybrid too (for the shared workloads' inputs): the parent hands it its own
``sys.path`` in ``HYBRID_BENCH_HOST_PATH``, which :func:`adopt_host_path` appends after the
venv's own entries, so the venv's torch/jax and NumPy win and hybrid's pure dependencies
(networkx, llvmlite, ...) come from the parent's environment.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ENV = {"torch": "BENCH_TORCH_PYTHON", "jax": "BENCH_JAX_PYTHON"}
DEFAULT = {"torch": "/work/venv-torch/bin/python", "jax": "/work/venv-jax/bin/python"}
HOST_PATH = "HYBRID_BENCH_HOST_PATH"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_chosen: dict = {}  # part -> interpreter, from the command line


def choose(part: str, python: str | None):
    if python:
        _chosen[part] = python


def interpreter(part: str) -> str | None:
    """The interpreter that imports ``part`` (torch, jax; anything else: this one), or None."""
    if part not in ENV:
        return sys.executable
    named = _chosen.get(part) or os.environ.get(ENV[part])
    if named:
        return None if named == "none" else named  # "none": leave this peer out
    if importlib.util.find_spec(part) is not None:
        return sys.executable
    return DEFAULT[part] if os.path.exists(DEFAULT[part]) else None


def version(part: str) -> str | None:
    """The peer's version as its interpreter reports it, or None when it is not there."""
    py = interpreter(part)
    if py is None:
        return None
    out = subprocess.run([py, "-c", f"import {part}; print({part}.__version__)"],
                         capture_output=True, text=True, timeout=120, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def child_env(**extra) -> dict:
    """The environment of a peer's process: this one's, plus where hybrid is."""
    path = [_REPO] + [p for p in sys.path if p]
    return dict(os.environ, **{HOST_PATH: os.pathsep.join(path)}, **extra)


def adopt_host_path():
    """In a peer's process: make hybrid and its dependencies importable (see the module)."""
    host = os.environ.get(HOST_PATH)
    if host:
        for p in host.split(os.pathsep):
            if p not in sys.path:
                sys.path.append(p)
