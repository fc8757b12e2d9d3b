"""The compile pipeline: a named, ordered pass list, then code generation.

``compile(graph, backend, device) -> runtime.Executable``. Each pass is a pure function
Graph -> (Graph, report); the pipeline times it, prints the graph after it when
HYBRID_PRINT_AFTER names it (or 'all'), and runs the verifier between passes when
HYBRID_CHECK=1.
"""
from __future__ import annotations

import time

from runtime import config
from runtime.executable import Executable, PartExecutable, PartitionedExecutable

from .control_flow import compile_control, has_control, is_control_part
from .graph import Graph
from .passes import fuse, plan_memory, schedule, simplify
from .passes.index_checks import add_index_checks, checked_run
from .passes.loop_invariants import hoist_loop_invariants
from .passes.loop_packing import pack_loop_products
from .passes.partition import devices_of, partition
from .passes.row_bounds import part_rows
from .reference import ReferenceProgram
from .verify import verify

_log = config.logger("compile")

BACKENDS = ("reference", "llvm", "cuda")

# the pass list, in order
PIPELINE: list = [
    ("simplify", simplify),
    ("fuse", fuse),
    ("schedule", schedule),
    ("memory", plan_memory),
]


LOG_CHANNEL = {"fuse": "fusion"}  # the HYBRID_LOG channel of each pass (default: its name)


def run_passes(graph: Graph, passes=None):
    """Run the pass list; returns (graph, reports) with one report per pass."""
    passes = PIPELINE if passes is None else passes
    check = config.get("HYBRID_CHECK")
    show = config.get("HYBRID_PRINT_AFTER")
    if check:
        verify(graph, "tracing")
    reports = []
    for name, fn in passes:
        t0 = time.perf_counter()
        graph, rep = fn(graph)
        rep = dict(rep or {})
        rep["pass"] = name
        rep["seconds"] = time.perf_counter() - t0
        reports.append(rep)
        if check:
            verify(graph, name)
        channel = LOG_CHANNEL.get(name, name)
        if config.log_enabled(channel):
            config.logger(channel).info("%s: %s", graph.name, rep.get("summary", rep))
            if channel == "fusion":
                from .passes.fusion import describe  # noqa: PLC0415
                config.logger(channel).info("%s", describe(graph))
        if name in show or "all" in show:
            print(f"--- after {name} ---\n{graph.format()}")
    return graph, reports


