"""The Mixer family: MLP-Mixer, S-Mixer and their random-permuted (RP) versions in one model class.

* MLP-Mixer exactly as Listing 1 of the Mixer supplementary (Tolstikhin et al. 2021): per-patch stem,
  blocks of LayerNorm + token-mixing MLP + skip and LayerNorm + channel-mixing MLP + skip, pre-head
  LayerNorm, mean pooling over tokens, zero-initialised head; Flax default (LeCun normal) initialisation.
  φ is the exact GELU by default (as timm); ``act="gelu_tanh"`` is Flax's ``nn.gelu``, the tanh approximation
  that Listing 1 (and so Google's checkpoints) uses.
* S-Mixer (Hayase & Karakida Eq. 5, S.7-S.8): ``block="fc"`` makes each mixing a single Dense + activation.
* Tokens S independent of the patch grid S₀ (App. A.2.4): ``num_tokens=S`` makes the first token mixing map
  S₀ -> S with the skip SkipLayer(X) = LN(W̃ X), W̃ ∈ R^{S×S₀}; the paper uses it even when S = S₀.
* RP Mixers (Sec. 5.2, S.13): ``rp_blocks`` names the blocks whose token and channel mixing are PK layers
  with frozen uniformly random J₁, J₂ drawn from ``structure_seed``; ``"all"`` for an RP Mixer, a list of
  block indices for Fig. S.4.

* The token-mixing ablations of the Mixer supplementary, A.1, are injected rather than switched on:
  ``token_mixing=`` takes a factory of :mod:`pkmixer.layers.token_mixing` (``TiedTokens()``, Listing 1's and
  the default; ``UntiedTokens()``, C separate token MLPs; ``GroupedTokens(G, views=..., untied=...)``, token
  MLPs on G neighbouring channels, (S·G)×(C/G), or on G trainable views R^C -> R^{C/G}), each carrying its
  own options; ``num_tokens=Pyramid(S_1, ..., S_L)`` is a pyramid (S per block: the token mixing of a block
  maps S_in -> S_out and its skip becomes LN(W̃ X) whenever S changes).
* ``create_model`` (and so configs and checkpoints) also speaks the plain spelling of those arguments,
  :data:`PLAIN_OPTIONS` (``untied_tokens``, ``channel_groups``, ``group_views``, ``token_schedule``):
  :func:`from_plain_options` turns them into ``token_mixing`` / ``num_tokens``, :func:`to_plain_options` back.

Hidden widths: ``mlp_ratio=γ`` (or a (γ_token, γ_channel) pair) gives D_S = γS and D_C = γC as in Hayase &
Karakida; ``token_hidden`` / ``channel_hidden`` set D_S, D_C directly, as Table 1 of Tolstikhin et al. does.
With channel groups the token MLP's input is S·G wide and D_S = γ·S·G; in a pyramid S is each block's output
token count.

The class follows the model contract (:mod:`pkmixer.models.contract`): its effective wide MLP
(:meth:`Mixer.effective_mlp`, Prop. 3.2, Eq. 19), the rows of its stem, and its token-mixing and per-patch
units to draw (Mixer supp. D).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from timm.layers import DropPath, lecun_normal_
from torch import nn

from ..errors import ConfigError, check_positive, check_positive_int, check_rate
from ..layers.ablations import BatchedLinear, GroupedTokenMixing
from ..layers.mlp import FcAct, Mlp
from ..layers.pk import PKMixing
from ..layers.token_mixing import TiedTokens, TokenMixingFactory, token_mixing_from_options
from .features import check_where, select_indices
from .info import ModelInfo
from .timm_api import TimmModel

if TYPE_CHECKING:
    from ..theory.effective import EffectiveMLP

BLOCK_KINDS = {"mlp": Mlp, "fc": FcAct}
RP = ("random", "random")
# φ by name. "gelu" is the exact GELU x·Φ(x) (timm, torch's default); "gelu_tanh" is the tanh approximation
# 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))), Flax's nn.gelu and so Listing 1's (and Google's checkpoints').
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU, "gelu_tanh": partial(nn.GELU, approximate="tanh"), "relu": nn.ReLU, "identity": nn.Identity}


def tiled_token_order(grid: int, tiles: int) -> torch.Tensor:
    """Gather index over a grid×grid raster of tokens that lists the tokens of each of the tiles×tiles spatial
    parts as one contiguous run (parts in raster order, tokens within a part in raster order; Mixer supp. C).
    It is itself a permutation in the PK sense."""
    part = grid // tiles
    rows = torch.arange(grid, device="cpu").view(tiles, part)  # (part row, row within part)
    idx = rows[:, None, :, None] * grid + rows[None, :, None, :]  # (pr, pc, r, c) -> raster index
    return idx.reshape(-1)


class TokenProjectionSkip(nn.Module):
    """SkipLayer(X) = LN(W̃ X), W̃ ∈ R^{S×S₀} (App. A.2.4, S.15): the skip of a first block that changes S."""

    def __init__(self, in_tokens: int, out_tokens: int, dim: int, eps: float) -> None:
        super().__init__()
        self.proj = nn.Linear(in_tokens, out_tokens, bias=False)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S0, C) -> (B, S, C)
        return self.norm(self.proj(x.transpose(1, 2)).transpose(1, 2))

    def rows_per_image(self) -> dict[nn.Module, int]:
        """W̃ mixes tokens: it runs once per channel (contract, pkmixer.models.contract)."""
        return {self.proj: self.norm.normalized_shape[0]}

    def effective_map(self, channels: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """SkipLayer(X) = LN(W̃ X) on vec coordinates: vec(W̃ X) = (I_C ⊗ W̃) vec(X) (S.15), in float64."""
        from ..theory.effective import EffectiveLinear, kron_identity, vec_layer_norm

        proj = EffectiveLinear("skip", kron_identity(channels, self.proj.weight.double()), None)
        norm = vec_layer_norm(self.norm, self.proj.out_features, channels)
        return lambda x: norm(proj(x))


class MixingSublayer(nn.Module):
    """x -> skip(x) + drop_path(mixing(LN(x))) (Eqs. 3-4, S.5-S.8, S.14)."""

    def __init__(self, norm: nn.Module, mixing: PKMixing, drop_path: float, skip: nn.Module | None = None):
        super().__init__()
        self.norm = norm
        self.mixing = mixing
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.skip = skip

    def forward_branch(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(new x, mixing output before the skip addition)."""
        branch = self.mixing(self.norm(x))
        shortcut = x if self.skip is None else self.skip(x)
        return shortcut + self.drop_path(branch), branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_branch(x)[0]


