"""Fig. 5: S-Mixer, RP S-Mixer and SW-MLP against effective width at fixed Ω (Hayase & Karakida Sec. 4.2, App. C.4).

Command::

    pkmixer reproduce fig5 --scale paper --dataset cifar10   # also cifar100, stl10 (resized to 32 px)
    pkmixer reproduce fig5 --scale medium                     # 66 runs, 75 min on 2 cores here
    pkmixer reproduce fig5 --scale small                      # make demo: a subset of medium, under 10 minutes
    pkmixer reproduce fig5 --scale smoke                      # seconds, for the tests

The paper's claim: at a fixed number Ω of connections per layer, the test error falls as the effective width
grows, alike for the S-Mixer (m = S·C), the RP S-Mixer and the static sparse-weight MLP (m = √(Ω/p)); the
Mixers reach widths an SW-MLP cannot afford. What a run shows: the mean test error over seeds of every
(family, Ω, C, S) or (SW-MLP, p) point against m, and - the verdict - per family and Ω a statistic with its 90 %
paired-bootstrap interval over seeds, decided by a rule declared here before any run is read: with three widths
or more :data:`TREND_RULE`, the within-seed Spearman ρ between m and the test error averaged over seeds (the claim
holds when the whole interval is below 0); with two widths :data:`WIDEST_RULE`, the narrowest point's error minus
the widest one's (above 0). Fewer than 5 seeds are undecided; the claim is supported when every family supports
it, contradicted when any contradicts it. The report also gives each family's narrowest-minus-widest difference
with its interval, the training curves of every run, and at medium scale the epoch-doubling check.

Scales:

* ``paper`` (App. C.4): patch 4 on 32 px images (S₀ = 64), 8 blocks, the first token mixing S₀ -> S with the skip
  layer of App. A.2.4; S-Mixer and RP S-Mixer at Ω = 2^18, 2^21, 2^27 with the (C, S) pairs listed there; SW-MLP
  (S.16 blocks, per-patch FC to 64 channels) at Ω = 2^18 with 1 - p = 0.1, 0.3, 0.5, 0.7, 0.9 (m = 540 ... 1619);
  Nesterov SGD, batch 128, momentum 0.9, lr 0.02, cosine annealing, 200 epochs, random crop (padding 4) and
  horizontal flip; 3 seeds. 111 runs per data set; the paper reports about 400 V100 hours for the three.
* ``medium`` (:func:`.recipes.medium`): all 60 000 Fashion-MNIST training and 10 000 test images (28 px,
  1 channel, patch 4: S₀ = 49), Ω = 2^15, 4 blocks; Mixers at C = 4, 8, 16, 32 (S = 126, 87, 56, 32;
  m = 504 ... 1024, 2.03×, the widest at C = S), SW-MLP at p = 1, 1/4, 1/16, 1/32 (m = 181 ... 1024, 5.7×; CSR
  weights below p = 1: 2.1-2.9× the dense-masked step at m = 1024 and p ≤ 1/16, level at p = 1/4,
  docs/performance.md (c)); 10 epochs of AdamW (:data:`.recipes.MEDIUM_EPOCHS`);
  5 seeds paired across models: 60 runs, plus the convergence check - the narrowest and widest point of each
  family retrained for 20 epochs on seed 0 (6 runs, left out of the verdicts). With ``--epochs 20`` (all runs
  20 epochs, the check 40; 7.5 min on one H100) four of the six checks pass. The same on CIFAR-10/100 or
  STL-10 (``--dataset``) with 32 px colour images, crop and flip; on the bundled 8×8 digits (the default when
  Fashion-MNIST is absent) Ω = 2^12 with C = 2, 4, 8, 16 and 24 epochs.
* ``small``: two S-Mixer points of medium, the second-narrowest and the widest (C = 8 and 32, m = 696 and 1024;
  on digits C = 4 and 16), 5 seeds: 10 runs, under 10 minutes on 2 cores (``make demo``). The narrowest,
  C = 4, takes about 1.7 times as long per epoch as C = 8 and would not fit.
* ``smoke``: 500 digits (8 px, patch 2: S₀ = 16), Ω = 2^9, 2 blocks, two widths per family, 1 epoch, 1 seed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from ...theory.width import mixer_omega, swmlp_width, symmetric_pairs
from ..preset import Analysis, Preset, register_preset
from ..stats import (Rule, aggregate, bootstrap_verdict, format_mean_std, interval_text, overall,
                     per_seed_difference, summary, trend_verdict)
from ..sweep import RunSpec
from . import measures, recipes
from .measures import COLOURS, learning_curves

FAMILIES = ("S-Mixer", "RP S-Mixer", "SW-MLP")
# The verdicts' rules, fixed before any run is read (issue 16), per family and Ω: with three widths or more the
# mean over seeds of the within-seed Spearman ρ(m, test error); with two, the paired difference of the narrowest
# and the widest point's errors; each with its 90 % paired-bootstrap interval over seeds and the threshold 0.
LEVEL = 0.90
TREND_RULE = Rule("mean over seeds of Spearman ρ(width, test error)", threshold=0.0, direction="below", level=LEVEL)
WIDEST_RULE = Rule("test error at the narrowest minus the widest m", threshold=0.0, direction="above", level=LEVEL,
                   scale=100.0, unit=" points")


@dataclass(frozen=True)
class _Size:
    """The model sizes of one scale; the training recipe comes from :mod:`.recipes` (:func:`_recipe`)."""

    mixer_pairs: dict[int, list[tuple[int, int]]]  # Ω -> [(C, S)]
    sw_omega: int
    sw_densities: tuple[float, ...]  # () for no SW-MLP
    depth: int
    sw_embed_dim: int
    sw_format: str = "masked"  # "sparse": CSR weights below p = 1 (the training step is faster there)
    mixer_families: tuple[str, ...] = ("S-Mixer", "RP S-Mixer")


def _mirrored(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(set(pairs) | {(s, c) for c, s in pairs})


# Ω = 2^15: C* = S* = 32, the widest Mixer m = 1024; SW-MLP from dense (m = 181) to m = 1024
MEDIUM = _Size(mixer_pairs={2**15: symmetric_pairs(2**15, channels=[4, 8, 16, 32])}, sw_omega=2**15,
               sw_densities=(1.0, 1 / 4, 1 / 16, 1 / 32), depth=4, sw_embed_dim=16, sw_format="sparse")
# the bundled digits (1438 training images, 8 px): Ω = 2^12 (C* = 16)
MEDIUM_DIGITS = dataclasses.replace(MEDIUM, mixer_pairs={2**12: symmetric_pairs(2**12, channels=[2, 4, 8, 16])},
                                    sw_omega=2**12, sw_embed_dim=4)
SIZES = {
    "paper": _Size(mixer_pairs={2**18: _mirrored(symmetric_pairs(2**18, channels=[16, 32, 48])),
                                2**21: symmetric_pairs(2**21, count=3, c_min=16),
                                2**27: symmetric_pairs(2**27, count=2, c_min=128)},
                   sw_omega=2**18, sw_densities=(0.9, 0.7, 0.5, 0.3, 0.1), depth=8, sw_embed_dim=64),
    "medium": MEDIUM,
    "small": dataclasses.replace(MEDIUM, mixer_pairs={2**15: symmetric_pairs(2**15, channels=[8, 32])},
                                 sw_densities=(), mixer_families=("S-Mixer",)),
    "smoke": _Size(mixer_pairs={2**9: symmetric_pairs(2**9, channels=[4, 8])},
                   sw_omega=2**9, sw_densities=(1.0, 1 / 4), depth=2, sw_embed_dim=4),
}
DIGITS = {"medium": MEDIUM_DIGITS,
          "small": dataclasses.replace(MEDIUM_DIGITS, mixer_pairs={2**12: symmetric_pairs(2**12, channels=[4, 16])},
                                       sw_densities=(), mixer_families=("S-Mixer",))}
MODELS = {"S-Mixer": ("smixer", "smixer_s64_32", "smixer_t4_28"),  # family -> run tag, colour model, grey model
          "RP S-Mixer": ("rpsmixer", "rp_smixer_s64_32", "rp_smixer_t4_28"),
          "SW-MLP": ("swmlp", "swmlp_o18_32", "swmlp_t4_28")}


def _recipe(scale: str, dataset: str) -> recipes.Recipe:
    """App. C.4 at paper scale; recipes.medium at medium and small scale (small is a subset of medium's runs);
    at smoke scale 500 / 200 digits in batches of 50."""
    if scale == "paper":
        return recipes.paper_cifar(dataset)
    if scale == "smoke":
        return recipes.smoke(train_subset=500, test_subset=200, batch_size=50)
    return recipes.medium(dataset)


@register_preset
class Fig5(Preset):
    name = "fig5"
    title = "S-Mixer, RP S-Mixer and SW-MLP against effective width at fixed Ω"
    claim = ("At a fixed number Ω of connections per layer, test error falls as the effective width m grows, "
             "alike for the S-Mixer (m = SC), the RP S-Mixer and the sparse-weight MLP (m = √(Ω/p)); the Mixers "
             "reach widths an SW-MLP cannot afford.")
    source = "Hayase & Karakida Fig. 5, Sec. 4.2, App. C.4"
    datasets = ("cifar10", "cifar100", "stl10", "fashion-mnist", "digits")
    scales = ("paper", "medium", "small", "smoke")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)
    default_seeds = {"paper": 3, "medium": 5, "small": 5, "smoke": 1}

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        s = DIGITS[scale] if dataset == "digits" and scale in DIGITS else SIZES[scale]
        recipe = _recipe(scale, dataset)
        colour = recipe.image == recipes.COLOUR32
        specs, ends = [], []  # ends: the narrowest and widest point of each family (medium's convergence check)
        for omega, pairs in s.mixer_pairs.items():
            for family in s.mixer_families:
                tag, model = MODELS[family][0], MODELS[family][1 if colour else 2]
                points = []
                for C, S in pairs:
                    options = {"name": model, "depth": s.depth, "embed_dim": C, "num_tokens": S}
                    meta = {"dataset": dataset, "model": family, "omega": omega, "omega_exact": mixer_omega(C, S),
                            "C": C, "S": S, "width": C * S, "density": None}
                    points.append(self.seeded(f"{tag}-o{omega}-c{C}-s{S}", recipe.config(options), meta, scale))
                ends += _ends(points)
                specs += [spec for point in points for spec in point]
        points = []
        for p in s.sw_densities:
            m = swmlp_width(s.sw_omega, p)
            # dense + mask at paper scale (m <= 1619); CSR below p = 1 where sw_format says so
            weight_format = "sparse" if s.sw_format == "sparse" and p < 1 else "masked"
            options = {"name": MODELS["SW-MLP"][1 if colour else 2], "depth": s.depth, "embed_dim": s.sw_embed_dim,
                       "width": m, "density": p, "block": "fc", "weight_format": weight_format}
            meta = {"dataset": dataset, "model": "SW-MLP", "omega": s.sw_omega, "omega_exact": p * m * m, "C": None,
                    "S": None, "width": m, "density": p}
            points.append(self.seeded(f"swmlp-o{s.sw_omega}-m{m}", recipe.config(options), meta, scale))
        ends += _ends(points)
        specs += [spec for point in points for spec in point]
        if scale == "medium":
            specs += [recipes.doubled(spec) for spec in ends if spec.meta["seed"] == 0]
        return recipes.seed_structures(specs)  # each seed its own permutations and masks

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        finished, done = measures.finished(rows), measures.trained(rows)
        points = aggregate(done, ["model", "omega", "C", "S", "width", "density"], "final_test_error")
        points.sort(key=lambda r: (FAMILIES.index(r["model"]), r["omega"], r["width"], r["C"] or 0))
        table = [{"model": p["model"], "omega": p["omega"], "C": p["C"], "S": p["S"], "width": p["width"],
                  "density": p["density"], "test_error_mean": p["mean"], "test_error_std": p["std"], "seeds": p["n"]}
                 for p in points]
        numbers, verdicts = {}, []
        for family in FAMILIES:
            for omega in sorted({p["omega"] for p in points if p["model"] == family}):
                group = [p for p in points if p["model"] == family and p["omega"] == omega]
                key = f"{family} Ω={_power(omega)}"
                best = min(group, key=lambda p: p["mean"])
                numbers[f"{key}: widths"] = f"{min(p['width'] for p in group)} to {max(p['width'] for p in group)}"
                numbers[f"{key}: lowest test error"] = \
                    f"{format_mean_std(best, percent=True)} at m = {best['width']}" + \
                    (f" (C = {best['C']}, S = {best['S']})" if best["C"] else f" (p = {best['density']:.3g})")
                runs = [r for r in done if r["model"] == family and r["omega"] == omega]
                narrow, wide = _extremes(runs)
                difference = per_seed_difference(narrow, wide)
                if len({r["width"] for r in runs}) > 1:
                    numbers[f"{key}: error at the narrowest minus the widest m"] = \
                        interval_text(difference, level=LEVEL, scale=100.0, unit=" points")
                claim = f"{key}: error falls as m grows"
                verdicts.append(bootstrap_verdict(difference, WIDEST_RULE, claim)
                                if len({r["width"] for r in runs}) == 2 else trend_verdict(runs, "width", TREND_RULE,
                                                                                           claim))
        doubling = measures.doubling(finished, "width")
        number, convergence = measures.doubling_report(doubling)
        numbers.update(number)
        supported = None if scale == "smoke" else overall(verdicts)
        listed = summary(verdicts) or "no finished runs."
        if supported is None:
            verdict = f"Error against effective width at fixed Ω - undecided: {listed}"
            if scale == "smoke":
                verdict += " (Smoke scale: too short to decide.)"
        else:
            verdict = (f"Test error {'falls' if supported else 'does not fall in every family'} as the effective "
                       f"width grows at fixed Ω - {listed}")
        verdict += convergence
        tables = {"fig5": table}
        if doubling:
            tables["fig5_doubling"] = doubling
        curves = learning_curves(finished)
        return Analysis(figures={"fig5": _plot(points, rows), "fig5_curves": _plot_curves(finished, curves)},
                        tables=tables, numbers=numbers, verdict=verdict, supported=supported, verdicts=verdicts)


def _ends(points: list[list[RunSpec]]) -> list[RunSpec]:
    """The runs of the narrowest and the widest of ``points`` (each a list of seeded runs)."""
    if not points:
        return []
    by_width = sorted(points, key=lambda runs: runs[0].meta["width"])
    return by_width[0] + (by_width[-1] if len(by_width) > 1 else [])


def _extremes(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """The rows at the narrowest and at the widest m of ``runs``."""
    if not runs:
        return [], []
    widths = [r["width"] for r in runs]
    return [r for r in runs if r["width"] == min(widths)], [r for r in runs if r["width"] == max(widths)]


def _power(omega: int, tex: bool = False) -> str:
    exponent = omega.bit_length() - 1
    if omega != 1 << exponent:
        return f"{omega:g}"
    return f"$2^{{{exponent}}}$" if tex else f"2^{exponent}"


def _plot(points: list[dict], rows: list[dict]) -> Figure:
    """Mean test error ± std over seeds against effective width: one line per family and Ω (Fig. 5)."""
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    colors = COLOURS
    markers = ["o", "s", "^", "D"]
    for family in FAMILIES:
        omegas = sorted({p["omega"] for p in points if p["model"] == family})
        for i, omega in enumerate(omegas):
            group = sorted((p for p in points if p["model"] == family and p["omega"] == omega),
                           key=lambda p: (p["width"], p["C"] or 0))
            ax.errorbar([p["width"] for p in group], [100 * p["mean"] for p in group],
                        yerr=[100 * (p["std"] or 0.0) for p in group], color=colors[family],
                        marker=markers[i % len(markers)], capsize=3, linewidth=1.2,
                        label=f"{family}, Ω = {_power(omega, tex=True)}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("effective width m")
    ax.set_ylabel("test error (%)")
    data = sorted({str(r.get("dataset", "")) for r in rows} - {""})
    ax.set_title(f"Fig. 5: error against effective width at fixed Ω{' (' + ', '.join(data) + ')' if data else ''}")
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    return fig


def _plot_curves(rows: list[dict], curves: dict[str, list[dict]]) -> Figure:
    """Convergence evidence: training loss and test error of every finished run against the epoch, one thin
    line per run coloured by family (dashed: the epoch-doubling runs)."""
    fig = Figure(figsize=(10.0, 4.0))
    loss_ax, error_ax = fig.subplots(1, 2)
    labelled = set()
    for row in rows:
        curve = [m for m in curves.get(row["run"], []) if "test_error" in m]
        if not curve:
            continue
        epochs = [m["epoch"] for m in curve]
        style = {"color": COLOURS.get(row["model"]), "linewidth": 0.8, "alpha": 0.7,
                 "linestyle": "--" if row.get("doubles") else "-"}
        label = row["model"] if row["model"] not in labelled else None
        labelled.add(row["model"])
        loss_ax.plot(epochs, [m["train_loss"] for m in curve], label=label, **style)
        error_ax.plot(epochs, [100 * m["test_error"] for m in curve], **style)
    loss_ax.set_yscale("log")
    loss_ax.set_ylabel("training loss")
    error_ax.set_ylabel("test error (%)")
    for ax in (loss_ax, error_ax):
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    if labelled:
        loss_ax.legend(fontsize=8)
    fig.suptitle("Fig. 5 runs: training curves (dashed: the epoch-doubling check)", fontsize=10)
    return fig
