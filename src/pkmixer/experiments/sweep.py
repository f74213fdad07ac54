"""Sweeps: many training runs, one run directory each, one results table; resumable, local or on Ray.

A sweep directory holds::

    sweep.json       the runs (name, config, meta) and who asked for them (preset, scale, data set, command)
    runs/<name>/     each run's directory, as ``pkmixer train`` writes it (config, metrics, checkpoints, summary)
    logs/<name>.log  each run's log lines
    results.jsonl    one row per run: meta + run, status, final test error and loss, the validation-selected epoch
                     and its test error, epochs, wall time, environment
    results.csv      the same table as CSV

Resume: run the same sweep again and a finished (or diverged) run is skipped, a run with
``checkpoints/latest.pt`` resumes from it (``train(..., resume=True)``: exact on CPU), and a run directory
without a checkpoint - created, then killed before its first epoch ended - is removed and started afresh (only
when it holds nothing but files a run writes). The table is rebuilt from the run directories after every
finished run and written atomically (temporary file, then rename), so it always has exactly one row per run,
whatever was killed when. A run whose directory was made with another config is refused, not mixed in.
One process at a time may drive a sweep directory (a lock file, ``.lock``).

Stacking (``stack=True``, ``pkmixer reproduce --stack``; off by default): the runs still to train whose configs
differ only in ``run.seed``, ``model.structure_seed``, ``optim.lr`` and ``optim.weight_decay`` (a point's seeds,
and a learning-rate sweep's points) are one job, trained as one stacked model
(:mod:`pkmixer.train.stacked_runs`: each run directory as if trained alone, resumable alone or restacked); a job
the stack refuses (a model it cannot carry) trains its runs alone. Each row's ``stack`` and curve record how the
run trained (its results depend on it to float rounding). A stacked run's ``wall_time`` counts the whole stack's.

Backends (``backend=``):

* ``local`` (default): a pool of worker processes (spawn context), each run in one worker. Without GPUs the
  default is one torch thread per run and one worker per core: on 2 cores, 2 runs × 1 thread beats 1 run × 2
  threads for the small models of the small and smoke scales (little work per operation to share out). With
  CUDA GPUs, one worker per GPU by default (CUDA_VISIBLE_DEVICES=i) and the cores split among them; ``workers``
  above the GPU count shares each GPU among several runs, round-robin (worker k takes GPU k mod the count), which
  keeps a GPU busy when its runs are small and launch-bound (docs/performance.md). With one worker the
  run trains in this process. On Linux a worker dies with this process from the first statement it runs, before
  it imports multiprocessing, pkmixer or torch (``PR_SET_PDEATHSIG``, then a check that this process is still
  its parent: ``pkmixer.experiments.worker``), and multiprocessing's resource tracker ends with the workers: a
  killed sweep leaves no process behind that could write into it. Elsewhere workers may outlive a killed sweep.
* ``ray``: each run is a Ray task (``num_cpus`` = threads per run, ``num_gpus`` = 1 when the cluster has
  GPUs); ``address=None`` starts a local Ray instance, else ``ray.init(address=...)`` joins a cluster. Every
  node must see the sweep directory at the same absolute path (a shared filesystem: NFS, Lustre, ...) and have
  pkmixer installed; skip and resume work as above. Needs ``pip install 'pkmixer[ray]'``.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import is_temp_file, write_text_atomically
from ..errors import ConfigError, unknown_name
from ..train.config import DataConfig, TrainConfig, build_config, load_yaml
from ..train.rundir import RunDir, hold_lock, remove_if_untouched
from .probes import check_probes, missing_probes, probe_columns, read_probes, run_probes

BACKENDS = ("local", "ray")
ROW_KEYS = ("run", "status", "final_test_error", "final_test_loss", "final_train_loss", "final_val_error",
            "selected_epoch", "selected_test_error", "best_val_error", "selection", "n_test", "epochs", "wall_time",
            "params", "precision", "pipeline", "stack", "environment", "error", "curve")
# a row's curve: these, per epoch (the stack's size and the run's place in it only for epochs trained stacked; the
# validation columns only for runs with a validation split; ema_*: with a Polyak average)
CURVE_KEYS = ("epoch", "train_loss", "val_loss", "val_error", "test_loss", "test_error", "ema_val_loss",
              "ema_val_error", "ema_test_loss", "ema_test_error", "lr", "stack_members", "stack_member")
# test images per data set (data.test_subset takes fewer): the binomial sampling error of a test error needs them
TEST_SIZES = {"fashion-mnist": 10_000, "mnist": 10_000, "cifar10": 10_000, "cifar100": 10_000, "stl10": 8_000,
              "digits": 359, "imagenet": 50_000}
DONE = ("finished", "diverged")  # a run in one of these states is never run again
# config keys that do not change a run's result: a rerun may differ in them (e.g. another --data-dir)
NEUTRAL_KEYS = {("data", "data_dir"), ("data", "download"), ("data", "workers"), ("run", "progress"),
                ("run", "device"), ("run", "loggers")}
# config keys added after results were recorded, with the value every earlier run trained with: left out of the
# normalised config at that value, so that a record's key (pkmixer.experiments.records.run_key) and a sweep's resume
# check stay those of the configs that lacked them
ADDED_KEYS = {("optim", "lasso"): 0.0, ("optim", "lasso_beta"): 50.0}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its directory is ``<sweep_dir>/runs/<name>``."""

    name: str  # unique within the sweep; letters, digits and . _ = + -
    config: TrainConfig  # the run's whole training configuration (pkmixer.train.config.build_config)
    meta: dict[str, Any] = field(default_factory=dict)  # the results table's columns, e.g. {"model": ..., "seed": 0}
    probes: tuple[str, ...] = ()  # what to measure on the finished model (pkmixer.experiments.probes)


