"""The figs1 preset (Fig. S.1, App. D.1): its runs at every scale, the paper-scale settings against the caption,
the verdict on constructed training curves, and the spectrum panels against pkmixer.theory.spectrum."""
import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from pkmixer.errors import ConfigError
from pkmixer.experiments import get_preset, run_sweep
from pkmixer.experiments.presets import figs1
from pkmixer.experiments.report import write_report
from pkmixer.models.registry import model_entry
from pkmixer.theory.spectrum import alpha_scaling_singular_values, alpha_sweep
from pkmixer.theory.width import mixer_omega

PRESET = get_preset("figs1")
CHEAP = figs1._Spectrum(100.0, (0.0, 0.5, 1.0, 1.5), 1.5, 5)  # 5 draws decide a 90 % rule, in a second


@pytest.mark.parametrize("scale, count", [("paper", 60), ("medium", 52), ("small", 50), ("smoke", 6)])
def test_every_run_is_a_valid_config(scale, count):
    specs = PRESET.runs(scale, None)
    assert len(specs) == count and len({s.name for s in specs}) == count
    for spec in specs:
        cfg = spec.config
        assert set(cfg.model.options) <= set(model_entry(cfg.model.name).accepted()), spec.name
        assert cfg.run.seed == spec.meta["seed"] == spec.config.model.options["structure_seed"]
        assert spec.meta["density"] == pytest.approx(figs1.TRAINING[scale].omega ** -spec.meta["alpha"])
        if spec.meta["model"] == "SW-MLP":
            options = spec.config.model.options
            assert options["width"] == spec.meta["width"] and options["density"] == spec.meta["density"]
            expected = "masked" if scale == "paper" or options["density"] == 1 else "sparse"
            assert options["weight_format"] == expected and options["block"] == "fc"


def test_paper_settings_follow_the_caption():
    specs = PRESET.runs("paper", None)
    sw = [s for s in specs if s.meta["model"] == "SW-MLP"]
    assert {s.meta["omega"] for s in specs} == {2**16}  # "under fixed Ω = 2^16"
    for width in {s.meta["width"] for s in sw}:  # "five trials for each p with random seeds"
        assert sorted(s.meta["seed"] for s in sw if s.meta["width"] == width) == [0, 1, 2, 3, 4]
    for spec in sw:  # p·m² = Ω up to rounding m
        p, m = spec.meta["density"], spec.meta["width"]
        assert p * m * m == pytest.approx(2**16, rel=2e-3)
    sparse = sorted({s.meta["density"] for s in sw if s.meta["alpha"] >= 1 / 3 - 1e-9})
    assert len(sparse) >= 3 and max(s.meta["density"] for s in sw) == 1.0
    for spec in (s for s in specs if s.meta["model"] == "S-Mixer"):
        assert mixer_omega(spec.meta["C"], spec.meta["S"]) == pytest.approx(2**16, rel=0.03)
    cfg = sw[0].config  # App. C.4's recipe, as D.1 names none
    assert (cfg.data.name, cfg.optim.name, cfg.optim.lr, cfg.schedule.epochs) == ("cifar10", "sgd", 0.02, 200)
    s = figs1.SPECTRA["paper"]  # "a = 1.5, Ω = 10^3 and performed 50 trials"
    assert (s.omega, s.centre, s.draws) == (1e3, 1.5, 50) and s.centre in s.alphas
    assert all(s.centre in t.alphas for t in figs1.SPECTRA.values())


def test_bad_input_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown scale 'huge'"):
        PRESET.analyze([], None, "huge")
    with pytest.raises(ConfigError, match="at scale paper runs on"):
        PRESET.runs("paper", "fashion-mnist")
    assert figs1.scaling_index(2**12, 1 / 16) == pytest.approx(1 / 3)


