"""GPUs through the seam (runtime/gpu): emulated ones here, real ones where CuPy sees a GPU.

Without a real GPU (CI, this machine) the module runs on two emulated GPUs
(``HYBRID_GPU_EMULATE=2``, set by the ``gpus`` fixture for this module only and restored
after, so other test files see no GPU whatever the order). Where CuPy sees a GPU and
``HYBRID_GPU_EMULATE`` is not set (``benchmarks/gpu_check.sh``), the same tests run on the real
device; the tests that need two GPUs skip on a one-GPU machine, the emulated-only ones (the
emulated streams' own mechanics) skip there, and the ``gpu``-marked ones run only there.

Checked: the seam (memory, copies each way and between GPUs, stream order and events,
capture/replay of kernel launches through the emulator, GEMM), device selection and its
errors, every registry op eagerly on gpu(0) against NumPy, transfers as engine ops on the copy
lane (they overlap compute), autograd, an MLP trained on gpu(0) against cpu(0), and two GPUs
with split_and_load and Trainer(kvstore="device") against one device.
"""
from __future__ import annotations

import importlib.util
import os
import threading

import numpy as np
import pytest

import hybrid as hb
from compiler.ops import REGISTRY, eager_apply
from hybrid import autograd, nn
from runtime import config
from runtime.engine import WaitTimeout, get_engine
from runtime.gpu import GPUError, emulated, get_gpu, seam
from runtime.gpu.cupy_gpu import device_count
from test_ops import ACC_TOL, OP_CASES, TOL

REAL = not os.environ.get("HYBRID_GPU_EMULATE") and device_count() > 0
real_gpu = pytest.mark.skipif(not REAL, reason="needs a real NVIDIA GPU with CuPy (run by "
                              "benchmarks/gpu_check.sh); this machine has none")
emulated_only = pytest.mark.skipif(REAL, reason="the emulated streams' own mechanics")
HAVE_EMU = importlib.util.find_spec("runtime.gpu.emu.build") is not None
needs_emu = pytest.mark.skipif(not HAVE_EMU, reason="runtime.gpu.emu.build (the CUDA C "
                               "emulator) is not in this tree yet")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def gpus():
    """Two emulated GPUs for this module, unless a real GPU is here to test instead."""
    if REAL:
        yield hb.num_gpus()
        return
    old = config.set_flag("HYBRID_GPU_EMULATE", 2)
    try:
        yield 2
    finally:
        hb.waitall()
        config.set_flag("HYBRID_GPU_EMULATE", old)


def two_gpus():
    if hb.num_gpus() < 2:
        pytest.skip(f"needs two GPUs; this machine has {hb.num_gpus()}")


def _close(got, want, acc=False, tol=None, exact=True):
    """Equal bits on an emulated GPU (the same NumPy code runs) unless not ``exact`` (a GPU's
    own branch, run by the emulator too); a GPU's rounding otherwise (``tol``: (rtol, atol)
    where several steps let it grow)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    if (not REAL and exact) or want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        rtol, atol = tol or (ACC_TOL if acc else TOL).get(want.dtype.name, (1e-6, 1e-6))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


# ================================================================== selection and errors
def test_selection_and_clear_errors():
    n = hb.num_gpus()
    assert n >= 1 and hb.gpu(n - 1).xp is get_gpu(n - 1).xp
    assert seam.implementation() == ("cupy" if REAL else "emulated")
    if not REAL:
        assert n == 2 and hb.gpu(1).xp.ndarray is emulated.DeviceArray and \
            hb.gpu(0).seam.implementation == "emulated"
    with pytest.raises(hb.DeviceError, match=rf"gpu\({n + 3}\) was used, but this machine "
                                             rf"has {n} GPU\(s\).*i < {n}"):
        hb.gpu(n + 3).xp
    with pytest.raises(hb.DeviceError, match=rf"gpu\({n + 3}\)"):
        hb.ones((2,), device=hb.gpu(n + 3))
    with pytest.raises(hb.DeviceError, match="not a GPU"):
        hb.cpu(0).seam


@emulated_only
def test_flag_decides_at_each_query():
    """num_gpus follows HYBRID_GPU_EMULATE at every call (no cached count): tests may set it
    in any order. Off, without CuPy, a GPU's first use says how to get one."""
    old = config.set_flag("HYBRID_GPU_EMULATE", 3)
    try:
        assert hb.num_gpus() == 3 and hb.gpu(2).xp.ndarray is emulated.DeviceArray
        config.set_flag("HYBRID_GPU_EMULATE", 0)
        assert hb.num_gpus() == device_count() == 0
        with pytest.raises(hb.DeviceError, match=r"hybrid\[gpu\].*HYBRID_GPU_EMULATE=N.*hb\.cpu"):
            hb.gpu(0).xp
        hb.waitall()  # GPU workers the engine still has: nothing to wait for, no error
    finally:
        config.set_flag("HYBRID_GPU_EMULATE", old)
    assert hb.num_gpus() == 2


