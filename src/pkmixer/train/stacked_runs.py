"""K runs trained as one stacked model (:mod:`pkmixer.train.stack`), each run directory what
:func:`pkmixer.train.loop.train` would have written for it alone.

:func:`train_stack` takes K configs that differ only in :data:`PER_MEMBER` - ``run.seed``,
``model.structure_seed``, ``optim.lr`` and ``optim.weight_decay`` - and K run directories. Each member is set up
exactly as a solo run (:meth:`pkmixer.train.run.Run.build`: seeded, its own data split, resident feeds, engine,
and on resume its own ``latest.pt``); the members' models, optimiser states and Polyak averages are then
stacked, and each epoch every member's batch comes from its own feed (its data order and augmentation draws
keyed by its own seed, as alone), its learning rate from its own schedule (its engine's, stepped through the
epoch as alone), its gradient clipped to ``optim.clip_grad`` by its
own global norm, one :class:`~pkmixer.train.stack.MemberOptimizer` step for all, the stacked Polyak average
(``optim.ema_decay``, timm's ``ModelEmaV3`` as the solo engine keeps it) updated after it, and one stacked
evaluation of the weights and of their average over each member's test set. At the end of an epoch the weights,
optimiser state and average are unstacked into each member's model and engine, and each member's metrics row and
checkpoints are written by :meth:`pkmixer.train.run.Run.end_epoch`, member after member: the checkpoints are
a solo run's, loadable alone, and ``loop.train(cfg, dir, resume=True)`` continues a member alone. Rows gain
``stack_members`` (the stack's size that epoch) and ``stack_member`` (the member's place in it): the float
rounding of a stacked epoch may depend on them.

Members regroup by completed epochs. A kill between two members' writes leaves members at different epochs (the
epoch of their ``latest.pt``; 0 without one). A stacked run - fresh or resumed - trains, one epoch at a time, the
group of members with the fewest completed epochs as one stack (a stack of one when alone); when it reaches the
epoch of the next group the two are one group from then on. So every member trains each of its epochs once
from its own checkpoint, and ends where an uninterrupted run ends. A member whose mean training loss of an epoch
is not finite stops there alone, as a solo run would: ``summary.json`` says ``diverged`` at that epoch and its
checkpoints stay those of the epoch before; the others restack and go on.

Refused (:class:`~pkmixer.errors.ConfigError`): configs that differ in anything but :data:`PER_MEMBER`; the
per-sample pipeline (the resident one only); several processes (torchrun); and whatever
:func:`~pkmixer.train.stack.stack_models` refuses. ``run.compile`` compiles the stacked model as
:func:`~pkmixer.train.engine.compiled` compiles a solo run's (the optimiser step and the Polyak average stay eager,
as there): fewer, fused kernels for the launch-bound small runs on a GPU. Tested in
tests/test_stacked_runs.py.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3
from torch import nn

from ..errors import ConfigError
from . import distributed as dist_
from .config import TrainConfig, flat_config
from .engine import StepEngine, compile_mode, compiled
from .evaluation import evaluate
from .run import Run, check_stop_after, rng_state, set_threads
from .stack import MemberOptimizer, StackedModel, build_optimizer, clip_member_grads_, stack_models

# what stacked runs' configs may differ in: the seeds, and each member's own learning rate and weight decay
PER_MEMBER = ("run.seed", "model.structure_seed", "optim.lr", "optim.weight_decay")


# ---- checks -----------------------------------------------------------------------------------------------


def stack_key(cfg: TrainConfig) -> str:
    """What must agree for runs to train as one stack: the config but for :data:`PER_MEMBER`, as text."""
    return json.dumps({k: v for k, v in flat_config(cfg.as_dict()).items() if k not in PER_MEMBER},
                      sort_keys=True, default=str)


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


# ---- the runs ---------------------------------------------------------------------------------------------


@dataclass
class _Member:
    index: int
    r: Run
    rng: dict[str, Any]  # the RNG states its solo run would checkpoint (stacked training draws from none)
    end_epoch: int
    epoch: int  # completed epochs
    diverged: str | None = None
    last: dict[str, Any] = field(default_factory=dict)  # its last metrics row of this invocation


@dataclass
class _Stack:
    members: list[_Member]
    model: StackedModel
    net: nn.Module  # what the steps call: the model, compiled with run.compile
    optimizer: MemberOptimizer
    ema: ModelEmaV3 | None  # the stacked Polyak average (optim.ema_decay), as each member's engine keeps its own

    @property
    def engines(self) -> list[StepEngine]:
        return [m.r.engine for m in self.members]


def _restack(group: list[_Member], ctx: dist_.Context) -> _Stack:
    """The group's members (their models and engines hold their state) as one stack, in the order the solo
    engine builds and restores its optimiser."""
    first = group[0].r
    model = stack_models([m.r.model for m in group]).to(ctx.device)
    if [n for n, _ in model.named_parameters()] != [n for n, _ in first.model.named_parameters()]:
        raise ConfigError("the stacked model's parameters do not follow its members'")  # the optimiser ids rely on it
    optimizer = build_optimizer(model, [m.r.cfg.optim for m in group])
    optimizer.load_members([m.r.engine.optimizer.state_dict() for m in group])
    ema = None
    if first.cfg.optim.ema_decay is not None:
        ema = ModelEmaV3(model, decay=first.cfg.optim.ema_decay)
        ema.module.load_state_dict(stack_models([m.r.engine.ema.module for m in group]).state_dict())
    mode = compile_mode(first.cfg.run)
    net = model if mode is None else compiled(model, mode)
    return _Stack(group, model, net, optimizer, ema)


def _unstack(stack: _Stack) -> None:
    """Each member's weights, optimiser state and Polyak average, from the stack into its own model and engine
    (its schedule is its own already: :func:`_member_lrs`)."""
    for k, (m, engine) in enumerate(zip(stack.members, stack.engines)):
        m.r.model.load_state_dict(stack.model.member_state_dict(k))
        engine.optimizer.load_state_dict(stack.optimizer.member_state_dict(
            k, engine.optimizer.state_dict()["param_groups"]))
        if stack.ema is not None:
            engine.ema.module.load_state_dict(stack.ema.module.member_state_dict(k))


def _member_lrs(engines: list[StepEngine], epoch: int, like: torch.Tensor) -> torch.Tensor:
    """Each member's learning rate for each update of ``epoch``, (steps, K) like ``like``: its own schedule,
    stepped through the epoch here as its solo run steps it (after each update), which leaves its optimiser's
    settings and schedule where the solo run's are at the epoch's end. One copy to the device an epoch."""
    steps = engines[0].steps_per_epoch
    rows = []
    for update in range(epoch * steps + 1, (epoch + 1) * steps + 1):
        rows.append([e.lr for e in engines])
        for e in engines:
            e.scheduler.step_update(update)
    return torch.tensor(rows, dtype=like.dtype).to(like.device)


def _train_epoch(stack: _Stack, epoch: int, ctx: dist_.Context) -> list[float]:
    """One epoch of the stack (as :meth:`StepEngine.train_epoch` for each member); the members' mean losses."""
    engines = stack.engines
    first, steps, K = engines[0], engines[0].steps_per_epoch, len(engines)
    clip = first.optim.clip_grad
    lrs = _member_lrs(engines, epoch, next(stack.model.parameters()))
    stack.net.train()
    loss_sum = torch.zeros(K, dtype=torch.float64, device=ctx.device)
    seen = 0
    for i, batches in enumerate(zip(*(e.train_feed.epoch(epoch) for e in engines), strict=True)):
        images = torch.stack([b[0] for b in batches])
        targets = torch.stack([b[1] for b in batches])
        with first.precision.autocast(ctx.device):
            losses = member_losses(first.criterion, stack.net(images), targets)
        stack.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # each member's gradient is its own loss's
        if clip is not None:
            clip_member_grads_(stack.model, clip)
        stack.optimizer.set_lr(lrs[i])
        stack.optimizer.step()
        if stack.ema is not None:
            stack.ema.update(stack.model, step=epoch * steps + i + 1)
        loss_sum += losses.detach().double() * images.shape[1]
        seen += images.shape[1]
    return (loss_sum / seen).tolist()


