"""The mixing MLPs behind one signature (Mixer supp. Listing 1; Hayase & Karakida Eqs. 1-2, 5, S.7-S.8).

Both act on the last axis and take ``(in_features, hidden_features, out_features, act_layer, drop)``, so a
model swaps one for the other without forking (timm's ``mlp_layer=Mlp`` habit):

* :class:`Mlp` - Dense, activation, Dense: the MLP-Mixer's token and channel MLPs (``fc1``, ``fc2``).
* :class:`FcAct` - one Dense followed by the activation: the S-Mixer's single-layer mixing ``phi(W x)``.

Both also apply themselves along the second-to-last axis, ``forward_left``: the token mixing W X of Eq. 1 as a
left multiplication of the (S, C) feature matrix, one batched product per Dense (``baddbmm`` with the weight
broadcast over the batch, bias fused), with no transposes in or out; with fewer than 16 channels sequence-first
instead, one GEMM per Dense over all the batch's columns. timm's ``mlp(x.transpose(1, 2))
.transpose(1, 2)`` is the same map (tests/test_fastpaths.py) on strided operands, and leaves its output in the
transposed layout; docs/performance.md section (e) times the formulations.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .narrow_linear import WIDTHS as NARROW_LINEAR_WIDTHS
from .narrow_linear import narrow_linear


# Below this many columns (channels, for token mixing) the MLP runs sequence-first, one GEMM per Dense over all
# B·n columns, instead of B products whose inner matrices are only n wide (docs/performance.md (e)).
NARROW_COLUMNS = 16


def columns_first(x: torch.Tensor) -> torch.Tensor:
    """(B, in, n) -> (in, B·n): the columns of every example side by side (one copy)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def columns_back(y: torch.Tensor, batch: int) -> torch.Tensor:
    """(out, B·n) -> (B, out, n), a strided view (the residual sum that follows lays it out again)."""
    return y.view(y.shape[0], batch, -1).transpose(0, 1)


def left_mm(weight: torch.Tensor, bias: Optional[torch.Tensor], columns: torch.Tensor) -> torch.Tensor:
    """W X + b[:, None] for a Dense's (out, in) ``weight`` and ``bias``, X of shape (in, N): one GEMM."""
    if bias is None:
        return weight @ columns
    return torch.addmm(bias.unsqueeze(-1), weight, columns)


def left_linear(weight: torch.Tensor, bias: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """W x + b[:, None] for x of shape (B, in, n): the Dense applied to every column, as batched products with
    no transposes."""
    w = weight.expand(x.shape[0], -1, -1)  # (B, out, in), stride 0 over the batch
    if bias is None:
        return torch.bmm(w, x)
    return torch.baddbmm(bias.unsqueeze(-1), w, x)  # (B, out, n)


class Mlp(nn.Module):
    """x -> fc2(drop(act(fc1(x)))): hidden width ``hidden_features``."""

    STACKS_BY_CHILDREN = True  # its forward is generic in the leading axes (pkmixer.layers.stacked)

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
        self.narrow_columns = NARROW_COLUMNS

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def forward_left(self, x: torch.Tensor, narrow: Optional[bool] = None) -> torch.Tensor:
        """``self(x.transpose(1, 2)).transpose(1, 2)`` without the transposes, (B, in, n) -> (B, hidden, n) ->
        (B, out, n): sequence-first when ``narrow`` (None: when n < NARROW_COLUMNS; a mixing layer passes what
        it chose when it was built)."""
        if narrow is None:
            narrow = x.shape[-1] < self.narrow_columns
        if narrow:
            h = self.drop1(self.act(left_mm(self.fc1.weight, self.fc1.bias, columns_first(x))))
            return columns_back(self.drop2(left_mm(self.fc2.weight, self.fc2.bias, h)), x.shape[0])
        h = self.drop1(self.act(left_linear(self.fc1.weight, self.fc1.bias, x)))
        return self.drop2(left_linear(self.fc2.weight, self.fc2.bias, h))

    def linears(self) -> list[nn.Linear]:
        return [self.fc1, self.fc2]

    def linear_steps(self) -> list[tuple[nn.Linear, nn.Module | None]]:
        """(Dense, activation) in the order the effective MLP applies them (pkmixer.models.contract)."""
        return [(self.fc1, self.act), (self.fc2, None)]


class FcAct(nn.Module):
    """x -> drop(act(fc(x))): the single-layer mixing of the S-Mixer (Eq. 5)."""

    STACKS_BY_CHILDREN = True  # its forward is generic in the leading axes (pkmixer.layers.stacked)

    def __init__(self, in_features: int, hidden_features: int | None, out_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        if hidden_features is not None:
            raise ValueError("FcAct has no hidden layer; pass hidden_features=None")
        self.fc = nn.Linear(in_features, out_features)
        self.act = act_layer()
        self.drop = nn.Dropout(drop)
        self.narrow_columns = NARROW_COLUMNS
        # a square Dense over 4 or 8 features: product() along the last axis runs pkmixer.layers.narrow_linear
        self.narrow_product = in_features == out_features and in_features in NARROW_LINEAR_WIDTHS

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.drop(self.act(self.fc(x)))

    def forward_left(self, x: torch.Tensor, narrow: Optional[bool] = None) -> torch.Tensor:
        """``self(x.transpose(1, 2)).transpose(1, 2)`` without the transposes, (B, in, n) -> (B, out, n);
        ``narrow`` as :meth:`Mlp.forward_left`."""
        if narrow is None:
            narrow = x.shape[-1] < self.narrow_columns
        if narrow:
            return columns_back(self.drop(self.act(left_mm(self.fc.weight, self.fc.bias, columns_first(x)))),
                                x.shape[0])
        return self.drop(self.act(left_linear(self.fc.weight, self.fc.bias, x)))

    def product(self, x: torch.Tensor, left: bool = False, narrow: bool = False) -> torch.Tensor:
        """W x, the Dense without its bias and activation (pkmixer.layers.fused adds them): along the last axis
        with :func:`pkmixer.layers.narrow_linear.narrow_linear` over 4 or 8 features; ``left``: along the
        second-to-last axis, as :meth:`forward_left` with ``narrow``."""
        if not left:
            return narrow_linear(x, self.fc.weight) if self.narrow_product else F.linear(x, self.fc.weight)
        if narrow:
            return columns_back(self.fc.weight @ columns_first(x), x.shape[0])
        return torch.bmm(self.fc.weight.expand(x.shape[0], -1, -1), x)

    def linears(self) -> list[nn.Linear]:
        return [self.fc]

    def linear_steps(self) -> list[tuple[nn.Linear, nn.Module | None]]:
        """(Dense, activation) in the order the effective MLP applies them (pkmixer.models.contract)."""
        return [(self.fc, self.act)]
