"""K runs trained as one stack (:mod:`pkmixer.train.stack`), each run directory what :func:`pkmixer.train.loop.train`
would have written for it alone.

:func:`train_stack` takes K configs that differ only in ``run.seed`` and ``model.structure_seed`` and K run
directories. Each member is set up exactly as a solo run (:func:`pkmixer.train.loop.open_run`: seeded, its own
data split, resident feeds, engine, and on resume its own ``latest.pt``); the members' models and optimiser
states are then stacked, and each epoch every member's batch comes from its own feed (its data order and
augmentation draws keyed by its own seed, as alone), the stacked optimiser and one per-update schedule (the
members share one config, so one schedule is each one's), and one stacked evaluation over each member's test
set. At the end of an epoch the weights, optimiser and schedule are unstacked into each member's model and engine,
and each member's metrics row and checkpoints are written by :func:`pkmixer.train.loop.end_epoch_writes`, member
after member: the checkpoints are a solo run's, loadable alone, and ``loop.train(cfg, dir, resume=True)``
continues a member alone. Rows gain ``stack_members`` (the stack's size that epoch) and ``stack_member`` (the
member's place in it): the float rounding of a stacked epoch may depend on them.

Members regroup by completed epochs. A kill between two members' writes leaves members at different epochs (the
epoch of their ``latest.pt``; 0 without one). A stacked run - fresh or resumed - trains, one epoch at a time, the
group of members with the fewest completed epochs as one stack (a stack of one when alone); when it reaches the
epoch of the next group the two are one group from then on. So every member trains each of its epochs once
from its own checkpoint, and ends where an uninterrupted run ends. A member whose mean training loss of an epoch
is not finite stops there alone, as a solo run would: ``summary.json`` says ``diverged`` at that epoch and its
checkpoints stay those of the epoch before; the others restack and go on.

Refused (:class:`~pkmixer.errors.ConfigError`): configs that differ in anything but the two seeds; the
per-sample pipeline (the resident one only); gradient clipping, EMA, ``run.compile``; several processes
(torchrun); and whatever :func:`~pkmixer.train.stack.stack_models` refuses. Tested in tests/test_stack_runs.py.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import nn

from ..checkpoint import read_checkpoint
from ..errors import ConfigError
from . import distributed as dist_
from .config import TrainConfig
from .engine import autocast, build_optimizer, build_scheduler, evaluate
from .loop import (OpenRun, claim_run, end_epoch_writes, open_run, prepare_run, resolve_auto_data, rng_state,
                   seed_everything, set_threads, start_files, write_diverged, write_summary)
from .rundir import RunDir
from .stack import StackedModel, stack_models

SEEDS = ("run.seed", "model.structure_seed")


# ---- checks -----------------------------------------------------------------------------------------------


def flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's dictionary as dotted keys, the model's options as ``model.<option>`` (as ``--set`` names them)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = prefix if (prefix, k) == ("model.", "options") else f"{prefix}{k}."
        if isinstance(v, dict):
            out.update(flat_config(v, key))
        else:
            out[key[:-1]] = v
    return out


def stack_key(cfg: TrainConfig) -> str:
    """What must agree for runs to train as one stack: the config but for the seeds, as text."""
    return json.dumps({k: v for k, v in flat_config(cfg.as_dict()).items() if k not in SEEDS}, sort_keys=True,
                      default=str)


def check_stackable(cfgs: list[TrainConfig]) -> None:
    """ConfigError unless the configs can train as one stack (module docstring): equal but for the seeds."""
    if not cfgs:
        raise ConfigError("train_stack needs at least one run")
    first = {k: v for k, v in flat_config(cfgs[0].as_dict()).items() if k not in SEEDS}
    for i, cfg in enumerate(cfgs[1:], 1):
        other = {k: v for k, v in flat_config(cfg.as_dict()).items() if k not in SEEDS}
        differ = sorted(k for k in first.keys() | other.keys() if first.get(k, "?") != other.get(k, "?"))
        if differ:
            raise ConfigError(f"stacked runs may differ only in run.seed and model.structure_seed; run {i} differs "
                              f"from run 0 in {', '.join(differ[:3])}")
    c = cfgs[0]
    if c.data.pipeline == "per-sample":
        raise ConfigError("stacked runs need the resident data pipeline; data.pipeline=per-sample cannot be stacked")
    if c.optim.clip_grad is not None or c.optim.ema_decay is not None:
        raise ConfigError("stacked runs do not carry gradient clipping or EMA; set optim.clip_grad and "
                          "optim.ema_decay to null")
    if c.run.compile:
        raise ConfigError("stacked runs do not carry run.compile; set it to false")


# ---- losses and optimiser state ---------------------------------------------------------------------------


def member_losses(criterion: nn.Module, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each member's ``criterion(logits[k], targets[k])`` as one batched computation: logits (K, B, classes),
    targets (K, B) or soft (K, B, classes); returns (K,). The three losses of
    :func:`pkmixer.data.build_loss`."""
    if isinstance(criterion, SoftTargetCrossEntropy):
        return torch.sum(-targets * F.log_softmax(logits, dim=-1), dim=-1).mean(1)
    if isinstance(criterion, LabelSmoothingCrossEntropy):
        logprobs = F.log_softmax(logits, dim=-1)
        nll = -logprobs.gather(dim=-1, index=targets.unsqueeze(-1)).squeeze(-1)
        return (criterion.confidence * nll + criterion.smoothing * -logprobs.mean(dim=-1)).mean(1)
    if type(criterion) is nn.CrossEntropyLoss and criterion.label_smoothing == 0 and criterion.weight is None:
        return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(1)
    raise ConfigError(f"stacked runs do not carry the loss {type(criterion).__name__}")


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def stack_optimizer_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The members' optimiser ``state_dict``s (of one structure, as :func:`engine.build_optimizer` makes them) as
    the stacked optimiser's: per-parameter tensors stacked on a first axis, shared scalars (``step``) kept
    once - they must agree."""
    first = states[0]
    out: dict[str, Any] = {"state": {}, "param_groups": first["param_groups"]}
    for idx, entry in first["state"].items():
        stacked = {}
        for key, value in entry.items():
            values = [s["state"][idx][key] for s in states]
            if key == "step" or not isinstance(value, torch.Tensor):
                if any(not torch.equal(torch.as_tensor(v), torch.as_tensor(value)) for v in values):
                    raise ConfigError(f"stacked members are at different optimiser steps ({key})")
                stacked[key] = value
            else:
                stacked[key] = torch.stack(values)
        out["state"][idx] = stacked
    if any(s["state"].keys() != first["state"].keys() for s in states):
        raise ConfigError("stacked members' optimiser states hold different parameters")
    return out


def member_optimizer_state(state: dict[str, Any], k: int) -> dict[str, Any]:
    """Member ``k``'s optimiser ``state_dict`` out of the stacked one's (copies): what its solo run holds."""
    return {"state": {idx: {key: v if key == "step" or not isinstance(v, torch.Tensor) else v[k].clone()
                            for key, v in entry.items()} for idx, entry in state["state"].items()},
            "param_groups": [dict(g) for g in state["param_groups"]]}


# ---- the runs ---------------------------------------------------------------------------------------------


@dataclass
class _Member:
    index: int
    r: OpenRun
    rng: dict[str, Any]  # the RNG states its solo run would checkpoint (stacked training draws from none)
    end_epoch: int
    epoch: int  # completed epochs
    diverged: str | None = None
    last: dict[str, Any] = field(default_factory=dict)  # its last metrics row of this invocation


@dataclass
class _Stack:
    members: list[_Member]
    model: StackedModel
    optimizer: torch.optim.Optimizer
    scheduler: Any


def _restack(group: list[_Member], ctx: dist_.Context) -> _Stack:
    """The group's members (their models and engines hold their state) as one stack, in the order the solo
    engine builds and restores its optimiser and schedule."""
    first = group[0].r
    model = stack_models([m.r.model for m in group]).to(ctx.device)
    optimizer = build_optimizer(first.cfg, model)
    scheduler = build_scheduler(first.cfg, optimizer, first.engine.steps_per_epoch)
    optimizer.load_state_dict(stack_optimizer_states([m.r.engine.optimizer.state_dict() for m in group]))
    scheduler.load_state_dict(first.engine.scheduler.state_dict())
    if [n for n, _ in model.named_parameters()] != [n for n, _ in first.model.named_parameters()]:
        raise ConfigError("the stacked model's parameters do not follow its members'")  # the optimiser ids rely on it
    return _Stack(group, model, optimizer, scheduler)


def _unstack(stack: _Stack) -> None:
    """Each member's weights, optimiser and schedule state, from the stack into its own model and engine."""
    opt_state, sched_state = stack.optimizer.state_dict(), stack.scheduler.state_dict()
    for k, m in enumerate(stack.members):
        m.r.model.load_state_dict(stack.model.member_state_dict(k))
        m.r.engine.optimizer.load_state_dict(member_optimizer_state(opt_state, k))
        m.r.engine.scheduler.load_state_dict(sched_state)


