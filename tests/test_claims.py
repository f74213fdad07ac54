"""The presets' claims decided by the rules of pkmixer.experiments.rules on constructed rows (no training): the
medium designs, the outcomes beside supported / contradicted / undecided, the validation split that selects an epoch
on its own, the records kept as data and the docs generated from them."""
import json
import math

import numpy as np
import pytest

from pkmixer.experiments import docs, get_preset, records
from pkmixer.experiments.preset import list_presets
from pkmixer.experiments.report import verdict_table
from pkmixer.experiments.rules import NOT_CONVERGED, NOT_TESTABLE, OUT_OF_REGIME, adjusted
from pkmixer.experiments.stats import CONTRADICTED, SUPPORTED, UNDECIDED
from pkmixer.experiments.sweep import selected_epoch, selection_columns


def _rows(specs, error_of, noise=0.0025, seed=0, doubled_shift=0.0):
    """Finished rows of ``specs`` with test error ``error_of(meta)`` plus N(0, noise²) per run; the doubled runs
    (``doubles``) at their original's error plus ``doubled_shift``."""
    rng = np.random.default_rng(seed)
    out, by_name = [], {}
    for s in specs:
        error = error_of(s.meta) + noise * rng.normal()
        if s.meta.get("doubles"):
            error = by_name[s.meta["doubles"]] + doubled_shift
        by_name[s.name] = error
        out.append({**s.meta, "run": s.name, "status": "finished", "final_test_error": error,
                    "selected_test_error": error, "selection": "val_error", "n_test": 10_000,
                    "epochs": s.config.schedule.epochs, "curve": []})
    return out


# ---- the medium designs ---------------------------------------------------------------------------------------

def test_fig5_and_fig6_share_one_medium_grid_on_both_sides_of_c_equal_s():
    fig5, fig6 = get_preset("fig5").runs("medium", None), get_preset("fig6").runs("medium", None)
    assert [(s.name, s.config.as_dict()) for s in fig5] == [(s.name, s.config.as_dict()) for s in fig6]
    mixers = {(s.meta["C"], s.meta["S"]) for s in fig5 if s.meta["model"] == "S-Mixer"}
    assert mixers == {(8, 87), (16, 56), (32, 32), (56, 16), (87, 8)}  # mirrored pairs (App. C.4)
    assert {s.meta["model"] for s in fig5} == {"S-Mixer", "RP S-Mixer", "SW-MLP"}
    trained = [s for s in fig5 if not s.meta.get("doubles")]
    assert len(trained) == 13 * 5 and len(fig5) - len(trained) == 6
    c = trained[0].config
    assert c.data.val_fraction == pytest.approx(1 / 12) and c.data.crop_padding == 4 and c.data.hflip
    assert {s.config.schedule.epochs for s in fig5 if s.meta.get("doubles")} == {2 * c.schedule.epochs}


def test_every_medium_design_fits_two_hours_or_is_out_of_regime_or_untestable():
    from pkmixer.experiments import recipes

    for preset in list_presets():
        if "medium" not in preset.scales:
            continue
        specs = preset.runs("medium", None)
        assert all(s.config.data.val_fraction > 0 for s in specs), preset.name
        check = preset.regime_check("medium", None)
        if check.reached and preset.testable:
            assert recipes.estimate_hours(preset.name, specs) <= recipes.BUDGET_HOURS + 0.05, preset.name


@pytest.mark.parametrize("name, reached", [("fig4", False), ("fig7", False), ("table1", False), ("suppa1", False),
                                           ("fig5", True), ("fig6", True), ("figs3", True)])
def test_regimes_checked_from_the_configs(name, reached):
    check = get_preset(name).regime_check("medium", None)
    assert check.reached is reached and check.rows and any(line.startswith("- departure") for line in check.lines())
    assert ("out of regime" in check.lines()[-1]) is not reached


