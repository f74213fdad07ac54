"""Weight conversion for Listing 1's MLP-Mixer: timm models, timm state-dict files, Google's Flax ``.npz``
checkpoints and pkmixer checkpoints.

Only a normal MLP-Mixer converts: the architecture of Listing 1 in the Mixer supplementary (Tolstikhin et al.
2021, App. F; ``block="mlp"``, S = S₀, no RP blocks), which is what timm implements and what Google's
official checkpoints hold. Tensors are copied unchanged, so every conversion is bit-exact both ways.

* timm: parameter names map one to one (``from_timm``, ``to_timm``, the ``*_state_dict`` renames).
* Flax: Listing 1's parameter tree flattened with ``/``, as Google's ``.npz`` checkpoints store it:
  ``stem/kernel`` (P, P, in, C; HWIO), ``MixerBlock_{i}/LayerNorm_0/scale|bias``,
  ``MixerBlock_{i}/token_mixing/Dense_{0,1}/kernel|bias`` (kernels (in, out)), ``MixerBlock_{i}/LayerNorm_1``,
  ``MixerBlock_{i}/channel_mixing/Dense_{0,1}``, ``pre_head_layer_norm/scale|bias``, ``head/kernel|bias``.
* The activation: Listing 1 uses Flax's ``nn.gelu``, the tanh approximation (``act="gelu_tanh"``); timm and
  our Mixer by default use the exact GELU (``act="gelu"``). No format but ours records it, so a Flax ``.npz``
  imports as ``act="gelu_tanh"`` and a timm state dict as ``act="gelu"`` unless ``act`` says otherwise, and
  writing a model to a format whose reader assumes the other GELU warns (:class:`ActivationWarning`).
* Files: :func:`import_checkpoint` reads any of the three formats (and safetensors: a pkmixer weights file, or a
  timm state dict as the Hugging Face hub holds them) into a registered model (architecture
  inferred from the shapes, or checked against a named model; optionally a fresh head), and
  :func:`export_checkpoint` writes one; :func:`convert_checkpoint` is the two together (``pkmixer convert``).
  None of the formats records the LayerNorm ε: Flax and timm use 1e-6.
"""
from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..atomic import write_atomically
from ..checkpoint import FORMAT, check_version, read_weights, save_model, save_weights, upgrade_state_dict
from ..errors import ConfigError, check_positive_int
from .mixer import ACTIVATIONS, Mixer
from .registry import ModelEntry, create_model, list_models, model_entry
from .restore import rebuild_options
from .timm_names import TO_TIMM, rename_key, pkmixer_to_timm_state_dict, timm_to_pkmixer_state_dict

# the GELU each format's own code computes; a file records neither (Flax's nn.gelu is the tanh approximation)
FORMAT_ACT = {"flax": "gelu_tanh", "timm": "gelu"}
_FORMAT_NAMES = {"flax": "Flax (Listing 1)", "timm": "timm"}


class ActivationWarning(UserWarning):
    """A model goes to a checkpoint format whose own code computes another GELU than the model does."""


def _check_listing1(model: nn.Module, target: str) -> None:
    """Raise unless ``model`` is Listing 1's MLP-Mixer, the one architecture timm and Flax checkpoints hold."""
    if not isinstance(model, Mixer) or model.block_kind != "mlp":
        raise ConfigError(f"only an MLP-Mixer (block='mlp') converts to or from {target}")
    if model.activation not in FORMAT_ACT.values():
        raise ConfigError(f"{target} has a GELU MLP-Mixer, not act={model.activation!r}: this Mixer does not convert")
    if model.rp_blocks or model.num_tokens != model.grid_tokens or model.blocks[0].token.skip is not None:
        raise ConfigError(f"{target} has no RP blocks and no token projection: this Mixer does not convert")
    if model.token_ablations:
        raise ConfigError(f"{target} has none of the supp. A.1 token-mixing options "
                          f"({', '.join(model.token_ablations)}): this Mixer does not convert")