def test_medium_is_the_small_models_on_all_of_fashion_mnist():
    specs, small = PRESET.runs("medium", None), PRESET.runs("small", None)
    trained, doubled = [s for s in specs if "doubles" not in s.meta], [s for s in specs if "doubles" in s.meta]
    assert len(trained) == 50 and sorted({s.meta["seed"] for s in trained}) == [0, 1, 2, 3, 4]
    for point in {(s.meta["model"], s.meta["width"]) for s in trained}:  # every point on the same five seeds
        assert sorted(s.meta["seed"] for s in trained if (s.meta["model"], s.meta["width"]) == point) == [0, 1, 2, 3, 4]
    assert {s.name: s.config.model for s in trained} == {s.name: s.config.model for s in small}
    cfg = trained[0].config
    assert (cfg.data.name, cfg.data.train_subset, cfg.data.test_subset, cfg.schedule.epochs) == \
        ("fashion-mnist", None, None, 10)
    # the convergence check: the ends of the verdict's region, p = Ω^(-1/3) (m = 256) and the sparsest (m = 2048)
    by_name = {s.name: s for s in specs}
    assert sorted(s.meta["width"] for s in doubled) == [256, 2048] and {s.meta["seed"] for s in doubled} == {0}
    for spec in doubled:
        base = by_name[spec.meta["doubles"]]
        assert spec.config.schedule.epochs == 20 and spec.config.model == base.config.model
    assert figs1.SPECTRA["medium"] == figs1.SPECTRA["paper"]  # 50 draws cost seconds


# ---- the verdict on constructed runs -------------------------------------------------------------------------


def _sweep(tmp_path, loss_of, seeds=5, diverged=(), scale="small"):
    """The rows of ``scale`` with ``seeds`` seeds, each run's curve ending at training loss
    ``loss_of(alpha) + 0.001 * seed`` (0.01 lower for an epoch-doubling run, its test error 0.001 lower); the runs
    named in ``diverged`` have diverged."""
    rows = []
    for spec in PRESET.with_seeds(seeds).runs(scale, None):
        alpha, seed = spec.meta["alpha"], spec.meta["seed"]
        loss = loss_of(alpha) + 0.001 * seed - 0.01 * ("doubles" in spec.meta)
        status = "diverged" if spec.name in diverged else "finished"
        curve = [{"epoch": e + 1, "train_loss": loss + 0.5 * (2 - e), "test_loss": loss, "test_error": 0.1}
                 for e in range(3)]
        rows.append({**spec.meta, "run": spec.name, "status": status, "final_test_error": 0.1 + loss / 10,
                     "final_train_loss": curve[-1]["train_loss"], "curve": curve})
    return rows


def _decisions(analysis):
    return [v.decision for v in analysis.verdicts]


def test_verdict_supported_when_the_loss_rises_beyond_the_optimum(tmp_path, monkeypatch):
    monkeypatch.setitem(figs1.SPECTRA, "small", CHEAP)
    rows = _sweep(tmp_path, lambda a: 0.3 + abs(a - 1 / 3), diverged={"swmlp-m2048-s4"})
    analysis = PRESET.analyze(rows, tmp_path, "small")
    assert analysis.supported is True and _decisions(analysis) == ["supported"] * 3
    assert analysis.verdicts[0].estimate == 1.0 and analysis.verdicts[0].seeds == 5
    table = {(t["model"], t["width"]): t for t in analysis.tables["figs1"]}
    assert table[("SW-MLP", 2048)]["diverged"] == 1 and table[("SW-MLP", 2048)]["seeds"] == 4
    assert table[("SW-MLP", 256)]["train_loss_mean"] == pytest.approx(0.3 + 0.002)  # the last epoch's loss
    assert table[("SW-MLP", 256)]["alpha"] == pytest.approx(1 / 3)
    assert analysis.figures["figs1"] and isinstance(analysis.figures["figs1"], Figure)


def test_verdict_contradicted_when_the_loss_falls_with_sparsity(tmp_path, monkeypatch):
    monkeypatch.setitem(figs1.SPECTRA, "small", CHEAP)
    analysis = PRESET.analyze(_sweep(tmp_path, lambda a: 1.0 - a), tmp_path, "small")
    assert analysis.supported is False and _decisions(analysis) == ["contradicted", "supported", "supported"]


