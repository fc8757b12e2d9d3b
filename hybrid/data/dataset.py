"""Datasets (Gluon's ``gluon.data``): anything with ``__getitem__`` and ``__len__``.

Samples are kept as NumPy values (an ``ArrayDataset`` of hybrid arrays copies them to NumPy
once), so building a batch is one NumPy stack and one hybrid array, not one engine op per
sample.
"""
from __future__ import annotations

import numpy as np

from ..ndarray import NDArray

__all__ = ["Dataset", "SimpleDataset", "ArrayDataset"]


class Dataset:
    """Abstract dataset: override ``__getitem__`` and ``__len__``."""

    def __getitem__(self, idx):
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def transform(self, fn, lazy: bool = True) -> "Dataset":
        """A dataset of ``fn(*sample)`` (``fn(sample)`` for non-tuple samples); applied on
        access when lazy, at once otherwise."""
        trans = _LazyTransformDataset(self, fn)
        if lazy:
            return trans
        return SimpleDataset([trans[i] for i in range(len(trans))])

    def transform_first(self, fn, lazy: bool = True) -> "Dataset":
        """Apply ``fn`` to the first element of each sample only (the data, not the label)."""
        return self.transform(_TransformFirst(fn), lazy)

    def filter(self, fn) -> "Dataset":
        """The samples for which ``fn(sample)`` is true."""
        keep = [i for i in range(len(self)) if fn(self[i])]
        return _IndexedDataset(self, keep)

    def take(self, count) -> "Dataset":
        """The first ``count`` samples (all if None)."""
        n = len(self) if count is None else min(int(count), len(self))
        return _IndexedDataset(self, list(range(n)))

    def shard(self, num_shards: int, index: int) -> "Dataset":
        """The ``index``-th of ``num_shards`` contiguous parts (sizes differ by at most 1)."""
        if not 0 <= index < num_shards:
            raise ValueError(f"shard: index must be in [0, {num_shards}), got {index}")
        n = len(self)
        size, extra = divmod(n, num_shards)
        start = index * size + min(index, extra)
        end = start + size + (1 if index < extra else 0)
        return _IndexedDataset(self, list(range(start, end)))

    def sample(self, sampler) -> "Dataset":
        """The samples at the indices ``sampler`` yields."""
        return _IndexedDataset(self, list(sampler))


class _IndexedDataset(Dataset):
    def __init__(self, base, indices):
        self._base = base
        self._indices = indices

    def __getitem__(self, idx):
        return self._base[self._indices[idx]]

    def __len__(self):
        return len(self._indices)


class _LazyTransformDataset(Dataset):
    def __init__(self, data, fn):
        self._data = data
        self._fn = fn

    def __len__(self):
        return len(self._data)

    def __getitem__(self, idx):
        item = self._data[idx]
        if isinstance(item, tuple):
            return self._fn(*item)
        return self._fn(item)


class _TransformFirst:
    def __init__(self, fn):
        self._fn = fn

    def __call__(self, x, *args):
        if args:
            return (self._fn(x),) + args
        return self._fn(x)


class SimpleDataset(Dataset):
    """Wrap a list (or anything indexable with a length)."""

    def __init__(self, data):
        self._data = data

    def __len__(self):
        return len(self._data)

    def __getitem__(self, idx):
        return self._data[idx]


class ArrayDataset(Dataset):
    """Samples are tuples of the i-th entries of each array (the entry itself for one array).

    Hybrid arrays are copied to NumPy once here, so sample access is cheap.
    """

    def __init__(self, *args):
        if not args:
            raise ValueError("ArrayDataset needs at least one array")
        self._length = len(args[0])
        self._data = []
        for i, data in enumerate(args):
            if len(data) != self._length:
                raise ValueError(f"ArrayDataset: all arrays must have the same length; "
                                 f"array 0 has {self._length} entries, array {i} has "
                                 f"{len(data)}")
            if isinstance(data, NDArray):
                data = data.asnumpy()
            elif isinstance(data, (list, tuple)) and data and np.isscalar(data[0]):
                data = np.asarray(data)
            self._data.append(data)

    def __getitem__(self, idx):
        if len(self._data) == 1:
            return self._data[0][idx]
        return tuple(d[idx] for d in self._data)

    def __len__(self):
        return self._length
