"""pkmixer.experiments.stats: the paired bootstrap over seeds and its decision rule, on simulated results whose true
effect is known.

Coverage: over N = 400 simulated experiments a 90 % interval should cover the true value in 90 % of them; the
count of covering intervals is Binomial(400, 0.9) with standard deviation √(400·0.9·0.1) = 6 (1.5 %), so the
tests accept 85.5-94.5 % (± 3 standard deviations: a correct interval fails this about 3 times in 1000). The
decision tests use the same tolerance on rates."""
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from pkmixer.experiments import stats
from pkmixer.experiments.stats import (CONTRADICTED, SUPPORTED, UNDECIDED, Rule, Verdict, bootstrap_interval,
                                       decide, difference_verdict, overall, per_seed_difference, per_seed_trend,
                                       rank_correlation, seeds_needed, trend_verdict)

EXPERIMENTS, LEVEL = 400, 0.90
LOW, HIGH = LEVEL - 3 * math.sqrt(LEVEL * (1 - LEVEL) / EXPERIMENTS), LEVEL + 3 * math.sqrt(LEVEL * (1 - LEVEL) /
                                                                                            EXPERIMENTS)
WIDTHS = (128, 256, 512, 1024)


def _paired_rows(rng, seeds, effect, seed_sd=0.03, noise=0.01):
    """Two arms at the same seeds: error = 0.2 + seed effect (shared by both arms) + arm effect + noise."""
    rows = []
    for s in range(seeds):
        shared = rng.normal(0, seed_sd)
        rows.append({"model": "A", "seed": s, "final_test_error": 0.2 + shared + effect + rng.normal(0, noise)})
        rows.append({"model": "B", "seed": s, "final_test_error": 0.2 + shared + rng.normal(0, noise)})
    return [r for r in rows if r["model"] == "A"], [r for r in rows if r["model"] == "B"]


def _trend_rows(rng, seeds, slope, slope_sd=0.01, noise=0.01):
    """Errors against width within each seed: 0.3 + seed offset + b_s·log₂(m/128) + noise, b_s ~ N(slope, sd)."""
    rows = []
    for s in range(seeds):
        offset, b = rng.normal(0, 0.03), rng.normal(slope, slope_sd)
        rows += [{"width": m, "seed": s, "final_test_error": 0.3 + offset + b * math.log2(m / 128) +
                  rng.normal(0, noise)} for m in WIDTHS]
    return rows


# ---- coverage ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seeds", [5, 10])
def test_difference_interval_covers_the_true_difference_at_its_level(seeds):
    rng, covered = np.random.default_rng(seeds), 0
    for e in range(EXPERIMENTS):
        a, b = _paired_rows(rng, seeds, effect=0.01)
        _, (low, high) = bootstrap_interval(list(per_seed_difference(a, b).values()), level=LEVEL, seed=e)
        covered += low <= 0.01 <= high
    assert LOW <= covered / EXPERIMENTS <= HIGH, covered / EXPERIMENTS


@pytest.mark.parametrize("seeds", [5, 10])
def test_slope_interval_covers_the_true_slope_at_its_level(seeds):
    rng, covered = np.random.default_rng(100 + seeds), 0
    for e in range(EXPERIMENTS):
        per_seed = per_seed_trend(_trend_rows(rng, seeds, slope=-0.02), "width", kind="slope", log_x=True)
        assert len(per_seed) == seeds
        _, (low, high) = bootstrap_interval(list(per_seed.values()), level=LEVEL, seed=e)
        covered += low <= -0.02 <= high
    assert LOW <= covered / EXPERIMENTS <= HIGH, covered / EXPERIMENTS


def test_plain_percentiles_undercover_at_few_seeds_and_the_expansion_corrects_it():
    rng = np.random.default_rng(7)
    samples = [rng.normal(0.0, 1.0, 5) for _ in range(EXPERIMENTS)]
    plain = np.mean([(lambda i: i[0] <= 0 <= i[1])(bootstrap_interval(x, expand=False, seed=k)[1])
                     for k, x in enumerate(samples)])
    expanded = np.mean([(lambda i: i[0] <= 0 <= i[1])(bootstrap_interval(x, seed=k)[1])
                        for k, x in enumerate(samples)])
    assert plain < LOW <= expanded <= HIGH, (plain, expanded)


def test_a_statistic_of_whole_seed_rows_resamples_seeds_not_runs():
    # each seed's row: errors at 4 widths; the statistic is the mean over seeds of the row's last − first entry.
    rng = np.random.default_rng(3)
    rows = np.array([[0.3, 0.28, 0.26, 0.25] for _ in range(6)]) + rng.normal(0, 0.05, (6, 1))  # seed offsets only
    estimate, (low, high) = bootstrap_interval(rows, lambda r: (r[..., -1] - r[..., 0]).mean(-1))
    assert estimate == pytest.approx(-0.05) and low == pytest.approx(-0.05) and high == pytest.approx(-0.05)


