"""Probes (pkmixer.experiments.probes): the few-shot ridge classifier against its closed form, probes run once per
finished run and stored, a sweep killed between a run's last checkpoint and its probes completing them without
retraining, and the suppa1 preset's decisions on simulated rows."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from pkmixer.errors import ConfigError
from pkmixer.experiments import get_preset
from pkmixer.experiments.probes import ridge_error, run_probes
from pkmixer.experiments.sweep import RunSpec, load_rows, run_sweep
from pkmixer.train.config import build_config
from pkmixer.train.rundir import RunDir

TINY = {"model": {"name": "mixer_t4_28", "img_size": 8, "patch_size": 2, "in_chans": 1, "depth": 1, "embed_dim": 8},
        "data": {"name": "digits", "batch_size": 50, "train_subset": 300, "test_subset": 200},
        "optim": {"name": "adamw", "lr": 0.005}, "schedule": {"epochs": 1}, "run": {"progress": False, "seed": 0}}
PROBED = RunSpec("a", build_config(TINY), {"seed": 0}, ("fewshot5", "top5"))


def quiet(_: str) -> None:
    pass


def test_ridge_error_is_the_closed_form_classifier():
    rng = np.random.default_rng(0)
    x, test_x = rng.normal(size=(30, 6)), rng.normal(size=(40, 6))
    y, test_y = rng.integers(0, 3, 30), rng.integers(0, 3, 40)
    # the same classifier written out: standardise, centre the ±1 targets, solve (AᵀA + λI) W = Aᵀ(T − t̄)
    mean, std = x.mean(0), x.std(0)
    a, b = (x - mean) / std, (test_x - mean) / std
    t = 2.0 * np.eye(3)[y] - 1.0
    w = np.linalg.solve(a.T @ a + 1.0 * np.eye(6), a.T @ (t - t.mean(0)))
    expected = np.mean((b @ w + t.mean(0)).argmax(1) != test_y)
    got = ridge_error(*(torch.from_numpy(v) for v in (x, y, test_x, test_y)), classes=3)
    assert got == pytest.approx(expected, abs=1e-12)
    centres = torch.eye(3, 6, dtype=torch.float64) * 10  # separable classes: no error
    labels = torch.arange(3).repeat(5)
    points = centres[labels] + 0.1 * torch.randn(15, 6, dtype=torch.float64)
    assert ridge_error(points, labels, points, labels, classes=3) == 0.0


def test_probes_run_once_when_a_run_finishes_and_become_row_columns(tmp_path):
    rows = run_sweep([PROBED], tmp_path, progress=False, workers=1)
    row = rows[0]
    assert row["status"] == "finished"
    assert row["top1_error"] == pytest.approx(row["final_test_error"])  # the probe evaluates the same weights
    assert 0.0 <= row["fewshot5_error"] <= 1.0 and row["top5_error"] <= row["top1_error"]
    assert [c["epoch"] for c in row["curve"]] == [1] and row["final_train_loss"] == row["curve"][-1]["train_loss"]
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert "curve" not in header and "fewshot5_error" in header  # the per-epoch curve stays in results.jsonl
    stored = json.loads(RunDir(tmp_path / "runs" / "a").probes.read_text())
    assert set(stored) == {"fewshot5", "top5"}
    written = RunDir(tmp_path / "runs" / "a").probes.stat().st_mtime_ns
    again = run_probes(tmp_path / "runs" / "a", ["fewshot5", "top5"])  # nothing missing: read, not recomputed
    assert again == stored and RunDir(tmp_path / "runs" / "a").probes.stat().st_mtime_ns == written


@pytest.mark.parametrize("cut", ["before the probe file", "while writing it"])
def test_a_sweep_killed_before_the_probes_are_stored_completes_them_without_retraining(tmp_path, cut):
    """The crash-safety invariant across the probe step: a finished run whose probes.json is missing (or only a
    temporary file of it exists) is probed by the next sweep, to the same numbers, and not trained again."""
    run_sweep([PROBED], tmp_path, progress=False, workers=1)
    run = RunDir(tmp_path / "runs" / "a")
    expected = json.loads(run.probes.read_text())
    metrics, checkpoint = run.metrics.read_bytes(), run.latest.stat().st_mtime_ns
    run.probes.unlink()
    if cut == "while writing it":
        (run.root / ".probes.json.x1.tmp").write_text('{"fewshot5": ')
    assert load_rows(tmp_path)[0]["fewshot5_error"] is None  # the row says what is missing
    rows = run_sweep([PROBED], tmp_path, progress=False, workers=1)
    assert json.loads(run.probes.read_text()) == expected
    assert rows[0]["fewshot5_error"] == expected["fewshot5"]["fewshot5_error"]
    assert run.metrics.read_bytes() == metrics and run.latest.stat().st_mtime_ns == checkpoint  # not retrained
    assert not [p for p in run.root.iterdir() if p.name.endswith(".tmp")]


def test_unknown_probes_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="unknown probe 'cka'"):
        run_sweep([dataclasses.replace(PROBED, probes=("cka",))], tmp_path / "s", progress=False)
    assert not (tmp_path / "s" / "runs").exists()


# ---- suppa1 (Mixer supp. A.1) ------------------------------------------------------------------------------

def _a1_rows(gain, seeds=range(5), noise=0.002):
    """Simulated rows: each modification's test error is the baseline's minus ``gain``, plus noise."""
    rng = np.random.default_rng(1)
    rows = []
    for seed in seeds:
        base = 0.12 + 0.01 * rng.normal()
        for model in ("MLP-Mixer", "untied", "grouped", "views", "pyramid"):
            error = base - (0.0 if model == "MLP-Mixer" else gain) + noise * rng.normal()
            rows.append({"model": model, "seed": seed, "run": f"{model}-s{seed}", "status": "finished",
                         "final_test_error": error, "fewshot5_error": error + 0.2, "top5_error": error / 10,
                         "wall_time": 100.0 if model != "pyramid" else 60.0, "params": 1000})
    return rows


def test_suppa1_decides_no_help_help_and_undecided(tmp_path):
    """The parts are decided on the rows; the preset as a whole is out of regime at medium scale (the supplement's
    claims are about ImageNet-scale Mixers), so it is neither supported nor contradicted."""
    preset = get_preset("suppa1")
    testable = lambda analysis: {v.decision for v in analysis.verdicts if v.decision != "not testable here"}
    no_help = preset.analyze(_a1_rows(0.0), tmp_path, "medium")
    assert no_help.supported is None and testable(no_help) == {"supported"}
    assert len(no_help.verdicts) == 4  # untied, grouping's 5-shot rule; views and pyramids not testable here
    assert no_help.numbers["pyramid: training time / baseline's"].startswith("0.60, 92 % interval [0.60, 0.60]")
    helped = preset.analyze(_a1_rows(0.03), tmp_path, "medium")  # 3 points better: a noticeable improvement
    assert helped.supported is None and testable(helped) == {"contradicted"}
    edge = preset.analyze(_a1_rows(0.01, noise=0.01), tmp_path, "medium")  # at the threshold, noisy: undecided
    assert testable(edge) == {"undecided"}


def test_suppa1_runs_are_the_supplements_modifications():
    specs = get_preset("suppa1").runs("medium", "fashion-mnist")
    assert len(specs) == 25 and all(s.probes == ("fewshot5", "top5") for s in specs)
    options = {s.meta["model"]: s.config.model.options for s in specs if s.meta["seed"] == 0}
    assert options["untied"]["untied_tokens"] is True and options["grouped"]["channel_groups"] == 4
    assert options["views"]["group_views"] is True and options["pyramid"]["token_schedule"][0] == 49
    assert options["pyramid"]["token_schedule"][-1] == 16 and {s.config.data.train_subset for s in specs} == {None}
