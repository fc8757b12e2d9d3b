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

A warm start needs no llvmlite where it can: the host's target info is remembered under a
fingerprint of /proc/cpuinfo and the llvmlite install (``host/<fingerprint>.json``), and an
object that a later process will want is also linked by the system linker into a shared
library (``link_shared``; ``<digest>.so`` plus its checksummed ``.so.json``) that it dlopens:
the same machine code, ~30-50 ms of llvmlite import and MCJIT set-up saved. Without a linker,
or when a library does not check out or load, MCJIT loads the object as before.

``HYBRID_LOG=compile`` reports cold and warm compile times; ``HYBRID_DUMP_DIR`` receives the
IR (``.ll``, and ``.opt.ll`` after optimization) and assembly (``.s``) of every module.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import queue
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
# Helper modules that run no array arithmetic (the thread pool's claim loop) are compiled
# without IR passes and with LLVM's fast instruction selection: ~4 ms instead of ~40 on a
# first call, for code whose speed is its system calls' and atomics', not LLVM's.
OPT_QUICK = "O0"
_lock = threading.RLock()
_target_lock = threading.Lock()  # creating the target machine (not _lock: see prepare)
_target: dict = {}
_preparing: list = []  # the thread of prepare(), once started
_loaded: dict = {}  # cache digest -> NativeModule (one MCJIT engine per distinct object)
# what compile_ir did, counted (tests assert a warm start compiles and generates nothing)
stats = {"compiles": 0, "disk_hits": 0, "ir_generated": 0, "shared_loads": 0, "links": 0}
# Engines are never disposed: machine code must outlive every function pointer handed out
# (and disposing an MCJIT engine that was fed an object file crashes in llvmlite 0.50).
# MCJIT engines are let go of once loaded (_load); shared libraries are kept here.
_keepalive: list = []


def _after_fork_in_child():
    """A child forked while a thread of the parent held a lock here (a compile, or prepare()
    importing llvmlite) would wait for it forever: that thread does not exist in the child.
    The child starts with fresh locks; a preparation the parent had not finished is started
    again by the next compile."""
    global _lock, _target_lock
    _lock = threading.RLock()
    _target_lock = threading.Lock()
    if not _target:
        _preparing.clear()


def _before_fork():
    """A fork waits (seconds at most) for prepare()'s import of llvmlite to end: a child forked
    in the middle would inherit the import's module locks held by a thread it does not have,
    and hang in its own first compile."""
    for t in list(_preparing):
        if t is not threading.current_thread():
            t.join(timeout=5.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


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


def _make_tm(opt: int = 3, cpu: str | None = None, features: str | None = None):
    """A new target machine for this host, for the CPU and features of the cache key once
    target() made them (a compile thread's own: native_parallel)."""
    llvm = _llvm()
    if cpu is None:
        cpu, features = _target["info"]["cpu"], _target["info"]["features"]
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=cpu, features=features, opt=opt, jit=True)


# LLVM vectorizes loops 256 bits wide on Intel's AVX-512 cores (their "prefer-256-bit"
# tuning, against the clock drop of 512-bit work). The generated GEMM loops run 512-bit FMAs
# anyway, so the other loops go 512 wide too: the LSTM language model's gates and softmax
# passes took 10-25% less time (2-vCPU Xeon), its training step ~0.5 ms of ~21.
WIDE_VECTORS = "-prefer-256-bit"


def _host_features(llvm) -> str:
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        features += "," + WIDE_VECTORS
    return features


def target():
    """(llvm module, target machine, info dict) for this host, created once."""
    if _target:
        return _target["llvm"], _target["tm"], _target["info"]
    with _target_lock:
        if not _target:
            llvm = _llvm()
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            cpu = llvm.get_host_cpu_name()
            features = _host_features(llvm)
            tm = _make_tm(3, cpu, features)
            import llvmlite  # noqa: PLC0415
            tm_quick = _make_tm(0, cpu, features)
            info = {"triple": tm.triple, "cpu": cpu, "features": features,
                    "data_layout": str(tm.target_data), "llvmlite": llvmlite.__version__,
                    "llvm": ".".join(map(str, llvm.llvm_version_info)),
                    "hybrid": _hybrid_version()}
            _target.update(llvm=llvm, tm=tm, tm_quick=tm_quick, info=info)
            if _host.get("info") is not None and _host["info"] != info:
                _remember_host(info)  # keys made from it were wrong: never again
    return _target["llvm"], _target["tm"], _target["info"]