def from_timm(timm_model: nn.Module) -> Mixer:
    """A :class:`Mixer` with the architecture and weights of a timm ``MlpMixer`` (Listing 1)."""
    from timm.models.mlp_mixer import MixerBlock, MlpMixer

    if not isinstance(timm_model, MlpMixer) or not all(isinstance(b, MixerBlock) for b in timm_model.blocks):
        raise ConfigError(f"expected a timm MlpMixer with MixerBlocks (mixer_*), got {type(timm_model).__name__}")
    proj = timm_model.stem.proj
    blk = timm_model.blocks[0]
    act = blk.mlp_tokens.act
    if type(act) is not nn.GELU or act.approximate not in ("none", "tanh"):
        raise ConfigError(f"expected a timm MlpMixer with GELU activations, got {act}")
    ours = Mixer(img_size=timm_model.stem.img_size[0], patch_size=proj.kernel_size[0], in_chans=proj.in_channels,
                 num_classes=timm_model.num_classes, embed_dim=timm_model.embed_dim, depth=len(timm_model.blocks),
                 token_hidden=blk.mlp_tokens.fc1.out_features, channel_hidden=blk.mlp_channels.fc1.out_features,
                 norm_eps=blk.norm1.eps, act="gelu" if act.approximate == "none" else "gelu_tanh")
    ours.to(next(timm_model.parameters()).dtype)  # first, so that float64 weights are not rounded to float32
    ours.load_state_dict(timm_to_pkmixer_state_dict(timm_model.state_dict()))
    return ours


def to_timm(model: Mixer) -> nn.Module:
    """A timm ``MlpMixer`` with the architecture and weights of a normal MLP-Mixer, and its GELU (a model with
    ``act="gelu_tanh"`` gives a timm model built with the tanh GELU; timm's registered mixers use the exact one)."""
    from timm.models.mlp_mixer import MlpMixer

    _check_listing1(model, "timm")
    C = model.embed_dim
    # timm computes hidden = int(ratio * C); the half keeps int() from rounding down a float error
    ratio = ((model.token_hidden + 0.5) / C, (model.channel_hidden + 0.5) / C)
    timm_model = MlpMixer(num_classes=model.num_classes, img_size=model.img_size, in_chans=model.in_chans,
                          patch_size=model.patch_size, num_blocks=model.depth, embed_dim=C, mlp_ratio=ratio,
                          norm_layer=partial(nn.LayerNorm, eps=model.norm.eps), act_layer=ACTIVATIONS[model.activation])
    timm_model.to(next(model.parameters()).dtype)  # first, so that float64 weights are not rounded to float32
    timm_model.load_state_dict(pkmixer_to_timm_state_dict(model.state_dict()))
    return timm_model


# ---- Flax names (Listing 1) ------------------------------------------------------------------------------
# layouts: "conv" is (C, in, P, P) here and (P, P, in, C) in Flax; "dense" is (out, in) here and (in, out)
# in Flax; "vector" is the same in both
_NDIM = {"conv": 4, "dense": 2, "vector": 1}
_BLOCK_INDEX = {"flax": re.compile(r"MixerBlock_(\d+)/"), "timm": re.compile(r"blocks\.(\d+)\."),
                "pkmixer": re.compile(r"blocks\.(\d+)\.")}


