"""Weights as users get them: safetensors files, the folder a model is shared as on the Hugging Face hub, and the
hub weights timm names (Google's Mixers).

* :func:`save_pretrained` writes the folder timm's ``push_to_hf_hub`` uploads: ``model.safetensors`` (the weights
  and what the model was built with, :func:`pkmixer.checkpoint.save_weights`), ``config.json`` in timm's layout
  (``architecture``, ``num_classes``, ``model_args``, ``pretrained_cfg``) and a model card ``README.md`` that says
  what the weights are and how they were made. ``timm.create_model("local-dir:<folder>", pretrained=True)`` and
  ``pkmixer.create_model(name, pretrained=<folder>)`` read it back, offline.
* :func:`find_weights` resolves ``create_model``'s ``pretrained``: a weights file, a folder, ``"hf-hub:<repo>"``,
  or ``True`` for the hub weights of timm's name and tag (``mixer_b16_224.goog_in21k_ft_in1k``: Google's Mixer-B/16,
  as timm converted it), taken from the local Hugging Face cache when they are there (``HF_HOME``;
  ``HF_HUB_OFFLINE=1`` never downloads). Weights named as timm's ``MlpMixer`` names them are renamed to ours
  (:mod:`pkmixer.models.timm_names`); they compute with the exact GELU, as timm does (``act="gelu"``).
* :func:`load_weights` loads them into a built model; a head of another size is left as the model built it.

A Flax ``.npz``, a timm ``.pth`` and a pkmixer ``.pt`` import through :func:`pkmixer.models.convert.import_checkpoint`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import write_atomically
from ..checkpoint import WEIGHTS_FORMAT, read_weights, save_weights
from ..errors import ConfigError
from .timm_names import timm_to_pkmixer_state_dict

WEIGHTS_FILE, CONFIG_FILE, CARD_FILE = "model.safetensors", "config.json", "README.md"
HEAD = ("head.weight", "head.bias")
# the keys of a pretrained cfg that describe where weights came from, not the model: left out of config.json
_SOURCE_KEYS = ("architecture", "url", "file", "hf_hub_id", "hf_hub_filename", "source", "state_dict")
# what weights bring to the model's pretrained cfg: the preprocessing they expect and where they come from
WEIGHTS_CFG_KEYS = ("mean", "std", "interpolation", "crop_pct", "crop_mode", "num_classes", "license", "hf_hub_id", "tag",
             "origin_url", "paper_ids", "paper_name", "notes", "label_names", "label_descriptions")


@dataclass
class Weights:
    """Weights in our parameter names, with what they were saved with."""

    state_dict: dict[str, torch.Tensor]
    where: str  # for messages: the file, folder or hub repo
    model: str | None = None  # the registered name they were saved from (None: not recorded)
    arguments: dict[str, Any] = field(default_factory=dict)  # to build with, under the caller's overrides
    overrides: dict[str, Any] = field(default_factory=dict)  # what the model's spec records of them
    cfg: dict[str, Any] = field(default_factory=dict)  # timm pretrained-cfg keys for the model's pretrained_cfg


def find_weights(name: str, tag: str | None, pretrained: Any) -> Weights:
    """The weights ``create_model(name, pretrained=...)`` asks for (see the module docstring)."""
    if pretrained is True:
        return hub_weights(name, tag)
    if not isinstance(pretrained, (str, os.PathLike)):
        raise ConfigError(f"pretrained must be true or false, a weights file or folder, or 'hf-hub:<repo>'; "
                          f"got {pretrained!r}")
    text = os.fspath(pretrained)
    if text.startswith("hf-hub:"):
        repo = text.removeprefix("hf-hub:")
        return read_folder(hub_folder(repo, optional=(CONFIG_FILE,)), where=text)
    path = Path(text)
    if path.is_dir():
        return read_folder(path)
    if path.suffix == ".safetensors" or path.is_file() and path.suffix not in (".pt", ".pth", ".npz"):
        return read_file(path)
    if path.suffix in (".pt", ".pth", ".npz"):
        raise ConfigError(f"{path}: pretrained= reads safetensors weights and their folders; import a .pt, .pth or "
                          ".npz with pkmixer.models.convert.import_checkpoint (pkmixer convert)")
    raise ConfigError(f"no weights file or folder at {path}")


def read_file(path: Path, where: str | None = None) -> Weights:
    """A safetensors file: a pkmixer weights file, or a state dict in timm's (or our) parameter names."""
    payload = read_weights(path)
    where = where or str(path)
    if payload["format"] != WEIGHTS_FORMAT:  # e.g. model.safetensors of a timm hub repo
        state = payload["state_dict"]
        if "stem.proj.weight" in state:
            state = timm_to_pkmixer_state_dict(state)
        classes = {"num_classes": int(state["head.bias"].shape[0])} if "head.bias" in state else {}
        return Weights(state, where, arguments=classes, overrides=classes)
    return Weights(payload["state_dict"], where, payload["model"], payload["arguments"], payload["overrides"])


