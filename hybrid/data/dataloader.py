"""``DataLoader``: batches from a Dataset, optionally prepared by background threads.

With ``num_workers > 0``, worker threads build the next ``prefetch`` batches while the model
trains on the current one, so the device does not wait for input; batches still come out in
order. A worker's exception is re-raised in the loop that consumes the batches, and every
wait has a timeout, so a broken pipeline raises instead of hanging. Shuffling draws its
permutation from ``hybrid.random``, so ``hb.random.seed`` makes epochs reproducible.

Workers are threads: batch assembly is NumPy work that releases the GIL, and threads need no
pickling (``thread_pool=False`` is accepted for Gluon compatibility and also uses threads).
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import sys

import numpy as np

from runtime.device import cpu, current_device, parse_device

from .. import random as _random
from ..ndarray import NDArray, array

__all__ = ["DataLoader", "Sampler", "SequentialSampler", "RandomSampler", "BatchSampler",
           "default_batchify_fn", "DataLoaderTimeout", "progress"]


class DataLoaderTimeout(TimeoutError):
    """A worker took longer than ``timeout`` seconds to produce a batch."""


class Sampler:
    """Yields sample indices."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__ (the indices)")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")


class SequentialSampler(Sampler):
    def __init__(self, length: int, start: int = 0):
        self._length, self._start = int(length), int(start)

    def __iter__(self):
        return iter(range(self._start, self._start + self._length))

    def __len__(self):
        return self._length


class RandomSampler(Sampler):
    """A fresh permutation of range(length) per pass, drawn from hybrid.random's stream."""

    def __init__(self, length: int):
        self._length = int(length)

    def __iter__(self):
        rng = np.random.default_rng(_random.next_key(cpu(0)))
        return iter(rng.permutation(self._length).tolist())

    def __len__(self):
        return self._length


