"""Statistics over seeds: summaries, rank correlation, and verdicts with confidence intervals.

Every number a preset reports about its runs comes from here:

* summaries - :func:`mean_std`, :func:`aggregate` (one row per point: mean, std, n over seeds),
  :func:`format_mean_std`, :func:`gap` (two summaries' difference and pooled std);
* rank correlation - :func:`rank_correlation` (Spearman's ρ, ties averaged: SciPy's);
* per-seed statistics - :func:`per_seed_trend` (within one seed's runs: Spearman ρ or the least-squares slope of
  a value against an ordered factor), :func:`per_seed_difference` (arm A − arm B for the seeds both arms have),
  :func:`per_seed_table` (a seed's value in every arm, for a statistic over arms' means such as the lowest);
* intervals - :func:`bootstrap_interval`: the paired bootstrap over seeds. A seed is the resampling unit: each
  resample draws n seeds with replacement and keeps all of a seed's runs together (whatever arms, widths or
  depths they cover), so the pairing of runs that share a seed (data order, initialisation, permutations, masks)
  is kept. The interval is the *expanded* percentile interval (Hesterberg 2015, "What teachers should know about
  the bootstrap", Sec. 4.1): the percentiles are taken at Φ(−√(n/(n−1))·t_{n−1, (1+level)/2}) instead of
  (1−level)/2, which corrects most of the plain percentile interval's narrowness at small n;
* decisions - a :class:`Rule` (statistic, threshold, direction, level, least number of seeds), declared in a
  preset's code before its runs are read, and :func:`decide`, which turns an estimate and its interval into a
  :class:`Verdict`: **supported** when the whole interval lies on the claimed side of the threshold,
  **contradicted** when it lies wholly on the other side, **undecided** otherwise - when it spans (or touches)
  the threshold, or when there are fewer seeds than the rule needs. Each verdict also carries ``p_against``, the
  one-sided p-value of the data against the claim read off the same resamples (:func:`expanded_p_value`: below
  ``(1 − level)/2`` exactly when the interval lies wholly on the wrong side), so that a claim of several parts
  is contradicted by Holm's step-down procedure across its parts (:func:`holm`, :func:`overall`), not by any
  one part at its own level.

The least number of seeds. A seed-resampling interval of a mean lies inside the range of the n per-seed values,
and that range misses the true value with probability 2·2^−n for any symmetric distribution: a "90 %" interval
from 3 seeds covers at most 75 %, from 4 seeds at most 87.5 %. :func:`seeds_needed` is therefore the smallest n
with 1 − 2^(1−n) ≥ level (at least 3): 5 seeds for a 90 % rule, 4 for 80 %. With fewer the verdict is undecided.

Everything is deterministic: the resamples come from ``numpy.random.default_rng(seed)`` (``seed`` = 0 unless
given), and only NumPy is used.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "undecided"
DIRECTIONS = ("below", "above")  # the claim holds when the statistic lies below / above the threshold
DEFAULT_LEVEL = 0.90
DEFAULT_RESAMPLES = 4000
MIN_SEEDS = 3  # never fewer, whatever the level


# ---- summaries over seeds --------------------------------------------------------------------------------


def finite(value: Any) -> bool:
    """A real, finite number (not a bool)."""
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool) \
        and math.isfinite(value)


def mean_std(values: Iterable[float]) -> dict[str, Any]:
    """{"mean", "std", "n"} of the finite values; std is the sample standard deviation (None below 2 values)."""
    data = [float(v) for v in values if finite(v)]
    n = len(data)
    return {"mean": float(np.mean(data)) if n else None, "std": float(np.std(data, ddof=1)) if n > 1 else None,
            "n": n}


def aggregate(rows: Sequence[dict], by: Sequence[str], value: str = "final_test_error") -> list[dict]:
    """One row per distinct combination of the ``by`` columns (in order of first appearance): those columns
    and the mean, std and n of ``value`` over its rows (the seeds); rows without a finite value are left out."""
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if finite(row.get(value)):
            groups.setdefault(tuple(row.get(k) for k in by), []).append(row[value])
    return [{**dict(zip(by, key)), **mean_std(values)} for key, values in groups.items()]


def format_mean_std(stats: dict[str, Any], percent: bool = False, digits: int | None = None) -> str:
    """``12.34 ± 0.56 % (n=3)``; without a std (one seed): ``12.34 % (n=1)``. ``digits`` decimals; by default
    at least 2 and enough to show the std (else the mean) to 2 significant figures, so that a slope of 1e-4
    does not print as ``0.00 ± 0.00``."""
    if stats.get("mean") is None:
        return "-"
    scale, unit = (100.0, " %") if percent else (1.0, "")
    if digits is None:
        size = abs(stats["std"] if stats.get("std") else stats["mean"]) * scale
        digits = max(2, 1 - math.floor(math.log10(size))) if size > 0 and math.isfinite(size) else 2
    text = f"{stats['mean'] * scale:.{digits}f}"
    if stats.get("std") is not None:
        text += f" ± {stats['std'] * scale:.{digits}f}"
    return f"{text}{unit} (n={stats['n']})"


def gap(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` minus ``b`` for two {"mean", "std", "n"} summaries: the difference, the pooled standard deviation
    √(std_a² + std_b²) (None when a side has one seed) and ``within_noise`` (|difference| ≤ 2 × pooled std).
    Descriptive only: a verdict uses :func:`per_seed_difference` and :func:`bootstrap_interval`."""
    diff = a["mean"] - b["mean"]
    pooled = math.hypot(a["std"], b["std"]) if a.get("std") is not None and b.get("std") is not None else None
    return {"difference": diff, "pooled_std": pooled,
            "within_noise": None if pooled is None else abs(diff) <= 2 * pooled}


