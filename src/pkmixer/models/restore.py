"""Models rebuilt from checkpoint files (:mod:`pkmixer.checkpoint`): from every constructor argument a file
records, or - a file written before those were recorded - from its registry name and overrides, with the options
it lacks filled in as they were when it was written (``CHECKPOINT_DEFAULTS``)."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from torch import nn

from ..checkpoint import fill_checkpoint_defaults, read_checkpoint, read_weights
from ..errors import ConfigError
from .registry import create_model, model_entry


def checkpoint_overrides(name: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides to rebuild a checkpoint's model ``name`` with today (:func:`fill_checkpoint_defaults`)."""
    try:
        entry = model_entry(name)
    except Exception:  # not a registered name: left for create_model to refuse
        return overrides
    return fill_checkpoint_defaults(entry.cls, entry.defaults, overrides)


def rebuild_options(name: Any, overrides: dict[str, Any], arguments: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what to build a checkpoint's model with, what its spec records as overrides): every recorded constructor
    argument when the file has them (so later registry defaults do not matter), else the filled-in overrides."""
    if isinstance(arguments, dict) and arguments:
        return dict(arguments), dict(overrides)
    filled = checkpoint_overrides(name, overrides)  # a file from before arguments were recorded
    return filled, filled


def build_recorded(name: Any, overrides: dict[str, Any], arguments: Any = None, **changes: Any) -> nn.Module:
    """The model a checkpoint records (:func:`rebuild_options`), with ``changes`` on top; its spec records the
    file's name (an earlier name too, without the warning ``create_model`` gives for it), overrides and the
    changes, as if it had been built with them."""
    build, recorded = rebuild_options(name, overrides, arguments)
    try:
        canonical = model_entry(name).canonical
    except Exception:  # not a registered name: left for create_model to refuse
        canonical = name
    model = create_model(canonical, **{**build, **changes})
    model.spec = replace(model.spec, name=name, overrides={**recorded, **changes})
    return model


def load_model(path: str | os.PathLike) -> nn.Module:
    """Rebuild the model of a checkpoint (a ``.pt`` file) or of a weights file (``.safetensors``,
    :func:`pkmixer.checkpoint.save_weights`) and load its weights, permutations and masks."""
    if str(path).endswith(".safetensors"):
        payload = read_weights(path)
        if payload["format"] is None:
            raise ConfigError(f"{path} holds weights but no pkmixer model description (import it with "
                              "pkmixer.models.convert.import_checkpoint)")
        return model_from_checkpoint(payload, path)
    return model_from_checkpoint(read_checkpoint(path), path)


def model_from_checkpoint(payload: dict[str, Any], where: str | os.PathLike) -> nn.Module:
    """The model a checkpoint dictionary names, with its weights; ConfigError when they do not fit."""
    try:
        if not isinstance(payload["overrides"], dict):
            raise TypeError(f"overrides are a {type(payload['overrides']).__name__}")
        model = build_recorded(payload["model"], payload["overrides"], payload.get("arguments"))
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
