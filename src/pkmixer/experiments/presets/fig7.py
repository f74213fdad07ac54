"""Fig. 7: depth - RP S-Mixers catch up with normal ones as blocks are added (Hayase & Karakida Sec. 5.4, App. C.6,
D.4).

Command::

    pkmixer reproduce fig7 --scale paper --dataset cifar10   # also cifar100, stl10
    pkmixer reproduce fig7 --scale small                      # Fashion-MNIST, CPU minutes
    pkmixer reproduce fig7 --scale smoke

The paper's claim: with few blocks the RP S-Mixer is worse than the normal S-Mixer, but as the depth grows it
becomes comparable or better (its receptive field grows with every independently permuted layer, App. D.4).
What a run shows: mean test error ± std over seeds against the number of blocks L for both families, and the
gap RP − normal at each L. The verdict: the gap at the largest L is smaller than at the smallest L, and at the
largest L the RP S-Mixer is better or within two pooled standard deviations of the normal one (undecided when
the RP S-Mixer is not worse even at the smallest L: then there is no deficit to catch up with); the numbers say
whether each family improves with depth (Spearman ρ(L, error)).

Scales:

* ``paper`` (App. C.6, with App. C.4's recipe, which holds "throughout the whole study" on these data sets):
  S = C = 128 (the first token mixing maps S₀ = 64 -> 128, App. A.2.4), L = 4, 8, 12, 16, 20, patch 4 at 32 px,
  Nesterov SGD lr 0.02, batch 128, 200 epochs, crop and flip, 3 seeds: 30 runs per data set (about 70 V100
  hours for the three in the paper).
* ``small`` - Fashion-MNIST, S = C = 32, L = 1, 2, 4, 8, 4 epochs of AdamW on 10 000 images, 2 seeds: 16 runs.
* ``smoke`` - digits, S = C = 4, L = 1, 2, 1 epoch.
"""
from __future__ import annotations

from pathlib import Path

from ..preset import Analysis, Preset, register_preset
from ..report import aggregate, format_mean_std, rank_correlation
from ..sweep import RunSpec
from . import recipes
from .measures import error_plot, finished, gap

FAMILIES = {"S-Mixer": ("smixer_s128_32", "smixer"), "RP S-Mixer": ("rp_smixer_s128_32", "rpsmixer")}


@register_preset
class Fig7(Preset):
    name = "fig7"
    title = "Depth: RP S-Mixers against normal S-Mixers"
    claim = ("RP S-Mixers underperform normal S-Mixers at small depth but become comparable to or better than "
             "them as the number of blocks grows (S = C = 128).")
    source = "Hayase & Karakida Fig. 7, Sec. 5.4, App. C.6, D.4"
    datasets = recipes.PAPER_CIFAR + ("fashion-mnist", "mnist", "digits")
    scale_datasets = recipes.SCALE_DATASETS

    def runs(self, scale: str, dataset: str | None) -> list[RunSpec]:
        dataset = self.check_dataset(scale, dataset)
        recipes.check_dataset(self.name, scale, dataset, recipes.PAPER_CIFAR)
        recipe, width, depths = {
            "paper": lambda: (recipes.paper_cifar(dataset), 128, (4, 8, 12, 16, 20)),
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
        numbers = {}
        for family in FAMILIES:
            group = sorted((p for p in points if p["model"] == family), key=lambda p: p["depth"])
            for p in group:
                numbers[f"{family}, L = {p['depth']}"] = format_mean_std(p, percent=True)
            rho = rank_correlation([p["depth"] for p in group], [p["mean"] for p in group])
            numbers[f"{family}: Spearman ρ(L, error)"] = None if rho is None else round(rho, 3)
        supported, verdict = None, "Too few depths finished to compare."
        if len(gaps) >= 2:
            first, last = gaps[min(gaps)], gaps[max(gaps)]
            shrinks = last["difference"] < first["difference"]
            close = last["difference"] <= 0 or bool(last["within_noise"])
            numbers["gap RP − normal at the smallest / largest L (points)"] = \
                f"{100 * first['difference']:+.2f} / {100 * last['difference']:+.2f}"
            standing = ("better than" if last["difference"] <= 0 else "within two pooled std of" if close else
                        "worse, beyond two pooled std, than" if last["within_noise"] is False else
                        "worse (one seed: no std) than")
            verdict = (f"The RP − normal error gap goes from {100 * first['difference']:+.2f} points at "
                       f"L = {min(gaps)} to {100 * last['difference']:+.2f} at L = {max(gaps)} "
                       f"({'shrinks' if shrinks else 'does not shrink'}); at L = {max(gaps)} the RP S-Mixer is "
                       f"{standing} the normal one.")
            if close and not shrinks and first["difference"] <= 0:
                # RP is not worse even at the smallest depth: there is no deficit to catch up with
                verdict += (f" The shallow RP deficit the claim starts from does not appear (RP is not worse at "
                            f"L = {min(gaps)}), so catching up cannot be judged.")
                supported = None
            else:
                supported = None if scale == "smoke" else shrinks and close
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        width = rows[0].get("C") if rows else None
        figure = error_plot(points, "depth", "model", f"Fig. 7: error against depth, S = C = {width} ({data})",
                            "blocks L", log_x=False, order=list(FAMILIES))
        return Analysis(figures={"fig7": figure}, tables={"fig7": table}, numbers=numbers, verdict=verdict,
                        supported=supported)