# ================================================================== the seam
def test_alloc_views_and_free():
    g = get_gpu(0)
    buf = g.alloc(1024)
    assert buf.nbytes == 1024 and buf.ptr % 256 == 0
    v = buf.view((16,), "float32", offset=64)
    with g.activate():  # CuPy queues on the current stream: the compute stream, as ops do
        v[...] = g.xp.arange(16, dtype=np.float32)
    w = buf.view((4, 4), "float32", offset=64)
    np.testing.assert_array_equal(g.to_host(w).ravel(), np.arange(16, dtype=np.float32))
    with pytest.raises(ValueError, match="does not fit"):
        buf.view((300,), "float32")
    g.free(buf)
    with pytest.raises(GPUError, match="freed"):
        buf.view((1,), "float32")


def test_copies_each_way_on_streams():
    g = get_gpu(0)
    host = np.arange(12, dtype=np.float64).reshape(3, 4)
    d = g.empty((3, 4), "float64")
    s = g.new_stream("test")
    g.copy_h2d(d, host, s)
    back = np.zeros_like(host)
    g.copy_d2h(back, d, s)  # same stream: after the upload
    e = s.record()
    e.synchronize()
    assert e.query() and s.query()
    np.testing.assert_array_equal(back, host)
    d2 = g.empty((3, 4), "float64")
    g.copy_d2d(d2, d, s)
    s.synchronize()
    np.testing.assert_array_equal(g.to_host(d2), host)
    np.testing.assert_array_equal(g.to_host(g.to_device(host.T)), host.T)  # any layout
    with pytest.raises(ValueError, match="does not match"):
        g.copy_h2d(g.empty((4, 3), "float64"), host, s)
    with pytest.raises(ValueError, match="C-contiguous"):
        g.copy_d2h(np.zeros((4, 3)), d.T, s)


def test_copy_between_gpus():
    two_gpus()
    g0, g1 = get_gpu(0), get_gpu(1)
    x = g0.to_device(np.linspace(0, 1, 1000, dtype=np.float32))
    y = g1.from_gpu(x, g0)
    np.testing.assert_array_equal(g1.to_host(y), np.linspace(0, 1, 1000, dtype=np.float32))
    z = g1.empty(x.shape, x.dtype)
    s = g1.new_stream()
    s.wait(g0.compute_stream.record())
    g1.copy_d2d(z, x, s)
    s.synchronize()
    np.testing.assert_array_equal(g1.to_host(z), g0.to_host(x))


def test_events_order_work_across_streams():
    """Stream b waits for a's event: b's copy reads what a wrote, however long a took."""
    g = get_gpu(0)
    a, b = g.new_stream("a"), g.new_stream("b")
    src = np.random.default_rng(0).standard_normal(1 << 20)
    mid, out = g.empty(src.shape, src.dtype), g.empty(src.shape, src.dtype)
    for _ in range(3):  # a few rounds: a race would show
        g.copy_h2d(mid, src, a)
        b.wait(a.record())
        g.copy_d2d(out, mid, b)
        b.synchronize()
        np.testing.assert_array_equal(g.to_host(out), src)
        src = src + 1
    fresh = g.new_event()
    assert fresh.query()  # never recorded: done, as in CUDA
    fresh.synchronize(timeout=1)


@emulated_only
def test_emulated_streams_run_in_order_on_their_own_thread():
    g = get_gpu(0)
    s, t = g.new_stream("gated"), g.new_stream("follower")
    gate, order = threading.Event(), []
    s.submit("gate", lambda: gate.wait(30))
    for i in range(5):
        s.submit(f"item {i}", lambda i=i: order.append(i))
    ev = s.record()
    t.wait(ev)
    t.submit("after", lambda: order.append("t"))
    assert not ev.query() and not s.query() and not t.query()  # queued, not run: async
    with pytest.raises(WaitTimeout, match="waited 0.05s"):
        ev.synchronize(timeout=0.05)
    with pytest.raises(WaitTimeout):
        t.synchronize(timeout=0.05)
    gate.set()
    t.synchronize(timeout=30)
    assert order == [0, 1, 2, 3, 4, "t"] and ev.query()
    # the compute stream runs work where it is queued (as eager NumPy ops run): in order
    done = []
    g.compute_stream.submit("now", lambda: done.append(1))
    assert done == [1] and g.compute_stream.record().query()