def _eval_batches(engines: list[StepEngine], split: str):
    return ((torch.stack([b[0] for b in bs]), torch.stack([b[1] for b in bs]))
            for bs in zip(*(e.eval_feeds[split].epoch(0) for e in engines), strict=True))


def _evaluate(stack: _Stack, ctx: dist_.Context) -> list[dict[str, float]]:
    """Each member's :meth:`StepEngine.evaluate`: its weights, and their Polyak average when kept, on each
    evaluated split."""
    engines, K = stack.engines, len(stack.members)
    precision, splits = engines[0].precision, list(engines[0].eval_feeds)
    results: list[dict[str, float]] = [{} for _ in range(K)]
    for split in splits:
        for result, own in zip(results, evaluate(stack.net, _eval_batches(engines, split), ctx, precision,
                                                 members=K, split=split)):
            result.update(own)
    if stack.ema is not None:
        for split in splits:
            averages = evaluate(stack.ema.module, _eval_batches(engines, split), ctx, precision, members=K,
                                split=split)
            for result, ema in zip(results, averages):
                result.update({f"ema_{split}_loss": ema[f"{split}_loss"], f"ema_{split}_error": ema[f"{split}_error"]})
    return results


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
    check_stop_after(stop_after)
    if len(cfgs) != len(run_dirs) or not cfgs:
        raise ConfigError(f"train_stack needs one run directory per config ({len(cfgs)} configs, "
                          f"{len(run_dirs)} directories)")
    again = [resume] * len(cfgs) if isinstance(resume, bool) else list(resume)
    if len(again) != len(cfgs):
        raise ConfigError(f"{len(again)} resume flags for {len(cfgs)} runs")
    if len({Path(d).resolve() for d in run_dirs}) != len(cfgs):
        raise ConfigError("stacked runs need distinct run directories")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("stacked runs train in one process; run them without torchrun")
    with Run.claimed(run_dirs, cfgs, again, log) as runs:
        for i, r in enumerate(runs[1:], 1):  # configs equal but for PER_MEMBER
            if stack_key(r.cfg) != stack_key(runs[0].cfg):
                first, other = flat_config(runs[0].cfg.as_dict()), flat_config(r.cfg.as_dict())
                differ = sorted(k for k in first.keys() | other.keys()
                                if k not in PER_MEMBER and first.get(k, "?") != other.get(k, "?"))
                raise ConfigError(f"stacked runs may differ only in {', '.join(PER_MEMBER)}; run {i} differs from "
                                  f"run 0 in {', '.join(differ[:3])}")
        if runs[0].cfg.data.pipeline == "per-sample":
            raise ConfigError("stacked runs need the resident data pipeline; data.pipeline=per-sample cannot be "
                              "stacked")
        ctx = dist_.setup(runs[0].cfg.run.device)
        try:
            return _train_stack(runs, ctx, log, stop_after, threads)
        finally:
            dist_.teardown()


