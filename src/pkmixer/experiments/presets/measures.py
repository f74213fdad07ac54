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
* :func:`trained`, :func:`doubling`, :func:`doubling_report` - medium scale's epoch-doubling check as fig5 makes it
  (:func:`pkmixer.experiments.presets.recipes.doubled_ends`): the runs the verdicts read, each doubled run
  against its original, and what the report says of them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..stats import Rule, Verdict, bootstrap_verdict, per_seed_table

COLOURS = {"S-Mixer": "tab:red", "RP S-Mixer": "tab:orange", "MLP-Mixer": "tab:red", "RP MLP-Mixer": "tab:orange",
           "SW-MLP": "tab:blue", "Monarch": "tab:purple", "Kronecker": "tab:green"}
# medium scale's convergence check (fig5's): doubling the epochs moves the test error by less than this
CONVERGED = 0.005


def finished(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "finished"]


def trained(rows: Sequence[dict]) -> list[dict]:
    """The finished rows but the epoch-doubling runs (``doubles``), which the verdicts leave out."""
    return [r for r in finished(rows) if not r.get("doubles")]


def doubling(rows: Sequence[dict], axis: str) -> list[dict]:
    """Each finished run trained for twice the epochs (``doubles``) against its original: the family, ``axis``,
    both errors, the change and whether it is below :data:`CONVERGED`."""
    by_name = {r["run"]: r for r in finished(rows)}
    out = []
    for row in finished(rows):
        base = by_name.get(row.get("doubles"))
        if base is None or base["final_test_error"] is None or row["final_test_error"] is None:
            continue
        change = row["final_test_error"] - base["final_test_error"]
        out.append({"run": base["run"], "model": row["model"], axis: row[axis], "epochs": base.get("epochs"),
                    "epochs_doubled": row.get("epochs"), "error": base["final_test_error"],
                    "error_doubled": row["final_test_error"], "change": change,
                    "converged": abs(change) < CONVERGED})
    return out


def doubling_report(checks: Sequence[dict]) -> tuple[dict[str, str], str]:
    """The key number and the verdict's closing sentence of the epoch-doubling ``checks`` ({} and "" without)."""
    if not checks:
        return {}, ""
    number = "; ".join(f"{c['run']}: {100 * c['error']:.2f} % -> {100 * c['error_doubled']:.2f} % "
                       f"({100 * c['change']:+.2f} points)" for c in checks)
    if all(c["converged"] for c in checks):
        return {"epoch doubling": number}, (f" Convergence: doubling the epochs moved every checked point's test "
                                            f"error by less than {100 * CONVERGED:g} points.")
    fell = sum(c["change"] <= -CONVERGED for c in checks)
    rose = sum(c["change"] >= CONVERGED for c in checks)
    parts = ([f"lower at {fell} of them, so those runs are not fully trained"] if fell else []) + \
        ([f"higher at {rose}, where the longer runs overfit instead of training further"] if rose else [])
    return {"epoch doubling": number}, (f" Convergence: doubling the epochs moved the test error of {fell + rose} of "
                                        f"the {len(checks)} checked points by {100 * CONVERGED:g} points or more "
                                        f"(see the epoch-doubling table): {'; '.join(parts)}.")


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