def test_check_regime_on_the_command_line(capsys):
    from pkmixer.cli import main

    assert main(["reproduce", "fig4", "--scale", "medium", "--check-regime"]) == 0
    out = capsys.readouterr().out
    assert "widest γm" in out and "NOT reached" in out and "out of regime" in out


# ---- fig5 and fig6 on the grid ---------------------------------------------------------------------------------

def _grid_error(mixer, sw):
    def error(meta):
        if meta["model"] == "SW-MLP":
            return sw(meta["width"])
        return mixer(math.log2(meta["C"] / meta["S"]), meta["width"]) + (0.01 if meta["model"] == "S-Mixer" else 0)
    return error


def test_fig5_supports_a_fall_with_width_and_a_u_shape_fails_the_end_part():
    preset, specs = get_preset("fig5"), get_preset("fig5").runs("medium", None)
    falls = preset.analyze(_rows(specs, _grid_error(lambda x, m: 0.2 - 0.02 * math.log2(m),
                                                    lambda m: 0.2 - 0.01 * math.log2(m))), None, "medium")
    trends = [v for v in falls.verdicts if v.required and v.decision != NOT_TESTABLE]
    assert falls.outcome == SUPPORTED and len(trends) == 6 and all(v.decision == SUPPORTED for v in trends)
    alike, = [v for v in falls.verdicts if "trend with m is the S-Mixer's" in v.claim]
    assert not alike.required and alike.decision != CONTRADICTED and "power" in alike.extra
    # the widest (C = S) one point worse than the next-widest, the slope over all pairs still negative
    def u(x, m):
        return 0.2 - 0.03 * math.log2(m) + (0.03 * math.log2(1024) - 0.03 * math.log2(896) + 0.01 if m == 1024 else 0)
    shaped = preset.analyze(_rows(specs, _grid_error(u, lambda m: 0.2 - 0.01 * math.log2(m))), None, "medium")
    ends = [v for v in shaped.verdicts if "next" in v.claim and "Mixer" in v.claim]
    assert ends and all(v.decision == CONTRADICTED for v in ends) and shaped.outcome == CONTRADICTED
    flat = preset.analyze(_rows(specs, lambda meta: 0.12, seed=3), None, "medium")
    assert flat.outcome == UNDECIDED


def test_fig5_alike_part_contradicts_opposite_trends():
    """The RP S-Mixer's error rising with m where the S-Mixer's falls: "similar tendencies" is contradicted, and so
    the preset's claim (the RP trend's own parts say contradicted too)."""
    preset, specs = get_preset("fig5"), get_preset("fig5").runs("medium", None)

    def error(meta):
        if meta["model"] == "SW-MLP":
            return 0.2 - 0.01 * math.log2(meta["width"])
        sign = 1 if meta["model"] == "RP S-Mixer" else -1
        return 0.15 + sign * 0.04 * (math.log2(meta["width"]) - 10)
    analysis = preset.analyze(_rows(specs, error), None, "medium")
    alike, = [v for v in analysis.verdicts if "trend with m is the S-Mixer's" in v.claim]
    assert alike.decision == CONTRADICTED and "inside ±0.50 points" in alike.text()
    assert analysis.outcome == CONTRADICTED


