"""The step engine of a run: model and data, forward/backward, update, evaluation (Hayase & Karakida App. C,
Table S.2; Mixer supp. B, C).

:class:`StepEngine` knows nothing of run directories: the run (:mod:`pkmixer.train.loop`) builds it, asks it
for one epoch at a time, and saves and restores what it returns from :meth:`StepEngine.state_dict`
(optimiser, schedule, Polyak average). The same functions build the model and data for evaluation.

Data reach the model through one of two feeds (``data.pipeline``), with the same global batches in the same
order (:class:`~pkmixer.train.distributed.GlobalBatchSampler`'s):

* :class:`ResidentFeed`: a data set that fits in memory, held on the run's device as one tensor, augmented a
  whole batch at a time with per-image draws keyed by (seed, epoch, step) (:mod:`pkmixer.data.resident`,
  :mod:`pkmixer.data.batch_augment`) - what the paper's small models on 28-32 px images need;
* :class:`PerSampleFeed`: a DataLoader with per-example transforms (image folders such as ImageNet, and the
  augmentations that have no batched version).

The training loop makes no host synchronisation per step: the loss is summed on the device and read once per
epoch (a non-finite sum stops the run), except for the progress bar's occasional loss on a terminal.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler
from torch import nn
from tqdm import tqdm

from ..data import (ResidentBatches, build_batch_augment, build_dataset, build_loss, build_mixup, build_transform,
                    dataset_info, to_resident)
from ..data.datasets import ArrayImages
from ..errors import ConfigError
from ..layers.decay import decayed_parameters
from ..models.convert import import_checkpoint
from ..models.registry import canonical_name, create_model
from ..models.resolution import enlarged_options, enlarged_state_dict
from ..models.restore import model_from_checkpoint
from . import distributed as dist_
from .config import TrainConfig
from .preflight import check_head_classes


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


# ---- model and data -------------------------------------------------------------------------------------


def build_model(cfg: TrainConfig, num_classes: int) -> nn.Module:
    """The registered model, with the data set's class count unless the config sets one; with ``model.init``,
    started from that checkpoint (:func:`_model_from_init`)."""
    options = dict(cfg.model.options)
    options.setdefault("num_classes", num_classes)
    if cfg.model.init:
        return _model_from_init(cfg.model.name, cfg.model.init, options)
    return create_model(cfg.model.name, **options)


def _model_from_init(name: str, path: str, options: dict[str, Any]) -> nn.Module:
    """The checkpoint's architecture and weights, at the configured image size - enlarged block-diagonally
    when larger (Mixer supp. C) - and class count (a fresh head when it differs). The checkpoint is a
    pkmixer ``.pt``, a timm state dict or a Flax ``.npz`` of Google's (:func:`import_checkpoint`)."""
    source = import_checkpoint(path).model
    if canonical_name(source.spec.name) != canonical_name(name):  # an old name and its new one are one model
        raise ConfigError(f"model.init {path} holds a {source.spec.name}, not the configured {name}")
    size = options.get("img_size", getattr(source, "img_size", None))
    if size != getattr(source, "img_size", None):
        if size % source.img_size:
            raise ConfigError(f"model.img_size={size} is not an integer multiple of the checkpoint's "
                              f"{source.img_size} px (Mixer supp. C enlarges by integer factors)")
        factor = size // source.img_size
        base, state = enlarged_options(source, factor), enlarged_state_dict(source, factor)
    else:
        base, state = dict(source.spec.arguments), source.state_dict()
    model = create_model(name, **{**base, **options})
    own = model.state_dict()
    head = [k for k in state if k.startswith("head.") and k in own and state[k].shape != own[k].shape]
    for k in head:
        del state[k]
    try:
        model.load_state_dict(state, strict=not head)
    except RuntimeError as err:
        raise ConfigError(f"model.init {path}: weights do not fit the model ({str(err).splitlines()[1].strip()})")
    return model


