"""The step engine's recipe choices: weight decay by role (not rank), fp32 by default with the precision
recorded, and the Polyak average (optim.ema_decay) evaluated, checkpointed and exact on resume."""
import json

import pytest
import torch
from torch import nn

from pkmixer.layers.decay import decayed_parameters
from pkmixer.models.registry import create_model
from pkmixer.train import loop
from pkmixer.checkpoint import read_checkpoint
from pkmixer.models.restore import load_model
from pkmixer.train.config import build_config
from pkmixer.train.build import build_model
from pkmixer.experiments import get_preset

from conftest import rel_err

DIGITS = {"data.name": "digits", "data.batch_size": 32, "data.train_subset": 256, "data.test_subset": 128,
          "model.img_size": 8, "model.patch_size": 2, "model.in_chans": 1, "optim.name": "adamw", "optim.lr": 0.01,
          "schedule.epochs": 2, "run.progress": False}


def quiet(_: str) -> None:
    pass


def test_decay_follows_roles_not_rank():
    sparse = create_model("swmlp_t4_28", weight_format="sparse")
    names = decayed_parameters(sparse)
    values = [n for n, p in sparse.named_parameters() if n.endswith(".values")]
    assert values and all(sparse.get_parameter(n).shape[0] == 1 for n in values) and set(values) <= names  # (1, nnz) rows
    untied = create_model("mixer_untied_t4_28")
    batched_bias = [n for n, p in untied.named_parameters() if n.endswith("bias") and p.ndim == 2]
    assert batched_bias and not set(batched_bias) & decayed_parameters(untied)
    for name, p in untied.named_parameters():  # everything else: matrices decayed, norms and biases not
        if name not in batched_bias:
            assert (name in decayed_parameters(untied)) == (p.ndim > 1), name


def test_a_layer_must_declare_its_roles():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

    model = nn.Sequential(nn.Linear(3, 3), Odd())
    with pytest.raises(TypeError, match="Odd has parameters \\(scale\\)"):
        decayed_parameters(model)
    Odd.decayed_parameters = ("scale",)
    assert decayed_parameters(model) == {"0.weight", "1.scale"}


def test_sparse_and_masked_swmlp_train_to_the_same_weights_with_weight_decay(tmp_path):
    """App. A.2.5's SW-MLP in its two storage formats is one model: with weight decay on, both must end with
    the same kept weights (a rank rule would decay the masked weights and never the sparse values)."""
    ends = {}
    for fmt in ("sparse", "masked"):
        cfg = build_config(None, {**DIGITS, "model.name": "swmlp_t4_28", "model.weight_format": fmt,
                                  "optim.weight_decay": 0.5})
        loop.train(cfg, tmp_path / fmt, log=quiet)
        model = load_model(tmp_path / fmt / "checkpoints" / "latest.pt")
        ends[fmt] = [m.dense_weight() for m in model.modules() if hasattr(m, "dense_weight")]
    assert len(ends["sparse"]) == len(ends["masked"]) > 0
    for s, m in zip(ends["sparse"], ends["masked"]):  # float rounding only (CSR and dense products differ)
        assert rel_err(s.detach(), m.detach()) < 1e-5


def test_fp32_by_default_and_recorded(tmp_path):
    cfg = build_config(None, {**DIGITS, "model.name": "smixer_t4_28", "schedule.epochs": 1})
    assert cfg.run.amp == "off" and cfg.run.tf32 is False
    summary = loop.train(cfg, tmp_path / "run", log=quiet)
    assert summary["precision"] == "fp32"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["precision"] == "fp32"
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "amp: 'off'" in saved and "tf32: false" in saved


