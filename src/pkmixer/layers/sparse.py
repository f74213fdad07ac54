"""Static sparse-weight linear layers of the SW-MLP (Hayase & Karakida Sec. 3.4, 4.3, App. A.2.5).

A mask M has i.i.d. Bernoulli(p) entries, drawn once from a seeded generator and frozen. Two
representations compute the same map x -> (M ⊙ W) x + b:

* :class:`MaskedLinear` keeps W dense and the mask as a boolean buffer: the reference, O(m²) memory.
* :class:`SparseLinear` keeps only the unmasked weights (``values``) and their coordinates: O(p m²).

The sparse form trains in time and memory O(Ω·batch) with CSR kernels (MKL on the CPU, cuSPARSE on a GPU):
forward y = W x is a CSR × dense product, the input gradient Wᵀ g a second one with the transposed pattern
(derived once from the coordinates, 8 bytes per kept weight), and the weight gradient is (g xᵀ)
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


def _one_dtype(t: torch.Tensor):
    """Autocast off around the CSR kernels: they take one dtype (cuSPARSE refuses fp32 CSR with a bf16 dense
    operand, MKL bf16 CSR), so the dense operands are cast to the values' dtype instead."""
    return torch.autocast(t.device.type, enabled=False)


def csr_product(x: torch.Tensor, values: torch.Tensor, pattern: CsrPattern) -> torch.Tensor:
    """x Wᵀ for W = CSR(pattern, values), x (N, in) -> (N, out): one CSR × dense product, in the values' dtype."""
    with _one_dtype(x):
        y = torch.sparse.mm(pattern.matrix(values), x.to(values.dtype).t().contiguous())  # (out, N); MKL: row-major x
    return y.t().contiguous()  # (N, out)


def csr_gradients(grad: torch.Tensor, x: torch.Tensor, values: torch.Tensor, pattern: CsrPattern, need_x: bool,
                  need_values: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :func:`csr_product` for the output gradient ``grad`` (N, out): Wᵀ g with the transposed
    pattern, and (g xᵀ) at the kept coordinates only."""
    g = grad.to(values.dtype).t().contiguous()  # (out, N); under autocast the output's gradient may be bf16
    grad_x = grad_values = None
    with _one_dtype(grad):
        if need_x:
            grad_x = torch.sparse.mm(pattern.transposed(values), g).t()  # Wᵀ g: (in, N) -> (N, in)
        if need_values:
            zeros = pattern.matrix(values.new_zeros(values.shape))
            grad_values = torch.sparse.sampled_addmm(zeros, g, x.to(values.dtype), beta=0.0).values()
    return grad_x, grad_values


class CsrLinearFunction(torch.autograd.Function):
    """(x, values) -> x Wᵀ for W = CSR(pattern, values); x (N, in), values (nnz,). See the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, values: torch.Tensor, pattern: CsrPattern) -> torch.Tensor:
        ctx.pattern = pattern  # frozen structure, not an input: kept on ctx, not saved as a tensor
        ctx.save_for_backward(x, values)
        return csr_product(x, values, pattern)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, values = ctx.saved_tensors
        return (*csr_gradients(grad, x, values, ctx.pattern, *ctx.needs_input_grad[:2]), None)


# SparseLinear's product as an operator of torch.ops, opaque to torch.fx, TorchScript, torch.export and
# torch.compile: the CSR kernels on float32/float64 (and on a GPU), else the COO reference, whose gradients are
# torch's own autograd of the COO product (its weight gradient forms the dense (out, in) product, then masks it).
def _pattern(shape: tuple[int, int], indices: torch.Tensor, crow: torch.Tensor, t_crow: torch.Tensor,
             t_col: torch.Tensor, t_perm: torch.Tensor) -> CsrPattern:
    return CsrPattern(shape, crow, indices[1], t_crow, t_col, t_perm)


def _uses_csr(values: torch.Tensor) -> bool:
    return values.dtype in CSR_DTYPES or values.device.type == "cuda"


def _coo_product(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, shape: tuple[int, int]
                 ) -> torch.Tensor:
    weight = torch.sparse_coo_tensor(indices, values.reshape(-1), shape, is_coalesced=True, check_invariants=False)
    return torch.sparse.mm(weight, x.t()).t()


@torch.library.custom_op("pkmixer::sparse_linear", mutates_args=())
def _sparse_linear_op(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, crow: torch.Tensor,
                      t_crow: torch.Tensor, t_col: torch.Tensor, t_perm: torch.Tensor) -> torch.Tensor:
    shape = (crow.numel() - 1, t_crow.numel() - 1)
    if _uses_csr(values):
        return csr_product(x.to(values.dtype), values.reshape(-1), _pattern(shape, indices, crow, t_crow, t_col, t_perm))
    return _coo_product(x, values, indices, shape).clone()  # a new tensor, never a view of the input


@_sparse_linear_op.register_fake
def _(x, values, indices, crow, t_crow, t_col, t_perm):
    out_dtype = values.dtype if _uses_csr(values) else torch.promote_types(x.dtype, values.dtype)
    return x.new_empty((x.shape[0], crow.shape[0] - 1), dtype=out_dtype)


def _sparse_linear_setup(ctx, inputs, output) -> None:
    x, values, indices, crow, t_crow, t_col, t_perm = inputs
    ctx.save_for_backward(x, values)
    ctx.structure = (indices, crow, t_crow, t_col, t_perm)  # frozen structure, not inputs to differentiate


