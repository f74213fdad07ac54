"""The model zoo: ``create_model(name, **overrides)``, ``list_models()``, and the same entries in timm's
registry as ``timm.create_model("pkmixer_<name>")``.

Each entry is a model class plus its defaults; overrides are checked against the class's arguments, and
unknown names are answered with the closest known ones.
"""
from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import ConfigError, unknown_name
from .mixer import Mixer
from .shallow import ShallowMLP
from .swmlp import SWMLP

TIMM_PREFIX = "pkmixer_"


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`create_model` was asked for; kept on the model as ``model.spec`` (checkpoints use it)."""

    name: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    cls: type[nn.Module]
    defaults: dict[str, Any]
    description: str
    source: str  # where in the papers the configuration comes from
    tags: tuple[str, ...] = field(default=())

    def accepted(self) -> list[str]:
        return [p for p in inspect.signature(self.cls.__init__).parameters if p != "self"]


_REGISTRY: dict[str, ModelEntry] = {}


def register(name: str, cls: type[nn.Module], description: str, source: str, **defaults: Any) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} registered twice")
    _REGISTRY[name] = ModelEntry(name, cls, defaults, description, source)


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names, optionally filtered by a shell-style pattern such as ``"*smixer*"``."""
    names = sorted(_REGISTRY)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def model_entry(name: str) -> ModelEntry:
    key = name[len(TIMM_PREFIX):] if name.startswith(TIMM_PREFIX) else name
    if key not in _REGISTRY:
        raise unknown_name("model", name, _REGISTRY)
    return _REGISTRY[key]


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model; ``overrides`` replace its defaults (e.g. ``num_classes=10, rp_blocks="all"``)."""
    entry = model_entry(name)
    accepted = entry.accepted()
    for key in overrides:
        if key not in accepted:
            raise unknown_name(f"option for {entry.name}", key, accepted)
    defaults = {k: v for k, v in entry.defaults.items()
                if not any(k in _SUPERSEDES.get(o, ()) for o in overrides)}
    model = entry.cls(**{**defaults, **overrides})
    model.spec = ModelSpec(entry.name, dict(overrides))
    return model


# an override of the key replaces these defaults of an entry (e.g. γ instead of Table 1's hidden widths)
_SUPERSEDES = {"mlp_ratio": ("token_hidden", "channel_hidden")}


# ---- the zoo --------------------------------------------------------------------------------------------
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
             img_size=224, patch_size=_p, depth=_d, embed_dim=_c, token_hidden=_ds, channel_hidden=_dc)

_HAYASE = "Hayase & Karakida 2024"
_CIFAR = dict(img_size=32, patch_size=4, num_classes=10, norm_eps=1e-5)
register("mixer_ss8_32", Mixer, "Mixer-SS/8: S=16, C=986, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         **{**_CIFAR, "patch_size": 8}, depth=2, embed_dim=986, mlp_ratio=4.0)
register("mixer_ssw4_32", Mixer, "Mixer-SS-W: S=64, C=487, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         **_CIFAR, depth=2, embed_dim=487, mlp_ratio=4.0)
register("mixer_bw14_224", Mixer, "Mixer-B-W: P=14, S=256, C=588, γ=4.57, 8 blocks", f"{_HAYASE}, Table 1, App. C.3",
         img_size=224, patch_size=14, depth=8, embed_dim=588, mlp_ratio=4.57, norm_eps=1e-5)
register("mixer_f2_32", Mixer, "MLP-Mixer S=C=64, γ=2, 3 blocks (Fig. 2 CKA)", f"{_HAYASE}, App. C.1",
         **_CIFAR, depth=3, embed_dim=64, mlp_ratio=2.0)
register("mixer_s64_32", Mixer, "MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, App. D.7",
         **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0)
register("rp_mixer_s64_32", Mixer, "RP MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, Sec. 5.2, App. D.7",
         **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0, rp_blocks="all")
_T4 = dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64, mlp_ratio=2.0)
register("mixer_t4_28", Mixer, "small MLP-Mixer for 28 px grey images: S=49, C=64, γ=2, 4 blocks", "pkmixer", **_T4)
_ABLATION = "Tolstikhin et al. 2021, supp. A.1"  # the token-mixing ablations, on mixer_t4_28
register("mixer_untied_t4_28", Mixer, "mixer_t4_28 with untied token mixing: C=64 separate token MLPs", _ABLATION,
         **_T4, untied_tokens=True)
register("mixer_grouped_t4_28", Mixer, "mixer_t4_28 with token MLPs on G=4 grouped channels: (S·G)×(C/G) = 196×16",
         _ABLATION, **_T4, channel_groups=4)
register("mixer_views_t4_28", Mixer, "mixer_t4_28 with G=4 trainable views R^64 -> R^16 mixed as 196×16", _ABLATION,
         **_T4, channel_groups=4, group_views=True)
register("mixer_pyramid_t4_28", Mixer, "mixer_t4_28 as a pyramid: S = 49, 49, 25, 16 after blocks 1-4", _ABLATION,
         **_T4, token_schedule=(49, 49, 25, 16))
for _s in (64, 128):
    _tokens = None if _s == 64 else _s  # S0 = 64 at 32 px with 4 px patches; S=128 needs the skip layer
    register(f"smixer_s{_s}_32", Mixer, f"S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Figs. 5-7, App. C.4, C.6",
             **_CIFAR, depth=8, embed_dim=_s, num_tokens=_tokens, block="fc")
    register(f"rp_smixer_s{_s}_32", Mixer, f"RP S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Sec. 5.2, Figs. 5-7",
             **_CIFAR, depth=8, embed_dim=_s, num_tokens=_tokens, block="fc", rp_blocks="all")
register("smixer_t4_28", Mixer, "small S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64, block="fc")
register("rp_smixer_t4_28", Mixer, "small RP S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64, block="fc",
         rp_blocks="all")
register("swmlp_f2_32", SWMLP, "SW-MLP m=4096, p=1/64, γ=2 MLP blocks, 6 blocks (Fig. 2 CKA)", f"{_HAYASE}, App. C.1",
         img_size=32, patch_size=4, num_classes=10, embed_dim=64, depth=6, block="mlp", mlp_ratio=2.0,
         density=1 / 64)
register("swmlp_o18_32", SWMLP, "SW-MLP Ω=2^18, p=0.1, m=1619, 8 blocks (Fig. 5)", f"{_HAYASE}, App. C.4",
         img_size=32, patch_size=4, num_classes=10, embed_dim=64, depth=8, block="fc", width=1619, density=0.1)
register("swmlp_t4_28", SWMLP, "small SW-MLP for 28 px grey images: m=784, p=1/8, 4 blocks", "pkmixer",
         img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=16, depth=4, block="fc", density=1 / 8)
for _w in ("dense", "kronecker", "monarch"):
    register(f"shallow_{_w}_28", ShallowMLP, f"shallow MLP with {_w} weights on 28 px (MNIST)",
             f"{_HAYASE}, Sec. 3.3, Fig. 2d", img_size=28, in_chans=1, num_classes=10, weights=_w)


# ---- timm ---------------------------------------------------------------------------------------------
def _timm_entrypoint(name: str) -> Callable[..., nn.Module]:
    def entrypoint(pretrained: bool = False, pretrained_cfg: Any = None, pretrained_cfg_overlay: Any = None,
                   cache_dir: Any = None, **kwargs: Any) -> nn.Module:
        if pretrained:
            raise ConfigError(f"{TIMM_PREFIX}{name} has no pretrained weights to download; "
                              "import a checkpoint with pkmixer.models.convert instead")
        return create_model(name, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = TIMM_PREFIX + name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = _REGISTRY[name].description
    return entrypoint


def register_with_timm() -> None:
    """Make every entry available as ``timm.create_model("pkmixer_<name>")``."""
    import timm
    from timm.models import register_model

    for name in _REGISTRY:
        if not timm.is_model(TIMM_PREFIX + name):
            register_model(_timm_entrypoint(name))