@dataclass(frozen=True)
class SweepDir:
    root: Path

    spec_file = property(lambda self: self.root / "sweep.json")
    results_jsonl = property(lambda self: self.root / "results.jsonl")
    results_csv = property(lambda self: self.root / "results.csv")
    lock = property(lambda self: self.root / ".lock")

    def run(self, name: str) -> Path:
        return self.root / "runs" / name

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"


# ---- writing files atomically ---------------------------------------------------------------------------


def rows_to_csv(rows: Sequence[dict]) -> str:
    """Rows as CSV, columns in order of first appearance; None as an empty cell. Columns of lists or mappings
    (a run's ``curve``) are left to the JSON lines."""
    nested = {k for row in rows for k, v in row.items() if isinstance(v, (list, dict))}
    columns = dict.fromkeys(k for row in rows for k in row if k not in nested)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items() if k in columns})
    return out.getvalue()


def write_results(sweep_dir: Path, rows: Sequence[dict]) -> None:
    sweep = SweepDir(Path(sweep_dir))
    write_text_atomically(sweep.results_jsonl, "".join(json.dumps(row) + "\n" for row in rows))
    write_text_atomically(sweep.results_csv, rows_to_csv(rows))


# ---- specs ----------------------------------------------------------------------------------------------


def _normalized(config: TrainConfig) -> dict[str, Any]:
    """The config as a plain dict, without the keys that do not change a result and the :data:`ADDED_KEYS` at
    their earlier value."""
    resolved = config.as_dict()
    for section, key in NEUTRAL_KEYS:
        resolved[section].pop(key, None)
    for (section, key), before in ADDED_KEYS.items():
        if resolved[section].get(key) == before:
            resolved[section].pop(key)
    return resolved


def _difference(a: dict, b: dict, prefix: str = "") -> str:
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
                return _difference(a[key], b[key], f"{prefix}{key}.")
            return f"{prefix}{key}: {a.get(key)!r} here, {b.get(key)!r} there"
    return ""


