"""Fig. 7: depth - RP S-Mixers catch up with normal ones as blocks are added (Hayase & Karakida Sec. 5.4, App. C.6,
D.4).

Command::

    pkmixer reproduce fig7 --scale paper --dataset cifar10   # also cifar100, stl10
    pkmixer reproduce fig7 --scale medium                     # all of Fashion-MNIST, 5 seeds (estimated 30 min, 2 cores)
    pkmixer reproduce fig7 --scale small                      # Fashion-MNIST, CPU minutes
    pkmixer reproduce fig7 --scale smoke

The paper's claim: with few blocks the RP S-Mixer is worse than the normal S-Mixer, but as the depth grows it
becomes comparable or better (its receptive field grows with every independently permuted layer, App. D.4).
What a run shows: mean test error ± std over seeds against the number of blocks L for both families, and the
gap RP − normal at each L. The verdict has three parts, each the mean over seeds of a per-seed statistic (a
seed's RP and normal runs at every depth share the seed) with its 90 % paired-bootstrap interval over seeds and a
rule declared below before any run is read (pkmixer.experiments.stats): the RP deficit at the smallest L, error(RP)
− error(normal) > 0 (:data:`DEFICIT_RULE`); the catching up, gap(smallest L) − gap(largest L) > 0
(:data:`CATCH_UP_RULE`); comparable or better at the largest L, gap < :data:`COMPARABLE` = 0.5 points
(:data:`DEEP_RULE`). Supported when all three are, contradicted when any is, undecided otherwise (and with fewer
than 5 seeds); when the deficit itself is contradicted (RP not worse even at the smallest L) the catching up
cannot be judged and the verdict is undecided. The numbers say whether each family improves with depth (Spearman
ρ(L, error) per seed, averaged, with its interval).

Scales:

* ``paper`` (App. C.6, with App. C.4's recipe, which holds "throughout the whole study" on these data sets):
  S = C = 128 (the first token mixing maps S₀ = 64 -> 128, App. A.2.4), L = 4, 8, 12, 16, 20, patch 4 at 32 px,
  Nesterov SGD lr 0.02, batch 128, 200 epochs, crop and flip, 3 seeds: 30 runs per data set (about 70 V100
  hours for the three in the paper).
* ``medium`` - the same models with :func:`.recipes.medium` (all 60 000 Fashion-MNIST images, 10 epochs of
  AdamW), 5 seeds: 40 runs.
* ``small`` - Fashion-MNIST, S = C = 32, L = 1, 2, 4, 8, 4 epochs of AdamW on 10 000 images, 2 seeds: 16 runs.
* ``smoke`` - digits, S = C = 4, L = 1, 2, 1 epoch.
"""
from __future__ import annotations

from pathlib import Path

from ..preset import Analysis, Preset, register_preset
from ..stats import (CONTRADICTED, Rule, aggregate, bootstrap_verdict, format_mean_std, gap, interval_text, overall,
                     per_seed_difference, per_seed_trend, summary)
from ..sweep import RunSpec
from . import recipes
from .measures import error_plot, finished

FAMILIES = {"S-Mixer": ("smixer_s128_32", "smixer"), "RP S-Mixer": ("rp_smixer_s128_32", "rpsmixer")}
# The verdict's rules, fixed before any run is read (issue 16; pkmixer.experiments.stats).
LEVEL = 0.90
COMPARABLE = 0.005  # "comparable": the RP S-Mixer's error at most 0.5 points above the normal one's
_POINTS = {"level": LEVEL, "scale": 100, "unit": " points"}
DEFICIT_RULE = Rule("mean over seeds of error(RP) − error(normal) at the smallest L", threshold=0.0,
                    direction="above", **_POINTS)
CATCH_UP_RULE = Rule("mean over seeds of the gap RP − normal at the smallest L minus at the largest L",
                     threshold=0.0, direction="above", **_POINTS)
DEEP_RULE = Rule("mean over seeds of error(RP) − error(normal) at the largest L", threshold=COMPARABLE,
                 direction="below", **_POINTS)


