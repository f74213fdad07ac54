"""Shallow MLPs x -> B_c B₂ ReLU(B₁ x) with dense, Kronecker or Monarch weights (Hayase & Karakida Sec. 3.3,
Fig. 2d, Table S.1: no per-patch FC, no skip, no LayerNorm).

The flattened image (n = in_chans·H·W = n1·n2 inputs) passes through B₁ and B₂, each n×n and bias-free as in
the paper's formula, then the classifier B_c. ``weights="kronecker"`` makes B_i = V_i ⊗ W_i, ``"monarch"``
makes B_i = J_cᵀ L_i J_c R_i (Eq. 12) with n1 blocks of n2×n2 and n2 blocks of n1×n1.

The class follows the model contract (:mod:`pkmixer.models.contract`): its effective MLP has the explicit B₁, B₂.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError, check_positive_int
from ..layers.structured import KroneckerLinear, MonarchLinear
from .features import check_where, point_format, select_indices
from .info import ModelInfo
from .inputs import check_image
from .swmlp import flat_format
from .timm_api import TimmModel

torch.fx.wrap("check_image")  # one node of an FX graph

WEIGHT_KINDS = ("dense", "kronecker", "monarch")


class ShallowMLP(TimmModel, nn.Module):
    """x -> B_c B₂ ReLU(B₁ x) (Sec. 3.3); see the module docstring."""

    zero_head = False  # timm's reset_classifier: B_c has PyTorch's Linear initialisation, as here
    first_conv = "fc1"  # no convolution: B₁ reads the flattened image

    @property
    def num_features(self) -> int:
        """Width of the features the head reads (timm's convention): n."""
        return self.width

    def __init__(self, *, img_size: int = 28, in_chans: int = 1, num_classes: int = 10,
                 weights: str = "kronecker", factors: Sequence[int] | None = None) -> None:
        super().__init__()
        for name, value in [("img_size", img_size), ("in_chans", in_chans), ("num_classes", num_classes)]:
            check_positive_int(name, value)
        if weights not in WEIGHT_KINDS:
            raise ConfigError(f"weights must be one of {', '.join(WEIGHT_KINDS)}, got {weights!r}")
        n = in_chans * img_size * img_size
        n1, n2 = (in_chans * img_size, img_size) if factors is None else tuple(factors)
        check_positive_int("factors[0]", n1)
        check_positive_int("factors[1]", n2)
        if n1 * n2 != n:
            raise ConfigError(f"factors {n1}x{n2} do not multiply to the input size {n}")
        self.img_size, self.in_chans, self.num_classes = img_size, in_chans, num_classes
        self.weights, self.n1, self.n2, self.width = weights, n1, n2, n

        def make() -> nn.Module:
            if weights == "dense":
                return nn.Linear(n, n, bias=False)
            return (KroneckerLinear if weights == "kronecker" else MonarchLinear)(n1, n2)

        self.fc1, self.act, self.fc2 = make(), nn.ReLU(), make()
        self.head = nn.Linear(n, num_classes)
        self.grad_checkpointing = False  # timm's set_grad_checkpointing: recompute B₁, B₂ in the backward

    def _first(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc1(x))

    def _hidden(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_image(x, self.in_chans, self.img_size)
        x = x.flatten(1)  # (B, n)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            h1 = checkpoint(self._first, x, use_reentrant=False)
            return h1, checkpoint(self.fc2, h1, use_reentrant=False)
        h1 = self._first(x)  # (B, n)
        return h1, self.fc2(h1)  # (B, n)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self._hidden(x)[1]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    # ---- intermediate features (timm's forward_intermediates, features_only) ---------------------------------
    OUTPUT_FORMATS = ("NC", "NLC", "NCHW")  # (B, n); or as timm's layouts, (B, 1, n) and (B, n, 1, 1)

    def feature_names(self, where: str = "block") -> list[str]:
        check_where(where)
        return ["fc1", "fc2"]

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NC",
                              intermediates_only: bool = False, *, where: str = "block"
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """ReLU(B₁x) and B₂ReLU(B₁x), each (B, n) (or timm's layouts, as the SW-MLP's); there are no skips, so
        both ``where`` agree, and no norm."""
        take = select_indices(2, indices)
        fmt = point_format(output_fmt, self.OUTPUT_FORMATS)
        h1, h2 = self._hidden(x)
        out = [flat_format((h1, h2)[i], fmt) for i in take]
        return out if intermediates_only else (h2, out)

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """timm's description of the feature points: n channels each, reduced from the whole image."""
        return [dict(module=name, num_chs=self.width, reduction=self.img_size) for name in ("fc1", "fc2")]

    def default_output_fmt(self) -> str:
        """The layout ``features_only`` returns: timm's NCHW, (B, n, 1, 1)."""
        return "NCHW"

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's convention; both layers stay (B₂ is needed for the features after it, and costs n² at most
        otherwise): only the head goes. Returns the kept indices."""
        take = select_indices(2, indices)
        if prune_head:
            self.reset_classifier(0)
        return take

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups (layer-wise lr decay): B₁, then B₂."""
        return dict(stem=r"^fc1", blocks=[(r"^fc2", None)])

    # ---- the model contract (pkmixer.models.contract) ------------------------------------------------------
    def rows_per_image(self) -> dict[nn.Module, int]:
        """Every layer runs once per image."""
        return {}

    def effective_mlp(self):  # -> pkmixer.theory.effective.EffectiveMLP
        """x -> B_c B₂ ReLU(B₁ x) with B₁, B₂ as explicit float64 matrices (V ⊗ W, J_cᵀ L J_c R; Cor. 3.4)."""
        from ..theory.effective import EffectiveLinear, EffectiveMLP, EffectiveResidual, structured_weight

        B1, B2 = (structured_weight(fc).double().to_sparse() for fc in (self.fc1, self.fc2))
        layers = [EffectiveLinear("fc1", B1, None, self.act), EffectiveLinear("fc2", B2, None)]
        return EffectiveMLP(lambda images: images.flatten(1),
                            [EffectiveResidual(lambda x: x, layers, residual=False)],
                            self.head)

    def info(self) -> ModelInfo:
        n = self.width
        return ModelInfo(family=f"shallow {self.weights}", params=sum(p.numel() for p in self.parameters()),
                         num_tokens=None, embed_dim=None, gamma_token=None, gamma_channel=None, depth=2, mixing_layers=2,
                         connections=float(n * n), effective_width=n, max_width=n, density=1.0)
