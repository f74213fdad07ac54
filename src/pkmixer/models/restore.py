"""Models rebuilt from checkpoint files (:mod:`pkmixer.checkpoint`): the registry name and overrides a file
records, with the options it lacks filled in as they were when it was written (``CHECKPOINT_DEFAULTS``)."""
from __future__ import annotations

import os
from typing import Any

from torch import nn

from ..checkpoint import fill_checkpoint_defaults, read_checkpoint
from ..errors import ConfigError
from .registry import create_model, model_entry


def checkpoint_overrides(name: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides to rebuild a checkpoint's model ``name`` with today (:func:`fill_checkpoint_defaults`)."""
    try:
        entry = model_entry(name)
    except Exception:  # not a registered name: left for create_model to refuse
        return overrides
    return fill_checkpoint_defaults(entry.cls, entry.defaults, overrides)


def load_model(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model of a checkpoint and load its weights, permutations and masks."""
    return model_from_checkpoint(read_checkpoint(path), path)


def model_from_checkpoint(payload: dict[str, Any], where: str | os.PathLike) -> nn.Module:
    """The model a checkpoint dictionary names, with its weights; ConfigError when they do not fit."""
    try:
        overrides = payload["overrides"]
        if isinstance(overrides, dict):  # a file from before a default changed keeps its meaning
            overrides = checkpoint_overrides(payload["model"], overrides)
        model = create_model(payload["model"], **overrides)
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
