"""Build CUDA C for the emulated GPU: the host C++ compiler and cuda_emu.h.

``build_module(source) -> EmuModule`` compiles ``source`` (the same text nvcc gets) with

    g++ -O2 -std=c++17 -fPIC -shared -DHYBRID_EMULATE -include cuda_emu.h -x c++ source

into a shared library, cached on disk under ``runtime.config.cache_dir() / "cuda_emu"``
(key: sha256 of the source, the header, the compiler's version and the flags; written
atomically, so concurrent processes never see half a file) and in memory, and loads it with
ctypes. ``EmuModule.launch(kernel_name, grid, block, shared_bytes, args)`` runs one kernel
to completion on the calling thread (the GIL is released while it runs); the kernel must
have a launch stub, ``HYB_EMU_STUB(name)`` under ``#ifdef HYBRID_EMULATE`` (the code
generator writes one for every kernel).

Arguments: an int is a device pointer (device memory is host memory here: the address of a
NumPy buffer); a NumPy array passes the address of its data; a NumPy scalar passes its value
with its own width (np.float32, np.int64, ...). A Python float or bool is refused: the
kernel's parameter decides between float and double, and the stub checks every argument's
width against its parameter.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from ... import config

HEADER = Path(__file__).with_name("cuda_emu.h")
FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-DHYBRID_EMULATE",
         # CUDA code reinterprets float arrays as float4 and relies on wrapping integers,
         # which nvcc's targets give; the host compiler must not exploit either as UB
         "-fno-strict-aliasing", "-fwrapv",
         # no FMA contraction: elementwise results stay those of separate IEEE operations
         "-ffp-contract=off")
MAX_THREADS_PER_BLOCK = 1024
_STUB = re.compile(r"^\s*HYB_EMU_STUB\(\s*([A-Za-z_]\w*)\s*\)", re.MULTILINE)
_SCALAR_CTYPES = {np.dtype(t): c for t, c in (
    ("float32", ctypes.c_float), ("float64", ctypes.c_double), ("int8", ctypes.c_int8),
    ("uint8", ctypes.c_uint8), ("int16", ctypes.c_int16), ("uint16", ctypes.c_uint16),
    ("int32", ctypes.c_int32), ("uint32", ctypes.c_uint32), ("int64", ctypes.c_int64),
    ("uint64", ctypes.c_uint64), ("bool", ctypes.c_bool))}


class EmuBuildError(RuntimeError):
    """The host compiler rejected a CUDA source (its message is included)."""


class EmuLaunchError(RuntimeError):
    """A launch on the emulated GPU failed (bad arguments or dimensions, a deadlock at a
    barrier, a stack overflow, __trap)."""


@functools.lru_cache(maxsize=1)
def host_compiler() -> tuple:
    """(path, version line) of the host C++ compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise EmuBuildError("the emulated GPU needs a host C++ compiler (g++), and none is on "
                            "PATH; install g++ (apt-get install g++)")
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return cxx, (out.stdout.splitlines() or ["unknown"])[0].strip()


def _digest(source: str, defines) -> str:
    record = {"source": hashlib.sha256(source.encode()).hexdigest(),
              "header": hashlib.sha256(HEADER.read_bytes()).hexdigest(),
              "compiler": host_compiler()[1], "flags": list(FLAGS) + list(defines)}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _library_path(digest: str) -> Path:
    return config.cache_dir() / "cuda_emu" / digest[:2] / f"{digest}.so"


_modules: dict = {}
_lock = threading.Lock()


def build_module(source: str, defines=()) -> "EmuModule":
    """Compile (or find in the caches) and load ``source``; ``defines``: extra -D macros
    (e.g. "HYB_EMU_UCONTEXT" for the portable fibers)."""
    defines = tuple(defines)
    digest = _digest(source, defines)
    mod = _modules.get(digest)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(digest)
        if mod is None:
            path = _library_path(digest)
            if not path.exists():
                _compile(source, path, defines)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:  # unreadable or from another machine: build it again
                _compile(source, path, defines)
                lib = ctypes.CDLL(str(path))
            mod = _modules[digest] = EmuModule(lib, _STUB.findall(source), digest, path)
    return mod


