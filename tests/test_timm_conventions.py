"""timm's model conventions for every registered model (``pkmixer.list_models()``), at the small sizes of
tests/test_contract.py: forward and backward, ``forward_features`` / ``forward_head(pre_logits=True)``,
``reset_classifier(0)``, ``features_only`` through ``timm.create_model`` with ``feature_info``,
``forward_intermediates`` with timm's arguments, ``prune_intermediate_layers``, ``group_matcher`` (layer-wise lr
decay), ``set_grad_checkpointing``, a complete ``pretrained_cfg``, timm's optimiser's weight decay, and the
tracers: ``torch.fx.symbolic_trace`` forward and backward, ``torch.jit.script`` and ``torch.export``, each giving
the eager model's outputs and gradients exactly.

The checks are the functions of :data:`CHECKS`; ``python tests/test_timm_conventions.py`` prints their table.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

import pkmixer
from pkmixer.errors import ConfigError
from pkmixer.layers.decay import decayed_parameters

sys.path.insert(0, str(Path(__file__).parent))
from test_contract import small_overrides  # noqa: E402

ALL = pkmixer.list_models()
# The default tier (about 15 s) runs the checks on one model of each family and token mixing, TorchScript and
# torch.export (about 1 s a model each) on fewer; the slow tier runs every check on every registered model.
REPRESENTATIVES = ["mixer_t4_28", "rp_smixer_t4_28", "mixer_untied_t4_28", "mixer_views_t4_28", "mixer_pyramid_t4_28",
                   "smixer_c128p4_32", "swmlp_t4_28", "swmlp_m1619p4_32", "shallow_dense_28", "shallow_kronecker_28",
                   "shallow_monarch_28"]
TRACED = ["mixer_t4_28", "rp_smixer_t4_28", "swmlp_m1619p4_32", "shallow_monarch_28"]
SLOW_CHECKS = ("torchscript", "torch.export")


def build(name: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    model = pkmixer.create_model(name, **small_overrides(name), **extra)
    with torch.no_grad():  # every term matters: no zero head, no unit LayerNorm
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def image(model: torch.nn.Module, batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, model.in_chans, model.img_size, model.img_size, generator=torch.Generator().manual_seed(1))


def outputs_and_grads(fn, model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out = fn(x)
    (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grads["input"] = x.grad.clone()
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def assert_same(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1]), \
        [k for k in a[1] if not torch.equal(a[1][k], b[1][k])]


# ---- the checks -------------------------------------------------------------------------------------------

def check_forward_backward(name: str) -> None:
    model = build(name).train()
    x = image(model)
    out, grads = outputs_and_grads(model, model, x)
    assert out.shape == (3, model.num_classes)
    assert all(g.abs().sum() > 0 for k, g in grads.items()), [k for k, g in grads.items() if not g.abs().sum()]


def check_features_and_head(name: str) -> None:
    model = build(name).eval()
    x = image(model)
    with torch.no_grad():
        feats = model.forward_features(x)
        pooled = model.forward_head(feats, pre_logits=True)
        assert pooled.shape == (3, model.num_features) == (3, model.head_hidden_size)
        assert torch.equal(model.forward_head(feats), model(x)) and torch.equal(model.get_classifier()(pooled), model(x))
        model.reset_classifier(0)
        assert isinstance(model.get_classifier(), torch.nn.Identity) and model.num_classes == 0
        assert torch.equal(model(x), pooled)
    assert model.spec.overrides["num_classes"] == 0


def check_features_only(name: str) -> None:
    eager = build(name).eval()
    x = image(eager)
    net = timm.create_model("pkmixer_" + name, features_only=True, **small_overrides(name)).eval()
    net.model.load_state_dict(eager.state_dict(), strict=False)  # pruned: the head and norm are gone
    info = eager.feature_info
    assert len(info) == len(eager.feature_names()) and net.feature_info.channels() == [f["num_chs"] for f in info]
    fmt = eager.default_output_fmt()
    with torch.no_grad():
        feats = net(x)
        ref = eager.forward_intermediates(x, output_fmt=fmt, intermediates_only=True)
    assert len(feats) == len(info) and all(torch.equal(a, b) for a, b in zip(feats, ref))
    for f, i in zip(feats, info):
        assert f.shape[0] == 3 and f.shape[1 if fmt == "NCHW" else -1] == i["num_chs"]
        if fmt == "NCHW":  # the patch grid, or 1×1 for a flat feature
            assert f.shape[2] == f.shape[3] == eager.img_size // i["reduction"]
    two = timm.create_model("pkmixer_" + name, features_only=True, out_indices=(-1,), **small_overrides(name))
    assert two.feature_info.channels() == [info[-1]["num_chs"]] and len(two(x)) == 1


def check_forward_intermediates(name: str) -> None:
    model = build(name).eval()
    x = image(model)
    n = len(model.feature_names())
    with torch.no_grad():
        final, feats = model.forward_intermediates(x)
        assert torch.equal(final, model.forward_features(x)) and len(feats) == n
        last = model.forward_intermediates(x, indices=1, norm=True, stop_early=True, intermediates_only=True)
        assert len(last) == 1 and last[0].shape == feats[-1].shape
        first, early = model.forward_intermediates(x, indices=[0], stop_early=True)
        assert torch.equal(early[0], feats[0])
        nlc = model.forward_intermediates(x, indices=[0], output_fmt="NLC", intermediates_only=True)[0]
        assert nlc.shape[0] == 3 and nlc.shape[-1] == model.feature_info[0]["num_chs"]
        with pytest.raises(ConfigError, match="output_fmt"):
            model.forward_intermediates(x, output_fmt="NHWC")
        take = model.prune_intermediate_layers([0], prune_head=True)
        assert take == [0] and isinstance(model.get_classifier(), torch.nn.Identity)
        assert torch.equal(model.forward_intermediates(x, indices=[0], intermediates_only=True)[0], feats[0])


def check_grad_checkpointing(name: str) -> None:
    model = build(name).train()
    x = image(model)
    plain = outputs_and_grads(model, model, x)
    model.set_grad_checkpointing(True)
    assert_same(outputs_and_grads(model, model, x), plain)


def check_pretrained_cfg(name: str) -> None:
    model = build(name)
    cfg = model.pretrained_cfg
    for key in ("architecture", "description", "license", "paper_ids", "paper_name", "origin_url", "mean", "std",
                "input_size", "num_classes", "first_conv", "classifier"):
        assert cfg[key] not in (None, "", ()), key
    assert cfg["architecture"] == "pkmixer_" + name and cfg["input_size"] == (model.in_chans, model.img_size,
                                                                            model.img_size)
    first = model.get_submodule(cfg["first_conv"])  # a real module, whose weights read the image
    reads = [p for p in first.parameters() if p.ndim > 1]
    assert reads and all(p.shape[-1] in (model.img_size, model.in_chans * model.img_size, model.patch_size
                                         if hasattr(model, "patch_size") else -1, model.in_chans * model.img_size ** 2)
                         or p.ndim == 4 for p in reads)
    assert isinstance(model.get_submodule(cfg["classifier"]), torch.nn.Linear)
    registered = timm.models.get_pretrained_cfg("pkmixer_" + name).to_dict()
    assert all(registered[k] == cfg[k] for k in ("license", "paper_ids", "paper_name", "origin_url", "first_conv"))


def check_timm_optimizer(name: str) -> None:
    """timm's optimiser factory decays what pkmixer decays (layers.decay), and its layer-wise lr decay groups every
    parameter through group_matcher."""
    model = build(name)
    names = {id(p): n for n, p in model.named_parameters()}
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == decayed_parameters(model)
    layered = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.7)
    scales = {names[id(p)]: g["lr_scale"] for g in layered.param_groups for p in g["params"]}
    assert scales.keys() == set(names.values()) and len(set(scales.values())) > 1
    assert {names[id(p)] for g in layered.param_groups if g["weight_decay"] > 0 for p in g["params"]} == decayed


def check_fx(name: str) -> None:
    model = build(name).train()
    x = image(model)
    graph = torch.fx.symbolic_trace(model)
    assert_same(outputs_and_grads(graph, model, x), outputs_and_grads(model, model, x))


def check_torchscript(name: str) -> None:
    model = build(name).train()
    x = image(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated in favour of torch.export
        scripted = torch.jit.script(model)
    assert_same(outputs_and_grads(scripted, model, x), outputs_and_grads(model, model, x))


def check_export(name: str) -> None:
    model = build(name).eval()
    x = image(model)
    exported = torch.export.export(model, (x,)).module()
    with torch.no_grad():
        assert torch.equal(exported(x), model(x))


CHECKS = {"forward/backward": check_forward_backward, "features/head/reset(0)": check_features_and_head,
          "features_only": check_features_only, "forward_intermediates/prune": check_forward_intermediates,
          "grad checkpointing": check_grad_checkpointing, "pretrained_cfg": check_pretrained_cfg,
          "timm optimiser": check_timm_optimizer, "fx fwd+bwd": check_fx, "torchscript": check_torchscript,
          "torch.export": check_export}


def _default_tier(name: str, check: str) -> bool:
    return name in (TRACED if check in SLOW_CHECKS else REPRESENTATIVES)


def _cases(default: bool) -> list:
    return [pytest.param(n, c, id=f"{n}-{c}") for n in ALL for c in CHECKS if _default_tier(n, c) == default]


@pytest.mark.parametrize("name, check", _cases(default=True))
def test_timm_conventions(name, check):
    CHECKS[check](name)


@pytest.mark.slow
@pytest.mark.parametrize("name, check", _cases(default=False))
def test_timm_conventions_of_every_model(name, check):
    CHECKS[check](name)


def test_every_registered_model_is_checked():
    assert set(REPRESENTATIVES) | set(TRACED) <= set(ALL)
    assert len(_cases(default=True)) + len(_cases(default=False)) == len(ALL) * len(CHECKS)


def test_timm_s_mixer_passes_the_same_tracers():
    """The reference: timm's own MlpMixer scripts, traces and exports (so none of these is skipped for ours)."""
    from timm.models.mlp_mixer import MlpMixer

    model = MlpMixer(img_size=32, patch_size=8, num_blocks=2, embed_dim=8, num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert torch.equal(torch.jit.script(model)(x), model(x))
    assert torch.equal(torch.fx.symbolic_trace(model)(x), model(x))
    assert torch.equal(torch.export.export(model, (x,)).module()(x), model(x))


if __name__ == "__main__":  # the table of the report: every registered model × every check
    import time

    rows = []
    for model_name in ALL:
        cells = []
        for check_name, fn in CHECKS.items():
            start = time.perf_counter()
            try:
                fn(model_name)
                cells.append("ok")
            except Exception as err:  # noqa: BLE001 - the table records the failure
                cells.append(f"FAIL {type(err).__name__}: {str(err).splitlines()[0][:60] if str(err) else ''}")
            cells[-1] += f" ({time.perf_counter() - start:.1f}s)" if len(sys.argv) > 1 else ""
        rows.append((model_name, cells))
    print("| model | " + " | ".join(CHECKS) + " |")
    print("|---" * (len(CHECKS) + 1) + "|")
    for model_name, cells in rows:
        print(f"| {model_name} | " + " | ".join(cells) + " |")
