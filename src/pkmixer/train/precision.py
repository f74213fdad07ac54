"""What a run's arithmetic is, resolved once for its device (Hayase & Karakida App. C.3: the paper trained in
fp32)."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from .config import RunConfig


@dataclass(frozen=True)
class Precision:
    """fp32, fp32 with TF32 matrix products on CUDA (``run.tf32``), or bf16 autocast (``run.amp``: bf16, or auto
    on a GPU only)."""

    bf16: bool = False
    tf32: bool = False

    @classmethod
    def resolve(cls, run: RunConfig, device: torch.device) -> Precision:
        return cls(bf16=run.amp == "bf16" or (run.amp == "auto" and device.type == "cuda"),
                   tf32=run.tf32 and device.type == "cuda")

    def apply(self) -> None:
        """torch's TF32 switches for CUDA matrix products and convolutions."""
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32

    def autocast(self, device: torch.device):
        """bf16 autocast, or nothing: fp32."""
        return torch.autocast(device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()

    def __str__(self) -> str:
        if self.bf16:
            return "bf16 autocast"
        return "fp32 (TF32 matmul)" if self.tf32 else "fp32"
