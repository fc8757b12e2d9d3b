"""Lowering: an optimized graph (fusion groups, schedule, memory plan in ``graph.meta``) to a
kernel :class:`Program`, and the binding that tells an executable where each input,
parameter, constant and output goes.

Every value has a *layout*: a slot plus element strides per dimension and an offset. Views
(reshape/transpose/broadcast/slice of a value in memory) only change layouts, so they cost
no kernel; an extern that needs a contiguous operand gets a copy only when the layout is not
one (a transposed 2-D matmul operand becomes a BLAS transpose flag instead).
"""
from __future__ import annotations

import dataclasses
import math

from ..graph import Graph, NodeRef
from ..ops import REGISTRY
from ..ops.movement import normalize_slice
from .kernel import (EXTERN_OPS, Access, Const, Index, KernelIRError, Load, Output, Program,
                     ProgramBuilder, call, contiguous_strides, dense_strides)


@dataclasses.dataclass(frozen=True)
class Layout:
    slot: int
    shape: tuple
    strides: tuple
    offset: int = 0

    @property
    def contiguous(self) -> bool:
        return self.offset == 0 and dense_strides(self.shape, self.strides)


@dataclasses.dataclass
class Binding:
    """How an executable fills the program's io slots and builds its outputs.

    io: per io position, ('input', i) | ('param', i) | ('const', array) | ('output', k) |
        ('alias', position) (the same pointer as another position: a reshaped view);
    outputs: per graph output, ('slot', k) | ('input', i) | ('param', i) | ('const', array).
    """
    io: list
    outputs: list


def gather_outputs(outputs, slots, inputs, params, consts=None) -> list:
    """The graph's outputs from a run: ``outputs`` is a Binding's list; ``slots`` the output
    slots' arrays; ``consts`` (per output, else the Binding's own arrays) the constants as
    the target holds them (a GPU's copies)."""
    res = []
    for k, (kind, v) in enumerate(outputs):
        if kind == "slot":
            res.append(slots[v])
        elif kind == "input":
            res.append(inputs[v])
        elif kind == "param":
            res.append(params[v])
        else:
            res.append(v if consts is None else consts[k])
    return res


def lower(graph: Graph) -> tuple[Program, Binding]:
    return _Lowering(graph).run()


