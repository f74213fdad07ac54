"""The mixing MLPs behind one signature (Mixer supp. Listing 1; Hayase & Karakida Eqs. 1-2, 5, S.7-S.8).

Both act on the last axis and take ``(in_features, hidden_features, out_features, act_layer, drop)``, so a
model swaps one for the other without forking (timm's ``mlp_layer=Mlp`` habit):

* :class:`Mlp` - Dense, activation, Dense: the MLP-Mixer's token and channel MLPs (``fc1``, ``fc2``).
* :class:`FcAct` - one Dense followed by the activation: the S-Mixer's single-layer mixing ``phi(W x)``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Mlp(nn.Module):
    """x -> fc2(drop(act(fc1(x)))): hidden width ``hidden_features``."""

    def __init__(self, in_features: int, hidden_features: int | None, out_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        if hidden_features is None:
            raise ValueError("Mlp needs hidden_features")
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def linears(self) -> list[nn.Linear]:
        return [self.fc1, self.fc2]


class FcAct(nn.Module):
    """x -> drop(act(fc(x))): the single-layer mixing of the S-Mixer (Eq. 5)."""

    def __init__(self, in_features: int, hidden_features: int | None, out_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        if hidden_features is not None:
            raise ValueError("FcAct has no hidden layer; pass hidden_features=None")
        self.fc = nn.Linear(in_features, out_features)
        self.act = act_layer()
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.drop(self.act(self.fc(x)))

    def linears(self) -> list[nn.Linear]:
        return [self.fc]
