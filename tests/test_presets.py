"""The figure and table presets of Hayase & Karakida other than Fig. 5: every smoke scale through the sweep and the
report, the paper-scale settings against App. C / Table S.2, the data-set checks, the analysis-only presets
against closed forms, and each verdict on constructed results (one that supports the claim, one that does not)."""
import json
import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from pkmixer.analysis.cost import fixed_omega_comparison
from pkmixer.analysis.visualize import sparsity_masks
from pkmixer.errors import ConfigError
from pkmixer.experiments import get_preset, run_sweep
from pkmixer.experiments import sweep as sweep_module
from pkmixer.experiments.presets import fig5
from pkmixer.experiments.preset import list_presets
from pkmixer.experiments.report import write_report
from pkmixer.experiments.presets import fig6 as fig6_module
from pkmixer.experiments.presets.figs9 import block_fraction
from pkmixer.train.config import TrainConfig
from pkmixer.experiments.presets import tables3 as tables3_module
from pkmixer.experiments.presets.tables3 import SETTINGS
from pkmixer.models.registry import model_entry
from pkmixer.theory.spectrum import c_gamma, lambda_max_sweep
from pkmixer.theory.width import gamma_at_width, mixer_omega, swmlp_width, tokens_for_channels
from pkmixer.train.config import build_config

TRAINED = ["fig2", "fig2d", "fig4", "fig6", "fig7", "table1", "figs2", "figs3", "figs4", "figs5", "figs6", "figs7",
           "figs8"]
ANALYSIS_ONLY = ["fig3", "figs9", "tables3"]


# ---- smoke scale: the sweep, the analysis and the report ---------------------------------------------------

@pytest.mark.slow  # every preset's smoke sweep; tests/test_reproduce.py runs fig5's in the default tier
@pytest.mark.parametrize("name", TRAINED + ANALYSIS_ONLY)
def test_smoke_scale_runs_and_reports(name, tmp_path):
    preset = get_preset(name)
    specs = preset.runs("smoke", None)
    assert (len(specs) == 0) == (name in ANALYSIS_ONLY)
    rows = run_sweep(specs, tmp_path, workers=1, threads=1, progress=False)
    assert [r["status"] for r in rows] == ["finished"] * len(specs)
    analysis = preset.analyze(rows, tmp_path, "smoke")
    assert analysis.figures and all(isinstance(f, Figure) for f in analysis.figures.values())
    assert analysis.tables and all(analysis.tables.values())
    assert analysis.numbers and analysis.verdict
    if name in TRAINED:
        assert analysis.supported is None and "Smoke scale" in analysis.verdict
    paths = write_report(analysis, tmp_path, preset=preset, scale="smoke", dataset=preset.default_dataset("smoke"),
                         command=f"pkmixer reproduce {name} --scale smoke", rows=rows)
    for path in [paths["report"], *paths["figures"], *paths["tables"]]:
        assert (tmp_path / "report" / path.split("/")[-1]).stat().st_size > 0


# ---- every registered preset: one style ------------------------------------------------------

@pytest.mark.parametrize("preset", list_presets(), ids=lambda p: p.name)
def test_every_preset_builds_its_smoke_runs_and_configs(preset):
    """Default tier, seconds: each registered preset (a new one included) builds its smoke runs, each a typed
    TrainConfig (one config source) that survives sweep.json and config.yaml: as_dict then build_config gives it
    back. Its data-set tables agree: every scale's default is one it accepts, and what a scale accepts is among
    ``datasets``."""
    specs = preset.runs("smoke", None)
    assert len({s.name for s in specs}) == len(specs)
    for spec in specs:
        cfg = spec.config
        assert isinstance(cfg, TrainConfig) and build_config(cfg.as_dict()) == cfg, spec.name
        assert sweep_module._normalized(build_config(cfg.as_dict())) == sweep_module._normalized(cfg), spec.name
    for scale in preset.scales:
        default = preset.default_dataset(scale)
        assert (default is None) == (not preset.datasets)
        if default is not None:
            assert default in preset.allowed_datasets.get(scale, preset.datasets)
        assert set(preset.allowed_datasets.get(scale, ())) <= set(preset.datasets)


# ---- data sets ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TRAINED)
def test_dataset_override_and_refusals(name):
    preset = get_preset(name)
    specs = preset.runs("small", "digits")
    assert {s.config.data.name for s in specs} == {"digits"}
    assert {s.config.model.options["img_size"] for s in specs} == {8}
    with pytest.raises(ConfigError, match="at scale paper runs on"):
        preset.runs("paper", "fashion-mnist" if name != "fig2d" else "digits")
    with pytest.raises(ConfigError, match="at scale smoke runs on digits"):
        preset.runs("smoke", "fashion-mnist")
    with pytest.raises(ConfigError, match="unknown data set"):
        preset.runs("small", "svhn")


