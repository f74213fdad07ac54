"""Training and evaluation runs (Hayase & Karakida App. C, Table S.2; Mixer supp. B, C).

A run directory (:mod:`pkmixer.train.rundir`) holds everything needed to know what ran, to resume and to
evaluate. Resuming restores the weights, the optimiser and schedule, and the Python, NumPy and torch RNG
states; the data order of epoch e depends only on (seed, e). The invariant: at every instant - whatever is
killed when - the run directory is a state from which ``--resume`` reproduces the uninterrupted run
bit-for-bit on CPU in deterministic mode (checkpoints, every metrics row and the summary; timing fields
excepted). It holds because every file is written atomically and an epoch ends with, in this order: its
metrics row, ``best.pt`` when it improved, ``latest.pt`` when due. A kill before ``latest.pt`` is renamed
into place trains the epoch again from the previous checkpoint, dropping the rows after it, and rewrites the
same ``best.pt``; a kill after it has nothing left to do for that epoch. One process trains a run at a time
(:class:`~pkmixer.train.rundir.RunLock`). A loss that becomes NaN or infinite stops the run and keeps the
last good checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler
from torch import nn
from tqdm import tqdm

from ..data import build_dataset, build_loss, build_mixup, build_transform, dataset_info
from ..errors import ConfigError
from ..models.convert import import_checkpoint
from ..models.registry import create_model
from ..models.resolution import enlarged_options, enlarged_state_dict
from ..atomic import write_text_atomically
from . import distributed as dist_
from .checkpoint import model_from_checkpoint, read_checkpoint, save_model
from .config import TrainConfig, build_config, load_yaml, save_yaml
from .rundir import RunDir, RunLock


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def default_run_dir(cfg: TrainConfig) -> Path:
    return Path("runs") / f"{cfg.model.name}-{cfg.data.name}-{datetime.now():%Y%m%d-%H%M%S}"


# ---- building -------------------------------------------------------------------------------------------


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
    if source.spec.name != name:
        raise ConfigError(f"model.init {path} holds a {source.spec.name}, not the configured {name}")
    size = options.get("img_size", getattr(source, "img_size", None))
    if size != getattr(source, "img_size", None):
        if size % source.img_size:
            raise ConfigError(f"model.img_size={size} is not an integer multiple of the checkpoint's "
                              f"{source.img_size} px (Mixer supp. C enlarges by integer factors)")
        factor = size // source.img_size
        base, state = enlarged_options(source, factor), enlarged_state_dict(source, factor)
    else:
        base, state = dict(source.spec.overrides), source.state_dict()
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


def _transform(cfg: TrainConfig, model: nn.Module, train: bool):
    d = cfg.data
    info = dataset_info(d.name)  # mean/std and channels; the class count comes from the built split
    if not train:
        return build_transform(info, train=False, img_size=model.img_size, in_chans=model.in_chans,
                               resize=d.resize, eval_crop=d.eval_crop)
    return build_transform(info, train=True, img_size=model.img_size, in_chans=model.in_chans,
                           crop_padding=d.crop_padding, hflip=d.hflip, auto_augment=d.auto_augment,
                           rand_augment=d.rand_augment, random_erasing=d.random_erasing,
                           random_resized_crop=d.random_resized_crop, resize=d.resize)


def _datasets(cfg: TrainConfig, splits: tuple[str, ...]) -> dict:
    """The splits, without transforms yet: the model they feed is built from their class count."""
    d = cfg.data
    return {split: build_dataset(d.name, split, data_dir=d.data_dir, download=d.download,
                                 val_fraction=d.val_fraction, seed=cfg.run.seed,
                                 subset=d.train_subset if split == "train" else d.test_subset)
            for split in splits}


def _model_and_data(cfg: TrainConfig, splits: tuple[str, ...], checkpoint: dict[str, Any] | None = None,
                    where: Path | None = None) -> tuple[nn.Module, dict]:
    """The data splits and the model; with ``checkpoint`` the model is that checkpoint's (resume, eval)."""
    sets = _datasets(cfg, splits)
    if checkpoint is None:
        model = build_model(cfg, sets[splits[0]].info.num_classes)
    else:
        model = model_from_checkpoint(checkpoint, where)
    for split, ds in sets.items():
        ds.transform = _transform(cfg, model, split == "train")
    return model, sets


