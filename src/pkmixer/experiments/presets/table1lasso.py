"""Table 1's dynamic-sparsity row: a wider Mixer (Mixer-SS-W) against β-LASSO (Neyshabur 2020) at about the same
number of connections (Hayase & Karakida Sec. 5.3, Table 1).

Command::

    pkmixer reproduce table1lasso --scale paper --dataset cifar10   # also cifar100; a GPU's run
    pkmixer reproduce table1lasso --scale medium   # 10 000 Fashion-MNIST images, 2 λ, 5 seeds
    pkmixer reproduce table1lasso --scale small    # Fashion-MNIST subset, CPU minutes
    pkmixer reproduce table1lasso --scale smoke

The paper's claim: Mixer-SS-W (255 M connections) has a lower test error than β-LASSO (256 M): 12.07 against
14.81 % on CIFAR-10, 38.13 against 40.44 % on CIFAR-100. The paper trains only the Mixer; its β-LASSO numbers are
Neyshabur's (his S-FC: two hidden fully connected layers with BatchNorm on the raw pixels). This preset trains
both sides, on one data set with one augmentation.

What a run trains:

* Mixer-SS-W: table1's wider Mixer at that scale (P = 4, S = 49, C = 57, γ = 4, 2 blocks on 28 px images).
* β-LASSO: a fully connected network on the raw pixels trained with β-LASSO (:mod:`pkmixer.train.lasso`) - a dense
  SW-MLP (App. A.2.5 at p = 1) whose per-patch stem sees single pixels (P = 1, C = 1: d₀ = n pixels), then an input
  layer n → m and two residual blocks of width m, with m the width at which its hidden layers hold the Mixer's
  connections (n·m + 2m² against Ω × mixing layers, :func:`fc_width`): two hidden fully connected layers as
  Neyshabur's S-FC has, with the SW-MLP's LayerNorm and skips for his BatchNorm. β = 50 (Neyshabur's), and two
  penalties λ (:data:`LAMBDAS`, a decade apart: a mild one, and one whose threshold βλ is half the initial weights'
  scale); the λ whose runs have the lowest mean final *validation* error is the one compared - a choice the Mixer
  does not get, which can only favour β-LASSO. Optimiser: App. C.4's
  Nesterov SGD (lr 0.02, momentum 0.9, no weight decay: the L1 penalty replaces it), the step Alg. 1 writes plus
  momentum; the classifier is left out of the penalty (it starts at zero). The ``kept`` probe records the fraction
  of weights β-LASSO left non-zero.

The verdict (:data:`RULE`, declared before any run is read): the mean over seeds of error(Mixer-SS-W) −
error(β-LASSO at the selected λ), a seed's runs sharing the seed, with its 92 % paired-bootstrap interval,
claimed < 0; decided on the final epoch's test error (the paper's protocol). Medium scale adds the epoch-doubling
check on seed 0 of every arm.

Scales:

* ``paper`` - CIFAR-10 or CIFAR-100: ``mixer_ssw4_32`` (P = 4, S = 64, C = 487, 2 blocks) with table1's paper
  recipe (App. C.3: AdamW lr 0.04, batch 1024, 4000 epochs, AutoAugment with crop and flip), and the β-LASSO
  network on the 3 072 input values at the Mixer's 275 M connections (m = :func:`fc_width`), App. C.4's Nesterov
  SGD at batch 128 with the same augmentation and epochs; 3 seeds (pass ``--seeds 5`` to decide).
* ``medium`` - :func:`.recipes.medium` with AutoAugment (as table1: App. C.1's augmentation for the CIFAR Mixers,
  with crop and flip) on 10 000 Fashion-MNIST training images (each seed draws its own, shared by its runs; a
  validation split of 2 500 held out of the training set) for 20 epochs, tested on all 10 000 test images, 5
  seeds: 15 runs, plus 3 doubled (40 epochs, seed 0 of each arm). A subset, as figs8's: both models cost about
  4.7 M multiply-adds per image each way, and Mixer-SS-W's epochs of this design took 15-19 s on each of two
  cores (28-33 s beside test suites; the FC network's small-scale epochs took as long as the Mixer's). Estimated
  1.0 h on 2 cores (:data:`.recipes.RUN_EPOCH_SECONDS`).
* ``small`` - :func:`.recipes.small` (10 000 images, no augmentation), 4 epochs of the same optimisers, 3 seeds:
  9 runs.
* ``smoke`` - digits at 8 px (Mixer P = 2, C = 7; the FC network of the same connections), 1 epoch.

Neyshabur's own S-FC and recipe are not what any scale trains (see the β-LASSO network above).
"""
from __future__ import annotations

