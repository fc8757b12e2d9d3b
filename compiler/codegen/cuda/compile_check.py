"""Compile generated CUDA C for a real GPU architecture, to prove it builds there.

``check_compiles(source, arch)`` compiles ``source`` for ``arch`` ("sm_80", "sm_90", ...)
and raises :class:`CudaCompileError` with the compiler's message when it fails. It uses
NVRTC through CuPy where CuPy imports (a GPU machine), else ``nvcc -cubin`` (which also runs
ptxas: register and shared-memory limits are checked too). ``available_compiler()`` says
which one would run (None: neither). Successful nvcc builds are remembered on disk (key:
the source, the architecture, the flags and nvcc's version), so re-checking an unchanged
source costs nothing; a failure is never cached.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime import config

NVCC_FLAGS = ("-std=c++17", "-cubin")
NVRTC_FLAGS = ("-std=c++17",)


class CudaCompileError(RuntimeError):
    """A CUDA compiler rejected a generated source."""


@functools.lru_cache(maxsize=1)
def _cupy():
    try:
        import cupy  # noqa: PLC0415 - optional: only on GPU machines
        from cupy.cuda import nvrtc  # noqa: F401, PLC0415
        return cupy
    except Exception:  # noqa: BLE001 - any import failure means: not available
        return None


def nvcc_path():
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True,
                         check=False)
    return (out.stdout.strip().splitlines() or ["unknown"])[-1]


def available_compiler():
    """'nvrtc' (CuPy imports), 'nvcc' (on PATH or in /usr/local/cuda) or None."""
    if _cupy() is not None:
        return "nvrtc"
    if nvcc_path() is not None:
        return "nvcc"
    return None


def check_compiles(source: str, arch: str = "sm_80") -> str:
    """Compile ``source`` for ``arch``; returns the compiler used. Raises CudaCompileError."""
    which = available_compiler()
    if which is None:
        raise CudaCompileError("no CUDA compiler here: install the CUDA toolkit (nvcc) or "
                               "CuPy (NVRTC) to check generated CUDA C")
    if which == "nvrtc":
        _nvrtc(source, arch)
    else:
        _nvcc(source, arch)
    return which


def check_compiles_all(source: str, archs=("sm_80", "sm_90")) -> str:
    """``check_compiles`` for several architectures, the compilers running side by side."""
    with ThreadPoolExecutor(max_workers=len(archs)) as pool:
        results = list(pool.map(lambda a: check_compiles(source, a), archs))
    return results[0]


def _cache_path(source: str, arch: str) -> Path:
    record = {"source": hashlib.sha256(source.encode()).hexdigest(), "arch": arch,
              "flags": list(NVCC_FLAGS), "nvcc": nvcc_version()}
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return config.cache_dir() / "cuda_cubin" / digest[:2] / f"{digest}.cubin"


def _nvcc(source: str, arch: str):
    path = _cache_path(source, arch)
    if path.exists():
        return
    with tempfile.TemporaryDirectory(prefix="hyb_nvcc_") as tmp:
        src = Path(tmp) / "module.cu"
        src.write_text(source)
        out = Path(tmp) / "module.cubin"
        cmd = [nvcc_path(), f"-arch={arch}", *NVCC_FLAGS, str(src), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
        if res.returncode != 0:
            raise CudaCompileError(f"nvcc -arch={arch} rejected the generated source:\n"
                                   f"{(res.stderr or res.stdout).strip()[-6000:]}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        os.close(fd)
        shutil.copyfile(out, tmp_path)
        os.replace(tmp_path, path)


def _nvrtc(source: str, arch: str):
    from cupy.cuda import nvrtc  # noqa: PLC0415 - only where CuPy imports
    prog = nvrtc.createProgram(source, "hybrid.cu", [], [])
    try:
        opts = [f"--gpu-architecture={arch}", *NVRTC_FLAGS]
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise CudaCompileError(f"NVRTC ({arch}) rejected the generated source: {exc}\n"
                                   f"{log.strip()[-6000:]}") from None
    finally:
        nvrtc.destroyProgram(prog)