def read_folder(folder: Path, where: str | None = None) -> Weights:
    """A folder as :func:`save_pretrained` writes it (or a timm hub repo's files): ``model.safetensors``, and
    ``config.json`` for the preprocessing the weights expect, if there."""
    folder = Path(folder)
    weights = read_file(folder / WEIGHTS_FILE, where or str(folder)) if (folder / WEIGHTS_FILE).is_file() else None
    if weights is None:
        raise ConfigError(f"{where or folder} has no {WEIGHTS_FILE}")
    config_path = folder / CONFIG_FILE
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
            cfg = dict(config.get("pretrained_cfg", {}))
        except (ValueError, AttributeError, TypeError) as err:
            raise ConfigError(f"{config_path} is not a timm model config ({err})") from None
        weights.cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in WEIGHTS_CFG_KEYS}
        architecture = config.get("architecture")
        if weights.model is None and isinstance(architecture, str) and architecture.startswith("pkmixer_"):
            weights.model = architecture.removeprefix("pkmixer_")
    return weights


def hub_folder(repo: str, files: tuple[str, ...] = (WEIGHTS_FILE,), optional: tuple[str, ...] = ()) -> Path:
    """The local folder of a Hugging Face hub repo's ``files`` (and of those of ``optional`` it has): the local
    cache when they are there, else a download (none with ``HF_HUB_OFFLINE=1``)."""
    from huggingface_hub import hf_hub_download

    found = None
    for name in (*files, *optional):
        try:
            found = Path(hf_hub_download(repo_id=repo, filename=name)).parent
        except Exception as err:  # not cached and offline, no such repo or file, no network
            if name in optional:
                continue
            offline = " (HF_HUB_OFFLINE is set: only the local cache is read)" if os.environ.get("HF_HUB_OFFLINE") \
                else ""
            raise ConfigError(f"cannot get {name} of the Hugging Face hub repo {repo}{offline}: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}") from None
    return found


def hub_weights(name: str, tag: str | None) -> Weights:
    """The hub weights of timm's model ``name`` (a Listing 1 Mixer of the same name) with ``tag`` (None: timm's
    default for the name), with timm's pretrained cfg for them (Google's normalisation, 0.5 and 0.5)."""
    import timm
    from timm.models import get_pretrained_cfg, list_pretrained

    full = name if tag is None else f"{name}.{tag}"
    cfg = get_pretrained_cfg(full) if timm.is_model(name) else None
    if cfg is None or not cfg.hf_hub_id:
        tags = [t for t in list_pretrained(f"{name}.*") if get_pretrained_cfg(t).hf_hub_id] if timm.is_model(name) else []
        known = f"; timm has {', '.join(tags)}" if tags else "; timm has none for it"
        raise ConfigError(f"no hub weights for {full}{known}. Pass a weights file or folder as pretrained=")
    weights = read_folder(hub_folder(cfg.hf_hub_id), where=f"hf-hub:{cfg.hf_hub_id}")
    weights.cfg = {k: v for k, v in cfg.to_dict().items() if k in WEIGHTS_CFG_KEYS and v is not None}
    return weights


