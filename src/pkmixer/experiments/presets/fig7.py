"""Fig. 7: depth - RP S-Mixers catch up with normal ones as blocks are added (Hayase & Karakida Sec. 5.4, App. C.6,
D.4).

Command::

    pkmixer reproduce fig7 --scale paper --dataset cifar10   # also cifar100, stl10
    pkmixer reproduce fig7 --scale medium                     # all of Fashion-MNIST, 5 seeds (estimated 30 min, 2 cores)
    pkmixer reproduce fig7 --scale small                      # Fashion-MNIST, CPU minutes
    pkmixer reproduce fig7 --scale smoke

The paper's words (:data:`QUOTE`, Sec. 5.4): "we observed that RP Mixers tended to underperform at limited depths but
could achieve comparable or better results than normal Mixers with increased depths"; App. D.4's "RP S-Mixers can
even become comparable to the normal ones or better than them in some cases" is existential (:data:`QUOTE_SOME`): not
testable here. What a run shows: mean test error ± std over seeds against the number of blocks L for both families,
and the gap RP − normal at each L. The verdict has three parts (:mod:`pkmixer.experiments.rules`, Student's t over 5
paired seeds at 92 %, Holm's procedure across the parts): the RP deficit at the smallest L, error(RP) − error(normal)
> 0 (:data:`DEFICIT_RULE`); its shrinking, gap(smallest L) − gap(largest L) > 0 (:data:`CATCH_UP_RULE`); comparable
or better at the largest L, gap < :data:`COMPARABLE` = 0.5 points (:data:`DEEP_RULE`, printed at a quarter and one
point too). Medium scale is out of the claim's regime (S = C = 32 and L ≤ 8 against 128 and 4 ... 20): decided out of
regime whatever its statistics say.

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
from ..regime import Departures, Quantity, Regime, widest
from ..rules import ArmRule, Quote, arm_verdict, contrast, not_testable
from ..stats import aggregate, format_mean_std, gap, interval_text, per_seed_table, per_seed_trend, summary
from ..sweep import RunSpec
from .. import measures, recipes
from ..measures import error_plot, finished

FAMILIES = {"S-Mixer": ("smixer_c128p4_32", "smixer"), "RP S-Mixer": ("rp_smixer_c128p4_32", "rpsmixer")}
QUOTE = Quote("Sec. 5.4", "As is shown in Figure 7, we observed that RP Mixers tended to underperform at limited "
                          "depths but could achieve comparable or better results than normal Mixers with increased "
                          "depths.")
QUOTE_SOME = Quote("App. D.4", "Fig. 7 confirms that by increasing the depth, i.e., the number of blocks, RP S-Mixers "
                               "can even become comparable to the normal ones or better than them in some cases.")
# The rules, fixed before any run is read; the arms of each per-seed table are (normal, RP) at the smallest L, then
# (normal, RP) at the largest
LEVEL = 0.92
COMPARABLE = 0.005  # "comparable": the RP S-Mixer's error at most 0.5 points above the normal one's
_POINTS = {"level": LEVEL, "scale": 100, "unit": " points"}
DEFICIT_RULE = ArmRule("mean over seeds of error(RP) − error(normal) at the smallest L", contrast([-1, 1, 0, 0]),
                       "above", 0.0, **_POINTS)
CATCH_UP_RULE = ArmRule("mean over seeds of the gap RP − normal at the smallest L minus at the largest L",
                        contrast([-1, 1, 1, -1]), "above", 0.0, **_POINTS)
DEEP_RULE = ArmRule("mean over seeds of error(RP) − error(normal) at the largest L", contrast([0, 0, -1, 1]), "below",
                    COMPARABLE, margins=(0.0025, 0.005, 0.01),
                    reason="“comparable” read as at most half a point worse", **_POINTS)


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

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((Quantity("S = C", 128, widest("C"), 2.0, why="App. C.6 and the caption: S = C = 128"),
                       Quantity("largest depth L", 20, widest("depth"), 0.75, "at_least",
                                "App. C.6: L = 4 ... 20; the claim is about “increased depths”")),
                      Departures(f"{dataset} (the paper: CIFAR-10, CIFAR-100, STL-10)",
                                 f"{recipes.MEDIUM_EPOCHS} of AdamW (the paper: 200 of Nesterov SGD)",
                                 "App. C.4's random crop and flip",
                                 ("S = C = 128 at L = 20 costs about 80 times the medium runs' S = C = 32 at L = 8 per "
                                  "step: a GPU's run (paper scale)",)).lines())

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
        verdict, verdicts = "Too few depths finished to compare. ", []
        if len(gaps) >= 2:
            low, high = min(gaps), max(gaps)
            table4 = per_seed_table(done, lambda r: (r["model"], r["depth"]),
                                    [("S-Mixer", low), ("RP S-Mixer", low), ("S-Mixer", high), ("RP S-Mixer", high)])
            numbers["gap RP − normal at the smallest / largest L (points)"] = \
                f"{100 * gaps[low]['difference']:+.2f} / {100 * gaps[high]['difference']:+.2f}"
            extra = measures.sampling_error(done)
            verdicts = [arm_verdict(DEFICIT_RULE, table4, f"RP worse than normal at L = {low}", quote=QUOTE),
                        arm_verdict(CATCH_UP_RULE, table4, f"the gap shrinks from L = {low} to L = {high}",
                                    quote=QUOTE),
                        arm_verdict(DEEP_RULE, table4, f"RP comparable or better at L = {high}", quote=QUOTE,
                                    extra=extra)]
            verdict = (f"The RP − normal error gap goes from {100 * gaps[low]['difference']:+.2f} points at L = {low} "
                       f"to {100 * gaps[high]['difference']:+.2f} at L = {high}. " + summary(verdicts))
        verdicts.append(not_testable("RP S-Mixers comparable or better in some cases",
                                     "existential (“in some cases”): no run can contradict it", QUOTE_SOME))
        fields = measures.conclude(self, rows, scale, verdicts)
        verdict += measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        width = rows[0].get("C") if rows else None
        figure = error_plot(points, "depth", "model", f"Fig. 7: error against depth, S = C = {width} ({data})",
                            "blocks L", log_x=False, order=list(FAMILIES))
        return Analysis(figures={"fig7": figure}, tables={"fig7": table}, numbers=numbers, verdict=verdict,
                        verdicts=verdicts, **fields)
