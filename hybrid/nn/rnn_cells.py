"""Gluon's recurrent cells: ``RNNCell``, ``LSTMCell``, ``GRUCell`` and ``SequentialRNNCell``.

A cell computes ONE time step: ``output, new_states = cell(x_t, states)``, with x_t of shape
(N, C) and each state (N, hidden). ``unroll`` runs it over a sequence through
``npx.foreach``, so an unrolled cell hybridizes into one loop node whatever the length.

The step equations (MXNet's, gate order included; W_i*: i2h_weight rows, W_h*: h2h_weight
rows, each block ``hidden_size`` rows in the order listed; b the matching bias rows):

    RNN   h' = act(W_i x + b_i + W_h h + b_h)                act: 'tanh' (cell default) or 'relu'
    LSTM  gates [i, f, c(g), o]:
          i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)
          f = sigmoid(W_if x + b_if + W_hf h + b_hf)
          g = tanh(W_ig x + b_ig + W_hg h + b_hg)
          o = sigmoid(W_io x + b_io + W_ho h + b_ho)
          c' = f * c + i * g          h' = o * tanh(c')       states [h, c]
    GRU   gates [r, z, n]:
          r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
          z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
          n = tanh(W_in x + b_in + r * (W_hn h + b_hn))     (b_hn inside the product, as MXNet)
          h' = (1 - z) * n + z * h

The layers (rnn_layers.py) use the same step functions, with the input projection of all
time steps hoisted out of the loop.
"""
from __future__ import annotations

from .. import npx
from ..control_flow import foreach
from ..ndarray import (
    NDArray,
    concatenate,
    matmul,
    split,
    stack,
    swapaxes,
    transpose,
    zeros,
)
from .block import HybridBlock
from .layers import _dev, _float_input
from .parameter import Parameter

