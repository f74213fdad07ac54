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
import functools
import importlib.metadata
import json
import math
import os
import platform
import random
import subprocess
import time
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..atomic import write_text_atomically
from ..checkpoint import read_checkpoint, save_model
from ..data import build_dataset
from ..errors import ConfigError
from ..models.convert import import_checkpoint
from . import distributed as dist_
from .config import TrainConfig, build_config, load_yaml, save_yaml
from .engine import (StepEngine, TrainingDiverged, build_loader, build_model, build_splits, evaluate,
                     model_and_data, precision, run_splits, transform_for)
from .rundir import RunDir, RunLock


def default_run_dir(cfg: TrainConfig) -> Path:
    return Path("runs") / f"{cfg.model.name}-{cfg.data.name}-{datetime.now():%Y%m%d-%H%M%S}"


# ---- RNG state ------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached],
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


# ---- the run --------------------------------------------------------------------------------------------


TRAINING_STATE = ("optimizer", "scheduler", "epoch", "rng")


def _saved_config(run: RunDir) -> TrainConfig:
    try:
        return build_config(load_yaml(run.config))
    except ConfigError as err:
        raise ConfigError(f"{run.config}: {err}") from None


def prepare_run(run: RunDir, cfg: TrainConfig | None, resume: bool, main: bool,
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
          log: Callable[[str], None] = print, threads: int | None = None) -> dict[str, Any]:
    """Train (or resume) a run; returns its summary. ConfigError for bad input, TrainingDiverged on NaN.

    ``resume`` continues from ``checkpoints/latest.pt``; a directory killed before its first checkpoint (holding
    only what a run writes) starts afresh, with its own config.yaml or ``cfg``. ``stop_after`` ends this
    invocation after that many epochs, leaving the run resumable (a job-time limit). The main process holds
    the run's lock for the whole call. ``threads`` sets torch's thread count; without it a resumed run takes
    the count its checkpoint was written with (CPU results are bit-exact only at one count), a fresh run the
    current one.
    """
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after <= 0):
        raise ConfigError(f"--stop-after must be a positive integer, got {stop_after!r}")
    run = RunDir(Path(run_dir))
    main = int(os.environ.get("RANK", "0")) == 0
    with claim_run(run, resume) if main else nullcontext():
        cfg, resuming = prepare_run(run, cfg, resume, main, log)
        cfg = resolve_auto_data(cfg, log)
        ctx = dist_.setup(cfg.run.device)
        try:
            return _train(cfg, run, resuming, ctx, log, stop_after, threads)
        finally:
            dist_.teardown()


def claim_run(run: RunDir, resume: bool) -> RunLock:
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
           stop_after: int | None, threads: int | None) -> dict:
    seed_everything(cfg.run.seed, cfg.run.deterministic)
    payload = read_checkpoint(run.latest) if resume else None
    set_threads([payload], threads, ctx, log)
    r = open_run(cfg, run, payload, ctx, log)
    started = time.time()
    metrics: dict[str, Any] = {}
    end_epoch = cfg.schedule.epochs if stop_after is None else min(cfg.schedule.epochs, r.start_epoch + stop_after)
    t0 = time.time()  # an epoch's time runs from the previous epoch's metrics row: its checkpoint writes count
    for epoch in range(r.start_epoch, end_epoch):
        try:
            train_loss = r.engine.train_epoch(epoch)
        except TrainingDiverged as err:
            if ctx.is_main:
                write_diverged(run, epoch)
            raise TrainingDiverged(f"{err}; the run stopped and keeps its last good checkpoint in "
                                   f"{run.latest.parent}") from None
        metrics = {"epoch": epoch + 1, "train_loss": train_loss, **r.engine.evaluate(), "lr": r.engine.lr,
                   "epoch_time": time.time() - t0}
        t0 = time.time()
        end_epoch_writes(r, metrics, end_epoch, ctx, log, rng_state())
        dist_.barrier(ctx)
    return write_summary(r, end_epoch, started, ctx)


@dataclasses.dataclass
class OpenRun:
    """A run set up to train: its config, directory, model and engine, where it starts, its lowest validation
    error so far (inf without a validation split: nothing is selected)."""

    cfg: TrainConfig
    run: RunDir
    model: Any
    engine: StepEngine
    start_epoch: int
    best_val_error: float
    params: int
    writer: Any = None


def set_threads(payloads: list[dict[str, Any] | None], threads: int | None, ctx: dist_.Context,
                log: Callable[[str], None]) -> None:
    """torch's thread count: ``threads``, else the count the (first) resumed checkpoint was written with
    (CPU results are bit-exact only at one count), else as it is."""
    recorded = next((p.get("threads") for p in payloads if p is not None), None)
    if threads is None and isinstance(recorded, int) and recorded != torch.get_num_threads():
        threads = recorded
        if ctx.is_main:
            log(f"torch threads: {recorded}, the count the run was checkpointed with (--threads overrides)")
    if threads is not None:
        torch.set_num_threads(threads)


