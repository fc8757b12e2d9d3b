"""gluon.rnn (issue 22, deliverable 2): RNN, LSTM, GRU and their cells against a NumPy
implementation of MXNet's equations written here (never the layers' code), gradients against
finite differences, MXNet's parameter names and shapes, cells' unroll against the layers, and
eager against hybridized (the layers run their recurrence in npx.foreach)."""
import numpy
import pytest

import hybrid as hb
from hybrid import autograd
from hybrid.gluon import rnn

RNG = numpy.random.default_rng(22)
MODES = ["rnn_relu", "rnn_tanh", "lstm", "gru"]
GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}


def close(a, b, rtol=1e-5, atol=1e-6):
    numpy.testing.assert_allclose(numpy.asarray(a), numpy.asarray(b), rtol=rtol, atol=atol)


# --------------------------------------------------------------------- the reference
def sigmoid(v):
    return 1 / (1 + numpy.exp(-v))


def ref_step(mode, x, h, c, wi, wh, bi, bh):
    """One step of MXNet's equations, gate by gate. LSTM gates [i, f, g, o]; GRU [r, z, n]
    with n = tanh(W_in x + b_in + r * (W_hn h + b_hn))."""
    hid = h.shape[1]

    def pre(k, with_h=True):  # gate k's pre-activation: its rows of both projections
        rows = slice(k * hid, (k + 1) * hid)
        out = x @ wi[rows].T + bi[rows]
        return out + h @ wh[rows].T + bh[rows] if with_h else out

    if mode == "lstm":
        i, f, g, o = sigmoid(pre(0)), sigmoid(pre(1)), numpy.tanh(pre(2)), sigmoid(pre(3))
        c = f * c + i * g
        return o * numpy.tanh(c), c
    if mode == "gru":
        r, z = sigmoid(pre(0)), sigmoid(pre(1))
        rows = slice(2 * hid, 3 * hid)
        n = numpy.tanh(pre(2, with_h=False) + r * (h @ wh[rows].T + bh[rows]))
        return (1 - z) * n + z * h, c
    v = pre(0)
    return (numpy.maximum(v, 0) if mode == "rnn_relu" else numpy.tanh(v)), c


def ref_layer(mode, x, params, h0, c0, num_layers, dirs):
    """The whole layer on x (T, N, C): (outputs (T, N, dirs*H), h_n, c_n)."""
    hs, cs = [], []
    for k in range(num_layers):
        outs = []
        for d in range(dirs):
            name = "lr"[d] + str(k)
            w = [params[f"{name}_{p}"] for p in ("i2h_weight", "h2h_weight", "i2h_bias",
                                                   "h2h_bias")]
            h, c = h0[k * dirs + d], c0[k * dirs + d]
            seq = x if d == 0 else x[::-1]
            ys = []
            for t in range(seq.shape[0]):
                h, c = ref_step(mode, seq[t], h, c, *w)
                ys.append(h)
            ys = numpy.stack(ys)
            outs.append(ys if d == 0 else ys[::-1])
            hs.append(h)
            cs.append(c)
        x = numpy.concatenate(outs, axis=-1)
    return x, numpy.stack(hs), numpy.stack(cs)


# --------------------------------------------------------------------- helpers
def make_layer(mode, hidden, num_layers=1, bidirectional=False, layout="TNC", dtype="float32",
               **kw):
    if mode.startswith("rnn"):
        return rnn.RNN(hidden, num_layers, activation=mode[4:], layout=layout,
                       bidirectional=bidirectional, dtype=dtype, **kw)
    cls = rnn.LSTM if mode == "lstm" else rnn.GRU
    return cls(hidden, num_layers, layout=layout, bidirectional=bidirectional, dtype=dtype,
               **kw)


def randomize(block, dtype, scale=0.5):
    """Random values for every parameter (biases too, so a dropped bias would show);
    returns them by name as NumPy arrays."""
    values = {}
    for name, p in block.collect_params().items():
        v = RNG.uniform(-scale, scale, p.shape).astype(dtype)
        p.set_data(hb.array(v, dtype=dtype))
        values[name] = v.astype("float64")
    return values


def setup(mode, hidden=4, features=3, num_layers=1, bidirectional=False, layout="TNC",
          dtype="float32", **kw):
    layer = make_layer(mode, hidden, num_layers, bidirectional, layout, dtype, **kw)
    layer.initialize()
    layer(hb.array(numpy.zeros((2, 2, features)), dtype=dtype))  # finish deferred shapes
    return layer, randomize(layer, dtype)