import math
from pathlib import Path

from ..preset import Analysis, Preset, register_preset
from ..regime import Departures, Quantity, Regime, ratio
from ..rules import ArmRule, Quote, contrast
from ..stats import format_mean_std, interval_text, mean_std, per_seed_difference, summary
from ..sweep import RunSpec
from .. import measures, recipes
from ..measures import trained
from .table1 import SMALL_PAIRS, _describe, _small_pair

QUOTE = Quote("Sec. 5.3", "Table 1 shows a comparison of MLP-Mixer with a dynamic sparsity β-LASSO (Neyshabur, 2020). "
                          "We found a wider Mixer (Mixer-SS-W) has better performance than β-LASSO.")
LEVEL = 0.92
RULE = ArmRule("mean over seeds of error(Mixer-SS-W) − error(β-LASSO)", contrast([1, -1]), "below", 0.0,
               level=LEVEL, scale=100, unit=" points")
PAPER_EFFECT = (0.1207, 0.1481)  # Table 1, CIFAR-10: Mixer-SS-W 12.07 %, β-LASSO 14.81 %
PAPER_CONNECTIONS = 256 / 255  # Table 1: β-LASSO 256 M, Mixer-SS-W 255 M
BETA = 50.0  # Neyshabur's β
LAMBDAS = (3e-5, 3e-4)  # the penalties tried; βλ = 1.5e-3 and 1.5e-2 against initial weights of 1/√m ≈ 0.027
FC_DEPTH = 2  # the residual blocks after the input layer: two hidden layers, as S-FC
MIXER, LASSO = "Mixer-SS-W", "β-LASSO"
MEDIUM_EPOCHS, MEDIUM_SUBSET = 20, 10_000
PAPER_EPOCHS = 4000  # App. C.3's Mixer-SS-W, for both


def fc_width(connections: float, inputs: int, depth: int = FC_DEPTH) -> int:
    """The width m at which a fully connected network with an input layer ``inputs`` → m and ``depth`` blocks of
    m → m holds ``connections`` weights in those layers: the root of depth·m² + inputs·m = connections."""
    return round((-inputs + math.sqrt(inputs * inputs + 4 * depth * connections)) / (2 * depth))


def _fc_options(image: dict, connections: float) -> tuple[dict, int]:
    """The β-LASSO network's model options (a dense SW-MLP on single pixels) and its hidden-layer connections."""
    inputs = image["in_chans"] * image["img_size"] ** 2
    width = fc_width(connections, inputs)
    options = {"name": "swmlp_t4_28", **image, "patch_size": 1, "embed_dim": image["in_chans"], "width": width,
               "density": 1.0, "depth": FC_DEPTH, "block": "fc", "weight_format": "masked"}
    return options, inputs * width + FC_DEPTH * width * width


def _medium(dataset: str) -> recipes.Recipe:
    """:func:`.recipes.medium` with AutoAugment for :data:`MEDIUM_EPOCHS` epochs on 10 000 training images (the
    digits: all of them); see the module docstring."""
    recipe = recipes.medium(dataset, epochs=MEDIUM_EPOCHS, augment="autoaugment",
                            val_fraction=recipes.SUBSET_VAL_FRACTION)
    if dataset == "digits":
        return recipe
    return recipe.replace(data={**recipe.data, "train_subset": MEDIUM_SUBSET})


