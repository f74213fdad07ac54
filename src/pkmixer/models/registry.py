"""The model zoo: ``create_model(name, **overrides)``, ``list_models()``, and the same entries in timm's
registry as ``timm.create_model("pkmixer_<name>")``.

Each entry is a model class plus its defaults; overrides are checked against the class's arguments, and
unknown names are answered with the closest known ones.

Names follow one grammar (:data:`NAME_GRAMMAR`, docs/models.md "Names"):
``[rp_]<family>[_<variant>]_<size><patch>_<img>`` - e.g. ``mixer_b16_224`` (timm's names for the Mixers of
Tolstikhin et al.), ``rp_smixer_c64p4_32`` - or ``shallow_<weights>_<img>``. Names of earlier versions are
aliases (:func:`list_aliases`): ``create_model``, ``model_entry``, timm and checkpoints that record them keep
working, and ``model.spec.name`` is the name the model was asked for.

Every entry names the data set it is meant for; the model's timm ``pretrained_cfg`` carries that data set's
normalisation (:mod:`pkmixer.models.timm_api`).
"""
from __future__ import annotations

import fnmatch
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ..errors import ConfigError, unknown_name
from .mixer import Mixer
from .shallow import ShallowMLP
from .swmlp import SWMLP
from .timm_api import TimmModel

TIMM_PREFIX = "pkmixer_"


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`create_model` was asked for; kept on the model as ``model.spec`` (checkpoints use it)."""

    name: str
    overrides: dict[str, Any]


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
        return [p for p in inspect.signature(self.cls.__init__).parameters if p != "self"]


_REGISTRY: dict[str, ModelEntry] = {}
_ALIASES: dict[str, str] = {}  # an earlier name -> the canonical name

# the grammar of canonical names (docs/models.md, "Names"): [rp_]<family>[_<variant>]_<size><patch>_<img>, where
# <size> is a letter code or a number with its letter (c: S = C; m: SW-MLP width) and optional d<depth>, then p
SIZE_CODES = ("s", "b", "l", "h", "ss", "ssw", "bw", "t")
NAME_GRAMMAR = re.compile(
    r"(?:(?P<rp>rp_)?(?P<family>mixer|smixer|swmlp)(?:_(?P<variant>untied|grouped|views|pyramid))?"
    r"_(?:(?P<code>" + "|".join(sorted(SIZE_CODES, key=len, reverse=True)) + r")"
    r"|(?P<qty>[cm])(?P<number>\d+)(?:d(?P<depth>\d+))?p)(?P<patch>\d+)"
    r"|(?P<shallow>shallow)_(?P<weights>dense|kronecker|monarch))_(?P<img>\d+)")


def register(name: str, cls: type[nn.Module], description: str, source: str, *, data_set: str | None = None,
             aliases: tuple[str, ...] = (), **defaults: Any) -> None:
    """Register ``name`` (it must follow :data:`NAME_GRAMMAR`) and its earlier names ``aliases``."""
    if not NAME_GRAMMAR.fullmatch(name):
        raise ValueError(f"model name {name!r} does not follow the naming grammar (docs/models.md)")
    if name in _REGISTRY or name in _ALIASES:
        raise ValueError(f"model {name!r} registered twice")
    _REGISTRY[name] = ModelEntry(name, cls, defaults, description, source, data_set=data_set)
    for alias in aliases:
        register_alias(alias, name)


def register_alias(alias: str, name: str) -> None:
    """Make ``alias`` (e.g. a name of an earlier version) build the registered model ``name``."""
    if name not in _REGISTRY:
        raise ValueError(f"alias {alias!r} of unregistered model {name!r}")
    if alias in _REGISTRY or alias in _ALIASES:
        raise ValueError(f"model {alias!r} registered twice")
    _ALIASES[alias] = name


def list_models(pattern: str | None = None) -> list[str]:
    """Canonical names, optionally filtered by a shell-style pattern such as ``"*smixer*"`` (aliases:
    :func:`list_aliases`)."""
    names = sorted(_REGISTRY)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def list_aliases(pattern: str | None = None) -> dict[str, str]:
    """Aliases (earlier names) and the canonical name each stands for, sorted, optionally filtered by a
    shell-style pattern on the alias."""
    return {a: _ALIASES[a] for a in sorted(_ALIASES) if pattern is None or fnmatch.fnmatch(a, pattern)}


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
        return replace(_REGISTRY[_ALIASES[key]], name=key)
    raise unknown_name("model", name, [*_REGISTRY, *_ALIASES])


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model (a canonical name or an alias); ``overrides`` replace its defaults (e.g.
    ``num_classes=10, rp_blocks="all"``). ``num_classes=0`` gives timm's headless model (``nn.Identity`` head)."""
    classes = overrides.get("num_classes")
    if classes == 0 and not isinstance(classes, bool):
        model = create_model(name, **{k: v for k, v in overrides.items() if k != "num_classes"})
        model.reset_classifier(0)  # records num_classes=0 in model.spec
        return model
    entry = model_entry(name)
    accepted = entry.accepted()
    for key in overrides:
        if key not in accepted:
            raise unknown_name(f"option for {entry.name}", key, accepted)
    defaults = {k: v for k, v in entry.defaults.items()
                if not any(k in _SUPERSEDES.get(o, ()) for o in overrides)}
    model = entry.cls(**{**defaults, **overrides})
    model.spec = ModelSpec(entry.name, dict(overrides))
    if isinstance(model, TimmModel) and entry.data_set is not None:
        model.data_set = entry.data_set
    return model


