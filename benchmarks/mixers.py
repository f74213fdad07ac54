"""Sections (a) Mixers against timm, (b) RP-Mixer against the normal Mixer, (f) achieved FLOP/s.

(a) Our :class:`pkmixer.models.mixer.Mixer` against timm's ``MlpMixer`` built with the same configuration
(depth, C, D_S, D_C, patch, image size, classes, LayerNorm ε): ``timm.create_model`` for the Table 1 Mixers,
``MlpMixer(...)`` for the CIFAR-sized ones, and for an S-Mixer ``MlpMixer(mlp_layer=TimmFcAct)`` - timm's own
block with its ``mlp_layer`` hook given the single Dense + GELU of Eq. 5. Both models get the same batch, the
same (fused) AdamW step, and are timed in one interleaved loop together with a run of 2048³ sgemms lasting
about one of our steps, eager and (where the mode asks) ``torch.compile``'d. Parameter counts are checked
equal before timing.

(f) FLOPs of a training step are counted by ``torch.utils.flop_counter`` (forward + backward, on a meta copy);
achieved FLOP/s = FLOPs / median step time, divided by the sgemm FLOP/s of the same loop.
"""
from __future__ import annotations

from functools import partial

import timm
import torch
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from pkmixer.layers.pk import PermuteColumns
from pkmixer.models.mixer import Mixer
from pkmixer.models.registry import create_model

from .common import Settings, image_batch, infer_step, interleaved, ratio, sgemm_case, train_flops, train_step


class TimmFcAct(nn.Module):
    """The S-Mixer's single-layer mixing as a timm ``mlp_layer``: (in, hidden ignored) -> Dense(in, in) + act."""

    def __init__(self, in_features: int, hidden_features: int | None = None, act_layer: type[nn.Module] = nn.GELU,
                 drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, in_features, device=device, dtype=dtype)
        self.act = act_layer()
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.act(self.fc(x)))


def timm_peer(ours: Mixer, name: str) -> nn.Module:
    """timm's MlpMixer with ``ours``'s configuration (module docstring)."""
    if timm.is_model(name) and name.startswith("mixer_") and ours.img_size == 224:
        peer = timm.create_model(name, num_classes=ours.num_classes)
    else:
        C = ours.embed_dim
        fc = ours.block_kind == "fc"
        ratios = (1.0, 1.0) if fc else (ours.token_hidden / C, ours.channel_hidden / C)
        peer = MlpMixer(num_classes=ours.num_classes, img_size=ours.img_size, in_chans=ours.in_chans,
                        patch_size=ours.patch_size, num_blocks=ours.depth, embed_dim=C, mlp_ratio=ratios,
                        mlp_layer=TimmFcAct if fc else timm.layers.Mlp,
                        norm_layer=partial(nn.LayerNorm, eps=ours.norm.eps))
    theirs_n, ours_n = (sum(p.numel() for p in m.parameters()) for m in (peer, ours))
    if theirs_n != ours_n:
        raise RuntimeError(f"timm peer of {name} has {theirs_n} parameters, ours {ours_n}")
    return peer


# (name, batch, compile in quick mode) per mode; the CIFAR-sized ones are 32 px, 4 px patches, S = C = 64
A_MODELS = {
    "smoke": [("smixer_t4_28", 4, False)],
    "quick": [("smixer_c64p4_32", 128, True), ("mixer_s16_224", 8, False), ("mixer_b16_224", 8, False)],
    "full": [("smixer_c64p4_32", 128, True), ("mixer_c64p4_32", 128, True), ("mixer_s16_224", 32, True),
             ("mixer_b16_224", 32, True)],
}
B_PAIRS = {  # (registered normal Mixer, batch); the RP one is the same with rp_blocks="all"
    "smoke": [("smixer_t4_28", 4)],
    "quick": [("smixer_c64p4_32", 128), ("mixer_c64p4_32", 128), ("mixer_s16_224", 8)],
    "full": [("smixer_c64p4_32", 128), ("mixer_c64p4_32", 128), ("mixer_s16_224", 16)],
}


def _device(model: nn.Module, settings: Settings) -> nn.Module:
    return model.to(settings.torch_device)