def prepare():
    """Start importing llvmlite and making the target machine in a background thread (once
    per process), so that a cold compile's import (~50-80 ms, mostly outside the GIL: the
    library's dlopen) overlaps the Python work before its first use (passes, lowering, IR).
    Returns at once; whoever needs the target first waits for it in :func:`target`, which
    also raises what went wrong (this thread only logs it)."""
    if _target or _preparing:
        return

    def run():
        try:
            info = target()[2]
            if _known_host() != info:
                _remember_host(info)  # as target_info() does: the next start needs no llvmlite
        except Exception as exc:  # noqa: BLE001 - target() raises it again for its user
            _log().info("preparing llvmlite failed: %s: %s", type(exc).__name__, exc)
    with _target_lock:
        if _target or _preparing:
            return
        t = threading.Thread(target=run, name="hybrid-llvm-prepare", daemon=True)
        _preparing.append(t)
    t.start()


def host_key() -> dict:
    """What identifies this host's machine code, for cache keys computed before compiling
    (the executable cache), without llvmlite: the host fingerprint (/proc/cpuinfo's identity
    and flags and the llvmlite install, which decide LLVM's CPU name and features) and the
    versions; LLVM's own target info where there is no fingerprint."""
    fp = _host["fp"] if "fp" in _host else _host_fingerprint()
    if fp is None:
        info = target_info()
        return {k: info[k] for k in ("triple", "cpu", "features", "llvmlite", "llvm",
                                     "hybrid")}
    _host.setdefault("fp", fp)
    return {"host": fp, "hybrid": _hybrid_version()}


def target_info() -> dict:
    """Triple, CPU name and features, data layout and versions of this host's code.

    Without llvmlite when this host was seen before (:func:`_known_host`): a warm start
    computes its cache keys without importing it (~30-50 ms)."""
    if _target:
        return dict(_target["info"])
    info = _known_host()
    if info is not None:
        return dict(info)
    info = target()[2]
    _remember_host(info)
    return dict(info)


# ------------------------------------------------------------- this host, without llvmlite
_HOST_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
                "features", "cpu implementer", "cpu architecture", "cpu variant", "cpu part",
                "cpu revision")  # x86 and ARM spellings of /proc/cpuinfo
_host: dict = {}


def _host_fingerprint() -> str | None:
    """sha256 of what decides LLVM's host CPU name and features and its version: the first
    processor's /proc/cpuinfo identity and flags, the machine, and the llvmlite install (its
    version, and its library's size and mtime). None where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = []
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                lines.append(line)
        import llvmlite  # noqa: PLC0415 - its version only: no library loaded
        libdir = Path(llvmlite.__file__).parent / "binding"
        libs = sorted(p for p in libdir.iterdir() if p.name.startswith("libllvmlite"))
        machine = os.uname().machine
    except (OSError, ImportError, AttributeError):  # no /proc/cpuinfo, llvmlite or uname
        return None
    fields = []
    for line in lines:
        k, _, v = line.partition(":")
        if k.strip().lower() in _HOST_FIELDS:
            fields.append((k.strip().lower(), " ".join(sorted(v.split()))))
    if not fields or not libs:
        return None
    st = libs[0].stat()
    text = json.dumps([FORMAT, WIDE_VECTORS, sorted(fields), machine, llvmlite.__version__,
                       libs[0].name, st.st_size, st.st_mtime_ns])
    return hashlib.sha256(text.encode()).hexdigest()


def _host_path(fp: str) -> Path:
    return config.cache_dir() / "host" / f"{fp}.json"


def _known_host() -> dict | None:
    """The target info this host's fingerprint was last seen with (the hybrid version is
    this process's), or None."""
    if "info" in _host:
        return _host["info"]
    fp = _host_fingerprint()
    info = None
    if fp is not None:
        try:
            doc = json.loads(_host_path(fp).read_bytes())
            keys = ("triple", "cpu", "features", "data_layout", "llvmlite", "llvm")
            if isinstance(doc, dict) and doc.get("fingerprint") == fp and \
                    all(isinstance(doc.get(k), str) for k in keys) and \
                    doc.get("sha256") == _host_sum(doc):
                info = {k: doc[k] for k in keys}
                info["hybrid"] = _hybrid_version()
        except (OSError, ValueError, UnicodeDecodeError):
            info = None
    _host.update(fp=fp, info=info)
    return info


