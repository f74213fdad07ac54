"""Naming and creation: ``create_model(name, **overrides)``, ``list_models()``, ``model_entry(name)``.

Each entry is a model class plus its defaults (the entries themselves: :mod:`pkmixer.models.zoo`); overrides are
checked against the class's arguments, and unknown names are answered with the closest known ones.

Names follow one grammar (:data:`NAME_GRAMMAR`, docs/models.md "Names"):
``[rp_]<family>[_<variant>]_<size><patch>_<img>`` - e.g. ``mixer_b16_224`` (timm's names for the Mixers of
Tolstikhin et al.), ``rp_smixer_c64p4_32`` - or ``shallow_<weights>_<img>``. A name may carry a tag of weights,
``name.tag`` as timm writes it (``mixer_b16_224.goog_in21k_ft_in1k``). Names of earlier versions are aliases
(:func:`list_aliases`, :mod:`pkmixer.models.spellings`): ``create_model`` warns once per alias, and
``model.spec.name`` is the name the model was asked for.

A class whose arguments take objects (the Mixer's ``token_mixing`` factories) may have a plain spelling of them
(:func:`register_spelling`): ``create_model`` accepts it, and records every model's arguments in it
(``model.spec``, and so checkpoints), so that files hold plain values only.

Every build runs under the build budget (:mod:`pkmixer.models.budget`). ``pretrained=`` loads weights as users
get them (:mod:`pkmixer.models.weights`): a weights file or folder, or weights on the Hugging Face hub by timm's
names.
"""
from __future__ import annotations

import fnmatch
import inspect
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ..errors import ConfigError, unknown_name
from .budget import MAX_DEPTH, BuildBudget
from .timm_api import paper_fields
from .weights import find_weights, load_weights

TIMM_PREFIX = "pkmixer_"


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`create_model` was asked for; kept on the model as ``model.spec`` (checkpoints use it).
    ``arguments`` are every constructor argument it resolved to (registry defaults, the class's own defaults
    and the overrides, in their plain spelling): checkpoints record them, so that editing a registry default
    never changes what an old checkpoint means. Two specs are equal when name and overrides are."""

    name: str
    overrides: dict[str, Any]
    arguments: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Spelling:
    """A class's plain spelling of arguments that take objects: the keywords, the map to the class's arguments
    (``to_arguments(kwargs) -> kwargs``) and back (``to_plain(arguments) -> arguments``)."""

    options: tuple[str, ...]
    to_arguments: Callable[[dict[str, Any]], dict[str, Any]]
    to_plain: Callable[[dict[str, Any]], dict[str, Any]]


_SPELLINGS: dict[type, Spelling] = {}


def register_spelling(cls: type, options: tuple[str, ...], to_arguments: Callable[[dict[str, Any]], dict[str, Any]],
                      to_plain: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Give ``cls`` a plain spelling (see :class:`Spelling`)."""
    _SPELLINGS[cls] = Spelling(tuple(options), to_arguments, to_plain)


def spelling(cls: type) -> Spelling:
    """The plain spelling of ``cls`` (none: the arguments are already plain)."""
    return _SPELLINGS.get(cls, Spelling((), dict, dict))


# the papers an entry's source names (keys of pkmixer.models.timm_api.PAPERS); pkmixer's own small models are
# Hayase & Karakida's families
_PAPER_NAMES = {"tolstikhin": "Tolstikhin", "hayase": "Hayase"}


@dataclass(frozen=True)
class ModelEntry:
    name: str  # the name it was looked up by: the canonical name or one of its aliases
    cls: type[nn.Module]
    defaults: dict[str, Any]
    description: str
    source: str  # where in the papers the configuration comes from
    tags: tuple[str, ...] = field(default=())
    data_set: str | None = None  # the data set it is meant for (its normalisation in the timm pretrained_cfg)
    canonical: str = ""  # the registered name (as list_models() lists it); "" means ``name``

    def __post_init__(self) -> None:
        if not self.canonical:
            object.__setattr__(self, "canonical", self.name)

    def accepted(self) -> list[str]:
        """The class's arguments, and the plain spellings it translates (:func:`register_spelling`)."""
        params = [p for p in inspect.signature(self.cls.__init__).parameters if p != "self"]
        return [*params, *spelling(self.cls).options]

    @property
    def papers(self) -> tuple[str, ...]:
        """The papers ``source`` names (Hayase & Karakida's for pkmixer's own configurations)."""
        return tuple(key for key, word in _PAPER_NAMES.items() if word in self.source) or ("hayase",)

    def cfg_fields(self) -> dict[str, Any]:
        """The keys of timm's pretrained cfg that the entry gives: its name in timm, description and papers."""
        return {"architecture": TIMM_PREFIX + self.canonical, "description": self.description,
                **paper_fields(*self.papers)}