def test_fig4_parts_from_the_papers_words():
    """fig4's error parts on constructed medium rows (out of regime there, but every part still computed): both
    families falling with γm, the widest SW-MLP a point worse than the Mixer and flat between its two widest
    widths; the causal sentence is listed as not testable; an SW-MLP that rises a point at its widest width fails
    "little change"."""
    preset, specs = get_preset("fig4"), get_preset("fig4").runs("medium", None)

    def falling(meta, last_step=0.0):
        widest = max(s.meta["width"] for s in specs)
        error = 0.3 - 0.02 * math.log2(meta["gamma_width"])
        if meta["model"] == "SW-MLP":
            error += 0.01 + (last_step if meta["width"] == widest else 0.0)
            if meta["width"] == widest:  # flat: the next-widest's error
                error += 0.02 * math.log2(2 * widest) - 0.02 * math.log2(2 * _next_widest(specs))
        return error
    analysis = preset.analyze(_rows(specs, falling), None, "medium")
    by = {v.claim: v for v in analysis.verdicts}
    assert analysis.outcome == OUT_OF_REGIME
    assert by["MLP-Mixer: error falls as the γm grows"].decision == SUPPORTED
    assert by["the SW-MLP's error changes little between its two widest γm"].decision == SUPPORTED
    assert [v.decision for v in analysis.verdicts if "worse than the Mixer" in v.claim] == [SUPPORTED]
    assert by["large singular values are what deteriorates the SW-MLP's error"].decision == NOT_TESTABLE
    rising = preset.analyze(_rows(specs, lambda meta: falling(meta, last_step=0.02)), None, "medium")
    flat, = [v for v in rising.verdicts if "changes little" in v.claim]
    assert flat.decision == CONTRADICTED


def test_table1lasso_compares_the_mixer_with_the_lambda_the_validation_split_selects():
    """Table 1's β-LASSO row: the FC network holds the Mixer's connections; λ is the one with the lowest mean final
    validation error, whatever the other λs' test errors; the paired rule decides on it."""
    from pkmixer.experiments.presets.table1lasso import LAMBDAS

    preset = get_preset("table1lasso")
    specs = preset.runs("medium", None)
    trained = [s for s in specs if not s.meta.get("doubles")]
    assert len(trained) == 5 * (1 + len(LAMBDAS)) and len(specs) - len(trained) == 1 + len(LAMBDAS)
    connections = {s.meta["model"]: s.meta["connections"] for s in trained}
    assert connections["β-LASSO"] / connections["Mixer-SS-W"] == pytest.approx(1, abs=0.005)
    assert preset.regime_check("medium", None).reached
    for s in trained:
        optim = s.config.optim
        assert (optim.lasso, optim.name) == ((s.meta["lasso"], "sgd") if s.meta["lasso"] else (0.0, "adamw"))
    middle = LAMBDAS[1]

    def analysed(mixer_error, other_test):
        def error(meta):
            if meta["model"] == "Mixer-SS-W":
                return mixer_error
            return 0.13 if meta["lasso"] == middle else other_test
        rows = _rows(specs, error)
        for r in rows:  # the middle λ validates best
            r["final_val_error"] = 0.05 if r.get("lasso") == middle else 0.2
        return preset.analyze(rows, None, "medium")

    low, high = analysed(0.10, 0.01), analysed(0.10, 0.5)
    for a in (low, high):
        assert a.numbers["λ selected on the validation split"] == f"{middle:g}"
        assert a.verdicts[0].decision == SUPPORTED and a.outcome == SUPPORTED
    assert low.verdicts[0].estimate == high.verdicts[0].estimate
    assert analysed(0.16, 0.01).verdicts[0].decision == CONTRADICTED


def _next_widest(specs):
    widths = sorted({s.meta["width"] for s in specs})
    return widths[-2]


def test_fig5_is_not_converged_when_doubling_moves_the_selected_error():
    preset, specs = get_preset("fig5"), get_preset("fig5").runs("medium", None)
    rows = _rows(specs, _grid_error(lambda x, m: 0.2 - 0.02 * math.log2(m), lambda m: 0.2 - 0.01 * math.log2(m)),
                 doubled_shift=-0.006)
    analysis = preset.analyze(rows, None, "medium")
    assert analysis.outcome == NOT_CONVERGED and "moved" in analysis.reason


