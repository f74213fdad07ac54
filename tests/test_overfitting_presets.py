"""The overfitting presets figs6, figs7 and figs8 (Figs. S.6-S.8, App. D.7) at medium scale: their runs (a training
subset trained long, 5 seeds paired across the two families) and their verdict rules, unchanged, on simulated rows
of medium's shape (medium's C values, seeds and curve lengths). The other scales are tested in
tests/test_presets.py and tests/test_rule_verdicts.py."""
import numpy as np
import pytest

from pkmixer.experiments import get_preset

# preset -> runs (without the epoch-doubling ones), training images, test images (None: all 10 000), epochs,
# AutoAugment, epoch-doubling runs
MEDIUM = {"figs6": (50, 10_000, None, 60, None, 0), "figs7": (50, 2000, 2000, 50, "cifar10", 2),
          "figs8": (10, 10_000, None, 40, "cifar10", 0)}


@pytest.mark.parametrize("name", sorted(MEDIUM))
def test_medium_trains_small_models_long_on_a_subset(name):
    preset = get_preset(name)
    count, train, test, epochs, augment, doubles = MEDIUM[name]
    everything = preset.runs("medium", None)
    specs = [s for s in everything if not s.meta.get("doubles")]
    assert len(specs) == count and len({s.name for s in everything}) == count + doubles
    doubled = [s for s in everything if s.meta.get("doubles")]
    assert len(doubled) == doubles
    originals = {s.name: s for s in specs}
    for spec in doubled:  # seed 0's pair at the largest C, twice the epochs, otherwise the same run
        base = originals[spec.meta["doubles"]]
        assert base.meta["seed"] == 0 and base.meta["C"] == max(s.meta["C"] for s in specs)
        assert spec.config.schedule.epochs == 2 * epochs
        assert spec.config.override({"schedule.epochs": epochs}) == base.config
    assert len({s.meta["model"] for s in doubled}) == doubles
    for point in {(s.meta["model"], s.meta["C"]) for s in specs}:  # every point on the same five seeds
        assert sorted(s.meta["seed"] for s in specs if (s.meta["model"], s.meta["C"]) == point) == [0, 1, 2, 3, 4]
    for spec in specs:
        d = spec.config.data
        assert (d.name, d.train_subset, d.test_subset, d.auto_augment, d.batch_size) == \
            ("fashion-mnist", train, test, augment, 128)
        assert spec.config.schedule.epochs == epochs and spec.config.optim.name == "adamw"
        assert spec.config.run.seed == spec.meta["seed"] == spec.config.model.options["structure_seed"]
    small = {s.name: s.config.model for s in preset.runs("small", None)}
    assert all(small[s.name] == s.config.model for s in specs if s.name in small)  # small's models
    assert {s.meta["model"] for s in specs} == {s.meta["model"] for s in preset.runs("small", None)}
    digits = preset.runs("medium", "digits")  # the fallback: all 1 438 digits, no subset
    assert len(digits) == count + doubles and {s.config.data.train_subset for s in digits} == {None}


def test_figs6_and_figs7_medium_share_the_pairs():
    pairs = [sorted({(s.meta["C"], s.meta["S"]) for s in get_preset(n).runs("medium", None)})
             for n in ("figs6", "figs7")]
    assert pairs[0] == pairs[1] and [C for C, _ in pairs[0]] == [8, 16, 32, 56, 87]


# ---- the verdict rules on simulated medium rows ------------------------------------------------------------------

def _rows(name, curve):
    """Medium scale's rows of ``name``, finished, each with the curve ``curve(row)`` over its epochs."""
    rows = []
    for spec in get_preset(name).runs("medium", None):
        row = {**spec.meta, "run": spec.name, "status": "finished", "final_test_error": 0.1}
        rows.append({**row, "curve": [{"epoch": e + 1, **p} for e, p in enumerate(curve(row,
                                                                                  spec.config.schedule.epochs))]})
    return rows


def _decisions(analysis):
    return [v.decision for v in analysis.verdicts]


