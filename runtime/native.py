"""Native code: LLVM IR text -> machine code (llvmlite MCJIT), cached on disk, called via ctypes.

The runtime never imports the compiler: :func:`compile_ir` takes IR text, the entry symbols
and a key record of what else the code depends on. Calls go through ``ctypes.CFUNCTYPE``,
which releases the GIL, so engine workers run native code in parallel.

The on-disk cache (``config.cache_dir()/"llvm"``) is content-addressed by a named key record
(sha256 of the IR, target triple, CPU name and features, llvmlite and LLVM versions, hybrid
version, plus the caller's fields), hashed, never pickled. One entry is one file: a JSON
header line (the key record, the object's sha256 and size) and the object bytes, written to a
temporary file and moved into place with ``os.replace``, so concurrent writers are safe and a
reader sees a whole entry or none. An entry whose checksum or key does not match is reported
(a warning) and rebuilt.

``HYBRID_LOG=compile`` reports cold and warm compile times; ``HYBRID_DUMP_DIR`` receives the
IR (``.ll``, and ``.opt.ll`` after optimization) and assembly (``.s``) of every module.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import re
import sys
import threading
import time
import warnings
from pathlib import Path

from . import config
from .atomic import write_bytes

FORMAT = "hybrid-llvm-object/1"
OPT_PIPELINE = "O3+vectorize,no-unroll,no-interleave"  # part of the cache key
_lock = threading.RLock()
_target: dict = {}
_loaded: dict = {}  # cache digest -> NativeModule (one MCJIT engine per distinct object)
# what compile_ir did, counted (tests assert a warm start compiles and generates nothing)
stats = {"compiles": 0, "disk_hits": 0, "ir_generated": 0}
# Engines are never disposed: machine code must outlive every function pointer handed out
# (and disposing an MCJIT engine that was fed an object file crashes in llvmlite 0.50).
_keepalive: list = []


def _log():
    return config.logger("compile")  # looked up per use: HYBRID_LOG may change at run time


def _hybrid_version() -> str:
    # The front end's version when it is loaded (always, but for runtime-only tools): read,
    # never imported (runtime never imports hybrid). importlib.metadata costs ~60 ms of a
    # first hybridized call (its import and the METADATA parse), for the same string.
    front = sys.modules.get("hybrid")
    version = getattr(front, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib.metadata import version  # noqa: PLC0415
        return version("hybrid")
    except Exception:  # noqa: BLE001 - not installed: a source checkout
        return "0.1.0+src"


def _llvm():
    import llvmlite.binding as llvm  # noqa: PLC0415 - native code is optional for the runtime
    return llvm


def target():
    """(llvm module, target machine, info dict) for this host, created once."""
    if _target:
        return _target["llvm"], _target["tm"], _target["info"]
    with _lock:
        if not _target:
            llvm = _llvm()
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            cpu = llvm.get_host_cpu_name()
            features = llvm.get_host_cpu_features().flatten()
            tm = llvm.Target.from_default_triple().create_target_machine(
                cpu=cpu, features=features, opt=3, jit=True)
            import llvmlite  # noqa: PLC0415
            info = {"triple": tm.triple, "cpu": cpu, "features": features,
                    "data_layout": str(tm.target_data), "llvmlite": llvmlite.__version__,
                    "llvm": ".".join(map(str, llvm.llvm_version_info)),
                    "hybrid": _hybrid_version()}
            _target.update(llvm=llvm, tm=tm, info=info)
    return _target["llvm"], _target["tm"], _target["info"]


def target_info() -> dict:
    """Triple, CPU name and features, data layout and versions of this host's code."""
    return dict(target()[2])


