"""Decision rules read from the paper's words, and the outcome of a claim made of parts.

:mod:`pkmixer.experiments.stats` decides one statistic against one threshold. The claims of Hayase & Karakida
need a few shapes more, each fixed in a preset's code (module constants) before any run is read:

* :class:`ArmRule` - a statistic of the arms' means over seeds (the arms: the widths of a sweep, the (C, S) pairs,
  two models), bootstrapped by resampling whole seeds (a seed's runs stay together). It is vectorised over
  experiments: :func:`evaluate` takes data of shape (experiments, seeds, arms), so that the same code decides a
  report (one experiment) and a calibration (thousands of simulated ones, :mod:`.calibration`). Its claim is
  "below" or "above" a threshold, or "inside" (−tolerance, +tolerance); its ``margins`` print the verdict across a
  range of thresholds where the paper's words are vague ("comparable", "around", "almost").
* :func:`trend_parts` - "the error falls as the width grows": the least-squares slope of the error on log₂ of the
  width, claimed < 0, *and* the widest arm no worse than the next-widest by more than a declared margin. A U-shape
  whose far end rises passes a rank correlation; it does not pass the second part.
* :class:`AlikeRules` - "the two families show similar tendencies": the difference of their slopes on log₂ width
  within a declared margin (an equivalence interval), contradicted when it lies wholly outside.
* :func:`around_parts` - "lowest around C = S": the quadratic in x = log₂(C/S) fitted to the arms' means falls up
  to one grid step below C = S and rises from one grid step above it; both slopes are required (together: the
  fitted minimum lies within one step and the fit is convex, which tied arms never give), and either, of the
  wrong sign, contradicts the claim.
* Outcomes - beside supported / contradicted / undecided, a claim can be :data:`OUT_OF_REGIME` (the runs do not
  reach the quantities its mechanism names: :mod:`.regime`), :data:`NOT_CONVERGED` (doubling the epochs moved a
  checked point's validation-selected error by 0.5 points or more) or :data:`NOT_TESTABLE` (existential, or about
  data sets we do not have). :func:`outcome` combines them with the parts' verdicts, contradicted parts decided by
  Holm's procedure across the parts (:func:`pkmixer.experiments.stats.overall`).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .stats import (CONTRADICTED, DEFAULT_LEVEL, DEFAULT_RESAMPLES, SUPPORTED, UNDECIDED, Verdict, contradicted_parts,
                    expanded_p_value, overall, seeds_needed, tail_probability)

OUT_OF_REGIME, NOT_CONVERGED, NOT_TESTABLE = "out of regime", "not converged", "not testable here"
OUTCOMES = (SUPPORTED, CONTRADICTED, UNDECIDED, OUT_OF_REGIME, NOT_CONVERGED, NOT_TESTABLE)
CLAIMS = ("below", "above", "inside")
FAR = 1e6  # the vertex of a fit that is not convex: outside any tolerance, on the side where the fit is lower
_CODES = {0: UNDECIDED, 1: SUPPORTED, -1: CONTRADICTED}
# The level of these rules' two-sided intervals (each side errs at most (1 − LEVEL)/2 = 4 %). Student's t is exact
# for normal noise; with the residuals of real runs (calibration.RESIDUALS: skewed, two large negative values) a
# 90 % t interval erred 5.7-6.2 % on one side at the boundary of a claim in 20 000 simulated 5-seed experiments,
# at 92 % 4.5-5.0 % (tests/test_calibration.py). 5 seeds still decide at 92 % (1 − 2⁻⁴ ≥ 0.92).
LEVEL = 0.92


@dataclass(frozen=True)
class Quote:
    """The paper's words a part tests: the sentence, as printed, and where it stands."""

    section: str  # e.g. "Sec. 4.2" or "Fig. 6 caption"
    text: str

    def __str__(self) -> str:
        return f"“{self.text}” ({self.section})"