def _worker_init(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)  # torch seeds Python's random itself


def _loader(dataset, batch_size: int, ctx: dist_.Context, cfg: TrainConfig, train: bool):
    sampler = dist_.GlobalBatchSampler(len(dataset), batch_size, ctx, shuffle=train, seed=cfg.run.seed,
                                       drop_last=train)
    generator = torch.Generator()
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.data.workers,
                                         worker_init_fn=_worker_init if cfg.data.workers else None,
                                         generator=generator, pin_memory=ctx.device.type == "cuda")
    return loader, sampler, generator


def _optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Weight decay on matrices and kernels only, not on biases and LayerNorm parameters."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    o = cfg.optim
    if o.name == "adamw":  # the fused kernel: one pass over all tensors, 8x the per-tensor loop on a CPU
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in decay + rest)
        return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, fused=fused or None)
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0)


def _scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int) -> CosineLRScheduler:
    """Cosine annealing with linear warm-up, stepped every update."""
    s = cfg.schedule
    return CosineLRScheduler(optimizer, t_initial=s.epochs * steps_per_epoch, lr_min=s.min_lr,
                             warmup_t=round(s.warmup_epochs * steps_per_epoch), warmup_lr_init=s.warmup_lr,
                             t_in_epochs=False)


def _autocast(cfg: TrainConfig, device: torch.device):
    use = cfg.run.amp == "bf16" or (cfg.run.amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if use else nullcontext()


# ---- RNG state ------------------------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached],
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


# ---- evaluation -----------------------------------------------------------------------------------------


def evaluate(model: nn.Module, loader, ctx: dist_.Context, cfg: TrainConfig) -> dict[str, float]:
    """Top-1 error and mean cross-entropy over the loader (summed over all processes)."""
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            with _autocast(cfg, ctx.device):
                logits = model(images)
            loss_sum += float(nn.functional.cross_entropy(logits.float(), labels, reduction="sum"))
            correct += float((logits.argmax(1) == labels).sum())
            count += labels.numel()
    loss_sum, correct, count = dist_.all_reduce_sum([loss_sum, correct, count], ctx)
    return {"test_loss": loss_sum / count, "test_error": 1.0 - correct / count, "test_examples": int(count)}


# ---- the run --------------------------------------------------------------------------------------------


TRAINING_STATE = ("optimizer", "scheduler", "epoch", "best_test_error", "rng")


def _saved_config(run: RunDir) -> TrainConfig:
    try:
        return build_config(load_yaml(run.config))
    except ConfigError as err:
        raise ConfigError(f"{run.config}: {err}") from None


def _prepare(run: RunDir, cfg: TrainConfig | None, resume: bool, main: bool,
             log: Callable[[str], None]) -> tuple[TrainConfig, bool]:
    """The run's config and whether it continues from ``checkpoints/latest.pt``. Called under the run's lock
    (on the main process, which also removes what a kill left: temporary files; a run without a checkpoint)."""
    if not resume:
        if cfg is None:
            raise ValueError("a new run needs a config")
        return cfg, False
    if main:
        run.remove_temp_files()
    if run.latest.is_file():
        if not run.config.is_file():
            raise ConfigError(f"{run.root} has checkpoints/latest.pt but no config.yaml; it was not written by pkmixer")
        saved = _saved_config(run)
        if cfg is not None and cfg != saved:
            raise ConfigError("a resumed run keeps its own config; drop the config file and --set options")
        return saved, True
    chosen = cfg or (_saved_config(run) if run.config.is_file() else None)  # nothing trained: cfg may differ
    if chosen is None:
        raise ConfigError(f"{run.root} holds no checkpoint and no config.yaml: nothing to resume; give the "
                          "config to start the run afresh")
    if main:
        run.clear_unstarted()  # refuses a directory with files a run does not write
        log(f"{run.root} never reached its first checkpoint: starting it afresh")
    return chosen, False


def resolve_auto_data(cfg: TrainConfig, log: Callable[[str], None]) -> TrainConfig:
    """data.name=auto: Fashion-MNIST when it is on disk (never downloaded), else the bundled digits."""
    if cfg.data.name != "auto":
        return cfg
    try:
        found = build_dataset("fashion-mnist", "test", data_dir=cfg.data.data_dir).root
        log(f"data: Fashion-MNIST from {found}")
        name = "fashion-mnist"
    except ConfigError as err:
        log(f"data: Fashion-MNIST is not on this machine ({err}); using scikit-learn's bundled digits instead")
        name = "digits"
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, name=name))