def test_fig6_lowest_around_c_equal_s():
    preset, specs = get_preset("fig6"), get_preset("fig6").runs("medium", None)
    step = math.log2(87 / 8) / 2  # about the grid step

    def around(centre):
        return _grid_error(lambda x, m: 0.12 + 0.004 * ((x - centre) / step) ** 2, lambda m: 0.11)

    assert preset.analyze(_rows(specs, around(0.0)), None, "medium").outcome == SUPPORTED
    falling = preset.analyze(_rows(specs, _grid_error(lambda x, m: 0.12 + 0.004 * x, lambda m: 0.11)), None, "medium")
    assert falling.outcome == CONTRADICTED  # lowest at C = 8, S = 87: the error still falls past one step
    tied = preset.analyze(_rows(specs, lambda meta: 0.12, seed=5), None, "medium")
    assert tied.outcome == UNDECIDED
    assert any(v.decision == NOT_TESTABLE and "ImageNet" in v.claim for v in tied.verdicts)
    assert all(len(v.margins) == 3 for v in tied.verdicts if v.decision != NOT_TESTABLE)


# ---- outcomes beside the statistics ----------------------------------------------------------------------------

def test_out_of_regime_and_not_testable_come_before_the_statistics():
    table1 = get_preset("table1")
    specs = table1.runs("medium", None)
    rows = _rows(specs, lambda meta: 0.10 if meta["max_width"] > 9000 else 0.13)  # a clear effect
    analysis = table1.analyze(rows, None, "medium")
    assert analysis.verdicts[0].decision == SUPPORTED and analysis.outcome == OUT_OF_REGIME
    assert "width ratio" in analysis.reason and analysis.supported is None
    figs5 = get_preset("figs5")
    analysis = figs5.analyze(_rows(figs5.runs("medium", None), lambda meta: 0.12), None, "medium")
    assert analysis.outcome == NOT_TESTABLE and "side note" in analysis.reason


def test_figs4_without_an_rp_deficit_is_out_of_regime():
    preset = get_preset("figs4")
    specs = preset.runs("medium", None)
    better = preset.analyze(_rows(specs, lambda meta: 0.11 if meta["model"] != "S-Mixer" else 0.12), None, "medium")
    assert better.verdicts[0].decision == CONTRADICTED and better.outcome == OUT_OF_REGIME
    deficit = preset.analyze(_rows(specs, lambda meta: {"S-Mixer": 0.12, "RP block 1": 0.14,
                                                         "RP S-Mixer": 0.14}.get(meta["model"], 0.121)), None, "medium")
    assert [v.decision for v in deficit.verdicts] == [SUPPORTED] * 3 and deficit.outcome == SUPPORTED


def test_fig7_has_no_exception_and_its_existential_part_is_not_testable():
    preset = get_preset("fig7")
    rows = _rows(preset.runs("medium", None), lambda meta: 0.12 - (0.01 if meta["model"] == "RP S-Mixer" else 0))
    analysis = preset.analyze(rows, None, "medium")
    assert analysis.outcome == OUT_OF_REGIME
    assert analysis.verdicts[-1].decision == NOT_TESTABLE and "some cases" in analysis.verdicts[-1].quote


def test_holm_reads_a_part_contradicted_alone_as_undecided():
    from dataclasses import replace

    from pkmixer.experiments.stats import Rule, decide

    rule = Rule("d", 0.0, "below")
    alone = decide(0.01, (0.001, 0.02), rule, 5, "a", p_against=0.03)  # contradicted at its own level
    other = decide(-0.01, (-0.02, 0.001), rule, 5, "b", p_against=0.9)
    assert alone.decision == CONTRADICTED and adjusted([alone, other]) == [UNDECIDED, UNDECIDED]
    assert adjusted([replace(alone, p_against=0.01), other])[0] == CONTRADICTED
    lines = "\n".join(verdict_table([alone, other]))
    assert "not after Holm" in lines


def test_every_trained_preset_quotes_the_paper():
    for preset in list_presets():
        if "medium" in preset.scales:
            assert docs._quotes(preset), preset.name


# ---- the validation split selects; the test split never does ---------------------------------------------------