__all__ = [
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


# ----------------------------------------------------------------- step functions
def rnn_step(gi, h, whT, bh, act="tanh"):
    """One plain RNN step from the projected input ``gi`` (N, H). ``bh`` may be None when the
    caller has folded it into gi (the layers do: the two biases only ever add)."""
    g = gi + matmul(h, whT)
    if bh is not None:
        g = g + bh
    return npx.activation(g, act_type=act)


def lstm_step(gi, h, c, whT, bh, act="tanh", rec_act="sigmoid"):
    """One LSTM step from the projected input ``gi`` (N, 4H); returns (h', c')."""
    g = gi + matmul(h, whT)
    if bh is not None:
        g = g + bh
    i, f, cand, o = split(g, 4, axis=-1)
    i = npx.activation(i, act_type=rec_act)
    f = npx.activation(f, act_type=rec_act)
    cand = npx.activation(cand, act_type=act)
    o = npx.activation(o, act_type=rec_act)
    c2 = f * c + i * cand
    return o * npx.activation(c2, act_type=act), c2


def gru_step(gi, h, whT, bh, act="tanh", rec_act="sigmoid"):
    """One GRU step from the projected input ``gi`` (N, 3H, i2h bias included). The h2h bias
    stays separate: its n block is multiplied by r."""
    gh = matmul(h, whT) + bh
    ir, iz, i_n = split(gi, 3, axis=-1)
    hr, hz, h_n = split(gh, 3, axis=-1)
    r = npx.activation(ir + hr, act_type=rec_act)
    z = npx.activation(iz + hz, act_type=rec_act)
    n = npx.activation(i_n + r * h_n, act_type=act)
    return n + z * (h - n)  # (1 - z) * n + z * h, one op fewer


def check_act(who, act, allowed=None):
    allowed = allowed or npx.ACT_TYPES
    if act not in allowed:
        raise ValueError(f"{who}: activation must be one of {list(allowed)}, got {act!r}")
    return act


def make_begin_state(block, batch_size, func, kwargs):
    """MXNet's ``begin_state``: ``func(shape=..., dtype=..., **kwargs)`` for each entry of
    ``block.state_info(batch_size)``; the dtype defaults to the block's."""
    func = zeros if func is None else func
    states = []
    for info in block.state_info(batch_size):
        args = {"shape": info["shape"], "dtype": info["dtype"]}
        args.update(kwargs)
        states.append(func(**args))
    return states


def as_state_list(states, who) -> list:
    if isinstance(states, NDArray):
        return [states]
    if isinstance(states, (list, tuple)) and all(isinstance(s, NDArray) for s in states):
        return list(states)
    raise TypeError(f"{who}: states must be an array or a list of arrays, got "
                    f"{type(states).__name__}")


def check_states(who, states, infos):
    """Refuse a wrong number of states or a state of the wrong shape, naming it."""
    if len(states) != len(infos):
        raise ValueError(f"{who}: expected {len(infos)} state(s) "
                         f"({', '.join(str(i['shape']) for i in infos)}), got {len(states)}")
    for k, (s, info) in enumerate(zip(states, infos)):
        if tuple(s.shape) != tuple(info["shape"]):
            raise ValueError(f"{who}: state {k} has shape {tuple(s.shape)}, expected "
                             f"{tuple(info['shape'])} (layout {info['__layout__']})")
        if s._dtype != info["dtype"]:  # a loop's states keep one dtype: say which, here
            raise TypeError(f"{who}: state {k} has dtype {s._dtype}, but the parameters are "
                            f"{info['dtype']}; cast it: state.astype('{info['dtype']}')")


# ----------------------------------------------------------------- cells
class RecurrentCell(HybridBlock):
    """The base of recurrent cells (MXNet's ``HybridRecurrentCell``): ``forward(inputs,
    states) -> (output, new_states)`` for one step; ``unroll`` for a sequence."""

    def state_info(self, batch_size=0):
        raise NotImplementedError(f"{type(self).__name__} must implement state_info(): the "
                                  "shape and layout of each state")

    def begin_state(self, batch_size=0, func=None, **kwargs):
        """Initial states (zeros by default): ``func(shape=, dtype=, **kwargs)`` for each;
        kwargs such as ``device=`` / ``ctx=`` go to ``func``."""
        return make_begin_state(self, batch_size, func, kwargs)

    def reset(self):
        """MXNet resets its step counter here; cells here keep no per-call state."""

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None,
               valid_length=None):
        """Run the cell over ``length`` steps of ``inputs`` (one array in ``layout``, 'NTC' or
        'TNC', or a list of ``length`` arrays (N, C)); returns ``(outputs, states)``.

        outputs are merged into one array in ``layout`` when ``merge_outputs`` is True (by
        default: when ``inputs`` is one array), else a list of per-step arrays. The steps
        run in ``npx.foreach``: one loop node when hybridized.
        """
        who = f"{type(self).__name__}.unroll"
        _refuse_valid_length(who, valid_length)
        if layout not in ("NTC", "TNC"):
            raise ValueError(f"{who}: layout must be 'NTC' or 'TNC', got {layout!r}")
        length = int(length)
        if isinstance(inputs, NDArray):
            if inputs.ndim != 3:
                raise ValueError(f"{who}: inputs must be 3-d in layout {layout}, got shape "
                                 f"{tuple(inputs.shape)}")
            axis = layout.find("T")
            if inputs.shape[axis] != length:
                raise ValueError(f"{who}: length is {length} but the inputs have "
                                 f"{inputs.shape[axis]} steps on axis {axis} ({layout})")
            seq = inputs if axis == 0 else swapaxes(inputs, 0, 1)
            merge = True if merge_outputs is None else merge_outputs
        else:
            steps = list(inputs)
            if len(steps) != length:
                raise ValueError(f"{who}: length is {length} but {len(steps)} inputs were "
                                 "given")
            seq = stack(steps, axis=0)
            merge = bool(merge_outputs)
        if begin_state is None:
            begin_state = self.begin_state(seq.shape[1], device=_dev(seq))
        states = as_state_list(begin_state, who)

        def body(x_t, st):
            out, new = self(x_t, st)
            return out, list(new)

        outs, states = foreach(body, seq, states)
        if merge:
            return (outs if layout == "TNC" else swapaxes(outs, 0, 1)), states
        return [outs[t] for t in range(length)], states


HybridRecurrentCell = RecurrentCell  # MXNet's two names, one class here


def _refuse_valid_length(who, valid_length):
    if valid_length is not None:
        raise NotImplementedError(f"{who}: valid_length (per-sequence lengths) is not "
                                  "supported; mask the outputs with npx.sequence_mask")


