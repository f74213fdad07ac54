"""Kronecker and Monarch linear layers (Hayase & Karakida Sec. 3.3, Eq. 12, Cor. 3.4; Dao et al. 2022).

Both act on x ∈ R^{n}, n = n1·n2, in the paper's vec convention: the row-major (n1, n2) view of x is mat(x)ᵀ
with mat(x) ∈ R^{n2×n1}.

* :class:`KroneckerLinear`: x -> (V ⊗ W) x = vec(W mat(x) Vᵀ), V ∈ R^{n1×n1}, W ∈ R^{n2×n2}: two small
  products, O(n(n1 + n2)) work instead of O(n²); V multiplies through ``bmm`` with V broadcast over the batch.
* :class:`MonarchLinear`: x -> J_cᵀ L J_c R x with R = diag(R_1..R_{n1}) (n1 blocks n2×n2) and
  L = diag(L_1..L_{n2}) (n2 blocks n1×n1); J_c is the commutation matrix of an n2×n1 matrix. With all
  R_i = W and all L_j = V this is V ⊗ W (Cor. 3.4 with weight-shared blocks).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import check_positive_int
from .pk import transpose_index


class KroneckerLinear(nn.Module):
    """(V ⊗ W) x: n1² + n2² parameters for an n×n map."""

    decayed_parameters = ("V", "W")  # weight decay by role (pkmixer.layers.decay)

    def __init__(self, n1: int, n2: int) -> None:
        super().__init__()
        self.n1, self.n2 = check_positive_int("n1", n1), check_positive_int("n2", n2)
        self.V = nn.Parameter(torch.randn(n1, n1) / math.sqrt(n1))
        self.W = nn.Parameter(torch.randn(n2, n2) / math.sqrt(n2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n) -> (B, n)
        y = x.reshape(-1, self.n1, self.n2) @ self.W.t()  # (B, n1, n2): mat(x)ᵀ Wᵀ, one (B·n1, n2) product
        V = self.V.expand(y.shape[0], -1, -1)  # broadcast over the batch: bmm, not matmul's broadcasting copy
        return torch.bmm(V, y).reshape(x.shape)  # V mat(x)ᵀ Wᵀ = (W mat(x) Vᵀ)ᵀ

    def dense_weight(self) -> torch.Tensor:
        """V ⊗ W as a dense (n, n) matrix."""
        return torch.kron(self.V.detach(), self.W.detach())

    def matmul_cost(self) -> tuple[str, int, int, int]:
        """W on n1 rows of n2, then V on n2 columns of n1 (layer contract, pkmixer.models.contract)."""
        n1, n2 = self.n1, self.n2
        return "kronecker", n1 * n2, n1 * n2, n1 * n2 * n2 + n2 * n1 * n1


class MonarchLinear(nn.Module):
    """J_cᵀ L J_c R x with free blocks: n1·n2² + n2·n1² parameters for an n×n map."""

    decayed_parameters = ("R", "L")  # weight decay by role (pkmixer.layers.decay)

    def __init__(self, n1: int, n2: int) -> None:
        super().__init__()
        self.n1, self.n2 = check_positive_int("n1", n1), check_positive_int("n2", n2)
        self.R = nn.Parameter(torch.randn(n1, n2, n2) / math.sqrt(n2))  # n1 blocks acting on length n2
        self.L = nn.Parameter(torch.randn(n2, n1, n1) / math.sqrt(n1))  # n2 blocks acting on length n1

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n) -> (B, n)
        y = torch.einsum("bij,ikj->bik", x.view(-1, self.n1, self.n2), self.R)  # R: block i on row i
        z = torch.einsum("bij,ikj->bik", y.transpose(1, 2), self.L)  # J_c, then L: (B, n2, n1)
        return z.transpose(1, 2).reshape(x.shape)  # J_cᵀ

    def dense_weight(self) -> torch.Tensor:
        """J_cᵀ L J_c R as a dense (n, n) matrix (Eq. 12), J_c the commutation matrix of an n2×n1 matrix."""
        R = torch.block_diag(*self.R.detach())
        L = torch.block_diag(*self.L.detach())
        n = self.n1 * self.n2
        # (J_c v)[i·n1 + j] = v[j·n2 + i]: J_c is the identity with its rows gathered by this index
        Jc = torch.eye(n, dtype=R.dtype, device=R.device)[transpose_index(self.n1, self.n2)]
        return Jc.t() @ L @ Jc @ R

    def matmul_cost(self) -> tuple[str, int, int, int]:
        """R on n1 rows of n2, then L on n2 columns of n1 (layer contract, pkmixer.models.contract)."""
        n1, n2 = self.n1, self.n2
        return "monarch", n1 * n2, n1 * n2, n1 * n2 * n2 + n2 * n1 * n1