def train(cfg: TrainConfig | None, run_dir: str | Path, resume: bool = False, stop_after: int | None = None,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) a run; returns its summary. ConfigError for bad input, TrainingDiverged on NaN.

    ``resume`` continues from ``checkpoints/latest.pt``; a directory killed before its first checkpoint (holding
    only what a run writes) starts afresh, with its own config.yaml or ``cfg``. ``stop_after`` ends this
    invocation after that many epochs, leaving the run resumable (a job-time limit). The main process holds
    the run's lock for the whole call.
    """
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after <= 0):
        raise ConfigError(f"--stop-after must be a positive integer, got {stop_after!r}")
    run = RunDir(Path(run_dir))
    main = int(os.environ.get("RANK", "0")) == 0
    with _claim(run, resume) if main else nullcontext():
        cfg, resuming = _prepare(run, cfg, resume, main, log)
        cfg = resolve_auto_data(cfg, log)
        ctx = dist_.setup(cfg.run.device)
        try:
            return _train(cfg, run, resuming, ctx, log, stop_after)
        finally:
            dist_.teardown()


def _claim(run: RunDir, resume: bool) -> RunLock:
    """The run's lock; a new run's directory is made here (and must not exist), a resumed run's must."""
    if resume:
        if not run.root.is_dir():
            raise ConfigError(f"no run directory at {run.root} to resume")
    else:
        if run.root.exists():
            raise ConfigError(f"run directory {run.root} exists; pass --resume to continue it, or choose another --run-dir")
        try:
            run.root.mkdir(parents=True)
        except FileExistsError:
            raise ConfigError(f"run directory {run.root} was just made by another process") from None
        except OSError as err:
            raise ConfigError(f"cannot make the run directory {run.root}: {err.strerror}") from None
    return RunLock(run, made_dir=not resume)


