"""Cost accounting against closed-form counts, torch's FLOP counter and published numbers."""
import math

import pytest
import torch
from torch import nn

import pkmixer
from pkmixer.analysis.cost import (cost_table, fixed_omega_comparison, fixed_omega_models, layer_costs, measured_macs,
                                   model_cost, saved_tensor_bytes, swmlp_expected_cost, table_s3_counts)
from pkmixer.analysis.throughput import training_step_seconds
from pkmixer.errors import ConfigError


def meta_model(name, **overrides):
    with torch.device("meta"):
        return pkmixer.create_model(name, **overrides)


def mixer_macs(S, C, P, D_S, D_C, depth, classes, in_chans=3):
    """Closed form: stem S·C·3P², per block C·2·S·D_S (token) + S·2·C·D_C (channel), head C·classes."""
    return S * C * in_chans * P * P + depth * (C * 2 * S * D_S + S * 2 * C * D_C) + C * classes


def test_mixer_b16_matches_published_numbers():
    report = model_cost(meta_model("mixer_b16_224"))
    assert report.params == 59_880_472  # published 59.9M (Tolstikhin et al. Table 1)
    assert report.macs == mixer_macs(196, 768, 16, 384, 3072, 12, 1000) == 12_601_767_936
    assert abs(report.macs / 12.6e9 - 1) < 0.01  # published 12.6 G
    assert report.forward_flops == 2 * report.macs and report.train_flops == 3 * report.forward_flops
    assert report.param_bytes == 4 * report.params and report.buffer_bytes == 0
    assert report.train_state_bytes == 4 * report.param_bytes


def test_mixer_s16_matches_published_numbers():
    report = model_cost(meta_model("mixer_s16_224"))
    assert abs(report.params / 18.5e6 - 1) < 0.02
    assert abs(report.macs / 3.8e9 - 1) < 0.02
    assert report.macs == mixer_macs(196, 512, 16, 256, 2048, 8, 1000)


@pytest.mark.parametrize("name, overrides", [
    ("mixer_t4_28", {}), ("smixer_t4_28", {}), ("rp_smixer_t4_28", {}),
    ("mixer_c64d3p4_32", {"depth": 1}), ("mixer_c64d3p4_32", {"depth": 1, "num_tokens": 36}),  # S0 -> S skip layer
    ("shallow_dense_28", {}), ("shallow_kronecker_28", {}), ("shallow_monarch_28", {}),
    ("swmlp_t4_28", {"weight_format": "masked", "width": 500}),  # dense-masked matmuls, input layer
])
def test_analytic_macs_equal_flop_counter(name, overrides):
    model = meta_model(name, **overrides)
    assert sum(layer.macs for layer in layer_costs(model)) == measured_macs(model)


def test_swmlp_sparse_form_costs_its_kept_weights():
    torch.manual_seed(0)
    sparse = pkmixer.create_model("swmlp_t4_28", density=1 / 64)
    masked = pkmixer.create_model("swmlp_t4_28", density=1 / 64, weight_format="masked")
    blocks = lambda model, kind: [c for c in layer_costs(model) if c.kind == kind and c.name.startswith("blocks")]
    kept, full = sum(c.macs for c in blocks(sparse, "sparse")), sum(c.macs for c in blocks(masked, "masked"))
    assert full == 4 * 784 * 784
    assert kept == sum(int(lin.mask.sum()) for blk in masked.blocks for lin in blk.linears)  # same masks
    assert abs(kept - full / 64) < 5 * math.sqrt(full / 64)  # binomial, 5 sigma
    a, b = model_cost(sparse), model_cost(masked)
    assert a.params == b.params  # trainable: kept weights in both forms
    assert b.stored_params - a.stored_params == full - kept
    assert b.buffer_bytes == full and a.buffer_bytes == 2 * 8 * kept  # bool masks vs int64 COO indices
    assert b.param_bytes > 20 * a.param_bytes
    assert b.saved_fixed_bytes == 4 * full and a.saved_fixed_bytes == 0  # the M ⊙ W products, float32


def test_activation_memory_is_linear_in_batch_and_leaves_state_alone():
    torch.manual_seed(0)
    model = pkmixer.create_model("mixer_t4_28", drop_rate=0.1).eval()
    rng = torch.get_rng_state()
    one, two, four = (saved_tensor_bytes(model, b) for b in (1, 2, 4))
    assert one > 0 and four - two == 2 * (two - one) and two - one == one  # no batch-independent saved tensors
    assert torch.equal(torch.get_rng_state(), rng) and not model.training
    report = model_cost(model, batch_size=8)
    assert report.activation_bytes_per_image == one and report.saved_fixed_bytes == 0
    assert report.train_memory_bytes == report.train_state_bytes + 8 * one
    assert model_cost(meta_model("mixer_t4_28", drop_rate=0.1)).activation_bytes_per_image == one  # meta: same
    assert saved_tensor_bytes(model, 2, torch.float16) == one  # half precision: half the bytes


def test_expected_swmlp_cost_equals_built_model_at_full_density():
    options = dict(img_size=16, patch_size=4, in_chans=1, embed_dim=8, width=100, depth=2, block="mlp",
                   mlp_ratio=1.5, density=1.0)
    for form in ("sparse", "masked"):
        built = model_cost(pkmixer.models.SWMLP(**options, weight_format=form)).as_dict()
        expected = swmlp_expected_cost(**options, weight_format=form).as_dict()
        for key in ("built", "activation_bytes_per_image", "saved_fixed_bytes", "train_memory_bytes"):
            built.pop(key), expected.pop(key)
        assert built == expected