def open_run(cfg: TrainConfig, run: RunDir, payload: dict[str, Any] | None, ctx: dist_.Context,
             log: Callable[[str], None], write: bool = True) -> OpenRun:
    """Build the model, data and engine of a run seeded by :func:`seed_everything`; restore the training state
    and RNG states from ``payload`` (latest.pt) or reseed Python's and NumPy's; then, unless ``write`` is false
    (the caller calls :func:`start_files` itself), :func:`start_files`."""
    model, sets = model_and_data(cfg, run_splits(cfg), payload, run.latest)
    engine = StepEngine(cfg, ctx, model, sets["train"], sets["test"], sets.get("val"))
    start_epoch, best_val_error = 0, math.inf
    if payload is not None:
        missing = [key for key in TRAINING_STATE if key not in payload]
        if missing:
            raise ConfigError(f"{run.latest} is a model checkpoint without the training state ({', '.join(missing)})")
        engine.load_state_dict(payload, run.latest)
        start_epoch = payload["epoch"]
        best_val_error = min((row["val_error"] for row in _history(run, start_epoch) if "val_error" in row),
                             default=math.inf)
        set_rng_state(payload["rng"])
    else:  # again: modules imported while building data and model may have drawn from Python's or NumPy's RNG
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
    params = sum(p.numel() for p in model.parameters())
    if ctx.is_main:
        held = f", {len(sets['val'])} validation" if "val" in sets else " (no validation split: nothing selected)"
        log(f"{cfg.model.name} ({params / 1e6:.3g} M parameters) on {cfg.data.name}: {len(sets['train'])} training"
            f"{held} and {len(sets['test'])} test examples, {cfg.schedule.epochs} epochs, {ctx.world} process(es) on "
            f"{ctx.device}, {precision(cfg, ctx.device)}, {engine.pipeline} data pipeline")
    r = OpenRun(cfg, run, model, engine, start_epoch, best_val_error, params)
    if write:
        start_files(r, payload is not None, ctx)
    return r


def start_files(r: OpenRun, resumed: bool, ctx: dist_.Context) -> None:
    """A run's first writes: drop the metrics rows after the checkpoint it resumes, or write config.yaml; open
    its TensorBoard writer."""
    if ctx.is_main:
        if resumed:
            r.run.truncate_metrics(r.start_epoch)
        else:
            save_yaml(r.cfg, r.run.config)
        r.writer = _tensorboard(r.cfg, r.run)


def write_diverged(run: RunDir, epoch: int) -> None:
    """The summary of a run whose loss went non-finite in ``epoch`` (0-based); its checkpoints stay."""
    write_text_atomically(run.summary, json.dumps({"status": "diverged", "epoch": epoch + 1}, indent=2))


def end_epoch_writes(r: OpenRun, metrics: dict[str, Any], end_epoch: int, ctx: dist_.Context,
                     log: Callable[[str], None], rng: dict[str, Any]) -> None:
    """An epoch's writes, in the order that keeps the run resumable at every instant (module docstring): its
    metrics row, best.pt when the validation error improved, latest.pt when due - ``r.model`` and ``r.engine``
    hold the state. The test split selects nothing: without a validation split there is no best.pt."""
    cfg, run, epoch = r.cfg, r.run, metrics["epoch"] - 1
    improved = "val_error" in metrics and metrics["val_error"] < r.best_val_error
    if improved:
        r.best_val_error = metrics["val_error"]
    if not ctx.is_main:
        return
    run.append_metrics(metrics)
    last = epoch + 1 == end_epoch
    if last or (epoch + 1) % cfg.run.save_every == 0 or improved:
        state = dict(**r.engine.state_dict(), epoch=epoch + 1, rng=rng, config=cfg.as_dict(),
                     threads=torch.get_num_threads())
        if improved:
            save_model(run.best, r.model, overwrite=True, **state)
        save_model(run.latest, r.model, overwrite=True, **state)
    if r.writer is not None:
        for key in ("train_loss", "val_loss", "val_error", "test_loss", "test_error", "lr"):
            if key in metrics:
                r.writer.add_scalar(key, metrics[key], epoch + 1)
    val = f"val error {metrics['val_error']:.2%}, " if "val_error" in metrics else ""
    ema = f", Polyak average {metrics['ema_test_error']:.2%}" if "ema_test_error" in metrics else ""
    log(f"epoch {epoch + 1}/{cfg.schedule.epochs}: train loss {metrics['train_loss']:.4f}, {val}test loss "
        f"{metrics['test_loss']:.4f}, test error {metrics['test_error']:.2%}{ema} ({metrics['epoch_time']:.1f} s)")


