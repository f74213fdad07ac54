"""Model checkpoints: what was built (registry name and overrides) and its weights, in one file.

A checkpoint is a ``torch.save`` dictionary that loads with ``weights_only=True`` (no pickled code runs):
``{"format": "pkmixer-checkpoint", "version": 1, "model": name, "overrides": {...}, "state_dict": {...}}``
plus any extra plain entries. It is written to a temporary file in the same folder and renamed into place, so
a crash never leaves a half-written checkpoint, and an existing file is only replaced when asked. The overrides
also record every option whose default has changed (a model class's ``CHECKPOINT_DEFAULTS``), and reading a
file that lacks one fills in the value it was written with.
"""
from __future__ import annotations

import inspect
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import write_atomically
from ..errors import ConfigError
from ..models.registry import create_model, model_entry

FORMAT, VERSION = "pkmixer-checkpoint", 1


def save_model(path: str | os.PathLike, model: nn.Module, *, overwrite: bool = False, **extra: Any) -> Path:
    """Write ``model`` (built by :func:`pkmixer.create_model`) and ``extra`` entries atomically to ``path``."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ConfigError("only models built by pkmixer.create_model can be checkpointed (they carry their spec)")
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; refusing to overwrite it")
    overrides = {**recorded_options(model), **spec.overrides}
    payload = {"format": FORMAT, "version": VERSION, "model": spec.name, "overrides": overrides,
               "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **extra}
    write_atomically(path, lambda f: torch.save(payload, f))
    return path


def recorded_options(model: nn.Module) -> dict[str, Any]:
    """The options whose default has changed (the model class's ``CHECKPOINT_DEFAULTS``) with ``model``'s values:
    every checkpoint records them, so that a later default never changes what the file means."""
    return {key: getattr(model, key) for key in getattr(type(model), "CHECKPOINT_DEFAULTS", {})}


def with_checkpoint_defaults(name: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides to rebuild a checkpoint's model with today: each option of the class's
    ``CHECKPOINT_DEFAULTS`` that the file does not record takes the value it had when the file was written,
    and is left out where that is today's default (so the spec reads as if the model were built now)."""
    try:
        entry = model_entry(name)
    except Exception:  # not a registered name: left for create_model to refuse
        return overrides
    legacy = getattr(entry.cls, "CHECKPOINT_DEFAULTS", {})
    if not legacy:
        return overrides
    out, params = dict(overrides), inspect.signature(entry.cls.__init__).parameters
    for key, old in legacy.items():
        value = out.pop(key, old)
        if value != entry.defaults.get(key, params[key].default):
            out[key] = value
    return out


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint dictionary, checked to be ours; a missing, corrupt or foreign file is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no checkpoint file at {path}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's pickle warnings: the one-line error says what is wrong
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, pickle with code, not a torch file at all
        raise ConfigError(f"{path} is not a readable checkpoint ({type(err).__name__}: {str(err).splitlines()[0]})")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a pkmixer checkpoint")
    if payload.get("version") != VERSION:
        raise ConfigError(f"{path} has checkpoint version {payload.get('version')!r}; this pkmixer reads {VERSION}")
    if isinstance(payload.get("overrides"), dict):  # a file from before a default changed keeps its meaning
        payload["overrides"] = with_checkpoint_defaults(payload.get("model"), payload["overrides"])
    return payload


def load_model(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model of a checkpoint and load its weights, permutations and masks."""
    return model_from_checkpoint(read_checkpoint(path), path)


def model_from_checkpoint(payload: dict[str, Any], where: str | os.PathLike) -> nn.Module:
    """The model a checkpoint dictionary names, with its weights; ConfigError when they do not fit."""
    try:
        model = create_model(payload["model"], **payload["overrides"])
    except (KeyError, TypeError) as err:
        raise ConfigError(f"{where}: the checkpoint does not name a model and its options ({err})") from None
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    try:
        model.load_state_dict(payload["state_dict"])
    except (RuntimeError, KeyError, TypeError) as err:
        lines = str(err).splitlines()
        detail = (lines[1] if len(lines) > 1 else lines[0] if lines else type(err).__name__).strip()
        raise ConfigError(f"{where}: weights do not fit {payload['model']} ({detail})") from None
    return model
