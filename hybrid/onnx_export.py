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
             "take", "pick", "full", "arange")
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


def _like(dtype):
    """A stand-in array of ``dtype`` for result_dtype (which looks at .shape/.dtype)."""
    return np.empty((), dtype=dtype)


class _Emitter:
    def __init__(self, graph, helper):
        self.g = graph
        self.h = helper
        self.nodes: list = []
        self.initializers: list = []
        self.names: dict = {}  # graph node id -> ONNX value name
        self.types: dict = {}  # ONNX value name -> dtype name
        self._n = 0

    # ------------------------------------------------------------ building blocks
    def fresh(self, hint="t") -> str:
        self._n += 1
        return f"{hint}_{self._n}"

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
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        self.types[name] = np.asarray(value).dtype.name
        return name

    def bind_initializer(self, nid, name, value):
        from onnx import numpy_helper  # noqa: PLC0415
        if name in self.types:
            name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
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