@pytest.mark.parametrize("name", ANALYSIS_ONLY)
def test_analysis_only_presets_take_no_data_set(name):
    preset = get_preset(name)
    assert preset.runs("paper", None) == []
    with pytest.raises(ConfigError, match="uses no data set"):
        preset.runs("paper", "cifar10")


@pytest.mark.parametrize("name", TRAINED)
@pytest.mark.parametrize("scale", ["paper", "small", "smoke"])
def test_every_run_is_a_valid_config_with_known_model_options(name, scale):
    preset = get_preset(name)
    specs = preset.runs(scale, None)
    assert len({s.name for s in specs}) == len(specs)
    for spec in specs:
        cfg = spec.config
        assert set(cfg.model.options) <= set(model_entry(cfg.model.name).accepted()), spec.name
        assert cfg.run.seed == spec.meta["seed"]
        if "structure_seed" in spec.config.model.options:
            assert spec.config.model.options["structure_seed"] == spec.meta["seed"]


# ---- paper scale: App. C and Table S.2 -----------------------------------------------------------------------

def _by(specs, **meta):
    return [s for s in specs if all(s.meta.get(k) == v for k, v in meta.items())]


def _pairs(specs, model):
    return sorted({(s.meta["C"], s.meta["S"]) for s in specs if s.meta["model"] == model})


def _seeds(specs):
    return sorted({s.meta["seed"] for s in specs})


def test_fig2_paper_settings():
    specs = get_preset("fig2").runs("paper", None)
    mixers, sws = _by(specs, model="MLP-Mixer"), _by(specs, model="SW-MLP")
    assert sorted({s.meta["size"] for s in mixers}) == [32, 64] and _seeds(specs) == [0, 1, 2]
    assert sorted({s.meta["density"] for s in sws}) == [2.0 ** -n for n in range(10, -1, -1)]
    for s in mixers:
        assert s.config.model.options["depth"] == 3 and s.config.model.options["mlp_ratio"] == 2.0
    for s in sws:
        assert s.config.model.options["depth"] == 6 and s.config.model.options["block"] == "mlp"
        assert s.config.model.options["width"] == s.meta["size"] ** 2 and s.config.model.options["mlp_ratio"] == 2.0
    assert _by(specs, size=32, model="MLP-Mixer")[0].config.model.options["num_tokens"] == 32
    assert _by(specs, size=64, model="MLP-Mixer")[0].config.model.options["num_tokens"] is None  # S = S0 = 64
    cfg = specs[0].config
    assert (cfg.data.name, cfg.data.batch_size, cfg.data.auto_augment) == ("cifar10", 128, "cifar10")
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.betas[0], cfg.schedule.epochs) == ("adamw", 0.01, 0.9, 600)

    d = get_preset("fig2d").runs("paper", None)
    assert sorted(s.config.model.name for s in d if s.meta["seed"] == 0) == ["shallow_kronecker_28",
                                                                                    "shallow_monarch_28"]
    cfg = d[0].config
    assert (cfg.data.name, cfg.optim.name, cfg.optim.lr, cfg.schedule.epochs) == ("mnist", "adamw", 0.01, 200)
    assert _seeds(d) == [0, 1, 2, 3, 4]


def test_fig4_paper_settings_are_app_c2():
    specs = get_preset("fig4").runs("paper", None)
    paper_s = [360, 252, 203, 173, 152, 136, 124, 113, 104, 96, 89, 83, 64]  # App. C.2
    assert _pairs(specs, "MLP-Mixer") == list(zip([4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 64], paper_s))
    assert _seeds(specs) == [0, 1, 2, 3]
    for s in _by(specs, model="SW-MLP"):
        C, S = s.meta["C"], s.meta["S"]
        assert s.config.model.options["width"] == C * S and s.config.model.options["density"] == (1 / C + 1 / S) / 2
        assert s.config.model.options["depth"] == 6 and s.config.model.options["mlp_ratio"] == 2.0
    for s in _by(specs, model="MLP-Mixer"):
        assert s.config.model.options["depth"] == 3
        assert abs(mixer_omega(s.meta["C"], s.meta["S"], 2.0) / 2**19 - 1) < 0.02
    cfg = specs[0].config
    assert (cfg.optim.name, cfg.optim.lr, cfg.schedule.epochs, cfg.data.batch_size) == ("adamw", 0.01, 600, 128)


