"""Dive into Deep Learning 9.6 / 10.1 -- a character-level language model with gluon.rnn.LSTM.

The book's RNNModel (one-hot inputs, an LSTM layer, a Dense decoder over every step), trained
with SGD and gradient clipping on sequential minibatches, perplexity reported per epoch, then
text predicted from a prefix. The corpus is The Zen of Python (Python's ``this`` module), so
the example needs no download; the book uses H. G. Wells' The Time Machine.

Three runs of the same model from the same initial weights and batches:
  eager        no hybridize(): the layer's recurrence still runs compiled from its second
               call (as MXNet's and PyTorch's fused RNN ops do; HYBRID_EAGER_KERNELS=0 keeps
               the Python loop)
  hybridized   net and loss hybridized: the LSTM is one foreach node, its loop split across
               the cores over the batch
  lengths      hybridized, each batch cut to a random length: shape buckets serve every
               length from a few graphs (the recompiles are counted)
"""
from __future__ import annotations

import codecs
import contextlib
import io
import math
import time

import _common as C

hb = C.hb
from hybrid import autograd, gluon, npx  # noqa: E402
from hybrid import np as hnp  # noqa: E402
from hybrid.gluon import nn, rnn  # noqa: E402

NUM_STEPS = C.smoke(35, 12)
BATCH = C.smoke(32, 8)
HIDDEN = C.smoke(256, 32)
EPOCHS = C.smoke(60, 6)
LR, CLIP = 1.0, 1.0


def corpus():
    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints the Zen
        import this  # noqa: PLC0415
    text = codecs.decode(this.s, "rot13").lower()
    chars = sorted(set(text))
    vocab = {c: i for i, c in enumerate(chars)}
    return text * C.smoke(8, 2), chars, vocab


class RNNModel(nn.HybridBlock):
    """The book's RNNModel: one-hot tokens -> rnn layer -> Dense over every step."""

    def __init__(self, rnn_layer, vocab_size):
        super().__init__()
        self.rnn = rnn_layer
        self.vocab_size = vocab_size
        self.dense = nn.Dense(vocab_size)

    def forward(self, inputs, state):
        x = npx.one_hot(inputs.T, self.vocab_size)
        y, state = self.rnn(x, state)
        return self.dense(y.reshape(-1, y.shape[-1])), state

    def begin_state(self, *args, **kwargs):
        return self.rnn.begin_state(*args, **kwargs)