def check_specs(specs: Sequence[RunSpec]) -> dict[str, dict[str, Any]]:
    """Refuse duplicate or unusable names, bad configs, unknown model options and meta that is not a flat
    JSON mapping; returns each run's normalised config."""
    import torch

    from ..models.registry import create_model

    seen: dict[str, dict[str, Any]] = {}
    built: set[str] = set()  # models already checked (the seeds of a point share one)
    for spec in specs:
        if not isinstance(spec, RunSpec):
            raise ConfigError(f"a sweep is a list of RunSpec, got {type(spec).__name__}")
        if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name) or len(spec.name) > 200:
            raise ConfigError(f"run name {spec.name!r} must be letters, digits and . _ = + - (a directory name)")
        if spec.name in seen:
            raise ConfigError(f"run name {spec.name!r} appears twice in the sweep")
        clash = set(spec.meta) & set(ROW_KEYS)
        if clash:
            raise ConfigError(f"run {spec.name}: meta keys {sorted(clash)} are reserved for the results table")
        try:
            json.dumps(spec.meta)
        except TypeError as err:
            raise ConfigError(f"run {spec.name}: meta must be JSON values ({err})") from None
        if not isinstance(spec.config, TrainConfig):
            raise ConfigError(f"run {spec.name}: its config must be a TrainConfig (pkmixer.train.config.build_config), "
                              f"not a {type(spec.config).__name__}")
        try:
            cfg = spec.config
            if cfg.data.name == "auto":
                raise ConfigError("data.name=auto is resolved before a sweep; name the data set")
            key = json.dumps([cfg.model.name, cfg.model.options], sort_keys=True, default=str)
            if key not in built:
                with torch.device("meta"):  # no memory; checks the options
                    create_model(cfg.model.name, **cfg.model.options)
                built.add(key)
        except ConfigError as err:
            raise ConfigError(f"run {spec.name}: {err}") from None
        try:
            check_probes(spec.probes)
        except ConfigError as err:
            raise ConfigError(f"run {spec.name}: {err}") from None
        seen[spec.name] = _normalized(spec.config)
    return seen


def _spec_dict(spec: RunSpec) -> dict[str, Any]:
    return {"name": spec.name, "config": spec.config.as_dict(), "meta": spec.meta, "probes": list(spec.probes)}


def read_sweep(sweep_dir: Path) -> dict[str, Any]:
    """The contents of ``sweep.json``: {"info": {...}, "specs": [RunSpec, ...]}."""
    path = SweepDir(Path(sweep_dir)).spec_file
    if not path.is_file():
        raise ConfigError(f"{sweep_dir} is not a sweep directory (no sweep.json)")
    try:
        data = json.loads(path.read_text())
        specs = [RunSpec(s["name"], build_config(s["config"]), s["meta"], tuple(s.get("probes", ())))
                 for s in data["specs"]]
    except (ValueError, KeyError, TypeError, ConfigError) as err:
        raise ConfigError(f"{path} is not a sweep file ({err})") from None
    return {"info": data.get("info", {}), "specs": specs}


# ---- the state of a run ---------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_status(run_dir: Path) -> str:
    """finished / diverged (done), partial (a checkpoint to resume from), failed, or pending."""
    run = RunDir(run_dir)
    summary = _read_json(run.summary) or {}
    if summary.get("status") in DONE:
        return summary["status"]
    if run.error.is_file():
        return "failed"
    if run.latest.is_file():
        return "partial"
    return "pending"


def selected_epoch(curve: Sequence[dict]) -> int | None:
    """The 1-based epoch of the lowest validation error (ties: the earliest); None without a validation split. The
    test columns play no part in it."""
    best = None
    for i, m in enumerate(curve):
        value = m.get("val_error")
        if isinstance(value, (int, float)) and (best is None or value < best[0]):
            best = (value, i)
    return None if best is None else int(curve[best[1]].get("epoch", best[1] + 1))


def selection_columns(curve: Sequence[dict], summary: dict[str, Any]) -> dict[str, Any]:
    """The validation-selection columns of a row: ``selection`` ("val_error", or "none" without a validation
    split - also for a summary written before there was one, which holds ``best_test_error`` and no ``selection``:
    such a run selects nothing), ``selected_epoch``, ``selected_test_error`` (the test error at that epoch),
    ``best_val_error`` and ``final_val_error``. The summary's own values are taken where it has them; else they are
    read off the curve."""
    if "selection" in summary and summary.get("selection") not in ("none", None):
        epoch = summary.get("selected_epoch")
        return {"selection": summary["selection"], "selected_epoch": epoch,
                "selected_test_error": summary.get("selected_test_error"),
                "best_val_error": summary.get("best_val_error"), "final_val_error": summary.get("final_val_error")}
    epoch = selected_epoch(curve)
    if epoch is None:
        legacy = "best_test_error" in summary and "selection" not in summary
        return {"selection": "none (written before the validation split)" if legacy else "none",
                "selected_epoch": None, "selected_test_error": None, "best_val_error": None, "final_val_error": None}
    at = next(m for m in curve if m.get("epoch") == epoch) if any("epoch" in m for m in curve) else curve[epoch - 1]
    return {"selection": "val_error", "selected_epoch": epoch, "selected_test_error": at.get("test_error"),
            "best_val_error": at.get("val_error"), "final_val_error": curve[-1].get("val_error")}