def key_record(ir_text, extra: dict | None = None, source_key: str | None = None) -> dict:
    """The cache key: the IR's sha256 — or, when the caller generates IR deterministically
    from a source it can name (a kernel Program's hash), that ``source_key``, so a warm
    start does not have to generate the IR at all."""
    info = target_info()
    rec = {"format": FORMAT, "opt": OPT_PIPELINE}
    if source_key is not None:
        rec["source_key"] = source_key
    else:
        rec["ir_sha256"] = hashlib.sha256(ir_text.encode()).hexdigest()
    rec.update({k: info[k] for k in ("triple", "cpu", "features", "llvmlite", "llvm",
                                     "hybrid")})
    for k, v in (extra or {}).items():
        rec[f"x.{k}"] = v
    return rec


def key_digest(record: dict) -> str:
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def cache_path(digest: str) -> Path:
    return config.cache_dir() / "llvm" / digest[:2] / f"{digest}.o"


class NativeModule:
    """Loaded machine code: symbol addresses, kept alive with the MCJIT engine."""

    def __init__(self, name: str, engine, addresses: dict, digest: str, cache_hit: bool,
                 record: dict | None = None):
        self.name = name
        self._engine = engine
        self.addresses = addresses
        self.digest = digest
        self.cache_hit = cache_hit
        self.record = record  # the cache key record (load_cached finds the object by it)

    def address(self, symbol: str) -> int:
        return self.addresses[symbol]

    def global_address(self, symbol: str) -> int:
        return self.addresses[symbol]

    def cfunc(self, symbol: str, restype=None, *argtypes):
        """A ctypes function (GIL released during the call)."""
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.addresses[symbol])


def compile_ir(ir_text, entries, key: dict | None = None, name: str = "module",
               before_load=None, globals_=(), source_key: str | None = None,
               optional_globals=()) -> NativeModule:
    """Machine code for ``ir_text`` (from the disk cache when possible).

    entries: the functions whose addresses are wanted; globals_: global variables too (the
    caller may write them, e.g. a thread count). key: extra fields of the cache key
    (whatever else the code depends on). before_load: called before the object is linked (to
    register the external symbols it calls, e.g. BLAS).
    """
    entries = tuple(entries)
    record = key_record(ir_text, key, source_key)
    digest = key_digest(record)
    mod = _loaded.get(digest)
    if mod is not None:
        return mod
    with _lock:
        mod = _loaded.get(digest)
        if mod is not None:
            return mod
        t0 = time.perf_counter()
        dump = config.get("HYBRID_DUMP_DIR")
        path = cache_path(digest)
        obj = None if dump else _read_cache(path, record)
        hit = obj is not None
        times = {}
        if obj is None:
            if callable(ir_text):  # generated only when it must be compiled
                ir_text = ir_text()
                stats["ir_generated"] += 1
            obj, times = _compile(ir_text, name, dump)
            stats["compiles"] += 1
            _write_cache(path, record, obj)
        else:
            stats["disk_hits"] += 1
        if before_load is not None:
            before_load()
        t1 = time.perf_counter()
        engine, addresses = _load(obj, entries, tuple(globals_), tuple(optional_globals))
        times["load"] = time.perf_counter() - t1
        total = time.perf_counter() - t0
        detail = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items())
        _log().info("%s: %s in %.1f ms (%s) [%s]", name,
                  "warm (disk cache hit)" if hit else "cold compile", total * 1e3, detail,
                  path)
        mod = NativeModule(name, engine, addresses, digest, hit, record)
        _loaded[digest] = mod
        return mod


def load_cached(record: dict, entries, name: str = "module", before_load=None, globals_=(),
                optional_globals=()) -> NativeModule | None:
    """The machine code of a key record that :func:`compile_ir` made (``NativeModule.record``),
    from memory or the disk cache; None, compiling nothing, when the entry is missing or
    does not check out (then the caller compiles). A warm first call loads its executable's
    object this way: no IR, no Program, no compiler."""
    if config.get("HYBRID_DUMP_DIR"):
        return None  # dumping asks for the IR: compile
    digest = key_digest(record)
    mod = _loaded.get(digest)
    if mod is not None:
        return mod
    with _lock:
        mod = _loaded.get(digest)
        if mod is not None:
            return mod
        t0 = time.perf_counter()
        path = cache_path(digest)
        obj = _read_cache(path, record)
        if obj is None:
            return None
        stats["disk_hits"] += 1
        if before_load is not None:
            before_load()
        engine, addresses = _load(obj, tuple(entries), tuple(globals_),
                                  tuple(optional_globals))
        _log().info("%s: warm (disk cache hit, by record) in %.1f ms [%s]", name,
                    (time.perf_counter() - t0) * 1e3, path)
        mod = NativeModule(name, engine, addresses, digest, True, record)
        _loaded[digest] = mod
        return mod


