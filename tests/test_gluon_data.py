"""Datasets, DataLoader (shuffling, last batch, worker threads, errors), transforms, idx
parsing and the embedded Digits set."""
import gzip
import struct
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import hybrid as hb
from hybrid import data
from hybrid.data import transforms, vision


# ------------------------------------------------------------------ datasets
def test_array_and_simple_datasets():
    x = np.arange(20).reshape(10, 2)
    y = np.arange(10)
    ds = data.ArrayDataset(x, hb.array(y, dtype="int32"))
    assert len(ds) == 10
    a, b = ds[3]
    np.testing.assert_array_equal(a, [6, 7])
    assert b == 3
    single = data.ArrayDataset(x)
    np.testing.assert_array_equal(single[2], [4, 5])
    with pytest.raises(ValueError, match="same length"):
        data.ArrayDataset(x, y[:5])
    s = data.SimpleDataset(list("abcdef"))
    assert len(s) == 6 and s[1] == "b"
    assert [s.take(3)[i] for i in range(3)] == ["a", "b", "c"]
    assert [s.shard(4, 1)[i] for i in range(len(s.shard(4, 1)))] == ["c", "d"]
    assert sum(len(s.shard(4, k)) for k in range(4)) == 6
    f = s.filter(lambda c: c in "bdf")
    assert [f[i] for i in range(len(f))] == ["b", "d", "f"]


def test_transform_and_transform_first():
    ds = data.ArrayDataset(np.arange(4.0), np.arange(4))
    calls = []

    def fn(v):
        calls.append(v)
        return v * 10

    lazy = ds.transform_first(fn)
    assert not calls
    assert lazy[2] == (20.0, 2)
    eager = ds.transform(lambda a, b: (a + b, b), lazy=False)
    assert eager[3] == (6.0, 3)
    plain = data.SimpleDataset([1, 2]).transform(lambda v: -v)
    assert plain[1] == -2


# ------------------------------------------------------------------ DataLoader
def _epoch(loader):
    out = []
    for xb, yb in loader:
        out.append(yb.asnumpy().tolist())
    return out


def test_loader_shuffle_covers_every_sample_once_and_is_deterministic():
    n = 53
    ds = data.ArrayDataset(np.arange(n, dtype=np.float32).reshape(n, 1), np.arange(n))
    loader = data.DataLoader(ds, batch_size=8, shuffle=True)
    assert len(loader) == 7
    hb.random.seed(42)
    e1 = _epoch(loader)
    e2 = _epoch(loader)
    for e in (e1, e2):
        flat = [i for b in e for i in b]
        assert sorted(flat) == list(range(n)) and [len(b) for b in e][-1] == 53 - 48
    assert e1 != e2  # a new order each epoch
    hb.random.seed(42)
    assert _epoch(loader) == e1  # reproducible under the seed
    seq = _epoch(data.DataLoader(ds, batch_size=8))
    assert [i for b in seq for i in b] == list(range(n))
    xb, yb = next(iter(loader))
    assert xb.shape == (8, 1) and xb.dtype == np.float32 and yb.dtype == np.int64


def test_last_batch_modes():
    ds = data.SimpleDataset(list(range(10)))
    sizes = lambda ld: [b.shape[0] for b in ld]  # noqa: E731
    assert sizes(data.DataLoader(ds, 4, last_batch="keep")) == [4, 4, 2]
    assert sizes(data.DataLoader(ds, 4, last_batch="discard")) == [4, 4]
    roll = data.DataLoader(ds, 4, last_batch="rollover")
    first = [b.asnumpy().tolist() for b in roll]
    second = [b.asnumpy().tolist() for b in roll]
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert second[0] == [8, 9, 0, 1] and len(second) == 3
    assert len(data.DataLoader(ds, 4, last_batch="discard")) == 2
    with pytest.raises(ValueError, match="last_batch"):
        data.DataLoader(ds, 4, last_batch="sometimes")
    with pytest.raises(ValueError, match="batch_size"):
        data.DataLoader(ds)