class MixerBlock(nn.Module):
    """Token mixing then channel mixing, each a residual sublayer (Eqs. 3-4)."""

    def __init__(self, token: MixingSublayer, channel: MixingSublayer) -> None:
        super().__init__()
        self.token = token
        self.channel = channel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, C) -> (B, S, C)
        return self.channel(self.token(x))


def _parse_rp_blocks(rp_blocks: str | Sequence[int] | None, depth: int) -> frozenset[int]:
    if rp_blocks is None or rp_blocks == "none":
        return frozenset()
    if rp_blocks == "all":
        return frozenset(range(depth))
    if isinstance(rp_blocks, str):
        raise ConfigError(f"rp_blocks must be 'all', 'none' or a list of block indices, got {rp_blocks!r}")
    chosen = set()
    for i in rp_blocks:
        if isinstance(i, bool) or not isinstance(i, int) or not -depth <= i < depth:
            raise ConfigError(f"rp_blocks entry {i!r} is not a block index in [0, {depth})")
        chosen.add(i % depth)
    return frozenset(chosen)


def _block_shapes(mixing: PKMixing | GroupedTokenMixing) -> list[tuple[int, int, int]]:
    """(blocks n, in, out) of each linear map of a mixing layer's effective MLP (its PKLayer contract,
    pkmixer.models.contract): its weight is block diagonal (up to the permutations) with n blocks of out×in -
    shared, or distinct when untied; n is the rows the layer declares for the map. The views of a
    :class:`GroupedTokenMixing` (its input maps) are the map A ⊗ I_S: S blocks of C×C."""
    rows = mixing.rows_per_image()
    return [(rows[lin], lin.in_features, lin.out_features) for lin in [*mixing.input_maps(), *mixing.mlp.linears()]]


