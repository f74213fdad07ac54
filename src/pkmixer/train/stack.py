"""Stacked training: K models of one architecture shape trained as one model with a leading member axis.

:func:`stack_models` turns K built models (the seeds of a sweep point: their own initialisations and RP
permutations or SW-MLP masks) into a :class:`StackedModel` whose tensors are the members' stacked on a first
axis of length K, under the members' own names: its forward maps (K, B, c, H, W) to (K, B, classes), member k's
batch through member k's weights only, as batched products and per-member gathers
(:mod:`pkmixer.layers.stacked`). :meth:`StackedModel.unstack` gives each member's ``state_dict`` back, the one
a model of that member's architecture loads alone. :class:`MemberOptimizer` is the members' AdamW or SGD as one
update on the stacked tensors, each member with its own learning rate and weight decay, and
:func:`clip_member_grads_` each member's global-norm gradient clip. :func:`train_stacked`
advances the K members together, each with its own data order (a generator seeded by its seed over in-memory
tensors), one :func:`stacked_step` per batch; :func:`train_one` is the same loop for one model, the reference it
equals. benchmarks/stack.py (section s) times it against K sequential runs.

What stacks is declared by the models, not known here (the model contract, docs/architecture.md): a family
declares ``stacked_forward(net, x)``, and each of its modules how K copies of it stack
(:mod:`pkmixer.layers.stacked`). In pkmixer that carries the Mixer in MLP-Mixer and S-Mixer form, normal or RP
(per-member J₁, J₂), with ``num_tokens`` skips, pyramids and ``token_tiles``, and the SW-MLP with dense-masked
weights (p = 1 included) or CSR weights (one block-diagonal CSR product); members whose optimiser settings differ in
``lr`` and ``weight_decay``; gradient clipping. Refused with a :class:`~pkmixer.errors.ConfigError`: a module that
declares no stacked form (the supp. A.1 untied or grouped token mixing), dropout or stochastic depth above 0 (their
randomness is not per member), members of different shapes, devices or dtypes, members whose optimiser settings
differ in anything else, and - in :func:`train_stacked` only - EMA.

Guaranteed and tested (tests/test_stack.py): the stacked forward and gradients equal each member's, and a
stacked run of :func:`train_stacked` equals :func:`train_one` on each member, to floating-point tolerance
(the sums run in another order); a member whose loss goes non-finite stops alone, its parameters frozen at
their last finite step, without host synchronisation in the step. ``torch.func.vmap`` over
``functional_call`` carries the normal S-Mixer and the masked SW-MLP but not the RP gathers (their cached
index pairs and :class:`~pkmixer.layers.pk.PermuteColumns`) nor CSR weights (whose sizes differ per seed), and
where it runs it measured slower than these layers (section s), so it is not used.

Real runs - run directories, checkpoints, resume, per-member schedules, augmentation, the Polyak average -
trained as one stack are :mod:`pkmixer.train.stacked_runs`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..layers.decay import decayed_parameters
from ..layers.stacked import ragged_tensors, stack_modules
from .config import OptimConfig


def _tensors(model: nn.Module) -> list[tuple]:
    """What must agree between members for each tensor: name, shape, dtype, device - the last axis of the tensors a
    layer declares ragged excepted (:func:`~pkmixer.layers.stacked.ragged_tensors`: a CSR layer's kept weights)."""
    ragged = {f"{path}.{name}" if path else name for path, m in model.named_modules() for name in ragged_tensors(m)}
    return [(name, t.shape[:-1] if name in ragged else t.shape, t.dtype, t.device)
            for name, t in [*model.named_parameters(), *model.named_buffers()]]


def _check_members(models: Sequence[nn.Module]) -> None:
    if not models:
        raise ConfigError("stack_models needs at least one model")
    first = models[0]
    if not hasattr(type(first), "stacked_forward"):
        raise ConfigError(f"stack_models carries model families that declare stacked_forward (in pkmixer: Mixer and "
                          f"SWMLP), not {type(first).__name__}")
    if any(p is not None for p in first._parameters.values()):
        raise ConfigError(f"{type(first).__name__} holds parameters outside its modules; it cannot be stacked")
    tensors = _tensors(first)
    for k, model in enumerate(models[1:], 1):
        if type(model) is not type(first):
            raise ConfigError(f"member {k} is a {type(model).__name__}, member 0 a {type(first).__name__}")
        for a, b in zip_longest(tensors, _tensors(model)):
            if a != b:
                raise ConfigError(f"member {k} differs from member 0 in a tensor's name, shape, dtype or device: "
                                  f"{b} against {a}")
        for name, buffer in first._buffers.items():
            other = model._buffers[name]
            if (buffer is None) != (other is None) or (buffer is not None and not torch.equal(buffer, other)):
                raise ConfigError(f"member {k} differs from member 0 in its buffer {name}, which members share")


class StackedModel(nn.Module):
    """K models of one family and shape as one module; see the module docstring. Built by :func:`stack_models`:
    each child of the members stacked (:func:`~pkmixer.layers.stacked.stack_modules`), the model's own buffers
    (derived from its shape, as the Mixer's ``token_order``) shared, and the forward the family declares,
    ``stacked_forward(net, x)``: (K, B, c, H, W) -> (K, B, classes)."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        _check_members(models)
        first = models[0]
        self.members = len(models)
        self.family = type(first).__name__
        self._stacked_forward = type(first).stacked_forward
        self.in_chans, self.img_size, self.num_classes = first.in_chans, first.img_size, first.num_classes
        for name, child in first._modules.items():
            self.add_module(name, None if child is None else stack_modules([m._modules[name] for m in models], name))
        for name, buffer in first._buffers.items():
            self.register_buffer(name, buffer, persistent=name not in first._non_persistent_buffers_set)
        self._no_weight_decay = set(first.no_weight_decay()) if hasattr(first, "no_weight_decay") else set()

    def no_weight_decay(self) -> set[str]:
        """The members' exclusions (timm's convention, pkmixer.layers.decay)."""
        return self._no_weight_decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, B, c, H, W) -> (K, B, classes)
        if x.ndim != 5 or x.shape[0] != self.members or tuple(x.shape[2:]) != (self.in_chans, self.img_size,
                                                                                self.img_size):
            raise ValueError(f"expected input of shape ({self.members}, B, {self.in_chans}, {self.img_size}, "
                             f"{self.img_size}), got {tuple(x.shape)}")
        return self._stacked_forward(self, x)

    def padded(self) -> dict[str, tuple[int, ...]]:
        """The tensors whose last axis is padded (ragged between members: a CSR layer's kept weights and
        coordinates, :class:`~pkmixer.layers.stacked.StackedSparseLinear`), by name, with each member's own
        length."""
        return {f"{path}.{name}": sizes for path, m in self.named_modules() if hasattr(m, "padded")
                and m is not self for name, sizes in m.padded.items()}

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's ``state_dict``: what a model of its architecture loads alone (copies, not views)."""
        padded = self.padded()
        return {name: (t[k, ..., :padded[name][k]] if name in padded else t[k]).clone()
                for name, t in self.state_dict().items()}

    def unstack(self) -> list[dict[str, torch.Tensor]]:
        """Every member's ``state_dict``, in order."""
        return [self.member_state_dict(k) for k in range(self.members)]


