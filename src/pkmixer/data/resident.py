"""Device-resident data: a data set that fits in memory, decoded once into one tensor on the run's device, and
the global batches of an epoch in :class:`pkmixer.train.distributed.GlobalBatchSampler`'s order.

:func:`load_resident` reads a split with :func:`pkmixer.data.build_dataset` (the same readers, the same
``val_fraction`` hold-out and ``subset``, the same examples in the same order) and stacks its images into

* ``images``: uint8 (N, C, H, W) for data stored as bytes (CIFAR-10/100, STL-10, MNIST, Fashion-MNIST), or
  float32 (N, C, H, W) in [0, 1] for digits and synthetic, which ``build_dataset`` itself gives as floats
  (digits' 0..16 levels and the synthetic noise are not whole multiples of 1/255; quantising them would change
  the data);
* ``labels``: int64 (N,),

on ``device``. Image folders (ImageNet) are refused with a :class:`ConfigError`: they keep the per-sample
DataLoader path. Memory: CIFAR-10's training set is 150 MB as uint8, STL-10's 5000 training images 138 MB.

:class:`ResidentBatches` cuts an epoch into global batches exactly as ``GlobalBatchSampler`` does for
(seed, epoch) - the permutation ``torch.randperm(n, generator=seed·100003 + epoch)`` drawn on the CPU - so a run
can switch between the per-sample pipeline and this one and keep its data order. Each batch is this process's
slice of the global batch (the r-th of ``world`` equal slices; in evaluation the last, incomplete batch is split
``[rank::world]`` as the sampler does), with the slice's place in the global batch for
:class:`pkmixer.data.batch_augment.BatchAugment`. Per step it only indexes device tensors: the order of an epoch
goes to the device once, when the epoch starts.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, check_positive_int
from .datasets import ArrayImages, DatasetInfo, build_dataset, dataset_info
from .transforms import natural_images


@dataclass
class ResidentSplit:
    """One split held as tensors on a device (module docstring)."""

    images: torch.Tensor  # (N, C, H, W) uint8, or float32 in [0, 1] for digits / synthetic
    labels: torch.Tensor  # (N,) int64
    info: DatasetInfo
    split: str
    classes: list[str]

    def __len__(self) -> int:
        return self.labels.shape[0]

    @property
    def device(self) -> torch.device:
        return self.images.device


def load_resident(name: str, split: str, *, device: str | torch.device = "cpu",
                  data_dir: str | os.PathLike | None = None, download: bool = False, val_fraction: float = 0.0,
                  subset: int | None = None, seed: int = 0, **synthetic_options: Any) -> ResidentSplit:
    """Split ``split`` of data set ``name`` as tensors on ``device``: the examples of
    ``build_dataset(name, split, ...)`` with the same arguments, in its order (module docstring)."""
    info = dataset_info(name, **synthetic_options)  # refuses unknown names before anything is read
    if natural_images(info):
        raise ConfigError(f"{info.title} is a folder of image files of varying sizes; it cannot be held on the "
                          "device as one tensor - use the per-sample DataLoader pipeline for it")
    ds = build_dataset(name, split, data_dir=data_dir, download=download, val_fraction=val_fraction,
                       subset=subset, seed=seed, **synthetic_options)
    return to_resident(ds, device)


def to_resident(ds, device: str | torch.device = "cpu") -> ResidentSplit:
    """A split already built by :func:`pkmixer.data.build_dataset`, as tensors on ``device``."""
    if natural_images(ds.info):
        raise ConfigError(f"{ds.info.title} is a folder of image files of varying sizes; it cannot be held on "
                          "the device as one tensor - use the per-sample DataLoader pipeline for it")
    source = ds.source
    if not isinstance(source, ArrayImages):  # a registered in-memory data set always is one
        raise ConfigError(f"{ds.info.title} is not held in memory by its reader; use the per-sample pipeline")
    index = np.asarray(ds.indices, dtype=np.int64)
    if isinstance(source.images, torch.Tensor):  # digits, synthetic: float (N, C, H, W) in [0, 1]
        images = source.images[torch.from_numpy(index)].to(torch.float32)
    else:  # uint8 (N, H, W) or (N, H, W, C)
        array = np.ascontiguousarray(source.images[index])
        images = torch.from_numpy(array)
        images = images[:, None] if images.ndim == 3 else images.permute(0, 3, 1, 2)
    labels = torch.as_tensor(ds.targets, dtype=torch.int64)
    return ResidentSplit(images.contiguous().to(device), labels.to(device), ds.info, ds.split, ds.classes)


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The order of the n examples in ``epoch``: one permutation drawn from (seed, epoch) (CPU, int64), the order
    of :class:`ResidentBatches` and of :class:`pkmixer.train.distributed.GlobalBatchSampler`."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def batch_count(n: int, batch_size: int, drop_last: bool) -> int:
    """Global batches of an epoch of n examples (an incomplete last one kept unless ``drop_last``)."""
    full, rest = divmod(n, batch_size)
    return full + (0 if drop_last or rest == 0 else 1)


def batch_parts(n: int, batch_size: int, *, rank: int, world: int,
                drop_last: bool) -> Iterator[tuple[int, int, int, slice]]:
    """(step, start, stop, part) of each global batch ``order[start:stop]`` of an epoch, ``part`` the slice of it
    that process ``rank`` of ``world`` takes: the r-th of ``world`` equal slices, and of an incomplete last batch
    (evaluation) every ``world``-th example from ``rank`` on - a process may get none, and then stops."""
    per_rank = batch_size // world
    for step, start in enumerate(range(0, n, batch_size)):
        stop = min(start + batch_size, n)
        if stop - start < batch_size:
            if drop_last or rank >= stop - start:
                return
            yield step, start, stop, slice(rank, None, world)
            return
        yield step, start, stop, slice(rank * per_rank, (rank + 1) * per_rank)


@dataclass(frozen=True)
class Batch:
    """This process's part of one global batch."""

    step: int  # the batch's index in the epoch
    images: torch.Tensor  # (n, C, H, W) as stored
    labels: torch.Tensor  # (n,)
    indices: torch.Tensor  # (n,) the examples' positions in the split, on the device
    rank_slice: slice  # where these n examples sit in the global batch
    global_size: int  # the global batch's size


class ResidentBatches:
    """The global batches of an epoch over a :class:`ResidentSplit`, this process's slice of each - the batches
    ``GlobalBatchSampler(len(data), batch_size, ctx, shuffle=..., seed=..., drop_last=...)`` gives process
    ``rank`` of ``world``. ``set_epoch`` then iterate, like the sampler."""

    def __init__(self, data: ResidentSplit, batch_size: int, *, seed: int, shuffle: bool, drop_last: bool,
                 rank: int = 0, world: int = 1) -> None:
        check_positive_int("batch_size", batch_size)
        check_positive_int("world", world)
        if not 0 <= rank < world:
            raise ConfigError(f"rank {rank} is outside 0..{world - 1}")
        if batch_size % world:
            raise ConfigError(f"data.batch_size={batch_size} is not divisible by the {world} processes")
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.shuffle, self.drop_last, self.rank, self.world = shuffle, drop_last, rank, world
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return batch_count(len(self.data), self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[Batch]:
        n = len(self.data)
        order = epoch_order(n, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle).to(self.data.device)
        for step, start, stop, part in batch_parts(n, self.batch_size, rank=self.rank, world=self.world,
                                                   drop_last=self.drop_last):
            index = order[start:stop][part]
            yield Batch(step, self.data.images.index_select(0, index), self.data.labels.index_select(0, index),
                        index, part, stop - start)