def _host_sum(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _remember_host(info: dict):
    """Write this host's target info under its fingerprint (for the next process); a
    remembered info that llvmlite now contradicts is replaced, and said so."""
    fp = _host["fp"] if "fp" in _host else _host_fingerprint()
    if fp is None:
        return
    known = _host.get("info")
    if known is not None and known != info:
        _log().warning("host info of %s changed (%s -> %s); rewritten", fp[:12],
                       {k: v for k, v in known.items() if info.get(k) != v},
                       {k: v for k, v in info.items() if known.get(k) != v})
    doc = {k: v for k, v in info.items() if k != "hybrid"}
    doc["fingerprint"] = fp
    doc["sha256"] = _host_sum(doc)
    try:
        write_bytes(_host_path(fp), json.dumps(doc, sort_keys=True).encode(), fsync=False)
    except OSError as exc:
        _log().info("could not write host info %s: %s", _host_path(fp), exc)
    _host.update(fp=fp, info=dict(info))


def key_record(ir_text, extra: dict | None = None, source_key: str | None = None,
               quick: bool = False) -> dict:
    """The cache key: the IR's sha256 — or, when the caller generates IR deterministically
    from a source it can name (a kernel Program's hash), that ``source_key``, so a warm
    start does not have to generate the IR at all."""
    info = target_info()
    rec = {"format": FORMAT, "opt": OPT_QUICK if quick else OPT_PIPELINE}
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


def cache_path(digest: str, root: Path | None = None) -> Path:
    return (root or config.cache_dir()) / "llvm" / digest[:2] / f"{digest}.o"


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
        self.shared = False  # linked into a shared library (link_shared) or loaded from one

    def address(self, symbol: str) -> int:
        return self.addresses[symbol]

    def global_address(self, symbol: str) -> int:
        return self.addresses[symbol]

    def cfunc(self, symbol: str, restype=None, *argtypes):
        """A ctypes function (GIL released during the call)."""
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.addresses[symbol])


def compile_ir(ir_text, entries, key: dict | None = None, name: str = "module",
               before_load=None, globals_=(), source_key: str | None = None,
               optional_globals=(), quick: bool = False, meanwhile=None) -> NativeModule:
    """Machine code for ``ir_text`` (from the disk cache when possible).

    entries: the functions whose addresses are wanted; globals_: global variables too (the
    caller may write them, e.g. a thread count). key: extra fields of the cache key
    (whatever else the code depends on). before_load: called before the object is linked (to
    register the external symbols it calls, e.g. BLAS). quick: no IR passes, fast
    instruction selection (OPT_QUICK: helper code without array arithmetic). meanwhile:
    called on this thread once every shard is built, while compile threads finish them (what
    the caller needs next: the thread pool's module), or after a compile on one thread.
    """
    entries = tuple(entries)
    record = key_record(ir_text, key, source_key, quick)
    digest = key_digest(record)
    mod = _loaded.get(digest)
    if mod is not None:
        return mod
    with _lock:
        t0 = time.perf_counter()
        dump = config.get("HYBRID_DUMP_DIR")
        mod = _known(digest, record, name, entries, globals_, optional_globals, dump)
        if mod is not None:
            return mod
        path = cache_path(digest)
        obj = None if dump else _read_cache(path, record)
        hit = obj is not None
        times = {}
        if obj is None:
            if callable(ir_text):  # generated only when it must be compiled
                ir_text = ir_text()
                stats["ir_generated"] += 1
            obj, times = _compile(ir_text, name, dump, quick, meanwhile)
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


