"""Static sparse-weight linear layers of the SW-MLP (Hayase & Karakida Sec. 3.4, 4.3, App. A.2.5).

A mask M has i.i.d. Bernoulli(p) entries, drawn once from a seeded generator and frozen. Two
representations compute the same map x -> (M ⊙ W) x + b:

* :class:`MaskedLinear` keeps W dense and the mask as a boolean buffer: the reference, O(m²) memory.
* :class:`SparseLinear` keeps only the unmasked weights (``values``) and their coordinates: O(p m²).

The sparse form trains in time and memory O(Ω·batch) with CSR kernels (MKL on the CPU, cuSPARSE on a GPU):
forward y = W x is a CSR × dense product, the input gradient Wᵀ g a second one with the transposed pattern
(built once from the coordinates and cached, 8 bytes per kept weight), and the weight gradient is (g xᵀ)
sampled at the kept coordinates only (``torch.sparse.sampled_addmm``), never the dense m×m product that a COO
``torch.sparse.mm`` backward forms. CPU CSR kernels exist for float32 and float64 only; other dtypes take the
COO path. docs/performance.md section (c) compares the two forms.

Both draw the same mask and, from the same global RNG state, the same values. Initialisation is
sparsity-aware: the kept weights are N(0, 1/(p·fan_in)), so each output sums about p·fan_in inputs of unit
total variance - the distribution of M ⊙ A with M ∈ {0, 1/√p} and A ~ N(0, 1/fan_in) of Sec. 4.3.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ..errors import check_density, check_positive_int

CSR_DTYPES = (torch.float32, torch.float64)  # dtypes of torch's CPU CSR kernels (MKL)


def sample_bernoulli_mask(rows: int, cols: int, p: float, generator: torch.Generator, chunk: int = 1 << 22
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinates (row, col), in row-major order, of the ones of a (rows, cols) i.i.d. Bernoulli(p) mask.

    Samples the gaps between successive ones (geometric with parameter p), so time and memory grow with the
    number of ones, p·rows·cols, never with rows·cols. Each round draws as many gaps as should reach the end,
    ``chunk`` at a time, so the float64 temporaries stay O(chunk); the draws, hence the mask for a given
    generator state, do not depend on ``chunk``.
    """
    check_density("density p", p)
    total = rows * cols
    if p == 1.0:
        flat = torch.arange(total, device="cpu")
    else:
        log_q = math.log1p(-p)
        found, last, done = [], -1, False
        while not done:
            n = int(1.05 * p * (total - last)) + 64  # this round's draws
            for start in range(0, n, chunk):
                u = 1.0 - torch.rand(min(chunk, n - start), generator=generator, dtype=torch.float64,
                                     device="cpu")  # in (0, 1]
                if done:  # past the end: still drawn, so that the generator always ends in the same state
                    continue
                gaps = torch.floor(torch.log(u) / log_q).clamp_(max=total) + 1
                pos = last + torch.cumsum(gaps, 0)  # integers below 2^53: exact in float64
                inside = pos < total
                found.append(pos[inside].long())
                done = not bool(inside.all())
                last = int(pos[-1])
        flat = torch.cat(found)
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

    decayed_parameters = ("weight",)  # weight decay by role (pkmixer.layers.decay)

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

    # the layer contract (pkmixer.models.contract): a dense matmul whatever the mask; its mask stays on the CPU in
    # a meta model, so a meta model holding it is copied wholly to meta to run
    META_FORWARD = "to_meta"

    def matmul_cost(self) -> tuple[str, int, int, int]:
        return "masked", self.in_features, self.out_features, self.in_features * self.out_features

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, p={self.density:g}, nnz={self.nnz}"