def states_for(mode, num_layers, dirs, batch, hidden, given):
    shape = (num_layers * dirs, batch, hidden)
    if not given:
        return numpy.zeros(shape), numpy.zeros(shape)
    return RNG.normal(size=shape), RNG.normal(size=shape)


def to_tnc(a, layout):
    return a if layout == "TNC" else a.swapaxes(0, 1)


# --------------------------------------------------------------------- forward
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, False), (1, True),
                                                      (2, True)])
@pytest.mark.parametrize("layout,given", [("TNC", True), ("NTC", False)])
def test_layer_matches_mxnet_equations(mode, num_layers, bidirectional, layout, given):
    T, N, C, H = 5, 3, 3, 4
    dirs = 2 if bidirectional else 1
    layer, params = setup(mode, H, C, num_layers, bidirectional, layout)
    x = RNG.normal(size=(T, N, C))
    h0, c0 = states_for(mode, num_layers, dirs, N, H, given)
    want, want_h, want_c = ref_layer(mode, x, params, h0, c0, num_layers, dirs)
    xin = hb.array(to_tnc(x, layout), dtype="float32")
    if given:
        states = [hb.array(h0, dtype="float32")]
        if mode == "lstm":
            states.append(hb.array(c0, dtype="float32"))
        out, new = layer(xin, states)
        assert len(new) == len(states)
        close(new[0].asnumpy(), want_h, rtol=1e-4, atol=1e-5)
        if mode == "lstm":
            close(new[1].asnumpy(), want_c, rtol=1e-4, atol=1e-5)
    else:
        out = layer(xin)
        assert isinstance(out, hb.NDArray)
    assert out.shape == to_tnc(want, layout).shape
    close(out.asnumpy(), to_tnc(want, layout), rtol=1e-4, atol=1e-5)


def test_layouts_agree_and_begin_state_is_zeros():
    layer, _ = setup("lstm", num_layers=2, bidirectional=True)
    x = hb.array(RNG.normal(size=(6, 2, 3)))
    states = layer.begin_state(batch_size=2, device=hb.cpu())
    assert [s.shape for s in states] == [(4, 2, 4), (4, 2, 4)]
    assert all(float(abs(s).sum().item()) == 0 for s in states)
    info = layer.state_info(2)
    assert [i["shape"] for i in info] == [(4, 2, 4)] * 2 and info[0]["__layout__"] == "LNC"
    out, _ = layer(x, states)
    close(layer(x).asnumpy(), out.asnumpy())
    ntc = setup("lstm", num_layers=2, bidirectional=True, layout="NTC")[0]
    ntc.load_dict({k: p.data() for k, p in layer.collect_params().items()})
    close(ntc(x.swapaxes(0, 1)).asnumpy(), out.asnumpy().swapaxes(0, 1))