def test_workers_give_the_same_batches_in_order():
    n = 100
    ds = data.ArrayDataset(np.random.default_rng(0).standard_normal((n, 3)), np.arange(n))
    hb.random.seed(5)
    ref = [(x.asnumpy(), y.asnumpy()) for x, y in data.DataLoader(ds, 7, shuffle=True)]
    hb.random.seed(5)
    got = [(x.asnumpy(), y.asnumpy())
           for x, y in data.DataLoader(ds, 7, shuffle=True, num_workers=3, prefetch=4)]
    assert len(ref) == len(got)
    for (a, b), (c, d) in zip(ref, got):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def test_workers_prefetch_ahead():
    started = []
    lock = threading.Lock()

    class Slow(data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            with lock:
                started.append(i)
            return np.float32(i)

    loader = data.DataLoader(Slow(), 2, num_workers=2, prefetch=3)
    it = iter(loader)
    next(it)
    deadline = time.time() + 5
    while len(started) < 6 and time.time() < deadline:
        time.sleep(0.01)
    assert len(started) >= 6  # batches beyond the one consumed were built in the background
    it.close()


class _Failing(data.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 13:
            raise KeyError("sample 13 is broken")
        return np.float32(i)


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_exception_propagates(workers):
    loader = data.DataLoader(_Failing(), 4, num_workers=workers)
    t0 = time.time()
    got = []
    with pytest.raises(KeyError, match="sample 13 is broken"):
        for b in loader:
            got.append(b.shape[0])
    assert got == [4, 4, 4] and time.time() - t0 < 10


def test_worker_timeout_raises_instead_of_hanging():
    class Stuck(data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(1.0)
            return np.float32(i)

    loader = data.DataLoader(Stuck(), 2, num_workers=1, timeout=0.2)
    with pytest.raises(data.DataLoaderTimeout, match="more than 0.2 s"):
        next(iter(loader))


def test_batchify_and_device():
    ds = data.SimpleDataset([(np.ones((2, 2), np.float32), 1, hb.array([1.0, 2.0]))] * 3)
    x, y, z = next(iter(data.DataLoader(ds, 3, device=hb.cpu(1))))
    assert x.shape == (3, 2, 2) and y.shape == (3,) and z.shape == (3, 2)
    assert x.device == hb.cpu(1) and y.dtype == np.int64
    custom = data.DataLoader(data.SimpleDataset([1, 2, 3]), 2,
                             batchify_fn=lambda items: sum(items))
    assert list(custom) == [3, 3]


def test_progress_is_plain_when_not_a_terminal():
    items = [1, 2, 3]
    assert data.progress(items) is items
    bar = data.progress(items, enable=True, disable=False, file=open("/dev/null", "w"))
    assert list(bar) == items


# ------------------------------------------------------------------ transforms
def test_transforms():
    img = (np.arange(24).reshape(2, 4, 3) * 10).astype(np.uint8)
    t = transforms.ToTensor()(img)
    assert t.shape == (3, 2, 4) and t.dtype == np.float32
    np.testing.assert_allclose(t, np.moveaxis(img, -1, 0) / 255.0, rtol=1e-6)
    tn = transforms.ToTensor()(hb.array(img, dtype="uint8"))
    assert isinstance(tn, hb.NDArray) and tn.shape == (3, 2, 4)
    n = transforms.Normalize(mean=(0.1, 0.2, 0.3), std=(0.5, 0.5, 2.0))(t)
    np.testing.assert_allclose(n[2], (t[2] - 0.3) / 2.0, rtol=1e-6)
    r = transforms.Resize((8, 4))(img)  # (width, height) as Gluon
    assert r.shape == (4, 8, 3) and r.dtype == np.uint8
    up = transforms.resize_images(np.array([[0.0, 1.0]]), (1, 4))
    np.testing.assert_allclose(up, [[0.0, 0.25, 0.75, 1.0]])
    near = transforms.resize_images(np.array([[1.0, 2.0]]), (2, 4), "nearest")
    np.testing.assert_array_equal(near, [[1, 1, 2, 2], [1, 1, 2, 2]])
    comp = transforms.Compose([transforms.Resize(4), transforms.ToTensor()])
    assert comp(img).shape == (3, 4, 4)
    const = transforms.resize_images(np.full((3, 3), 0.5), (7, 5))
    np.testing.assert_allclose(const, 0.5)


# ------------------------------------------------------------------ Digits
def test_digits_embedded_dataset():
    tr, te = vision.Digits(train=True), vision.Digits(train=False)
    assert len(tr) + len(te) == 1797 and len(te) == 355
    x, y = tr[0]
    assert x.shape == (1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int32
    assert tr.data.min() == 0 and tr.data.max() == 1
    assert sorted(set(te.label.tolist())) == list(range(10))
    counts = np.bincount(te.label)
    assert counts.min() >= 34 and counts.max() <= 37  # stratified
    big = vision.Digits(train=False, size=28)
    assert big.data.shape == (355, 1, 28, 28) and 0 <= big.data.min() and big.data.max() <= 1
    np.testing.assert_array_equal(big.label, te.label)
    np.testing.assert_array_equal(vision.Digits(train=False).data, te.data)
    near = vision.Digits(train=False, size=16, interpolation="nearest")
    np.testing.assert_array_equal(near.data[:, :, ::2, ::2], te.data)
    # a train image is never a test image
    trs = {a.tobytes() for a in tr.data}
    assert sum(a.tobytes() in trs for a in te.data) < 5  # (a few duplicate digits exist)


# ------------------------------------------------------------------ idx files
def _idx(arr, type_code=0x08):
    head = struct.pack(">HBB", 0, type_code, arr.ndim) + struct.pack(f">{arr.ndim}I",
                                                                      *arr.shape)
    return head + arr.astype(">u1" if type_code == 0x08 else ">i4").tobytes()


def _write_mnist(root, n=5, gz=True, train=True):
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, size=(n, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    pre = "train" if train else "t10k"
    for name, arr in ((f"{pre}-images-idx3-ubyte", imgs), (f"{pre}-labels-idx1-ubyte", labels)):
        blob = _idx(arr)
        if gz:
            (root / (name + ".gz")).write_bytes(gzip.compress(blob))
        else:
            (root / name).write_bytes(blob)
    return imgs, labels


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_reads_idx_files(tmp_path, gz):
    imgs, labels = _write_mnist(tmp_path, gz=gz)
    ds = vision.FashionMNIST(root=tmp_path, train=True)
    assert len(ds) == 5
    x, y = ds[2]
    assert x.shape == (28, 28, 1) and x.dtype == np.uint8 and y == labels[2]
    np.testing.assert_array_equal(x[:, :, 0], imgs[2])
    loader = data.DataLoader(ds.transform_first(transforms.ToTensor()), 5)
    xb, yb = next(iter(loader))
    assert xb.shape == (5, 1, 28, 28) and xb.dtype == np.float32 and yb.dtype == np.int32


def test_idx_corrupt_files_are_refused(tmp_path):
    good = _idx(np.zeros((2, 3, 3), np.uint8))
    cases = {
        "magic": b"\x01\x02" + good[2:],
        "type": good[:2] + b"\x07" + good[3:],
        "short": good[:-3],
        "trailing": good + b"\x00",
        "header": good[:9],
        "tiny": b"\x00\x00",
    }
    for name, blob in cases.items():
        p = tmp_path / f"{name}-idx3-ubyte"
        p.write_bytes(blob)
        with pytest.raises(vision.IdxFormatError, match=str(p).replace("\\", "\\\\")):
            vision.read_idx(p, expect_ndim=3)
    p = tmp_path / "bad.gz"
    p.write_bytes(gzip.compress(good)[:-6])
    with pytest.raises(vision.IdxFormatError, match="damaged gzip"):
        vision.read_idx(p)
    p = tmp_path / "two-d"
    p.write_bytes(_idx(np.zeros((2, 3), np.uint8)))
    with pytest.raises(vision.IdxFormatError, match="2-d array, expected 3-d"):
        vision.read_idx(p, expect_ndim=3)
    assert vision.read_idx(p).shape == (2, 3)
    p.write_bytes(_idx(np.arange(6).reshape(2, 3), 0x0C))
    np.testing.assert_array_equal(vision.read_idx(p), np.arange(6).reshape(2, 3))


def test_mnist_count_mismatch(tmp_path):
    _write_mnist(tmp_path, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx(np.zeros(4, np.uint8)))
    with pytest.raises(vision.IdxFormatError, match="5 images but .* 4 labels"):
        vision.MNIST(root=tmp_path)


def test_missing_files_without_network_say_what_to_do(tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match="could not be downloaded.*copy them into"):
        vision.FashionMNIST(root=tmp_path / "none", train=False)


def test_download_when_absent(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    imgs, labels = _write_mnist(src, train=False)

    class Resp:
        def __init__(self, blob):
            self.blob = blob

        def read(self):
            return self.blob

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    fetched = []

    def fake(url, timeout=None):
        fetched.append(url)
        return Resp((src / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    ds = vision.FashionMNIST(root=tmp_path / "dl", train=False)
    assert len(ds) == 5 and len(fetched) == 2
    np.testing.assert_array_equal(ds.label, labels)
    vision.FashionMNIST(root=tmp_path / "dl", train=False)  # now present: no download
    assert len(fetched) == 2