@dataclass(frozen=True)
class Alias:
    name: str  # the canonical name
    kept_until: str  # the release up to which the alias stays


_REGISTRY: dict[str, ModelEntry] = {}
_ALIASES: dict[str, Alias] = {}  # an earlier name -> the canonical name
_WARNED: set[str] = set()  # the aliases create_model has warned about in this process

# the grammar of canonical names (docs/models.md, "Names"): [rp_]<family>[_<variant>]_<size><patch>_<img>, where
# <size> is a letter code or a number with its letter (c: S = C; m: SW-MLP width) and optional d<depth>, then p
SIZE_CODES = ("s", "b", "l", "h", "ss", "ssw", "bw", "t")
NAME_GRAMMAR = re.compile(
    r"(?:(?P<rp>rp_)?(?P<family>mixer|smixer|swmlp)(?:_(?P<variant>untied|grouped|views|pyramid))?"
    r"_(?:(?P<code>" + "|".join(sorted(SIZE_CODES, key=len, reverse=True)) + r")"
    r"|(?P<qty>[cm])(?P<number>\d+)(?:d(?P<depth>\d+))?p)(?P<patch>\d+)"
    r"|(?P<shallow>shallow)_(?P<weights>dense|kronecker|monarch))_(?P<img>\d+)")


def register(name: str, cls: type[nn.Module], description: str, source: str, *, data_set: str | None = None,
             **defaults: Any) -> None:
    """Register ``name`` (it must follow :data:`NAME_GRAMMAR`)."""
    if not NAME_GRAMMAR.fullmatch(name):
        raise ValueError(f"model name {name!r} does not follow the naming grammar (docs/models.md)")
    if name in _REGISTRY or name in _ALIASES:
        raise ValueError(f"model {name!r} registered twice")
    _REGISTRY[name] = ModelEntry(name, cls, defaults, description, source, data_set=data_set)


def register_alias(alias: str, name: str, *, kept_until: str) -> None:
    """Make ``alias`` (a name of an earlier version) build the registered model ``name`` until release
    ``kept_until``."""
    if name not in _REGISTRY:
        raise ValueError(f"alias {alias!r} of unregistered model {name!r}")
    if alias in _REGISTRY or alias in _ALIASES:
        raise ValueError(f"model {alias!r} registered twice")
    _ALIASES[alias] = Alias(name, kept_until)


def list_models(pattern: str | None = None) -> list[str]:
    """Canonical names, optionally filtered by a shell-style pattern such as ``"*smixer*"`` (aliases:
    :func:`list_aliases`)."""
    names = sorted(_REGISTRY)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def list_aliases(pattern: str | None = None) -> dict[str, str]:
    """Aliases (earlier names) and the canonical name each stands for, sorted, optionally filtered by a
    shell-style pattern on the alias."""
    return {a: _ALIASES[a].name for a in sorted(_ALIASES) if pattern is None or fnmatch.fnmatch(a, pattern)}


def alias_kept_until(alias: str) -> str:
    """The release up to which an alias stays."""
    return _ALIASES[alias].kept_until


def split_tag(name: str) -> tuple[str, str | None]:
    """``"mixer_b16_224.goog_in21k"`` -> (``"mixer_b16_224"``, ``"goog_in21k"``), timm's ``name.tag``; a
    ``pkmixer_`` prefix is dropped."""
    name = name[len(TIMM_PREFIX):] if name.startswith(TIMM_PREFIX) else name
    base, _, tag = name.partition(".")
    return base, tag or None


def canonical_name(name: str) -> str:
    """The canonical name of a registered name or alias (a ``pkmixer_`` prefix is dropped)."""
    return model_entry(name).canonical


def model_entry(name: str) -> ModelEntry:
    """The entry of a canonical name or an alias; an alias's entry has ``name`` the alias and ``canonical`` the
    registered name."""
    key = name[len(TIMM_PREFIX):] if name.startswith(TIMM_PREFIX) else name
    if key in _REGISTRY:
        return _REGISTRY[key]
    if key in _ALIASES:
        return replace(_REGISTRY[_ALIASES[key].name], name=key)
    raise unknown_name("model", name, [*_REGISTRY, *_ALIASES])


def warn_alias(name: str, stacklevel: int = 3) -> None:
    """A FutureWarning, once per process and alias, that ``name`` is an earlier name and until when it stays."""
    key = name[len(TIMM_PREFIX):] if name.startswith(TIMM_PREFIX) else name
    if key in _ALIASES and key not in _WARNED:
        _WARNED.add(key)
        alias = _ALIASES[key]
        warnings.warn(f"model name {key!r} is deprecated: use {alias.name!r}, the same model; {key!r} stays until "
                      f"pkmixer {alias.kept_until}", FutureWarning, stacklevel=stacklevel)