def _train_stack(runs: list[Run], ctx: dist_.Context, log: Callable[[str], None], stop_after: int | None,
                 threads: int | None) -> list[dict[str, Any]]:
    set_threads([r.checkpoint for r in runs], threads, ctx, log)
    members = []
    for i, r in enumerate(runs):
        r.build(ctx)
        epochs = r.cfg.schedule.epochs
        end = epochs if stop_after is None else min(epochs, r.start_epoch + stop_after)
        members.append(_Member(i, r, rng_state(), end, r.start_epoch))
    if members[0].r.engine.pipeline != "resident":
        raise ConfigError("stacked runs need the resident data pipeline; this data set or augmentation has no "
                          "batched version")
    stack_models([m.r.model for m in members])  # refuses what it cannot carry before any file is written
    for r in runs:
        r.start()
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
        elapsed = time.time() - t0
        for k, (m, loss, result) in enumerate(zip(group, losses, results)):
            m.epoch = epoch + 1
            if not math.isfinite(loss):
                m.r.diverged(epoch)
                m.diverged = (f"the loss became {loss} in epoch {epoch + 1}; the run stopped and keeps its last "
                              f"good checkpoint in {m.r.files.latest.parent}")
                log(f"{m.r.files.root}: {m.diverged}")
                continue
            m.last = {"epoch": epoch + 1, "train_loss": loss, **result, "lr": m.r.engine.lr, "epoch_time": elapsed,
                      "stack_members": len(group), "stack_member": k}
            m.r.end_epoch(m.last, m.end_epoch, m.rng, log=lambda line, m=m: log(f"{m.r.files.root.name}: {line}"))
        t0 = time.time()
    return [{"status": "diverged", "epoch": m.epoch, "error": m.diverged} if m.diverged is not None
            else m.r.finish(m.end_epoch, started) for m in members]
