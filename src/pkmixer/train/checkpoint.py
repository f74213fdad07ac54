"""Model checkpoints: what was built (registry name and overrides) and its weights, in one file.

A checkpoint is a ``torch.save`` dictionary that loads with ``weights_only=True`` (no pickled code runs):
``{"format": "pkmixer-checkpoint", "version": 1, "model": name, "overrides": {...}, "state_dict": {...}}``
plus any extra plain entries. It is written to a temporary file in the same folder and renamed into place, so
a crash never leaves a half-written checkpoint, and an existing file is only replaced when asked.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import write_atomically
from ..errors import ConfigError
from ..models.registry import create_model

FORMAT, VERSION = "pkmixer-checkpoint", 1


def save_model(path: str | os.PathLike, model: nn.Module, *, overwrite: bool = False, **extra: Any) -> Path:
    """Write ``model`` (built by :func:`pkmixer.create_model`) and ``extra`` entries atomically to ``path``."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ConfigError("only models built by pkmixer.create_model can be checkpointed (they carry their spec)")
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; refusing to overwrite it")
    payload = {"format": FORMAT, "version": VERSION, "model": spec.name, "overrides": dict(spec.overrides),
               "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **extra}
    write_atomically(path, lambda f: torch.save(payload, f))
    return path


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint dictionary, checked to be ours; a missing, corrupt or foreign file is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no checkpoint file at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, pickle with code, not a torch file at all
        raise ConfigError(f"{path} is not a readable checkpoint ({type(err).__name__}: {str(err).splitlines()[0]})")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a pkmixer checkpoint")
    if payload.get("version") != VERSION:
        raise ConfigError(f"{path} has checkpoint version {payload.get('version')!r}; this pkmixer reads {VERSION}")
    return payload


def load_model(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model of a checkpoint and load its weights, permutations and masks."""
    payload = read_checkpoint(path)
    model = create_model(payload["model"], **payload["overrides"])
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as err:
        raise ConfigError(f"{path}: weights do not fit {payload['model']} ({str(err).splitlines()[1].strip()})")
    return model