@dataclass(frozen=True)
class ArmRule:
    """A statistic of the arms' means over seeds and the side of a threshold (or the interval) the claim predicts.

    ``function`` maps arm means of shape (..., arms) to the statistic (...); it is applied to the means of each
    resample of whole seeds. Supported when the whole ``level`` interval lies on the claimed side (for "inside":
    within (−tolerance, +tolerance)), contradicted when it lies wholly on the other side ("inside" never
    contradicts alone: a refutation part does), undecided otherwise or with fewer seeds than the level needs.
    ``margins``: the thresholds (tolerances) at which the report also prints the decision, where the words are
    vague; ``reason`` says why ``threshold`` (``tolerance``) is what it is."""

    statistic: str
    function: Callable[[np.ndarray], np.ndarray]
    claim: str = "below"
    threshold: float = 0.0
    tolerance: float = 0.0
    level: float = LEVEL
    resamples: int = DEFAULT_RESAMPLES
    scale: float = 1.0
    unit: str = ""
    digits: int = 2
    margins: tuple[float, ...] = ()
    reason: str = ""

    def __post_init__(self):
        if self.claim not in CLAIMS:
            raise ValueError(f"claim must be one of {CLAIMS}, not {self.claim!r}")

    @property
    def seeds(self) -> int:
        return seeds_needed(self.level)

    @property
    def bound(self) -> float:
        return self.tolerance if self.claim == "inside" else self.threshold

    def side(self, bound: float | None = None) -> str:
        b = self.bound if bound is None else bound
        text = _number(b * self.scale, self.digits, signed=False)
        return {"below": f"< {text}", "above": f"> {text}", "inside": f"inside ±{text}"}[self.claim] + self.unit

    def text(self) -> str:
        level = f"{100 * self.level:g} %"
        other = {"below": "wholly above", "above": "wholly below", "inside": None}[self.claim]
        tail = f", contradicted when it lies {other} it" if other else " (it never contradicts alone)"
        why = f" ({self.reason})" if self.reason else ""
        return (f"{self.statistic}: supported when its whole {level} paired-bootstrap interval over seeds is "
                f"{self.side()}{why}{tail}, undecided otherwise or with fewer than {self.seeds} seeds")

    def fingerprint(self) -> str:
        """What decides: the statistic's name and code, the side, the bound, the level, the margins."""
        code = getattr(self.function, "__code__", None)
        body = (self.statistic, self.claim, self.threshold, self.tolerance, self.level, self.resamples,
                self.margins, getattr(self.function, "__qualname__", repr(self.function)),
                code.co_code.hex() if code is not None else "", repr(getattr(self.function, "__defaults__", None)),
                repr([getattr(c, "cell_contents", None) for c in (getattr(self.function, "__closure__", None) or ())]))
        return hashlib.sha256(repr(body).encode()).hexdigest()[:16]


def _number(value: float, digits: int, signed: bool = True) -> str:
    return f"{value:{'+' if signed else ''}.{digits}f}".replace("-", "−")


# ---- statistics of arm means (vectorised over leading axes) -----------------------------------------------


def slope_weights(x: Sequence[float]) -> np.ndarray:
    """w such that w · y is the least-squares slope of y on ``x``."""
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()) / np.sum((x - x.mean()) ** 2)