def transform_for(cfg: TrainConfig, model: nn.Module, train: bool):
    """The per-example transform of a split, at the model's image size and channels."""
    d = cfg.data
    info = dataset_info(d.name)  # mean/std and channels; the class count comes from the built split
    if not train:
        return build_transform(info, train=False, img_size=model.img_size, in_chans=model.in_chans,
                               resize=d.resize, eval_crop=d.eval_crop)
    return build_transform(info, train=True, img_size=model.img_size, in_chans=model.in_chans,
                           crop_padding=d.crop_padding, hflip=d.hflip, auto_augment=d.auto_augment,
                           rand_augment=d.rand_augment, random_erasing=d.random_erasing,
                           random_resized_crop=d.random_resized_crop, resize=d.resize)


def run_splits(cfg: TrainConfig) -> tuple[str, ...]:
    """The splits a run trains and evaluates on: the training set, the validation split held out of it when
    ``data.val_fraction`` > 0 (it selects ``best.pt``), and the test set."""
    return ("train", "val", "test") if cfg.data.val_fraction > 0 else ("train", "test")


def build_splits(cfg: TrainConfig, splits: tuple[str, ...]) -> dict:
    """The splits, without transforms yet: the model they feed is built from their class count. The validation
    split is held out of the whole training set (``data.train_subset`` then subsets the rest) and is never
    subsetted."""
    d = cfg.data
    return {split: build_dataset(d.name, split, data_dir=d.data_dir, download=d.download,
                                 val_fraction=d.val_fraction, seed=cfg.run.seed,
                                 subset={"train": d.train_subset, "test": d.test_subset}.get(split))
            for split in splits}


def model_and_data(cfg: TrainConfig, splits: tuple[str, ...], checkpoint: dict[str, Any] | None = None,
                   where: Path | None = None) -> tuple[nn.Module, dict]:
    """The data splits and the model; with ``checkpoint`` the model is that checkpoint's (resume, eval)."""
    sets = build_splits(cfg, splits)
    if checkpoint is None:
        model = build_model(cfg, sets[splits[0]].info.num_classes)
    else:
        model = model_from_checkpoint(checkpoint, where)
    for split, ds in sets.items():
        ds.transform = transform_for(cfg, model, split == "train")
    return model, sets


def _worker_init(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)  # torch seeds Python's random itself


def build_loader(dataset, batch_size: int, ctx: dist_.Context, cfg: TrainConfig, train: bool):
    """A loader over global batches (:class:`~pkmixer.train.distributed.GlobalBatchSampler`), its sampler
    and the generator that seeds its randomness (reseeded per epoch by the engine)."""
    sampler = dist_.GlobalBatchSampler(len(dataset), batch_size, ctx, shuffle=train, seed=cfg.run.seed,
                                       drop_last=train)
    generator = torch.Generator()
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.data.workers,
                                         worker_init_fn=_worker_init if cfg.data.workers else None,
                                         generator=generator, pin_memory=ctx.device.type == "cuda")
    return loader, sampler, generator


# ---- optimisation ---------------------------------------------------------------------------------------


def build_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum (App. C.4) or AdamW (App. C.5); weight decay on the parameters whose role
    is a weight, as each layer declares (:func:`~pkmixer.layers.decay.decayed_parameters`): not on biases,
    norms or anything a layer leaves out, whatever their rank."""
    decay_names = decayed_parameters(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if n in decay_names]
    rest = [p for n, p in named if n not in decay_names]
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    o = cfg.optim
    if o.name == "adamw":  # the fused kernel: one pass over all tensors, 8x the per-tensor loop on a CPU
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in decay + rest)
        return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, fused=fused or None)
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0)


def build_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int) -> CosineLRScheduler:
    """Cosine annealing with linear warm-up, stepped every update."""
    s = cfg.schedule
    return CosineLRScheduler(optimizer, t_initial=s.epochs * steps_per_epoch, lr_min=s.min_lr,
                             warmup_t=round(s.warmup_epochs * steps_per_epoch), warmup_lr_init=s.warmup_lr,
                             t_in_epochs=False)


def set_precision(cfg: TrainConfig) -> None:
    """TF32 matrix products on CUDA only when ``run.tf32`` asks (the paper trained in fp32, App. C.3)."""
    torch.backends.cuda.matmul.allow_tf32 = cfg.run.tf32
    torch.backends.cudnn.allow_tf32 = cfg.run.tf32


def uses_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    """bf16 autocast when ``run.amp`` is bf16, or auto on a GPU."""
    return cfg.run.amp == "bf16" or (cfg.run.amp == "auto" and device.type == "cuda")


def precision(cfg: TrainConfig, device: torch.device) -> str:
    """What the arithmetic is, as runs record it: fp32, fp32 with TF32 products, or bf16 autocast."""
    if uses_bf16(cfg, device):
        return "bf16 autocast"
    return "fp32 (TF32 matmul)" if cfg.run.tf32 and device.type == "cuda" else "fp32"


def autocast(cfg: TrainConfig, device: torch.device):
    """bf16 autocast (:func:`uses_bf16`) or nothing: fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if uses_bf16(cfg, device) else nullcontext()