def _compile(ir_text: str, name: str, dump):
    llvm, tm, _info = target()
    times = {}
    t = time.perf_counter()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    times["parse"] = time.perf_counter() - t
    t = time.perf_counter()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    # unrolling and interleaving cost ~5x compile time (ResNet-18: 7.7 s -> 1.3 s) for a
    # few percent at run time; vectorization stays on
    pto.loop_unrolling = False
    pto.loop_interleaving = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    times["optimize"] = time.perf_counter() - t
    t = time.perf_counter()
    obj = tm.emit_object(mod)
    times["codegen"] = time.perf_counter() - t
    if dump:
        _dump(Path(dump), name, ir_text, str(mod), tm.emit_assembly(mod))
    return obj, times


def _dump(where: Path, name: str, ir_text: str, opt_text: str, asm: str):
    where.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    for suffix, text in ((".ll", ir_text), (".opt.ll", opt_text), (".s", asm)):
        write_bytes(where / f"{stem}{suffix}", text.encode(), fsync=False)
    _log().info("%s: dumped %s.{ll,opt.ll,s} to %s", name, stem, where)


def _load(obj: bytes, entries, globals_=(), optional_globals=()):
    llvm, tm, _info = target()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    _keepalive.append(engine)
    addresses = {}
    for sym in entries:
        addr = engine.get_function_address(sym)
        if not addr:
            raise RuntimeError(f"native code has no symbol {sym!r}")
        addresses[sym] = addr
    for sym in globals_:
        addr = engine.get_global_value_address(sym)
        if not addr:
            raise RuntimeError(f"native code has no global {sym!r}")
        addresses[sym] = addr
    for sym in optional_globals:
        addr = engine.get_global_value_address(sym)
        if addr:
            addresses[sym] = addr
    return engine, addresses


# -------------------------------------------------------------------- disk cache
def _read_cache(path: Path, record: dict):
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log().info("cache entry %s unreadable (%s)", path, exc)
        return None
    why = None
    nl = data.find(b"\n")
    try:
        header = json.loads(data[:nl].decode()) if nl > 0 else None
    except (ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        why = "no valid header"
    else:
        obj = data[nl + 1:]
        if header.get("key") != record:
            why = "key record differs"
        elif header.get("size") != len(obj):
            why = f"size {len(obj)} != {header.get('size')} (truncated?)"
        elif header.get("sha256") != hashlib.sha256(obj).hexdigest():
            why = "sha256 mismatch"
    if why is None:
        return obj
    msg = f"hybrid: compile cache entry {path} is corrupt ({why}); recompiling"
    warnings.warn(msg, RuntimeWarning, stacklevel=4)
    _log().warning(msg)
    return None


def _write_cache(path: Path, record: dict, obj: bytes):
    header = {"key": record, "sha256": hashlib.sha256(obj).hexdigest(), "size": len(obj)}
    data = json.dumps(header, sort_keys=True).encode() + b"\n" + obj
    try:
        write_bytes(path, data, fsync=False)  # a lost entry only costs a recompile
    except OSError as exc:  # a read-only or full cache directory only costs a recompile
        _log().warning("could not write compile cache entry %s: %s", path, exc)


def clear_memory_cache():
    """Forget loaded modules, so the next compile_ir goes to the disk cache (for tests).

    The machine code itself stays loaded (see _keepalive)."""
    with _lock:
        _loaded.clear()
