"""Layers of K models with a leading member axis, and how K copies of a module stack
(:func:`pkmixer.train.stack.stack_models` builds models from them).

Each stacked layer holds the K members' tensors of one layer stacked on a new first axis, under the layer's own
names, and maps activations (K, ...) -> (K, ...), member k's slice through member k's tensors only: batched
products (``bmm``/``baddbmm``), per-member gathers, one block-diagonal CSR product for CSR weights. Built from K
layers of the same shape by ``from_members``.

How K copies of a module stack is declared by the module, as the rest of the model contract
(:mod:`pkmixer.models.contract`) is: :func:`stack_modules` asks :func:`stacked_form`, which

* uses the class's own ``stacked(members, path)`` classmethod where it has one (a layer with a stacked form of its
  own, e.g. a token-projection skip);
* stacks the children of a container whose class sets ``STACKS_BY_CHILDREN = True`` - its forward is generic in
  the leading axes, so the same code runs with a member axis in front (the Mixer's blocks and sublayers, the
  mixing MLPs);
* for classes pkmixer does not own, or whose stacked form lives here, is registered below
  (``stacked_form.register(Cls)``): ``nn.Linear``, ``nn.LayerNorm``, a per-patch ``nn.Conv2d``, the masked and CSR
  sparse layers, :class:`~pkmixer.layers.pk.PKMixing`, stateless activations, and dropout or stochastic depth at
  rate 0 (at a higher rate their randomness is not per member: refused);
* refuses anything else, naming it.

Members agree at every module: the same class and :func:`member_signature` (its ``extra_repr`` unless registered
otherwise: a sparse layer's kept count differs per member, its density may not). A layer whose tensors' last axis
differs per member names them in :func:`ragged_tensors`.
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from ..errors import ConfigError
from .pk import PKMixing
from .sparse import CSR_DTYPES, CsrLinearFunction, CsrPattern, MaskedLinear, SparseLinear


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors])


class StackedLinear(nn.Module):
    """K Dense maps: weight (K, out, in), bias (K, out) or None."""

    decayed_parameters = ("weight",)  # as nn.Linear (pkmixer.layers.decay)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)

    @classmethod
    def from_members(cls, layers: list[nn.Linear]) -> StackedLinear:
        return cls(stacked([m.weight for m in layers]),
                   None if layers[0].bias is None else stacked([m.bias for m in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, ..., in) -> (K, ..., out)
        K, lead = x.shape[0], x.shape[1:-1]
        rows = x.reshape(K, -1, x.shape[-1])
        w = self.weight.transpose(1, 2)
        y = torch.bmm(rows, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), rows, w)
        return y.view(K, *lead, -1)

    def forward_columns(self, cols: torch.Tensor) -> torch.Tensor:  # (K, in, N) -> (K, out, N)
        """W X + b for each member's columns X: one batched product."""
        if self.bias is None:
            return torch.bmm(self.weight, cols)
        return torch.baddbmm(self.bias.unsqueeze(2), self.weight, cols)

    def extra_repr(self) -> str:
        K, out, n_in = self.weight.shape
        return f"members={K}, in_features={n_in}, out_features={out}, bias={self.bias is not None}"


