"""Higher-resolution fine-tuning by block-diagonal token-mixing initialisation (MLP-Mixer supp. C).

At resolution ×K (patch size unchanged) a Mixer sees S' = K²S tokens. The enlarged model orders its tokens so
that each of the K×K spatial parts is one contiguous run (``token_tiles=K``: a fixed permutation of the
tokens, a PK permutation), widens each token-mixing MLP to K²·D_S hidden units, and starts from
W₁' = blockdiag(W₁, …, W₁) and W₂' = blockdiag(W₂, …, W₂) (K² copies; biases repeated), every other
parameter copied. Each part is then processed by the pre-trained MLP independently, so on an image tiled from
K×K images every token feature equals the original model's feature on the corresponding tile.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .mixer import Mixer
from .registry import create_model


def _check_enlargeable(model: nn.Module, factor: int) -> Mixer:
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ConfigError(f"the resolution factor must be a positive integer, got {factor!r}")
    if not isinstance(model, Mixer):
        raise ConfigError(f"only Mixers have token-mixing MLPs to enlarge, got {type(model).__name__}")
    if model.rp_blocks:
        raise ConfigError("RP blocks mix permuted tokens: their token MLPs cannot be copied block-diagonally")
    if model.num_tokens != model.grid_tokens or model.blocks[0].token.skip is not None:
        raise ConfigError("a Mixer whose token count differs from its patch grid (num_tokens) cannot be enlarged")
    if model.token_ablations:
        raise ConfigError(f"a Mixer with the supp. A.1 option(s) {', '.join(model.token_ablations)} has no "
                          "block-diagonal enlargement")
    if getattr(model, "spec", None) is None:
        raise ConfigError("only models built by pkmixer.create_model (or loaded from checkpoints) can be enlarged")
    return model


def enlarged_options(model: Mixer, factor: int) -> dict:
    """The create_model options of the enlarged model (every argument the model was built with, plus the new
    sizes)."""
    options = {**model.spec.arguments, "img_size": model.img_size * factor,
               "token_tiles": model.token_tiles * factor}
    if model.token_hidden is not None:  # explicit widths win over any mlp_ratio
        options["token_hidden"] = model.token_hidden * factor ** 2
        options["channel_hidden"] = model.channel_hidden
    return options


def enlarged_state_dict(model: Mixer, factor: int) -> dict[str, torch.Tensor]:
    """The model's weights for K = ``factor``: token-mixing Dense layers block-diagonal, the rest copied."""
    _check_enlargeable(model, factor)
    copies = factor ** 2
    state = {}
    token_linears = {f"blocks.{i}.token.mixing.mlp.{name}"
                     for i, blk in enumerate(model.blocks)
                     for name, module in blk.token.mixing.mlp.named_children() if isinstance(module, nn.Linear)}
    for key, value in model.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        if prefix in token_linears:
            value = torch.block_diag(*[value] * copies) if leaf == "weight" else value.repeat(copies)
        state[key] = value.detach().clone()
    return state


def enlarge_resolution(model: Mixer, factor: int) -> Mixer:
    """A Mixer for ``factor``× the resolution, initialised as in the Mixer supplementary C."""
    _check_enlargeable(model, factor)
    big = create_model(model.spec.name, **enlarged_options(model, factor))
    big.load_state_dict(enlarged_state_dict(model, factor))
    return big.to(next(model.parameters()).dtype)
