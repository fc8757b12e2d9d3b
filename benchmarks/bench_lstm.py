"""Issue 22's measure: a word-level LSTM language model's training step, side by side.

    python benchmarks/bench_lstm.py                      # --steps, --reps, --lengths to size it
    python benchmarks/bench_lstm.py --torch-python /work/venv-torch/bin/python

The model: Embedding(1000 -> 128), one LSTM layer of 256, Dense(256 -> 1000) on every step
(the outputs reshaped to (T*N, 256) first, as the book's RNNModel does);
35 steps, batch 32; softmax cross-entropy (the mean over all T*N tokens); SGD, lr 0.1. One
training step = forward + loss + backward + update. Measured:

  hybrid llvm    net and loss hybridized (the LSTM's recurrence is one npx.foreach node)
  hybrid eager   the same code without hybridize()
  torch eager    nn.LSTM (a fused oneDNN/ATen LSTM on the CPU)
  torch.compile  torch.compile of the same module

Every framework runs in a process of its own, one after another, from the same initial
weights and tokens (an .npz the parent writes), so the first step's loss must agree across
them: the table prints it. PyTorch runs under its own interpreter (benchmarks/peers.py).
hybrid llvm also counts its compiles over sequence lengths --lengths (10-50): the target is
one graph for every length at a given batch (a symbolic time dimension): one shape bucket
whose programs stop at the real steps (compiler/passes/row_bounds.py) per hybridized block,
its forward and backward.

Figures: ms per step, median over --reps runs of --steps steps each (ending with a sync)
[fastest run]; ratios to torch eager of this run.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers

peers.adopt_host_path()  # a peer's venv: hybrid and its dependencies from the parent's path

import numpy as np

VOCAB, EMBED, HIDDEN, STEPS, BATCH, LR = 1000, 128, 256, 35, 32, 0.1
PARTS = ("hybrid llvm", "hybrid eager", "torch eager", "torch.compile")


def make_inputs(path, lengths):
    """Initial weights (MXNet's names and layouts) and token batches, saved to ``path``."""
    rng = np.random.default_rng(0)

    def uniform(*shape, scale=0.07):
        return rng.uniform(-scale, scale, shape).astype(np.float32)
    g = 4 * HIDDEN
    arrays = {"embedding.weight": uniform(VOCAB, EMBED),
              "lstm.l0_i2h_weight": uniform(g, EMBED), "lstm.l0_h2h_weight": uniform(g, HIDDEN),
              "lstm.l0_i2h_bias": uniform(g), "lstm.l0_h2h_bias": uniform(g),
              "dense.weight": uniform(VOCAB, HIDDEN), "dense.bias": uniform(VOCAB)}
    for t in [STEPS] + sorted(set(lengths) - {STEPS}):  # the timed batch never depends on
        # which other lengths are asked for
        arrays[f"x{t}"] = rng.integers(0, VOCAB, (t, BATCH)).astype(np.int64)
        arrays[f"y{t}"] = rng.integers(0, VOCAB, (t, BATCH)).astype(np.int64)
    np.savez(path, **arrays)


def timed(step, sync, steps, reps, warmup):
    """(median, fastest) ms per step over ``reps`` runs of ``steps`` steps, after warm-up."""
    for _ in range(warmup):
        step()
    sync()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        runs.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(runs), min(runs)


# ------------------------------------------------------------------ hybrid
def run_hybrid(data, hybridized, args):
    import hybrid as hb
    from hybrid import autograd, gluon, loss, nn

    class LanguageModel(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(VOCAB, EMBED)
            self.lstm = gluon.rnn.LSTM(HIDDEN, input_size=EMBED)
            self.dense = nn.Dense(VOCAB, in_units=HIDDEN)

        def forward(self, tokens):  # (T, N) -> logits (T*N, V), as the book's RNNModel
            y = self.lstm(self.embedding(tokens))
            return self.dense(y.reshape((-1, HIDDEN)))

    net = LanguageModel()
    net.initialize()
    net.load_dict({k: data[k] for k in data.files if k[0] not in "xy"})
    loss_fn = loss.SoftmaxCrossEntropyLoss()
    if hybridized:
        net.hybridize(backend=args.backend)
        loss_fn.hybridize(backend=args.backend)
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})
    batches = {t: (hb.array(data[f"x{t}"], dtype="int64"), hb.array(data[f"y{t}"]))
               for t in [STEPS] + args.lengths}
    losses = []

    def step(t=STEPS):
        x, y = batches[t]
        with autograd.record():
            l = loss_fn(net(x), y.reshape((-1,))).mean()
        l.backward()
        trainer.step(1)  # the loss is already the mean over all tokens
        return l

    out = {"first loss": float(step().item())}
    before = hb.num_compiles()
    out["ms"] = timed(step, hb.waitall, args.steps, args.reps, args.warmup)
    if hybridized:
        out["recompiles in timing"] = hb.num_compiles() - before
        before = hb.num_compiles()
        for t in args.lengths:
            losses.append(float(step(t).item()))
        out["compiles over lengths"] = hb.num_compiles() - before
    return out


