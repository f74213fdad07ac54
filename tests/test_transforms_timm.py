"""ImageNet and image-folder pre-processing as timm's (Hayase & Karakida App. C.5 used timm): evaluation resizes
the shorter side to ⌊224 / 0.875⌋ = 256 with bicubic interpolation and takes the central 224 crop; training
resamples bicubically. Other data sets keep their own pre-processing."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform
from torchvision.transforms import InterpolationMode, v2

from pkmixer.data import build_transform, dataset_info, natural_images
from pkmixer.train.config import build_config, load_yaml

CONFIGS = Path(__file__).parent.parent / "configs"
IMAGENET_PRESETS = [CONFIGS / "imagenet_mixer.yaml", *sorted((CONFIGS / "supp").glob("imagenet*.yaml"))]
SIZES = [(500, 375), (375, 500), (256, 256), (1000, 231), (225, 900), (224, 224), (640, 480)]  # (width, height)


def photos():
    rng = np.random.default_rng(0)
    for w, h in SIZES:
        # smooth content plus noise, so that interpolation differences would show
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([128 + 100 * np.sin(xx / 17 + c) * np.cos(yy / 23 - c) for c in range(3)], axis=2)
        yield Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))


def timm_eval(normalize=True):
    return create_transform(224, is_training=False, crop_pct=0.875, interpolation="bicubic", normalize=normalize)


def test_imagenet_is_the_natural_image_data_set():
    assert natural_images(dataset_info("imagenet"))
    assert not any(natural_images(dataset_info(name)) for name in ("cifar10", "stl10", "mnist", "digits"))


def test_imagenet_evaluation_equals_timms():
    ours = build_transform(dataset_info("imagenet"), train=False, img_size=224, in_chans=3)
    ours_raw = build_transform(dataset_info("imagenet"), train=False, img_size=224, in_chans=3, normalize=False)
    theirs, theirs_raw = timm_eval(), timm_eval(normalize=False)
    for photo in photos():
        expected = theirs(photo)
        got = ours(photo)
        assert got.shape == expected.shape == (3, 224, 224)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)  # x / 255 against x · (1 / 255)
        raw = theirs_raw(photo)  # uint8: the resized, cropped pixels themselves
        assert raw.dtype == torch.uint8 and torch.equal((ours_raw(photo) * 255).round().to(torch.uint8), raw)


def test_explicit_choices_still_win():
    info = dataset_info("imagenet")
    common = dict(train=False, img_size=224, in_chans=3)
    steps = build_transform(info, eval_crop="resize-crop", **common).transforms
    assert steps[0].size == [256, 256]  # the square resize of supp. C's resize-crop
    steps = build_transform(info, resize=240, **common).transforms
    assert steps[0].size == [240, 240] and isinstance(steps[1], v2.CenterCrop)
    steps = build_transform(info, interpolation="bilinear", **common).transforms
    assert steps[0].interpolation == InterpolationMode.BILINEAR and steps[0].size == [256]


def test_imagenet_training_resamples_bicubically_and_others_bilinearly():
    crop = dict(train=True, img_size=224, in_chans=3, random_resized_crop=(0.08, 1.0), hflip=True)
    steps = build_transform(dataset_info("imagenet"), **crop).transforms
    assert isinstance(steps[0], v2.RandomResizedCrop) and steps[0].interpolation == InterpolationMode.BICUBIC
    steps = build_transform(dataset_info("cifar10"), **crop).transforms
    assert steps[0].interpolation == InterpolationMode.BILINEAR
    # CIFAR evaluation is unchanged: a square resize, bilinear
    steps = build_transform(dataset_info("cifar10"), train=False, img_size=224, in_chans=3).transforms
    assert steps[0].size == [224, 224] and steps[0].interpolation == InterpolationMode.BILINEAR


@pytest.mark.parametrize("path", IMAGENET_PRESETS, ids=lambda p: p.name)
def test_imagenet_presets_evaluate_as_timm(path):
    d = build_config(load_yaml(path)).data
    # the arguments pkmixer.train.loop passes to the evaluation transform
    ours = build_transform(dataset_info(d.name), train=False, img_size=224, in_chans=3, resize=d.resize,
                           eval_crop=d.eval_crop)
    theirs = timm_eval()
    for photo in list(photos())[:3]:
        torch.testing.assert_close(ours(photo), theirs(photo), rtol=0, atol=1e-5)