# ---- rank correlation ------------------------------------------------------------------------------------


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's ρ of the pairs (``scipy.stats.spearmanr``: ties share their average rank); None with fewer than
    3 distinct x or a constant y (nothing to rank)."""
    from scipy.stats import spearmanr

    pairs = [(float(a), float(b)) for a, b in zip(x, y) if finite(a) and finite(b)]
    if len({a for a, _ in pairs}) < 3 or len({b for _, b in pairs}) < 2:
        return None
    rho = float(spearmanr([a for a, _ in pairs], [b for _, b in pairs]).statistic)
    return max(-1.0, min(1.0, rho)) if math.isfinite(rho) else None


def slope(x: Sequence[float], y: Sequence[float], log_x: bool = False) -> float | None:
    """Least-squares slope of y on x (on log₂ x with ``log_x``); None with fewer than 2 distinct x."""
    pairs = [(float(a), float(b)) for a, b in zip(x, y) if finite(a) and finite(b) and (not log_x or a > 0)]
    if len({a for a, _ in pairs}) < 2:
        return None
    xs = np.array([math.log2(a) if log_x else a for a, _ in pairs])
    ys = np.array([b for _, b in pairs])
    xs = xs - xs.mean()
    return float((xs * (ys - ys.mean())).sum() / (xs * xs).sum())


# ---- per-seed statistics ---------------------------------------------------------------------------------


def _by_seed(rows: Iterable[dict], seed_key: str) -> dict[Any, list[dict]]:
    seeds: dict[Any, list[dict]] = {}
    for row in rows:
        if row.get(seed_key) is not None:
            seeds.setdefault(row[seed_key], []).append(row)
    return seeds


def per_seed_trend(rows: Sequence[dict], x: str | Callable[[dict], float], value: str = "final_test_error", *,
                   kind: str = "spearman", log_x: bool = False, seed_key: str = "seed") -> dict[Any, float]:
    """Seed -> the trend of ``value`` against ``x`` within that seed's rows: Spearman's ρ (``kind="spearman"``)
    or the least-squares slope (``kind="slope"``, against log₂ x with ``log_x``). ``x`` is a column or a function
    of a row. Seeds whose rows cannot be ranked (fewer than 3 distinct x; 2 for a slope) are left out."""
    if kind not in ("spearman", "slope"):
        raise ValueError(f"kind must be 'spearman' or 'slope', not {kind!r}")
    get = x if callable(x) else (lambda row: row.get(x))
    out = {}
    for seed, group in _by_seed(rows, seed_key).items():
        xs, ys = [get(r) for r in group], [r.get(value) for r in group]
        stat = rank_correlation(xs, ys) if kind == "spearman" else slope(xs, ys, log_x)
        if stat is not None:
            out[seed] = stat
    return out


def _paired_means(rows_a: Sequence[dict], rows_b: Sequence[dict], value: str, seed_key: str
                  ) -> dict[Any, tuple[float, float]]:
    """Seed -> (mean ``value`` of arm A's rows, of arm B's), for the seeds with a finite value in both arms (the
    pairing: a seed missing from one arm is dropped from both)."""
    def means(rows: Sequence[dict]) -> dict[Any, float]:
        return {s: float(np.mean(v)) for s, group in _by_seed(rows, seed_key).items()
                if (v := [r[value] for r in group if finite(r.get(value))])}

    a, b = means(rows_a), means(rows_b)
    return {s: (a[s], b[s]) for s in a if s in b}


def per_seed_difference(rows_a: Sequence[dict], rows_b: Sequence[dict], value: str = "final_test_error", *,
                        seed_key: str = "seed") -> dict[Any, float]:
    """Seed -> mean ``value`` of arm A's rows minus arm B's, over the paired seeds."""
    return {s: a - b for s, (a, b) in _paired_means(rows_a, rows_b, value, seed_key).items()}


def per_seed_ratio(rows_a: Sequence[dict], rows_b: Sequence[dict], value: str, *,
                   seed_key: str = "seed") -> dict[Any, float]:
    """Seed -> mean ``value`` of arm A's rows over arm B's, over the paired seeds where B's is not 0."""
    return {s: a / b for s, (a, b) in _paired_means(rows_a, rows_b, value, seed_key).items() if b}


