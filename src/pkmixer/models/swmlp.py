"""Static sparse-weight MLP, SW-MLP (Hayase & Karakida Sec. 3.4, App. A.2.5; Golubeva et al. 2021).

Per-patch FC -> vectorise the (S₀, C) features (d₀ = S₀·C) -> [a sparse input layer d₀ -> m when the width m
differs from d₀] -> ``depth`` residual blocks of width m -> classifier, as App. A.2.5 has it (``head_norm=True``
puts a LayerNorm before the classifier, as this class did by default before; checkpoints without the option
load with it, see ``CHECKPOINT_DEFAULTS``). A block is

* ``block="fc"`` (S.16):  x -> x + φ((M ⊙ W) LN(x)),
* ``block="mlp"`` (S.17): x -> x + φ((M₂ ⊙ W₂) φ((M₁ ⊙ W₁) LN(x))) with hidden width γm,

where every mask has i.i.d. Bernoulli(p) entries drawn once from ``structure_seed`` and frozen. The weights
are stored sparse (``weight_format="sparse"``, only the p·m² kept entries) or dense with a mask buffer
(``"masked"``, the reference); both give the same masks and, from the same RNG state, the same model.
Width for a budget Ω of connections per layer: m = √(Ω/(γp)) (S.43), see :mod:`pkmixer.theory`.

The class follows the model contract (:mod:`pkmixer.models.contract`); its effective MLP is itself, with the
masked weights M ⊙ W as explicit sparse matrices.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from timm.layers import DropPath, lecun_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError, check_density, check_positive, check_positive_int, check_rate
from ..layers.norm import layer_norm
from ..layers.patch import PatchConv
from ..layers.sparse import SPARSE_LAYERS, MaskedLinear
from .features import check_where, point_format, select_indices
from .info import ModelInfo
from .inputs import check_image
from .mixer import ACTIVATIONS
from .timm_api import TimmModel, record_arguments

torch.fx.wrap("check_image")  # one node of an FX graph


class SparseBlock(nn.Module):
    """One residual SW-MLP block; ``linears`` are applied in turn, each followed by the activation."""

    STACKS_BY_CHILDREN = True  # its forward is generic in the leading axes (pkmixer.layers.stacked)

    def __init__(self, width: int, hidden: int | None, make_linear: Callable[[int, int], nn.Module],
                 act_layer: Callable[[], nn.Module], eps: float, drop_path: float) -> None:
        super().__init__()
        self.norm = layer_norm(width, eps)
        dims = [width, width] if hidden is None else [width, hidden, width]
        self.linears = nn.ModuleList(make_linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = act_layer()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward_branch(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(x)
        for lin in self.linears:
            y = self.act(lin(y))  # (B, m) -> (B, γm) -> (B, m)
        return x + self.drop_path(y), y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_branch(x)[0]


class SWMLP(TimmModel, nn.Module):
    """Sparse-weight MLP with a per-patch FC stem; see the module docstring."""

    @property
    def num_features(self) -> int:
        """Width of the features the head reads (timm's convention): m, no pooling."""
        return self.width

    # options whose default changed, with the value a checkpoint that does not record them was written with;
    # pkmixer.checkpoint records them in every checkpoint; pkmixer.models.restore fills them in for an older one
    CHECKPOINT_DEFAULTS = {"head_norm": True}

    def __init__(
        self,
        *,
        img_size: int = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        embed_dim: int = 64,  # channels C of the per-patch FC
        width: int | None = None,  # m; None: m = S0 * embed_dim and no input layer
        density: float = 1.0,  # p, the fraction of kept weights
        depth: int = 8,
        block: str = "fc",  # "fc" (S.16) or "mlp" (S.17)
        mlp_ratio: float = 1.0,  # γ, hidden width γm of block="mlp"
        weight_format: str = "sparse",  # "sparse" (kept weights only) or "masked" (dense reference)
        structure_seed: int = 0,  # seed of the frozen masks
        norm_eps: float = 1e-5,
        act: str = "gelu",
        head_norm: bool = False,  # a LayerNorm before the classifier; App. A.2.5 has none
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in [("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans),
                            ("num_classes", num_classes), ("embed_dim", embed_dim), ("depth", depth)]:
            check_positive_int(name, value)
        if img_size % patch_size:
            raise ConfigError(f"patch_size {patch_size} does not divide img_size {img_size}")
        check_density("density p", density)
        if block not in ("fc", "mlp"):
            raise ConfigError(f"block must be one of fc, mlp, got {block!r}")
        if weight_format not in SPARSE_LAYERS:
            raise ConfigError(f"weight_format must be one of {', '.join(SPARSE_LAYERS)}, got {weight_format!r}")
        if act not in ACTIVATIONS:
            raise ConfigError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
        if not isinstance(head_norm, bool):
            raise ConfigError(f"head_norm must be true or false, got {head_norm!r}")
        check_rate("drop_rate", drop_rate)
        check_rate("drop_path_rate", drop_path_rate)
        check_positive("norm_eps", norm_eps)
        gamma = check_positive("mlp_ratio", mlp_ratio)

        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.num_classes = num_classes
        self.grid_tokens = (img_size // patch_size) ** 2
        self.embed_dim = embed_dim
        self.input_dim = self.grid_tokens * embed_dim  # d0
        self.width = self.input_dim if width is None else check_positive_int("width", width)
        self.density, self.depth, self.block_kind, self.gamma = density, depth, block, gamma
        self.hidden = max(1, int(gamma * self.width)) if block == "mlp" else None
        self.weight_format, self.structure_seed = weight_format, structure_seed
        self.activation, self.head_norm = act, head_norm

        generator = torch.Generator().manual_seed(structure_seed)
        linear_cls = SPARSE_LAYERS[weight_format]

        def make_linear(n_in: int, n_out: int) -> nn.Module:
            return linear_cls(n_in, n_out, density, generator)

        self.stem = PatchConv(in_chans, embed_dim, patch_size)
        # a module slot even when empty, so that what is built from the model's modules (stacking) sees it
        self.register_module("input_layer", make_linear(self.input_dim, self.width)
                             if self.width != self.input_dim else None)
        dpr = [drop_path_rate * i / max(1, depth - 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            SparseBlock(self.width, self.hidden, make_linear, ACTIVATIONS[act], norm_eps, dpr[i])
            for i in range(depth))
        # the identity without head_norm, so that forward_features and the effective MLP read it alike
        self.norm = layer_norm(self.width, norm_eps) if head_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.width, num_classes)
        lecun_normal_(self.stem.weight)
        nn.init.zeros_(self.stem.bias)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.grad_checkpointing = False  # timm's set_grad_checkpointing: recompute each block in the backward

    @staticmethod
    def build_bytes(kw: dict[str, Any], meta: bool) -> int:
        """Bytes the sparse layers of an SW-MLP with constructor arguments ``kw`` hold, before it is built (the
        build budget, :mod:`pkmixer.models.budget`): per kept weight two int64 coordinates (kept on the CPU even
        on the meta device), two int32 entries of the transposed CSR pattern and a float32 value; the "masked"
        format also holds the dense mask and weight."""
        grid = (int(kw.get("img_size", 32)) // int(kw.get("patch_size", 4))) ** 2
        d0 = grid * int(kw.get("embed_dim", 64))
        m = d0 if kw.get("width") is None else int(kw["width"])
        p, depth = float(kw.get("density", 1.0)), int(kw.get("depth", 8))
        dims = [m, m] if kw.get("block", "fc") == "fc" else [m, max(1, int(float(kw.get("mlp_ratio", 1.0)) * m)), m]
        dense = depth * sum(a * b for a, b in zip(dims[:-1], dims[1:])) + (d0 * m if m != d0 else 0)
        if kw.get("weight_format", "sparse") == "masked":
            return int(dense * (1 if meta else 5) + 16 * p * dense)
        return int(p * dense * (24 if meta else 28))

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        check_image(x, self.in_chans, self.img_size)
        x = self.stem(x).flatten(2).transpose(1, 2).flatten(1)  # (B, S0, C) -> (B, S0*C), row-major
        return x if self.input_layer is None else self.input_layer(x)  # (B, m)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_stem(x)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)  # (B, m)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @staticmethod
    def stacked_forward(net: nn.Module, x: torch.Tensor) -> torch.Tensor:  # (K, B, c, H, W) -> (K, B, classes)
        """The forward of K members stacked (:func:`pkmixer.train.stack.stack_models`): ``net`` holds this
        model's children in their stacked forms (pkmixer.layers.stacked)."""
        x = net.stem(x).flatten(2)  # (K, B, S0·C), row-major as the members' vectorisation
        if net.input_layer is not None:
            x = net.input_layer(x)
        for blk in net.blocks:
            x = blk(x)
        return net.head(net.norm(x))

    # ---- intermediate features (timm's forward_intermediates, features_only) ---------------------------------
    OUTPUT_FORMATS = ("NC", "NLC", "NCHW")  # (B, m); or as timm's layouts, (B, 1, m) and (B, m, 1, 1)

    def feature_names(self, where: str = "block") -> list[str]:
        check_where(where)
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NC",
                              intermediates_only: bool = False, *, where: str = "block"
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs (``where="block"``) or branch outputs before the skip (``"mixing"``), each (B, m), or in
        timm's layouts ``"NLC"`` (B, 1, m) and ``"NCHW"`` (B, m, 1, 1): the width has no spatial layout.
        The forward stops after the last requested point with ``intermediates_only`` or ``stop_early``."""
        take = set(select_indices(len(self.feature_names(where)), indices))
        fmt = point_format(output_fmt, self.OUTPUT_FORMATS)
        out = []
        x = self.forward_stem(x)
        for i, blk in enumerate(self.blocks):
            x, branch = checkpoint(blk.forward_branch, x, use_reentrant=False) if self.grad_checkpointing \
                else blk.forward_branch(x)
            if i in take:
                out.append(flat_format(branch if where == "mixing" else (self.norm(x) if norm else x), fmt))
            if (intermediates_only or stop_early) and i >= max(take):
                break
        return out if intermediates_only else (self.norm(x), out)

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """timm's description of the feature points: m channels each, reduced from the whole image."""
        return [dict(module=f"blocks.{i}", num_chs=self.width, reduction=self.img_size)
                for i in range(len(self.blocks))]

    def default_output_fmt(self) -> str:
        """The layout ``features_only`` returns: timm's NCHW, (B, m, 1, 1)."""
        return "NCHW"

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last feature point ``indices`` needs (timm's convention), optionally the
        final norm and the head; returns the kept indices. ``model.spec`` records the new depth."""
        take = select_indices(len(self.blocks), indices)
        self.depth = max(take) + 1
        self.blocks = self.blocks[:self.depth]
        record_arguments(self, depth=self.depth)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups (layer-wise lr decay): the stem (with the input layer), each block, the norm."""
        return dict(stem=r"^stem|^input_layer", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    def info(self) -> ModelInfo:
        layers = [lin for blk in self.blocks for lin in blk.linears]
        nnz = sum(lin.nnz for lin in layers)
        # a masked dense weight counts only its kept entries: both formats report the same parameters
        masked_out = sum(lin.weight.numel() - lin.nnz for lin in self.sparse_layers() if isinstance(lin, MaskedLinear))
        return ModelInfo(
            family="SW-MLP", params=sum(p.numel() for p in self.parameters()) - masked_out,
            num_tokens=None, embed_dim=self.embed_dim,
            gamma_token=None, gamma_channel=self.gamma if self.block_kind == "mlp" else None,
            depth=self.depth, mixing_layers=len(layers), connections=nnz / len(layers), effective_width=self.width,
            max_width=self.hidden or self.width,
            density=nnz / sum(lin.in_features * lin.out_features for lin in layers))

    # ---- the model contract (pkmixer.models.contract) ------------------------------------------------------
    def rows_per_image(self) -> dict[nn.Module, int]:
        """The per-patch stem runs once per patch, S₀ rows."""
        return {self.stem: self.grid_tokens}

    def effective_mlp(self):  # -> pkmixer.theory.effective.EffectiveMLP
        """The model with every masked weight M ⊙ W an explicit sparse float64 matrix (S.16-S.17); the optional
        input layer d₀ -> m is part of the stem, as it is not a hidden layer of width m."""
        from ..theory.effective import EffectiveLinear, EffectiveMLP, EffectiveResidual

        def sparse_layer(name: str, lin: nn.Module, act: nn.Module | None) -> EffectiveLinear:
            return EffectiveLinear(name, lin.dense_weight().detach().double().to_sparse(), lin.bias.detach().double(),
                                   act)

        blocks = [EffectiveResidual(blk.norm, [sparse_layer(f"blocks.{i}.fc{k + 1}", lin, blk.act)
                                               for k, lin in enumerate(blk.linears)])
                  for i, blk in enumerate(self.blocks)]
        first = None if self.input_layer is None else sparse_layer("input_layer", self.input_layer, None)

        def stem(images: torch.Tensor) -> torch.Tensor:
            x = self.stem(images).flatten(2).transpose(1, 2).flatten(1)  # row-major (S0, C): the MLP's own order
            return x if first is None else first(x)

        return EffectiveMLP(stem, blocks, lambda x: self.forward_head(self.norm(x)))

    def patch_unit_weights(self) -> torch.Tensor:
        """The per-patch projection (C, in_chans, P, P)."""
        return self.stem.weight

    def display_name(self) -> str:
        return f"SWMLP[{self.weight_format}]"

    def sparse_layers(self) -> list[nn.Module]:
        first = [] if self.input_layer is None else [self.input_layer]
        return first + [lin for blk in self.blocks for lin in blk.linears]



def flat_format(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """A (B, n) feature as ``fmt``: itself ("NC"), (B, 1, n) ("NLC") or (B, n, 1, 1) ("NCHW")."""
    if fmt == "NLC":
        return t.unsqueeze(1)
    if fmt == "NCHW":
        return t.unsqueeze(-1).unsqueeze(-1)
    return t