def test_fig6_paper_settings_follow_table_s2():
    preset = get_preset("fig6")
    c10 = preset.runs("paper", "cifar10")
    omega21 = [(16, 504), (32, 346), (64, 226), (226, 64), (346, 32), (504, 16)]  # App. C.4
    assert _pairs(c10, "S-Mixer") == _pairs(c10, "RP S-Mixer") == omega21
    assert _seeds(c10) == [0, 1, 2, 3, 4]
    cfg = c10[0].config
    assert (cfg.model.options["depth"], cfg.optim.name, cfg.optim.lr, cfg.data.batch_size, cfg.schedule.epochs) == \
        (12, "adamw", 0.02, 1024, 2000)
    c100 = preset.runs("paper", "cifar100")[0].config
    assert (c100.optim.name, c100.optim.lr, c100.optim.nesterov, c100.data.batch_size, c100.schedule.epochs) == \
        ("sgd", 0.1, True, 128, 600)
    stl = preset.runs("paper", "stl10")
    assert _pairs(stl, "S-Mixer") == [(16, 173), (32, 113), (48, 83), (83, 48), (113, 32), (173, 16)]
    assert _seeds(stl) == [0, 1, 2]
    cfg = stl[0].config
    assert (cfg.optim.lr, cfg.schedule.epochs, cfg.data.resize, cfg.model.options["img_size"]) == (0.1, 2000, 32, 32)

    imagenet = preset.runs("paper", "imagenet")
    rows = sorted({(s.meta["patch"], s.meta["C"], s.meta["S"]) for s in imagenet})
    assert [p for p, _, _ in rows] == [7, 8, 14, 16, 28, 32] and all(C == 3 * p * p for p, C, _ in rows)
    assert (16, 768, 196) in rows  # the Mixer-B/16 baseline defines Ω
    assert all(abs(mixer_omega(C, S, 4.0) / fig6_module.IMAGENET_OMEGA - 1) < 0.1 for _, C, S in rows)
    cfg = imagenet[0].config
    assert (cfg.model.options["depth"], cfg.model.options["mlp_ratio"], cfg.optim.lr, cfg.data.batch_size,
            cfg.schedule.epochs, cfg.schedule.warmup_epochs, cfg.schedule.min_lr) == (8, 4.0, 1e-3, 4096, 300, 5, 1e-5)
    assert (cfg.data.mixup, cfg.data.cutmix, cfg.data.label_smoothing, cfg.data.random_erasing) == (0.8, 1.0, 0.1, 0.25)


def test_fig7_paper_settings_are_app_c6():
    specs = get_preset("fig7").runs("paper", None)
    assert sorted({s.meta["depth"] for s in specs}) == [4, 8, 12, 16, 20] and _seeds(specs) == [0, 1, 2]
    assert {(s.config.model.options["embed_dim"], s.config.model.options["num_tokens"]) for s in specs} == {(128, 128)}
    cfg = specs[0].config
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.momentum, cfg.data.batch_size, cfg.schedule.epochs,
            cfg.data.crop_padding, cfg.data.hflip) == ("sgd", 0.02, 0.9, 128, 200, 4, True)


def test_table1_paper_settings_are_app_c3():
    preset = get_preset("table1")
    for dataset, lrs in (("cifar10", {"Mixer-SS/8": 0.04, "Mixer-SS-W": 0.04}),
                         ("cifar100", {"Mixer-SS/8": 0.06, "Mixer-SS-W": 0.04})):
        specs = preset.runs("paper", dataset)
        described = {s.meta["model"]: (s.meta["P"], s.meta["S"], s.meta["C"], s.meta["gamma"], s.meta["blocks"])
                     for s in specs}
        assert described == {"Mixer-SS/8": (8, 16, 986, 4.0, 2), "Mixer-SS-W": (4, 64, 487, 4.0, 2)}
        assert {s.meta["model"]: s.config.optim.lr for s in specs} == lrs
        cfg = specs[0].config
        assert (cfg.optim.name, cfg.data.batch_size, cfg.schedule.epochs, cfg.data.auto_augment) == \
            ("adamw", 1024, 4000, "cifar10")
        assert _seeds(specs) == [0, 1, 2]
    imagenet = preset.runs("paper", "imagenet")
    described = {s.meta["model"]: (s.meta["P"], s.meta["S"], s.meta["C"], s.meta["blocks"]) for s in imagenet}
    assert described == {"Mixer-B/16": (16, 196, 768, 12), "Mixer-B-W": (14, 256, 588, 8)}
    assert {s.meta["max_width"] for s in imagenet if s.meta["model"] == "Mixer-B/16"} == {196 * 3072}
    assert imagenet[0].config.model.options["norm_eps"] == 1e-5