def section_a(settings: Settings) -> dict:
    """Training step and inference throughput, ours against timm; also the rows of section (f)."""
    rows, flops_rows = [], []
    for name, batch, compile_quick in A_MODELS[settings.mode]:
        compiled = settings.compile and (compile_quick or settings.mode == "full")
        torch.manual_seed(0)
        ours = _device(create_model(name), settings)
        theirs = _device(timm_peer(ours, name), settings)
        data = image_batch(ours, batch, settings)
        cases = {"ours": train_step(ours, data, settings), "timm": train_step(theirs, data, settings)}
        step_s = interleaved({"ours": cases["ours"]}, settings, warmup=1, repeats=1)["ours"].median_s
        cases["sgemm"], sgemm_flops = sgemm_case(settings, step_s)
        if compiled:
            cases["ours_compiled"] = train_step(ours, data, settings, compiled=True)
            cases["timm_compiled"] = train_step(theirs, data, settings, compiled=True)
            for key in ("ours_compiled", "timm_compiled"):  # compile outside the timed loop
                cases[key]()
                cases[key]()
        t = interleaved(cases, settings)
        flops = {"ours": train_flops(ours, data[0].shape), "timm": train_flops(theirs, data[0].shape)}
        sgemm_rate = sgemm_flops / t["sgemm"].median_s
        row = {"model": name, "kind": "train", "batch": batch, "params": sum(p.numel() for p in ours.parameters()),
               "times": {k: v.as_dict() for k, v in t.items() if k != "sgemm"},
               "speedup_eager": ratio(t["timm"].median_s, t["ours"].median_s)}
        if compiled:
            row["speedup_compiled"] = ratio(t["timm_compiled"].median_s, t["ours_compiled"].median_s)
            row["ours_compiled_vs_timm_eager"] = ratio(t["timm"].median_s, t["ours_compiled"].median_s)
        rows.append(row)
        for key in [k for k in t if k != "sgemm"]:
            who = key.split("_")[0]
            rate = flops[who] / t[key].median_s
            flops_rows.append({"model": name, "impl": key, "batch": batch, "train_flops": flops[who],
                               "gflops": rate / 1e9, "sgemm_gflops": sgemm_rate / 1e9,
                               "fraction_of_sgemm": rate / sgemm_rate})

        # inference: eval mode, inference_mode
        x = data[0]
        cases = {"ours": infer_step(ours, x, settings), "timm": infer_step(theirs, x, settings)}
        if compiled and settings.mode == "full":
            cases["ours_compiled"] = infer_step(ours, x, settings, compiled=True)
            cases["timm_compiled"] = infer_step(theirs, x, settings, compiled=True)
            for key in ("ours_compiled", "timm_compiled"):
                cases[key]()
                cases[key]()
        t = interleaved(cases, settings)
        row = {"model": name, "kind": "infer", "batch": batch,
               "times": {k: v.as_dict() for k, v in t.items()},
               "images_per_s": {k: batch / v.median_s for k, v in t.items()},
               "speedup_eager": ratio(t["timm"].median_s, t["ours"].median_s)}
        if "ours_compiled" in t:
            row["speedup_compiled"] = ratio(t["timm_compiled"].median_s, t["ours_compiled"].median_s)
        rows.append(row)
        del ours, theirs, cases
    return {"rows": rows, "flops_rows": flops_rows}


def section_b(settings: Settings) -> dict:
    """RP-Mixer against the normal Mixer of the same shape: training step, interleaved."""
    rows = []
    for name, batch in B_PAIRS[settings.mode]:
        torch.manual_seed(0)
        normal = _device(create_model(name), settings)
        rp = _device(create_model(name, rp_blocks="all"), settings)
        data = image_batch(normal, batch, settings)
        t = interleaved({"normal": train_step(normal, data, settings), "rp": train_step(rp, data, settings)},
                        settings)
        rows.append({"model": name, "batch": batch, "times": {k: v.as_dict() for k, v in t.items()},
                     "rp_overhead": ratio(t["rp"].median_s, t["normal"].median_s) - 1.0})
    rows.extend(_gather_rows(settings))
    return {"rows": rows}


def _gather_rows(settings: Settings) -> list[dict]:
    """The permutation gather alone, forward + backward: index_select's autograd against PermuteColumns."""
    out = []
    for batch, m in [(4, 64)] if settings.mode == "smoke" else [(128, 64 * 64), (16, 196 * 512)]:
        x = torch.randn(batch, m, device=settings.torch_device, requires_grad=True)
        idx = torch.randperm(m, device=settings.torch_device)
        g = torch.randn(batch, m, device=settings.torch_device)

        def ref() -> None:
            x.index_select(1, idx).backward(g)

        def fast() -> None:
            PermuteColumns.apply(x, idx).backward(g)

        t = interleaved({"index_select": ref, "permute_columns": fast}, settings,
                        repeats=max(settings.repeats, 10))
        out.append({"model": f"gather only, B={batch}, m={m}", "batch": batch,
                    "times": {k: v.as_dict() for k, v in t.items()},
                    "speedup": ratio(t["index_select"].median_s, t["permute_columns"].median_s)})
    return out


def section_f(a: dict) -> dict:
    """Achieved FLOP/s as a fraction of the same-loop sgemm, from section (a)'s measurements."""
    return {"rows": a["flops_rows"]}
