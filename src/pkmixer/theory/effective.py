"""The effective wide MLP of every mixing layer, as explicit sparse matrices (Hayase & Karakida Sec. 3, 5).

Coordinates are the paper's: a feature map X ∈ R^{S×C} is the vector vec(X) (columns stacked,
vec(X)[jS + i] = X[i, j]), the effective width is m = S·C, and J_c is the commutation matrix,
J_c vec(X) = vec(Xᵀ) (Def. 3.1). Row-major storage of X is vec(Xᵀ) = J_c vec(X); the gathers of a
:class:`~pkmixer.layers.pk.PKMixing` act on that storage, so a PK layer with gathers J₁, J₂ and Dense W has,
on vec coordinates, the effective weight J_cᵀ P(J₂) (I_n ⊗ W) P(J₁) J_c (Eq. 19, S.21-S.23). For the normal
Mixer this reduces to I_C ⊗ W for token mixing and Vᵀ ⊗ I_S for channel mixing (Eqs. 7-8).

:func:`effective_mlp` turns a whole model into an :class:`EffectiveMLP` - the same network written as a plain
wide MLP whose linear maps are these sparse matrices. LayerNorm over channels, skips, pooling and the head
are kept as they are (they are per-token operations, not mixing). :func:`bare_smixer` and
:func:`bare_smixer_vec` state Prop. 3.2, :func:`mixer_monarch_factors` Cor. 3.4.

Nothing here knows a model class: each family assembles its own :class:`EffectiveMLP` (``model.effective_mlp()``)
from the pieces below, and the layers declare what those need - a PK layer its gathers, Kronecker blocks and
input maps, a mixing MLP its (Dense, activation) steps, a structured linear layer its dense matrix
(:mod:`pkmixer.models.contract`).

The token-mixing ablations of the Mixer supplementary (A.1) have effective weights of the same kind: untied
token mixing blockdiag(W⁽¹⁾, ..., W⁽ᶜ⁾) with C distinct blocks; grouped channels I_{C/G} ⊗ W_G on vec(X) itself
(grouping is the column-major reshape, so it permutes nothing in vec coordinates); G views the extra linear
map A ⊗ I_S before the grouped one; a pyramid a different S on each side of a block (I_C ⊗ W₁, I_C ⊗ W₂ with
W₁ ∈ R^{D_S×S_in}, W₂ ∈ R^{S_out×D_S}, and the skip LN((I_C ⊗ W̃) vec(X))).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models import contract

# ---- explicit matrices -------------------------------------------------------------------------------------


def _sparse(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, shape, check_invariants=False).coalesce()


def vec(X: torch.Tensor) -> torch.Tensor:
    """Column-stacking vec of a (..., rows, cols) batch: (..., rows*cols)."""
    return X.transpose(-1, -2).reshape(*X.shape[:-2], -1)


def unvec(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`vec`: (..., rows*cols) -> (..., rows, cols)."""
    return x.reshape(*x.shape[:-1], cols, rows).transpose(-1, -2)


