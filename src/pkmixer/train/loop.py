"""Training and evaluation runs (Hayase & Karakida App. C, Table S.2; Mixer supp. B, C).

A run directory holds everything needed to know what ran, to resume and to evaluate:

    config.yaml            the resolved configuration
    metrics.jsonl          one JSON line per epoch: losses, top-1 test error, learning rate, time
    checkpoints/latest.pt  model, optimiser, schedule, epoch and RNG states (written atomically)
    checkpoints/best.pt    the same at the lowest test error so far
    summary.json           the final state: finished or diverged, best and last test error, wall time
    tensorboard/           scalars, when run.tensorboard is set

Resuming restores the weights, the optimiser and schedule, and the Python, NumPy and torch RNG states; the
data order of epoch e depends only on (seed, e). So on CPU in deterministic mode a run stopped after any
epoch - or killed in the middle of one - and resumed ends with the same weights and metrics as a run that
never stopped. A loss that becomes NaN or infinite stops the run and keeps the last good checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
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
from . import distributed as dist_
from .checkpoint import read_checkpoint, save_model
from .config import TrainConfig, build_config, load_yaml, save_yaml


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    config = property(lambda self: self.root / "config.yaml")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    latest = property(lambda self: self.root / "checkpoints" / "latest.pt")
    best = property(lambda self: self.root / "checkpoints" / "best.pt")
    summary = property(lambda self: self.root / "summary.json")
    tensorboard = property(lambda self: self.root / "tensorboard")


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


def _model_and_data(cfg: TrainConfig, splits: tuple[str, ...], checkpoint: dict[str, Any] | None = None
                    ) -> tuple[nn.Module, dict]:
    """The data splits and the model; with ``checkpoint`` the model is that checkpoint's (resume, eval)."""
    sets = _datasets(cfg, splits)
    if checkpoint is None:
        model = build_model(cfg, sets[splits[0]].info.num_classes)
    else:
        model = create_model(checkpoint["model"], **checkpoint["overrides"])
        model.load_state_dict(checkpoint["state_dict"])
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


def _prepare(run: RunDir, cfg: TrainConfig | None, resume: bool) -> TrainConfig:
    if resume:
        if not run.config.is_file() or not run.latest.is_file():
            raise ConfigError(f"{run.root} has no config.yaml and checkpoints/latest.pt to resume from")
        saved = build_config(load_yaml(run.config))
        if cfg is not None and cfg != saved:
            raise ConfigError("a resumed run keeps its own config; drop the config file and --set options")
        return saved
    if cfg is None:
        raise ValueError("a new run needs a config")
    if run.root.exists():
        raise ConfigError(f"run directory {run.root} exists; pass --resume to continue it, or choose another --run-dir")
    return cfg


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

    ``stop_after`` ends this invocation after that many epochs, leaving the run resumable (a job-time limit).
    """
    if stop_after is not None and stop_after <= 0:
        raise ConfigError(f"--stop-after must be positive, got {stop_after}")
    run = RunDir(Path(run_dir))
    cfg = _prepare(run, cfg, resume)
    cfg = resolve_auto_data(cfg, log)
    ctx = dist_.setup(cfg.run.device)
    try:
        return _train(cfg, run, resume, ctx, log, stop_after)
    finally:
        dist_.teardown()


def _train(cfg: TrainConfig, run: RunDir, resume: bool, ctx: dist_.Context, log: Callable[[str], None],
           stop_after: int | None) -> dict:
    _seed_everything(cfg.run.seed, cfg.run.deterministic)
    payload = read_checkpoint(run.latest) if resume else None
    model, sets = _model_and_data(cfg, ("train", "test"), payload)
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
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        start_epoch, best_error = payload["epoch"], payload["best_test_error"]
        _set_rng_state(payload["rng"])
    if ctx.is_main:
        run.root.mkdir(parents=True, exist_ok=True)
        if resume:
            _truncate_metrics(run.metrics, start_epoch)
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
        if ctx.is_main:
            with run.metrics.open("a") as f:  # metrics first: a kill before the checkpoint repeats the epoch
                f.write(json.dumps(metrics) + "\n")
            last = epoch + 1 == end_epoch
            if last or (epoch + 1) % cfg.run.save_every == 0 or improved:
                state = dict(optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), epoch=epoch + 1,
                             best_test_error=best_error, rng=_rng_state(), config=cfg.as_dict())
                save_model(run.latest, model, overwrite=True, **state)
                if improved:
                    save_model(run.best, model, overwrite=True, **state)
            if writer is not None:
                for key in ("train_loss", "test_loss", "test_error", "lr"):
                    writer.add_scalar(key, metrics[key], epoch + 1)
            log(f"epoch {epoch + 1}/{cfg.schedule.epochs}: train loss {train_loss:.4f}, test loss "
                f"{metrics['test_loss']:.4f}, test error {metrics['test_error']:.2%} ({metrics['epoch_time']:.1f} s)")
        dist_.barrier(ctx)
    finished = end_epoch == cfg.schedule.epochs
    summary = {"status": "finished" if finished else "stopped", "epochs_done": end_epoch,
               "epochs": cfg.schedule.epochs, "best_test_error": best_error,
               "final_test_error": metrics.get("test_error", _last_metrics(run.metrics).get("test_error")),
               "params": params, "wall_time": time.time() - started, "processes": ctx.world}
    if ctx.is_main:
        run.summary.write_text(json.dumps(summary, indent=2))
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
        run.summary.write_text(json.dumps({"status": "diverged", "epoch": epoch + 1}, indent=2))


def _tensorboard(cfg: TrainConfig, run: RunDir):
    if not cfg.run.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("run.tensorboard needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(str(run.tensorboard))


def _truncate_metrics(path: Path, epochs_done: int) -> None:
    """Drop metric lines of epochs after the checkpoint (written before a kill), so no row is duplicated."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["epoch"] <= epochs_done]
    path.write_text("".join(line + "\n" for line in keep))


def _last_metrics(path: Path) -> dict[str, Any]:
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else {}


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
    model, sets = _model_and_data(cfg, ("test",), payload)
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