def per_seed_table(rows: Sequence[dict], key: str | Callable[[dict], Any], keys: Sequence[Any],
                   value: str = "final_test_error", *, seed_key: str = "seed") -> dict[Any, list[float]]:
    """Seed -> [mean ``value`` of the seed's rows whose ``key`` (a column or a function of a row) is k, for k in
    ``keys``], for the seeds with a finite value at every k (the pairing: a seed missing an arm is dropped). Its
    values are whole-seed rows for :func:`bootstrap_interval` with a statistic over arms (e.g. a minimum over
    arms of their means over seeds). Such a minimum (maximum) leans below (above) the arms' common mean when
    there is no effect, so a rule on it errs that way more often than its level says: a preset that uses one
    states which way."""
    get = key if callable(key) else (lambda row: row.get(key))
    out = {}
    for seed, group in _by_seed(rows, seed_key).items():
        cells = [[r[value] for r in group if get(r) == k and finite(r.get(value))] for k in keys]
        if keys and all(cells):
            out[seed] = [float(np.mean(c)) for c in cells]
    return out


# ---- the paired bootstrap over seeds ---------------------------------------------------------------------


def tail_probability(n: int, level: float, expand: bool = True) -> float:
    """The lower percentile (as a probability) of the bootstrap interval: (1 − level)/2, or with ``expand`` the
    expanded percentile Φ(−√(n/(n−1))·t_{n−1, (1+level)/2})."""
    alpha = (1 - level) / 2
    if not expand or n < 2:
        return alpha
    from scipy.stats import norm, t

    return float(norm.cdf(-math.sqrt(n / (n - 1)) * t.ppf(1 - alpha, n - 1)))


def expanded_p_value(share: float, n: int, resamples: int = DEFAULT_RESAMPLES) -> float:
    """The one-sided p-value that matches the expanded percentile interval: ``share`` is the fraction of resampled
    statistics on the claimed side of the threshold; the interval at level ℓ lies wholly on the other side exactly
    when ``share`` < :func:`tail_probability` (n, ℓ), i.e. when this p-value is below (1 − ℓ)/2. Inverting
    Φ(−√(n/(n−1))·t_{n−1, 1−α}) = share gives α = T_{n−1}(Φ⁻¹(share)·√((n−1)/n)); a share of 0 counts as half a
    resample."""
    from scipy.stats import norm, t

    if n < 2:
        return 1.0
    share = min(1.0, max(float(share), 0.5 / resamples))
    return float(t.cdf(norm.ppf(share) * math.sqrt((n - 1) / n), n - 1))


def seeds_needed(level: float) -> int:
    """The least number of seeds for which an interval that resamples them can reach ``level`` (the range of n
    values covers a symmetric distribution's centre with probability 1 − 2^(1−n)); at least :data:`MIN_SEEDS`."""
    n = MIN_SEEDS
    while 1 - 2.0 ** (1 - n) < level:
        n += 1
    return n


def _mean_over_seeds(resamples: np.ndarray) -> np.ndarray:
    return resamples.mean(axis=1)