class _GatedCell(RecurrentCell):
    """A cell with i2h/h2h weights and biases of ``gates * hidden_size`` rows."""

    _gates = 1

    def __init__(self, hidden_size, i2h_weight_initializer, h2h_weight_initializer,
                 i2h_bias_initializer, h2h_bias_initializer, input_size, dtype, **kwargs):
        super().__init__(**kwargs)
        if int(hidden_size) <= 0:
            raise ValueError(f"{type(self).__name__}: hidden_size must be a positive int, got "
                             f"{hidden_size!r}")
        self._hidden_size = int(hidden_size)
        self._input_size = int(input_size)
        g = self._gates * self._hidden_size
        self.i2h_weight = Parameter("i2h_weight", shape=(g, self._input_size), dtype=dtype,
                                    init=i2h_weight_initializer)
        self.h2h_weight = Parameter("h2h_weight", shape=(g, self._hidden_size), dtype=dtype,
                                    init=h2h_weight_initializer)
        self.i2h_bias = Parameter("i2h_bias", shape=(g,), dtype=dtype,
                                  init=i2h_bias_initializer)
        self.h2h_bias = Parameter("h2h_bias", shape=(g,), dtype=dtype,
                                  init=h2h_bias_initializer)

    def state_info(self, batch_size=0):
        info = {"shape": (batch_size, self._hidden_size), "__layout__": "NC",
                "dtype": self.h2h_weight.dtype.name}
        return [dict(info) for _ in range(self._n_states)]

    _n_states = 1

    def _prepare(self, inputs, states):
        """Checks; the projected input (N, G) and the device's h2h weight (transposed)."""
        who = type(self).__name__
        _float_input(self, inputs, self.i2h_weight)
        if inputs.ndim != 2:
            raise ValueError(f"{who}: one step's input must be 2-d (batch, features), got "
                             f"shape {tuple(inputs.shape)}; use unroll() for a sequence")
        states = as_state_list(states, who)
        check_states(who, states, self.state_info(inputs.shape[0]))
        g = self._gates * self._hidden_size
        known = self.i2h_weight.shape[1]
        if known and known != inputs.shape[1]:
            raise ValueError(f"{who}: the input has {inputs.shape[1]} features, but the cell "
                             f"was built for input_size={known}")
        self.i2h_weight._finish_deferred_init((g, inputs.shape[1]))
        dev = _dev(inputs)
        gi = npx.fully_connected(inputs, self.i2h_weight.data(dev), self.i2h_bias.data(dev),
                                 flatten=False)
        return gi, states, transpose(self.h2h_weight.data(dev)), self.h2h_bias.data(dev)

    def __repr__(self):
        ni = self.i2h_weight.shape[1] or None
        return f"{type(self).__name__}({ni} -> {self._hidden_size})"


class RNNCell(_GatedCell):
    """An Elman RNN cell: ``h' = activation(W_i x + b_i + W_h h + b_h)``; states [h]."""

    def __init__(self, hidden_size, activation="tanh", i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", input_size=0, dtype="float32", **kwargs):
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, input_size, dtype,
                         **kwargs)
        self._act = check_act("RNNCell", activation)

    def forward(self, inputs, states):
        gi, states, whT, bh = self._prepare(inputs, states)
        h = rnn_step(gi, states[0], whT, bh, self._act)
        return h, [h]


class _TwoActivationCell(_GatedCell):
    """LSTM and GRU cells: MXNet's constructor, with an activation and a recurrent (gate)
    activation."""

    def __init__(self, hidden_size, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0,
                 activation="tanh", recurrent_activation="sigmoid", dtype="float32",
                 **kwargs):
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, input_size, dtype,
                         **kwargs)
        self._act = check_act(type(self).__name__, activation)
        self._rec_act = check_act(type(self).__name__, recurrent_activation)


class LSTMCell(_TwoActivationCell):
    """An LSTM cell, gates [i, f, c, o] (see the module docstring); states [h, c]."""

    _gates = 4
    _n_states = 2

    def forward(self, inputs, states):
        gi, states, whT, bh = self._prepare(inputs, states)
        h, c = lstm_step(gi, states[0], states[1], whT, bh, self._act, self._rec_act)
        return h, [h, c]


class GRUCell(_TwoActivationCell):
    """A GRU cell, gates [r, z, n], MXNet's n = tanh(W_in x + b_in + r * (W_hn h + b_hn));
    states [h]."""

    _gates = 3

    def forward(self, inputs, states):
        gi, states, whT, bh = self._prepare(inputs, states)
        h = gru_step(gi, states[0], whT, bh, self._act, self._rec_act)
        return h, [h]


