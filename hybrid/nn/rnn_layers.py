"""Gluon's recurrent layers: ``RNN``, ``LSTM`` and ``GRU`` (multi-layer, bidirectional).

``layer(inputs, states=None)`` takes a sequence in ``layout`` 'TNC' (time, batch, features;
the default) or 'NTC' and returns the top layer's outputs, (T, N, D*H) in TNC, D = 2 when
bidirectional (forward then backward features); given ``states`` it returns ``(outputs,
new_states)``. States are [h] (RNN, GRU) or [h, c] (LSTM), each (num_layers*D, N, H), rows
ordered layer 0 forward, layer 0 backward, layer 1 forward, ...

The step equations and gate orders are MXNet's (written out in rnn_cells.py):
    RNN   h' = act(W_i x + b_i + W_h h + b_h)                act 'relu' (default) or 'tanh'
    LSTM  gates [i, f, c(g), o]: c' = f*c + i*g, h' = o*tanh(c')
    GRU   gates [r, z, n]: n = tanh(W_in x + b_in + r*(W_hn h + b_hn)), h' = (1-z)*n + z*h

Parameters carry MXNet's names, for each layer k and direction ('l' forward, 'r' backward):
{l,r}k_i2h_weight (G*H, C_k), {l,r}k_h2h_weight (G*H, H), {l,r}k_i2h_bias (G*H,),
{l,r}k_h2h_bias (G*H,); G = 1, 4, 3 gates; C_0 = input_size (0: learned from the first
input), C_k = D*H above.

How it runs, per layer and direction: the input projection of ALL time steps is one GEMM
((T*N, C) @ W_i2h.T) before the loop, then ``npx.foreach`` runs the recurrence, so a
hybridized layer is one loop node (one compile for every sequence length) whose body holds
only the (N, H) @ (H, G*H) product and the gates. The backward direction reverses the
sequence (x[::-1]) before the loop and its outputs after. Dropout (training only) is applied
to the outputs of every layer but the last, as MXNet's fused RNN does.
"""
from __future__ import annotations

from runtime import config

from .. import _state, npx
from ..control_flow import foreach
from ..eager_kernels import MIN_CALLS
from ..tracing import hybridize
from ..ndarray import NDArray, concatenate, stack, swapaxes, transpose
from .block import HybridBlock
from .layers import _dev, _float_input
from .parameter import Parameter
from .rnn_cells import (
    as_state_list,
    check_act,
    check_states,
    gru_step,
    lstm_step,
    make_begin_state,
    rnn_step,
)

__all__ = ["GRU", "LSTM", "RNN"]

_GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}