def test_float64_layer():
    layer, params = setup("gru", dtype="float64", num_layers=2)
    x = RNG.normal(size=(4, 2, 3))
    out = layer(hb.array(x, dtype="float64"))
    assert out.dtype == numpy.float64
    h0 = numpy.zeros((2, 2, 4))
    close(out.asnumpy(), ref_layer("gru", x, params, h0, h0, 2, 1)[0], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------- parameters
def test_parameter_names_and_shapes_are_mxnets():
    layer = rnn.LSTM(5, num_layers=2, bidirectional=True, input_size=3)
    got = [(k, p.shape) for k, p in layer.collect_params().items()]
    want = []
    for k, ni in ((0, 3), (1, 10)):
        for d in "lr":
            want += [(f"{d}{k}_i2h_weight", (20, ni)), (f"{d}{k}_h2h_weight", (20, 5)),
                     (f"{d}{k}_i2h_bias", (20,)), (f"{d}{k}_h2h_bias", (20,))]
    assert got == want
    gru = rnn.GRU(6, input_size=2)
    assert {k: p.shape for k, p in gru.collect_params().items()} == {
        "l0_i2h_weight": (18, 2), "l0_h2h_weight": (18, 6), "l0_i2h_bias": (18,),
        "l0_h2h_bias": (18,)}
    cell = rnn.LSTMCell(5, input_size=3)
    assert {k: p.shape for k, p in cell.collect_params().items()} == {
        "i2h_weight": (20, 3), "h2h_weight": (20, 5), "i2h_bias": (20,), "h2h_bias": (20,)}


def test_input_size_is_learned_from_the_first_input():
    layer = rnn.GRU(4, num_layers=2, bidirectional=True)
    assert layer.l0_i2h_weight.shape == (12, 0) and layer.l1_i2h_weight.shape == (12, 8)
    layer.initialize()
    layer(hb.zeros((3, 2, 7)))
    assert layer.l0_i2h_weight.shape == (12, 7) and layer.r0_i2h_weight.shape == (12, 7)
    with pytest.raises(ValueError, match="7 features.*input_size=7|has 5 features"):
        layer(hb.zeros((3, 2, 5)))


def test_clear_errors():
    layer, _ = setup("lstm", num_layers=2)
    with pytest.raises(ValueError, match="3-d in layout TNC"):
        layer(hb.zeros((2, 3)))
    with pytest.raises(ValueError, match="expected 2 state"):
        layer(hb.zeros((4, 2, 3)), [hb.zeros((2, 2, 4))])
    with pytest.raises(ValueError, match=r"state 1 has shape \(2, 3, 4\), expected \(2, 2, 4\)"):
        layer(hb.zeros((4, 2, 3)), [hb.zeros((2, 2, 4)), hb.zeros((2, 3, 4))])
    with pytest.raises(TypeError, match="state 0 has dtype float64.*float32"):
        layer(hb.zeros((4, 2, 3)), [hb.zeros((2, 2, 4), dtype="float64"), hb.zeros((2, 2, 4))])
    with pytest.raises(ValueError, match="layout must be 'TNC' or 'NTC'"):
        rnn.GRU(3, layout="CTN")
    with pytest.raises(ValueError, match="activation must be one of"):
        rnn.RNN(3, activation="sigmoid")
    with pytest.raises(TypeError, match="cast the input"):
        layer(hb.zeros((4, 2, 3), dtype="int64"))
    cell = rnn.LSTMCell(4, input_size=3)
    cell.initialize()
    with pytest.raises(ValueError, match="2-d"):
        cell(hb.zeros((4, 2, 3)), cell.begin_state(2))
    with pytest.raises(ValueError, match="length is 5"):
        cell.unroll(5, hb.zeros((2, 4, 3)))


# --------------------------------------------------------------------- dropout
def test_dropout_between_layers_only_in_training():
    layer, params = setup("lstm", num_layers=2, dropout=0.5)
    x = RNG.normal(size=(5, 3, 3))
    h0 = numpy.zeros((2, 3, 4))
    want = ref_layer("lstm", x, params, h0, h0, 2, 1)[0]
    close(layer(hb.array(x)).asnumpy(), want, rtol=1e-4, atol=1e-5)  # predict: no dropout
    with autograd.record():
        trained = layer(hb.array(x)).asnumpy()
    assert numpy.abs(trained - want).max() > 1e-3
    one, params1 = setup("lstm", num_layers=1, dropout=0.5)  # one layer: nothing between
    with autograd.record():
        out = one(hb.array(x)).asnumpy()
    close(out, ref_layer("lstm", x, params1, h0[:1], h0[:1], 1, 1)[0], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------- gradients
def loss_and_grads(layer, x, states, wy, ws):
    """sum(out * wy) + sum(h_n * ws): the autograd gradients of x, the states and every
    parameter (float64 NumPy)."""
    xs = hb.array(x, dtype="float64")
    xs.attach_grad()
    st = [hb.array(s, dtype="float64") for s in states]
    for s in st:
        s.attach_grad()
    with autograd.record():
        out, new = layer(xs, st)
        loss = (out * hb.array(wy, dtype="float64")).sum() + \
            (new[-1] * hb.array(ws, dtype="float64")).sum()
    loss.backward()
    grads = {k: p.grad().asnumpy() for k, p in layer.collect_params().items()}
    return float(loss.item()), xs.grad.asnumpy(), [s.grad.asnumpy() for s in st], grads


@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_finite_differences(mode):
    T, N, C, H, L = 3, 2, 2, 3, 2
    layer, params = setup(mode, H, C, L, bidirectional=True, dtype="float64")
    x = RNG.normal(size=(T, N, C))
    h0, c0 = states_for(mode, L, 2, N, H, given=True)
    states = [h0, c0] if mode == "lstm" else [h0]
    wy, ws = RNG.normal(size=(T, N, 2 * H)), RNG.normal(size=(2 * L, N, H))

    def ref_loss(x_, p_, h_, c_):
        out, hn, cn = ref_layer(mode, x_, p_, h_, c_, L, 2)
        return (out * wy).sum() + ((cn if mode == "lstm" else hn) * ws).sum()

    loss, gx, gs, gp = loss_and_grads(layer, x, states, wy, ws)
    assert abs(loss - ref_loss(x, params, h0, c0)) < 1e-10

    def numeric(arr, f, eps=1e-6):  # central differences of the reference, every entry
        g = numpy.zeros_like(arr)
        for i in numpy.ndindex(arr.shape):
            keep = arr[i]
            arr[i] = keep + eps
            up = f()
            arr[i] = keep - eps
            g[i] = (up - f()) / (2 * eps)
            arr[i] = keep
        return g

    def f():
        return ref_loss(x, params, h0, c0)
    tol = {"rtol": 1e-5, "atol": 1e-7}
    close(gx, numeric(x, f), **tol)
    close(gs[0], numeric(h0, f), **tol)
    if mode == "lstm":
        close(gs[1], numeric(c0, f), **tol)
    for name, v in params.items():
        close(gp[name], numeric(v, f), **tol)


def test_directional_derivative_of_the_layer_itself():
    """The layer's own finite difference along one random direction of all parameters."""
    layer, params = setup("lstm", 3, 2, 2, bidirectional=True, dtype="float64")
    x = RNG.normal(size=(3, 2, 2))
    states = [numpy.zeros((4, 2, 3))] * 2
    wy, ws = RNG.normal(size=(3, 2, 6)), RNG.normal(size=(4, 2, 3))
    _, _, _, grads = loss_and_grads(layer, x, states, wy, ws)
    direction = {k: RNG.normal(size=v.shape) for k, v in params.items()}
    eps = 1e-6

    def loss_at(sign):
        for k, p in layer.collect_params().items():
            p.set_data(hb.array(params[k] + sign * eps * direction[k], dtype="float64"))
        out, new = layer(hb.array(x, dtype="float64"),
                         [hb.array(s, dtype="float64") for s in states])
        return float((out.asnumpy() * wy).sum() + (new[-1].asnumpy() * ws).sum())
    numeric = (loss_at(1) - loss_at(-1)) / (2 * eps)
    analytic = sum(float((grads[k] * direction[k]).sum()) for k in params)
    assert abs(numeric - analytic) < 1e-6 * max(1.0, abs(analytic))


# --------------------------------------------------------------------- cells
def cell_for(mode, hidden, **kw):
    if mode.startswith("rnn"):
        return rnn.RNNCell(hidden, activation=mode[4:], **kw)
    return (rnn.LSTMCell if mode == "lstm" else rnn.GRUCell)(hidden, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_cell_step_matches_mxnet_equations(mode):
    cell = cell_for(mode, 4)
    cell.initialize()
    x = RNG.normal(size=(2, 3))
    h, c = RNG.normal(size=(2, 4)), RNG.normal(size=(2, 4))
    states = [hb.array(h)] + ([hb.array(c)] if mode == "lstm" else [])
    cell(hb.array(x), states)  # learn input_size
    p = randomize(cell, "float32")
    out, new = cell(hb.array(x), states)
    want_h, want_c = ref_step(mode, x, h, c, p["i2h_weight"], p["h2h_weight"], p["i2h_bias"],
                              p["h2h_bias"])
    close(out.asnumpy(), want_h, rtol=1e-5, atol=1e-6)
    close(new[0].asnumpy(), want_h, rtol=1e-5, atol=1e-6)
    if mode == "lstm":
        close(new[1].asnumpy(), want_c, rtol=1e-5, atol=1e-6)
    assert [i["shape"] for i in cell.state_info(2)] == [(2, 4)] * len(states)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["NTC", "TNC"])
def test_cell_unroll_equals_the_layer(mode, layout):
    layer, params = setup(mode, 4, 3, layout=layout)
    cell = cell_for(mode, 4, input_size=3)
    cell.initialize()
    cell.load_dict({k[3:]: v for k, v in params.items()}, cast_dtype=True)
    x = hb.array(to_tnc(RNG.normal(size=(5, 2, 3)), layout), dtype="float32")
    want = layer(x)
    out, states = cell.unroll(5, x, layout=layout)
    close(out.asnumpy(), want.asnumpy())
    t_axis = layout.find("T")
    steps = [x[:, t] if t_axis == 1 else x[t] for t in range(5)]
    outs, states2 = cell.unroll(5, steps, layout=layout)
    assert isinstance(outs, list) and len(outs) == 5
    close(outs[-1].asnumpy(), out.asnumpy()[:, -1] if t_axis == 1 else out.asnumpy()[-1])
    close(states2[0].asnumpy(), states[0].asnumpy())
    merged, _ = cell.unroll(5, steps, layout=layout, merge_outputs=True)
    close(merged.asnumpy(), out.asnumpy())


@pytest.mark.parametrize("mode", ["lstm", "rnn_relu"])
def test_cell_unroll_gradients_equal_the_layers(mode):
    """The cells add the h2h bias in the step; the layers fold it into the hoisted
    projection: the gradients must not tell the two apart."""
    layer, params = setup(mode, 4, 3, dtype="float64")
    cell = cell_for(mode, 4, input_size=3, dtype="float64")
    cell.initialize()
    cell.load_dict({k[3:]: v for k, v in params.items()})
    x = RNG.normal(size=(5, 2, 3))
    wy = hb.array(RNG.normal(size=(5, 2, 4)), dtype="float64")
    grads = []
    for block, run in ((layer, lambda xs: layer(xs)),
                       (cell, lambda xs: cell.unroll(5, xs, layout="TNC")[0])):
        xs = hb.array(x, dtype="float64")
        xs.attach_grad()
        with autograd.record():
            loss = (run(xs) * wy).sum()
        loss.backward()
        grads.append([xs.grad.asnumpy()] + [p.grad().asnumpy() for p in
                                            block.collect_params().values()])
    for a, b in zip(*grads):
        close(a, b, rtol=1e-10, atol=1e-12)


def test_sequential_cell_unroll_equals_a_two_layer_layer():
    layer, params = setup("lstm", 4, 3, num_layers=2)
    stack = rnn.SequentialRNNCell()
    stack.add(rnn.LSTMCell(4, input_size=3))
    stack.add(rnn.LSTMCell(4, input_size=4))
    stack.initialize()
    stack.load_dict({f"{k[1]}.{k[3:]}": v for k, v in params.items()}, cast_dtype=True)
    assert len(stack.state_info(2)) == 4
    x = RNG.normal(size=(5, 2, 3))
    h0, c0 = RNG.normal(size=(2, 2, 4)), RNG.normal(size=(2, 2, 4))
    want, new = layer(hb.array(x), [hb.array(h0), hb.array(c0)])
    begin = [hb.array(h0[0]), hb.array(c0[0]), hb.array(h0[1]), hb.array(c0[1])]
    out, states = stack.unroll(5, hb.array(x), begin_state=begin, layout="TNC")
    close(out.asnumpy(), want.asnumpy())
    close(states[2].asnumpy(), new[0].asnumpy()[1])
    close(states[3].asnumpy(), new[1].asnumpy()[1])


def test_bidirectional_cell_unroll_equals_the_bidirectional_layer():
    layer, params = setup("gru", 4, 3, bidirectional=True)
    cell = rnn.BidirectionalCell(rnn.GRUCell(4, input_size=3), rnn.GRUCell(4, input_size=3))
    cell.initialize()
    cell.load_dict({("l_cell." if k[0] == "l" else "r_cell.") + k[3:]: v
                    for k, v in params.items()}, cast_dtype=True)
    x = RNG.normal(size=(2, 5, 3))  # NTC, the cells' default layout
    h0 = RNG.normal(size=(2, 2, 4))
    want, new = layer(hb.array(x.swapaxes(0, 1)), [hb.array(h0)])
    out, states = cell.unroll(5, hb.array(x), begin_state=[hb.array(h0[0]), hb.array(h0[1])])
    close(out.asnumpy(), want.asnumpy().swapaxes(0, 1))
    close(numpy.stack([s.asnumpy() for s in states]), new[0].asnumpy())
    with pytest.raises(NotImplementedError, match="unroll"):
        cell(hb.array(x[:, 0]), cell.begin_state(2))


def test_residual_and_dropout_cells():
    base = rnn.RNNCell(3, input_size=3)
    stack = rnn.SequentialRNNCell()
    stack.add(rnn.DropoutCell(0.5))
    stack.add(rnn.ResidualCell(base))
    stack.initialize()
    p = randomize(base, "float32")
    x, h = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))
    out, new = stack(hb.array(x), [hb.array(h)])  # predict: dropout is the identity
    want = ref_step("rnn_tanh", x, h, h, p["i2h_weight"], p["h2h_weight"], p["i2h_bias"],
                    p["h2h_bias"])[0]
    close(out.asnumpy(), want + x, rtol=1e-5, atol=1e-6)
    close(new[0].asnumpy(), want, rtol=1e-5, atol=1e-6)
    with autograd.record():
        dropped = stack(hb.array(x), [hb.array(h)])[0].asnumpy()
    assert numpy.abs(dropped - want - x).max() > 1e-3


