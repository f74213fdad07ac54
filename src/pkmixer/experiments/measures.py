"""What several presets measure in their runs, and the plot they share.

* :func:`balance_minimum` - where the lowest mean error over (C, S) pairs falls relative to C = S (Fig. 6,
  Fig. S.3 right): the pair's |log₂(C/S)| against the smallest one of the sweep.
* :func:`balance_verdict` - the error at the pairs closest to C = S minus the lowest error of the other pairs,
  means over seeds, decided by a rule (Fig. 6, Fig. S.3).
* :func:`gap` - the difference of two families' mean errors with its pooled standard deviation, and whether it is
  within noise (Table 1, Fig. 7 and Fig. S.4 describe with it); it lives in :mod:`pkmixer.experiments.stats`,
  with every statistic over seeds.
* :func:`learning_curves`, :func:`mean_curve`, :func:`overfitting` - the per-epoch metrics of runs (their rows'
  ``curve``), averaged over seeds, and how far a test loss rises after its minimum (Figs. S.6-S.8).
* :func:`error_plot` - mean test error ± std over seeds against a swept quantity, one line per family.
* :func:`trained`, :func:`doubling`, :func:`doubling_report`, :func:`convergence` - medium scale's epoch-doubling
  check (:func:`pkmixer.experiments.recipes.doubled_ends`): the runs the verdicts read, each doubled run
  against its original on the validation-selected test error, and whether the claim is "not converged";
  :func:`sign_doubling`, :func:`sign_doubling_report` - the same check for claims about where loss curves end
  (Figs. S.6, S.7): each part's statistic on seed 0's runs and on their doubled copies keeps its sign.
* :func:`decided_value`, :func:`selected_or_final`, :func:`sampling_error`, :func:`one_data_set`,
  :func:`val_overfitting` - the error a verdict reads (final or validation-selected), the binomial test-set error
  printed beside a seed interval, the data-set sentence of every report, overfitting measured from the epoch the
  validation split selects.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .stats import Rule, Verdict, bootstrap_verdict, per_seed_table

COLOURS = {"S-Mixer": "tab:red", "RP S-Mixer": "tab:orange", "MLP-Mixer": "tab:red", "RP MLP-Mixer": "tab:orange",
           "SW-MLP": "tab:blue", "Monarch": "tab:purple", "Kronecker": "tab:green"}
# medium scale's convergence check (fig5's): doubling the epochs moves the test error by less than this
CONVERGED = 0.005


def finished(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "finished"]


def trained(rows: Sequence[dict]) -> list[dict]:
    """The finished rows but the epoch-doubling runs (``doubles``), which the verdicts leave out."""
    return [r for r in finished(rows) if not r.get("doubles")]


def selected_or_final(row: dict) -> float | None:
    """The test error at the validation-selected epoch, or the final one for a run without a validation split."""
    value = row.get("selected_test_error")
    return value if value is not None else row.get("final_test_error")


def doubling(rows: Sequence[dict], axis: str) -> list[dict]:
    """Each finished run trained for twice the epochs (``doubles``) against its original: the family, ``axis``,
    the validation-selected test errors (the final ones for runs without a validation split) and their change,
    which decides convergence (< :data:`CONVERGED`), and the final errors' change beside it."""
    by_name = {r["run"]: r for r in finished(rows)}
    out = []
    for row in finished(rows):
        base = by_name.get(row.get("doubles"))
        if base is None or selected_or_final(base) is None or selected_or_final(row) is None:
            continue
        change = selected_or_final(row) - selected_or_final(base)
        final = (row["final_test_error"] - base["final_test_error"]
                 if row.get("final_test_error") is not None and base.get("final_test_error") is not None else None)
        out.append({"run": base["run"], "model": row["model"], axis: row[axis], "epochs": base.get("epochs"),
                    "epochs_doubled": row.get("epochs"), "error": selected_or_final(base),
                    "error_doubled": selected_or_final(row), "change": change, "final_change": final,
                    "selection": base.get("selection"), "converged": abs(change) < CONVERGED,
                    "train_loss": base.get("final_train_loss"), "train_loss_doubled": row.get("final_train_loss")})
    return out


