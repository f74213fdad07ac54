"""Weight conversion between timm's ``mixer_*`` models (``timm.models.mlp_mixer.MlpMixer``) and our MLP-Mixer.

Only a normal MLP-Mixer converts: Listing 1's architecture (``block="mlp"``, S = S₀, no RP blocks), which
is what timm implements. Parameter names map one to one; tensors are copied unchanged.
"""
from __future__ import annotations

import re
from functools import partial

import torch
from torch import nn

from ..errors import ConfigError
from .mixer import Mixer

# (timm pattern, ours) - applied to the key with the block index substituted
_KEY_MAP = [
    (r"stem\.proj\.", "stem."),
    (r"blocks\.(\d+)\.norm1\.", r"blocks.\1.token.norm."),
    (r"blocks\.(\d+)\.mlp_tokens\.", r"blocks.\1.token.mixing.mlp."),
    (r"blocks\.(\d+)\.norm2\.", r"blocks.\1.channel.norm."),
    (r"blocks\.(\d+)\.mlp_channels\.", r"blocks.\1.channel.mixing.mlp."),
]
_REVERSE_MAP = [
    (r"stem\.", "stem.proj."),
    (r"blocks\.(\d+)\.token\.norm\.", r"blocks.\1.norm1."),
    (r"blocks\.(\d+)\.token\.mixing\.mlp\.", r"blocks.\1.mlp_tokens."),
    (r"blocks\.(\d+)\.channel\.norm\.", r"blocks.\1.norm2."),
    (r"blocks\.(\d+)\.channel\.mixing\.mlp\.", r"blocks.\1.mlp_channels."),
]


def _rename(state: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            if re.match(pattern, key):
                key = re.sub(pattern, repl, key, count=1)
                break
        out[key] = value
    return out


def timm_to_pkmixer_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _rename(state, _KEY_MAP)


def pkmixer_to_timm_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _rename(state, _REVERSE_MAP)


def from_timm(timm_model: nn.Module) -> Mixer:
    """A :class:`Mixer` with the architecture and weights of a timm ``MlpMixer`` (Listing 1)."""
    from timm.models.mlp_mixer import MixerBlock, MlpMixer

    if not isinstance(timm_model, MlpMixer) or not all(isinstance(b, MixerBlock) for b in timm_model.blocks):
        raise ConfigError(f"expected a timm MlpMixer with MixerBlocks (mixer_*), got {type(timm_model).__name__}")
    proj = timm_model.stem.proj
    blk = timm_model.blocks[0]
    ours = Mixer(img_size=timm_model.stem.img_size[0], patch_size=proj.kernel_size[0], in_chans=proj.in_channels,
                 num_classes=timm_model.num_classes, embed_dim=timm_model.embed_dim, depth=len(timm_model.blocks),
                 token_hidden=blk.mlp_tokens.fc1.out_features, channel_hidden=blk.mlp_channels.fc1.out_features,
                 norm_eps=blk.norm1.eps)
    ours.load_state_dict(timm_to_pkmixer_state_dict(timm_model.state_dict()))
    return ours


def to_timm(model: Mixer) -> nn.Module:
    """A timm ``MlpMixer`` with the architecture and weights of a normal MLP-Mixer."""
    from timm.models.mlp_mixer import MlpMixer

    if not isinstance(model, Mixer) or model.block_kind != "mlp":
        raise ConfigError("only an MLP-Mixer (block='mlp') converts to timm")
    if model.rp_blocks or model.num_tokens != model.grid_tokens or model.blocks[0].token.skip is not None:
        raise ConfigError("timm has no RP blocks and no token projection: this Mixer does not convert to timm")
    C = model.embed_dim
    # timm computes hidden = int(ratio * C); the half keeps int() from rounding down a float error
    ratio = ((model.token_hidden + 0.5) / C, (model.channel_hidden + 0.5) / C)
    timm_model = MlpMixer(num_classes=model.num_classes, img_size=model.img_size, in_chans=model.in_chans,
                          patch_size=model.patch_size, num_blocks=model.depth, embed_dim=C, mlp_ratio=ratio,
                          norm_layer=partial(nn.LayerNorm, eps=model.norm.eps))
    timm_model.load_state_dict(pkmixer_to_timm_state_dict(model.state_dict()))
    return timm_model.to(next(model.parameters()).dtype)
