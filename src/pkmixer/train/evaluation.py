"""Evaluation: top-1 error and mean cross-entropy of a model over a split's batches, of a run's checkpoint, and of
a checkpoint file on a data set's test split."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import read_checkpoint
from ..errors import ConfigError
from ..models.convert import import_checkpoint
from . import distributed as dist_
from .build import build_model, build_splits, model_and_data, resolve_data_name, transform_for
from .config import build_config, load_yaml
from .feeds import build_loader
from .precision import Precision
from .rundir import RunDir


def evaluate(model: nn.Module, batches: Iterable, ctx: dist_.Context, precision: Precision, members: int | None = None,
             split: str = "test") -> dict[str, float] | list[dict[str, float]]:
    """Top-1 error and mean cross-entropy over ``(images, labels)`` batches, summed over all processes (read
    from the device once), as ``<split>_loss``, ``<split>_error`` and ``<split>_examples``; under ``precision``. With ``members`` = K, a stacked model's: batches (K, B, ...) with
    labels (K, B), logits (K, B, classes), one result per member (one process)."""
    model.eval()
    shape = () if members is None else (members,)
    loss_sum = torch.zeros(shape, dtype=torch.float64, device=ctx.device)
    correct = torch.zeros(shape, dtype=torch.int64, device=ctx.device)
    count = 0
    with torch.no_grad():
        for images, labels in batches:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            with precision.autocast(ctx.device):
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


def _eval_context(device_choice: str) -> dist_.Context:
    return dist_.Context(0, 1, torch.device("cuda" if torch.cuda.is_available() and device_choice != "cpu" else "cpu"))


def evaluate_run(run_dir: str | Path, which: str | None = None) -> dict[str, Any]:
    """Top-1 error and loss of a run's best or latest checkpoint on the test split. ``which`` None: best.pt where
    the run has one, else latest.pt. ``selection`` says what chose the checkpoint: the validation split, nothing
    (the last epoch), or - for best.pt of a run written before validation selection - the test split."""
    run = RunDir(Path(run_dir))
    if which not in (None, "best", "latest"):
        raise ConfigError(f"--checkpoint must be best or latest, got {which!r}")
    if not run.config.is_file():
        raise ConfigError(f"{run.root} is not a run directory (no config.yaml)")
    cfg = build_config(load_yaml(run.config))
    if which is None:
        which = "best" if run.best.is_file() else "latest"
    elif which == "best" and not run.best.is_file() and run.latest.is_file():
        raise ConfigError(f"{run.root} has no best.pt: it holds out no validation split, so nothing was selected "
                          "(use --checkpoint latest)")
    path = run.best if which == "best" else run.latest
    payload = read_checkpoint(path)
    if which == "latest":
        chosen_by = "none (the latest epoch)"
    elif "best_test_error" in payload:
        chosen_by = "test_error (best.pt of a run written before the validation split selected it)"
    else:
        chosen_by = "val_error"
    ctx = _eval_context(cfg.run.device)
    model, sets = model_and_data(cfg.model, cfg.data, cfg.run.seed, ("test",), payload, path)
    model.to(ctx.device)
    loader, _, _ = build_loader(sets["test"], cfg.data.eval_batch_size, ctx, cfg.run.seed, cfg.data.workers, train=False)
    return {"run": str(run.root), "checkpoint": which, "selection": chosen_by, "epoch": payload["epoch"],
            **evaluate(model, loader, ctx, Precision.resolve(cfg.run, ctx.device))}


def evaluate_checkpoint(path: str | Path, overrides: dict[str, Any] | None = None,
                        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Top-1 error and loss of a checkpoint file - pkmixer, timm or Flax ``.npz`` - on a data set's test split.

    ``overrides`` are ``section.key`` settings (``data.name``, ``data.data_dir``, ``model.img_size``, ...); the
    model is the checkpoint's. A data set with another class count than the checkpoint's head is refused.
    """
    imported = import_checkpoint(path).model
    cfg = build_config(None, {**(overrides or {}), "model.name": imported.spec.name, "model.init": str(path)})
    dist_.uses_cuda(cfg.run.device)  # run.device=cuda on a machine without one: refused, not run on the CPU
    data = resolve_data_name(cfg.data, log)
    ctx = _eval_context(cfg.run.device)
    sets = build_splits(data, cfg.run.seed, ("test",))
    classes = sets["test"].info.num_classes
    if classes != imported.num_classes:
        raise ConfigError(f"{path} has a {imported.num_classes}-class head and {data.name} has {classes} "
                          "classes: fine-tune it first (pkmixer train --set model.init=...)")
    # the imported model as it is; model options (e.g. a larger img_size) rebuild it from the file
    model = build_model(cfg.model, classes) if cfg.model.options else imported
    sets["test"].transform = transform_for(data, model, train=False)
    model.to(ctx.device)
    loader, _, _ = build_loader(sets["test"], data.eval_batch_size, ctx, cfg.run.seed, data.workers, train=False)
    return {"checkpoint": str(path), "model": imported.spec.name, "data": data.name,
            **evaluate(model, loader, ctx, Precision.resolve(cfg.run, ctx.device))}
