"""D2L 12.6 Concise Implementation for Multiple GPUs: ResNet-18, Trainer and a kvstore.

    python examples/ch12_6_multi_device_concise.py
    python examples/ch12_6_multi_device_concise.py --width 64 --size 28   # the book's net
    HYBRID_SMOKE=1 python examples/ch12_6_multi_device_concise.py

The book's code on hybrid: the ResNet-18 variant (3x3 stride-1 stem, no max-pool),
``net.initialize(..., device=devices)`` (one copy of every parameter per device),
``hb.split_batch``, a Trainer whose kvstore ('device') sums the gradients across devices
before the update, and accuracy evaluated on every device's shard; 1 device vs 2 devices with
the global batch and the learning rate both doubled (the book: 256 / 0.1 vs 512 / 0.2).

Scaled down for a 2-core CPU, and said so in the output: width 8 instead of 64 channels in
the first stage, the embedded digits at 16x16 instead of Fashion-MNIST at 28x28 (96x96 in the
book's GPU runs), batch 64 per device (the digits set gives only 1442 training images: at
256 per device a 2-device epoch would be 2 steps). Full mode hybridizes the net (the LLVM
backend): the first step traces and compiles the training graph -- minutes on this machine
with a cold compile cache, seconds once ~/.cache/hybrid holds it. Smoke mode runs eagerly at
tiny sizes (no compile).
"""
from __future__ import annotations

import argparse
import time

import _common as C  # noqa: I001 - puts the repository on sys.path first
import numpy as np

import hybrid as hb
from hybrid import autograd, data, init
from hybrid import loss as gloss
from hybrid.nn import models


def try_devices(n):
    if hb.num_gpus() >= n:
        return [hb.gpu(i) for i in range(n)]
    return [hb.cpu(i) for i in range(n)]


def split_batch(X, y, devices):
    fn = getattr(hb, "split_batch", None)
    if fn is not None:
        return fn(X, y, devices)
    n = X.shape[0] // len(devices)   # fallback while hybrid.parallel is not in this checkout
    return ([X[i * n:(i + 1) * n].copyto(d) for i, d in enumerate(devices)],
            [y[i * n:(i + 1) * n].copyto(d) for i, d in enumerate(devices)])


def evaluate_accuracy_devices(net, data_iter):
    """Accuracy with every device evaluating its shard (the book's evaluate_accuracy_gpus)."""
    devices = list(net.collect_params().values())[0].list_device()
    correct = total = 0
    for features, labels in data_iter:
        X_shards, y_shards = split_batch(features, labels, devices)
        pred_shards = [net(X_shard) for X_shard in X_shards]   # in parallel, one per device
        correct += sum(int((p.argmax(axis=1).astype("int32") == y.astype("int32")).sum().item())
                       for p, y in zip(pred_shards, y_shards))
        total += labels.shape[0]
    return correct / max(total, 1)


def load_data(batch_size, size, eval_batch):
    train = data.vision.Digits(train=True, size=size)
    test = data.vision.Digits(train=False, size=size)
    if C.SMOKE:
        train = data.SimpleDataset([train[i] for i in range(512)])
    n_test = len(test) // eval_batch * eval_batch   # fixed shapes: one compiled signature
    test = data.SimpleDataset([test[i] for i in range(n_test)])
    return (data.DataLoader(train, batch_size, shuffle=True, last_batch="discard"),
            data.DataLoader(test, eval_batch, shuffle=False))