def test_changing_only_the_test_split_never_changes_the_selected_epoch():
    rng = np.random.default_rng(0)
    val = rng.uniform(0.1, 0.2, size=12)
    base = [{"epoch": e + 1, "val_error": float(v), "test_error": 0.15} for e, v in enumerate(val)]
    for k in range(20):
        other = [{**m, "test_error": float(rng.uniform(0, 1)), "test_loss": float(rng.uniform(0, 2))} for m in base]
        assert selected_epoch(other) == selected_epoch(base) == int(np.argmin(val)) + 1
    ties = [{"epoch": e + 1, "val_error": 0.1} for e in range(4)]
    assert selected_epoch(ties) == 1  # ties to the earliest
    columns = selection_columns(base, {})
    assert columns["selection"] == "val_error" and columns["selected_test_error"] == 0.15


def test_a_run_without_a_validation_split_selects_nothing_and_says_so():
    curve = [{"epoch": 1, "test_error": 0.3}, {"epoch": 2, "test_error": 0.2}]
    legacy = selection_columns(curve, {"best_test_error": 0.2})
    assert legacy["selected_epoch"] is None and "before the validation split" in legacy["selection"]
    assert selection_columns(curve, {})["selection"] == "none"


def test_figs6_measures_overfitting_from_the_validation_selected_epoch():
    from pkmixer.experiments.measures import val_overfitting

    curve = [{"val_loss": 0.5, "test_loss": 0.3}, {"val_loss": 0.4, "test_loss": 0.35},
             {"val_loss": 0.45, "test_loss": 0.5}]
    assert val_overfitting(curve) == pytest.approx(0.15)  # from epoch 2 (lowest validation loss), not epoch 1
    assert val_overfitting([{"test_loss": 0.3}]) is None


# ---- results kept as data, docs generated from them -------------------------------------------------------------

def test_records_round_trip_and_a_sweep_skips_what_they_hold(tmp_path):
    preset = get_preset("fig2d")
    specs = preset.runs("medium", None)
    rows = _rows(specs, lambda meta: 0.10)
    written = records.write_records(tmp_path, specs, rows, preset="fig2d", scale="medium", dataset="fashion-mnist",
                                    rules=preset.rules_hash())
    assert len(written) == len(specs) and all(p.stat().st_size < 20_000 for p in written)
    record = json.loads(written[0].read_text())
    assert record["rules"] == preset.rules_hash() and record["key"] == records.run_key(specs[0])
    held = records.load_records(tmp_path)
    todo, rows_held = records.split_held(specs, held)
    assert todo == [] and set(rows_held) == {s.name for s in specs}
    longer = [s for s in preset.runs("medium", None)]
    other = [type(s)(s.name, s.config.override({"schedule.epochs": 3}), s.meta, s.probes) for s in longer]
    assert records.split_held(other, held)[0] == other  # another config is not taken from the records


def test_docs_are_generated_from_the_records_alone(tmp_path):
    preset = get_preset("fig2d")
    specs = preset.runs("medium", None)
    before = docs.generate(tmp_path, tmp_path)
    assert "| fig2d |" in before and "not run yet under this design" in before
    records.write_records(tmp_path / "reproduction", specs,
                          _rows(specs, lambda meta: 0.10 if meta["model"] == "Monarch" else 0.101),
                          preset="fig2d", scale="medium", dataset="fashion-mnist", rules=preset.rules_hash())
    after = docs.generate(tmp_path / "reproduction", tmp_path, write_figures=True)
    row = next(line for line in after.splitlines() if line.startswith("| fig2d |"))
    assert "supported" in row and "not run yet" not in row.split(" | ")[4]
    assert (tmp_path / "docs" / "figures" / "fig2d_medium.png").is_file()
    assert "This verdict rests on one data set: Fashion-MNIST." in after