@dataclass(frozen=True)
class CsrPattern:
    """The frozen sparsity pattern of an (out, in) weight in CSR form, and of its transpose.

    The kept weights are stored in row-major order, which is CSR order: ``values`` index the forward pattern
    directly, and ``values[t_perm]`` are the values of Wᵀ in its own CSR order.
    """

    shape: tuple[int, int]
    crow: torch.Tensor  # (out + 1,) row pointers of W
    col: torch.Tensor  # (nnz,) column of each kept weight
    t_crow: torch.Tensor  # (in + 1,) row pointers of Wᵀ
    t_col: torch.Tensor  # (nnz,) column of Wᵀ (a row of W) of each kept weight, in Wᵀ's order
    t_perm: torch.Tensor  # (nnz,) position in ``values`` of each kept weight of Wᵀ

    @classmethod
    def from_coordinates(cls, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]) -> CsrPattern:
        """From row-major sorted coordinates; the transposed pattern in int32 when it fits (half the bytes)."""
        out, inp = shape
        small = rows.numel() < 2**31 and max(shape) < 2**31
        t_perm = torch.sort(cols, stable=True).indices  # column-major order: rows stay sorted within a column
        t_dtype = torch.int32 if small else torch.int64
        return cls(shape, _row_pointers(rows, out), cols,
                   _row_pointers(cols, inp).to(t_dtype), rows.index_select(0, t_perm).to(t_dtype),
                   t_perm.to(t_dtype))

    def matrix(self, values: torch.Tensor) -> torch.Tensor:
        return _csr(self.crow, self.col, values, self.shape)

    def transposed(self, values: torch.Tensor) -> torch.Tensor:
        return _csr(self.t_crow, self.t_col, values.index_select(0, self.t_perm), self.shape[::-1])


def _row_pointers(rows: torch.Tensor, n: int) -> torch.Tensor:
    crow = torch.zeros(n + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=n), 0, out=crow[1:])
    return crow


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # torch warns once per process that CSR support is "beta"
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


class CsrLinearFunction(torch.autograd.Function):
    """(x, values) -> x Wᵀ for W = CSR(pattern, values); x (N, in). See the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, values: torch.Tensor, pattern: CsrPattern) -> torch.Tensor:
        ctx.pattern = pattern  # frozen structure, not an input: kept on ctx, not saved as a tensor
        ctx.save_for_backward(x, values)
        y = torch.sparse.mm(pattern.matrix(values), x.t().contiguous())  # (out, N); MKL wants a row-major x
        return y.t().contiguous()  # (N, out)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, values = ctx.saved_tensors
        pattern: CsrPattern = ctx.pattern
        g = grad.t().contiguous()  # (out, N)
        grad_x = grad_values = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.sparse.mm(pattern.transposed(values), g).t()  # Wᵀ g: (in, N) -> (N, in)
        if ctx.needs_input_grad[1]:  # (g xᵀ) at the kept coordinates only
            zeros = pattern.matrix(values.new_zeros(values.shape))
            grad_values = torch.sparse.sampled_addmm(zeros, g, x, beta=0.0).values()
        return grad_x, grad_values, None


class SparseLinear(nn.Module):
    """Only the unmasked weights, as values with frozen COO coordinates: memory O(p·in·out).

    Trains with CSR kernels (:class:`CsrLinearFunction`); ``csr_pattern`` derives the pattern from ``indices``
    on first use and again whenever ``indices`` is replaced, moved or loaded.
    """

    decayed_parameters = ("values",)  # the kept weights, 1-D: weight decay by role (pkmixer.layers.decay)

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

    def csr_pattern(self) -> CsrPattern:
        """The CSR pattern of ``indices``: a cache derived from the buffer (not state; cost.py does not count it)."""
        key = (self.indices.data_ptr(), self.indices.device, self.indices._version, self.indices.shape[1])
        cached = self.__dict__.get("_csr_cache")
        if cached is None or cached[0] != key:
            rows, cols = self.indices
            cached = self.__dict__["_csr_cache"] = (key, CsrPattern.from_coordinates(
                rows, cols, (self.out_features, self.in_features)))
        return cached[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (N, in)
        if self.values.dtype in CSR_DTYPES or self.values.device.type == "cuda":
            y = _csr_linear(x2.to(self.values.dtype), self.values, self.csr_pattern())
        else:  # COO reference: its weight gradient forms the dense (out, in) product before masking it
            y = torch.sparse.mm(self.sparse_weight(), x2.t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the derived CSR cache behind."""
        state = self.__dict__.copy()
        state.pop("_csr_cache", None)
        return state

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

    # the layer contract (pkmixer.models.contract): the kept weights only; torch has no sparse product on the meta
    # device, so a meta model holding it runs as a CPU copy with zeros
    META_FORWARD = "cpu_zeros"

    def matmul_cost(self) -> tuple[str, int, int, int]:
        return "sparse", self.in_features, self.out_features, self.nnz

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, p={self.density:g}, nnz={self.nnz}"


@torch.compiler.disable  # sparse CSR tensors do not trace; a compiled SW-MLP runs this product eagerly
def _csr_linear(x: torch.Tensor, values: torch.Tensor, pattern: CsrPattern) -> torch.Tensor:
    return CsrLinearFunction.apply(x, values, pattern)


SPARSE_LAYERS = {"sparse": SparseLinear, "masked": MaskedLinear}