def slope_on(x: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """The least-squares slope of the arms' means on ``x`` (e.g. log₂ width)."""
    weights = slope_weights(x)

    def slope(means: np.ndarray) -> np.ndarray:
        return means @ weights
    slope.linear = True
    return slope


def contrast(weights: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """A linear combination of the arms' means, e.g. (1, −1) for arm A − arm B."""
    w = np.asarray(weights, dtype=np.float64)

    def combination(means: np.ndarray) -> np.ndarray:
        return means @ w
    combination.linear = True
    return combination


def absolute(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """|``function``|: for "comparable" (|Δ| within a margin)."""
    def magnitude(means: np.ndarray) -> np.ndarray:
        return np.abs(function(means))
    return magnitude


def vertex_on(x: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """Where the quadratic a + b·x + c·x² fitted (least squares) to the arms' means is lowest: −b/(2c) when c > 0;
    when the fit is not convex, ±:data:`FAR` on the side where it is lower (no minimum inside the grid)."""
    x = np.asarray(x, dtype=np.float64)
    projection = np.linalg.pinv(np.stack([np.ones_like(x), x, x * x], axis=1))  # (3, arms)

    def vertex(means: np.ndarray) -> np.ndarray:
        coef = means @ projection.T
        b, c = coef[..., 1], coef[..., 2]
        convex = c > 1e-12 * (1 + np.abs(b))
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(convex, -b / (2 * np.where(convex, c, 1.0)), -np.sign(b + (b == 0)) * FAR)
        return np.clip(v, -FAR, FAR)
    return vertex


# ---- evaluation (vectorised over experiments) ---------------------------------------------------------------


def evaluate(rule: ArmRule, data: np.ndarray, seed: int = 0, chunk: int = 256) -> dict[str, np.ndarray]:
    """Decide ``rule`` on every experiment of ``data`` (experiments, seeds, arms): the estimate (the statistic of
    the arms' means), the expanded percentile interval over ``rule.resamples`` resamples of whole seeds (the same
    resamples for every experiment, ``numpy.random.default_rng(seed)``), ``p_against`` (one-sided, against the
    claim; 1 for "inside") and the decision code (1 supported, −1 contradicted, 0 undecided), and the codes at each
    of ``rule.margins`` (``margin_codes``: experiments × margins)."""
    data = np.asarray(data, dtype=np.float64)
    if data.ndim != 3:
        raise ValueError("data must have shape (experiments, seeds, arms)")
    B, n, _ = data.shape
    estimate = rule.function(data.mean(axis=1))
    out = {"estimate": estimate, "low": np.full(B, np.nan), "high": np.full(B, np.nan),
           "p_against": np.ones(B), "code": np.zeros(B, dtype=int),
           "margin_codes": np.zeros((B, len(rule.margins)), dtype=int)}
    if n < 2:
        return out
    if getattr(rule.function, "linear", False):
        return _evaluate_linear(rule, data, out)
    index = np.random.default_rng(seed).integers(0, n, size=(rule.resamples, n))
    tail = tail_probability(n, rule.level)
    bounds = (rule.bound, *rule.margins)
    claimed = np.empty((B, len(bounds)))
    for start in range(0, B, chunk):
        part = data[start:start + chunk]
        means = part[:, index].mean(axis=2)  # (b, resamples, arms)
        values = rule.function(means)  # (b, resamples)
        out["low"][start:start + chunk], out["high"][start:start + chunk] = \
            np.quantile(values, [tail, 1 - tail], axis=1)
        for j, b in enumerate(bounds):
            claimed[start:start + chunk, j] = _claimed(rule.claim, values, b).mean(axis=1)
    codes = np.stack([_code(rule.claim, out["low"], out["high"], b, contradicts=False) for b in bounds], axis=1)
    if n < rule.seeds:
        codes[:] = 0
    out["code"], out["margin_codes"] = codes[:, 0], codes[:, 1:]
    if rule.claim != "inside":
        out["p_against"] = np.array([expanded_p_value(s, n, rule.resamples) for s in claimed[:, 0]])
    return out


def _t_decision(rule: ArmRule, mean: np.ndarray, se: np.ndarray, n: int, out: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """Student's t interval mean ± t_{n−1}·se, the decisions at the bound and the margins, and the one-sided
    p-value against the claim."""
    from scipy.stats import t

    half = t.ppf(1 - (1 - rule.level) / 2, n - 1) * se
    out["low"], out["high"] = mean - half, mean + half
    bounds = (rule.bound, *rule.margins)
    codes = np.stack([_code(rule.claim, out["low"], out["high"], b) for b in bounds], axis=1)
    if n < rule.seeds:
        codes[:] = 0
    out["code"], out["margin_codes"] = codes[:, 0], codes[:, 1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        score = (mean - rule.bound) / np.where(se > 0, se, np.nan)
    if rule.claim == "inside":  # against the claim: beyond +bound, or beyond −bound (nearly disjoint events)
        with np.errstate(divide="ignore", invalid="ignore"):
            up, down = (mean - rule.bound) / se, (mean + rule.bound) / se
        p = np.minimum(t.sf(up, n - 1), t.cdf(down, n - 1))
        out["p_against"] = np.where(np.isfinite(p), p, np.where(np.abs(mean) > rule.bound, 0.0, 1.0))
        return out
    if rule.claim == "below":  # against the claim: large values
        p = t.sf(score, n - 1)
    else:
        p = t.cdf(score, n - 1)
    wrong_side = (mean > rule.bound) if rule.claim == "below" else (mean < rule.bound)
    out["p_against"] = np.where(np.isfinite(p), p, np.where(wrong_side, 0.0, 1.0))
    return out


def _evaluate_linear(rule: ArmRule, data: np.ndarray, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A statistic linear in the arms' means is the mean over seeds of its per-seed values: Student's t interval
    and one-sided p-value on those (exact for normal noise; the bootstrap percentile interval is too narrow at
    5 seeds, which the calibration tests show)."""
    n = data.shape[1]
    per_seed = rule.function(data)  # (experiments, seeds)
    return _t_decision(rule, per_seed.mean(axis=1), per_seed.std(axis=1, ddof=1) / np.sqrt(n), n, out)


def _claimed(claim: str, values: np.ndarray, bound: float) -> np.ndarray:
    if claim == "below":
        return values <= bound
    if claim == "above":
        return values >= bound
    return np.abs(values) < bound


def _code(claim: str, low: np.ndarray, high: np.ndarray, bound: float, contradicts: bool = True) -> np.ndarray:
    if claim == "inside":
        outside = ((low > bound) | (high < -bound)) & contradicts
        return np.where((low > -bound) & (high < bound), 1, np.where(outside, -1, 0))
    below, above = high < bound, low > bound
    good, bad = (below, above) if claim == "below" else (above, below)
    return np.where(good, 1, np.where(bad, -1, 0))


def arm_verdict(rule: ArmRule, table: Mapping[Any, Sequence[float]], claim: str, *, quote: Quote | str = "",
                required: bool = True, extra: str = "", seed: int = 0) -> Verdict:
    """The :class:`~pkmixer.experiments.stats.Verdict` of ``rule`` on a per-seed table (seed -> [value at each
    arm], :func:`pkmixer.experiments.stats.per_seed_table`)."""
    rows = [list(v) for v in table.values()]
    n = len(rows)
    base = dict(claim=claim, statistic=rule.statistic, level=rule.level, threshold=rule.bound,
                direction=rule.claim, rule=rule.text(), seeds=n, scale=rule.scale, unit=rule.unit,
                digits=rule.digits, required=required, quote=str(quote), extra=extra)
    if n == 0:
        return Verdict(estimate=None, interval=None, decision=UNDECIDED,
                       note="no seed has a finished run in every arm", **base)
    result = evaluate(rule, np.asarray(rows, dtype=np.float64)[None], seed=seed)
    estimate = float(result["estimate"][0])
    interval = None if n < 2 else (float(result["low"][0]), float(result["high"][0]))
    note = "" if n >= rule.seeds else f"{n} seed{'s' if n != 1 else ''}: a {100 * rule.level:g} % rule needs {rule.seeds}"
    margins = tuple((m, _CODES[int(c)]) for m, c in zip(rule.margins, result["margin_codes"][0]))
    linear = getattr(rule.function, "linear", False)
    p = float(result["p_against"][0]) if n >= rule.seeds and (linear or rule.claim != "inside") else None
    return Verdict(estimate=estimate, interval=interval, decision=_CODES[int(result["code"][0])], note=note,
                   p_against=p, margins=margins, **base)


def not_testable(claim: str, reason: str, quote: Quote | str = "") -> Verdict:
    """A part of the paper's claim that this repository cannot test (existential, or about data sets we do not
    have), with the reason."""
    return Verdict(claim=claim, statistic="-", estimate=None, interval=None, level=DEFAULT_LEVEL, threshold=0.0,
                   direction="below", decision=NOT_TESTABLE, rule=reason, seeds=0, note=reason, quote=str(quote),
                   required=False)


# ---- the shapes of claim the paper makes -------------------------------------------------------------------


@dataclass(frozen=True)
class TrendRules:
    """"Falls as the width grows": :data:`slope` on log₂ width claimed < 0, and :data:`end` (widest − next-widest)
    claimed below ``margin`` - both required. The margin is the paper's unstated "no worse"; ``margins`` print it
    across a range."""

    margin: float = 0.0025
    margins: tuple[float, ...] = (0.0, 0.0025, 0.005)
    reason: str = ("“no worse” read as at most a quarter point: below the test-set sampling error of one model "
                   "(about 0.3 points at 10 % error on 10 000 images)")
    level: float = LEVEL
    scale: float = 100.0
    unit: str = " points"
    value: str = "error"
    axis: str = "width"
    claim: str = "below"  # "above" for a claim that the value rises (a training loss with sparsity)
    digits: int = 2  # decimals the report prints (a loss's slope needs more than an error's in points)

    def slope(self, log_widths: Sequence[float]) -> ArmRule:
        return ArmRule(f"least-squares slope of the {self.value} on log₂ {self.axis} (means over seeds, per doubling)",
                       slope_on(log_widths), self.claim, 0.0, level=self.level, scale=self.scale, unit=self.unit,
                       digits=self.digits)

    def end(self, widest: Sequence[int], following: Sequence[int], arms: int) -> ArmRule:
        """The end part on arms ``widest`` (the widest width's arms) against arms ``following`` (the next width's)."""
        weights = np.zeros(arms)
        weights[list(widest)] += 1.0 / len(widest)
        weights[list(following)] -= 1.0 / len(following)
        sign = 1.0 if self.claim == "below" else -1.0  # "above": the end part is the next minus the widest
        what = "the widest minus the next-widest" if sign > 0 else "the next-widest minus the widest"
        return ArmRule(f"{self.value} at {what} {self.axis} (means over seeds)", contrast(sign * weights), "below",
                       self.margin, level=self.level, scale=self.scale, unit=self.unit, margins=self.margins,
                       reason=self.reason, digits=self.digits)


def trend_parts(rules: TrendRules, table: Mapping[Any, Sequence[float]], widths: Sequence[float], label: str,
                quote: Quote | str = "", extra: str = "") -> list[Verdict]:
    """The parts of "falls as the width grows" on a per-seed table whose arms have ``widths``: the slope, and with
    three widths or more the end part (arms of equal width, e.g. mirrored (C, S) pairs, count together)."""
    distinct = sorted(set(widths))
    if len(distinct) < 2:
        return []
    grows = "falls" if rules.claim == "below" else "rises"
    parts = [arm_verdict(rules.slope(np.log2(np.asarray(widths, dtype=float))), table,
                         f"{label}: {rules.value} {grows} as the {rules.axis} grows", quote=quote, extra=extra)]
    if len(distinct) >= 3:
        widest = [i for i, w in enumerate(widths) if w == distinct[-1]]
        following = [i for i, w in enumerate(widths) if w == distinct[-2]]
        parts.append(arm_verdict(rules.end(widest, following, len(widths)), table,
                                 f"{label}: the widest {rules.axis} is no worse than the next", quote=quote,
                                 extra=extra))
    return parts


@dataclass(frozen=True)
class AlikeRules:
    """"Similar tendencies" of two families over the same arms: the difference of their least-squares slopes of
    the error on log₂ width (second family minus first, per doubling, seeds paired across the families) claimed
    inside ±``margin``; contradicted when its whole interval lies outside (the trends differ by more)."""

    margin: float = 0.005
    margins: tuple[float, ...] = (0.0025, 0.005, 0.01)
    reason: str = ("“similar” read as slopes that differ by less than half a point per doubling of the width: the "
                   "size of the effect itself (Fig. 5's assumed slope)")
    level: float = LEVEL
    scale: float = 100.0
    unit: str = " points"

    def difference(self, log_widths: Sequence[float]) -> ArmRule:
        """On 2k arms: the first family's k arms, then the second's at the same ``log_widths``."""
        weights = slope_weights(log_widths)
        return ArmRule("difference of the slopes of the error on log₂ width, second family minus first (means "
                       "over seeds, per doubling)", contrast(np.concatenate([-weights, weights])), "inside",
                       tolerance=self.margin, level=self.level, scale=self.scale, unit=self.unit,
                       margins=self.margins, reason=self.reason)


def fitted_slope_at(x: Sequence[float], at: float) -> Callable[[np.ndarray], np.ndarray]:
    """The derivative b + 2c·``at`` of the quadratic a + b·x + c·x² fitted (least squares) to the arms' means: a
    linear combination of the means."""
    x = np.asarray(x, dtype=np.float64)
    projection = np.linalg.pinv(np.stack([np.ones_like(x), x, x * x], axis=1))  # (3, arms)
    return contrast(projection[1] + 2 * at * projection[2])


@dataclass(frozen=True)
class AroundRules:
    """"Lowest around C = S" on arms at x = log₂(C/S): the quadratic fitted to the arms' means falls up to
    x = −τ and rises from x = +τ, τ = ``steps`` grid steps (the grid step: the smallest |x| of the sweep). Both
    slopes are linear in the means (Student's t), both are required - together they say the fitted minimum lies
    inside (−τ, +τ) and the fit is convex - and either, significantly of the wrong sign after Holm's procedure,
    contradicts the claim (the error still falls past τ on that side). Tied arms support neither slope.
    ``margins``: the tolerances in grid steps at which the report also prints the decision."""

    steps: float = 1.0
    margins: tuple[float, ...] = (0.5, 1.0, 1.5)
    reason: str = "“around” read as within one grid step of C = S: the nearest pairs the sweep has"
    level: float = LEVEL

    @staticmethod
    def step(x: Sequence[float]) -> float:
        return float(min(abs(v) for v in x if v != 0))

    def slope(self, x: Sequence[float], side: int, steps: float | None = None) -> ArmRule:
        """The fitted slope at x = side·τ, claimed > 0 on the C > S side (side +1) and < 0 on the other."""
        tau = (self.steps if steps is None else steps) * self.step(x)
        return ArmRule(f"slope of the quadratic in log₂(C/S) fitted to the means over seeds, at log₂(C/S) = "
                       f"{side * tau:+.2f}", fitted_slope_at(x, side * tau), "above" if side > 0 else "below", 0.0,
                       level=self.level, scale=100.0, unit=" points per doubling", reason=self.reason)


def around_parts(rules: AroundRules, table: Mapping[Any, Sequence[float]], x: Sequence[float], label: str,
                 quote: Quote | str = "", extra: str = "") -> list[Verdict]:
    """The two parts of "lowest around C = S" on a per-seed table whose arms sit at x = log₂(C/S) (a sweep with arms
    on both sides of C = S), each with the claim's decision at every tolerance of ``rules.margins`` (grid steps):
    supported there when both slopes are, contradicted when either is."""
    if not any(v > 0 for v in x) or not any(v < 0 for v in x):
        return []
    rows = np.asarray(list(table.values()), dtype=np.float64)
    margins = ()
    if len(rows) >= 2:
        codes = []
        for steps in rules.margins:
            pair = [int(evaluate(rules.slope(x, side, steps), rows[None])["code"][0]) for side in (1, -1)]
            codes.append(SUPPORTED if pair == [1, 1] else CONTRADICTED if -1 in pair else UNDECIDED)
        margins = tuple((m, c) for m, c in zip(rules.margins, codes))
    where = ""
    if len(rows):
        vertex = float(vertex_on(x)(rows.mean(axis=0)))
        where = (f"fitted vertex at log₂(C/S) = {vertex:+.2f} (grid step {rules.step(x):.2f})" if abs(vertex) < FAR
                 else "the fitted quadratic is not convex")
    parts = []
    for side in (1, -1):
        name = "rises from one grid step on the C > S side" if side > 0 else "falls up to one grid step on the C < S side"
        v = arm_verdict(rules.slope(x, side), table, f"{label}: the fitted error {name}", quote=quote,
                        extra="; ".join(e for e in (where, extra) if e))
        parts.append(dataclasses.replace(v, margins=tuple((m * 1.0, c) for m, c in margins),
                                         margin_unit=" grid steps") if margins else v)
    return parts


# ---- the outcome of a claim --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """The decision on a whole claim and why; ``parts``: each part's decision after Holm's procedure."""

    decision: str
    reason: str = ""
    parts: tuple[str, ...] = field(default_factory=tuple)

    @property
    def supported(self) -> bool | None:
        return {SUPPORTED: True, CONTRADICTED: False}.get(self.decision)


def adjusted(verdicts: Sequence[Verdict]) -> list[str]:
    """Each part's decision as the claim reads it: contradicted only after Holm's procedure across the tested parts;
    a part contradicted at its own level but not after Holm is undecided."""
    tested = [i for i, v in enumerate(verdicts) if v.decision in (SUPPORTED, CONTRADICTED, UNDECIDED)]
    flags = contradicted_parts([verdicts[i] for i in tested])
    out = [v.decision for v in verdicts]
    for i, flag in zip(tested, flags):
        out[i] = CONTRADICTED if flag else (UNDECIDED if out[i] == CONTRADICTED else out[i])
    return out


def outcome(verdicts: Sequence[Verdict], *, regime: Any = None, converged: bool | None = None,
            convergence: str = "", decide: bool = True) -> Outcome:
    """The claim's outcome: :data:`NOT_TESTABLE` when no part is testable; :data:`OUT_OF_REGIME` when ``regime``
    (a :class:`pkmixer.experiments.regime.RegimeCheck`) is not reached; :data:`NOT_CONVERGED` when the
    epoch-doubling check failed (``converged`` False, ``convergence`` says where); otherwise supported when every
    required part is, contradicted when a part is after Holm's procedure across the parts, undecided otherwise
    (and always undecided with ``decide`` False, e.g. at smoke scale)."""
    parts = tuple(adjusted(verdicts))
    tested = [v for v in verdicts if v.decision != NOT_TESTABLE]
    if not tested:
        reasons = "; ".join(dict.fromkeys(v.note for v in verdicts if v.note))
        return Outcome(NOT_TESTABLE, reasons, parts)
    if regime is not None and not regime.reached:
        return Outcome(OUT_OF_REGIME, regime.reason(), parts)
    if converged is False:
        return Outcome(NOT_CONVERGED, convergence, parts)
    if not decide:
        return Outcome(UNDECIDED, "this scale does not decide", parts)
    result = overall(tested)
    return Outcome({True: SUPPORTED, False: CONTRADICTED, None: UNDECIDED}[result], "", parts)


def rules_fingerprint(rules: Sequence[Any]) -> str:
    """A hash of the rules that decide a preset (:class:`ArmRule`, :class:`pkmixer.experiments.stats.Rule`,
    :class:`TrendRules`, :class:`AroundRules`, quotes): recorded with the results it decided."""
    parts = []
    for rule in rules:
        parts.append(rule.fingerprint() if isinstance(rule, ArmRule) else repr(rule))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def binomial_error(error: float | None, n_test: int | None) -> float | None:
    """The test-set sampling error of an error rate: √(p(1 − p)/n) (binomial), None without both."""
    if error is None or not n_test or not math.isfinite(error):
        return None
    return math.sqrt(max(error * (1 - error), 0.0) / n_test)
