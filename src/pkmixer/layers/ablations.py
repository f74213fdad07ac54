"""The token-mixing ablations of the MLP-Mixer supplementary (Tolstikhin et al. 2021, supp. A.1).

* Untied token mixing ("C separate MLPs with independent weights"): :class:`BatchedLinear` holds n independent
  Dense maps as one (n, out, in) weight and runs them as one batched matmul; :class:`BatchedMlp` and
  :class:`BatchedFcAct` are :class:`~pkmixer.layers.mlp.Mlp` and :class:`~pkmixer.layers.mlp.FcAct` with such
  maps, taking ``n`` first and then the shared ``(in, hidden, out, act_layer, drop)`` signature. Inside a token
  :class:`~pkmixer.layers.pk.PKMixing` (n = C) row c of the (B, C, S) input meets MLP c: the effective weight
  is blockdiag(W⁽¹⁾, ..., W⁽ᶜ⁾) instead of I_C ⊗ W.
* Grouped channels and G views: :class:`GroupedTokenMixing`.

Grouping convention. Channel group k (k < C/G) holds the G neighbouring channels kG, ..., kG + G - 1, and
its token-MLP input is their columns of X ∈ R^{S×C} stacked, channel by channel:

    X_G[g·S + i, k] = X[i, kG + g]      (X_G ∈ R^{(S·G)×(C/G)}),

the column-major reshape of X, so vec(X_G) = vec(X): in the paper's vec coordinates grouping moves nothing,
and the effective weight of grouped token mixing is I_{C/G} ⊗ W_G with W_G ∈ R^{D_S×S·G}. The output
Y_G ∈ R^{(S'·G)×(C/G)} returns to Y ∈ R^{S'×C} by the inverse reshape, Y[i, kG + g] = Y_G[g·S' + i, k].

Views. The G trainable maps R^C → R^{C/G} are one bias-free Linear(C, C) with weight A: view g of a token x
is (A x)[g::G], i.e. rows g, g + G, ... of A. With that assignment of A's rows to views (any other is the same
model up to relabelling A's rows), the matrix of views "concatenated for each of the C/G features" is the
grouping above applied to X Aᵀ, so views mixing = grouped mixing ∘ (per-token Linear A); its effective weights
are A ⊗ I_S followed by I_{C/G} ⊗ W_G. The seed does not say how the (S'·G)×(C/G) output returns to S'×C: it
is reshaped back as grouped mixing does (output channel kG + g is the mixed view g of feature k); there is no
map back through A.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from timm.layers import lecun_normal_
from torch import nn

from .pk import inverse_permutation


class BatchedLinear(nn.Module):
    """n independent Dense maps: (..., n, in) -> (..., n, out), row j through weight[j] (out, in) and bias[j]."""

    decayed_parameters = ("weight",)  # not the (n, out) bias: weight decay by role (pkmixer.layers.decay)

    def __init__(self, n: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.n, self.in_features, self.out_features = n, in_features, out_features
        self.weight = nn.Parameter(torch.empty(n, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(n, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Flax's Dense default per map (Listing 1): LeCun normal with fan-in ``in_features``, zero bias."""
        lecun_normal_(self.weight.view(-1, self.in_features))
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., n, in) -> (..., n, out)
        rows = x.reshape(-1, self.n, self.in_features).transpose(0, 1)  # (n, batch, in)
        y = torch.baddbmm(self.bias[:, None, :], rows, self.weight.transpose(1, 2))  # (n, batch, out)
        return y.transpose(0, 1).unflatten(0, x.shape[:-2])

    def extra_repr(self) -> str:
        return f"n={self.n}, in_features={self.in_features}, out_features={self.out_features}"

    def matmul_cost(self) -> tuple[str, int, int, int]:
        """One Dense per row: each of the n rows an enclosing mixing declares meets its own map (contract)."""
        return "linear", self.in_features, self.out_features, self.in_features * self.out_features