# ---- decisions -----------------------------------------------------------------------------------------------

RULE = Rule("mean over seeds of error(A) − error(B)", threshold=0.0, direction="above", level=LEVEL)
TREND = Rule("mean over seeds of Spearman ρ(width, error)", threshold=0.0, direction="below", level=LEVEL)


def _decisions(make, seeds, effect, experiments=EXPERIMENTS):
    rng, out = np.random.default_rng(seeds * 1000 + int(1000 * effect) + 17), []
    for _ in range(experiments):
        out.append(make(rng, seeds, effect).decision)
    return {d: out.count(d) / len(out) for d in (SUPPORTED, CONTRADICTED, UNDECIDED)}


def _difference(rng, seeds, effect):
    return difference_verdict(*_paired_rows(rng, seeds, effect), RULE)


def _trend(rng, seeds, effect):
    return trend_verdict(_trend_rows(rng, seeds, slope=effect, slope_sd=0.005, noise=0.005), "width", TREND)


def test_no_effect_is_mostly_undecided_and_rarely_either_way():
    rates = _decisions(_difference, 8, 0.0)
    # each wrong side has nominal rate ≤ 5 %; 3 binomial sd at 400 experiments is 3.3 %
    assert rates[UNDECIDED] >= LOW and rates[SUPPORTED] <= 0.083 and rates[CONTRADICTED] <= 0.083, rates
    trend = _decisions(_trend, 8, 0.0, 200)
    assert trend[UNDECIDED] >= 0.8 and trend[SUPPORTED] <= 0.1 and trend[CONTRADICTED] <= 0.1, trend


def test_a_strong_effect_with_enough_seeds_is_supported_and_its_opposite_contradicted():
    assert _decisions(_difference, 5, 0.03)[SUPPORTED] >= 0.95
    assert _decisions(_difference, 5, -0.03)[CONTRADICTED] >= 0.95
    assert _decisions(_trend, 5, -0.02, 100)[SUPPORTED] == 1.0
    assert _decisions(_trend, 5, 0.02, 100)[CONTRADICTED] == 1.0


@pytest.mark.parametrize("seeds", [1, 2])
def test_two_seeds_or_fewer_are_always_undecided(seeds):
    assert _decisions(_difference, seeds, 0.5, 50)[UNDECIDED] == 1.0
    assert _decisions(_trend, seeds, -0.5, 50)[UNDECIDED] == 1.0
    verdict = _difference(np.random.default_rng(0), seeds, 0.5)
    assert f"a 90 % rule needs {RULE.seeds}" in verdict.note and verdict.supported is None


def test_fewer_seeds_than_the_level_can_reach_are_undecided():
    # 4 seeds: the range of 4 values covers a symmetric centre with probability 1 − 2^-3 = 87.5 % < 90 %
    assert seeds_needed(0.9) == 5 and seeds_needed(0.8) == 4 and seeds_needed(0.5) == 3
    assert _decisions(_difference, 4, 0.5, 20)[UNDECIDED] == 1.0
    assert Rule("x", min_seeds=4).seeds == 4 and Rule("x", min_seeds=1).seeds == 3


def test_decide_on_the_interval_and_the_threshold():
    rule = Rule("ρ", threshold=0.0, direction="below")
    assert decide(-0.9, (-1.0, -0.5), rule, 5).decision == SUPPORTED
    assert decide(0.6, (0.2, 0.9), rule, 5).decision == CONTRADICTED
    assert decide(-0.2, (-0.6, 0.1), rule, 5).decision == UNDECIDED
    assert decide(-0.5, (-1.0, 0.0), rule, 5).decision == UNDECIDED  # touching the threshold is not beyond it
    above = Rule("gap", threshold=0.005, direction="above", scale=100, unit=" points")
    assert decide(0.02, (0.01, 0.03), above, 5).decision == SUPPORTED
    assert decide(0.0, (-0.01, 0.004), above, 5).decision == CONTRADICTED
    assert decide(None, None, rule, 5).decision == UNDECIDED


def test_verdict_text_and_record():
    rule = Rule("mean over seeds of error(SW-MLP) − error(Mixer)", threshold=0.0, direction="above", scale=100,
                unit=" points")
    verdict = decide(0.0123, (0.004, 0.02), rule, 5, claim="widest SW-MLP worse")
    assert verdict.text() == ("widest SW-MLP worse: mean over seeds of error(SW-MLP) − error(Mixer) = +1.23 points, "
                              "90 % interval [+0.40, +2.00] points over 5 seeds (claim: > 0.00 points) - supported")
    assert "supported when its whole 90 % paired-bootstrap interval over seeds is > 0.00 points" in verdict.rule
    record = verdict.as_dict()
    assert record["interval"] == [0.004, 0.02] and record["decision"] == SUPPORTED and record["level"] == 0.9
    assert set(record) >= {"statistic", "estimate", "interval", "level", "threshold", "direction", "decision", "rule"}
    assert isinstance(verdict, Verdict) and verdict.supported is True