def _history(run: RunDir, upto: int | None = None) -> list[dict[str, Any]]:
    """The run's metrics rows (those of epochs up to ``upto``); none where this process cannot see them."""
    if not run.metrics.is_file():
        return []
    rows = run.read_metrics()
    return rows if upto is None else [row for row in rows if row.get("epoch", 0) <= upto]


def selection(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the validation split selects among a run's epochs: the epoch of the lowest ``val_error`` (the
    earliest of equals, as best.pt keeps it), that error and the test error then. Rows without a validation
    error (no split held out) select nothing: ``selection`` is "none"."""
    held = [row for row in rows if "val_error" in row]
    if not held:
        return {"selection": "none", "selected_epoch": None, "best_val_error": None, "selected_test_error": None}
    best = min(held, key=lambda row: (row["val_error"], row["epoch"]))
    return {"selection": "val_error", "selected_epoch": best["epoch"], "best_val_error": best["val_error"],
            "selected_test_error": best["test_error"]}


@functools.cache
def _source_commit() -> dict[str, Any]:
    """The git commit of the pkmixer source that runs, and whether its tracked files differ from it (None
    outside a git checkout, e.g. an installed wheel)."""
    where = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".") if commit else None
    return {"commit": commit, "dirty": None if changed is None else bool(changed)}


def environment(ctx: dist_.Context) -> dict[str, Any]:
    """What a run's numbers may depend on beside its config: versions, the source commit, the CPU's kernel
    capability (rounding differs between AVX2 and AVX-512 kernels), torch's threads and the device."""
    try:
        version = importlib.metadata.version("pkmixer")
    except importlib.metadata.PackageNotFoundError:
        version = None
    device = str(ctx.device)
    if ctx.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(ctx.device)})"
    return {"python": platform.python_version(), "torch": torch.__version__, "pkmixer": version,
            **_source_commit(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "device": device}


def write_summary(r: OpenRun, end_epoch: int, started: float, ctx: dist_.Context) -> dict[str, Any]:
    """summary.json of an invocation that trained up to ``end_epoch``: status, the validation selection
    (:func:`selection`), the final errors, and what the numbers depend on (:func:`environment`)."""
    cfg, run = r.cfg, r.run
    finished = end_epoch == cfg.schedule.epochs
    rows = _history(run)
    last_row = rows[-1] if rows else {}
    summary = {"status": "finished" if finished else "stopped", "epochs_done": end_epoch,
               "epochs": cfg.schedule.epochs, **selection(rows), "final_val_error": last_row.get("val_error"),
               "final_test_error": last_row.get("test_error"), "params": r.params,
               "precision": precision(cfg, ctx.device), "pipeline": r.engine.pipeline,
               "wall_time": time.time() - started, "processes": ctx.world, "environment": environment(ctx)}
    if "ema_test_error" in last_row:
        summary["final_ema_test_error"] = last_row["ema_test_error"]
    if ctx.is_main:
        write_text_atomically(run.summary, json.dumps(summary, indent=2))
        if r.writer is not None:
            r.writer.close()
    return summary


def _tensorboard(cfg: TrainConfig, run: RunDir):
    if not cfg.run.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("run.tensorboard needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(str(run.tensorboard))


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
    ctx = dist_.Context(0, 1, torch.device("cuda" if torch.cuda.is_available() and cfg.run.device != "cpu" else "cpu"))
    model, sets = model_and_data(cfg, ("test",), payload, path)
    model.to(ctx.device)
    loader, _, _ = build_loader(sets["test"], cfg.data.eval_batch_size, ctx, cfg, train=False)
    return {"run": str(run.root), "checkpoint": which, "selection": chosen_by, "epoch": payload["epoch"],
            **evaluate(model, loader, ctx, cfg)}


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
    sets = build_splits(cfg, ("test",))
    classes = sets["test"].info.num_classes
    if classes != imported.num_classes:
        raise ConfigError(f"{path} has a {imported.num_classes}-class head and {cfg.data.name} has {classes} "
                          "classes: fine-tune it first (pkmixer train --set model.init=...)")
    # the imported model as it is; model options (e.g. a larger img_size) rebuild it from the file
    model = build_model(cfg, classes) if cfg.model.options else imported
    sets["test"].transform = transform_for(cfg, model, train=False)
    model.to(ctx.device)
    loader, _, _ = build_loader(sets["test"], cfg.data.eval_batch_size, ctx, cfg, train=False)
    return {"checkpoint": str(path), "model": imported.spec.name, "data": cfg.data.name,
            **evaluate(model, loader, ctx, cfg)}
