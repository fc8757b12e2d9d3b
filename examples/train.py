"""The main job: train the book's LeNet (or an MLP) hybridized, checkpoint, export, reload.

    python examples/train.py                       # LeNet on the embedded digits, CPU, offline
    python examples/train.py --model mlp --epochs 5
    python examples/train.py --no-hybridize        # the eager comparison
    python examples/train.py --data ~/fashion-mnist  # Fashion-MNIST idx files

Prints loss, accuracy and samples/s per epoch, saves a checkpoint (safetensors), exports the
hybridized model, reloads the export in a fresh Python process that never imports this
script's model code, and checks that its predictions equal the in-process ones.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import hybrid as hb
from hybrid import autograd, data, loss, nn
from hybrid.nn import models


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("lenet", "mlp"), default="lenet")
    # the book's sigmoid LeNet needs ~2,000 SGD steps to leave the plateau; the embedded
    # digits give ~45 steps per epoch, so the default is Adam, which learns in a few epochs
    p.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", 6)))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--optimizer", default="adam", help="sgd (the book's, lr 0.9), adam, ...")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--devices", default="cpu:0", help="comma list, e.g. cpu:0,cpu:1 or gpu:0")
    p.add_argument("--data", default=None, help="directory of Fashion-MNIST idx(.gz) files")
    p.add_argument("--no-hybridize", action="store_true")
    p.add_argument("--out", default=None, help="where to write checkpoint and export")
    return p.parse_args(argv)


def load_data(args):
    if args.data:
        train = data.vision.FashionMNIST(root=args.data, train=True)
        test = data.vision.FashionMNIST(root=args.data, train=False)
    else:  # the embedded 8x8 digits, upsampled to LeNet's 28x28 layout
        train = data.vision.Digits(train=True, size=28)
        test = data.vision.Digits(train=False, size=28)
    if os.environ.get("HYBRID_SMOKE"):
        train = data.SimpleDataset([train[i] for i in range(256)])
        test = data.SimpleDataset([test[i] for i in range(128)])
    return (data.DataLoader(train, args.batch_size, shuffle=True, last_batch="keep",
                            num_workers=1),
            data.DataLoader(test, args.batch_size, shuffle=False))


def evaluate(net, loader, device):
    correct = total = 0
    for x, y in loader:
        pred = net(x.to(device)).argmax(axis=1)
        correct += int((pred == y.to(device).astype("int64")).sum().item())
        total += y.shape[0]
    return correct / max(total, 1)


def main(argv=None):
    args = parse_args(argv)
    hb.random.seed(42)
    devices = [hb.parse_device(d) for d in args.devices.split(",")]
    device = devices[0]
    train_iter, test_iter = load_data(args)
    net = models.lenet() if args.model == "lenet" else models.mlp(num_outputs=10)
    net.initialize(hb.init.Xavier(), device=device)
    if not args.no_hybridize:
        net.hybridize()
    loss_fn = loss.SoftmaxCrossEntropyLoss()
    trainer = hb.Trainer(net.collect_params(), args.optimizer, {"learning_rate": args.lr})
    history = []
    for epoch in range(args.epochs):
        total_loss = n = timed = dt = compiling = 0.0
        for x, y in data.progress(train_iter, desc=f"epoch {epoch + 1}"):
            t0, compiles = time.perf_counter(), hb.num_compiles()
            x, y = x.to(device), y.to(device)
            with autograd.record():
                batch_loss = loss_fn(net(x), y)
            batch_loss.backward()
            trainer.step(x.shape[0])
            total_loss += float(batch_loss.sum().item())  # a sync point: the step is done
            n += x.shape[0]
            if hb.num_compiles() != compiles:  # traced and compiled: reported apart
                compiling += time.perf_counter() - t0
            else:
                timed += x.shape[0]
                dt += time.perf_counter() - t0
        acc = evaluate(net, test_iter, device)
        history.append((total_loss / n, acc))
        speed = f"{timed / dt:.0f} samples/s" if timed else "every step compiled"
        print(f"epoch {epoch + 1}: loss {total_loss / n:.4f}, test acc {acc:.3f}, {speed}"
              + (f" (+{compiling:.2f} s tracing and compiling)" if compiling else ""))
    if args.out:
        return _finish(args, net, history, test_iter, device, args.out)
    with tempfile.TemporaryDirectory(prefix="hybrid-train-") as out:
        print(f"writing to {out}, removed at exit (pass --out DIR to keep the files)")
        return _finish(args, net, history, test_iter, device, out)


def _finish(args, net, history, test_iter, device, out):
    """Checkpoint, curves, export, and the export reloaded in a fresh process."""
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, f"{args.model}.safetensors")
    net.save_parameters(ckpt)
    print(f"checkpoint: {ckpt}")
    _plot(history, os.path.join(out, "curves.png"))
    if args.no_hybridize:
        return history
    x0, _ = next(iter(test_iter))
    x0 = x0.to(device)
    art = os.path.join(out, f"{args.model}-export")
    net.export(art, example_inputs=(x0,))
    np.save(os.path.join(out, "x.npy"), x0.asnumpy())
    np.save(os.path.join(out, "expected.npy"), net(x0).asnumpy())
    # a fresh process that imports hybrid but never this script's model code
    code = ("import sys, numpy as np, hybrid as hb; d = sys.argv[1]; "
            "m = hb.load(d + '/" + f"{args.model}-export" + "'); "
            "y = m(hb.array(np.load(d + '/x.npy'))).asnumpy(); "
            "e = np.load(d + '/expected.npy'); "
            "print('reloaded export in a fresh process: predictions equal:', "
            "bool(np.array_equal(y, e))); sys.exit(0 if np.array_equal(y, e) else 1)")
    subprocess.run([sys.executable, "-c", code, out], check=True, cwd=tempfile.gettempdir())
    print(f"export: {art}")
    return history


def _plot(history, path):
    try:
        import matplotlib  # noqa: PLC0415 - optional
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("curves: skipped (matplotlib is not installed: pip install 'hybrid[plot]')")
        return
    fig, ax = plt.subplots(figsize=(5, 3))
    epochs = range(1, len(history) + 1)
    ax.plot(epochs, [h[0] for h in history], label="train loss")
    ax.plot(epochs, [h[1] for h in history], label="test acc")
    ax.set_xlabel("epoch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"curves: {path}")


if __name__ == "__main__":
    main()