class _Lowering:
    def __init__(self, graph: Graph):
        self.g = graph
        self.fusion = graph.meta["fusion"]
        self.order = graph.meta["schedule"]["order"]
        self.mem = graph.meta["memory"]
        self.pb = ProgramBuilder()
        self.pb.arena_bytes = self.mem["arena_bytes"]
        self.layouts: dict[int, Layout] = {}
        self.slot_src: dict[int, tuple] = {}  # io slot -> binding entry
        self.out_slots: dict[int, int] = {}  # graph output node -> output slot

    # ----------------------------------------------------------------- slots
    def _io_slot(self, role, shape, dtype, entry):
        s = {"input": self.pb.input, "param": self.pb.param, "output": self.pb.output}[role](
            shape, dtype)
        self.slot_src[s] = entry
        return s

    def _place_sources(self):
        g = self.g
        for i, n in enumerate(g.inputs):
            sp = g.spec(n)
            self.layouts[n] = self._contig(self._io_slot("input", sp.shape, sp.dtype,
                                                         ("input", i)), sp.shape)
        for i, n in enumerate(g.params):
            sp = g.spec(n)
            self.layouts[n] = self._contig(self._io_slot("param", sp.shape, sp.dtype,
                                                         ("param", i)), sp.shape)
        for n in g.g.nodes:
            if g.op(n) == "const":
                sp = g.spec(n)
                value = g.constants[g.node(n)["attrs"]["name"]]
                self.layouts[n] = self._contig(self._io_slot("param", sp.shape, sp.dtype,
                                                             ("const", value)), sp.shape)

    @staticmethod
    def _contig(slot, shape):
        return Layout(slot, tuple(shape), contiguous_strides(shape), 0)

    def _root_slot(self, gid, node):
        """The slot a group writes: an output slot, or its planned arena offset."""
        g = self.g
        sp = g.spec(node)
        if node in g.outputs:
            if node not in self.out_slots:
                self.out_slots[node] = self._io_slot("output", sp.shape, sp.dtype,
                                                     ("output", len(self.out_slots)))
            return self.out_slots[node]
        backed = self.mem.get("out_backed", {}).get(gid)
        if backed is not None:  # an output is a reshape of this value: write it there
            osp = g.spec(backed)
            out = self._io_slot("output", osp.shape, osp.dtype, ("output", len(self.out_slots)))
            self.out_slots[backed] = out
            if tuple(osp.shape) == tuple(sp.shape):
                return out
            alias = self.pb.output(sp.shape, sp.dtype)
            self.slot_src[alias] = ("alias", out)
            return alias
        for dst, src in self.mem["inplace"]:
            if dst == gid:  # write over the dying input, through its own slot
                lay = self.layouts[self.fusion["groups"][src]["root"]]
                if self.pb.slots[lay.slot].size == sp.size:
                    return lay.slot
        return self.pb.temp(sp.shape, sp.dtype, offset=self.mem["offsets"][gid])

    def _temp(self, shape, dtype):
        return self.pb.temp(shape, dtype)  # bump-allocated past the planned arena

    # ----------------------------------------------------------------- layouts
    def _view(self, n) -> Layout:
        g = self.g
        op = g.op(n)
        attrs = g.node(n)["attrs"]
        (src,) = g.arg_ids(n)
        lay = self.layouts[src]
        shape = g.spec(n).shape
        if op == "transpose":
            axes = attrs.get("axes") or tuple(reversed(range(len(lay.shape))))
            return Layout(lay.slot, shape, tuple(lay.strides[a] for a in axes), lay.offset)
        if op == "broadcast_to":
            lead = len(shape) - len(lay.shape)
            strides = tuple(0 if i < lead or lay.shape[i - lead] == 1 and shape[i] != 1
                            else lay.strides[i - lead] for i in range(len(shape)))
            return Layout(lay.slot, shape, strides, lay.offset)
        if op == "slice":
            b, _, s = normalize_slice(lay.shape, attrs["begin"], attrs["end"], attrs["step"])
            off = lay.offset + sum(bi * st for bi, st in zip(b, lay.strides))
            return Layout(lay.slot, shape, tuple(st * si for st, si in zip(lay.strides, s)),
                          off)
        if op == "reshape":
            # a dense layout reshapes in place, at its offset (the fused SGD update's
            # learning rate, a (1, 1) slice of the hyperparameter table, was a copy kernel
            # per parameter on the GPU)
            if dense_strides(lay.shape, lay.strides):
                return Layout(lay.slot, shape, contiguous_strides(shape), lay.offset)
            copy = self._copy_to_temp(lay, g.spec(src).dtype)
            return Layout(copy.slot, shape, contiguous_strides(shape), 0)
        raise KernelIRError(f"not a view op: {op}")

    def _output_copy(self, n, fresh=False) -> int:
        """A new output slot holding a contiguous copy of node n's value; its output index."""
        lay = self.layouts[n]
        sp = self.g.spec(n)
        slot = self._io_slot("output", sp.shape, sp.dtype, ("output", len(self.out_slots)))
        self.out_slots[("copy", len(self.out_slots)) if fresh else n] = slot
        self.pb.loop(sp.shape, [Access(lay.slot, lay.strides, lay.offset)],
                     [Output(self._access(self._contig(slot, sp.shape), sp.shape),
                             Load(0))], name="output_copy")
        return self.slot_src[slot][1]

    def _copy_to_temp(self, lay: Layout, dtype) -> Layout:
        slot = self._temp(lay.shape, dtype)
        out = self._contig(slot, lay.shape)
        self.pb.loop(lay.shape, [Access(lay.slot, lay.strides, lay.offset)],
                     [Output(self._access(out, lay.shape), Load(0))], name="copy")
        return out

    def _whole_slot(self, n) -> int:
        """A slot holding exactly node n's value, contiguous (externs read whole slots)."""
        g = self.g
        lay = self.layouts[n]
        sp = g.spec(n)
        if lay.contiguous:
            slot = self.pb.slots[lay.slot]
            if tuple(slot.shape) == tuple(sp.shape):
                return lay.slot
            if slot.in_arena:
                return self.pb.temp(sp.shape, sp.dtype, offset=slot.offset)
            alias = self._io_slot(slot.role if slot.role != "output" else "param",
                                  sp.shape, sp.dtype, ("alias", lay.slot))
            return alias
        return self._copy_to_temp(lay, sp.dtype).slot

    @staticmethod
    def _access(lay: Layout, loop_shape) -> Access:
        """lay's value read at each point of loop_shape (right-aligned broadcasting)."""
        lead = len(loop_shape) - len(lay.shape)
        strides = []
        for j, n in enumerate(loop_shape):
            i = j - lead
            if i < 0 or lay.shape[i] == 1 and n != 1:
                strides.append(0)
            else:
                strides.append(lay.strides[i])
        return Access(lay.slot, tuple(strides), lay.offset)

    # ----------------------------------------------------------------- expressions
    def _expr(self, n, members, loop_shape, loads):
        g = self.g
        if n not in members:
            lay = self.layouts[n]
            acc = self._access(lay, loop_shape)
            if acc not in loads:
                loads.append(acc)
            return Load(loads.index(acc))
        d = g.node(n)
        op = d["op"]
        args = []
        for a in g.args(n):
            if isinstance(a, NodeRef):
                args.append(self._expr(a.id, members, loop_shape, loads))
            else:
                args.append(Const(a, None))
        if REGISTRY[op].kind == "source" and op != "full":
            args.append(self._own_index(d["spec"].shape, loop_shape))
        return call(op, *args, dtype=d["spec"].dtype, attrs=d["attrs"])

    @staticmethod
    def _own_index(shape, loop_shape):
        """The row-major index into a source op's own output at each loop point."""
        if tuple(shape) == tuple(loop_shape):
            return Index(None)
        lead = len(loop_shape) - len(shape)
        strides = contiguous_strides(shape)
        expr = None
        for i, n in enumerate(shape):
            if n == 1:
                continue
            term = Index(lead + i)
            if strides[i] != 1:
                term = call("mul", term, Const(strides[i], None), dtype="int64")
            expr = term if expr is None else call("add", expr, term, dtype="int64")
        return expr if expr is not None else Const(0, "int64")

    # ----------------------------------------------------------------- groups
    def run(self):
        self._place_sources()
        for gid in self.order:
            grp = self.fusion["groups"][gid]
            kind = grp["kind"]
            if kind == "view":
                self.layouts[grp["root"]] = self._view(grp["root"])
            elif kind == "extern" or kind == "index" or \
                    self.g.op(grp["root"]) in ("argmax", "argmin"):
                self._extern_group(gid, grp)
            elif kind == "reduce":
                self._reduce_group(gid, grp)
            elif kind == "movement":
                self._movement_group(gid, grp)
            else:  # elementwise and sources
                self._loop_group(gid, grp)
        # a loop body's outputs are each a slot of its own (graph.meta "distinct_outputs"), so
        # a step can write them straight into the rows of a loop's results
        distinct = self.g.meta.get("distinct_outputs")
        outputs, taken = [], set()
        for n in self.g.outputs:
            op = self.g.op(n)
            if distinct and (op in ("input", "param", "const") or n in taken):
                outputs.append(("slot", self._output_copy(n, fresh=True)))
            elif op in ("input", "param"):
                outputs.append((op, (self.g.inputs if op == "input" else self.g.params).index(n)))
            elif op == "const":
                outputs.append(("const", self.g.constants[self.g.node(n)["attrs"]["name"]]))
            elif n in self.out_slots:
                outputs.append(("slot", self.slot_src[self.out_slots[n]][1]))
            else:  # a view as output: a fresh contiguous copy
                outputs.append(("slot", self._output_copy(n)))
            taken.add(n)
        program = self.pb.build()
        pos = {s: i for i, s in enumerate(program.io_slots())}
        io = []
        for s in program.io_slots():
            entry = self.slot_src[s]
            io.append(("alias", pos[entry[1]]) if entry[0] == "alias" else entry)
        return program, Binding(io, outputs)

    def _loop_group(self, gid, grp):
        root = grp["root"]
        sp = self.g.spec(root)
        members = set(grp["nodes"])
        loads: list = []
        expr = self._expr(root, members, sp.shape, loads)
        slot = self._root_slot(gid, root)
        out = self._contig(slot, sp.shape)
        outputs = [Output(self._access(out, sp.shape), expr)]
        outputs += self._extra_outputs(gid, grp, members, sp.shape, loads)
        self.pb.loop(sp.shape, loads, outputs, name=f"k{gid}_{self.g.op(root)}")
        self.layouts[root] = out

    def _extra_outputs(self, gid, grp, members, loop_shape, loads) -> list:
        """The group's other stored values (fusion's ``extra_outputs``: graph outputs read
        by the rest of the group), each an Output of the same loop; the expressions share
        their common parts with the root's (the emitters evaluate equal subexpressions once)."""
        outs = []
        for m in grp.get("extra_outputs", ()):
            sp = self.g.spec(m)
            if tuple(sp.shape) != tuple(loop_shape):  # fusion stores same-shape values only
                raise KernelIRError(f"extra output %{m} {sp.shape} in a loop over {loop_shape}")
            lay = self._contig(self._root_slot(gid, m), sp.shape)
            outs.append(Output(self._access(lay, loop_shape),
                               self._expr(m, members, loop_shape, loads)))
            self.layouts[m] = lay
        return outs

    def _reduce_group(self, gid, grp):
        g = self.g
        root = grp["root"]
        attrs = g.node(root)["attrs"]
        (src,) = g.arg_ids(root)
        in_shape = g.spec(src).shape
        members = set(grp["nodes"]) - {root}
        loads: list = []
        expr = self._expr(src, members, in_shape, loads)
        nd = len(in_shape)
        axes = set(range(nd)) if attrs.get("axis") is None else {
            a % nd for a in ((attrs["axis"],) if isinstance(attrs["axis"], int)
                             else attrs["axis"])}
        sp = g.spec(root)
        slot = self._root_slot(gid, root)
        cs = contiguous_strides(sp.shape)
        strides, k = [], 0
        for j in range(nd):
            if j in axes:
                strides.append(0)
                if attrs.get("keepdims"):
                    k += 1
            else:
                strides.append(cs[k])
                k += 1
        outputs = [Output(Access(slot, tuple(strides), 0), expr, reduce=g.op(root))]
        outputs += self._extra_outputs(gid, grp, members, in_shape, loads)
        self.pb.loop(in_shape, loads, outputs, name=f"k{gid}_{g.op(root)}")
        self.layouts[root] = self._contig(slot, sp.shape)

    def _extern_group(self, gid, grp):
        g = self.g
        nodes = grp["nodes"]
        ext = next(n for n in nodes if g.op(n) in EXTERN_OPS)
        pre = [n for n in nodes if n != ext and n in _ancestors_within(g, ext, set(nodes))]
        root = grp["root"]
        # a prologue inside the group (e.g. argmax of an expression) is materialized first
        members_pre = set(pre)
        ins, attrs = [], dict(g.node(ext)["attrs"])
        for k, a in enumerate(g.arg_ids(ext)):
            if a in members_pre:
                loads: list = []
                sp = g.spec(a)
                expr = self._expr(a, members_pre, sp.shape, loads)
                slot = self._temp(sp.shape, sp.dtype)
                lay = self._contig(slot, sp.shape)
                self.pb.loop(sp.shape, loads, [Output(self._access(lay, sp.shape), expr)])
                self.layouts[a] = lay
            src_slot = self._transposed_2d(a) if g.op(ext) == "matmul" else None
            if src_slot is not None:
                ins.append(src_slot)
                attrs["transpose_a" if k == 0 else "transpose_b"] = True
            else:
                ins.append(self._whole_slot(a))
        if g.op(ext) == "matmul" and self.pb.slots[ins[1]].role == "param":
            attrs["b_param"] = True  # the same data every call of a binding: worth packing
        sp_ext = g.spec(ext)
        epilogue = [n for n in nodes if n not in members_pre and n != ext]
        if not epilogue:
            out = self._root_slot(gid, root)
            self.pb.extern(g.op(ext), ins, [out], name=f"k{gid}_{g.op(ext)}", **attrs)
            self.layouts[root] = self._contig(out, sp_ext.shape)
            return
        sp_root = g.spec(root)
        out = self._root_slot(gid, root)
        tmp_slot = out if sp_root.size == sp_ext.size and \
            sp_root.dtype == sp_ext.dtype else self._temp(sp_ext.shape, sp_ext.dtype)
        if tuple(self.pb.slots[tmp_slot].shape) != tuple(sp_ext.shape):
            slot = self.pb.slots[tmp_slot]
            tmp_slot = self.pb.temp(sp_ext.shape, sp_ext.dtype, offset=slot.offset) \
                if slot.in_arena else self._temp(sp_ext.shape, sp_ext.dtype)
        self.pb.extern(g.op(ext), ins, [tmp_slot], name=f"k{gid}_{g.op(ext)}", **attrs)
        self.layouts[ext] = self._contig(tmp_slot, sp_ext.shape)
        # the epilogue runs in place over the extern's output, cache-hot
        loads: list = []
        expr = self._expr(root, set(epilogue), sp_root.shape, loads)
        out_lay = self._contig(out, sp_root.shape)
        self.pb.loop(sp_root.shape, loads, [Output(self._access(out_lay, sp_root.shape), expr)],
                     name=f"k{gid}_epilogue")
        self.layouts[root] = out_lay

    def _transposed_2d(self, n):
        """A slot holding node n's 2-D value transposed, contiguous, or None: a matmul reads
        it with its transpose flag instead of a materialized copy. The data may sit in a
        slot of another shape with the same elements (the reverse scan's stacked (T, N, 4H)
        gate gradients, reshaped to (T*N, 4H) and transposed): then a view slot of the
        untransposed shape, as _whole_slot makes for a reshape."""
        lay = self.layouts[n]
        if len(lay.shape) != 2 or lay.offset != 0:
            return None
        slot = self.pb.slots[lay.slot]
        r, c = lay.shape
        if tuple(lay.strides) != (1, r) or slot.size != r * c:
            return None
        if tuple(slot.shape) == (c, r):
            return lay.slot
        if slot.in_arena:
            return self.pb.temp((c, r), slot.dtype, offset=slot.offset)
        return self._io_slot(slot.role if slot.role != "output" else "param", (c, r),
                             slot.dtype, ("alias", lay.slot))

    def _movement_group(self, gid, grp):
        g = self.g
        (n,) = grp["nodes"]
        op = g.op(n)
        attrs = g.node(n)["attrs"]
        sp = g.spec(n)
        slot = self._root_slot(gid, n)
        out = self._contig(slot, sp.shape)
        self.layouts[n] = out
        args = g.args(n)
        if op == "concatenate":
            axis = attrs.get("axis", 0) % len(sp.shape)
            start = 0
            for a in args:
                lay = self.layouts[a.id]
                shp = g.spec(a.id).shape
                self.pb.loop(shp, [self._access(lay, shp)],
                             [Output(Access(slot, out.strides, start * out.strides[axis]),
                                     _cast(Load(0), g.spec(a.id).dtype, sp.dtype))],
                             name=f"k{gid}_concat")
                start += shp[axis]
            return
        if op in ("slice_scatter", "slice_update"):
            base_shape = sp.shape
            if op == "slice_scatter":
                self.pb.loop(base_shape, [], [Output(self._access(out, base_shape),
                                                     Const(0, sp.dtype))], name="zero")
                value = args[0]
            else:
                self.pb.loop(base_shape, [self._access(self.layouts[args[0].id], base_shape)],
                             [Output(self._access(out, base_shape), Load(0))], name="copy")
                value = args[1]
            b, _, s = normalize_slice(base_shape, attrs["begin"], attrs["end"], attrs["step"])
            region = tuple(len(range(bi, ei, si)) for bi, ei, si in
                           zip(*normalize_slice(base_shape, attrs["begin"], attrs["end"],
                                                attrs["step"])))
            strides = tuple(st * si for st, si in zip(out.strides, s))
            offset = sum(bi * st for bi, st in zip(b, out.strides))
            if math.prod(region) == 0:
                return
            if isinstance(value, NodeRef):
                loads = [self._access(self.layouts[value.id], region)]
                expr = _cast(Load(0), g.spec(value.id).dtype, sp.dtype)
            else:
                loads, expr = [], Const(value, sp.dtype)
            self.pb.loop(region, loads, [Output(Access(slot, strides, offset), expr)],
                         name=f"k{gid}_{op}")
            return
        raise KernelIRError(f"no lowering for movement op {op!r}")


def _cast(expr, src, dst):
    return expr if src == dst else call("cast", expr, dtype=dst, attrs={"dtype": dst})


def _ancestors_within(g: Graph, n, members):
    out, stack = set(), [n]
    while stack:
        x = stack.pop()
        for a in g.arg_ids(x):
            if a in members and a not in out:
                out.add(a)
                stack.append(a)
    return out