def load_weights(model: nn.Module, weights: Weights) -> None:
    """Load ``weights`` into ``model`` (built for them); a head of another number of classes stays the model's
    own new one. A tensor that does not fit is a ConfigError naming it."""
    state = dict(weights.state_dict)
    own = model.state_dict()
    replaced = [k for k in HEAD if k in state and k in own and state[k].shape != own[k].shape]
    for key in replaced:
        del state[key]
    try:
        result = model.load_state_dict(state, strict=not replaced)
    except (RuntimeError, KeyError, TypeError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise ConfigError(f"{weights.where}: the weights do not fit the model ({lines[1] if len(lines) > 1 else lines[0]})") \
            from None
    if result is not None and (result.unexpected_keys or set(result.missing_keys) - set(replaced)):
        raise ConfigError(f"{weights.where}: the weights do not fit the model (missing "
                          f"{sorted(set(result.missing_keys) - set(replaced))}, unexpected {result.unexpected_keys})")
    cfg = {k: v for k, v in weights.cfg.items() if k != "num_classes" or not replaced}
    if hasattr(model, "pretrained_cfg") and cfg:
        model.pretrained_cfg = cfg


# ---- the folder timm's push_to_hf_hub uploads ---------------------------------------------------------------

def save_pretrained(model: nn.Module, folder: str | os.PathLike, *, how_made: str, overwrite: bool = False) -> Path:
    """Write ``model`` (built by ``create_model``) as the folder timm's ``push_to_hf_hub`` uploads (module
    docstring); ``how_made`` says in the model card how the weights were made (the training run, its data and
    result, or "not trained"). An existing non-empty folder is replaced only with ``overwrite``."""
    if getattr(model, "spec", None) is None:
        raise ConfigError("only models built by pkmixer.create_model can be saved (they carry their spec)")
    if not isinstance(how_made, str) or not how_made.strip():
        raise ConfigError("how_made must say how the weights were made (it goes into the model card)")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise ConfigError(f"{folder} is not empty; refusing to overwrite it")
    config = hub_config(model)
    text = json.dumps(config, indent=2)  # before anything is written: a value JSON cannot hold is a ConfigError
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(folder / WEIGHTS_FILE, model, overwrite=True)
    write_atomically(folder / CONFIG_FILE, lambda f: f.write(text.encode()))
    card = model_card(model, config, how_made)
    write_atomically(folder / CARD_FILE, lambda f: f.write(card.encode()))
    return folder


def _json_value(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"{value!r} cannot be written to config.json")


def hub_config(model: nn.Module) -> dict[str, Any]:
    """``config.json`` in timm's layout: what ``timm.create_model("local-dir:...")`` rebuilds the model from."""
    cfg = model.pretrained_cfg
    pretrained_cfg = {k: _json_value(v) for k, v in cfg.items() if v is not None and k not in _SOURCE_KEYS}
    config = {"architecture": cfg["architecture"], "num_classes": model.num_classes,
              "num_features": model.num_features}
    if getattr(model, "global_pool", ""):
        config["global_pool"] = model.global_pool
    config["model_args"] = _json_value(dict(model.spec.overrides))
    config["pretrained_cfg"] = pretrained_cfg
    return config


CITATIONS = {
    "hayase": """@inproceedings{hayase2024understanding,
  title = {Understanding {MLP}-Mixer as a wide and sparse {MLP}},
  author = {Hayase, Tomohiro and Karakida, Ryo},
  booktitle = {Proceedings of the 41st International Conference on Machine Learning},
  series = {Proceedings of Machine Learning Research},
  volume = {235},
  pages = {17734--17758},
  year = {2024}
}""",
    "tolstikhin": """@inproceedings{tolstikhin2021mixer,
  title = {{MLP}-Mixer: An all-{MLP} Architecture for Vision},
  author = {Tolstikhin, Ilya and Houlsby, Neil and Kolesnikov, Alexander and Beyer, Lucas and Zhai, Xiaohua and
            Unterthiner, Thomas and Yung, Jessica and Steiner, Andreas and Keysers, Daniel and Uszkoreit, Jakob and
            Lucic, Mario and Dosovitskiy, Alexey},
  booktitle = {Advances in Neural Information Processing Systems},
  year = {2021}
}""",
}


def model_card(model: nn.Module, config: dict[str, Any], how_made: str) -> str:
    """The ``README.md`` of the folder, with the front matter the hub reads (as timm's ``generate_readme``): what
    the weights are (architecture, sizes, parameters, input and normalisation), how they were made, how to load
    them, and what to cite."""
    cfg = model.pretrained_cfg
    name = config["architecture"]
    info = model.info() if hasattr(model, "info") else None
    papers = [k for k, word in (("hayase", "Understanding MLP-Mixer"), ("tolstikhin", "MLP-Mixer: An all-MLP"))
              if word in (cfg.get("paper_name") or "")]
    data_set = getattr(model, "data_set", None)
    lines = ["---", "tags:", "- image-classification", "- timm", "- pkmixer", "library_name: timm",
             f"license: {cfg.get('license') or 'apache-2.0'}"]
    if data_set:
        lines += ["datasets:", f"- {data_set}"]
    lines += ["---", f"# Model card for {name}", "", f"{cfg.get('description') or type(model).__name__}: "
              f"a `{type(model).__name__}` of pkmixer, the models of Hayase & Karakida, \"Understanding MLP-Mixer as "
              "a Wide and Sparse MLP\" (ICML 2024).", "", "## What the weights are", "",
              f"- **Architecture:** `{model.spec.name}` with {dict(model.spec.overrides) or 'its registered options'}",
              f"- **Parameters:** {sum(p.numel() for p in model.parameters()):,}"]
    if info is not None:
        lines.append(f"- **Family:** {info.family}; effective width m = {info.effective_width}, "
                     f"{info.mixing_layers} hidden maps of {info.connections:.4g} connections each, density "
                     f"{info.density:.4g}")
    lines += [f"- **Input:** {tuple(cfg['input_size'])}, normalised with mean {tuple(cfg['mean'])} and std "
              f"{tuple(cfg['std'])}" + (f" ({data_set})" if data_set else ""),
              f"- **Classes:** {model.num_classes}", "", "## How they were made", "", how_made.strip(), "",
              "## How to load them", "", "```python", "import timm", "import pkmixer  # registers pkmixer's models "
              "with timm", "", "model = timm.create_model(\"local-dir:<this folder>\", pretrained=True)  # or "
              "\"hf-hub:<repo>\"", f"model = pkmixer.create_model(\"{model.spec.name}\", pretrained=\"<this folder>\")",
              "```", ""]
    if papers:
        lines += ["## Citation", ""]
        for key in papers:
            lines += ["```bibtex", CITATIONS[key], "```"]
    return "\n".join(lines) + "\n"