# an override of the key replaces these defaults of an entry (e.g. γ instead of Table 1's hidden widths)
_SUPERSEDES = {"mlp_ratio": ("token_hidden", "channel_hidden")}


# ---- the zoo --------------------------------------------------------------------------------------------
# Names: docs/models.md, "Names" (NAME_GRAMMAR above); aliases= keeps the names of earlier versions working.
_TOLSTIKHIN = "Tolstikhin et al. 2021, Table 1"
# name: (patch, depth, C, D_S, D_C)
_ORIGINAL = {
    "s32": (32, 8, 512, 256, 2048), "s16": (16, 8, 512, 256, 2048),
    "b32": (32, 12, 768, 384, 3072), "b16": (16, 12, 768, 384, 3072),
    "l32": (32, 24, 1024, 512, 4096), "l16": (16, 24, 1024, 512, 4096),
    "h14": (14, 32, 1280, 640, 5120),
}
for _key, (_p, _d, _c, _ds, _dc) in _ORIGINAL.items():
    register(f"mixer_{_key}_224", Mixer, f"Mixer-{_key[0].upper()}/{_key[1:]} at 224 px", _TOLSTIKHIN,
             data_set="imagenet", img_size=224, patch_size=_p, depth=_d, embed_dim=_c, token_hidden=_ds,
             channel_hidden=_dc)

