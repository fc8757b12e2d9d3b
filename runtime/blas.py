"""BLAS for generated native code: the ``scipy-openblas32`` wheel's OpenBLAS.

The wheel ships OpenBLAS with 32-bit integers and prefixed symbols (``scipy_cblas_sgemm``) so
it never clashes with NumPy's private copy. :func:`load` opens it (RTLD_GLOBAL) and registers
its entry points with LLVM under hybrid's own names (``hybrid_cblas_sgemm`` -> the wheel's
``scipy_cblas_sgemm``), so JIT-compiled code calls BLAS directly, with no Python in between.

Threads: OpenBLAS runs single-threaded. Generated code splits big kernels across its own
threads (the workers of compiler/codegen/extern_plan.py) and calls BLAS from each. A
multithreaded OpenBLAS would oversubscribe the cores under them, and its pool waits with
``sched_yield`` spins: on a 2-core machine with the other core busy, a 0.1 ms GEMM of LeNet's
dense layers took 4-16 ms (scheduler ticks).
"""
from __future__ import annotations

import ctypes
import os
import threading

from . import config


# name used in generated IR -> unprefixed CBLAS name in the wheel
FUNCTIONS = {
    "hybrid_cblas_sgemm": "cblas_sgemm",
    "hybrid_cblas_dgemm": "cblas_dgemm",
    "hybrid_cblas_sgemv": "cblas_sgemv",
    "hybrid_cblas_dgemv": "cblas_dgemv",
}
CBLAS_ROW_MAJOR = 101
CBLAS_NO_TRANS = 111
CBLAS_TRANS = 112


class BlasUnavailable(RuntimeError):
    """The scipy-openblas32 wheel is not installed or cannot be loaded."""


_lock = threading.Lock()
_state: dict = {}


def _library_path() -> str:
    # the wheel's lib/ folder (its get_lib_dir()), found without running its __init__, which
    # reads the package metadata: ~5-10 ms of a warm first call that calls BLAS
    import importlib.util  # noqa: PLC0415
    spec = importlib.util.find_spec("scipy_openblas32")
    if spec is None or not spec.submodule_search_locations:
        raise BlasUnavailable("generated code calls BLAS from the scipy-openblas32 wheel: "
                              "pip install scipy-openblas32")
    libdir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    names = [n for n in os.listdir(libdir) if n.startswith("libscipy_openblas")
             and (".so" in n or n.endswith(".dylib") or n.endswith(".dll"))]
    if not names:
        raise BlasUnavailable(f"no OpenBLAS shared library in {libdir}")
    return os.path.join(libdir, sorted(names)[0])


def _find(lib, name: str):
    """(symbol name, ctypes function) of a CBLAS/OpenBLAS function, whatever its prefix."""
    for prefix in ("scipy_", ""):
        for suffix in ("", "64_"):
            sym = prefix + name + suffix
            try:
                return sym, getattr(lib, sym)
            except AttributeError:
                continue
    raise BlasUnavailable(f"OpenBLAS library has no symbol for {name}")


def load_library():
    """Open OpenBLAS once (RTLD_GLOBAL, so shared libraries linked against it resolve its
    symbols), without llvmlite. Returns the ctypes library."""
    lib = _state.get("lib")
    if lib is not None:
        return lib
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        path = _library_path()
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        names = {}
        for ours, name in FUNCTIONS.items():
            sym, fn = _find(lib, name)
            names[ours] = sym
            _state.setdefault("addresses", {})[ours] = ctypes.cast(fn, ctypes.c_void_p).value
        _sym, setter = _find(lib, "openblas_set_num_threads")
        setter.argtypes = [ctypes.c_int]
        setter.restype = None
        _sym, getter = _find(lib, "openblas_get_num_threads")
        getter.restype = ctypes.c_int
        _state["set_threads"] = setter
        _state["get_threads"] = getter
        _state["names"] = names
        _state["path"] = path
        _state["lib"] = lib
        config.logger("codegen").info("BLAS: %s", path)
    from . import engine  # noqa: PLC0415 - after the library is ready
    # Registered after engine's own hook, whose threadpoolctl call sets every BLAS it finds
    # (this one too) to the core share: this one runs last and keeps OpenBLAS at one thread.
    engine.on_core_share(lambda _share: set_threads(1))
    return lib


def symbol_names() -> dict:
    """hybrid's BLAS names in generated code -> the library's own symbols (what a shared
    library of generated code is linked against: runtime/native.py)."""
    load_library()
    return dict(_state["names"])


def load():
    """Load OpenBLAS once; register its symbols with LLVM (MCJIT). Returns the library."""
    lib = load_library()
    if not _state.get("registered"):
        with _lock:
            if not _state.get("registered"):
                import llvmlite.binding as llvm  # noqa: PLC0415 - only with native code
                for ours, addr in _state["addresses"].items():
                    llvm.add_symbol(ours, addr)
                _state["registered"] = True
    return lib


def set_threads(n: int):
    """OpenBLAS threads for generated code (1: see the module docstring)."""
    setter = _state.get("set_threads")
    if setter is not None:
        setter(max(1, int(n)))
        config.logger("codegen").info("BLAS threads: %d", n)


def get_threads() -> int:
    load()
    return int(_state["get_threads"]())


def library_path() -> str:
    load()
    return _state["path"]