@emulated_only
def test_emulated_stream_failure_poisons_until_reported():
    g = get_gpu(0)
    s = g.new_stream("poisoned")
    ran = []

    def boom():
        raise ValueError("kernel fault")

    s.submit("bad kernel", boom)
    s.submit("reads garbage", lambda: ran.append("skipped?"))
    ev = s.record()
    with pytest.raises(GPUError, match="bad kernel .* failed: ValueError: kernel fault"):
        ev.synchronize(timeout=30)
    with pytest.raises(GPUError, match="kernel fault"):
        s.synchronize(timeout=30)
    assert ran == []  # the work behind the failure never ran
    s.submit("later", lambda: ran.append("later"))
    s.synchronize(timeout=30)  # reported once: the stream is usable again
    assert ran == ["later"]
    with pytest.raises(GPUError, match="failed"):
        g.compute_stream.submit("bad here", boom)  # the compute stream: raised at once


AXPY = r"""
#ifndef HYBRID_EMULATE
#define HYB_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
// one block sums its slice through dynamic shared memory: barriers and shared_bytes
extern "C" __global__ void block_sum(float* out, const float* x, int n) {
    HYB_DYNAMIC_SHARED(float, buf);
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    buf[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}
#ifdef HYBRID_EMULATE
HYB_EMU_STUB(axpy)
HYB_EMU_STUB(block_sum)
#endif
"""


