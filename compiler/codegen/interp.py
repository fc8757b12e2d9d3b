"""A NumPy interpreter of kernel-IR Programs: the oracle the native backends are tested against.

Loop kernels evaluate their expressions with :class:`NumpyScalarBuilder` (the registry's
scalar expressions on whole arrays); extern kernels call the registry's eager impls. Arena
slots are views into one byte buffer, so buffer reuse (overlapping slots) behaves as it does
in native code. The arena starts filled with 0xFF bytes (NaN for floats), so a kernel that
reads an intermediate before it is written shows up in differential tests.
"""
from __future__ import annotations

import math

import numpy as np

from ..ops import eager_apply
from .kernel import (Call, Const, ExternKernel, Index, Load, LoopKernel, Program, expr_nodes,
                     registry_attrs)
from .scalar import NumpyScalarBuilder, Typed, eval_call, reduce_scalar


def slot_arrays(program: Program, inputs, params, outputs, arena=None):
    """A flat array per slot: the caller's arrays for io slots, arena views otherwise."""
    if arena is None:
        arena = np.full(max(program.arena_bytes, 1), 0xFF, dtype=np.uint8)
    queues = {"input": list(inputs), "param": list(params), "output": list(outputs)}
    arrays = []
    for i, s in enumerate(program.slots):
        if s.in_arena:
            arrays.append(arena[s.offset:s.offset + s.nbytes].view(s.dtype))
            continue
        a = queues[s.role].pop(0)
        if a.dtype.name != s.dtype or tuple(a.shape) != tuple(s.shape):
            raise ValueError(f"slot {i} ({s.role}) wants {s.dtype}{list(s.shape)}, got "
                             f"{a.dtype.name}{list(a.shape)}")
        if not a.flags.c_contiguous:
            raise ValueError(f"slot {i} ({s.role}): array must be C-contiguous")
        arrays.append(a.reshape(-1))
    return arrays


def interpret(program: Program, inputs, params=(), outputs=None) -> list:
    """Run ``program`` on NumPy arrays; returns the output arrays (fresh unless given)."""
    if outputs is None:
        outputs = [np.empty(program.slots[i].shape, program.slots[i].dtype)
                   for i in program.slots_of("output")]
    arrays = slot_arrays(program, inputs, params, outputs)
    for step in program.steps:
        if isinstance(step, LoopKernel):
            run_loop(program, step, arrays)
        else:
            run_extern(program, step, arrays)
    return list(outputs)


def _grid(strides, offset, shape):
    idx = np.asarray(offset, dtype=np.int64)
    for d, (s, n) in enumerate(zip(strides, shape)):
        if s:
            ax = [1] * len(shape)
            ax[d] = n
            idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(ax)
    return idx


def run_loop(program: Program, k: LoopKernel, arrays):
    shape = tuple(k.loop_shape)
    b = NumpyScalarBuilder()
    if math.prod(shape) == 0:
        for out in k.outputs:
            if out.reduce is None:
                continue
            live = [n for s, n in zip(out.access.strides, shape) if s]
            if math.prod(live) == 0:
                continue
            keep = tuple(n if s else 1 for s, n in zip(out.access.strides, shape))
            idx = _grid(out.access.strides, out.access.offset, keep)
            dt = program.slots[out.access.slot].dtype
            arrays[out.access.slot][idx] = b.const(reduce_scalar(out.reduce)[1], dt).v
        return
    memo = {}

    def linear():
        return Typed(np.arange(math.prod(shape), dtype=np.int64).reshape(shape), "int64")

    def value(node):
        if node in memo:
            return memo[node]
        if isinstance(node, Load):
            acc = k.loads[node.index]
            slot = program.slots[acc.slot]
            v = Typed(arrays[acc.slot][_grid(acc.strides, acc.offset, shape)], slot.dtype)
        elif isinstance(node, Const):
            v = b.const(node.value, node.dtype)
        elif isinstance(node, Index):
            if node.dim is None:
                v = linear()
            else:
                ax = [1] * len(shape)
                ax[node.dim] = shape[node.dim]
                v = Typed(np.arange(shape[node.dim], dtype=np.int64).reshape(ax), "int64")
        elif isinstance(node, Call):
            v = eval_call(b, node, [value(a) for a in node.args], linear)
        else:
            raise TypeError(node)
        memo[node] = v
        return v

    results = []
    for out in k.outputs:  # every load happens before any store (in place is safe)
        for node in expr_nodes(out.expr):
            value(node)
        dt = program.slots[out.access.slot].dtype
        results.append(np.broadcast_to(b.typed(value(out.expr), dt).v, shape))
    for out, vals in zip(k.outputs, results):
        acc = out.access
        dt = program.slots[acc.slot].dtype
        if out.reduce is None:
            arrays[acc.slot][_grid(acc.strides, acc.offset, shape)] = vals
            continue
        combine, identity = reduce_scalar(out.reduce)
        red = [d for d, s in enumerate(acc.strides) if s == 0]
        keep = [d for d in range(len(shape)) if d not in red]
        v = np.transpose(vals, keep + red).reshape([shape[d] for d in keep] + [-1])
        v = _tree_reduce(b, combine, v, dt)
        init = b.const(identity, dt)
        v = b.typed(combine(b, init, Typed(v, dt)), dt).v
        kshape = tuple(shape[d] if d in keep else 1 for d in range(len(shape)))
        # the index grid has no axes when the output walks no dimension (a full reduction)
        idx = np.broadcast_to(_grid(acc.strides, acc.offset, kshape), kshape)
        arrays[acc.slot][idx] = v.reshape(kshape)


def _tree_reduce(b, combine, v, dt):
    """Combine along the last axis pairwise (log-depth, like NumPy's pairwise sum)."""
    while v.shape[-1] > 1:
        m = v.shape[-1]
        half = m // 2
        c = b.typed(combine(b, Typed(v[..., :half], dt), Typed(v[..., half:2 * half], dt)),
                    dt).v
        v = np.concatenate([c, v[..., 2 * half:]], axis=-1) if m % 2 else c
    return v[..., 0]


def run_extern(program: Program, k: ExternKernel, arrays):
    attrs = k.attr_dict
    ins = [arrays[s].reshape(program.slots[s].shape) for s in k.in_slots]
    if k.op == "matmul":
        if attrs.get("transpose_a"):
            ins[0] = np.swapaxes(ins[0], -1, -2)
        if attrs.get("transpose_b"):
            ins[1] = np.swapaxes(ins[1], -1, -2)
    outs = eager_apply(np, k.op, ins, registry_attrs(k.op, attrs),
                       [program.slots[s].spec for s in k.out_slots])
    for s, r in zip(k.out_slots, outs):
        arrays[s][...] = np.asarray(r).reshape(-1)
