"""Eager reverse-mode autograd on a tape, MXNet style.

Under ``record()`` every op whose inputs need a gradient is noted on the tape; ``backward``
walks it in reverse and applies each op's gradient rule from the registry, built with the same
front-end ops (so gradients are themselves asynchronous engine ops). A hybridized block is a
single tape node whose backward runs a compiled backward graph.
"""
from __future__ import annotations

import contextlib
import inspect

import numpy as np

from compiler.ops import REGISTRY

from . import _state
from .ndarray import F, NDArray, _from_numpy, ones_like


class _TransposedValue(NDArray):
    """A recorded matmul's operand that a recorded 2-D transpose computed (Dense's ``W.T``):
    stored transposed, so matmul's gradient for it is computed in that layout
    (compiler/ops/linalg.py). Told by the recording, never by the data, which may not be
    computed yet: the same program gives the same bits however the engine ran it."""
    __slots__ = ()
    _stored_transposed = True


def _value_of(name, a):
    """The snapshot of input ``a`` a node keeps."""
    if name == "matmul" and a._node is not None and a._node[0].name == "transpose" and \
            len(a.shape) == 2:
        return _TransposedValue(a._buf, a.shape, a._dtype, a.device)
    return NDArray(a._buf, a.shape, a._dtype, a.device)


class _Node:
    """One recorded op: its inputs (value snapshots and where their gradients go)."""

    __slots__ = ("name", "values", "parents", "leaves", "outputs", "attrs", "backward_fn",
                 "freed")

    def __init__(self, name, inputs, outputs, attrs, backward_fn):
        self.name = name
        self.values = []
        self.parents = []
        self.leaves = []
        for a in inputs:
            if isinstance(a, NDArray):
                self.values.append(_value_of(name, a))
                live = a._node is not None and not a._node[0].freed
                self.parents.append(a._node if live else None)
                self.leaves.append(a if a._grad_req != "null" and a._node is None else None)
            else:
                self.values.append(a)
                self.parents.append(None)
                self.leaves.append(None)
        self.outputs = [NDArray(o._buf, o.shape, o._dtype, o.device) for o in outputs]
        self.attrs = attrs
        self.backward_fn = backward_fn
        self.freed = False


def _needs_grad(a) -> bool:
    """Whether a gradient flows into ``a``: a leaf with attach_grad, or a value computed by
    recorded ops whose graph a backward has not freed yet. A value from an earlier batch's
    graph (an RNN's state carried to the next batch) is a constant in a new recording, as
    in MXNet: the book's ``for s in state: s.detach()`` does not detach in place, and its
    training runs there."""
    return isinstance(a, NDArray) and (
        (a._node is not None and not a._node[0].freed) or a._grad_req != "null")


def record_op(name, args, attrs, outs):
    """Called by the front end for every op while recording."""
    if not any(_needs_grad(a) for a in args) or REGISTRY[name].grad is None:
        return
    node = _Node(name, args, outs, attrs, None)
    for i, o in enumerate(outs):
        o._node = (node, i)


def record_custom(name, inputs, outputs, backward_fn):
    """Record a node whose backward is ``backward_fn(out_grads) -> in_grads`` (lists)."""
    if not any(_needs_grad(a) for a in inputs):
        return
    node = _Node(name, inputs, outputs, {}, backward_fn)
    for i, o in enumerate(outputs):
        o._node = (node, i)


# ---------------------------------------------------------------- contexts
@contextlib.contextmanager
def _scope(recording, training):
    loc = _state.local
    old = (loc.recording, loc.training)
    if recording is not None:
        loc.recording = recording
    if training is not None:
        loc.training = training
    try:
        yield
    finally:
        loc.recording, loc.training = old


def record(train_mode: bool = True):
    """Record ops for ``backward`` (and run layers in training mode unless told otherwise)."""
    return _scope(True, train_mode)


def pause(train_mode: bool = False):
    return _scope(False, train_mode)


def train_mode():
    return _scope(None, True)


def predict_mode():
    return _scope(None, False)


def is_recording() -> bool:
    return _state.is_recording()


def is_training() -> bool:
    return _state.is_training()


def set_recording(flag: bool) -> bool:
    old = _state.local.recording
    _state.local.recording = bool(flag)
    return old


def set_training(flag: bool) -> bool:
    old = _state.local.training
    _state.local.training = bool(flag)
    return old


def mark_variables(variables, gradients, grad_reqs="write"):
    reqs = [grad_reqs] * len(variables) if isinstance(grad_reqs, str) else grad_reqs
    for v, g, r in zip(variables, gradients, reqs):
        v._grad_req, v._grad, v._node = r, g, None


# ---------------------------------------------------------------- backward
def _topo(heads):
    order, seen = [], set()
    stack = [(h._node[0], False) for h in heads if h._node is not None]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for p in node.parents:
            if p is not None and id(p[0]) not in seen:
                stack.append((p[0], False))
    return order  # producers before consumers


def _accumulate(store, key, g, holder=None):
    cur = store.get(key)
    store[key] = (holder, g) if cur is None else (holder, cur[1] + g)