@register_preset
class Table1Lasso(Preset):
    name = "table1lasso"
    title = "Table 1: a wider Mixer against β-LASSO at the same connections"
    claim = ("A wider Mixer (Mixer-SS-W) has a lower test error than a fully connected network trained with "
             "β-LASSO (Neyshabur 2020) at about the same number of connections.")
    source = "Hayase & Karakida Table 1, Sec. 5.3; Neyshabur 2020, Alg. 1"
    datasets = ("cifar10", "cifar100", "fashion-mnist", "mnist", "digits")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, ("cifar10", "cifar100"))
    scales = ("paper", "medium", "small", "smoke")
    default_seeds = {"paper": 3, "medium": 5, "small": 3, "smoke": 1}

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        if scale != "medium":
            return None
        return Regime((Quantity("connections ratio, the larger model's over the smaller's", PAPER_CONNECTIONS,
                                ratio("connections"), 1.1, why="Table 1: 256 M (β-LASSO) against 255 M (Mixer-SS-W)"),),
                      Departures(f"{dataset} (the paper: CIFAR-10, CIFAR-100)",
                                 f"{MEDIUM_EPOCHS} for both on {MEDIUM_SUBSET} training images (the paper: 4000 "
                                 "for the Mixer on all of CIFAR; Neyshabur's β-LASSO numbers)",
                                 "AutoAugment with crop and flip, for both",
                                 ("the β-LASSO network: a dense SW-MLP on single pixels with two residual blocks "
                                  "(LayerNorm) for Neyshabur's S-FC (BatchNorm), Nesterov SGD with momentum for "
                                  "Alg. 1's plain gradient step, λ chosen on the validation split from two",)
                                 ).lines())

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        if scale == "paper":  # table1's paper recipe for the Mixer; App. C.4's SGD and batch for β-LASSO
            mixer = {"name": "mixer_ssw4_32"}
            mixer_config = recipes.paper_cifar(dataset, {**recipes.ADAMW_C1, "lr": 0.04}, PAPER_EPOCHS,
                                               {"batch_size": 1024, "auto_augment": "cifar10"}).replace(image={}
                                                                                                       ).config(mixer)
            image = recipes.GEOMETRY[dataset]
            fc_recipe = recipes.paper_cifar(dataset, recipes.SGD_C4, PAPER_EPOCHS, {"auto_augment": "cifar10"})
        else:
            fc_recipe = {"smoke": recipes.smoke, "medium": lambda: _medium(dataset),
                         "small": lambda: recipes.small(dataset, epochs=4)}[scale]()
            image = fc_recipe.image
            mixer = dict(_small_pair(image, *SMALL_PAIRS[image["img_size"]])[1][1])
            mixer_config = fc_recipe.config(mixer)
        mixer_meta = {"dataset": dataset, "model": MIXER, "lasso": None,
                      "connections": _describe(mixer)["connections"]}
        specs = self.seeded("mixerssw", mixer_config, mixer_meta, scale)
        fc, connections = _fc_options(image, mixer_meta["connections"])
        for lam in LAMBDAS:
            config = fc_recipe.config(fc, {**{f"optim.{k}": v for k, v in recipes.SGD_C4.items()},
                                           "optim.lasso": lam, "optim.lasso_beta": BETA})
            meta = {"dataset": dataset, "model": LASSO, "lasso": lam, "width": fc["width"],
                    "connections": float(connections)}
            specs += self.seeded(f"lasso{lam:g}", config, meta, scale, probes=("kept",))
        if scale == "medium":
            specs += [recipes.doubled(s) for s in specs if s.meta["seed"] == 0]
        return specs

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = trained(rows)
        value, value_note = measures.decided_value(done, self.decided_on)
        arms = {lam: [r for r in done if r.get("model") == LASSO and r.get("lasso") == lam] for lam in LAMBDAS}
        mixer = [r for r in done if r.get("model") == MIXER]
        table, numbers = [], {}
        for label, runs in [(MIXER, mixer)] + [(f"{LASSO}, λ = {lam:g}", arms[lam]) for lam in LAMBDAS]:
            if not runs:
                continue
            test, val = mean_std([r[value] for r in runs]), mean_std([r.get("final_val_error") for r in runs
                                                                       if r.get("final_val_error") is not None])
            kept = mean_std([r["kept_fraction"] for r in runs if r.get("kept_fraction") is not None])
            table.append({"model": label, "lasso": runs[0].get("lasso"), "connections": runs[0].get("connections"),
                          "test_error_mean": test["mean"], "test_error_std": test["std"], "seeds": test["n"],
                          "val_error_mean": val["mean"] if val["n"] else None,
                          "kept_fraction": kept["mean"] if kept["n"] else None})
            numbers[f"{label}: test error"] = format_mean_std(test, percent=True)
            if kept["n"]:
                numbers[f"{label}: weights kept"] = f"{100 * kept['mean']:.1f} %"
        chosen = _select(arms)
        verdict, verdicts = "Both models must finish to compare them. ", []
        if chosen is None and any(arms.values()):
            verdict = "No β-LASSO run has a validation split to select λ on: nothing is compared. "
        if chosen is not None and mixer:
            lasso_runs = arms[chosen]
            numbers["λ selected on the validation split"] = f"{chosen:g}"
            numbers["Mixer-SS-W − β-LASSO, paired over seeds"] = interval_text(
                per_seed_difference(mixer, lasso_runs, value), level=LEVEL, scale=100.0, unit=" points")
            extra = "; ".join(e for e in (
                f"β-LASSO's λ = {chosen:g} has the lowest mean final validation error of {', '.join(map(str, LAMBDAS))}",
                measures.sampling_error(done, value),
                measures.power_text([(RULE, PAPER_EFFECT)], "read off Table 1: CIFAR-10 12.07 against 14.81 %")) if e)
            verdicts = [measures.difference_verdict(RULE, mixer, lasso_runs, value, "Mixer-SS-W has a lower test "
                                                    "error than β-LASSO", quote=QUOTE, extra=extra)]
            a, b = mean_std([r[value] for r in mixer]), mean_std([r[value] for r in lasso_runs])
            verdict = (f"Mixer-SS-W against β-LASSO (λ = {chosen:g}, selected on the validation split): "
                       f"{100 * a['mean']:.2f} % against {100 * b['mean']:.2f} %. " + summary(verdicts))
        checks, check_numbers, closing, fields = measures.closing(self, rows, scale, verdicts, "lasso", value_note)
        numbers |= check_numbers
        verdict += closing
        tables = {"table1lasso": table} | ({"table1lasso_doubling": checks} if checks else {})
        data = ", ".join(sorted({str(r.get("dataset")) for r in rows}))
        return Analysis(figures={"table1lasso": _bars(table, chosen, data)}, tables=tables, numbers=numbers,
                        verdict=verdict, verdicts=verdicts, **fields)