def stack_models(models: Sequence[nn.Module]) -> StackedModel:
    """K built models of one architecture shape as one :class:`StackedModel` (copies of their tensors);
    ConfigError for what it cannot carry (module docstring)."""
    return StackedModel(list(models))


# ---- training ---------------------------------------------------------------------------------------------


MEMBER_OPTIM = ("lr", "weight_decay")  # what stacked members' optimiser settings may differ in
ADAMW_EPS = 1e-8  # torch's AdamW default, which engine.build_optimizer keeps


def member_optims(optim: OptimConfig | Sequence[OptimConfig], members: int) -> list[OptimConfig]:
    """One optimiser setting per member (one given: every member's); ConfigError unless they agree but for
    :data:`MEMBER_OPTIM`."""
    configs = [optim] * members if isinstance(optim, OptimConfig) else list(optim)
    if len(configs) != members:
        raise ConfigError(f"{len(configs)} optimiser settings for {members} stacked members")
    if any(c.lasso > 0 for c in configs):
        raise ConfigError("stacked runs do not carry β-LASSO (optim.lasso > 0): train those runs alone")
    shared = [dataclasses.replace(c, lr=1.0, weight_decay=0.0) for c in configs]
    if any(c != shared[0] for c in shared):
        raise ConfigError("stacked members may differ in their optimiser's lr and weight_decay only; train "
                          "members whose optimiser settings differ otherwise separately")
    return configs