def _compile(source: str, path: Path, defines):
    cxx = host_compiler()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hyb_emu_") as tmp:
        src = Path(tmp) / "module.cu"
        src.write_text(source)
        out = Path(tmp) / "module.so"
        cmd = [cxx, *FLAGS, *(f"-D{d}" for d in defines), "-include", str(HEADER),
               "-x", "c++", str(src), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmuBuildError(f"the host compiler could not build this CUDA source for the "
                                f"emulated GPU ({' '.join(cmd[:1] + list(FLAGS[:2]))} ...):\n"
                                f"{_tail(res.stderr)}")
        fd, tmp_final = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(out, tmp_final)
            os.replace(tmp_final, path)  # atomic: other processes see all of it or nothing
        except BaseException:
            Path(tmp_final).unlink(missing_ok=True)
            raise


def _tail(text: str, limit: int = 6000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _dims(value, what) -> tuple:
    dims = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"launch: {what} must have 1 to 3 dimensions, got {value!r}")
    if any(d < 1 for d in dims):
        raise ValueError(f"launch: every {what} dimension must be at least 1, got {value!r}")
    return dims + (1,) * (3 - len(dims))


def _argument(i, a):
    """A ctypes object holding launch argument ``i``."""
    if isinstance(a, (bool, np.bool_)) and not isinstance(a, np.generic):
        raise TypeError(f"launch: argument {i} is a Python bool; pass np.bool_(...)")
    if isinstance(a, np.ndarray):
        return ctypes.c_void_p(a.__array_interface__["data"][0])
    if isinstance(a, np.generic):
        ct = _SCALAR_CTYPES.get(a.dtype)
        if ct is None:
            raise TypeError(f"launch: argument {i} has dtype {a.dtype}, which no kernel "
                            "parameter takes")
        return ct(a.item())
    if isinstance(a, int):
        return ctypes.c_void_p(a)  # a device pointer
    raise TypeError(f"launch: argument {i} is a {type(a).__name__}; pass a device pointer "
                    "(int), a NumPy array or a NumPy scalar (np.float32(x), np.int32(n), ...): "
                    "the kernel's parameter type decides its width")


class EmuModule:
    """A built CUDA source: its kernels, launched by name on the emulated GPU."""

    def __init__(self, lib, kernels, digest: str, path: Path):
        self.lib = lib
        self.kernels = tuple(kernels)
        self.digest = digest
        self.path = path
        self._last_error = lib.hyb_emu_last_error
        self._last_error.restype = ctypes.c_char_p
        self._launchers = {}
        for name in self.kernels:
            fn = getattr(lib, f"hyb_emu_launch_{name}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                           ctypes.c_uint, ctypes.c_void_p]
            self._launchers[name] = fn

    def launch(self, kernel_name: str, grid, block, shared_bytes: int, args):
        """Run ``kernel_name`` over ``grid`` x ``block`` threads; returns when it is done."""
        fn = self._launchers.get(kernel_name)
        if fn is None:
            raise KeyError(f"this module has no kernel {kernel_name!r} with an emulator stub; "
                           f"its kernels: {', '.join(self.kernels) or '(none)'}")
        g, b = _dims(grid, "grid"), _dims(block, "block")
        threads = b[0] * b[1] * b[2]
        if threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"launch of {kernel_name}: a block of {b} is {threads} threads; "
                             f"a CUDA block has at most {MAX_THREADS_PER_BLOCK}")
        if int(shared_bytes) < 0:
            raise ValueError(f"launch of {kernel_name}: shared_bytes must be >= 0")
        values = [_argument(i, a) for i, a in enumerate(args)]
        n = len(values)
        ptrs = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(v) for v in values])
        sizes = (ctypes.c_uint * max(n, 1))(*[ctypes.sizeof(v) for v in values])
        g3, b3 = (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b)
        rc = fn(g3, b3, int(shared_bytes), ptrs, n, sizes)
        if rc != 0:
            raise EmuLaunchError(f"launch of {kernel_name} on the emulated GPU failed: "
                                 f"{self._last_error().decode(errors='replace')}")

    def __repr__(self):
        return f"<EmuModule {self.digest[:12]} kernels={list(self.kernels)}>"