def bootstrap_interval(samples: Any, statistic: Callable[[np.ndarray], np.ndarray] | None = None, *,
                       level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                       expand: bool = True) -> tuple[float, tuple[float, float]]:
    estimate, interval, _ = bootstrap_resamples(samples, statistic, level=level, resamples=resamples, seed=seed,
                                                expand=expand)
    return estimate, interval


def bootstrap_resamples(samples: Any, statistic: Callable[[np.ndarray], np.ndarray] | None = None, *,
                        level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                        expand: bool = True) -> tuple[float, tuple[float, float], np.ndarray]:
    """(estimate, (low, high), the finite resampled values): the paired bootstrap over seeds of ``statistic``
    (:func:`bootstrap_interval` returns the first two).

    ``samples`` has one entry per seed along its first axis - a number (e.g. a seed's difference of errors or
    its Spearman ρ), or a row of values (a seed's errors at every width or arm, NaN where a run is missing), so
    that resampling a seed keeps its runs together. ``statistic`` maps an array of shape (B, n, ...) of B data
    sets of n seeds to B values; the default is the mean over seeds. The estimate is ``statistic`` of the data
    itself; the interval the expanded percentile interval (module docstring; ``expand=False``: plain
    percentiles) of ``resamples`` resamples drawn with ``numpy.random.default_rng(seed)``.
    """
    data = np.asarray(samples, dtype=np.float64)
    if data.ndim == 0 or data.shape[0] < 2:
        raise ValueError("the bootstrap needs at least 2 seeds")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    statistic = statistic or _mean_over_seeds
    n = data.shape[0]
    estimate = float(statistic(data[None])[0])
    index = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = np.asarray(statistic(data[index]), dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("the statistic is not finite on any resample")
    tail = tail_probability(n, level, expand)
    low, high = np.quantile(values, [tail, 1 - tail])
    return estimate, (float(low), float(high)), values


# ---- rules and verdicts ----------------------------------------------------------------------------------


def _number(value: float, digits: int, signed: bool = True) -> str:
    return f"{value:{'+' if signed else ''}.{digits}f}".replace("-", "−")


@dataclass(frozen=True)
class Rule:
    """A decision rule, declared in a preset's code before its runs are read.

    The claim holds when ``statistic`` lies ``direction`` ("below" or "above") ``threshold``. A verdict is
    supported when the whole ``level`` interval lies on that side, contradicted when it lies wholly on the other
    side, undecided otherwise or with fewer than ``min_seeds`` seeds (None: :func:`seeds_needed` of the level).
    ``scale`` and ``unit`` only change how numbers print (e.g. 100 and " points" for errors as fractions).
    """

    statistic: str
    threshold: float = 0.0
    direction: str = "below"
    level: float = DEFAULT_LEVEL
    min_seeds: int | None = None
    resamples: int = DEFAULT_RESAMPLES
    scale: float = 1.0
    unit: str = ""
    digits: int = 2

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {self.direction!r}")
        if not 0 < self.level < 1:
            raise ValueError(f"level must lie in (0, 1), got {self.level}")

    @property
    def seeds(self) -> int:
        """The least number of seeds this rule decides with."""
        return max(MIN_SEEDS, self.min_seeds) if self.min_seeds is not None else seeds_needed(self.level)

    def side(self) -> str:
        return ("<" if self.direction == "below" else ">") + " " + \
            _number(self.threshold * self.scale, self.digits).lstrip("+") + self.unit

    def text(self) -> str:
        level, side = f"{100 * self.level:g} %", self.side()
        other = ("> " if self.direction == "below" else "< ") + side.split(" ", 1)[1]
        return (f"{self.statistic}: supported when its whole {level} paired-bootstrap interval over seeds is "
                f"{side}, contradicted when it is wholly {other}, undecided otherwise or with fewer than "
                f"{self.seeds} seeds")


@dataclass(frozen=True)
class Verdict:
    """One part of a claim decided by a :class:`Rule`: the estimate, its interval and the decision."""

    claim: str  # the part of the paper's claim, e.g. "S-Mixer, Ω = 2^15: error falls with width"
    statistic: str
    estimate: float | None
    interval: tuple[float, float] | None
    level: float
    threshold: float
    direction: str
    decision: str  # supported | contradicted | undecided
    rule: str  # the rule's text
    seeds: int  # how many seeds the statistic was computed from
    note: str = ""  # why it is undecided, when it is for want of data
    scale: float = 1.0
    unit: str = ""
    digits: int = 2
    p_against: float | None = None  # one-sided p-value of the data against this part (expanded_p_value)
    required: bool = True  # False: the part can contradict the claim but its support is not needed (a refutation)
    quote: str = ""  # the paper's words this part tests, with their section
    margins: tuple = ()  # ((threshold, decision), ...): the verdict across a range of margins, for vague words
    margin_unit: str | None = None  # what the margins count, where not the statistic's scale and unit
    extra: str = ""  # what the report prints beside the interval (power, test-set sampling error)

    @property
    def supported(self) -> bool | None:
        return {SUPPORTED: True, CONTRADICTED: False}.get(self.decision)

    def formatted(self) -> dict[str, str]:
        """The estimate, the interval and the threshold side as printed."""
        def num(v: float) -> str:
            return _number(v * self.scale, self.digits)

        bound = num(self.threshold).lstrip("+") + self.unit
        side = f"inside ±{bound}" if self.direction == "inside" else \
            ("<" if self.direction == "below" else ">") + " " + bound
        return {"estimate": "-" if self.estimate is None else num(self.estimate) + self.unit,
                "interval": "-" if self.interval is None else
                f"[{num(self.interval[0])}, {num(self.interval[1])}]{self.unit}",
                "level": f"{100 * self.level:g} %", "claimed": side}

    def text(self) -> str:
        """``claim: statistic = −0.93, 90 % interval [−1.00, −0.80] over 5 seeds (claim: < 0) - supported``."""
        f = self.formatted()
        body = f"{self.statistic} = {f['estimate']}"
        if self.interval is not None:
            body += f", {f['level']} interval {f['interval']}"
        body += f" over {self.seeds} seed{'s' if self.seeds != 1 else ''} (claim: {f['claimed']})"
        tail = f" ({self.note})" if self.note else ""
        return f"{self.claim}: {body} - {self.decision}{tail}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = None if self.interval is None else list(self.interval)
        out["margins"] = [list(m) for m in self.margins]
        return out


def decide(estimate: float | None, interval: tuple[float, float] | None, rule: Rule, seeds: int,
           claim: str = "", note: str = "", p_against: float | None = None) -> Verdict:
    """The :class:`Verdict` of ``rule`` on an estimate and its interval from ``seeds`` seeds (see the module
    docstring); no estimate or interval, or fewer seeds than the rule needs, is undecided."""
    lo_hi = None if interval is None else (float(interval[0]), float(interval[1]))
    decision = UNDECIDED
    if seeds == 0:
        note = note or "no seed has enough finished runs for the statistic"
    elif seeds < rule.seeds:
        note = note or f"{seeds} seed{'s' if seeds != 1 else ''}: a {100 * rule.level:g} % rule needs {rule.seeds}"
    elif estimate is None or lo_hi is None or not all(map(math.isfinite, lo_hi)):
        note = note or "no interval"
    else:
        low, high = lo_hi
        below, above = high < rule.threshold, low > rule.threshold
        if below or above:
            decision = SUPPORTED if below == (rule.direction == "below") else CONTRADICTED
    return Verdict(claim=claim, statistic=rule.statistic, estimate=estimate, interval=lo_hi, level=rule.level,
                   threshold=rule.threshold, direction=rule.direction, decision=decision, rule=rule.text(),
                   seeds=seeds, note=note, scale=rule.scale, unit=rule.unit, digits=rule.digits,
                   p_against=p_against if decision != UNDECIDED or seeds >= rule.seeds else None)


def bootstrap_verdict(samples: Mapping[Any, Any] | Sequence[Any], rule: Rule, claim: str = "",
                      statistic: Callable[[np.ndarray], np.ndarray] | None = None, seed: int = 0) -> Verdict:
    """:func:`decide` on :func:`bootstrap_interval` of per-seed ``samples`` (a mapping seed -> value or row, or a
    sequence with one entry per seed); the default statistic is the mean over seeds."""
    values = list(samples.values()) if isinstance(samples, Mapping) else list(samples)
    n = len(values)
    if n < 2:
        estimate = float(np.asarray(values[0], dtype=np.float64).mean()) if n and statistic is None else None
        if n and statistic is not None:
            estimate = float(statistic(np.asarray(values, dtype=np.float64)[None])[0])
        return decide(estimate, None, rule, n, claim)
    estimate, interval, resampled = bootstrap_resamples(values, statistic, level=rule.level,
                                                         resamples=rule.resamples, seed=seed)
    claimed = resampled <= rule.threshold if rule.direction == "below" else resampled >= rule.threshold
    p = expanded_p_value(float(np.mean(claimed)), n, rule.resamples) if n >= rule.seeds else None
    return decide(estimate, interval, rule, n, claim, p_against=p)


def trend_verdict(rows: Sequence[dict], x: str | Callable[[dict], float], rule: Rule, claim: str = "", *,
                  value: str = "final_test_error", kind: str = "spearman", log_x: bool = False,
                  seed_key: str = "seed") -> Verdict:
    """The mean over seeds of :func:`per_seed_trend`, bootstrapped over seeds and decided by ``rule``."""
    return bootstrap_verdict(per_seed_trend(rows, x, value, kind=kind, log_x=log_x, seed_key=seed_key), rule, claim)


def difference_verdict(rows_a: Sequence[dict], rows_b: Sequence[dict], rule: Rule, claim: str = "", *,
                       value: str = "final_test_error", seed_key: str = "seed") -> Verdict:
    """The mean over paired seeds of arm A − arm B (:func:`per_seed_difference`), bootstrapped and decided."""
    return bootstrap_verdict(per_seed_difference(rows_a, rows_b, value, seed_key=seed_key), rule, claim)


def interval_text(samples: Mapping[Any, float] | Sequence[float], *, level: float = DEFAULT_LEVEL, digits: int = 2,
                  scale: float = 1.0, unit: str = "", signed: bool = True) -> str:
    """A descriptive number with its interval: ``−0.93, 90 % interval [−1.00, −0.80] (5 seeds)`` - the mean of
    per-seed values and :func:`bootstrap_interval`; ``−0.93 (1 seed: no interval)`` below 2 seeds. ``signed``:
    a sign on every number (differences); without, plain numbers (ratios)."""
    values = [float(v) for v in (samples.values() if isinstance(samples, Mapping) else samples)]
    n = len(values)
    if n == 0:
        return "- (no seed)"
    if n < 2:
        return f"{_number(values[0] * scale, digits, signed)}{unit} (1 seed: no interval)"
    estimate, (low, high) = bootstrap_interval(values, level=level)
    low_text, high_text = _number(low * scale, digits, signed), _number(high * scale, digits, signed)
    return (f"{_number(estimate * scale, digits, signed)}{unit}, {100 * level:g} % interval [{low_text}, "
            f"{high_text}]{unit} ({n} seeds)")


def holm(p_values: Sequence[float | None], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which of the hypotheses with these p-values are rejected at family-wise level
    ``alpha`` (None: a part without a p-value, never rejected). The i-th smallest of k p-values is compared with
    alpha/(k − i + 1), stopping at the first that is not below."""
    order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (len(order) - rank):
            break
        rejected[i] = True
    return rejected


def contradicted_parts(verdicts: Sequence[Verdict]) -> list[bool]:
    """Which parts are contradicted after Holm's procedure across the parts that carry a p-value, at the one-sided
    level (1 − level)/2 of the parts' rules (the highest level among them); a part without a p-value (built by :func:`decide` from an interval
    alone) keeps its own decision."""
    if not verdicts:
        return []
    alpha = (1 - max(v.level for v in verdicts)) / 2
    rejected = holm([v.p_against for v in verdicts], alpha)
    return [r if v.p_against is not None else v.decision == CONTRADICTED for v, r in zip(verdicts, rejected)]


def overall(verdicts: Sequence[Verdict]) -> bool | None:
    """A claim made of parts: False when a part is contradicted after Holm's procedure across the parts
    (:func:`contradicted_parts`), True when every required part is supported (each at its own level: the claim
    is their intersection), else None (also None without parts). Parts that are not tested (a decision outside
    supported / contradicted / undecided, e.g. "not testable here") are left out."""
    tested = [v for v in verdicts if v.decision in (SUPPORTED, CONTRADICTED, UNDECIDED)]
    if any(contradicted_parts(tested)):
        return False
    required = [v for v in tested if v.required]
    if required and all(v.decision == SUPPORTED for v in required):
        return True
    return None


def summary(verdicts: Sequence[Verdict]) -> str:
    """The verdicts' texts, one sentence."""
    return "; ".join(v.text() for v in verdicts) + "." if verdicts else ""
