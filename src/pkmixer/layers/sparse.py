"""Static sparse-weight linear layers of the SW-MLP (Hayase & Karakida Sec. 3.4, 4.3, App. A.2.5).

A mask M has i.i.d. Bernoulli(p) entries, drawn once from a seeded generator and frozen. Two
representations compute the same map x -> (M ⊙ W) x + b:

* :class:`MaskedLinear` keeps W dense and the mask as a boolean buffer: the reference, O(m²) memory.
* :class:`SparseLinear` keeps only the unmasked weights (``values``) and their coordinates: O(p m²).

Both draw the same mask and, from the same global RNG state, the same values. Initialisation is
sparsity-aware: the kept weights are N(0, 1/(p·fan_in)), so each output sums about p·fan_in inputs of unit
total variance - the distribution of M ⊙ A with M ∈ {0, 1/√p} and A ~ N(0, 1/fan_in) of Sec. 4.3.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import check_density, check_positive_int


def sample_bernoulli_mask(rows: int, cols: int, p: float, generator: torch.Generator
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinates (row, col), in row-major order, of the ones of a (rows, cols) i.i.d. Bernoulli(p) mask.

    Samples the gaps between successive ones (geometric with parameter p), so time and memory grow with the
    number of ones, p·rows·cols, never with rows·cols.
    """
    check_density("density p", p)
    total = rows * cols
    if p == 1.0:
        flat = torch.arange(total, device="cpu")
    else:
        log_q = math.log1p(-p)
        chunks, last = [], -1
        while True:
            n = int(1.05 * p * (total - last)) + 64
            u = 1.0 - torch.rand(n, generator=generator, dtype=torch.float64, device="cpu")  # in (0, 1]
            gaps = torch.floor(torch.log(u) / log_q).clamp_(max=total) + 1
            pos = last + torch.cumsum(gaps, 0)
            inside = pos < total
            chunks.append(pos[inside].long())
            if not bool(inside.all()):
                break
            last = int(pos[-1])
        flat = torch.cat(chunks)
    return flat // cols, flat % cols


def _draw_sparse_weight(in_features: int, out_features: int, density: float, generator: torch.Generator
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mask coordinates (from ``generator``) and the kept weights (from the global RNG)."""
    check_positive_int("in_features", in_features)
    check_positive_int("out_features", out_features)
    rows, cols = sample_bernoulli_mask(out_features, in_features, density, generator)
    values = torch.randn(rows.numel()) / math.sqrt(density * in_features)
    return rows, cols, values


class MaskedLinear(nn.Module):
    """Dense weight times a frozen Bernoulli(p) mask: the reference representation."""

    def __init__(self, in_features: int, out_features: int, density: float, generator: torch.Generator,
                 bias: bool = True) -> None:
        super().__init__()
        rows, cols, values = _draw_sparse_weight(in_features, out_features, density, generator)
        self.in_features, self.out_features, self.density = in_features, out_features, density
        # on the indices' device (CPU), so that a model built on the meta device still knows its mask
        mask = torch.zeros(out_features, in_features, dtype=torch.bool, device=rows.device)
        mask[rows, cols] = True
        weight = torch.zeros(out_features, in_features)
        weight[rows, cols] = values
        self.register_buffer("mask", mask)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @property
    def nnz(self) -> int:
        return int(self.mask.sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return F.linear(x, self.weight * self.mask, self.bias)

    def dense_weight(self) -> torch.Tensor:
        """M ⊙ W as a dense (out, in) matrix."""
        return self.weight * self.mask

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, p={self.density:g}, nnz={self.nnz}"


class SparseLinear(nn.Module):
    """Only the unmasked weights, as COO values with frozen coordinates: memory O(p·in·out)."""

    def __init__(self, in_features: int, out_features: int, density: float, generator: torch.Generator,
                 bias: bool = True) -> None:
        super().__init__()
        rows, cols, values = _draw_sparse_weight(in_features, out_features, density, generator)
        self.in_features, self.out_features, self.density = in_features, out_features, density
        self.register_buffer("indices", torch.stack([rows, cols]))
        self.values = nn.Parameter(values)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @property
    def nnz(self) -> int:
        return self.values.numel()

    def sparse_weight(self) -> torch.Tensor:
        return torch.sparse_coo_tensor(self.indices, self.values, (self.out_features, self.in_features),
                                       is_coalesced=True, check_invariants=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        lead = x.shape[:-1]
        y = torch.sparse.mm(self.sparse_weight(), x.reshape(-1, self.in_features).t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        """A checkpoint carries its own mask, whose number of ones differs from this one's: take its size.

        Load before building an optimizer: ``values`` becomes a new Parameter when the size changes.
        """
        incoming = state_dict.get(prefix + "indices")
        if incoming is not None and incoming.shape != self.indices.shape and incoming.ndim == 2:
            n = incoming.shape[1]
            self.indices = torch.empty(2, n, dtype=self.indices.dtype, device=self.indices.device)
            self.values = nn.Parameter(self.values.new_empty(n), requires_grad=self.values.requires_grad)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def dense_weight(self) -> torch.Tensor:
        """M ⊙ W as a dense (out, in) matrix (for analysis at small sizes)."""
        return self.sparse_weight().to_dense()

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, p={self.density:g}, nnz={self.nnz}"


SPARSE_LAYERS = {"sparse": SparseLinear, "masked": MaskedLinear}