def doubling_report(checks: Sequence[dict]) -> tuple[dict[str, str], str]:
    """The key number and the verdict's closing sentence of the epoch-doubling ``checks`` ({} and "" without)."""
    if not checks:
        return {}, ""
    what = ("validation-selected" if all(c.get("selection") == "val_error" for c in checks)
            else "final (no validation split)")
    number = "; ".join(f"{c['run']}: {100 * c['error']:.2f} % -> {100 * c['error_doubled']:.2f} % "
                       f"({100 * c['change']:+.2f} points)" for c in checks)
    if all(c["converged"] for c in checks):
        return {f"epoch doubling ({what} test error)": number}, (
            f" Convergence: doubling the epochs moved every checked point's {what} test error by less than "
            f"{100 * CONVERGED:g} points.")
    moved = [c for c in checks if not c["converged"]]
    return {f"epoch doubling ({what} test error)": number}, (
        f" Not converged: doubling the epochs moved the {what} test error of {len(moved)} of the {len(checks)} "
        f"checked points by {100 * CONVERGED:g} points or more ({', '.join(c['run'] for c in moved)}).")


def sign_doubling(parts: Sequence[tuple[str, float | None, float | None]], digits: int = 4) -> list[dict]:
    """The epoch-doubling check of a claim about where loss curves end: ``parts`` are (part, its statistic on
    seed 0's runs, the same statistic on their epoch-doubled copies); a part is converged when the doubled
    statistic has the same sign - the longer run tells the same story. Parts with a missing value are left out."""
    out = []
    for label, base, doubled in parts:
        if base is None or doubled is None:
            continue
        out.append({"run": label, "converged": bool(np.sign(base) == np.sign(doubled) and base != 0),
                    "text": f"{label}: {base:+.{digits}f} -> {doubled:+.{digits}f}",
                    "moved": f"{label} changed sign when the epochs were doubled ({base:+.{digits}f} -> "
                             f"{doubled:+.{digits}f})"})
    return out


def sign_doubling_report(checks: Sequence[dict]) -> tuple[dict[str, str], str]:
    """:func:`doubling_report` for :func:`sign_doubling`'s checks."""
    if not checks:
        return {}, ""
    number = {"epoch doubling (seed 0's statistics, as trained -> doubled)": "; ".join(c["text"] for c in checks)}
    moved = [c for c in checks if not c["converged"]]
    if not moved:
        return number, " Convergence: doubling the epochs of seed 0's runs left the sign of every checked statistic."
    return number, (f" Not converged: doubling the epochs of seed 0's runs changed the sign of {len(moved)} of the "
                    f"{len(checks)} checked statistics ({', '.join(c['run'] for c in moved)}).")


def convergence(checks: Sequence[dict]) -> tuple[bool | None, str]:
    """(converged, where not): None without checks, False when a checked point moved by :data:`CONVERGED` or more
    (or, for :func:`sign_doubling`'s checks, changed sign)."""
    if not checks:
        return None, ""
    moved = [c for c in checks if not c["converged"]]
    return not moved, "; ".join(c.get("moved") or f"{c['run']} moved {100 * c['change']:+.2f} points when its "
                                f"epochs were doubled" for c in moved)


def decided_value(rows: Sequence[dict], preferred: str) -> tuple[str, str]:
    """The column a verdict reads: ``preferred`` ("final_test_error" or "selected_test_error"); the final error,
    said, when some finished run has no validation split."""
    if preferred == "selected_test_error" and any(r.get("selected_test_error") is None for r in finished(rows)):
        return "final_test_error", ("runs without a validation split (none selects an epoch): decided on the final "
                                    "epoch's test error")
    return preferred, ""


def sampling_error(rows: Sequence[dict], key: str = "final_test_error") -> str:
    """The test-set sampling error of one run's error, binomial √(p(1 − p)/n) at the mean error and test size."""
    from .rules import binomial_error

    done = [r for r in finished(rows) if r.get(key) is not None and r.get("n_test")]
    if not done:
        return ""
    p = float(np.mean([r[key] for r in done]))
    n = int(min(r["n_test"] for r in done))
    count = f"{n:,}".replace(",", " ")
    return f"test-set sampling error ±{100 * binomial_error(p, n):.2f} points (binomial, n_test = {count})"


def one_data_set(rows: Sequence[dict]) -> str:
    """The sentence every report carries: on which data set its verdict rests."""
    data = sorted({str(r.get("dataset")) for r in rows if r.get("dataset")})
    if not data:
        return ""
    titles = {"fashion-mnist": "Fashion-MNIST", "mnist": "MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
              "stl10": "STL-10", "digits": "scikit-learn's 8×8 digits", "imagenet": "ImageNet-1k"}
    names = ", ".join(titles.get(d, d) for d in data)
    return (f"This verdict rests on one data set: {names}." if len(data) == 1
            else f"This verdict rests on the data sets {names}.")


