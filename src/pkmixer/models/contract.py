"""The model contract: what a model family and its layers declare, so that the theory and the analysis never ask
which class they hold (docs/architecture.md, "The model contract").

A **model family** (:class:`ModelFamily`) is an ``nn.Module`` that takes images (B, in_chans, img_size, img_size)
and provides

* ``forward_features`` / ``forward_head`` and the intermediate-features API ``feature_names(where)`` /
  ``forward_intermediates(x, indices, where=..., norm=..., intermediates_only=...)`` (timm's convention, see
  :mod:`pkmixer.models.features`); :mod:`pkmixer.analysis.cka` reads features only through it (mini-batch CKA
  at the "mixing" points, Hayase & Karakida Sec. 3.4, App. C.1, Fig. 2);
* ``info()``: a :class:`~pkmixer.models.info.ModelInfo`, the effective-MLP view of its size: width m, Ω
  connections per hidden layer and density (Hayase & Karakida Eqs. 13-15, Sec. 4.1);
* ``effective_mlp()``: the same network as an explicit wide MLP whose hidden linear maps are sparse float64
  matrices on vec coordinates (:class:`~pkmixer.theory.effective.EffectiveMLP`; Prop. 3.2, Eq. 19, Cor. 3.4),
  named as ``info().mixing_layers`` counts them;
* ``rows_per_image()``: how many vectors per image each of its own matrix-product modules runs on, for those
  that run on more than one - a per-patch stem runs once per patch (Tolstikhin et al. 2021, S.1); this and
  the layers' declarations below give the analytic cost (:mod:`pkmixer.analysis.cost`, Hayase & Karakida
  App. D.9, Table S.3).

and optionally, for weight pictures (:mod:`pkmixer.analysis.visualize`, Mixer supp. D):

* ``patch_unit_weights()``: the per-patch projection, a (C, in_chans, P, P) tensor (supp. Fig. 2);
* ``token_unit_weights(block)``: the first token-mixing Dense of ``blocks[block]``, (D_S, S), each row an
  S-pixel image in raster order (supp. Fig. 1); it raises :class:`~pkmixer.errors.ConfigError` when the block's
  units are not images;
* ``display_name()``: the label of cost tables (default: the class name).

A **layer** declares itself the same way, so that a new layer needs no change to the analysis either:

* a module that multiplies matrices declares ``matmul_cost() -> (kind, in_features, out_features,
  macs_per_row)``: MACs per input vector, counted once per row the enclosing modules declare
  (:func:`layer_cost`). PyTorch's own ``nn.Linear`` and ``nn.Conv2d`` are registered here
  (:func:`layer_cost` is a :func:`functools.singledispatch`; ``layer_cost.register(cls)`` adds other foreign
  classes);
* a container whose sub-modules run on several vectors per image declares ``rows_per_image()
  -> {module: rows}``; a PK layer's mixing MLP runs once per Kronecker block, ``other`` rows (Def. 5.1);
* a linear layer with an explicit matrix declares ``dense_weight()`` (M ⊙ W, V ⊗ W, J_cᵀ L J_c R), read by
  :func:`dense_weight` (``nn.Linear`` registered here);
* a mixing MLP declares ``linear_steps() -> [(Dense, activation or None), ...]``, the order the effective MLP
  applies them in (:class:`MixingMlp`);
* a PK layer PK_W(X; J₁, J₂) = J₂ (I ⊗ W) J₁ vec(X) (Hayase & Karakida Def. 5.1, Eq. 19) is a
  :class:`PKLayer`: ``axis``, ``perms``, ``permuted``, ``other`` (Kronecker blocks), ``in_features``,
  ``out_features``, ``mlp``, ``gather_indices()`` (J₁, J₂ on row-major storage) and ``input_maps()``
  (per-token channel maps applied before J₁, e.g. the G views of Mixer supp. A.1);
* ``META_FORWARD``: how :mod:`pkmixer.analysis.cost` runs a model built on the meta device that holds this
  layer: ``"to_meta"`` (it keeps CPU tensors, e.g. a mask: copy the model to meta) or ``"cpu_zeros"`` (it
  cannot run on meta, e.g. a sparse product: run a copy on the CPU with zeros); absent: run as it is.

Every check here is structural (``typing.Protocol``): a family needs no base class and no registration beyond
its entry in :mod:`pkmixer.models.registry`.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import singledispatch
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..theory.effective import EffectiveMLP
    from .info import ModelInfo


@runtime_checkable
class ModelFamily(Protocol):
    """What every model family provides; see the module docstring."""

    img_size: int
    in_chans: int
    num_classes: int

    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor: ...

    def feature_names(self, where: str = "block") -> list[str]: ...

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, *,
                              where: str = "block", norm: bool = False, intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]: ...

    def info(self) -> ModelInfo: ...

    def effective_mlp(self) -> EffectiveMLP: ...

    def rows_per_image(self) -> dict[nn.Module, int]: ...


@runtime_checkable
class HasIntermediates(Protocol):
    """The part of the contract that CKA needs: the intermediate-features API."""

    def feature_names(self, where: str = "block") -> list[str]: ...

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, *,
                              where: str = "block", norm: bool = False, intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]: ...


@runtime_checkable
class PatchUnits(Protocol):
    def patch_unit_weights(self) -> torch.Tensor: ...


@runtime_checkable
class TokenUnits(Protocol):
    def token_unit_weights(self, block: int) -> torch.Tensor: ...


@runtime_checkable
class MixingMlp(Protocol):
    """A mixing MLP (:mod:`pkmixer.layers.mlp`, :mod:`pkmixer.layers.ablations`): Dense maps with ``weight``
    (out, in) - or (n, out, in) when untied - and ``bias``, each followed by its activation or none."""

    def linears(self) -> list[nn.Module]: ...

    def linear_steps(self) -> list[tuple[nn.Module, nn.Module | None]]: ...


@runtime_checkable
class PKLayer(Protocol):
    """A permuted-Kronecker mixing layer (Def. 5.1): :class:`~pkmixer.layers.pk.PKMixing` and the grouped token
    mixing of Mixer supp. A.1 (:class:`~pkmixer.layers.ablations.GroupedTokenMixing`)."""

    axis: str  # "token" or "channel"
    perms: tuple[str, str]  # the kinds of J₁, J₂
    other: int  # Kronecker blocks n of I_n ⊗ W
    in_features: int
    out_features: int
    mlp: nn.Module

    @property
    def permuted(self) -> bool: ...

    def gather_indices(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def input_maps(self) -> list[nn.Module]: ...

    def rows_per_image(self) -> dict[nn.Module, int]: ...


def require(model: object, what: str, protocol: type = ModelFamily, label: str | None = None) -> Any:
    """``model`` if it follows ``protocol``, else a :class:`ConfigError` saying that ``what`` needs it and what
    ``model`` (called ``label`` in the message, if given) lacks."""
    if not isinstance(model, protocol):
        missing = [name for name in _members(protocol) if not hasattr(model, name)]
        name = type(model).__name__ if label is None else f"{label} ({type(model).__name__})"
        raise ConfigError(f"{what} supports only models that follow the pkmixer model contract "
                          f"(pkmixer.models.contract.{protocol.__name__}); {name} lacks "
                          f"{', '.join(missing) or 'some of it'}")
    return model


def _members(protocol: type) -> list[str]:
    names = getattr(protocol, "__protocol_attrs__", None)  # Python >= 3.12
    if names is None:
        names = {n for n in vars(protocol) if not n.startswith("_")} | set(getattr(protocol, "__annotations__", {}))
    return sorted(names)


def display_name(model: nn.Module) -> str:
    """``model.display_name()`` where the family defines it, else the class name."""
    label = getattr(model, "display_name", None)
    return label() if callable(label) else type(model).__name__


# ---- cost declarations -----------------------------------------------------------------------------------------


class MatmulCost(NamedTuple):
    """One matrix product or convolution of a forward pass: ``rows`` vectors per image, ``macs`` in all."""

    kind: str  # conv, linear, sparse, masked, kronecker, monarch, ...
    rows: int
    in_features: int
    out_features: int
    macs: int


def rows_per_image(module: nn.Module) -> dict[nn.Module, int]:
    """The rows a module declares for its sub-modules (empty when it declares none)."""
    declare = getattr(module, "rows_per_image", None)
    return dict(declare()) if callable(declare) else {}


@singledispatch
def layer_cost(module: nn.Module, rows: int | None) -> MatmulCost | None:
    """MACs per image of one module that multiplies matrices, run on ``rows`` vectors per image (None: not
    declared by any enclosing module, i.e. one). None for a module that does no matrix product of its own."""
    declare = getattr(module, "matmul_cost", None)
    if not callable(declare):
        return None
    kind, n_in, n_out, per_row = declare()
    n = 1 if rows is None else rows
    return MatmulCost(kind, n, n_in, n_out, n * per_row)


@layer_cost.register
def _(module: nn.Linear, rows: int | None) -> MatmulCost:
    n = 1 if rows is None else rows
    n_in, n_out = module.in_features, module.out_features
    return MatmulCost("linear", n, n_in, n_out, n * n_in * n_out)


@layer_cost.register
def _(module: nn.Conv2d, rows: int | None) -> MatmulCost:
    """A convolution runs once per output position: the model declares them (a per-patch stem: S₀)."""
    if rows is None:
        raise ConfigError(f"a {type(module).__name__} runs once per output position: its model must declare them "
                          "in rows_per_image() (pkmixer.models.contract)")
    fan_in = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
    return MatmulCost("conv", rows, fan_in, module.out_channels, rows * fan_in * module.out_channels)


def meta_forward(module: nn.Module) -> str | None:
    """The layer's ``META_FORWARD`` declaration (see the module docstring), None when it has none."""
    return getattr(module, "META_FORWARD", None)


# ---- explicit matrices -------------------------------------------------------------------------------------------


@singledispatch
def dense_weight(layer: nn.Module) -> torch.Tensor:
    """The dense (out, in) matrix of a linear layer: its ``dense_weight()`` (M ⊙ W, V ⊗ W, J_cᵀ L J_c R)."""
    declare = getattr(layer, "dense_weight", None)
    if not callable(declare):
        raise TypeError(f"no effective form for {type(layer).__name__}: it declares no dense_weight() "
                        "(pkmixer.models.contract)")
    return declare().detach()


@dense_weight.register
def _(layer: nn.Linear) -> torch.Tensor:
    return layer.weight.detach()


def linear_steps(mlp: nn.Module) -> list[tuple[nn.Module, nn.Module | None]]:
    """The (Dense, activation or None) steps of a mixing MLP (:class:`MixingMlp`)."""
    if not isinstance(mlp, MixingMlp):
        raise TypeError(f"no effective form for mixing MLP {type(mlp).__name__}: it declares no linear_steps() "
                        "(pkmixer.models.contract)")
    return mlp.linear_steps()
