"""Parameter names of timm's ``MlpMixer`` and of our :class:`~pkmixer.models.mixer.Mixer` (Listing 1's MLP-Mixer):
they map one to one, so a state dict converts by renaming its keys, both ways."""
from __future__ import annotations

import re

import torch

# (timm pattern, ours), applied to a key with its block index substituted
TO_OURS = [
    (r"stem\.proj\.", "stem."),
    (r"blocks\.(\d+)\.norm1\.", r"blocks.\1.token.norm."),
    (r"blocks\.(\d+)\.mlp_tokens\.", r"blocks.\1.token.mixing.mlp."),
    (r"blocks\.(\d+)\.norm2\.", r"blocks.\1.channel.norm."),
    (r"blocks\.(\d+)\.mlp_channels\.", r"blocks.\1.channel.mixing.mlp."),
]
TO_TIMM = [
    (r"stem\.", "stem.proj."),
    (r"blocks\.(\d+)\.token\.norm\.", r"blocks.\1.norm1."),
    (r"blocks\.(\d+)\.token\.mixing\.mlp\.", r"blocks.\1.mlp_tokens."),
    (r"blocks\.(\d+)\.channel\.norm\.", r"blocks.\1.norm2."),
    (r"blocks\.(\d+)\.channel\.mixing\.mlp\.", r"blocks.\1.mlp_channels."),
]


def rename_key(key: str, rules: list[tuple[str, str]]) -> str:
    for pattern, repl in rules:
        if re.match(pattern, key):
            return re.sub(pattern, repl, key, count=1)
    return key


def rename(state: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    return {rename_key(key, rules): value for key, value in state.items()}


def timm_to_pkmixer_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return rename(state, TO_OURS)


def pkmixer_to_timm_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return rename(state, TO_TIMM)
