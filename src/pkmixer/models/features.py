"""Shared pieces of the intermediate-features API (timm's ``forward_intermediates`` convention).

Every model has ``feature_names(where)`` and ``forward_intermediates(x, indices, where=...)``. ``where`` picks
the feature points: ``"block"`` - the output of each residual block (timm's choice); ``"mixing"`` - the
output of each mixing layer before it is added to the skip connection, the points Hayase & Karakida compare
with CKA (App. C.1, Fig. 2b-c). Features are returned as the model holds them: (B, S, C) for Mixers,
(B, m) for MLPs. This API is the part of the model contract that CKA reads
(:class:`pkmixer.models.contract.HasIntermediates`).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError

FEATURE_POINTS = ("block", "mixing")


def check_where(where: str) -> str:
    if where not in FEATURE_POINTS:
        raise ConfigError(f"where must be one of {', '.join(FEATURE_POINTS)}, got {where!r}")
    return where


def select_indices(n: int, indices: int | Sequence[int] | None) -> list[int]:
    """None: all n points; an int k: the last k; a sequence: those indices (negative counts from the end)."""
    if indices is None:
        return list(range(n))
    if isinstance(indices, int):
        if not 0 < indices <= n:
            raise ConfigError(f"cannot take the last {indices} of {n} feature points")
        return list(range(n - indices, n))
    out = []
    for i in indices:
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise ConfigError(f"feature index {i} out of range for {n} feature points")
        out.append(j)
    return sorted(set(out))


def point_format(output_fmt: str, allowed: tuple[str, ...]) -> str:
    """The layout of the features, one of ``allowed`` (timm's ``output_fmt``; a ``timm.layers.Format`` too)."""
    fmt = getattr(output_fmt, "value", output_fmt)
    if fmt not in allowed:
        raise ConfigError(f"output_fmt must be one of {', '.join(allowed)}, got {output_fmt!r}")
    return fmt
