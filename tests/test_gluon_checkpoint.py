"""save_parameters / load_parameters and hb.save / hb.load_arrays: exact round trips, atomic
writes, refusal of truncated, damaged and mismatched files."""
import os

import numpy as np
import pytest

import hybrid as hb
from hybrid import init, nn
from hybrid.checkpoint import CheckpointError


def make_net(units=3):
    net = nn.HybridSequential()
    net.add(nn.Dense(4, activation="relu"), nn.BatchNorm(), nn.Dense(units))
    return net


def ready(net, seed=0):
    hb.random.seed(seed)
    net.initialize(init.Xavier())
    net(hb.zeros((2, 5)))
    return net


def assert_same_params(a, b):
    pa, pb = a.collect_params(), b.collect_params()
    assert list(pa) == list(pb)
    for k in pa:
        x, y = pa[k].data().asnumpy(), pb[k].data().asnumpy()
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), k


def test_round_trip_is_bitwise_and_fills_deferred_shapes(tmp_path):
    a = ready(make_net())
    a[1].running_var.set_data(hb.random.uniform(size=(4,)))
    path = tmp_path / "net.safetensors"
    a.save_parameters(path)
    b = make_net()  # never initialized: shapes come from the file
    b.load_parameters(path)
    assert_same_params(a, b)
    np.testing.assert_array_equal(a(hb.ones((2, 5))).asnumpy(), b(hb.ones((2, 5))).asnumpy())
    c = ready(make_net(), seed=1)  # initialized: overwritten in place
    c.load_parameters(str(path))
    assert_same_params(a, c)
    assert [f for f in os.listdir(tmp_path) if f != "net.safetensors"] == []


def test_round_trip_float64_and_multi_device(tmp_path):
    a = ready(make_net())
    a.cast("float64")
    a.save_parameters(tmp_path / "p")
    b = make_net()
    b.cast("float64")
    b.load_parameters(tmp_path / "p", device=[hb.cpu(0), hb.cpu(1)])
    assert_same_params(a, b)
    for p in b.collect_params().values():
        x, y = p.list_data()
        assert y.device == hb.cpu(1) and x.asnumpy().tobytes() == y.asnumpy().tobytes()


def test_missing_extra_and_misshaped_names_are_listed(tmp_path):
    a = ready(make_net())
    path = tmp_path / "p.safetensors"
    a.save_parameters(path)
    small = nn.HybridSequential()
    small.add(nn.Dense(4, activation="relu"))
    with pytest.raises(ValueError, match=r"not in the model \(6\): 1.gamma.*ignore_extra"):
        small.load_parameters(path)
    small.load_parameters(path, ignore_extra=True)
    np.testing.assert_array_equal(small[0].weight.data().asnumpy(),
                                  a[0].weight.data().asnumpy())
    bigger = make_net()
    bigger.add(nn.Dense(2))
    with pytest.raises(ValueError, match=r"missing from the file \(2\): 3.weight, 3.bias"):
        bigger.load_parameters(path)
    bigger.load_parameters(path, allow_missing=True)
    other = ready(make_net(units=7))
    before = other[2].weight.data().asnumpy()
    with pytest.raises(ValueError, match=r"shape mismatch: 2.weight: model has \(7, 4\), "
                                         r"file has \(3, 4\)"):
        other.load_parameters(path)
    # nothing was changed by the refused load
    np.testing.assert_array_equal(other[2].weight.data().asnumpy(), before)
    f64 = make_net()
    f64.cast("float64")
    with pytest.raises(ValueError, match="dtype mismatch.*cast_dtype=True"):
        f64.load_parameters(path)
    f64.load_parameters(path, cast_dtype=True)
    assert f64[0].weight.data().dtype == np.float64
    saved = make_net()
    saved.cast("float64")
    saved.load_parameters(path, cast_dtype=True, dtype_source="saved")
    assert saved[0].weight.data().dtype == np.float32


@pytest.mark.parametrize("cut", [0, 5, 8, 20, -1, -17])
def test_truncated_files_are_refused(tmp_path, cut):
    a = ready(make_net())
    path = tmp_path / "p.safetensors"
    a.save_parameters(path)
    blob = path.read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(blob[:cut])
    with pytest.raises(CheckpointError, match="bad.safetensors.*(truncated|not a|damaged)"):
        make_net().load_parameters(bad)


def test_garbage_and_missing_files(tmp_path):
    bad = tmp_path / "g"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        hb.load_arrays(bad)
    blob = bytearray((tmp_path / "g").read_bytes())
    hb.save(tmp_path / "ok", hb.ones((2, 2)))
    good = (tmp_path / "ok").read_bytes()
    (tmp_path / "extra").write_bytes(good + b"junk")
    with pytest.raises(CheckpointError, match="unexpected bytes"):
        hb.load_arrays(tmp_path / "extra")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_net().load_parameters(tmp_path / "nope")
    assert blob


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    a = ready(make_net())
    path = tmp_path / "p.safetensors"
    a.save_parameters(path)
    old = path.read_bytes()
    b = ready(make_net(), seed=3)

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        b.save_parameters(path)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["p.safetensors"]  # no temporary left behind
    b.save_parameters(path)
    assert path.read_bytes() != old


def test_save_refuses_uninitialized(tmp_path):
    net = make_net()
    net.initialize()
    with pytest.raises(RuntimeError, match="0.weight.*not initialized"):
        net.save_parameters(tmp_path / "p")


def test_shared_parameters_dedup(tmp_path):
    a = nn.HybridSequential()
    d = nn.Dense(2, in_units=2)
    a.add(d, nn.Dense(2, in_units=2, params=d.collect_params()))
    a.initialize()
    a.save_parameters(tmp_path / "p", deduplicate=True)
    assert sorted(hb.load_arrays(tmp_path / "p")) == ["0.bias", "0.weight"]
    b = nn.HybridSequential()
    e = nn.Dense(2, in_units=2)
    b.add(e, nn.Dense(2, in_units=2, params=e.collect_params()))
    b.load_parameters(tmp_path / "p")
    np.testing.assert_array_equal(b[1].weight.data().asnumpy(), a[0].weight.data().asnumpy())


def test_hb_save_and_load_arrays(tmp_path):
    x = hb.array(np.arange(6, dtype=np.float64).reshape(2, 3))
    hb.save(tmp_path / "one", x)
    y = hb.load_arrays(tmp_path / "one")
    assert isinstance(y, hb.NDArray) and y.dtype == np.float32  # hb.array's default float
    hb.save(tmp_path / "list", [hb.ones(2), hb.array([1, 2], dtype="int32")])
    lst = hb.load_arrays(tmp_path / "list", device=hb.cpu(1))
    assert isinstance(lst, list) and lst[1].dtype == np.int32 and lst[0].device == hb.cpu(1)
    d = {"zeta": np.zeros(3, np.float32), "alpha": np.ones((2, 2), np.int64),
         "mid": np.array(True)}
    hb.save(tmp_path / "dict", d)
    back = hb.load_arrays(tmp_path / "dict")
    assert list(back) == ["zeta", "alpha", "mid"]  # the caller's order
    assert back["alpha"].dtype == np.int64 and back["mid"].item() is True
    raw = (tmp_path / "dict").read_bytes()
    assert b"pickle" not in raw and b"__reduce__" not in raw
