"""A static plan's launches as one CUDA graph, captured once and replayed per call
(HYBRID_CUDA_GRAPHS, on by default).

A captured graph holds the pointers its launches were given. The arena and workspace are
the executable's own, so they never move; inputs and outputs are new arrays on every call,
parameters on every training step (an update rebinds them to new arrays) and on no
inference call. So, as torch's CUDA graphs and ``torch.compile(mode="reduce-overhead")`` do,
per executable one static buffer per input, parameter and output slot: a call copies its
inputs into them, replays, and copies the outputs out into fresh arrays (outputs must be
fresh: a later call never overwrites what a caller holds). A graph per set of pointers
instead would miss on every call (inputs are new arrays) and each miss is a capture.

Parameters are the exception worth taking: once two calls in a row bring the same
parameter pointers (inference, or evaluation between steps), a second graph is captured
that reads the parameters where they are, and is replayed while the pointers stay the same,
saving a copy of every weight per call. Equal pointers are all it needs: the graph reads
whatever lies at those addresses when it runs, i.e. the current call's arrays. Otherwise
(training) the parameters are copied in like inputs. At most ``MAX_POINTER_CAPTURES`` such
graphs per executable, so parameters that keep moving cannot make every call a capture.

Everything — copies in, replay, copies out — is queued on the GPU's compute stream, so
stream order keeps a call's pieces and the next call's in sequence. The static buffers are
shared by all callers, so the caller holds the executable's lock while it queues them: a
second thread's copies in are queued after the first's copies out.

A replayed graph runs the generated GEMM kernels where plain launches call cuBLAS (CuPy
refuses cuBLAS calls under stream capture; measured on an H100): a graph is replayed only
where launches dominate (graph_pays), i.e. small products, where the kernel is no slower.

Capture runs on a stream of the executable's own, never on the compute stream: under
capture a stream records instead of running, and an eager op another thread queued on the
compute stream meanwhile would be swallowed into the graph. If capture fails (a driver or
a CuPy that cannot capture these launches), the executable says why in the log and its
stats and goes on with plain launches.
"""
from __future__ import annotations

import math

import numpy as np

from runtime import config

_log = config.logger("compile")


def alias_view(a, shape):
    """An io alias (lower.Binding): the first elements of ``a``'s buffer under ``shape``: a
    reshape, or a contiguous prefix (x[:, :3] of a one-row x is the row's first 3)."""
    n = math.prod(shape)
    return (a if a.size == n else a.reshape(-1)[:n]).reshape(shape)

MAX_POINTER_CAPTURES = 4

# What a launch or a copy costs the host (CuPy's call from Python, the driver's queueing),
# and the rate a device-to-device copy moves bytes, read and written counted (an H100 measured
# ~2.4e12): a graph saves launches but costs its io copies, so it is replayed only where it
# is cheaper (a 64M-element elementwise chain: one launch, 512 MB of copies: plain).
LAUNCH_COST_S = 5e-6
COPY_RATE = 2.0e12


def graph_pays(launches: int, copies: int, copy_bytes: int) -> bool:
    """Whether one replay plus ``copies`` copies of ``copy_bytes`` in all beats ``launches``
    plain launches."""
    replay = (copies + 1) * LAUNCH_COST_S + 2 * copy_bytes / COPY_RATE
    return replay < launches * LAUNCH_COST_S


