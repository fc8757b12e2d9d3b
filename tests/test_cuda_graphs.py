"""CUDA graphs for static plans (compiler/codegen/cuda/replay.py) on an emulated GPU, whose
capture records the launches and whose replay runs the recording again.

A call replays the graph captured at the first call, its io copied through the executable's
static buffers; HYBRID_CUDA_GRAPHS=0 launches the kernels one by one. Results must be equal
both ways over calls with different inputs, and outputs held from earlier calls must keep
their values (a graph that kept the first call's input or output pointers fails here).
"""
import numpy as np
import pytest
from conftest import mismatches_in_threads

import hybrid as hb
from hybrid import nn
from compiler.codegen.cuda import replay
from runtime import config
from runtime.gpu import GPUError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def graphs_flag(monkeypatch):
    """Restores HYBRID_CUDA_GRAPHS after a test that sets it; graphs are replayed whatever
    their io costs (these nets are tiny: the cost rule alone would launch them plainly), and
    plain launches run the same GEMM kernels as a graph (no BLAS), so both agree bitwise."""
    monkeypatch.setattr(replay, "graph_pays", lambda launches, copies, nbytes: True)
    old = config.get("HYBRID_CUDA_GRAPHS"), config.get("HYBRID_CUDA_BLAS")
    config.set_flag("HYBRID_CUDA_BLAS", 0)
    yield
    config.set_flag("HYBRID_CUDA_GRAPHS", old[0])
    config.set_flag("HYBRID_CUDA_BLAS", old[1])


def test_a_graph_runs_the_gemm_kernels_and_plain_calls_the_blas(emulated_gpu, graphs_flag,
                                                                 monkeypatch):
    """CuPy refuses cuBLAS under stream capture (seen on an H100): the capture launches the
    generated GEMM, plain calls the BLAS; the results agree to rounding."""
    from runtime.gpu import emulated
    asked = []
    real = emulated.EmulatedGPU.gemm_strided
    monkeypatch.setattr(emulated.EmulatedGPU, "gemm_strided",
                        lambda self, *a, **k: (asked.append(1), real(self, *a, **k))[1])
    config.set_flag("HYBRID_CUDA_BLAS", 1)
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    on = _calls(_net(emulated_gpu), emulated_gpu)
    assert asked == []  # every call replayed a graph
    config.set_flag("HYBRID_CUDA_GRAPHS", 0)
    off = _calls(_net(emulated_gpu), emulated_gpu)
    assert len(asked) == 4 * 3  # four calls, three Dense products each
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_graph_pays_only_where_launches_outweigh_its_copies():
    # one launch never pays for a copy in and out; 64M floats in and out cost more than
    # the launches of a small net; a net of many launches and a small io pays
    assert not replay.graph_pays(1, 2, 8)
    assert not replay.graph_pays(20, 2, 2 * 4 * (64 << 20))
    assert replay.graph_pays(20, 2, 2 * 4 * 512)
    assert not replay.graph_pays(4, 10, 1024)


def test_large_io_runs_plain_under_the_cost_rule(emulated_gpu, graphs_flag, monkeypatch):
    """The default rule: an elementwise op on a large array is one launch, and copying its
    input and output through static buffers would double the memory traffic."""
    monkeypatch.undo()  # the real rule
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    f = hb.hybridize(lambda x: hb.tanh(x) + 1, backend="cuda")
    x = hb.array(np.linspace(-1, 1, 1 << 16, dtype=np.float32), device=emulated_gpu)
    for _ in range(3):
        np.testing.assert_allclose(f(x).asnumpy(), np.tanh(x.asnumpy()) + 1, rtol=1e-6)
    [entry] = f.cache.entries.values()
    stats = entry.exe.report["cuda_graphs"]
    assert stats["captures"] == 0 and stats["plain_calls"] == 3, stats


def _net(dev):
    hb.random.seed(3)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=6),  # no deferred init: the seed decides
            nn.Dense(8, activation="tanh", in_units=16), nn.Dense(4, in_units=8))
    net.initialize(hb.init.Xavier(), device=dev)
    net.hybridize(backend="cuda")
    return net


def _stats(net):
    [entry] = net._cached.entries.values()
    return entry.exe.report["cuda_graphs"]


def _calls(net, dev, n=4):
    """``n`` calls on different inputs; outputs read back only after the last call."""
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((3, 6)).astype(np.float32) for _ in range(n)]
    outs = [net(hb.array(x, device=dev)) for x in xs]
    return [o.asnumpy() for o in outs]


