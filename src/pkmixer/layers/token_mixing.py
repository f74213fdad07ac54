"""Token-mixing layers behind one signature: what ``Mixer(token_mixing=...)`` injects (timm's ``mlp_layer=Mlp``
habit), Listing 1's token mixing and the token-mixing ablations of the MLP-Mixer supplementary (A.1).

A factory is a small frozen object that carries its own options and builds the token mixing of one block:

    factory(mlp_layer, channels=C, in_tokens=S_in, out_tokens=S_out, hidden=D_S, act_layer=φ, drop=p,
            perms=(J₁, J₂) or None, generator=g)  ->  a PK layer (pkmixer.models.contract.PKLayer)

``mlp_layer`` is the block's mixing MLP class (:class:`~pkmixer.layers.mlp.Mlp` or
:class:`~pkmixer.layers.mlp.FcAct`, one signature); ``perms`` is ``None`` for Listing 1's J₁ = J₂ = J_c and
``("random", "random")`` in an RP block (Hayase & Karakida S.13).

* :class:`TiedTokens` - Listing 1: one token MLP shared by the C channels, I_C ⊗ W.
* :class:`UntiedTokens` - supp. A.1 "untying": C separate MLPs with independent weights, blockdiag(W⁽¹⁾, …).
* :class:`GroupedTokens` - supp. A.1 grouped channels: the token MLP reads G neighbouring channels at once,
  (S·G)×(C/G); ``views=True`` reads G trainable views R^C -> R^{C/G} instead; ``untied=True`` gives each of
  the C/G groups its own MLP. ``GroupedTokens(1, views=True)`` is the single C×C view control.

Each factory also says what the model around it needs: ``groups`` (G, so the token MLP is S·G wide and
D_S = γ·S·G), ``permutable`` (whether it may sit in an RP block: grouping regroups neighbouring channels,
which a random J₁ has already scattered), and its plain spelling :meth:`options` - ``untied_tokens``,
``channel_groups``, ``group_views`` -, the keyword values that ``create_model``, configs and checkpoints use
(:func:`token_mixing_from_options` is the way back).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ConfigError, check_positive_int
from .ablations import BatchedFcAct, BatchedMlp, GroupedTokenMixing
from .mlp import FcAct, Mlp
from .pk import PKMixing

# the untied form of each mixing MLP: the same signature after the number of separate MLPs
UNTIED_LAYERS: dict[type[nn.Module], type[nn.Module]] = {Mlp: BatchedMlp, FcAct: BatchedFcAct}


def untied(mlp_layer: Callable[..., nn.Module], n: int) -> Callable[..., nn.Module]:
    """``mlp_layer`` as n separate MLPs behind the same ``(in, hidden, out, act_layer, drop)`` signature."""
    if mlp_layer not in UNTIED_LAYERS:
        raise ConfigError(f"no untied form of {getattr(mlp_layer, '__name__', mlp_layer)!r}; "
                          f"known: {', '.join(c.__name__ for c in UNTIED_LAYERS)}")
    return partial(UNTIED_LAYERS[mlp_layer], n)


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


class TokenMixingFactory:
    """The one signature of the token-mixing factories (see the module docstring)."""

    groups: int = 1  # G: the token MLP reads S·G inputs
    permutable: ClassVar[bool] = True  # may sit in an RP block (random J₁, J₂)

    def __call__(self, mlp_layer: Callable[..., nn.Module], *, channels: int, in_tokens: int, out_tokens: int,
                 hidden: int | None, act_layer: Callable[[], nn.Module], drop: float,
                 perms: tuple[str, str] | None, generator: torch.Generator | None) -> nn.Module:
        raise NotImplementedError

    def check(self, channels: int) -> None:
        """ConfigError where the factory cannot build for C = ``channels``."""

    def options(self) -> dict[str, Any]:
        """The plain spelling (``create_model``'s keywords, as checkpoints record them)."""
        raise NotImplementedError

    @property
    def ablations(self) -> tuple[str, ...]:
        """The supp. A.1 options in use, by their plain names (empty for Listing 1's token mixing)."""
        opts = self.options()
        used = [("untied_tokens", opts["untied_tokens"]), ("channel_groups", opts["channel_groups"] > 1),
                ("group_views", opts["group_views"])]
        return tuple(name for name, on in used if on)


@dataclass(frozen=True)
class TiedTokens(TokenMixingFactory):
    """Listing 1's token mixing: one MLP on every channel's S tokens, PK_W with J₁ = J₂ = J_c (I_C ⊗ W)."""

    def __call__(self, mlp_layer, *, channels, in_tokens, out_tokens, hidden, act_layer, drop, perms, generator):
        mlp = mlp_layer(in_tokens, hidden, out_tokens, act_layer, drop)
        return PKMixing(mlp, "token", channels, in_tokens, out_tokens, perms=perms, generator=generator)

    def options(self) -> dict[str, Any]:
        return {"untied_tokens": False, "channel_groups": 1, "group_views": False}


@dataclass(frozen=True)
class UntiedTokens(TokenMixingFactory):
    """C separate token MLPs (supp. A.1, "untying"): column c of X meets MLP c; blockdiag(W⁽¹⁾, …, W⁽ᶜ⁾).
    Works in RP blocks: the random J₁, J₂ act around the C MLPs as in any PK layer."""

    def __call__(self, mlp_layer, *, channels, in_tokens, out_tokens, hidden, act_layer, drop, perms, generator):
        mlp = untied(mlp_layer, channels)(in_tokens, hidden, out_tokens, act_layer, drop)
        return PKMixing(mlp, "token", channels, in_tokens, out_tokens, perms=perms, generator=generator)

    def options(self) -> dict[str, Any]:
        return {"untied_tokens": True, "channel_groups": 1, "group_views": False}


@dataclass(frozen=True)
class GroupedTokens(TokenMixingFactory):
    """Token MLPs on G neighbouring channels stacked, (S·G)×(C/G) (supp. A.1, "grouping the channels"), or on G
    trainable views of the channels (``views=True``); ``untied=True``: one MLP per group. Builds a
    :class:`~pkmixer.layers.ablations.GroupedTokenMixing` (its docstring has the conventions)."""

    groups: int = 1
    views: bool = False
    untied: bool = False
    permutable: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_positive_int("channel_groups", self.groups)
        _check_flag("group_views", self.views)
        _check_flag("untied_tokens", self.untied)

    def __call__(self, mlp_layer, *, channels, in_tokens, out_tokens, hidden, act_layer, drop, perms, generator):
        if perms is not None:
            raise ConfigError("grouped token mixing cannot sit in an RP block")  # Mixer refuses it first
        G = self.groups
        layer = untied(mlp_layer, channels // G) if self.untied else mlp_layer  # untied: one MLP per group
        mlp = layer(in_tokens * G, hidden, out_tokens * G, act_layer, drop)
        return GroupedTokenMixing(mlp, channels, G, in_tokens, out_tokens, views=self.views)

    def check(self, channels: int) -> None:
        if channels % self.groups:
            raise ConfigError(f"channel_groups G={self.groups} must divide embed_dim C={channels}")

    def options(self) -> dict[str, Any]:
        return {"untied_tokens": self.untied, "channel_groups": self.groups, "group_views": self.views}


def token_mixing_from_options(untied_tokens: bool = False, channel_groups: int = 1, group_views: bool = False
                              ) -> TokenMixingFactory:
    """The factory of a plain spelling: ``GroupedTokens`` where channels are grouped or viewed, else
    ``UntiedTokens`` or ``TiedTokens`` (the inverse of :meth:`TokenMixingFactory.options`)."""
    untied_ = _check_flag("untied_tokens", untied_tokens)
    views = _check_flag("group_views", group_views)
    if check_positive_int("channel_groups", channel_groups) > 1 or views:
        return GroupedTokens(channel_groups, views=views, untied=untied_)
    return UntiedTokens() if untied_ else TiedTokens()
