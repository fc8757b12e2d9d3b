"""The executable cache: a traced graph -> its compiled executable, on disk, so that a warm
first call (a new process, the cache on disk) runs no pass, no lowering and no code
generation: it reads one JSON entry and loads the stored object code.

The key is a named record, hashed, never pickled (runtime/native.py's habit):

- ``format``: this file's entry format;
- ``graph_sha256``: the traced graph's canonical JSON (``Graph.to_json``: nodes, attributes,
  specs, devices, source lines, constants' bytes) plus each scalar argument's Python type;
- ``backend``, ``device``;
- the host: target triple, CPU name and features, llvmlite, LLVM and hybrid versions, and
  the core count extern plans split their work for (extern_plan.max_workers);
- ``sources``: a fingerprint of every ``.py`` file of compiler/ and runtime/ (path, size,
  mtime): a pass or code generator edited since the entry was written never serves it.

The entry (``<cache dir>/exe/<digest[:2]>/<digest>.json``) is one JSON document: the key
record, the body and the body's sha256. The body holds what running needs: the program's
slots, arena size and packed-weights state offsets (codegen/llvm/loaded.py ProgramInfo), the
binding (constants as base64), the output specs, the explain text, and the key record of the
machine code (runtime/native.py), whose object file carries its own sha256. Entries are
written atomically (runtime/atomic.py), off the caller's path: a thread (not a daemon: exit
waits for it) first links the program and the thread pool into shared libraries
(runtime/native.py link_shared), so that the next process loads them with dlopen and never
imports llvmlite, then writes the entry. One that does not parse or check out is reported
(a RuntimeWarning) and compiled again, and so is one whose object file is missing or
corrupt.

Only plain LLVM executables are stored (one native call: no index checks, no device parts,
no control flow); the rest compile as before. Nothing is read or stored while
HYBRID_PRINT_AFTER, HYBRID_DUMP_DIR or a compile-time HYBRID_LOG channel (fusion, memory,
schedule, codegen, ...) asks to watch the compiler work.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from runtime import config, native
from runtime.atomic import write_bytes
from runtime.executable import Executable

from .ops import Spec

FORMAT = "hybrid-exe/2"
# what the cache did, counted (tests assert a warm start loads and compiles nothing)
stats = {"hits": 0, "misses": 0, "stores": 0, "rejected": 0}
_WATCH_FREE = frozenset({"engine", "recompiles", "compile"})  # channels a hit does not skip
_sources_print: list = []
_writes: list = []  # the threads writing entries (wait_writes)
_writes_lock = threading.Lock()


def _log():
    return config.logger("compile")


def compile(graph, backend: str = "reference", device=None, rows=None):
    """``compiler.pipeline.compile(graph, backend, device, rows=rows)``, from the disk cache
    when this graph was compiled before (by any process) on this host with these sources
    (a shape bucket's row-bounded program, ``rows``, is not cached)."""
    key = None if rows else _key(graph, backend, device)
    if key is not None:
        exe = _lookup(graph, key, device)
        if exe is not None:
            return exe
        stats["misses"] += 1
    if backend == "llvm":
        native.prepare()  # llvmlite's import overlaps the passes (a miss only: a hit needs none)
    from .pipeline import compile as compile_graph  # noqa: PLC0415 - a miss only
    exe = compile_graph(graph, backend, device, rows=rows)
    if key is not None:
        _store(key, exe)
    return exe


# ------------------------------------------------------------------------ the key
def _watching() -> bool:
    return bool(config.get("HYBRID_PRINT_AFTER") or config.get("HYBRID_DUMP_DIR") or
                config.get("HYBRID_LOG") - _WATCH_FREE)


def sources_fingerprint() -> str:
    """sha256 over (path, size, mtime) of every .py file of compiler/ and runtime/, once
    per process (~0.5 ms)."""
    if _sources_print:
        return _sources_print[0]
    root = str(Path(__file__).resolve().parent.parent)
    h = hashlib.sha256()
    for pkg in ("compiler", "runtime"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, pkg)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = dirpath[len(root):]
            for f in sorted(filenames):
                if f.endswith(".py"):
                    st = os.stat(os.path.join(dirpath, f))
                    h.update(f"{rel}/{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    _sources_print.append(h.hexdigest())
    return _sources_print[0]


def key_record(graph, backend: str, device=None) -> dict | None:
    """The named key record of ``graph`` compiled for ``backend`` on this host, or None
    where the cache does not apply (a backend other than LLVM, a graph that has no JSON
    form or carries decisions in ``meta``, someone watching the compile)."""
    if backend != "llvm" or _watching() or graph.meta:
        return None  # (meta: decisions made before compiling, e.g. a loop body's: not keyed)
    try:
        text = graph.to_json(indent=None)
    except (TypeError, ValueError):  # an attribute with no JSON form: compile, uncached
        return None
    h = hashlib.sha256(text.encode())
    for n in sorted(graph.g.nodes):  # 1 and 1.0 and True are one JSON number, not one type
        scalars = graph.g.nodes[n].get("scalars")
        if scalars:
            h.update(repr((n, sorted((int(p), type(v).__name__)
                                     for p, v in scalars.items()))).encode())
    from runtime.device import cpu_count  # noqa: PLC0415
    rec = {"format": FORMAT, "graph_sha256": h.hexdigest(), "backend": backend,
           "device": str(device), "sources": sources_fingerprint(), "cpus": cpu_count()}
    rec.update(native.host_key())  # no llvmlite: a cold compile imports it meanwhile
    return rec


def _key(graph, backend, device):
    try:
        rec = key_record(graph, backend, device)
    except Exception as exc:  # noqa: BLE001 - no key: compile as without a cache
        _log().info("%s: no executable cache key (%s: %s)", graph.name, type(exc).__name__,
                    exc)
        return None
    if rec is None:
        return None
    return rec, native.key_digest(rec)


def entry_path(digest: str, root: Path | None = None) -> Path:
    return (root or config.cache_dir()) / "exe" / digest[:2] / f"{digest}.json"


# ------------------------------------------------------------------------ store
def _array_doc(a) -> dict:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _ref_doc(ref) -> list:
    kind, v = ref
    if kind == "const":
        if type(v) is not np.ndarray:
            raise TypeError(f"a constant of type {type(v).__name__}")
        return [kind, _array_doc(v)]
    return [kind, int(v)]


def _store(key, exe):
    from .codegen.llvm.loaded import NativeRun, ProgramInfo  # noqa: PLC0415
    if type(exe) is not Executable or type(exe.run) is not NativeRun:
        return  # index checks, device parts, control flow: compiled each process
    from .codegen.llvm import emit  # noqa: PLC0415 - it compiled this: loaded
    if emit.settings_changed():  # a later process, which never imports emit, would load it
        _log().info("%s: not cached: code generator settings changed at run time",
                    exe.run.compiled.name)
        return
    run = exe.run
    compiled = run.compiled
    record = compiled.native.record
    if record is None:
        return
    from .codegen.kernel import ExternKernel  # noqa: PLC0415 - a miss: compiled already
    prog = compiled.program
    try:
        body = {
            "program": ProgramInfo.of(prog).to_doc(),
            "binding": {"io": [_ref_doc(e) for e in run.binding.io],
                        "outputs": [_ref_doc(e) for e in run.binding.outputs]},
            "name": compiled.name, "symbol": compiled.symbol, "native": record,
            "blas": any(isinstance(s, ExternKernel) for s in prog.steps),
            "out_specs": [[list(s.shape), s.dtype] for s in exe.out_specs],
            "kernels": exe.report.get("kernels"),
            "explain": exe.report.get("explain", ""),
        }
    except (TypeError, ValueError, AttributeError) as exc:
        _log().info("%s: executable not cached (%s)", compiled.name, exc)
        return
    modules = [compiled.native]
    if compiled._nthreads is not None:
        from .codegen.llvm import threadpool  # noqa: PLC0415
        modules.append(threadpool.native_module())
    # off the caller's path: the link (~10-20 ms a module, in subprocesses) and the write
    # are for the next process. Not a daemon: the interpreter waits for it at exit.
    t = threading.Thread(target=_write, args=(key, body, modules, config.cache_dir()),
                         daemon=False, name="hybrid-exe-cache-write")
    with _writes_lock:
        _writes.append(t)
    t.start()


def wait_writes():
    """Until every entry this process is storing is on disk (tests; exit waits anyway)."""
    while True:
        with _writes_lock:
            if not _writes:
                return
            t = _writes.pop()
        t.join()


def _write(key, body, modules, root):
    # a later process loads these through dlopen, without llvmlite: linked before the entry
    # is written, so an entry it finds has them (or never will: no linker)
    rec, digest = key
    path = entry_path(digest, root)
    try:
        for module in modules:
            if module is not None:
                native.link_shared(module, root)
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        doc = {"key": rec, "body": body, "sha256": hashlib.sha256(text.encode()).hexdigest()}
        write_bytes(path, json.dumps(doc, sort_keys=True).encode(), fsync=False)
    except Exception as exc:  # noqa: BLE001 - a cache write only ever costs a compile
        _log().warning("could not write executable cache entry %s: %s", path, exc)
        return
    stats["stores"] += 1


# ------------------------------------------------------------------------ load
class _Binding:
    """lower.Binding's fields (io, outputs), without importing the lowering."""
    __slots__ = ("io", "outputs")

    def __init__(self, io, outputs):
        self.io, self.outputs = io, outputs


def _array(doc) -> np.ndarray:
    dt = np.dtype(doc["dtype"])
    shape = tuple(int(n) for n in doc["shape"])
    data = base64.b64decode(doc["data"].encode("ascii"), validate=True)
    if len(data) != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ValueError("a constant's size does not match its shape")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()


def _ref(doc) -> tuple:
    kind, v = doc
    if kind == "const":
        return kind, _array(v)
    if kind not in ("input", "param", "output", "alias", "slot") or type(v) is not int:
        raise ValueError(f"a binding entry {kind!r}")
    return kind, v


def _read(path: Path, rec: dict):
    """The entry's body, or None (missing: quietly; not checking out: a warning)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log().info("executable cache entry %s unreadable (%s)", path, exc)
        return None
    why = None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("body"), dict):
        why = "not a JSON entry"
    elif doc.get("key") != rec:
        why = "key record differs"
    else:
        text = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
        if doc.get("sha256") != hashlib.sha256(text.encode()).hexdigest():
            why = "sha256 mismatch"
    if why is None:
        return doc["body"]
    _reject(path, why)
    return None


def _reject(path, why):
    stats["rejected"] += 1
    msg = f"hybrid: executable cache entry {path} is corrupt ({why}); compiling"
    warnings.warn(msg, RuntimeWarning, stacklevel=5)
    _log().warning(msg)


def _settings_match(record: dict) -> bool:
    """Whether the code generator's settings in this process are the ones the stored code
    was generated with (the machine-code record's codegen version and extern split). Their
    values in the source are in the key (the sources fingerprint); what this adds is a
    value changed at run time (a test's monkeypatch). Checked only where the code
    generator is loaded: a process that never imported it cannot have changed it."""
    if "compiler.codegen.llvm.emit" not in sys.modules and \
            "compiler.codegen.extern_plan" not in sys.modules:
        return True
    from .codegen.llvm import emit  # noqa: PLC0415 - loaded already, or about to compile
    ok = record.get("x.codegen") == emit.CODEGEN_VERSION and \
        record.get("x.externs") == emit.extern_key()
    if not ok:
        _log().info("executable cache entry not used: code generator settings changed")
    return ok


def _lookup(graph, key, device):
    rec, digest = key
    t0 = time.perf_counter()
    path = entry_path(digest)
    body = _read(path, rec)
    if body is None:
        return None
    from .codegen.llvm.loaded import CompiledProgram, NativeRun, ProgramInfo  # noqa: PLC0415
    try:
        info = ProgramInfo.from_doc(body["program"])
        binding = _Binding([_ref(e) for e in body["binding"]["io"]],
                           [_ref(e) for e in body["binding"]["outputs"]])
        out_specs = [Spec(tuple(int(n) for n in shape), str(dt))
                     for shape, dt in body["out_specs"]]
        symbol, name = str(body["symbol"]), str(body["name"])
        record = body["native"]
        if not isinstance(record, dict):
            raise ValueError("no machine-code record")
        if not _settings_match(record):
            return None
        before = None
        if body["blas"]:
            from runtime import blas  # noqa: PLC0415 - BLAS symbols must exist before linking
            before = blas.load
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        _reject(path, f"{type(exc).__name__}: {exc}")
        return None
    module = native.load_cached(record, [symbol], name=name, before_load=before,
                                optional_globals=[f"{symbol}.nthreads", f"{symbol}.pool"])
    if module is None:  # the object file is gone or did not check out: compile
        return None
    if not module.shared:  # loaded by MCJIT: its shared library is missing or was broken
        native.link_shared(module)
    compiled = CompiledProgram(info, name, module, symbol,
                               f"{symbol}.nthreads" in module.addresses)
    run = NativeRun(compiled, binding)
    seconds = time.perf_counter() - t0
    report = {"kernels": body.get("kernels"), "arena_bytes": info.arena_bytes,
              "program": info, "passes": [], "graph": graph, "compile_seconds": seconds,
              "explain": body.get("explain", ""), "exe_cache": str(path)}
    exe = Executable(run, "llvm", [graph.spec(n) for n in graph.inputs],
                     [graph.spec(n) for n in graph.params], out_specs, device, report)
    stats["hits"] += 1
    _log().info("%s: warm (executable cache hit) in %.1f ms [%s]", graph.name,
                seconds * 1e3, path)
    return exe