def test_medium_verdict_leaves_the_doubling_check_out(tmp_path, monkeypatch):
    monkeypatch.setitem(figs1.SPECTRA, "medium", CHEAP)
    rows = _sweep(tmp_path, lambda a: 0.3 + abs(a - 1 / 3), scale="medium")
    assert len(rows) == 52
    plain = PRESET.analyze([r for r in rows if not r.get("doubles")], tmp_path, "medium")
    analysis = PRESET.analyze(rows, tmp_path, "medium")
    assert analysis.verdicts == plain.verdicts and analysis.supported is True
    assert analysis.tables["figs1"] == plain.tables["figs1"] and "figs1_doubling" not in plain.tables
    check = {c["width"]: c for c in analysis.tables["figs1_doubling"]}
    assert sorted(check) == [256, 2048] and all(c["converged"] for c in check.values())
    assert check[2048]["train_loss"] == pytest.approx(0.3 + 10 / 12 - 1 / 3)  # seed 0, α = 10/12
    assert check[2048]["train_loss_doubled"] == pytest.approx(check[2048]["train_loss"] - 0.01)
    assert "less than 0.5 points" in analysis.verdict and "epoch doubling" in analysis.numbers
    assert "swmlp-m2048-s0: 0.8000 -> 0.7900" in analysis.numbers["epoch doubling: final training loss"]


def test_verdict_undecided_with_two_seeds(tmp_path, monkeypatch):
    monkeypatch.setitem(figs1.SPECTRA, "small", CHEAP)
    analysis = PRESET.analyze(_sweep(tmp_path, lambda a: 0.3 + abs(a - 1 / 3), seeds=2), tmp_path, "small")
    assert analysis.supported is None and analysis.verdicts[0].decision == "undecided"
    assert "2 seeds: a 90 % rule needs 5" in analysis.verdict


# ---- the spectrum panels (no training) -------------------------------------------------------------------------


def test_centre_and_right_panels_are_the_theory_modules(tmp_path):
    s = figs1.SPECTRA["smoke"]
    analysis = PRESET.analyze([], tmp_path, "smoke")
    right = analysis.tables["figs1_spectrum"]
    direct = alpha_sweep(s.omega, s.alphas, seeds=s.draws)
    assert [r["lambda_max_mean"] for r in right] == [r["lambda_max_mean"] for r in direct]
    assert [(r["m"], r["p"]) for r in right] == [(r["m"], r["p"]) for r in direct]
    assert np.all(np.diff([r["lambda_max_mean"] for r in right]) > 0)  # grows monotonically with α
    pooled = np.concatenate([alpha_scaling_singular_values(s.omega, s.centre, seed=k) for k in range(s.draws)])
    centre = analysis.tables["figs1_histogram"]
    assert sum(h["density"] * (h["high"] - h["low"]) for h in centre) == pytest.approx(1.0)
    assert centre[-1]["high"] == pytest.approx(pooled.max())
    key = next(k for k in analysis.numbers if "share of zero singular values" in k)
    assert analysis.numbers[key] == pytest.approx(np.mean(pooled < figs1.ZERO), abs=1e-4)
    assert analysis.numbers[key] > 0.5  # "peaked around zero": most rows of Z keep no weight at p = Ω^-1.5
    assert [v.decision for v in analysis.verdicts] == ["undecided"] * 3 and analysis.supported is None


def test_monotone_rule_sees_a_dip(tmp_path, monkeypatch):
    """The monotonicity part is contradicted when one step of the mean λ_max goes down in every draw."""
    tops = np.tile([2.0, 2.5, 2.4, 3.0], (5, 1)) + np.linspace(0, 0.01, 5)[:, None]
    monkeypatch.setitem(figs1.SPECTRA, "small", CHEAP)
    monkeypatch.setattr(figs1, "_spectrum", lambda s: (tops, np.linspace(0.0, 3.0, 50)))
    analysis = PRESET.analyze([], tmp_path, "small")
    assert _decisions(analysis)[1:] == ["supported", "contradicted"]
    assert analysis.verdicts[2].estimate == pytest.approx(-0.1) and analysis.supported is False


# ---- the smoke sweep ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_sweep_runs_and_reports(tmp_path):
    specs = PRESET.runs("smoke", None)
    rows = run_sweep(specs, tmp_path, workers=1, threads=1, progress=False)
    assert [r["status"] for r in rows] == ["finished"] * len(specs)
    analysis = PRESET.analyze(rows, tmp_path, "smoke")
    assert all(t["train_loss_mean"] is not None and math.isfinite(t["train_loss_mean"])
               for t in analysis.tables["figs1"])
    assert analysis.supported is None and "Smoke scale" in analysis.verdict
    paths = write_report(analysis, tmp_path, preset=PRESET, scale="smoke", dataset="digits",
                         command="pkmixer reproduce figs1 --scale smoke", rows=rows)
    assert (tmp_path / "report" / paths["report"].split("/")[-1]).stat().st_size > 0
