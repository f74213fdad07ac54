"""Fig. 2: the MLP-Mixer next to MLPs with sparse weights - hidden-feature CKA against the SW-MLP's density
(a-c), and shallow MLPs with Monarch against Kronecker weights (d) (Hayase & Karakida Secs. 3.3-3.4, App. C.1).

Commands::

    pkmixer reproduce fig2 --scale paper      # CKA on CIFAR-10 (Fig. 2a-c)
    pkmixer reproduce fig2d --scale paper     # Monarch against Kronecker on MNIST (Fig. 2d)
    pkmixer reproduce fig2 --scale medium     # all of Fashion-MNIST, 5 seeds (fig2d likewise)
    pkmixer reproduce fig2 --scale small      # Fashion-MNIST, CPU minutes (fig2d likewise)
    pkmixer reproduce fig2 --scale smoke

fig2 - the paper's claim: the hidden features of a trained MLP-Mixer are most similar (mini-batch CKA,
Nguyen et al. 2021) to those of a trained SW-MLP of the same width m = SC at an intermediate, sparse density,
and clearly more similar to a sparse SW-MLP than to a dense one. What a run shows: the mean of the diagonal of the
6×6 CKA matrix (features "just before the skip" of each mixing block / SW-MLP block) against the SW-MLP's
density p, one line per Mixer size, with the Mixer's own density (1/S + 1/C)/2; the full CKA matrices against
the SW-MLP at the density nearest the Mixer's and against the dense one (Fig. 2b, c). CKA pairs a Mixer and an
SW-MLP of the same seed, on the first test images, with the final weights (the trained networks, not the epoch
picked by test error): each run stores its features' Gram matrices when it finishes (the ``grams-<B>x<n>``
probe of :mod:`pkmixer.experiments.probes`); once the sweep is done each SW-MLP run's CKA matrix against its Mixer
is computed from them and kept in its row and record (:meth:`Fig2.derive`), so that the records alone decide.
Verdict, per Mixer size (rules :data:`SPARSE_RULE`, :data:`PEAK_RULE`, paired bootstrap over seeds): CKA at the
Mixer's density minus the dense SW-MLP's > 0, and the highest mean CKA over the sparse densities minus the dense
one's > 0.

fig2d - the paper's claim: shallow MLPs x -> B_c B₂ ReLU(B₁x) with Monarch weights and with Kronecker weights
(the Mixer's weight-shared Monarch, Cor. 3.4) perform comparably. What a run shows: both test errors (mean ± std
over seeds); verdict :data:`COMPARABLE_RULE`: |mean paired difference| < 0.5 points on its bootstrap interval.

Scales (fig2):

* ``paper`` - App. C.1: MLP-Mixer of 3 blocks, γ = 2, S = C = 64 and 32, patch 4 at 32 px (S₀ = 64; S = 32 with
  the token-projection skip of App. A.2.4); SW-MLP of 6 MLP blocks (S.17, γ = 2) replacing the Mixer's 6 mixing
  blocks, width m = SC, densities p = 2^-n for n = 0 ... 10; CIFAR-10, batch 128, 600 epochs, lr 0.01, AdamW
  (momentum 0.9), cosine annealing, AutoAugment (with App. C.4's crop and flip); 3 seeds: 72 runs; CKA over
  20 batches of 128 test images.
* ``medium`` - the small design with :func:`.recipes.medium` (all 60 000 Fashion-MNIST images, 10 epochs of
  AdamW), 5 seeds: 80 runs (run on 2 loaded cores: its SW-MLP runs took 3-6 min each, so allow more than 2 h;
  result in docs/reproduction.md).
* ``small`` - Fashion-MNIST, S = C = 16 and 8, Mixer of 3 blocks, SW-MLP of 6, p = 2^-n for n = 0 ... 6, 4 epochs
  of AdamW on 10 000 images, 2 seeds: 32 runs; CKA over 10 batches of 128.
* ``smoke`` - digits, S = C = 4, Mixer of 1 block, SW-MLP of 2, p = 1, 1/4, 1/16, 1 epoch; CKA over 2 batches of 32.

Scales (fig2d): ``paper`` - App. C.1: MNIST, AdamW lr 0.01, 200 epochs, cosine annealing, batch 128 (as Fig. 2a),
5 seeds; ``medium`` - :func:`.recipes.medium` on all of Fashion-MNIST, 5 seeds: 10 runs; ``small`` - Fashion-MNIST, 4 epochs of AdamW on 10 000 images, 3 seeds; ``smoke`` - digits at 8 px,
1 epoch.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ...analysis.cka import CKAResult, cka_from_grams
from ...train.rundir import RunDir
from ..preset import Analysis, Preset, register_preset
from ..probes import load_grams
from ..regime import Departures, Quantity, Regime
from ..rules import ArmRule, Quote, arm_verdict, contrast
from ..stats import (Rule, aggregate, bootstrap_verdict, format_mean_std, interval_text, mean_std,
                     per_seed_difference, summary)
from ..sweep import RunSpec, SweepDir
from .. import measures, recipes
from ..measures import finished

GAMMA = 2.0
MEDIUM_EPOCHS = 12  # 50 runs at the earlier design's 12 s a run-epoch: 2.0 h on 2 cores
# The paper's words and the rules, fixed before any run is read, per Mixer size; CKA is paired within a seed (a Mixer
# and the SW-MLPs of its seed)
QUOTE_SPARSE = Quote("Sec. 3.4", "By comparing Figure 2(b) and (c), we found that CKA matrix with sparse MLP was "
                                 "clearly higher than dense MLP.")
QUOTE_PEAK = Quote("Sec. 3.4", "In Figure 2(a), we observed the averaged CKA achieved the maximum as an appropriate "
                               "sparsity of the MLPs.")
QUOTE_COMPARABLE = Quote("Sec. 3.3", "In Figure 2 (left), the two models showed comparable performance.")
LEVEL = 0.92
# "clearly higher": above 0; the report prints it at 0.02, 0.05 and 0.1 too (CKA lies in [0, 1])
SPARSE_RULE = ArmRule("mean over seeds of CKA(SW-MLP at the Mixer's density) − CKA(dense SW-MLP)", contrast([-1, 1]),
                      "above", 0.0, level=LEVEL, digits=3, margins=(0.02, 0.05, 0.1),
                      reason="“clearly” states no size: decided at 0, printed at larger margins")
# the maximum over the sparse densities of the means over resampled seeds leans high (towards the claim): a
# bootstrap rule whose lean the preset states
PEAK_RULE = Rule("highest mean CKA over the sparse densities − mean CKA of the dense SW-MLP", threshold=0.0,
                 direction="above", level=0.90, digits=3)
# fig2d: "comparable" read as within half a point either way (printed at a quarter and one point too)
COMPARABLE = 0.005
COMPARABLE_RULE = ArmRule("mean over seeds of error(Monarch) − error(Kronecker)", contrast([1, -1]), "inside",
                          tolerance=COMPARABLE, level=LEVEL, scale=100, unit=" points", margins=(0.0025, 0.005, 0.01),
                          reason="“comparable” read as within half a point, about 1.5 times the test-set sampling "
                                 "error")
# scale -> (Mixer sizes S = C, Mixer blocks, SW-MLP density exponents n of p = 2^-n, CKA batches, batch size)
SIZES = {"paper": ((64, 32), 3, range(11), 20, 128), "medium": ((16, 8), 3, (0, 2, 4, 6), 10, 128),
         "small": ((16, 8), 3, range(7), 10, 128),
         "smoke": ((4,), 1, (0, 2, 4), 2, 32)}


@register_preset
class Fig2(Preset):
    name = "fig2"
    title = "CKA between the MLP-Mixer and SW-MLPs of the same width, against the SW-MLP's density"
    claim = ("The hidden features of a trained MLP-Mixer are most similar (mini-batch CKA) to those of an SW-MLP "
             "of the same width at an appropriate sparse density, and clearly more similar to a sparse SW-MLP than "
             "to a dense one.")
    source = "Hayase & Karakida Fig. 2a-c, Sec. 3.4, App. C.1"
    datasets = ("cifar10", "fashion-mnist", "mnist", "digits", "cifar100", "stl10")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, ("cifar10",))

    scales = ("paper", "medium", "small", "smoke")
    quotes = (QUOTE_SPARSE, QUOTE_PEAK)
    rule_names = ("SPARSE_RULE", "PEAK_RULE")
    decided_on = "CKA of the final weights"
    decided_on_why = "App. C.1 computes CKA among features of the trained networks"

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((Quantity("Mixer S = C", 48, lambda specs: max(s.meta["size"] for s in specs), 4.0,
                                why="App. C.1: S = C = 64 and 32"),
                       Quantity("sparsest SW-MLP density × S", 1 / 16, lambda specs: max(
                           min(s.meta["density"] for s in specs if s.meta["model"] == "SW-MLP" and s.meta["size"] == z)
                           * z for z in {s.meta["size"] for s in specs}), 8.0, "at_most",
                                "the densities must go at least twice beyond each Mixer's own 1/S (App. C.1: "
                                "2^−10 at S = 64)")),
                      Departures(f"{dataset} (the paper: CIFAR-10)",
                                 f"{MEDIUM_EPOCHS} of AdamW (the paper: 600)", "App. C.1's AutoAugment with crop and flip",
                                 ("SW-MLP densities 2^0, 2^−2, 2^−4, 2^−6 (the paper: 2^0 ... 2^−10)",)).lines())

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        recipe = (recipes.medium(dataset, epochs=MEDIUM_EPOCHS, augment="autoaugment") if scale == "medium"
                  else recipes.c1(scale, dataset))
        sizes, depth, exponents, batches, batch_size = SIZES[scale]
        probes = (f"grams-{batches}x{batch_size}",)
        grid = (recipe.image["img_size"] // recipe.image["patch_size"]) ** 2
        specs = []
        for size in sizes:
            mixer = recipe.config({"name": "mixer_c64d3p4_32", "depth": depth, "embed_dim": size, "mlp_ratio": GAMMA,
                                   "num_tokens": None if size == grid else size})
            meta = {"dataset": dataset, "model": "MLP-Mixer", "size": size, "width": size * size,
                    "density": 1 / size}  # (1/S + 1/C)/2 with S = C
            specs += self.seeded(f"mixer-s{size}", mixer, meta, scale, probes)
            for n in exponents:
                p = 2.0 ** -n
                sw = recipe.config({"name": "swmlp_m4096d6p4_32", "depth": 2 * depth, "embed_dim": size, "mlp_ratio": GAMMA,
                                    "block": "mlp", "width": size * size, "density": p, "weight_format": "masked"})
                meta = {"dataset": dataset, "model": "SW-MLP", "size": size, "width": size * size, "density": p}
                specs += self.seeded(f"swmlp-s{size}-p{n}", sw, meta, scale, probes)
        return recipes.seed_structures(specs)

    def derive(self, rows: list[dict], sweep_dir: Path) -> dict[str, dict]:
        """Each SW-MLP run's CKA matrix against the Mixer of its size and seed, from the two runs' Gram matrices
        in ``sweep_dir`` (pairs without them are left out), with the Mixer's record key: kept in the SW-MLP's
        record, so that the analysis needs no run directory."""
        sweep, out = SweepDir(Path(sweep_dir)), {}
        for mixer_row, sw_row in _pairs(finished(rows)):
            runs = [sweep.run(r["run"]) for r in (mixer_row, sw_row)]
            if mixer_row.get("key") and all(RunDir(run).grams.is_file() for run in runs):
                result = _cka(load_grams(runs[0]), load_grams(runs[1]), _labels(sw_row))
                out[sw_row["run"]] = {"cka": {**result.as_dict(), "mixer": mixer_row["key"]}}
        return out

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        rows = finished(rows)
        sweep = SweepDir(Path(sweep_dir))
        cka_rows, matrices, grams = [], {}, {}
        for mixer_row, r in _pairs(rows):
            size, seed = mixer_row["size"], mixer_row["seed"]
            stored = r.get("cka")
            if isinstance(stored, dict) and stored.get("mixer") and stored["mixer"] == mixer_row.get("key"):
                result = CKAResult(**{**{k: v for k, v in stored.items() if k != "mixer"},
                                      "matrix": np.asarray(stored["matrix"], dtype=np.float64)})
            else:  # no derived CKA (or one paired with a Mixer since changed): the runs' Gram matrices
                if mixer_row["run"] not in grams:
                    grams[mixer_row["run"]] = load_grams(sweep.run(mixer_row["run"]))
                result = _cka(grams[mixer_row["run"]], load_grams(sweep.run(r["run"])), _labels(r))
            cka_rows.append({"size": size, "seed": seed, "density": r["density"],
                             "cka_diagonal_mean": result.diagonal_mean})
            matrices[(size, seed, r["density"])] = result
        points = aggregate(cka_rows, ["size", "density"], "cka_diagonal_mean")
        table = [{"size": p["size"], "density": p["density"], "cka_mean": p["mean"], "cka_std": p["std"],
                  "seeds": p["n"]} for p in sorted(points, key=lambda p: (-p["size"], -p["density"]))]
        errors = aggregate(rows, ["model", "size", "density"])
        numbers = {f"{e['model']} S = C = {e['size']}" + (f", p = {e['density']:.3g}" if e["model"] == "SW-MLP" else "")
                   + ": test error": format_mean_std(e, percent=True) for e in errors}
        verdicts, findings = [], []
        for size in sorted({p["size"] for p in points}, reverse=True):
            group = {p["density"]: p["mean"] for p in points if p["size"] == size}
            nearest = min(group, key=lambda d: abs(math.log2(d * size)))  # the Mixer's density is 1/size
            best = max(group, key=group.get)
            numbers[f"S = C = {size}: most similar density"] = f"p = {best:.3g} (CKA {group[best]:.3f})"
            numbers[f"S = C = {size}: CKA at the Mixer's density p = {nearest:.3g} / dense"] = \
                f"{group[nearest]:.3f} / {group.get(1.0, float('nan')):.3f}"
            findings.append(f"S = C = {size}: CKA peaks at p = {best:.3g} (Mixer: {1 / size:.3g})")
            verdicts += _cka_verdicts(cka_rows, size, nearest)
        fields = measures.conclude(self, rows, scale, verdicts)
        verdict = (("; ".join(findings) + ". " if findings else "No Mixer/SW-MLP pair finished. ") + summary(verdicts)
                   + measures.headline(fields))
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        figures = {"fig2_cka": _cka_plot(points)}
        if points:
            size = max(p["size"] for p in points)
            seed = min(s for (sz, s, _) in matrices if sz == size)
            densities = sorted({d for (sz, s, d) in matrices if sz == size and s == seed})
            nearest = min(densities, key=lambda d: abs(math.log2(d * size)))
            figures["fig2_matrices"] = _matrices_plot([matrices[(size, seed, d)] for d in dict.fromkeys([nearest, 1.0])
                                                       if (size, seed, d) in matrices], size)
        return Analysis(figures=figures, tables={"fig2_cka": table, "fig2_errors": errors}, numbers=numbers,
                        verdict=verdict, verdicts=verdicts, **fields)


def _cka_verdicts(cka_rows: list[dict], size: int, nearest: float) -> list:
    """Fig. 2a's two parts for the Mixer of ``size``, from each seed's CKA against every density: the SW-MLP at
    the Mixer's density (``nearest``) beats the dense one (:data:`SPARSE_RULE`), and the best density beats the
    dense one (:data:`PEAK_RULE`, the maximum taken after averaging over the resampled seeds)."""
    per_seed: dict[int, dict[float, float]] = {}
    for r in cka_rows:
        if r["size"] == size:
            per_seed.setdefault(r["seed"], {})[r["density"]] = r["cka_diagonal_mean"]
    densities = sorted({d for curve in per_seed.values() for d in curve}, reverse=True)  # dense first
    complete = {seed: curve for seed, curve in per_seed.items() if set(curve) == set(densities)}
    if not densities or densities[0] != 1.0 or len(densities) < 2:
        return []
    at_mixer = {seed: [curve[1.0], curve[nearest]] for seed, curve in complete.items()}
    curves = [[curve[d] for d in densities] for curve in complete.values()]
    peak = bootstrap_verdict(curves, PEAK_RULE, f"S = C = {size}: the most similar density is sparse",
                             statistic=lambda d: d.mean(axis=1)[:, 1:].max(axis=-1) - d.mean(axis=1)[:, 0])
    return [arm_verdict(SPARSE_RULE, at_mixer, f"S = C = {size}: the SW-MLP at the Mixer's density (p = "
                        f"{nearest:.3g}) is more similar than the dense one", quote=QUOTE_SPARSE),
            dataclasses.replace(peak, quote=str(QUOTE_PEAK), extra="a maximum over densities leans high, towards "
                                "the claim: this part errs towards supported")]


def _pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(Mixer row, SW-MLP row) of the same size and seed, Mixers in order of (size, seed), SW-MLPs in row order."""
    mixers = {(r["size"], r["seed"]): r for r in rows if r["model"] == "MLP-Mixer"}
    return [(mixer, r) for (size, seed), mixer in sorted(mixers.items()) for r in rows
            if r["model"] == "SW-MLP" and r["size"] == size and r["seed"] == seed]


