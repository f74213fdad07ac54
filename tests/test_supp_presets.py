"""The presets of configs/supp against the MLP-Mixer supplementary: Table 1 (pre-training), section B
(RandAugment with two layers, stochastic depth) and section C (fine-tuning grid and evaluation crops)."""
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

import pkmixer
from pkmixer.data.datasets import dataset_info
from pkmixer.data.randaugment import RandAugment
from pkmixer.data.transforms import build_transform
from pkmixer.train.config import build_config, load_yaml

SUPP = Path(__file__).parent.parent / "configs" / "supp"
PRESETS = sorted(SUPP.glob("*.yaml"))

# Table 1: (model, epochs, lr, wd, RandAugment magnitude, mixup, dropout, stochastic depth)
TABLE1 = {
    "imagenet_mixer_b16.yaml": ("mixer_b16_224", 300, 0.001, 0.1, 15, 0.5, 0.0, 0.1),
    "imagenet_mixer_l16.yaml": ("mixer_l16_224", 300, 0.001, 0.1, 15, 0.5, 0.0, 0.1),
    "imagenet21k_mixer_b16.yaml": ("mixer_b16_224", 300, 0.001, 0.1, 10, 0.2, 0.0, 0.1),
    "imagenet21k_mixer_l16.yaml": ("mixer_l16_224", 300, 0.001, 0.1, 20, 0.5, 0.0, 0.1),
}
FINETUNE = {"finetune_cifar10.yaml": "cifar10", "finetune_cifar100.yaml": "cifar100"}  # section C
LR_GRID = (0.003, 0.01, 0.03, 0.06)  # section C: ViT's grid without 0.001, with 0.06 for CIFAR-10/100


def config(name):
    return build_config(load_yaml(SUPP / name))


def test_every_preset_is_checked_here():
    assert sorted(p.name for p in PRESETS) == sorted([*TABLE1, *FINETUNE])


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_parses_and_states_source_command_and_expectation(path):
    cfg = build_config(load_yaml(path))
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    text = "\n".join(header)
    assert path.read_text().startswith("# Source: MLP-Mixer supplementary")
    assert f"pkmixer train configs/supp/{path.name}" in text.replace("pkmixer.cli train", "pkmixer train")
    assert "# Expect:" in text
    with torch.device("meta"):  # the model options are the model's own
        model = pkmixer.create_model(cfg.model.name, **cfg.model.options)
    assert model.img_size == 224  # supp. C: resolution 224 unless mentioned otherwise; Table 2: 224


@pytest.mark.parametrize("name", list(TABLE1))
def test_pretraining_presets_equal_table_1(name):
    model, epochs, lr, wd, magnitude, mixup, dropout, depth = TABLE1[name]
    cfg = config(name)
    assert cfg.model.name == model
    assert cfg.schedule.epochs == epochs
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay) == ("adamw", lr, wd)
    assert cfg.data.rand_augment == f"bigvision-n2-m{magnitude}"  # section B: always two layers
    assert cfg.data.mixup == mixup and cfg.data.cutmix == 0.0
    assert cfg.model.options["proj_drop_rate"] == dropout and cfg.model.options.get("drop_rate", 0.0) == 0.0
    assert cfg.model.options["drop_path_rate"] == depth
    assert cfg.data.name == "imagenet"  # ImageNet-21k too: an ImageFolder tree, classes from its folders
    assert cfg.data.batch_size == 4096 and cfg.optim.clip_grad == 1.0  # main text, said in the header


def test_stochastic_depth_rises_linearly_from_zero_to_the_table_value():
    cfg = config("imagenet_mixer_b16.yaml")
    with torch.device("meta"):
        model = pkmixer.create_model(cfg.model.name, **cfg.model.options)
    rates = [sub.drop_path.drop_prob if hasattr(sub.drop_path, "drop_prob") else 0.0
             for block in model.blocks for sub in (block.token, block.channel)]
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.1) and rates == sorted(rates)


@pytest.mark.parametrize("name", list(TABLE1))
def test_rand_augment_runs_at_the_tables_magnitude(name):
    """big_vision's RandAugment (the Mixer authors' own): magnitudes 15 and 20 are not capped at 10."""
    cfg = config(name)
    transform = build_transform(dataset_info("imagenet"), train=True, img_size=224, in_chans=3, hflip=True,
                                random_resized_crop=cfg.data.random_resized_crop, rand_augment=cfg.data.rand_augment)
    augment = next(step for step in transform.transforms if isinstance(step, RandAugment))
    assert (augment.num_layers, augment.magnitude) == (2, TABLE1[name][4])
    assert augment.arguments["Rotate"] == pytest.approx(3.0 * TABLE1[name][4])  # 30 degrees at magnitude 10
    assert "Caveat" not in (SUPP / name).read_text()
    out = transform(Image.new("RGB", (64, 48), (120, 60, 30)))  # the pipeline runs
    assert out.shape == (3, 224, 224)


@pytest.mark.parametrize("name", list(FINETUNE))
def test_finetuning_presets_equal_section_c(name):
    cfg = config(name)
    assert cfg.data.name == FINETUNE[name]
    assert (cfg.optim.name, cfg.optim.momentum, cfg.optim.nesterov) == ("sgd", 0.9, False)
    assert cfg.data.batch_size == 512
    assert cfg.optim.lr in LR_GRID
    assert cfg.data.eval_crop in ("resize-crop", "resmall-crop")
    assert cfg.optim.weight_decay == 0.0 and cfg.optim.clip_grad == 1.0
    assert cfg.model.init is None  # given with --set model.init=CKPT
    text = (SUPP / name).read_text()
    grid = re.search(r"lr ∈ \{([^}]*)\}", text).group(1)
    assert tuple(float(v) for v in grid.split(",")) == LR_GRID
    assert "{resize-crop, resmall-crop}" in text
    assert build_config(load_yaml(SUPP / name), {"model.init": "ckpt.pt"}).model.init == "ckpt.pt"


@pytest.mark.parametrize("name", list(FINETUNE))
def test_finetuning_eval_crops_resize_cifar_to_224(name):
    cfg = config(name)
    image = Image.new("RGB", (32, 32), (10, 200, 90))
    for crop in ("resize-crop", "resmall-crop"):
        transform = build_transform(dataset_info(FINETUNE[name]), train=False, img_size=224, in_chans=3,
                                    resize=cfg.data.resize, eval_crop=crop)
        assert transform(image).shape == (3, 224, 224)
    train = build_transform(dataset_info(FINETUNE[name]), train=True, img_size=224, in_chans=3,
                            resize=cfg.data.resize, hflip=cfg.data.hflip)
    assert train(image).shape == (3, 224, 224)


def test_jft_rows_are_documented_not_preset():
    readme = (SUPP / "README.md").read_text()
    assert "JFT-300M" in readme and "no preset" in readme
    assert not any("jft" in p.name.lower() for p in PRESETS)