def batches(ids, batch, steps, rng, random_lengths=False):
    """The book's sequential partitioning: (X, Y) minibatches of (batch, steps) tokens, Y
    one token ahead; with random_lengths each batch is cut to a length in [steps/3, steps]."""
    offset = int(rng.integers(0, steps))
    n = ((len(ids) - offset - 1) // batch) * batch
    xs = hnp.array(ids[offset:offset + n]).reshape(batch, -1)
    ys = hnp.array(ids[offset + 1:offset + 1 + n]).reshape(batch, -1)
    for i in range(0, xs.shape[1] - steps + 1, steps):
        t = int(rng.integers(max(2, steps // 3), steps + 1)) if random_lengths else steps
        yield xs[:, i:i + t], ys[:, i:i + t]


def clip(params, theta):
    norm = math.sqrt(sum(float((p.grad() ** 2).sum().item()) for p in params))
    if norm > theta:
        for p in params:
            p.grad()[:] *= theta / norm


def train(net, ids, vocab_size, hybridize, random_lengths=False, seed=0):
    import numpy as onp
    if hybridize:
        net.hybridize()
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    if hybridize:
        loss.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})
    params = [p for p in net.collect_params().values()]
    rng = onp.random.default_rng(seed)
    history, t0 = [], time.perf_counter()
    compiles0 = hb.num_compiles()
    for epoch in range(EPOCHS):
        if epoch == 1:  # the first epoch traces and compiles: the speed is the others'
            hb.waitall()
            t0 = time.perf_counter()
        total, count = 0.0, 0
        state = net.begin_state(batch_size=BATCH, device=hb.cpu())
        for X, Y in batches(ids, BATCH, NUM_STEPS, rng, random_lengths):
            state = [s.detach() for s in state]
            with autograd.record():
                y_hat, state = net(X, state)
                l = loss(y_hat, Y.T.reshape(-1)).mean()
            l.backward()
            clip(params, CLIP)
            trainer.step(1)
            total += float(l.item()) * Y.size
            count += Y.size
        history.append(math.exp(total / count))
    hb.waitall()
    return history, (time.perf_counter() - t0) / max(1, EPOCHS - 1), \
        hb.num_compiles() - compiles0


def predict(prefix, n, net, vocab, chars):
    state = net.begin_state(batch_size=1, device=hb.cpu())
    out = [vocab[prefix[0]]]
    for c in prefix[1:]:  # warm up on the prefix
        _, state = net(hnp.array([[out[-1]]]), state)
        out.append(vocab[c])
    for _ in range(n):
        y, state = net(hnp.array([[out[-1]]]), state)
        out.append(int(y.argmax(axis=1).reshape(1).item()))
    return "".join(chars[i] for i in out)


def make_net(vocab_size, init_from=None):
    net = RNNModel(rnn.LSTM(HIDDEN), vocab_size)
    net.initialize(hb.init.Xavier())
    net(hnp.zeros((BATCH, NUM_STEPS)), net.begin_state(batch_size=BATCH, device=hb.cpu()))
    if init_from is not None:
        net.load_dict({k: p.data() for k, p in init_from.collect_params().items()})
    return net


def main():
    C.header("9.6 / 10.1", "a character-level LSTM language model", __doc__)
    text, chars, vocab = corpus()
    ids = [vocab[c] for c in text]
    print(f"corpus: {len(text)} characters, vocabulary {len(chars)}; batch {BATCH}, "
          f"{NUM_STEPS} steps, LSTM({HIDDEN}), {EPOCHS} epochs, SGD lr {LR}, clip {CLIP}")
    hb.random.seed(0)
    first = make_net(len(chars))
    runs = {}
    for name, hyb, lengths in (("eager", False, False), ("hybridized", True, False),
                               ("lengths", True, True)):
        C.section(name)
        net = make_net(len(chars), init_from=first)
        history, seconds, compiles = train(net, ids, len(chars), hyb, lengths)
        runs[name] = (history, seconds, compiles, net)
        print(f"perplexity {history[0]:.2f} (epoch 1) -> {history[-1]:.2f} (epoch {EPOCHS}); "
              f"{seconds * 1e3:.0f} ms per epoch after the first; {compiles} compile(s)")
        print(f"  predict 'beautiful ': {predict('beautiful ', 40, net, vocab, chars)!r}")
    eager, hybrid_ = runs["eager"][0], runs["hybridized"][0]
    C.section("claims")
    C.result("ppl.first_epoch.eager", eager[0])
    C.result("ppl.last_epoch.eager", eager[-1])
    C.result("ppl.last_epoch.hybridized", hybrid_[-1])
    C.result("ppl.last_epoch.lengths", runs["lengths"][0][-1])
    # one program: the same weights and batches give the same first epoch, whatever runs it
    C.result("ppl.first_epoch_agree", abs(eager[0] - hybrid_[0]) <= 1e-3 * eager[0])
    C.result("ppl.learned", eager[-1] < 0.85 * eager[0] and hybrid_[-1] < 0.85 * hybrid_[0])
    C.result("lengths.compiles", runs["lengths"][2])
    for name in runs:
        C.result(f"ms_per_epoch.{name}", runs[name][1] * 1e3)
    print(f"\nhybridized is {runs['eager'][1] / runs['hybridized'][1]:.1f}x eager here "
          f"({C.load()})")


if __name__ == "__main__":
    main()