def train(net, num_devices, batch_size, lr, args):
    devices = try_devices(num_devices)
    train_iter, test_iter = load_data(batch_size, args.size, args.eval_batch * num_devices)
    hb.random.seed(0)
    net.initialize(init=init.Normal(sigma=0.01), device=devices, force_reinit=True)
    trainer = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})
    loss = gloss.SoftmaxCrossEntropyLoss()
    times, accs, losses = [], [], []
    first_step = None
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        epoch_loss = []
        for features, labels in train_iter:
            ts = time.perf_counter()
            X_shards, y_shards = split_batch(features, labels, devices)
            with autograd.record():
                ls = [loss(net(X_shard), y_shard) for X_shard, y_shard
                      in zip(X_shards, y_shards)]
            for l in ls:
                l.backward()
            trainer.step(batch_size)
            epoch_loss += [l.sum() for l in ls]   # read after the epoch: no sync per step
            if first_step is None:
                hb.waitall()
                first_step = time.perf_counter() - ts
                t0 += first_step       # report the compile separately from the epoch
        hb.waitall()
        times.append(time.perf_counter() - t0)
        losses.append(sum(float(x.item()) for x in epoch_loss) / (len(epoch_loss) // num_devices
                                                                  * batch_size))
        accs.append(evaluate_accuracy_devices(net, test_iter))
        print(f"    epoch {epoch + 1:2d}: train loss {losses[-1]:.3f}, test acc {accs[-1]:.3f}"
              f"  ({times[-1]:.1f} s)")
    kv = trainer.kvstore
    w = net[0].weight
    same = all(np.array_equal(w.data(devices[0]).asnumpy(), w.data(d).asnumpy())
               for d in devices[1:])
    print(f"  test acc: {accs[-1]:.2f}, {np.mean(times):.1f} sec/epoch on "
          f"{[str(d) for d in devices]} (first step, incl. trace + compile: {first_step:.1f} s)")
    print(f"  kvstore: {kv if kv is not None else 'none needed (one device)'}; the copies of "
          f"the stem's weight on every device are identical: {same}")
    return accs[-1], float(np.mean(times)), same, losses


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=C.smoke(8, 4), help="first-stage channels "
                   "(the book: 64)")
    p.add_argument("--size", type=int, default=C.smoke(16, 8), help="image side")
    p.add_argument("--epochs", type=int, default=C.smoke(6, 2))
    p.add_argument("--batch-size", type=int, default=C.smoke(64, 32),
                   help="per device: the global batch is this times the device count")
    p.add_argument("--lr", type=float, default=0.1, help="for one device; times the count")
    p.add_argument("--eval-batch", type=int, default=C.smoke(64, 50))
    p.add_argument("--devices", default="1,2")
    p.add_argument("--no-hybridize", action="store_true", default=C.SMOKE)
    args = p.parse_args(argv)
    C.header("12.6", "concise multi-device training: ResNet-18, Trainer, kvstore", None)
    print(f"ResNet-18 variant, width {args.width} (book: 64), digits at {args.size}x{args.size}"
          f" (book: Fashion-MNIST), {args.batch_size} images per device per step, "
          f"{'eager' if args.no_hybridize else 'hybridized (LLVM)'}; scaled down for a "
          "2-core CPU")
    net = models.resnet18(10, width=args.width)
    if not args.no_hybridize:
        net.hybridize()

    C.section("parameters are initialized on every device")
    devices = try_devices(2)
    net.initialize(init=init.Normal(sigma=0.01), device=devices)
    x = hb.random.uniform(size=(4, 1, args.size, args.size))
    x_shards = split_batch(x, hb.zeros((4,)), devices)[0]
    outs = [net(xs) for xs in x_shards]
    weight = net[0].weight
    w0, w1 = weight.data(devices[0]), weight.data(devices[1])
    print(f"  outputs: {[f'{o.shape} on {o.device}' for o in outs]}")
    print(f"  stem weight[0, 0, 0] on {devices[0]}: {w0.asnumpy()[0, 0, 0]}\n"
          f"  stem weight[0, 0, 0] on {devices[1]}: {w1.asnumpy()[0, 0, 0]}")
    C.result("init.copies_identical", bool(np.array_equal(w0.asnumpy(), w1.asnumpy())))

    results = {}
    for n in [int(s) for s in args.devices.split(",")]:
        gb, lr = args.batch_size * n, args.lr * n
        C.section(f"train(num_devices={n}, batch_size={gb}, lr={lr:g})")
        acc, sec, same, losses = train(net, n, gb, lr, args)
        results[n] = (acc, sec)
        C.result(f"train{n}.test_acc", acc)
        C.result(f"train{n}.loss_first_epoch", losses[0])
        C.result(f"train{n}.loss_last_epoch", losses[-1])
        C.result(f"train{n}.sec_per_epoch", sec)
        C.result(f"train{n}.replicas_identical", same)
    if 1 in results and 2 in results:
        (a1, s1), (a2, s2) = results[1], results[2]
        C.note(f"""
1 device: accuracy {a1:.2f}, {s1:.1f} s/epoch; 2 devices: accuracy {a2:.2f}, {s2:.1f} s/epoch
(speed-up {s1 / s2:.2f}x). The book finds that ResNet-18's computation dominates the
synchronization, so 2 GPUs nearly halve the epoch time. On two logical CPU devices sharing 2
loaded cores the headroom is at most 2x and the kvstore's summing of 62 gradients per step is
not free; on GPUs the same script runs with hb.gpu(0), hb.gpu(1). With the global batch doubled,
2 devices make half as many steps per epoch on the same data, so after the same number of
epochs their accuracy can trail (the book's Fashion-MNIST has 235 steps per epoch at 256; the
digits set has {1442 // args.batch_size} at {args.batch_size}).""")
    if C.SMOKE:
        C.note("""
Smoke mode trains for a few dozen steps only: the training loss falls, but the test accuracy
is still near chance because BatchNorm's running statistics (momentum 0.9), which predict
mode uses, have not caught up yet. Run without HYBRID_SMOKE for a real training.""")
    C.footer()


if __name__ == "__main__":
    main()