def _train_epoch(stack: _Stack, epoch: int, ctx: dist_.Context) -> list[float]:
    """One epoch of the stack (as :meth:`StepEngine.train_epoch` for each member); the members' mean losses."""
    engines = [m.r.engine for m in stack.members]
    cfg, steps, K = engines[0].cfg, engines[0].steps_per_epoch, len(engines)
    stack.model.train()
    loss_sum = torch.zeros(K, dtype=torch.float64, device=ctx.device)
    seen, updates = 0, epoch * steps
    for batches in zip(*(e.train_feed.epoch(epoch) for e in engines), strict=True):
        images = torch.stack([b[0] for b in batches])
        targets = torch.stack([b[1] for b in batches])
        with autocast(cfg, ctx.device):
            losses = member_losses(engines[0].criterion, stack.model(images), targets)
        stack.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # each member's gradient is its own loss's
        stack.optimizer.step()
        updates += 1
        stack.scheduler.step_update(updates)
        loss_sum += losses.detach().double() * images.shape[1]
        seen += images.shape[1]
    return (loss_sum / seen).tolist()


def _evaluate(stack: _Stack, ctx: dist_.Context) -> list[dict[str, float]]:
    engines = [m.r.engine for m in stack.members]
    batches = ((torch.stack([b[0] for b in bs]), torch.stack([b[1] for b in bs]))
               for bs in zip(*(e.test_feed.epoch(0) for e in engines), strict=True))
    return evaluate(stack.model, batches, ctx, engines[0].cfg, members=len(engines))


