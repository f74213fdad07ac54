"""Figs. S.6 and S.7: random permutations curb overfitting - test-loss curves of normal and RP Mixers at fixed Ω
(Hayase & Karakida App. D.7).

Command::

    pkmixer reproduce figs6 --scale paper    # S-Mixers (Fig. S.6); figs7: MLP-Mixers with AutoAugment (Fig. S.7)
    pkmixer reproduce figs6 --scale medium   # 10 000 Fashion-MNIST images, 60 epochs, 5 seeds (1.9 h on 2
                                             # shared cores); figs7: 2 000 images, 50 epochs (44 min)
    pkmixer reproduce figs6 --scale small    # Fashion-MNIST, 2 000 training images, 15 epochs
    pkmixer reproduce figs6 --scale smoke

The paper's claims. Fig. S.6: trained long, the normal S-Mixer overfits - its test loss rises again after its
minimum - by more than twice as much as the RP S-Mixer, worst at the largest C (smallest S). Fig. S.7: with
AutoAugment and MLP-Mixers (γ = 4) the RP model still ends with the lower test loss at the largest C, while its
training loss stays above the normal model's. What a run shows: the mean test-loss curves over seeds for every C
(and the min-max band at the largest C, with the training loss for S.7); the table gives, per family and C, the
overfitting (final minus minimal test loss, mean ± std over seeds) and the final losses. Each verdict part is a
mean over seeds of a per-seed statistic (a seed's normal and RP runs share the seed) with its 90 %
paired-bootstrap interval over seeds and a rule declared below before any run is read
(pkmixer.experiments.stats). S.6: at the largest C, overfitting(normal) − 2 × overfitting(RP), claimed > 0
(:data:`TWICE_RULE`: "more than twice", without dividing by an RP overfitting near 0), and "especially at the
largest C", the within-seed Spearman ρ(C, overfitting(normal) − overfitting(RP)), claimed > 0
(:data:`GROWS_RULE`). S.7: at the largest C, final test loss(RP) − final test loss(normal), claimed < 0
(:data:`TEST_LOSS_RULE`), and final training loss(RP) − final training loss(normal), claimed > 0
(:data:`TRAIN_LOSS_RULE`). Supported when both parts are, contradicted when either is, undecided otherwise (and
with fewer than 5 seeds: pass ``--seeds 5``).

Scales:

* ``paper`` - CIFAR-10, Ω = 2^18 for the S-Mixers (S.6; γ = 4 and Ω = 2^20 for the MLP-Mixers of S.7, which
  gives the same pairs): C = 16, 32, 64, 114, 173 with S = 173, 113, 64, 32, 16; 8 blocks, Nesterov SGD lr 0.1,
  600 epochs, 5 seeds; S.6 with App. C.4's batch 128, crop and flip; S.7 with batch 256 and AutoAugment. Ω is
  not stated in D.7: it is the Ω whose C.4 pairs end in (173, 16). 50 runs each.
* ``medium`` - small's models with :func:`.recipes.medium` (AdamW, batch 128), 5 seeds: 50 runs each (S.7: and 2
  for the epoch-doubling check below), on a training subset trained long - a departure from medium scale's whole
  training set, since the claims need the overfitting regime of the paper's 600 epochs (the evidence:
  docs/reproduction.md). S.6: 10 000 Fashion-MNIST images (each seed draws its own; a seed's two families share
  it), 60 epochs, all 10 000 test images; estimated 65 min on 2 cores (0.19 ms per training and 0.06 ms per test
  image on one core, timed beside another job); it took 1.9 h, with the CI suite and other jobs on the same 2
  cores for part of it.
  S.7: 2 000 training and 2 000 test images, 50 epochs; estimated at most 100 min (AutoAugment's per-image
  pipeline before its batched version: 1.7 ms per training and 0.8 ms per test image); with AutoAugment batched
  it took 44 min, with the CI suite on the same cores for half of it. On all 60 000 images the 20 epochs that 2
  cores afford end with training losses of 0.02-0.18, where overfitting starts; on 10 000 images for 60 epochs
  every training loss ends below 0.005 and every test loss 0.22-0.67 above its minimum. On the bundled digits
  (when Fashion-MNIST is absent) all 1 438 images, 2.4 times the epochs. S.7's epoch-doubling check: seed 0's
  two runs at the largest C trained twice as long. The claims are about where the loss curves end after the
  paper's 600 epochs, not about a converged error, so the check asks whether a run twice as long tells the same
  story: each part's statistic on seed 0's pair (:data:`END_PARTS`) keeps its sign, else the outcome is "not
  converged" - S.7's training losses still fall at 50 epochs. S.6 has none: its runs end with training losses
  below 0.005, in the overfitting the claim is about, and the check's 240 run-epochs would take its estimate over
  the 2-hour budget (2.07 h).
* ``small`` - Fashion-MNIST, 2 000 training and 2 000 test images, 15 epochs of AdamW, Ω = 2^15 (S.6) or 2^17
  at γ = 4 (S.7), 4 blocks, C = 8, 16, 32, 56, 87, 2 seeds: 20 runs each.
* ``smoke`` - digits, C = 4, 14 at Ω = 2^9 (γ = 4: 2^11), 1 block, 2 epochs.
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ...theory.width import symmetric_pairs
from ..preset import Analysis, Preset, register_preset
from ..regime import Departures, Quantity, Regime, constant
from ..rules import ArmRule, Quote, arm_verdict, contrast, slope_on
from ..stats import interval_text, mean_std, per_seed_difference, per_seed_table, summary
from ..sweep import RunSpec
from .. import measures, recipes
from ..measures import COLOURS, finished, learning_curves, mean_curve, overfitting, val_overfitting

PAPER_CHANNELS = (16, 32, 64, 114, 173)
# The paper's words and the rules, fixed before any run is read; losses are cross-entropies (nats). Overfitting is
# how far the test loss rises after the epoch the validation split selects (lowest validation loss): the test split
# selects nothing (runs without a validation split fall back to the test loss's own minimum, and say so)
QUOTE_S6 = Quote("App. D.7", "In Figure S.6, we explored several values of C fixed Ω, the normal model shows "
                             "overfitting of more than twice the magnitude compared to the RP model, especially C is "
                             "the largest one in the exploring range.")
QUOTE_S7_TEST = Quote("App. D.7", "RP S-Mixer outperformed S-Mixer in terms of test loss for C = 173, indicating that "
                                  "RP still provides overfitting prevention even with relatively strong data "
                                  "augmentations.")
QUOTE_S7_TRAIN = Quote("App. D.7", "Figure S.7 (right) illustrates that RP did not reach the relatively small "
                                   "training loss as the normal model.")
LEVEL = 0.92
_LOSS = {"level": LEVEL, "digits": 4}
TWICE_RULE = ArmRule("mean over seeds of overfitting(normal) − 2 × overfitting(RP) at the largest C",
                     contrast([1, -2]), "above", 0.0, **_LOSS)
TEST_LOSS_RULE = ArmRule("mean over seeds of final test loss(RP) − final test loss(normal) at the largest C",
                         contrast([-1, 1]), "below", 0.0, **_LOSS)
TRAIN_LOSS_RULE = ArmRule("mean over seeds of final training loss(RP) − final training loss(normal) at the largest C",
                          contrast([-1, 1]), "above", 0.0, **_LOSS)
# The medium epoch-doubling check, per preset that has one: (part, its statistic on seed 0's normal and RP runs at
# the largest C, each a _Overfitting._per_run row); converged when doubling the epochs leaves every sign
END_PARTS = {
    "figs7": (("final test loss(RP) − final test loss(normal)",
               lambda n, r: r["final_test_loss"] - n["final_test_loss"]),
              ("final training loss(RP) − final training loss(normal)",
               lambda n, r: r["final_train_loss"] - n["final_train_loss"])),
}


def grows_rule(channels: list[int]) -> ArmRule:
    """"Especially at the largest C": the least-squares slope of overfitting(normal) − overfitting(RP) on log₂ C,
    claimed > 0 (arms: the excess at each C)."""
    return ArmRule("slope of overfitting(normal) − overfitting(RP) on log₂ C (means over seeds)",
                   slope_on(np.log2(channels)), "above", 0.0, **_LOSS)


@dataclass(frozen=True)
class _Sweep:
    recipe: recipes.Recipe
    omega: int
    channels: tuple[int, ...]
    depth: int


def _sweep(scale: str, dataset: str, gamma: float, paper_data: dict, medium: tuple[dict, int]) -> _Sweep:
    """The C values and recipe; Ω scales with γ so that both figures share their (C, S) pairs. ``medium``: the
    data settings and epochs of medium scale."""
    if scale == "paper":
        return _Sweep(recipes.paper_cifar(dataset, {**recipes.SGD_C4, "lr": 0.1}, 600, paper_data),
                      round(2**18 * gamma), PAPER_CHANNELS, 8)
    if scale == "medium":  # a training subset trained long: see the module docstring
        subsets, epochs = medium
        recipe = recipes.medium(dataset, epochs=epochs, augment=None, val_fraction=recipes.SUBSET_VAL_FRACTION)
        if dataset != "digits":  # the digits' 1438 training images are fewer than the subsets
            recipe = recipe.replace(data={**recipe.data, **subsets})
        return _Sweep(recipe, round(2**15 * gamma), (8, 16, 32, 56, 87), 4)
    if scale == "small":
        recipe = recipes.small(dataset, epochs=15, train_subset=2000, test_subset=2000)
        return _Sweep(recipe, round(2**15 * gamma), (8, 16, 32, 56, 87), 4)
    return _Sweep(recipes.smoke(epochs=2), round(2**9 * gamma), (4, 14), 1)


class _Overfitting(Preset):
    """Normal against RP Mixers at fixed Ω, analysed by their test-loss curves."""

    decided_on = "final losses"
    decided_on_why = ("the claims are about the loss curves to the end of training (the paper plots them); where an "
                      "epoch is selected, the validation loss selects it")

    families: dict[str, dict] = {}  # label -> model options
    gamma: float = 1.0
    paper_data: dict = {}
    medium: tuple[dict, int] = ({"train_subset": 10_000}, 60)  # data settings, epochs
    scales = ("paper", "medium", "small", "smoke")
    default_seeds = {"paper": 5, "medium": 5, "small": 2, "smoke": 1}
    datasets = ("cifar10", "cifar100", "stl10", "fashion-mnist", "mnist", "digits")
    scale_datasets = recipes.SCALE_DATASETS
    allowed_datasets = recipes.allowed(datasets, recipes.PAPER_CIFAR)

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        s = _sweep(scale, dataset, self.gamma, self.paper_data, self.medium)
        specs = []
        for C, S in symmetric_pairs(s.omega, self.gamma, channels=s.channels):
            for family, options in self.families.items():
                config = s.recipe.config({**options, "depth": s.depth, "embed_dim": C, "num_tokens": S})
                meta = {"dataset": dataset, "model": family, "omega": s.omega, "C": C, "S": S}
                tag = family.replace(" ", "").replace("-", "").lower()
                specs += self.seeded(f"{tag}-c{C}", config, meta, scale)
        specs = recipes.seed_structures(specs)
        if scale == "medium" and self.name in END_PARTS:  # the epoch-doubling check: seed 0's pair at the largest C
            largest = max(s.meta["C"] for s in specs)
            specs += [recipes.doubled(s) for s in specs if s.meta["seed"] == 0 and s.meta["C"] == largest]
        return specs

    def _summaries(self, rows: list[dict]) -> tuple[list[dict], dict]:
        """Per (family, C): overfitting and final losses over seeds; and the runs' curves."""
        curves = learning_curves(rows)
        table = []
        for family in self.families:
            for C in sorted({r["C"] for r in rows if r["model"] == family}):
                runs = [curves[r["run"]] for r in rows if r["model"] == family and r["C"] == C and curves[r["run"]]]
                if not runs:
                    continue
                over = mean_std(_overfitting(c) for c in runs)
                final = mean_std(c[-1]["test_loss"] for c in runs)
                train = mean_std(c[-1]["train_loss"] for c in runs)
                S = next(r["S"] for r in rows if r["model"] == family and r["C"] == C)
                table.append({"model": family, "C": C, "S": S, "overfitting_mean": over["mean"],
                              "overfitting_std": over["std"], "final_test_loss_mean": final["mean"],
                              "final_test_loss_std": final["std"], "final_train_loss_mean": train["mean"],
                              "min_test_loss_mean": float(np.mean([min(e["test_loss"] for e in c) for c in runs])),
                              "seeds": len(runs)})
        return table, curves

    def _figure(self, rows: list[dict], curves: dict, title: str, right_key: str) -> Figure:
        """Left: mean test-loss curves for every C; right: ``right_key`` at the largest C with its min-max band."""
        fig = Figure(figsize=(10.0, 3.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        channels = sorted({r["C"] for r in rows})
        styles = ["-", "--", "-.", ":", (0, (3, 1, 1, 1))]
        for family in self.families:
            colour = COLOURS[family]
            for i, C in enumerate(channels):
                runs = [curves[r["run"]] for r in rows if r["model"] == family and r["C"] == C and curves[r["run"]]]
                if not runs:
                    continue
                mc = mean_curve(runs, "test_loss")
                left.plot(mc["epoch"], mc["mean"], color=colour, linestyle=styles[i % len(styles)], linewidth=1.2,
                          label=f"{family}, C = {C}")
                if C == channels[-1]:
                    band = mean_curve(runs, right_key)
                    right.plot(band["epoch"], band["mean"], color=colour, label=family)
                    right.fill_between(band["epoch"], band["min"], band["max"], color=colour, alpha=0.25)
        left.set_title(f"{title}: mean test loss", fontsize=10)
        right.set_title(f"{right_key.replace('_', ' ')} at C = {channels[-1] if channels else '-'} (min-max band)",
                        fontsize=10)
        for ax in (left, right):
            ax.set_xlabel("epoch")
            ax.set_ylabel("loss")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        return fig

    def _per_run(self, rows: list[dict], curves: dict) -> list[dict]:
        """One row per run with a curve: its seed, family, C, overfitting and final test and training losses."""
        return [{"seed": r.get("seed"), "model": r["model"], "C": r["C"],
                 "overfitting": _overfitting(curves[r["run"]]),
                 "final_test_loss": curves[r["run"]][-1]["test_loss"],
                 "final_train_loss": curves[r["run"]][-1]["train_loss"]} for r in rows if curves[r["run"]]]

    def _paired(self, runs: list[dict], C: int, value: str) -> dict:
        """Seed -> RP minus normal ``value`` at ``C``."""
        normal, rp = ([r for r in runs if r["model"] == f and r["C"] == C] for f in self.families)
        return per_seed_difference(rp, normal, value)

    def _end_checks(self, rows: list[dict], C: int) -> tuple[list[dict], dict[str, str], str]:
        """The epoch-doubling check (:data:`END_PARTS`) on the finished ``rows`` (the doubled runs among them) at
        ``C``: the checks, their key number and the verdict's sentence (measures.sign_doubling); none for a preset
        without one."""
        if self.name not in END_PARTS:
            return [], {}, ""
        curves = learning_curves(rows)
        pair = [r for r in rows if r["C"] == C and r.get("seed") == 0 and curves[r["run"]]]
        runs = {(r["model"], bool(r.get("doubles"))): run for r, run in zip(pair, self._per_run(pair, curves))}
        normal, rp = self.families

        def value(doubled: bool, fn) -> float | None:
            n, r = runs.get((normal, doubled)), runs.get((rp, doubled))
            return None if n is None or r is None else float(fn(n, r))

        checks = measures.sign_doubling([(label, value(False, fn), value(True, fn))
                                         for label, fn in END_PARTS[self.name]])
        numbers, text = measures.sign_doubling_report(checks)
        return checks, numbers, text

    def _at_largest(self, table: list[dict]) -> tuple[dict | None, dict | None]:
        if not table:
            return None, None
        C = max(t["C"] for t in table)
        normal, rp = (next((t for t in table if t["model"] == f and t["C"] == C), None) for f in self.families)
        return normal, rp


def _overfitting(curve: list[dict]) -> float:
    """How far the test loss rises after the epoch of the lowest validation loss (measures.val_overfitting); for a
    run without a validation split, after the test loss's own minimum."""
    value = val_overfitting(curve)
    return value if value is not None else overfitting([e["test_loss"] for e in curve])


def _selection_note(rows: list[dict]) -> str:
    if any(not any("val_loss" in e for e in (r.get("curve") or [])) for r in rows):
        return ("runs without a validation split: overfitting measured from the minimum of the test loss itself, "
                "which the test split selects")
    return ""


def _regime(gamma: float, dataset: str | None, subsets: dict, epochs: int, augmentation: str) -> Regime:
    return Regime((Quantity("largest C / S", 173 / 16, lambda specs: max(s.meta["C"] / s.meta["S"] for s in specs),
                            1.5, why="App. D.7: C up to 173 with S = 16"),
                   Quantity("γ", gamma, constant(gamma), 1.0, why="γ = 1 (S-Mixer, Fig. S.6), 4 (MLP-Mixer, S.7)")),
                  Departures(f"{dataset}, {subsets.get('train_subset', 'all')} training images (the paper: all of "
                             "CIFAR-10): a subset trained long, to reach the overfitting the claim is about",
                             f"{epochs} of AdamW (the paper: 600 of Nesterov SGD at lr 0.1)", augmentation).lines())


def _ratio(normal: float, rp: float) -> float | None:
    """normal / RP overfitting; infinite when only the normal model overfits, None when neither does."""
    if rp > 0:
        return normal / rp
    return float("inf") if normal > 0 else None


@register_preset
class FigS6(_Overfitting):
    name = "figs6"
    title = "Overfitting of normal and RP S-Mixers at fixed Ω (test-loss curves)"
    claim = ("The normal S-Mixer overfits more than twice as much as the RP S-Mixer, especially at the largest C "
             "(smallest S): RP regularises beyond the token-mixing side.")
    source = "Hayase & Karakida Fig. S.6, App. D.7"
    quotes = (QUOTE_S6,)
    rule_names = ("TWICE_RULE",)
    families = {"S-Mixer": {"name": "smixer_c64p4_32"}, "RP S-Mixer": {"name": "rp_smixer_c64p4_32"}}

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = finished(rows)
        rows = measures.trained(done)  # the epoch-doubling runs are left out
        table, curves = self._summaries(rows)
        normal, rp = self._at_largest(table)
        numbers = {f"{t['model']}, C = {t['C']}: overfitting (final − min test loss)":
                   {"mean": t["overfitting_mean"], "std": t["overfitting_std"], "n": t["seeds"]} for t in table}
        verdict, verdicts = "Both families must finish at the largest C. ", []
        if normal and rp:
            ratio = _ratio(normal["overfitting_mean"], rp["overfitting_mean"])
            numbers["overfitting ratio normal / RP at the largest C"] = ratio
            runs, C = self._per_run(rows, curves), normal["C"]
            pairs = per_seed_table([r for r in runs if r["C"] == C], "model", list(self.families), "overfitting")
            numbers["overfitting normal − 2 × RP at the largest C"] = interval_text(
                {seed: n - 2 * r for seed, (n, r) in pairs.items()}, level=LEVEL, digits=4)
            channels = sorted({r["C"] for r in runs})
            excess = {}
            for c in channels:
                for seed, d in self._paired(runs, c, "overfitting").items():
                    excess.setdefault(seed, {})[c] = -d  # normal − RP
            excess = {seed: [v[c] for c in channels] for seed, v in excess.items() if len(v) == len(channels)}
            verdicts = [arm_verdict(TWICE_RULE, pairs, f"The normal S-Mixer overfits more than twice as much as the "
                                    f"RP one at C = {C}", quote=QUOTE_S6)]
            if len(channels) >= 2:
                verdicts.append(arm_verdict(grows_rule(channels), excess, "The normal S-Mixer's excess overfitting "
                                            "grows with C", quote=QUOTE_S6))
            verdict = (f"At C = {normal['C']} (S = {normal['S']}) the normal S-Mixer's test loss ends "
                       f"{normal['overfitting_mean']:.4f} above its value at the validation-selected epoch, the RP "
                       f"S-Mixer's {rp['overfitting_mean']:.4f}: " + ("neither overfits" if ratio is None else
                                                                       f"a ratio of {ratio:.3g}") +
                       " (the paper: more than 2). " + summary(verdicts))
        checks, check_numbers, check_text = self._end_checks(done, max((r["C"] for r in rows), default=0))
        numbers.update(check_numbers)
        fields = measures.conclude(self, rows, scale, verdicts, checks, _selection_note(rows))
        verdict += check_text + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        figure = self._figure(rows, curves, "Fig. S.6", "test_loss")
        return Analysis(figures={"figs6": figure}, tables={"figs6": table}, numbers=numbers, verdict=verdict,
                        verdicts=verdicts, **fields)

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        return _regime(1.0, dataset, self.medium[0], self.medium[1], "none (App. C.4's crop and flip are the "
                       "paper's; the subset is meant to overfit)") if scale == "medium" else None


@register_preset
class FigS7(_Overfitting):
    name = "figs7"
    title = "Overfitting of normal and RP MLP-Mixers with AutoAugment (test and training loss)"
    claim = ("With AutoAugment and MLP-Mixers (γ = 4), the RP model still ends with the lower test loss at the "
             "largest C, while its training loss stays above the normal model's.")
    source = "Hayase & Karakida Fig. S.7, App. D.7"
    quotes = (QUOTE_S7_TEST, QUOTE_S7_TRAIN)
    rule_names = ("TEST_LOSS_RULE", "TRAIN_LOSS_RULE")
    gamma = 4.0
    paper_data = {"batch_size": 256, "auto_augment": "cifar10"}
    medium = ({"train_subset": 2000, "test_subset": 2000}, 50)  # γ = 4 and AutoAugment: 9 times the time per image
    families = {"MLP-Mixer": {"name": "mixer_c64p4_32", "mlp_ratio": 4.0},
                "RP MLP-Mixer": {"name": "rp_mixer_c64p4_32", "mlp_ratio": 4.0}}

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        specs = super().build(scale, dataset)
        if scale != "paper":  # AutoAugment at every scale (the smoke digits too: it exercises the path)
            specs = [dataclasses.replace(s, config=s.config.override({"data.auto_augment": "cifar10"})) for s in specs]
        return specs

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        done = finished(rows)
        rows = measures.trained(done)  # the epoch-doubling runs are left out
        table, curves = self._summaries(rows)
        normal, rp = self._at_largest(table)
        numbers = {f"{t['model']}, C = {t['C']}: final test / train loss":
                   f"{t['final_test_loss_mean']:.4f} / {t['final_train_loss_mean']:.4f}" for t in table}
        verdict, verdicts = "Both families must finish at the largest C. ", []
        if normal and rp:
            lower = rp["final_test_loss_mean"] < normal["final_test_loss_mean"]
            runs, C = self._per_run(rows, curves), normal["C"]
            test, train = (per_seed_table([r for r in runs if r["C"] == C], "model", list(self.families), key)
                           for key in ("final_test_loss", "final_train_loss"))
            numbers["final test loss RP − normal at the largest C"] = interval_text(
                {k: b - a for k, (a, b) in test.items()}, level=LEVEL, digits=4)
            numbers["final training loss RP − normal at the largest C"] = interval_text(
                {k: b - a for k, (a, b) in train.items()}, level=LEVEL, digits=4)
            verdicts = [arm_verdict(TEST_LOSS_RULE, test, f"The RP MLP-Mixer ends with the lower test loss at C = {C}",
                                    quote=QUOTE_S7_TEST),
                        arm_verdict(TRAIN_LOSS_RULE, train, f"The RP MLP-Mixer's training loss stays above the normal "
                                    f"one's at C = {C}", quote=QUOTE_S7_TRAIN)]
            verdict = (f"At C = {normal['C']} (S = {normal['S']}) the final test loss is "
                       f"{rp['final_test_loss_mean']:.4f} for the RP MLP-Mixer and "
                       f"{normal['final_test_loss_mean']:.4f} for the normal one "
                       f"({'RP lower' if lower else 'RP not lower'}); final training loss "
                       f"{rp['final_train_loss_mean']:.4f} against {normal['final_train_loss_mean']:.4f}. "
                       + summary(verdicts))
        checks, check_numbers, check_text = self._end_checks(done, max((r["C"] for r in rows), default=0))
        numbers.update(check_numbers)
        fields = measures.conclude(self, rows, scale, verdicts, checks)
        verdict += check_text + measures.headline(fields)
        if scale == "smoke":
            verdict += " (Smoke scale: too short to decide.)"
        figure = self._figure(rows, curves, "Fig. S.7", "train_loss")
        return Analysis(figures={"figs7": figure}, tables={"figs7": table}, numbers=numbers, verdict=verdict,
                        verdicts=verdicts, **fields)

    def regime(self, scale: str, dataset: str | None) -> Regime | None:
        return _regime(4.0, dataset, self.medium[0], self.medium[1], "AutoAugment, as the paper's Fig. S.7") \
            if scale == "medium" else None