def test_figs2_paper_settings_are_app_d2():
    specs = get_preset("figs2").runs("paper", None)
    for omega in (2**18, 2**20):
        mixers = _by(specs, model="MLP-Mixer", omega=omega)
        assert sorted({s.meta["C"] for s in mixers}) == [16, 32, 48, 64, 83, 113, 173]
        assert all(s.meta["S"] == tokens_for_channels(omega, s.meta["C"], 4.0) for s in mixers)
        widths = sorted({s.meta["width"] for s in _by(specs, model="SW-MLP", omega=omega)})
        assert widths == sorted(swmlp_width(omega, p, 4.0) for p in (0.1, 0.3, 0.5, 0.7, 0.9))
    assert _by(specs, model="MLP-Mixer", omega=2**18, C=16)[0].meta["S"] == 83
    assert {s.config.model.options["depth"] for s in specs} == {8} and {s.config.optim.lr for s in specs} == {0.1}
    assert {s.config.model.options["mlp_ratio"] for s in specs} == {4.0}


def test_figs3_paper_settings_keep_m_fixed():
    specs = get_preset("figs3").runs("paper", None)
    assert {s.meta["C"] * s.meta["S"] for s in specs} == {4096}
    assert sorted({s.meta["C"] for s in specs}) == [16, 32, 64, 128, 256]
    peak = _by(specs, omega=2**20, C=64)[0].config.model.options["mlp_ratio"]
    assert peak == pytest.approx(4.0) == pytest.approx(gamma_at_width(2**20, 4096, 64))  # S.46: Ω/(m√m)
    assert _by(specs, omega=2**20, C=16)[0].meta["gamma"] == _by(specs, omega=2**20, C=256)[0].meta["gamma"]


def test_figs4_paper_settings_are_app_d5():
    specs = get_preset("figs4").runs("paper", None)
    variants = {json.dumps(s.config.model.options["rp_blocks"]) for s in specs}
    assert variants == {"null", "[0]", "[1]", "[2]", "[3]", '"all"'}
    assert {(s.config.model.options["depth"], s.config.model.options["embed_dim"]) for s in specs} == {(4, 64)}
    cfg = specs[0].config
    assert (cfg.optim.lr, cfg.schedule.epochs, cfg.model.options["num_tokens"]) == (0.02, 200, None)


def test_figs5_paper_settings_are_app_d6():
    preset = get_preset("figs5")
    cifar = preset.runs("paper", "cifar10")
    assert sorted({s.meta["patch"] for s in cifar}) == [1, 2, 4, 8, 16, 32] and _seeds(cifar) == [0, 1, 2]
    assert {(s.config.model.options["embed_dim"], s.config.model.options["num_tokens"], s.config.model.options["depth"])
            for s in cifar} == {(64, 64, 4)}
    assert _by(cifar, patch=4)[0].meta["C0"] == 48
    stl = preset.runs("paper", "stl10")
    assert sorted({s.meta["patch"] for s in stl}) == [1, 3, 6, 10, 18, 30] and _seeds(stl) == [0, 1, 2, 3, 4]
    cfg = stl[0].config
    assert (cfg.model.options["img_size"], cfg.data.resize, cfg.schedule.epochs, cfg.optim.lr) == (90, 90, 400, 0.1)
    assert _by(stl, patch=6)[0].meta["C0"] == 108


def test_figs6_figs7_figs8_paper_settings_are_app_d7():
    s6, s7 = get_preset("figs6").runs("paper", None), get_preset("figs7").runs("paper", None)
    pairs = [(16, 173), (32, 113), (64, 64), (114, 32), (173, 16)]
    assert _pairs(s6, "S-Mixer") == _pairs(s6, "RP S-Mixer") == _pairs(s7, "MLP-Mixer") == pairs
    assert _seeds(s6) == _seeds(s7) == [0, 1, 2, 3, 4]
    c6, c7 = s6[0].config, s7[0].config
    assert (c6.optim.lr, c6.schedule.epochs, c6.model.options["depth"], c6.data.batch_size) == (0.1, 600, 8, 128)
    assert (c7.optim.lr, c7.data.batch_size, c7.data.auto_augment, c7.model.options["mlp_ratio"]) == \
        (0.1, 256, "cifar10", 4.0)
    s8 = get_preset("figs8").runs("paper", None)
    c8 = s8[0].config
    assert sorted(s.config.model.name for s in s8 if s.meta["seed"] == 0) == ["mixer_c64p4_32", "rp_mixer_c64p4_32"]
    assert (c8.optim.name, c8.optim.lr, c8.data.batch_size, c8.schedule.epochs, c8.data.auto_augment) == \
        ("adamw", 0.01, 256, 600, "cifar10")
    assert _seeds(s8) == [0, 1, 2, 3, 4]