def val_overfitting(curve: Sequence[dict]) -> float | None:
    """How far the test loss rises after the epoch the validation split selects: the final test loss minus the
    test loss at the epoch of the lowest validation loss (ties: the earliest). None without a validation split."""
    val = [(m.get("val_loss"), i) for i, m in enumerate(curve) if isinstance(m.get("val_loss"), (int, float))]
    if not val:
        return None
    best = min(val)[1]
    return float(curve[-1]["test_loss"] - curve[best]["test_loss"])


def balance_minimum(points: Sequence[dict]) -> dict[str, Any] | None:
    """The (C, S) point of lowest ``mean`` error and how far it is from C = S.

    Returns the point's C, S and mean, ``log_ratio`` = |log₂(C/S)|, the sweep's smallest |log₂(C/S)|
    (``closest``), and ``at_balance``: the minimum lies on one of the pairs closest to C = S (a mirrored pair
    (a, b), (b, a) shares its distance). None without points.
    """
    points = [p for p in points if p.get("mean") is not None]
    if not points:
        return None
    best = min(points, key=lambda p: p["mean"])
    distance = {id(p): abs(math.log2(p["C"] / p["S"])) for p in points}
    closest = min(distance.values())
    return {"C": best["C"], "S": best["S"], "mean": best["mean"], "log_ratio": distance[id(best)],
            "closest": closest, "at_balance": math.isclose(distance[id(best)], closest, abs_tol=1e-9)}


def balance_verdict(runs: Sequence[dict], rule: Rule, claim: str) -> Verdict:
    """``rule`` on how much lower the error is at the pairs closest to C = S than at any other pair (Fig. 6,
    Fig. S.3): the mean over seeds of the pairs of smallest |log₂(C/S)| (a mirrored pair (a, b), (b, a) shares
    its distance) minus the lowest mean over seeds among the other pairs, recomputed on every bootstrap resample
    of whole seeds. A minimum of means leans low when there is no effect, so this errs towards "not lowest"
    (conservative for the claim); a minimum within each seed would lean low by a seed's noise, which more seeds
    do not shrink."""
    distance = {(r["C"], r["S"]): round(abs(math.log2(r["C"] / r["S"])), 9) for r in runs}
    pairs = sorted(distance, key=lambda pair: (distance[pair], pair))
    closest = sum(distance[p] == distance[pairs[0]] for p in pairs) if pairs else 0
    table = per_seed_table(runs, lambda r: (r["C"], r["S"]), pairs) if len(pairs) > closest else {}

    def statistic(d: np.ndarray) -> np.ndarray:
        means = d.mean(axis=1)
        return means[:, :closest].mean(axis=1) - means[:, closest:].min(axis=1)

    return bootstrap_verdict(table, rule, claim=claim, statistic=statistic)


def learning_curves(rows: Sequence[dict]) -> dict[str, list[dict[str, Any]]]:
    """Run name -> its per-epoch metrics (epoch, train_loss, test_loss, test_error, lr): the rows' ``curve``."""
    return {row["run"]: list(row.get("curve") or []) for row in rows}


def mean_curve(curves: Sequence[Sequence[dict]], key: str) -> dict[str, np.ndarray]:
    """Epoch-wise mean, min and max of ``key`` over runs, cut to the shortest run."""
    length = min(len(c) for c in curves)
    values = np.array([[epoch[key] for epoch in c[:length]] for c in curves], dtype=np.float64)
    return {"epoch": np.arange(1, length + 1), "mean": values.mean(0), "min": values.min(0), "max": values.max(0)}


def overfitting(curve: Sequence[float]) -> float:
    """How far a test-loss curve rises above its minimum by the end: last − min (≥ 0)."""
    return float(curve[-1] - np.min(curve))


