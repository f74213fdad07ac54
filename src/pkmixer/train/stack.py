"""Stacked training: K models of one architecture shape trained as one model with a leading member axis.

:func:`stack_models` turns K built models (the seeds of a sweep point: their own initialisations and RP
permutations or SW-MLP masks) into a :class:`StackedModel` whose tensors are the members' stacked on a first
axis of length K, under the members' own names: its forward maps (K, B, c, H, W) to (K, B, classes), member k's
batch through member k's weights only, as batched products and per-member gathers
(:mod:`pkmixer.layers.stacked`). :meth:`StackedModel.unstack` gives each member's ``state_dict`` back, the one
a model of that member's architecture loads alone. :func:`train_stacked` advances the K members together, each
with its own data order (a generator seeded by its seed over in-memory tensors) and an optimizer on the stacked
tensors equal to K separate ones, one :func:`stacked_step` per batch; :func:`train_one` is the same loop for one
model, the reference it equals. benchmarks/stack.py (section s) times it against K sequential runs.

Carried: the :class:`~pkmixer.models.mixer.Mixer` in MLP-Mixer and S-Mixer form, normal or RP (per-member
J₁, J₂), with ``num_tokens`` skips, pyramids and ``token_tiles``; the :class:`~pkmixer.models.swmlp.SWMLP`
with dense-masked weights (``weight_format="masked"``, p = 1 included). Refused with a
:class:`~pkmixer.errors.ConfigError`: CSR ``SparseLinear`` weights (use the masked form), the supp. A.1 untied
or grouped token mixing, dropout or stochastic depth above 0 (their randomness is not per member), members of
different shapes, devices or dtypes, members given different optimiser settings, and gradient clipping or EMA.

Guaranteed and tested (tests/test_stack.py): the stacked forward and gradients equal each member's, and a
stacked run of :func:`train_stacked` equals :func:`train_one` on each member, to floating-point tolerance
(the sums run in another order); a member whose loss goes non-finite stops alone, its parameters frozen at
their last finite step, without host synchronisation in the step. ``torch.func.vmap`` over
``functional_call`` carries the normal S-Mixer and the masked SW-MLP but not the RP gathers (their cached
index pairs and :class:`~pkmixer.layers.pk.PermuteColumns`) nor CSR weights (whose sizes differ per seed), and
where it runs it measured slower than these layers (section s), so it is not used.

Real runs - run directories, checkpoints, resume, schedules, augmentation - trained as one stack are
:mod:`pkmixer.train.stack_runs`. Not part of it yet: per-member learning rates.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import zip_longest

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from ..errors import ConfigError
from ..layers.decay import decayed_parameters
from ..layers.mlp import FcAct, Mlp
from ..layers.pk import PKMixing
from ..layers.sparse import MaskedLinear, SparseLinear
from ..layers.stacked import (StackedLayerNorm, StackedLinear, StackedMaskedLinear, StackedPatchConv,
                              StackedPKMixing, StackedTokenSkip)
from ..models.mixer import Mixer, MixerBlock, MixingSublayer, TokenProjectionSkip
from ..models.swmlp import SWMLP, SparseBlock
from .config import OptimConfig

# modules whose forward is generic in the leading axes: reused with their children stacked
CONTAINERS = (MixerBlock, MixingSublayer, SparseBlock, FcAct, Mlp, nn.ModuleList)
STATELESS = (nn.GELU, nn.ReLU, nn.Identity, nn.Dropout)


def _describe(module: nn.Module) -> str:
    """What must agree between members for one module (a mask's kept count may differ)."""
    if isinstance(module, MaskedLinear):
        return f"in={module.in_features}, out={module.out_features}, p={module.density}"
    return module.extra_repr()


def _check_members(models: Sequence[nn.Module]) -> None:
    if not models:
        raise ConfigError("stack_models needs at least one model")
    first = models[0]
    if not isinstance(first, (Mixer, SWMLP)):
        raise ConfigError(f"stack_models carries Mixer and SWMLP models, not {type(first).__name__}")
    for path, module in first.named_modules():
        if isinstance(module, SparseLinear):
            raise ConfigError(f"{path} holds CSR SparseLinear weights, which cannot be stacked: build the SW-MLP "
                              "with weight_format='masked'")
        if isinstance(module, DropPath) or (isinstance(module, nn.Dropout) and module.p > 0):
            raise ConfigError(f"{path} has dropout or stochastic depth, whose randomness stacking does not keep per "
                              "member: use rate 0")
    modules = [(name, type(m), _describe(m)) for name, m in first.named_modules()]
    tensors = [(name, t.shape, t.dtype, t.device) for name, t in [*first.named_parameters(), *first.named_buffers()]]
    for k, model in enumerate(models[1:], 1):
        if type(model) is not type(first):
            raise ConfigError(f"member {k} is a {type(model).__name__}, member 0 a {type(first).__name__}")
        for a, b in zip(modules, [(n, type(m), _describe(m)) for n, m in model.named_modules()], strict=False):
            if a != b:
                raise ConfigError(f"member {k} differs from member 0 at {a[0] or 'the top'}: {b[1].__name__}({b[2]}) "
                                  f"against {a[1].__name__}({a[2]})")
        other = [(n, t.shape, t.dtype, t.device) for n, t in [*model.named_parameters(), *model.named_buffers()]]
        for a, b in zip_longest(tensors, other):
            if a != b:
                raise ConfigError(f"member {k} differs from member 0 in a tensor's name, shape, dtype or device: "
                                  f"{b} against {a}")


def _stack(modules: list[nn.Module], path: str) -> nn.Module:
    """The stacked form of the members' modules at ``path`` (all of one type and shape)."""
    first = modules[0]
    where = path or "the model"
    if type(first) is nn.Linear:
        return StackedLinear.from_members(modules)
    if type(first) is MaskedLinear:
        return StackedMaskedLinear.from_members(modules)
    if type(first) is nn.LayerNorm:
        return StackedLayerNorm.from_members(modules)
    if type(first) is nn.Conv2d:
        if (first.kernel_size != first.stride or first.padding != (0, 0) or first.dilation != (1, 1)
                or first.groups != 1 or first.kernel_size[0] != first.kernel_size[1]):
            raise ConfigError(f"{where} is a convolution other than a square per-patch FC; it cannot be stacked")
        return StackedPatchConv.from_members(modules)
    if type(first) is PKMixing:
        return StackedPKMixing(modules, _stack([m.mlp for m in modules], f"{path}.mlp"))
    if type(first) is TokenProjectionSkip:
        return StackedTokenSkip(_stack([m.proj for m in modules], f"{path}.proj"),
                                _stack([m.norm for m in modules], f"{path}.norm"))
    if type(first) in STATELESS:
        return copy.deepcopy(first)
    if type(first) in CONTAINERS:
        if first._parameters or first._buffers:
            raise ConfigError(f"{where} ({type(first).__name__}) holds tensors of its own; it cannot be stacked")
        out = copy.copy(first)
        out._modules = {name: None if child is None else _stack([m._modules[name] for m in modules],
                                                                  f"{path}.{name}" if path else name)
                        for name, child in first._modules.items()}
        return out
    raise ConfigError(f"{where} is a {type(first).__name__}, which stacking does not carry (the supp. A.1 untied or "
                      "grouped token mixing, for one)")


class StackedModel(nn.Module):
    """K Mixers or SW-MLPs of one shape as one module; see the module docstring. Built by :func:`stack_models`."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        _check_members(models)
        first = models[0]
        self.members = len(models)
        self.kind = "mixer" if isinstance(first, Mixer) else "swmlp"
        self.in_chans, self.img_size, self.num_classes = first.in_chans, first.img_size, first.num_classes
        for name, _ in first.named_children():
            self.add_module(name, _stack([m.get_submodule(name) for m in models], name))
        if self.kind == "swmlp" and first.input_layer is None:
            self.input_layer = None
        # Mixer's token_tiles gather: derived from the shape, one for all members, not state
        self.register_buffer("token_order", getattr(first, "token_order", None), persistent=False)
        self._no_weight_decay = set(first.no_weight_decay()) if hasattr(first, "no_weight_decay") else set()

    def no_weight_decay(self) -> set[str]:
        """The members' exclusions (timm's convention, pkmixer.layers.decay)."""
        return self._no_weight_decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, B, c, H, W) -> (K, B, classes)
        if x.ndim != 5 or x.shape[0] != self.members or tuple(x.shape[2:]) != (self.in_chans, self.img_size,
                                                                                self.img_size):
            raise ValueError(f"expected input of shape ({self.members}, B, {self.in_chans}, {self.img_size}, "
                             f"{self.img_size}), got {tuple(x.shape)}")
        x = self.stem(x)  # (K, B, S0, C)
        if self.kind == "swmlp":
            x = x.flatten(2)  # (K, B, S0·C), row-major as the members' vectorisation
            if self.input_layer is not None:
                x = self.input_layer(x)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))
        if self.token_order is not None:
            x = x.index_select(2, self.token_order)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(dim=2))

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's ``state_dict``: what a model of its architecture loads alone (copies, not views)."""
        return {name: t[k].clone() for name, t in self.state_dict().items()}

    def unstack(self) -> list[dict[str, torch.Tensor]]:
        """Every member's ``state_dict``, in order."""
        return [self.member_state_dict(k) for k in range(self.members)]


