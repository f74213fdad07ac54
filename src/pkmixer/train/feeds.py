"""How a split's batches reach the model: the two feeds of ``data.pipeline``, with the same global batches in the
same order (:class:`~pkmixer.train.distributed.GlobalBatchSampler`'s).

* :class:`ResidentFeed`: a data set that fits in memory, held on the run's device as one tensor, augmented a
  whole batch at a time with per-image draws keyed by (seed, epoch, step) (:mod:`pkmixer.data.resident`,
  :mod:`pkmixer.data.batch_augment`) - what the paper's small models on 28-32 px images need;
* :class:`PerSampleFeed`: a DataLoader with per-example transforms (image folders such as ImageNet, and the
  augmentations that have no batched version).

A feed is built from the ``data`` section, the run's seed and device, and the model it feeds (its image size,
channels and classes).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from ..data import ResidentBatches, build_mixup, to_resident
from ..data.datasets import ArrayImages
from ..errors import ConfigError
from . import distributed as dist_
from .build import batch_augment_for, transform_for
from .config import DataConfig


def _worker_init(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)  # torch seeds Python's random itself


def build_loader(dataset, batch_size: int, ctx: dist_.Context, seed: int, workers: int, train: bool):
    """A loader over global batches (:class:`~pkmixer.train.distributed.GlobalBatchSampler`), its sampler
    and the generator that seeds its randomness (reseeded per epoch by the feed)."""
    sampler = dist_.GlobalBatchSampler(len(dataset), batch_size, ctx, shuffle=train, seed=seed, drop_last=train)
    generator = torch.Generator()
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=workers,
                                         worker_init_fn=_worker_init if workers else None,
                                         generator=generator, pin_memory=ctx.device.type == "cuda")
    return loader, sampler, generator


class PerSampleFeed:
    """Global batches through a DataLoader of per-example transforms, then timm's mixup/cutmix."""

    name = "per-sample"

    def __init__(self, data: DataConfig, seed: int, ctx: dist_.Context, dataset, model: nn.Module,
                 train: bool) -> None:
        dataset.transform = transform_for(data, model, train)
        size = data.batch_size if train else data.eval_batch_size
        self.loader, self.sampler, self.generator = build_loader(dataset, size, ctx, seed, data.workers, train)
        self.mixup = build_mixup(data.mixup, data.cutmix, data.mixup_switch_prob, data.label_smoothing,
                                 model.num_classes) if train else None
        self.ctx, self.seed = ctx, seed

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.set_epoch(epoch)
        self.generator.manual_seed(self.seed * 100_003 + epoch)
        for images, labels in self.loader:
            images = images.to(self.ctx.device, non_blocking=True)
            labels = labels.to(self.ctx.device, non_blocking=True)
            if self.mixup is not None:
                images, labels = self.mixup(images, labels)
            yield images, labels


class ResidentFeed:
    """Global batches of a device-resident split, augmented whole (mixup/cutmix included)."""

    name = "resident"

    def __init__(self, data: DataConfig, seed: int, ctx: dist_.Context, dataset, model: nn.Module,
                 train: bool) -> None:
        self.augment = batch_augment_for(data, model, train, dataset.info)
        self.data = to_resident(dataset, ctx.device)
        size = data.batch_size if train else data.eval_batch_size
        self.batches = ResidentBatches(self.data, size, seed=seed, shuffle=train, drop_last=train,
                                       rank=ctx.rank, world=ctx.world)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.batches)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.batches.set_epoch(epoch)
        for b in self.batches:
            yield self.augment(b.images, b.labels, seed=self.seed, epoch=epoch, step=b.step,
                               rank_slice=b.rank_slice, global_size=b.global_size)


FEEDS = {feed.name: feed for feed in (PerSampleFeed, ResidentFeed)}


def choose_feed(data: DataConfig, model: nn.Module, dataset, train: bool) -> type[PerSampleFeed] | type[ResidentFeed]:
    """``data.pipeline`` for one split: resident or per-sample as asked; auto takes resident where it can hold the
    data set and batch the split's transforms (a choice made from the config alone, never by timing). The splits
    choose apart: a training set with timm's RandAugment goes per sample, its test set (no augmentation) stays
    batched; AutoAugment is batched (:mod:`pkmixer.data.auto_augment`)."""
    if data.pipeline == "per-sample":
        return PerSampleFeed
    try:
        batch_augment_for(data, model, train, dataset.info)
        if not isinstance(getattr(dataset, "source", None), ArrayImages):
            raise ConfigError(f"{dataset.info.title} is not held in memory by its reader")
    except ConfigError as err:
        if data.pipeline == "resident":
            raise ConfigError(f"data.pipeline=resident: {err}") from None
        return PerSampleFeed
    return ResidentFeed


def build_feed(data: DataConfig, seed: int, ctx: dist_.Context, dataset, model: nn.Module, train: bool):
    """The feed :func:`choose_feed` picks for the split, built."""
    return choose_feed(data, model, dataset, train)(data, seed, ctx, dataset, model, train)