@needs_emu
def test_load_launch_capture_and_replay():
    g = get_gpu(0)
    mod = g.load_module(AXPY, "test_axpy")
    n = 1000
    x = g.to_device(np.arange(n, dtype=np.float32))
    y = g.to_device(np.ones(n, dtype=np.float32))
    s = g.new_stream("capture")
    mod.launch("axpy", (n + 127) // 128, 128, 0, [y, x, np.float32(2.0), np.int32(n)], s)
    s.synchronize()
    want = 2 * np.arange(n, dtype=np.float32) + 1
    np.testing.assert_array_equal(g.to_host(y), want)
    s.begin_capture()
    mod.launch("axpy", (n + 127) // 128, 128, 0, [y, x, np.float32(0.5), np.int32(n)], s)
    mod.launch("axpy", (n + 127) // 128, 128, 0, [y, x, np.float32(0.25), np.int32(n)], s)
    graph = s.end_capture()
    s.synchronize()
    np.testing.assert_array_equal(g.to_host(y), want)  # captured, not run
    for _ in range(2):
        graph.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(g.to_host(y), want + 1.5 * np.arange(n, dtype=np.float32))
    sums = g.empty((4,), "float32")
    mod.launch("block_sum", 4, 256, 256 * 4, [sums, x, np.int32(n)])  # the compute stream
    g.synchronize()
    np.testing.assert_array_equal(
        g.to_host(sums), np.add.reduceat(np.arange(n, dtype=np.float32), [0, 256, 512, 768]))
    with pytest.raises(TypeError, match="Python float"):
        mod.launch("axpy", 1, 1, 0, [y, x, 2.0, np.int32(n)], s)


def test_gemm_row_major():
    g = get_gpu(0)
    rng = np.random.default_rng(1)
    for dt in ("float32", "float64"):
        a, b = rng.standard_normal((5, 3)).astype(dt), rng.standard_normal((4, 3)).astype(dt)
        c0 = rng.standard_normal((5, 4)).astype(dt)
        da, db, dc = g.to_device(a), g.to_device(b), g.to_device(c0)
        g.gemm(da, db, dc, trans_b=True, alpha=2.0, beta=0.5)
        g.synchronize()
        want = 2.0 * a @ b.T + 0.5 * c0
        np.testing.assert_allclose(g.to_host(dc), want, rtol=1e-5 if dt == "float32" else 1e-12)
        dd = g.empty((3, 4), dt)
        g.gemm(da, g.to_device(c0), dd, trans_a=True)
        g.synchronize()
        np.testing.assert_allclose(g.to_host(dd), a.T @ c0, rtol=1e-5 if dt == "float32"
                                   else 1e-12)
    with pytest.raises(ValueError, match="op\\(a\\) is 5x3"):
        g.gemm(g.to_device(a), g.to_device(b), g.empty((5, 4), "float64"))
    with pytest.raises(TypeError, match="float32 \\(sgemm\\) or float64"):
        g.gemm(*(g.to_device(np.ones((2, 2), "int32")) for _ in range(3)))


# ================================================================== eager ops on gpu(0)
def _on_gpu(a, dev):
    if isinstance(a, (np.ndarray, np.generic)):
        a = np.asarray(a)
        return hb.array(a, dtype=a.dtype.name, device=dev)
    return a


OPS = [pytest.param(name, dt, id=f"{name}-{dt}") for name in sorted(OP_CASES)
       for dt in OP_CASES[name].dtypes]


@pytest.mark.parametrize("name,dt", OPS)
def test_every_registry_op_eagerly_on_gpu0(name, dt):
    """The front end's one door (apply) with the device's xp: every sample of every dtype the
    op claims (test_ops.py's table), on gpu(0), against eager_apply with NumPy on the host."""
    case = OP_CASES[name]
    dev = hb.gpu(0)
    samples = case.samples(np.random.default_rng(abs(hash((name, dt))) % (1 << 32)), dt)
    acc = REGISTRY[name].kind in ("reduce", "extern")
    for s in samples:
        with np.errstate(all="ignore"):
            want = eager_apply(np, name, list(s.args), dict(s.attrs))
        with dev:  # where ops without array arguments (full, arange) put their result
            got = hb.apply(name, tuple(_on_gpu(a, dev) for a in s.args), dict(s.attrs))
        got = got if isinstance(got, tuple) else (got,)
        for g_, w in zip(got, want):
            assert g_.device == dev
            # a GPU's normal transform is its libm's log1p and cos (NumPy's is the compiled
            # code's series), on the emulator as on a real GPU
            _close(g_.asnumpy(), w, acc=acc, exact=name != "random_normal")


def test_arrays_arithmetic_reductions_on_gpu0():
    dev = hb.gpu(0)
    x = hb.ones((2, 3), device=dev)
    assert x.device == dev and x.shape == (2, 3)
    y = (x * 2 + 1) @ hb.arange(6, device=dev).reshape(3, 2)
    assert y.device == dev
    np.testing.assert_allclose(y.asnumpy(), 3 * np.ones((2, 3)) @ np.arange(6.).reshape(3, 2))
    z = hb.tanh(y).sum(axis=1).max()
    _close(z.asnumpy(), np.tanh(y.asnumpy()).sum(axis=1).max().astype(np.float32), acc=True)
    assert float(hb.array([2.5], device=dev).item()) == 2.5
    assert "device=gpu(0)" in repr(x) and np.asarray(x).shape == (2, 3)
    assert type(x.asnumpy()) is np.ndarray


def test_writes_and_indices_on_gpu0_make_their_values_there():
    """Ops without array arguments that a write or an index makes for an array on a GPU run
    on that GPU, whatever the current device: found on the H100 by the fresh-program fuzzer
    (``a[:, :1] = 2`` on a one-column array made its new value on the host, CuPy then
    refused it); the emulator's arrays being host memory, the in-place update's device check
    is what shows it here."""
    dev = hb.gpu(0)
    x = hb.ones((2, 1), device=dev)
    x[:, :1] = 2  # the whole array: a fill
    x[:] = 3.5
    assert x.device == dev and isinstance(x._buf.data, dev.xp.ndarray)
    np.testing.assert_array_equal(x.asnumpy(), np.full((2, 1), 3.5, np.float32))
    m = hb.arange(12, device=dev).reshape(3, 4)
    got = m[hb.array([0, 2], dtype="int64", device=dev), hb.array([1, -1], dtype="int64",
                                                                  device=dev)]
    assert got.device == dev
    np.testing.assert_array_equal(got.asnumpy(), np.arange(12.).reshape(3, 4)[[0, 2], [1, -1]])
    with pytest.raises(ValueError, match="value.copyto"):
        x[:] = hb.ones((2, 1))  # a value on the host: moved by the user, as the error says


@emulated_only
def test_an_emulated_gpus_memory_is_not_host_memory():
    """What a real GPU refuses, the emulator refuses: an op mixing a GPU's arrays with host
    arrays (CuPy's TypeError), a kernel launched with a host array, a copy whose ends are on
    the wrong sides, native CPU code handed a GPU's array. NumPy scalars and 0-d arrays mix
    freely, as with CuPy; the host copy of a GPU's array is a plain NumPy array."""
    from compiler.codegen.llvm.loaded import NativeRun
    g = get_gpu(0)
    dev = g.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(dev, emulated.DeviceArray) and isinstance(g.xp.ones(3), g.xp.ndarray)
    assert isinstance(dev + np.float32(1) + np.array(2.0, np.float32), emulated.DeviceArray)
    with pytest.raises(TypeError, match="host array .float32.2, 3.. beside an emulated GPU"):
        dev + np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="concatenate: a host array"):
        g.xp.concatenate([dev, np.ones((1, 3), np.float32)])
    host = g.to_host(dev)
    assert type(host) is np.ndarray and host.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TypeError, match="copy device->host: the destination is GPU memory"):
        g.copy_d2h(g.empty((2, 3), "float32"), dev)
    with pytest.raises(TypeError, match="native CPU code was handed a GPU's array"):
        NativeRun._prep(dev, ((2, 3), np.dtype("float32")))
    if HAVE_EMU:
        mod = g.load_module(AXPY, "axpy_strict")
        with pytest.raises(TypeError, match="argument 1 is a host array"):
            mod.launch("axpy", 1, 32, 0, [g.xp.zeros(32, dtype=np.float32),
                                          np.ones(32, np.float32), np.float32(1),
                                          np.int32(32)])


def test_a_one_row_inputs_first_columns_on_the_cuda_backend():
    """x[:, :3] of a 1 x 4 input is the buffer's first 3 elements: the CUDA executable takes
    it as an alias of the input's buffer of another size (it reshaped the whole buffer and
    failed, found by a fresh fuzzer run); two rows are a strided view, copied."""
    class FirstCols(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.d = nn.Dense(3, in_units=3, activation="tanh")

        def forward(self, x):
            return self.d(x[:, :3])
    dev = hb.gpu(0)
    for rows in (1, 2):
        net = FirstCols()
        net.initialize(device=dev)
        x = hb.array(np.random.default_rng(rows).standard_normal((rows, 4)), dtype="float32",
                     device=dev)
        want = net(x).asnumpy()
        net.hybridize(backend="cuda")  # the generated kernels vs eager: to rounding
        np.testing.assert_allclose(net(x).asnumpy(), want, rtol=1e-5, atol=1e-6)


def test_the_llvm_backend_refuses_a_graph_on_a_gpu():
    net = nn.Dense(2, in_units=3)
    net.initialize(device=hb.gpu(0))
    net.hybridize(backend="llvm")
    with pytest.raises(ValueError, match="backend='llvm' compiles for CPUs, but this graph "
                                         "runs on gpu.0.; hybridize with backend='cuda'"):
        net(hb.ones((1, 3), device=hb.gpu(0))).wait_to_read()


def test_a_loop_body_on_a_gpu_refuses_ops_elsewhere():
    """A loop's body runs on the loop's device; an op on another device inside it is a clear
    error when it compiles (the steps would hand GPU memory to CPU code)."""
    from compiler.control_flow import _check_one_device
    from compiler.graph import Graph, NodeRef
    from compiler.ops import Spec
    from compiler.ops.control import Body
    g = Graph("body")
    a = g.add_input(Spec((3,), "float32"), "a", "gpu(0)")
    g.outputs = [g.add_op("add", [NodeRef(a), 1.0], {}, None, "cpu(0)")]
    with pytest.raises(ValueError, match="body graph has ops on cpu.0. while the loop runs "
                                         "on gpu.0."):
        _check_one_device("foreach", {"body": Body(g)}, hb.gpu(0))
    g.node(g.outputs[0])["device"] = "gpu(0)"
    _check_one_device("foreach", {"body": Body(g)}, hb.gpu(0))


# ================================================================== transfers
def test_transfers_between_host_and_gpus():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = hb.array(a)
    g = x.to(hb.gpu(0))
    assert g.device == hb.gpu(0) and x.to(hb.cpu(0)) is x
    np.testing.assert_array_equal(g.asnumpy(), a)
    lazy = (g * 2).to(hb.cpu(0), non_blocking=True)
    np.testing.assert_array_equal(lazy.asnumpy(), 2 * a)
    assert lazy.device == hb.cpu(0)
    dest = hb.zeros((2, 3), device=hb.gpu(0))
    x.copyto(dest)  # into an existing GPU array
    np.testing.assert_array_equal(dest.asnumpy(), a)
    if hb.num_gpus() >= 2:
        h = g.copyto(hb.gpu(1))
        assert h.device == hb.gpu(1)
        np.testing.assert_array_equal((h + 1).asnumpy(), a + 1)
        back = hb.zeros((2, 3), device=hb.gpu(0))
        (h * 3).copyto(back)
        np.testing.assert_array_equal(back.asnumpy(), 3 * a)
    with pytest.raises(ValueError, match="different devices"):
        x + g


def test_copies_run_on_the_copy_lane_beside_compute():
    """A transfer is an engine op on the GPU's copy lane: it finishes while a long compute op
    still holds the GPU's worker (copies overlap compute)."""
    dev = hb.gpu(0)
    eng = get_engine()
    gate = threading.Event()
    blocker = hb.zeros((1,), device=dev)
    blocker.wait_to_read()
    from runtime.memory import Buffer  # noqa: PLC0415
    busy = Buffer()
    eng.push(lambda: gate.wait(60), (), (busy.var,), dev, "long compute")
    try:
        x = hb.array(np.arange(1000, dtype=np.float32))
        y = x.to(dev, non_blocking=True)
        eng.wait(y._buf.var, timeout=30)  # would time out if the copy queued behind compute
        assert not gate.is_set()
        np.testing.assert_array_equal(dev.to_numpy(y._buf.data), np.arange(1000))
    finally:
        gate.set()
    hb.waitall()


def test_errors_on_gpu_ops_reach_the_sync_point():
    dev = hb.gpu(0)
    idx = hb.array([0, 7], dtype="int64", device=dev)
    bad = hb.take(hb.ones((3,), device=dev), idx)  # index 7 of 3: raises inside the op
    with pytest.raises(IndexError, match="op 'take'"):
        bad.asnumpy()
    with pytest.raises(IndexError):
        (bad + 1).to(hb.cpu(0)).asnumpy()  # what is computed from it, copies too, fail again
    hb.waitall()  # reported already: the engine goes on
    assert float(hb.ones((1,), device=dev).sum().item()) == 1.0


# ================================================================== autograd and training
def test_autograd_on_gpu0_matches_cpu():
    rng = np.random.default_rng(3)
    w0, x0 = rng.standard_normal((4, 3)), rng.standard_normal((5, 4))
    grads = {}
    for dev in (hb.cpu(0), hb.gpu(0)):
        w = hb.array(w0, dtype="float64", device=dev)
        x = hb.array(x0, dtype="float64", device=dev)
        w.attach_grad()
        with autograd.record():
            loss = (hb.tanh(x @ w) ** 2).mean() + hb.log_softmax(x @ w).sum()
        loss.backward()
        assert w.grad.device == dev
        grads[dev] = w.grad.asnumpy()
    _close(grads[hb.gpu(0)], grads[hb.cpu(0)], acc=True)


def _mlp(dev, seed=11):
    hb.random.seed(seed, device=dev)  # the same key stream on each device: equal weights
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(8, activation="relu"), nn.Dense(3))
    net.initialize(hb.init.Xavier(), device=dev)
    return net


def _batches(steps, batch=32):
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((batch, 10)).astype(np.float32),
             rng.integers(0, 3, size=batch)) for _ in range(steps)]


