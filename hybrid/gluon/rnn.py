"""``gluon.rnn``: Gluon's recurrent layers (``RNN``, ``LSTM``, ``GRU`` and their cells).

Not in hybrid yet: they come with the recurrent-networks work (issue 22), which fills this
module. Until then it imports, so the book's import lines run, and asking it for a layer
raises an AttributeError that says what to write instead, never a stand-in layer.
"""

__all__: list = []


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"gluon.rnn.{name} is not available in hybrid yet: the recurrent layers (RNN, LSTM, "
        "GRU and their cells) are still to come. Write the recurrence from scratch as the "
        "book's 'from scratch' sections do: a loop over time steps with np.dot, np.tanh and "
        "npx.sigmoid on parameters you create (gluon.Parameter, or nn.Dense layers)")
