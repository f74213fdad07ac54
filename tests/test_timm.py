"""Parity with timm's mixer_* models, both ways, and timm registration."""
import pytest
import timm
import torch

import pkmixer
from pkmixer.errors import ConfigError
from pkmixer.models.convert import from_timm, to_timm

from conftest import perturb_, rel_err


def _random_timm(name: str) -> torch.nn.Module:
    model = timm.create_model(name).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)  # random weights everywhere, head and biases included
    return model


@pytest.mark.parametrize("name", ["mixer_s16_224", "mixer_b16_224"])
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
        to_timm(pkmixer.create_model("rp_mixer_s64_32", depth=1))
    with pytest.raises(ConfigError, match="MLP-Mixer"):
        to_timm(pkmixer.create_model("smixer_s64_32", depth=1))


def test_timm_registry():
    names = timm.list_models("pkmixer_*")
    assert set(names) == {f"pkmixer_{n}" for n in pkmixer.list_models()}
    model = timm.create_model("pkmixer_rp_smixer_s64_32", num_classes=7, drop_path_rate=0.1)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    assert model.rp_blocks == frozenset(range(8))
    with pytest.raises(ConfigError, match="pretrained"):
        timm.create_model("pkmixer_mixer_s16_224", pretrained=True)