def _train_eagerly(dev, steps=5):
    net = _mlp(dev)
    tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss_fn = hb.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for X, y in _batches(steps):
        X, y = hb.array(X, device=dev), hb.array(y, dtype="int64", device=dev)
        with autograd.record():
            loss = loss_fn(net(X), y)
        loss.backward()
        tr.step(X.shape[0])
        losses.append(float(loss.mean().item()))
    params = [p.data(dev) for p in net.collect_params().values()]
    assert all(p.device == dev for p in params)
    return losses, [p.asnumpy() for p in params]


@pytest.mark.parametrize("eager_kernels", [0, 1])
def test_mlp_trained_eagerly_on_gpu0_equals_cpu0(eager_kernels, monkeypatch):
    """Op by op (HYBRID_EAGER_KERNELS=0) the emulated GPU runs NumPy as the CPU does: the same
    bits. With eager kernels the loss is compiled per device (LLVM on the CPU, CUDA C on the
    GPU; from its second call here): equal to rounding."""
    monkeypatch.setattr(hb.loss, "COMPILE_AFTER", 2)
    old = config.get("HYBRID_EAGER_KERNELS")
    config.set_flag("HYBRID_EAGER_KERNELS", eager_kernels)
    try:
        cpu_losses, cpu_params = _train_eagerly(hb.cpu(0))
        gpu_losses, gpu_params = _train_eagerly(hb.gpu(0))
    finally:
        config.set_flag("HYBRID_EAGER_KERNELS", old)
    assert cpu_losses[-1] < cpu_losses[0]
    if REAL or eager_kernels:
        np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4)
        for g_, c in zip(gpu_params, cpu_params):  # five steps of another summation order
            np.testing.assert_allclose(g_, c, rtol=1e-4, atol=1e-5)
    else:
        assert gpu_losses == cpu_losses
        for g_, c in zip(gpu_params, cpu_params):
            _close(g_, c)


