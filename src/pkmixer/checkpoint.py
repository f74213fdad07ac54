"""The checkpoint file format: what was built (registry name and overrides) and its weights, in one file.

A checkpoint is a ``torch.save`` dictionary that loads with ``weights_only=True`` (no pickled code runs):
``{"format": "pkmixer-checkpoint", "version": 1, "model": name, "overrides": {...}, "arguments": {...},
"state_dict": {...}}`` plus any extra plain entries. It is written to a temporary file in the same folder and
renamed into place, so a crash never leaves a half-written checkpoint, and an existing file is only replaced
when asked. ``arguments`` are every constructor argument the model was built with (``model.spec.arguments``): a
file that has them is rebuilt from them, whatever the registry's defaults are by then. A file written before
they were recorded is rebuilt from its overrides, with the options whose default has changed since (a model
class's ``CHECKPOINT_DEFAULTS``) given the values they had then (:func:`fill_checkpoint_defaults`).

A weights file (:func:`save_weights`, :func:`read_weights`) holds the same description and the weights only, as
safetensors: tensors by name, no pickle at all, the description in the file's metadata (``format``
``pkmixer-weights``; ``model``; ``overrides`` and ``arguments`` as Python literals). That is the file a model is
shared as (``model.safetensors`` of a Hugging Face folder, :mod:`pkmixer.models.weights`); checkpoints that
resume a run (optimiser, schedule, random state) stay torch files.

This module knows the file, not the model zoo: it sits below :mod:`pkmixer.models` and :mod:`pkmixer.train`.
Rebuilding the model a file names is :func:`pkmixer.models.restore.load_model` (and ``model_from_checkpoint``),
which looks the name up in the registry and fills in the defaults.
"""
from __future__ import annotations

import ast
import inspect
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .atomic import write_atomically
from .errors import ConfigError

FORMAT, VERSION = "pkmixer-checkpoint", 1
WEIGHTS_FORMAT = "pkmixer-weights"  # the metadata of a safetensors weights file; version VERSION


def save_model(path: str | os.PathLike, model: nn.Module, *, overwrite: bool = False, **extra: Any) -> Path:
    """Write ``model`` (built by :func:`pkmixer.create_model`) and ``extra`` entries atomically to ``path``."""
    spec = _spec(model)
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; refusing to overwrite it")
    payload = {"format": FORMAT, "version": VERSION, "model": spec.name, "overrides": dict(spec.overrides),
               "arguments": dict(spec.arguments),
               "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **extra}
    write_atomically(path, lambda f: torch.save(payload, f))
    return path


def fill_checkpoint_defaults(cls: type, registered: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides to rebuild a checkpoint's model of class ``cls`` (whose registry entry sets ``registered``
    defaults) with today: each option of the class's ``CHECKPOINT_DEFAULTS`` that the file does not record takes
    the value it had when the file was written, and is left out where that is today's default (so the spec reads
    as if the model were built now)."""
    legacy = getattr(cls, "CHECKPOINT_DEFAULTS", {})
    if not legacy:
        return overrides
    out, params = dict(overrides), inspect.signature(cls.__init__).parameters
    for key, old in legacy.items():
        value = out.pop(key, old)
        if value != registered.get(key, params[key].default):
            out[key] = value
    return out


def upgrade_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict of an earlier version as today's layers hold it: an SW-MLP sparse layer's kept weights, the
    1-D ``values`` beside its (2, nnz) ``indices``, become the (1, nnz) row (``SparseLinear`` loads either)."""
    out = dict(state)
    for key, value in state.items():
        indices = state.get(key.removesuffix("values") + "indices") if key.endswith("values") else None
        if isinstance(value, torch.Tensor) and value.ndim == 1 and isinstance(indices, torch.Tensor) \
                and indices.ndim == 2 and indices.shape[1] == value.shape[0]:
            out[key] = value.view(1, -1)
    return out


def fit_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After ``optimizer.load_state_dict`` of a checkpoint of an earlier version: each state tensor that holds a
    parameter's elements in the parameter's earlier shape (an SW-MLP's 1-D kept weights, now a (1, nnz) row) takes
    the parameter's shape, so that the optimiser steps as it did."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.shape != p.shape and value.numel() == p.numel() > 1:
                    state[key] = value.view(p.shape)


def check_version(payload: dict[str, Any], path: str | os.PathLike) -> None:
    """Refuse a checkpoint dictionary of another format version than this pkmixer reads."""
    if payload.get("version") != VERSION:
        raise ConfigError(f"{path} has checkpoint version {payload.get('version')!r}; this pkmixer reads {VERSION}")


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint dictionary as the file holds it, checked to be ours; a missing, corrupt or foreign file is a
    ConfigError. (The overrides are the file's: the defaults it lacks are filled in when its model is built; its
    weights are in today's layout, :func:`upgrade_state_dict`.)"""
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
    check_version(payload, path)
    if isinstance(payload.get("state_dict"), dict):
        payload["state_dict"] = upgrade_state_dict(payload["state_dict"])
    return payload


def _spec(model: nn.Module) -> Any:
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ConfigError("only models built by pkmixer.create_model can be saved (they carry their spec)")
    return spec


def save_weights(path: str | os.PathLike, model: nn.Module, *, overwrite: bool = False) -> Path:
    """Write ``model``'s weights (built by :func:`pkmixer.create_model`) and what it was built with atomically to
    ``path`` as safetensors (see the module docstring)."""
    from safetensors.torch import save

    spec = _spec(model)
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; refusing to overwrite it")
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": WEIGHTS_FORMAT, "version": str(VERSION), "model": spec.name,
                "overrides": repr(dict(spec.overrides)), "arguments": repr(dict(spec.arguments))}
    data = save(tensors, metadata)
    write_atomically(path, lambda f: f.write(data))
    return path


def read_weights(path: str | os.PathLike) -> dict[str, Any]:
    """A safetensors file's tensors and description: ``{"format", "version", "model", "overrides", "arguments",
    "state_dict"}`` for a pkmixer weights file, ``{"format": None, "metadata": {...}, "state_dict"}`` for any other
    (a timm state dict, say). A missing or corrupt file is a ConfigError."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no weights file at {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            state = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as err:  # not safetensors, truncated, a bad header
        raise ConfigError(f"{path} is not a readable safetensors file ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if metadata.get("format") != WEIGHTS_FORMAT:
        return {"format": None, "metadata": metadata, "state_dict": state}
    if metadata.get("version") != str(VERSION):
        raise ConfigError(f"{path} has weights format version {metadata.get('version')!r}; this pkmixer reads {VERSION}")
    try:
        overrides, arguments = (ast.literal_eval(metadata[k]) for k in ("overrides", "arguments"))
        if not (isinstance(overrides, dict) and isinstance(arguments, dict) and isinstance(metadata["model"], str)):
            raise ValueError("not a name and two dictionaries")
    except (KeyError, ValueError, SyntaxError, TypeError) as err:
        raise ConfigError(f"{path}: its metadata does not name a model and its options ({err})") from None
    return {"format": WEIGHTS_FORMAT, "version": VERSION, "model": metadata["model"], "overrides": overrides,
            "arguments": arguments, "state_dict": state}
