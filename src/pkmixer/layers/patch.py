"""The per-patch fully connected stem (Mixer supp. Eq. S.1; Hayase & Karakida App. A.2.1) as one matrix product.

:class:`PatchConv` is ``nn.Conv2d(in, out, P, stride=P)`` - the same parameters, state dict, initialisation hooks
and NCHW output - computed as the product of the (B·h·w, c·P·P) patch matrix with the flattened kernel. On CPU,
oneDNN's backward of a convolution whose kernel equals its stride costs far more than this product's (a (C, S) =
(87, 8) Mixer's training step is 1.22× faster with it: docs/performance.md, fast path 7 and section n). The result
equals the convolution's within float rounding, not bit for bit. The output is a channels-last view, so that the
models' ``flatten(2).transpose(1, 2)`` to (B, S₀, C) needs no copy. No Python branch on shapes: torch.fx,
TorchScript and torch.export trace it as it runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchConv(nn.Conv2d):
    """A per-patch FC: ``nn.Conv2d(in_chans, out_chans, patch_size, stride=patch_size)`` as one matrix product."""

    decayed_parameters = ("weight",)  # as nn.Conv2d (pkmixer.layers.decay)

    def __init__(self, in_chans: int, out_chans: int, patch_size: int, bias: bool = True) -> None:
        super().__init__(in_chans, out_chans, patch_size, stride=patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, c, H, W) -> (B, C, H/P, W/P), channels-last
        P = self.kernel_size[0]
        B, c = x.shape[0], x.shape[1]
        h, w = x.shape[2] // P, x.shape[3] // P
        patches = (x[:, :, :h * P, :w * P].reshape(B, c, h, P, w, P).permute(0, 2, 4, 1, 3, 5)
                   .reshape(B * h * w, c * P * P))
        y = F.linear(patches, self.weight.flatten(1), self.bias)  # (B·h·w, C)
        return y.view(B, h, w, self.out_channels).permute(0, 3, 1, 2)