_GPU_DRAWS = [("normal", dict(loc=1.0, scale=2.0), "float32"),
              ("uniform", dict(low=-3.0, high=5.0), "float32"),
              ("normal", dict(loc=0.0, scale=1.0), "float64"),
              ("randint", dict(low=-5, high=7), "int64")]


@pytest.mark.parametrize("kind,attrs,dtype", _GPU_DRAWS,
                         ids=[f"{k}-{d}" for k, _, d in _GPU_DRAWS])
def test_eager_draws_on_a_gpu_run_its_compiled_cuda_kernel(kind, attrs, dtype, monkeypatch):
    """A GPU's eager draw compiles to one CUDA kernel for that GPU (from its signature's
    second call at this size), where the array module runs ~20 kernels: the numbers of the
    generator's NumPy implementation for the same keys (bit for bit on the emulator, which
    builds without contraction; to rounding on a real GPU, whose compiler contracts
    multiply-adds), and the CPU's signature keeps its own LLVM kernel."""
    from compiler.ops.random import _normal_impl, _randint_impl, _uniform_impl
    from hybrid import eager_kernels
    impl = {"uniform": _uniform_impl, "normal": _normal_impl, "randint": _randint_impl}[kind]
    built = []
    compile_op = eager_kernels.compile_op
    monkeypatch.setattr(eager_kernels, "compile_op", lambda name, operands, attrs, gpu=None,
                        *rest: built.append(gpu) or compile_op(name, operands, attrs, gpu,
                                                               *rest))
    draw = getattr(hb.random, kind)
    dev, shape = hb.gpu(0), (131, 127)  # >= LARGE_MIN elements, odd extents
    hb.random.seed(21)
    keys = [hb.random.next_key(dev) for _ in range(4)]
    hb.random.seed(21)
    for key in keys:
        got = draw(size=shape, dtype=dtype, device=dev, **attrs)
        assert got.device == dev
        want = impl(np, np.int64(key), shape, dtype=dtype, **attrs)
        assert got.dtype == want.dtype
        # the first call runs the array module: a GPU's transform (libm's log1p and cos, on
        # the emulator too), to rounding; the compiled kernel's after it, bit for bit here
        if kind == "normal" and (REAL or key is keys[0]):
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got.asnumpy(), want)
    assert built == [dev], "the GPU's draw did not compile for it"
    for _ in range(2):
        draw(size=shape, dtype=dtype, device=hb.cpu(0), **attrs).wait_to_read()
    assert built == [dev, None], "the CPU's signature shares the GPU's kernel"


