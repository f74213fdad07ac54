"""Fig. 5: S-Mixer, RP S-Mixer and SW-MLP against effective width at fixed Ω (Hayase & Karakida Sec. 4.2, App. C.4).

Command::

    pkmixer reproduce fig5 --scale paper --dataset cifar10   # also cifar100, stl10 (resized to 32 px)
    pkmixer reproduce fig5 --scale small                      # make demo: Fashion-MNIST (else digits), CPU minutes
    pkmixer reproduce fig5 --scale smoke                      # seconds, for the tests

The paper's claim: at a fixed number Ω of connections per layer, the test error falls as the effective width
grows, alike for the S-Mixer (m = S·C), the RP S-Mixer and the static sparse-weight MLP (m = √(Ω/p)); the
Mixers reach widths an SW-MLP cannot afford. What a run shows: the mean test error over seeds of every
(family, Ω, C, S) or (SW-MLP, p) point against m, and - the verdict - for each family and Ω, Spearman's ρ between m
and the test error within each seed, averaged over seeds, with its 90 % paired-bootstrap interval over seeds
(:data:`TREND_RULE`, declared here before any run is read): a family supports the claim when the whole interval is
below 0, contradicts it when it is above 0, and is undecided otherwise or with fewer than 5 seeds; the claim is
supported when every family supports it, contradicted when any contradicts it.

Scales:

* ``paper`` (App. C.4): patch 4 on 32 px images (S₀ = 64), 8 blocks, the first token mixing S₀ -> S with the skip
  layer of App. A.2.4; S-Mixer and RP S-Mixer at Ω = 2^18, 2^21, 2^27 with the (C, S) pairs listed there; SW-MLP
  (S.16 blocks, per-patch FC to 64 channels) at Ω = 2^18 with 1 - p = 0.1, 0.3, 0.5, 0.7, 0.9 (m = 540 ... 1619);
  Nesterov SGD, batch 128, momentum 0.9, lr 0.02, cosine annealing, 200 epochs, random crop (padding 4) and
  horizontal flip; 3 seeds. 111 runs per data set; the paper reports about 400 V100 hours for the three.
* ``small``: Fashion-MNIST (28 px, 1 channel, patch 4: S₀ = 49), Ω = 2^15, 4 blocks; Mixers at C = 4, 8, 16, 32
  (S = 126, 87, 56, 32; m = 504 ... 1024, the widest at C = S), SW-MLP at p = 1, 1/4, 1/16, 1/32
  (m = 181 ... 1024); 8 000 training and 2 500 test images, 4 epochs of AdamW (a few epochs of SGD at lr 0.02
  would leave the models far from trained); 2 seeds: 24 runs, about 560 CPU-seconds. The same on CIFAR-10/100
  or STL-10 (``--dataset``) with 32 px colour images, 10 000 / 5 000 images and 6 epochs; on the bundled 8×8
  digits (the default when Fashion-MNIST is absent) Ω = 2^12 with C = 2, 4, 8, 16 and 12 epochs of all 1438.
* ``smoke``: 500 digits (8 px, patch 2: S₀ = 16), Ω = 2^9, 2 blocks, two widths per family, 1 epoch, 1 seed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from ...theory.width import mixer_omega, swmlp_width, symmetric_pairs
from ..preset import Analysis, Preset, register_preset
from ..stats import Rule, aggregate, format_mean_std, overall, summary, trend_verdict
from ..sweep import RunSpec
from . import recipes
from .recipes import SCALE_DATASETS, seed_structures

FAMILIES = ("S-Mixer", "RP S-Mixer", "SW-MLP")
# The verdict's rule, fixed before any run is read (issue 16): per family and Ω, the mean over seeds of the
# within-seed Spearman ρ(m, test error), its 90 % paired-bootstrap interval over seeds, and the threshold 0.
LEVEL = 0.90
TREND_RULE = Rule("mean over seeds of Spearman ρ(width, test error)", threshold=0.0, direction="below", level=LEVEL)


@dataclass(frozen=True)
class _Size:
    """The model sizes of one scale; the training recipe comes from :mod:`.recipes` (:func:`_recipe`)."""

    mixer_pairs: dict[int, list[tuple[int, int]]]  # Ω -> [(C, S)]
    sw_omega: int
    sw_densities: tuple[float, ...]
    depth: int
    sw_embed_dim: int


def _mirrored(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(set(pairs) | {(s, c) for c, s in pairs})


SIZES = {
    "paper": _Size(mixer_pairs={2**18: _mirrored(symmetric_pairs(2**18, channels=[16, 32, 48])),
                                2**21: symmetric_pairs(2**21, count=3, c_min=16),
                                2**27: symmetric_pairs(2**27, count=2, c_min=128)},
                   sw_omega=2**18, sw_densities=(0.9, 0.7, 0.5, 0.3, 0.1), depth=8, sw_embed_dim=64),
    # Ω = 2^15: C* = S* = 32, the widest Mixer m = 1024; SW-MLP from dense (m = 181) to m = 1024
    "small": _Size(mixer_pairs={2**15: symmetric_pairs(2**15, channels=[4, 8, 16, 32])},
                   sw_omega=2**15, sw_densities=(1.0, 1 / 4, 1 / 16, 1 / 32), depth=4, sw_embed_dim=16),
    "smoke": _Size(mixer_pairs={2**9: symmetric_pairs(2**9, channels=[4, 8])},
                   sw_omega=2**9, sw_densities=(1.0, 1 / 4), depth=2, sw_embed_dim=4),
}
# the 1438 + 359 bundled digits at small scale: Ω = 2^12 (C* = 16), more epochs of fewer images (recipes.small)
SMALL_DIGITS = _Size(mixer_pairs={2**12: symmetric_pairs(2**12, channels=[2, 4, 8, 16])},
                     sw_omega=2**12, sw_densities=(1.0, 1 / 4, 1 / 16, 1 / 32), depth=4, sw_embed_dim=4)


def _recipe(scale: str, dataset: str) -> recipes.Recipe:
    """App. C.4 at paper scale; at small scale recipes.small with 8 000 / 2 500 Fashion-MNIST images, or 6 epochs
    of CIFAR/STL-10; at smoke scale 500 / 200 digits in batches of 50."""
    if scale == "paper":
        return recipes.paper_cifar(dataset)
    if scale == "smoke":
        return recipes.smoke(train_subset=500, test_subset=200, batch_size=50)
    if recipes.GEOMETRY[dataset] == recipes.COLOUR32:
        return recipes.small(dataset, epochs=6)
    return recipes.small(dataset, train_subset=8_000, test_subset=2_500)


@register_preset
class Fig5(Preset):
    name = "fig5"
    title = "S-Mixer, RP S-Mixer and SW-MLP against effective width at fixed Ω"
    claim = ("At a fixed number Ω of connections per layer, test error falls as the effective width m grows, "
             "alike for the S-Mixer (m = SC), the RP S-Mixer and the sparse-weight MLP (m = √(Ω/p)); the Mixers "
             "reach widths an SW-MLP cannot afford.")
    source = "Hayase & Karakida Fig. 5, Sec. 4.2, App. C.4"
    datasets = ("cifar10", "cifar100", "stl10", "fashion-mnist", "digits")
    scale_datasets = SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        s = SMALL_DIGITS if scale == "small" and dataset == "digits" else SIZES[scale]
        recipe = _recipe(scale, dataset)
        mixer_model, rp_model, sw_model = (("smixer_s64_32", "rp_smixer_s64_32", "swmlp_o18_32")
                                           if recipe.image == recipes.COLOUR32
                                           else ("smixer_t4_28", "rp_smixer_t4_28", "swmlp_t4_28"))
        specs = []
        for omega, pairs in s.mixer_pairs.items():
            for family, model in (("S-Mixer", mixer_model), ("RP S-Mixer", rp_model)):
                tag = "smixer" if family == "S-Mixer" else "rpsmixer"
                for C, S in pairs:
                    options = {"name": model, "depth": s.depth, "embed_dim": C, "num_tokens": S}
                    meta = {"dataset": dataset, "model": family, "omega": omega, "omega_exact": mixer_omega(C, S),
                            "C": C, "S": S, "width": C * S, "density": None}
                    specs += self.seeded(f"{tag}-o{omega}-c{C}-s{S}", recipe.config(options), meta, scale)
        for p in s.sw_densities:
            m = swmlp_width(s.sw_omega, p)
            options = {"name": sw_model, "depth": s.depth, "embed_dim": s.sw_embed_dim, "width": m,
                       "density": p, "block": "fc", "weight_format": "masked"}  # dense + mask: fastest at m <= 1619
            meta = {"dataset": dataset, "model": "SW-MLP", "omega": s.sw_omega, "omega_exact": p * m * m, "C": None,
                    "S": None, "width": m, "density": p}
            specs += self.seeded(f"swmlp-o{s.sw_omega}-m{m}", recipe.config(options), meta, scale)
        return seed_structures(specs)  # each seed its own permutations and masks

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = [r for r in rows if r["status"] == "finished"]
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
                verdicts.append(trend_verdict(runs, "width", TREND_RULE, claim=f"{key}: error falls as m grows"))
        supported = None if scale == "smoke" else overall(verdicts)
        listed = summary(verdicts) or "no finished runs."
        if supported is None:
            verdict = f"Spearman ρ between effective width and test error, per seed and averaged over seeds - " \
                      f"undecided: {listed}"
            if scale == "smoke":
                verdict += " (Smoke scale: too short to decide.)"
        else:
            verdict = (f"Test error {'falls' if supported else 'does not fall in every family'} as the effective "
                       f"width grows at fixed Ω - {listed}")
        return Analysis(figures={"fig5": _plot(points, rows)}, tables={"fig5": table}, numbers=numbers,
                        verdict=verdict, supported=supported, verdicts=verdicts)


def _power(omega: int, tex: bool = False) -> str:
    exponent = omega.bit_length() - 1
    if omega != 1 << exponent:
        return f"{omega:g}"
    return f"$2^{{{exponent}}}$" if tex else f"2^{exponent}"


def _plot(points: list[dict], rows: list[dict]) -> Figure:
    """Mean test error ± std over seeds against effective width: one line per family and Ω (Fig. 5)."""
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    colors = {"S-Mixer": "tab:red", "RP S-Mixer": "tab:orange", "SW-MLP": "tab:blue"}
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