def _sparse_linear_backward(ctx, grad: torch.Tensor):
    x, values = ctx.saved_tensors
    indices, crow, t_crow, t_col, t_perm = ctx.structure
    shape = (crow.numel() - 1, t_crow.numel() - 1)
    need_x, need_values = ctx.needs_input_grad[:2]
    if _uses_csr(values):
        grad_x, grad_values = csr_gradients(grad, x.to(values.dtype), values.reshape(-1),
                                            _pattern(shape, indices, crow, t_crow, t_col, t_perm), need_x, need_values)
        grad_x = None if grad_x is None else grad_x.to(x.dtype)
        grad_values = None if grad_values is None else grad_values.reshape(values.shape)
    else:
        with torch.enable_grad():
            xs, vs = x.detach().requires_grad_(need_x), values.detach().requires_grad_(need_values)
            wanted = [t for t, need in ((xs, need_x), (vs, need_values)) if need]
            found = iter(torch.autograd.grad(_coo_product(xs, vs, indices, shape), wanted, grad))
        grad_x, grad_values = (next(found) if need_x else None), (next(found) if need_values else None)
    return grad_x, grad_values, None, None, None, None, None


_sparse_linear_op.register_autograd(_sparse_linear_backward, setup_context=_sparse_linear_setup)


class SparseLinear(nn.Module):
    """Only the unmasked weights, as values with frozen COO coordinates: memory O(p·in·out).

    ``values`` is a (1, nnz) row, a weight matrix to optimisers (weight decay by role and timm's rank rule
    agree); ``indices`` (2, nnz) holds each kept weight's (row, column), row-major. Trains with CSR kernels
    through the operator ``torch.ops.pkmixer.sparse_linear`` (:func:`csr_product`, :func:`csr_gradients`),
    which torch.fx, TorchScript and torch.export keep as one opaque node. Its CSR pattern (:meth:`csr_pattern`,
    8 bytes per kept weight besides ``indices``) is derived from ``indices`` when the layer is built and again
    when weights are loaded; it is not state, and moves with the layer. A checkpoint that stores ``values`` as
    the 1-D (nnz,) vector of earlier versions loads as it is.
    """

    decayed_parameters = ("values",)  # the kept weights: weight decay by role (pkmixer.layers.decay)

    def __init__(self, in_features: int, out_features: int, density: float, generator: torch.Generator,
                 bias: bool = True) -> None:
        super().__init__()
        rows, cols, values = _draw_sparse_weight(in_features, out_features, density, generator)
        self.in_features, self.out_features, self.density = in_features, out_features, density
        self.register_buffer("indices", torch.stack([rows, cols]))
        self.values = nn.Parameter(values.view(1, -1))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._derive_pattern()

    @property
    def nnz(self) -> int:
        return self.values.numel()

    def sparse_weight(self) -> torch.Tensor:
        return torch.sparse_coo_tensor(self.indices, self.values.reshape(-1), (self.out_features, self.in_features),
                                       is_coalesced=True, check_invariants=False)

    def _derive_pattern(self) -> None:
        """The CSR pattern of ``indices`` as tensors of the layer (not buffers: derived, not state)."""
        rows, cols = self.indices
        pattern = CsrPattern.from_coordinates(rows, cols, (self.out_features, self.in_features))
        self.csr_crow, self.csr_t_crow = pattern.crow, pattern.t_crow
        self.csr_t_col, self.csr_t_perm = pattern.t_col, pattern.t_perm

    def csr_pattern(self) -> CsrPattern:
        """The CSR pattern of ``indices`` (derived from it; cost.py does not count it)."""
        return _pattern((self.out_features, self.in_features), self.indices, self.csr_crow, self.csr_t_crow,
                        self.csr_t_col, self.csr_t_perm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        y = torch.ops.pkmixer.sparse_linear(x.reshape(-1, self.in_features), self.values, self.indices, self.csr_crow,
                                            self.csr_t_crow, self.csr_t_col, self.csr_t_perm)  # (N, out)
        if self.bias is not None:
            y = y + self.bias
        return y.unflatten(0, x.shape[:-1])

    def _apply(self, fn, recurse: bool = True):
        """The derived pattern moves with the layer (``to``, ``cuda``, ...), as its buffers do."""
        super()._apply(fn, recurse)
        for name in ("csr_crow", "csr_t_crow", "csr_t_col", "csr_t_perm"):
            setattr(self, name, fn(getattr(self, name)))
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        """A checkpoint carries its own mask, whose number of ones differs from this one's: take its size. The
        1-D ``values`` of earlier versions load as the (1, nnz) row. The pattern is derived again afterwards.

        Load before building an optimizer: ``values`` becomes a new Parameter when the size changes.
        """
        incoming = state_dict.get(prefix + "indices")
        if incoming is not None and incoming.shape != self.indices.shape and incoming.ndim == 2:
            n = incoming.shape[1]
            self.indices = torch.empty(2, n, dtype=self.indices.dtype, device=self.indices.device)
            self.values = nn.Parameter(self.values.new_empty(1, n), requires_grad=self.values.requires_grad)
        values = state_dict.get(prefix + "values")
        if values is not None and values.ndim == 1:
            state_dict[prefix + "values"] = values.view(1, -1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._derive_pattern()

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


SPARSE_LAYERS = {"sparse": SparseLinear, "masked": MaskedLinear}
