"""Parity with timm's mixer_* models, both ways, timm registration, and timm's model conventions
(pretrained_cfg, num_features, get_classifier, reset_classifier)."""
import pytest
import timm
import torch
from timm.data import resolve_data_config

import pkmixer
from pkmixer.data.datasets import dataset_info
from pkmixer.errors import ConfigError
from pkmixer.models import Mixer
from pkmixer.models.convert import from_timm, to_timm
from pkmixer.checkpoint import save_model
from pkmixer.models.restore import load_model

from conftest import perturb_, rel_err


def _random_timm(name: str) -> torch.nn.Module:
    model = timm.create_model(name).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)  # random weights everywhere, head and biases included
    return model


@pytest.mark.parametrize("name", ["mixer_s16_224", pytest.param("mixer_b16_224", marks=pytest.mark.slow)])
def test_timm_to_pkmixer_and_back(name):
    theirs = _random_timm(name)
    ours = from_timm(theirs).eval()
    assert ours.info().params == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        ref = theirs(x)
        assert rel_err(ours(x), ref) <= 1e-5
        back = to_timm(ours).eval()
        assert rel_err(back(x), ref) <= 1e-5
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), theirs.state_dict().values()))


def test_pkmixer_to_timm_registered_variant():
    """Our registered S/16 (Flax init, then perturbed) converts to timm with the same logits."""
    ours = perturb_(pkmixer.create_model("mixer_s16_224", img_size=64, depth=2), 0.02).eval()
    theirs = to_timm(ours).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert rel_err(theirs(x), ours(x)) <= 1e-5
    with torch.no_grad():
        assert rel_err(from_timm(theirs)(x), ours(x)) <= 1e-5


def test_rp_and_smixer_do_not_convert():
    with pytest.raises(ConfigError, match="RP"):
        to_timm(pkmixer.create_model("rp_mixer_c64p4_32", depth=1))
    with pytest.raises(ConfigError, match="MLP-Mixer"):
        to_timm(pkmixer.create_model("smixer_c64p4_32", depth=1))


def test_timm_registry():
    names = timm.list_models("pkmixer_*")
    assert set(names) == {f"pkmixer_{n}" for n in pkmixer.list_models()}
    model = timm.create_model("pkmixer_rp_smixer_c64p4_32", num_classes=7, drop_path_rate=0.1)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    assert model.rp_blocks == frozenset(range(8))
    with pytest.raises(ConfigError, match="pretrained"):
        timm.create_model("pkmixer_mixer_s16_224", pretrained=True)


def _stats(name):
    info = dataset_info(name)
    return {"mean": info.mean, "std": info.std}


@pytest.mark.parametrize("name, data_set, size", [
    ("mixer_t4_28", "fashion-mnist", (1, 28, 28)), ("swmlp_t4_28", "fashion-mnist", (1, 28, 28)),
    ("shallow_monarch_28", "mnist", (1, 28, 28)), ("rp_smixer_c64p4_32", "cifar10", (3, 32, 32)),
    ("mixer_s32_224", "imagenet", (3, 224, 224))])
def test_resolve_data_config_gives_the_model_s_own_input(name, data_set, size):
    with torch.device("meta"):
        model = pkmixer.create_model(name)
    cfg = resolve_data_config(model=model)
    assert (cfg["input_size"], cfg["mean"], cfg["std"]) == (size, *_stats(data_set).values())
    natural = data_set == "imagenet"
    assert (cfg["interpolation"], cfg["crop_pct"]) == (("bicubic", 0.875) if natural else ("bilinear", 1.0))
    pc = model.pretrained_cfg
    assert (pc["num_classes"], pc["classifier"], pc["architecture"]) == (model.num_classes, "head", "pkmixer_" + name)
    assert pc["first_conv"] == ("fc1" if name.startswith("shallow") else "stem")
    registered = timm.models.get_pretrained_cfg("pkmixer_" + name).to_dict()  # timm's registry has it too
    keys = ("architecture", "input_size", "fixed_input_size", "interpolation", "crop_pct", "mean", "std",
            "num_classes", "first_conv", "classifier")
    assert {k: registered[k] for k in keys} == {k: pc[k] for k in keys}