def permutation_matrix(index: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Sparse P with (P v)[i] = v[index[i]]."""
    m = index.numel()
    return _sparse(torch.arange(m), index.cpu(), torch.ones(m, dtype=dtype), (m, m))


def commutation_matrix(rows: int, cols: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Sparse J_c of size rows·cols with J_c vec(A) = vec(Aᵀ) for A ∈ R^{rows×cols} (Def. 3.1)."""
    i = torch.arange(rows).repeat_interleave(cols)  # entries A[i, j] ...
    j = torch.arange(cols).repeat(rows)
    return _sparse(i * cols + j, j * rows + i, torch.ones(rows * cols, dtype=dtype), (rows * cols, rows * cols))


def block_diagonal(blocks: torch.Tensor) -> torch.Tensor:
    """Sparse blockdiag(blocks[0], ..., blocks[n-1]) for blocks of shape (n, out, in)."""
    n, out, inp = blocks.shape
    b, r, c = torch.meshgrid(torch.arange(n), torch.arange(out), torch.arange(inp), indexing="ij")
    return _sparse((b * out + r).reshape(-1), (b * inp + c).reshape(-1), blocks.detach().reshape(-1),
                   (n * out, n * inp))


def kron_identity(n: int, W: torch.Tensor) -> torch.Tensor:
    """Sparse I_n ⊗ W for W of shape (out, in): n diagonal copies of W."""
    return block_diagonal(W.detach().expand(n, *W.shape))


def spmm(*mats: torch.Tensor) -> torch.Tensor:
    """Product of sparse matrices, left to right."""
    out = mats[0]
    with warnings.catch_warnings():  # torch flags its internal CSR path as beta; the results are checked in tests
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        for m in mats[1:]:
            out = torch.sparse.mm(out, m)
    return out.coalesce()


# ---- the effective MLP ---------------------------------------------------------------------------------


@dataclass
class EffectiveLinear:
    """x -> act(W x + b) with an explicit sparse W on vec coordinates."""

    name: str
    weight: torch.Tensor  # sparse (out, in)
    bias: torch.Tensor | None  # (out,)
    act: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, in) -> (B, out)
        y = torch.sparse.mm(self.weight, x.t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y if self.act is None else self.act(y)

    @property
    def density(self) -> float:
        return self.weight._nnz() / (self.weight.shape[0] * self.weight.shape[1])


@dataclass
class EffectiveResidual:
    """x -> skip(x) + layers(norm(x)); ``skip=None`` is the identity, ``residual=False`` drops it."""

    norm: Callable[[torch.Tensor], torch.Tensor]
    layers: list[EffectiveLinear]
    skip: Callable[[torch.Tensor], torch.Tensor] | None = None
    residual: bool = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        for layer in self.layers:
            y = layer(y)
        if not self.residual:
            return y
        return (x if self.skip is None else self.skip(x)) + y


@dataclass
class EffectiveMLP:
    """A model rewritten as stem -> residual wide layers -> head, every mixing an explicit sparse matrix."""

    stem: Callable[[torch.Tensor], torch.Tensor]  # images -> (B, m0) in vec coordinates
    blocks: list[EffectiveResidual]
    head: Callable[[torch.Tensor], torch.Tensor]  # (B, m) -> logits

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)

    def layers(self) -> list[EffectiveLinear]:
        return [layer for blk in self.blocks for layer in blk.layers]