# ------------------------------------------------------------------ torch
def run_torch(data, compiled, args):
    import torch

    class LanguageModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(VOCAB, EMBED)
            self.lstm = torch.nn.LSTM(EMBED, HIDDEN)  # gates [i, f, g, o], as MXNet's
            self.dense = torch.nn.Linear(HIDDEN, VOCAB)

        def forward(self, tokens):
            return self.dense(self.lstm(self.embedding(tokens))[0].reshape(-1, HIDDEN))

    model = LanguageModel()
    names = {"embedding.weight": "embedding.weight", "lstm.weight_ih_l0": "lstm.l0_i2h_weight",
             "lstm.weight_hh_l0": "lstm.l0_h2h_weight", "lstm.bias_ih_l0": "lstm.l0_i2h_bias",
             "lstm.bias_hh_l0": "lstm.l0_h2h_bias", "dense.weight": "dense.weight",
             "dense.bias": "dense.bias"}
    model.load_state_dict({k: torch.from_numpy(data[v]) for k, v in names.items()})
    fwd = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = torch.from_numpy(data[f"x{STEPS}"]), torch.from_numpy(data[f"y{STEPS}"])
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        l = lossf(fwd(x), y.reshape(-1))
        l.backward()
        opt.step()
        return l

    out = {"first loss": float(step().item()), "threads": torch.get_num_threads()}
    out["ms"] = timed(step, lambda: None, args.steps, args.reps, args.warmup)
    return out


def child(part, path, args):
    data = np.load(path)
    if part.startswith("hybrid"):
        res = run_hybrid(data, part == "hybrid llvm", args)
    else:
        res = run_torch(data, part == "torch.compile", args)
    print(json.dumps(res))


def run_part(part, path, argv):
    py = peers.interpreter("torch" if part.startswith("torch") else "hybrid")
    if py is None:
        return None, "not installed"
    proc = subprocess.run([py, os.path.abspath(__file__), "--part", part, path] + argv,
                          capture_output=True, text=True, timeout=1800, check=False,
                          env=peers.child_env())
    if proc.returncode != 0:
        return None, "failed: " + proc.stderr.strip()[-400:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def load():
    try:
        return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "load average n/a"


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", nargs=2, metavar=("PART", "NPZ"), help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=10, help="steps per timed run")
    ap.add_argument("--reps", type=int, default=3, help="timed runs (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--lengths", default="10,20,30,40,50",
                    help="sequence lengths for the compile count (comma-separated)")
    ap.add_argument("--backend", default="llvm", help="hybridize backend")
    ap.add_argument("--parts", default=",".join(PARTS), help="which of " + ", ".join(PARTS))
    ap.add_argument("--torch-python", help="the interpreter of a venv with torch")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    args.lengths = [int(t) for t in args.lengths.split(",") if t]
    if args.part:
        return child(*args.part, args)
    peers.choose("torch", args.torch_python)
    print(f"LSTM language model training step: vocab {VOCAB}, embedding {EMBED}, LSTM "
          f"{HIDDEN}, {STEPS} steps, batch {BATCH}, SGD; {os.cpu_count()} CPU(s)")
    print(f"{load()} (at start); ms per step, median of {args.reps} runs of {args.steps} "
          "steps [fastest]")
    passed = ["--steps", str(args.steps), "--reps", str(args.reps), "--warmup",
              str(args.warmup), "--lengths", ",".join(map(str, args.lengths)), "--backend",
              args.backend]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lm.npz")
        make_inputs(path, args.lengths)
        for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
            res, why = run_part(part, path, passed)
            if res is None:
                print(f"   {part:14s} {why}")
                continue
            results[part] = res
            med, best = res["ms"]
            print(f"   {part:14s} {med:9.1f} [{best:8.1f}] ms/step   first-step loss "
                  f"{res['first loss']:.6f}")
    base = results.get("torch eager")
    if base:
        print("\nRatios to torch eager (this run; < 1 is faster than PyTorch eager):")
        for part, res in results.items():
            print(f"   {part:14s} {res['ms'][0] / base['ms'][0]:6.2f}x")
    hyb = results.get("hybrid llvm")
    if hyb and "compiles over lengths" in hyb:
        print(f"\nhybrid llvm: {hyb['compiles over lengths']} compile(s) for sequence lengths "
              f"{args.lengths} after the length-{STEPS} graph (target: one graph per block "
              "for every length: the network's bucket and the loss's, forward and backward "
              f"each, is 4); {hyb['recompiles in timing']} during the timed steps")
    print(f"{load()} (at end)")


if __name__ == "__main__":
    main()