def test_polyak_average_is_evaluated_checkpointed_and_exact_on_resume(tmp_path):
    settings = {**DIGITS, "model.name": "smixer_t4_28", "schedule.epochs": 3, "optim.ema_decay": 0.9}
    cfg = build_config(None, settings)
    loop.train(cfg, tmp_path / "straight", log=quiet)
    loop.train(cfg, tmp_path / "pieces", stop_after=1, log=quiet)
    loop.train(None, tmp_path / "pieces", resume=True, log=quiet)
    a, b = (read_checkpoint(tmp_path / run / "checkpoints" / "latest.pt") for run in ("straight", "pieces"))
    assert a["ema"].keys() == a["state_dict"].keys()
    for k in a["ema"]:
        assert torch.equal(a["ema"][k], b["ema"][k]), k
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= row["ema_test_error"] <= 1 for row in rows)
    # the average lags the weights: a decay near 0 follows them, a decay near 1 stays near the start
    fast = build_config(None, {**settings, "optim.ema_decay": 1e-9, "schedule.epochs": 1})
    loop.train(fast, tmp_path / "fast", log=quiet)
    c = read_checkpoint(tmp_path / "fast" / "checkpoints" / "latest.pt")
    for k, v in c["state_dict"].items():
        assert torch.allclose(c["ema"][k], v, atol=1e-6), k
    slow = build_config(None, {**settings, "optim.ema_decay": 0.999999, "schedule.epochs": 1})
    loop.train(slow, tmp_path / "slow", log=quiet)
    d = read_checkpoint(tmp_path / "slow" / "checkpoints" / "latest.pt")
    moved = max(float((d["state_dict"][k] - d["ema"][k]).abs().max()) for k in d["ema"] if "weight" in k)
    assert moved > 1e-3


def test_ema_decay_outside_its_domain_is_refused():
    from pkmixer.errors import ConfigError

    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ConfigError, match="optim.ema_decay"):
            build_config(None, {"optim.ema_decay": bad})


# ---- the two data pipelines ------------------------------------------------------------------------------

SYNTH = {"data.name": "synthetic", "model.name": "smixer_t4_28", "model.img_size": 32, "model.patch_size": 8,
         "model.in_chans": 3, "model.depth": 1, "model.embed_dim": 16, "data.batch_size": 64,
         "data.train_subset": 512, "data.test_subset": 256, "optim.name": "adamw", "optim.lr": 0.01,
         "schedule.epochs": 2, "run.progress": False}


def _latest(run) -> dict:
    return read_checkpoint(run / "checkpoints" / "latest.pt")


def test_resident_and_per_sample_pipelines_agree_without_augmentation(tmp_path):
    """The same global batches in the same order and the same normalisation: one training run either way."""
    for pipeline in ("resident", "per-sample"):
        cfg = build_config(None, {**DIGITS, "model.name": "smixer_t4_28", "data.pipeline": pipeline})
        summary = loop.train(cfg, tmp_path / pipeline, log=quiet)
        assert summary["pipeline"] == pipeline
    a, b = _latest(tmp_path / "resident"), _latest(tmp_path / "per-sample")
    for k in a["state_dict"]:
        assert torch.allclose(a["state_dict"][k], b["state_dict"][k], rtol=1e-5, atol=1e-6), k
    rows = [[json.loads(line) for line in (tmp_path / p / "metrics.jsonl").read_text().splitlines()]
            for p in ("resident", "per-sample")]
    for r, s in zip(*rows):
        assert r["test_error"] == s["test_error"] and r["train_loss"] == pytest.approx(s["train_loss"], rel=1e-5)


def test_auto_pipeline_is_resident_where_it_can_be(tmp_path):
    from pkmixer.data.datasets import build_dataset
    from pkmixer.train.feeds import PerSampleFeed, ResidentFeed, choose_feed

    model = create_model("smixer_t4_28", img_size=32, patch_size=8, in_chans=3)
    data = build_dataset("synthetic", "train", subset=64)
    assert choose_feed(build_config(None, {**SYNTH, "data.crop_padding": 4, "data.hflip": True}).data, model,
                       data, True) is ResidentFeed
    auto_augment = build_config(None, {**SYNTH, "data.auto_augment": "cifar10"}).data  # batched: pkmixer.data.auto_augment
    assert choose_feed(auto_augment, model, data, True) is ResidentFeed
    timm = build_config(None, {**SYNTH, "data.rand_augment": "rand-m9-mstd0.5-inc1"}).data  # no batched version
    assert choose_feed(timm, model, data, True) is PerSampleFeed
    assert choose_feed(timm, model, data, False) is ResidentFeed  # the test split has no augmentation
    from pkmixer.errors import ConfigError

    with pytest.raises(ConfigError, match="data.pipeline=resident: .*RandAugment"):
        choose_feed(build_config(None, {**SYNTH, "data.rand_augment": "rand-m9-mstd0.5-inc1",
                                        "data.pipeline": "resident"}).data, model, data, True)


