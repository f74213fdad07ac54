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

import torch
from timm.layers import DropPath, lecun_normal_
from torch import nn

from ..errors import ConfigError, check_density, check_positive, check_positive_int, check_rate
from ..layers.sparse import SPARSE_LAYERS, MaskedLinear
from .features import check_where, select_indices
from .info import ModelInfo
from .timm_api import TimmModel
from .mixer import ACTIVATIONS


class SparseBlock(nn.Module):
    """One residual SW-MLP block; ``linears`` are applied in turn, each followed by the activation."""

    def __init__(self, width: int, hidden: int | None, make_linear: Callable[[int, int], nn.Module],
                 act_layer: Callable[[], nn.Module], eps: float, drop_path: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, eps=eps)
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

        self.stem = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.input_layer = make_linear(self.input_dim, self.width) if self.width != self.input_dim else None
        dpr = [drop_path_rate * i / max(1, depth - 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            SparseBlock(self.width, self.hidden, make_linear, ACTIVATIONS[act], norm_eps, dpr[i])
            for i in range(depth))
        # the identity without head_norm, so that forward_features and the effective MLP read it alike
        self.norm = nn.LayerNorm(self.width, eps=norm_eps) if head_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.width, num_classes)
        lecun_normal_(self.stem.weight)
        nn.init.zeros_(self.stem.bias)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_chans, self.img_size, self.img_size):
            raise ValueError(f"expected input of shape (B, {self.in_chans}, {self.img_size}, {self.img_size}), "
                             f"got {tuple(x.shape)}")
        x = self.stem(x).flatten(2).transpose(1, 2).flatten(1)  # (B, S0, C) -> (B, S0*C), row-major
        return x if self.input_layer is None else self.input_layer(x)  # (B, m)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_stem(x)
        for blk in self.blocks:
            x = blk(x)  # (B, m)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def feature_names(self, where: str = "block") -> list[str]:
        check_where(where)
        return [f"blocks.{i}" for i in range(self.depth)]

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, *,
                              where: str = "block", norm: bool = False, intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs (``where="block"``) or branch outputs before the skip (``"mixing"``), each (B, m)."""
        take = set(select_indices(len(self.feature_names(where)), indices))
        out = []
        x = self.forward_stem(x)
        for i, blk in enumerate(self.blocks):
            x, branch = blk.forward_branch(x)
            if i in take:
                out.append(branch if where == "mixing" else (self.norm(x) if norm else x))
            if intermediates_only and i >= max(take):
                return out
        return out if intermediates_only else (self.norm(x), out)

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