class BatchSampler(Sampler):
    """Groups a sampler's indices into lists of ``batch_size``.

    last_batch: 'keep' (a smaller last batch), 'discard' (drop it) or 'rollover' (carry the
    leftover indices to the start of the next pass).
    """

    def __init__(self, sampler, batch_size: int, last_batch: str = "keep"):
        if last_batch not in ("keep", "discard", "rollover"):
            raise ValueError(f"last_batch must be 'keep', 'discard' or 'rollover', got "
                             f"{last_batch!r}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self._sampler = sampler
        self._batch_size = int(batch_size)
        self._last_batch = last_batch
        self._prev = []

    def __iter__(self):
        batch, self._prev = self._prev, []
        for i in self._sampler:
            batch.append(i)
            if len(batch) == self._batch_size:
                yield batch
                batch = []
        if batch:
            if self._last_batch == "keep":
                yield batch
            elif self._last_batch == "rollover":
                self._prev = batch

    def __len__(self):
        n = len(self._sampler)
        if self._last_batch == "keep":
            return (n + self._batch_size - 1) // self._batch_size
        if self._last_batch == "discard":
            return n // self._batch_size
        return (len(self._prev) + n) // self._batch_size


def _stack(items):
    first = items[0]
    if isinstance(first, NDArray):
        return np.stack([a.asnumpy() for a in items])
    if hasattr(first, "get") and not isinstance(first, np.ndarray):  # cupy
        return np.stack([a.get() for a in items])
    return np.stack([np.asarray(a) for a in items])


def default_batchify_fn(data):
    """Stack samples into hybrid arrays; tuples of fields give a list of batched fields."""
    first = data[0]
    if isinstance(first, (tuple, list)):
        return [default_batchify_fn(list(field)) for field in zip(*data)]
    stacked = _stack(data)
    return array(stacked, dtype=stacked.dtype if isinstance(first, NDArray) else None)


class DataLoader:
    """Gluon's DataLoader.

    batch_size, shuffle, sampler, last_batch ('keep' | 'discard' | 'rollover'),
    batch_sampler, batchify_fn (samples -> batch; default stacks into hybrid arrays),
    num_workers (background threads; 0 builds batches in the consuming loop),
    prefetch (batches prepared ahead, default 2 * num_workers), timeout (seconds one batch
    may take before DataLoaderTimeout), device (where batches are placed; default the
    current device).
    """

    def __init__(self, dataset, batch_size=None, shuffle: bool = False, sampler=None,
                 last_batch=None, batch_sampler=None, batchify_fn=None, num_workers: int = 0,
                 pin_memory: bool = False, pin_device_id: int = 0, prefetch=None,
                 thread_pool: bool = True, timeout: float = 120, device=None,
                 try_nopython=None):
        self._dataset = dataset
        if batch_sampler is None:
            if batch_size is None:
                raise ValueError("DataLoader: batch_size must be given when batch_sampler is "
                                 "not")
            if sampler is None:
                sampler = RandomSampler(len(dataset)) if shuffle else \
                    SequentialSampler(len(dataset))
            elif shuffle:
                raise ValueError("DataLoader: shuffle must not be set when a sampler is given")
            batch_sampler = BatchSampler(sampler, batch_size,
                                         last_batch if last_batch else "keep")
        elif batch_size is not None or shuffle or sampler is not None or \
                last_batch is not None:
            raise ValueError("DataLoader: batch_size, shuffle, sampler and last_batch must "
                             "not be set when batch_sampler is given")
        self._batch_sampler = batch_sampler
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self._num_workers = int(num_workers)
        self._prefetch = max(1, int(prefetch) if prefetch is not None
                             else 2 * self._num_workers)
        self._batchify_fn = batchify_fn or default_batchify_fn
        if timeout is None or timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self._timeout = float(timeout)
        self._device = parse_device(device) if device is not None else None

    def __len__(self):
        return len(self._batch_sampler)

    def __iter__(self):
        # the order of this pass is fixed now, in the caller's thread (reproducible)
        batches = list(self._batch_sampler)
        device = self._device or current_device()
        if self._num_workers == 0:
            return (self._make(idx, device) for idx in batches)
        return self._threaded(batches, device)

    def _make(self, indices, device):
        batch = self._batchify_fn([self._dataset[i] for i in indices])
        return _to_device(batch, device)

    def _threaded(self, batches, device):
        pool = concurrent.futures.ThreadPoolExecutor(self._num_workers,
                                                     thread_name_prefix="hybrid-data")
        todo = iter(batches)
        pending = collections.deque()
        try:
            for idx in itertools.islice(todo, self._prefetch):
                pending.append(pool.submit(self._make, idx, device))
            while pending:
                fut = pending.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(self._make, nxt, device))
                try:
                    batch = fut.result(timeout=self._timeout)
                except concurrent.futures.TimeoutError:
                    raise DataLoaderTimeout(
                        f"a DataLoader worker took more than {self._timeout:g} s to produce a "
                        "batch (a slow or stuck dataset or batchify_fn); raise timeout= if "
                        "batches are legitimately this slow") from None
                except Exception as exc:
                    exc.add_note("(raised in a DataLoader worker thread while building a "
                                 "batch)")
                    raise
                yield batch
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=False, cancel_futures=True)


def _to_device(batch, device):
    if isinstance(batch, NDArray):
        return batch if batch.device == device else batch.copyto(device)
    if isinstance(batch, list):
        return [_to_device(b, device) for b in batch]
    if isinstance(batch, tuple):
        return tuple(_to_device(b, device) for b in batch)
    return batch


def progress(iterable, total=None, desc=None, enable=None, **kwargs):
    """A tqdm progress bar over ``iterable`` when stderr is a terminal (or enable=True);
    otherwise the iterable itself, so logs stay clean."""
    if enable is None:
        enable = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    if not enable:
        return iterable
    try:
        from tqdm import tqdm  # noqa: PLC0415 - optional at import time
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, **kwargs)