def build_optimizer(model: nn.Module, optim: OptimConfig | Sequence[OptimConfig]) -> torch.optim.Optimizer:
    """For one model, AdamW (fused) or SGD with (Nesterov) momentum, weight decay on :func:`decayed_parameters`
    only, as :func:`pkmixer.train.engine.build_optimizer`; for a :class:`StackedModel`, the
    :class:`MemberOptimizer` of its members' settings (one for all, or one each)."""
    if isinstance(model, StackedModel):
        return MemberOptimizer(model, member_optims(optim, model.members))
    (optim,) = member_optims(optim, 1)
    decay_names = decayed_parameters(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay_names], "weight_decay": optim.weight_decay},
              {"params": [p for n, p in named if n not in decay_names], "weight_decay": 0.0}]
    if optim.name == "adamw":
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for _, p in named)
        return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, fused=fused or None)
    return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum,
                           nesterov=optim.nesterov and optim.momentum > 0)


def _member_views(values: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """(K,) per-member values as (K, 1, ..., 1) for each stacked tensor, to broadcast over it (torch's foreach
    ops take such lists, one kernel per tensor)."""
    return [values.view(-1, *(1,) * (t.ndim - 1)) for t in tensors]


class MemberOptimizer(torch.optim.Optimizer):
    """The members' AdamW (App. C.5) or SGD with (Nesterov) momentum (App. C.4) as one update of a
    :class:`StackedModel`'s tensors, each member with its own learning rate and weight decay.

    Both are (K,) tensors: ``lr`` of every group (:meth:`set_lr` sets it before a step, so each member follows
    its own schedule) and ``weight_decay`` of the decayed group (the other has None). Member k's slices take the
    update torch's optimiser of its setting makes with lr_k and wd_k: AdamW's decoupled decay
    p ← p·(1 − lr_k·wd_k) − lr_k·m̂/(√v̂ + ε), SGD's coupled g + wd_k·p through the momentum and p ← p − lr_k·d.
    The state is torch's, each tensor with the member axis first (``step``, ``exp_avg``, ``exp_avg_sq``;
    ``momentum_buffer``): :meth:`load_members` and :meth:`member_state_dict` convert it from and to the
    state dicts of the members' own optimisers."""

    def __init__(self, model: StackedModel, optims: Sequence[OptimConfig]) -> None:
        decay_names = decayed_parameters(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        like = named[0][1]
        o = optims[0]

        def per_member(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=like.dtype, device=like.device)

        groups = [{"params": [p for n, p in named if n in decay_names],
                   "weight_decay": per_member([c.weight_decay for c in optims])},
                  {"params": [p for n, p in named if n not in decay_names], "weight_decay": None}]
        super().__init__(groups, dict(lr=per_member([c.lr for c in optims]), name=o.name, betas=o.betas,
                                      eps=ADAMW_EPS, momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0))
        # state index -> each member's length, for tensors padded along their last axis (CSR kept weights)
        padded, names = model.padded(), {p: n for n, p in named}
        self.padded = {i: padded[names[p]] for i, p in enumerate(p for g in self.param_groups for p in g["params"])
                       if names[p] in padded}

    def set_lr(self, lr: torch.Tensor) -> None:
        """Each member's learning rate for the next step, (K,) on the parameters' device."""
        for group in self.param_groups:
            group["lr"] = lr

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._adamw if group["name"] == "adamw" else self._sgd)(group, params)

    def _adamw(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """torch's AdamW (``_single_tensor_adam`` with decoupled decay), with per-member lr and decay."""
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        states = [self.state[p] for p in params]
        for p, s in zip(params, states):
            if not s:
                s.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        torch._foreach_add_([s["step"] for s in states], 1)
        steps = [s["step"].item() for s in states]  # host tensors, as torch's: no device synchronisation
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denoms, [math.sqrt(1 - beta2 ** t) for t in steps])
        torch._foreach_add_(denoms, group["eps"])
        directions = torch._foreach_div(exp_avgs, denoms)
        if wd is not None:
            torch._foreach_mul_(params, _member_views(1 - lr * wd, params))
        torch._foreach_addcmul_(params, directions, _member_views(lr, params), [-1 / (1 - beta1 ** t) for t in steps])

    def _sgd(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """torch's SGD (no dampening), with per-member lr and decay; a missing momentum buffer starts at zero,
        so that its first value is the gradient, as torch's clone."""
        lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
        grads = [p.grad for p in params]
        if wd is not None:
            grads = torch._foreach_addcmul(grads, params, _member_views(wd, params))
        if momentum:
            states = [self.state[p] for p in params]
            for p, s in zip(params, states):
                s.setdefault("momentum_buffer", torch.zeros_like(p))
            bufs = [s["momentum_buffer"] for s in states]
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, grads)
            grads = torch._foreach_add(grads, bufs, alpha=momentum) if group["nesterov"] else bufs
        torch._foreach_addcmul_(params, grads, _member_views(lr, params), value=-1)

    def load_members(self, states: Sequence[dict[str, Any]]) -> None:
        """The members' own optimisers' ``state_dict``s (torch's optimiser of their setting over their model,
        one parameter order: :func:`build_optimizer`'s), as this one's state: tensors stacked (zero-padded where
        the parameter is), the step count - which must agree - kept once, on the host. This optimiser's settings
        stay its own."""
        ids = states[0]["state"].keys()
        if any(s["state"].keys() != ids for s in states):
            raise ConfigError("stacked members' optimiser states hold different parameters")
        stacked: dict[int, dict[str, torch.Tensor]] = {}
        for idx in ids:
            entry = stacked[idx] = {}
            for key in states[0]["state"][idx]:
                values = [s["state"][idx][key] for s in states]
                if key == "step":
                    counts = {float(v) for v in values}
                    if len(counts) > 1:
                        raise ConfigError(f"stacked members are at different optimiser steps {sorted(counts)}")
                    entry[key] = torch.tensor(counts.pop())
                elif idx in self.padded:
                    entry[key] = torch.stack([F.pad(v, (0, max(self.padded[idx]) - v.shape[-1])) for v in values])
                else:
                    entry[key] = torch.stack(values)
        self.load_state_dict({"state": stacked, "param_groups": self.state_dict()["param_groups"]})

    def member_state_dict(self, k: int, param_groups: list[dict[str, Any]]) -> dict[str, Any]:
        """Member k's slice of the state (copies) with ``param_groups`` - its own optimiser's settings and
        schedule - as the ``state_dict`` its own optimiser loads."""
        def own(idx: int, key: str, v: torch.Tensor) -> torch.Tensor:
            if key == "step":
                return v.clone()
            return (v[k, ..., :self.padded[idx][k]] if idx in self.padded else v[k]).clone()

        return {"state": {idx: {key: own(idx, key, v) for key, v in entry.items()}
                          for idx, entry in self.state_dict()["state"].items()},
                "param_groups": [dict(g) for g in param_groups]}


def clip_member_grads_(model: StackedModel, max_norm: float) -> torch.Tensor:
    """Each member's ``torch.nn.utils.clip_grad_norm_(member.parameters(), max_norm)`` - the solo run's global
    clip - on its own slice of the gradients: member k's norm runs over all its tensors, and its gradient is
    scaled by min(1, max_norm / (norm_k + 1e-6)). Returns the members' norms, (K,)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])  # (tensors, K)
    norms = torch.linalg.vector_norm(per_tensor, dim=0)
    torch._foreach_mul_(grads, _member_views(torch.clamp(max_norm / (norms + 1e-6), max=1.0), grads))
    return norms


@dataclass(frozen=True)
class TensorData:
    """In-memory training and test tensors (images normalised, labels int64), shared by the members."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor | None = None
    y_test: torch.Tensor | None = None


@dataclass
class MemberResult:
    """One member's history: per epoch the mean training loss over its finite steps and the test error."""

    seed: int
    train_loss: list[float] = field(default_factory=list)
    test_error: list[float] = field(default_factory=list)
    stopped_step: int | None = None  # the step whose loss was non-finite (the member stopped before it)


def _steps(n: int, batch_size: int) -> range:
    if n < batch_size:
        raise ConfigError(f"batch_size {batch_size} exceeds the {n} training images")
    return range(0, n - batch_size + 1, batch_size)  # full batches only


@torch.no_grad()
def _test_errors(model: nn.Module, data: TensorData, batch: int, stacked: int | None) -> list[float]:
    if data.x_test is None:
        return []
    model.eval()
    wrong = 0
    for i in range(0, data.x_test.shape[0], batch):
        x, y = data.x_test[i:i + batch], data.y_test[i:i + batch]
        logits = model(x if stacked is None else x.expand(stacked, *x.shape))
        wrong = wrong + (logits.argmax(-1) != y).sum(-1)
    model.train()
    errors = (wrong.double() / data.x_test.shape[0]).reshape(-1)
    return errors.tolist()


def _no_ema(configs: Sequence[OptimConfig]) -> None:
    if configs[0].ema_decay is not None:
        raise ConfigError("train_one and train_stacked keep no Polyak average; set ema_decay to None (real runs "
                          "stack with it: pkmixer.train.stacked_runs)")


def train_one(model: nn.Module, seed: int, data: TensorData, optim: OptimConfig, epochs: int, batch_size: int,
              eval_batch_size: int = 256) -> MemberResult:
    """Train one model: each epoch a ``torch.randperm`` of the training set from a generator seeded by ``seed``,
    full batches of mean cross-entropy, the gradient clipped to ``optim.clip_grad`` when set, one optimizer
    step each; stop at the first non-finite loss (no step)."""
    _no_ema([optim])
    opt = build_optimizer(model, optim)
    generator = torch.Generator().manual_seed(seed)
    result, step, device = MemberResult(seed), 0, next(model.parameters()).device
    model.train()
    for _ in range(epochs):
        order = torch.randperm(data.x_train.shape[0], generator=generator).to(device)
        total, taken = 0.0, 0
        for start in _steps(data.x_train.shape[0], batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
            if not torch.isfinite(loss):
                result.stopped_step = step
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if optim.clip_grad is not None:
                nn.utils.clip_grad_norm_(model.parameters(), optim.clip_grad)
            opt.step()
            total, taken, step = total + float(loss.detach()), taken + 1, step + 1
        result.train_loss.append(total / taken if taken else math.nan)
        result.test_error += _test_errors(model, data, eval_batch_size, None)
        if result.stopped_step is not None:
            break
    return result


def stacked_step(model: StackedModel, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 active: torch.Tensor, clip_grad: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of every member on its own batch, x (K, B, c, H, W) and y (K, B), each member's gradient clipped
    to ``clip_grad`` when given; ``active`` (K,) bool says which members still train. Returns the members'
    losses (K,) and ``active`` less the members whose loss is not finite: their loss leaves the sum and the
    step leaves their parameters as they were."""
    K = x.shape[0]
    losses = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(K, -1).mean(1)
    active = active & torch.isfinite(losses)
    optimizer.zero_grad(set_to_none=True)
    torch.where(active, losses, 0.0).sum().backward()
    if clip_grad is not None:
        clip_member_grads_(model, clip_grad)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    before = [p.detach().clone() for p in params]
    optimizer.step()
    with torch.no_grad():
        for p, old in zip(params, before):
            p.copy_(torch.where(active.view(K, *(1,) * (p.ndim - 1)), p, old))
    return losses.detach(), active


def train_stacked(model: StackedModel, seeds: Sequence[int], data: TensorData,
                  optim: OptimConfig | Sequence[OptimConfig], epochs: int, batch_size: int,
                  eval_batch_size: int = 256) -> list[MemberResult]:
    """Train the K members of ``model`` together, member k as :func:`train_one` with ``seeds[k]`` and its
    optimiser setting (``optim``: one for all, or one each, differing in lr and weight decay) would: the loss
    is the sum over members of each one's mean cross-entropy, so each member's gradient is its own. A member whose
    loss goes non-finite stops alone: its loss leaves the sum and its parameters keep their values from before
    that step. The step never synchronises with the host; the metrics are read once per epoch."""
    K = model.members
    if len(seeds) != K:
        raise ConfigError(f"{len(seeds)} seeds for {K} stacked members")
    optims = member_optims(optim, K)
    _no_ema(optims)
    opt = build_optimizer(model, optims)
    device = next(model.parameters()).device
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    results = [MemberResult(s) for s in seeds]
    active = torch.ones(K, dtype=torch.bool, device=device)
    stopped_at = torch.full((K,), -1, dtype=torch.long, device=device)
    n, step = data.x_train.shape[0], 0
    model.train()
    for _ in range(epochs):
        running = active.tolist()
        if not any(running):
            break
        orders = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(device)  # (K, N)
        total = torch.zeros(K, dtype=torch.float64, device=device)
        taken = torch.zeros(K, dtype=torch.long, device=device)
        for start in _steps(n, batch_size):
            idx = orders[:, start:start + batch_size]  # (K, B): each member its own batch
            losses, now = stacked_step(model, opt, data.x_train[idx], data.y_train[idx], active,
                                       optims[0].clip_grad)
            stopped_at = torch.where(active & ~now, step, stopped_at)
            active = now
            total += torch.where(active, losses, 0.0)
            taken += active
            step += 1
        errors = _test_errors(model, data, eval_batch_size, K)
        for k, (r, was, t, c, s) in enumerate(zip(results, running, total.tolist(), taken.tolist(),
                                                  stopped_at.tolist())):
            if not was:
                continue
            r.train_loss.append(t / c if c else math.nan)
            if errors:
                r.test_error.append(errors[k])
            if s >= 0:
                r.stopped_step = s
    return results