def _train(cfg: TrainConfig, run: RunDir, resume: bool, ctx: dist_.Context, log: Callable[[str], None],
           stop_after: int | None) -> dict:
    _seed_everything(cfg.run.seed, cfg.run.deterministic)
    payload = read_checkpoint(run.latest) if resume else None
    model, sets = _model_and_data(cfg, ("train", "test"), payload, run.latest)
    train_set, test_set = sets["train"], sets["test"]
    train_loader, train_sampler, train_gen = _loader(train_set, cfg.data.batch_size, ctx, cfg, train=True)
    test_loader, _, _ = _loader(test_set, cfg.data.eval_batch_size, ctx, cfg, train=False)
    if len(train_loader) == 0:
        raise ConfigError(f"data.batch_size={cfg.data.batch_size} exceeds the {len(train_set)} training examples")
    mixup = build_mixup(cfg.data.mixup, cfg.data.cutmix, cfg.data.mixup_switch_prob, cfg.data.label_smoothing,
                        model.num_classes)
    criterion = build_loss(mixup is not None, cfg.data.label_smoothing)
    if mixup is not None and (cfg.data.batch_size // ctx.world) % 2:
        raise ConfigError(f"mixup and cutmix pair examples within a batch: data.batch_size={cfg.data.batch_size} "
                          f"must give an even batch per process")
    model.to(ctx.device)
    optimizer = _optimizer(cfg, model)
    scheduler = _scheduler(cfg, optimizer, len(train_loader))
    start_epoch, best_error = 0, math.inf
    if payload is not None:
        missing = [key for key in TRAINING_STATE if key not in payload]
        if missing:
            raise ConfigError(f"{run.latest} is a model checkpoint without the training state ({', '.join(missing)})")
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        start_epoch, best_error = payload["epoch"], payload["best_test_error"]
        _set_rng_state(payload["rng"])
    else:  # again: modules imported while building data and model may have drawn from Python's or NumPy's RNG
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
    if ctx.is_main:
        if resume:
            run.truncate_metrics(start_epoch)
        else:
            save_yaml(cfg, run.config)
    net: nn.Module = model
    if cfg.run.compile:
        net = torch.compile(net)
    if ctx.world > 1:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
                                                  broadcast_buffers=False)
    writer = _tensorboard(cfg, run) if ctx.is_main else None
    params = sum(p.numel() for p in model.parameters())
    if ctx.is_main:
        log(f"{cfg.model.name} ({params / 1e6:.3g} M parameters) on {cfg.data.name}: {len(train_set)} training and "
            f"{len(test_set)} test examples, {cfg.schedule.epochs} epochs, {ctx.world} process(es) on {ctx.device}")
    started = time.time()
    metrics: dict[str, Any] = {}
    end_epoch = cfg.schedule.epochs if stop_after is None else min(cfg.schedule.epochs, start_epoch + stop_after)
    for epoch in range(start_epoch, end_epoch):
        train_sampler.set_epoch(epoch)
        train_gen.manual_seed(cfg.run.seed * 100_003 + epoch)
        t0 = time.time()
        train_loss = _train_epoch(net, train_loader, optimizer, scheduler, criterion, mixup, epoch, cfg, ctx, run)
        metrics = {"epoch": epoch + 1, "train_loss": train_loss, **evaluate(net, test_loader, ctx, cfg),
                   "lr": optimizer.param_groups[0]["lr"], "epoch_time": time.time() - t0}
        improved = metrics["test_error"] < best_error
        best_error = min(best_error, metrics["test_error"])
        if ctx.is_main:  # the order that keeps the run resumable at every instant: see the module docstring
            run.append_metrics(metrics)
            last = epoch + 1 == end_epoch
            if last or (epoch + 1) % cfg.run.save_every == 0 or improved:
                state = dict(optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), epoch=epoch + 1,
                             best_test_error=best_error, rng=_rng_state(), config=cfg.as_dict())
                if improved:
                    save_model(run.best, model, overwrite=True, **state)
                save_model(run.latest, model, overwrite=True, **state)
            if writer is not None:
                for key in ("train_loss", "test_loss", "test_error", "lr"):
                    writer.add_scalar(key, metrics[key], epoch + 1)
            log(f"epoch {epoch + 1}/{cfg.schedule.epochs}: train loss {train_loss:.4f}, test loss "
                f"{metrics['test_loss']:.4f}, test error {metrics['test_error']:.2%} ({metrics['epoch_time']:.1f} s)")
        dist_.barrier(ctx)
    finished = end_epoch == cfg.schedule.epochs
    summary = {"status": "finished" if finished else "stopped", "epochs_done": end_epoch,
               "epochs": cfg.schedule.epochs, "best_test_error": best_error,
               "final_test_error": metrics.get("test_error", (run.read_metrics() or [{}])[-1].get("test_error")),
               "params": params, "wall_time": time.time() - started, "processes": ctx.world}
    if ctx.is_main:
        write_text_atomically(run.summary, json.dumps(summary, indent=2))
        if writer is not None:
            writer.close()
    return summary