def _global_rng() -> tuple:
    return torch.get_rng_state(), np.random.get_state()[1].tobytes(), random.getstate()


def train_stack(cfgs: list[TrainConfig | None], run_dirs: list[str | Path], resume: bool | list[bool] = False,
                stop_after: int | None = None, log: Callable[[str], None] = print,
                threads: int | None = None) -> list[dict[str, Any]]:
    """Train (or resume) K runs as one stack (module docstring); each member's summary, in order - for a member
    that diverged ``{"status": "diverged", "epoch": e, "error": ...}`` (what a solo run raises
    :class:`~pkmixer.train.engine.TrainingDiverged` for). ``resume``, ``stop_after`` (per member, from where it
    resumed) and ``threads`` as :func:`pkmixer.train.loop.train` - ``resume`` also one flag per run; a resumed
    run's config may be None (its own)."""
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after <= 0):
        raise ConfigError(f"--stop-after must be a positive integer, got {stop_after!r}")
    if len(cfgs) != len(run_dirs) or not cfgs:
        raise ConfigError(f"train_stack needs one run directory per config ({len(cfgs)} configs, "
                          f"{len(run_dirs)} directories)")
    runs = [RunDir(Path(d)) for d in run_dirs]
    again = [resume] * len(runs) if isinstance(resume, bool) else list(resume)
    if len(again) != len(runs):
        raise ConfigError(f"{len(again)} resume flags for {len(runs)} runs")
    if len({r.root.resolve() for r in runs}) != len(runs):
        raise ConfigError("stacked runs need distinct run directories")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("stacked runs train in one process; run them without torchrun")
    with ExitStack() as locks:
        for run, flag in zip(runs, again):
            locks.enter_context(claim_run(run, flag))
        prepared = [prepare_run(run, cfg, flag, True, log) for run, cfg, flag in zip(runs, cfgs, again)]
        cfgs = [resolve_auto_data(cfg, log) for cfg, _ in prepared]
        check_stackable(cfgs)
        ctx = dist_.setup(cfgs[0].run.device)
        try:
            if ctx.world > 1:
                raise ConfigError("stacked runs train in one process; run them without torchrun")
            return _train_stack(cfgs, runs, [resuming for _, resuming in prepared], ctx, log, stop_after, threads)
        finally:
            dist_.teardown()