def test_cfg_follows_overrides_and_the_class():
    grey = pkmixer.create_model("mixer_t4_28", img_size=32, in_chans=3, depth=1)
    cfg = resolve_data_config(model=grey)
    mean, std = _stats("fashion-mnist").values()
    assert cfg["input_size"] == (3, 32, 32) and cfg["mean"] == mean * 3 and cfg["std"] == std * 3
    # a model built from its class: the data set its input sizes suggest
    assert resolve_data_config(model=Mixer(img_size=28, patch_size=7, in_chans=1, depth=1, embed_dim=8))["mean"] \
        == mean
    cifar = Mixer(img_size=32, patch_size=8, depth=1, embed_dim=8)
    assert resolve_data_config(model=cifar)["mean"] == _stats("cifar10")["mean"]
    cifar.data_set = "imagenet"  # what the model is for, when the guess is wrong
    assert resolve_data_config(model=cifar)["crop_pct"] == 0.875
    with pytest.raises(ConfigError, match="did you mean"):
        cifar.data_set = "cifar11"


def test_timm_create_model_like_timm_s_models():
    model = timm.create_model("pkmixer_mixer_t4_28", pretrained=False, num_classes=3, in_chans=3, depth=2,
                              pretrained_cfg_overlay={"crop_pct": 0.9})
    assert model(torch.randn(2, 3, 28, 28)).shape == (2, 3)
    cfg = resolve_data_config(model=model)
    assert cfg["input_size"] == (3, 28, 28) and cfg["crop_pct"] == 0.9
    assert model.pretrained_cfg["num_classes"] == model.num_classes == 3
    assert model.spec.overrides == {"num_classes": 3, "in_chans": 3, "depth": 2}
    headless = timm.create_model("pkmixer_swmlp_t4_28", num_classes=0)
    assert headless(torch.randn(2, 1, 28, 28)).shape == (2, headless.num_features) == (2, 784)
    assert isinstance(headless.get_classifier(), torch.nn.Identity)


@pytest.mark.parametrize("name, features", [("mixer_t4_28", 64), ("swmlp_t4_28", 784), ("shallow_kronecker_28", 784)])
def test_reset_classifier_changes_the_head_and_keeps_the_rest(name, features, tmp_path):
    torch.manual_seed(0)
    model = pkmixer.create_model(name).double()
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    assert model.num_features == model.head_hidden_size == features
    assert model.get_classifier() is model.head
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 1, 28, 28, dtype=torch.float64)
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    model.reset_classifier(5, global_pool=model.global_pool)
    head = model.get_classifier()
    assert head.weight.shape == (5, features) and head.weight.dtype == torch.float64
    assert model.num_classes == 5 == model.pretrained_cfg["num_classes"]
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items() if not k.startswith("head."))
    with torch.no_grad():
        out = model(x)
        assert out.shape == (2, 5)
        assert torch.allclose(out, head(pooled))
    if name.startswith("shallow"):
        assert head.weight.abs().sum() > 0  # PyTorch's initialisation, as the model's own head
    else:
        assert not out.any()  # a zero head, as Listing 1 starts
    # the spec records the new head, so that a checkpoint rebuilds it
    assert model.spec.overrides["num_classes"] == 5
    loaded = load_model(save_model(tmp_path / "m.pt", model.float()))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), torch.nn.Identity)
    with torch.no_grad():
        assert model(x.float()).shape == (2, features)
    with pytest.raises(ConfigError, match="global_pool"):
        model.reset_classifier(3, global_pool="max")
    with pytest.raises(ConfigError, match="num_classes"):
        model.reset_classifier(-1)