def _train_epoch(net, loader, optimizer, scheduler, criterion, mixup, epoch, cfg, ctx, run) -> float:
    net.train()
    loss_sum = seen = 0.0
    updates = epoch * len(loader)
    show = ctx.is_main and cfg.run.progress and sys.stderr.isatty()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{cfg.schedule.epochs}", leave=False, disable=not show)
    for images, labels in bar:
        images, labels = images.to(ctx.device, non_blocking=True), labels.to(ctx.device, non_blocking=True)
        if mixup is not None:
            images, labels = mixup(images, labels)
        with _autocast(cfg, ctx.device):
            loss = criterion(net(images), labels)
        bad = not bool(torch.isfinite(loss))
        if dist_.broadcast_flag(bad, ctx) if ctx.world > 1 else bad:
            _write_diverged(run, ctx, epoch)
            raise TrainingDiverged(f"the loss became {float(loss.detach())} in epoch {epoch + 1}; the run stopped and keeps "
                                   f"its last good checkpoint in {run.latest.parent}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.optim.clip_grad is not None:
            nn.utils.clip_grad_norm_(net.parameters(), cfg.optim.clip_grad)
        optimizer.step()
        updates += 1
        scheduler.step_update(updates)
        loss_sum += float(loss.detach()) * labels.shape[0]
        seen += labels.shape[0]
        bar.set_postfix(loss=f"{float(loss.detach()):.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
    loss_sum, seen = dist_.all_reduce_sum([loss_sum, seen], ctx)
    return loss_sum / seen


def _write_diverged(run: RunDir, ctx: dist_.Context, epoch: int) -> None:
    if ctx.is_main:
        write_text_atomically(run.summary, json.dumps({"status": "diverged", "epoch": epoch + 1}, indent=2))


def _tensorboard(cfg: TrainConfig, run: RunDir):
    if not cfg.run.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("run.tensorboard needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(str(run.tensorboard))


def evaluate_run(run_dir: str | Path, which: str = "best") -> dict[str, Any]:
    """Top-1 error and loss of a run's best or latest checkpoint on the test split."""
    run = RunDir(Path(run_dir))
    if which not in ("best", "latest"):
        raise ConfigError(f"--checkpoint must be best or latest, got {which!r}")
    if not run.config.is_file():
        raise ConfigError(f"{run.root} is not a run directory (no config.yaml)")
    cfg = build_config(load_yaml(run.config))
    path = run.best if which == "best" else run.latest
    payload = read_checkpoint(path)
    ctx = dist_.Context(0, 1, torch.device("cuda" if torch.cuda.is_available() and cfg.run.device != "cpu" else "cpu"))
    model, sets = _model_and_data(cfg, ("test",), payload, path)
    model.to(ctx.device)
    loader, _, _ = _loader(sets["test"], cfg.data.eval_batch_size, ctx, cfg, train=False)
    return {"run": str(run.root), "checkpoint": which, "epoch": payload["epoch"], **evaluate(model, loader, ctx, cfg)}


def evaluate_checkpoint(path: str | Path, overrides: dict[str, Any] | None = None,
                        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Top-1 error and loss of a checkpoint file - pkmixer, timm or Flax ``.npz`` - on a data set's test split.

    ``overrides`` are ``section.key`` settings (``data.name``, ``data.data_dir``, ``model.img_size``, ...); the
    model is the checkpoint's. A data set with another class count than the checkpoint's head is refused.
    """
    imported = import_checkpoint(path).model
    cfg = build_config(None, {**(overrides or {}), "model.name": imported.spec.name, "model.init": str(path)})
    cfg = resolve_auto_data(cfg, log)
    ctx = dist_.Context(0, 1, torch.device("cuda" if torch.cuda.is_available() and cfg.run.device != "cpu" else "cpu"))
    sets = _datasets(cfg, ("test",))
    classes = sets["test"].info.num_classes
    if classes != imported.num_classes:
        raise ConfigError(f"{path} has a {imported.num_classes}-class head and {cfg.data.name} has {classes} "
                          "classes: fine-tune it first (pkmixer train --set model.init=...)")
    # the imported model as it is; model options (e.g. a larger img_size) rebuild it from the file
    model = build_model(cfg, classes) if cfg.model.options else imported
    sets["test"].transform = _transform(cfg, model, train=False)
    model.to(ctx.device)
    loader, _, _ = _loader(sets["test"], cfg.data.eval_batch_size, ctx, cfg, train=False)
    return {"checkpoint": str(path), "model": imported.spec.name, "data": cfg.data.name,
            **evaluate(model, loader, ctx, cfg)}
