"""Model-parallel graphs across a GPU and the CPU: a hybridized forward that moves values
with ``x.to(hb.gpu(0))`` ... ``.to(hb.cpu())`` is cut into device parts
(compiler/passes/partition.py); each GPU part compiles to CUDA C and each CPU part to LLVM
(pipeline.part_backend), and a value entering a part from another device is copied there
first (dispatch._moved). On an emulated GPU; results equal eager execution."""
import numpy as np
import pytest

import hybrid as hb
from compiler.pipeline import part_backend
from hybrid import autograd, gluon, nn
from runtime import transfer

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


class GpuThenCpu(nn.HybridBlock):
    """The first layer on gpu(0), the second on the CPU."""

    def __init__(self):
        super().__init__()
        self.a = nn.Dense(8, activation="tanh", in_units=6)
        self.b = nn.Dense(3, in_units=8)

    def forward(self, x):
        h = self.a(x.to(hb.gpu(0)))
        return self.b(h.to(hb.cpu()))


def _net(hybridize):
    hb.random.seed(7)
    net = GpuThenCpu()
    net.a.initialize(hb.init.Xavier(), device=hb.gpu(0))
    net.b.initialize(hb.init.Xavier(), device=hb.cpu())
    if hybridize is not None:
        net.hybridize(**hybridize)
    return net


def _train(net, steps=2):
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rng = np.random.default_rng(3)
    outs = []
    for _ in range(steps):
        x = hb.array(rng.standard_normal((5, 6)).astype(np.float32))
        y = hb.array(rng.standard_normal((5, 3)).astype(np.float32))
        with autograd.record():
            out = net(x)
            loss = ((out - y) ** 2).sum()
        loss.backward()
        outs.append((out.asnumpy(), [p.grad().asnumpy() for p in
                                     net.collect_params().values()]))
        trainer.step(5)
    return outs, [p.data().asnumpy() for p in net.collect_params().values()]


def test_part_backend_by_device():
    assert part_backend("cuda", "gpu(1)") == "cuda"
    assert part_backend("cuda", "cpu(0)") == "llvm"
    assert part_backend("llvm", "gpu(0)") == "cuda"  # LLVM code cannot read GPU memory
    assert part_backend("reference", "gpu(0)") == "reference"


@pytest.mark.parametrize("flags", [{"active": True}, {"backend": "cuda"}])
def test_gpu_and_cpu_parts_train_as_eager(emulated_gpu, flags, monkeypatch):
    moves = []
    real_push_copy = transfer.push_copy

    def push_copy(buf, src, dst, name="copyto", *args, **kwargs):
        if ":to " in name:  # the copies made between parts (not the user's x.to(...))
            moves.append((src.kind, dst.kind))
        return real_push_copy(buf, src, dst, name, *args, **kwargs)
    monkeypatch.setattr(transfer, "push_copy", push_copy)

    want_steps, want_params = _train(_net(None))
    assert not moves  # eager: only the user's own copies
    net = _net(flags)
    got_steps, got_params = _train(net)
    for (wo, wg), (go, gg) in zip(want_steps, got_steps):
        np.testing.assert_allclose(go, wo, rtol=1e-4, atol=1e-5)
        for a, b in zip(gg, wg):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(got_params, want_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    [entry] = net._cached.entries.values()
    backends = {(p.device, p.exe.backend) for p in entry.exe.parts}
    assert backends == {("gpu(0)", "cuda"), ("cpu(0)", "llvm")}, backends
    # each call's forward moves x to the GPU and the GPU's result to the CPU
    assert ("cpu", "gpu") in moves and ("gpu", "cpu") in moves