def test_book_usage():
    """Chapter 9.6's concise RNN: begin_state(batch_size=, ctx=), the layer called with a
    list of states, a new list back."""
    rnn_layer = rnn.RNN(8)
    rnn_layer.initialize()
    state = rnn_layer.begin_state(batch_size=2, ctx=hb.cpu())
    assert len(state) == 1 and state[0].shape == (1, 2, 8)
    X = hb.random.uniform(size=(5, 2, 6))
    Y, state_new = rnn_layer(X, state)
    assert Y.shape == (5, 2, 8) and state_new[0].shape == (1, 2, 8)
    assert repr(rnn_layer) == "RNN(6 -> 8, TNC)"
    # chapter 10's seq2seq: a 2-layer GRU encoder; the decoder reads its top layer's state
    encoder = rnn.GRU(8, 2, dropout=0.1)
    encoder.initialize()
    X = hb.random.uniform(size=(4, 7, 5)).swapaxes(0, 1)
    state = encoder.begin_state(batch_size=X.shape[1], ctx=X.ctx)
    output, state = encoder(X, state)
    assert output.shape == (7, 4, 8) and state[0].shape == (2, 4, 8)
    context = hb.broadcast_to(state[0][-1], (7, 4, 8))
    decoder = rnn.GRU(8, 2)
    decoder.initialize()
    out, _ = decoder(hb.concatenate((X, context), 2), state)
    assert out.shape == (7, 4, 8)


