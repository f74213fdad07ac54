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
* ``create_model`` (and so configs and checkpoints) also speaks the plain spelling of those arguments
  (``untied_tokens``, ``channel_groups``, ``group_views``, ``token_schedule``): :mod:`pkmixer.models.spellings`.

Hidden widths: ``mlp_ratio=γ`` (or a (γ_token, γ_channel) pair) gives D_S = γS and D_C = γC as in Hayase &
Karakida; ``token_hidden`` / ``channel_hidden`` set D_S, D_C directly, as Table 1 of Tolstikhin et al. does.
With channel groups the token MLP's input is S·G wide and D_S = γ·S·G; in a pyramid S is each block's output
token count.

An S-Mixer with the exact GELU, Listing 1's token mixing (no RP blocks, dropout or stochastic depth) and a width the
C kernel has code for (:func:`pkmixer.layers.fused.kernel_takes`) is ``fusable``. Built, moved or cast to float32 on
the CPU while torch uses one intra-op thread (the sweeps' setting), with the kernel built, it runs fused
(``fuse_sublayers``): each sublayer's bias, GELU, residual sum and the next LayerNorm in one pass
(:func:`pkmixer.layers.fused.residual_gelu_norm`), in its eager, traced, scripted, exported and compiled forwards,
checkpointed or not, and in ``forward_intermediates`` at the blocks, all of which then compute the same bits. With
fewer than 16 channels the fused path keeps the stream sequence-first, (S, B, C), so that each token mixing is one
matrix product over all the batch's columns with no layout copies (``fused_sequence_first``). A
forward while a module hook watches the blocks runs the modules instead (same results within float rounding), as
does every model with ``PKMIXER_NATIVE_KERNELS=0``.

The class follows the model contract (:mod:`pkmixer.models.contract`): its effective wide MLP
(:meth:`Mixer.effective_mlp`, Prop. 3.2, Eq. 19), the rows of its stem, and its token-mixing and per-patch
units to draw (Mixer supp. D).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Optional, Tuple

import torch
from timm.layers import DropPath, lecun_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError, check_positive, check_positive_int, check_rate
from ..layers import fused
from ..layers.ablations import BatchedLinear, GroupedTokenMixing
from ..layers.mlp import NARROW_COLUMNS, FcAct, Mlp, left_mm
from ..layers.norm import layer_norm
from ..layers.patch import PatchConv
from ..layers.pk import PKMixing
from ..layers.token_mixing import TiedTokens, TokenMixingFactory
from .features import check_where, point_format, select_indices
from .inputs import check_image
from .info import ModelInfo
from .timm_api import TimmModel, record_arguments

if TYPE_CHECKING:
    from ..theory.effective import EffectiveMLP

torch.fx.wrap("check_image")  # one node of an FX graph

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
        self.norm = layer_norm(dim, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S0, C) -> (B, S, C)
        return self.norm(self.proj(x.transpose(1, 2)).transpose(1, 2))

    def forward_sequence_first(self, x: torch.Tensor) -> torch.Tensor:  # (S0, B, C) -> (S, B, C)
        """The same map on a sequence-first stream: one product over all the batch's columns."""
        return self.norm(left_mm(self.proj.weight, None, x.reshape(x.shape[0], -1)).view(-1, x.shape[1], x.shape[2]))

    def rows_per_image(self) -> dict[nn.Module, int]:
        """W̃ mixes tokens: it runs once per channel (contract, pkmixer.models.contract)."""
        return {self.proj: self.norm.normalized_shape[0]}

    @classmethod
    def stacked(cls, members: list[TokenProjectionSkip], path: str) -> nn.Module:
        """K of them as one (pkmixer.layers.stacked): a batched product over each member's columns."""
        from ..layers.stacked import StackedTokenSkip, stack_modules

        return StackedTokenSkip(stack_modules([m.proj for m in members], f"{path}.proj"),
                                stack_modules([m.norm for m in members], f"{path}.norm"))

    def effective_map(self, channels: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """SkipLayer(X) = LN(W̃ X) on vec coordinates: vec(W̃ X) = (I_C ⊗ W̃) vec(X) (S.15), in float64."""
        from ..theory.effective import EffectiveLinear, kron_identity, vec_layer_norm

        proj = EffectiveLinear("skip", kron_identity(channels, self.proj.weight.double()), None)
        norm = vec_layer_norm(self.norm, self.proj.out_features, channels)
        return lambda x: norm(proj(x))


class MixingSublayer(nn.Module):
    """x -> skip(x) + drop_path(mixing(LN(x))) (Eqs. 3-4, S.5-S.8, S.14)."""

    STACKS_BY_CHILDREN = True  # its forward is generic in the leading axes (pkmixer.layers.stacked)

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

    def fused_product(self, x: torch.Tensor, u: torch.Tensor, sequence_first: bool = False
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(shortcut, W u) for u = LN(x): the sublayer up to its Dense's product, without the bias (an S-Mixer's
        fused path, :meth:`Mixer.forward_features`); on (S, B, C) streams where ``sequence_first``."""
        if self.skip is None:
            shortcut = x
        else:
            shortcut = self.skip.forward_sequence_first(x) if sequence_first else self.skip(x)
        if sequence_first and self.mixing.normal_left:  # W U over the batch's columns: (S_in, B·C) -> (S_out, B·C)
            z = left_mm(self.mixing.mlp.fc.weight, None, u.reshape(u.shape[0], -1))
            return shortcut, z.view(-1, u.shape[1], u.shape[2])
        return shortcut, self.mixing.mlp.product(u, self.mixing.normal_left, self.mixing.narrow)

    def fused_close(self, shortcut: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float, sequence_first: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """(shortcut + φ(z + b), the next LayerNorm of it, with ``weight``, ``bias``, ``eps``) in one pass."""
        return fused.residual_gelu_norm(shortcut, z, self.mixing.mlp.fc.bias, self.mixing.normal_left, weight, bias,
                                        eps, sequence_first)


class MixerBlock(nn.Module):
    """Token mixing then channel mixing, each a residual sublayer (Eqs. 3-4)."""

    STACKS_BY_CHILDREN = True

    def __init__(self, token: MixingSublayer, channel: MixingSublayer) -> None:
        super().__init__()
        self.token = token
        self.channel = channel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, C) -> (B, S, C)
        return self.channel(self.token(x))

    def fused_forward(self, x: torch.Tensor, u: torch.Tensor, sequence_first: bool = False
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The block on the fused path from x and u = LN(x): the channel sublayer's (shortcut, product), which the
        next block's first LayerNorm (or the final one) closes (:meth:`Mixer.forward_features`)."""
        shortcut, z = self.token.fused_product(x, u, sequence_first)
        norm = self.channel.norm
        x, u = self.token.fused_close(shortcut, z, norm.weight, norm.bias, norm.eps, sequence_first)
        return self.channel.fused_product(x, u, sequence_first)


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


def _ratio_pair(mlp_ratio: float | Sequence[float]) -> tuple[float, float]:
    pair = (mlp_ratio, mlp_ratio) if isinstance(mlp_ratio, (int, float)) else tuple(mlp_ratio)
    if len(pair) != 2:
        raise ConfigError(f"mlp_ratio must be a number or a (token, channel) pair, got {mlp_ratio!r}")
    return check_positive("mlp_ratio", pair[0]), check_positive("mlp_ratio", pair[1])


class Mixer(TimmModel, nn.Module):
    """MLP-Mixer (``block="mlp"``) or S-Mixer (``block="fc"``), normal or RP; see the module docstring."""

    global_pool = "avg"  # timm's name of the head's pooling: the mean over tokens
    # fixed when built (or moved, or pruned): TorchScript compiles only the path they choose
    __constants__ = ["fuse_sublayers", "fused_sequence_first", "final_layer_norm"]
    CLASS_PAPERS = ("tolstikhin", "hayase")  # a Mixer built from its class: Listing 1, and the S-Mixer and RP forms

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

        self.stem = PatchConv(in_chans, C, patch_size)  # per-patch FC (S.1)
        self.token_tiles = token_tiles
        order = tiled_token_order(img_size // patch_size, token_tiles) if token_tiles > 1 else None
        self.register_buffer("token_order", order, persistent=False)  # derived from the shapes, so not state
        blocks = []
        for i, (s_in, S) in enumerate(zip((S0, *self.token_schedule), self.token_schedule)):
            perms = RP if i in self.rp_blocks else None
            token = token_mixing(mlp_layer, channels=C, in_tokens=s_in, out_tokens=S, hidden=token_hiddens[i],
                                 act_layer=act_layer, drop=proj_drop_rate, perms=perms, generator=generator)
            channel = PKMixing(mlp_layer(C, self.channel_hidden, C, act_layer, proj_drop_rate), "channel", S, C, C,
                               perms=perms, generator=generator)
            skip = TokenProjectionSkip(s_in, S, C, norm_eps) if s_in != S or (i == 0 and project_first) else None
            blocks.append(MixerBlock(
                MixingSublayer(layer_norm(C, norm_eps), token, dpr[2 * i], skip),
                MixingSublayer(layer_norm(C, norm_eps), channel, dpr[2 * i + 1])))
        self.blocks = nn.ModuleList(blocks)
        self.norm = layer_norm(C, norm_eps)  # pre_head_layer_norm
        self.final_layer_norm = True  # False once prune_intermediate_layers drops the final norm
        self.fusable = (block == "fc" and act == "gelu" and drop_path_rate == 0 and proj_drop_rate == 0
                        and all(isinstance(sub.mixing, PKMixing) and isinstance(sub.mixing.mlp, FcAct)
                                and (sub.mixing.normal_channel or sub.mixing.normal_left) for sub in self._sublayers())
                        and fused.kernel_takes(C, C, token_bias=False)
                        and all(fused.kernel_takes(C, s, token_bias=True) for s in self.token_schedule))
        # below NARROW_COLUMNS the token mixing's inner matrices are only C wide: on the fused path the stream is
        # held sequence-first so that each is one product over all the batch's columns, without layout copies
        self.fused_sequence_first = self.fusable and C < NARROW_COLUMNS
        self.fuse_sublayers = self._fuses()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(C, num_classes)
        self.grad_checkpointing = False  # timm's set_grad_checkpointing: recompute each block in the backward
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

    # ---- forward -------------------------------------------------------------------------------------
    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        check_image(x, self.in_chans, self.img_size)
        # (B, C, H/P, W/P) -> (B, S0, C), raster order; made contiguous once here, else every residual sum
        # inherits the transposed layout and each LayerNorm copies its input and gradient (docs/performance.md)
        x = self.stem(x).flatten(2).transpose(1, 2).contiguous()
        return x if self.token_order is None else x.index_select(1, self.token_order)  # K² contiguous parts

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if self.fuse_sublayers:
            if torch.jit.is_scripting():
                return self._forward_features_fused(x)
            if not self._hooked():
                return self._forward_features_fused(x)
        x = self.forward_stem(x)  # (B, S0, C)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)  # (B, S, C)
        return self.norm(x)

    def _forward_features_fused(self, x: torch.Tensor) -> torch.Tensor:
        """forward_features with each sublayer's bias, activation, residual sum and the next LayerNorm in one pass
        (:func:`pkmixer.layers.fused.residual_gelu_norm`)."""
        x, u = self._fused_stream(x)
        seq = self.fused_sequence_first
        shortcut, z, bias = x, x, x  # the last block's channel sublayer, open until the next LayerNorm closes it
        for i, blk in enumerate(self.blocks):
            if i > 0:
                norm = blk.token.norm
                x, u = fused.residual_gelu_norm(shortcut, z, bias, False, norm.weight, norm.bias, norm.eps, seq)
            if self.grad_checkpointing and not torch.jit.is_scripting():
                shortcut, z = checkpoint(blk.fused_forward, x, u, seq, use_reentrant=False)
            else:
                shortcut, z = blk.fused_forward(x, u, seq)
            bias = blk.channel.mixing.mlp.fc.bias
        return self._batch_first(self._fused_last(shortcut, z, bias)[1])

    def _fused_stream(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The fused path's start: the stem's (B, S0, C) stream, (S0, B, C) where ``fused_sequence_first``, and
        the first block's LayerNorm of it."""
        x = self.forward_stem(x)
        if self.fused_sequence_first:
            x = x.transpose(0, 1).contiguous()
        return x, self.blocks[0].token.norm(x)

    def _batch_first(self, x: torch.Tensor) -> torch.Tensor:
        """A stream of the fused path as (B, S, C), contiguous."""
        return x.transpose(0, 1).contiguous() if self.fused_sequence_first else x

    def _fused_last(self, shortcut: torch.Tensor, z: torch.Tensor, bias: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(the last block's output, the final norm of it), the last sublayer closed by the final LayerNorm; a
        pruned norm (``prune_intermediate_layers``) is applied after a close with a unit LayerNorm, whose output
        is dropped (the block's output is the same either way). Both in the fused path's layout."""
        final = self.norm
        seq = self.fused_sequence_first
        if self.final_layer_norm:
            return fused.residual_gelu_norm(shortcut, z, bias, False, final.weight, final.bias, final.eps, seq)
        x = fused.residual_gelu_norm(shortcut, z, bias, False, torch.ones_like(bias), torch.zeros_like(bias),
                                     1e-6, seq)[0]
        return x, final(x)

    @torch.jit.unused
    def _fuses(self) -> bool:
        """Whether the sublayers run fused: a fusable S-Mixer (module docstring) in float32 on the CPU, built or
        moved while torch uses one intra-op thread (the kernel's; with more, torch's own operators share the work
        and the modules run faster than the fused path's fallback), with the kernel built on this machine."""
        weight = self.stem.weight
        return (self.fusable and weight.device.type == "cpu" and weight.dtype == torch.float32
                and torch.get_num_threads() == 1 and fused.kernel_available())

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .double(), ...: the fused path follows the parameters
        module = super()._apply(fn, recurse)
        self.fuse_sublayers = self._fuses()
        return module

    @torch.jit.unused
    def _sublayers(self) -> list[MixingSublayer]:
        return [sub for blk in self.blocks for sub in (blk.token, blk.channel)]

    @torch.jit.unused
    def _hooked(self) -> bool:
        """Whether a forward hook watches a block, a module in one or the final norm (global hooks included): the
        fused path does not call those modules, so the forward runs them instead."""
        hooks = nn.modules.module
        if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
            return True
        return any(m._forward_hooks or m._forward_pre_hooks for m in (*self.blocks.modules(), *self.norm.modules()))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(x.mean(dim=1))  # global average pooling over tokens: (B, C)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in_chans, H, W) -> (B, num_classes)
        return self.forward_head(self.forward_features(x))

    @staticmethod
    def stacked_forward(net: nn.Module, x: torch.Tensor) -> torch.Tensor:  # (K, B, c, H, W) -> (K, B, classes)
        """The forward of K members stacked (:func:`pkmixer.train.stack.stack_models`): ``net`` holds this
        model's children in their stacked forms (pkmixer.layers.stacked) and its shared ``token_order``."""
        x = net.stem(x)  # (K, B, S0, C)
        if net.token_order is not None:
            x = x.index_select(2, net.token_order)
        for blk in net.blocks:
            x = blk(x)
        return net.head(net.norm(x).mean(dim=2))

    # ---- intermediate features (timm's forward_intermediates, features_only) ---------------------------------
    OUTPUT_FORMATS = ("NLC", "NCHW")  # (B, S, C) as the model holds it; (B, C, H, W) on the patch grid

    def feature_names(self, where: str = "block") -> list[str]:
        n = len(self.blocks)
        if check_where(where) == "block":
            return [f"blocks.{i}" for i in range(n)]
        return [f"blocks.{i}.{part}" for i in range(n) for part in ("token", "channel")]

    def on_patch_grid(self, block: int) -> bool:
        """Whether the tokens after ``blocks[block]`` are the patches in raster order (an NCHW map)."""
        return self.token_schedule[block] == self.grid_tokens and self.token_order is None

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NLC",
                              intermediates_only: bool = False, *, where: str = "block"
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Features at the chosen points (see :mod:`pkmixer.models.features`), each (B, S, C) with S the
        block's output tokens (it varies in a pyramid; a token branch has them too), or (B, C, H, W) with
        ``output_fmt="NCHW"`` where the tokens are the patch grid.

        Returns ``(final normalised features, intermediates)``, or the list alone with ``intermediates_only``.
        The forward stops after the last requested point with ``intermediates_only`` or ``stop_early`` (then
        the final features are those of the last block run, as timm's).
        """
        points = self.feature_names(where)
        take = set(select_indices(len(points), indices))
        fmt = point_format(output_fmt, self.OUTPUT_FORMATS)
        last = max(take)
        if self.fuse_sublayers and where == "block" and not self._hooked():
            return self._intermediates_fused(x, take, last, norm, stop_early or intermediates_only, fmt,
                                             intermediates_only)
        out, k = [], 0
        x = self.forward_stem(x)
        for i, blk in enumerate(self.blocks):
            for sub in (blk.token, blk.channel):
                x, branch = checkpoint(sub.forward_branch, x, use_reentrant=False) if self.grad_checkpointing \
                    else sub.forward_branch(x)
                if where == "mixing":
                    if k in take:
                        out.append(self._as_format(branch, fmt, i))
                    k += 1
            if where == "block":
                if k in take:
                    out.append(self._as_format(self.norm(x) if norm else x, fmt, i))
                k += 1
            if (intermediates_only or stop_early) and k > last:
                break
        return out if intermediates_only else (self.norm(x), out)

    def _intermediates_fused(self, x: torch.Tensor, take: set[int], last: int, norm: bool, stop: bool, fmt: str,
                             intermediates_only: bool) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """forward_intermediates at the blocks on the fused path: the same operations as
        :meth:`_forward_features_fused`, each block's output taken where the next LayerNorm closes it."""
        out = []
        x, u = self._fused_stream(x)
        seq = self.fused_sequence_first
        for i, blk in enumerate(self.blocks):
            shortcut, z = (checkpoint(blk.fused_forward, x, u, seq, use_reentrant=False) if self.grad_checkpointing
                           else blk.fused_forward(x, u, seq))
            bias = blk.channel.mixing.mlp.fc.bias
            if i + 1 < len(self.blocks):
                after = self.blocks[i + 1].token.norm
                x, u = fused.residual_gelu_norm(shortcut, z, bias, False, after.weight, after.bias, after.eps, seq)
            else:
                x, u = self._fused_last(shortcut, z, bias)
            if i in take:
                block_out = self._batch_first(x)
                out.append(self._as_format(self.norm(block_out) if norm else block_out, fmt, i))
            if stop and i >= last:
                break
        if intermediates_only:
            return out
        return self._batch_first(u) if i + 1 == len(self.blocks) else self.norm(self._batch_first(x)), out

    def _as_format(self, t: torch.Tensor, fmt: str, block: int) -> torch.Tensor:
        if fmt == "NLC":
            return t
        if not self.on_patch_grid(block):
            raise ConfigError(f"block {block}'s tokens are not the patch grid in raster order (num_tokens, a pyramid "
                              "or token_tiles): its features have no NCHW layout; use output_fmt='NLC'")
        grid = self.img_size // self.patch_size
        return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], grid, grid)  # (B, C, H/P, W/P)

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """timm's description of the feature points (``where="block"``): C channels each; the reduction is the
        patch size where the block's tokens are the patch grid, else the image size (no spatial layout)."""
        return [dict(module=f"blocks.{i}", num_chs=self.embed_dim,
                     reduction=self.patch_size if self.on_patch_grid(i) else self.img_size)
                for i in range(len(self.blocks))]

    def default_output_fmt(self) -> str:
        """The layout ``features_only`` returns: NCHW where every block's tokens are the patch grid, else NLC."""
        return "NCHW" if all(self.on_patch_grid(i) for i in range(len(self.blocks))) else "NLC"

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last feature point ``indices`` needs (timm's convention), optionally the
        final norm and the head; returns the kept indices. ``model.spec`` records the new depth."""
        take = select_indices(len(self.blocks), indices)
        depth = max(take) + 1
        self.blocks = self.blocks[:depth]
        self.depth, self.token_schedule = depth, self.token_schedule[:depth]
        self.rp_blocks = frozenset(i for i in self.rp_blocks if i < depth)
        recorded = getattr(getattr(self, "spec", None), "arguments", {})
        changes: dict[str, Any] = {"depth": depth}
        if recorded.get("token_schedule") is not None:  # a pyramid, in its plain spelling
            changes["token_schedule"] = tuple(recorded["token_schedule"])[:depth]
        if not isinstance(recorded.get("rp_blocks"), (str, type(None))):  # a list of block indices
            changes["rp_blocks"] = sorted(self.rp_blocks)
        record_arguments(self, **changes)
        if prune_norm:
            self.norm = nn.Identity()
            self.final_layer_norm = False
        if prune_head:
            self.reset_classifier(0)
        return take

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups (layer-wise lr decay): the stem, each block, the final norm."""
        return dict(stem=r"^stem", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

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
            gamma_token=None if self.token_hidden is None else self.token_hidden / (S * self.token_mixing.groups),
            gamma_channel=None if self.channel_hidden is None else self.channel_hidden / C,
            depth=self.depth, mixing_layers=len(layers), connections=nnz / len(layers), effective_width=S * C,
            max_width=max(n * o for n, _, o in layers),
            density=nnz / sum(n * i * n * o for n, i, o in layers),
            tokens_per_block=self.token_schedule)
