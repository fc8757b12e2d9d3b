"""The book's ``gluon`` (``from hybrid import gluon``): Gluon's names for what hybrid has,
each the same object as hybrid's own, never a copy.

    gluon.nn is hybrid.nn          gluon.loss is hybrid.loss      gluon.data is hybrid.data
    gluon.utils is hybrid.utils    gluon.Trainer is hybrid.Trainer
    gluon.rnn: RNN, LSTM, GRU and their cells (hybrid/nn/rnn_layers.py, rnn_cells.py)
"""
import sys as _sys

from .. import data, loss, nn, utils
from ..nn import Block, Constant, HybridBlock, Parameter, ParameterDict
from ..trainer import Trainer
from . import rnn

__all__ = ["nn", "rnn", "loss", "data", "utils", "Trainer", "Parameter", "Constant",
           "ParameterDict", "Block", "HybridBlock"]

# `import hybrid.gluon.nn` and `from hybrid.gluon.data.vision import transforms` (the book's
# `from mxnet.gluon...` lines) find the same modules under their Gluon names
for _name, _module in (("nn", nn), ("loss", loss), ("data", data), ("utils", utils),
                       ("data.vision", data.vision)):
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module