def _figs6(rise):
    """Every test loss falls to 0.4 at epoch 10, then rises linearly by rise(family, C) (+ a little per seed)."""
    def curve(row, epochs):
        top = rise(row["model"], row["C"]) * (1 + 0.02 * row["seed"])
        return [{"test_loss": 0.4 + max(10 - e, 0) * 0.05 + top * max(e - 10, 0) / (epochs - 10),
                 "train_loss": 0.01, "test_error": 0.15} for e in range(1, epochs + 1)]

    return get_preset("figs6").analyze(_rows("figs6", curve), None, "medium")


def test_figs6_rules_decide_at_medium_scale():
    good = _figs6(lambda model, C: 0.006 * C if model == "S-Mixer" else 0.002 * C)  # 3× the RP model's, growing
    assert _decisions(good) == ["supported", "supported"] and good.supported is True
    assert good.verdicts[0].estimate == pytest.approx(87 * (0.006 - 2 * 0.002) * 1.04, rel=0.01)
    bad = _figs6(lambda model, C: 0.1 if model == "S-Mixer" else 0.1 + 0.002 * C)  # the RP model overfits more
    assert _decisions(bad) == ["contradicted", "contradicted"] and bad.supported is False


def _figs7(test_gap, train_gap):
    """Losses falling to 0.5 (test) and 0.2 (training); the RP model's end ``test_gap`` and ``train_gap`` away."""
    def curve(row, epochs):
        rp = row["model"] == "RP MLP-Mixer"
        jitter = 0.002 * row["seed"]
        end = (0.5 + rp * test_gap + jitter, 0.2 + rp * train_gap + jitter)
        return [{"test_loss": end[0] + (epochs - e) / epochs, "train_loss": end[1] + (epochs - e) / epochs,
                 "test_error": 0.15} for e in range(1, epochs + 1)]

    return get_preset("figs7").analyze(_rows("figs7", curve), None, "medium")


def test_figs7_rules_decide_at_medium_scale():
    good = _figs7(-0.05, 0.1)
    assert _decisions(good) == ["supported", "supported"] and good.supported is True
    assert good.verdicts[0].estimate == pytest.approx(-0.05)
    assert good.outcome == "supported" and "left the sign of every checked statistic" in good.verdict
    assert _decisions(_figs7(0.05, -0.1)) == ["contradicted", "contradicted"]


def test_figs7_is_not_converged_when_doubling_flips_a_part():
    """The epoch-doubling runs (seed 0's pair at the largest C) decide "not converged" when a part's statistic
    changes sign; the verdicts' parts leave them out."""
    def flipping(row, epochs):  # twice as long, the RP model's training loss ends below the normal one's
        gap = -0.1 if row.get("doubles") else 0.1
        rp = row["model"] == "RP MLP-Mixer"
        return [{"test_loss": 0.45 + rp * -0.05 + (epochs - e) / epochs + 0.002 * row["seed"],
                 "train_loss": 0.2 + rp * gap + (epochs - e) / epochs + 0.002 * row["seed"], "test_error": 0.15}
                for e in range(1, epochs + 1)]

    analysis = get_preset("figs7").analyze(_rows("figs7", flipping), None, "medium")
    assert _decisions(analysis) == ["supported", "supported"]  # the parts, on the runs as trained
    assert analysis.outcome == "not converged" and "final training loss(RP)" in analysis.reason
    assert "final test loss(RP)" not in analysis.reason and "changed the sign of 1 of the 2" in analysis.verdict


def _figs8(rp_end, rp_slope):
    """The normal model's test loss flat at 0.5 over the last quarter (epochs 31-40), the RP one's falling by
    ``rp_slope`` per epoch to 0.5 + ``rp_end``; test error = test loss / 4."""
    def curve(row, epochs):
        rp, tail = row["model"] == "RP MLP-Mixer", epochs // 4
        end = 0.5 + rp * rp_end + 0.003 * np.sin(row["seed"])
        values = [end + 0.05 * (epochs - tail - e) for e in range(1, epochs - tail + 1)]
        values += [end - rp * rp_slope * (tail - 1 - k) for k in range(tail)]
        return [{"test_loss": v, "train_loss": v, "test_error": v / 4} for v in values]

    return get_preset("figs8").analyze(_rows("figs8", curve), None, "medium")