_HAYASE = "Hayase & Karakida 2024"
_CIFAR = dict(img_size=32, patch_size=4, num_classes=10, norm_eps=1e-5)
register("mixer_ss8_32", Mixer, "Mixer-SS/8: S=16, C=986, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         data_set="cifar10", **{**_CIFAR, "patch_size": 8}, depth=2, embed_dim=986, mlp_ratio=4.0)
register("mixer_ssw4_32", Mixer, "Mixer-SS-W: S=64, C=487, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         data_set="cifar10", **_CIFAR, depth=2, embed_dim=487, mlp_ratio=4.0)
register("mixer_bw14_224", Mixer, "Mixer-B-W: P=14, S=256, C=588, γ=4.57, 8 blocks", f"{_HAYASE}, Table 1, App. C.3",
         data_set="imagenet", img_size=224, patch_size=14, depth=8, embed_dim=588, mlp_ratio=4.57, norm_eps=1e-5)
register("mixer_c64d3p4_32", Mixer, "MLP-Mixer S=C=64, γ=2, 3 blocks (Fig. 2 CKA)", f"{_HAYASE}, App. C.1",
         data_set="cifar10", aliases=("mixer_f2_32",), **_CIFAR, depth=3, embed_dim=64, mlp_ratio=2.0)
register("mixer_c64p4_32", Mixer, "MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, App. D.7",
         data_set="cifar10", aliases=("mixer_s64_32",), **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0)
register("rp_mixer_c64p4_32", Mixer, "RP MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, Sec. 5.2, App. D.7",
         data_set="cifar10", aliases=("rp_mixer_s64_32",), **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0,
         rp_blocks="all")
_T4 = dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64, mlp_ratio=2.0)
_GREY = "fashion-mnist"  # the 28 px grey models are trained on Fashion-MNIST here (make demo, configs/)
register("mixer_t4_28", Mixer, "small MLP-Mixer for 28 px grey images: S=49, C=64, γ=2, 4 blocks", "pkmixer",
         data_set=_GREY, **_T4)
_ABLATION = "Tolstikhin et al. 2021, supp. A.1"  # the token-mixing ablations, on mixer_t4_28
register("mixer_untied_t4_28", Mixer, "mixer_t4_28 with untied token mixing: C=64 separate token MLPs", _ABLATION,
         data_set=_GREY, **_T4, untied_tokens=True)
register("mixer_grouped_t4_28", Mixer, "mixer_t4_28 with token MLPs on G=4 grouped channels: (S·G)×(C/G) = 196×16",
         _ABLATION, data_set=_GREY, **_T4, channel_groups=4)
register("mixer_views_t4_28", Mixer, "mixer_t4_28 with G=4 trainable views R^64 -> R^16 mixed as 196×16", _ABLATION,
         data_set=_GREY, **_T4, channel_groups=4, group_views=True)
register("mixer_pyramid_t4_28", Mixer, "mixer_t4_28 as a pyramid: S = 49, 49, 25, 16 after blocks 1-4", _ABLATION,
         data_set=_GREY, **_T4, token_schedule=(49, 49, 25, 16))
for _s in (64, 128):
    _tokens = None if _s == 64 else _s  # S0 = 64 at 32 px with 4 px patches; S=128 needs the skip layer
    register(f"smixer_c{_s}p4_32", Mixer, f"S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Figs. 5-7, App. C.4, C.6",
             data_set="cifar10", aliases=(f"smixer_s{_s}_32",), **_CIFAR, depth=8, embed_dim=_s, num_tokens=_tokens,
             block="fc")
    register(f"rp_smixer_c{_s}p4_32", Mixer, f"RP S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Sec. 5.2, Figs. 5-7",
             data_set="cifar10", aliases=(f"rp_smixer_s{_s}_32",), **_CIFAR, depth=8, embed_dim=_s,
             num_tokens=_tokens, block="fc", rp_blocks="all")
register("smixer_t4_28", Mixer, "small S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64,
         block="fc")
register("rp_smixer_t4_28", Mixer, "small RP S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64,
         block="fc", rp_blocks="all")
register("swmlp_m4096d6p4_32", SWMLP, "SW-MLP m=4096, p=1/64, γ=2 MLP blocks, 6 blocks (Fig. 2 CKA)",
         f"{_HAYASE}, App. C.1", data_set="cifar10", aliases=("swmlp_f2_32",), img_size=32, patch_size=4,
         num_classes=10, embed_dim=64, depth=6, block="mlp", mlp_ratio=2.0, density=1 / 64)
register("swmlp_m1619p4_32", SWMLP, "SW-MLP Ω=2^18, p=0.1, m=1619, 8 blocks (Fig. 5)", f"{_HAYASE}, App. C.4",
         data_set="cifar10", aliases=("swmlp_o18_32",), img_size=32, patch_size=4, num_classes=10, embed_dim=64,
         depth=8, block="fc", width=1619, density=0.1)
register("swmlp_t4_28", SWMLP, "small SW-MLP for 28 px grey images: m=784, p=1/8, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=16, depth=4, block="fc",
         density=1 / 8)
for _w in ("dense", "kronecker", "monarch"):
    register(f"shallow_{_w}_28", ShallowMLP, f"shallow MLP with {_w} weights on 28 px (MNIST)",
             f"{_HAYASE}, Sec. 3.3, Fig. 2d", data_set="mnist", img_size=28, in_chans=1, num_classes=10, weights=_w)


# ---- timm ---------------------------------------------------------------------------------------------
def default_cfg(name: str) -> dict[str, Any]:
    """timm's pretrained cfg of a registered model at its defaults (no weights: url and hub id empty); a built
    model's ``pretrained_cfg`` is computed from its own sizes (:mod:`pkmixer.models.timm_api`)."""
    from .timm_api import data_cfg

    entry = model_entry(name)
    kw = entry.defaults
    sig = inspect.signature(entry.cls.__init__).parameters
    in_chans, img_size, classes = (kw.get(k, sig[k].default) for k in ("in_chans", "img_size", "num_classes"))
    data_set = entry.data_set or "imagenet"
    first_conv = getattr(entry.cls, "first_conv", "stem")
    return {"url": "", "architecture": TIMM_PREFIX + entry.canonical, **data_cfg(data_set, in_chans, img_size),
            "num_classes": classes, "first_conv": first_conv, "classifier": "head", "description": entry.description,
            "notes": (f"normalisation of {data_set}",)}


def _timm_entrypoint(name: str) -> Callable[..., nn.Module]:
    def entrypoint(pretrained: bool = False, pretrained_cfg: Any = None, pretrained_cfg_overlay: Any = None,
                   cache_dir: Any = None, **kwargs: Any) -> nn.Module:
        if pretrained:
            raise ConfigError(f"{TIMM_PREFIX}{name} has no pretrained weights to download; "
                              "import a checkpoint with pkmixer.models.convert instead")
        model = create_model(name, **kwargs)
        overlay = {**(pretrained_cfg if isinstance(pretrained_cfg, dict) else {}),
                   **(pretrained_cfg_overlay or {})}
        if hasattr(pretrained_cfg, "to_dict"):  # a timm PretrainedCfg
            overlay = {**pretrained_cfg.to_dict(), **(pretrained_cfg_overlay or {})}
        if overlay:
            model.pretrained_cfg = overlay
        return model

    entrypoint.__name__ = entrypoint.__qualname__ = TIMM_PREFIX + name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = _REGISTRY[name].description
    return entrypoint


def register_with_timm() -> None:
    """Make every entry available as ``timm.create_model("pkmixer_<name>")``, with its pretrained cfg
    (``timm.models.get_pretrained_cfg``); the aliases are registered as timm registers renamed models
    (``register_model_deprecations``: listed by ``timm.models.get_deprecated_models("registry")``, not by
    ``timm.list_models``; timm warns that it maps the old name to the new one)."""
    import timm
    from timm.models import generate_default_cfgs, register_model, register_model_deprecations

    module = sys.modules[__name__]
    # register_model reads the cfgs of the module that defines an entrypoint from its ``default_cfgs``
    module.default_cfgs = generate_default_cfgs({TIMM_PREFIX + n: default_cfg(n) for n in _REGISTRY})
    for name in _REGISTRY:
        if not timm.is_model(TIMM_PREFIX + name):
            fn = register_model(_timm_entrypoint(name))
            setattr(module, fn.__name__, fn)  # register_model_deprecations finds the current entrypoints here
    aliases = {TIMM_PREFIX + a: TIMM_PREFIX + n for a, n in _ALIASES.items() if not timm.is_model(TIMM_PREFIX + a)}
    if aliases:
        register_model_deprecations(__name__, aliases)
