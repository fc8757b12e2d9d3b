"""Devices (runtime/device.py): identity, parsing, and clear errors where a GPU is missing."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import hybrid as hb
from runtime import config
from runtime import device as device_mod
from runtime.device import Device, DeviceError, cpu, current_device, gpu, num_gpus, parse_device
from runtime.gpu import implementation

HAVE_GPU = num_gpus() > 0  # real or emulated (HYBRID_GPU_EMULATE)
REAL_GPU = HAVE_GPU and implementation() == "cupy"
needs_gpu = pytest.mark.skipif(not REAL_GPU, reason="no GPU (needs an NVIDIA GPU with CuPy)")


@pytest.mark.timeout(30)
def test_equality_hash_repr():
    assert cpu(0) == cpu() == Device("cpu", 0) == cpu(np.int64(0))
    assert cpu(0) != cpu(1) and cpu(0) != gpu(0) and gpu(0) == gpu()
    assert cpu(0) != "cpu(0)" and cpu(0) != ("cpu", 0)
    assert hash(cpu(1)) == hash(Device("cpu", 1))
    assert len({cpu(0), cpu(0), cpu(1), gpu(0), gpu(0)}) == 3
    assert {cpu(1): "x"}[Device("cpu", 1)] == "x"
    assert repr(cpu(1)) == str(cpu(1)) == "cpu(1)" and repr(gpu(2)) == "gpu(2)"
    assert type(cpu(np.int32(3)).index) is int
    assert (cpu(2).device_type, cpu(2).device_id) == ("cpu", 2)
    assert (gpu(1).device_type, gpu(1).device_id) == ("gpu", 1)
    assert pickle.loads(pickle.dumps(gpu(3))) == gpu(3)
    # interned: one object per device, also through copies and unpickling
    assert cpu(1) is Device("cpu", np.int64(1)) is copy.deepcopy(cpu(1))
    assert pickle.loads(pickle.dumps(gpu(3))) is gpu(3)


@pytest.mark.timeout(30)
def test_front_end_names():
    assert hb.cpu is cpu and hb.gpu is gpu and hb.Device is Device and hb.DeviceError is DeviceError
    assert hb.cpu(1) == cpu(1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind,index,match", [
    ("tpu", 0, "kind must be 'cpu' or 'gpu'"),
    ("cpu", -1, "non-negative int"),
    ("cpu", 1.0, "non-negative int"),
    ("gpu", "0", "non-negative int"),
])
def test_bad_devices(kind, index, match):
    with pytest.raises(ValueError, match=match):
        Device(kind, index)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("spec,expected", [
    ("cpu", cpu(0)), ("cpu:1", cpu(1)), ("CPU:2", cpu(2)), ("cpu(0)", cpu(0)),
    (" cpu(3) ", cpu(3)), ("gpu", gpu(0)), ("gpu:1", gpu(1)), ("gpu(2)", gpu(2)),
    ("cuda", gpu(0)), ("cuda:1", gpu(1)), (cpu(4), cpu(4)), (gpu(5), gpu(5)),
])
def test_parse_device(spec, expected):
    assert parse_device(spec) == expected


@pytest.mark.timeout(30)
@pytest.mark.parametrize("spec", ["tpu", "tpu:0", "cpu:x", "cpu:-1", "cpu:1:2", "", 3, 1.5,
                                  ("cpu", 0)])
def test_parse_device_rejects_with_a_clear_message(spec):
    with pytest.raises(ValueError, match=r"device must be hb.cpu\(i\), hb.gpu\(i\) or a string "
                                         r"like 'cpu:0', got"):
        parse_device(spec)


@pytest.mark.timeout(30)
def test_current_device_and_with_blocks():
    assert parse_device(None) == current_device() == cpu(0)
    with cpu(1):
        assert current_device() == cpu(1) and parse_device(None) == cpu(1)
        with gpu(0):  # a GPU that is not there is fine until it is used
            assert current_device() == gpu(0)
        assert current_device() == cpu(1)
    assert current_device() == cpu(0)


@pytest.mark.timeout(30)
def test_cpu_array_module_and_cores():
    assert cpu(0).xp is np and cpu(7).xp is np
    assert device_mod.cpu_count() >= 1
    assert device_mod.device_of(np.zeros(2)) == cpu(0)
    assert device_mod.device_of(1.5) == cpu(0)


@pytest.mark.timeout(30)
def test_num_gpus_never_raises(monkeypatch):
    n = num_gpus()
    assert isinstance(n, int) and n >= 0
    assert hb.num_gpus() == n
    if device_mod.cupy_module() is None and implementation() != "emulated":
        assert n == 0
    saved = config.set_flag("HYBRID_GPU_EMULATE", 3)
    try:
        assert num_gpus() == 3  # follows the flag at every call: nothing cached
        monkeypatch.setenv("HYBRID_GPU_EMULATE", "lots")  # a broken value: still no raise
        config._values.pop("HYBRID_GPU_EMULATE")
        assert num_gpus() == 0
        with pytest.raises(ValueError, match="HYBRID_GPU_EMULATE='lots' is not valid"):
            gpu(0).xp  # the first use says what is wrong
    finally:
        config.set_flag("HYBRID_GPU_EMULATE", saved)
    assert num_gpus() == n


@pytest.mark.timeout(30)
@pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU, or emulates some")
def test_using_a_missing_gpu_raises_device_error():
    assert num_gpus() == 0
    g = hb.gpu(0)  # creating it is fine
    with pytest.raises(DeviceError, match=r"gpu\(0\) was used, but") as info:
        g.xp
    msg = str(info.value)
    assert "CuPy is not installed" in msg or "0 GPU(s)" in msg
    assert "hb.cpu()" in msg or "pip install" in msg
    with pytest.raises(DeviceError, match=r"gpu\(0\) was used"):
        hb.ones((2,), device=hb.gpu(0))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.timeout(60)
def test_gpu_array_module():
    cp = gpu(0).xp
    assert cp is device_mod.cupy_module()
    x = cp.arange(4, dtype=cp.float32)
    assert device_mod.device_of(x) == gpu(0)
    with pytest.raises(DeviceError, match=f"this machine has {num_gpus()} GPU"):
        gpu(num_gpus()).xp


@pytest.mark.gpu
@needs_gpu
@pytest.mark.timeout(60)
def test_gpu_front_end_round_trip():
    x = hb.array([1.0, 2.0], device=hb.gpu(0))
    y = (x + 1).asnumpy()
    np.testing.assert_array_equal(y, [2.0, 3.0])
