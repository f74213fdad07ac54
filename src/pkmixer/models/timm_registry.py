"""The zoo in timm's registry: every entry is ``timm.create_model("pkmixer_<name>")``, with timm's arguments.

* ``pretrained=True`` loads what the name's cfg points to: a ``local-dir:`` folder (as
  :func:`pkmixer.models.weights.save_pretrained` writes it), or, for the entries that are timm's own Mixers, the
  hub weights timm names (``pkmixer_mixer_b16_224.goog_in21k_ft_in1k``: Google's weights, the first tag of a name
  being its default, as in timm). A name with no weights raises ConfigError.
* ``features_only=True`` (``out_indices``, ``output_fmt``, ``norm``) gives timm's ``FeatureGetterNet`` over the
  model's ``forward_intermediates``: one feature per block (per layer for the shallow MLPs), NCHW where the tokens
  are the patch grid, else NLC for a Mixer and (B, m, 1, 1) for the MLPs (``feature_info`` says which).
* ``pretrained_cfg`` / ``pretrained_cfg_overlay`` overlay the model's own cfg; ``global_pool`` may only name the
  model's pooling.
* The aliases are registered as timm registers renamed models (``register_model_deprecations``: listed by
  ``timm.models.get_deprecated_models("registry")``, not by ``timm.list_models``; timm warns that it maps the old
  name to the new one).
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from torch import nn

from ..errors import ConfigError
from .registry import TIMM_PREFIX, create_model, list_aliases, list_models, model_entry
from .timm_api import timm_cfg
from .weights import WEIGHTS_CFG_KEYS


def default_cfg(name: str) -> dict[str, Any]:
    """timm's pretrained cfg of a registered model at its defaults (no weights: url and hub id empty); a built
    model's ``pretrained_cfg`` is computed from its own sizes (:mod:`pkmixer.models.timm_api`)."""
    entry = model_entry(name)
    kw = entry.defaults
    sig = inspect.signature(entry.cls.__init__).parameters
    in_chans, img_size, classes = (kw.get(k, sig[k].default) for k in ("in_chans", "img_size", "num_classes"))
    return timm_cfg(TIMM_PREFIX + entry.canonical, entry.description, entry.data_set or "imagenet", in_chans,
                    img_size, classes, getattr(entry.cls, "first_conv", "stem"), entry.papers)


def hub_tags(name: str) -> dict[str, dict[str, Any]]:
    """The tags of timm's hub weights for a registered name that is one of timm's Mixers, with the cfg keys they
    bring (Google's normalisation, classes, hub id), in timm's order (the first is the default)."""
    import timm
    from timm.models import get_pretrained_cfg, list_pretrained

    if not timm.is_model(name):
        return {}
    out = {}
    for full in list_pretrained(f"{name}.*"):
        cfg = get_pretrained_cfg(full)
        if cfg.hf_hub_id:
            out[full.split(".", 1)[1]] = {k: v for k, v in cfg.to_dict().items() if k in WEIGHTS_CFG_KEYS and v is not None}
    return out


def features_model(model: nn.Module, out_indices: Any = None, output_fmt: str | None = None, norm: bool = False,
                   **feature_cfg: Any) -> nn.Module:
    """timm's ``FeatureGetterNet`` of ``model``: its ``forward_intermediates`` at ``out_indices`` (default: every
    feature point), in ``output_fmt`` (default: the model's, ``default_output_fmt()``)."""
    from timm.models._features import FeatureGetterNet

    indices = tuple(range(len(model.feature_info))) if out_indices is None else out_indices
    return FeatureGetterNet(model, out_indices=indices, output_fmt=output_fmt or model.default_output_fmt(),
                            norm=norm, **feature_cfg)


def _entrypoint(name: str) -> Callable[..., nn.Module]:
    def entrypoint(pretrained: bool = False, pretrained_cfg: Any = None, pretrained_cfg_overlay: Any = None,
                   cache_dir: Any = None, features_only: bool = False, out_indices: Any = None,
                   output_fmt: str | None = None, feature_cls: Any = None, feature_cfg: dict | None = None,
                   global_pool: str | None = None, pretrained_model_args: Any = None, **kwargs: Any) -> nn.Module:
        from timm.models import resolve_pretrained_cfg

        cfg = resolve_pretrained_cfg(TIMM_PREFIX + name, pretrained_cfg=pretrained_cfg).to_dict()
        source: Any = False
        if pretrained:
            if cfg.get("file"):  # local-dir:<folder>
                source = cfg["file"]
            elif cfg.get("hf_hub_id") and cfg.get("source") == "hf-hub":  # hf-hub:<repo>
                source = f"hf-hub:{cfg['hf_hub_id']}"
            elif cfg.get("hf_hub_id"):  # one of timm's tags of weights
                source = True
            else:
                raise ConfigError(f"{TIMM_PREFIX}{name} has no pretrained weights to download; pass a folder "
                                  "(local-dir:...) or load a weights file with pkmixer.create_model(name, pretrained=...)")
        tagged = f"{name}.{cfg['tag']}" if source is True and cfg.get("tag") else name
        model = create_model(tagged, pretrained=source, **kwargs)
        if global_pool is not None and global_pool != model.global_pool:
            raise ConfigError(f"{type(model).__name__} pools {model.global_pool!r} before its head and has no other "
                              f"pooling; got global_pool={global_pool!r}")
        overlay = {}
        if isinstance(pretrained_cfg, dict) or hasattr(pretrained_cfg, "to_dict"):
            overlay.update(pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else pretrained_cfg)
        overlay.update(pretrained_cfg_overlay or {})
        if overlay:
            model.pretrained_cfg = overlay
        if features_only:
            if feature_cls not in (None, "getter"):
                raise ConfigError(f"pkmixer models give features through forward_intermediates (feature_cls "
                                  f"'getter'), not {feature_cls!r}")
            return features_model(model, out_indices, output_fmt, **(feature_cfg or {}))
        return model

    entrypoint.__name__ = entrypoint.__qualname__ = TIMM_PREFIX + name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = model_entry(name).description
    return entrypoint


def register_with_timm() -> None:
    """Make every entry available as ``timm.create_model("pkmixer_<name>")``, with its pretrained cfgs
    (``timm.models.get_pretrained_cfg``) and aliases (module docstring)."""
    import timm
    from timm.models import generate_default_cfgs, register_model, register_model_deprecations

    module = sys.modules[__name__]
    cfgs = {}
    for name in list_models():
        tags = hub_tags(name)
        for tag, weights_cfg in tags.items():  # the first tag is the name's default, as in timm
            cfgs[f"{TIMM_PREFIX}{name}.{tag}"] = {**default_cfg(name), **weights_cfg}
        if not tags:
            cfgs[TIMM_PREFIX + name] = default_cfg(name)
    # register_model reads the cfgs of the module that defines an entrypoint from its ``default_cfgs``
    module.default_cfgs = generate_default_cfgs(cfgs)
    for name in list_models():
        if not timm.is_model(TIMM_PREFIX + name):
            fn = register_model(_entrypoint(name))
            setattr(module, fn.__name__, fn)  # register_model_deprecations finds the current entrypoints here
    aliases = {TIMM_PREFIX + a: TIMM_PREFIX + n for a, n in list_aliases().items()
               if not timm.is_model(TIMM_PREFIX + a)}
    if aliases:
        register_model_deprecations(__name__, aliases)