def test_seeds_option_overrides_the_paper_counts():
    assert _seeds(get_preset("fig6").with_seeds(2).runs("paper", "cifar10")) == [0, 1]


# ---- analysis-only presets against closed forms ---------------------------------------------------------------

def _stub_runtime(scale):
    """The runtime column without timing (the smoke test and test_tables3_runtime_is_measured time for real)."""
    return [{"setting": "CIFAR", "shape": "S=64 C=64 L=3 γ=2", "model": f"{name} S=64 C=64", "device": "stub",
             "step_s": step, "step_ratio": step, "paper_ratio": None} for name, step in (("MLP-Mixer", 1.0),
                                                                                        ("RP-Mixer", 1.1))]


def test_tables3_matches_the_cost_module_and_closed_forms(monkeypatch):
    monkeypatch.setattr(tables3_module, "runtime_rows", _stub_runtime)
    analysis = get_preset("tables3").analyze([], None, "paper")
    table = analysis.tables["tables3"]
    for setting in ("CIFAR", "ImageNet"):
        rows = [r for r in table if r["setting"] == setting]
        reports = fixed_omega_comparison(**SETTINGS[setting])
        assert [r["macs"] for r in rows] == [r.macs for r in reports]
        assert [r["train_state_bytes"] for r in rows] == [r.train_state_bytes for r in reports]
        assert rows[0]["macs"] == rows[1]["macs"]  # RP-Mixer = MLP-Mixer
    cifar = [r for r in table if r["setting"] == "CIFAR"]
    # CIFAR: S = S0 = C = 64, L = 3, γ = 2: stem S0·C0·C + 4LΩ (each block: two MLPs of two Dense) + head
    assert cifar[0]["macs"] == 64 * 48 * 64 + 4 * 3 * 2**19 + 64 * 10
    # the dense-masked SW-MLP (2L blocks, App. C.1) multiplies full (m × γm) matrices: 4Lγm² + stem + head
    assert cifar[3]["macs"] == 2 * 6 * 2 * 4096**2 + 64 * 48 * 64 + 4096 * 10
    imagenet = [r for r in table if r["setting"] == "ImageNet"]
    assert imagenet[3]["train_state_ratio"] > 1e4 and analysis.supported is True
    assert analysis.numbers["runtime RP-Mixer / MLP-Mixer (measured: stub, batch 128, fp32 AdamW)"] == 1.1


def test_tables3_sets_the_printed_values_beside_their_convention(monkeypatch):
    monkeypatch.setattr(tables3_module, "runtime_rows", _stub_runtime)
    paper = get_preset("tables3").analyze([], None, "paper").tables["tables3_paper"]
    assert len(paper) == 12
    verdicts = {(r["setting"], r["model"], r["quantity"]): r["explanation"].split(":")[0] for r in paper}
    # exact: every SW-MLP value and the CIFAR Mixers' FLOPs; the ImageNet Mixers only at γ = 1
    assert [k for k, v in verdicts.items() if v == "reproduced"] == [
        ("CIFAR", "SW-MLP", "memory"), ("CIFAR", "SW-MLP", "FLOPs"), ("CIFAR", "RP-Mixer", "FLOPs"),
        ("CIFAR", "MLP-Mixer", "FLOPs"), ("ImageNet", "SW-MLP", "memory"), ("ImageNet", "SW-MLP", "FLOPs")]
    assert {k for k, v in verdicts.items() if v.startswith("reproduced only with γ = 1")} == {
        ("ImageNet", m, q) for m in ("RP-Mixer", "MLP-Mixer") for q in ("memory", "FLOPs")}
    assert verdicts[("CIFAR", "MLP-Mixer", "memory")].startswith("10 ×")  # 3.93 MB printed, 0.393 MB counted
    assert verdicts[("CIFAR", "RP-Mixer", "memory")] == "not reproduced"
    by = {(r["setting"], r["model"], r["quantity"]): r for r in paper}
    assert by[("CIFAR", "SW-MLP", "FLOPs")]["paper_convention"] == 2 * 12 * 4096 * 8192  # 805 M
    assert by[("ImageNet", "SW-MLP", "memory")]["paper_convention"] == 8 * 32 * 150_528 * 602_112  # 23.2 TB


