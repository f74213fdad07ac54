"""timm's model conventions for every pkmixer model: ``pretrained_cfg`` / ``default_cfg``, ``num_features``,
``get_classifier()`` and ``reset_classifier(num_classes, global_pool=None)``.

``pretrained_cfg`` is computed from the model itself each time it is read: ``input_size`` = (in_chans,
img_size, img_size), ``num_classes`` the head's, and the normalisation of the data set the model is meant for
(``model.data_set``: the registry entry's, see :mod:`pkmixer.models.registry`; for a model built from its
class, the first of :data:`GUESSES` whose channels and image size match). The statistics come from
:func:`pkmixer.data.datasets.dataset_info`. Data sets of photographs of varying size (ImageNet) get timm's
ImageNet evaluation (bicubic, crop_pct 0.875, as ``pkmixer.data.transforms`` does); data sets of fixed-size
images are used as stored (bilinear, crop_pct 1). So ``timm.data.resolve_data_config(model=m)`` gives a
1-channel 28 px model (1, 28, 28) and its data set's mean and std, not 3×224 ImageNet.

Assigning ``model.pretrained_cfg = {...}`` (as timm's builders do) overlays those keys on the computed ones; the
registry overlays each entry's name, description and papers (:data:`PAPERS`), weights loaded from the hub or a
folder their own cfg. A model built from its class gets the papers of :data:`CLASS_PAPERS`.

The mixin also gives every model timm's ``set_grad_checkpointing``; each family adds ``feature_info``,
``forward_intermediates`` (with timm's arguments), ``prune_intermediate_layers`` and ``group_matcher``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from ..errors import ConfigError

# a model built from its class (not the registry) gets the first data set matching (in_chans, img_size);
# None matches any size
GUESSES: tuple[tuple[str, int, int | None], ...] = (
    ("fashion-mnist", 1, 28), ("cifar10", 3, 32), ("mnist", 1, None), ("imagenet", 3, None))


def guess_data_set(in_chans: int, img_size: int) -> str:
    """The data set a model of these input sizes is most likely meant for (see :data:`GUESSES`)."""
    for name, chans, size in GUESSES:
        if chans == in_chans and size in (None, img_size):
            return name
    return "mnist" if in_chans == 1 else "imagenet"


def _per_channel(values: tuple[float, ...], in_chans: int) -> tuple[float, ...]:
    """A data set's per-channel statistic for a model with ``in_chans`` inputs: repeated for a grey data set
    fed to a colour model, averaged for a colour data set fed to another channel count."""
    if len(values) == in_chans:
        return tuple(values)
    if len(values) == 1:
        return tuple(values) * in_chans
    return (sum(values) / len(values),) * in_chans


def data_cfg(data_set: str, in_chans: int, img_size: int) -> dict[str, Any]:
    """The timm data-config keys (input_size, interpolation, crop_pct, crop_mode, mean, std) of a model with
    these input sizes meant for ``data_set``."""
    from ..data.datasets import dataset_info  # lazily: the data package imports torchvision

    info = dataset_info(data_set)
    natural = info.image_size is None  # photographs of varying size: timm's ImageNet evaluation
    return {"input_size": (in_chans, img_size, img_size), "fixed_input_size": True,
            "interpolation": "bicubic" if natural else "bilinear", "crop_pct": 0.875 if natural else 1.0,
            "crop_mode": "center", "mean": _per_channel(info.mean, in_chans), "std": _per_channel(info.std, in_chans)}


# the papers a configuration comes from, as timm's pretrained cfg names them: (paper_name, paper_ids, origin_url)
PAPERS = {
    "tolstikhin": ("MLP-Mixer: An all-MLP Architecture for Vision", "arXiv:2105.01601",
                   "https://github.com/google-research/vision_transformer"),
    "hayase": ("Understanding MLP-Mixer as a Wide and Sparse MLP", "https://proceedings.mlr.press/v235/hayase24a.html",
               "https://proceedings.mlr.press/v235/hayase24a.html"),
}
LICENSE = "apache-2.0"  # pkmixer's (Google's Mixer weights are Apache-2.0 too)


def paper_fields(*papers: str) -> dict[str, Any]:
    """timm's ``paper_name``, ``paper_ids`` and ``origin_url`` for the papers by key of :data:`PAPERS`."""
    found = [PAPERS[p] for p in papers]
    return {"paper_name": ", ".join(f[0] for f in found) or None, "paper_ids": ", ".join(f[1] for f in found) or None,
            "origin_url": found[0][2] if found else None}


