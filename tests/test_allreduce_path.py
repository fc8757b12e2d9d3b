"""Which path a sum across devices takes (runtime/collective.py: allreduce_path): NCCL only
where CuPy has it and every device is a real CuPy GPU, else copies between devices. No real
NCCL here: the choice is checked with fakes, the copies path on two emulated GPUs."""
import types

import numpy as np
import pytest

from runtime import collective, config
from runtime.collective import Tensor, allreduce, allreduce_path
from runtime.device import cpu, gpu
from runtime.gpu import nccl


@pytest.fixture
def two_emulated():
    old = config.set_flag("HYBRID_GPU_EMULATE", 2)
    try:
        yield gpu(0), gpu(1)
    finally:
        config.set_flag("HYBRID_GPU_EMULATE", old)


class FakeDevice:
    """A device as allreduce_path sees it: a kind and a seam's implementation."""

    def __init__(self, kind, index, implementation="cupy"):
        self.kind, self.index = kind, index
        self.seam = types.SimpleNamespace(implementation=implementation)

    def __eq__(self, other):
        return (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self):
        return hash((self.kind, self.index))


def _tensors(devices, dtype="float32"):
    return [Tensor.ready(np.zeros(4, dtype), d) for d in devices]


@pytest.fixture
def cupy_has_nccl(monkeypatch):
    monkeypatch.setattr(nccl, "nccl_module", lambda: types.SimpleNamespace())


@pytest.fixture
def cupy_lacks_nccl(monkeypatch):
    monkeypatch.setattr(nccl, "nccl_module", lambda: None)


def test_nccl_only_for_real_cupy_gpus_with_nccl(cupy_has_nccl):
    real = [FakeDevice("gpu", 0), FakeDevice("gpu", 1)]
    assert allreduce_path(_tensors(real)) == "nccl"
    assert allreduce_path(_tensors(real, "bool")) == "copies"  # NCCL has no bool
    assert allreduce_path(_tensors(real[:1])) == "copies"  # one device: nothing to sum
    assert allreduce_path(_tensors([real[0], real[0]])) == "copies"  # the same GPU twice
    assert allreduce_path(_tensors([real[0], FakeDevice("cpu", 0)])) == "copies"
    emulated = [FakeDevice("gpu", 0, "emulated"), FakeDevice("gpu", 1, "emulated")]
    assert allreduce_path(_tensors(emulated)) == "copies"  # host memory: not for NCCL


def test_no_nccl_in_cupy_means_copies(cupy_lacks_nccl):
    assert allreduce_path(_tensors([FakeDevice("gpu", 0), FakeDevice("gpu", 1)])) == "copies"


def test_emulated_gpus_take_copies_even_where_nccl_exists(two_emulated, cupy_has_nccl):
    assert allreduce_path(_tensors(two_emulated)) == "copies"
    assert allreduce_path(_tensors([cpu(0), cpu(1)])) == "copies"


@pytest.mark.parametrize("method,size", [("ring", 1 << 16), ("reduce", 1000)])
def test_copies_path_sums_on_two_emulated_gpus(two_emulated, method, size, monkeypatch):
    def no_nccl(tensors):
        raise AssertionError("NCCL chosen for emulated GPUs")
    monkeypatch.setattr(collective, "_nccl_allreduce", no_nccl)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(size).astype(np.float32) for _ in two_emulated]
    tensors = [Tensor.ready(d.seam.to_device(v), d) for v, d in zip(values, two_emulated)]
    sums = allreduce(tensors, method)
    assert [s.device for s in sums] == list(two_emulated)
    got = [s.host() for s in sums]
    np.testing.assert_array_equal(got[0], got[1])  # identical bits on both GPUs
    np.testing.assert_allclose(got[0], values[0] + values[1], rtol=1e-6)


def test_allreduce_takes_the_chosen_nccl_path(monkeypatch):
    """Where the choice is 'nccl', allreduce hands the tensors to NCCL and nothing else."""
    taken = []
    monkeypatch.setattr(collective, "allreduce_path", lambda tensors: "nccl")
    monkeypatch.setattr(collective, "_nccl_allreduce",
                        lambda tensors: taken.append(tensors) or ["summed"] * len(tensors))
    tensors = _tensors([cpu(0), cpu(1)])
    assert allreduce(tensors) == ["summed", "summed"]
    assert taken == [tensors]


def _real_nccl_gpus() -> int:
    from runtime.gpu.cupy_gpu import device_count
    if config.get("HYBRID_GPU_EMULATE") or device_count() < 2:
        return 0
    return device_count() if nccl.nccl_module() is not None else 0


@pytest.mark.gpu
@pytest.mark.skipif(not _real_nccl_gpus(), reason="needs two real NVIDIA GPUs and a CuPy with "
                    "NCCL; this machine has not")
def test_real_gpus_sum_through_nccl():
    devices = [gpu(0), gpu(1)]
    values = [np.arange(1000, dtype=np.float32) * (i + 1) for i in range(2)]
    tensors = [Tensor.ready(d.seam.to_device(v), d) for v, d in zip(values, devices)]
    assert allreduce_path(tensors) == "nccl"
    for s in allreduce(tensors):
        np.testing.assert_array_equal(s.host(), values[0] + values[1])