class BatchedMlp(nn.Module):
    """n separate MLPs x -> fc2(drop(act(fc1(x)))) on (..., n, in), the untied form of :class:`Mlp`."""

    def __init__(self, n: int, in_features: int, hidden_features: int | None, out_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        if hidden_features is None:
            raise ValueError("BatchedMlp needs hidden_features")
        self.fc1 = BatchedLinear(n, in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = BatchedLinear(n, hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., n, in) -> (..., n, out)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def linears(self) -> list[BatchedLinear]:
        return [self.fc1, self.fc2]

    def linear_steps(self) -> list[tuple[BatchedLinear, nn.Module | None]]:
        return [(self.fc1, self.act), (self.fc2, None)]


class BatchedFcAct(nn.Module):
    """n separate single-layer mixings x -> drop(act(fc(x))) on (..., n, in), the untied form of :class:`FcAct`."""

    def __init__(self, n: int, in_features: int, hidden_features: int | None, out_features: int,
                 act_layer: Callable[[], nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        if hidden_features is not None:
            raise ValueError("BatchedFcAct has no hidden layer; pass hidden_features=None")
        self.fc = BatchedLinear(n, in_features, out_features)
        self.act = act_layer()
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., n, in) -> (..., n, out)
        return self.drop(self.act(self.fc(x)))

    def linears(self) -> list[BatchedLinear]:
        return [self.fc]

    def linear_steps(self) -> list[tuple[BatchedLinear, nn.Module | None]]:
        return [(self.fc, self.act)]


def group_index(tokens: int, channels: int, groups: int) -> torch.Tensor:
    """Gather index from the row-major storage of a (tokens, channels) map to the row-major storage of X_Gᵀ, the
    (C/G, tokens·G) rows the token MLP reads (the module docstring's convention)."""
    return torch.arange(tokens * channels, device="cpu").view(tokens, channels // groups, groups).permute(1, 2, 0) \
        .reshape(-1)


class GroupedTokenMixing(nn.Module):
    """Token mixing of (S·G)-vectors, each G neighbouring channels stacked (supp. A.1, "grouping the channels"),
    optionally of G trainable views of the channels (``views=True``); see the module docstring.

    ``mlp`` maps ``in_tokens·G`` to ``out_tokens·G`` features on the last axis and is applied to the C/G groups
    (a :class:`BatchedMlp` with n = C/G unties them). Maps (B, in_tokens, C) -> (B, out_tokens, C). It is a PK
    layer (Def. 5.1) with fixed J₁, J₂ (:meth:`gather_indices`) and ``other = C/G`` Kronecker blocks, and it
    follows :class:`pkmixer.models.contract.PKLayer` as :class:`~pkmixer.layers.pk.PKMixing` does; the views
    are its :meth:`input_maps`.
    """

    # the PKLayer contract (pkmixer.models.contract): token mixing, fixed grouping gathers, nothing random
    axis = "token"
    perms = ("grouped", "grouped")
    permuted = False

    def __init__(self, mlp: nn.Module, channels: int, groups: int, in_tokens: int, out_tokens: int,
                 views: bool = False) -> None:
        super().__init__()
        if channels % groups:
            raise ValueError(f"groups {groups} must divide channels {channels}")
        self.mlp = mlp
        self.channels, self.groups = channels, groups
        self.in_tokens, self.out_tokens = in_tokens, out_tokens
        self.other = channels // groups
        self.in_features, self.out_features = in_tokens * groups, out_tokens * groups
        self.views = nn.Linear(channels, channels, bias=False) if views else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S_in, C) -> (B, S_out, C)
        B, S, C = x.shape
        G = self.groups
        if self.views is not None:
            x = self.views(x)  # (B, S_in, C); view g of token i is x[:, i, g::G]
        y = x.reshape(B, S, C // G, G).permute(0, 2, 3, 1).reshape(B, C // G, G * S)  # X_Gᵀ: (B, C/G, G·S_in)
        y = self.mlp(y)  # (B, C/G, G·S_out)
        return y.reshape(B, C // G, G, self.out_tokens).permute(0, 3, 1, 2).reshape(B, self.out_tokens, C)

    def gather_indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(J₁, J₂) as gather indices on flat row-major storage, as :meth:`PKMixing.gather_indices`: J₁ maps the
        (S_in, C) input (after the views) to the (C/G, G·S_in) rows, J₂ the (C/G, G·S_out) rows to (S_out, C)."""
        return (group_index(self.in_tokens, self.channels, self.groups),
                inverse_permutation(group_index(self.out_tokens, self.channels, self.groups)))

    def input_maps(self) -> list[nn.Linear]:
        """The per-token channel maps applied before J₁: the views A (PKLayer contract), or none."""
        return [] if self.views is None else [self.views]

    def rows_per_image(self) -> dict[nn.Module, int]:
        """The MLP runs once per group (C/G rows, untied or not), the views once per input token."""
        rows = {m: self.other for m in self.mlp.modules()}
        if self.views is not None:
            rows[self.views] = self.in_tokens
        return rows

    def extra_repr(self) -> str:
        return (f"groups={self.groups}, blocks={self.other}, in={self.in_features}, out={self.out_features}, "
                f"views={self.views is not None}")
