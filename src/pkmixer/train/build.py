"""What a run is built from: its model (the ``model`` section) and its data splits with their transforms and loss
(the ``data`` section), for training, resuming and evaluation (Hayase & Karakida App. C; Mixer supp. B, C).

Each builder takes only its own section of the config, and the run's seed where it draws.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from ..data import build_batch_augment, build_dataset, build_loss, build_transform, dataset_info
from ..errors import ConfigError
from ..models.convert import import_checkpoint
from ..models.registry import canonical_name, create_model
from ..models.resolution import enlarged_options, enlarged_state_dict
from ..models.restore import model_from_checkpoint
from .config import DataConfig, ModelConfig

# ---- the model --------------------------------------------------------------------------------------------


def build_model(model: ModelConfig, num_classes: int) -> nn.Module:
    """The registered model, with the data set's class count unless the config sets one; with ``model.init``,
    started from that checkpoint (:func:`_model_from_init`)."""
    options = dict(model.options)
    options.setdefault("num_classes", num_classes)
    if model.init:
        return _model_from_init(model.name, model.init, options)
    return create_model(model.name, **options)


def _model_from_init(name: str, path: str, options: dict[str, Any]) -> nn.Module:
    """The checkpoint's architecture and weights, at the configured image size - enlarged block-diagonally
    when larger (Mixer supp. C) - and class count (a fresh head when it differs). The checkpoint is a
    pkmixer ``.pt``, a timm state dict or a Flax ``.npz`` of Google's (:func:`import_checkpoint`)."""
    source = import_checkpoint(path).model
    if canonical_name(source.spec.name) != canonical_name(name):  # an old name and its new one are one model
        raise ConfigError(f"model.init {path} holds a {source.spec.name}, not the configured {name}")
    size = options.get("img_size", getattr(source, "img_size", None))
    if size != getattr(source, "img_size", None):
        if size % source.img_size:
            raise ConfigError(f"model.img_size={size} is not an integer multiple of the checkpoint's "
                              f"{source.img_size} px (Mixer supp. C enlarges by integer factors)")
        factor = size // source.img_size
        base, state = enlarged_options(source, factor), enlarged_state_dict(source, factor)
    else:
        base, state = dict(source.spec.arguments), source.state_dict()
    model = create_model(name, **{**base, **options})
    own = model.state_dict()
    head = [k for k in state if k.startswith("head.") and k in own and state[k].shape != own[k].shape]
    for k in head:
        del state[k]
    try:
        model.load_state_dict(state, strict=not head)
    except RuntimeError as err:
        raise ConfigError(f"model.init {path}: weights do not fit the model ({str(err).splitlines()[1].strip()})")
    return model


# ---- the data ---------------------------------------------------------------------------------------------


def run_splits(data: DataConfig) -> tuple[str, ...]:
    """The splits a run trains and evaluates on: the training set, the validation split held out of it when
    ``data.val_fraction`` > 0 (it selects ``best.pt``), and the test set."""
    return ("train", "val", "test") if data.val_fraction > 0 else ("train", "test")


def build_splits(data: DataConfig, seed: int, splits: tuple[str, ...]) -> dict:
    """The splits, without transforms yet: the model they feed is built from their class count. The validation
    split is held out of the whole training set by ``seed`` (``data.train_subset`` then subsets the rest) and is
    never subsetted."""
    return {split: build_dataset(data.name, split, data_dir=data.data_dir, download=data.download,
                                 val_fraction=data.val_fraction, seed=seed,
                                 subset={"train": data.train_subset, "test": data.test_subset}.get(split))
            for split in splits}


def model_and_data(model: ModelConfig, data: DataConfig, seed: int, splits: tuple[str, ...],
                   checkpoint: dict[str, Any] | None = None, where: Path | None = None) -> tuple[nn.Module, dict]:
    """The data splits and the model; with ``checkpoint`` the model is that checkpoint's (resume, eval)."""
    sets = build_splits(data, seed, splits)
    if checkpoint is None:
        net = build_model(model, sets[splits[0]].info.num_classes)
    else:
        net = model_from_checkpoint(checkpoint, where)
    for split, ds in sets.items():
        ds.transform = transform_for(data, net, split == "train")
    return net, sets


def transform_for(data: DataConfig, model: nn.Module, train: bool):
    """The per-example transform of a split, at the model's image size and channels."""
    info = dataset_info(data.name)  # mean/std and channels; the class count comes from the built split
    if not train:
        return build_transform(info, train=False, img_size=model.img_size, in_chans=model.in_chans,
                               resize=data.resize, eval_crop=data.eval_crop)
    return build_transform(info, train=True, img_size=model.img_size, in_chans=model.in_chans,
                           crop_padding=data.crop_padding, hflip=data.hflip, auto_augment=data.auto_augment,
                           rand_augment=data.rand_augment, random_erasing=data.random_erasing,
                           random_resized_crop=data.random_resized_crop, resize=data.resize)


def batch_augment_for(data: DataConfig, model: nn.Module, train: bool, info):
    """:func:`~pkmixer.data.build_batch_augment` for a split (ConfigError where there is no batched version)."""
    if not train:
        return build_batch_augment(info, train=False, img_size=model.img_size, in_chans=model.in_chans,
                                   resize=data.resize, eval_crop=data.eval_crop, num_classes=model.num_classes)
    return build_batch_augment(info, train=True, img_size=model.img_size, in_chans=model.in_chans,
                               crop_padding=data.crop_padding, hflip=data.hflip, auto_augment=data.auto_augment,
                               rand_augment=data.rand_augment, random_erasing=data.random_erasing,
                               random_resized_crop=data.random_resized_crop, resize=data.resize,
                               mixup_alpha=data.mixup, cutmix_alpha=data.cutmix, switch_prob=data.mixup_switch_prob,
                               label_smoothing=data.label_smoothing, num_classes=model.num_classes)


def mixes_examples(data: DataConfig) -> bool:
    """Whether mixup or cutmix pairs the examples of a batch (their targets are then soft)."""
    return data.mixup > 0 or data.cutmix > 0


def loss_for(data: DataConfig) -> nn.Module:
    """The training loss the data's targets call for (:func:`~pkmixer.data.build_loss`): soft targets under
    mixup or cutmix, label smoothing, or plain cross-entropy."""
    return build_loss(mixes_examples(data), data.label_smoothing)


def resolve_data_name(data: DataConfig, log: Callable[[str], None]) -> DataConfig:
    """``data.name: auto`` resolved: Fashion-MNIST when it is on disk (never downloaded), else the bundled
    digits; any other name as it is."""
    if data.name != "auto":
        return data
    try:
        found = build_dataset("fashion-mnist", "test", data_dir=data.data_dir).root
        log(f"data: Fashion-MNIST from {found}")
        name = "fashion-mnist"
    except ConfigError as err:
        log(f"data: Fashion-MNIST is not on this machine ({err}); using scikit-learn's bundled digits instead")
        name = "digits"
    return dataclasses.replace(data, name=name)