def evaluate(model: nn.Module, batches: Iterable, ctx: dist_.Context, cfg: TrainConfig,
             members: int | None = None, split: str = "test") -> dict[str, float] | list[dict[str, float]]:
    """Top-1 error and mean cross-entropy over ``(images, labels)`` batches, summed over all processes (read
    from the device once), as ``<split>_loss``, ``<split>_error`` and ``<split>_examples``. With ``members`` = K,
    a stacked model's: batches (K, B, ...) with labels (K, B), logits (K, B, classes), one result per member (one
    process)."""
    model.eval()
    shape = () if members is None else (members,)
    loss_sum = torch.zeros(shape, dtype=torch.float64, device=ctx.device)
    correct = torch.zeros(shape, dtype=torch.int64, device=ctx.device)
    count = 0
    with torch.no_grad():
        for images, labels in batches:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            with autocast(cfg, ctx.device):
                logits = model(images)
            if members is None:
                loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").double()
            else:  # classes on axis 1, as cross_entropy takes extra axes: (K, classes, B)
                loss_sum += nn.functional.cross_entropy(logits.float().transpose(1, 2), labels,
                                                        reduction="none").double().sum(1)
            correct += (logits.argmax(-1) == labels).sum(-1)
            count += labels.numel() if members is None else labels.shape[-1]
    if members is not None:
        return [{f"{split}_loss": s / count, f"{split}_error": 1.0 - c / count, f"{split}_examples": count}
                for s, c in zip(loss_sum.tolist(), correct.tolist())]
    loss_sum, correct, count = dist_.all_reduce_sum([float(loss_sum), float(correct), count], ctx)
    return {f"{split}_loss": loss_sum / count, f"{split}_error": 1.0 - correct / count,
            f"{split}_examples": int(count)}


# ---- feeds ----------------------------------------------------------------------------------------------


class PerSampleFeed:
    """Global batches through a DataLoader of per-example transforms, then timm's mixup/cutmix."""

    name = "per-sample"

    def __init__(self, cfg: TrainConfig, ctx: dist_.Context, dataset, model: nn.Module, train: bool) -> None:
        dataset.transform = transform_for(cfg, model, train)
        size = cfg.data.batch_size if train else cfg.data.eval_batch_size
        self.loader, self.sampler, self.generator = build_loader(dataset, size, ctx, cfg, train)
        d = cfg.data
        self.mixup = build_mixup(d.mixup, d.cutmix, d.mixup_switch_prob, d.label_smoothing,
                                 model.num_classes) if train else None
        self.ctx, self.seed = ctx, cfg.run.seed

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

    def __init__(self, cfg: TrainConfig, ctx: dist_.Context, dataset, model: nn.Module, train: bool) -> None:
        self.augment = batch_augment_for(cfg, model, train, dataset.info)
        self.data = to_resident(dataset, ctx.device)
        size = cfg.data.batch_size if train else cfg.data.eval_batch_size
        self.batches = ResidentBatches(self.data, size, seed=cfg.run.seed, shuffle=train, drop_last=train,
                                       rank=ctx.rank, world=ctx.world)
        self.seed = cfg.run.seed

    def __len__(self) -> int:
        return len(self.batches)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.batches.set_epoch(epoch)
        for b in self.batches:
            yield self.augment(b.images, b.labels, seed=self.seed, epoch=epoch, step=b.step,
                               rank_slice=b.rank_slice, global_size=b.global_size)