class _RNNLayer(HybridBlock):
    """The shared machinery of RNN, LSTM and GRU (MXNet's ``_RNNLayer``)."""

    def __init__(self, hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                 i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer, mode, dtype, use_sequence_length=False,
                 projection_size=None, **kwargs):
        super().__init__(**kwargs)
        who = type(self).__name__
        if layout not in ("TNC", "NTC"):
            raise ValueError(f"{who}: layout must be 'TNC' or 'NTC', got {layout!r}")
        if int(hidden_size) <= 0 or int(num_layers) <= 0:
            raise ValueError(f"{who}: hidden_size and num_layers must be positive ints, got "
                             f"{hidden_size!r} and {num_layers!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"{who}: dropout must be in [0, 1), got {dropout}")
        if projection_size:
            raise ValueError(f"{who}: projection_size (LSTMP) is not supported")
        if use_sequence_length:
            raise ValueError(f"{who}: use_sequence_length is not supported; mask the "
                             "outputs with npx.sequence_mask")
        self._hidden_size = int(hidden_size)
        self._num_layers = int(num_layers)
        self._layout = layout
        self._dropout = float(dropout)
        self._dir = 2 if bidirectional else 1
        self._input_size = int(input_size)
        self._mode = mode
        self._gates = _GATES[mode]
        g, h = self._gates * self._hidden_size, self._hidden_size
        ni = self._input_size
        # MXNet's registration order: per layer, per direction, i2h_weight, h2h_weight,
        # i2h_bias, h2h_bias (collect_params lists them so)
        for k in range(self._num_layers):
            for d in "lr"[:self._dir]:
                setattr(self, f"{d}{k}_i2h_weight", Parameter(
                    f"{d}{k}_i2h_weight", shape=(g, ni), dtype=dtype,
                    init=i2h_weight_initializer))
                setattr(self, f"{d}{k}_h2h_weight", Parameter(
                    f"{d}{k}_h2h_weight", shape=(g, h), dtype=dtype,
                    init=h2h_weight_initializer))
                setattr(self, f"{d}{k}_i2h_bias", Parameter(
                    f"{d}{k}_i2h_bias", shape=(g,), dtype=dtype, init=i2h_bias_initializer))
                setattr(self, f"{d}{k}_h2h_bias", Parameter(
                    f"{d}{k}_h2h_bias", shape=(g,), dtype=dtype, init=h2h_bias_initializer))
            ni = h * self._dir

    # ------------------------------------------------------------ states
    def state_info(self, batch_size=0):
        shape = (self._num_layers * self._dir, batch_size, self._hidden_size)
        info = {"shape": shape, "__layout__": "LNC", "dtype": self.l0_h2h_weight.dtype.name}
        return [dict(info) for _ in range(2 if self._mode == "lstm" else 1)]

    def begin_state(self, batch_size=0, func=None, **kwargs):
        """Initial states (zeros by default), each (num_layers*D, batch_size, hidden_size):
        ``func(shape=, dtype=, **kwargs)``; kwargs such as ``device=`` / ``ctx=`` go to
        ``func``."""
        return make_begin_state(self, batch_size, func, kwargs)

    # ------------------------------------------------------------ forward
    def forward(self, inputs, states=None, sequence_length=None):
        who = type(self).__name__
        if sequence_length is not None:
            raise ValueError(f"{who}: sequence_length is not supported; mask the outputs "
                             "with npx.sequence_mask")
        if not isinstance(inputs, NDArray) or inputs.ndim != 3:
            shape = tuple(inputs.shape) if hasattr(inputs, "shape") else type(inputs).__name__
            raise ValueError(f"{who}: inputs must be 3-d in layout {self._layout} (T: "
                             f"sequence length, N: batch, C: features), got {shape}")
        _float_input(self, inputs, self.l0_i2h_weight)
        x = inputs if self._layout == "TNC" else swapaxes(inputs, 0, 1)
        batch, features = x.shape[1], x.shape[2]
        self._finish_input_size(features)
        dev = _dev(inputs)
        skip_states = states is None
        if skip_states:
            states = self.begin_state(batch, device=dev)
        states = as_state_list(states, who)
        check_states(who, states, self.state_info(batch))
        h_out, c_out = [], []
        for k in range(self._num_layers):
            outs = []
            for d in range(self._dir):
                row = k * self._dir + d
                st = [s[row] for s in states]
                y, new = self._one_direction(x, st, "lr"[d] + str(k), d == 1, dev)
                outs.append(y)
                h_out.append(new[0])
                if self._mode == "lstm":
                    c_out.append(new[1])
            x = outs[0] if self._dir == 1 else concatenate(outs, axis=2)
            if self._dropout and k + 1 < self._num_layers:
                x = npx.dropout(x, p=self._dropout)  # the identity outside training
        out = x if self._layout == "TNC" else swapaxes(x, 0, 1)
        if skip_states:
            return out
        new_states = [stack(h_out, axis=0)]
        if self._mode == "lstm":
            new_states.append(stack(c_out, axis=0))
        return out, new_states

    def _finish_input_size(self, features):
        g = self._gates * self._hidden_size
        known = self.l0_i2h_weight.shape[1]
        if known and known != features:
            raise ValueError(f"{type(self).__name__}: the input has {features} features (its "
                             f"C axis in layout {self._layout}), but the layer was built for "
                             f"input_size={known}")
        for d in "lr"[:self._dir]:
            getattr(self, f"{d}0_i2h_weight")._finish_deferred_init((g, features))

    def _one_direction(self, x, states, name, reverse, dev):
        """One layer in one direction over x (T, N, C): (outputs (T, N, H), final states)."""
        wi = getattr(self, name + "_i2h_weight").data(dev)
        bi = getattr(self, name + "_i2h_bias").data(dev)
        wh = getattr(self, name + "_h2h_weight").data(dev)
        bh = getattr(self, name + "_h2h_bias").data(dev)
        if reverse:
            x = x[::-1]
        n, c = x.shape[1], x.shape[2]
        # the two biases only ever add, except GRU's n block: fold b_h2h into the hoisted
        # projection where that holds, so the loop body has one add fewer
        mode = self._mode
        bias = bi if mode == "gru" else bi + bh
        # one GEMM for all time steps; -1 keeps the time axis free (one graph for any length)
        gi = npx.fully_connected(x.reshape((-1, c)), wi, bias, flatten=False)
        gi = gi.reshape((-1, n, gi.shape[-1]))
        whT = transpose(wh)  # once, outside the loop
        args = (gi, *states, whT) + ((bh,) if mode == "gru" else ())
        y, new = _recurrence(mode, args)
        return (y[::-1] if reverse else y), new

    def __repr__(self):
        ni = self.l0_i2h_weight.shape[1] or None
        extra = f", num_layers={self._num_layers}" if self._num_layers > 1 else ""
        if self._dropout:
            extra += f", dropout={self._dropout}"
        if self._dir == 2:
            extra += ", bidirectional"
        return f"{type(self).__name__}({ni} -> {self._hidden_size}, {self._layout}{extra})"


def _scan(mode):
    """The recurrence of one layer and direction as a function of arrays only: ``(gi, *states,
    W_h2h.T[, b_h2h]) -> (outputs, new_states)``, one ``npx.foreach`` over gi's steps."""
    if mode == "lstm":
        def scan(gi, h, c, whT):
            def body(g_t, st):
                h2, c2 = lstm_step(g_t, st[0], st[1], whT, None)
                return h2, [h2, c2]
            return foreach(body, gi, [h, c])
    elif mode == "gru":
        def scan(gi, h, whT, bh):
            return foreach(lambda g_t, st: _one(gru_step(g_t, st[0], whT, bh)), gi, [h])
    else:
        act = "relu" if mode == "rnn_relu" else "tanh"

        def scan(gi, h, whT):
            return foreach(lambda g_t, st: _one(rnn_step(g_t, st[0], whT, None, act)), gi,
                           [h])
    scan.__name__ = f"{mode}_recurrence"
    return scan


def _one(h):
    return h, [h]


# Eager layers run their recurrence compiled, as MXNet's and PyTorch's fused RNN ops do: the
# scan function hybridized (one per mode, shared by every layer; a signature compiles on its
# second call, the first runs the Python loop, as eager kernels do: hybrid/eager_kernels.py).
# The eager Python loop costs ~13 ops per step: an LSTM language model's training step ran
# 5.8x PyTorch eager's. Inside a trace the scan is traced with the block, as before.
_SCANS: dict = {}  # mode -> the scan function
_COMPILED: dict = {}  # mode -> the scan function hybridized
_SEEN: dict = {}  # signature -> calls run by the Python loop so far


def _recurrence(mode, args):
    fn = _SCANS.get(mode) or _SCANS.setdefault(mode, _scan(mode))
    if _state.tracing() or not config.get("HYBRID_EAGER_KERNELS") or args[0].shape[0] == 0:
        return fn(*args)
    key = (mode,) + tuple((a.shape, a.dtype, str(a.device)) for a in args)
    calls = _SEEN.get(key, 0)
    if calls < MIN_CALLS - 1:
        if len(_SEEN) > 1024:  # signatures seen once: forget them rather than grow
            _SEEN.clear()
        _SEEN[key] = calls + 1
        return fn(*args)
    compiled = _COMPILED.get(mode)
    if compiled is None:
        compiled = _COMPILED[mode] = hybridize(fn)
        compiled.cache._retrace_warned = True  # one function for every layer: many shapes
    return compiled(*args)


class RNN(_RNNLayer):
    """A multi-layer Elman RNN: ``h' = activation(W_i x + b_i + W_h h + b_h)``, activation
    'relu' (MXNet's default) or 'tanh'. States [h]."""

    def __init__(self, hidden_size, num_layers=1, activation="relu", layout="TNC", dropout=0,
                 bidirectional=False, i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros", input_size=0,
                 dtype="float32", **kwargs):
        check_act("RNN", activation, ("relu", "tanh"))
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, "rnn_" + activation, dtype, **kwargs)


class LSTM(_RNNLayer):
    """A multi-layer LSTM, gates [i, f, c, o] (MXNet's order). States [h, c]."""

    def __init__(self, hidden_size, num_layers=1, layout="TNC", dropout=0,
                 bidirectional=False, input_size=0, i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", projection_size=None, dtype="float32",
                 **kwargs):
        for k in ("lstm_state_clip_min", "lstm_state_clip_max"):
            if kwargs.pop(k, None) is not None:
                raise ValueError(f"LSTM: {k} (state clipping) is not supported")
        kwargs.pop("lstm_state_clip_nan", None)
        kwargs.pop("h2r_weight_initializer", None)
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, "lstm", dtype, projection_size=projection_size,
                         **kwargs)


class GRU(_RNNLayer):
    """A multi-layer GRU, gates [r, z, n], MXNet's n = tanh(W_in x + b_in + r * (W_hn h +
    b_hn)). States [h]."""

    def __init__(self, hidden_size, num_layers=1, layout="TNC", dropout=0,
                 bidirectional=False, input_size=0, i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", dtype="float32", **kwargs):
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, "gru", dtype, **kwargs)
