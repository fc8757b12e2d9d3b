"""Vision datasets (``hybrid.data.vision``): the embedded Digits set, MNIST and Fashion-MNIST.

``Digits`` needs no download: the classic 8x8 handwritten digits (UCI "Optical Recognition of
Handwritten Digits", E. Alpaydin and C. Kaynak, 1998, as shipped by scikit-learn; 1797
images; CC BY 4.0) are stored in ``hybrid/data/digits.npz``.

``MNIST`` / ``FashionMNIST`` read the standard idx files (plain or .gz) from ``root``; only
when they are absent is a download tried, and without a network the error says which files
to put where.
"""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

from . import transforms
from .dataset import Dataset

__all__ = ["Digits", "MNIST", "FashionMNIST", "read_idx", "IdxFormatError", "transforms"]

_DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")


class IdxFormatError(ValueError):
    """An idx file is damaged, truncated or not the kind expected."""


# ====================================================================== Digits
class _ImageArrays(Dataset):
    """Images and labels held as NumPy arrays (``_data``, ``_label``), an optional transform."""

    _transform = None

    def __getitem__(self, idx):
        if self._transform is not None:
            return self._transform(self._data[idx], self._label[idx])
        return self._data[idx], self._label[idx]

    def __len__(self):
        return len(self._label)

    @property
    def data(self) -> np.ndarray:
        """All images as one array, (N, 1, H, W) float32."""
        return self._data

    @property
    def label(self) -> np.ndarray:
        return self._label


class Digits(_ImageArrays):
    """The embedded 8x8 handwritten digits: 1797 images of 10 classes.

    Samples are (image float32 of shape (1, size, size) scaled to [0, 1], label int32).
    The split is fixed and stratified: within each class, every 5th image (in the data's
    order) is a test image, so test holds 355 images and train 1442.

    size: 8 (the original), or e.g. 28 to upsample for LeNet's 28x28 layout, with
    ``interpolation`` 'bilinear' (default) or 'nearest' (done once, in NumPy).
    transform: optional ``fn(image, label) -> sample``, as Gluon datasets take.
    """

    num_classes = 10

    def __init__(self, train: bool = True, size: int = 8, interpolation: str = "bilinear",
                 transform=None):
        with np.load(_DIGITS, allow_pickle=False) as z:
            images, labels = z["images"], z["labels"]
        test = _stratified_test_mask(labels, 5)
        keep = ~test if train else test
        x = images[keep].astype(np.float32) / 16.0
        if int(size) != 8:
            x = transforms.resize_images(x, (int(size), int(size)), interpolation, "HW")
        self._data = np.ascontiguousarray(x[:, None, :, :], dtype=np.float32)
        self._label = labels[keep].astype(np.int32)
        self._transform = transform
        self.train = train



def _stratified_test_mask(labels, every: int) -> np.ndarray:
    mask = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        mask[idx[every - 1::every]] = True
    return mask


# ====================================================================== idx files
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path, expect_ndim: int | None = None) -> np.ndarray:
    """Parse an idx file (optionally gzipped); validates the magic number and the size."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"idx file '{path}' does not exist") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise IdxFormatError(f"'{path}' is a damaged gzip file ({exc}); delete it and "
                                 "download it again") from None
    if len(raw) < 4:
        raise IdxFormatError(f"'{path}' is not an idx file: only {len(raw)} bytes")
    zero, type_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or type_code not in _IDX_TYPES or ndim == 0:
        raise IdxFormatError(f"'{path}' is not an idx file: bad magic number "
                             f"0x{raw[:4].hex()} (expected 0x0000TTNN with a known type)")
    if expect_ndim is not None and ndim != expect_ndim:
        raise IdxFormatError(f"'{path}' holds a {ndim}-d array, expected {expect_ndim}-d "
                             f"(magic 0x{raw[:4].hex()})")
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise IdxFormatError(f"'{path}' is truncated inside its header")
    dims = struct.unpack(f">{ndim}I", raw[4:head])
    dtype = np.dtype(_IDX_TYPES[type_code])
    need = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    have = len(raw) - head
    if have != need:
        what = "truncated" if have < need else "damaged (trailing bytes)"
        raise IdxFormatError(f"'{path}' is {what}: dimensions {dims} need {need} bytes of "
                             f"data, the file has {have}")
    data = np.frombuffer(raw, dtype=dtype, offset=head).reshape(dims)
    return data.astype(dtype.newbyteorder("="), copy=True)


class MNIST(_ImageArrays):
    """MNIST from idx files in ``root``; samples are (image uint8 (28, 28, 1), label int32),
    as Gluon's. Use ``transform_first(transforms.ToTensor())`` for float (1, 28, 28)."""

    _base_urls = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                  "https://storage.googleapis.com/cvdf-datasets/mnist/")
    _default_root = os.path.join("~", ".hybrid", "datasets", "mnist")
    _files = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

    def __init__(self, root=None, train: bool = True, transform=None):
        self._root = os.path.expanduser(os.fspath(root or self._default_root))
        self.train = train
        self._transform = transform
        img_path, lbl_path = (self._locate(name) for name in self._files[train])
        images = read_idx(img_path, expect_ndim=3)
        labels = read_idx(lbl_path, expect_ndim=1)
        if images.dtype != np.uint8 or labels.dtype != np.uint8:
            raise IdxFormatError(f"'{img_path}' / '{lbl_path}': expected unsigned-byte data")
        if len(images) != len(labels):
            raise IdxFormatError(f"'{img_path}' has {len(images)} images but '{lbl_path}' has "
                                 f"{len(labels)} labels")
        self._data = images[:, :, :, None]
        self._label = labels.astype(np.int32)

    def _locate(self, name):
        for cand in (name, name + ".gz"):
            p = os.path.join(self._root, cand)
            if os.path.exists(p):
                return p
        return self._download(name + ".gz")

    def _download(self, fname):
        from ..utils import DownloadError, download  # noqa: PLC0415 - imports the front end
        dest = os.path.join(self._root, fname)
        errors = []
        for base in self._base_urls:
            try:
                return download(base + fname, path=dest, retries=1)
            except DownloadError as exc:
                errors.append(f"{base + fname}: {exc.reason}")
        files = ", ".join(n + ".gz" for pair in self._files.values() for n in pair)
        raise RuntimeError(
            f"{type(self).__name__}: '{fname}' is not in {self._root} and could not be "
            f"downloaded ({'; '.join(errors)}). Download {files} from "
            f"{self._base_urls[0]} on a machine with network access and copy them into "
            f"{self._root} (or pass root= to where they are); plain or .gz files both work.")



class FashionMNIST(MNIST):
    """Fashion-MNIST (Zalando): the same format and file names as MNIST."""

    _base_urls = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                  "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/")
    _default_root = os.path.join("~", ".hybrid", "datasets", "fashion-mnist")
