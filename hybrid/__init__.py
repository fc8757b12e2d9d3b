"""hybrid: write models imperatively, hybridize them into compiled graphs.

    import hybrid as hb
    x = hb.array([[1, 2], [3, 4]])
    y = hb.tanh(x @ x.T) + 1        # returns at once; computed on the engine
    print(y)                        # a sync point
"""
from runtime.device import Device, DeviceError, cpu, gpu, num_gpus, current_device, parse_device
from runtime.engine import AsyncOpError, WaitTimeout

from . import _state, autograd, config, npx, random
from .ndarray import *  # noqa: F401,F403 - NumPy-named functions
from .ndarray import NDArray, apply, array, asarray, waitall
from .numpy_ops import *  # noqa: F401,F403 - sort, einsum, arcsin/asin, ... (numpy_ops.py)
from .benchmark import Benchmark

__version__ = "0.1.0"
from . import context, linalg, np  # the book's mx.context, np.linalg and np (hybrid/np.py)
from .tracing import TraceError, explain, hybridize, num_compiles
from . import deploy
from .deploy import load
from . import nn, init, loss, data
from .trainer import Trainer
from . import kv, parallel
from .parallel import split_and_load, split_batch
from .checkpoint import save, load_arrays
from . import gluon  # the book's gluon: the same nn, loss, data, Trainer (hybrid/gluon/)

if config.get("HYBRID_GC_FREEZE"):
    import gc as _gc

    _gc.freeze()  # the import's objects live as long as the process (HYBRID_GC_FREEZE)

if config.get("HYBRID_PRELOAD_LLVM"):
    import importlib.util as _util

    if _util.find_spec("llvmlite") is not None:
        from runtime import native as _native

        _native.prepare()  # llvmlite loads while the script builds its model (a thread)
