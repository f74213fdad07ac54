"""The figs1 preset (Fig. S.1, App. D.1): its runs at every scale, the paper-scale settings against the caption,
the verdict on constructed training curves, and the spectrum panels against pkmixer.theory.spectrum."""
import math

import pytest

from pkmixer.errors import ConfigError
from pkmixer.experiments import get_preset, run_sweep
from pkmixer.experiments.presets import figs1
from pkmixer.experiments.report import write_report
from pkmixer.models.registry import model_entry
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


# ---- the spectrum panels (no training) -------------------------------------------------------------------------


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
