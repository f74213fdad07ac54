"""Fig. S.4: one block of an S-Mixer replaced by its RP counterpart (Hayase & Karakida App. D.5).

Command::

    pkmixer reproduce figs4 --scale paper --dataset cifar10   # also cifar100, stl10
    pkmixer reproduce figs4 --scale medium                     # all of Fashion-MNIST, 8 seeds (about 60 min, 2 cores)
    pkmixer reproduce figs4 --scale small                      # Fashion-MNIST, CPU minutes
    pkmixer reproduce figs4 --scale smoke

The paper's words (:data:`QUOTE_FIRST`, :data:`QUOTE_UPSTREAM`, App. D.5): "Interestingly, when the accuracy
deterioration apparently appears (e.g., cases of CIFAR-10 and STL-10 in Figure 7), this deterioration is attributed to
the first block." and "Thus, we conclude that the RP and normal mixing layers have almost the same inductive bias,
especially, in the upstream layers." The claim is conditional: it is about the case where the RP S-Mixer is worse than
the normal one. What a run shows: mean test error ± std over seeds of the normal S-Mixer, the S-Mixer with block l
made RP (l = 1 ... L) and the all-RP S-Mixer, and each variant's error minus the normal one's, paired over seeds. The
verdict (:mod:`pkmixer.experiments.rules`, Student's t over 5 paired seeds at 92 %, Holm across the parts): first the
precondition, the all-RP S-Mixer worse than the normal one (:data:`DEFICIT_RULE`) - when it is not supported, the
outcome is out of regime, whatever the rest says; then block 1's cost minus the mean cost of blocks 2 ... L > 0
(:data:`FIRST_RULE`); and the mean cost of blocks 2 ... L below :data:`ALMOST_NOTHING` = 0.5 points
(:data:`UPPER_RULE`, "almost the same": printed at a quarter and one point too).

Scales:

* ``paper`` - App. D.5: S-Mixer, 4 blocks, S = C = 64 (= S₀ at patch 4 and 32 px), "the optimizer and training
  settings ... consistent with Section C.6", i.e. App. C.4's recipe (Nesterov SGD lr 0.02, batch 128, 200
  epochs, crop and flip), 3 seeds: 18 runs per data set (about 10 V100 hours in the paper).
* ``medium`` - the small design with :func:`.recipes.medium` (Fashion-MNIST less a 5 000-image validation split,
  App. C.4's crop and flip, 20 epochs), 5 seeds: 30 runs, plus the epoch-doubling check (the normal and the
  all-RP S-Mixer, seed 0, 40 epochs): at the earlier design's recorded 7.5 s a run-epoch, 1.4 h on 2 cores.
* ``small`` - Fashion-MNIST, S = C = 32, 4 blocks, 4 epochs of AdamW on 10 000 images, 2 seeds: 12 runs.
* ``smoke`` - digits, S = C = 4, 2 blocks, 1 epoch.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..preset import Analysis, Preset, register_preset
from ..regime import Departures, Quantity, Regime, constant
from ..rules import OUT_OF_REGIME, ArmRule, Quote, arm_verdict, contrast
from ..stats import (SUPPORTED, aggregate, bootstrap_interval, format_mean_std, gap, interval_text,
                     per_seed_difference, per_seed_table, summary)
from ..sweep import RunSpec
from .. import measures, recipes

QUOTE_FIRST = Quote("App. D.5", "Interestingly, when the accuracy deterioration apparently appears (e.g., cases of "
                                "CIFAR-10 and STL-10 in Figure 7), this deterioration is attributed to the first block.")
QUOTE_UPSTREAM = Quote("App. D.5", "Thus, we conclude that the RP and normal mixing layers have almost the same "
                                   "inductive bias, especially, in the upstream layers.")
# The rules, fixed before any run is read; a per-seed table's arms are [normal, RP block 1, ..., RP block L, all-RP]
LEVEL = 0.92
ALMOST_NOTHING = 0.005
_POINTS = {"level": LEVEL, "scale": 100, "unit": " points"}


def deficit_rule(depth: int) -> ArmRule:
    return ArmRule("mean over seeds of error(all-RP) − error(normal)", contrast([-1] + [0] * depth + [1]), "above",
                   0.0, **_POINTS)


def first_rule(depth: int) -> ArmRule:
    higher = [-1 / (depth - 1)] * (depth - 1)
    return ArmRule("error(RP block 1) − the mean error of RP blocks 2 ... L (means over seeds)",
                   contrast([0, 1] + higher + [0]), "above", 0.0, **_POINTS)


def upper_rule(depth: int) -> ArmRule:
    higher = [1 / (depth - 1)] * (depth - 1)
    return ArmRule("mean error of RP blocks 2 ... L − error(normal) (means over seeds)",
                   contrast([-1, 0] + higher + [0]), "below", ALMOST_NOTHING, margins=(0.0025, 0.005, 0.01),
                   reason="“almost the same” read as at most half a point worse", **_POINTS)


DEFICIT_RULE, FIRST_RULE, UPPER_RULE = deficit_rule(4), first_rule(4), upper_rule(4)


def _variants(depth: int) -> list[tuple[str, str | list[int] | None, int | None]]:
    """(label, rp_blocks, replaced block counted from 1) of the normal, single-RP-block and all-RP S-Mixers."""
    return ([("S-Mixer", None, None)] + [(f"RP block {i + 1}", [i], i + 1) for i in range(depth)]
            + [("RP S-Mixer", "all", None)])


@register_preset
class FigS4(Preset):
    name = "figs4"
    title = "One RP block in a normal S-Mixer"
    claim = ("Replacing a single block of a normal S-Mixer by an RP block hurts most in the first block; RP blocks "
             "higher up behave like normal ones.")
    source = "Hayase & Karakida Fig. S.4, App. D.5"
    datasets = recipes.PAPER_CIFAR + ("fashion-mnist", "mnist", "digits")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)
    scales = ("paper", "medium", "small", "smoke")
    default_seeds = {"paper": 3, "medium": 5, "small": 2, "smoke": 1}

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((Quantity("S = C", 64, lambda specs: specs[0].meta["C"], 2.0, why="App. D.5: S = C = 64"),
                       Quantity("blocks L", 4, constant(4), 1.0, why="App. D.5: four blocks")),
                      Departures(f"{dataset} (the paper: CIFAR-10, CIFAR-100, STL-10)",
                                 "20 of AdamW (the paper: 200 of Nesterov SGD)", "App. C.4's random crop and flip",
                                 ("the precondition, an RP deficit, is checked on the runs: without it the outcome is "
                                  "out of regime",)).lines())

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        recipe, width, depth = {
            "paper": lambda: (recipes.paper_cifar(dataset), 64, 4),
            "medium": lambda: (recipes.medium(dataset, epochs=20), 32, 4),
            "small": lambda: (recipes.small(dataset), 32, 4),
            "smoke": lambda: (recipes.smoke(), 4, 2),
        }[scale]()
        specs = []
        for label, rp, block in _variants(depth):
            tokens = None if width == (recipe.image["img_size"] // recipe.image["patch_size"]) ** 2 else width
            config = recipe.config({"name": "smixer_c64p4_32", "depth": depth, "embed_dim": width, "num_tokens": tokens,
                                    "rp_blocks": rp})
            meta = {"dataset": dataset, "model": label, "rp_block": block, "depth": depth, "C": width, "S": width}
            tag = "normal" if rp is None else "allrp" if rp == "all" else f"rp{block}"
            specs += self.seeded(tag, config, meta, scale)
        if scale == "medium":  # the normal and the all-RP S-Mixer, seed 0
            specs += [recipes.doubled(s) for s in specs if s.meta["seed"] == 0 and s.meta["rp_block"] is None]
        return recipes.seed_structures(specs)

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = measures.trained(rows)
        value, value_note = measures.decided_value(done, self.decided_on)
        points = aggregate(done, ["model", "rp_block"], value)
        normal = next((p for p in points if p["model"] == "S-Mixer"), None)
        singles = sorted((p for p in points if p["rp_block"] is not None), key=lambda p: p["rp_block"])
        table = [{"model": p["model"], "rp_block": p["rp_block"], "test_error_mean": p["mean"],
                  "test_error_std": p["std"], "seeds": p["n"],
                  "minus_normal": None if normal is None else p["mean"] - normal["mean"]} for p in points]
        numbers = {p["model"]: format_mean_std(p, percent=True) for p in points}
        normal_runs = [r for r in done if r["model"] == "S-Mixer"]
        for p in points:
            if p["model"] != "S-Mixer":
                numbers[f"{p['model']} − S-Mixer"] = interval_text(
                    per_seed_difference([r for r in done if r["model"] == p["model"]], normal_runs, value),
                    level=LEVEL, scale=100.0, unit=" points")
        verdict, verdicts = "The normal S-Mixer and the single-block replacements must finish to compare. ", []
        if normal is not None and len(singles) >= 2:
            depth = len(singles)
            costs = ", ".join(f"block {p['rp_block']}: {100 * gap(p, normal)['difference']:+.2f}" for p in singles)
            verdict = f"Error of each single RP block minus the normal S-Mixer's, in points - {costs}. "

            def arm(row: dict):
                return "normal" if row["model"] == "S-Mixer" else "all" if row["model"] == "RP S-Mixer" else \
                    row["rp_block"]

            seeds_table = per_seed_table(done, arm, ["normal", *range(1, depth + 1), "all"], value)
            extra = measures.sampling_error(done, value)
            verdicts = [arm_verdict(deficit_rule(depth), seeds_table, "Precondition: the RP S-Mixer is worse than the "
                                    "normal one", quote=QUOTE_FIRST, extra=extra),
                        arm_verdict(first_rule(depth), seeds_table, "The first RP block costs most", quote=QUOTE_FIRST),
                        arm_verdict(upper_rule(depth), seeds_table, f"RP blocks 2 ... {depth} cost (almost) nothing",
                                    quote=QUOTE_UPSTREAM)]
            verdict += summary(verdicts)
        checks = measures.doubling(rows, "rp_block")
        check_numbers, check_text = measures.doubling_report(checks)
        numbers |= check_numbers
        fields = measures.conclude(self, rows, scale, verdicts, checks, value_note)
        if verdicts and verdicts[0].decision != SUPPORTED and fields["outcome"] not in ("not testable here",) \
                and scale != "smoke":
            fields |= {"outcome": OUT_OF_REGIME, "supported": None,
                       "reason": "the claim is about the case where the RP S-Mixer is worse than the normal one; here "
                                 f"that deficit is {verdicts[0].decision}"}
        verdict += check_text + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        return Analysis(figures={"figs4": _figure(points, normal, done, data)}, tables={"figs4": table},
                        numbers=numbers, verdict=verdict, verdicts=verdicts, **fields)


def _figure(points: list[dict], normal: dict | None, done: list[dict], data: str) -> Figure:
    """Left: mean test error ± std of each variant, the normal S-Mixer's as a dashed line. Right: each variant's
    error minus the normal S-Mixer's, paired over seeds, with its 90 % paired-bootstrap interval (the differences
    the verdict reads; the bars hide them when they are small against the error itself)."""
    order = sorted(points, key=lambda p: (p["rp_block"] is None and p["model"] != "S-Mixer", p["rp_block"] or 0))
    fig = Figure(figsize=(10.0, 3.8))
    ax, diff = fig.subplots(1, 2)
    colours = ["tab:red" if p["model"] == "S-Mixer" else "tab:orange" if p["rp_block"] is None else "tab:olive"
               for p in order]
    ax.bar(range(len(order)), [100 * p["mean"] for p in order], yerr=[100 * (p["std"] or 0) for p in order],
           color=colours, capsize=3)
    if normal is not None:
        ax.axhline(100 * normal["mean"], color="tab:red", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(order)), [p["model"] for p in order], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("test error (%)")
    ax.set_title(f"Fig. S.4: one RP block in a normal S-Mixer ({data})", fontsize=10)
    normal_runs = [r for r in done if r["model"] == "S-Mixer"]
    others = [(k, p) for k, p in enumerate(order) if p["model"] != "S-Mixer"]
    for k, p in others:
        seeds = per_seed_difference([r for r in done if r["model"] == p["model"]], normal_runs)
        if len(seeds) >= 2:
            estimate, (low, high) = bootstrap_interval(list(seeds.values()), level=LEVEL)
            diff.errorbar([k], [100 * estimate], yerr=[[100 * (estimate - low)], [100 * (high - estimate)]],
                          fmt="o", color=colours[k], capsize=3)
        elif seeds:
            diff.plot([k], [100 * next(iter(seeds.values()))], "o", color=colours[k])
    diff.axhline(0.0, color="tab:red", linestyle="--", linewidth=1)
    diff.set_xticks([k for k, _ in others], [p["model"] for _, p in others], rotation=30, ha="right", fontsize=8)
    diff.set_ylabel("error − S-Mixer's (points)")
    diff.set_title(f"paired over seeds, {100 * LEVEL:g} % intervals", fontsize=10)
    fig.tight_layout()
    return fig
