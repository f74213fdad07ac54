"""Higher-resolution fine-tuning (Mixer supp. C): the tiling identity, exactly."""
import pytest
import torch

import pkmixer
from pkmixer.errors import ConfigError
from pkmixer.models.mixer import tiled_token_order
from pkmixer.models.resolution import enlarge_resolution

from conftest import perturb_


def test_tiled_order_makes_parts_contiguous():
    order = tiled_token_order(4, 2)
    assert sorted(order.tolist()) == list(range(16))
    assert order.view(4, 4).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    assert torch.equal(tiled_token_order(6, 1), torch.arange(36))


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("name,overrides", [
    ("mixer_s16_224", dict(img_size=32, patch_size=8, depth=2, embed_dim=12, token_hidden=6, channel_hidden=20)),
    ("smixer_t4_28", dict(depth=2, img_size=16)),
])
def test_tiling_identity(K, name, overrides):
    """On an image tiled from K×K images, every token feature of the enlarged model equals the original
    model's feature on the corresponding tile."""
    small = perturb_(pkmixer.create_model(name, **overrides)).double().eval()
    big = enlarge_resolution(small, K).eval()
    assert big.img_size == K * small.img_size and big.num_tokens == K * K * small.num_tokens
    if small.token_hidden is not None:
        assert big.token_hidden == K * K * small.token_hidden
    tiles = torch.randn(K, K, 2, small.in_chans, small.img_size, small.img_size, dtype=torch.float64)
    image = torch.cat([torch.cat(list(row), dim=-1) for row in tiles], dim=-2)  # (2, chans, K·H, K·W)
    with torch.no_grad():
        feats = big.forward_features(image).view(2, K * K, small.num_tokens, small.embed_dim)
        for a in range(K):
            for b in range(K):
                expected = small.forward_features(tiles[a, b])
                assert torch.allclose(feats[:, a * K + b], expected, rtol=1e-12, atol=1e-12)
        # the logits of the tiled image are those of the mean feature over tiles
        assert big(image).shape == (2, small.num_classes)


def test_enlarged_model_rebuilds_from_its_spec(tmp_path):
    from pkmixer.checkpoint import save_model
    from pkmixer.models.restore import load_model

    small = perturb_(pkmixer.create_model("mixer_c64d3p4_32", depth=1, img_size=16))
    big = enlarge_resolution(small, 2)
    again = load_model(save_model(tmp_path / "big.pt", big))
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(again(x), big(x))


def test_refusals():
    with pytest.raises(ConfigError, match="RP"):
        enlarge_resolution(pkmixer.create_model("rp_smixer_t4_28", depth=1), 2)
    with pytest.raises(ConfigError, match="num_tokens"):
        enlarge_resolution(pkmixer.create_model("smixer_c128p4_32", depth=1), 2)
    with pytest.raises(ConfigError, match="positive integer"):
        enlarge_resolution(pkmixer.create_model("smixer_t4_28", depth=1), 0)
    with pytest.raises(ConfigError, match="token_tiles"):
        pkmixer.create_model("smixer_t4_28", token_tiles=2)  # 7-patch grid