class SequentialRNNCell(RecurrentCell):
    """Cells stacked: each step runs them in order, the output of one the input of the next;
    the states are the cells' states concatenated, in order."""

    def add(self, cell):
        if not isinstance(cell, RecurrentCell):
            raise TypeError(f"SequentialRNNCell.add: expected a recurrent cell, got "
                            f"{type(cell).__name__}")
        self.register_child(cell)
        return self

    def __len__(self):
        return len(self._children)

    def __getitem__(self, i):
        return list(self._children.values())[i]

    def state_info(self, batch_size=0):
        return [info for cell in self._children.values()
                for info in cell.state_info(batch_size)]

    def begin_state(self, batch_size=0, func=None, **kwargs):
        return [s for cell in self._children.values()
                for s in cell.begin_state(batch_size, func, **kwargs)]

    def forward(self, inputs, states):
        states = as_state_list(states, "SequentialRNNCell")
        check_states("SequentialRNNCell", states, self.state_info(inputs.shape[0]))
        pos, new_states = 0, []
        for cell in self._children.values():
            n = len(cell.state_info())
            inputs, st = cell(inputs, states[pos:pos + n])
            pos += n
            new_states.extend(st)
        return inputs, new_states

    def __repr__(self):
        return "SequentialRNNCell(\n" + "\n".join(
            f"  ({k}): {c!r}" for k, c in self._children.items()) + "\n)"


HybridSequentialRNNCell = SequentialRNNCell  # MXNet's two names, one class here


class DropoutCell(RecurrentCell):
    """Dropout on each step's input while training (the identity otherwise); no states."""

    def __init__(self, rate, axes=(), **kwargs):
        super().__init__(**kwargs)
        if not 0 <= rate < 1:
            raise ValueError(f"DropoutCell: rate must be in [0, 1), got {rate}")
        if axes:
            raise ValueError("DropoutCell: axes (a mask shared along axes) is not supported")
        self._rate = float(rate)

    def state_info(self, batch_size=0):
        return []

    def forward(self, inputs, states):
        return npx.dropout(inputs, p=self._rate), list(states)

    def __repr__(self):
        return f"DropoutCell(rate={self._rate})"


class ResidualCell(RecurrentCell):
    """``base_cell``'s step with its input added to its output (the sizes must agree)."""

    def __init__(self, base_cell, **kwargs):
        super().__init__(**kwargs)
        self.base_cell = base_cell

    def state_info(self, batch_size=0):
        return self.base_cell.state_info(batch_size)

    def begin_state(self, batch_size=0, func=None, **kwargs):
        return self.base_cell.begin_state(batch_size, func, **kwargs)

    def forward(self, inputs, states):
        out, states = self.base_cell(inputs, states)
        if tuple(out.shape) != tuple(inputs.shape):
            raise ValueError(f"ResidualCell: the cell's output {tuple(out.shape)} and its "
                             f"input {tuple(inputs.shape)} differ in shape; they are added")
        return out + inputs, states


class BidirectionalCell(RecurrentCell):
    """``l_cell`` over the sequence and ``r_cell`` over it reversed; each step's outputs
    joined on the feature axis (forward first), the states l_cell's then r_cell's. A whole
    sequence is needed: use ``unroll``."""

    def __init__(self, l_cell, r_cell, **kwargs):
        super().__init__(**kwargs)
        self.l_cell = l_cell
        self.r_cell = r_cell

    def state_info(self, batch_size=0):
        return self.l_cell.state_info(batch_size) + self.r_cell.state_info(batch_size)

    def begin_state(self, batch_size=0, func=None, **kwargs):
        return (self.l_cell.begin_state(batch_size, func, **kwargs) +
                self.r_cell.begin_state(batch_size, func, **kwargs))

    def forward(self, inputs, states):
        raise NotImplementedError("BidirectionalCell cannot step: the backward direction "
                                  "needs the whole sequence; call unroll()")

    def unroll(self, length, inputs, begin_state=None, layout="NTC", merge_outputs=None,
               valid_length=None):
        who = "BidirectionalCell.unroll"
        _refuse_valid_length(who, valid_length)
        if layout not in ("NTC", "TNC"):
            raise ValueError(f"{who}: layout must be 'NTC' or 'TNC', got {layout!r}")
        single = isinstance(inputs, NDArray)
        if single:
            seq = inputs if layout == "TNC" else swapaxes(inputs, 0, 1)
        else:
            seq = stack(list(inputs), axis=0)
        if begin_state is None:
            begin_state = self.begin_state(seq.shape[1], device=_dev(seq))
        states = as_state_list(begin_state, who)
        check_states(who, states, self.state_info(seq.shape[1]))
        n_left = len(self.l_cell.state_info())
        l_out, l_states = self.l_cell.unroll(length, seq, states[:n_left], "TNC", True)
        r_out, r_states = self.r_cell.unroll(length, seq[::-1], states[n_left:], "TNC", True)
        out = concatenate([l_out, r_out[::-1]], axis=2)
        merge = single if merge_outputs is None else merge_outputs
        if merge:
            return (out if layout == "TNC" else swapaxes(out, 0, 1)), l_states + r_states
        return [out[t] for t in range(length)], l_states + r_states