def _labels(sw_row: dict) -> tuple[str, str]:
    return "MLP-Mixer", f"SW-MLP p={sw_row['density']:.3g}"


def _cka(a: tuple[list[str], np.ndarray], b: tuple[list[str], np.ndarray], labels: tuple[str, str]) -> CKAResult:
    """The CKA matrix of two runs from their stored Gram matrices (the same test batches)."""
    (names_a, grams_a), (names_b, grams_b) = a, b
    matrix = cka_from_grams(names_a, grams_a, names_b, grams_b, labels)
    square = matrix.shape[0] == matrix.shape[1]
    return CKAResult(label_a=labels[0], label_b=labels[1], where="mixing", names_a=names_a, names_b=names_b,
                     matrix=matrix, diagonal_mean=float(np.diag(matrix).mean()) if square else None,
                     n_examples=grams_a.shape[1] * grams_a.shape[2], n_batches=grams_a.shape[1])


def _cka_plot(points: list[dict]) -> Figure:
    """Mean diagonal CKA ± std over seeds against the SW-MLP's density, with each Mixer's density (Fig. 2a)."""
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.add_subplot()
    for i, size in enumerate(sorted({p["size"] for p in points}, reverse=True)):
        group = sorted((p for p in points if p["size"] == size), key=lambda p: p["density"])
        colour = f"C{i}"
        ax.errorbar([p["density"] for p in group], [p["mean"] for p in group], yerr=[p["std"] or 0 for p in group],
                    marker="o", capsize=3, color=colour, label=f"MLP-Mixer S = C = {size}")
        ax.axvline(1 / size, color=colour, linestyle="--", linewidth=1, label=f"its density 1/{size}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("SW-MLP density p")
    ax.set_ylabel("mean diagonal CKA")
    ax.set_title("Fig. 2a: CKA between MLP-Mixer and SW-MLP of the same width", fontsize=10)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    return fig


def _matrices_plot(results: list, size: int) -> Figure:
    """CKA matrices of the Mixer against the SW-MLP at the Mixer's density and the dense one (Fig. 2b, c)."""
    fig = Figure(figsize=(5.0 * len(results), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(results)))
    for ax, result in zip(axes, results):
        image = ax.imshow(result.matrix, origin="lower", vmin=0.0, vmax=1.0, cmap="magma")
        for (i, j), value in np.ndenumerate(result.matrix):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if value > 0.6 else "white")
        ticks = range(1, result.matrix.shape[0] + 1)
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_yticks(range(len(ticks)), ticks)
        ax.set_xlabel(result.label_b)
        ax.set_ylabel(f"MLP-Mixer S = C = {size}")
    fig.colorbar(image, ax=list(axes), label="CKA")
    fig.suptitle("Fig. 2b, c: CKA matrices (features before each skip, input at 1)", fontsize=10)
    return fig