def test_tables3_runtime_is_measured():
    rows = tables3_module.runtime_rows("smoke")
    assert [tables3_module.family(r["model"]) for r in rows] == ["MLP-Mixer", "RP-Mixer", "SW-MLP[sparse]",
                                                                 "SW-MLP[masked]"]
    assert rows[0]["step_ratio"] == 1.0 and all(r["step_s"] > 0 and r["repeats"] == 3 for r in rows)
    assert all(r["batch_size"] == 128 and r["device"] for r in rows)
    assert all(len(r["times_s"].split()) == 3 for r in rows)


def test_figs9_counts_match_the_kronecker_structure():
    analysis = get_preset("figs9").analyze([], None, "paper")
    by = {r["weight"]: r for r in analysis.tables["figs9"]}
    assert by["Mixer"]["block_fraction_mean"] == 1.0 and by["Mixer"]["density"] == 1 / 8
    assert by["RP-Mixer"]["density"] == 1 / 8  # C·S² non-zeros of m² = (SC)²
    assert by["RP-Mixer"]["nonzeros_per_row_min"] == by["RP-Mixer"]["nonzeros_per_row_max"] == 8
    assert abs(by["SW-MLP"]["density"] - 1 / 8) < 0.02
    assert abs(by["RP-Mixer"]["block_fraction_mean"] - 1 / 8) < 0.05
    assert analysis.supported is True
    masks = list(sparsity_masks(8, 8, 0).values())
    assert block_fraction(masks[1], 8) == 1.0 and block_fraction(np.eye(4, dtype=bool)[::-1], 2) == 0.0


def test_fig3_is_eq_15s_line():
    analysis = get_preset("fig3").analyze([], None, "paper")
    curve = analysis.tables["fig3"]
    assert analysis.supported is True and not analysis.verdicts  # exact arithmetic: no seeds, no interval
    assert curve[0]["C"] == 1.0 and curve[-1]["S"] == pytest.approx(1.0) and curve[0]["m"] == curve[-1]["m"]
    peak = max(curve, key=lambda r: r["m"])
    assert peak["C"] == pytest.approx(1e8 ** (1 / 3)) and peak["S"] == pytest.approx(peak["C"])
    assert peak["m"] == pytest.approx(1e8 ** (2 / 3)) and peak is min(curve, key=lambda r: r["p"])
    for row in curve[::37]:
        assert (row["C"] * row["S"] ** 2 + row["C"] ** 2 * row["S"]) / 2 == \
            pytest.approx(1e8)  # Eq. 14 at γ = 1
        assert row["p"] == pytest.approx(1e8 / row["m"] ** 2)
    assert len(get_preset("fig3").analyze([], None, "smoke").tables["fig3"]) < len(curve)


def test_fig4_spectrum_is_the_theory_modules(tmp_path):
    analysis = get_preset("fig4").analyze([], tmp_path, "smoke")
    table = analysis.tables["fig4_spectrum"]
    widths = [r["m"] for r in table]
    direct = lambda_max_sweep(2**9, 2.0, widths, seeds=3)
    assert [r["lambda_max_mean"] for r in table] == [r["lambda_max_mean"] for r in direct]
    assert table[0]["c_gamma"] == c_gamma(2.0) == 1 + math.sqrt(2)


# ---- verdicts on constructed results -------------------------------------------------------------------------

FIVE = range(5)  # a verdict's 90 % rule needs 5 seeds (pkmixer.experiments.stats.seeds_needed)


def _rows(points, seeds=(0, 1, 2), jitter=0.002):
    """Finished result rows: each point's error, ± jitter over seeds."""
    rows = []
    for i, (meta, error) in enumerate(points):
        for seed in seeds:
            rows.append({**meta, "seed": seed, "run": f"r{i}-s{seed}", "status": "finished",
                         "final_test_error": error + jitter * (seed - 1)})
    return rows


def _fig6_rows(best_at, seeds=FIVE):
    pairs = [(8, 87), (16, 56), (32, 32), (56, 16), (87, 8)]
    points = []
    for family in ("S-Mixer", "RP S-Mixer"):
        for C, S in pairs:
            error = 0.1 + 0.02 * abs(math.log2((C / S) / (best_at[0] / best_at[1])))
            points.append(({"model": family, "omega": 2**15, "gamma": 1.0, "C": C, "S": S, "width": C * S}, error))
    return _rows(points, seeds)


