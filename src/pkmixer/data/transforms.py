"""Input pipelines of the experiments: augmentation, resizing, evaluation crops, normalisation, mixup and the loss.

* Random crop with padding and random horizontal flip on CIFAR-10/100 and STL-10 (Hayase & Karakida App. C.4).
* AutoAugment (Cubuk et al. 2019; App. C.1, C.3, D.7) with torchvision's CIFAR10 / IMAGENET / SVHN policies.
* RandAugment by timm policy strings such as ``rand-m9-mstd0.5-inc1``, random erasing 0.25, mixup α = 0.8 and
  cutmix α = 1.0 switched with probability 0.5, label smoothing 0.1: ImageNet-1k training (App. C.5, Table S.2),
  which used timm. The random-resized (Inception) crop is timm's ImageNet default.
* RandAugment as big_vision has it, ``bigvision-n2-m15`` (:mod:`pkmixer.data.randaugment`): the Mixer
  pre-training regulariser (Mixer supp. B, Table 1), whose magnitudes 15 and 20 extrapolate past 10.
* Resizing: STL-10's 96 px images to 32 px (App. C.4) or 90 px (App. D.6).
* Evaluation pre-processing of Mixer supp. C: "resize-crop" resizes to a square of side ⌊img_size / crop_pct⌋
  and takes the central img_size crop; "resmall-crop" resizes the shorter side to that length, keeping the
  aspect ratio, and takes the central crop. Without ``eval_crop`` evaluation resizes to img_size (or ``resize``,
  then centre-crops) - except for data sets of natural images of any size (ImageNet and other image-folder
  trees), which are evaluated as timm does: the shorter side resized to ⌊img_size / crop_pct⌋ (256 for 224)
  and the central crop, i.e. "resmall-crop". Their interpolation is bicubic (timm's for Mixers) in training and
  evaluation; other data sets use bilinear.
* Grey <-> RGB when the model's ``in_chans`` differs from the data's, and normalisation by the data set's mean
  and standard deviation (converted with the same channels: repeated for grey -> RGB, the luma weights
  0.2989 R + 0.587 G + 0.114 B for RGB -> grey, which for the standard deviation is an upper bound).

The pipelines take PIL images or float tensors (C, H, W) in [0, 1] (what :func:`pkmixer.data.build_dataset`
gives) and return float tensors (in_chans, img_size, img_size). Options that concern only training
(augmentations) are ignored when ``train=False`` and evaluation-only ones (``eval_crop``, ``crop_pct``) when
``train=True``, so that one configuration can build both.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from timm.data import Mixup
from timm.data.auto_augment import rand_augment_transform
from timm.data.random_erasing import RandomErasing
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import nn
from torchvision.transforms import InterpolationMode, v2

from ..errors import ConfigError, check_density, check_positive_int, check_rate
from .datasets import DatasetInfo
from .randaugment import POLICY_PREFIX as BIGVISION_PREFIX
from .randaugment import RandAugment, parse_policy

AUTO_AUGMENT_POLICIES = {"cifar10": v2.AutoAugmentPolicy.CIFAR10, "imagenet": v2.AutoAugmentPolicy.IMAGENET,
                         "svhn": v2.AutoAugmentPolicy.SVHN}
EVAL_CROPS = ("resize-crop", "resmall-crop")
INTERPOLATIONS = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC,
                  "nearest": InterpolationMode.NEAREST}
GREY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale

# The sections of a timm RandAugment string that timm 1.0 reads, as "rand-<section>-<section>...".
_RAND_SECTION = re.compile(r"m\d+|n\d+|p\d+(\.\d+)?|mstd\d+(\.\d+)?|inc[01]|t(weights|3aw|3a)")
_RAND_SECTIONS_HELP = ("m<int> magnitude (0-10), n<int> ops per image, p<float> probability of each op, "
                       "mstd<float> magnitude noise, inc0/inc1 severity-increasing ops, tweights/t3a/t3aw op sets")
# timm's posterize keeps int(4 - 4·m/10) bits (or int(4·m/10)): 0 bits at magnitude 10, which recent Pillow rejects.
# Capping the (noisy) magnitude just under 10 keeps at least one bit and changes no other op measurably.
_RAND_MAGNITUDE_CAP = 10 - 1e-6


def check_rand_augment(policy: str) -> str:
    """A timm RandAugment string such as ``rand-m9-mstd0.5-inc1``, checked section by section (timm itself skips
    sections it cannot parse; ``mmax`` is refused because magnitudes above 10 break timm's posterize), or a
    big_vision one such as ``bigvision-n2-m15`` (:func:`pkmixer.data.randaugment.parse_policy`)."""
    parts = policy.split("-") if isinstance(policy, str) else []
    if parts and parts[0] == BIGVISION_PREFIX:
        parse_policy(policy)
        return policy
    if not parts or parts[0] != "rand":
        raise ConfigError(f"rand_augment {policy!r} is not a RandAugment policy: it must start with 'rand' "
                          f"(timm's, e.g. rand-m9-mstd0.5-inc1) or '{BIGVISION_PREFIX}' (big_vision's, e.g. "
                          f"{BIGVISION_PREFIX}-n2-m15)")
    for part in parts[1:]:
        if not _RAND_SECTION.fullmatch(part):
            raise ConfigError(f"rand_augment {policy!r} has an unknown section {part!r}; allowed sections: "
                              f"{_RAND_SECTIONS_HELP}")
    return policy


def _channel_stats(info: DatasetInfo, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if in_chans == info.in_chans:
        return info.mean, info.std
    if (info.in_chans, in_chans) == (1, 3):
        return info.mean * 3, info.std * 3
    if (info.in_chans, in_chans) == (3, 1):
        return ((sum(w * m for w, m in zip(GREY_WEIGHTS, info.mean)),),
                (sum(w * s for w, s in zip(GREY_WEIGHTS, info.std)),))
    raise ConfigError(f"cannot turn {info.in_chans}-channel {info.name} images into in_chans={in_chans}; "
                      "only grey <-> RGB conversions are supported")


def natural_images(info: DatasetInfo) -> bool:
    """Whether ``info`` is a data set of photographs of varying sizes (ImageNet, image-folder trees), which get
    timm's ImageNet pre-processing: bicubic resampling and the crop_pct centre crop in evaluation."""
    return info.image_size is None


def _check_choice(name: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")


def build_transform(info: DatasetInfo, *, train: bool, img_size: int, in_chans: int, crop_padding: int | None = None,
                    hflip: bool = False, auto_augment: str | None = None, rand_augment: str | None = None,
                    random_erasing: float = 0.0, random_resized_crop: tuple[float, float] | None = None,
                    resize: int | None = None, eval_crop: str | None = None, crop_pct: float = 0.875,
                    interpolation: str | None = None, normalize: bool = True) -> v2.Compose:
    """The training (``train=True``) or evaluation pipeline for data set ``info`` and a model that takes
    (in_chans, img_size, img_size) inputs.

    crop_padding: random crop of img_size after zero-padding each side by this many pixels (App. C.4).
    random_resized_crop: (min, max) area fraction of an Inception-style random-resized crop, e.g. (0.08, 1.0);
        it replaces ``resize`` and ``crop_padding``.
    resize: resize to this square side first (STL-10 at 90 px, App. D.6); default img_size. A side larger than
        img_size is followed by a random crop (training) or a centre crop (evaluation without ``eval_crop``).
    auto_augment: "cifar10", "imagenet" or "svhn"; rand_augment: a timm policy string (``rand-...``) or a
        big_vision one (``bigvision-n2-m15``). At most one of them.
    random_erasing: probability of timm's per-pixel random erasing, applied after normalisation.
    eval_crop: None, "resize-crop" or "resmall-crop" (Mixer supp. C), with crop_pct = img_size / resized side;
        when set, it replaces ``resize`` in evaluation. None and no ``resize``: "resmall-crop" for
        :func:`natural_images` data sets (timm's evaluation), a plain resize to img_size for the others.
    interpolation: "bilinear", "bicubic" or "nearest"; None: bicubic for :func:`natural_images` data sets (timm's
        default for Mixers), bilinear for the others.
    """
    check_positive_int("img_size", img_size)
    check_positive_int("in_chans", in_chans)
    mean, std = _channel_stats(info, in_chans)
    if crop_padding is not None and (isinstance(crop_padding, bool) or not isinstance(crop_padding, int)
                                     or crop_padding < 0):
        raise ConfigError(f"crop_padding must be an integer >= 0 or None, got {crop_padding!r}")
    if resize is not None and (check_positive_int("resize", resize) < img_size):
        raise ConfigError(f"resize {resize} is smaller than img_size {img_size}; give resize >= img_size")
    if auto_augment is not None:
        _check_choice("auto_augment", auto_augment, list(AUTO_AUGMENT_POLICIES))
    if rand_augment is not None:
        check_rand_augment(rand_augment)
        if auto_augment is not None:
            raise ConfigError("auto_augment and rand_augment are both set; choose one augmentation policy")
    check_rate("random_erasing", random_erasing)
    if random_resized_crop is not None:
        scale = tuple(random_resized_crop) if isinstance(random_resized_crop, (tuple, list)) else ()
        if len(scale) != 2 or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scale) \
                or not 0 < scale[0] <= scale[1] <= 1:
            raise ConfigError(f"random_resized_crop must be a (min, max) area fraction with 0 < min <= max <= 1, "
                              f"got {random_resized_crop!r}")
        if resize is not None or crop_padding is not None:
            raise ConfigError("random_resized_crop replaces resize and crop_padding; drop them")
    _check_choice("eval_crop", eval_crop, [None, *EVAL_CROPS])
    check_density("crop_pct", crop_pct)
    if interpolation is None:
        interpolation = "bicubic" if natural_images(info) else "bilinear"
    _check_choice("interpolation", interpolation, list(INTERPOLATIONS))
    interp = INTERPOLATIONS[interpolation]
    if not train and eval_crop is None and resize is None and natural_images(info):
        eval_crop = "resmall-crop"  # timm: shorter side to floor(img_size / crop_pct), central crop

    steps: list[nn.Module] = []
    if in_chans != info.in_chans:
        steps.append(v2.RGB() if in_chans == 3 else v2.Grayscale(num_output_channels=1))
    side = resize or img_size
    if train:
        if random_resized_crop is not None:
            steps.append(v2.RandomResizedCrop(img_size, scale=tuple(random_resized_crop), interpolation=interp))
        else:
            steps.append(v2.Resize((side, side), interpolation=interp))
            if crop_padding is not None or side > img_size:
                steps.append(v2.RandomCrop(img_size, padding=crop_padding or None))
        if hflip:
            steps.append(v2.RandomHorizontalFlip())
        if auto_augment is not None:
            steps.append(v2.AutoAugment(AUTO_AUGMENT_POLICIES[auto_augment]))
        if rand_augment is not None and rand_augment.split("-")[0] == BIGVISION_PREFIX:
            steps.append(RandAugment.from_policy(rand_augment, img_size, fill=128))
        elif rand_augment is not None:
            hparams = {"translate_const": int(img_size * 0.45), "img_mean": tuple(round(255 * m) for m in mean),
                       "magnitude_max": _RAND_MAGNITUDE_CAP}
            steps += [v2.ToPILImage(), rand_augment_transform(rand_augment, hparams)]  # timm's ops work on PIL
    elif eval_crop is None:
        steps.append(v2.Resize((side, side), interpolation=interp))
        if side > img_size:
            steps.append(v2.CenterCrop(img_size))
    else:
        resized = math.floor(img_size / crop_pct)
        steps += [v2.Resize((resized, resized) if eval_crop == "resize-crop" else resized, interpolation=interp),
                  v2.CenterCrop(img_size)]
    steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    if normalize:
        steps.append(v2.Normalize(mean, std))
    steps.append(v2.ToPureTensor())
    if train and random_erasing > 0:
        steps.append(RandomErasing(random_erasing, mode="pixel", device="cpu"))
    return v2.Compose(steps)


def build_mixup(mixup_alpha: float, cutmix_alpha: float, switch_prob: float, label_smoothing: float,
                num_classes: int) -> Mixup | None:
    """timm's batch-wise mixup / cutmix with soft, smoothed targets (App. C.5: 0.8, 1.0, 0.5, 0.1), or None when
    both α are 0. It is called on a batch, ``images, soft_targets = mixup(images, labels)``, and needs an even
    batch size (use ``drop_last=True``)."""
    for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
    if isinstance(switch_prob, bool) or not isinstance(switch_prob, (int, float)) or not 0 <= switch_prob <= 1:
        raise ConfigError(f"switch_prob must lie in [0, 1], got {switch_prob!r}")
    check_rate("label_smoothing", label_smoothing)
    check_positive_int("num_classes", num_classes)
    if mixup_alpha == 0 and cutmix_alpha == 0:
        return None
    return Mixup(mixup_alpha=float(mixup_alpha), cutmix_alpha=float(cutmix_alpha), switch_prob=float(switch_prob),
                 label_smoothing=float(label_smoothing), num_classes=num_classes)


def build_loss(mixup_active: bool, label_smoothing: float) -> nn.Module:
    """The training loss as timm's train script picks it: soft-target cross-entropy under mixup (the smoothing is
    then in the targets), label-smoothing cross-entropy, or plain cross-entropy."""
    check_rate("label_smoothing", label_smoothing)
    if mixup_active:
        return SoftTargetCrossEntropy()
    if label_smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=label_smoothing)
    return nn.CrossEntropyLoss()
