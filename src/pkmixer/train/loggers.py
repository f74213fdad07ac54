"""Where a run's numbers go besides its own files (``metrics.jsonl``, ``summary.json``): the loggers of
``run.loggers``.

A logger has three methods: :meth:`~RunLogger.log_hparams` once when the run starts (its config as dotted keys,
``optim.lr`` ...), :meth:`~RunLogger.log_metrics` after every epoch's metrics row, and :meth:`~RunLogger.close`.
Built in: ``csv`` (``metrics.csv`` in the run directory, rewritten whole from ``metrics.jsonl`` after every epoch,
so that it stays what a resumed run has) and ``tensorboard`` (``tensorboard/`` in the run directory; needs the
tensorboard package). ``wandb`` (Weights & Biases) and ``mlflow`` are used when they are installed: a run is one
W&B run (its id derived from the run directory, so a resumed run continues it) or one MLflow run (tagged with the
run directory, found again on resume); where they log to is their own configuration (``WANDB_PROJECT``,
``WANDB_MODE=offline``, ``MLFLOW_TRACKING_URI`` ...).
"""
from __future__ import annotations

import csv
import hashlib
import importlib
import io
from typing import Any, Protocol

from ..atomic import write_text_atomically
from ..errors import ConfigError
from .rundir import RunDir

LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


class RunLogger(Protocol):
    def log_hparams(self, hparams: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], epoch: int) -> None: ...

    def close(self) -> None: ...


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k != "epoch"}


class CSVLogger:
    """``metrics.csv``: the metrics rows as a table, columns in order of first appearance."""

    def __init__(self, files: RunDir) -> None:
        self.files = files

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        pass  # config.yaml holds them

    def log_metrics(self, metrics: dict[str, float], epoch: int) -> None:
        rows = self.files.read_metrics()
        columns = list(dict.fromkeys(k for row in rows for k in row))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomically(self.files.metrics_csv, out.getvalue())

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """TensorBoard scalars in ``tensorboard/``, the config as text."""

    def __init__(self, files: RunDir) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(files.tensorboard))

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in hparams.items()))

    def log_metrics(self, metrics: dict[str, float], epoch: int) -> None:
        for key, value in _numbers(metrics).items():
            self.writer.add_scalar(key, value, epoch)

    def close(self) -> None:
        self.writer.close()


def _run_id(files: RunDir) -> str:
    return hashlib.sha256(str(files.root.resolve()).encode()).hexdigest()[:16]


class WandbLogger:
    """One Weights & Biases run per run directory (resumed with it; wandb 0.19.10 or later)."""

    def __init__(self, files: RunDir) -> None:
        import wandb

        # create_new (wandb >= 0.19.10): the K runs of a stack are K W&B runs alive at once
        self.run = wandb.init(name=files.root.name, id=_run_id(files), resume="allow", dir=str(files.root),
                              reinit="create_new")

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        self.run.config.update(hparams, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], epoch: int) -> None:
        self.run.log(_numbers(metrics), step=epoch)

    def close(self) -> None:
        self.run.finish()


class MLflowLogger:
    """One MLflow run per run directory, tagged ``pkmixer.run_dir`` and found again on resume; through
    ``MlflowClient``, so that the K runs of a stack log side by side."""

    TAG = "pkmixer.run_dir"

    def __init__(self, files: RunDir) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        where = str(files.root.resolve())
        experiment = self.client.get_experiment_by_name("pkmixer")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("pkmixer")
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{self.TAG}` = '{where}'",
                                        max_results=1)
        self.run_id = found[0].info.run_id if found else self.client.create_run(
            experiment_id, run_name=files.root.name, tags={self.TAG: where}).info.run_id

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        for key, value in hparams.items():
            self.client.log_param(self.run_id, key, value)

    def log_metrics(self, metrics: dict[str, float], epoch: int) -> None:
        for key, value in _numbers(metrics).items():
            self.client.log_metric(self.run_id, key, value, step=epoch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_CLASSES = {"csv": CSVLogger, "tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MLflowLogger}


def check_loggers(names: tuple[str, ...]) -> None:
    """ConfigError unless every logger is known and its package installed."""
    for name in names:
        if name not in _CLASSES:
            raise ConfigError(f"run.loggers: unknown logger {name!r}; choose among {', '.join(LOGGERS)}")
        package = _PACKAGES.get(name)
        if package is not None:
            try:
                importlib.import_module(package)
            except ImportError:
                raise ConfigError(f"run.loggers: {name} needs the {package} package: pip install {package}") from None


def open_loggers(names: tuple[str, ...], files: RunDir) -> list[RunLogger]:
    """The run's loggers, in the order named (:func:`check_loggers` first)."""
    check_loggers(names)
    return [_CLASSES[name](files) for name in names]
