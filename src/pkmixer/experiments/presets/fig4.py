"""Fig. 4: MLP-Mixer against SW-MLP at fixed Ω - test error against width (left) and the largest singular
value of the sparse weights (right) (Hayase & Karakida Secs. 4.2-4.3, App. C.2).

Command::

    pkmixer reproduce fig4 --scale paper     # CIFAR-10
    pkmixer reproduce fig4 --scale medium    # all of Fashion-MNIST, 5 seeds
    pkmixer reproduce fig4 --scale small     # Fashion-MNIST, CPU minutes
    pkmixer reproduce fig4 --scale smoke

The paper's claims. Left: at fixed Ω = 2^19 and γ = 2, the test errors of the MLP-Mixer and of the SW-MLP with
the same Ω and width both fall as the width γm grows, but at the widest point (γm ≈ 8000) the SW-MLP is worse
than the Mixer. Right: the largest singular value of the SW-MLP's random weight M ⊙ A grows with m at fixed Ω
and stays above the Mixer's c_γ = 1 + √γ (Eqs. 16-18). What a run shows: mean test error ± std over seeds of
both families against γm; λ_max of M ⊙ A (mean ± std over draws) at the same widths with √L₊ and c_γ. The
parts, each quoting the paper's sentence (pkmixer.experiments.rules): for each family "error falls as γm grows" as
:data:`TREND` (the slope on log₂ γm < 0 and the widest no worse than the next by a quarter point, Student's t over
paired seeds at 92 %); error(SW-MLP) − error(MLP-Mixer) at the widest γm > 0 (:data:`WIDEST_RULE`); "little change
in response to increasing width" as the SW-MLP's error at its widest minus its next-widest γm inside ±0.5 points
(:data:`FLAT_RULE`, the margin printed across 0.25-1 point); over the draws of M ⊙ A (the same draw seeds at every
width), the mean within-draw Spearman ρ(m, λ_max) > 0 (:data:`SPECTRUM_TREND_RULE`) and the smallest over widths of
the mean λ_max / c_γ > 1 (:data:`EDGE_RULE`), 90 % bootstrap intervals; "such large singular values deteriorate
the performance of SW-MLP" (Sec. 4.3) is causal and not testable by these runs (it needs an intervention on
λ_max). Supported when every required part is, contradicted when a part is after Holm's procedure across the
parts, undecided otherwise (and with fewer than 5 seeds or draws); out of regime at medium scale (the regime below).

Scales:

* ``paper`` - App. C.2 with App. C.1's training: Ω = 2^19, γ = 2, C = 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44,
  48, 64 and S = 360, 252, 203, 173, 152, 136, 124, 113, 104, 96, 89, 83, 64 (from Eq. 14); MLP-Mixer of 3
  blocks; SW-MLP of 6 MLP blocks (S.17, γ = 2; App. C.1: one per token- and channel-mixing block) of width
  m = SC at the Mixer's own density p = (1/C + 1/S)/2, with the per-patch FC to C channels; patch 4 at 32 px;
  AdamW lr 0.01, batch 128, 600 epochs, cosine annealing, AutoAugment with App. C.4's crop and flip; 4 seeds:
  104 runs. Right: 10 draws of M ⊙ A ((γm × m), A ~ N(0, 1/m), p = Ω/(γm²)) at each of those widths.
* ``medium`` - :func:`.recipes.medium` (all 60 000 Fashion-MNIST images, 10 epochs of AdamW), Ω = 2^14, γ = 2,
  C = 2, 4, 8, 16 (S = 90, 62, 41, 25; m = 180 ... 400, 2.2×), Mixer of 2 blocks, SW-MLP of 4, 5 seeds: 40 runs;
  spectra over 10 draws.
* ``small`` - Fashion-MNIST, Ω = 2^13, γ = 2, C = 2, 4, 8, 12, 16 (S from Ω), Mixer of 2 blocks, SW-MLP of 4,
  4 epochs of AdamW on 10 000 images, 2 seeds: 20 runs; spectra over 10 draws.
* ``smoke`` - digits, Ω = 2^9, C = 2, 4, 6, Mixer of 1 block, SW-MLP of 2, 1 epoch; spectra over 3 draws.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


import numpy as np

from ...theory.spectrum import lambda_max_sweep
from ...theory.width import mixer_omega, symmetric_pairs
from ..preset import Analysis, Preset, register_preset
from ..regime import Departures, Quantity, Regime, widest
from ..rules import ArmRule, Quote, TrendRules, arm_verdict, contrast, not_testable, trend_parts
from ..stats import Rule, aggregate, bootstrap_verdict, format_mean_std, per_seed_trend, summary
from ..sweep import RunSpec
from .. import measures, recipes
from ..measures import error_plot, finished

GAMMA = 2.0
PAPER_CHANNELS = (4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 64)
# The paper's words each part tests
QUOTE_TREND = Quote("Sec. 4.2", "We observed both networks’ test error improved as the width increased.")
QUOTE_WIDEST = Quote("Sec. 4.2", "However, we observed for too-wide cases around γm = 8000 in Figure 4 (left), the "
                                 "test error of SW-MLP is higher than MLP-Mixer and there is little change in response "
                                 "to increasing width.")
QUOTE_SPECTRUM = Quote("Sec. 4.3", "In Figure 4 (right), we observed the maximal singular value of M ⊙ A increased by "
                                   "widening m with fixed Ω and γ. In particular, the value was always higher than the "
                                   "theoretical value of Mixer’s singular values.")
QUOTE_LINK = Quote("Sec. 4.3", "Such large singular values deteriorate the performance of SW-MLP.")
# The verdict's rules (pkmixer.experiments.rules, pkmixer.experiments.stats). The error parts read the per-seed
# table of each family's widths; the spectrum parts resample the draws of M ⊙ A.
LEVEL = 0.90
TREND = TrendRules(axis="γm")
WIDEST_RULE = ArmRule("error(SW-MLP) − error(MLP-Mixer) at the widest γm (means over seeds)", contrast([1, -1]),
                      "above", 0.0, scale=100.0, unit=" points")
FLAT_RULE = ArmRule("the SW-MLP's error at the widest γm minus at the next-widest (means over seeds)",
                    contrast([-1, 1]), "inside", tolerance=0.005, scale=100.0, unit=" points",
                    margins=(0.0025, 0.005, 0.01),
                    reason="“little change” read as less than half a point between the two widest widths")
SPECTRUM_TREND_RULE = Rule("mean over draws of Spearman ρ(m, λ_max of M ⊙ A)", threshold=0.0, direction="above",
                           level=LEVEL)
EDGE_RULE = Rule("smallest over widths of the mean λ_max / c_γ", threshold=1.0, direction="above", level=LEVEL,
                 digits=3)


@dataclass(frozen=True)
class _Size:
    omega: int
    channels: tuple[int, ...]
    depth: int  # Mixer blocks; the SW-MLP has twice as many
    draws: int  # random weights per width for the spectrum

    def pairs(self) -> list[tuple[int, int]]:
        """The (C, S) pairs at Ω and γ = 2 (App. C.2)."""
        return symmetric_pairs(self.omega, GAMMA, channels=self.channels)


SIZES = {"paper": _Size(2**19, PAPER_CHANNELS, 3, 10), "medium": _Size(2**14, (2, 4, 8, 16), 2, 10),
         "small": _Size(2**13, (2, 4, 8, 12, 16), 2, 10),
         "smoke": _Size(2**9, (2, 4, 6), 1, 3)}


@register_preset
class Fig4(Preset):
    name = "fig4"
    title = "MLP-Mixer against SW-MLP at fixed Ω: error against width, and the SW-MLP's largest singular value"
    claim = ("At fixed Ω the test errors of MLP-Mixers and of SW-MLPs both fall as the width grows, but the widest "
             "SW-MLP is worse than the Mixer: its largest singular value grows with the width and exceeds the "
             "Mixer's c_γ = 1 + √γ.")
    source = "Hayase & Karakida Fig. 4, Secs. 4.2-4.3, App. C.1-C.2"
    datasets = ("cifar10", "fashion-mnist", "mnist", "digits", "cifar100", "stl10")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, ("cifar10",))
    scales = ("paper", "medium", "small", "smoke")
    default_seeds = {"paper": 4, "medium": 5, "small": 2, "smoke": 1}

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((Quantity("widest γm", 8192, widest("gamma_width"), 0.5, "at_least",
                                "Sec. 4.2: “too-wide cases around γm = 8000”"),
                       Quantity("density (1/C + 1/S)/2 at the widest pair", 1 / 64,
                                lambda specs: min(s.meta["density"] for s in specs), 2.0, "at_most",
                                "C = S = 64 at Ω = 2^19: p = 1/64")),
                      Departures(f"{dataset} (the paper: CIFAR-10)", "15 of AdamW (the paper: 600)",
                                 "App. C.1's AutoAugment with crop and flip",
                                 ("reaching the regime takes Ω = 2^19 and an SW-MLP of width 4096 at p = 1/64: about "
                                  "10 times a Mixer's step on a CPU, some 25 core-hours for 5 seeds of 3 widths on "
                                  "10 000 images; a GPU's run (paper scale)",)).lines())

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        s = SIZES[scale]
        recipe = (recipes.medium(dataset, augment="autoaugment") if scale == "medium"
                  else recipes.c1(scale, dataset))
        specs = []
        for C, S in s.pairs():
            m, p = C * S, (1 / C + 1 / S) / 2
            mixer = recipe.config({"name": "mixer_c64d3p4_32", "depth": s.depth, "embed_dim": C, "num_tokens": S,
                                   "mlp_ratio": GAMMA})
            sw = recipe.config({"name": "swmlp_m4096d6p4_32", "depth": 2 * s.depth, "embed_dim": C, "width": m,
                                "density": p, "block": "mlp", "mlp_ratio": GAMMA, "weight_format": "masked"})
            common = {"dataset": dataset, "omega": s.omega, "C": C, "S": S, "width": m, "gamma_width": GAMMA * m,
                      "density": p, "omega_exact": mixer_omega(C, S, GAMMA)}
            specs += self.seeded(f"mixer-c{C}-s{S}", mixer, {**common, "model": "MLP-Mixer"}, scale)
            specs += self.seeded(f"swmlp-m{m}", sw, {**common, "model": "SW-MLP"}, scale)
        return recipes.seed_structures(specs)

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = finished(rows)
        value, value_note = measures.decided_value(done, self.decided_on)
        points = aggregate(done, ["model", "C", "S", "width", "gamma_width", "density"], value)
        points.sort(key=lambda p: (p["model"], p["width"]))
        table = [{k: p[k] for k in ("model", "C", "S", "width", "gamma_width", "density")} |
                 {"test_error_mean": p["mean"], "test_error_std": p["std"], "seeds": p["n"]} for p in points]
        numbers, verdicts = {}, []
        for family in ("MLP-Mixer", "SW-MLP"):
            runs = [r for r in done if r["model"] == family]
            widths = sorted({r["gamma_width"] for r in runs})
            seeds_table = measures.arm_table(runs, "gamma_width", widths, value)
            verdicts += trend_parts(TREND, seeds_table, widths, family, quote=QUOTE_TREND)
        widest = max((p["width"] for p in points), default=None)
        at_widest = {p["model"]: p for p in points if p["width"] == widest}
        for family, p in at_widest.items():
            numbers[f"{family} at the widest γm = {p['gamma_width']:g}"] = format_mean_std(p, percent=True)
        arms = [[r for r in done if r["model"] == f and r["width"] == widest] for f in ("SW-MLP", "MLP-Mixer")]
        verdicts.append(measures.difference_verdict(WIDEST_RULE, *arms, value, f"the widest SW-MLP (γm = "
                                                    f"{GAMMA * (widest or 0):g}) is worse than the Mixer",
                                                    quote=QUOTE_WIDEST))
        sw_widths = sorted({r["gamma_width"] for r in done if r["model"] == "SW-MLP"})
        if len(sw_widths) >= 2:
            sw = [r for r in done if r["model"] == "SW-MLP"]
            verdicts.append(arm_verdict(FLAT_RULE, measures.arm_table(sw, "gamma_width", sw_widths[-2:], value),
                                        "the SW-MLP's error changes little between its two widest γm",
                                        quote=QUOTE_WIDEST))

        s = SIZES[scale]
        widths = sorted({C * S for C, S in s.pairs()})
        spectrum, draws = _spectrum(s.omega, widths, s.draws)
        per_draw = per_seed_trend([{"seed": k, "m": m, "lambda": draws[k, i]} for k in range(s.draws)
                                   for i, m in enumerate(widths)], "m", "lambda")
        verdicts.append(bootstrap_verdict(per_draw, SPECTRUM_TREND_RULE, claim="λ_max of M ⊙ A grows with m"))
        c = spectrum[0]["c_gamma"]
        verdicts.append(bootstrap_verdict(list(draws), EDGE_RULE, claim="λ_max of M ⊙ A exceeds c_γ at every width",
                                          statistic=lambda d: (d.mean(axis=1) / c).min(axis=-1)))
        numbers["c_γ = 1 + √γ"] = round(c, 4)
        verdicts[-2:] = [dataclasses.replace(v, quote=str(QUOTE_SPECTRUM)) for v in verdicts[-2:]]
        verdicts.append(not_testable(
            "large singular values are what deteriorates the SW-MLP's error",
            "causal: in these runs λ_max grows only together with the width and the sparsity, so no statistic of "
            "them separates its effect; it needs an intervention (the same SW-MLP with its initial weights rescaled "
            "so that λ_max = c_γ), which no preset runs", QUOTE_LINK))
        fields = measures.conclude(self, rows, scale, verdicts, value_note=value_note)
        verdict = summary(verdicts) + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        left = error_plot(points, "gamma_width", "model",
                          f"Fig. 4 left: error against width at Ω = {recipes.power_label(s.omega)}, γ = 2 ({data})",
                          "width γm", order=["MLP-Mixer", "SW-MLP"])
        right = _spectrum_figure(spectrum, s.omega)
        spectrum_table = [{k: r[k] for k in ("m", "p", "q", "lambda_max_mean", "lambda_max_std", "sqrt_l_plus",
                                             "c_gamma")} for r in spectrum]
        return Analysis(figures={"fig4_error": left, "fig4_spectrum": right},
                        tables={"fig4_error": table, "fig4_spectrum": spectrum_table}, numbers=numbers,
                        verdict=verdict, verdicts=verdicts, **fields)


def _spectrum(omega: int, widths: list[int], draws: int) -> tuple[list[dict], np.ndarray]:
    """:func:`pkmixer.theory.spectrum.lambda_max_sweep`'s rows (seed k at every width) and the λ_max of every
    draw, shape (draws, widths), which the verdict resamples."""
    rows = lambda_max_sweep(omega, GAMMA, widths, seeds=draws)
    return rows, np.array([r["lambda_max_draws"] for r in rows]).T


def _spectrum_figure(rows: list[dict], omega: int):
    """λ_max of M ⊙ A against m with √L₊ and c_γ (Fig. 4 right), drawn by pkmixer.theory.spectrum's conventions."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.add_subplot()
    m = [r["m"] for r in rows]
    ax.errorbar(m, [r["lambda_max_mean"] for r in rows], yerr=[r["lambda_max_std"] for r in rows], fmt="o-",
                color="tab:blue", capsize=3, label="SW-MLP $M\\odot A$ (mean ± std over draws)")
    ax.plot(m, [r["sqrt_l_plus"] for r in rows], color="tab:blue", linestyle="--", label="$\\sqrt{L_+}$ (Eq. 17)")
    ax.axhline(rows[0]["c_gamma"], color="tab:red",
               label=f"Mixer: $c_\\gamma = 1+\\sqrt{{\\gamma}}$ = {rows[0]['c_gamma']:.3g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("width m")
    ax.set_ylabel("largest singular value $\\lambda_{max}$")
    ax.set_title(f"Fig. 4 right: Ω = {recipes.power_label(omega)}, γ = {GAMMA:g}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
