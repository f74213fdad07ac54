"""How often a rule errs: simulated experiments at the boundary where the claim stops holding, and its power.

A rule of :mod:`pkmixer.experiments.rules` is decided on a table of seeds × arms. :func:`simulate` draws thousands
of such tables - true arm means plus run-to-run noise - and decides each with the rule's own code
(:func:`pkmixer.experiments.rules.evaluate`, vectorised), so that its false-supported and false-contradicted rates
can be read at the boundary of the claim (|Δ| = X for "within X", a flat line for a trend, the optimum at the
tolerance's edge and all arms tied for "around") and its power at the paper's effect (:func:`power`).

The noise: :data:`RESIDUALS` resamples the residuals of real runs - each run's test error minus its arm's mean
over seeds, inflated by √(N/(N − arms)) for the means removed - from the one per-seed table of paired runs the
repository holds in text, table1's medium runs (5 seeds × 2 models, Fashion-MNIST, 10 epochs; listed as
:data:`TABLE1_MEDIUM`, from docs/reproduction.md's historical section). Their standard deviation is about 0.25
points and they are not positively correlated within a seed, so the simulated runs are independent across arms
(pairing gains nothing, the conservative case). :meth:`NoiseModel.scaled` gives the same shape at another scale
(a loss, a CKA); :func:`gaussian` is the stated alternative where no residuals apply.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .rules import ArmRule, evaluate
from .stats import holm

# table1 at medium scale (the earlier 10-epoch design), test error in % per seed 0-4: Mixer-SS/7, Mixer-SS-W/4
TABLE1_MEDIUM = ((10.89, 11.06, 10.85, 10.52, 11.13), (10.74, 10.24, 10.95, 10.63, 10.68))


@dataclass(frozen=True)
class NoiseModel:
    """Run-to-run noise of one run's statistic: a pool of residuals drawn with replacement, or N(0, sd²)."""

    residuals: tuple[float, ...] = ()
    sd: float = 0.0
    source: str = ""

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        if self.residuals:
            pool = np.asarray(self.residuals, dtype=np.float64)
            return pool[rng.integers(0, pool.size, size=shape)]
        return rng.normal(0.0, self.sd, size=shape)

    @property
    def spread(self) -> float:
        """The standard deviation of one draw."""
        return float(np.sqrt(np.mean(np.square(self.residuals)))) if self.residuals else self.sd

    def scaled(self, sd: float) -> NoiseModel:
        """The same shape with standard deviation ``sd`` (e.g. a loss's or a CKA's run-to-run spread)."""
        factor = sd / self.spread
        return NoiseModel(tuple(r * factor for r in self.residuals), self.sd * factor, f"{self.source}, scaled to {sd:g}")


def residual_model(arms: Sequence[Sequence[float]], scale: float = 0.01, source: str = "") -> NoiseModel:
    """Residuals of per-seed values (one sequence per arm, in units of ``scale``: 0.01 for errors in %) about each
    arm's mean, inflated by √(N/(N − arms))."""
    values = [np.asarray(a, dtype=np.float64) * scale for a in arms]
    residuals = np.concatenate([v - v.mean() for v in values])
    inflate = np.sqrt(residuals.size / (residuals.size - len(values)))
    return NoiseModel(tuple(float(r) for r in residuals * inflate), source=source)


RESIDUALS = residual_model(TABLE1_MEDIUM, source="residuals of table1's 10 medium runs (Fashion-MNIST, 5 seeds)")


def gaussian(sd: float) -> NoiseModel:
    return NoiseModel(sd=sd, source=f"stated: N(0, {sd:g}²) per run")


def simulate_data(means: Sequence[float], seeds: int, experiments: int, noise: NoiseModel = RESIDUALS,
                  seed: int = 0) -> np.ndarray:
    """Simulated tables (experiments, seeds, arms): the true arm ``means`` plus independent noise per run."""
    rng = np.random.default_rng(seed)
    mu = np.asarray(means, dtype=np.float64)
    return mu + noise.draw(rng, (experiments, seeds, mu.size))


def simulate(rule: ArmRule, means: Sequence[float], seeds: int = 5, experiments: int = 2000,
             noise: NoiseModel = RESIDUALS, seed: int = 0) -> dict[str, float]:
    """The rates at which ``rule`` says supported, contradicted and undecided on ``experiments`` simulated tables
    with true arm ``means``; ``mc_error``: the Monte-Carlo standard error of a rate of 5 %."""
    result = evaluate(rule, simulate_data(means, seeds, experiments, noise, seed), seed=seed + 1)
    code = result["code"]
    return {"supported": float(np.mean(code == 1)), "contradicted": float(np.mean(code == -1)),
            "undecided": float(np.mean(code == 0)), "experiments": experiments,
            "mc_error": float(np.sqrt(0.05 * 0.95 / experiments))}


def simulate_claim(parts: Sequence[tuple[ArmRule, Sequence[float]]], seeds: int = 5, experiments: int = 2000,
                   noise: NoiseModel = RESIDUALS, seed: int = 0, required: Sequence[bool] | None = None
                   ) -> dict[str, float]:
    """Rates for a claim of several parts, each (rule, true arm means) on a simulated table (shared by the parts
    with the same means, drawn independently otherwise): contradicted
    when Holm's procedure across the parts rejects one (at (1 − level)/2), supported when every required part is."""
    required = list(required) if required is not None else [True] * len(parts)
    codes, ps, tables = [], [], {}
    for k, (rule, means) in enumerate(parts):
        key = tuple(float(m) for m in means)  # parts with the same arms are decided on the same simulated runs
        if key not in tables:
            tables[key] = simulate_data(means, seeds, experiments, noise, seed + 10 * len(tables))
        result = evaluate(rule, tables[key], seed=seed + 10 * k + 1)
        codes.append(result["code"])
        ps.append(result["p_against"])
    codes, ps = np.stack(codes, 1), np.stack(ps, 1)
    alpha = (1 - parts[0][0].level) / 2
    contradicted = np.array([any(holm([p if parts[j][0].claim != "inside" else None for j, p in enumerate(row)],
                                      alpha)) for row in ps])
    supported = np.all(codes[:, required] == 1, axis=1) & ~contradicted
    return {"supported": float(np.mean(supported)), "contradicted": float(np.mean(contradicted)),
            "experiments": experiments, "mc_error": float(np.sqrt(0.05 * 0.95 / experiments))}


def power(rule: ArmRule, means: Sequence[float], seeds: int = 5, experiments: int = 1000,
          noise: NoiseModel = RESIDUALS, seed: int = 0) -> float:
    """How often ``rule`` says supported when the true arm means are ``means`` (the paper's effect)."""
    return simulate(rule, means, seeds, experiments, noise, seed)["supported"]