def test_overall_combines_parts():
    s, c, u = (decide(e, i, TREND, 5) for e, i in ((-1, (-1, -0.5)), (1, (0.5, 1)), (0, (-1, 1))))
    assert overall([s, s]) is True and overall([s, u]) is None and overall([s, u, c]) is False
    assert overall([]) is None


def test_deterministic():
    x = np.random.default_rng(0).normal(size=6)
    assert bootstrap_interval(x, seed=4) == bootstrap_interval(x, seed=4)
    assert bootstrap_interval(x, seed=4) != bootstrap_interval(x, seed=5)


# ---- the helpers ---------------------------------------------------------------------------------------------

def test_rank_correlation_is_spearmans_rho_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 4, 7).astype(float), rng.integers(0, 3, 7).astype(float)
        if len(set(x)) >= 3 and len(set(y)) >= 2:
            assert rank_correlation(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert rank_correlation([1, 2], [3, 4]) is None and rank_correlation([1, 2, 3], [1, 1, 1]) is None
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0


def test_per_seed_statistics_pair_by_seed():
    a = [{"seed": s, "final_test_error": 0.1 * s} for s in (0, 1, 2)]
    b = [{"seed": s, "final_test_error": 0.05} for s in (1, 2, 3)]
    assert per_seed_difference(a, b) == pytest.approx({1: 0.05, 2: 0.15})
    rows = [{"seed": 0, "width": m, "final_test_error": e} for m, e in ((1, 3.0), (2, 2.0), (4, 1.0))]
    assert per_seed_trend(rows, "width") == {0: -1.0}
    assert per_seed_trend(rows, "width", kind="slope", log_x=True) == {0: pytest.approx(-1.0)}


def test_the_report_prints_estimate_interval_and_decision(tmp_path):
    import json

    from pkmixer.experiments import get_preset
    from pkmixer.experiments.preset import Analysis
    from pkmixer.experiments.report import write_report

    verdicts = [decide(-0.9, (-1.0, -0.6), TREND, 5, claim="S-Mixer: error falls"),
                decide(-0.1, (-0.7, 0.4), TREND, 5, claim="SW-MLP: error falls"),
                decide(None, None, TREND, 2, claim="RP: error falls")]
    analysis = Analysis(verdict=stats.summary(verdicts), supported=overall(verdicts), verdicts=verdicts)
    write_report(analysis, tmp_path, preset=get_preset("fig5"), scale="small", dataset="digits", command="x", rows=[])
    text = (tmp_path / "report" / "report.md").read_text()
    assert ("| S-Mixer: error falls | mean over seeds of Spearman ρ(width, error) | −0.90 | 90 % [−1.00, −0.60] | 5 | "
            "statistic < 0.00 | **supported** |") in text
    assert "| **undecided** |" in text and "**undecided** (2 seeds: a 90 % rule needs 5) |" in text
    assert "supported when its whole 90 % paired-bootstrap interval over seeds is < 0.00" in text
    saved = json.loads((tmp_path / "report" / "analysis.json").read_text())
    assert [v["decision"] for v in saved["verdicts"]] == [SUPPORTED, UNDECIDED, UNDECIDED]
    assert saved["verdicts"][0]["interval"] == [-1.0, -0.6] and saved["supported"] is None


def test_interval_text_signs_differences_not_ratios():
    from pkmixer.experiments.stats import interval_text

    ratio = interval_text([1.1, 0.9, 1.0, 1.2], signed=False)
    assert ratio.startswith("1.05, 90 % interval [") and "+" not in ratio
    assert interval_text([0.1, -0.3, 0.2]).startswith("+0.00, 90 % interval [−")


def test_mean_std_prints_small_quantities_to_two_significant_figures():
    """A slope of 1e-4 once printed as ``0.00 ± 0.00`` in the figs8 report."""
    assert stats.format_mean_std({"mean": 1.8e-4, "std": 1.1e-4, "n": 5}) == "0.00018 ± 0.00011 (n=5)"
    assert stats.format_mean_std({"mean": 0.1357, "std": 0.0026, "n": 5}) == "0.1357 ± 0.0026 (n=5)"
    assert stats.format_mean_std({"mean": 0.1234, "std": 0.0056, "n": 3}, percent=True) == "12.34 ± 0.56 % (n=3)"
    assert stats.format_mean_std({"mean": 3e-5, "std": None, "n": 1}) == "0.000030 (n=1)"
    assert stats.format_mean_std({"mean": 0.5, "std": 0.0, "n": 2}, digits=1) == "0.5 ± 0.0 (n=2)"