def stack_models(models: Sequence[nn.Module]) -> StackedModel:
    """K built models of one architecture shape as one :class:`StackedModel` (copies of their tensors);
    ConfigError for what it cannot carry (module docstring)."""
    return StackedModel(list(models))


# ---- training ---------------------------------------------------------------------------------------------


def _one_optim(optim: OptimConfig | Sequence[OptimConfig], members: int) -> OptimConfig:
    configs = [optim] if isinstance(optim, OptimConfig) else list(optim)
    if len(configs) not in (1, members) or any(c != configs[0] for c in configs):
        raise ConfigError("stacked members must share one optimiser setting (learning rate included); give one "
                          "OptimConfig, or train members that differ separately")
    o = configs[0]
    if o.clip_grad is not None or o.ema_decay is not None:
        raise ConfigError("stacked training does not carry gradient clipping or EMA; set clip_grad and ema_decay "
                          "to None")
    return o


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (fused) or SGD with (Nesterov) momentum, weight decay on :func:`decayed_parameters` only, as
    :func:`pkmixer.train.engine.build_optimizer`: elementwise, so on a stacked model it equals one per member."""
    decay_names = decayed_parameters(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay_names], "weight_decay": optim.weight_decay},
              {"params": [p for n, p in named if n not in decay_names], "weight_decay": 0.0}]
    if optim.name == "adamw":
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for _, p in named)
        return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, fused=fused or None)
    return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum,
                           nesterov=optim.nesterov and optim.momentum > 0)


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


def train_one(model: nn.Module, seed: int, data: TensorData, optim: OptimConfig, epochs: int, batch_size: int,
              eval_batch_size: int = 256) -> MemberResult:
    """Train one model: each epoch a ``torch.randperm`` of the training set from a generator seeded by ``seed``,
    full batches of mean cross-entropy, one optimizer step each; stop at the first non-finite loss (no step)."""
    o = _one_optim(optim, 1)
    opt = build_optimizer(model, o)
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
            opt.step()
            total, taken, step = total + float(loss.detach()), taken + 1, step + 1
        result.train_loss.append(total / taken if taken else math.nan)
        result.test_error += _test_errors(model, data, eval_batch_size, None)
        if result.stopped_step is not None:
            break
    return result


def stacked_step(model: StackedModel, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of every member on its own batch, x (K, B, c, H, W) and y (K, B); ``active`` (K,) bool says
    which members still train. Returns the members' losses (K,) and ``active`` less the members whose loss
    is not finite: their loss leaves the sum and the step leaves their parameters as they were."""
    K = x.shape[0]
    losses = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(K, -1).mean(1)
    active = active & torch.isfinite(losses)
    optimizer.zero_grad(set_to_none=True)
    torch.where(active, losses, 0.0).sum().backward()
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
    """Train the K members of ``model`` together, member k as :func:`train_one` with ``seeds[k]`` would: the loss
    is the sum over members of each one's mean cross-entropy, so each member's gradient is its own. A member whose
    loss goes non-finite stops alone: its loss leaves the sum and its parameters keep their values from before
    that step. The step never synchronises with the host; the metrics are read once per epoch."""
    K = model.members
    if len(seeds) != K:
        raise ConfigError(f"{len(seeds)} seeds for {K} stacked members")
    opt = build_optimizer(model, _one_optim(optim, K))
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
            losses, now = stacked_step(model, opt, data.x_train[idx], data.y_train[idx], active)
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