def test_size(data: DataConfig) -> int | None:
    """How many test images a run is evaluated on (:data:`TEST_SIZES`, or ``data.test_subset`` when fewer)."""
    size = TEST_SIZES.get(data.name)
    subset = data.test_subset
    if size is None:
        return subset
    return min(size, subset) if subset else size


def run_row(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    """The results-table row of one run, read from its directory: ``spec.meta`` + the ROW_KEYS + the numbers
    of its probes (None until they are measured).

    ``wall_time`` sums the epoch times of metrics.jsonl, so it counts every resumed piece of the run; ``curve``
    holds the :data:`CURVE_KEYS` of every epoch, so that a preset's analysis never reads run directories;
    ``stack`` is the size of the stack its last epoch trained in (None: alone); the selection columns come from
    :func:`selection_columns` (the validation split selects, the test split never does); ``n_test`` from
    :func:`test_size`; ``environment`` from the summary (torch, Python, pkmixer, commit, CPU, threads, device).
    """
    run = RunDir(run_dir)
    status = run_status(run_dir)
    metrics = [m for m in run.read_metrics() if "test_error" in m]  # a line cut by a kill is dropped
    summary = _read_json(run.summary) or {}
    errors = [m["test_error"] for m in metrics]
    error = None
    if status == "failed":
        error = (run.error.read_text().strip().splitlines() or ["unknown error"])[0]
    curve = [{k: m[k] for k in CURVE_KEYS if k in m} for m in metrics]
    return {**spec.meta, **probe_columns(spec.probes, read_probes(run_dir)), "run": spec.name, "status": status,
            "final_test_error": errors[-1] if errors else None,
            "final_test_loss": metrics[-1]["test_loss"] if metrics else None,
            "final_train_loss": metrics[-1].get("train_loss") if metrics else None,
            **selection_columns(curve, summary), "n_test": test_size(spec.config.data),
            "epochs": len(metrics), "wall_time": sum(m.get("epoch_time", 0.0) for m in metrics),
            "params": summary.get("params"), "precision": summary.get("precision"),
            "pipeline": summary.get("pipeline"), "stack": metrics[-1].get("stack_members") if metrics else None,
            "environment": summary.get("environment"), "error": error, "curve": curve}


def load_rows(sweep_dir: Path) -> list[dict]:
    """The results table of a sweep, one row per run of sweep.json, rebuilt from the run directories; a run
    whose directory is gone keeps its row from results.jsonl (e.g. when only the results were copied)."""
    sweep = SweepDir(Path(sweep_dir))
    specs = read_sweep(sweep.root)["specs"]
    saved, bad = {}, []
    if sweep.results_jsonl.is_file():
        try:
            lines = sweep.results_jsonl.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            lines, bad = [], [f"unreadable ({type(err).__name__})"]
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
                saved[row["run"]] = row
            except (ValueError, TypeError, KeyError):  # cut mid-line, or not a row
                bad.append(f"line {number}")
    gone = [s.name for s in specs if not sweep.run(s.name).exists()]
    if bad and gone:  # the table is damaged and some rows can only come from it
        raise ConfigError(f"{sweep.results_jsonl}: {', '.join(bad[:3])} is cut or not a JSON row, and the "
                          f"directories of {len(gone)} runs (e.g. {gone[0]}) are gone, so their rows cannot be "
                          "read; restore the file or the run directories")
    return [run_row(s, sweep.run(s.name)) if sweep.run(s.name).exists() or s.name not in saved else saved[s.name]
            for s in specs]


# ---- one run (in a worker process, a Ray task or this process) ------------------------------------------


@dataclass(frozen=True)
class RunJob:
    """One run as a worker takes it (plain values: it travels to other processes and Ray tasks)."""

    name: str
    config: TrainConfig
    run_dir: str
    log_path: str
    probes: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: RunSpec, sweep: SweepDir) -> RunJob:
        return cls(spec.name, spec.config, str(sweep.run(spec.name)), str(sweep.log(spec.name)), tuple(spec.probes))


