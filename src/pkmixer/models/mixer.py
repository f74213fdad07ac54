"""The Mixer family: MLP-Mixer, S-Mixer and their random-permuted (RP) versions in one model class.

* MLP-Mixer exactly as Listing 1 of the Mixer supplementary (Tolstikhin et al. 2021): per-patch stem,
  blocks of LayerNorm + token-mixing MLP + skip and LayerNorm + channel-mixing MLP + skip, pre-head
  LayerNorm, mean pooling over tokens, zero-initialised head; Flax default (LeCun normal) initialisation.
* S-Mixer (Hayase & Karakida Eq. 5, S.7-S.8): ``block="fc"`` makes each mixing a single Dense + activation.
* Tokens S independent of the patch grid S₀ (App. A.2.4): ``num_tokens=S`` makes the first token mixing map
  S₀ -> S with the skip SkipLayer(X) = LN(W̃ X), W̃ ∈ R^{S×S₀}; the paper uses it even when S = S₀.
* RP Mixers (Sec. 5.2, S.13): ``rp_blocks`` names the blocks whose token and channel mixing are PK layers
  with frozen uniformly random J₁, J₂ drawn from ``structure_seed``; ``"all"`` for an RP Mixer, a list of
  block indices for Fig. S.4.

Hidden widths: ``mlp_ratio=γ`` (or a (γ_token, γ_channel) pair) gives D_S = γS and D_C = γC as in Hayase &
Karakida; ``token_hidden`` / ``channel_hidden`` set D_S, D_C directly, as Table 1 of Tolstikhin et al. does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from timm.layers import DropPath, lecun_normal_
from torch import nn

from ..errors import ConfigError, check_positive, check_positive_int, check_rate
from ..layers.mlp import FcAct, Mlp
from ..layers.pk import PKMixing
from .features import check_where, select_indices
from .info import ModelInfo

BLOCK_KINDS = {"mlp": Mlp, "fc": FcAct}
RP = ("random", "random")
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU, "identity": nn.Identity}


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


def _ratio_pair(mlp_ratio: float | Sequence[float]) -> tuple[float, float]:
    pair = (mlp_ratio, mlp_ratio) if isinstance(mlp_ratio, (int, float)) else tuple(mlp_ratio)
    if len(pair) != 2:
        raise ConfigError(f"mlp_ratio must be a number or a (token, channel) pair, got {mlp_ratio!r}")
    return check_positive("mlp_ratio", pair[0]), check_positive("mlp_ratio", pair[1])


class Mixer(nn.Module):
    """MLP-Mixer (``block="mlp"``) or S-Mixer (``block="fc"``), normal or RP; see the module docstring."""

    def __init__(
        self,
        *,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 512,  # C
        depth: int = 8,  # number of blocks (each: token mixing + channel mixing)
        num_tokens: int | None = None,  # S; None keeps S = S0 = (img_size / patch_size)^2 and no skip layer
        block: str = "mlp",  # "mlp": MLP-Mixer; "fc": S-Mixer
        mlp_ratio: float | Sequence[float] | None = None,  # γ: D_S = γ_t S, D_C = γ_c C; default 4 (block="mlp")
        token_hidden: int | None = None,  # D_S, overrides mlp_ratio on the token axis
        channel_hidden: int | None = None,  # D_C, overrides mlp_ratio on the channel axis
        rp_blocks: str | Sequence[int] | None = None,  # "all", "none" or block indices made RP
        structure_seed: int = 0,  # seed of the frozen permutations
        token_tiles: int = 1,  # K: order tokens as K×K spatial parts, each a contiguous run (Mixer supp. C)
        norm_eps: float = 1e-6,  # LayerNorm ε: 1e-6 as Flax/timm, 1e-5 in Hayase & Karakida (S.4)
        act: str = "gelu",
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

        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.num_classes = num_classes
        self.grid_tokens = (img_size // patch_size) ** 2  # S0
        self.num_tokens = self.grid_tokens if num_tokens is None else check_positive_int("num_tokens", num_tokens)
        self.embed_dim = C = embed_dim
        self.depth = depth
        self.block_kind = block
        self.rp_blocks = _parse_rp_blocks(rp_blocks, depth)
        self.structure_seed = structure_seed
        S0, S = self.grid_tokens, self.num_tokens

        if block == "fc":
            if token_hidden is not None or channel_hidden is not None:
                raise ConfigError("the S-Mixer (block='fc') has no hidden layer: drop token_hidden/channel_hidden")
            if mlp_ratio is not None:
                raise ConfigError("the S-Mixer (block='fc') has no hidden layer: drop mlp_ratio")
            self.token_hidden = self.channel_hidden = None
        else:
            gamma_t, gamma_c = _ratio_pair(4.0 if mlp_ratio is None else mlp_ratio)
            self.token_hidden = (check_positive_int("token_hidden", token_hidden) if token_hidden is not None
                                 else max(1, int(gamma_t * S)))
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
        for i in range(depth):
            rp = i in self.rp_blocks
            s_in = S0 if i == 0 else S
            token = PKMixing(mlp_layer(s_in, self.token_hidden, S, act_layer, proj_drop_rate), "token", C, s_in, S,
                             perms=RP if rp else None, generator=generator)
            channel = PKMixing(mlp_layer(C, self.channel_hidden, C, act_layer, proj_drop_rate), "channel", S, C, C,
                               perms=RP if rp else None, generator=generator)
            skip = TokenProjectionSkip(S0, S, C, norm_eps) if i == 0 and num_tokens is not None else None
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
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.head.weight)

    # ---- forward -------------------------------------------------------------------------------------
    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_chans, self.img_size, self.img_size):
            raise ValueError(f"expected input of shape (B, {self.in_chans}, {self.img_size}, {self.img_size}), "
                             f"got {tuple(x.shape)}")
        x = self.stem(x).flatten(2).transpose(1, 2)  # (B, C, H/P, W/P) -> (B, S0, C), raster order
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
        """Features at the chosen points (see :mod:`pkmixer.models.features`), each (B, S, C).

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

    # ---- description ---------------------------------------------------------------------------------
    def info(self) -> ModelInfo:
        """Parameters, S, C, γ, connections Ω per mixing layer and effective width m = SC (Eqs. 13-14)."""
        S, C = self.num_tokens, self.embed_dim
        # every Dense of a mixing layer is a block-diagonal effective weight: n blocks of (out, in)
        layers = [(mixing.other, lin.in_features, lin.out_features)
                  for blk in self.blocks for mixing in (blk.token.mixing, blk.channel.mixing)
                  for lin in mixing.mlp.linears()]
        nnz = sum(n * i * o for n, i, o in layers)
        return ModelInfo(
            family="MLP-Mixer" if self.block_kind == "mlp" else "S-Mixer",
            params=sum(p.numel() for p in self.parameters()),
            num_tokens=S, embed_dim=C,
            gamma_token=None if self.token_hidden is None else self.token_hidden / S,
            gamma_channel=None if self.channel_hidden is None else self.channel_hidden / C,
            depth=self.depth, mixing_layers=len(layers), connections=nnz / len(layers), effective_width=S * C,
            max_width=max(n * o for n, _, o in layers),
            density=nnz / sum(n * i * n * o for n, i, o in layers))
