"""Every ``HYBRID_*`` flag, declared once with its type, default and help.

This is the one place flags are read. ``hybrid.config`` re-exports it, so the front end,
the compiler and the runtime all see the same values. Flags are read from the environment
at import and may be changed at run time with :func:`set_flag` (tests do this).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    parse: Callable[[Any], Any]  # the environment's text, or a Python value (set_flag)
    default: Any
    help: str


def _bool(value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {value!r}")


def _channels(value) -> frozenset:
    items = value.split(",") if isinstance(value, str) else value
    return frozenset(str(c).strip() for c in items if str(c).strip())


def _positive_int(value) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"expected a positive integer, got {value!r}")
    n = int(value)
    if n < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return n


def _power_of_two(value) -> int:
    n = _positive_int(value)
    if n & (n - 1):
        raise ValueError(f"expected a power of two (1, 2, 4, ...), got {value!r}")
    return n


def _count(value) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"expected a whole number (0 or more), got {value!r}")
    n = int(value)
    if n < 0:
        raise ValueError(f"expected a whole number (0 or more), got {value!r}")
    return n


def _seconds(value) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a positive number of seconds, got {value!r}")
    x = float(value)
    if not 0 < x < math.inf:
        raise ValueError(f"expected a positive, finite number of seconds, got {value!r}")
    return x


def _mebibytes(value) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a size in MiB, got {value!r}")
    x = float(value)
    if not 0 <= x < math.inf:
        raise ValueError(f"expected a finite size in MiB (0 or more), got {value!r}")
    return x


def _engine_mode(value) -> str:
    text = str(value).strip().lower()
    if text not in ("threaded", "naive"):
        raise ValueError(f"expected 'threaded' or 'naive', got {value!r}")
    return text


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "hybrid")


FLAGS = {f.name: f for f in [
    Flag("HYBRID_ENGINE", _engine_mode, "threaded",
         "'threaded' runs ops on per-device worker threads; 'naive' runs every op "
         "synchronously in the caller (for debugging; same results)."),
    Flag("HYBRID_ENGINE_WINDOW", _positive_int, 4096,
         "Most ops in flight at once; a front end further ahead blocks (back-pressure)."),
    Flag("HYBRID_WAIT_TIMEOUT", _seconds, 600.0,
         "Seconds a sync point waits before it raises, naming what is still pending."),
    Flag("HYBRID_CPU_WORKERS", _positive_int, 1,
         "Worker threads per CPU device."),
    Flag("HYBRID_INLINE", _bool, True,
         "Run a small op in the caller when its inputs are ready and its device is idle, and "
         "let each device measure whether its long compiled calls run faster in the caller "
         "or on the engine (hybrid/call_mode.py); 0: every op goes through the engine."),
    Flag("HYBRID_EAGER_KERNELS", _bool, True,
         "Eager convolutions, their gradients and pooling run a compiled single-op kernel "
         "(LLVM, cached per signature in memory and on disk) from a signature's second call, "
         "where NumPy is slower (hybrid/eager_kernels.py), and eager recurrent layers (RNN, "
         "LSTM, GRU) their recurrence compiled (hybrid/nn/rnn_layers.py), and built-in "
         "losses one compiled function from an instance's second call (hybrid/loss.py); 0: "
         "NumPy, op by op, and the Python loop always."),
    Flag("HYBRID_SWITCH_INTERVAL", _seconds, 0.0002,
         "Python's thread switch interval while engine workers run (sys.setswitchinterval; "
         "never raised): a worker whose native call ends waits at most this long for the "
         "GIL while the front end runs Python (Python's default, 5 ms, stalls it)."),
    Flag("HYBRID_HOST_POOL_MB", _mebibytes, 256.0,
         "MiB of large host buffers (over 4 KiB) that compiled calls recycle for their "
         "outputs once nothing refers to them (MXNet's pooled storage): fresh pages cost a "
         "page fault each on first touch. 0 turns the pool off."),
    Flag("HYBRID_LLVM_THREADS", _count, 0,
         "Threads that compile a module's shards at once, each in an LLVM context of its "
         "own (runtime/native_parallel.py); 0: one per core (at most 8); 1: one shard at a "
         "time."),
    Flag("HYBRID_LOG", _channels, frozenset(),
         "Comma-separated log channels: engine, recompiles, fusion, memory, schedule, "
         "compile, codegen, simplify, all."),
    Flag("HYBRID_CACHE_DIR", str, None,
         "Directory of the on-disk compile cache (default ~/.cache/hybrid)."),
    Flag("HYBRID_CHECK", _bool, False,
         "Run the graph verifier between compiler passes (on under pytest)."),
    Flag("HYBRID_PRINT_AFTER", _channels, frozenset(),
         "Print the graph after these passes ('all' for every pass)."),
    Flag("HYBRID_DUMP_DIR", str, None,
         "Write generated code (LLVM IR, assembly, CUDA C) of each executable here."),
    Flag("HYBRID_SMOKE", _bool, False,
         "Examples and benchmarks shrink their sizes (used by CI)."),
    Flag("HYBRID_GPU_EMULATE", _count, 0,
         "Emulate this many GPUs on the CPU (hb.gpu(0) .. hb.gpu(N-1)): device memory is host "
         "memory, streams are worker queues, CUDA C kernels run through the emulator "
         "(runtime/gpu/emulated.py). 0: the real GPUs that CuPy sees, if any."),
    Flag("HYBRID_CUDA_GRAPHS", _bool, True,
         "Capture a static plan's kernels as a CUDA graph and replay it (one launch per call "
         "instead of one per kernel); 0 launches the kernels one by one."),
    Flag("HYBRID_CUDA_BLAS", _bool, True,
         "A compiled matmul whose operands share a float dtype runs through the GPU's BLAS "
         "(cuBLAS on a real GPU: 3-10x the generated GEMM's speed on an H100) instead of the "
         "generated GEMM kernel; 0 keeps the generated kernel."),
    Flag("HYBRID_BUCKETS", _bool, True,
         "A hybridized block seeing a second batch size (or sequence length) runs the graph "
         "of a shape bucket on padded inputs where that gives the same results (hybrid/"
         "buckets.py), instead of compiling every size; 0 compiles every size exactly."),
    Flag("HYBRID_BUCKET_ROWS", _power_of_two, 512,
         "The largest shape bucket (a power of two): a bigger batch size (or sequence "
         "length) runs that bucket's graph on consecutive pieces of this many rows, the "
         "last one padded, where its rows are independent (hybrid/buckets.py); the first "
         "size a block sees always compiles exactly."),
    Flag("HYBRID_ROW_BOUNDS", _bool, True,
         "A shape bucket's native (LLVM) programs read the real number of rows and compute "
         "those only (compiler/passes/row_bounds.py), so one bucket serves every smaller "
         "size at the real size's cost; 0 computes every padded row, and buckets follow the "
         "power-of-two ladder."),
    Flag("HYBRID_PRELOAD_LLVM", _bool, True,
         "`import hybrid` starts loading llvmlite (a ~50 ms library load, outside the GIL) "
         "and LLVM's target machine in a background thread, as jaxlib loads XLA at import, so "
         "a first compile does not wait for it; 0 loads it when a first compile needs it "
         "(a process that only loads cached executables never does)."),
    Flag("HYBRID_GC_FREEZE", _bool, True,
         "At the end of `import hybrid`, move every object alive then (modules, classes, "
         "functions: ~50K of them) to the garbage collector's permanent generation "
         "(gc.freeze), so a full collection no longer scans them (~20 ms each on a 2-vCPU "
         "VM, once in a first hybridized call). Objects frozen are never collected: 0 "
         "keeps the collector as Python leaves it."),
    Flag("HYBRID_DIST_TIMEOUT", _seconds, 300.0,
         "Seconds a distributed key-value store or collective waits for the other workers "
         "(a rank that died, hung, left early or runs fewer batches) before it raises, "
         "naming the rank, the key and the step."),
    Flag("HYBRID_DIST_BUCKET_MB", _seconds, 25.0,
         "Size in MiB of the flat buffers that dist_sync packs gradients into: one "
         "allreduce per bucket, started as soon as its gradients are computed. A gradient "
         "of min(this, 1 MiB) or more is sent from its own buffer, without a packing copy."),
]}

_values: dict[str, Any] = {}


def _load(name: str) -> Any:
    flag = FLAGS[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return flag.default
    try:
        return flag.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}={raw!r} is not valid ({exc}): {flag.help}") from exc


def get(name: str) -> Any:
    """The current value of flag ``name`` (one of :data:`FLAGS`)."""
    try:
        return _values[name]
    except KeyError:
        if name not in FLAGS:
            raise KeyError(f"unknown flag {name!r}; known flags: {', '.join(FLAGS)}") from None
        _values[name] = _load(name)
        return _values[name]


def set_flag(name: str, value: Any) -> Any:
    """Set a flag for this process; returns the previous value.

    ``value`` is checked like the environment's text ("0" turns a switch off); None restores
    the default.
    """
    if name not in FLAGS:
        raise KeyError(f"unknown flag {name!r}; known flags: {', '.join(FLAGS)}")
    flag = FLAGS[name]
    if value is None:
        value = flag.default
    else:
        try:
            value = flag.parse(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}={value!r} is not valid ({exc}): {flag.help}") from None
    try:
        old = get(name)
    except ValueError:  # a bad value in the environment: setting the flag replaces it
        old = None
    _values[name] = value
    if name == "HYBRID_LOG":  # loggers made before take the new channels now
        for channel, log in _loggers.items():
            log.setLevel(logging.INFO if log_enabled(channel) else logging.WARNING)
    return old


_loggers: dict[str, logging.Logger] = {}


def cache_dir() -> Path:
    return Path(get("HYBRID_CACHE_DIR") or _default_cache_dir())


def log_enabled(channel: str) -> bool:
    chans = get("HYBRID_LOG")
    return channel in chans or "all" in chans


def logger(channel: str) -> logging.Logger:
    """The logger of a named channel; its messages show when the channel is in HYBRID_LOG."""
    log = logging.getLogger(f"hybrid.{channel}")
    if not getattr(log, "_hybrid_ready", False):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[hybrid:{channel}] %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        log._hybrid_ready = True
        _loggers[channel] = log
    log.setLevel(logging.INFO if log_enabled(channel) else logging.WARNING)
    return log


def describe() -> str:
    """Every flag with its value and help, for docs and ``hybrid sysinfo``."""
    lines = []
    for flag in FLAGS.values():
        lines.append(f"{flag.name} = {get(flag.name)!r}  (default {flag.default!r})\n    {flag.help}")
    return "\n".join(lines)