@register_preset
class Fig7(Preset):
    name = "fig7"
    title = "Depth: RP S-Mixers against normal S-Mixers"
    claim = ("RP S-Mixers underperform normal S-Mixers at small depth but become comparable to or better than "
             "them as the number of blocks grows (S = C = 128).")
    source = "Hayase & Karakida Fig. 7, Sec. 5.4, App. C.6, D.4"
    datasets = recipes.PAPER_CIFAR + ("fashion-mnist", "mnist", "digits")
    scales = ("paper", "medium", "small", "smoke")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        recipe, width, depths = {
            "paper": lambda: (recipes.paper_cifar(dataset), 128, (4, 8, 12, 16, 20)),
            "medium": lambda: (recipes.medium(dataset), 32, (1, 2, 4, 8)),
            "small": lambda: (recipes.small(dataset), 32, (1, 2, 4, 8)),
            "smoke": lambda: (recipes.smoke(), 4, (1, 2)),
        }[scale]()
        specs = []
        for family, (model, tag) in FAMILIES.items():
            for depth in depths:
                config = recipe.config({"name": model, "depth": depth, "embed_dim": width, "num_tokens": width})
                meta = {"dataset": dataset, "model": family, "depth": depth, "C": width, "S": width}
                specs += self.seeded(f"{tag}-l{depth}", config, meta, scale)
        return recipes.seed_structures(specs)

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        points = aggregate(finished(rows), ["model", "depth"])
        by = {(p["model"], p["depth"]): p for p in points}
        depths = sorted({p["depth"] for p in points})
        table, gaps = [], {}
        for depth in depths:
            normal, rp = by.get(("S-Mixer", depth)), by.get(("RP S-Mixer", depth))
            if normal and rp:
                gaps[depth] = gap(rp, normal)
            table.append({"depth": depth,
                          "smixer_error_mean": normal and normal["mean"], "smixer_error_std": normal and normal["std"],
                          "rp_error_mean": rp and rp["mean"], "rp_error_std": rp and rp["std"],
                          "gap_rp_minus_normal": gaps[depth]["difference"] if depth in gaps else None})
        done = finished(rows)
        numbers = {}
        for family in FAMILIES:
            group = sorted((p for p in points if p["model"] == family), key=lambda p: p["depth"])
            for p in group:
                numbers[f"{family}, L = {p['depth']}"] = format_mean_std(p, percent=True)
            numbers[f"{family}: Spearman ρ(L, error) per seed"] = interval_text(
                per_seed_trend([r for r in done if r["model"] == family], "depth"), level=LEVEL)
        supported, verdict, verdicts = None, "Too few depths finished to compare.", []
        if len(gaps) >= 2:
            low, high = min(gaps), max(gaps)

            def seed_gaps(depth: int) -> dict:
                arms = [[r for r in done if r["model"] == f and r["depth"] == depth] for f in ("RP S-Mixer", "S-Mixer")]
                return per_seed_difference(*arms)

            shallow, deep = seed_gaps(low), seed_gaps(high)
            numbers["gap RP − normal at the smallest / largest L (points)"] = \
                f"{100 * gaps[low]['difference']:+.2f} / {100 * gaps[high]['difference']:+.2f}"
            verdicts = [
                bootstrap_verdict(shallow, DEFICIT_RULE, claim=f"RP worse than normal at L = {low}"),
                bootstrap_verdict({s: shallow[s] - deep[s] for s in shallow if s in deep}, CATCH_UP_RULE,
                                  claim=f"the gap shrinks from L = {low} to L = {high}"),
                bootstrap_verdict(deep, DEEP_RULE, claim=f"RP comparable or better at L = {high}"),
            ]
            verdict = (f"The RP − normal error gap goes from {100 * gaps[low]['difference']:+.2f} points at L = {low} "
                       f"to {100 * gaps[high]['difference']:+.2f} at L = {high}. " + summary(verdicts))
            if verdicts[0].decision == CONTRADICTED:
                # RP is not worse even at the smallest depth: there is no deficit to catch up with
                verdict += (f" The shallow RP deficit the claim starts from does not appear (RP is not worse at "
                            f"L = {low}), so catching up cannot be judged.")
            else:
                supported = None if scale == "smoke" else overall(verdicts)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        width = rows[0].get("C") if rows else None
        figure = error_plot(points, "depth", "model", f"Fig. 7: error against depth, S = C = {width} ({data})",
                            "blocks L", log_x=False, order=list(FAMILIES))
        return Analysis(figures={"fig7": figure}, tables={"fig7": table}, numbers=numbers, verdict=verdict,
                        supported=supported, verdicts=verdicts)