_builtins: dict = {}  # name -> NativeModule of the process-wide helper modules


def builtin_module(name: str, emit_ir, source_key: str, entries,
                   quick: bool = False) -> NativeModule:
    """A process-wide helper module (the thread pool, the loop step driver), loaded once:
    its IR, ``emit_ir(triple, data_layout)``, is generated only when the disk cache misses,
    keyed by ``source_key`` (the emitter's version); quick: see compile_ir."""
    mod = _builtins.get(name)
    if mod is None:
        info = target_info()
        mod = compile_ir(lambda: emit_ir(info["triple"], info["data_layout"]), entries,
                         name=name, source_key=source_key,
                         quick=quick)  # one compile: its lock, its memo
        _builtins[name] = mod
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
        mod = _known(digest, record, name, entries, globals_, optional_globals, False)
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


def _mismatch(meta: dict, record: dict, data: bytes):
    """Why ``data`` is not what ``meta`` (a cache file's header) says it holds for the key
    ``record``: None when it is."""
    if meta.get("key") != record:
        return "key record differs"
    if meta.get("size") != len(data):
        return f"size {len(data)} != {meta.get('size')} (truncated?)"
    if meta.get("sha256") != hashlib.sha256(data).hexdigest():
        return "sha256 mismatch"
    return None


def _known(digest, record, name, entries, globals_, optional_globals, dump):
    """The module of ``digest`` loaded in this process already or, unless dumping (which asks
    for the IR), from its linked shared library in the disk cache; None. Under ``_lock``."""
    mod = _loaded.get(digest)
    if mod is None and not dump:
        mod = _load_shared(digest, record, name, tuple(entries), tuple(globals_),
                           tuple(optional_globals))
    return mod


def _compile(ir_text, name: str, dump, quick: bool = False, meanwhile=None):
    """Machine code for ``ir_text``: one IR text, or an iterable of texts (a module's shards,
    possibly generated lazily), each parsed and optimized as soon as it is there, then
    linked into one module for code generation. Where it can (native_parallel.available),
    shards compile on several cores at once instead, each to an object of its own, joined
    by ``ld -r``."""
    llvm, tm, _info = target()
    if not isinstance(ir_text, str) and not dump and not quick:
        from . import native_parallel  # noqa: PLC0415
        if native_parallel.available():
            try:
                return native_parallel.compile_shards(llvm, _make_tm, _optimize, ir_text,
                                                      meanwhile)
            except native_parallel.LinkError as exc:  # compiled again, one shard at a time
                msg = (f"hybrid: the system linker could not join {name}'s compiled shards "
                       f"({exc}); compiling them one at a time (HYBRID_LLVM_THREADS=1 skips "
                       "the linker)")
                warnings.warn(msg, RuntimeWarning, stacklevel=3)
                _log().warning(msg)
                ir_text = iter(exc.texts)
    if quick:
        tm = _target["tm_quick"]
    times = {"parse": 0.0}
    texts = []

    def parse_and_optimize(text):
        t = time.perf_counter()
        mod = llvm.parse_assembly(text)
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
        t1 = time.perf_counter()
        times["parse"] += t1 - t
        if not quick:
            _optimize(llvm, tm, mod)
            times["optimize"] = times.get("optimize", 0.0) + time.perf_counter() - t1
        return mod

    if isinstance(ir_text, str):
        texts.append(ir_text)
        mod = parse_and_optimize(ir_text)
    else:
        mods = _pipelined(parse_and_optimize, _keeping(ir_text, texts) if dump else ir_text)
        mod = mods[0]
        t = time.perf_counter()
        for other in mods[1:]:
            mod.link_in(other)
        times["link"] = time.perf_counter() - t
    t = time.perf_counter()
    obj = tm.emit_object(mod)
    times["codegen"] = time.perf_counter() - t
    if dump:
        joined = "\n".join(f"; ---- shard {k} of {len(texts)}\n{text}"
                           for k, text in enumerate(texts)) if len(texts) > 1 else texts[0]
        _dump(Path(dump), name, joined, str(mod), tm.emit_assembly(mod))
    if meanwhile is not None:
        meanwhile()
    return obj, times


