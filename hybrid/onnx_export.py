"""ONNX export for interop: the traced predict-mode graph, op by op, as ONNX nodes.

    net.export_onnx("net.onnx", example_inputs=(x,))       # or export_onnx(net, path, (x,))

Needs the optional ``onnx`` package (``pip install onnx``; ``onnxruntime`` to run the file).
Opset 17, fixed shapes (those of the example inputs). Composites such as softmax, log_softmax,
batch norm (predict mode) and layer norm decompose into primitives during tracing, so they
export as the primitives they are made of. An op without a mapping raises
:class:`OnnxExportError` naming the op and the user's source line; nothing is written then.

Type promotion is made explicit: ONNX wants operands of one type where hybrid promotes (an
int array plus a float array, true division of integers), so operands are Cast first.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from compiler.graph import NodeRef
from compiler.ops import REGISTRY, result_dtype
from compiler.ops.control import CONTROL_OPS
from compiler.ops.movement import normalize_slice
from runtime.atomic import write_bytes

OPSET = 17
IR_VERSION = 8  # what opset 17 needs; readable by every onnxruntime since 1.13

_UNARY = {"neg": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "sin": "Sin", "cos": "Cos", "tanh": "Tanh", "sigmoid": "Sigmoid",
          "relu": "Relu", "erf": "Erf", "floor": "Floor", "ceil": "Ceil", "round": "Round"}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
           "maximum": "Max", "minimum": "Min"}
_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
            "ge": "GreaterOrEqual"}
_LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
_REDUCE = {"sum": "ReduceSum", "prod": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin"}


class OnnxExportError(ValueError):
    """The graph cannot be written as ONNX (an op without a mapping, or onnx missing)."""


def _onnx():
    try:
        import onnx  # noqa: PLC0415
        from onnx import helper, numpy_helper  # noqa: PLC0415
    except ImportError:
        raise OnnxExportError("ONNX export needs the optional 'onnx' package: pip install "
                              "onnx (and onnxruntime to run the exported file)") from None
    return onnx, helper, numpy_helper


def supported_ops() -> list:
    """The registry ops this exporter maps to ONNX."""
    extra = ("ne", "logical_not", "copy", "stop_gradient", "cast", "square", "rsqrt", "log1p",
             "expm1", "mod", "floordiv", "where", "clip", "matmul", "reshape", "transpose",
             "broadcast_to", "slice", "concatenate", "argmax", "argmin", "conv2d", "pool2d",
             "take", "pick", "full", "arange", "foreach", "while_loop", "cond", "nth")
    return sorted(set(_UNARY) | set(_BINARY) | set(_COMPARE) | set(_LOGICAL) | set(_REDUCE)
                  | set(extra))


def export_onnx(block, path, example_inputs=None, opset: int = OPSET, check: bool = True):
    """Write ``block`` (a HybridBlock or an ``hb.hybridize``'d function) as an ONNX model.

    ``example_inputs`` fix the input shapes (as for ``export``). ``check`` runs
    ``onnx.checker.check_model`` (with shape inference) before the file is written.
    Returns the path. Inputs are named ``in0, in1, ...`` (flattened like the call's array
    arguments), outputs ``out0, out1, ...``; parameters keep their structured names.
    """
    from .deploy import _predict_entry, _suspended_trace  # noqa: PLC0415
    onnx, helper, _ = _onnx()
    if opset < OPSET:
        raise OnnxExportError(f"ONNX export writes opset {OPSET} or newer, not {opset}")
    entry, _, _ = _predict_entry(block, example_inputs)
    g = entry.graph
    device = entry.signature[1][0][2] if entry.signature[1] else None
    em = _Emitter(g, helper)
    with _suspended_trace():
        for p, nid in zip(entry.params, g.params):
            em.bind_initializer(nid, g.node(nid)["attrs"]["name"], p.data(device).asnumpy())
    inputs = []
    for k, nid in enumerate(g.inputs):
        spec = g.spec(nid)
        name = f"in{k}"
        em.names[nid] = name
        em.types[name] = spec.dtype
        inputs.append(helper.make_tensor_value_info(name, _tt(spec.dtype), list(spec.shape)))
    for nid in g.topo_order():
        op = g.op(nid)
        if op in ("input", "param"):
            continue
        if op == "const":
            name = g.node(nid)["attrs"]["name"]
            em.bind_initializer(nid, f"const.{name}", g.constants[name])
            continue
        em.lower(nid)
    outputs = []
    for k, nid in enumerate(g.outputs[:entry.n_user_out]):
        spec = g.spec(nid)
        name = f"out{k}"
        em.emit("Identity", [em.names[nid]], name)
        outputs.append(helper.make_tensor_value_info(name, _tt(spec.dtype), list(spec.shape)))
    graph = helper.make_graph(em.nodes, g.name or "hybrid", inputs, outputs, em.initializers)
    model = helper.make_model(graph, producer_name="hybrid", producer_version=_version(),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    if check:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:  # noqa: BLE001 - the checker's own error types
            raise OnnxExportError(f"ONNX export: the model fails onnx.checker: {exc}") from None
    write_bytes(Path(path), model.SerializeToString())
    return path


def _version():
    from .deploy import PRODUCER  # noqa: PLC0415
    return PRODUCER.split()[-1]


def _tt(dtype: str) -> int:
    from onnx import helper  # noqa: PLC0415
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else tuple(int(a) for a in v)


def _axes(axis, ndim):
    if axis is None:
        return list(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return sorted(int(a) % max(ndim, 1) for a in axes)


def _c_order(value) -> np.ndarray:
    """A C-ordered copy that keeps a 0-d array 0-d (np.ascontiguousarray makes it 1-d, and a
    scalar initializer of shape [1] makes ONNX shape inference disagree with the graph)."""
    return np.array(value, order="C")


def _like(dtype):
    """A stand-in array of ``dtype`` for result_dtype (which looks at .shape/.dtype)."""
    return np.empty((), dtype=dtype)


class _Emitter:
    def __init__(self, graph, helper, outer=None, nodes=None, initializers=None):
        """``outer``: the emitter of the enclosing graph (a control-flow body's ONNX graph is
        a subgraph: fresh names stay unique across all scopes, and outer values keep their
        types); ``nodes``/``initializers``: lists to emit into (a body inlined into the
        enclosing scope shares them)."""
        self.g = graph
        self.h = helper
        self.nodes: list = [] if nodes is None else nodes
        self.initializers: list = [] if initializers is None else initializers
        self.names: dict = {}  # graph node id -> ONNX value name
        self.types: dict = {} if outer is None else dict(outer.types)
        self.results: dict = {}  # control node -> its results' ONNX names (None: not written)
        self._counter = [0] if outer is None else outer._counter
        self._scoped = outer is not None

    # ------------------------------------------------------------ building blocks
    def fresh(self, hint="t") -> str:
        self._counter[0] += 1
        return f"{hint}_{self._counter[0]}"

    def emit(self, op_type, inputs, output=None, dtype=None, **attrs) -> str:
        output = output or self.fresh(op_type.lower())
        self.nodes.append(self.h.make_node(op_type, list(inputs), [output],
                                           name=f"{op_type}_{len(self.nodes)}", **attrs))
        if dtype is not None:
            self.types[output] = dtype
        elif inputs and inputs[0] in self.types:
            self.types[output] = self.types[inputs[0]]
        return output

    def initializer(self, value: np.ndarray, hint="c") -> str:
        from onnx import numpy_helper  # noqa: PLC0415
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(_c_order(value), name))
        self.types[name] = np.asarray(value).dtype.name
        return name

    def bind_initializer(self, nid, name, value):
        from onnx import numpy_helper  # noqa: PLC0415
        if name in self.types or self._scoped:  # a body's constant: unique in every scope
            name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(_c_order(value), name))
        self.names[nid] = name
        self.types[name] = np.asarray(value).dtype.name

    def ints(self, values) -> str:
        return self.initializer(np.asarray(list(values), dtype=np.int64), "ints")

    def cast(self, name, dtype) -> str:
        if self.types.get(name) == dtype:
            return name
        return self.emit("Cast", [name], dtype=dtype, to=_tt(dtype))

    def operand(self, arg, dtype) -> str:
        """An argument (a graph value or a Python scalar) as an ONNX value of ``dtype``."""
        if isinstance(arg, NodeRef):
            return self.cast(self.names[arg.id], dtype)
        return self.initializer(np.asarray(arg, dtype=dtype), "scalar")

    # ------------------------------------------------------------ one graph node
    def lower(self, nid):
        g = self.g
        op, spec, attrs = g.op(nid), g.spec(nid), dict(g.node(nid)["attrs"])
        args = g.args(nid)
        fn = getattr(self, f"_op_{op}", None)
        if op in CONTROL_OPS:  # several results, read by nth nodes
            self.results[nid] = fn(args, **attrs)
            return
        if op == "nth":
            name = self.results[args[0].id][attrs["index"]]
            if name is None:
                raise OnnxExportError(f"ONNX export: result {attrs['index']} of a "
                                      f"{g.op(args[0].id)} (node %{args[0].id}) is only kept "
                                      "for training and has no ONNX form")
            self.names[nid] = name
            return
        if op in _UNARY:
            out = self._unary(op, args[0], spec)
        elif op in _BINARY:
            out = self.emit(_BINARY[op], [self.operand(a, spec.dtype) for a in args])
        elif op in _COMPARE or op == "ne":
            dt = result_dtype(*[_like(g.spec(a.id).dtype) if isinstance(a, NodeRef) else a
                                for a in args])
            xs = [self.operand(a, dt) for a in args]
            out = self.emit(_COMPARE.get(op, "Equal"), xs, dtype="bool")
            if op == "ne":
                out = self.emit("Not", [out], dtype="bool")
        elif op in _LOGICAL:
            out = self.emit(_LOGICAL[op], [self.operand(a, "bool") for a in args])
        elif op in _REDUCE:
            out = self._reduce(op, args[0], spec, **attrs)
        elif fn is not None:
            out = fn(args, spec, **attrs)
        else:
            where = g.node(nid).get("where")
            loc = f" (at {where[0]}:{where[1]})" if where and len(where) >= 2 else ""
            kind = REGISTRY[op].kind if op in REGISTRY else "unknown"
            raise OnnxExportError(f"ONNX export: op {op!r} ({kind}, node %{nid}){loc} has no "
                                  f"ONNX mapping; supported ops: {', '.join(supported_ops())}")
        out = self.cast(out, spec.dtype)
        self.names[nid] = out

    def _unary(self, op, x, spec):
        dt = spec.dtype
        if op in ("floor", "ceil", "round") and not dt.startswith("float"):
            return self.emit("Identity", [self.operand(x, dt)])
        if op == "relu" and dt in ("uint8", "bool"):
            return self.emit("Identity", [self.operand(x, dt)])
        return self.emit(_UNARY[op], [self.operand(x, dt)])

    # ------------------------------------------------------------ elementwise extras
    def _op_copy(self, args, spec):
        return self.emit("Identity", [self.operand(args[0], spec.dtype)])

    _op_stop_gradient = _op_copy

    def _op_cast(self, args, spec, dtype):
        x = args[0]
        src = self.names[x.id] if isinstance(x, NodeRef) else self.operand(x, spec.dtype)
        return self.emit("Identity", [src]) if self.types.get(src) == spec.dtype else \
            self.emit("Cast", [src], dtype=spec.dtype, to=_tt(spec.dtype))

    def _op_logical_not(self, args, spec):
        return self.emit("Not", [self.operand(args[0], "bool")])

    def _op_square(self, args, spec):
        x = self.operand(args[0], spec.dtype)
        return self.emit("Mul", [x, x])

    def _op_rsqrt(self, args, spec):
        return self.emit("Reciprocal", [self.emit("Sqrt", [self.operand(args[0], spec.dtype)])])

    def _op_log1p(self, args, spec):
        x = self.operand(args[0], spec.dtype)
        one = self.initializer(np.asarray(1, dtype=spec.dtype))
        return self.emit("Log", [self.emit("Add", [x, one])])

    def _op_expm1(self, args, spec):
        x = self.operand(args[0], spec.dtype)
        one = self.initializer(np.asarray(1, dtype=spec.dtype))
        return self.emit("Sub", [self.emit("Exp", [x]), one])

    def _op_mod(self, args, spec):
        x, y = (self.operand(a, spec.dtype) for a in args)
        if not spec.dtype.startswith("float"):
            return self.emit("Mod", [x, y], fmod=0)  # the sign of the divisor, as NumPy
        return self.emit("Sub", [x, self.emit("Mul", [self.emit("Floor", [
            self.emit("Div", [x, y])]), y])])

    def _op_floordiv(self, args, spec):
        x, y = (self.operand(a, spec.dtype) for a in args)
        if spec.dtype.startswith("float"):
            return self.emit("Floor", [self.emit("Div", [x, y])])
        exact = self.emit("Sub", [x, self.emit("Mod", [x, y], fmod=0)])
        return self.emit("Div", [exact, y])  # exact division: truncation is floor here

    def _op_where(self, args, spec):
        c = self.operand(args[0], "bool")
        return self.emit("Where", [c, self.operand(args[1], spec.dtype),
                                   self.operand(args[2], spec.dtype)], dtype=spec.dtype)

    def _op_clip(self, args, spec, a_min=None, a_max=None):
        x = self.operand(args[0], spec.dtype)
        lo = "" if a_min is None else self.initializer(np.asarray(a_min, dtype=spec.dtype))
        hi = "" if a_max is None else self.initializer(np.asarray(a_max, dtype=spec.dtype))
        if a_min is not None and a_max is not None and a_min > a_max:  # NumPy: a_max wins
            return self.emit("Min", [self.emit("Max", [x, lo]), hi])
        return self.emit("Clip", [x, lo, hi])

    def _op_matmul(self, args, spec):
        return self.emit("MatMul", [self.operand(a, spec.dtype) for a in args])

    # ------------------------------------------------------------ movement
    def _op_reshape(self, args, spec, shape):
        return self.emit("Reshape", [self.operand(args[0], spec.dtype), self.ints(spec.shape)])

    def _op_transpose(self, args, spec, axes=None):
        nd = len(spec.shape)
        perm = list(reversed(range(nd))) if axes is None else [int(a) % max(nd, 1)
                                                               for a in axes]
        return self.emit("Transpose", [self.operand(args[0], spec.dtype)], perm=perm)

    def _op_broadcast_to(self, args, spec, shape):
        return self.emit("Expand", [self.operand(args[0], spec.dtype), self.ints(spec.shape)])

    def _op_slice(self, args, spec, begin, end, step):
        x = args[0]
        shape = self.g.spec(x.id).shape
        b, e, s = normalize_slice(shape, begin, end, step)
        e = [-(1 << 63) if ei < 0 and si < 0 else ei for ei, si in zip(e, s)]
        return self.emit("Slice", [self.operand(x, spec.dtype), self.ints(b), self.ints(e),
                                   self.ints(range(len(shape))), self.ints(s)])

    def _op_concatenate(self, args, spec, axis=0):
        nd = len(spec.shape)
        return self.emit("Concat", [self.operand(a, spec.dtype) for a in args],
                         axis=int(axis) % nd)

    # ------------------------------------------------------------ reductions
    def _reduce(self, op, x, spec, axis=None, keepdims=False):
        nd = len(self.g.spec(x.id).shape)
        axes = _axes(axis, nd)
        src = self.operand(x, spec.dtype)  # sum of small ints accumulates in int64
        if not axes:
            return self.emit("Identity", [src])
        if op == "sum":  # opset 13+: axes as an input
            return self.emit("ReduceSum", [src, self.ints(axes)], keepdims=int(bool(keepdims)))
        return self.emit(_REDUCE[op], [src], axes=axes, keepdims=int(bool(keepdims)))

    def _arg(self, onnx_op, args, spec, axis=None, keepdims=False):
        x = args[0]
        xs = self.g.spec(x.id)
        src = self.names[x.id]
        if xs.dtype == "bool":
            src = self.cast(src, "int32")
        if axis is None:
            flat = self.emit("Reshape", [src, self.ints([-1])])
            out = self.emit(onnx_op, [flat], dtype="int64", axis=0, keepdims=0)
            return self.emit("Reshape", [out, self.ints(spec.shape)]) if keepdims else out
        return self.emit(onnx_op, [src], dtype="int64", axis=int(axis) % len(xs.shape),
                         keepdims=int(bool(keepdims)))

    def _op_argmax(self, args, spec, **attrs):
        return self._arg("ArgMax", args, spec, **attrs)

    def _op_argmin(self, args, spec, **attrs):
        return self._arg("ArgMin", args, spec, **attrs)

    # ------------------------------------------------------------ nn
    def _op_conv2d(self, args, spec, stride=1, pad=0, dilation=1, groups=1):
        p = _pair(pad)
        return self.emit("Conv", [self.operand(a, spec.dtype) for a in args],
                         strides=list(_pair(stride)), pads=[p[0], p[1], p[0], p[1]],
                         dilations=list(_pair(dilation)), group=int(groups))

    def _op_pool2d(self, args, spec, pool_type="max", kernel=2, stride=None, pad=0,
                   global_pool=False, count_include_pad=True):
        x = self.operand(args[0], spec.dtype)
        if global_pool:
            return self.emit("GlobalMaxPool" if pool_type == "max" else "GlobalAveragePool",
                             [x])
        k = _pair(kernel)
        s = _pair(kernel if stride is None else stride)
        p = _pair(pad)
        common = dict(kernel_shape=list(k), strides=list(s), pads=[p[0], p[1], p[0], p[1]])
        if pool_type == "max":
            return self.emit("MaxPool", [x], **common)
        return self.emit("AveragePool", [x], count_include_pad=int(bool(count_include_pad)),
                         **common)

    # ------------------------------------------------------------ gathers
    def _op_take(self, args, spec, axis=0, mode="clip"):
        x, idx = args
        xs = self.g.spec(x.id)
        ax = int(axis) % len(xs.shape)
        dim = xs.shape[ax]
        i = self.cast(self.names[idx.id], "int64")
        if mode == "wrap":
            i = self.emit("Mod", [i, self.ints([dim])], fmod=0)
        elif mode == "clip":
            i = self.emit("Clip", [i, self.initializer(np.asarray(0, np.int64)),
                                   self.initializer(np.asarray(dim - 1, np.int64))])
        return self.emit("Gather", [self.operand(x, spec.dtype), i], axis=ax)

    def _op_pick(self, args, spec, axis=-1, keepdims=False):
        x, idx = args
        xs = self.g.spec(x.id)
        ax = int(axis) % len(xs.shape)
        kshape = list(xs.shape[:ax]) + [1] + list(xs.shape[ax + 1:])
        i = self.cast(self.names[idx.id], "int64")
        i = self.emit("Clip", [i, self.initializer(np.asarray(0, np.int64)),
                               self.initializer(np.asarray(xs.shape[ax] - 1, np.int64))])
        i = self.emit("Reshape", [i, self.ints(kshape)])
        out = self.emit("GatherElements", [self.operand(x, spec.dtype), i], axis=ax)
        return self.emit("Reshape", [out, self.ints(spec.shape)])

    # ------------------------------------------------------------ sources
    def _source(self, op, spec, attrs):
        value = np.asarray(REGISTRY[op].impl(np, **attrs)).astype(spec.dtype)
        return self.emit("Identity", [self.initializer(value.reshape(spec.shape))])

    def _op_full(self, args, spec, **attrs):
        return self._source("full", spec, attrs)

    def _op_arange(self, args, spec, **attrs):
        return self._source("arange", spec, attrs)

    # ------------------------------------------------------------ control flow
    def _body_values(self, graph, bound: dict) -> "_Emitter":
        """Lower ``graph`` (a body) into this scope; ``bound``: its input node -> the ONNX
        name it reads. Returns the emitter holding the names of its values."""
        sub = _Emitter(graph, self.h, outer=self, nodes=self.nodes,
                       initializers=self.initializers)
        sub.names.update(bound)
        for nid in graph.topo_order():
            op = graph.op(nid)
            if op == "input":
                continue
            if op == "const":
                name = graph.node(nid)["attrs"]["name"]
                sub.bind_initializer(nid, f"const.{name}", graph.constants[name])
                continue
            sub.lower(nid)
        return sub

    def _subgraph(self, graph, inputs: list, bound: dict, outputs, hint):
        """An ONNX GraphProto of body ``graph``: ``inputs`` its formal inputs (body nodes, in
        ONNX order), ``bound`` the rest of its inputs (outer names), ``outputs`` a function of
        the lowered body's emitter giving [(ONNX name, dtype, shape)]."""
        h = self.h
        scope = _Emitter(graph, h, outer=self)
        formal = []
        for nid in inputs:
            spec = graph.spec(nid)
            name = scope.fresh(f"{hint}_in")
            bound = {**bound, nid: name}
            scope.types[name] = spec.dtype
            formal.append(h.make_tensor_value_info(name, _tt(spec.dtype), list(spec.shape)))
        sub = scope._body_values(graph, bound)
        outs = []
        for name, dtype, shape in outputs(sub):
            out = scope.emit("Identity", [sub.cast(name, dtype)], scope.fresh(f"{hint}_out"),
                             dtype=dtype)
            outs.append(h.make_tensor_value_info(out, _tt(dtype), list(shape)))
        return h.make_graph(scope.nodes, hint, formal, outs, scope.initializers)

    def _names(self, args):
        return [self.names[a.id] for a in args]

    def _op_foreach(self, args, body, n_data, n_states, reverse=False, counted=False,
                    **saved):
        if counted or saved.get("vjp") is not None:
            raise OnnxExportError("ONNX export: a training graph's foreach has no ONNX form "
                                  "(export writes the predict graph)")
        bg = body.graph
        seqs, states, caps = args[:n_data], args[n_data:n_data + n_states], \
            args[n_data + n_states:]
        n_out = len(bg.outputs) - n_states
        ins = bg.inputs
        bound = {nid: self.names[a.id] for nid, a in zip(ins[n_data + n_states:], caps)}

        def outputs(sub):  # ONNX Scan: new states first, then the step outputs
            order = bg.outputs[n_out:] + bg.outputs[:n_out]
            return [(sub.names[o], bg.spec(o).dtype, bg.spec(o).shape) for o in order]
        graph = self._subgraph(bg, ins[n_data:n_data + n_states] + ins[:n_data], bound,
                               outputs, "scan_body")
        finals = [self.fresh("scan_state") for _ in range(n_states)]
        stacked = [self.fresh("scan_out") for _ in range(n_out)]
        direction = [1 if reverse else 0]
        self.nodes.append(self.h.make_node(
            "Scan", self._names(states) + self._names(seqs), finals + stacked,
            name=f"Scan_{len(self.nodes)}", body=graph, num_scan_inputs=n_data,
            scan_input_directions=direction * n_data,
            scan_output_directions=direction * n_out))
        for name, o in zip(stacked, bg.outputs[:n_out]):
            self.types[name] = bg.spec(o).dtype
        for name, a in zip(finals, states):
            self.types[name] = self.g.spec(a.id).dtype
        return stacked + finals + [None] * n_states

    def _op_while_loop(self, args, cond, func, n_vars, max_iterations):
        cg, fg = cond.graph, func.graph
        lvars, caps = args[:n_vars], args[n_vars:]
        n_out = len(fg.outputs) - n_vars
        cap_names = [self.names[a.id] for a in caps]

        def pred(emitter, graph, var_names):  # cond's value on var_names, a bool scalar
            bound = dict(zip(graph.inputs, var_names + cap_names))
            sub = emitter._body_values(graph, bound)
            p = sub.cast(sub.names[graph.outputs[0]], "bool")
            return emitter.emit("Reshape", [p, emitter.ints([])], dtype="bool")
        first = pred(self, cg, self._names(lvars))
        # the Loop body: (iteration, condition, steps taken, vars...) -> (condition for the
        # next iteration, steps + 1, new vars..., step outputs...)
        h = self.h
        scope = _Emitter(fg, h, outer=self)
        it, cond_in, count_in = (scope.fresh(n) for n in ("iter", "cond_in", "count_in"))
        formal = [h.make_tensor_value_info(it, _tt("int64"), []),
                  h.make_tensor_value_info(cond_in, _tt("bool"), []),
                  h.make_tensor_value_info(count_in, _tt("int64"), [])]
        var_names = []
        for a in lvars:
            spec = self.g.spec(a.id)
            name = scope.fresh("var_in")
            scope.types[name] = spec.dtype
            var_names.append(name)
            formal.append(h.make_tensor_value_info(name, _tt(spec.dtype), list(spec.shape)))
        sub = scope._body_values(fg, dict(zip(fg.inputs, var_names + cap_names)))
        new_vars = [sub.names[o] for o in fg.outputs[n_out:]]
        nxt = pred(scope, cg, new_vars)
        count = scope.emit("Add", [count_in, scope.ints([1])], dtype="int64")
        count = scope.emit("Reshape", [count, scope.ints([])], dtype="int64")
        outs = [(nxt, "bool", []), (count, "int64", [])] + [
            (sub.names[o], fg.spec(o).dtype, fg.spec(o).shape) for o in fg.outputs[n_out:]] + [
            (sub.names[o], fg.spec(o).dtype, fg.spec(o).shape) for o in fg.outputs[:n_out]]
        out_info = []
        for name, dtype, shape in outs:
            o = scope.emit("Identity", [sub.cast(name, dtype)], scope.fresh("loop_out"),
                           dtype=dtype)
            out_info.append(h.make_tensor_value_info(o, _tt(dtype), list(shape)))
        body = h.make_graph(scope.nodes, "loop_body", formal, out_info, scope.initializers)
        steps = self.fresh("loop_steps")
        finals = [self.fresh("loop_var") for _ in range(n_vars)]
        rows = [self.fresh("loop_rows") for _ in range(n_out)]
        zero = self.initializer(np.asarray(0, dtype=np.int64), "zero")
        trip = self.initializer(np.asarray(max_iterations, dtype=np.int64), "max_iterations")
        self.nodes.append(h.make_node("Loop", [trip, first, zero] + self._names(lvars),
                                      [steps] + finals + rows, name=f"Loop_{len(self.nodes)}",
                                      body=body))
        self.types[steps] = "int64"
        for name, a in zip(finals, lvars):
            self.types[name] = self.g.spec(a.id).dtype
        padded = []  # rows after the last step taken are zeros, max_iterations in all
        for name, o in zip(rows, fg.outputs[:n_out]):
            spec = fg.spec(o)
            self.types[name] = spec.dtype
            short = self.emit("Sub", [trip, steps], dtype="int64")
            pads = self.emit("Concat", [self.ints([0] * (spec.ndim + 1)),
                                        self.emit("Reshape", [short, self.ints([1])]),
                                        self.ints([0] * spec.ndim)], dtype="int64", axis=0)
            padded.append(self.emit("Pad", [name, pads], dtype=spec.dtype))
        return padded + finals + [steps] + [None] * n_vars

    def _op_cond(self, args, then_body, else_body):
        p = self.cast(self.names[args[0].id], "bool")
        p = self.emit("Reshape", [p, self.ints([])], dtype="bool")
        operands = self._names(args[1:])
        branches = []
        for b, hint in ((then_body, "then"), (else_body, "else")):
            bg = b.graph
            branches.append(self._subgraph(
                bg, [], dict(zip(bg.inputs, operands)),
                lambda sub, bg=bg: [(sub.names[o], bg.spec(o).dtype, bg.spec(o).shape)
                                    for o in bg.outputs], f"{hint}_branch"))
        outs = [self.fresh("if_out") for _ in then_body.graph.outputs]
        self.nodes.append(self.h.make_node("If", [p], outs, name=f"If_{len(self.nodes)}",
                                           then_branch=branches[0], else_branch=branches[1]))
        for name, o in zip(outs, then_body.graph.outputs):
            self.types[name] = then_body.graph.spec(o).dtype
        return outs
