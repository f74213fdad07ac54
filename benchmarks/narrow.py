"""Section (n): narrow Mixers against square ones at fixed Ω, and a small Mixer against its own matrix products.

Per multiply-add: the fig5/fig6 medium grid (Ω = 2^15, the mirrored pairs (C, S) = (8, 87) ... (87, 8), 4 blocks,
Fashion-MNIST's 28 px images in patches of 4) and, narrower than it, (4, 126) at the same Ω, S-Mixer and RP
S-Mixer, one training step (fused AdamW, batch 128) each. A family's six models are timed round-robin in one loop;
a point's cost is its step time over its training FLOPs (torch.utils.flop_counter, forward + backward), and its
ratio is the median over the loop's rounds of that cost over the square model's (C = S, same family) in the same
round: pairing within a round cancels the clock and load the two shared, which drift between rounds (the ratio of
the two medians is kept beside it). A ratio of 1 means a narrow model pays per multiply-add what the square one
does. Each model is timed in the same loop beside its peers (:data:`VARIANTS`):
a copy whose stem is torch's ``nn.Conv2d`` (the peer of :class:`pkmixer.layers.patch.PatchConv`); a copy that runs
its sublayers as modules (the peer of the fused sublayers, :mod:`pkmixer.layers.fused`; for a model without them the
same model, a control of the loop); that copy with every LayerNorm torch's ``nn.LayerNorm`` (the peer of
:class:`pkmixer.layers.norm.NarrowLayerNorm`, below 16 channels; from 16 up a control); and a copy whose RP gathers
run torch's operators (the peer of the gather kernel of :func:`pkmixer.layers.pk.permute_columns`; a control for
the S-Mixer). Every variant is built twice, in palindromic order, and timed as the mean of its two copies.

LayerNorm over few channels: torch's kernel against five other formulations (a ``var_mean`` decomposition,
``group_norm`` with one group per token, ``batch_norm`` of the transposed stream, a hand-written forward and
backward over a channel-first (C, B·S) copy of the stream, whose reductions run along contiguous tokens, and
pkmixer's C kernel, :func:`pkmixer.layers.norm.narrow_layer_norm`, where it has code for C, below 16), forward +
backward on each point's (128, S, C) stream, timed round-robin.

Own products: the small CIFAR S-Mixer (S = C = 64, patch 4 on 32 px, 8 blocks, batch 128). Every dense matrix
product of one training step (mm, addmm, bmm, baddbmm, forward and backward) is recorded with its operands' shapes
and strides (``TorchDispatchMode``), and replayed alone on fresh tensors of the same layout; the step's time over
the replay's, timed in the same loop (the median of their ratios round by round), is how far the rest of the step
(norms, activations, sums, copies, the optimizer) takes it from the time its products need. Beside them: the same
step with the sublayers run as modules, and the replay followed by the element-wise floor
(:func:`element_wise_floor`), the least time any fusion of the element-wise work around these products could take.
Where the step's time goes (:class:`StepParts`): its products as they run inside it and the fused kernel's calls,
timed in the same loop, and the rest of the step.
"""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pkmixer.experiments.presets.fig5 import MEDIUM
from pkmixer.layers import fused
from pkmixer.layers.norm import KERNEL_WIDTHS, NarrowLayerNorm, narrow_layer_norm
from pkmixer.layers.pk import PKMixing
from pkmixer.models.registry import create_model
from pkmixer.theory.width import symmetric_pairs

from .common import (Settings, Timing, image_batch, interleaved, interleaved_rounds, paired_ratio, ratio, timing,
                     train_flops, train_step)

FAMILIES = {"S-Mixer": "smixer_t4_28", "RP S-Mixer": "rp_smixer_t4_28"}
SMALL_CIFAR = "smixer_c64p4_32"
PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default}


def _pairs(settings: Settings) -> tuple[int, list[tuple[int, int]]]:
    """Ω and the grid's (C, S) pairs, with C = 4 first (narrower than the grid, as figs3's narrowest C)."""
    if settings.mode == "smoke":
        return 2**9, [(4, 16), (8, 8), (16, 4)]
    (omega, pairs), = MEDIUM.mixer_pairs.items()
    return omega, [*symmetric_pairs(omega, channels=[4]), *pairs]