# --------------------------------------------------------------------- hybridized
CASES = [("lstm", 2, True, "TNC"), ("gru", 1, False, "NTC"), ("rnn_tanh", 2, False, "TNC"),
         ("rnn_relu", 1, True, "NTC")]


@pytest.mark.parametrize("backend,mode,num_layers,bidirectional,layout",
                         [("reference",) + CASES[0]] + [("llvm",) + c for c in CASES])
def test_eager_and_hybridized_agree(backend, mode, num_layers, bidirectional, layout):
    _eager_vs_hybridized(backend, mode, num_layers, bidirectional, layout, batch=2)


def _eager_vs_hybridized(backend, mode, num_layers, bidirectional, layout, batch):
    """Outputs, final states and gradients (inputs, parameters) of one recorded step, eager
    and then hybridized on ``backend``, agree."""
    layer, _ = setup(mode, 4, 3, num_layers, bidirectional, layout)
    dirs = 2 if bidirectional else 1
    x = RNG.normal(size=(5, batch, 3)).astype("float32")
    h0 = RNG.normal(size=(num_layers * dirs, batch, 4)).astype("float32")
    states = [h0, h0 * 0.5] if mode == "lstm" else [h0]
    wy = hb.array(RNG.normal(size=to_tnc(numpy.zeros((5, batch, 4 * dirs)), layout).shape))

    def run():
        xs = hb.array(to_tnc(x, layout))
        xs.attach_grad()
        with autograd.record():
            out, new = layer(xs, [hb.array(s) for s in states])
            loss = (out * wy).sum() + new[0].sum() + new[-1].sum()
        loss.backward()
        grads = {k: p.grad().asnumpy().copy() for k, p in layer.collect_params().items()}
        return out.asnumpy(), [s.asnumpy() for s in new], xs.grad.asnumpy(), grads

    eager = run()
    layer.hybridize(backend=backend)
    hybrid_ = run()
    close(hybrid_[0], eager[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(hybrid_[1], eager[1]):
        close(a, b, rtol=1e-5, atol=1e-5)
    close(hybrid_[2], eager[2], rtol=1e-4, atol=1e-5)
    for k in eager[3]:
        close(hybrid_[3][k], eager[3][k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,num_layers,bidirectional,layout", CASES)
def test_hybridized_default_states_agree(mode, num_layers, bidirectional, layout):
    """states=None: the zero begin states are made inside the graph."""
    layer, _ = setup(mode, 4, 3, num_layers, bidirectional, layout)
    x = hb.array(to_tnc(RNG.normal(size=(5, 2, 3)), layout))
    eager = layer(x).asnumpy()
    layer.hybridize(backend="llvm")
    close(layer(x).asnumpy(), eager, rtol=1e-5, atol=1e-5)


def test_hybridized_dropout_draws_what_eager_draws():
    layer, _ = setup("gru", 4, 3, num_layers=2, dropout=0.5)
    x = hb.array(RNG.normal(size=(5, 2, 3)))
    outs = []
    for active in (False, True):
        layer.hybridize(active=active, backend="llvm")
        hb.random.seed(3)
        with autograd.record():
            outs.append(layer(x).asnumpy())
    close(outs[1], outs[0], rtol=1e-5, atol=1e-6)


def test_hybridized_cell_unroll_agrees():
    """A cell unrolled inside a hybridized block: its input size is first learned inside the
    traced loop body (deferred initialization while tracing)."""
    cell = rnn.GRUCell(4)
    cell.initialize()

    class Unrolled(hb.nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.cell = cell

        def forward(self, x):
            return self.cell.unroll(x.shape[1], x, layout="NTC")[0]

    net = Unrolled()
    x = hb.array(RNG.normal(size=(2, 5, 3)))
    net.hybridize(backend="llvm")
    hybridized = net(x).asnumpy()
    assert cell.i2h_weight.shape == (12, 3)
    net.hybridize(active=False)
    close(hybridized, net(x).asnumpy(), rtol=1e-5, atol=1e-5)



def test_hybridized_layer_is_one_loop_per_layer_and_direction():
    """The traced graph: one foreach per layer and direction, the input projection of all
    steps one matmul outside each loop, and only the h2h product inside."""
    layer, _ = setup("lstm", 4, 3, num_layers=2, bidirectional=True)
    layer.hybridize(backend="reference")
    x = hb.array(RNG.normal(size=(5, 2, 3)))
    layer(x, layer.begin_state(2))
    graph = next(iter(layer._cached.entries.values())).graph
    counts = graph.op_counts()
    assert counts["foreach"] == 4 and counts["matmul"] == 4
    bodies = [graph.node(n)["attrs"]["body"].graph for n in graph.g.nodes
              if graph.op(n) == "foreach"]
    assert all(b.op_counts()["matmul"] == 1 for b in bodies)


def test_one_bucket_serves_every_other_sequence_length():
    layer, _ = setup("lstm", 4, 3)
    xs = [RNG.normal(size=(t, 2, 3)).astype("float32") for t in (10, 23, 35, 50)]
    want = [layer(hb.array(x)).asnumpy() for x in xs]
    layer.hybridize(backend="llvm")
    before = hb.num_compiles()
    for x, w in zip(xs, want):
        close(layer(hb.array(x)).asnumpy(), w, rtol=1e-5, atol=1e-5)
    # the first length compiles exactly; the others run one shape bucket of 64 steps, the
    # scan stopping after the real ones (hybrid/buckets.py)
    assert hb.num_compiles() - before == 2


def test_exported_layer_runs_without_its_class(tmp_path):
    layer, _ = setup("lstm", 4, 3, num_layers=2, bidirectional=True)
    x = hb.array(RNG.normal(size=(5, 2, 3)))
    states = [hb.array(RNG.normal(size=(4, 2, 4))) for _ in range(2)]
    want, want_states = layer(x, states)
    layer.hybridize(backend="llvm")
    layer(x, states)
    layer.export(str(tmp_path / "lstm"))
    out, new = hb.load(str(tmp_path / "lstm"))(x, states)
    close(out.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)
    for a, b in zip(new, want_states):
        close(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)


def test_cuda_backend_on_an_emulated_gpu(emulated_gpu):
    """The generated CUDA C (run by the host compiler under emulation) computes the layer's
    loop as eager does; forward only, to keep the compile short."""
    layer, _ = setup("lstm", 4, 3, bidirectional=True)
    x = RNG.normal(size=(5, 2, 3)).astype("float32")
    states = [RNG.normal(size=(2, 2, 4)).astype("float32") for _ in range(2)]
    want, want_states = layer(hb.array(x), [hb.array(s) for s in states])
    layer.reset_device(emulated_gpu)
    layer.hybridize(backend="cuda")
    out, new = layer(hb.array(x, device=emulated_gpu),
                     [hb.array(s, device=emulated_gpu) for s in states])
    close(out.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(new, want_states):
        close(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-5)


def test_cuda_backend_trains_on_an_emulated_gpu(emulated_gpu, tmp_path):
    """A recorded step on the CUDA backend (the forward loop stores the gates it saves for the
    backward from the cell's one fused kernel): outputs and gradients as eager's on the CPU;
    the generated sources (the loop bodies' too) compile with nvcc for sm_80 and sm_90."""
    from compiler.codegen.cuda.compile_check import available_compiler, check_compiles_all
    from runtime import config
    layer, _ = setup("lstm", 4, 3)
    x = RNG.normal(size=(5, 2, 3)).astype("float32")
    wy = RNG.normal(size=(5, 2, 4)).astype("float32")

    def step(device):
        xs = hb.array(x, device=device)
        xs.attach_grad()
        with autograd.record():
            out = layer(xs)
            loss = (out * hb.array(wy, device=device)).sum()
        loss.backward()
        return out.asnumpy(), xs.grad.asnumpy(), {
            k: p.grad(device).asnumpy().copy() for k, p in layer.collect_params().items()}
    want = step(hb.cpu())
    layer.reset_device(emulated_gpu)
    layer.hybridize(backend="cuda")
    old_dump = config.set_flag("HYBRID_DUMP_DIR", str(tmp_path))
    try:
        got = step(emulated_gpu)
    finally:
        config.set_flag("HYBRID_DUMP_DIR", old_dump)
    close(got[0], want[0], rtol=1e-5, atol=1e-5)
    close(got[1], want[1], rtol=1e-4, atol=1e-5)
    for k in want[2]:
        close(got[2][k], want[2][k], rtol=1e-4, atol=1e-5)
    sources = [src.read_text() for src in sorted(tmp_path.glob("*.cu"))]
    assert any("body" in src for src in sources), "the loop bodies' sources were not dumped"
    if available_compiler() is None:
        pytest.skip("no CUDA compiler (nvcc or CuPy's NVRTC): results checked, compile not")
    for src in sources:
        check_compiles_all(src, ("sm_80", "sm_90"))


@pytest.mark.parametrize("mode,num_layers,bidirectional,layout", CASES)
def test_loops_split_across_threads_agree_with_eager(monkeypatch, mode, num_layers,
                                                     bidirectional, layout):
    """A foreach whose body keeps the batch rows apart runs as one loop per thread over a
    slice of the batch (compiler/control_flow.py, at any size here): the same outputs, final
    states and gradients as eager."""
    from compiler import control_flow
    monkeypatch.setattr(control_flow, "SPLIT_MIN_WORK", 0)
    monkeypatch.setattr(control_flow, "SPLIT_MIN_ROWS", 1)
    monkeypatch.setattr("compiler.codegen.extern_plan.max_workers", lambda: 2)
    splits, real = [], control_flow._SplitLoop.__call__

    def counted(self, n, ins, outs):
        splits.append(real(self, n, ins, outs))
        return splits[-1]
    monkeypatch.setattr(control_flow._SplitLoop, "__call__", counted)
    _eager_vs_hybridized("llvm", mode, num_layers, bidirectional, layout, batch=4)
    assert splits and all(splits), "no loop was split"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kernels", [True, False])
def test_eager_layer_runs_its_recurrence_compiled_from_a_signatures_second_call(
        monkeypatch, mode, kernels):
    """An eager layer's recurrence runs compiled (as a fused RNN op does) from a signature's
    second call: the Python loop's outputs, states and gradients, each call; with
    HYBRID_EAGER_KERNELS=0 it stays the Python loop."""
    from hybrid.nn import rnn_layers
    from runtime import config
    monkeypatch.setattr(rnn_layers, "_SEEN", {})  # no signature seen by an earlier test
    monkeypatch.setattr(rnn_layers, "_COMPILED", {})
    old = config.set_flag("HYBRID_EAGER_KERNELS", kernels)
    try:
        # one layer, one direction: each call one use of the signature
        layer, _ = setup(mode, 4, 3, 1, False, "TNC")
        x = hb.array(RNG.normal(size=(6, 3, 3)).astype("float32"))
        h0 = RNG.normal(size=(1, 3, 4)).astype("float32")
        states = [h0, h0 * 0.5] if mode == "lstm" else [h0]

        def step():
            xs = x.copy()
            xs.attach_grad()
            with autograd.record():
                out, new = layer(xs, [hb.array(s) for s in states])
                loss = (out * out).sum() + new[-1].sum()
            loss.backward()
            return [out.asnumpy(), xs.grad.asnumpy()] + [s.asnumpy() for s in new] + \
                [p.grad().asnumpy().copy() for p in layer.collect_params().values()]
        before = hb.num_compiles()
        first = step()  # the Python loop
        assert hb.num_compiles() == before
        for _ in range(2):
            again = step()
            for a, b in zip(again, first):
                close(a, b, rtol=1e-4, atol=1e-5)
        assert (hb.num_compiles() > before) == kernels
    finally:
        config.set_flag("HYBRID_EAGER_KERNELS", old)


def test_eager_compiled_recurrence_inside_a_hybridized_parent_is_traced_with_it():
    class Net(hb.nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.lstm = rnn.LSTM(4, input_size=3)

        def forward(self, x):
            return self.lstm(x)
    net = Net()
    net.initialize()
    x = hb.array(RNG.normal(size=(5, 2, 3)).astype("float32"))
    eager = [net(x).asnumpy() for _ in range(2)]  # the second compiled, eagerly
    net.hybridize(backend="llvm")
    close(net(x).asnumpy(), eager[0], rtol=1e-5, atol=1e-5)
    close(eager[1], eager[0], rtol=1e-5, atol=1e-5)
    (entry,) = net._cached.entries.values()
    assert [entry.graph.op(n) for n in entry.graph.g.nodes].count("foreach") == 1