def compile(graph: Graph, backend: str = "reference", device=None, passes=None, rows=None):
    """An Executable, or a PartitionedExecutable when the graph's ops span several devices
    (one compiled part per device and stage: see passes/partition.py). ``rows``: a shape
    bucket's padded inputs, ``{"count": input index of the real row count, "batched": input
    indices padded along axis 0, "units": the bucket's rows}``: a one-part native program
    then computes the real rows only where every kernel can (passes/row_bounds.py)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if has_control(graph):
        # a control node runs its compiled bodies in a loop: a part of its own, between the
        # parts before and after it (passes/partition.py)
        graph = graph.copy()
        graph.remove_dead()
        if passes is None:  # the default optimizations: a loop body's invariants first
            graph, _ = hoist_loop_invariants(graph)
            if backend == "llvm":  # its GEMM reads B in panels: packed once per loop
                from .codegen.extern_plan import panel_cols  # noqa: PLC0415 - llvmlite
                graph, _ = pack_loop_products(graph, panel_cols())
        if is_control_part(graph):
            return compile_control(graph, backend, device,
                                   lambda body: compile(body, backend, device, passes),
                                   shared=passes is None)
        if has_control(graph):
            return _compile_parts(graph, backend, device, passes, rows)
    if len(devices_of(graph)) > 1 or (device is not None and
                                       devices_of(graph) - {str(device)}):
        # ops on several devices, or all on another device than the call's (x.to(cpu(1))
        # first thing in forward): parts, each pushed on its own device
        return _compile_parts(graph, backend, device, passes)
    t0 = time.perf_counter()
    in_specs = [graph.spec(n) for n in graph.inputs]
    param_specs = [graph.spec(n) for n in graph.params]
    n_outputs = len(graph.outputs)
    checked, checks = add_index_checks(graph)
    optimized, reports = run_passes(checked, passes)
    if backend == "reference":
        prog = ReferenceProgram(optimized)
        exe = Executable(prog, "reference", in_specs, param_specs,
                         [optimized.spec(o) for o in optimized.outputs], device)
    else:
        from .codegen import backend_compile  # noqa: PLC0415 - optional heavy import
        exe = backend_compile(optimized, backend, device, in_specs, param_specs, rows)
    if checks:  # out-of-range indices raise after the call; callers see their outputs only
        exe.run = checked_run(exe.run, checks, n_outputs)
        exe.out_specs = exe.out_specs[:n_outputs]
    exe.report.update({"passes": reports, "graph": optimized,
                       "compile_seconds": time.perf_counter() - t0,
                       "explain": explain_plan(optimized)})
    _log.info("compiled %s for %s in %.3fs", graph.name, backend, exe.report["compile_seconds"])
    return exe


def part_backend(backend: str, device: str) -> str:
    """The code generator of one device's part: a native backend ('llvm' or 'cuda') means
    native code on every device, CUDA C for a GPU part and LLVM for a CPU part (neither runs
    on the other's memory); 'reference' stays the NumPy interpreter everywhere."""
    if backend == "reference":
        return backend
    return "cuda" if str(device).startswith("gpu") else "llvm"


def _compile_parts(graph, backend, device, passes, rows=None):
    t0 = time.perf_counter()
    split = partition(graph)
    each = part_rows(graph, split, rows) if rows else None

    def build(rows_of):
        return [PartExecutable(p.device, compile(p.graph, part_backend(backend, p.device),
                                                 p.device, passes, rows=r),
                               p.inputs, p.params, p.input_devices)
                for p, r in zip(split.parts, rows_of)]
    parts = build(each or [None] * len(split.parts))
    bounded = sum(p.exe.report.get("row_bounds", 0) for p in parts)
    if each and any(r and not p.exe.report.get("row_bounds") for p, r in zip(parts, each)):
        # one part computes every padded row: it would read rows the others never wrote
        parts, bounded = build([None] * len(split.parts)), 0
    for p in parts if bounded else ():  # no one reads the rows its loops do not reach
        options = p.exe.report.get("loop_options")
        if options is not None:
            options["zero_rest"] = False
    explain = "\n".join(f"   part {i} on {p.device} (reads {_refs(p.inputs)}):\n"
                         f"{p.exe.report['explain']}" for i, p in enumerate(parts))
    report = {"parts": len(parts), "compile_seconds": time.perf_counter() - t0,
              "explain": explain, "graph": graph, "row_bounds": bounded,
              "row_granule": max((p.exe.report.get("row_granule", 1) for p in parts),
                                 default=1),
              "passes": [r for p in parts for r in p.exe.report["passes"]]}
    _log.info("compiled %s for %s as %d device parts in %.3fs", graph.name, backend,
              len(parts), report["compile_seconds"])
    return PartitionedExecutable(parts, split.outputs, backend,
                                 [graph.spec(n) for n in graph.inputs],
                                 [graph.spec(n) for n in graph.params],
                                 [graph.spec(o) for o in graph.outputs], device, report)


def _refs(refs) -> str:
    return ", ".join(f"part {r[1]}" if r[0] == "part" else f"{r[0]} {r[1]}"
                     for r in refs) or "nothing"


def explain_plan(graph: Graph) -> str:
    """Kernels with their fusion reasons, the schedule and the memory plan, as text."""
    from .passes.fusion import describe  # noqa: PLC0415
    lines = ["   kernels:", describe(graph)]
    sched = graph.meta.get("schedule")
    if sched:
        lines.append(f"   schedule: kernels {sched['order']}; lanes "
                     + ", ".join(f"{d}: {len(v)}" for d, v in sched["lanes"].items()))
    mem = graph.meta.get("memory")
    if mem:
        lines.append(f"   memory: arena {mem['arena_bytes']} B (naive {mem['naive_bytes']} B, "
                     f"peak live {mem['peak_bytes']} B, {len(mem['inplace'])} in place); "
                     "offsets " + ", ".join(f"k{k}@{v}" for k, v in mem["offsets"].items()))
    return "\n".join(lines)