@dataclass(frozen=True, init=False, repr=False)
class Pyramid:
    """S after each block's token mixing, one positive integer per block, never increasing (supp. A.1
    pyramids): ``Mixer(num_tokens=Pyramid(49, 49, 25, 16), depth=4)``. The first S may differ from the S₀
    patches. A block's skip is LN(W̃ X) (App. A.2.4) where S changes, and in block 0 also when it does not if
    ``project_first`` (what ``num_tokens=S`` always does)."""

    tokens: tuple[int, ...]
    project_first: bool = False

    def __init__(self, *tokens: int, project_first: bool = False) -> None:
        if (not tokens or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in tokens)
                or any(b > a for a, b in zip(tokens, tokens[1:]))):
            raise ConfigError(f"a Pyramid lists non-increasing positive integers, the tokens after each block's "
                              f"token mixing; got {tokens!r}")
        if not isinstance(project_first, bool):
            raise ConfigError(f"project_first must be true or false, got {project_first!r}")
        object.__setattr__(self, "tokens", tuple(tokens))
        object.__setattr__(self, "project_first", project_first)

    def __repr__(self) -> str:
        return f"Pyramid({', '.join(map(str, self.tokens))}{', project_first=True' if self.project_first else ''})"


def _token_schedule(num_tokens: int | Pyramid | None, depth: int, grid: int) -> tuple[tuple[int, ...], bool]:
    """(S after each block's token mixing, whether block 0's skip is LN(W̃ X) even where S = S₀)."""
    if num_tokens is None:
        return (grid,) * depth, False
    if isinstance(num_tokens, Pyramid):
        if len(num_tokens.tokens) != depth:
            raise ConfigError(f"{num_tokens} lists {len(num_tokens.tokens)} token counts for depth={depth} blocks")
        return num_tokens.tokens, num_tokens.project_first
    return (check_positive_int("num_tokens", num_tokens),) * depth, True


# ---- the plain spelling of the injected arguments (create_model, configs, checkpoints) -----------------------
PLAIN_OPTIONS = ("untied_tokens", "channel_groups", "group_views", "token_schedule")
_MIXING_OPTIONS = PLAIN_OPTIONS[:3]


def from_plain_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Mixer arguments from ``create_model``'s: the plain options (:data:`PLAIN_OPTIONS`, the keywords of
    Mixer's earlier signature, which checkpoints and configs record) update ``token_mixing`` and ``num_tokens``.

    ``untied_tokens``, ``channel_groups``, ``group_views`` replace those options of the given (or default)
    factory, so ``channel_groups=2`` on ``mixer_views_t4_28`` keeps its views. ``token_schedule=[S_1, …]``
    becomes ``num_tokens=Pyramid(S_1, …)``; with an integer ``num_tokens`` it must start at that S and keeps
    block 0's App. A.2.4 skip (``project_first``); ``token_schedule=None`` drops a Pyramid.
    """
    out = dict(kwargs)
    plain = {k: out.pop(k) for k in PLAIN_OPTIONS if k in out}
    if any(k in plain for k in _MIXING_OPTIONS):
        mixing = out.get("token_mixing", TiedTokens())
        if not isinstance(mixing, TokenMixingFactory):
            raise ConfigError(f"token_mixing must be a token-mixing factory (pkmixer.layers.token_mixing), "
                              f"got {mixing!r}")
        options = {**mixing.options(), **{k: plain[k] for k in _MIXING_OPTIONS if k in plain}}
        out["token_mixing"] = token_mixing_from_options(**options)
    if "token_schedule" in plain:
        schedule, num_tokens = plain["token_schedule"], out.get("num_tokens")
        if schedule is None:
            if isinstance(num_tokens, Pyramid):
                out["num_tokens"] = None
            return out
        depth = out.get("depth", 8)
        entries = list(schedule) if isinstance(schedule, Sequence) and not isinstance(schedule, str) else []
        project_first = num_tokens is not None and not isinstance(num_tokens, Pyramid)
        try:  # Pyramid checks the entries; the message names the plain option the user wrote
            if len(entries) != depth:
                raise ConfigError("")
            pyramid = Pyramid(*entries, project_first=project_first)
        except ConfigError:
            raise ConfigError(f"token_schedule must list depth={depth} non-increasing positive integers, the "
                              f"tokens after each block's token mixing, got {schedule!r}") from None
        if project_first and entries[0] != num_tokens:
            raise ConfigError(f"token_schedule starts at {entries[0]} tokens but num_tokens is {num_tokens}: "
                              "the first entry is the first block's S")
        out["num_tokens"] = pyramid
    return out


def to_plain_options(overrides: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`from_plain_options` on ``create_model`` overrides, so that ``model.spec`` and the
    checkpoints that record it hold plain values: a factory as its :meth:`~TokenMixingFactory.options`, a
    Pyramid as ``token_schedule`` (and ``num_tokens``, its first S where ``project_first``, else None)."""
    out = dict(overrides)
    mixing = out.get("token_mixing")
    if isinstance(mixing, TokenMixingFactory):
        del out["token_mixing"]
        out.update(mixing.options())
    num_tokens = out.get("num_tokens")
    if isinstance(num_tokens, Pyramid):
        out["num_tokens"] = num_tokens.tokens[0] if num_tokens.project_first else None
        out["token_schedule"] = num_tokens.tokens
    return out