def batch_augment_for(cfg: TrainConfig, model: nn.Module, train: bool, info):
    """:func:`~pkmixer.data.build_batch_augment` for a split (ConfigError where there is no batched version)."""
    d = cfg.data
    if not train:
        return build_batch_augment(info, train=False, img_size=model.img_size, in_chans=model.in_chans,
                                   resize=d.resize, eval_crop=d.eval_crop, num_classes=model.num_classes)
    return build_batch_augment(info, train=True, img_size=model.img_size, in_chans=model.in_chans,
                               crop_padding=d.crop_padding, hflip=d.hflip, auto_augment=d.auto_augment,
                               rand_augment=d.rand_augment, random_erasing=d.random_erasing,
                               random_resized_crop=d.random_resized_crop, resize=d.resize, mixup_alpha=d.mixup,
                               cutmix_alpha=d.cutmix, switch_prob=d.mixup_switch_prob,
                               label_smoothing=d.label_smoothing, num_classes=model.num_classes)


def choose_feed(cfg: TrainConfig, model: nn.Module, dataset, train: bool) -> type[PerSampleFeed] | type[ResidentFeed]:
    """``data.pipeline`` for one split: resident or per-sample as asked; auto takes resident where it can hold the
    data set and batch the split's transforms (a choice made from the config alone, never by timing). The splits
    choose apart: a training set with timm's RandAugment goes per sample, its test set (no augmentation) stays
    batched; AutoAugment is batched (:mod:`pkmixer.data.auto_augment`)."""
    if cfg.data.pipeline == "per-sample":
        return PerSampleFeed
    try:
        batch_augment_for(cfg, model, train, dataset.info)
        if not isinstance(getattr(dataset, "source", None), ArrayImages):
            raise ConfigError(f"{dataset.info.title} is not held in memory by its reader")
    except ConfigError as err:
        if cfg.data.pipeline == "resident":
            raise ConfigError(f"data.pipeline=resident: {err}") from None
        return PerSampleFeed
    return ResidentFeed


# ---- the engine -----------------------------------------------------------------------------------------


class GraphSteps(nn.Module):
    """A model compiled with CUDA graphs, each call a new step (``torch.compiler.cudagraph_mark_step_begin``):
    a graph's outputs live until the next replay, which the loops here never read past."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return self.net(x)


def compiled(model: nn.Module, mode: str) -> nn.Module:
    """``torch.compile(model, mode=mode)``; the CUDA-graph modes (reduce-overhead, max-autotune) mark each call a
    step (:class:`GraphSteps`). On the Fig. 5 paper-scale S-Mixers on an H100, reduce-overhead takes a training
    step from 8.1 to 4.8 ms at Ω = 2^18 and the RP S-Mixer's from 18.6 to 3.2 ms (docs/performance.md, h)."""
    net = torch.compile(model, mode=mode)
    return GraphSteps(net) if mode in ("reduce-overhead", "max-autotune") else net


