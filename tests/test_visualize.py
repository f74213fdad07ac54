"""Weight pictures: ordering and inverse matching on constructed units, sparsity counts, files written."""
import numpy as np
import pytest
import torch

import pkmixer
from pkmixer.analysis.visualize import (closest_inverses, effective_pattern, low_frequency_order,
                                        sparsity_masks, sparsity_patterns, spatial_frequency, token_unit_sequence,
                                        visualize)
from pkmixer.errors import ConfigError


def cosine_family(n=8):
    """cos(2π k x / n) along x for k = 0 .. n/2: radial frequency k/n, strictly increasing."""
    x = np.arange(n)
    return np.stack([np.tile(np.cos(2 * np.pi * k * x / n), (n, 1)) for k in range(n // 2 + 1)])


def is_permuted_block_diagonal(pattern, blocks, size):
    """Whether a 0/1 matrix is a row and column permutation of I_blocks ⊗ ones(size, size)."""
    rows, counts = np.unique(pattern, axis=0, return_counts=True)
    return (len(rows) == blocks and np.all(counts == size) and np.all(rows.sum(axis=1) == size)
            and np.array_equal(rows.sum(axis=0), np.ones(pattern.shape[1])))


def test_constant_unit_sorts_before_checkerboard():
    checker = np.indices((6, 6)).sum(axis=0) % 2 * 2.0 - 1
    units = np.stack([checker, np.ones((6, 6))])
    assert np.allclose(spatial_frequency(units), [np.sqrt(2) / 2, 0])
    assert low_frequency_order(units).tolist() == [1, 0]


def test_order_is_monotone_in_a_frequency_family():
    family = cosine_family(8)
    shuffled = np.random.default_rng(0).permutation(len(family))
    assert np.allclose(spatial_frequency(family), np.arange(5) / 8)
    assert shuffled[low_frequency_order(family[shuffled])].tolist() == list(range(5))


def test_inverse_of_a_negated_unit_is_that_unit():
    units = np.random.default_rng(0).normal(size=(6, 16))
    units[4] = -units[1]
    inverse = closest_inverses(units)
    assert inverse[1] == 4 and inverse[4] == 1
    assert np.all(inverse != np.arange(6))


def test_token_sequence_pairs_each_unit_with_its_inverse():
    family = cosine_family(8).reshape(5, 64)
    weights = np.concatenate([family[[3, 0, 2]], -family[[2, 3]]])  # units 3, 4 invert 2, 0
    sequence = token_unit_sequence(weights)
    # frequency order 1 (k=0), 2 and 3 (k=2), 0 and 4 (k=3), each followed by its closest inverse
    assert sequence.reshape(-1, 2)[:, 0].tolist() == [1, 2, 3, 0, 4]
    assert sequence.reshape(-1, 2)[1:, 1].tolist() == [3, 2, 4, 0]
    assert len(token_unit_sequence(weights, num_units=2)) == 4
    with pytest.raises(ConfigError, match="square"):
        token_unit_sequence(np.ones((4, 12)))


@pytest.mark.parametrize("S, C", [(8, 8), (4, 6)])
def test_sparsity_masks_have_the_expected_non_zeros(S, C):
    sw, mixer, rp = sparsity_masks(S, C, seed=1).values()
    I_kron = np.kron(np.eye(C), np.ones((S, S))).astype(bool)
    assert np.array_equal(mixer, I_kron) and mixer.sum() == C * S * S
    assert rp.sum() == C * S * S and not np.array_equal(rp, mixer)
    assert is_permuted_block_diagonal(rp, C, S)
    m = S * C
    assert abs(sw.sum() - m * m / C) < 5 * np.sqrt(m * m / C)  # Bernoulli(1/C), 5 sigma


def test_effective_patterns_of_models():
    normal = pkmixer.create_model("smixer_c64p4_32", depth=1, embed_dim=16, img_size=16)  # S = C = 16
    rp = pkmixer.create_model("rp_smixer_c64p4_32", depth=1, embed_dim=16, img_size=16)
    name, pattern = effective_pattern(normal)
    assert name == "blocks.0.token.fc" and np.array_equal(pattern, np.kron(np.eye(16), np.ones((16, 16))))
    _, rp_pattern = effective_pattern(rp, "blocks.0.token.fc")
    assert is_permuted_block_diagonal(rp_pattern, 16, 16)
    _, channel = effective_pattern(normal, -1)  # channel mixing Vᵀ ⊗ I_S
    assert np.array_equal(channel, np.kron(np.ones((16, 16)), np.eye(16)))
    with pytest.raises(ConfigError, match="unknown effective layer"):
        effective_pattern(normal, "blocks.0.tokn.fc")


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_pictures_are_written(tmp_path, suffix, magic):
    model = pkmixer.create_model("mixer_t4_28", embed_dim=16)  # token fc1: (98·16) × (49·16)
    paths = [sparsity_patterns(path=tmp_path / f"sparsity{suffix}"),
             visualize("sparsity", tmp_path / f"model_sparsity{suffix}", model=model, layer="blocks.0.token.fc1"),
             visualize("token-units", tmp_path / "sub" / f"token{suffix}", model=model, num_units=8, block=1),
             visualize("patch-units", tmp_path / f"patch{suffix}", model=model, num_units=10)]
    for path in paths:
        assert path.exists() and path.read_bytes().startswith(magic) and path.stat().st_size > 1000
    rgb = pkmixer.create_model("mixer_c64d3p4_32", depth=1)
    assert visualize("patch-units", tmp_path / f"rgb{suffix}", model=rgb).stat().st_size > 1000


def test_bad_pictures_raise_config_error(tmp_path):
    model = pkmixer.create_model("mixer_t4_28")
    with pytest.raises(ConfigError, match="projected by an earlier block"):  # block 1 reads 48 learned tokens
        visualize("token-units", tmp_path / "t.png", model=pkmixer.create_model("mixer_t4_28", num_tokens=48),
                  block=1)
    visualize("token-units", tmp_path / "ok0.png", model=pkmixer.create_model("mixer_t4_28", num_tokens=48))
    with pytest.raises(ConfigError, match="projected by an earlier block"):  # S = 49, 49, 25, 16
        visualize("token-units", tmp_path / "t.png", model=pkmixer.create_model("mixer_pyramid_t4_28"), block=3)
    for name, option in [("mixer_untied_t4_28", "untied_tokens"), ("mixer_views_t4_28", "group_views")]:
        with pytest.raises(ConfigError, match=option):
            visualize("token-units", tmp_path / "t.png", model=pkmixer.create_model(name))
    visualize("token-units", tmp_path / "ok.png", model=pkmixer.create_model("mixer_pyramid_t4_28"), block=1)
    with pytest.raises(ConfigError, match="no spatial layout"):
        visualize("token-units", tmp_path / "t.png", model=pkmixer.create_model("rp_smixer_t4_28"))
    with pytest.raises(ConfigError, match="block"):
        visualize("token-units", tmp_path / "t.png", model=model, block=4)
    with pytest.raises(ConfigError, match=r"\.png or \.svg"):
        visualize("sparsity", tmp_path / "s.jpg")
    with pytest.raises(ConfigError, match="unknown picture kind"):
        visualize("token_units", tmp_path / "t.png", model=model)
    with pytest.raises(ConfigError, match="unknown option"):
        visualize("patch-units", tmp_path / "p.png", model=model, units=3)
    with pytest.raises(ConfigError, match="needs a model"):
        visualize("patch-units", tmp_path / "p.png")
    with pytest.raises(ConfigError, match="input channels"):
        visualize("patch-units", tmp_path / "p.png", model=pkmixer.create_model("mixer_t4_28", in_chans=2))
    with torch.device("meta"):
        meta = pkmixer.create_model("mixer_t4_28")
    with pytest.raises(ConfigError, match="meta"):
        visualize("patch-units", tmp_path / "p.png", model=meta)