def _listing1_names(fmt: str, depth: int) -> list[tuple[str, str, str]]:
    """(our name, its name in ``fmt``, layout) for every parameter of a ``depth``-block Listing 1 Mixer."""
    rows = [("stem.weight", "stem/kernel", "conv"), ("stem.bias", "stem/bias", "vector")]
    for i in range(depth):
        for ln, part, flax_part in ((0, "token", "token_mixing"), (1, "channel", "channel_mixing")):
            rows += [(f"blocks.{i}.{part}.norm.weight", f"MixerBlock_{i}/LayerNorm_{ln}/scale", "vector"),
                     (f"blocks.{i}.{part}.norm.bias", f"MixerBlock_{i}/LayerNorm_{ln}/bias", "vector")]
            for d in (0, 1):
                ours, flax = f"blocks.{i}.{part}.mixing.mlp.fc{d + 1}", f"MixerBlock_{i}/{flax_part}/Dense_{d}"
                rows += [(f"{ours}.weight", f"{flax}/kernel", "dense"), (f"{ours}.bias", f"{flax}/bias", "vector")]
    rows += [("norm.weight", "pre_head_layer_norm/scale", "vector"),
             ("norm.bias", "pre_head_layer_norm/bias", "vector"),
             ("head.weight", "head/kernel", "dense"), ("head.bias", "head/bias", "vector")]
    if fmt == "flax":
        return rows
    if fmt == "timm":
        return [(ours, rename_key(ours, TO_TIMM), layout) for ours, _, layout in rows]
    return [(ours, ours, layout) for ours, _, layout in rows]


def _flax_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The Flax shape of one of our tensors of the given layout."""
    if layout == "conv":
        return shape[2], shape[3], shape[1], shape[0]
    return tuple(reversed(shape))


def _check_names(where: str, fmt: str, state: Mapping[str, Any]) -> int:
    """The depth of the Listing 1 Mixer whose parameters ``state`` (named as in ``fmt``) holds, exactly and
    with the right number of dimensions; anything else is a ConfigError naming the parameter."""
    blocks = {int(m.group(1)) for key in state if (m := _BLOCK_INDEX[fmt].match(key))}
    if not blocks:
        example = _listing1_names(fmt, 1)[2][1]  # the first block's first LayerNorm scale
        raise ConfigError(f"{where} has no Mixer block parameters (such as {example}): "
                          "not an MLP-Mixer as in Listing 1")
    rows = _listing1_names(fmt, max(blocks) + 1)
    names = {name for _, name, _ in rows}
    for _, name, layout in rows:
        if name not in state:
            raise ConfigError(f"{where} lacks {name}, a parameter of Listing 1's MLP-Mixer")
        if len(state[name].shape) != _NDIM[layout]:
            raise ConfigError(f"{where}: {name} has shape {tuple(state[name].shape)}, "
                              f"expected {_NDIM[layout]} dimensions")
    for name in state:
        if name not in names:
            raise ConfigError(f"{where} has {name}, which is not a parameter of Listing 1's MLP-Mixer")
    return max(blocks) + 1


def _listing1_to_ours(where: str, fmt: str, state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Our state dict from Listing 1's parameters named as in ``fmt`` ("flax": NumPy arrays; "timm": tensors)."""
    out = {}
    for ours, name, layout in _listing1_names(fmt, _check_names(where, fmt, state)):
        value = state[name]
        if fmt == "flax":
            if value.dtype not in (np.float16, np.float32, np.float64):
                raise ConfigError(f"{where}: {name} has NumPy dtype {value.dtype}, not float16, float32 or float64")
            if layout == "conv":
                value = value.transpose(3, 2, 0, 1)  # (P, P, in, C) -> (C, in, P, P)
            elif layout == "dense":
                value = value.T  # (in, out) -> (out, in)
            value = torch.from_numpy(np.ascontiguousarray(value))
        out[ours] = value
    return out