class StepEngine:
    """One run's training steps over a feed (module docstring): the model (compiled, DDP-wrapped when asked),
    optimiser, per-update schedule, mixup/cutmix, and - with ``optim.ema_decay`` - a Polyak average of the
    weights (timm's ``ModelEmaV3``; Mixer supp. A.2 found no consistent gain, so it is off by default),
    evaluated beside the raw weights."""

    def __init__(self, cfg: TrainConfig, ctx: dist_.Context, model: nn.Module, train_set, test_set,
                 val_set=None) -> None:
        self.cfg, self.ctx, self.model = cfg, ctx, model
        d = cfg.data
        check_head_classes(model.num_classes, train_set.info.num_classes, train_set.info.title)
        if (d.mixup > 0 or d.cutmix > 0) and (d.batch_size // ctx.world) % 2:
            raise ConfigError(f"mixup and cutmix pair examples within a batch: data.batch_size={d.batch_size} "
                              f"must give an even batch per process")
        self.train_set = train_set
        self.train_feed = choose_feed(cfg, model, train_set, True)(cfg, ctx, train_set, model, True)
        # the splits evaluated after every epoch, in row order: the validation split (when held out) selects
        held = {"val": val_set, "test": test_set}
        self.eval_feeds = {split: choose_feed(cfg, model, ds, False)(cfg, ctx, ds, model, False)
                           for split, ds in held.items() if ds is not None}
        if len(self.train_feed) == 0:
            raise ConfigError(f"data.batch_size={d.batch_size} exceeds the {len(train_set)} training examples")
        self.criterion = build_loss(d.mixup > 0 or d.cutmix > 0, d.label_smoothing)
        set_precision(cfg)
        model.to(ctx.device)
        self.optimizer = build_optimizer(cfg, model)
        self.scheduler = build_scheduler(cfg, self.optimizer, len(self.train_feed))
        self.ema = None
        if cfg.optim.ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(model, decay=cfg.optim.ema_decay)
        net: nn.Module = model
        if cfg.run.compile:
            net = compiled(net, cfg.run.compile_mode)
        if ctx.world > 1:
            net = nn.parallel.DistributedDataParallel(net, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                                      else None, broadcast_buffers=False)
        self.net = net

    @property
    def pipeline(self) -> str:
        return self.train_feed.name

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_feed)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs beside the weights to continue exactly, the training set's pipeline among it
        (its augmentation draws differ between the two)."""
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "pipeline": self.pipeline}
        if self.ema is not None:
            state["ema"] = {k: v.detach().cpu() for k, v in self.ema.module.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any], where: Path) -> None:
        """Restore ``state``. A run goes on with the training pipeline it was checkpointed with, which
        ``data.pipeline: auto`` may resolve otherwise since (when a batched version of an augmentation is added).
        Checkpoints written before the pipeline was recorded ran AutoAugment per sample (it had no batched
        version then) and everything else as ``auto`` chooses today."""
        saved = state.get("pipeline")
        if saved is None and self.cfg.data.auto_augment is not None:
            saved = PerSampleFeed.name
        if saved is not None and saved != self.pipeline:
            if self.cfg.data.pipeline != "auto":
                raise ConfigError(f"{where} was trained with the {saved} data pipeline, and data.pipeline="
                                  f"{self.cfg.data.pipeline} would change its augmentation draws")
            feed = {f.name: f for f in (PerSampleFeed, ResidentFeed)}[saved]
            self.train_feed = feed(self.cfg, self.ctx, self.train_set, self.model, True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            if "ema" not in state:
                raise ConfigError(f"{where} holds no Polyak average for optim.ema_decay")
            self.ema.module.load_state_dict(state["ema"])

    def train_epoch(self, epoch: int) -> float:
        """One epoch of updates; the mean training loss. TrainingDiverged when it is not finite."""
        cfg, ctx = self.cfg, self.ctx
        self.net.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        seen = 0
        updates = epoch * self.steps_per_epoch
        show = ctx.is_main and cfg.run.progress and sys.stderr.isatty()
        bar = tqdm(total=self.steps_per_epoch, desc=f"epoch {epoch + 1}/{cfg.schedule.epochs}", leave=False,
                   disable=not show)
        for images, targets in self.train_feed.epoch(epoch):
            with autocast(cfg, ctx.device):
                loss = self.criterion(self.net(images), targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.optim.clip_grad is not None:
                nn.utils.clip_grad_norm_(self.net.parameters(), cfg.optim.clip_grad)
            self.optimizer.step()
            updates += 1
            self.scheduler.step_update(updates)
            if self.ema is not None:
                self.ema.update(self.model, step=updates)
            loss_sum += loss.detach().double() * images.shape[0]
            seen += images.shape[0]
            if show:
                bar.update()
                if updates % 25 == 0:  # reading the loss waits for the device: only for the display
                    bar.set_postfix(loss=f"{float(loss):.4f}", lr=f"{self.lr:.2e}")
        bar.close()
        total, seen = dist_.all_reduce_sum([float(loss_sum), seen], ctx)
        if not math.isfinite(total):
            raise TrainingDiverged(f"the loss became {total / seen} in epoch {epoch + 1}")
        return total / seen

    def evaluate(self) -> dict[str, float]:
        """Loss and error on each evaluated split (``val_``, ``test_`` keys) of the weights, and of their Polyak
        average (``ema_val_``, ``ema_test_`` keys) when kept."""
        result: dict[str, float] = {}
        for split, feed in self.eval_feeds.items():
            result.update(evaluate(self.net, feed.epoch(0), self.ctx, self.cfg, split=split))
        if self.ema is not None:
            for split, feed in self.eval_feeds.items():
                ema = evaluate(self.ema.module, feed.epoch(0), self.ctx, self.cfg, split=split)
                result.update({f"ema_{split}_loss": ema[f"{split}_loss"], f"ema_{split}_error": ema[f"{split}_error"]})
        return result
