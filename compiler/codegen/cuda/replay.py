"""A static plan's launches as one CUDA graph, captured once and replayed per call
(HYBRID_CUDA_GRAPHS, on by default).

A captured graph holds the pointers its launches were given. The arena and workspace are
the executable's own, so they never move; inputs, parameters and outputs are new arrays on
(nearly) every call. Two ways out: capture one graph per set of pointers (a small cache),
or give the graph pointers that never change. We do the second, as torch's CUDA graphs and
``torch.compile(mode="reduce-overhead")`` do: per executable, one static buffer per input,
parameter and output slot; a call copies its inputs and parameters into them, replays the
graph, and copies the outputs out into fresh arrays (outputs must be fresh: a later call
never overwrites what a caller holds). A pointer cache would miss on every call whose
inputs are new arrays (all of them, in inference or training loops), and each miss is a
capture; the copies cost one device-to-device pass over the io, small beside the kernels.
The price is memory: one more copy of the io slots (parameters included) per executable.

Everything — copies in, replay, copies out — is queued on the GPU's compute stream, so
stream order keeps a call's pieces and the next call's in sequence. The static buffers are
shared by all callers, so the caller holds the executable's lock while it queues them: a
second thread's copies in are queued after the first's copies out.

Capture runs on a stream of the executable's own, never on the compute stream: under
capture a stream records instead of running, and an eager op another thread queued on the
compute stream meanwhile would be swallowed into the graph. If capture fails (a driver or
a CuPy that cannot capture these launches), the executable says why in the log and its
stats and goes on with plain launches.
"""
from __future__ import annotations

from runtime import config

_log = config.logger("compile")


class StaticGraph:
    """The captured launches of one :class:`~.exec.CudaRun` and its static io buffers.

    ``stats``: captures, replays, plain calls (launches one by one: the flag off, or capture
    failed) and ``fallback`` (why capture failed, else None). Callers hold the run's lock.
    """

    def __init__(self, run):
        self.run = run
        self.graph = None
        self.stream = None
        self.static = None
        self.stats = {"captures": 0, "replays": 0, "plain_calls": 0, "fallback": None}

    def usable(self) -> bool:
        return bool(config.get("HYBRID_CUDA_GRAPHS")) and self.stats["fallback"] is None

    def call(self, io):
        """Carry out the launches for a call whose io positions hold ``io`` (the caller's
        arrays): copies in, one graph replay, copies out; plain launches if capture fails."""
        run, gpu = self.run, self.run.gpu
        if self.static is None:
            self.static = self._static_buffers()
        if self.graph is None:
            self.graph = self._capture()
            if self.graph is None:
                return self.plain(io)
        stream = gpu.compute_stream
        kinds = [kind for kind, _ in run.entries]
        for pos, kind in enumerate(kinds):
            if kind in ("input", "param") and self.static[pos].nbytes:
                gpu.copy_d2d(self.static[pos], io[pos], stream)
        self.graph.replay(stream)
        for pos, kind in enumerate(kinds):
            if kind == "output" and self.static[pos].nbytes:
                gpu.copy_d2d(io[pos], self.static[pos], stream)
        self.stats["replays"] += 1

    def plain(self, io):
        """One launch per kernel, on the caller's pointers."""
        run = self.run
        for launch in run.source.launches:
            run.module.launch(launch.kernel, launch.grid, launch.block, launch.shared_bytes,
                              run.args(launch, io))
        self.stats["plain_calls"] += 1

    def _static_buffers(self):
        run = self.run
        static = [None] * len(run.entries)
        for pos, (kind, _) in enumerate(run.entries):
            if kind in ("input", "param", "output"):
                static[pos] = run.gpu.empty(*run.want[pos])
            elif kind == "const":
                static[pos] = run.consts[pos]  # the executable's own already
        for pos, (kind, v) in enumerate(run.entries):
            if kind == "alias":  # the same static buffer under another shape
                static[pos] = static[v].reshape(run.want[pos][0])
        return static

    def _capture(self):
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
                run.module.launch(launch.kernel, launch.grid, launch.block,
                                  launch.shared_bytes, run.args(launch, self.static), stream)
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