def _ratio_pair(mlp_ratio: float | Sequence[float]) -> tuple[float, float]:
    pair = (mlp_ratio, mlp_ratio) if isinstance(mlp_ratio, (int, float)) else tuple(mlp_ratio)
    if len(pair) != 2:
        raise ConfigError(f"mlp_ratio must be a number or a (token, channel) pair, got {mlp_ratio!r}")
    return check_positive("mlp_ratio", pair[0]), check_positive("mlp_ratio", pair[1])


class Mixer(TimmModel, nn.Module):
    """MLP-Mixer (``block="mlp"``) or S-Mixer (``block="fc"``), normal or RP; see the module docstring."""

    global_pool = "avg"  # timm's name of the head's pooling: the mean over tokens
    # the plain spelling that create_model accepts besides the arguments (and records in model.spec, so in
    # checkpoints): the keywords of the earlier signature, translated into token_mixing / num_tokens
    PLAIN_OPTIONS = PLAIN_OPTIONS
    from_plain_options = staticmethod(from_plain_options)
    to_plain_options = staticmethod(to_plain_options)

    @property
    def num_features(self) -> int:
        """Width of the pooled features the head reads (timm's convention): C."""
        return self.embed_dim

    def __init__(
        self,
        *,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 512,  # C
        depth: int = 8,  # number of blocks (each: token mixing + channel mixing)
        num_tokens: int | Pyramid | None = None,  # S (App. A.2.4 skip in block 0); None: S = S0; or a Pyramid
        block: str = "mlp",  # "mlp": MLP-Mixer; "fc": S-Mixer
        mlp_ratio: float | Sequence[float] | None = None,  # γ: D_S = γ_t S, D_C = γ_c C; default 4 (block="mlp")
        token_hidden: int | None = None,  # D_S, overrides mlp_ratio on the token axis
        channel_hidden: int | None = None,  # D_C, overrides mlp_ratio on the channel axis
        rp_blocks: str | Sequence[int] | None = None,  # "all", "none" or block indices made RP
        structure_seed: int = 0,  # seed of the frozen permutations
        token_tiles: int = 1,  # K: order tokens as K×K spatial parts, each a contiguous run (Mixer supp. C)
        token_mixing: TokenMixingFactory = TiedTokens(),  # Listing 1's, or a supp. A.1 ablation (layers.token_mixing)
        norm_eps: float = 1e-6,  # LayerNorm ε: 1e-6 as Flax/timm, 1e-5 in Hayase & Karakida (S.4)
        act: str = "gelu",  # φ: "gelu" (exact), "gelu_tanh" (Listing 1's Flax nn.gelu), "relu", "identity"
        drop_rate: float = 0.0,  # dropout before the head
        proj_drop_rate: float = 0.0,  # dropout inside the mixing MLPs
        drop_path_rate: float = 0.0,  # stochastic depth, linear from 0 (first MLP) to this (last MLP)
    ) -> None:
        super().__init__()
        for name, value in [("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans),
                            ("num_classes", num_classes), ("embed_dim", embed_dim), ("depth", depth)]:
            check_positive_int(name, value)
        if img_size % patch_size:
            raise ConfigError(f"patch_size {patch_size} does not divide img_size {img_size}")
        if block not in BLOCK_KINDS:
            raise ConfigError(f"block must be one of {', '.join(BLOCK_KINDS)}, got {block!r}")
        if act not in ACTIVATIONS:
            raise ConfigError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
        for name, value in [("drop_rate", drop_rate), ("proj_drop_rate", proj_drop_rate),
                            ("drop_path_rate", drop_path_rate)]:
            check_rate(name, value)
        check_positive("norm_eps", norm_eps)
        if isinstance(structure_seed, bool) or not isinstance(structure_seed, int):
            raise ConfigError(f"structure_seed must be an integer, got {structure_seed!r}")
        check_positive_int("token_tiles", token_tiles)
        if (img_size // patch_size) % token_tiles:
            raise ConfigError(f"token_tiles {token_tiles} does not divide the {img_size // patch_size}-patch grid")
        if not isinstance(token_mixing, TokenMixingFactory):
            raise ConfigError(f"token_mixing must be a token-mixing factory (TiedTokens(), UntiedTokens(), "
                              f"GroupedTokens(G, views=..., untied=...)), got {token_mixing!r}")
        token_mixing.check(embed_dim)

        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.num_classes = num_classes
        self.grid_tokens = S0 = (img_size // patch_size) ** 2
        self.token_schedule, project_first = _token_schedule(num_tokens, depth, S0)
        self.num_tokens = self.token_schedule[0]  # S of the first block (of every block unless a pyramid)
        self.embed_dim = C = embed_dim
        self.depth = depth
        self.block_kind = block
        self.activation = act
        self.rp_blocks = _parse_rp_blocks(rp_blocks, depth)
        self.structure_seed = structure_seed
        self.token_mixing = token_mixing
        G = token_mixing.groups
        if self.rp_blocks and not token_mixing.permutable:
            raise ConfigError(f"{token_mixing} regroups neighbouring channels (channel_groups, group_views), which the "
                              "random J₁ of an RP block has already scattered: use it without rp_blocks")

        if block == "fc":
            if token_hidden is not None or channel_hidden is not None:
                raise ConfigError("the S-Mixer (block='fc') has no hidden layer: drop token_hidden/channel_hidden")
            if mlp_ratio is not None:
                raise ConfigError("the S-Mixer (block='fc') has no hidden layer: drop mlp_ratio")
            self.token_hidden = self.channel_hidden = None
            token_hiddens = [None] * depth
        else:
            gamma_t, gamma_c = _ratio_pair(4.0 if mlp_ratio is None else mlp_ratio)
            if token_hidden is not None:
                check_positive_int("token_hidden", token_hidden)
            token_hiddens = [token_hidden if token_hidden is not None else max(1, int(gamma_t * s * G))
                             for s in self.token_schedule]
            self.token_hidden = token_hiddens[0]  # D_S of the first block (of every block unless a pyramid)
            self.channel_hidden = (check_positive_int("channel_hidden", channel_hidden)
                                   if channel_hidden is not None else max(1, int(gamma_c * C)))

        mlp_layer, act_layer = BLOCK_KINDS[block], ACTIVATIONS[act]
        dpr = [drop_path_rate * i / max(1, 2 * depth - 1) for i in range(2 * depth)]  # linear ramp over the MLPs
        generator = torch.Generator().manual_seed(structure_seed)

        self.stem = nn.Conv2d(in_chans, C, patch_size, stride=patch_size)  # per-patch FC (S.1)
        self.token_tiles = token_tiles
        if token_tiles > 1:  # derived from the shapes, so not state
            self.register_buffer("token_order", tiled_token_order(img_size // patch_size, token_tiles),
                                 persistent=False)
        blocks = []
        for i, (s_in, S) in enumerate(zip((S0, *self.token_schedule), self.token_schedule)):
            perms = RP if i in self.rp_blocks else None
            token = token_mixing(mlp_layer, channels=C, in_tokens=s_in, out_tokens=S, hidden=token_hiddens[i],
                                 act_layer=act_layer, drop=proj_drop_rate, perms=perms, generator=generator)
            channel = PKMixing(mlp_layer(C, self.channel_hidden, C, act_layer, proj_drop_rate), "channel", S, C, C,
                               perms=perms, generator=generator)
            skip = TokenProjectionSkip(s_in, S, C, norm_eps) if s_in != S or (i == 0 and project_first) else None
            blocks.append(MixerBlock(
                MixingSublayer(nn.LayerNorm(C, eps=norm_eps), token, dpr[2 * i], skip),
                MixingSublayer(nn.LayerNorm(C, eps=norm_eps), channel, dpr[2 * i + 1])))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(C, eps=norm_eps)  # pre_head_layer_norm
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(C, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Flax defaults of Listing 1: LeCun normal kernels, zero biases, zero head, unit LayerNorm."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                lecun_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, BatchedLinear):
                module.reset_parameters()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.head.weight)

    @property
    def token_ablations(self) -> tuple[str, ...]:
        """The options of Mixer supp. A.1 in use, by their plain names: empty for Listing 1's token mixing (what
        timm, Flax checkpoints and block-diagonal resolution enlargement handle)."""
        pyramid = ("token_schedule",) if len(set(self.token_schedule)) > 1 else ()
        return (*self.token_mixing.ablations, *pyramid)

    # the plain spelling of the token mixing (create_model's options; read-only)
    @property
    def untied_tokens(self) -> bool:
        return self.token_mixing.options()["untied_tokens"]

    @property
    def channel_groups(self) -> int:
        return self.token_mixing.options()["channel_groups"]

    @property
    def group_views(self) -> bool:
        return self.token_mixing.options()["group_views"]

    # ---- forward -------------------------------------------------------------------------------------
    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_chans, self.img_size, self.img_size):
            raise ValueError(f"expected input of shape (B, {self.in_chans}, {self.img_size}, {self.img_size}), "
                             f"got {tuple(x.shape)}")
        # (B, C, H/P, W/P) -> (B, S0, C), raster order; made contiguous once here, else every residual sum
        # inherits the transposed layout and each LayerNorm copies its input and gradient (docs/performance.md)
        x = self.stem(x).flatten(2).transpose(1, 2).contiguous()
        return x if self.token_tiles == 1 else x.index_select(1, self.token_order)  # K² contiguous parts

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_stem(x)  # (B, S0, C)
        for blk in self.blocks:
            x = blk(x)  # (B, S, C)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(x.mean(dim=1))  # global average pooling over tokens: (B, C)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in_chans, H, W) -> (B, num_classes)
        return self.forward_head(self.forward_features(x))

    # ---- intermediate features -----------------------------------------------------------------------
    def feature_names(self, where: str = "block") -> list[str]:
        if check_where(where) == "block":
            return [f"blocks.{i}" for i in range(self.depth)]
        return [f"blocks.{i}.{part}" for i in range(self.depth) for part in ("token", "channel")]

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, *,
                              where: str = "block", norm: bool = False, intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Features at the chosen points (see :mod:`pkmixer.models.features`), each (B, S, C) with S the
        block's output tokens (it varies in a pyramid; a token branch has them too).

        Returns ``(final normalised features, intermediates)``, or the list alone with
        ``intermediates_only`` (then the forward stops after the last requested point).
        """
        take = set(select_indices(len(self.feature_names(where)), indices))
        last = max(take)
        out, k = [], 0
        x = self.forward_stem(x)
        for blk in self.blocks:
            for sub in (blk.token, blk.channel):
                x, branch = sub.forward_branch(x)
                if where == "mixing":
                    if k in take:
                        out.append(branch)
                    k += 1
            if where == "block":
                if k in take:
                    out.append(self.norm(x) if norm else x)
                k += 1
            if intermediates_only and k > last:
                return out
        return out if intermediates_only else (self.norm(x), out)

    # ---- the model contract (pkmixer.models.contract) ------------------------------------------------------
    def rows_per_image(self) -> dict[nn.Module, int]:
        """The per-patch stem runs once per patch, S₀ rows (S.1)."""
        return {self.stem: self.grid_tokens}

    def effective_mlp(self) -> EffectiveMLP:
        """The model as an explicit wide MLP on vec coordinates, float64 (Prop. 3.2, Eq. 19; call in eval mode):
        each mixing sublayer a residual of its PK layer's sparse maps (J_cᵀ P(J₂) (I ⊗ W) P(J₁) J_c), after
        the LayerNorm over each token's channels; the App. A.2.4 skip is LN((I_C ⊗ W̃) vec(X)); the stem and
        the head (LayerNorm, mean over tokens, Linear) are kept as they are."""
        from ..theory.effective import EffectiveMLP, EffectiveResidual, pk_effective_layers, unvec, vec, vec_layer_norm

        C, schedule = self.embed_dim, self.token_schedule  # S after each block: varies in a pyramid
        blocks = []
        for i, (blk, s_in, S) in enumerate(zip(self.blocks, (self.grid_tokens, *schedule), schedule)):
            for part, sub in (("token", blk.token), ("channel", blk.channel)):
                s_here = s_in if part == "token" else S
                layers = pk_effective_layers(sub.mixing, f"blocks.{i}.{part}", s_here, S, C)
                skip = None if sub.skip is None else sub.skip.effective_map(C)
                blocks.append(EffectiveResidual(vec_layer_norm(sub.norm, s_here, C), layers, skip))
        S = schedule[-1]

        def stem(images: torch.Tensor) -> torch.Tensor:
            return vec(self.forward_stem(images))  # per-patch FC (S.1), then vec: (B, S0*C)

        def head(x: torch.Tensor) -> torch.Tensor:
            return self.forward_head(self.norm(unvec(x, S, C)))

        return EffectiveMLP(stem, blocks, head)

    def patch_unit_weights(self) -> torch.Tensor:
        """The per-patch projection (C, in_chans, P, P) (Mixer supp. D, Fig. 2)."""
        return self.stem.weight

    def token_unit_weights(self, block: int) -> torch.Tensor:
        """The first token-mixing Dense of ``blocks[block]``, (D_S, S), each unit an image over the patch grid
        (Mixer supp. D, Fig. 1); ConfigError where the units are not images of the input's patches."""
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.depth:
            raise ConfigError(f"block must be an index in [0, {self.depth}), got {block!r}")
        if self.token_mixing.ablations:
            raise ConfigError(f"token-mixing units of a Mixer with the supp. A.1 option(s) "
                              f"{', '.join(self.token_mixing.ablations)} are not one S-pixel image per unit")
        if any(blk.token.skip is not None for blk in self.blocks[:block]):
            raise ConfigError(f"block {block} reads tokens projected by an earlier block (num_tokens or a pyramid): "
                              "they are no longer image patches")
        mixing = self.blocks[block].token.mixing
        if mixing.perms[0] != "commutation":
            raise ConfigError(f"block {block}'s token mixing reads permuted inputs ({mixing.perms[0]} J₁): its units "
                              "have no spatial layout")
        return mixing.mlp.linears()[0].weight  # (D_S, S_in)

    # ---- description ---------------------------------------------------------------------------------
    def info(self) -> ModelInfo:
        """Parameters, S, C, γ, connections Ω per mixing layer and effective width m = SC (Eqs. 13-14).

        S and m are the first block's (a pyramid lists every block's S in ``tokens_per_block``); γ_token is
        D_S / (S·G), relative to the token MLP's input width.
        """
        S, C = self.num_tokens, self.embed_dim
        layers = [shape for blk in self.blocks for mixing in (blk.token.mixing, blk.channel.mixing)
                  for shape in _block_shapes(mixing)]
        nnz = sum(n * i * o for n, i, o in layers)
        return ModelInfo(
            family="MLP-Mixer" if self.block_kind == "mlp" else "S-Mixer",
            params=sum(p.numel() for p in self.parameters()),
            num_tokens=S, embed_dim=C,
            gamma_token=None if self.token_hidden is None else self.token_hidden / (S * self.channel_groups),
            gamma_channel=None if self.channel_hidden is None else self.channel_hidden / C,
            depth=self.depth, mixing_layers=len(layers), connections=nnz / len(layers), effective_width=S * C,
            max_width=max(n * o for n, _, o in layers),
            density=nnz / sum(n * i * n * o for n, i, o in layers),
            tokens_per_block=self.token_schedule)
