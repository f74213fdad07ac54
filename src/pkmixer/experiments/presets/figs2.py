"""Fig. S.2: MLP-Mixer, RP MLP-Mixer and SW-MLP with γ = 4 against effective width at fixed Ω (Hayase &
Karakida App. D.2).

Command::

    pkmixer reproduce figs2 --scale paper --dataset cifar10   # also cifar100
    pkmixer reproduce figs2 --scale medium                     # all of Fashion-MNIST, 5 seeds (about 90 min, 2 cores)
    pkmixer reproduce figs2 --scale small                      # Fashion-MNIST, CPU minutes
    pkmixer reproduce figs2 --scale smoke

The paper's claim: with the expansion factor γ = 4 in the blocks, the test error still falls as the effective
width grows, for normal and RP MLP-Mixers (m = SC) and for SW-MLPs (m = √(Ω/(γp))). What a run shows: mean test
error ± std over seeds against m, one line per family and Ω. The verdict has one part per line, a statistic with
its 90 % paired-bootstrap interval over seeds (a seed's runs at every width share the seed) and a rule declared
below before any run is read (pkmixer.experiments.stats): with three widths or more the mean over seeds of the
within-seed Spearman ρ(m, error), claimed < 0 (:data:`TREND_RULE`); with two, the narrowest point's error minus
the widest one's, claimed > 0 (:data:`WIDEST_RULE`). Supported when every line is, contradicted when any line
is, undecided otherwise (and with fewer than 5 seeds: pass ``--seeds 5``). The numbers add each line's lowest
error, Spearman's ρ of the mean errors, and the narrowest-minus-widest difference with its interval; at medium
scale the report adds fig5's epoch-doubling check, which the verdict leaves out.

Scales:

* ``paper`` - App. D.2 with App. C.4's recipe (Nesterov SGD, batch 128, 200 epochs, crop and flip, 3 seeds) at
  the initial lr 0.1 that D.2 states: MLP-Mixer and RP MLP-Mixer at C = 16, 32, 48, 64, 83, 113, 173 with S
  from Ω = 2^18 and 2^20 (γ = 4), SW-MLP with MLP blocks (S.17, γ = 4) at p = 0.1, 0.3, 0.5, 0.7, 0.9 and
  m = √(Ω/(γp)) for both Ω. The depth is not stated for D.2; App. C.4's 8 blocks are used for all three.
  Patch 4 at 32 px (S₀ = 64); the SW-MLP's per-patch FC has 64 channels. 114 runs per data set.
* ``medium`` - :func:`.recipes.medium` (all 60 000 Fashion-MNIST training and 10 000 test images, 10 epochs of
  AdamW), Ω = 2^17: MLP-Mixer and RP MLP-Mixer at C = 4, 8, 32 (S = 126, 87, 32: fig5's medium pairs, Ω/γ =
  2^15 in both; m = 504, 696, 1024, 2.03×: at fixed Ω a Mixer's m is half its peak at C ≈ C*/8), SW-MLP at
  p = 1, 1/4, 1/16 (m = 181, 362, 724, 4×; CSR weights below p = 1, as fig5's medium), all of 2 blocks (4 take
  twice as long); 5 seeds: 45 runs, plus the convergence check - the narrowest and the widest point of each
  family retrained for 20 epochs on seed 0 (6 runs, left out of the verdicts): 51 runs, estimated 90 min on
  2 cores (one epoch of each model timed on one core while another job used the other, times 10 epochs); the 45
  verdict runs took 73 min here (docs/reproduction.md). The bundled digits (when Fashion-MNIST is absent): the
  same models, 24 epochs.
* ``small`` - Fashion-MNIST, Ω = 2^17 (C* = 32 at γ = 4), C = 8, 16, 32, 64 and SW-MLP p = 1, 1/4, 1/16
  (m = 181, 362, 724), 4 blocks, 4 epochs of AdamW on 10 000 images, 2 seeds: 22 runs.
* ``smoke`` - digits, Ω = 2^11, C = 4, 8, 16, SW-MLP p = 1, 1/4, 1 block (SW-MLP 2), 1 epoch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...theory.width import mixer_omega, swmlp_width, tokens_for_channels
from ..preset import Analysis, Preset, register_preset
from ..stats import (Rule, aggregate, bootstrap_verdict, format_mean_std, interval_text, overall, per_seed_difference,
                     rank_correlation, summary, trend_verdict)
from ..sweep import RunSpec
from . import recipes
from .measures import doubling, doubling_report, error_plot, trained

GAMMA = 4.0
PAPER_DATASETS = ("cifar10", "cifar100")
FAMILIES = {"MLP-Mixer": "mixer", "RP MLP-Mixer": "rpmixer", "SW-MLP": "swmlp"}
# The verdict's rules, fixed before any run is read (issue 16; pkmixer.experiments.stats): "the error falls as m
# grows" is a negative rank correlation within each seed (fig5's rule); a line of two widths has no rank to
# correlate, and falls when its narrowest point is worse than its widest
LEVEL = 0.90
TREND_RULE = Rule("mean over seeds of Spearman ρ(m, test error)", threshold=0.0, direction="below", level=LEVEL)
WIDEST_RULE = Rule("test error at the narrowest minus the widest m", threshold=0.0, direction="above", level=LEVEL,
                   scale=100, unit=" points")


@dataclass(frozen=True)
class _Sweep:
    recipe: recipes.Recipe
    omegas: tuple[int, ...]
    channels: tuple[int, ...]
    densities: tuple[float, ...]
    depth: int
    sw_depth: int
    sw_embed_dim: int
    sw_format: str = "masked"  # "sparse": CSR weights below p = 1 (a faster step there, fig5's medium scale)


def _sweep(scale: str, dataset: str) -> _Sweep:
    if scale == "paper":
        return _Sweep(recipes.paper_cifar(dataset, {**recipes.SGD_C4, "lr": 0.1}), (2**18, 2**20),
                      (16, 32, 48, 64, 83, 113, 173), (0.1, 0.3, 0.5, 0.7, 0.9), 8, 8, 64)
    if scale == "medium":  # fig5's medium (C, S) pairs (the same Ω/γ = 2^15): m = 504, 696, 1024
        return _Sweep(recipes.medium(dataset), (2**17,), (4, 8, 32), (1.0, 1 / 4, 1 / 16), 2, 2, 16, "sparse")
    if scale == "small":
        return _Sweep(recipes.small(dataset), (2**17,), (8, 16, 32, 64), (1.0, 1 / 4, 1 / 16), 4, 4, 16)
    return _Sweep(recipes.smoke(), (2**11,), (4, 8, 16), (1.0, 1 / 4), 1, 2, 4)


@register_preset
class FigS2(Preset):
    name = "figs2"
    title = "MLP-Mixer, RP MLP-Mixer and SW-MLP (γ = 4) against effective width"
    claim = ("With γ = 4, test error still falls as the effective width grows at fixed Ω, for normal and RP "
             "MLP-Mixers and for SW-MLPs.")
    source = "Hayase & Karakida Fig. S.2, App. D.2"
    datasets = PAPER_DATASETS + ("fashion-mnist", "mnist", "digits", "stl10")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, PAPER_DATASETS)
    scales = ("paper", "medium", "small", "smoke")

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        s = _sweep(scale, dataset)
        specs = []
        for omega in s.omegas:
            for family, rp in (("MLP-Mixer", None), ("RP MLP-Mixer", "all")):
                for C in s.channels:
                    S = tokens_for_channels(omega, C, GAMMA)
                    config = s.recipe.config({"name": "mixer_s64_32", "depth": s.depth, "embed_dim": C, "num_tokens": S,
                                              "mlp_ratio": GAMMA, "rp_blocks": rp})
                    meta = {"dataset": dataset, "model": family, "omega": omega, "C": C, "S": S, "width": C * S,
                            "density": None, "omega_exact": mixer_omega(C, S, GAMMA)}
                    specs += self.seeded(f"{FAMILIES[family]}-o{omega}-c{C}", config, meta, scale)
            for p in s.densities:
                m = swmlp_width(omega, p, GAMMA)
                config = s.recipe.config({"name": "swmlp_o18_32", "depth": s.sw_depth, "embed_dim": s.sw_embed_dim,
                                          "width": m, "density": p, "block": "mlp", "mlp_ratio": GAMMA,
                                          "weight_format": "sparse" if s.sw_format == "sparse" and p < 1
                                          else "masked"})
                meta = {"dataset": dataset, "model": "SW-MLP", "omega": omega, "C": None, "S": None, "width": m,
                        "density": p, "omega_exact": GAMMA * p * m * m}
                specs += self.seeded(f"swmlp-o{omega}-m{m}", config, meta, scale)
        if scale == "medium":
            specs += recipes.doubled_ends(specs, "width")
        return recipes.seed_structures(specs)

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = trained(rows)  # the epoch-doubling runs are left out
        points = aggregate(done, ["model", "omega", "C", "S", "width", "density"])
        for p in points:
            p["line"] = f"{p['model']}, Ω = {recipes.power_label(p['omega'])}"
        points.sort(key=lambda p: (list(FAMILIES).index(p["model"]), p["omega"], p["width"]))
        table = [{k: p[k] for k in ("model", "omega", "C", "S", "width", "density")} |
                 {"test_error_mean": p["mean"], "test_error_std": p["std"], "seeds": p["n"]} for p in points]
        numbers, rhos, verdicts = {}, {}, []
        for line in dict.fromkeys(p["line"] for p in points):
            group = [p for p in points if p["line"] == line]
            rhos[line] = rank_correlation([p["width"] for p in group], [p["mean"] for p in group])
            best = min(group, key=lambda p: p["mean"])
            numbers[f"{line}: lowest error"] = f"{format_mean_std(best, percent=True)} at m = {best['width']}"
            numbers[f"{line}: Spearman ρ(m, error)"] = None if rhos[line] is None else round(rhos[line], 3)
            runs = [r for r in done if r["model"] == group[0]["model"] and r["omega"] == group[0]["omega"]]
            widths = sorted({r["width"] for r in runs})
            difference = per_seed_difference([r for r in runs if r["width"] == widths[0]],
                                             [r for r in runs if r["width"] == widths[-1]])
            if len(widths) > 1:
                numbers[f"{line}: error at the narrowest minus the widest m"] = \
                    interval_text(difference, level=LEVEL, scale=100.0, unit=" points")
            claim = f"{line}: error falls as m grows"
            verdicts.append(bootstrap_verdict(difference, WIDEST_RULE, claim) if len(widths) == 2
                            else trend_verdict(runs, "width", TREND_RULE, claim))
        supported = None if scale == "smoke" else overall(verdicts)
        listed = summary(verdicts) or "no finished runs."
        if supported is None:
            verdict = f"Error against effective width at γ = 4 - undecided: {listed}"
        else:
            verdict = (f"Test error {'falls' if supported else 'does not fall on every line'} as the effective "
                       f"width grows at γ = 4 - {listed}")
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        checks = doubling(rows, "width")
        check_numbers, check_text = doubling_report(checks)
        numbers |= check_numbers
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        figure = error_plot(points, "width", "line", f"Fig. S.2: error against effective width, γ = 4 ({data})",
                            "effective width m")
        tables = {"figs2": table} | ({"figs2_doubling": checks} if checks else {})
        return Analysis(figures={"figs2": figure}, tables=tables, numbers=numbers, verdict=verdict + check_text,
                        supported=supported, verdicts=verdicts)
