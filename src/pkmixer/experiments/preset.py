"""Experiment presets: one per figure or table of Hayase & Karakida (2024) and the MLP-Mixer supplementary.

A preset states the paper's claim and where it comes from, lists the runs of its sweep at each of its scales and
turns the finished runs into figures, tables, key numbers and a verdict computed from the data:

* ``paper``: the seed's own settings (Ω, (C, S) pairs, depth, optimiser, epochs, seeds, data set; App. C,
  Table S.2) - GPU hours to days;
* ``medium``: the same question sized to decide on a CPU (a whole data set, models trained until doubling the
  epochs no longer moves them, 5 paired seeds) - at most 2 hours on 2 cores; only presets that list it in
  :attr:`Preset.scales` have it so far;
* ``small``: the quick look (smaller Ω and data, fewer epochs) - minutes; it may say "undecided";
* ``smoke``: seconds, for the test suite.

Presets live in :mod:`pkmixer.experiments.presets`, one module per figure or table, each a subclass of
:class:`Preset` registered with :func:`register_preset`. ``pkmixer reproduce NAME`` runs a preset's sweep
(:func:`pkmixer.experiments.sweep.run_sweep`) and renders its :class:`Analysis`
(:func:`pkmixer.experiments.report.write_report`); ``pkmixer reproduce --list`` lists them.

Seeds: a preset that draws its seeds with :meth:`Preset.seed_list` honours ``--seeds N`` (the CLI sets
:attr:`Preset.seeds_override` through :meth:`Preset.with_seeds`); :meth:`Preset.seeded` builds one
:class:`~pkmixer.experiments.sweep.RunSpec` per seed, named ``<name>-s<seed>``, with ``run.seed`` and
``meta["seed"]`` set.

Also: ``Preset.default_dataset(scale)`` (the
default data set may differ per scale through ``scale_datasets``, e.g. Fashion-MNIST at small scale), ``check_scale``/``check_dataset``,
``default_seeds``/``with_seeds``/``seed_list``/``seeded`` (``--seeds``), ``describe`` (``--list``);
``allowed_datasets`` and :meth:`Preset.build` (:meth:`Preset.runs` checks the data set once, then builds);
``run_sweep(..., threads=None, info=None)`` (torch threads per run; what sweep.json records for
``pkmixer report``). A scale's default data set that is absent on the machine is only replaced (by the bundled
digits, said in a line) for Fashion-MNIST, in :func:`pkmixer.experiments.reproduce.preset_runs`.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..errors import ConfigError, check_positive_int, unknown_name
from ..train.config import TrainConfig
from .sweep import RunSpec

SCALES = ("paper", "medium", "small", "smoke")


@dataclass
class Analysis:
    """What a preset makes of its finished runs; :func:`pkmixer.experiments.report.write_report` saves it."""

    figures: dict[str, Figure] = field(default_factory=dict)  # stem -> figure: <out>/<stem>.png and .svg
    tables: dict[str, list[dict]] = field(default_factory=dict)  # stem -> rows: <out>/<stem>.csv
    numbers: dict[str, Any] = field(default_factory=dict)  # key numbers; {"mean", "std", "n"} dicts print as mean ± std
    verdict: str = ""  # one or two sentences computed from the data
    supported: bool | None = None  # does this run support the paper's claim (None: undecidable, e.g. smoke)
    verdicts: list = field(default_factory=list)  # pkmixer.experiments.stats.Verdict per part of the claim
    outcome: str = ""  # pkmixer.experiments.rules.OUTCOMES: supported ... not testable here
    reason: str = ""  # why the outcome is out of regime, not converged or not testable
    regime: list = field(default_factory=list)  # the regime check's lines (pkmixer.experiments.regime)
    decided_on: str = ""  # which error the verdict reads, and why
    data_set: str = ""  # "This verdict rests on one data set: ..."


class Preset(ABC):
    """One figure or table of the paper as a sweep and its analysis (see the module docstring)."""

    name: str = ""  # e.g. "fig5": the CLI's NAME
    title: str = ""  # e.g. "S-Mixer, RP S-Mixer and SW-MLP against effective width"
    claim: str = ""  # the paper's claim, one or two sentences
    source: str = ""  # e.g. "Hayase & Karakida Fig. 5, App. C.4"
    datasets: tuple[str, ...] = ()  # data sets accepted by runs(); the first is the default
    scale_datasets: dict[str, str] = {}  # the default data set per scale, where it is not datasets[0]
    allowed_datasets: dict[str, tuple[str, ...]] = {}  # the data sets a scale accepts, where not all of datasets
    scales: tuple[str, ...] = ("paper", "small", "smoke")  # the scales of SCALES this preset defines
    default_seeds: dict[str, int] = {"paper": 3, "medium": 5, "small": 2, "smoke": 1}  # seeds per scale (seed_list)
    seeds_override: int | None = None  # set by with_seeds (--seeds N)
    # which test error a verdict reads: "final_test_error" (the paper's protocol: the error after the whole
    # schedule; App. C describes no model selection) or "selected_test_error" (at the validation-selected epoch)
    decided_on: str = "final_test_error"
    decided_on_why: str = ("the paper reports the test error after its whole cosine schedule and describes no model "
                           "selection (App. C); the validation-selected error is reported beside it")
    quotes: tuple = ()  # the paper's words this preset tests (Quote), where its module holds another preset's too
    rule_names: tuple[str, ...] = ()  # the module constants that are this preset's rules, where its module is shared
    testable: bool = True  # False: no run of this repository can decide the claim (existential, other data sets)
    untestable_reason: str = ""

    def derive(self, rows: list[dict], sweep_dir: Path) -> dict[str, dict]:
        """Run name -> numbers to add to that run's row (and record) that need files a record does not keep - other
        runs' arrays in ``sweep_dir`` - computed once every run has finished; {} here. Each row has its record
        ``key`` (:func:`pkmixer.experiments.records.run_key`), so that a number that pairs two runs can name its
        partner's, and an analysis can refuse a pairing with a run that has since changed."""
        return {}

    def regime(self, scale: str, dataset: str | None):
        """The claim's regime at ``scale`` (:class:`pkmixer.experiments.regime.Regime`), None where none is
        declared (paper scale is the claim's own regime)."""
        return None

    def regime_check(self, scale: str, dataset: str | None):
        """:func:`pkmixer.experiments.regime.check` of :meth:`regime` on this scale's runs (no training)."""
        from .regime import check

        regime = self.regime(scale, dataset)
        return check(regime, self.runs(scale, dataset) if regime is not None else [])

    def rules(self) -> list:
        """The rules and quotes that decide this preset: the module constants of its module that are rules
        (:class:`~pkmixer.experiments.stats.Rule`, :class:`~pkmixer.experiments.rules.ArmRule`, ``TrendRules``,
        ``AroundRules``, ``AlikeRules``) or :class:`~pkmixer.experiments.rules.Quote`, by name."""
        import sys

        from .rules import AlikeRules, AroundRules, ArmRule, Quote, TrendRules
        from .stats import Rule

        module = sys.modules[type(self).__module__]
        kinds = (Rule, ArmRule, TrendRules, AroundRules, AlikeRules)
        rules = [value for name, value in sorted(vars(module).items()) if isinstance(value, kinds)
                 and (not self.rule_names or name in self.rule_names)]
        quotes = list(self.quotes) or [value for _, value in sorted(vars(module).items()) if isinstance(value, Quote)]
        return rules + quotes

    def rules_hash(self) -> str:
        """A hash of :meth:`rules`: recorded with the results they decided."""
        from .rules import rules_fingerprint

        return rules_fingerprint(self.rules())

    def runs(self, scale: str, dataset: str | None) -> list[RunSpec]:
        """The sweep at ``scale`` on ``dataset`` (None: the scale's default); [] for analysis-only presets.

        The data set is checked here, once, against ``datasets`` and ``allowed_datasets`` (:meth:`check_dataset`),
        before :meth:`build` makes anything."""
        return self.build(scale, self.check_dataset(scale, dataset))

    @abstractmethod
    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        """The runs at ``scale`` on ``dataset``, already checked (None only for presets with no data set)."""

    @abstractmethod
    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        """Figures, tables, numbers and the verdict from the sweep's rows (and, if needed, its run dirs): a
        function of the rows (their meta, results, per-epoch ``curve`` and probe columns), which neither trains nor
        reads run directories - except that fig2 reads the Gram matrices its runs stored (the ``grams`` probe) and
        tables3 times training steps."""

    # ---- helpers for subclasses and the CLI ----------------------------------------------------------
    def default_dataset(self, scale: str) -> str | None:
        """The data set used when none is given: ``scale_datasets[scale]``, else the first of ``datasets``."""
        self.check_scale(scale)
        return self.scale_datasets.get(scale, self.datasets[0] if self.datasets else None)

    def check_scale(self, scale: str) -> str:
        if scale not in SCALES:
            raise unknown_name("scale", str(scale), SCALES)
        if scale not in self.scales:
            raise ConfigError(f"preset {self.name} has no {scale} scale yet; its scales are {', '.join(self.scales)}")
        return scale

    def check_dataset(self, scale: str, dataset: str | None) -> str | None:
        """``dataset`` if this preset accepts it at ``scale`` (one of ``datasets`` and, where the scale has an
        entry in ``allowed_datasets``, one of those), the scale's default for None, else a ConfigError."""
        self.check_scale(scale)
        if dataset is None:
            return self.default_dataset(scale)
        if dataset not in self.datasets:
            if not self.datasets:
                raise ConfigError(f"preset {self.name} uses no data set; drop --dataset")
            raise unknown_name(f"data set for preset {self.name}", dataset, self.datasets)
        allowed = self.allowed_datasets.get(scale, self.datasets)
        if dataset not in allowed:
            raise ConfigError(f"preset {self.name} at scale {scale} runs on {', '.join(allowed)}, not {dataset}")
        return dataset

    def with_seeds(self, seeds: int | None) -> Preset:
        """A copy whose :meth:`seed_list` has ``seeds`` entries (None: the scale's default)."""
        clone = copy.copy(self)
        clone.seeds_override = None if seeds is None else check_positive_int("--seeds", seeds)
        return clone

    def seed_list(self, scale: str) -> list[int]:
        """Seeds 0..n-1, n = --seeds when given, else ``default_seeds[scale]``."""
        n = self.seeds_override if self.seeds_override is not None else self.default_seeds[self.check_scale(scale)]
        return list(range(n))

    def seeded(self, name: str, config: TrainConfig, meta: dict[str, Any], scale: str,
               probes: tuple[str, ...] = ()) -> list[RunSpec]:
        """One RunSpec per seed of :meth:`seed_list`: ``<name>-s<seed>`` with run.seed and meta["seed"] set."""
        return [RunSpec(f"{name}-s{seed}", config.override({"run.seed": seed}), {**meta, "seed": seed}, probes)
                for seed in self.seed_list(scale)]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "claim": self.claim, "source": self.source,
                "datasets": list(self.datasets), "decided_on": self.decided_on}


_PRESETS: dict[str, Preset] = {}


def register_preset(cls: type[Preset]) -> type[Preset]:
    """Class decorator: register one instance of ``cls`` under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"preset class {cls.__name__} has no name")
    if cls.name in _PRESETS:
        raise ValueError(f"preset {cls.name!r} registered twice")
    _PRESETS[cls.name] = cls()
    return cls


def _load_presets() -> None:
    from . import presets  # noqa: F401  (importing registers every preset module)


def get_preset(name: str) -> Preset:
    """The registered preset ``name``; unknown names raise a ConfigError with the closest names."""
    _load_presets()
    if name not in _PRESETS:
        raise unknown_name("preset", name, _PRESETS)
    return _PRESETS[name]


def list_presets() -> list[Preset]:
    """Every registered preset, sorted by name."""
    _load_presets()
    return [_PRESETS[k] for k in sorted(_PRESETS)]


def seeds_in(specs: Iterable[RunSpec]) -> set:
    """The distinct ``meta["seed"]`` values of a sweep (to check that --seeds took effect)."""
    return {spec.meta.get("seed") for spec in specs}