def vec_layer_norm(ln: nn.LayerNorm, S: int, C: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """LayerNorm over the channels of each token, applied to vec(X)."""
    return lambda x: vec(ln(unvec(x, S, C)))


def pk_effective_layers(mixing: contract.PKLayer, name: str, S_in: int, S_out: int, C: int) -> list[EffectiveLinear]:
    """The Dense layers of a (normal or RP) mixing as sparse matrices on vec coordinates (Eq. 19, S.21-S.23).

    The first maps vec(X) (X ∈ R^{S_in×C}) to the hidden blocks, the last maps the hidden blocks to vec(Y)
    (Y ∈ R^{S_out×C}); with one Dense both ends apply. Untied MLPs give distinct diagonal blocks. ``mixing``
    follows :class:`pkmixer.models.contract.PKLayer`: a grouped token mixing (Mixer supp. A.1) is the PK layer of
    its grouping gathers with C/G blocks; each of its input maps A (the views) comes first as a layer
    ``{name}.views`` = A ⊗ I_S (no bias, no activation).
    """
    views = []
    for k, lin in enumerate(mixing.input_maps()):
        Jc = commutation_matrix(S_in, C)
        A = kron_identity(S_in, lin.weight.double())  # per-token Linear on storage: I_S ⊗ A
        label = f"{name}.views" if k == 0 else f"{name}.views{k + 1}"
        views.append(EffectiveLinear(label, spmm(Jc.t(), A, Jc), None))  # on vec: A ⊗ I_S (Eq. 6)
    J1, J2 = mixing.gather_indices()
    C_in = C_out = C
    if mixing.axis == "channel":
        C_in, C_out = mixing.in_features, mixing.out_features
    into_storage = spmm(permutation_matrix(J1), commutation_matrix(S_in, C_in))  # P(J₁) J_c
    from_storage = spmm(commutation_matrix(S_out, C_out).t(), permutation_matrix(J2))  # J_cᵀ P(J₂)
    linears = contract.linear_steps(mixing.mlp)
    out = []
    for k, (lin, act) in enumerate(linears):
        weight, bias = lin.weight.detach().to(torch.float64), lin.bias.detach().to(torch.float64)
        if weight.ndim == 3:  # untied: one (out, in) block per row, each with its own bias
            W, b = block_diagonal(weight), bias.reshape(-1)
        else:
            W, b = kron_identity(mixing.other, weight), bias.repeat(mixing.other)
        if k == 0:
            W = spmm(W, into_storage.to(W.dtype))
        if k == len(linears) - 1:
            W = spmm(from_storage.to(W.dtype), W)
            b = torch.sparse.mm(from_storage.to(W.dtype), b[:, None]).to_dense()[:, 0]
        out.append(EffectiveLinear(f"{name}.{'fc' if len(linears) == 1 else f'fc{k + 1}'}", W, b, act))
    return views + out


def structured_weight(layer: nn.Module) -> torch.Tensor:
    """Dense effective matrix of a linear layer: W, V ⊗ W, J_cᵀ L J_c R (Eq. 12) or M ⊙ W, as the layer declares
    it (:func:`pkmixer.models.contract.dense_weight`)."""
    return contract.dense_weight(layer)


def effective_mlp(model: nn.Module) -> EffectiveMLP:
    """The model as an explicit wide MLP, in float64 (Prop. 3.2, Eq. 19, Cor. 3.4). Call it in eval mode.

    The model's family builds it (``model.effective_mlp()``, :class:`pkmixer.models.contract.ModelFamily`)."""
    build = getattr(model, "effective_mlp", None)
    if not callable(build):
        raise TypeError(f"no effective MLP for {type(model).__name__}: it does not follow the model contract "
                        "(pkmixer.models.contract.ModelFamily)")
    return build()


# ---- the propositions on bare matrices -------------------------------------------------------------------


def bare_smixer(X: torch.Tensor, W: torch.Tensor, V: torch.Tensor, act: Callable = F.gelu) -> torch.Tensor:
    """H = φ(φ(W X) V), the S-Mixer without LayerNorm and skips (Eq. 5). X: (..., S, C)."""
    return act(act(W @ X) @ V)


def bare_smixer_vec(x: torch.Tensor, W: torch.Tensor, V: torch.Tensor, act: Callable = F.gelu) -> torch.Tensor:
    """vec(H) = φ(J_cᵀ (I_S ⊗ Vᵀ) φ(J_c (I_C ⊗ W) vec(X))) (Prop. 3.2, Eq. 10). x: (B, S·C)."""
    S, C = W.shape[0], V.shape[0]
    Jc = commutation_matrix(S, C, x.dtype)
    inner = act(torch.sparse.mm(spmm(Jc, kron_identity(C, W)), x.t()))
    return act(torch.sparse.mm(spmm(Jc.t(), kron_identity(S, V.t())), inner)).t()


def mixer_monarch_factors(W: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(L, R, M) with L = I_S ⊗ Vᵀ, R = I_C ⊗ W, M = J_cᵀ L J_c R, so φ(W X V) = φ(M vec X) (Cor. 3.4)."""
    S, C = W.shape[0], V.shape[0]
    L, R = kron_identity(S, V.t()), kron_identity(C, W)
    Jc = commutation_matrix(S, C, W.dtype)
    return L, R, spmm(Jc.t(), L, Jc, R)