# the variants of each grid model timed: ours; with its stem torch's module; with its sublayers run as modules
# (the peer of the fused sublayers); that with every LayerNorm torch's module (the peer of NarrowLayerNorm); and with
# its RP gathers torch's operators (the peer of the gather kernel)
VARIANTS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "ours": copy.deepcopy, "conv stem": lambda m: with_conv_stem(m),
    "plain sublayers": lambda m: with_plain_sublayers(m),
    "torch norm": lambda m: with_torch_layer_norm(with_plain_sublayers(m)),
    "torch gather": lambda m: with_torch_gather(m)}


def section_n(settings: Settings) -> dict:
    """Step time per FLOP across the fig5/6 grid, relative to the square model; the small CIFAR S-Mixer's step
    against its own matrix products."""
    omega, pairs = _pairs(settings)
    depth, batch = (2, 16) if settings.mode == "smoke" else (MEDIUM.depth, 128)
    rows = []
    for family, name in FAMILIES.items():
        models, flops = {}, {}
        for C, S in pairs:
            torch.manual_seed(0)
            models[(C, S)] = create_model(name, depth=depth, embed_dim=C, num_tokens=S).to(settings.torch_device)
            flops[(C, S)] = train_flops(models[(C, S)], image_batch(models[(C, S)], batch, settings)[0].shape)
        keys = [(pair, variant) for pair in pairs for variant in VARIANTS]
        cases = {}
        for copy_, order in enumerate((keys, keys[::-1])):  # built in palindromic order (module docstring)
            for pair, variant in order:
                model = VARIANTS[variant](models[pair])
                cases[(pair, variant, copy_)] = train_step(model, image_batch(model, batch, settings), settings)
        rounds = interleaved_rounds(cases, settings)
        t = {key: merged(timing(rounds[(*key, 0)]), timing(rounds[(*key, 1)])) for key in keys}
        square = min(pairs, key=lambda p: abs(p[0] - p[1]))
        per_flop = {p: t[(p, "ours")].median_s / flops[p] for p in pairs}
        # a model's time in each round (the mean of its two copies'), per FLOP
        per_flop_rounds = {p: [(a + b) / 2 / flops[p] for a, b in zip(rounds[(p, "ours", 0)], rounds[(p, "ours", 1)])]
                           for p in pairs}
        for (C, S) in pairs:
            ours, conv, plain, norm, gather = (t[((C, S), v)] for v in VARIANTS)
            rows.append({"family": family, "model": name, "omega": omega, "C": C, "S": S, "batch": batch,
                         "fused": models[(C, S)].fuse_sublayers,
                         "train_flops": flops[(C, S)], "time": ours.as_dict(), "conv_stem_time": conv.as_dict(),
                         "stem_speedup": ratio(conv.median_s, ours.median_s),
                         "plain_sublayers_time": plain.as_dict(), "fused_speedup": ratio(plain.median_s, ours.median_s),
                         "torch_norm_time": norm.as_dict(), "norm_speedup": ratio(norm.median_s, plain.median_s),
                         "torch_gather_time": gather.as_dict(), "gather_speedup": ratio(gather.median_s, ours.median_s),
                         "ns_per_flop": 1e9 * per_flop[(C, S)],
                         **_per_flop_vs_square(per_flop_rounds[(C, S)], per_flop_rounds[square],
                                               ratio(per_flop[(C, S)], per_flop[square]))})
    return {"rows": rows, "layer_norm": layer_norm_rows(settings, pairs, batch),
            "own_products": own_products(settings)}


def _per_flop_vs_square(point: list[float], square: list[float], of_medians: float) -> dict:
    """A point's cost per FLOP over the square model's: the median over rounds of the two's ratio in each round
    (``per_flop_vs_square``, with its quartiles), and the ratio of their medians."""
    paired = paired_ratio(point, square)
    return {"per_flop_vs_square": paired["median"], "per_flop_vs_square_quartiles": [paired["q1"], paired["q3"]],
            "per_flop_vs_square_of_medians": of_medians}