def flax_to_pkmixer_state_dict(arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Our MLP-Mixer state dict from Listing 1's Flax arrays (``/``-joined names, as in Google's ``.npz``)."""
    return _listing1_to_ours("the Flax arrays", "flax", arrays)


def pkmixer_to_flax_arrays(state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Listing 1's Flax arrays (``/``-joined names, new NumPy arrays) from our MLP-Mixer state dict."""
    out = {}
    for ours, name, layout in _listing1_names("flax", _check_names("the state dict", "pkmixer", state)):
        value = state[ours].detach().cpu()
        if value.dtype not in (torch.float16, torch.float32, torch.float64):
            raise ConfigError(f"{ours} is {value.dtype}, which NumPy (and so an .npz file) cannot hold")
        if layout == "conv":
            value = value.permute(2, 3, 1, 0)  # (C, in, P, P) -> (P, P, in, C)
        elif layout == "dense":
            value = value.T  # (out, in) -> (in, out)
        out[name] = value.numpy().copy()
    return out


# ---- checkpoint files ------------------------------------------------------------------------------------
# by suffix; a pkmixer model goes to a checkpoint (.pt) or a safetensors weights file (.safetensors)
DESTINATION_FORMATS = {".npz": "flax", ".pth": "timm", ".pt": "pkmixer", ".safetensors": "pkmixer"}
_HEAD = {"flax": ("head/kernel", "head/bias"), "timm": ("head.weight", "head.bias"),
         "pkmixer": ("head.weight", "head.bias")}
# what a Flax or timm checkpoint implies beyond its shapes: Listing 1's MLP-Mixer with ε = 1e-6 (and the GELU
# of FORMAT_ACT, unless told another)
_LISTING1 = {"block": "mlp", "rp_blocks": None, "num_tokens": None, "norm_eps": 1e-6}


@dataclass(frozen=True)
class ImportedCheckpoint:
    model: nn.Module  # built by pkmixer.create_model (so it carries model.spec), in the checkpoint's dtype
    source_format: str  # "flax", "timm" or "pkmixer"
    head_replaced: bool  # whether the head is new (zero) because num_classes differs from the checkpoint's


def _first_line(err: Exception) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # torch colours some messages
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _is_npz(path: Path) -> bool:
    """A ``.npz`` suffix, or a zip archive of ``.npy`` files only (a torch file is a zip without them)."""
    if path.suffix == ".npz":
        return True
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return bool(names) and all(n.endswith(".npy") for n in names)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return {key: loaded[key] for key in loaded.files}
    except Exception as err:  # not a zip, truncated, pickled objects
        raise ConfigError(f"{path} is not a readable .npz archive of named arrays ({_first_line(err)})")
    raise ConfigError(f"{path} holds a single unnamed array, not an .npz archive of named arrays")


