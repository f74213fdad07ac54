"""Fig. S.1: the trainability of the SW-MLP against its sparsity, and the singular values of random sparse
weights (Hayase & Karakida App. D.1).

Command::

    pkmixer reproduce figs1 --scale paper     # CIFAR-10 (also cifar100, stl10)
    pkmixer reproduce figs1 --scale medium    # all of Fashion-MNIST, 5 seeds (estimated 45 min on 2 cores)
    pkmixer reproduce figs1 --scale small     # Fashion-MNIST, CPU minutes
    pkmixer reproduce figs1 --scale smoke

The paper's claims. Left: at fixed Ω the SW-MLP's trainability falls once its sparsity 1 − p is too high, a
fall the Mixers, whose density cannot go below Ω^{−1/3} (Eq. 15: m ≤ Ω^{2/3}), never show. Centre: the singular
values of a random sparse weight Z = M ⊙ W (m = Ω^{(1+α)/2}, p = Ω^{−α}, K = ZZᵀ over its mean diagonal entry)
peak at zero and spread up to an edge. Right: their largest value grows monotonically with α. Centre and right are
:mod:`pkmixer.theory.spectrum`'s App. D.1 scaling, computed here without training.

What a run shows: the final training loss (the mean mini-batch loss of the last epoch; the training loop records
no training error) and the test error, mean ± std over seeds, of SW-MLPs at densities p = Ω^{−α}, width
m = √(Ω/p), against α = log(1/p)/log Ω and 1 − p, with the S-Mixer at the same Ω (p = (1/C + 1/S)/2, Sec. 4.1)
as a comparison line outside the verdict; the histogram of the singular values pooled over the draws at the centre α;
λ_max (mean ± std over draws) against α beside the Mixer's Marchenko-Pastur edge 2. The verdict has three parts,
each a statistic with its 90 % bootstrap interval and a rule declared below before any run is read
(pkmixer.experiments.stats): over the SW-MLP densities at and beyond the S-Mixer's sparsest, p ≤ Ω^{−1/3} (fixed
in advance rather than a data-chosen optimum), the mean over seeds of the within-seed Spearman
ρ(1 − p, final training loss), claimed > 0 (:data:`LOSS_TREND_RULE`); over the draws (draw k uses seed k at every
α), the mean within-draw Spearman ρ(α, λ_max), claimed > 0 (:data:`SPECTRUM_TREND_RULE`), and the smallest step
of the mean λ_max between neighbouring α, claimed > 0 (:data:`MONOTONE_RULE`). Supported when all three are,
contradicted when any is, undecided otherwise (and with fewer than 5 seeds or draws). Runs that diverge are left
out of the statistics, which can only hide a loss of trainability, and counted in the table. At medium scale the
report adds the epoch-doubling check, left out of the verdict.

Scales:

* ``paper`` - the caption's Ω = 2^16 and five seeds per p; D.1 names neither data nor recipe, so App. C.4's
  CIFAR-10 setting (:func:`.recipes.paper_cifar`, as Fig. 5) and its SW-MLP: S.16 blocks (the caption's "γ set
  according to Golubeva et al." is read as their static-sparsity widening, m = √(Ω/p) for each p), 8 blocks, the
  per-patch FC to 64 channels, dense-masked weights; p = 2^−k for k = 0, 2, 4, 6, 7, 8, 9, 10 (m = 256 ... 8192,
  five densities at p ≤ Ω^{−1/3} = 2^−5.33); S-Mixer at C = 8, 16, 24, 40 (S = 124, 83, 63, 41). 60 runs.
  Spectra: the caption's Ω = 10^3 and 50 draws, α = 0, 0.25, ..., 1.5, the histogram at α = 1.5 (m = 5623, of
  whose rows about 940 hold a weight: the eigen-decomposition of those takes a fraction of a second per draw).
* ``medium`` - the small models with :func:`.recipes.medium` (all 60 000 Fashion-MNIST training and 10 000 test
  images, 10 epochs of AdamW; the bundled digits when Fashion-MNIST is absent), 5 seeds: 50 runs, plus the
  convergence check - the two ends of the verdict's region, the SW-MLP at p = Ω^{−1/3} (m = 256) and at the
  sparsest p (m = 2048), retrained for 20 epochs on seed 0 (2 runs, left out of the verdict). Estimated 45 min
  on 2 cores: small scale's 50 runs took 307 s of run time (3.5 min of wall time), and medium sees 15 times as
  many training images (10 epochs of 60 000 against 4 of 10 000): 39 min, plus 3 for the check and the runs'
  start-up. Spectra as at paper scale (50 draws, 12 s).
* ``small`` - Fashion-MNIST (:func:`.recipes.small`: 10 000 images, 4 epochs of AdamW), Ω = 2^12, 4 blocks,
  p = 4^−k for k = 0 ... 5 (α = k/6, m = 64 ... 2048; CSR weights below p = 1), S-Mixer at C = 2, 4, 8, 16;
  5 seeds: 50 runs. Spectra as at paper scale with 10 draws.
* ``smoke`` - digits, Ω = 2^9, p = 8^−k for k = 0 ... 3, S-Mixer at C = 4, 8, 2 blocks, 1 epoch, 1 seed; spectra
  at Ω = 100, α = 0, 0.5, 1, 1.5, 3 draws.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ...theory.spectrum import alpha_scaling_singular_values, alpha_scaling_size, c_gamma
from ...theory.width import mixer_omega, swmlp_width, symmetric_pairs
from ..preset import Analysis, Preset, register_preset
from ..regime import Departures, Quantity, Regime
from ..rules import ArmRule, Quote, TrendRules, arm_verdict, slope_on, trend_parts
from ..stats import (Rule, aggregate, bootstrap_verdict, format_mean_std, interval_text, per_seed_difference,
                     per_seed_table, per_seed_trend, summary)
from ..sweep import RunSpec
from .. import measures, recipes
from ..measures import COLOURS, doubling, doubling_report, finished

FAMILIES = ("SW-MLP", "S-Mixer")
MODELS = {"SW-MLP": ("swmlp_m1619p4_32", "swmlp_t4_28"), "S-Mixer": ("smixer_c64p4_32", "smixer_t4_28")}  # colour, grey
MIXER_ALPHA = 1 / 3  # the S-Mixer's lowest density p = Ω^{-1/3}, at C = S (Eq. 15; App. D.1: "a = 1/3")
# The paper's words and the rules, fixed before any run is read
QUOTE_LEFT = Quote("Fig. S.1 caption", "(Left) Trainability decreases as the sparsity 1 − p becomes too high.")
QUOTE_MIXER = Quote("App. D.1", "In contrast, we hardly observed such a decrease in performance for the Mixers.")
QUOTE_RIGHT = Quote("Fig. S.1 caption", "(Right) The largest eigenvalue monotonically increases as the sparsity "
                                        "increases.")
LEVEL = 0.92
# trainability: the SW-MLP's final training loss rises with log₂(1/p) over p ≤ Ω^(−1/3), and the sparsest is no
# better trained than the next (within 0.005 nats: a U would pass a rank correlation)
LOSS_TREND = TrendRules(claim="above", value="final training loss", axis="1/p", margin=0.005,
                        margins=(0.0, 0.005, 0.01), scale=1.0, unit="", digits=4,
                        reason="“too high” read as: no sparser point trains better than the next by 0.005 nats")
# "hardly observed such a decrease": the S-Mixer's test error rises by less than a quarter point per halving of its
# density (printed at 0.1, 0.25 and 0.5)
HARDLY = 0.0025


def mixer_rule(inverse_densities: list[float]) -> ArmRule:
    return ArmRule("slope of the S-Mixer's test error on log₂(1/p) (means over seeds, per halving of p)",
                   slope_on(np.log2(inverse_densities)), "below", HARDLY, level=LEVEL, scale=100.0, unit=" points",
                   margins=(0.001, 0.0025, 0.005), reason="“hardly” read as less than a quarter point per halving")


SPECTRUM_TREND_RULE = Rule("mean over draws of Spearman ρ(α, λ_max)", threshold=0.0, direction="above", level=0.90)
MONOTONE_RULE = Rule("smallest step of the mean λ_max between neighbouring α", threshold=0.0, direction="above",
                     level=0.90, digits=3)
ZERO = 1e-6  # a singular value below this counts as 0 (K is normalised to mean eigenvalue 1)


@dataclass(frozen=True)
class _Training:
    omega: int
    densities: tuple[float, ...]  # the SW-MLP's p
    channels: tuple[int, ...]  # the S-Mixer's C (S from Ω)
    depth: int
    embed_dim: int  # the SW-MLP's per-patch FC channels
    weight_format: str  # below p = 1


@dataclass(frozen=True)
class _Spectrum:
    omega: float
    alphas: tuple[float, ...]
    centre: float  # the α of the histogram: one of alphas
    draws: int


_SMALL = _Training(2**12, tuple(4.0**-k for k in range(6)), (2, 4, 8, 16), 4, 16, "sparse")
TRAINING = {"paper": _Training(2**16, tuple(2.0**-k for k in (0, 2, 4, 6, 7, 8, 9, 10)), (8, 16, 24, 40), 8, 64,
                               "masked"),
            "medium": _SMALL, "small": _SMALL,
            "smoke": _Training(2**9, tuple(8.0**-k for k in range(4)), (4, 8), 2, 4, "sparse")}
_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
SPECTRA = {"paper": _Spectrum(1e3, _ALPHAS, 1.5, 50), "medium": _Spectrum(1e3, _ALPHAS, 1.5, 50),
           "small": _Spectrum(1e3, _ALPHAS, 1.5, 10),
           "smoke": _Spectrum(100.0, (0.0, 0.5, 1.0, 1.5), 1.5, 3)}


def scaling_index(omega: float, density: float) -> float:
    """α = log(1/p) / log Ω, so that p = Ω^{−α} (App. D.1)."""
    return math.log(1 / density) / math.log(omega)


def _recipe(scale: str, dataset: str) -> recipes.Recipe:
    if scale == "paper":
        return recipes.paper_cifar(dataset)
    if scale == "medium":
        return recipes.medium(dataset, epochs=MEDIUM_EPOCHS)
    return recipes.small(dataset) if scale == "small" else recipes.smoke()


MEDIUM_EPOCHS = 20


@register_preset
class FigS1(Preset):
    name = "figs1"
    title = "Trainability of the SW-MLP against its sparsity; singular values of random sparse weights"
    claim = ("At fixed Ω the SW-MLP becomes harder to train once its sparsity 1 − p is too high, beyond what a "
             "Mixer can reach; the largest singular value of the random sparse weight (m = Ω^((1+α)/2), "
             "p = Ω^(−α)) grows monotonically with α.")
    source = "Hayase & Karakida Fig. S.1, App. D.1"
    datasets = recipes.PAPER_CIFAR + ("fashion-mnist", "mnist", "digits")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)
    scales = ("paper", "medium", "small", "smoke")
    default_seeds = {"paper": 5, "medium": 5, "small": 5, "smoke": 1}

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((Quantity("largest α = log(1/p)/log Ω of the SW-MLP", 10 / 16, lambda specs: max(
            s.meta["alpha"] for s in specs if s.meta["model"] == "SW-MLP"), 1.0, "at_least",
                                "Fig. S.1: p down to 2^−10 at Ω = 2^16"),
                       Quantity("SW-MLP densities beyond the Mixer's (α > 1/3)", 4, lambda specs: len(
                           {s.meta["alpha"] for s in specs if s.meta["model"] == "SW-MLP"
                            and s.meta["alpha"] > MIXER_ALPHA + 1e-9}), 0.75, "at_least",
                                "Fig. S.1: five densities below Ω^(−1/3); three make a trend")),
                      Departures(f"{dataset} (D.1 names none; App. C.4's CIFAR-10 at paper scale)",
                                 f"{MEDIUM_EPOCHS} of AdamW (C.4: 200 of Nesterov SGD)", "App. C.4's random crop and flip",
                                 ("Ω = 2^12 (the paper: 2^16)",)).lines())

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        t, recipe = TRAINING[scale], _recipe(scale, dataset)
        grey = 0 if recipe.image == recipes.COLOUR32 else 1  # the index into MODELS
        specs = []
        for p in t.densities:
            m = swmlp_width(t.omega, p)
            options = {"name": MODELS["SW-MLP"][grey], "depth": t.depth, "embed_dim": t.embed_dim, "width": m,
                       "density": p, "block": "fc", "weight_format": t.weight_format if p < 1 else "masked"}
            meta = {"dataset": dataset, "model": "SW-MLP", "omega": t.omega, "C": None, "S": None, "width": m,
                    "density": p, "alpha": scaling_index(t.omega, p)}
            specs += self.seeded(f"swmlp-m{m}", recipe.config(options), meta, scale)
        for C, S in symmetric_pairs(t.omega, channels=t.channels):
            p = (1 / C + 1 / S) / 2
            options = {"name": MODELS["S-Mixer"][grey], "depth": t.depth, "embed_dim": C, "num_tokens": S}
            meta = {"dataset": dataset, "model": "S-Mixer", "omega": t.omega, "omega_exact": mixer_omega(C, S),
                    "C": C, "S": S, "width": C * S, "density": p, "alpha": scaling_index(t.omega, p)}
            specs += self.seeded(f"smixer-c{C}-s{S}", recipe.config(options), meta, scale)
        if scale == "medium":  # the convergence check at the two ends of the verdict's region
            specs += recipes.doubled_ends([s for s in specs if s.meta["model"] == "SW-MLP"
                                           and s.meta["alpha"] >= MIXER_ALPHA - 1e-9], "alpha")
        return recipes.seed_structures(specs)  # each seed its own masks and weights

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        spectrum = SPECTRA[self.check_scale(scale)]
        checks, rows = _doubling(rows), [r for r in rows if not r.get("doubles")]  # the check: out of the verdict
        done = [r for r in finished(rows) if r.get("final_train_loss") is not None]
        losses = {(p["model"], p["width"]): p for p in aggregate(done, ["model", "width"], "final_train_loss")}
        errors = {(p["model"], p["width"]): p for p in aggregate(finished(rows), ["model", "width"])}
        table = []
        for key, r in {(r["model"], r["width"]): r for r in rows}.items():
            loss, error = losses.get(key, {}), errors.get(key, {})
            table.append({"model": r["model"], "C": r["C"], "S": r["S"], "width": r["width"], "density": r["density"],
                          "sparsity": 1 - r["density"], "alpha": r["alpha"], "train_loss_mean": loss.get("mean"),
                          "train_loss_std": loss.get("std"), "test_error_mean": error.get("mean"),
                          "test_error_std": error.get("std"), "seeds": loss.get("n", 0),
                          "diverged": sum(x["status"] == "diverged" and (x["model"], x["width"]) == key
                                          for x in rows)})
        table.sort(key=lambda t: (FAMILIES.index(t["model"]), t["alpha"]))

        sw = [r for r in done if r["model"] == "SW-MLP"]
        sparse = [r for r in sw if r["alpha"] >= MIXER_ALPHA - 1e-9]
        densities = sorted({r["density"] for r in sparse}, reverse=True)
        verdicts = trend_parts(LOSS_TREND, per_seed_table(sparse, "density", densities, "final_train_loss"),
                               [1 / d for d in densities], "SW-MLP beyond the S-Mixer's sparsest", quote=QUOTE_LEFT)
        mixer = [r for r in done if r["model"] == "S-Mixer"]
        mixer_densities = sorted({r["density"] for r in mixer}, reverse=True)
        if len(mixer_densities) >= 2:
            verdicts.append(arm_verdict(mixer_rule([1 / d for d in mixer_densities]),
                                        per_seed_table(mixer, "density", mixer_densities), "S-Mixer: hardly a decrease "
                                        "in performance as its density falls", quote=QUOTE_MIXER,
                                        extra=measures.sampling_error(mixer)))
        numbers = _training_numbers(table, sw, done)

        tops, centre = _spectrum(spectrum)
        per_draw = per_seed_trend([{"seed": k, "alpha": a, "lambda": tops[k, i]} for k in range(spectrum.draws)
                                   for i, a in enumerate(spectrum.alphas)], "alpha", "lambda")
        verdicts.append(bootstrap_verdict(per_draw, SPECTRUM_TREND_RULE, claim="λ_max grows with α"))
        verdicts.append(bootstrap_verdict(list(tops), MONOTONE_RULE, claim="λ_max grows monotonically with α",
                                          statistic=lambda d: np.diff(d.mean(axis=1), axis=-1).min(axis=-1)))
        verdicts[-2:] = [dataclasses.replace(v, quote=str(QUOTE_RIGHT)) for v in verdicts[-2:]]
        spectrum_table = []
        for i, a in enumerate(spectrum.alphas):
            m, p = alpha_scaling_size(spectrum.omega, a)
            spectrum_table.append({"alpha": a, "m": m, "p": p, "lambda_max_mean": float(np.mean(tops[:, i])),
                                   "lambda_max_std": float(np.std(tops[:, i])), "draws": spectrum.draws})
        counts, edges = np.histogram(centre, bins=60, range=(0.0, float(centre.max())), density=True)
        histogram = [{"low": float(lo), "high": float(hi), "density": float(c)}
                     for lo, hi, c in zip(edges[:-1], edges[1:], counts)]
        m, p = alpha_scaling_size(spectrum.omega, spectrum.centre)
        where = f"α = {spectrum.centre:g}, Ω = {spectrum.omega:g} (m = {m}, p = {p:.3g}), {spectrum.draws} draws"
        numbers[f"centre, {where}: share of zero singular values"] = round(float(np.mean(centre < ZERO)), 4)
        numbers[f"centre, {where}: median of the non-zero / largest singular value"] = \
            f"{np.median(centre[centre >= ZERO]):.3g} / {centre.max():.3g}"
        for row in (spectrum_table[0], spectrum_table[-1]):
            numbers[f"right: λ_max at α = {row['alpha']:g} (m = {row['m']})"] = \
                format_mean_std({"mean": row["lambda_max_mean"], "std": row["lambda_max_std"], "n": spectrum.draws},
                                digits=3)
        numbers["Mixer's λ_max (Marchenko-Pastur edge, α = 0 as Ω → ∞)"] = c_gamma(1.0)

        fields = measures.conclude(self, rows, scale, verdicts, checks)
        verdict = summary(verdicts) + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        check_numbers, check_text = doubling_report(checks)
        numbers |= check_numbers
        if checks and all(c["train_loss"] is not None and c["train_loss_doubled"] is not None for c in checks):
            numbers["epoch doubling: final training loss"] = "; ".join(
                f"{c['run']}: {c['train_loss']:.4f} -> {c['train_loss_doubled']:.4f}" for c in checks)
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        omega = rows[0]["omega"] if rows else TRAINING[scale].omega
        figure = _figure(table, spectrum_table, histogram, spectrum, omega, data)
        tables = {"figs1": table, "figs1_spectrum": spectrum_table, "figs1_histogram": histogram}
        if checks:
            tables["figs1_doubling"] = checks
        return Analysis(figures={"figs1": figure}, tables=tables, numbers=numbers, verdict=verdict + check_text,
                        verdicts=verdicts, **fields)


def _doubling(rows: list[dict]) -> list[dict]:
    """Medium scale's epoch-doubling check (:func:`.measures.doubling`, on the test error) with the final training
    loss, which the verdict reads, before and after."""
    base, twice = {r["run"]: r for r in rows}, {r["doubles"]: r for r in rows if r.get("doubles")}
    return [c | {"width": base[c["run"]]["width"], "train_loss": base[c["run"]].get("final_train_loss"),
                 "train_loss_doubled": twice[c["run"]].get("final_train_loss")} for c in doubling(rows, "alpha")]


def _training_numbers(table: list[dict], sw: list[dict], done: list[dict]) -> dict:
    """The SW-MLP's lowest and sparsest point, the sparsest minus the Mixer's sparsest density, the S-Mixer's
    trend."""
    numbers = {}
    points = [t for t in table if t["model"] == "SW-MLP" and t["train_loss_mean"] is not None]
    if points:
        def text(t: dict) -> str:
            loss = format_mean_std({"mean": t["train_loss_mean"], "std": t["train_loss_std"], "n": t["seeds"]},
                                   digits=4)
            error = format_mean_std({"mean": t["test_error_mean"], "std": t["test_error_std"], "n": t["seeds"]},
                                    percent=True)
            return f"training loss {loss}, test error {error}"

        best = min(points, key=lambda t: t["train_loss_mean"])
        numbers[f"SW-MLP: lowest training loss at p = {best['density']:.3g} (m = {best['width']})"] = text(best)
        last = max(points, key=lambda t: t["alpha"])
        numbers[f"SW-MLP at the sparsest p = {last['density']:.3g} (m = {last['width']})"] = text(last)
        anchor = min((t for t in points if t["alpha"] >= MIXER_ALPHA - 1e-9), key=lambda t: t["alpha"], default=None)
        if anchor is not None and anchor is not last:
            difference = per_seed_difference([r for r in sw if r["width"] == last["width"]],
                                             [r for r in sw if r["width"] == anchor["width"]], "final_train_loss")
            numbers[f"SW-MLP: training loss at p = {last['density']:.3g} minus at p = {anchor['density']:.3g}"] = \
                interval_text(difference, level=LEVEL, digits=4)
    mixer = [r for r in done if r["model"] == "S-Mixer"]
    if mixer:
        numbers["S-Mixer (comparison): Spearman ρ(1 − p, final training loss) per seed"] = interval_text(
            per_seed_trend(mixer, lambda r: 1 - r["density"], "final_train_loss"), level=LEVEL)
    return numbers


def _spectrum(s: _Spectrum) -> tuple[np.ndarray, np.ndarray]:
    """λ_max of every draw and α, shape (draws, alphas), and the singular values at the centre α pooled over the
    draws: :func:`pkmixer.theory.spectrum.alpha_scaling_singular_values` with seed k for draw k at every α, the
    seeds of :func:`~pkmixer.theory.spectrum.alpha_sweep`."""
    tops, centre = np.empty((s.draws, len(s.alphas))), []
    for k in range(s.draws):
        for i, a in enumerate(s.alphas):
            values = alpha_scaling_singular_values(s.omega, a, seed=k)
            tops[k, i] = values[0]
            if a == s.centre:
                centre.append(values)
    return tops, np.concatenate(centre)


def _figure(table: list[dict], spectrum: list[dict], histogram: list[dict], s: _Spectrum, omega: int,
            data: str) -> Figure:
    """Fig. S.1: training loss and test error against α (1 − p below), the singular-value histogram at the
    centre α, and λ_max against α."""
    fig = Figure(figsize=(17.0, 4.0), layout="constrained")
    loss_ax, error_ax, hist_ax, top_ax = fig.subplots(1, 4)
    grid = sorted({t["alpha"]: t["density"] for t in table if t["model"] == "SW-MLP"}.items())
    for family, marker in zip(FAMILIES, "os"):
        group = [t for t in table if t["model"] == family and t["train_loss_mean"] is not None]
        x = [t["alpha"] for t in group]
        loss_ax.errorbar(x, [t["train_loss_mean"] for t in group], yerr=[t["train_loss_std"] or 0.0 for t in group],
                         marker=marker, capsize=3, color=COLOURS[family], label=family)
        error_ax.errorbar(x, [100 * t["test_error_mean"] for t in group],
                          yerr=[100 * (t["test_error_std"] or 0.0) for t in group], marker=marker, capsize=3,
                          color=COLOURS[family], label=family)
    for ax, label in ((loss_ax, "final training loss"), (error_ax, "test error (%)")):
        ax.axvspan(MIXER_ALPHA, max([a for a, _ in grid] + [MIXER_ALPHA]), color="grey", alpha=0.15,
                   label="p ≤ Ω$^{-1/3}$: beyond the S-Mixer")
        ax.set_xticks([a for a, _ in grid], [f"{a:.2g}\n{1 - p:.3g}" for a, p in grid], fontsize=7)
        ax.set_xlabel("α = log(1/p)/log Ω  (below it: 1 − p)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=8)
    loss_ax.set_title(f"Left: trainability at Ω = {recipes.power_label(omega)} ({data})", fontsize=10)
    error_ax.set_title("test error", fontsize=10)
    hist_ax.stairs([h["density"] for h in histogram], [histogram[0]["low"]] + [h["high"] for h in histogram],
                   fill=True, color="tab:blue")
    hist_ax.set_yscale("log")
    hist_ax.set_xlabel("singular value λ")
    hist_ax.set_ylabel("density")
    hist_ax.set_title(f"Centre: α = {s.centre:g}, Ω = {s.omega:g}, {s.draws} draws", fontsize=10)
    hist_ax.grid(alpha=0.3)
    top_ax.errorbar([r["alpha"] for r in spectrum], [r["lambda_max_mean"] for r in spectrum],
                    yerr=[r["lambda_max_std"] for r in spectrum], marker="o", capsize=3, color="tab:blue",
                    label="SW-MLP $M\\odot W$ (mean ± std over draws)")
    top_ax.axhline(c_gamma(1.0), color="tab:red", label="Mixer: Marchenko-Pastur edge 2")
    top_ax.axvline(MIXER_ALPHA, color="grey", linestyle="--", label="S-Mixer at S = C (α = 1/3)")
    top_ax.set_xlabel("α")
    top_ax.set_ylabel("largest singular value $\\lambda_{max}$")
    top_ax.set_title(f"Right: Ω = {s.omega:g}", fontsize=10)
    top_ax.grid(alpha=0.3)
    top_ax.legend(fontsize=8)
    fig.suptitle("Fig. S.1: trainability of the SW-MLP and the spectrum of random sparse weights", fontsize=11)
    return fig