class StackedMaskedLinear(StackedLinear):
    """K :class:`~pkmixer.layers.sparse.MaskedLinear`: (M_k ⊙ W_k) x + b_k, masks a (K, out, in) bool buffer."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor) -> None:
        super().__init__(weight, bias)
        self.register_buffer("mask", mask)

    @classmethod
    def from_members(cls, layers) -> StackedMaskedLinear:
        return cls(stacked([m.weight for m in layers]),
                   None if layers[0].bias is None else stacked([m.bias for m in layers]),
                   stacked([m.mask for m in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K, lead = x.shape[0], x.shape[1:-1]
        rows = x.reshape(K, -1, x.shape[-1])
        w = (self.weight * self.mask).transpose(1, 2)
        y = torch.bmm(rows, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), rows, w)
        return y.view(K, *lead, -1)


class StackedSparseLinear(nn.Module):
    """K :class:`~pkmixer.layers.sparse.SparseLinear` (CSR SW-MLP weights, Sec. 3.4, App. A.2.5) as one
    block-diagonal CSR weight of size (K·out)×(K·in), applied to the members' activations side by side, (N, K·in):
    block k is member k's own mask and kept weights, so member k's outputs are its own product, exactly, and the
    weight gradient is sampled at the kept coordinates only (:class:`~pkmixer.layers.sparse.CsrLinearFunction`).

    Members keep different numbers of weights (each mask its own draw), so ``values`` is (K, 1, n) (each
    member's (1, nnz) row) and ``indices`` (K, 2, n) for the largest count n: member k's first ``sizes[k]``
    entries are its own, the rest zero padding that no product reads. Its gradient is zero, so optimiser steps (decay included), clipping and a
    Polyak average keep it zero; :meth:`~pkmixer.train.stack.StackedModel.member_state_dict` and the
    :class:`~pkmixer.train.stack.MemberOptimizer` cut it off (:attr:`padded`)."""

    decayed_parameters = ("values",)  # as SparseLinear

    def __init__(self, values: torch.Tensor, indices: torch.Tensor, sizes: tuple[int, ...], bias: torch.Tensor | None,
                 in_features: int, out_features: int, density: float) -> None:
        super().__init__()
        self.in_features, self.out_features, self.density, self.sizes = in_features, out_features, density, sizes
        self.register_buffer("indices", indices)
        self.values = nn.Parameter(values)
        self.bias = None if bias is None else nn.Parameter(bias)

    @classmethod
    def from_members(cls, layers: list[SparseLinear]) -> StackedSparseLinear:
        first = layers[0]
        if first.values.dtype not in CSR_DTYPES:
            raise ConfigError(f"stacked CSR weights need float32 or float64 values, not {first.values.dtype}")
        sizes = tuple(m.nnz for m in layers)
        values = first.values.new_zeros(len(layers), 1, max(sizes))
        indices = first.indices.new_zeros(len(layers), 2, max(sizes))
        for k, m in enumerate(layers):
            values[k, :, :sizes[k]] = m.values.detach()
            indices[k, :, :sizes[k]] = m.indices
        return cls(values, indices, sizes, None if first.bias is None else stacked([m.bias for m in layers]),
                   first.in_features, first.out_features, first.density)

    @property
    def padded(self) -> dict[str, tuple[int, ...]]:
        """The tensors whose last axis is padded, by name, with each member's own length."""
        return {"values": self.sizes, "indices": self.sizes}

    def block_pattern(self) -> tuple[CsrPattern, torch.Tensor]:
        """The block-diagonal CSR pattern, and where its values lie in ``values.flatten()``: member k's rows and
        columns offset by k·out and k·in, in row-major order as each member's; cached until ``indices`` is
        replaced, moved or loaded."""
        key = (self.indices.data_ptr(), self.indices.device, self.indices._version)
        cached = self.__dict__.get("_block_cache")
        if cached is None or cached[0] != key:
            K, n = self.values.shape[0], self.values.shape[-1]
            rows, cols, take = [], [], []
            for k, size in enumerate(self.sizes):
                rows.append(self.indices[k, 0, :size] + k * self.out_features)
                cols.append(self.indices[k, 1, :size] + k * self.in_features)
                take.append(torch.arange(k * n, k * n + size, device=self.indices.device))
            pattern = CsrPattern.from_coordinates(torch.cat(rows), torch.cat(cols),
                                                  (K * self.out_features, K * self.in_features))
            cached = self.__dict__["_block_cache"] = (key, (pattern, torch.cat(take)))
        return cached[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, ..., in) -> (K, ..., out)
        K, lead = x.shape[0], x.shape[1:-1]
        side_by_side = x.reshape(K, -1, self.in_features).transpose(0, 1).reshape(-1, K * self.in_features)
        pattern, take = self.block_pattern()
        y = CsrLinearFunction.apply(side_by_side.to(self.values.dtype), self.values.flatten().index_select(0, take),
                                    pattern)  # (N, K·out)
        y = y.view(-1, K, self.out_features).transpose(0, 1)  # (K, N, out)
        if self.bias is not None:
            y = y + self.bias.unsqueeze(1)
        return y.reshape(K, *lead, self.out_features)

    def __getstate__(self) -> dict:
        """Copies leave the derived pattern behind."""
        state = self.__dict__.copy()
        state.pop("_block_cache", None)
        return state

    def extra_repr(self) -> str:
        return (f"members={len(self.sizes)}, in={self.in_features}, out={self.out_features}, p={self.density:g}, "
                f"nnz={self.sizes}")


class StackedLayerNorm(nn.Module):
    """K LayerNorms over the last axis: weight and bias (K, C) (or None)."""

    decayed_parameters = ()  # as nn.LayerNorm

    def __init__(self, shape: tuple[int, ...], eps: float, weight: torch.Tensor | None,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.normalized_shape, self.eps = shape, eps
        self.weight = None if weight is None else nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)

    @classmethod
    def from_members(cls, layers: list[nn.LayerNorm]) -> StackedLayerNorm:
        first = layers[0]
        return cls(tuple(first.normalized_shape), first.eps,
                   None if first.weight is None else stacked([m.weight for m in layers]),
                   None if first.bias is None else stacked([m.bias for m in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, ..., C)
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        view = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
        if self.weight is not None:
            y = y * self.weight.view(view) if self.bias is None else torch.addcmul(
                self.bias.view(view), y, self.weight.view(view))
        elif self.bias is not None:
            y = y + self.bias.view(view)
        return y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class StackedPatchConv(nn.Module):
    """K per-patch FCs (a Conv2d whose kernel equals its stride, no padding): (K, B, c, H, W) -> (K, B, S₀, C),
    patches in raster order, as the members' ``stem(x).flatten(2).transpose(1, 2)``."""

    decayed_parameters = ("weight",)  # as nn.Conv2d

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)  # (K, C, c, P, P)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.patch = weight.shape[-1]

    @classmethod
    def from_members(cls, layers: list[nn.Conv2d]) -> StackedPatchConv:
        return cls(stacked([m.weight for m in layers]),
                   None if layers[0].bias is None else stacked([m.bias for m in layers]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K, B, c, H, W = x.shape
        P = self.patch
        patches = (x.reshape(K, B, c, H // P, P, W // P, P).permute(0, 1, 3, 5, 2, 4, 6)
                   .reshape(K, B * (H // P) * (W // P), c * P * P))
        w = self.weight.flatten(2).transpose(1, 2)  # (K, c·P·P, C)
        y = torch.bmm(patches, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), patches, w)
        return y.view(K, B, -1, w.shape[-1])


class StackedPermute(torch.autograd.Function):
    """y[k] = x[k][:, idx[k]] for (K, B, m) x and per-member permutations idx (K, m); the gradient is gathered
    back with the inverses."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, idx: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.inverse = inverse
        return torch.gather(x, 2, idx.unsqueeze(1).expand(-1, x.shape[1], -1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return torch.gather(grad, 2, ctx.inverse.unsqueeze(1).expand(-1, grad.shape[1], -1)), None, None


class StackedPKMixing(nn.Module):
    """K :class:`~pkmixer.layers.pk.PKMixing` of one shape, each with its own J₁, J₂ (buffers (K, m)); ``mlp``
    is the members' mixing MLP with stacked Dense layers."""

    def __init__(self, layers: list[PKMixing], mlp: nn.Module) -> None:
        super().__init__()
        first = layers[0]
        self.mlp = mlp
        self.axis, self.other, self.perms, self.normal = first.axis, first.other, first.perms, first.normal
        self.in_features, self.out_features = first.in_features, first.out_features
        if not self.normal:
            for name in ("in_index", "out_index"):
                self.register_buffer(name, stacked([getattr(m, name) for m in layers]),
                                     persistent=name not in first._non_persistent_buffers_set)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, B, S, C) -> (K, B, S', C')
        K, B = x.shape[:2]
        if self.normal:
            if self.axis == "channel":
                return self.mlp(x)
            # W X on every member's (S_in, C) maps, as products over the columns of all its images: (K, S, B·C)
            # with the activations laid out contiguously there, transposed back once at the end (a view)
            y = x.transpose(1, 2).reshape(K, x.shape[2], -1)
            for linear, act in self.mlp.linear_steps():
                y = linear.forward_columns(y)
                y = y if act is None else act(y)
            return y.view(K, -1, B, x.shape[3]).transpose(1, 2)
        j1, j2 = self.gather_pairs()
        y = StackedPermute.apply(x.reshape(K, B, -1), *j1)  # J₁
        y = self.mlp(y.view(K, B, self.other, self.in_features))  # I ⊗ W
        y = StackedPermute.apply(y.reshape(K, B, -1), *j2)  # J₂
        if self.axis == "token":
            return y.view(K, B, self.out_features, self.other)
        return y.view(K, B, self.other, self.out_features)

    def gather_pairs(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """(J, J⁻¹) of J₁ and J₂, per member; cached until a buffer is replaced, moved or loaded. Under
        torch.compile derived in the graph instead, as :meth:`PKMixing.gather_pairs` does (the cache key reads
        storage pointers)."""
        bufs = (self.in_index, self.out_index)
        pairs = lambda: tuple((b.long(), torch.argsort(b, dim=1)) for b in bufs)  # argsort of a permutation: inverse
        if torch.compiler.is_compiling():
            return pairs()
        key = tuple((b.data_ptr(), b.device, b._version) for b in bufs)
        cached = self.__dict__.get("_gather_cache")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_gather_cache"] = (key, pairs())
        return cached[1]

    def extra_repr(self) -> str:
        return (f"axis={self.axis}, blocks={self.other}, in={self.in_features}, out={self.out_features}, "
                f"perms={self.perms}")


class StackedTokenSkip(nn.Module):
    """K :class:`~pkmixer.models.mixer.TokenProjectionSkip`: LN(W̃ X) per member."""

    def __init__(self, proj: StackedLinear, norm: StackedLayerNorm) -> None:
        super().__init__()
        self.proj, self.norm = proj, norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, B, S0, C) -> (K, B, S, C)
        K, B, _, C = x.shape
        y = self.proj.forward_columns(x.transpose(1, 2).reshape(K, x.shape[2], B * C))  # (K, S, B·C)
        return self.norm(y.view(K, -1, B, C).transpose(1, 2).contiguous())


# ---- how K copies of a module stack ---------------------------------------------------------------------


@functools.singledispatch
def member_signature(module: nn.Module) -> str:
    """What must agree between members for one module to stack (module docstring)."""
    return module.extra_repr()


@member_signature.register(MaskedLinear)
@member_signature.register(SparseLinear)
def _(module: nn.Module) -> str:
    return f"in={module.in_features}, out={module.out_features}, p={module.density}"  # each mask its own draw


@functools.singledispatch
def ragged_tensors(module: nn.Module) -> tuple[str, ...]:
    """The names of ``module``'s own tensors whose last axis may differ between members."""
    return ()


@ragged_tensors.register(SparseLinear)
def _(module: SparseLinear) -> tuple[str, ...]:
    return ("values", "indices")  # each member keeps its own number of weights


def stack_modules(members: list[nn.Module], path: str = "") -> nn.Module:
    """The stacked form of K members' modules at ``path`` (module docstring); ConfigError where the members
    differ or the module declares none."""
    first = members[0]
    for k, module in enumerate(members[1:], 1):
        if type(module) is not type(first) or member_signature(module) != member_signature(first):
            raise ConfigError(f"member {k} differs from member 0 at {path or 'the top'}: "
                              f"{type(module).__name__}({member_signature(module)}) against "
                              f"{type(first).__name__}({member_signature(first)})")
    return stacked_form(first, members, path)


def stack_children(members: list[nn.Module], path: str) -> nn.Module:
    """A container whose forward is generic in the leading axes, with each child stacked (a child that is None
    stays None)."""
    first = members[0]
    if any(t is not None for t in (*first._parameters.values(), *first._buffers.values())):
        raise ConfigError(f"{path or 'the model'} ({type(first).__name__}) holds tensors of its own; it cannot be "
                          "stacked by its children")
    out = copy.copy(first)
    out._modules = {name: None if child is None else stack_modules([m._modules[name] for m in members],
                                                                   f"{path}.{name}" if path else name)
                    for name, child in first._modules.items()}
    return out


@functools.singledispatch
def stacked_form(first: nn.Module, members: list[nn.Module], path: str) -> nn.Module:
    """The stacked form of ``members`` (all of ``first``'s class, agreeing): see the module docstring."""
    declared = getattr(type(first), "stacked", None)
    if declared is not None:
        return declared(members, path)
    if getattr(type(first), "STACKS_BY_CHILDREN", False):
        return stack_children(members, path)
    raise ConfigError(f"{path or 'the model'} is a {type(first).__name__}, which declares no stacked form (the "
                      "supp. A.1 untied or grouped token mixing, for one): see pkmixer.layers.stacked")


stacked_form.register(nn.Linear, lambda first, members, path: StackedLinear.from_members(members))
stacked_form.register(MaskedLinear, lambda first, members, path: StackedMaskedLinear.from_members(members))
stacked_form.register(SparseLinear, lambda first, members, path: StackedSparseLinear.from_members(members))
stacked_form.register(nn.LayerNorm, lambda first, members, path: StackedLayerNorm.from_members(members))
stacked_form.register(nn.ModuleList, lambda first, members, path: stack_children(members, path))
stacked_form.register(PKMixing, lambda first, members, path: StackedPKMixing(
    members, stack_modules([m.mlp for m in members], f"{path}.mlp")))


@stacked_form.register(nn.Conv2d)
def _(first: nn.Conv2d, members: list[nn.Module], path: str) -> nn.Module:
    if (first.kernel_size != first.stride or first.padding != (0, 0) or first.dilation != (1, 1)
            or first.groups != 1 or first.kernel_size[0] != first.kernel_size[1]):
        raise ConfigError(f"{path} is a convolution other than a square per-patch FC; it cannot be stacked")
    return StackedPatchConv.from_members(members)


@stacked_form.register(nn.GELU)
@stacked_form.register(nn.ReLU)
@stacked_form.register(nn.Identity)
def _(first: nn.Module, members: list[nn.Module], path: str) -> nn.Module:
    return copy.deepcopy(first)  # stateless: one for all members


@stacked_form.register(nn.Dropout)
@stacked_form.register(DropPath)
def _(first: nn.Module, members: list[nn.Module], path: str) -> nn.Module:
    rate = first.p if isinstance(first, nn.Dropout) else first.drop_prob
    if rate > 0:
        raise ConfigError(f"{path} has dropout or stochastic depth, whose randomness stacking does not keep per "
                          "member: use rate 0")
    return copy.deepcopy(first)