def _decisions(analysis):
    return [v.decision for v in analysis.verdicts]


def _fig5_rows(sign, seeds=FIVE, noise=0.0):
    rng = np.random.default_rng(0)
    rows = []
    for family in ("S-Mixer", "RP S-Mixer", "SW-MLP"):
        for i, m in enumerate((181, 362, 724, 1024)):
            for seed in seeds:
                sw = family == "SW-MLP"
                rows.append({"model": family, "omega": 2**15, "C": None if sw else 2**(i + 2), "S": None if sw else 32,
                             "width": m, "density": 4.0**-i if sw else None, "seed": seed, "run": f"{family}-{m}-s{seed}",
                             "status": "finished", "final_test_error": 0.3 + sign * 0.02 * i + noise * rng.normal()})
    return rows


def _medium(name, seeds=5):
    """A preset's medium runs on Fashion-MNIST, split into the runs the verdicts read and fig5's epoch-doubling
    check; both checked against the earlier medium scale: the whole training and test sets, 10 epochs, ``seeds``
    seeds paired across every point, valid model options, each doubled run its seed-0 original at 20 epochs."""
    specs = get_preset(name).runs("medium", "fashion-mnist")
    main = [s for s in specs if not s.meta.get("doubles")]
    doubled = [s for s in specs if s.meta.get("doubles")]
    assert {(s.config.data.name, s.config.data.train_subset, s.config.data.test_subset) for s in specs} == \
        {("fashion-mnist", None, None)}
    assert {s.config.schedule.epochs for s in main} == {10} and len({s.name for s in specs}) == len(specs)
    points: dict[str, set] = {}
    for spec in main:
        points.setdefault(spec.name.rsplit("-s", 1)[0], set()).add(spec.meta["seed"])
        assert set(spec.config.model.options) <= set(model_entry(spec.config.model.name).accepted()), spec.name
    assert all(found == set(range(seeds)) for found in points.values())
    by_name = {s.name: s for s in main}
    for spec in doubled:
        base = by_name[spec.meta["doubles"]]
        assert spec.config.schedule.epochs == 20 and spec.config.model == base.config.model
        assert spec.meta["seed"] == 0 and spec.name == base.name + "-2x"
    return main, doubled


def _span(specs, key, **meta):
    values = [s.meta[key] for s in _by(specs, **meta)]
    return max(values) / min(values)


def _models(specs):
    """The model options of a sweep's seed-0 runs."""
    return {json.dumps(s.config.model.options, sort_keys=True) for s in specs if s.meta["seed"] == 0}


def _with_doubled(rows, run, change):
    """``rows`` and the epoch-doubling row of ``run``, ``change`` off its error."""
    base = next(r for r in rows if r["run"] == run)
    return rows + [{**base, "run": run + "-2x", "doubles": run, "final_test_error": base["final_test_error"] + change}]


def test_table1_verdict(tmp_path):
    def rows(wide_error):
        base = {"model": "Mixer-SS/7", "P": 7, "S": 16, "C": 128, "gamma": 4.0, "blocks": 2, "max_width": 8192,
                "omega": 1.0, "connections": 8.0}
        wide = {**base, "model": "Mixer-SS-W/4", "P": 4, "S": 49, "C": 57, "max_width": 11172}
        return _rows([(base, 0.15), (wide, wide_error)], FIVE)

    preset = get_preset("table1")
    assert preset.analyze(rows(0.12), tmp_path, "small").supported is True
    assert preset.analyze(rows(0.18), tmp_path, "small").supported is False


def test_figs4_verdict(tmp_path):
    def rows(costliest):
        points = [({"model": "S-Mixer", "rp_block": None}, 0.20), ({"model": "RP S-Mixer", "rp_block": None}, 0.25)]
        points += [({"model": f"RP block {b}", "rp_block": b}, 0.201 + (0.03 if b == costliest else 0))
                   for b in (1, 2, 3, 4)]
        return _rows(points, FIVE)

    preset = get_preset("figs4")
    assert preset.analyze(rows(1), tmp_path, "small").supported is True
    assert preset.analyze(rows(3), tmp_path, "small").supported is False


