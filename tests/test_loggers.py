"""The loggers of run.loggers: metrics.csv follows metrics.jsonl through a resume; W&B and MLflow (stand-in modules
with their APIs' names, neither package being installed here) get the config once and every epoch's metrics, one
run per run directory, the same one on resume, K at once for a stack; a missing package is refused before
anything is written."""
import csv
import json
import sys
import types

import pytest
import torch

from pkmixer.errors import ConfigError
from pkmixer.train import loop, stacked_runs
from pkmixer.train.config import build_config

CFG = {"data.name": "digits", "model.name": "smixer_t4_28", "model.img_size": 8, "model.patch_size": 2,
       "model.in_chans": 1, "model.depth": 1, "model.embed_dim": 8, "data.batch_size": 64,
       "data.train_subset": 128, "data.test_subset": 64, "data.val_fraction": 0.1, "optim.name": "adamw",
       "optim.lr": 0.01, "schedule.epochs": 3, "run.progress": False}
quiet = dict(log=lambda _: None)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_csv_follows_the_metrics_rows_through_a_resume(tmp_path):
    run = tmp_path / "run"
    cfg = build_config(None, {**CFG, "run.loggers": ["csv"]})
    loop.train(cfg, run, stop_after=1, **quiet)
    with open(run / "metrics.jsonl", "a") as f:  # as a kill after epoch 2's row and before its checkpoint leaves it
        f.write(json.dumps({**_rows(run)[0], "epoch": 2, "val_error": -1.0}) + "\n")
    loop.train(None, run, resume=True, **quiet)
    loop.train(cfg, tmp_path / "straight", **quiet)
    for where in (run, tmp_path / "straight"):
        with open(where / "metrics.csv") as f:
            table = list(csv.DictReader(f))
        rows = _rows(where)
        assert [int(r["epoch"]) for r in table] == [1, 2, 3]
        assert [float(r["val_error"]) for r in table] == [row["val_error"] for row in rows]
        assert list(table[0]) == list(rows[0])


class _FakeWandbRun:
    def __init__(self, calls, **kwargs):
        self.calls, self.kwargs, self.config = calls, kwargs, types.SimpleNamespace(update=self._update)
        calls.append(("init", kwargs))

    def _update(self, values, allow_val_change=False):
        self.calls.append(("config", self.kwargs["id"], dict(values)))

    def log(self, data, step=None):
        self.calls.append(("log", self.kwargs["id"], step, dict(data)))

    def finish(self):
        self.calls.append(("finish", self.kwargs["id"]))


def test_wandb_gets_one_run_per_directory_resumed_and_stacked(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: _FakeWandbRun(calls, **kw)))
    cfg = build_config(None, {**CFG, "run.loggers": ["wandb"]})
    loop.train(cfg, tmp_path / "solo", stop_after=1, **quiet)
    loop.train(None, tmp_path / "solo", resume=True, **quiet)
    inits = [c[1] for c in calls if c[0] == "init"]
    assert len(inits) == 2 and inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    assert inits[0]["reinit"] == "create_new" and inits[0]["dir"] == str(tmp_path / "solo")
    logged = [c for c in calls if c[0] == "log"]
    assert [c[2] for c in logged] == [1, 2, 3]
    assert [c[3]["val_error"] for c in logged] == [row["val_error"] for row in _rows(tmp_path / "solo")]
    config = [c for c in calls if c[0] == "config"]
    assert config[0][2]["optim.lr"] == 0.01 and config[0][2]["model.depth"] == 1

    calls.clear()
    stacked_runs.train_stack([cfg.override({"run.seed": s}) for s in (0, 1)],
                             [tmp_path / "a", tmp_path / "b"], **quiet)
    ids = {c[1]["id"] for c in calls if c[0] == "init"}
    assert len(ids) == 2 and {c[1] for c in calls if c[0] == "log"} == ids
    assert sorted(c[1] for c in calls if c[0] == "finish") == sorted(ids)


def test_mlflow_finds_its_run_again_on_resume(tmp_path, monkeypatch):
    runs, calls = {}, []

    class Client:
        def get_experiment_by_name(self, name):
            return types.SimpleNamespace(experiment_id="1") if runs else None

        def create_experiment(self, name):
            return "1"

        def search_runs(self, experiments, filter_string, max_results):
            return [types.SimpleNamespace(info=types.SimpleNamespace(run_id=rid))
                    for rid, tags in runs.items() if f"'{tags['pkmixer.run_dir']}'" in filter_string]

        def create_run(self, experiment_id, run_name, tags):
            runs[f"r{len(runs)}"] = tags
            return types.SimpleNamespace(info=types.SimpleNamespace(run_id=f"r{len(runs) - 1}"))

        def log_param(self, run_id, key, value):
            calls.append(("param", run_id, key))

        def log_metric(self, run_id, key, value, step):
            calls.append(("metric", run_id, key, step))

        def set_terminated(self, run_id):
            calls.append(("end", run_id))

    tracking = types.SimpleNamespace(MlflowClient=Client)
    monkeypatch.setitem(sys.modules, "mlflow", types.SimpleNamespace(tracking=tracking))
    monkeypatch.setitem(sys.modules, "mlflow.tracking", tracking)
    cfg = build_config(None, {**CFG, "run.loggers": ["mlflow"]})
    loop.train(cfg, tmp_path / "run", stop_after=2, **quiet)
    loop.train(None, tmp_path / "run", resume=True, **quiet)
    assert list(runs) == ["r0"] and runs["r0"]["pkmixer.run_dir"] == str((tmp_path / "run").resolve())
    assert sorted({c[3] for c in calls if c[0] == "metric" and c[2] == "val_error"}) == [1, 2, 3]
    assert ("param", "r0", "optim.lr") in calls and calls.count(("end", "r0")) == 2


def test_a_logger_whose_package_is_missing_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ConfigError, match="wandb needs the wandb package"):
        loop.train(build_config(None, {**CFG, "run.loggers": ["wandb"]}), tmp_path / "run", **quiet)
    assert not (tmp_path / "run").exists()


def test_the_old_tensorboard_switch_is_the_tensorboard_logger():
    assert build_config({"run": {"tensorboard": True}}).run.loggers == ("tensorboard",)
    assert build_config({"run": {"tensorboard": False, "loggers": ["csv"]}}).run.loggers == ("csv",)
    assert build_config({"run": {"tensorboard": True, "loggers": ["csv"]}}).run.loggers == ("csv", "tensorboard")
    with pytest.raises(ConfigError, match="names a logger twice"):
        build_config(None, {"run.loggers": ["csv", "csv"]})