def create_model(name: str, pretrained: bool | str | os.PathLike = False, **overrides: Any) -> nn.Module:
    """Build a registered model (a canonical name, an alias, optionally with timm's ``.tag`` of weights);
    ``overrides`` replace its defaults (e.g. ``num_classes=10, rp_blocks="all"``). ``num_classes=0`` gives timm's
    headless model (``nn.Identity`` head).

    ``pretrained`` loads weights (:mod:`pkmixer.models.weights`): ``True`` the hub weights of timm's name and tag
    (Google's Mixers, e.g. ``"mixer_b16_224.goog_in21k_ft_in1k"``, from the local Hugging Face cache when there);
    a path, a safetensors weights file or a folder as ``save_pretrained`` writes it; ``"hf-hub:<repo>"`` such a
    folder on the hub. What the weights were saved with are defaults under ``overrides``; a different
    ``num_classes`` gives a new head (the model's initialisation) and keeps every other weight.

    A class with a plain spelling (:func:`register_spelling`) also takes it, and ``model.spec`` (and so a
    checkpoint) records every argument in it."""
    base, tag = split_tag(name)
    warn_alias(base)
    classes = overrides.get("num_classes")
    if classes == 0 and not isinstance(classes, bool):
        model = _create(base, tag, pretrained, {k: v for k, v in overrides.items() if k != "num_classes"})
        model.reset_classifier(0)  # records num_classes=0 in model.spec
        return model
    return _create(base, tag, pretrained, overrides)


def _create(name: str, tag: str | None, pretrained: Any, overrides: dict[str, Any]) -> nn.Module:
    entry = model_entry(name)
    if pretrained is False or pretrained is None:
        weights, model = None, build(entry, overrides)
    else:
        weights = find_weights(entry.canonical, tag, pretrained)
        if weights.model is not None and model_entry(weights.model).canonical != entry.canonical:
            raise ConfigError(f"{weights.where} holds weights of {weights.model}, not {name}")
        model = build(entry, {**weights.arguments, **overrides})  # every argument they were saved with
        model.spec = replace(model.spec, overrides=spelling(entry.cls).to_plain({**weights.overrides, **overrides}))
    if hasattr(model, "pretrained_cfg"):  # timm's conventions (pkmixer.models.timm_api)
        model.pretrained_cfg = entry.cfg_fields()  # the registry's name, description and papers
        if tag is not None:
            model.pretrained_cfg = {"tag": tag}
    if weights is not None:
        load_weights(model, weights)
    return model


def build(entry: ModelEntry, overrides: dict[str, Any]) -> nn.Module:
    """The model of ``entry`` with ``overrides``, built under the build budget; ``model.spec`` records them."""
    accepted = entry.accepted()
    for key in overrides:
        if key not in accepted:
            raise unknown_name(f"option for {entry.name}", key, accepted)
    defaults = {k: v for k, v in entry.defaults.items()
                if not any(k in _SUPERSEDES.get(o, ()) for o in overrides)}
    what = entry.name + (f"({', '.join(f'{k}={v!r}' for k, v in overrides.items())})" if overrides else "")
    plain = spelling(entry.cls)
    kwargs = plain.to_arguments({**defaults, **overrides})
    depth = kwargs.get("depth")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > MAX_DEPTH:
        raise ConfigError(f"depth={depth} is more blocks than pkmixer builds (at most {MAX_DEPTH}; the paper's "
                          "deepest model has 32)")
    try:
        with BuildBudget(what) as budget:
            budget.precheck(entry.cls, kwargs)
            model = entry.cls(**kwargs)
    except (OverflowError, MemoryError) as err:
        raise ConfigError(f"{what} cannot be built: its sizes are too large ({type(err).__name__})") from None
    except (RuntimeError, TypeError) as err:  # torch: "Storage size calculation overflowed", "can't allocate"
        text = str(err).lower()
        if not any(word in text for word in ("overflow", "allocate", "out of memory")):
            raise
        raise ConfigError(f"{what} cannot be built: its sizes are too large ({str(err).splitlines()[0][:120]})") \
            from None
    own = {k: p.default for k, p in inspect.signature(entry.cls.__init__).parameters.items()
           if k != "self" and p.default is not inspect.Parameter.empty}
    # every argument as resolved: the plain options already turned into the objects they stand for (kwargs)
    model.spec = ModelSpec(entry.name, plain.to_plain(dict(overrides)), plain.to_plain({**own, **kwargs}))
    if entry.data_set is not None and hasattr(model, "data_set"):
        model.data_set = entry.data_set
    return model


# an override of the key replaces these defaults of an entry (e.g. γ instead of Table 1's hidden widths)
_SUPERSEDES = {"mlp_ratio": ("token_hidden", "channel_hidden")}