def test_gpu_draws_write_their_keys_on_the_gpu_without_an_upload(monkeypatch):
    """A random op's key reaches a GPU as a fill kernel's argument on its compute stream
    (eagerly and for a hybridized call's key inputs): no host upload (a pinned buffer, a
    copy and a copy-stream sync per draw), and the draws are the stream's as before."""
    from runtime import transfer

    class Noisy(nn.HybridBlock):
        def forward(self, x):
            return x + hb.np.random.normal(size=x.shape, device=x.device)

    dev = hb.gpu(0)
    x = hb.np.zeros((3, 4), device=dev)
    net = Noisy()
    net.hybridize(backend="cuda")
    net(x).wait_to_read()  # the trace's own call
    uploads = []
    upload = transfer.upload
    monkeypatch.setattr(transfer, "upload", lambda host, device, *a, **k:
                        uploads.append(device) or upload(host, device, *a, **k))
    hb.random.seed(5)
    keys = [hb.random.next_key(dev) for _ in range(2)]
    hb.random.seed(5)
    eager = hb.random.normal(size=(3, 4), device=dev).asnumpy()
    hybridized = net(x).asnumpy()
    assert [d for d in uploads if d.kind == "gpu"] == []
    from compiler.ops.random import _normal_impl
    for got, key in zip((eager, hybridized), keys):
        np.testing.assert_allclose(got, _normal_impl(np, np.int64(key), (3, 4)), rtol=1e-5,
                                   atol=1e-6)


