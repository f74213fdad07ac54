"""Section s: K models trained stacked (:mod:`pkmixer.train.stack`) against the same K trained one after another.

Each case builds K members of one S-Mixer (seeds 0..K-1) and times, interleaved (:func:`.common.interleaved`),
one call of each of

* ``sequential``: one training step of each member in turn, each with its own optimizer (forward,
  cross-entropy, backward, ``optimizer.step``; no host synchronisation);
* ``stacked``: one :func:`pkmixer.train.stack.stacked_step` of the stacked model over the K members' batches
  (the step :func:`~pkmixer.train.stack.train_stacked` takes, its per-member non-finite guard included);
* ``vmap`` (the normal S-Mixer only, for comparison): ``torch.func.vmap`` over ``functional_call`` of one
  member's module with the stacked parameters, one optimizer on them.

Each member's batch is its own fixed random batch of 128 on ``settings.device`` (under bf16 autocast on a GPU).
Member-steps per second = K / call time; the speedup is sequential time / stacked time, measured in the same loop.
Cases: the small Fashion-MNIST S-Mixer of Fig. 5 (4 blocks, C = S = 32, 28 px grey, AdamW) and
Fig. 5's paper-scale Ω = 2^18 S-Mixer on CIFAR-sized input (8 blocks, C = 32, S = 113, 32 px RGB, patch 4,
Nesterov SGD), at K = 1, 4, 8 (smoke: toy sizes, K = 1, 2).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from pkmixer.models.registry import create_model
from pkmixer.train.config import OptimConfig
from pkmixer.train.stack import build_optimizer, stack_models, stacked_step

from .common import Settings, interleaved

ADAMW = OptimConfig(name="adamw", lr=1e-3)
SGD = OptimConfig(name="sgd", lr=0.02, momentum=0.9, nesterov=True, weight_decay=5e-5)


def _cases(settings: Settings) -> list[dict]:
    depth = 2 if settings.mode == "smoke" else None
    return [
        {"case": "Fashion-MNIST S-Mixer (C = S = 32, 28 px grey)", "name": "smixer_t4_28",
         "options": dict(depth=depth or 4, embed_dim=32, num_tokens=32), "optim": ADAMW},
        {"case": "Fig. 5 Ω = 2^18 S-Mixer (C = 32, S = 113, 32 px RGB)", "name": "smixer_c64p4_32",
         "options": dict(depth=depth or 8, embed_dim=32, num_tokens=113), "optim": SGD},
    ]


def _members(case: dict, k: int, settings: Settings) -> list[torch.nn.Module]:
    out = []
    for seed in range(k):
        torch.manual_seed(seed)
        out.append(create_model(case["name"], num_classes=10, structure_seed=seed, **case["options"])
                   .to(settings.torch_device).train())
    return out


def _batches(model, k: int, batch: int, settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(k, batch, model.in_chans, model.img_size, model.img_size, generator=g)
    y = torch.randint(0, 10, (k, batch), generator=g)
    return x.to(settings.torch_device), y.to(settings.torch_device)


def _sequential(models, x, y, optim: OptimConfig, settings: Settings):
    opts = [build_optimizer(m, optim) for m in models]

    def call() -> None:
        for k, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad(set_to_none=True)
            with settings.autocast():
                loss = F.cross_entropy(model(x[k]), y[k])
            loss.backward()
            opt.step()

    return call


def _stacked(models, x, y, optim: OptimConfig, settings: Settings):
    stack = stack_models(models).train()
    opt = build_optimizer(stack, optim)
    active = torch.ones(len(models), dtype=torch.bool, device=settings.torch_device)

    def call() -> None:
        with settings.autocast():
            stacked_step(stack, opt, x, y, active)

    return call


def _vmap(models, x, y, optim: OptimConfig, settings: Settings):
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    params = {n: torch.nn.Parameter(p) for n, p in params.items()}
    holder = torch.nn.ParameterDict({n.replace(".", "/"): p for n, p in params.items()})
    opt = torch.optim.AdamW(holder.parameters(), lr=optim.lr, fused=True) if optim.name == "adamw" else \
        torch.optim.SGD(holder.parameters(), lr=optim.lr, momentum=optim.momentum, nesterov=optim.nesterov)
    K = len(models)

    def member(p, b, xk):
        return functional_call(base, (p, b), (xk,))

    def call() -> None:
        opt.zero_grad(set_to_none=True)
        with settings.autocast():
            logits = vmap(member)(params, buffers, x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(K, -1).mean(1).sum()
        loss.backward()
        opt.step()

    return call


def section_s(settings: Settings) -> dict:
    """Stacked ×K against K sequential runs (module docstring)."""
    smoke = settings.mode == "smoke"
    batch, ks = (16, (1, 2)) if smoke else (128, (1, 4, 8))
    rows = []
    for case in _cases(settings):
        for k in ks:
            models = _members(case, k, settings)
            x, y = _batches(models[0], k, batch, settings)
            calls = {"sequential": _sequential(copy.deepcopy(models), x, y, case["optim"], settings),
                     "stacked": _stacked(models, x, y, case["optim"], settings)}
            if not models[0].rp_blocks:
                calls["vmap"] = _vmap(models, x, y, case["optim"], settings)
            times = interleaved(calls, settings)
            rows.append({"case": f"{case['case']}, {case['options']['depth']} blocks", "model": case["name"], "options": case["options"],
                         "optim": case["optim"].name, "members": k, "batch": batch,
                         "times": {n: t.as_dict() for n, t in times.items()},
                         "member_steps_per_s": {n: k / t.median_s for n, t in times.items()},
                         "speedup": times["sequential"].median_s / times["stacked"].median_s,
                         "vmap_speedup": (times["sequential"].median_s / times["vmap"].median_s
                                          if "vmap" in times else None)})
    return {"rows": rows}
