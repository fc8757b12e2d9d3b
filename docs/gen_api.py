"""Write docs/api.md: the public names of ``hybrid``, with signatures and first doc lines.

    python docs/gen_api.py

The list of public names is curated here (SECTIONS), so helpers that modules import for
themselves do not show up; signatures and descriptions come from the code, so they stay true.
A name that this checkout does not have is listed as such (modules still being written).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "docs", "api.md")

# (title, module, intro, [names]); a name "Class.method" documents a method
SECTIONS = [
    ("Devices", "hybrid", "`import hybrid as hb`. CPU devices are logical (`cpu(0)`, `cpu(1)` "
     "are separate engine workers, each with its share of the cores); GPUs come from CuPy.",
     ["cpu", "gpu", "num_gpus", "current_device", "parse_device", "Device", "DeviceError"]),
    ("Arrays: creation and synchronization", "hybrid",
     "Every op returns at once; the engine computes. Sync points: `wait_to_read()`, "
     "`waitall()`, and the implicit ones (`asnumpy()`, `item()`, `print`, `np.asarray`, "
     "`bool()`).",
     ["array", "asarray", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
      "full_like", "empty_like", "arange", "linspace", "eye", "waitall", "Benchmark",
      "AsyncOpError", "WaitTimeout"]),
    ("NDArray", "hybrid", "An n-dimensional array on a device, computed asynchronously. "
     "Operators `+ - * / // % ** @`, comparisons, indexing and `x[:] = v` / `x[:] += v` "
     "(engine-ordered in-place writes) work as in NumPy.",
     ["NDArray", "NDArray.shape", "NDArray.dtype", "NDArray.device", "NDArray.ndim",
      "NDArray.size", "NDArray.wait_to_read", "NDArray.asnumpy", "NDArray.item",
      "NDArray.tolist", "NDArray.astype", "NDArray.copy", "NDArray.copyto", "NDArray.to",
      "NDArray.attach_grad", "NDArray.grad", "NDArray.detach", "NDArray.backward",
      "NDArray.reshape", "NDArray.transpose"]),
    ("hybrid.autograd", "hybrid.autograd", "Tape autograd; a hybridized block records one "
     "node whose backward is the compiled backward graph.",
     ["record", "pause", "train_mode", "predict_mode", "is_recording", "is_training",
      "backward", "grad", "mark_variables", "set_recording", "set_training"]),
    ("hybrid.random", "hybrid.random", "Counter-based streams per device: results depend on "
     "the seed only, never on thread timing.",
     ["seed", "uniform", "normal", "randint", "rand", "randn", "multinomial", "permutation",
      "shuffle"]),
    ("hybrid.linalg (the book's np.linalg)", "hybrid.linalg", None, ["norm"]),
    ("hybrid.npx (functional NN ops, MXNet names)", "hybrid.npx",
     "Thin names over the op registry, so they hybridize. Section 12.5's LeNet uses them.",
     ["convolution", "deconvolution", "pooling", "fully_connected", "relu", "sigmoid",
      "activation", "leaky_relu", "silu", "softmax", "log_softmax", "batch_norm", "layer_norm",
      "dropout", "embedding", "one_hot", "pick", "gelu", "batch_dot", "batch_flatten",
      "sequence_mask", "topk", "reshape", "stop_gradient", "save", "load", "set_np",
      "waitall"]),
    ("Control flow: npx.foreach, npx.while_loop, npx.cond", "hybrid.npx",
     "MXNet 2's signatures. Eagerly each runs as the Python it stands for; hybridized, each is "
     "one graph node carrying its bodies as sub-graphs (compiled once, run step by step into "
     "preallocated rows), differentiated (a reverse scan; the branch taken) and exported "
     "(graph.json; ONNX Scan/Loop/If). A Python `if` on a traced value raises a TraceError "
     "naming npx.cond. A random draw inside a hybridized body is refused (draw before the "
     "loop).",
     ["foreach", "while_loop", "cond"]),
    ("gluon.rnn: recurrent layers", "hybrid.gluon.rnn",
     "MXNet's layers, names and gate orders (see [book.md](book.md)); each layer and direction "
     "is one npx.foreach, the input projection of all steps hoisted into one matrix product.",
     ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "SequentialRNNCell",
      "BidirectionalCell", "DropoutCell", "ResidualCell"]),
    ("The book's spellings: hybrid.np, hybrid.gluon, hybrid.context", "hybrid.gluon",
     "`from hybrid import np, npx, gluon, autograd, init` and `import hybrid as mx` run the "
     "book's MXNet code: every name is an alias of hybrid's own (see [book.md](book.md)). "
     "`np.ndarray` is `hb.NDArray`; `mx.context.Context` is `hb.Device`.",
     ["nn", "rnn", "loss", "data", "utils", "Trainer", "Parameter", "Constant",
      "ParameterDict", "Block", "HybridBlock"]),
    ("gluon.utils: hybrid.utils", "hybrid.utils", None,
     ["split_and_load", "split_data", "clip_global_norm", "download", "check_sha1",
      "DownloadError"]),
    ("hybridize, explain", "hybrid", "Tracing into a networkx graph, compiled per input "
     "signature (shapes, dtypes, devices, train/predict mode). A block seeing a second batch "
     "size or sequence length runs a shape bucket's graph on padded inputs where that gives "
     "the same results (hybrid/buckets.py): on the LLVM backend one bucket whose programs "
     "compute the real rows only serves every smaller size (HYBRID_ROW_BOUNDS); elsewhere "
     "power-of-two buckets; a size above the largest bucket (HYBRID_BUCKET_ROWS) runs on "
     "pieces of its rows (`hybridize(static_shape=True)` or HYBRID_BUCKETS=0 compile every "
     "size).",
     ["hybridize", "explain", "TraceError"]),
    ("hybrid.nn: blocks", "hybrid.nn", "Gluon's vocabulary. Parameters are created lazily "
     "(deferred shapes) and initialized with `initialize(init, device=...)`.",
     ["Block", "Block.initialize", "Block.collect_params", "Block.hybridize",
      "Block.save_parameters", "Block.load_parameters", "Block.summary", "Block.cast",
      "Block.zero_grad", "Block.reset_device", "Block.share_parameters",
      "Block.register_forward_hook", "HybridBlock", "HybridBlock.export",
      "HybridBlock.export_onnx", "HybridBlock.infer_shape", "Sequential", "HybridSequential",
      "Concatenate", "HybridConcatenate", "Lambda", "HybridLambda", "Identity"]),
    ("hybrid.nn: layers", "hybrid.nn", None,
     ["Dense", "Conv1D", "Conv2D", "Conv1DTranspose", "Conv2DTranspose", "MaxPool1D",
      "MaxPool2D", "MaxPool3D", "AvgPool1D", "AvgPool2D", "AvgPool3D", "GlobalMaxPool1D",
      "GlobalMaxPool2D", "GlobalMaxPool3D", "GlobalAvgPool1D", "GlobalAvgPool2D",
      "GlobalAvgPool3D", "BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "Dropout",
      "Flatten", "Activation", "LeakyReLU", "PReLU", "ELU", "SELU", "GELU", "SiLU", "Swish",
      "Embedding", "MultiHeadAttention"]),
    ("hybrid.nn: parameters", "hybrid.nn", None,
     ["Parameter", "Parameter.data", "Parameter.list_data", "Parameter.grad",
      "Parameter.list_grad", "Parameter.list_device", "Parameter.set_data",
      "Parameter.initialize", "Parameter.zero_grad", "Parameter.reset_device", "Constant",
      "ParameterDict", "ParameterDict.get", "ParameterDict.get_constant",
      "DeferredInitializationError"]),
    ("hybrid.nn.models (the book's models)", "hybrid.nn.models", None,
     ["mlp", "lenet", "resnet18", "resnet_block", "Residual"]),
    ("hybrid.loss", "hybrid.loss", "Losses return one value per sample; the label is "
     "reshaped like the prediction.",
     ["Loss", "L2Loss", "L1Loss", "SoftmaxCrossEntropyLoss", "SigmoidBinaryCrossEntropyLoss",
      "HuberLoss", "HingeLoss", "LogisticLoss", "KLDivLoss"]),
    ("hybrid.init", "hybrid.init", None,
     ["Initializer", "Uniform", "Normal", "Xavier", "MSRAPrelu", "Constant", "Zero", "One",
      "create", "register"]),
    ("Trainer", "hybrid", None,
     ["Trainer", "Trainer.step", "Trainer.allreduce_grads", "Trainer.update",
      "Trainer.set_learning_rate", "Trainer.save_states", "Trainer.load_states",
      "Trainer.kvstore"]),
    ("hybrid.optimizer", "hybrid.optimizer", None,
     ["Optimizer", "SGD", "NAG", "Adam", "AdamW", "RMSProp", "AdaGrad", "create", "register"]),
    ("hybrid.lr_scheduler", "hybrid.lr_scheduler", None,
     ["LRScheduler", "FactorScheduler", "MultiFactorScheduler", "CosineScheduler",
      "PolyScheduler"]),
    ("hybrid.data", "hybrid.data", None,
     ["Dataset", "SimpleDataset", "ArrayDataset", "DataLoader", "Sampler", "SequentialSampler",
      "RandomSampler", "BatchSampler", "default_batchify_fn", "DataLoaderTimeout",
      "progress"]),
    ("hybrid.data.vision", "hybrid.data.vision", None,
     ["Digits", "FashionMNIST", "MNIST", "read_idx", "IdxFormatError"]),
    ("hybrid.data.transforms", "hybrid.data.transforms", None,
     ["Compose", "ToTensor", "Normalize", "Resize", "Cast", "resize_images"]),
    ("Data parallelism: hybrid.parallel", "hybrid.parallel", "Sections 12.5-12.7. "
     "`hb.split_and_load` and `hb.split_batch` are also at the top level.",
     ["split_data", "split_and_load", "split_batch", "allreduce", "ring_allreduce",
      "get_params", "rank", "num_workers"]),
    ("Key-value stores: hybrid.kv", "hybrid.kv", "Section 12.7: `push` aggregates (a sum), "
     "`pull` fetches.",
     ["create", "registered", "register", "KVStore", "KVStore.init", "KVStore.push",
      "KVStore.pull", "KVStore.pushpull", "KVStore.broadcast", "KVStore.set_optimizer",
      "KVStore.barrier", "KVStore.close", "KVStore.rank", "KVStore.num_workers",
      "DistributedError"]),
    ("Deployment: hybrid.deploy", "hybrid.deploy", "`net.export(path)` and `hb.load(path)`; "
     "the artifact is data (no pickle, no native code) and is re-verified on load.",
     ["export", "load", "Deployed", "Deployed.dynamic_batch", "Deployed.input_specs",
      "Deployed.output_specs", "export_onnx"]),
    ("Checkpoints: hybrid.checkpoint", "hybrid.checkpoint", "`hb.save` and `hb.load_arrays` "
     "are also at the top level.",
     ["save", "load_arrays", "write_safetensors", "read_safetensors", "CheckpointError"]),
    ("hybrid.config", "hybrid.config", "The `HYBRID_*` flags: see [flags.md](flags.md).",
     ["get", "set_flag", "describe", "cache_dir", "log_enabled", "logger", "FLAGS"]),
    ("Launching processes: hybrid.launch", "hybrid.launch",
     "`hybrid launch -n 2 script.py ARGS` (also `python -m hybrid launch ...`): the "
     "arguments after the script go to it untouched; `hybrid launch --help` lists the "
     "options. See [distributed.md](distributed.md).",
     ["launch_main", "find_mpirun", "build_command", "LaunchError"]),
    ("The `hybrid` command: hybrid.cli", "hybrid.cli",
     "`hybrid inspect | run | bench | sysinfo | launch` (installed by `pip install -e .`; "
     "`python -m hybrid` without installing).",
     ["main", "inspect_artifact", "bench_artifact", "sysinfo"]),
]


def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    para = doc.strip().split("\n\n")[0]
    return " ".join(para.split())


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return sig.replace("(self, ", "(").replace("(self)", "()")


def _lookup(module, name):
    obj = module
    for part in name.split("."):
        if isinstance(obj, type) and part in obj.__dict__:
            obj = obj.__dict__[part]
        else:
            obj = getattr(obj, part)
    return obj


def _entry(module, modname, name) -> str:
    try:
        obj = _lookup(module, name)
    except AttributeError:
        return f"- `{name}` -- *not in this checkout*"
    prefix = "hb" if modname == "hybrid" else modname.replace("hybrid.", "hb.", 1)
    if inspect.ismemberdescriptor(obj) or inspect.isgetsetdescriptor(obj):
        return f"- `{prefix}.{name}` (attribute)"
    if isinstance(obj, property):
        return f"- `{prefix}.{name}` (property) -- {_first_paragraph(obj.fget) or ''}".rstrip(" -")
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if inspect.isclass(obj):
        kind = "exception" if issubclass(obj, BaseException) else "class"
        # the signature of the __init__ the class uses, its own or a base class's (LSTMCell
        # takes _TwoActivationCell's); none for object's
        sig = _signature(obj) if obj.__init__ is not object.__init__ else ""
        desc = _first_paragraph(obj)
        return f"- `{prefix}.{name}{sig}` ({kind}) -- {desc}".rstrip(" -")
    if callable(obj):
        return f"- `{prefix}.{name}{_signature(obj)}` -- {_first_paragraph(obj)}".rstrip(" -")
    return f"- `{prefix}.{name}` = `{type(obj).__name__}`"


def render() -> str:
    import hybrid  # noqa: PLC0415
    lines = [
        "# API reference",
        "",
        "<!-- generated by docs/gen_api.py from the code's signatures and docstrings -->",
        "",
        f"hybrid {hybrid.__version__}. `import hybrid as hb`; the book's spelling works "
        "(`hb.np.tanh` is `hb.tanh`, `ctx=` is `device=`; [book.md](book.md)). Environment "
        "flags: "
        "[flags.md](flags.md). The examples of chapter 12: [examples/README.md]"
        "(../examples/README.md).",
        "",
        "NumPy-named array functions at the top level (`hb.<name>`, each an engine op that "
        "also hybridizes): " + ", ".join(f"`{n}`" for n in sorted(
            set(getattr(hybrid.ndarray, "__all__", [])) - {"NDArray", "waitall"})) + ".",
        "",
        "Contents: " + " | ".join(f"[{t}](#{_anchor(t)})" for t, *_ in SECTIONS),
        "",
    ]
    for title, modname, intro, names in SECTIONS:
        lines.append(f"## {title}")
        lines.append("")
        try:
            module = importlib.import_module(modname)
        except ImportError as exc:
            lines += [f"*`{modname}` is not in this checkout ({exc}).*", ""]
            continue
        if intro:
            lines += [intro, ""]
        lines += [_entry(module, modname, n) for n in names]
        lines.append("")
    return "\n".join(lines)


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def main() -> int:
    text = render()
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
