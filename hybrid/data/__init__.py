"""Datasets and data loading (Gluon's ``gluon.data``).

    from hybrid.data import vision
    train = vision.Digits(train=True, size=28)
    loader = hb.data.DataLoader(train, batch_size=64, shuffle=True, num_workers=2)
    for x, y in hb.data.progress(loader):
        ...
"""
from .dataset import ArrayDataset, Dataset, SimpleDataset
from .dataloader import (BatchSampler, DataLoader, DataLoaderTimeout, RandomSampler, Sampler,
                         SequentialSampler, default_batchify_fn, progress)
from . import transforms, vision

__all__ = ["Dataset", "SimpleDataset", "ArrayDataset", "DataLoader", "Sampler",
           "SequentialSampler", "RandomSampler", "BatchSampler", "default_batchify_fn",
           "DataLoaderTimeout", "progress", "transforms", "vision"]
