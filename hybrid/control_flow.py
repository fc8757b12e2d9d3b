"""Control flow over arrays: ``npx.foreach``, ``npx.while_loop`` and ``npx.cond`` with MXNet 2's
signatures and meaning (JAX's ``lax.scan``/``while_loop``/``cond`` are the same ideas).

Eagerly each runs as the Python it stands for (autograd records every op of every step).
Inside a hybridized forward each becomes ONE graph node carrying its body as a sub-graph
(traced once, whatever the number of steps), so a data-dependent branch or a loop of any
length stays one compiled graph: see compiler/control_flow.py for how it is compiled and
differentiated.

One choice departs from MXNet, which made eager and hybridized ``while_loop`` disagree: the
step outputs always have ``max_iterations`` rows, the rows after the last step taken are
zeros, in both modes (hybrid's contract: hybridizing never changes results).
"""
from __future__ import annotations

from . import _state
from .ndarray import NDArray, stack, zeros


def _as_list(v):
    """(list, was_single): MXNet lets data, states and loop variables be one array or a list."""
    if v is None:
        return [], False
    if isinstance(v, NDArray):
        return [v], True
    if isinstance(v, (list, tuple)):
        for a in v:
            if not isinstance(a, NDArray):
                raise TypeError(f"expected hybrid arrays in a list, got {type(a).__name__}; "
                                "wrap NumPy data with hb.array(...)")
        return list(v), False
    raise TypeError(f"expected a hybrid array or a list of them, got {type(v).__name__}")


def _restore(values, single):
    return values[0] if single else list(values)


def _check_body_result(res, who):
    if not (isinstance(res, (list, tuple)) and len(res) == 2):
        raise TypeError(f"{who} must return a pair (outputs, new_states); got "
                        f"{type(res).__name__}")
    return res


def _check_same_types(who, old, new):
    if len(old) != len(new):
        raise ValueError(f"{who} returned {len(new)} state(s) for {len(old)} given; a step "
                         "must return as many states as it takes")
    for i, (a, b) in enumerate(zip(old, new)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"{who}: state {i} changed from {a.dtype}{list(a.shape)} to "
                             f"{b.dtype}{list(b.shape)}; a loop's states keep their shape "
                             "and dtype (cast or reshape inside the body)")


def foreach(body, data, init_states):
    """Run ``body`` over the first axis of ``data``: MXNet's ``npx.foreach``.

    ``body(data_t, states) -> (outputs_t, new_states)``; ``data`` and ``init_states`` are an
    array or a list of arrays, passed to ``body`` in the same form. Returns ``(outputs,
    final_states)``: each step output stacked along a new first axis.
    """
    if _state.tracing():
        from .control_trace import trace_foreach  # noqa: PLC0415
        return trace_foreach(body, data, init_states)
    seqs, data_single = _as_list(data)
    states, states_single = _as_list(init_states)
    if not seqs:
        raise ValueError("foreach needs at least one data array to iterate over")
    length = seqs[0].shape[0] if seqs[0].ndim else None
    for s in seqs:
        if s.ndim == 0 or s.shape[0] != length:
            raise ValueError("foreach: every data array iterates over its first axis, and "
                             f"all must have the same length; got shapes "
                             f"{[tuple(a.shape) for a in seqs]}")
    steps, out_single = [], True
    for t in range(length):
        step = [s[t] for s in seqs]
        out, new = _check_body_result(
            body(_restore(step, data_single), _restore(states, states_single)), "foreach body")
        new_list, _ = _as_list(new)
        _check_same_types("foreach body", states, new_list)
        states = new_list
        outs, out_single = _as_list(out)
        steps.append(outs)
    if not steps:  # zero steps: the outputs' shapes are unknown without running the body
        outs, out_single = _empty_outputs(body, seqs, data_single, states, states_single)
        return _restore(outs, out_single) if outs else [], _restore(states, states_single)
    stacked = [stack([s[k] for s in steps]) for k in range(len(steps[0]))]
    return _restore(stacked, out_single), _restore(states, states_single)


