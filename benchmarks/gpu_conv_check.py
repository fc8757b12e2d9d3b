"""Convolution nets trained on gpu(0): hybridized (backend='cuda', through the BLAS and
through the generated GEMM) against eager on the same GPU, from the same initial weights.

    python benchmarks/gpu_conv_check.py      # a real GPU (or HYBRID_GPU_EMULATE=1)

Prints each net's largest relative parameter difference and exits 1 past the tolerance: the
real-GPU counterpart of tests/test_cuda_blas.py's emulated check.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hybrid as hb  # noqa: E402
from hybrid import autograd, nn  # noqa: E402
from runtime import config  # noqa: E402


def _nets():
    lenet = nn.HybridSequential()
    lenet.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"),
              nn.AvgPool2D(pool_size=2, strides=2),
              nn.Conv2D(16, kernel_size=5, activation="sigmoid"),
              nn.AvgPool2D(pool_size=2, strides=2), nn.Dense(10))
    mixed = nn.HybridSequential()
    mixed.add(nn.Conv2D(8, kernel_size=3, padding=1, activation="relu"),
              nn.Conv2D(16, kernel_size=3, strides=2, padding=1),
              nn.Conv2D(12, kernel_size=1, activation="tanh"), nn.Dense(10))
    return {"lenet": (lenet, (64, 1, 28, 28)), "3x3/strided/1x1": (mixed, (32, 3, 15, 13))}


def train(name, hybridize, blas):
    config.set_flag("HYBRID_CUDA_BLAS", blas)
    hb.random.seed(0)
    net, shape = _nets()[name]
    dev = hb.gpu(0)
    net.initialize(hb.init.Xavier(), device=dev)
    if hybridize:
        net.hybridize(backend="cuda")
    tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = hb.array(rng.standard_normal(shape).astype(np.float32), device=dev)
        with autograd.record():
            loss = (net(x) ** 2).mean()
        loss.backward()
        tr.step(shape[0])
    return [p.data().asnumpy() for p in net.collect_params().values()]


def main() -> int:
    bad = 0
    for name in _nets():
        eager = train(name, False, 1)
        for label, blas in (("blas", 1), ("generated gemm", 0)):
            got = train(name, True, blas)
            diff = max(float(np.max(np.abs(a - b) / (np.abs(b) + 1e-3)))
                       for a, b in zip(got, eager))
            ok = diff < 1e-3
            bad += not ok
            print(f"{name} hybridized ({label}) vs eager on gpu(0): max rel diff {diff:.2e} "
                  f"{'ok' if ok else 'FAILED'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
