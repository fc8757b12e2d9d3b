"""Image transforms (``hybrid.data.vision.transforms``), Gluon's names.

They work on NumPy images (what the datasets here yield, and fast inside DataLoader workers)
and return NumPy; given a hybrid array they return a hybrid array.

    trans = transforms.Compose([transforms.Resize(32), transforms.ToTensor()])
    train = vision.FashionMNIST(train=True).transform_first(trans)
"""
from __future__ import annotations

import numpy as np

from ..ndarray import NDArray, array

__all__ = ["Compose", "ToTensor", "Normalize", "Resize", "Cast", "resize_images"]


def _np(x):
    return (x.asnumpy(), True) if isinstance(x, NDArray) else (np.asarray(x), False)


def _back(x, was_nd):
    return array(x, dtype=x.dtype) if was_nd else x


def _interp_matrix(n_in: int, n_out: int, method: str) -> np.ndarray:
    """(n_out, n_in) weights mapping a row of n_in pixels to n_out pixels (pixel centres
    aligned, as OpenCV/PIL resize)."""
    m = np.zeros((n_out, n_in), dtype=np.float64)
    pos = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    if method == "nearest":
        idx = np.clip(np.floor((np.arange(n_out) + 0.5) * (n_in / n_out)), 0, n_in - 1)
        m[np.arange(n_out), idx.astype(int)] = 1.0
        return m
    if method != "bilinear":
        raise ValueError(f"interpolation must be 'bilinear' or 'nearest', got {method!r}")
    pos = np.clip(pos, 0, n_in - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    w = pos - lo
    np.add.at(m, (np.arange(n_out), lo), 1 - w)
    np.add.at(m, (np.arange(n_out), hi), w)
    return m


def resize_images(images: np.ndarray, size, method: str = "bilinear",
                  layout: str = "HW") -> np.ndarray:
    """Resize the two spatial axes of ``images`` to ``size`` = (height, width).

    layout 'HW': the last two axes are spatial (e.g. (N, H, W) or (N, C, H, W));
    'HWC': the two axes before the last one are. Float results for float input; integer
    input is rounded back to its dtype.
    """
    h_out, w_out = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    x = np.asarray(images)
    if layout == "HWC":
        x = np.moveaxis(x, -1, 0)
    h_in, w_in = x.shape[-2:]
    rh = _interp_matrix(h_in, h_out, method)
    rw = _interp_matrix(w_in, w_out, method)
    out = np.einsum("oh,...hw,pw->...op", rh, x.astype(np.float64), rw)
    if layout == "HWC":
        out = np.moveaxis(out, 0, -1)
    if x.dtype.kind in "iub":
        info = np.iinfo(x.dtype) if x.dtype.kind != "b" else None
        out = np.rint(out)
        if info is not None:
            out = np.clip(out, info.min, info.max)
        return out.astype(x.dtype)
    return out.astype(x.dtype if x.dtype.kind == "f" else np.float32)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms):
        self._transforms = list(transforms)

    def __call__(self, x):
        for t in self._transforms:
            x = t(x)
        return x

    def __repr__(self):
        inner = ", ".join(repr(t) for t in self._transforms)
        return f"Compose([{inner}])"


class ToTensor:
    """(H, W, C) (or (H, W), or a batch (N, H, W, C)) images in [0, 255] -> float32
    (C, H, W) (or (N, C, H, W)) in [0, 1]."""

    def __call__(self, x):
        x, nd = _np(x)
        x = x.astype(np.float32) / 255.0
        if x.ndim == 2:
            x = x[None]
        elif x.ndim == 3:
            x = np.moveaxis(x, -1, 0)
        elif x.ndim == 4:
            x = np.moveaxis(x, -1, 1)
        else:
            raise ValueError(f"ToTensor: expected (H, W), (H, W, C) or (N, H, W, C) images, "
                             f"got shape {x.shape}")
        return _back(np.ascontiguousarray(x), nd)

    def __repr__(self):
        return "ToTensor()"


class Normalize:
    """(x - mean[c]) / std[c] per channel of (C, H, W) or (N, C, H, W) tensors."""

    def __init__(self, mean=0.0, std=1.0):
        self._mean = np.asarray(mean, dtype=np.float32).reshape(-1)
        self._std = np.asarray(std, dtype=np.float32).reshape(-1)
        if np.any(self._std == 0):
            raise ValueError("Normalize: std must be non-zero")

    def __call__(self, x):
        x, nd = _np(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"Normalize: expected (C, H, W) or (N, C, H, W), got shape "
                             f"{x.shape}")
        c = x.shape[-3]
        for name, v in (("mean", self._mean), ("std", self._std)):
            if v.size not in (1, c):
                raise ValueError(f"Normalize: {name} has {v.size} values for {c} channels")
        shape = (-1, 1, 1)
        out = (x.astype(np.float32) - self._mean.reshape(shape)) / self._std.reshape(shape)
        return _back(out.astype(np.float32), nd)

    def __repr__(self):
        return f"Normalize(mean={self._mean.tolist()}, std={self._std.tolist()})"


class Resize:
    """Resize (H, W, C) or (H, W) images to ``size`` (an int, or (width, height) as Gluon).

    interpolation: 1 or 'bilinear' (default), 0 or 'nearest'. keep_ratio with an int size
    scales the shorter side to ``size``.
    """

    def __init__(self, size, keep_ratio: bool = False, interpolation=1):
        self._size = size
        self._keep_ratio = keep_ratio
        self._method = {0: "nearest", 1: "bilinear"}.get(interpolation, interpolation)
        if self._method not in ("nearest", "bilinear"):
            raise ValueError(f"Resize: interpolation must be 0/'nearest' or 1/'bilinear', got "
                             f"{interpolation!r}")

    def __call__(self, x):
        x, nd = _np(x)
        h, w = x.shape[:2]
        if isinstance(self._size, int):
            if self._keep_ratio:
                s = self._size / min(h, w)
                hw = (max(1, round(h * s)), max(1, round(w * s)))
            else:
                hw = (self._size, self._size)
        else:
            hw = (int(self._size[1]), int(self._size[0]))
        if x.ndim == 2:
            out = resize_images(x, hw, self._method, "HW")
        elif x.ndim == 3:
            out = resize_images(x, hw, self._method, "HWC")
        else:
            raise ValueError(f"Resize: expected (H, W) or (H, W, C) images, got {x.shape}")
        return _back(out, nd)

    def __repr__(self):
        return f"Resize(size={self._size}, keep_ratio={self._keep_ratio}, {self._method})"


class Cast:
    """Cast to ``dtype`` (float32 by default)."""

    def __init__(self, dtype="float32"):
        self._dtype = np.dtype(dtype)

    def __call__(self, x):
        x, nd = _np(x)
        return _back(x.astype(self._dtype), nd)

    def __repr__(self):
        return f"Cast({self._dtype.name})"