def _empty_outputs(body, seqs, data_single, states, states_single):
    """Zero-length outputs of a zero-step foreach: the body's output types come from one
    traced (never run) step, as a graph would know them."""
    from .control_trace import output_specs  # noqa: PLC0415
    step = [zeros(s.shape[1:], dtype=s.dtype, device=s.device) for s in seqs]
    specs, single = output_specs(
        lambda *a: body(_restore(list(a[:len(step)]), data_single),
                        _restore(list(a[len(step):]), states_single))[0], step + list(states))
    return [zeros((0,) + tuple(shape), dtype=dtype, device=seqs[0].device)
            for shape, dtype in specs], single


def while_loop(cond, func, loop_vars, max_iterations=None):
    """MXNet's ``npx.while_loop``: while ``cond(*loop_vars)`` is true (at most
    ``max_iterations`` times), ``step_outputs, loop_vars = func(*loop_vars)``.

    Returns ``(outputs, final_loop_vars)``; each step output stacked along a new first axis
    of length ``max_iterations``, zeros after the last step taken (in eager and hybridized
    runs alike).
    """
    if max_iterations is None:
        raise ValueError("while_loop needs max_iterations: the bound on the number of steps "
                         "(it sizes the step outputs, and bounds the gradient's work)")
    max_iterations = int(max_iterations)
    if max_iterations < 0:
        raise ValueError(f"max_iterations must be >= 0, got {max_iterations}")
    if _state.tracing():
        from .control_trace import trace_while_loop  # noqa: PLC0415
        return trace_while_loop(cond, func, loop_vars, max_iterations)
    lvars, single = _as_list(loop_vars)
    steps, out_single = [], False
    for _ in range(max_iterations):
        if not _truth(cond(*lvars), "while_loop cond"):
            break
        out, new = _check_body_result(func(*lvars), "while_loop func")
        new_list, _ = _as_list(new)
        _check_same_types("while_loop func", lvars, new_list)
        lvars = new_list
        outs, out_single = _as_list(out)
        steps.append(outs)
    if not steps:
        from .control_trace import output_specs  # noqa: PLC0415
        specs, out_single = output_specs(lambda *a: func(*a)[0], lvars)
        dev = lvars[0].device if lvars else None
        outs = [zeros((max_iterations,) + tuple(s), dtype=d, device=dev) for s, d in specs]
        return _restore(outs, out_single) if outs else [], _restore(lvars, single)
    outs = []
    for k in range(len(steps[0])):
        rows = stack([s[k] for s in steps])
        pad = max_iterations - len(steps)
        if pad:
            from .ndarray import concatenate  # noqa: PLC0415
            rows = concatenate([rows, zeros((pad,) + rows.shape[1:], dtype=rows.dtype,
                                            device=rows.device)])
        outs.append(rows)
    return _restore(outs, out_single), _restore(lvars, single)


def cond(pred, then_func, else_func, inputs=None):
    """MXNet's ``npx.cond``: ``then_func(*inputs)`` if ``pred`` else ``else_func(*inputs)``.

    ``pred`` is a function of ``inputs`` returning a scalar array (MXNet 2), or a scalar array
    itself with functions of no arguments (MXNet 1's ``contrib.cond``). Only the branch taken
    runs, and only it is differentiated. Both branches must return the same structure of
    arrays with the same shapes and dtypes (checked when hybridized, where both are traced).
    """
    args, _ = _as_list(inputs)
    if _state.tracing():
        from .control_trace import trace_cond  # noqa: PLC0415
        return trace_cond(pred, then_func, else_func, args)
    p = pred(*args) if callable(pred) else pred
    branch = then_func if _truth(p, "cond pred") else else_func
    return branch(*args)


def _truth(v, who) -> bool:
    if isinstance(v, NDArray):
        if v.size != 1:
            raise ValueError(f"{who} must give one value (a scalar array); got shape "
                             f"{tuple(v.shape)}")
        return bool(v.asnumpy().reshape(()))
    return bool(v)


__all__ = ["foreach", "while_loop", "cond"]