def error_plot(points: Sequence[dict], x: str, series: str, title: str, xlabel: str, *, log_x: bool = True,
               vlines: Sequence[tuple[float, str]] = (), order: Sequence[str] | None = None) -> Figure:
    """Mean test error (%) ± std over seeds against ``x``: one line per value of ``series``, coloured by family.

    ``points`` are :func:`pkmixer.experiments.stats.aggregate` rows; ``vlines`` are (x, label) dashed lines
    (e.g. C = S).
    """
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    names = list(order) if order else list(dict.fromkeys(p[series] for p in points))
    for i, name in enumerate(names):
        group = sorted((p for p in points if p[series] == name and p.get("mean") is not None), key=lambda p: p[x])
        if not group:
            continue
        family = next((f for f in sorted(COLOURS, key=len, reverse=True) if str(name).startswith(f)), None)
        ax.errorbar([p[x] for p in group], [100 * p["mean"] for p in group],
                    yerr=[100 * (p["std"] or 0.0) for p in group], marker="os^Dv"[i % 5], capsize=3, linewidth=1.2,
                    color=COLOURS.get(family), label=str(name))
    for value, label in vlines:
        ax.axvline(value, color="grey", linestyle="--", linewidth=1, label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test error (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    return fig


def conclude(preset: Any, rows: Sequence[dict], scale: str, verdicts: Sequence[Verdict],
             checks: Sequence[dict] = (), value_note: str = "") -> dict[str, Any]:
    """The outcome of a preset's claim (:func:`pkmixer.experiments.rules.outcome`): its regime checked on this
    scale's runs, the epoch-doubling ``checks``, Holm's procedure across the parts; smoke scale never decides.
    Returns the :class:`~pkmixer.experiments.preset.Analysis` fields ``supported``, ``outcome``, ``reason``,
    ``regime``, ``decided_on`` and ``data_set``."""
    from .rules import outcome

    dataset = next((r.get("dataset") for r in rows if r.get("dataset")), None)
    regime = None
    if scale != "smoke" and preset.regime(scale, dataset) is not None:
        regime = preset.regime_check(scale, dataset)
    converged, where = convergence(checks)
    result = outcome(verdicts, regime=regime, converged=converged, convergence=where, decide=scale != "smoke")
    column = {"final_test_error": "the final epoch's test error",
              "selected_test_error": "the test error at the validation-selected epoch"}.get(preset.decided_on,
                                                                                              preset.decided_on)
    decided = f"Decided on {column}: {preset.decided_on_why}." + (f" Here: {value_note}." if value_note else "")
    return {"supported": result.supported, "outcome": result.decision, "reason": result.reason,
            "regime": regime.lines() if regime is not None else [], "decided_on": decided,
            "data_set": one_data_set(rows)}


def headline(fields: dict[str, Any]) -> str:
    """The outcome as the verdict's closing sentence."""
    reason = f" ({fields['reason']})" if fields.get("reason") else ""
    return f" Outcome: {fields['outcome']}{reason}."


def closing(preset: Any, rows: Sequence[dict], scale: str, verdicts: Sequence[Verdict], axis: str,
            value_note: str = "") -> tuple[list[dict], dict[str, str], str, dict[str, Any]]:
    """The end of a preset's analysis: the epoch-doubling checks along ``axis`` (:func:`doubling`), their key
    number, the verdict's closing text (the convergence sentence, :func:`headline`, and at smoke scale that it is
    too short to decide) and the outcome fields (:func:`conclude`)."""
    checks = doubling(rows, axis)
    numbers, text = doubling_report(checks)
    fields = conclude(preset, rows, scale, verdicts, checks, value_note)
    text += headline(fields) + (" (Smoke scale: too short to decide.)" if scale == "smoke" else "")
    return checks, numbers, text, fields


def arm_table(runs: Sequence[dict], key: Any, arms: Sequence[Any], value: str) -> dict[Any, list[float]]:
    """Seed -> [``value`` at each of ``arms``] (``key``: a column or a function of a row), the seeds with every arm
    (:func:`pkmixer.experiments.stats.per_seed_table`)."""
    return per_seed_table(runs, key, list(arms), value)


def power_text(parts: Sequence[tuple[Any, Sequence[float]]], effect: str, seeds: int = 5,
               required: Sequence[bool] | None = None, noise: Any = None) -> str:
    """"power at the paper's effect (how it was read): 0.93 (1000 simulated experiments of ``seeds`` seeds)": how
    often the parts (rule, true arm means) together say supported, with the noise of real runs
    (:data:`pkmixer.experiments.calibration.RESIDUALS`, or ``noise``)."""
    from .calibration import RESIDUALS, simulate_claim

    rates = simulate_claim(parts, seeds, 1000, noise or RESIDUALS, required=required)
    return f"power at the paper's effect ({effect}): {rates['supported']:.2f} (1000 simulated {seeds}-seed experiments)"


def difference_verdict(rule: Any, runs_a: Sequence[dict], runs_b: Sequence[dict], value: str, claim: str,
                       quote: Any = "", extra: str = "", required: bool = True) -> Verdict:
    """An :class:`~pkmixer.experiments.rules.ArmRule` on two arms (A, B) paired by seed."""
    from .rules import arm_verdict

    rows = [dict(r, _arm="A") for r in runs_a] + [dict(r, _arm="B") for r in runs_b]
    return arm_verdict(rule, per_seed_table(rows, "_arm", ["A", "B"], value), claim, quote=quote, extra=extra,
                       required=required)