def _train_stack(cfgs: list[TrainConfig], runs: list[RunDir], resuming: list[bool], ctx: dist_.Context,
                 log: Callable[[str], None], stop_after: int | None, threads: int | None) -> list[dict[str, Any]]:
    payloads = [read_checkpoint(run.latest) if again else None for run, again in zip(runs, resuming)]
    set_threads(payloads, threads, ctx, log)
    members = []
    for i, (cfg, run, payload) in enumerate(zip(cfgs, runs, payloads)):
        seed_everything(cfg.run.seed, cfg.run.deterministic)
        r = open_run(cfg, run, payload, ctx, log, write=False)
        end = cfg.schedule.epochs if stop_after is None else min(cfg.schedule.epochs, r.start_epoch + stop_after)
        members.append(_Member(i, r, rng_state(), end, r.start_epoch))
    if members[0].r.engine.pipeline != "resident":
        raise ConfigError("stacked runs need the resident data pipeline; this data set or augmentation has no "
                          "batched version")
    stack_models([m.r.model for m in members])  # refuses what it cannot carry before any file is written
    for m, payload in zip(members, payloads):
        start_files(m.r, payload is not None, ctx)
    started, rng = time.time(), _global_rng()
    stack: _Stack | None = None
    t0 = time.time()
    while True:
        live = [m for m in members if m.diverged is None and m.epoch < m.end_epoch]
        if not live:
            break
        epoch = min(m.epoch for m in live)
        group = [m for m in live if m.epoch == epoch]
        if stack is None or [m.index for m in stack.members] != [m.index for m in group]:
            if stack is not None:
                log(f"stack: members {[m.index for m in group]} from epoch {epoch + 1}")
            stack = _restack(group, ctx)
        losses = _train_epoch(stack, epoch, ctx)
        results = _evaluate(stack, ctx)
        now = _global_rng()
        if not (torch.equal(now[0], rng[0]) and now[1:] == rng[1:]):
            raise RuntimeError("stacked training drew from the global RNG, which its members' solo runs would "
                               "each have drawn from alone")
        _unstack(stack)
        elapsed, lr = time.time() - t0, stack.optimizer.param_groups[0]["lr"]
        for k, (m, loss, result) in enumerate(zip(group, losses, results)):
            m.epoch = epoch + 1
            if not math.isfinite(loss):
                write_diverged(m.r.run, epoch)
                m.diverged = (f"the loss became {loss} in epoch {epoch + 1}; the run stopped and keeps its last "
                              f"good checkpoint in {m.r.run.latest.parent}")
                log(f"{m.r.run.root}: {m.diverged}")
                continue
            m.last = {"epoch": epoch + 1, "train_loss": loss, **result, "lr": lr, "epoch_time": elapsed,
                      "stack_members": len(group), "stack_member": k}
            end_epoch_writes(m.r, m.last, m.end_epoch, ctx, lambda line, m=m: log(f"{m.r.run.root.name}: {line}"),
                             m.rng)
        t0 = time.time()
    out = []
    for m in members:
        if m.diverged is not None:
            out.append({"status": "diverged", "epoch": m.epoch, "error": m.diverged})
        else:
            out.append(write_summary(m.r, m.end_epoch, m.last, started, ctx))
    return out
