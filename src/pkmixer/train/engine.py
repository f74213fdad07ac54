"""The step engine of a run: forward/backward, update, schedule and Polyak average over its training feed, and
evaluation of its splits (Hayase & Karakida App. C, Table S.2; Mixer supp. B, C).

:class:`StepEngine` knows nothing of run directories or configs as a whole: the run
(:class:`pkmixer.train.run.Run`) builds the model and feeds (:mod:`pkmixer.train.build`,
:mod:`pkmixer.train.feeds`), hands the engine its ``optim`` and ``schedule`` sections with the resolved
:class:`Precision` and device, asks it for one epoch at a time, and saves and restores what
:meth:`StepEngine.state_dict` returns (optimiser, schedule, Polyak average).

The training loop makes no host synchronisation per step: the loss is summed on the device and read once per
epoch (a non-finite sum stops the run), except for the progress bar's occasional loss on a terminal.
"""
from __future__ import annotations

import math
import sys
from typing import Any

import torch
from timm.scheduler import CosineLRScheduler
from torch import nn
from tqdm import tqdm

from ..checkpoint import fit_optimizer_state
from ..errors import ConfigError
from ..layers.decay import decayed_parameters
from . import distributed as dist_
from .config import OptimConfig, RunConfig, ScheduleConfig
from .evaluation import evaluate
from .lasso import attach_beta_lasso, lasso_weights
from .precision import Precision


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


# ---- optimisation ---------------------------------------------------------------------------------------


def build_optimizer(optim: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum (App. C.4) or AdamW (App. C.5); weight decay on the parameters whose role
    is a weight, as each layer declares (:func:`~pkmixer.layers.decay.decayed_parameters`): not on biases,
    norms or anything a layer leaves out, whatever their rank. With ``optim.lasso`` > 0 each step is a β-LASSO
    step on those weights but the classifier's (:mod:`pkmixer.train.lasso`)."""
    decay_names = decayed_parameters(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if n in decay_names]
    rest = [p for n, p in named if n not in decay_names]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if optim.name == "adamw":  # the fused kernel: one pass over all tensors, 8x the per-tensor loop on a CPU
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in decay + rest)
        optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, fused=fused or None)
    else:
        optimizer = torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum,
                                    nesterov=optim.nesterov and optim.momentum > 0)
    attach_beta_lasso(optimizer, lasso_weights(model), optim.lasso, optim.lasso_beta)
    return optimizer


def build_scheduler(schedule: ScheduleConfig, optimizer: torch.optim.Optimizer,
                    steps_per_epoch: int) -> CosineLRScheduler:
    """Cosine annealing with linear warm-up, stepped every update."""
    s = schedule
    return CosineLRScheduler(optimizer, t_initial=s.epochs * steps_per_epoch, lr_min=s.min_lr,
                             warmup_t=round(s.warmup_epochs * steps_per_epoch), warmup_lr_init=s.warmup_lr,
                             t_in_epochs=False)


class GraphSteps(nn.Module):
    """A model compiled with CUDA graphs, each call a new step (``torch.compiler.cudagraph_mark_step_begin``):
    a graph's outputs live until the next replay, which the loops here never read past."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return self.net(x)


def compiled(model: nn.Module, mode: str) -> nn.Module:
    """``torch.compile(model, mode=mode)``; the CUDA-graph modes (reduce-overhead, max-autotune) mark each call a
    step (:class:`GraphSteps`). On the Fig. 5 paper-scale S-Mixers on an H100, reduce-overhead takes a training
    step from 8.1 to 4.8 ms at Ω = 2^18 and the RP S-Mixer's from 18.6 to 3.2 ms (docs/performance.md, h)."""
    net = torch.compile(model, mode=mode)
    return GraphSteps(net) if mode in ("reduce-overhead", "max-autotune") else net


def compile_mode(run: RunConfig) -> str | None:
    """The mode ``torch.compile`` runs in, or None: eager."""
    return run.compile_mode if run.compile else None


# ---- the engine -----------------------------------------------------------------------------------------


