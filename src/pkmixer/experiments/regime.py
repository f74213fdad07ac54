"""The regime of a claim: the quantities its mechanism names, checked from the run configs before training.

A claim of Hayase & Karakida holds, if at all, in the regime its mechanism describes: Fig. 4's SW-MLP is worse than
the Mixer "for too-wide cases around γm = 8000" (density 1/64), Fig. 7's RP S-Mixers catch up at S = C = 128 with 4
to 20 blocks. A preset declares that regime (:class:`Regime`): each :class:`Quantity` with the paper's value, how it
is measured on the preset's runs (a function of their :class:`~pkmixer.experiments.sweep.RunSpec` list: configs and
meta, no training) and a stated tolerance; and the departures it does not check but lists (the data set, the epochs,
the augmentation). :func:`check` compares; a claim whose regime is not reached is decided **out of regime**
(:data:`pkmixer.experiments.rules.OUT_OF_REGIME`), whatever its statistics say. ``pkmixer reproduce NAME --scale
medium --check-regime`` prints the check without training.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("factor", "at_least", "at_most")


@dataclass(frozen=True)
class Quantity:
    """One quantity the claim's mechanism names.

    ``kind`` "factor": reached when ours lies within a factor ``tolerance`` of the paper's (both ways);
    "at_least" / "at_most": when ours is at least / at most ``tolerance`` × the paper's value."""

    name: str
    paper: float
    measure: Callable[[Sequence[Any]], float]  # from the preset's RunSpecs
    tolerance: float = 2.0
    kind: str = "factor"
    why: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")

    def reached(self, ours: float) -> bool:
        if self.kind == "at_least":
            return ours >= self.tolerance * self.paper
        if self.kind == "at_most":
            return ours <= self.tolerance * self.paper
        return self.paper / self.tolerance <= ours <= self.paper * self.tolerance

    def band(self) -> str:
        if self.kind == "at_least":
            return f"≥ {_g(self.tolerance * self.paper)}"
        if self.kind == "at_most":
            return f"≤ {_g(self.tolerance * self.paper)}"
        return f"within ×{self.tolerance:g} ({_g(self.paper / self.tolerance)} to {_g(self.paper * self.tolerance)})"


def _g(value: float) -> str:
    return f"{value:.3g}"


@dataclass(frozen=True)
class Regime:
    """The quantities a claim's mechanism names, and the departures listed beside them."""

    quantities: tuple[Quantity, ...] = ()
    departures: tuple[str, ...] = ()


@dataclass(frozen=True)
class RegimeCheck:
    """The check of a :class:`Regime` on a preset's runs: one row per quantity (name, paper, ours, band, reached)."""

    rows: tuple[dict, ...] = ()
    departures: tuple[str, ...] = ()
    note: str = ""  # e.g. why a scale has no regime to check

    @property
    def reached(self) -> bool:
        return all(r["reached"] for r in self.rows)

    def reason(self) -> str:
        missed = [r for r in self.rows if not r["reached"]]
        return "; ".join(f"{r['quantity']} is {_g(r['ours'])} here, the claim's {_g(r['paper'])} "
                         f"(needs {r['band']})" for r in missed)

    def lines(self) -> list[str]:
        """What ``--check-regime`` prints and the report lists."""
        out = [f"- {r['quantity']}: paper {_g(r['paper'])}, here {_g(r['ours'])} - needs {r['band']}: "
               f"{'reached' if r['reached'] else 'NOT reached'}" + (f" ({r['why']})" if r["why"] else "")
               for r in self.rows]
        out += [f"- departure: {d}" for d in self.departures]
        if self.note:
            out.append(f"- {self.note}")
        out.append("Regime " + ("reached" if self.reached else "not reached: out of regime") + ".")
        return out


def check(regime: Regime | None, specs: Sequence[Any]) -> RegimeCheck:
    """``regime`` measured on ``specs`` (a preset's runs at one scale); an empty check (reached) without one."""
    if regime is None:
        return RegimeCheck(note="no regime declared for this scale")
    rows = []
    for q in regime.quantities:
        ours = float(q.measure(specs))
        rows.append({"quantity": q.name, "paper": q.paper, "ours": ours, "band": q.band(), "reached": q.reached(ours),
                     "why": q.why})
    return RegimeCheck(tuple(rows), tuple(regime.departures))


# ---- measures of a sweep, from its RunSpecs ------------------------------------------------------------------


def spec_values(specs: Sequence[Any], key: str, **where: Any) -> list[Any]:
    """``meta[key]`` of the specs whose meta matches ``where`` (the epoch-doubling runs left out)."""
    return [s.meta.get(key) for s in specs if not s.meta.get("doubles")
            and all(s.meta.get(k) == v for k, v in where.items()) and s.meta.get(key) is not None]


def widest(key: str = "width", **where: Any) -> Callable[[Sequence[Any]], float]:
    return lambda specs: float(max(spec_values(specs, key, **where)))


def narrowest(key: str = "width", **where: Any) -> Callable[[Sequence[Any]], float]:
    return lambda specs: float(min(spec_values(specs, key, **where)))


def ratio(key: str = "width", **where: Any) -> Callable[[Sequence[Any]], float]:
    """The largest over the smallest ``meta[key]``."""
    return lambda specs: float(max(spec_values(specs, key, **where)) / min(spec_values(specs, key, **where)))


def config_value(path: str) -> Callable[[Sequence[Any]], float]:
    """A config value (dotted, e.g. ``model.depth``) of the first run (the epoch-doubling runs left out)."""
    def measure(specs: Sequence[Any]) -> float:
        spec = next(s for s in specs if not s.meta.get("doubles"))
        section, _, key = path.partition(".")
        part = getattr(spec.config, section)
        return float(part.options[key] if section == "model" else getattr(part, key))
    return measure


def constant(value: float) -> Callable[[Sequence[Any]], float]:
    """A quantity fixed by the design's geometry rather than a meta column."""
    return lambda specs: float(value)


@dataclass(frozen=True)
class Departures:
    """The usual departures of a CPU scale from the paper's experiment, said in words."""

    dataset: str
    epochs: str
    augmentation: str = ""
    more: tuple[str, ...] = field(default_factory=tuple)

    def lines(self) -> tuple[str, ...]:
        out = [f"data set: {self.dataset}", f"epochs: {self.epochs}"]
        if self.augmentation:
            out.append(f"augmentation: {self.augmentation}")
        return tuple(out) + tuple(self.more)
