"""``gluon.rnn`` (the book's ``from mxnet.gluon import rnn``): the recurrent layers ``RNN``,
``LSTM``, ``GRU`` and the cells ``RNNCell``, ``LSTMCell``, ``GRUCell``,
``SequentialRNNCell``. The same classes as hybrid.nn.rnn_layers / hybrid.nn.rnn_cells,
never copies; their module docstrings write down the equations and gate orders.
"""
from ..nn.rnn_cells import (
    GRUCell,
    HybridRecurrentCell,
    HybridSequentialRNNCell,
    LSTMCell,
    RecurrentCell,
    RNNCell,
    SequentialRNNCell,
)
from ..nn.rnn_layers import GRU, LSTM, RNN

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "GRUCell",
    "HybridRecurrentCell",
    "HybridSequentialRNNCell",
    "LSTMCell",
    "RNNCell",
    "RecurrentCell",
    "SequentialRNNCell",
]
