"""A training run: its directory, lock, config, checkpoints, metrics rows and summary, with the model and engine it
trains (Hayase & Karakida App. C, Table S.2; Mixer supp. B, C).

A :class:`Run` is what :func:`pkmixer.train.loop.train` (one run) and :func:`pkmixer.train.stacked_runs.train_stack`
(K runs as one stacked model) loop over; both go through the same lifecycle:

1. :meth:`Run.claimed` - the run's lock and directory (a new run's is made, a resumed run's must exist), its
   config (a resumed run keeps its own) and that config resolved once (``data.name: auto``);
2. :meth:`Run.build` - seeded, the model, data splits, feeds and :class:`~pkmixer.train.engine.StepEngine`, the
   device's :class:`~pkmixer.train.precision.Precision`, and on resume the state of ``checkpoints/latest.pt``;
3. :meth:`Run.start` - the first writes: config.yaml, or the metrics rows after the checkpoint dropped;
4. :meth:`Run.end_epoch` after each epoch, :meth:`Run.finish` (summary.json) at the end.

A run directory (:mod:`pkmixer.train.rundir`) holds everything needed to know what ran, to resume and to
evaluate. Resuming restores the weights, the optimiser and schedule, and the Python, NumPy and torch RNG
states; the data order of epoch e depends only on (seed, e). The invariant: at every instant - whatever is
killed when - the run directory is a state from which ``--resume`` reproduces the uninterrupted run
bit-for-bit on CPU in deterministic mode (checkpoints, every metrics row and the summary; timing fields
excepted). It holds because every file is written atomically and an epoch ends with, in this order: its
metrics row, ``best.pt`` when the validation error improved, ``latest.pt`` when due. A kill before ``latest.pt``
is renamed into place trains the epoch again from the previous checkpoint, dropping the rows after it, and
rewrites the same ``best.pt``; a kill after it has nothing left to do for that epoch. One process trains a run
at a time (:class:`~pkmixer.train.rundir.RunLock`).

The test split selects nothing: ``best.pt`` and the summary's ``selected_epoch`` come from the validation split
(``data.val_fraction``); a run without one selects nothing and has no ``best.pt``.
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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import kernels
from ..atomic import write_text_atomically
from ..checkpoint import read_checkpoint, save_model
from ..errors import ConfigError
from . import distributed as dist_
from .build import loss_for, mixes_examples, model_and_data, resolve_data_name, run_splits
from .config import TrainConfig, build_config, flat_config, load_yaml, save_yaml
from .engine import StepEngine, compile_mode
from .feeds import FEEDS, build_feed, choose_feed
from .loggers import open_loggers
from .precision import Precision
from .preflight import check_head_classes
from .rundir import RunDir, RunLock

TRAINING_STATE = ("optimizer", "scheduler", "epoch", "rng")  # what latest.pt holds beside the weights


def default_run_dir(model: str, data: str) -> Path:
    return Path("runs") / f"{model}-{data}-{datetime.now():%Y%m%d-%H%M%S}"


# ---- RNG state --------------------------------------------------------------------------------------------


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


def check_stop_after(stop_after: int | None) -> None:
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after <= 0):
        raise ConfigError(f"--stop-after must be a positive integer, got {stop_after!r}")


# ---- what a run's numbers depend on -----------------------------------------------------------------------


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
    capability (rounding differs between AVX2 and AVX-512 kernels), torch's threads, the device and how the C
    kernels were built (pkmixer.kernels): the LayerNorm of narrow Mixers and the S-Mixer's fused sublayers."""
    try:
        version = importlib.metadata.version("pkmixer")
    except importlib.metadata.PackageNotFoundError:
        version = None
    device = str(ctx.device)
    if ctx.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(ctx.device)})"
    return {"python": platform.python_version(), "torch": torch.__version__, "pkmixer": version,
            **_source_commit(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "device": device, "layer_norm_kernel": kernels.describe("layer_norm"),
            "residual_gelu_norm_kernel": kernels.describe("residual_gelu_norm")}


# ---- the run ----------------------------------------------------------------------------------------------


def _claim(files: RunDir, resume: bool) -> RunLock:
    """The run's lock; a new run's directory is made here (and must not exist), a resumed run's must."""
    if resume:
        if not files.root.is_dir():
            raise ConfigError(f"no run directory at {files.root} to resume")
    else:
        if files.root.exists():
            raise ConfigError(f"run directory {files.root} exists; pass --resume to continue it, or choose another "
                              "--run-dir")
        missing = [p for p in files.root.absolute().parents if not p.exists()]  # the deepest first
        try:
            files.root.mkdir(parents=True)
        except FileExistsError:
            raise ConfigError(f"run directory {files.root} was just made by another process") from None
        except OSError as err:
            raise ConfigError(f"cannot make the run directory {files.root}: {err.strerror}") from None
        return RunLock(files, made_dir=True, made_parents=tuple(missing))
    return RunLock(files)


def _saved_config(files: RunDir) -> TrainConfig:
    try:
        return build_config(load_yaml(files.config))
    except ConfigError as err:
        raise ConfigError(f"{files.config}: {err}") from None


def _resumable(files: RunDir, main: bool) -> tuple[TrainConfig | None, bool]:
    """A directory to resume, under its lock: its saved config (None where it has none) and whether it continues
    from ``checkpoints/latest.pt``. The main process removes the temporary files a kill left."""
    if main:
        files.remove_temp_files()
    saved = _saved_config(files) if files.config.is_file() else None
    if files.latest.is_file() and saved is None:
        raise ConfigError(f"{files.root} has checkpoints/latest.pt but no config.yaml; it was not written by pkmixer")
    return saved, files.latest.is_file()


class Run:
    """One run (module docstring): ``files`` its directory, ``cfg`` its config resolved once, ``resuming`` whether
    it continues from ``checkpoints/latest.pt`` (read into ``checkpoint``); after :meth:`build` the ``model``, the
    ``engine``, the ``precision`` and device context ``ctx``, the epoch it starts from and its lowest validation
    error so far (inf without a validation split: nothing is selected)."""

    def __init__(self, files: RunDir, cfg: TrainConfig, resuming: bool, log: Callable[[str], None],
                 main: bool = True) -> None:
        self.files, self.cfg, self.resuming, self.log, self.main = files, cfg, resuming, log, main
        self.checkpoint = read_checkpoint(files.latest) if resuming else None
        self.model: Any = None
        self.engine: StepEngine | None = None
        self.ctx: dist_.Context | None = None
        self.precision: Precision | None = None
        self.start_epoch, self.best_val_error, self.params = 0, math.inf, 0
        self.loggers: list = []

    @classmethod
    @contextmanager
    def claimed(cls, run_dirs: list[str | Path], cfgs: list[TrainConfig | None], resume: list[bool],
                log: Callable[[str], None]) -> Iterator[list[Run]]:
        """The runs under their locks (held by the main process for the whole ``with``, every lock taken before
        any directory is repaired or read): ``resume`` continues from ``checkpoints/latest.pt``; a directory
        killed before its first checkpoint (holding only what a run writes) starts afresh, with its own
        config.yaml or the given config. A refusal (ConfigError) leaves no trace."""
        files = [RunDir(Path(d)) for d in run_dirs]
        main = int(os.environ.get("RANK", "0")) == 0
        with ExitStack() as locks:
            if main:
                for f, again in zip(files, resume):
                    locks.enter_context(_claim(f, again))
            runs = []
            for f, cfg, again in zip(files, cfgs, resume):
                if not again and cfg is None:
                    raise ValueError("a new run needs a config")
                saved, resuming = _resumable(f, main) if again else (None, False)
                if resuming and cfg is not None and cfg != saved:
                    raise ConfigError("a resumed run keeps its own config; drop the config file and --set options")
                cfg = saved if resuming else cfg or saved  # nothing trained: the given config may differ
                if cfg is None:
                    raise ConfigError(f"{f.root} holds no checkpoint and no config.yaml: nothing to resume; give "
                                      "the config to start the run afresh")
                if again and not resuming and main:
                    f.clear_unstarted()  # refuses a directory with files a run does not write
                    log(f"{f.root} never reached its first checkpoint: starting it afresh")
                runs.append(cls(f, dataclasses.replace(cfg, data=resolve_data_name(cfg.data, log)), resuming, log,
                                main))
            yield runs

    # ---- building -----------------------------------------------------------------------------------------

    def build(self, ctx: dist_.Context) -> None:
        """Seed, then build the model, data splits, feeds and engine; restore the training state and RNG states
        from the checkpoint, or reseed Python's and NumPy's (modules imported while building may draw from
        them)."""
        cfg, payload = self.cfg, self.checkpoint
        seed_everything(cfg.run.seed, cfg.run.deterministic)
        self.ctx, self.precision = ctx, Precision.resolve(cfg.run, ctx.device)
        model, sets = model_and_data(cfg.model, cfg.data, cfg.run.seed, run_splits(cfg.data), payload,
                                     self.files.latest)
        train_set = sets.pop("train")
        d = cfg.data
        check_head_classes(model.num_classes, train_set.info.num_classes, train_set.info.title)
        if mixes_examples(d) and (d.batch_size // ctx.world) % 2:
            raise ConfigError(f"mixup and cutmix pair examples within a batch: data.batch_size={d.batch_size} "
                              f"must give an even batch per process")
        feed = self._training_feed(model, train_set)
        if len(feed) == 0:
            raise ConfigError(f"data.batch_size={d.batch_size} exceeds the {len(train_set)} training examples")
        evals = {split: build_feed(d, cfg.run.seed, ctx, ds, model, False) for split, ds in sets.items()}
        self.engine = StepEngine(model, feed, evals, loss_for(d), optim=cfg.optim, schedule=cfg.schedule,
                                 precision=self.precision, ctx=ctx, compile_mode=compile_mode(cfg.run),
                                 progress=cfg.run.progress)
        self.model = model
        if payload is not None:
            missing = [key for key in TRAINING_STATE if key not in payload]
            if missing:
                raise ConfigError(f"{self.files.latest} is a model checkpoint without the training state "
                                  f"({', '.join(missing)})")
            self.engine.load_state_dict(payload, self.files.latest)
            self.start_epoch = payload["epoch"]
            self.best_val_error = min((row["val_error"] for row in self.rows(self.start_epoch) if "val_error" in row),
                                      default=math.inf)
            set_rng_state(payload["rng"])
        else:
            random.seed(cfg.run.seed)
            np.random.seed(cfg.run.seed)
        self.params = sum(p.numel() for p in model.parameters())
        if ctx.is_main:
            held = f", {len(sets['val'])} validation" if "val" in sets else " (no validation split: nothing selected)"
            self.log(f"{cfg.model.name} ({self.params / 1e6:.3g} M parameters) on {d.name}: {len(train_set)} training"
                     f"{held} and {len(sets['test'])} test examples, {cfg.schedule.epochs} epochs, {ctx.world} "
                     f"process(es) on {ctx.device}, {self.precision}, {feed.name} data pipeline")

    def _training_feed(self, model, train_set):
        """The training split's feed: the pipeline the checkpoint was trained with when resuming (``data.pipeline:
        auto`` may resolve otherwise since a batched version of an augmentation was added; its draws differ),
        else the one :func:`~pkmixer.train.feeds.choose_feed` picks. Checkpoints written before the pipeline was
        recorded ran AutoAugment per sample (it had no batched version then) and everything else as ``auto``
        chooses today."""
        d, seed, ctx = self.cfg.data, self.cfg.run.seed, self.ctx
        chosen = choose_feed(d, model, train_set, True)
        if self.checkpoint is not None:
            saved = self.checkpoint.get("pipeline")
            if saved is None and d.auto_augment is not None:
                saved = "per-sample"
            if saved is not None and saved != chosen.name:
                if d.pipeline != "auto":
                    raise ConfigError(f"{self.files.latest} was trained with the {saved} data pipeline, and "
                                      f"data.pipeline={d.pipeline} would change its augmentation draws")
                chosen = FEEDS[saved]
        return chosen(d, seed, ctx, train_set, model, True)

    # ---- files --------------------------------------------------------------------------------------------

    def rows(self, upto: int | None = None) -> list[dict[str, Any]]:
        """The run's metrics rows (those of epochs up to ``upto``); none where this process cannot see them."""
        if not self.files.metrics.is_file():
            return []
        rows = self.files.read_metrics()
        return rows if upto is None else [row for row in rows if row.get("epoch", 0) <= upto]

    def start(self) -> None:
        """The first writes: open the loggers of ``run.loggers`` (a missing package is refused before anything is
        written), drop the metrics rows after the checkpoint it resumes or write config.yaml, and log the
        config as hyper-parameters."""
        if not self.main:
            return
        self.loggers = open_loggers(self.cfg.run.loggers, self.files)
        if self.checkpoint is not None:
            self.files.truncate_metrics(self.start_epoch)
        else:
            save_yaml(self.cfg, self.files.config)
        hparams = flat_config(self.cfg.as_dict())
        for logger in self.loggers:
            logger.log_hparams(hparams)

    def end_epoch(self, metrics: dict[str, Any], end_epoch: int, rng: dict[str, Any],
                  log: Callable[[str], None] | None = None) -> None:
        """An epoch's writes, in the order that keeps the run resumable at every instant (module docstring): its
        metrics row, best.pt when the validation error improved, latest.pt when due - ``model`` and ``engine``
        hold the state, ``rng`` the RNG states to resume with."""
        cfg, files, epoch = self.cfg, self.files, metrics["epoch"] - 1
        improved = "val_error" in metrics and metrics["val_error"] < self.best_val_error
        if improved:
            self.best_val_error = metrics["val_error"]
        if not self.ctx.is_main:
            return
        files.append_metrics(metrics)
        last = epoch + 1 == end_epoch
        if last or (epoch + 1) % cfg.run.save_every == 0 or improved:
            state = dict(**self.engine.state_dict(), epoch=epoch + 1, rng=rng, config=cfg.as_dict(),
                         threads=torch.get_num_threads())
            if improved:
                save_model(files.best, self.model, overwrite=True, **state)
            save_model(files.latest, self.model, overwrite=True, **state)
        for logger in self.loggers:
            logger.log_metrics(metrics, epoch + 1)
        val = f"val error {metrics['val_error']:.2%}, " if "val_error" in metrics else ""
        ema = f", Polyak average {metrics['ema_test_error']:.2%}" if "ema_test_error" in metrics else ""
        (log or self.log)(f"epoch {epoch + 1}/{cfg.schedule.epochs}: train loss {metrics['train_loss']:.4f}, {val}"
                          f"test loss {metrics['test_loss']:.4f}, test error {metrics['test_error']:.2%}{ema} "
                          f"({metrics['epoch_time']:.1f} s)")

    def diverged(self, epoch: int) -> None:
        """The summary of a run whose loss went non-finite in ``epoch`` (0-based); its checkpoints stay."""
        if self.main:
            write_text_atomically(self.files.summary, json.dumps({"status": "diverged", "epoch": epoch + 1}, indent=2))
            self._close_loggers()

    def _close_loggers(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []

    def finish(self, end_epoch: int, started: float) -> dict[str, Any]:
        """summary.json of an invocation that trained up to ``end_epoch``: status, the validation selection
        (:func:`selection`), the final errors, and what the numbers depend on (:func:`environment`)."""
        cfg, ctx = self.cfg, self.ctx
        rows = self.rows()
        last = rows[-1] if rows else {}
        summary = {"status": "finished" if end_epoch == cfg.schedule.epochs else "stopped", "epochs_done": end_epoch,
                   "epochs": cfg.schedule.epochs, **selection(rows), "final_val_error": last.get("val_error"),
                   "final_test_error": last.get("test_error"), "params": self.params, "precision": str(self.precision),
                   "pipeline": self.engine.pipeline, "wall_time": time.time() - started, "processes": ctx.world,
                   "environment": environment(ctx)}
        if "ema_test_error" in last:
            summary["final_ema_test_error"] = last["ema_test_error"]
        if ctx.is_main:
            write_text_atomically(self.files.summary, json.dumps(summary, indent=2))
            self._close_loggers()
        return summary