def test_fixed_omega_comparison_reproduces_table_s3_settings():
    mixer, rp, sparse, masked = fixed_omega_comparison(344064, 2, 3, embed_dim=48)  # CIFAR: S=64, C=48
    assert "S=64 C=48" in mixer.model
    assert mixer.connections == rp.connections == 344064 == sparse.connections == masked.connections
    assert mixer.effective_width == sparse.effective_width == 64 * 48
    assert mixer.macs == rp.macs == mixer_macs(64, 48, 4, 128, 96, 3, 10)
    assert rp.buffer_bytes == 3 * 2 * 2 * 64 * 48 * 8  # two int64 permutations per mixing layer
    assert sparse.macs < masked.macs / 40 and masked.param_bytes > 1000 * mixer.param_bytes
    symmetric = fixed_omega_comparison("2**19", 2, 3)  # S = C = (Ω/γ)^{1/3} = 64
    assert symmetric[0].effective_width == 4096 and symmetric[0].connections == 2 ** 19


def test_imagenet_dense_masked_swmlp_state_is_table_s3_size():
    reports = fixed_omega_comparison(254_091_264, 4, 8, embed_dim=588, img_size=224, patch_size=14,
                                     num_classes=1000)
    masked = reports[-1]
    assert masked.effective_width == 256 * 588 and not masked.built
    # weights, gradients and two AdamW moments in float32: 23.2 TB (Table S.3; the masks come on top)
    assert abs(4 * masked.param_bytes / 23.2e12 - 1) < 0.01


def test_table_s3_convention_gives_the_printed_numbers():
    # CIFAR at S = C = 64 (the caption's C = 48 does not give them), L = 3, γ = 2; SW-MLP of 2L blocks
    mixer, rp, sw = table_s3_counts(64, 64, 3, 2.0)
    assert mixer.flops == rp.flops == 2 * 4 * 3 * 2**19 == 12_582_912  # printed 12.5 M
    assert mixer.memory_bytes == 4 * 98_304  # 0.393 MB; printed 3.93 MB
    assert sw.flops == 805_306_368 and sw.memory_bytes == 3_221_225_472  # printed 805 M, 3.22 GB
    mixer, _, sw = table_s3_counts(256, 588, 8, 4.0)
    assert sw.flops == 5_800_621_768_704 and sw.memory_bytes == 23_202_487_074_816  # printed 5.80 T, 23.2 TB
    mixer_g1 = table_s3_counts(256, 588, 8, 1.0)[0]
    assert mixer_g1.flops == 4_065_460_224 and mixer_g1.memory_bytes == 26_321_920  # printed 4.06 G, 26.3 MB
    assert mixer.flops == 4 * mixer_g1.flops
    assert table_s3_counts(64, 64, 3, 2.0, swmlp_depth=3)[2].flops == 805_306_368 // 2


def test_fixed_omega_models_are_the_costed_ones():
    kwargs = dict(omega=2 * (36**3), gamma=2.0, depth=1, embed_dim=36, img_size=24, patch_size=4, swmlp_depth=2)
    models = fixed_omega_models(**kwargs, forms=("sparse",))
    reports = fixed_omega_comparison(**kwargs)[:3]
    assert list(models) == [r.model for r in reports]
    for model, report in zip(list(models.values())[:2], reports):
        assert model.info().params == report.params and model.info().connections == report.connections
    sw = models[reports[2].model].info()  # drawn masks: the expected kept weights within 1 %
    assert sw.depth == 2 and sw.effective_width == reports[2].effective_width == 36 * 36
    assert abs(sw.connections / reports[2].connections - 1) < 0.01


def test_training_step_seconds_times_each_model_and_restores_threads():
    threads = torch.get_num_threads()
    models = {"a": meta_free("mixer_t4_28", depth=1), "b": meta_free("smixer_t4_28", depth=1)}
    result = training_step_seconds(models, batch_size=4, repeats=2, threads=1)
    assert torch.get_num_threads() == threads
    assert set(result["median"]) == {"a", "b"} and all(len(t) == 2 for t in result["times"].values())
    assert all(m > 0 for m in result["median"].values()) and result["threads"] == 1 and result["device"]
    with pytest.raises(ConfigError, match="repeats"):
        training_step_seconds(models, repeats=0)


def meta_free(name, **overrides):
    torch.manual_seed(0)
    return pkmixer.create_model(name, **overrides)


def test_bad_input_raises_config_error():
    model = meta_model("mixer_t4_28")
    with pytest.raises(ConfigError, match="supports"):
        model_cost(nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="batch_size"):
        model_cost(model, batch_size=0)
    with pytest.raises(ConfigError, match="dtype"):
        model_cost(model, dtype=torch.int32)
    with pytest.raises(ConfigError, match="unknown model"):
        cost_table(["mixer_t4_2"])
    with pytest.raises(ConfigError, match="density"):
        swmlp_expected_cost(density=2.0)
    with pytest.raises(ConfigError, match="unknown SW-MLP option"):
        swmlp_expected_cost(widht=10)
    with pytest.raises(ConfigError, match="Ω"):
        fixed_omega_comparison("two")
