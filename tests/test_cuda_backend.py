"""hybridize(backend="cuda"): graphs compiled to CUDA C and run through the GPU seam, on an
emulated GPU here (HYBRID_GPU_EMULATE=1 for this module; the generated kernels run on the
CPU under runtime/gpu/emu) and on a real one where CuPy sees it. Results equal eager
execution on the same device (which runs NumPy/CuPy) within float tolerance."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, gluon, nn
from runtime import config

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module", autouse=True)
def one_gpu():
    if hb.num_gpus() > 0 and not config.get("HYBRID_GPU_EMULATE"):
        yield  # a real GPU
        return
    old = config.set_flag("HYBRID_GPU_EMULATE", 1)
    try:
        yield
    finally:
        hb.waitall()
        config.set_flag("HYBRID_GPU_EMULATE", old)


def _mlp():
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(16, activation="tanh"), nn.Dense(10))
    return net


def _lenet():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(8, kernel_size=5, activation="sigmoid"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Dense(24, activation="sigmoid"), nn.Dense(10))
    return net


def _resnet18():
    return nn.models.resnet18(num_classes=10, width=4)  # the book's, narrow: 16x16 inputs


@pytest.mark.parametrize("make,shape", [(_mlp, (8, 20)), (_lenet, (4, 1, 16, 16)),
                                        pytest.param(_resnet18, (4, 3, 16, 16),
                                                     marks=pytest.mark.slow)])  # ~60 s
def test_training_steps_match_eager(make, shape, tmp_path):
    """Forward, loss, backward and two SGD steps (the Trainer's fused update, compiled for the
    GPU too): hybridized on the CUDA backend vs eager on the same GPU; the sources of the
    model's executables (dumped) compile with nvcc for sm_80 and sm_90."""
    from compiler.codegen.cuda.compile_check import available_compiler, check_compiles_all
    old_dump = config.set_flag("HYBRID_DUMP_DIR", str(tmp_path))
    try:
        _train_both_ways(make, shape)
    finally:
        config.set_flag("HYBRID_DUMP_DIR", old_dump)
    sources = sorted(tmp_path.glob("*.cu"))
    assert len(sources) >= 3  # forward, backward and the fused optimizer step at least
    assert any("update" in src.name for src in sources), [src.name for src in sources]
    if available_compiler() is None:
        pytest.skip("no CUDA compiler (nvcc or CuPy's NVRTC): results checked, compile not")
    for src in sources:
        check_compiles_all(src.read_text(), ("sm_80", "sm_90"))


def _train_both_ways(make, shape):
    dev = hb.gpu(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, shape[0]).astype(np.float32)
    results = []
    for backend in (None, "cuda"):
        hb.random.seed(1)
        net = make()
        net.initialize(hb.init.Xavier(), device=dev)
        if backend:
            net.hybridize(backend=backend)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        xs, ys = hb.array(x, device=dev), hb.array(y, device=dev)
        losses = []
        for _ in range(2):
            with autograd.record():
                loss = loss_fn(net(xs), ys)
            loss.backward()
            trainer.step(shape[0])
            losses.append(loss.asnumpy())
        results.append((losses, [p.data(dev).asnumpy() for p in
                                 net.collect_params().values()], net(xs).asnumpy()))
    (l0, p0, o0), (l1, p1, o1) = results
    for a, b in zip(l0, l1):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(o1, o0, rtol=1e-4, atol=1e-5)


def test_executable_report_and_source():
    from compiler.graph import Graph, NodeRef
    from compiler.ops import Spec
    from compiler.pipeline import compile as compile_graph
    g = Graph("t")
    a = g.add_input(Spec((5, 7), "float32"), "a", device="gpu(0)")
    b = g.add_input(Spec((7, 3), "float32"), "b", device="gpu(0)")
    m = g.add_op("matmul", [NodeRef(a), NodeRef(b)], {}, device="gpu(0)")
    r = g.add_op("relu", [NodeRef(m)], {}, device="gpu(0)")
    s = g.add_op("sum", [NodeRef(r)], {"axis": 0, "keepdims": False}, device="gpu(0)")
    g.outputs = [r, s]
    exe = compile_graph(g, "cuda", hb.gpu(0))
    assert exe.backend == "cuda" and exe.report["launches"] >= 2
    assert "hyb_gemm" in exe.report["cuda_source"].text
    gpu = hb.gpu(0).seam
    rng = np.random.default_rng(2)
    av = rng.standard_normal((5, 7)).astype(np.float32)
    bv = rng.standard_normal((7, 3)).astype(np.float32)
    outs = exe(gpu.xp, [gpu.to_device(av), gpu.to_device(bv)], [])
    gpu.synchronize()
    want = np.maximum(av @ bv, 0)
    np.testing.assert_allclose(gpu.to_host(outs[0]), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gpu.to_host(outs[1]), want.sum(0), rtol=1e-5, atol=1e-6)


def test_cuda_backend_refuses_a_cpu_graph():
    net = _mlp()
    net.initialize(device=hb.cpu())
    net.hybridize(backend="cuda")
    with pytest.raises(Exception, match="backend='cuda' compiles for GPUs"):
        net(hb.array(np.ones((2, 20), np.float32))).asnumpy()
