"""The input check every model makes: images (B, in_chans, img_size, img_size), else ``ValueError``.

A function of its own so that it stays one opaque node when torch.fx traces a model (each model module wraps it
with ``torch.fx.wrap``), and compiles in TorchScript: a model's ``forward`` has no Python branch on shapes.
"""
from __future__ import annotations

import torch


def check_image(x: torch.Tensor, in_chans: int, img_size: int) -> None:
    """Raise ``ValueError`` unless ``x`` has the shape (B, in_chans, img_size, img_size)."""
    if x.dim() != 4 or x.shape[1] != in_chans or x.shape[2] != img_size or x.shape[3] != img_size:
        raise ValueError(f"expected input of shape (B, {in_chans}, {img_size}, {img_size}), got {list(x.shape)}")