def _optimize(llvm, tm, mod):
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    # unrolling and interleaving cost ~5x compile time (ResNet-18: 7.7 s -> 1.3 s) for a
    # few percent at run time; vectorization stays on
    pto.loop_unrolling = False
    pto.loop_interleaving = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def _keeping(texts, kept: list):
    """``texts``, each also appended to ``kept`` as it passes (for a dump)."""
    for text in texts:
        kept.append(text)
        yield text


def _pipelined(work, items) -> list:
    """``[work(x) for x in items]``, with ``work`` in a helper thread while the caller's
    thread produces the next item: LLVM (which releases the GIL, one call at a time under
    llvmlite's lock) optimizes a shard while Python builds the next. Results in order; the
    first error, the producer's or the helper's, is raised once the helper stopped."""
    todo = queue.SimpleQueue()
    results, errors = [], []

    def helper():
        while (item := todo.get()) is not None:
            if not errors:
                try:
                    results.append(work(item))
                except BaseException as exc:  # noqa: BLE001 - raised by the caller
                    errors.append(exc)
    thread = threading.Thread(target=helper, name="hybrid-llvm-shards", daemon=True)
    thread.start()
    try:
        for item in items:
            todo.put(item)
            if errors:
                break
    finally:
        todo.put(None)
        thread.join()  # LLVM finishes the shard it has (bounded work), then stops
    if errors:
        raise errors[0]
    return results


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
    # Never disposed (see _keepalive), and nothing else is asked of it: the Python wrapper
    # lets go of the engine, so that no __del__ tries to dispose it while the interpreter
    # tears llvmlite down (llvmlite skips that only where its own atexit hook ran, which a
    # first import from a background thread during exit misses: "Exception ignored in
    # ObjectRef.__del__" at the end of a script whose last op compiled)
    engine.detach()
    return None, addresses


# ------------------------------------------------------- shared libraries (no llvmlite)
# A module that a warm start will want (an executable cache entry's program, the thread
# pool) is also linked, by the system linker, into a shared library next to its object:
# ``<digest>.so`` and ``<digest>.so.json`` (its key record, sha256 and size, and the BLAS
# symbols it was linked against). A later process dlopens it after checking its sha256:
# the same machine code (the object's relocations applied by the dynamic loader instead
# of MCJIT's), without importing llvmlite (~30-50 ms of a warm first call). No linker, a
# link or dlopen that fails (a symbol the process lacks, text relocations refused): the
# object is loaded by MCJIT as before.
def _shared_paths(digest: str, root: Path | None = None):
    so = cache_path(digest, root).with_suffix(".so")
    return so, so.with_name(so.name + ".json")