def merged(a: Timing, b: Timing) -> Timing:
    """Two copies' timings of one model as one: the mean of their medians, the wider quartiles."""
    return Timing((a.median_s + b.median_s) / 2, min(a.q1_s, b.q1_s), max(a.q3_s, b.q3_s), a.repeats + b.repeats)


def _decomposed_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    return torch.addcmul(b, (x - mean) * torch.rsqrt(var + 1e-6), w)


def _group_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(b, F.group_norm(x.reshape(-1, 1, x.shape[-1]), 1, eps=1e-6).view_as(x), w)


def _batch_norm_of_transpose(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = F.batch_norm(x.reshape(-1, x.shape[-1]).t(), None, None, training=True, eps=1e-6)  # stats per column
    return torch.addcmul(b, y.t().view_as(x), w)


class _ChannelFirstLayerNorm(torch.autograd.Function):
    """LayerNorm over dim 0 of a channel-first (C, N) stream, the layout a narrow-C Mixer could keep its residual
    stream in: every reduction and broadcast runs along N, contiguous, instead of along rows of C. Forward and
    backward by hand, in the fewest eager passes (the backward is LayerNorm's: rstd·(g·w − mean(g·w) −
    x̂·mean(g·w·x̂)))."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        xc = x - x.mean(0)
        rstd = (xc * xc).mean(0).add_(1e-6).rsqrt_()
        xhat = xc.mul_(rstd)
        ctx.save_for_backward(xhat, rstd, w)
        return torch.addcmul(b[:, None], xhat, w[:, None])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xhat, rstd, w = ctx.saved_tensors
        gw, gb = (grad * xhat).sum(1), grad.sum(1)
        gx = grad * w[:, None]
        mean_g, mean_gx = gx.mean(0), (gx * xhat).mean(0)
        return gx.sub_(mean_g).sub_(xhat * mean_gx).mul_(rstd), gw, gb


def channel_first(x: torch.Tensor) -> torch.Tensor:
    """(B, S, C) -> (C, B·S), contiguous: the stream as a channel-first Mixer would hold it."""
    return x.detach().reshape(-1, x.shape[-1]).t().contiguous()


KERNEL = "pkmixer C kernel"
LAYER_NORMS = {"native": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-6),
               "var_mean": _decomposed_layer_norm, "group_norm": _group_norm,
               "batch_norm of the transpose": _batch_norm_of_transpose,
               "channel-first (C, B·S)": _ChannelFirstLayerNorm.apply,
               KERNEL: lambda x, w, b: narrow_layer_norm(x, w, b, 1e-6)}
# the layout each formulation reads its stream and gradient in, made before timing (identity: the (B, S, C) stream)
LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"channel-first (C, B·S)": channel_first}


def layer_norm_rows(settings: Settings, pairs: list[tuple[int, int]], batch: int) -> list[dict]:
    """LayerNorm over C channels of a (batch, S, C) residual stream, forward + backward: torch's kernel against
    the formulations a narrow-C fast path could use (each equal to it within float rounding)."""
    rows = []
    for C, S in pairs:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, S, C, generator=g).to(settings.torch_device).requires_grad_()
        w = torch.randn(C, generator=g).to(settings.torch_device).requires_grad_()
        b = torch.randn(C, generator=g).to(settings.torch_device).requires_grad_()
        grad = torch.randn(batch, S, C, generator=g).to(settings.torch_device)

        def case(name: str) -> Callable[[], None]:
            layout = LAYOUTS.get(name)
            xs, gs = (x, grad) if layout is None else (layout(x).requires_grad_(), layout(grad))
            return lambda: LAYER_NORMS[name](xs, w, b).backward(gs)
        names = [name for name in LAYER_NORMS if name != KERNEL or C in KERNEL_WIDTHS]  # the kernel: C < 16
        t = interleaved({name: case(name) for name in names}, settings,
                        repeats=max(settings.repeats, 10))
        rows.append({"C": C, "S": S, "batch": batch, "times": {k: v.as_dict() for k, v in t.items()},
                     "vs_native": {k: ratio(v.median_s, t["native"].median_s) for k, v in t.items()}})
    return rows


def with_torch_layer_norm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose LayerNorms are all torch's ``nn.LayerNorm`` (the peer of
    :class:`pkmixer.layers.norm.NarrowLayerNorm`), with the same weights."""
    plain = copy.deepcopy(model)
    for module in list(plain.modules()):
        for name, child in module.named_children():
            if isinstance(child, NarrowLayerNorm):
                torch_norm = nn.LayerNorm(child.normalized_shape, eps=child.eps).to(child.weight.device)
                torch_norm.load_state_dict(child.state_dict())
                setattr(module, name, torch_norm)
    return plain


def with_plain_sublayers(model: nn.Module) -> nn.Module:
    """A copy of ``model`` that runs its sublayers as modules (``fuse_sublayers = False``: the peer of
    :func:`pkmixer.layers.fused.residual_gelu_norm`), with the same weights."""
    plain = copy.deepcopy(model)
    plain.fuse_sublayers = False
    return plain


def with_torch_gather(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose RP gathers run torch's operators (``native_gather = False`` on every PK layer: the
    peer of the C kernel of :func:`pkmixer.layers.pk.permute_columns`), with the same weights."""
    plain = copy.deepcopy(model)
    for module in plain.modules():
        if isinstance(module, PKMixing):
            module.native_gather = False
    return plain


def with_conv_stem(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose per-patch stem is torch's ``nn.Conv2d`` (the peer of
    :class:`pkmixer.layers.patch.PatchConv`), with the same weights."""
    plain = copy.deepcopy(model)
    stem = model.stem
    plain.stem = nn.Conv2d(stem.in_channels, stem.out_channels, stem.kernel_size, stride=stem.stride,
                           bias=stem.bias is not None).to(stem.weight.device)
    plain.stem.load_state_dict(stem.state_dict())
    return plain


class StepParts:
    """Where a training step's time goes: called, it runs one step with the total time of its dense products as
    they run inside it (each timed around itself under a ``TorchDispatchMode``) and of the fused kernel's calls
    (forward and backward, each timed around itself) noted; :meth:`summary` gives their medians and the rest of a
    plain step's median. Timed in the same loop as the plain step, so that both see the same load; the mode's own
    cost (on every operator) falls in neither part."""

    def __init__(self, step: Callable[[], None], settings: Settings) -> None:
        self.step, self.settings = step, settings
        self.products: list[float] = []
        self.kernel: list[float] = []

    def __call__(self) -> None:
        with _TimeProducts(self.settings) as timer, _time_kernel() as kernel_s:
            self.step()
        self.products.append(timer.seconds)
        self.kernel.append(kernel_s[0])

    def summary(self, step_median_s: float, warmup: int) -> dict:
        products, kernel = (statistics.median(v[warmup:]) for v in (self.products, self.kernel))
        return {"products_s": products, "kernel_s": kernel, "rest_s": step_median_s - products - kernel,
                "rounds": len(self.products) - warmup}


class _TimeProducts(TorchDispatchMode):
    """Sums the time of every dense matrix product run under it (``seconds``)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in PRODUCTS:
            return func(*args, **(kwargs or {}))
        self.settings.sync()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.settings.sync()
        self.seconds += time.perf_counter() - start
        return out


@contextlib.contextmanager
def _time_kernel() -> Iterator[list[float]]:
    """The fused kernel's forward and backward calls (:mod:`pkmixer.layers.fused`) timed while inside: yields a
    one-element list that holds their total seconds."""
    total = [0.0]
    names = ("_kernel_forward", "_kernel_grads")
    originals = {name: getattr(fused, name) for name in names}

    def timed(call: Callable) -> Callable:
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start
        return run

    for name in names:
        setattr(fused, name, timed(originals[name]))
    try:
        yield total
    finally:
        for name, call in originals.items():
            setattr(fused, name, call)


class _RecordProducts(TorchDispatchMode):
    """Notes every dense matrix product run under it: (op, operands, keyword arguments), each tensor operand as
    a :class:`_Layout`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in PRODUCTS:
            operands = [_Layout(tuple(a.shape), tuple(a.stride())) if isinstance(a, torch.Tensor) else a
                        for a in args]
            self.calls.append((func, operands, dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


class _Layout(tuple):
    """(shape, stride) of a recorded operand."""

    def __new__(cls, shape: tuple[int, ...], stride: tuple[int, ...]) -> _Layout:
        return super().__new__(cls, (shape, stride))

    def tensor(self, device: torch.device) -> torch.Tensor:
        """A random tensor of this shape and stride (a broadcast operand keeps its zero strides)."""
        shape, stride = self
        storage = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
        return torch.randn(storage, device=device).as_strided(shape, stride)


def record_products(step: Callable[[], None]) -> list[tuple]:
    """The dense matrix products one call of ``step`` runs, in order."""
    with _RecordProducts() as recorder:
        step()
    return recorder.calls


def replay(calls: list[tuple], device: torch.device) -> Callable[[], None]:
    """The recorded products on fresh random tensors of the same shapes and strides."""
    prepared = [(func, [a.tensor(device) if isinstance(a, _Layout) else a for a in operands], kwargs)
                for func, operands, kwargs in calls]

    def run() -> None:
        for func, args, kwargs in prepared:
            func(*args, **kwargs)

    return run


def element_wise_floor(model: nn.Module, batch: int, device: torch.device) -> Callable[[], None]:
    """The bytes the fused sublayers of ``model`` must move in one training step, moved by torch's copy and add
    alone: per sublayer, two (batch, S, C) tensors read and two written in the forward (x, z in; y, u out), four
    read and two written in the backward, each sublayer on tensors of its own (as a step's saved activations are),
    forward in order and backward in reverse."""
    sublayers = 2 * len(model.blocks)
    shape = (batch, model.num_tokens, model.embed_dim)
    saved = [[torch.randn(shape, device=device) for _ in range(4)] for _ in range(sublayers)]  # x, z, y, u
    grads = [torch.randn(shape, device=device) for _ in range(4)]

    def run() -> None:
        for x, z, y, u in saved:
            y.copy_(x)
            u.copy_(z)
        for x, z, y, u in reversed(saved):
            torch.add(grads[0], grads[1], out=grads[2])
            torch.add(y, z, out=grads[3])

    return run


def own_products(settings: Settings) -> dict:
    """The small CIFAR S-Mixer's training step against its own matrix products replayed alone; the same step with
    its sublayers run as modules; and its products followed by the element-wise floor (:func:`element_wise_floor`),
    the least time any fusion of its element-wise work around these products could take."""
    depth, batch = (2, 8) if settings.mode == "smoke" else (8, 128)
    torch.manual_seed(0)
    model = create_model(SMALL_CIFAR, depth=depth).to(settings.torch_device)
    data = image_batch(model, batch, settings)
    step = train_step(model, data, settings)
    step()
    calls = record_products(step)
    products = replay(calls, settings.torch_device)
    floor = element_wise_floor(model, batch, settings.torch_device)
    parts = StepParts(step, settings)
    rounds = interleaved_rounds({"step": step,
                                 "plain sublayers": train_step(with_plain_sublayers(model), data, settings),
                                 "products": products, "products + floor": lambda: (products(), floor()),
                                 "step, parts timed": parts}, settings)
    t = {k: timing(v) for k, v in rounds.items()}
    paired = paired_ratio(rounds["step"], rounds["products"])
    return {"model": SMALL_CIFAR, "depth": depth, "batch": batch, "products": len(calls),
            "fused": model.fuse_sublayers, "times": {k: v.as_dict() for k, v in t.items()},
            "step_parts": parts.summary(t["step"].median_s, settings.warmup),
            "step_over_products": paired["median"], "step_over_products_quartiles": [paired["q1"], paired["q3"]],
            "step_over_products_of_medians": ratio(t["step"].median_s, t["products"].median_s),
            "plain_over_products": ratio(t["plain sublayers"].median_s, t["products"].median_s),
            "floor_over_products": ratio(t["products + floor"].median_s, t["products"].median_s)}