class StepEngine:
    """One run's training steps over its training feed (module docstring): the model (compiled with
    ``compile_mode``, DDP-wrapped on several processes), optimiser, per-update schedule, loss, and - with
    ``optim.ema_decay`` - a Polyak average of the weights (timm's ``ModelEmaV3``; Mixer supp. A.2 found no
    consistent gain, so it is off by default), evaluated beside the raw weights on every split of
    ``eval_feeds`` (in row order; the validation split, when held out, selects the run's best.pt)."""

    def __init__(self, model: nn.Module, train_feed, eval_feeds: dict[str, Any], criterion: nn.Module, *,
                 optim: OptimConfig, schedule: ScheduleConfig, precision: Precision, ctx: dist_.Context,
                 compile_mode: str | None = None, progress: bool = False) -> None:
        self.model, self.train_feed, self.eval_feeds, self.criterion = model, train_feed, eval_feeds, criterion
        self.optim, self.epochs, self.precision, self.ctx, self.progress = optim, schedule.epochs, precision, ctx, progress
        precision.apply()
        model.to(ctx.device)
        self.optimizer = build_optimizer(optim, model)
        self.scheduler = build_scheduler(schedule, self.optimizer, len(train_feed))
        self.ema = None
        if optim.ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(model, decay=optim.ema_decay)
        net: nn.Module = model
        if compile_mode is not None:
            net = compiled(net, compile_mode)
        if ctx.world > 1:
            net = nn.parallel.DistributedDataParallel(net, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                                      else None, broadcast_buffers=False)
        self.net = net

    @property
    def pipeline(self) -> str:
        return self.train_feed.name

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_feed)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs beside the weights to continue exactly, the training set's pipeline among it
        (its augmentation draws differ between the two)."""
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "pipeline": self.pipeline}
        if self.ema is not None:
            state["ema"] = {k: v.detach().cpu() for k, v in self.ema.module.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any], where) -> None:
        """Restore ``state`` (the training feed was chosen for the checkpoint's pipeline when it was built)."""
        self.optimizer.load_state_dict(state["optimizer"])
        fit_optimizer_state(self.optimizer)  # moments saved in a parameter's earlier shape
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            if "ema" not in state:
                raise ConfigError(f"{where} holds no Polyak average for optim.ema_decay")
            self.ema.module.load_state_dict(state["ema"])

    def train_epoch(self, epoch: int) -> float:
        """One epoch of updates; the mean training loss. TrainingDiverged when it is not finite."""
        ctx = self.ctx
        self.net.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        seen = 0
        updates = epoch * self.steps_per_epoch
        show = ctx.is_main and self.progress and sys.stderr.isatty()
        bar = tqdm(total=self.steps_per_epoch, desc=f"epoch {epoch + 1}/{self.epochs}", leave=False,
                   disable=not show)
        for images, targets in self.train_feed.epoch(epoch):
            with self.precision.autocast(ctx.device):
                loss = self.criterion(self.net(images), targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.optim.clip_grad is not None:
                nn.utils.clip_grad_norm_(self.net.parameters(), self.optim.clip_grad)
            self.optimizer.step()
            updates += 1
            self.scheduler.step_update(updates)
            if self.ema is not None:
                self.ema.update(self.model, step=updates)
            loss_sum += loss.detach().double() * images.shape[0]
            seen += images.shape[0]
            if show:
                bar.update()
                if updates % 25 == 0:  # reading the loss waits for the device: only for the display
                    bar.set_postfix(loss=f"{float(loss):.4f}", lr=f"{self.lr:.2e}")
        bar.close()
        total, seen = dist_.all_reduce_sum([float(loss_sum), seen], ctx)
        if not math.isfinite(total):
            raise TrainingDiverged(f"the loss became {total / seen} in epoch {epoch + 1}")
        return total / seen

    def evaluate(self) -> dict[str, float]:
        """Loss and error on each evaluated split (``val_``, ``test_`` keys) of the weights, and of their Polyak
        average (``ema_val_``, ``ema_test_`` keys) when kept."""
        result: dict[str, float] = {}
        for split, feed in self.eval_feeds.items():
            result.update(evaluate(self.net, feed.epoch(0), self.ctx, self.precision, split=split))
        if self.ema is not None:
            for split, feed in self.eval_feeds.items():
                ema = evaluate(self.ema.module, feed.epoch(0), self.ctx, self.precision, split=split)
                result.update({f"ema_{split}_loss": ema[f"{split}_loss"], f"ema_{split}_error": ema[f"{split}_error"]})
        return result
