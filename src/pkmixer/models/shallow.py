"""Shallow MLPs x -> B_c B₂ ReLU(B₁ x) with dense, Kronecker or Monarch weights (Hayase & Karakida Sec. 3.3,
Fig. 2d, Table S.1: no per-patch FC, no skip, no LayerNorm).

The flattened image (n = in_chans·H·W = n1·n2 inputs) passes through B₁ and B₂, each n×n and bias-free as in
the paper's formula, then the classifier B_c. ``weights="kronecker"`` makes B_i = V_i ⊗ W_i, ``"monarch"``
makes B_i = J_cᵀ L_i J_c R_i (Eq. 12) with n1 blocks of n2×n2 and n2 blocks of n1×n1.

The class follows the model contract (:mod:`pkmixer.models.contract`): its effective MLP has the explicit B₁, B₂.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import ConfigError, check_positive_int
from ..layers.structured import KroneckerLinear, MonarchLinear
from .features import check_where, select_indices
from .info import ModelInfo
from .timm_api import TimmModel

WEIGHT_KINDS = ("dense", "kronecker", "monarch")


class ShallowMLP(TimmModel, nn.Module):
    """x -> B_c B₂ ReLU(B₁ x) (Sec. 3.3); see the module docstring."""

    zero_head = False  # timm's reset_classifier: B_c has PyTorch's Linear initialisation, as here
    first_conv = None  # no convolution: the image is flattened

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

    def _hidden(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_chans, self.img_size, self.img_size):
            raise ValueError(f"expected input of shape (B, {self.in_chans}, {self.img_size}, {self.img_size}), "
                             f"got {tuple(x.shape)}")
        h1 = self.act(self.fc1(x.flatten(1)))  # (B, n)
        return h1, self.fc2(h1)  # (B, n)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self._hidden(x)[1]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    def feature_names(self, where: str = "block") -> list[str]:
        check_where(where)
        return ["fc1", "fc2"]

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, *,
                              where: str = "block", norm: bool = False, intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """ReLU(B₁x) and B₂ReLU(B₁x), each (B, n); there are no skips, so both ``where`` agree."""
        take = select_indices(2, indices)
        h1, h2 = self._hidden(x)
        out = [(h1, h2)[i] for i in take]
        return out if intermediates_only else (h2, out)

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