def execute_run(job: RunJob, threads: int | None) -> dict:
    """Train, resume or skip one run, then run the probes it still lacks on its finished model; never raises
    for a failed run: returns {"name", "status", "error"}."""
    import torch

    from ..train.engine import TrainingDiverged
    from ..train.loop import train

    name, config, probes = job.name, job.config, job.probes
    run = Path(job.run_dir)
    files = RunDir(run)
    if threads:
        torch.set_num_threads(threads)
    Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(job.log_path, "a") as logfile:
        def log(message: str) -> None:
            logfile.write(message + "\n")
            logfile.flush()

        status = run_status(run)
        if status == "diverged" or (status == "finished" and not missing_probes(run, probes)):
            return {"name": name, "status": status, "error": None}
        files.error.unlink(missing_ok=True)
        try:
            if status == "finished":  # trained: only probes are missing (killed between its last checkpoint and them)
                log(f"--- probing {name}")
            elif files.latest.is_file():
                log(f"--- resuming {name} from its latest checkpoint")
                train(None, run, resume=True, log=log)
            else:  # a directory killed before its first checkpoint starts afresh (train's resume does that)
                log(f"--- starting {name}")
                train(config, run, resume=run.exists(), log=log)
            if probes and run_status(run) == "finished":
                run_probes(run, probes, log)
        except TrainingDiverged as err:
            log(f"diverged: {err}")
            return {"name": name, "status": "diverged", "error": str(err)}
        except Exception as err:  # recorded for the table; the sweep goes on with the other runs
            message = f"{type(err).__name__}: {err}".splitlines()[0]
            log(traceback.format_exc())
            run.mkdir(parents=True, exist_ok=True)
            files.error.write_text(message + "\n")
            return {"name": name, "status": "failed", "error": message}
    return {"name": name, "status": run_status(run), "error": None}


def execute_stack(jobs: Sequence[RunJob], threads: int | None) -> list[dict]:
    """Train or resume the runs of ``jobs`` (configs that :func:`stack_groups` put together) as one stack (:func:`pkmixer.train.stacked_runs.train_stack`), then the probes each still lacks; one
    result per run, as :func:`execute_run`'s. Runs that are done are skipped as there; when the stack is refused
    before anything is written (a model it cannot carry, the per-sample pipeline), each run trains alone instead."""
    import torch

    from ..train.stacked_runs import train_stack

    if threads:
        torch.set_num_threads(threads)
    todo = [j for j in jobs if run_status(Path(j.run_dir)) not in DONE]
    logs = []
    for job in todo:
        Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
        logs.append(open(job.log_path, "a"))

    def log(message: str) -> None:
        for f in logs:
            f.write(message + "\n")
            f.flush()

    errors: dict[str, str] = {}  # the runs that diverged, or all that failed with the stack: why
    failed = False
    try:
        if len(todo) > 1:
            for job in todo:
                RunDir(Path(job.run_dir)).error.unlink(missing_ok=True)
            log(f"--- training {', '.join(j.name for j in todo)} as one stack")
            try:
                summaries = train_stack([None if RunDir(Path(j.run_dir)).latest.is_file() else j.config for j in todo],
                                        [j.run_dir for j in todo], resume=[Path(j.run_dir).exists() for j in todo],
                                        log=log)
                errors = {j.name: s["error"] for j, s in zip(todo, summaries) if s["status"] == "diverged"}
            except ConfigError as err:
                log(f"not stacked ({err}): each run trains alone")
            except Exception as err:  # recorded for the table, for every run of the stack
                message = f"{type(err).__name__}: {err}".splitlines()[0]
                log(traceback.format_exc())
                for job in todo:
                    Path(job.run_dir).mkdir(parents=True, exist_ok=True)
                    RunDir(Path(job.run_dir)).error.write_text(message + "\n")
                errors, failed = {j.name: message for j in todo}, True
    finally:
        for f in logs:
            f.close()
    # what is left - probes, or every run when the stack was refused - goes the solo way (done runs skipped)
    return [{"name": j.name, "status": "failed" if failed else "diverged", "error": errors[j.name]} if j.name in errors
            else execute_run(j, threads) for j in jobs]


