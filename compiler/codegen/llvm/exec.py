"""The LLVM backend's executable: ONE native call per hybridized call.

Per call, Python writes the input (and changed parameter) pointers into a prebuilt pointer
array, allocates the fresh output arrays and calls the program's entry point with the GIL
released; the arena is allocated once per executable and reused.
"""
from __future__ import annotations

import dataclasses
import time

from runtime import config
from runtime.executable import Executable

from ..lower import lower
from .emit import compile_program
from .loaded import NativeRun  # noqa: F401 - defined in loaded.py (a warm start needs no emit)

_log = config.logger("compile")


def _granule(program) -> int:
    """Rows a row-bounded program's count should be a multiple of: the GEMM loops' row
    tiles (sgemm.py) then never read a row past it, so a caller that fills the rows below
    its count leaves none of the rows a kernel reads unwritten (stale floats can be
    denormals: 3 garbage rows in a tile made a 40 us call 380 us)."""
    if not program.rows:
        return 1
    from compiler.codegen.extern_plan import tile_rows  # noqa: PLC0415
    return tile_rows()


def _bounded(program, binding, graph, rows):
    """``program`` with row bounds (compiler/passes/row_bounds.py) for a shape bucket's
    padded inputs, or as it is where some kernel cannot take them."""
    from compiler.passes.row_bounds import row_bounds  # noqa: PLC0415
    # an input's slots: its own and its views' (a reshaped input is a slot of that shape)
    slots_of: dict = {}
    for s, entry in zip(program.io_slots(), binding.io):
        while entry[0] == "alias":  # ('alias', io position): the same pointer
            entry = binding.io[entry[1]]
        if entry[0] == "input":
            slots_of.setdefault(entry[1], []).append(s)
    units = rows["units"]
    if rows["count"] not in slots_of:
        return program  # (the program never reads it: nothing to bound it by)
    batched = {s: program.slots[s].size // units
               for i in rows["batched"] for s in slots_of.get(i, ())}
    bounds = row_bounds(program, batched, units)
    _log.info("%s: %s", graph.name, f"{len(bounds)} kernel(s) bounded by the real rows"
              if bounds else "no row bounds (a kernel cannot take them)")
    return dataclasses.replace(program, count_slot=slots_of[rows["count"]][0], rows=bounds) \
        if bounds else program


def llvm_compile(graph, device, in_specs, param_specs, rows=None) -> Executable:
    if str(device).startswith("gpu"):  # native CPU code cannot read a GPU's memory
        raise ValueError(f"backend='llvm' compiles for CPUs, but this graph runs on {device}; "
                         "hybridize with backend='cuda' (the default on a GPU), or put its "
                         "inputs and parameters on hb.cpu()")
    t0 = time.perf_counter()
    program, binding = lower(graph)
    if rows:
        program = _bounded(program, binding, graph, rows)
    t1 = time.perf_counter()
    # symbols live in one process-wide JIT: the name must be unique per program
    compiled = compile_program(program, f"{graph.name or 'hybrid'}_{program.key()[:16]}")
    t2 = time.perf_counter()
    _log.info("%s: lowered to %d kernel(s) in %.1f ms, native code in %.1f ms", graph.name,
              len(program.steps), (t1 - t0) * 1e3, (t2 - t1) * 1e3)
    run = NativeRun(compiled, binding)
    if program.rows:  # it reads its padded inputs' rows below the count only
        run.short_inputs = frozenset(rows["batched"])
    report = {"kernels": len(program.steps), "arena_bytes": program.arena_bytes,
              "row_bounds": len(program.rows), "row_granule": _granule(program),
              "lower_seconds": t1 - t0, "codegen_seconds": t2 - t1, "program": program}
    return Executable(run, "llvm", in_specs, param_specs,
                      [graph.spec(o) for o in graph.outputs], device, report)
