"""``gluon.rnn`` (the book's ``from mxnet.gluon import rnn``): the recurrent layers ``RNN``,
``LSTM``, ``GRU`` and the cells ``RNNCell``, ``LSTMCell``, ``GRUCell``, ``SequentialRNNCell``,
``BidirectionalCell``, ``DropoutCell``, ``ResidualCell``. The same classes as
hybrid.nn.rnn_layers / hybrid.nn.rnn_cells, never copies; their module docstrings write down
the equations and gate orders.
"""
from ..nn.rnn_cells import (
    BidirectionalCell,
    DropoutCell,
    GRUCell,
    HybridRecurrentCell,
    HybridSequentialRNNCell,
    LSTMCell,
    RecurrentCell,
    ResidualCell,
    RNNCell,
    SequentialRNNCell,
)
from ..nn.rnn_layers import GRU, LSTM, RNN

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "BidirectionalCell",
    "DropoutCell",
    "GRUCell",
    "HybridRecurrentCell",
    "HybridSequentialRNNCell",
    "LSTMCell",
    "RNNCell",
    "RecurrentCell",
    "ResidualCell",
    "SequentialRNNCell",
]