class StaticGraph:
    """The captured launches of one :class:`~.exec.CudaRun` and its static io buffers.

    ``stats``: captures, replays, ``params_in_place`` (replays that read the parameters
    where they are), plain calls (launches one by one: the flag off, or capture failed) and
    ``fallback`` (why capture failed, else None). Callers hold the run's lock.
    """

    def __init__(self, run):
        self.run = run
        self.kinds = [kind for kind, _ in run.entries]
        self.param_pos = [pos for pos, kind in enumerate(self.kinds) if kind == "param"]
        self.static = None
        self.copying = None  # the graph reading every io slot from the static buffers
        self.in_place = None  # (parameter pointers, the graph reading parameters there)
        self.last_params = None  # the previous call's parameter pointers
        self.stream = None
        self.stats = {"captures": 0, "replays": 0, "params_in_place": 0, "plain_calls": 0,
                      "fallback": None}
        nbytes = [int(np.prod(shape)) * dt.itemsize for shape, dt in run.want]
        io_pos = [p for p, k in enumerate(self.kinds) if k in ("input", "output") and nbytes[p]]
        par_pos = [p for p in self.param_pos if nbytes[p]]
        launches = len(run.source.launches)
        # (params in place, params copied): is the graph worth its copies?
        self.pays = (graph_pays(launches, len(io_pos), sum(nbytes[p] for p in io_pos)),
                     graph_pays(launches, len(io_pos) + len(par_pos),
                                sum(nbytes[p] for p in io_pos + par_pos)))

    def usable(self) -> bool:
        return bool(config.get("HYBRID_CUDA_GRAPHS")) and self.stats["fallback"] is None

    def call(self, io):
        """Carry out the launches for a call whose io positions hold ``io`` (the caller's
        arrays): copies in, one graph replay, copies out; plain launches if capture fails."""
        gpu = self.run.gpu
        address = gpu.address
        ptrs = tuple(address(io[pos]) for pos in self.param_pos)
        in_place = ptrs == self.last_params or \
            self.in_place is not None and self.in_place[0] == ptrs
        if not self.pays[not in_place]:
            self.last_params = ptrs
            return self.plain(io)
        if self.static is None:
            self.static = self._static_buffers()
        graph, copy_params = self._graph_for(io, ptrs)
        if graph is None:
            return self.plain(io)
        stream = gpu.compute_stream
        for pos, kind in enumerate(self.kinds):
            if (kind == "input" or kind == "param" and copy_params) and \
                    self.static[pos].nbytes:
                gpu.copy_d2d(self.static[pos], io[pos], stream)
        graph.replay(stream)
        for pos, kind in enumerate(self.kinds):
            if kind == "output" and self.static[pos].nbytes:
                gpu.copy_d2d(io[pos], self.static[pos], stream)
        self.stats["replays"] += 1
        self.stats["params_in_place"] += not copy_params

    def _graph_for(self, io, ptrs):
        """(the graph for this call, whether its parameters must be copied in), the call's
        parameters being at ``ptrs``."""
        stable, self.last_params = ptrs == self.last_params, ptrs
        if self.in_place is not None and self.in_place[0] == ptrs:
            return self.in_place[1], False
        if stable and self.param_pos and \
                self.stats["captures"] - (self.copying is not None) < MAX_POINTER_CAPTURES:
            graph = self._capture(self._buffers(io))
            if graph is not None:
                self.in_place = (ptrs, graph)
                return graph, False
        if self.copying is None:
            self.copying = self._capture(self.static)
        return self.copying, True

    def plain(self, io):
        """One launch per kernel, on the caller's pointers."""
        run = self.run
        for launch in run.source.launches:
            run.launch(launch, io)
        self.stats["plain_calls"] += 1

    def _static_buffers(self):
        run = self.run
        static = [None] * len(run.entries)
        for pos, kind in enumerate(self.kinds):
            if kind in ("input", "param", "output"):
                static[pos] = run.gpu.empty(*run.want[pos])
            elif kind == "const":
                static[pos] = run.consts[pos]  # the executable's own already
        for pos, (kind, v) in enumerate(run.entries):
            if kind == "alias":  # the same static buffer under another shape
                static[pos] = alias_view(static[v], run.want[pos][0])
        return static

    def _buffers(self, io):
        """The static buffers, but the caller's parameters (and views of them) in place."""
        bufs = list(self.static)
        for pos, (kind, v) in enumerate(self.run.entries):
            if kind == "param" or kind == "alias" and self.kinds[v] == "param":
                bufs[pos] = io[pos]
        return bufs

    def _capture(self, bufs):
        if self.stats["fallback"] is not None:
            return None
        run = self.run
        if self.stream is None:
            self.stream = run.gpu.new_stream("graph capture")
        stream = self.stream
        try:
            stream.begin_capture()
        except Exception as exc:  # noqa: BLE001 - this stream cannot capture: plain launches
            self._give_up(exc)
            return None
        try:
            for launch in run.source.launches:
                run.launch(launch, bufs, stream, blas=False)
        except Exception as exc:  # noqa: BLE001 - a launch it refused: plain launches
            self._give_up(exc)
            try:
                stream.end_capture()
            except Exception:  # noqa: BLE001, S110 - the failure above is what we report
                pass
            return None
        try:
            graph = stream.end_capture()
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)
            return None
        self.stats["captures"] += 1
        _log.info("%s: captured %d launch(es) as a CUDA graph", run.source.name,
                  len(run.source.launches))
        return graph

    def _give_up(self, exc):
        self.stats["fallback"] = f"capture failed: {type(exc).__name__}: {exc}"
        _log.warning("%s: CUDA graph capture failed (%s: %s); launching the kernels one by "
                     "one instead", self.run.source.name, type(exc).__name__, exc)