def test_fig2d_verdict(tmp_path):
    """Comparable = |paired mean difference| below half a point, decided on its interval."""
    def rows(kronecker, seeds=FIVE):
        return _rows([({"model": "Monarch"}, 0.10), ({"model": "Kronecker"}, kronecker)], seeds)

    preset = get_preset("fig2d")
    assert preset.analyze(rows(0.101), tmp_path, "small").supported is True
    assert preset.analyze(rows(0.2), tmp_path, "small").supported is False
    assert preset.analyze(rows(0.101, seeds=(0, 1)), tmp_path, "small").supported is None  # 2 seeds
    noisy = _rows([({"model": "Monarch"}, 0.10)], FIVE, jitter=0)  # differences 0 ... 1 point: |mean| ≈ 0.5
    noisy += [{"model": "Kronecker", "seed": s, "run": f"k{s}", "status": "finished", "final_test_error": 0.10 + d}
              for s, d in zip(FIVE, (0.0, 0.010, 0.002, 0.009, 0.004))]
    assert preset.analyze(noisy, tmp_path, "small").supported is None


@pytest.mark.parametrize("sparse_gain, seeds, decision", [(0.05, FIVE, "supported"), (-0.05, FIVE, "contradicted"),
                                                         (0.05, (0, 1), "undecided")])
def test_fig2_cka_verdicts(sparse_gain, seeds, decision):
    """Both parts of Fig. 2a per Mixer size, from per-seed CKA curves: the Mixer's density against the dense
    SW-MLP, and the best sparse density against the dense one."""
    from pkmixer.experiments.presets.fig2 import _cka_verdicts

    densities = [1.0, 0.5, 0.25, 0.125]
    rows = [{"size": 8, "seed": seed, "density": d,
             "cka_diagonal_mean": 0.6 + sparse_gain * (1 - d) + 0.01 * seed}
            for seed in seeds for d in densities]
    verdicts = _cka_verdicts(rows, 8, 0.125)
    assert [v.decision for v in verdicts] == [decision, decision]


@pytest.mark.parametrize("name, sign, supported", [("figs2", -1, True), ("figs2", 1, False)])
def test_figs2_verdict(name, sign, supported, tmp_path):
    points = [({"model": family, "omega": 2**17, "C": None, "S": None, "width": m, "density": None},
               0.2 + sign * 0.01 * i) for family in ("MLP-Mixer", "RP MLP-Mixer", "SW-MLP")
              for i, m in enumerate((100, 200, 400, 800))]
    assert get_preset(name).analyze(_rows(points, FIVE), tmp_path, "small").supported is supported


def test_figs3_verdict(tmp_path):
    def rows(best_c):
        points = []
        for omega in (2**13, 2**14):
            for C in (4, 8, 16, 32, 64):
                gamma = gamma_at_width(omega, 256, C)
                for family in ("MLP-Mixer", "RP MLP-Mixer"):
                    meta = {"model": family, "omega": omega, "width": 256, "C": C, "S": 256 // C,
                            "gamma": round(gamma, 4)}
                    points.append((meta, 0.2 - 0.01 * gamma + (0 if C == best_c else 0.05)))
        return _rows(points, FIVE)

    preset = get_preset("figs3")
    assert preset.analyze(rows(16), tmp_path, "small").supported is True
    assert preset.analyze(rows(4), tmp_path, "small").supported is False


def _with_curves(rows, curve_of):
    """``rows`` with their ``curve`` column, as sweep.run_row reads it from metrics.jsonl."""
    return [{**row, "curve": [{"epoch": e + 1, **point} for e, point in enumerate(curve_of(row))]} for row in rows]


def test_figs6_verdict_measures_overfitting_from_the_curves(tmp_path):
    def verdict(rp_rise, where):
        rows = _rows([({"model": f, "omega": 2**15, "C": C, "S": 4096 // C}, 0.1)
                      for f in ("S-Mixer", "RP S-Mixer") for C in (8, 16, 64)], FIVE)
        rise = {"S-Mixer": 0.3, "RP S-Mixer": rp_rise}

        def curve(row):  # falls to 0.5 at epoch 3, then rises by `rise`
            top = rise[row["model"]] if row["C"] == 64 else 0.0
            return [{"test_loss": v, "train_loss": 0.1, "test_error": 0.1} for v in (1.0, 0.7, 0.5, 0.5 + top)]

        return get_preset("figs6").analyze(_with_curves(rows, curve), where, "small")

    good = verdict(0.1, tmp_path / "a")
    assert good.supported is True
    assert next(t for t in good.tables["figs6"] if t["model"] == "S-Mixer" and t["C"] == 64)["overfitting_mean"] == \
        pytest.approx(0.3)
    assert verdict(0.2, tmp_path / "b").supported is False


