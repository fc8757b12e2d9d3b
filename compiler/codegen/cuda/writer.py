"""Writing a CUDA source: the module (definitions in order, launches, workspace) and one
kernel at a time (its parameters, body and launch).

Per-step kernels bake every size and offset into their text (sizes are known when a Program
is lowered), so they take only pointers. Kernels shared by several steps (the GEMM of
matmul.py) take their sizes as scalar arguments instead.
"""
from __future__ import annotations

import contextlib
import re

from ..kernel import Program
from .scalar import Code, mem_ctype
from .source import CudaSource, KernelArg, Launch

BLOCK = 256  # threads per block of the grid-stride kernels
MAX_GRID = 4096  # blocks of a grid-stride kernel at most (each thread then loops)
INT_LIMIT = (1 << 31) - 1
WORKSPACE_ALIGN = 256


def sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name or "")
    return s.strip("_")[:40]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def grid_for(n: int, block: int = BLOCK, per_thread: int = 1) -> int:
    """Blocks of a grid-stride loop over ``n`` items (``per_thread`` items per step)."""
    return max(1, min(MAX_GRID, ceil_div(n, block * per_thread)))


def index_type(*limits) -> str:
    """``int`` while every index, bound and grid-stride step fits in it, else ``long long``."""
    return "int" if max((int(x) for x in limits), default=0) < INT_LIMIT else "long long"


def decompose(code: Code, it: str, var: str, extents, names) -> list:
    """Emit the row-major coordinates of linear index ``var`` over ``extents`` into new
    variables ``names`` (an extent of 1 gives the literal 0); returns their C text."""
    out = [None] * len(extents)
    rest = var
    live = [d for d, n in enumerate(extents) if n != 1]
    for d in range(len(extents)):
        if extents[d] == 1:
            out[d] = "0"
    for j, d in enumerate(reversed(live)):
        if j == len(live) - 1:  # the outermost: what is left
            code.line(f"const {it} {names[d]} = {rest};")
        else:
            code.line(f"const {it} {names[d]} = {rest} % {extents[d]};")
            nxt = code.fresh("q")
            code.line(f"const {it} {nxt} = {rest} / {extents[d]};")
            rest = nxt
        out[d] = names[d]
    return out


def linear_expr(offset: int, terms) -> str:
    """``offset + c0 * s0 + ...`` (terms: (coordinate text, stride)), zero terms left out."""
    parts = [str(offset)] if offset else []
    for c, s in terms:
        if s == 0 or c == "0":
            continue
        parts.append(c if s == 1 else f"{c} * {s}" if s > 0 else f"{c} * ({s})")
    return " + ".join(parts) if parts else "0"


