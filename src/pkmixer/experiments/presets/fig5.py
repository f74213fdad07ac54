"""Fig. 5: S-Mixer, RP S-Mixer and SW-MLP against effective width at fixed Ω (Hayase & Karakida Sec. 5.3, App. C.4),
decided at medium scale on the same grid as Fig. 6.

Command::

    pkmixer reproduce fig5 --scale paper --dataset cifar10   # also cifar100, stl10 (resized to 32 px)
    pkmixer reproduce fig5 --scale medium                     # the Fig. 5/6 grid (fig6 reads the same runs)
    pkmixer reproduce fig5 --scale medium --check-regime      # the regime check, without training
    pkmixer reproduce fig5 --scale small                      # make demo: under 10 minutes on 2 cores
    pkmixer reproduce fig5 --scale smoke                      # seconds, for the tests

The paper's words (:data:`QUOTE_FIG5`, :data:`QUOTE_CAPTION`): "Figure 5 shows that the test error improves as the
effective width of the Mixers increases" (Sec. 5.3), "Test error improved as the effective width increased" (Fig. 5
caption, for the S-Mixer, the RP S-Mixer and the SW-MLP). The verdict, per family, is :data:`TREND`
(:mod:`pkmixer.experiments.rules`): the least-squares slope of the test error on log₂ m, claimed < 0, and the
widest width no worse than the next-widest by more than a quarter point - both required, so that a U-shape does not
pass; each by Student's t over 5 paired seeds at 92 %; the claim is contradicted when a part is after Holm's
procedure across all parts. "The normal and RP S-Mixers show similar tendencies" (Sec. 5.3, :data:`QUOTE_SIMILAR`)
is :data:`ALIKE`: the RP S-Mixer's slope minus the S-Mixer's, seeds paired, inside ±0.5 points per doubling (the
assumed effect's size), contradicted when wholly outside; reported beside the width claim, not required for it (its
power on this grid, whose mirrored widths span only 0.56 of a doubling, is printed with it). Unlike the other rules,
it was written after 46 of the grid's 71 runs were recorded and their mean errors looked at; its margin is the
assumed effect's size, not a number read from them. "The Mixers reach widths an SW-MLP cannot afford" (Sec. 5.3)
is a statement of memory cost (App. D.9), not tested here. Decided on the final epoch's test error (the paper's
protocol); the validation-selected error is reported beside it and decides the epoch-doubling check.

Scales:

* ``paper`` (App. C.4): patch 4 on 32 px images (S₀ = 64), 8 blocks, the first token mixing S₀ -> S with the skip
  layer of App. A.2.4; S-Mixer and RP S-Mixer at Ω = 2^18, 2^21, 2^27 with the (C, S) pairs listed there; SW-MLP
  (S.16 blocks, per-patch FC to 64 channels) at Ω = 2^18 with 1 - p = 0.1, 0.3, 0.5, 0.7, 0.9 (m = 540 ... 1619);
  Nesterov SGD, batch 128, momentum 0.9, lr 0.02, cosine annealing, 200 epochs, random crop (padding 4) and
  horizontal flip; 3 seeds. 111 runs per data set; the paper reports about 400 V100 hours for the three.
* ``medium`` (:func:`grid`, shared with fig6): Fashion-MNIST's 60 000 training images less a 5 000-image
  validation split, all 10 000 test images (28 px, 1 channel, patch 4: S₀ = 49), App. C.4's random crop (padding 4)
  and flip, Ω = 2^15, 4 blocks; S-Mixer and RP S-Mixer at the mirrored pairs (C, S) = (8, 87), (16, 56), (32, 32),
  (56, 16), (87, 8) (App. C.4's "symmetric manner": m = 696, 896, 1024, 896, 696, log₂(C/S) from −3.4 to +3.4);
  SW-MLP at p = 1, 1/8, 1/32 (m = 181, 512, 1024; CSR weights below p = 1); 15 epochs of AdamW; 5 seeds paired
  across models: 65 runs, plus the convergence check - the narrowest and widest arm of each family retrained for
  30 epochs on seed 0 (6 runs, left out of the verdicts). Estimated 2.0 h on 2 cores (:data:`.recipes.RUN_EPOCH_SECONDS`):
  at the edge of the budget; the earlier design's doubling check (10 -> 20 epochs, no augmentation) moved the
  S-Mixers by about 0.5 points, so 15 epochs may still be "not converged" - the check says.
* ``small``: the S-Mixer at C = 8 and 32 (m = 696 and 1024) on the whole training set less a 5 000-image
  validation split, 6 epochs without augmentation, 5 seeds: 10 runs, sized for ``make demo`` to take under 10
  minutes on 2 quiet cores (an epoch of one run takes 13-15 s of one thread there). Two widths: the slope part
  alone decides.
* ``smoke``: 500 digits (8 px, patch 2: S₀ = 16), Ω = 2^9, 2 blocks, two widths per family, 1 epoch, 1 seed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ...theory.width import mixer_omega, swmlp_width, symmetric_pairs
from ..preset import Analysis, Preset, register_preset
from ..regime import Departures, Quantity, Regime, constant, ratio
from ..rules import AlikeRules, Quote, TrendRules, arm_verdict, not_testable, trend_parts
from ..stats import Verdict, aggregate, format_mean_std, interval_text, per_seed_difference, summary
from ..sweep import RunSpec
from .. import measures, recipes
from ..measures import COLOURS, learning_curves

FAMILIES = ("S-Mixer", "RP S-Mixer", "SW-MLP")
# The paper's words each part tests, and the rules, fixed before any run is read
QUOTE_FIG5 = Quote("Sec. 5.3", "Figure 5 shows that the test error improves as the effective width of the Mixers "
                               "increases.")
QUOTE_CAPTION = Quote("Fig. 5 caption", "Test error improved as the effective width increased.")
QUOTE_REACH = Quote("Sec. 5.3", "In contrast, we can use a large effective width for the Mixers, and the error "
                                "continues to increase as the width increases.")
QUOTE_SIMILAR = Quote("Sec. 5.3", "The normal and RP S-Mixers show similar tendencies of increasing test error "
                                   "with respect to the effective width m.")
TREND = TrendRules()
ALIKE = AlikeRules()
# the paper's effect for the power: Fig. 5's curves are not in the text this repository holds (its caption gives
# only the standard deviations); assumed: the error falls 0.5 points per doubling of m
ASSUMED_SLOPE = -0.005
SMALL_EPOCHS = 6


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


# Ω = 2^15: C* = S* = 32; the mirrored pairs of fig6 (both sides of C = S) and the SW-MLP from dense to m = 1024
MEDIUM = _Size(mixer_pairs={2**15: _mirrored(symmetric_pairs(2**15, channels=[8, 16, 32]))}, sw_omega=2**15,
               sw_densities=(1.0, 1 / 8, 1 / 32), depth=4, sw_embed_dim=16, sw_format="sparse")
SMALL = _Size(mixer_pairs={2**15: symmetric_pairs(2**15, channels=[8, 32])}, sw_omega=2**15, sw_densities=(),
              depth=4, sw_embed_dim=16, mixer_families=("S-Mixer",))
# the bundled digits (1438 training images, 8 px): Ω = 2^12 (C* = 16)
MEDIUM_DIGITS = dataclasses.replace(MEDIUM, mixer_pairs={2**12: _mirrored(symmetric_pairs(2**12, channels=[4, 8, 16]))},
                                    sw_omega=2**12, sw_embed_dim=4)
SIZES = {
    "paper": _Size(mixer_pairs={2**18: _mirrored(symmetric_pairs(2**18, channels=[16, 32, 48])),
                                2**21: symmetric_pairs(2**21, count=3, c_min=16),
                                2**27: symmetric_pairs(2**27, count=2, c_min=128)},
                   sw_omega=2**18, sw_densities=(0.9, 0.7, 0.5, 0.3, 0.1), depth=8, sw_embed_dim=64),
    "medium": MEDIUM,
    "small": SMALL,
    "smoke": _Size(mixer_pairs={2**9: symmetric_pairs(2**9, channels=[4, 8])},
                   sw_omega=2**9, sw_densities=(1.0, 1 / 4), depth=2, sw_embed_dim=4),
}
DIGITS = {"medium": MEDIUM_DIGITS,
          "small": dataclasses.replace(SMALL, mixer_pairs={2**12: symmetric_pairs(2**12, channels=[4, 16])},
                                       sw_omega=2**12, sw_embed_dim=4)}
MODELS = {"S-Mixer": ("smixer", "smixer_c64p4_32", "smixer_t4_28"),  # family -> run tag, colour model, grey model
          "RP S-Mixer": ("rpsmixer", "rp_smixer_c64p4_32", "rp_smixer_t4_28"),
          "SW-MLP": ("swmlp", "swmlp_m1619p4_32", "swmlp_t4_28")}


def _recipe(scale: str, dataset: str) -> recipes.Recipe:
    """App. C.4 at paper scale; :func:`.recipes.medium` with C.4's crop and flip at medium scale; at small scale the
    medium recipe without augmentation for :data:`SMALL_EPOCHS` epochs (make demo); at smoke scale 500 / 200 digits
    in batches of 50."""
    if scale == "paper":
        return recipes.paper_cifar(dataset)
    if scale == "smoke":
        return recipes.smoke(train_subset=500, test_subset=200, batch_size=50)
    if scale == "small":
        return recipes.medium(dataset, epochs=SMALL_EPOCHS, augment=None)
    return recipes.medium(dataset)


def _mixer_regime() -> tuple[Quantity, ...]:
    """What the width claim's mechanism names at fixed Ω (Hypothesis 4.1): the span of effective widths swept, on
    both sides of C = S, and the depth."""
    return (Quantity("Mixer width ratio m_max / m_min at fixed Ω", 3984 / 2768, ratio("width", model="S-Mixer"),
                     0.75, "at_least", "App. C.4 at Ω = 2^18: m = 2768 ... 3984"),
            Quantity("SW-MLP width ratio m_max / m_min at fixed Ω", 1619 / 540, ratio("width", model="SW-MLP"),
                     0.75, "at_least", "App. C.4: 1 − p = 0.1 ... 0.9, m = 540 ... 1619"),
            Quantity("largest |log₂(C/S)|", math.log2(173 / 16),
                     lambda specs: max(abs(math.log2(s.meta["C"] / s.meta["S"])) for s in specs if s.meta.get("C")),
                     2.0, why="App. C.4's pairs from (16, 173) to (173, 16)"),
            Quantity("blocks L", 8, constant(MEDIUM.depth), 2.0, why="App. C.4: eight blocks"))


def grid(preset: Preset, scale: str, dataset: str) -> list[RunSpec]:
    """The medium Fig. 5/6 grid (fig5's medium runs; fig6 decides on the same ones)."""
    return Fig5.build(preset, scale, dataset)


@register_preset
class Fig5(Preset):
    name = "fig5"
    title = "S-Mixer, RP S-Mixer and SW-MLP against effective width at fixed Ω"
    claim = ("At a fixed number Ω of connections per layer, test error falls as the effective width m grows, "
             "alike for the S-Mixer (m = SC), the RP S-Mixer and the sparse-weight MLP (m = √(Ω/p)); the Mixers "
             "reach widths an SW-MLP cannot afford.")
    source = "Hayase & Karakida Fig. 5, Sec. 5.3, App. C.4"
    datasets = ("cifar10", "cifar100", "stl10", "fashion-mnist", "digits")
    scales = ("paper", "medium", "small", "smoke")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)
    default_seeds = {"paper": 3, "medium": 5, "small": 5, "smoke": 1}

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        epochs = recipes.MEDIUM_EPOCHS if dataset != "digits" else round(2.4 * recipes.MEDIUM_EPOCHS)
        return Regime(_mixer_regime(), Departures(
            f"{dataset} (the paper: CIFAR-10, CIFAR-100, STL-10 at 32 px, patch 4, S₀ = 64)",
            f"{epochs} of AdamW (the paper: 200 of Nesterov SGD)", "App. C.4's random crop and flip",
            ("Ω = 2^15 (the paper: 2^18, 2^21, 2^27)",)).lines())

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
        value, value_note = measures.decided_value(done, self.decided_on)
        points = aggregate(done, ["model", "omega", "C", "S", "width", "density"], value)
        selected = {(p["model"], p["omega"], p["C"], p["S"], p["width"], p["density"]): p
                    for p in aggregate(done, ["model", "omega", "C", "S", "width", "density"], "selected_test_error")}
        points.sort(key=lambda r: (FAMILIES.index(r["model"]), r["omega"], r["width"], r["C"] or 0))
        table = [{"model": p["model"], "omega": p["omega"], "C": p["C"], "S": p["S"], "width": p["width"],
                  "density": p["density"], "test_error_mean": p["mean"], "test_error_std": p["std"], "seeds": p["n"],
                  "selected_test_error_mean": selected.get(
                      (p["model"], p["omega"], p["C"], p["S"], p["width"], p["density"]), {}).get("mean")}
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
                if len({r["width"] for r in runs}) > 1:
                    numbers[f"{key}: error at the narrowest minus the widest m"] = interval_text(
                        per_seed_difference(narrow, wide, value), level=TREND.level, scale=100.0, unit=" points")
                arms = [(p["C"], p["S"], p["density"]) for p in group]
                widths = [p["width"] for p in group]
                seeds_table = measures.arm_table(runs, lambda r: (r["C"], r["S"], r["density"]), arms, value)
                extra = measures.sampling_error(runs, value)
                if scale != "smoke" and len(set(widths)) >= 2:
                    extra = "; ".join(x for x in (extra, self._power(widths)) if x)
                verdicts += trend_parts(TREND, seeds_table, widths, key,
                                        quote=QUOTE_FIG5 if family != "SW-MLP" else QUOTE_CAPTION, extra=extra)
        verdicts += _alike_parts(done, value)
        verdicts.append(not_testable("The Mixers reach widths an SW-MLP cannot afford",
                                     "a statement of memory cost (App. D.9; pkmixer throughput), not of error",
                                     QUOTE_REACH))
        doubling = measures.doubling(finished, "width")
        number, convergence = measures.doubling_report(doubling)
        numbers.update(number)
        fields = measures.conclude(self, rows, scale, verdicts, doubling, value_note)
        listed = summary([v for v in verdicts if v.decision != "not testable here"]) or "no finished runs."
        verdict = f"Error against effective width at fixed Ω - {listed}" + convergence + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        tables = {"fig5": table}
        if doubling:
            tables["fig5_doubling"] = doubling
        curves = learning_curves(finished)
        return Analysis(figures={"fig5": _plot(points, rows), "fig5_curves": _plot_curves(finished, curves)},
                        tables=tables, numbers=numbers, verdict=verdict, verdicts=verdicts, **fields)

    @staticmethod
    def _power(widths: list[float]) -> str:
        """The power of the trend parts at the assumed effect (:data:`ASSUMED_SLOPE` per doubling of m)."""
        logs = np.log2(np.asarray(widths, dtype=float))
        means = 0.12 + ASSUMED_SLOPE * (logs - logs.mean())
        distinct = sorted(set(widths))
        parts = [(TREND.slope(logs), means)]
        if len(distinct) >= 3:
            widest = [i for i, w in enumerate(widths) if w == distinct[-1]]
            following = [i for i, w in enumerate(widths) if w == distinct[-2]]
            parts.append((TREND.end(widest, following, len(widths)), means))
        return measures.power_text(parts, f"assumed {100 * ASSUMED_SLOPE:+.1f} points per doubling of m: Fig. 5's "
                                          "values are not in the text this repository holds")


def _alike_parts(runs: list[dict], value: str) -> list[Verdict]:
    """"The normal and RP S-Mixers show similar tendencies" (:data:`ALIKE`): at each Ω where both families were
    trained at the same (C, S) pairs, the difference of their slopes on log₂ m, seeds paired across the families.
    Not required for the width claim to be supported; a contradiction of it contradicts the preset's claim ("alike
    for the S-Mixer, the RP S-Mixer ..."), after Holm's procedure across all parts."""
    parts = []
    for omega in sorted({r["omega"] for r in runs if r["model"] == "S-Mixer"}):
        pairs = [sorted({(r["C"], r["S"], r["width"]) for r in runs if r["model"] == family and r["omega"] == omega})
                 for family in ("S-Mixer", "RP S-Mixer")]
        if pairs[0] != pairs[1] or len({w for _, _, w in pairs[0]}) < 2:
            continue
        arms = [(family, C, S) for family in ("S-Mixer", "RP S-Mixer") for C, S, _ in pairs[0]]
        both = [r for r in runs if r["omega"] == omega and r["model"] in ("S-Mixer", "RP S-Mixer")]
        table = measures.arm_table(both, lambda r: (r["model"], r["C"], r["S"]), arms, value)
        logs = np.log2([w for _, _, w in pairs[0]])
        rule = ALIKE.difference(logs)
        falling = 0.12 + ASSUMED_SLOPE * (logs - logs.mean())
        power = measures.power_text([(rule, [*falling, *(falling + 0.01)])],
                                    "both falling at the assumed slope, the RP arms a point higher")
        parts.append(arm_verdict(rule, table, f"Ω={_power(omega)}: the RP S-Mixer's trend with m is the S-Mixer's",
                                 quote=QUOTE_SIMILAR, required=False, extra=power))
    return parts


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
