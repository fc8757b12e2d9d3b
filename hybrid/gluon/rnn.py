"""``gluon.rnn`` (the book's ``from mxnet.gluon import rnn``): the recurrent layers ``RNN``,
``LSTM``, ``GRU`` and the cells ``RNNCell``, ``LSTMCell``, ``GRUCell``, ``SequentialRNNCell``,
``BidirectionalCell``, ``DropoutCell``, ``ResidualCell``. The same classes as
hybrid.nn.rnn_layers / hybrid.nn.rnn_cells, never copies; their module docstrings write down
the equations and gate orders.
"""
from ..nn import rnn_cells as _cells
from ..nn.rnn_cells import *  # noqa: F403 - the cells, listed in rnn_cells.__all__
from ..nn.rnn_layers import GRU, LSTM, RNN

__all__ = ["GRU", "LSTM", "RNN"] + _cells.__all__