class ModuleWriter:
    """The definitions (helpers and kernels, each once, dependencies first), the launches and
    the workspace of one source."""

    def __init__(self, program: Program, name: str):
        self.program = program
        self.name = sanitize(name) or "program"
        self.defs: dict = {}
        self.kernels: list = []
        self.launches: list = []
        self.workspace_bytes = 0
        self.conv_scratch = None  # the convolutions' im2col scratch (conv.reserve_scratch)
        self.step = -1

    def define(self, name: str, make_text, kernel: bool = False) -> str:
        """Define ``name`` once, by ``make_text()`` (which may define what it uses first)."""
        if name not in self.defs:
            text = make_text()
            self.defs[name] = text
            if kernel:
                self.kernels.append(name)
        return name

    def workspace(self, nbytes: int) -> int:
        """Byte offset of ``nbytes`` of fresh workspace."""
        off = ceil_div(self.workspace_bytes, WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        self.workspace_bytes = off + int(nbytes)
        return off

    def launch(self, kernel: str, grid, block, args, shared_bytes: int = 0, blas=()):
        grid = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
        block = tuple(int(b) for b in (block if isinstance(block, tuple) else (block,)))
        self.launches.append(Launch(kernel, grid + (1,) * (3 - len(grid)),
                                    block + (1,) * (3 - len(block)), int(shared_bytes),
                                    tuple(args), self.step, tuple(blas)))

    def kernel_name(self, label: str) -> str:
        base = f"hyb_k{self.step}_{sanitize(label)}".rstrip("_")
        name, n = base, 1
        while name in self.defs:
            n += 1
            name = f"{base}_{n}"
        return name

    def source(self, prelude: str) -> CudaSource:
        stubs = "\n".join(f"HYB_EMU_STUB({k})" for k in self.kernels)
        text = "\n".join([prelude] + list(self.defs.values()) +
                         ["#ifdef HYBRID_EMULATE", stubs, "#endif", ""])
        return CudaSource(self.name, text, tuple(self.launches), tuple(self.kernels),
                          self.program.arena_bytes, self.workspace_bytes)


class KernelWriter:
    """One per-step ``__global__`` function: pointers to the slots it touches (``const``
    where it only reads them; ``__restrict__`` unless its arena bytes overlap another's)."""

    def __init__(self, mw: ModuleWriter, label: str):
        self.mw = mw
        self.name = mw.kernel_name(label)
        self.code = Code(indent=1)
        self._params: list = []  # (name, KernelArg, ctype of the pointee)
        self._slots: dict = {}
        self._written: set = set()

    def ptr(self, slot: int, write: bool = False) -> str:
        """The parameter name of slot ``slot``'s pointer."""
        if write:
            self._written.add(slot)
        name = self._slots.get(slot)
        if name is None:
            name = self._slots[slot] = f"s{slot}"
            dtype = self.mw.program.slots[slot].dtype
            self._params.append((name, KernelArg("slot", slot=slot), mem_ctype(dtype)))
        return name

    def workspace(self, offset: int, ctype: str) -> str:
        name = f"w{len(self._params)}"
        self._params.append((name, KernelArg("workspace", offset=offset), ctype))
        return name

    def _restrict(self, slot: int) -> bool:
        prog = self.mw.program
        s = prog.slots[slot]
        if not s.in_arena:
            return True
        for other in self._slots:
            o = prog.slots[other]
            if other != slot and o.in_arena and s.offset < o.offset + o.nbytes and \
                    o.offset < s.offset + s.nbytes:
                return False
        return True

    def _signature(self) -> str:
        decls = []
        for name, arg, ct in self._params:
            if arg.kind == "slot":
                const = "" if arg.slot in self._written else "const "
                rst = "__restrict__ " if self._restrict(arg.slot) else ""
                decls.append(f"{const}{ct}* {rst}{name}")
            else:
                decls.append(f"{ct}* __restrict__ {name}")
        return ", ".join(decls)

    def finish(self, grid, block, shared_bytes: int = 0):
        """Define the kernel and launch it once."""
        threads = block if isinstance(block, int) else block[0] * block[1] * block[2]
        text = (f'extern "C" __global__ void __launch_bounds__({threads}) '
                f"{self.name}({self._signature()}) {{\n{self.code.text()}\n}}\n")
        self.mw.define(self.name, lambda: text, kernel=True)
        self.mw.launch(self.name, grid, block, [a for _, a, _ in self._params], shared_bytes)

    def grid_stride(self, it: str, n, var: str = "i"):
        """``for (var = global thread; var < n; var += all threads)``."""
        return self.code.block(
            f"for ({it} {var} = ({it})blockIdx.x * blockDim.x + threadIdx.x; {var} < {n}; "
            f"{var} += ({it})gridDim.x * blockDim.x)")


@contextlib.contextmanager
def grid_stride_kernel(mw: ModuleWriter, label: str, total: int, *limits, var: str = "i"):
    """A kernel that is one grid-stride loop over ``total`` items (``var``), with an index
    type that fits ``limits`` too; yields (writer, index type) inside the loop, then defines
    and launches the kernel."""
    grid = grid_for(total)
    it = index_type(total + grid * BLOCK, *limits)
    kw = KernelWriter(mw, label)
    with kw.grid_stride(it, total, var):
        yield kw, it
    kw.finish(grid, BLOCK)
