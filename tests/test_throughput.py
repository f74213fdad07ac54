"""Throughput table of the MLP-Mixer supplementary, Table 2: the computed pre-training exaFLOPs against the
published column, a quick CPU measurement, and refusals of bad input."""
import math

import pytest
import torch

from pkmixer.analysis.cost import layer_costs
from pkmixer.analysis.throughput import JFT_IMAGES, QUICK, TABLE2, images_per_second, pretrain_exaflops, \
    throughput_table
from pkmixer.errors import ConfigError
from pkmixer.models.registry import create_model


@pytest.mark.parametrize("name", list(TABLE2))
def test_computed_exaflops_reproduce_the_published_column(name):
    published = TABLE2[name].exaflops
    ours = pretrain_exaflops(name)
    assert abs(ours / published - 1) < 0.03  # 0 to 2.3 % below: only matrix products are counted
    assert ours <= published * 1.005
    with torch.device("meta"):
        macs = sum(layer.macs for layer in layer_costs(create_model(name)))
    forward_only = 2 * macs * JFT_IMAGES * TABLE2[name].epochs / 1e18
    assert abs(forward_only / published - 1 / 3) < 0.02  # forward FLOPs alone are a third: not the convention


def test_exaflops_scale_with_epochs_and_images():
    base = pretrain_exaflops("mixer_s32_224")  # 5 epochs
    assert pretrain_exaflops("mixer_s32_224", epochs=10) == pytest.approx(2 * base)
    assert pretrain_exaflops("mixer_s32_224", images=JFT_IMAGES // 3) == pytest.approx(base / 3)
    assert pretrain_exaflops("mixer_t4_28", epochs=1, images=60_000) > 0  # any model, given its epochs


def test_quick_mode_measures_the_small_mixers_beside_table_2():
    rows = throughput_table(quick=True, image_size=32, device="cpu")  # 1 or 4 tokens: fast
    assert [r["name"] for r in rows] == list(QUICK.names) == ["mixer_s32_224", "mixer_s16_224"]
    for row in rows:
        assert row["images_per_s"] > 0 and math.isfinite(row["images_per_s"])
        assert (row["batch_size"], row["warmup"], row["repeats"]) == (QUICK.batch_size, QUICK.warmup, QUICK.repeats)
        assert (row["dtype"], row["device"], row["image_size"]) == ("float32", "cpu", 32)
        assert row["exaflops"] == pytest.approx(pretrain_exaflops(row["name"]))  # at 224 px, not at 32
        assert row["gmacs"] < 0.1  # the measured 32 px model
    s32 = rows[0]
    assert s32["title"] == "Mixer-S/32" and s32["pretrain_epochs"] == 5 and s32["published_exaflops"] == 9
    assert (s32["published_tpuv3_images_per_s_per_core"], s32["published_v100_images_per_s_per_core"]) == (11489, 5497)


def test_quick_measurement_of_a_tiny_model_outside_table_2():
    (row,) = throughput_table(["mixer_t4_28"], batch_size=2, device="cpu", warmup=1, repeats=2, dtype="bfloat16")
    assert row["images_per_s"] > 0 and math.isfinite(row["images_per_s"])
    assert (row["batch_size"], row["dtype"], row["image_size"]) == (2, "bfloat16", 28)
    assert row["title"] is row["published_exaflops"] is row["exaflops"] is row["pretrain_epochs"] is None


def test_images_per_second_leaves_the_mode_as_it_was():
    model = create_model("mixer_t4_28").train()
    assert images_per_second(model, 2, warmup=0, repeats=1) > 0
    assert model.training


@pytest.mark.parametrize("kwargs", [
    dict(names=["mixer_b16_22"]),  # unknown model
    dict(names="mixer_b16_224"),  # a string, not a list
    dict(names=[]),
    dict(batch_size=0),
    dict(repeats=0),
    dict(warmup=-1),
    dict(dtype=torch.int64),
    dict(dtype="float8"),
    dict(device="tpu"),
    dict(image_size=48),  # not a multiple of 32
    dict(image_size=0),
])
def test_bad_input_is_one_line_config_error(kwargs):
    with pytest.raises(ConfigError) as err:
        throughput_table(**{"names": ["mixer_s32_224"], "device": "cpu", **kwargs})
    assert "\n" not in str(err.value)


def test_bad_pretrain_arguments():
    with pytest.raises(ConfigError, match="not in supp. Table 2"):
        pretrain_exaflops("mixer_t4_28")
    with pytest.raises(ConfigError, match="did you mean"):
        pretrain_exaflops("mixer_b16_22")
    with pytest.raises(ConfigError):
        pretrain_exaflops("mixer_b16_224", epochs=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ConfigError, match="no CUDA"):
        throughput_table(["mixer_t4_28"], device="cuda")