def _head_grad(h):
    """The default head gradient, ones: on a CPU device made here, computed at once (as an
    engine op it would queue behind the forward whose backward it seeds)."""
    if h.device.kind == "cpu":
        return _from_numpy(np.ones(h.shape, dtype=h._dtype), h.device)
    return ones_like(h)


def backward(heads, head_grads=None, retain_graph: bool = False, train_mode: bool = True):
    """Accumulate d(sum of heads * head_grads)/d(leaf) into every leaf's ``.grad``."""
    heads = list(heads)
    head_grads = list(head_grads) if head_grads is not None else [None] * len(heads)
    for h in heads:
        if h._node is None and h._grad_req == "null":
            raise RuntimeError("backward: this array was not computed under autograd.record() "
                               "from arrays with attach_grad() (nothing to differentiate)")
    with _scope(False, train_mode):
        order = _topo(heads)
        grads: dict = {}
        leaves: dict = {}
        for h, hg in zip(heads, head_grads):
            if hg is not None and tuple(hg.shape) != h.shape:
                raise ValueError(f"backward: the head gradient has shape {tuple(hg.shape)}, "
                                 f"but its head has shape {h.shape}")
            g = _head_grad(h) if hg is None else hg
            if h._node is not None:
                _accumulate(grads, (id(h._node[0]), h._node[1]), g)
            else:
                _accumulate(leaves, id(h), g, h)
        for node in reversed(order):
            if node.freed:
                raise RuntimeError(f"backward through op '{node.name}' whose graph was freed by "
                                   "an earlier backward; pass retain_graph=True to the first one")
            outs = [grads.pop((id(node), i), (None, None))[1] for i in range(len(node.outputs))]
            if all(g is None for g in outs):
                continue
            # a gradient rule's constants (zeros, arange, ...) go on the op's own device, so
            # backward works for ops on cpu(1), gpu(0), ... (data parallelism)
            with node.outputs[0].device:
                outs = [g if g is not None else F.full(shape=o.shape, value=0.0, dtype=o._dtype)
                        for g, o in zip(outs, node.outputs)]
                in_grads = _node_grads(node, outs)
            for value, parent, leaf, g in zip(node.values, node.parents, node.leaves, in_grads):
                if g is None or not isinstance(value, NDArray):
                    continue
                if parent is not None:
                    _accumulate(grads, (id(parent[0]), parent[1]), g)
                elif leaf is not None:
                    _accumulate(leaves, id(leaf), g, leaf)
            if not retain_graph:
                # keep the node (a later backward through it must say why it fails), not
                # the arrays it saved
                node.freed = True
                node.values = node.outputs = ()
        for leaf, g in leaves.values():
            _write_grad(leaf, g)


def _node_grads(node, outs):
    if node.backward_fn is not None:
        return node.backward_fn(outs)
    op = REGISTRY[node.name]
    single = op.num_outputs == 1
    kw = node.attrs
    if _takes_needs(op):  # skip the gradients no input takes (see OpDef.grad)
        kw = dict(kw, needs=tuple(p is not None or leaf is not None
                                  for p, leaf in zip(node.parents, node.leaves)))
    res = op.grad(F, node.values, node.outputs[0] if single else tuple(node.outputs),
                  outs[0] if single else tuple(outs), **kw)
    return list(res)


_TAKES_NEEDS: dict = {}  # op name -> whether its gradient rule takes ``needs``


def _takes_needs(op) -> bool:
    takes = _TAKES_NEEDS.get(op.name)
    if takes is None:
        param = inspect.signature(op.grad).parameters.get("needs")
        takes = _TAKES_NEEDS[op.name] = param is not None and \
            param.kind is inspect.Parameter.KEYWORD_ONLY
    return takes


def _write_grad(leaf: NDArray, g: NDArray):
    if g.shape != leaf.shape:
        raise RuntimeError(f"internal: gradient of shape {g.shape} for an array of shape "
                           f"{leaf.shape}")
    if g._dtype != leaf._grad._dtype:
        g = g.astype(leaf._grad._dtype)
    if leaf._grad_req == "add":
        g = leaf._grad + g
    leaf._grad._buf = g._buf


def grad(heads, variables, head_grads=None, retain_graph=None, create_graph=False,
         train_mode=True):
    """Gradients of heads with respect to variables, returned (not stored in .grad)."""
    if create_graph:
        raise ValueError("create_graph=True (higher-order gradients) is not supported by "
                         "hybrid's autograd; compute first-order gradients only")
    heads = [heads] if isinstance(heads, NDArray) else list(heads)
    single = isinstance(variables, NDArray)
    variables = [variables] if single else list(variables)
    saved = [(v._grad, v._grad_req) for v in variables]
    try:
        for v in variables:
            v._grad = F.full(shape=v.shape, value=0.0, dtype=v._dtype)
            v._grad_req = "write"
        backward(heads, head_grads, retain_graph=bool(retain_graph), train_mode=train_mode)
        out = [v._grad for v in variables]
    finally:
        for v, (g, r) in zip(variables, saved):
            v._grad, v._grad_req = g, r
    return out[0] if single else out