def timm_cfg(architecture: str, description: str | None, data_set: str, in_chans: int, img_size: int,
             num_classes: int, first_conv: str | None, papers: tuple[str, ...] = ()) -> dict[str, Any]:
    """timm's pretrained cfg of a pkmixer model without weights (url and hub id empty): the registry's, at a
    model's defaults, and a built model's, from its own sizes."""
    return {"url": "", "hf_hub_id": None, "architecture": architecture, "tag": None,
            **data_cfg(data_set, in_chans, img_size),
            "num_classes": num_classes, "first_conv": first_conv, "classifier": "head", "license": LICENSE,
            "description": description, **paper_fields(*papers), "notes": (f"normalisation of {data_set}",)}


def record_arguments(model: nn.Module, **changes: Any) -> None:
    """Record in ``model.spec`` (if it has one) a change made after building (a new head, pruned blocks), so that
    a checkpoint saved afterwards rebuilds the model as it is now."""
    spec = getattr(model, "spec", None)
    if spec is not None:
        model.spec = replace(spec, overrides={**spec.overrides, **changes}, arguments={**spec.arguments, **changes})


class TimmModel:
    """Mixin (before ``nn.Module``) giving a model with ``in_chans``, ``img_size``, ``num_classes``, ``head``
    and ``num_features`` timm's conventions; see the module docstring."""

    global_pool: str = ""  # timm's name of the pooling before the head: "" none, "avg" mean over tokens
    zero_head: bool = True  # a new head starts at zero (Listing 1); False: PyTorch's Linear initialisation
    first_conv: str = "stem"  # timm's name of the module whose weight reads the image (in_chans adaptation)
    CLASS_PAPERS: tuple[str, ...] = ("hayase",)  # the papers of a model built from its class (keys of PAPERS)
    # properties TorchScript leaves alone (they run Python that a scripted forward never needs)
    __jit_unused_properties__ = ["pretrained_cfg", "default_cfg", "data_set", "head_hidden_size", "num_features",
                                 "feature_info", "token_ablations"]

    def no_weight_decay(self) -> set[str]:
        """timm's convention: the parameters weight decay leaves alone, every one that its layer does not declare
        a weight (:mod:`pkmixer.layers.decay`). timm's optimiser factory then decays what pkmixer decays, whatever
        the rank: not the (n, out) bias of untied token MLPs, with layer-wise lr decay too."""
        from ..layers.decay import weights_by_role

        return {name for name, _ in self.named_parameters()} - weights_by_role(self)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's convention: recompute each block in the backward instead of keeping its activations (the same
        values, less memory)."""
        self.grad_checkpointing = bool(enable)

    @property
    def head_hidden_size(self) -> int:
        return self.num_features

    @property
    def data_set(self) -> str:
        """The data set whose statistics ``pretrained_cfg`` gives: the registry entry's, else a guess."""
        return self.__dict__.get("_data_set") or guess_data_set(self.in_chans, self.img_size)

    @data_set.setter
    def data_set(self, name: str | None) -> None:
        if name is not None:
            from ..data.datasets import dataset_info
            dataset_info(name)  # an unknown name is refused with the closest ones
        self.__dict__["_data_set"] = name

    def _computed_cfg(self) -> dict[str, Any]:
        return timm_cfg(type(self).__name__.lower(), None, self.data_set, self.in_chans, self.img_size,
                        self.num_classes, self.first_conv, self.CLASS_PAPERS)

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        return {**self._computed_cfg(), **self.__dict__.get("_cfg_overlay", {})}

    @pretrained_cfg.setter
    def pretrained_cfg(self, cfg: Any) -> None:
        if cfg is None:
            self.__dict__.pop("_cfg_overlay", None)
            return
        cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}  # JSON's lists: timm's tuples
        computed, missing = self._computed_cfg(), object()
        # keep only what differs from the computed cfg, so that the model's own sizes stay live; on top of what
        # was overlaid before (the registry's names and papers, say)
        overlay = {**self.__dict__.get("_cfg_overlay", {}), **cfg}
        self.__dict__["_cfg_overlay"] = {k: v for k, v in overlay.items() if computed.get(k, missing) != v}

    default_cfg = pretrained_cfg  # timm's older name, kept as an alias there too

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new head with ``num_classes`` outputs (0: ``nn.Identity``, the pooled features), on the old head's
        device and dtype, initialised as the model initialises its head; every other weight is kept. The
        pooling is fixed: ``global_pool`` may only name the model's own (``self.global_pool``)."""
        if global_pool is not None and global_pool != self.global_pool:
            raise ConfigError(f"{type(self).__name__} pools {self.global_pool!r} before its head and has no "
                              f"other pooling; got global_pool={global_pool!r}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
            raise ConfigError(f"num_classes must be an integer >= 0, got {num_classes!r}")
        ref = next(iter(self.head.parameters()), None)
        if ref is None:
            ref = next(self.parameters())
        if num_classes:
            head: nn.Module = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype)
            if self.zero_head:
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
        else:
            head = nn.Identity()
        self.head = head
        self.num_classes = num_classes
        record_arguments(self, num_classes=num_classes)  # a checkpoint rebuilds the model from its spec