def _select(arms: dict[float, list[dict]]) -> float | None:
    """The λ whose finished runs have the lowest mean final validation error (the test split selects nothing);
    None when no λ has a run with one."""
    scored = {lam: sum(r["final_val_error"] for r in runs) / len(runs) for lam, runs in arms.items()
              if runs and all(r.get("final_val_error") is not None for r in runs)}
    return min(scored, key=scored.get) if scored else None


def _bars(table: list[dict], chosen: float | None, data: str):
    """Mean test error ± std over seeds: Mixer-SS-W, then β-LASSO at each λ (the selected one outlined), with the
    fraction of weights each β-LASSO arm kept."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 3.6))
    ax = fig.add_subplot()
    for i, row in enumerate(table):
        lasso = row["lasso"] is not None
        ax.bar(i, 100 * row["test_error_mean"], yerr=100 * (row["test_error_std"] or 0), capsize=4,
               color="tab:grey" if lasso else "tab:red", edgecolor="black" if lasso and row["lasso"] == chosen
               else "none", linewidth=2)
        if row.get("kept_fraction") is not None:
            ax.annotate(f"kept {100 * row['kept_fraction']:.0f} %", (i, 100 * row["test_error_mean"]),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 8), textcoords="offset points")
    ax.set_xticks(range(len(table)), [MIXER if r["lasso"] is None else f"{LASSO}\nλ = {r['lasso']:g}"
                                      for r in table], fontsize=8)
    ax.set_ylim(0, 1.15 * max(100 * (r["test_error_mean"] + (r["test_error_std"] or 0)) for r in table))  # labels
    ax.set_ylabel("test error (%)")
    ax.set_title(f"Table 1: Mixer-SS-W against β-LASSO ({data}); outlined: λ selected on validation", fontsize=9)
    return fig