def test_replay_equals_plain_launches_over_calls(emulated_gpu, graphs_flag):
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    on_net = _net(emulated_gpu)
    on = _calls(on_net, emulated_gpu)
    config.set_flag("HYBRID_CUDA_GRAPHS", 0)
    off_net = _net(emulated_gpu)
    off = _calls(off_net, emulated_gpu)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)  # the same kernels on the same pointers' values
    assert len({a.tobytes() for a in on}) == len(on)  # each call saw its own input
    # the first call copies the parameters in; the second sees them at the same addresses
    # and captures the graph that reads them in place, replayed from then on
    assert _stats(on_net) == {"captures": 2, "replays": 4, "params_in_place": 3,
                              "plain_calls": 0, "fallback": None}
    assert _stats(off_net) == {"captures": 0, "replays": 0, "params_in_place": 0,
                               "plain_calls": 4, "fallback": None}


def test_changed_parameters_are_read_after_replays_in_place(emulated_gpu, graphs_flag):
    """Parameters replaced between calls (as a training step does): each call must see the
    current ones, whether its graph copies them in or reads them in place."""
    results = {}
    for flag in (1, 0):
        config.set_flag("HYBRID_CUDA_GRAPHS", flag)
        net = _net(emulated_gpu)
        x = hb.array(np.linspace(-1, 1, 18, dtype=np.float32).reshape(3, 6),
                     device=emulated_gpu)
        outs = []
        for step in range(9):
            outs.append(net(x).asnumpy())
            if 2 <= step <= 6:  # changes in a row (a new array may take a freed one's
                # address: equal pointers, other values), then stable again
                for p in net.collect_params().values():
                    p.set_data(p.data() * 0.5 + 0.1)
        results[flag] = outs
        if flag:
            stats = _stats(net)
    for a, b in zip(results[1], results[0]):
        np.testing.assert_array_equal(a, b)
    assert len({o.tobytes() for o in results[1]}) == 6  # six sets of parameters seen
    assert stats["replays"] == 9 and stats["params_in_place"] >= 3, stats


def test_replay_matches_eager(emulated_gpu, graphs_flag):
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    net, eager = _net(emulated_gpu), _net(emulated_gpu)
    eager.hybridize(active=False)
    rng = np.random.default_rng(9)
    for _ in range(3):
        x = hb.array(rng.standard_normal((3, 6)).astype(np.float32), device=emulated_gpu)
        np.testing.assert_allclose(net(x).asnumpy(), eager(x).asnumpy(), rtol=1e-5, atol=1e-6)
    assert _stats(net)["replays"] == 3


def test_two_threads_share_one_graph(emulated_gpu, graphs_flag):
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    net = _net(emulated_gpu)
    rng = np.random.default_rng(6)
    xs = [hb.array(rng.standard_normal((3, 6)).astype(np.float32), device=emulated_gpu)
          for _ in range(2)]
    wants = [net(x).asnumpy() for x in xs]
    assert wants[0].tolist() != wants[1].tolist()
    bad = mismatches_in_threads(net, xs, wants, calls=20, rtol=0, atol=0)
    assert bad == [0, 0]
    assert _stats(net)["replays"] == 42 and _stats(net)["params_in_place"] >= 40


def test_failed_capture_falls_back_to_plain_launches(emulated_gpu, graphs_flag, monkeypatch):
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    seam = emulated_gpu.seam
    real_new_stream = seam.new_stream

    def new_stream(name="stream"):
        s = real_new_stream(name)

        def refuse():
            raise GPUError("capture is not supported here")
        s.begin_capture = refuse
        return s
    monkeypatch.setattr(seam, "new_stream", new_stream)
    net = _net(emulated_gpu)
    got = _calls(net, emulated_gpu, n=2)
    monkeypatch.undo()
    config.set_flag("HYBRID_CUDA_GRAPHS", 0)
    want = _calls(_net(emulated_gpu), emulated_gpu, n=2)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    stats = _stats(net)
    assert stats["plain_calls"] == 2 and stats["replays"] == 0
    assert "capture is not supported here" in stats["fallback"]


def test_small_io_net_replays_in_place_under_the_cost_rule(emulated_gpu, graphs_flag,
                                                           monkeypatch):
    """The default rule on the batch-1 shape of the book's MLP: several launches and a few
    bytes of io, so once the parameters stay put the graph reading them in place replays."""
    monkeypatch.undo()  # the real rule
    config.set_flag("HYBRID_CUDA_BLAS", 0)
    config.set_flag("HYBRID_CUDA_GRAPHS", 1)
    net = _net(emulated_gpu)
    x = hb.array(np.ones((1, 6), np.float32), device=emulated_gpu)
    outs = [net(x).asnumpy() for _ in range(4)]
    stats = _stats(net)
    assert stats["replays"] >= 2 and stats["params_in_place"] >= 2, stats
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