def execute_group(jobs: Sequence[RunJob], threads: int | None) -> list[dict]:
    """One run alone (:func:`execute_run`), or several as one stack (:func:`execute_stack`); their results."""
    return execute_stack(jobs, threads) if len(jobs) > 1 else [execute_run(jobs[0], threads)]


def stack_groups(specs: Sequence[RunSpec]) -> list[list[RunSpec]]:
    """The specs in groups that may train as one stack: configs equal but for what each member keeps its own
    (:data:`pkmixer.train.stacked_runs.PER_MEMBER`: the two seeds, ``optim.lr``, ``optim.weight_decay``), in the
    specs' order (a group of one trains alone). Decided from the configs alone, never by timing."""
    from ..train.stacked_runs import stack_key

    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(stack_key(spec.config), []).append(spec)
    return list(groups.values())


def _init_worker(threads: int, gpu_ids: Any) -> None:
    """Pool worker set-up: one GPU each, ``threads`` torch threads. (Dying with the parent is set up long
    before, by the first statements the worker runs: ``worker.spawn_context``.)"""
    if gpu_ids is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_ids.get())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch

    torch.set_num_threads(threads)


# ---- backends -------------------------------------------------------------------------------------------


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _plan(todo: int, workers: int | None, threads: int | None, gpus: int) -> tuple[int, int]:
    """(workers, threads per run) for the local backend; see the module docstring."""
    cores = available_cores()
    if workers is None:
        workers = gpus if gpus else max(1, cores // (threads or 1))
    workers = max(1, min(workers, todo))
    return workers, threads or max(1, cores // workers)


def gpu_assignment(workers: int, gpus: int) -> list[int]:
    """The GPU of each local worker: round-robin, so more workers than GPUs share them evenly."""
    return [k % gpus for k in range(workers)]


class _Progress:
    """A line per finished run: k/n, the run's result, elapsed time and an estimate of the rest."""

    def __init__(self, total: int, done: int, enabled: bool, log: Callable[[str], None]) -> None:
        self.total, self.done, self.enabled, self.log = total, done, enabled, log
        self.started, self.finished_here = time.time(), 0

    def update(self, row: dict[str, Any]) -> None:
        self.done += 1
        self.finished_here += 1
        if not self.enabled:
            return
        elapsed = time.time() - self.started
        left = self.total - self.done
        eta = f", about {_duration(elapsed / self.finished_here * left)} left" if left else ""
        error = row["final_test_error"]
        result = f"test error {error:.2%}" if row["status"] == "finished" and error is not None else \
            (row["error"] or row["status"])
        self.log(f"[{self.done}/{self.total}] {row['run']}: {row['status']}, {result} "
                 f"({_duration(row['wall_time'])}); {_duration(elapsed)} elapsed{eta}")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _run_local(groups: list[list[RunJob]], workers: int, threads: int, gpus: int,
               on_done: Callable[[dict], None]) -> None:
    if workers == 1 and not gpus:
        import torch

        before = torch.get_num_threads()
        try:
            for group in groups:
                for result in execute_group(group, threads):
                    on_done(result)
        finally:
            torch.set_num_threads(before)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    from .worker import spawn_context

    # spawn, each worker tied to this process by its first statements; the workers are created in this thread
    # (by submit), which outlives them (leaving the with block waits for them): PR_SET_PDEATHSIG fires when
    # the creating thread ends, not only the process
    ctx = spawn_context()
    gpu_ids = None
    if gpus:
        gpu_ids = ctx.Queue()
        for i in gpu_assignment(workers, gpus):
            gpu_ids.put(i)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(threads, gpu_ids)) as pool:
        futures = {pool.submit(execute_group, group, threads): [job.name for job in group] for group in groups}
        try:
            for future in as_completed(futures):
                try:
                    results = future.result()
                except BrokenProcessPool as err:
                    results = [{"name": name, "status": "failed", "error": f"worker process died ({err})"}
                               for name in futures[future]]
                for result in results:
                    on_done(result)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _run_ray(groups: list[list[RunJob]], workers: int | None, threads: int | None, address: str | None,
             on_done: Callable[[dict], None], log: Callable[[str], None]) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("the Ray backend needs Ray: pip install 'pkmixer[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address is None:
                ray.init(num_cpus=available_cores(), include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ConfigError(f"cannot start or reach Ray at {address or 'a local instance'}: "
                              f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    try:
        resources = ray.cluster_resources()
        gpus = 1 if resources.get("GPU", 0) >= 1 else 0
        per_run = threads or 1
        limit = workers or max(1, int(resources.get("CPU", 1) // per_run))
        log(f"Ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs; {per_run} CPU(s)"
            f"{' and 1 GPU' if gpus else ''} per run, up to {limit} runs at a time")
        task = ray.remote(num_cpus=per_run, num_gpus=gpus, max_retries=0)(execute_group)
        pending = list(groups)
        running: dict[Any, list[str]] = {}
        while pending or running:
            while pending and len(running) < limit:
                group = pending.pop(0)
                running[task.remote(group, per_run)] = [job.name for job in group]
            ready, _ = ray.wait(list(running), num_returns=1)
            names = running.pop(ready[0])
            try:
                results = ray.get(ready[0])
            except ray.exceptions.RayError as err:
                results = [{"name": name, "status": "failed", "error": f"Ray task failed ({str(err).splitlines()[0]})"}
                           for name in names]
            for result in results:
                on_done(result)
    finally:
        if started_here:
            ray.shutdown()


# ---- the sweep ------------------------------------------------------------------------------------------


class _Lock:
    """One process drives a sweep directory at a time (:func:`~pkmixer.train.rundir.hold_lock` on ``.lock``).
    ``made``: the sweep directory and the folders above it made for this sweep (the deepest first), removed
    again when the sweep is refused or its first write fails before anything is written."""

    def __init__(self, path: Path, made: tuple[Path, ...] = ()) -> None:
        self.path, self.made = path, made
        self.fd: int | None = None

    def __enter__(self) -> _Lock:
        self.fd = hold_lock(self.path, f"running the sweep in {self.path.parent}")
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        if kind is not None and issubclass(kind, (ConfigError, OSError)) and self.made:
            remove_if_untouched(self.path.parent, self.made[1:])
        os.close(self.fd)


def _check_existing(sweep: SweepDir, specs: Sequence[RunSpec], normalized: dict[str, dict]) -> None:
    """Refuse a run whose directory holds results made with another config (a run without a checkpoint
    starts afresh, so its config does not matter)."""
    for spec in specs:
        run = RunDir(sweep.run(spec.name))
        started = run.summary.is_file() or run.latest.is_file()
        if not (started and run.config.is_file()):
            continue
        theirs = _normalized(build_config(load_yaml(run.config)))
        if theirs != normalized[spec.name]:
            raise ConfigError(f"run {spec.name} in {sweep.root} was made with another config "
                              f"({_difference(normalized[spec.name], theirs)} in {run.config}); "
                              f"choose another output directory or remove {run.root}")


def run_sweep(specs: Sequence[RunSpec], sweep_dir: Path, *, backend: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool = True, log: Callable[[str], None] = print,
              threads: int | None = None, info: dict[str, Any] | None = None, stack: bool = False,
              on_row: Callable[[RunSpec, dict], None] | None = None) -> list[dict]:
    """Run (or resume) every spec in ``sweep_dir``; returns the results table, one row per spec, in order.

    ``threads``: torch threads per run (default: the cores divided among the workers; 1 per Ray task);
    ``info``: stored in sweep.json beside the specs (the preset, scale, data set and command, for reports).
    A run that fails is recorded (status "failed", its error in the row) and the others go on; run the sweep
    again to retry it. ``stack``: the runs still to train whose configs differ only in their seeds, learning rate
    and weight decay train as one stacked job each (:func:`stack_groups`, :func:`execute_stack`; each row's
    ``stack`` and curve say how it trained); off by default (on a CPU stacking measured no faster,
    docs/performance.md section s). ``on_row(spec, row)`` is called as each run ends, with its row (what
    ``pkmixer reproduce`` keeps as a record at once, so that a sweep killed later keeps it).
    """
    if backend not in BACKENDS:
        raise unknown_name("backend", str(backend), BACKENDS)
    if address is not None and backend != "ray":
        raise ConfigError("--address needs --backend ray")
    for flag, value in (("--workers", workers), ("--threads", threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
    specs = list(specs)
    normalized = check_specs(specs)
    sweep = SweepDir(Path(sweep_dir).resolve())
    made = tuple(p for p in (sweep.root, *sweep.root.parents) if not p.exists())  # the deepest first
    sweep.root.mkdir(parents=True, exist_ok=True)
    with _Lock(sweep.lock, made):
        _check_existing(sweep, specs, normalized)
        for leftover in (p for p in sweep.root.iterdir() if is_temp_file(p) and p.is_file()):
            leftover.unlink()  # a killed sweep's half-written sweep.json or table (the run folders clean their own)
        write_text_atomically(sweep.spec_file, json.dumps({"version": 1, "info": info or {},
                                                  "specs": [_spec_dict(s) for s in specs]}, indent=1))
        rows = {s.name: run_row(s, sweep.run(s.name)) for s in specs}
        write_results(sweep.root, [rows[s.name] for s in specs])
        todo = [s for s in specs if rows[s.name]["status"] not in DONE
                or (rows[s.name]["status"] == "finished" and missing_probes(sweep.run(s.name), s.probes))]
        resuming = sum(rows[s.name]["status"] == "partial" for s in todo)
        by_name = {s.name: s for s in specs}
        tracker = _Progress(len(specs), len(specs) - len(todo), progress, log)

        def on_done(result: dict[str, Any]) -> None:
            spec = by_name[result["name"]]
            rows[spec.name] = row = run_row(spec, sweep.run(spec.name))
            if result["status"] == "failed" and row["status"] != "failed":  # e.g. a worker that died
                row.update(status="failed", error=result["error"])
            write_results(sweep.root, [rows[s.name] for s in specs])
            if on_row is not None:
                on_row(spec, row)
            tracker.update(row)

        if todo:
            groups = stack_groups(todo) if stack else [[s] for s in todo]
            jobs = [[RunJob.of(s, sweep) for s in group] for group in groups]
            if backend == "local":
                import torch

                gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
                n_workers, n_threads = _plan(len(jobs), workers, threads, gpus)
                if progress:
                    log(f"sweep {sweep.root}: {len(specs)} runs, {len(specs) - len(todo)} done, {resuming} to resume, "
                        f"{len(todo) - resuming} to start{f' in {len(jobs)} stacked jobs' if stack else ''}; "
                        f"{n_workers} worker(s) x {n_threads} thread(s)"
                        f"{f' on {gpus} GPU(s)' if gpus else ''}; logs in {sweep.root / 'logs'}")
                _run_local(jobs, n_workers, n_threads, gpus, on_done)
            else:
                if progress:
                    log(f"sweep {sweep.root}: {len(specs)} runs, {len(specs) - len(todo)} done, {resuming} to resume, "
                        f"{len(todo) - resuming} to start{f' in {len(jobs)} stacked jobs' if stack else ''} on Ray; "
                        f"logs in {sweep.root / 'logs'}")
                _run_ray(jobs, workers, threads, address, on_done, log)
        elif progress:
            log(f"sweep {sweep.root}: all {len(specs)} runs are done" if specs else
                f"sweep {sweep.root}: nothing to train (an analysis-only preset)")
        return [rows[s.name] for s in specs]


def unfinished(rows: Sequence[dict]) -> list[dict]:
    """The rows of runs that are not done (neither finished nor diverged)."""
    return [r for r in rows if r["status"] not in DONE]