def test_a_longer_budget_keeps_its_own_records_and_the_docs_show_its_outcome(tmp_path):
    """A sweep at --epochs N writes to <preset>-medium-e<N>-<dataset>/, never over the scale's own records, and the
    generated docs add that budget's outcome, device and figure beside the scale's own verdict."""
    from pkmixer.experiments.reproduce import with_epochs

    preset, folder = get_preset("fig2d"), tmp_path / "reproduction"
    specs = preset.runs("medium", None)
    monarch_better = _rows(specs, lambda meta: 0.10 if meta["model"] == "Monarch" else 0.101)
    own = records.write_records(folder, specs, monarch_better, preset="fig2d", scale="medium",
                                dataset="fashion-mnist", rules=preset.rules_hash())
    longer = with_epochs(specs, 30, "fig2d")
    apart = [{**r, "environment": {"device": "cuda:0 (NVIDIA H200)"}}
             for r in _rows(longer, lambda meta: 0.08 if meta["model"] == "Monarch" else 0.12)]
    written = records.write_records(folder, longer, apart, preset="fig2d", scale="medium", dataset="fashion-mnist",
                                    rules=preset.rules_hash(), epochs=30)
    assert {p.parent.name for p in own} == {"fig2d-medium-fashion-mnist"}
    assert {p.parent.name for p in written} == {"fig2d-medium-e30-fashion-mnist"} and len(written) == len(specs)
    epochs = {s.name: s.config.schedule.epochs for s in specs}
    assert all(json.loads(p.read_text())["row"]["epochs"] == epochs[p.stem] for p in own)  # not replaced
    assert records.budgets(folder, "fig2d", "medium", "fashion-mnist") == [30]
    text = docs.generate(folder, tmp_path, write_figures=True)
    row = next(line for line in text.splitlines() if line.startswith("| fig2d |"))
    assert row.split(" | ")[4].startswith("supported")  # the scale's own verdict stays the table's decision
    assert "at 30 epochs (cuda:0 (NVIDIA H200)): contradicted" in row
    assert "*At 30 epochs* (12 runs recorded in reproduction/fig2d-medium-e30-fashion-mnist/, trained on cuda:0 " \
           "(NVIDIA H200)): *contradicted" in text
    assert (tmp_path / "docs" / "figures" / "fig2d_medium_e30.png").is_file()
    for p in written[3:]:
        p.unlink()  # an unfinished longer sweep: counted, no verdict
    partial = docs.generate(folder, tmp_path)
    assert "*At 30 epochs:* 3 of 12 runs recorded" in partial and "at 30 epochs (" not in partial


def test_reproduce_with_epochs_records_into_its_budgets_folder(tmp_path, monkeypatch):
    """`pkmixer reproduce NAME --scale medium --epochs N` hands its records the budget (the sweep itself faked)."""
    from pkmixer.experiments import reproduce as rp

    def fake_sweep(specs, sweep_dir, on_row=None, **kw):
        rows = _rows(specs, lambda meta: 0.10)
        for spec, row in zip(specs, rows):
            on_row(spec, row)
        return rows

    monkeypatch.setattr(rp, "run_sweep", fake_sweep)
    rp.reproduce("fig2d", scale="medium", backend="ray", epochs=30, out=tmp_path / "sweep",
                 records=tmp_path / "reproduction", log=lambda line: None)
    assert [p.name for p in (tmp_path / "reproduction").iterdir()] == ["fig2d-medium-e30-fashion-mnist"]


def test_reproduce_adds_what_a_preset_derives_to_the_rows_and_records(tmp_path, monkeypatch):
    """Once every run has finished, `pkmixer reproduce` hands Preset.derive the rows (each with its record key) and
    adds its numbers to the rows the analysis reads and to the runs' records (the sweep itself faked)."""
    from pkmixer.experiments import reproduce as rp

    def fake_sweep(specs, sweep_dir, on_row=None, **kw):
        rows = _rows(specs, lambda meta: 0.10)
        for spec, row in zip(specs, rows):
            on_row(spec, row)
        return rows

    preset = get_preset("fig2d")
    seen = {}

    def derive(self, rows, sweep_dir):
        seen.update({r["run"]: r["key"] for r in rows})
        return {rows[0]["run"]: {"derived": 1.5}}

    monkeypatch.setattr(rp, "run_sweep", fake_sweep)
    monkeypatch.setattr(type(preset), "derive", derive)
    rp.reproduce("fig2d", scale="medium", backend="ray", out=tmp_path / "sweep", records=tmp_path / "reproduction",
                 log=lambda line: None)
    specs = preset.runs("medium", None)
    assert seen == {s.name: records.run_key(s) for s in specs}
    kept = {p.stem: json.loads(p.read_text())["row"] for p in (tmp_path / "reproduction").glob("*/*.json")}
    assert kept[specs[0].name]["derived"] == 1.5 and all("derived" not in r for n, r in kept.items()
                                                         if n != specs[0].name)