def link_shared(module: "NativeModule", root: Path | None = None) -> bool:
    """Link ``module``'s cached object (under the cache directory ``root``, default the
    current one) into a shared library for later processes; True if one exists now. Costs
    ~10-20 ms (two short subprocesses), once per object."""
    record = module.record
    if record is None or module.shared:
        return module.shared
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    so, meta = _shared_paths(module.digest, root)
    if meta.exists():
        return True
    ld, objcopy = shutil.which("ld"), shutil.which("objcopy")
    obj = _read_cache(cache_path(module.digest, root), record) if ld else None
    if obj is None:
        return False
    renames = {}
    if b"hybrid_cblas_" in obj:  # calls BLAS: under the library's own names
        from . import blas  # noqa: PLC0415
        try:
            renames = blas.symbol_names()
        except blas.BlasUnavailable:
            return False
        if objcopy is None:
            return False
    try:
        with tempfile.TemporaryDirectory(prefix="hybrid-link-") as tmp:
            o, out = os.path.join(tmp, "m.o"), os.path.join(tmp, "m.so")
            with open(o, "wb") as f:
                f.write(obj)
            run = dict(capture_output=True, timeout=60, check=True)
            if renames:
                subprocess.run([objcopy] + [f"--redefine-sym={a}={b}" for a, b in
                                            sorted(renames.items())] + [o], **run)
            # the JIT's large code model: absolute relocations in text, applied at load
            subprocess.run([ld, "-shared", "-z", "notext", "-o", out, o], **run)
            with open(out, "rb") as f:
                data = f.read()
    except (OSError, subprocess.SubprocessError) as exc:
        _log().info("%s: no shared library (%s)", module.name, exc)
        return False
    doc = {"key": record, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
           "renames": renames}
    try:
        write_bytes(so, data, fsync=False)
        write_bytes(meta, json.dumps(doc, sort_keys=True).encode(), fsync=False)
    except OSError as exc:
        _log().warning("could not write shared library %s: %s", so, exc)
        return False
    stats["links"] += 1
    module.shared = True
    return True


def _dlopen_bytes(data: bytes, digest: str):
    """dlopen exactly ``data`` (the bytes whose sha256 was checked) from a private copy: a
    cache file replaced or damaged later (in place) never changes code that is running (a
    mapped file that shrinks kills the process with SIGBUS). The copy's name is never used
    twice in a process (pid, a counter): the dynamic loader returns an already loaded
    library for a name it has seen (a reused /proc/self/fd/N would be another library).
    RTLD_NOW: a missing symbol fails here."""
    import tempfile  # noqa: PLC0415
    _dl_count[0] += 1
    path = os.path.join(tempfile.gettempdir(),
                        f"hybrid-{os.getpid()}-{_dl_count[0]}-{digest[:16]}.so")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return ctypes.CDLL(path)
    finally:
        os.unlink(path)  # the mapping keeps the file alive: nothing left on disk


_dl_count = [0]


def _load_shared(digest, record, name, entries, globals_, optional_globals):
    """The module from its shared library, or None (none, or it does not check out)."""
    so, meta = _shared_paths(digest)
    try:
        doc = json.loads(meta.read_bytes())
        data = so.read_bytes()
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        doc, data = None, b""
        _log().info("shared library %s unreadable (%s)", so, exc)
    why = _mismatch(doc, record, data) if isinstance(doc, dict) else "no valid metadata"
    if why is not None:
        msg = f"hybrid: compile cache entry {so} is corrupt ({why}); loading the object"
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
        _log().warning(msg)
        for p in (meta, so):  # link_shared makes it again
            try:
                p.unlink()
            except OSError:
                pass
        return None
    t0 = time.perf_counter()
    try:
        if doc.get("renames"):
            from . import blas  # noqa: PLC0415 - its symbols must be global first
            if blas.symbol_names() != doc["renames"]:
                return None  # another OpenBLAS build: link again through the object
        with _lock:  # the counter
            lib = _dlopen_bytes(data, digest)
        addresses = {}
        for sym in entries:
            addresses[sym] = ctypes.cast(lib[sym], ctypes.c_void_p).value
        for sym in globals_:
            addresses[sym] = ctypes.addressof(ctypes.c_char.in_dll(lib, sym))
        for sym in optional_globals:
            try:
                addresses[sym] = ctypes.addressof(ctypes.c_char.in_dll(lib, sym))
            except ValueError:
                continue
    except Exception as exc:  # noqa: BLE001 - any failure: MCJIT loads the object instead
        _log().info("%s: shared library %s not loaded (%s); loading the object", name, so,
                    exc)
        return None
    _keepalive.append(lib)
    stats["shared_loads"] += 1
    _log().info("%s: warm (shared library) in %.1f ms [%s]", name,
                (time.perf_counter() - t0) * 1e3, so)
    mod = NativeModule(name, lib, addresses, digest, True, record)
    mod.shared = True
    _loaded[digest] = mod
    return mod


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
        why = _mismatch(header, record, obj)
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