@register_preset
class Fig2d(Preset):
    name = "fig2d"
    title = "Shallow MLPs with Monarch against Kronecker weights"
    claim = ("Shallow MLPs x -> B_c B₂ ReLU(B₁x) with Monarch weights and with Kronecker weights (the Mixer's "
             "weight-shared Monarch) reach comparable test error.")
    source = "Hayase & Karakida Fig. 2d, Sec. 3.3, App. C.1"
    datasets = ("mnist", "fashion-mnist", "digits")
    scale_datasets = {**recipes.SCALE_DATASETS, "paper": "mnist"}
    allowed_datasets = recipes.allowed(datasets, ("mnist",))
    scales = ("paper", "medium", "small", "smoke")
    default_seeds = {"paper": 5, "medium": 5, "small": 3, "smoke": 1}
    quotes = (QUOTE_COMPARABLE,)
    rule_names = ("COMPARABLE_RULE",)

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        recipe = {"paper": lambda: recipes.paper_mnist(dataset),
                  "medium": lambda: recipes.medium(dataset, epochs=20, augment=None),
                  "small": lambda: recipes.small(dataset), "smoke": lambda: recipes.smoke()}[scale]()
        recipe = recipe.replace(image={k: recipe.image[k] for k in ("img_size", "in_chans")})  # no patches
        specs = []
        for label, model in (("Monarch", "shallow_monarch_28"), ("Kronecker", "shallow_kronecker_28")):
            specs += self.seeded(label.lower(), recipe.config({"name": model}), {"dataset": dataset, "model": label},
                                 scale)
        if scale == "medium":  # both models, seed 0, twice the epochs
            specs += recipes.doubled_ends(specs, "seed")
        return specs

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((), Departures(f"{dataset} (the paper: MNIST; --dataset mnist where it is installed)",
                                     "20 of AdamW (the paper: 200)", "none, as App. C.1 states none for Fig. 2d").lines())

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = measures.trained(rows)
        value, value_note = measures.decided_value(done, self.decided_on)
        stats = {label: mean_std(r[value] for r in done if r["model"] == label) for label in ("Monarch", "Kronecker")}
        table = [{"model": k, "test_error_mean": v["mean"], "test_error_std": v["std"], "seeds": v["n"]}
                 for k, v in stats.items()]
        numbers = {f"{k}: test error": format_mean_std(v, percent=True) for k, v in stats.items()}
        arms = [[r for r in done if r["model"] == label] for label in ("Monarch", "Kronecker")]
        numbers["Monarch − Kronecker"] = interval_text(per_seed_difference(*arms, value), level=LEVEL, scale=100,
                                                       unit=" points")
        verdicts = [measures.difference_verdict(COMPARABLE_RULE, *arms, value, "Monarch and Kronecker MLPs reach "
                                                "comparable error", quote=QUOTE_COMPARABLE,
                                                extra=measures.sampling_error(done, value))]
        checks = measures.doubling(rows, "seed")
        check_numbers, check_text = measures.doubling_report(checks)
        numbers |= check_numbers
        fields = measures.conclude(self, rows, scale, verdicts, checks, value_note)
        verdict = summary(verdicts)
        if all(v["n"] for v in stats.values()):
            verdict = (f"Monarch {100 * stats['Monarch']['mean']:.2f} % against Kronecker "
                       f"{100 * stats['Kronecker']['mean']:.2f} % test error. " + verdict)
        verdict += check_text + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        return Analysis(figures={"fig2d": _bars(stats)}, tables={"fig2d": table}, numbers=numbers, verdict=verdict,
                        verdicts=verdicts, **fields)


def _bars(stats: dict[str, dict]) -> Figure:
    fig = Figure(figsize=(4.0, 3.4))
    ax = fig.add_subplot()
    labels = [k for k, v in stats.items() if v["mean"] is not None]
    ax.bar(range(len(labels)), [100 * stats[k]["mean"] for k in labels],
           yerr=[100 * (stats[k]["std"] or 0) for k in labels], color=["tab:purple", "tab:green"][:len(labels)],
           capsize=4)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("test error (%)")
    ax.set_title("Fig. 2d: shallow Monarch against Kronecker MLPs", fontsize=10)
    return fig