def test_fig2_is_decided_from_its_records_alone(tmp_path):
    """fig2's CKA needs two runs' Gram matrices: derive() computes each SW-MLP's CKA against its Mixer once the
    sweep is done and the records keep it, so that the analysis without any run directory (as `pkmixer reproduce
    --docs` makes it) is the analysis from the Gram matrices, number for number; a pairing with a Mixer whose
    record key has changed is refused (the Gram matrices are read again, here absent)."""
    from pkmixer.errors import ConfigError
    from pkmixer.experiments.sweep import run_sweep

    preset = get_preset("fig2")
    specs = preset.runs("smoke", None)
    sweep = tmp_path / "sweep"
    ran = run_sweep(specs, sweep, workers=1, threads=1, progress=False)
    rows = [{**r, "key": records.run_key(s)} for s, r in zip(specs, ran)]
    from_grams = preset.analyze(rows, sweep, "smoke")
    derived = preset.derive(rows, sweep)
    assert set(derived) == {s.name for s in specs if s.meta["model"] == "SW-MLP"}
    folder = tmp_path / "reproduction"
    records.write_records(folder, specs, ran, preset="fig2", scale="smoke", dataset="digits", rules="r")
    for s in specs:
        if s.name in derived:
            assert records.add_fields(folder, s, derived[s.name], preset="fig2", scale="smoke", dataset="digits")
            assert records.add_fields(folder, s, derived[s.name], preset="fig2", scale="smoke",
                                      dataset="digits") is None  # already there
    kept = records.rows_for(specs, records.load_records(folder))
    assert len(kept) == len(specs) and all("cka" in r for r in kept if r["model"] == "SW-MLP")
    from_records = preset.analyze(kept, tmp_path / "nowhere", "smoke")
    assert from_records.numbers == from_grams.numbers and from_records.tables == from_grams.tables
    assert [v.__dict__ for v in from_records.verdicts] == [v.__dict__ for v in from_grams.verdicts]
    changed = [{**r, "key": "another"} if r["model"] == "MLP-Mixer" else r for r in kept]
    with pytest.raises(ConfigError, match="no stored CKA Gram matrices"):
        preset.analyze(changed, tmp_path / "nowhere", "smoke")
    other = type(specs[-1])(specs[-1].name, specs[-1].config.override({"schedule.epochs": 3}), specs[-1].meta)
    assert records.add_fields(folder, other, {"cka": {}}, preset="fig2", scale="smoke", dataset="digits") is None


def test_around_prints_its_margins_in_grid_steps():
    """"Around C = S" is decided at tolerances counted in grid steps: the report prints them so, not scaled as the
    slope's points per doubling."""
    from pkmixer.experiments.rules import AroundRules, around_parts

    x = [-4.0, -2.0, 0.0, 2.0, 4.0]
    rng = np.random.default_rng(0)
    table = {seed: [0.16 + 0.002 * v * v + rng.normal(0, 0.001) for v in x] for seed in range(5)}
    parts = around_parts(AroundRules(), table, x, "S-Mixer")
    assert len(parts) == 2 and all(p.margins for p in parts)
    text = "\n".join(verdict_table(parts))
    assert "across margins: 0.5 grid steps: " in text and "1.5 grid steps: " in text
    assert "50 points per doubling" not in text