def _read_torch(path: Path) -> tuple[str, dict[str, torch.Tensor], tuple[str, dict[str, Any]] | None]:
    """("pkmixer", state dict, (model name, overrides, arguments)) or ("timm", state dict, None)."""
    try:
        # weights only: no pickled code runs; timm's train.py also stores its argparse arguments
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's pickle warnings: the one-line error says what is wrong
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, pickle with code, not a torch file at all
        raise ConfigError(f"{path} is not a readable torch file ({_first_line(err)})")
    if isinstance(payload, dict) and payload.get("format") == FORMAT:
        check_version(payload, path)
        fmt, state = "pkmixer", payload.get("state_dict")
        state = upgrade_state_dict(state) if isinstance(state, dict) else state
        spec = (payload.get("model"), payload.get("overrides"), payload.get("arguments"))
    else:  # timm: a state dict, or one wrapped by timm's training scripts
        fmt, spec = "timm", None
        state = next((payload[k] for k in ("state_dict", "model")
                      if isinstance(payload, dict) and isinstance(payload.get(k), dict)), payload)
    if not (isinstance(state, dict) and state
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise ConfigError(f"{path} holds neither a pkmixer checkpoint nor a timm state dict "
                          "(tensors by name, possibly under 'state_dict' or 'model')")
    return fmt, state, spec


def _read_safetensors(path: Path) -> tuple[str, dict[str, torch.Tensor], tuple[str, dict[str, Any], Any] | None]:
    """("pkmixer", state dict, (model name, overrides, arguments)) for a pkmixer weights file, else ("timm",
    state dict, None): a state dict in timm's names (as the Hugging Face hub holds timm's Mixers)."""
    payload = read_weights(path)
    if payload["format"] is None:
        return "timm", payload["state_dict"], None
    return "pkmixer", payload["state_dict"], (payload["model"], payload["overrides"], payload["arguments"])


def _float_dtype(path: Path, state: Mapping[str, torch.Tensor]) -> torch.dtype:
    dtypes = {v.dtype for v in state.values() if v.is_floating_point()}
    if len(dtypes) != 1:
        raise ConfigError(f"{path} mixes the floating-point types {', '.join(sorted(map(str, dtypes)))}" if dtypes
                          else f"{path} holds no floating-point weights")
    return dtypes.pop()


def _default(entry: ModelEntry, key: str) -> Any:
    """The value ``key`` takes in a registered model without overrides."""
    if key in entry.defaults:
        return entry.defaults[key]
    return inspect.signature(entry.cls.__init__).parameters[key].default


def _infer_spec(path: Path, ours: dict[str, torch.Tensor], model: str | None, img_size: int | None,
                num_classes: int | None, act: str) -> tuple[str, dict[str, Any]]:
    """(registered name, overrides) for the Listing 1 Mixer with activation ``act`` whose weights are ``ours``.

    The architecture comes from the shapes; the image size from the token count unless ``img_size`` is
    given. With ``model`` that name is used (the caller then checks that the weights fit it); otherwise the
    original variant of Table 1 with the same shapes, or ``mixer_s16_224`` with every shape overridden.
    ``act`` is an override wherever it differs from the model's default.
    """
    C, in_chans, P, P2 = ours["stem.weight"].shape
    if P != P2:
        raise ConfigError(f"{path}: the stem takes {P}x{P2} patches; the Mixer needs square ones")
    D_S, S0 = ours["blocks.0.token.mixing.mlp.fc1.weight"].shape
    grid = math.isqrt(S0)
    if grid * grid != S0:
        raise ConfigError(f"{path}: the token mixing takes {S0} tokens, which is not a square grid of patches")
    shapes = dict(patch_size=P, depth=sum(k.endswith(".token.norm.weight") for k in ours), embed_dim=C,
                  token_hidden=D_S, channel_hidden=ours["blocks.0.channel.mixing.mlp.fc1.weight"].shape[0])
    if in_chans != 3:
        shapes["in_chans"] = in_chans
    size = img_size or grid * P
    classes = num_classes or ours["head.bias"].shape[0]
    if model is None:
        wanted = {"in_chans": 3, **shapes, **_LISTING1}
        model = next((name for name in list_models() if model_entry(name).cls is Mixer
                      and all(_default(model_entry(name), k) == v for k, v in wanted.items())), None)
        if model is None:
            model = "mixer_s16_224"
            shapes = {**shapes, "img_size": size, "num_classes": classes, "norm_eps": 1e-6}
            return model, {**shapes, **_act_override(model_entry(model), act)}
    entry = model_entry(model)
    return entry.name, {**{k: v for k, v in (("img_size", size), ("num_classes", classes)) if v != _default(entry, k)},
                        **_act_override(entry, act)}


def _act_override(entry: ModelEntry, act: str, current: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``{"act": act}`` unless that is what the entry with ``current`` overrides computes anyway."""
    if act not in ACTIVATIONS:
        raise ConfigError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    if "act" not in entry.accepted():
        raise ConfigError(f"{entry.name} has no act option")
    return {} if (current or {}).get("act", _default(entry, "act")) == act else {"act": act}


def _check_fit(path: Path, what: str, found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
               skip: tuple[str, ...]) -> None:
    """Raise, naming the parameter and both shapes, unless the checkpoint's tensors are the model's."""
    for key, shape in expected.items():
        if key in skip:
            continue
        if key not in found:
            raise ConfigError(f"{path} lacks {key}, which {what} has with shape {shape}")
        if found[key] != shape:
            raise ConfigError(f"{path} does not fit {what}: {key} has shape {found[key]} in the checkpoint "
                              f"and {shape} in the model")
    for key, shape in found.items():
        if key not in expected and key not in skip:
            raise ConfigError(f"{path} has {key} {shape}, which {what} lacks")


def import_checkpoint(src: str | os.PathLike, *, model: str | None = None, num_classes: int | None = None,
                      img_size: int | None = None, act: str | None = None) -> ImportedCheckpoint:
    """A registered model with the weights of ``src``: a Flax ``.npz`` (Listing 1 names), a timm state dict
    (plain or under ``state_dict`` / ``model``) or a pkmixer checkpoint, all read without running code.

    ``model`` names the registered model the weights must fit (default: inferred from the shapes; a pkmixer
    checkpoint names its own). ``num_classes`` different from the checkpoint's gives a fresh zero head and
    keeps every other weight. ``img_size`` defaults to the checkpoint's (from its token count). ``act`` is
    the activation (default: ``"gelu_tanh"`` for a Flax ``.npz``, as Listing 1 computes; ``"gelu"`` for a
    timm state dict; what a pkmixer checkpoint records), an override of the model wherever it differs.
    """
    path = Path(src)
    if not path.is_file():
        raise ConfigError(f"no checkpoint file at {path}")
    for key, value in (("num_classes", num_classes), ("img_size", img_size)):
        if value is not None:
            check_positive_int(key, value)
    if _is_npz(path):
        fmt, state, spec = "flax", _read_npz(path), None
    elif path.suffix == ".safetensors":
        fmt, state, spec = _read_safetensors(path)
    else:
        fmt, state, spec = _read_torch(path)
    if spec is not None:
        name, recorded, arguments = spec
        if not isinstance(name, str) or not isinstance(recorded, dict):
            raise ConfigError(f"{path} does not name a model and its options")
        if model is not None and model_entry(model).canonical != model_entry(name).canonical:
            raise ConfigError(f"{path} is a checkpoint of {name}, not {model}")
        ours = state
        build, overrides = rebuild_options(name, recorded, arguments)  # every recorded argument, if any
        changes = {k: v for k, v in (("img_size", img_size), ("num_classes", num_classes)) if v is not None}
        if act is not None:
            changes |= _act_override(model_entry(name), act, {**overrides, **changes})
        build, overrides = {**build, **changes}, {**overrides, **changes}
    else:
        ours = _listing1_to_ours(str(path), fmt, state)
        name, overrides = _infer_spec(path, ours, model, img_size, num_classes, act or FORMAT_ACT[fmt])
        build = overrides
    dtype = _float_dtype(path, ours)
    with torch.device("meta"):  # the shapes first, without allocating or initialising weights
        shapes = create_model(name, **build)
    own = {k: tuple(v.shape) for k, v in shapes.state_dict().items()}
    if fmt == "pkmixer":
        expected = own
    else:
        _check_listing1(shapes, "Flax" if fmt == "flax" else "timm")
        expected = {src_name: _flax_shape(layout, own[o]) if fmt == "flax" else own[o]
                    for o, src_name, layout in _listing1_names(fmt, shapes.depth)}
    head_replaced = (num_classes is not None and "head.bias" in ours
                     and tuple(ours["head.bias"].shape) != (num_classes,))
    what = f"{name}({', '.join(f'{k}={v!r}' for k, v in overrides.items())})" if overrides else name
    _check_fit(path, what, {k: tuple(v.shape) for k, v in state.items()}, expected,
               _HEAD[fmt] if head_replaced else ())
    net = create_model(name, **build).to(dtype)
    net.spec = replace(net.spec, overrides=overrides)
    if head_replaced:  # the new model's zero head
        ours = {**ours, "head.weight": net.head.weight.detach(), "head.bias": net.head.bias.detach()}
    net.load_state_dict(ours)
    return ImportedCheckpoint(net, fmt, head_replaced)


def _destination(dst: str | os.PathLike, overwrite: bool) -> tuple[Path, str]:
    path = Path(dst)
    if path.suffix not in DESTINATION_FORMATS:
        raise ConfigError(f"cannot tell the format of {path} from its suffix: use .npz (Flax, Listing 1 names), "
                          ".pth (timm state dict), .pt (pkmixer checkpoint) or .safetensors (pkmixer weights)")
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a file name")
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; refusing to overwrite it")
    return path, DESTINATION_FORMATS[path.suffix]


def _warn_activation(model: Mixer, fmt: str, path: Path) -> None:
    """An :class:`ActivationWarning` when the code that reads ``fmt`` computes another GELU than ``model``."""
    if model.activation == FORMAT_ACT[fmt]:
        return
    warnings.warn(f"{path}: {_FORMAT_NAMES[fmt]} computes act={FORMAT_ACT[fmt]!r} and the file does not record "
                  f"the activation, but this model has act={model.activation!r}: its logits there differ slightly "
                  f"(about 1e-4 relative); import the file with act={model.activation!r} (pkmixer convert --act "
                  f"{model.activation}) to get this model back", ActivationWarning, stacklevel=3)


def export_checkpoint(model: nn.Module, dst: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Write ``model`` atomically in the format of ``dst``'s suffix (see ``DESTINATION_FORMATS``); return it.

    ``.npz``: Listing 1's Flax arrays; ``.pth``: a timm state dict; ``.pt``: a pkmixer checkpoint; ``.safetensors``:
    a pkmixer weights file (:func:`pkmixer.checkpoint.save_weights`)
    (:func:`pkmixer.checkpoint.save_model`; the model must come from ``create_model``). Neither an
    ``.npz`` nor a ``.pth`` records the activation: a model whose GELU is not the one the format's code
    computes (``FORMAT_ACT``: Flax the tanh approximation, timm the exact GELU) is written with an
    :class:`ActivationWarning`.
    """
    path, fmt = _destination(dst, overwrite)
    if path.suffix == ".safetensors":
        save_weights(path, model, overwrite=overwrite)
    elif fmt == "pkmixer":
        save_model(path, model, overwrite=overwrite)
    elif fmt == "flax":
        _check_listing1(model, "Flax")
        _warn_activation(model, fmt, path)
        arrays = pkmixer_to_flax_arrays(model.state_dict())
        write_atomically(path, lambda f: np.savez(f, **arrays))
    else:
        _check_listing1(model, "timm")
        _warn_activation(model, fmt, path)
        state = pkmixer_to_timm_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
        write_atomically(path, lambda f: torch.save(state, f))
    return fmt


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, model: str | None = None,
                       num_classes: int | None = None, img_size: int | None = None,
                       overwrite: bool = False, act: str | None = None) -> dict[str, Any]:
    """:func:`import_checkpoint` ``src``, then :func:`export_checkpoint` to ``dst``; a summary of what ran.

    ``dst`` is checked (suffix; existing file without ``overwrite``) before ``src`` is read.
    """
    path, fmt = _destination(dst, overwrite)
    imported = import_checkpoint(src, model=model, num_classes=num_classes, img_size=img_size, act=act)
    net = imported.model
    export_checkpoint(net, path, overwrite=overwrite)
    return {"source": str(src), "source_format": imported.source_format, "destination": str(path),
            "destination_format": fmt, "model": net.spec.name, "overrides": dict(net.spec.overrides),
            "params": sum(p.numel() for p in net.parameters()), "num_classes": net.num_classes,
            "img_size": net.img_size, "dtype": str(next(net.parameters()).dtype).removeprefix("torch."),
            "act": getattr(net, "activation", None), "head_replaced": imported.head_replaced}