def test_two_gpus_split_and_load_with_device_kvstore_equal_one_device():
    """Section 12.6 on two GPUs: each takes half the batch, Trainer(kvstore="device") sums the
    two GPUs' gradients (ring allreduce / reduce over GPU copies), both keep equal weights."""
    two_gpus()
    devs = [hb.gpu(0), hb.gpu(1)]
    opt = {"learning_rate": 0.1, "momentum": 0.9}

    def run(devices):
        hb.random.seed(4, device=devices[0])
        net = nn.HybridSequential()
        net.add(nn.Dense(8, activation="tanh", in_units=6), nn.Dense(2, in_units=8))
        net.initialize(hb.init.Xavier(), device=devices)
        net.cast("float64")
        tr = hb.Trainer(net.collect_params(), "sgd", opt, kvstore="device")
        rng = np.random.default_rng(8)
        for _ in range(4):
            X, Y = rng.standard_normal((16, 6)), rng.standard_normal((16, 2))
            xs = hb.split_and_load(X.astype(np.float64), devices)
            ys = hb.split_and_load(Y.astype(np.float64), devices)
            with autograd.record():
                ls = [hb.square(net(a) - b).sum() for a, b in zip(xs, ys)]
            for loss in ls:
                loss.backward()
            tr.step(16)
        return net

    one = run([hb.cpu(0)])
    many = run(devs)
    for name, p in one.collect_params().items():
        q = many.collect_params()[name]
        assert [d.device for d in q.list_data()] == devs
        a0, a1 = (d.asnumpy() for d in q.list_data())
        np.testing.assert_array_equal(a0, a1)  # the same summed update on both GPUs
        np.testing.assert_allclose(a0, p.data(hb.cpu(0)).asnumpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("store", ["device", "local"])
def test_kvstores_over_gpus(store):
    devs = [hb.gpu(i) for i in range(min(2, hb.num_gpus()))]
    kv = hb.kv.create(store)
    kv.init("w", hb.zeros((4,), device=devs[0]))
    grads = [hb.ones((4,), device=d) * (i + 1) for i, d in enumerate(devs)]
    kv.push("w", grads)
    outs = [hb.zeros((4,), device=d) for d in devs]
    kv.pull("w", out=outs)
    for o, d in zip(outs, devs):
        assert o.device == d
        np.testing.assert_array_equal(o.asnumpy(), np.full(4, sum(range(1, len(devs) + 1))))


# ================================================================== real GPUs only
@pytest.mark.gpu
@real_gpu
def test_real_gpu_uses_cupy_end_to_end():
    cp = hb.gpu(0).xp
    assert cp.__name__ == "cupy" and hb.gpu(0).seam.implementation == "cupy"
    x = (hb.arange(10, device=hb.gpu(0)) * 2).wait_to_read()
    assert isinstance(x._buf.data, cp.ndarray)  # computed by CuPy, not NumPy
    out = x.asnumpy()
    assert type(out) is np.ndarray and out.tolist() == list(range(0, 20, 2))
    pinned = hb.gpu(0).seam.host_empty((4,), "float32")
    assert isinstance(pinned, np.ndarray)


@pytest.mark.gpu
@real_gpu
def test_real_gpu_nvrtc_module_and_graph():
    g = get_gpu(0)
    mod = g.load_module(AXPY, "axpy_nvrtc")
    n = 4096
    x = g.to_device(np.ones(n, np.float32))
    y = g.to_device(np.zeros(n, np.float32))
    s = g.new_stream("capture")
    s.begin_capture()
    mod.launch("axpy", n // 256, 256, 0, [y, x, np.float32(3.0), np.int32(n)], s)
    graph = s.end_capture()
    for _ in range(3):
        graph.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(g.to_host(y), np.full(n, 9.0, np.float32))


def test_a_gpu_wait_spins_before_it_sleeps(monkeypatch):
    """A wait on a GPU stream or event asks done() in a tight loop first (a sleep costs
    ~60-110 us on these VMs, most of a synced small op), then sleeps, growing, until its
    timeout."""
    checks = {"n": 0}

    def done():
        checks["n"] += 1
        return checks["n"] >= 50

    slept = []
    monkeypatch.setattr(seam.time, "sleep", slept.append)
    monkeypatch.setattr(seam, "SPIN_SECONDS", 1.0)  # (a loaded box must not leave the spin)
    seam.poll(done, 5.0, "test")
    assert checks["n"] == 50 and slept == []
    monkeypatch.setattr(seam, "SPIN_SECONDS", 0.0)
    with pytest.raises(WaitTimeout):
        seam.poll(lambda: False, 0.01, "never done")
    assert slept and slept == sorted(slept)
