"""What every model reports about itself: size, shape of the effective wide MLP, connections (Sec. 4.1).

``info()`` of the model contract (:mod:`pkmixer.models.contract`) returns a :class:`ModelInfo`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelInfo:
    """Parameters and the effective-MLP view of a model (Hayase & Karakida Eqs. 13-15).

    ``mixing_layers`` counts the hidden linear layers of the effective MLP; ``connections`` is Ω, the average number of non-zero entries of the effective weight per hidden layer;
    ``effective_width`` is m (S·C for a Mixer, the layer width for an MLP) and ``max_width`` the widest
    hidden layer (γm for MLP blocks); ``density`` is the mean fraction of non-zero entries, Ω / (in·out).
    For a Mixer, ``tokens_per_block`` is S after each block's token mixing; in a pyramid (Mixer supp. A.1) it
    varies, and ``num_tokens`` and ``effective_width`` are the first block's. Other families leave it None.
    """

    family: str
    params: int
    num_tokens: int | None
    embed_dim: int | None
    gamma_token: float | None
    gamma_channel: float | None
    depth: int
    mixing_layers: int
    connections: float
    effective_width: int
    max_width: int
    density: float
    tokens_per_block: tuple[int, ...] | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def gamma(self) -> str:
        """γ as printed in tables: one number, or token/channel when they differ."""
        if self.gamma_token is None and self.gamma_channel is None:
            return "-"
        token, channel = (None if g is None else f"{g:.3g}" for g in (self.gamma_token, self.gamma_channel))
        if token is None or channel is None or token == channel:
            return token or channel
        return f"{token}/{channel}"