def test_resident_pipeline_with_augmentation_learns_and_resumes_exactly(tmp_path):
    settings = {**SYNTH, "data.crop_padding": 4, "data.hflip": True, "data.random_erasing": 0.25,
                "data.mixup": 0.8, "data.cutmix": 1.0, "schedule.epochs": 3}
    cfg = build_config(None, settings)
    summary = loop.train(cfg, tmp_path / "straight", log=quiet)
    assert summary["pipeline"] == "resident" and summary["final_test_error"] < 0.6  # chance is 0.9
    loop.train(cfg, tmp_path / "pieces", stop_after=1, log=quiet)
    loop.train(None, tmp_path / "pieces", resume=True, log=quiet)
    a, b = _latest(tmp_path / "straight"), _latest(tmp_path / "pieces")
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k


@pytest.mark.parametrize("recorded", [True, False])
def test_a_resumed_run_keeps_the_pipeline_it_was_checkpointed_with(tmp_path, recorded):
    """A run that data.pipeline=auto sent per sample (AutoAugment, before it had a batched version) goes on per
    sample when resumed under code where auto resolves to resident: its augmentation draws stay its own - whether
    its checkpoint names the pipeline or predates that record."""
    settings = {**SYNTH, "data.auto_augment": "cifar10", "schedule.epochs": 2, "data.pipeline": "per-sample"}
    straight = loop.train(build_config(None, settings), tmp_path / "straight", log=quiet)
    assert straight["pipeline"] == "per-sample"
    loop.train(build_config(None, settings), tmp_path / "pieces", stop_after=1, log=quiet)
    config = tmp_path / "pieces" / "config.yaml"  # as the older code wrote it: auto, resolved to per-sample
    config.write_text(config.read_text().replace("pipeline: per-sample", "pipeline: auto"))
    latest = tmp_path / "pieces" / "checkpoints" / "latest.pt"
    assert _latest(tmp_path / "pieces")["pipeline"] == "per-sample"
    if not recorded:
        payload = torch.load(latest, weights_only=True)
        del payload["pipeline"]
        torch.save(payload, latest)
    resumed = loop.train(None, tmp_path / "pieces", resume=True, log=quiet)
    assert resumed["pipeline"] == "per-sample"
    a, b = _latest(tmp_path / "straight"), _latest(tmp_path / "pieces")
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k


def test_a_head_with_fewer_classes_than_the_labels_is_refused_before_anything_is_written(tmp_path):
    from pkmixer.errors import ConfigError

    cfg = build_config(None, {**DIGITS, "model.name": "smixer_t4_28", "model.num_classes": 5})
    with pytest.raises(ConfigError, match="5 classes, fewer than the 10"):
        loop.train(cfg, tmp_path / "run", log=quiet)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # inductor compiles the model's C++ kernels: about a minute
def test_compiled_training_equals_eager(tmp_path):
    """run.compile with a CUDA-graph mode (GraphSteps marks every call a step; on the CPU the graphs are skipped)
    trains the same run as eager execution to float rounding."""
    losses = {}
    for mode in (None, "reduce-overhead"):
        extra = {} if mode is None else {"run.compile": True, "run.compile_mode": mode}
        cfg = build_config(None, {**DIGITS, "model.name": "smixer_t4_28", "schedule.epochs": 1, **extra})
        loop.train(cfg, tmp_path / str(mode), log=quiet)
        losses[mode] = json.loads((tmp_path / str(mode) / "metrics.jsonl").read_text().splitlines()[0])
    assert losses["reduce-overhead"]["train_loss"] == pytest.approx(losses[None]["train_loss"], rel=1e-4)
    assert losses["reduce-overhead"]["test_error"] == pytest.approx(losses[None]["test_error"], abs=2 / 128)


@pytest.mark.parametrize("spec", get_preset("fig5").runs("smoke", None), ids=lambda s: s.name)
def test_fig5_models_compile_to_one_graph(spec):
    """torch.compile traces each of Fig. 5's model families (the RP S-Mixer's gathers included) as one graph
    with no breaks: a break splits every mixing layer's CUDA graph and recompiles per layer."""
    model = build_model(spec.config.model, num_classes=10)
    explained = torch._dynamo.explain(model)(torch.randn(4, model.in_chans, model.img_size, model.img_size))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
