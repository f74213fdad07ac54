"""The model zoo: ``create_model(name, **overrides)``, ``list_models()``, and the same entries in timm's
registry as ``timm.create_model("pkmixer_<name>")``.

Each entry is a model class plus its defaults; overrides are checked against the class's arguments, and
unknown names are answered with the closest known ones.

Names follow one grammar (:data:`NAME_GRAMMAR`, docs/models.md "Names"):
``[rp_]<family>[_<variant>]_<size><patch>_<img>`` - e.g. ``mixer_b16_224`` (timm's names for the Mixers of
Tolstikhin et al.), ``rp_smixer_c64p4_32`` - or ``shallow_<weights>_<img>``. Names of earlier versions are
aliases (:func:`list_aliases`): ``create_model``, ``model_entry``, timm and checkpoints that record them keep
working, and ``model.spec.name`` is the name the model was asked for.

Every entry names the data set it is meant for; the model's timm ``pretrained_cfg`` carries that data set's
normalisation (:mod:`pkmixer.models.timm_api`).

Sizes that cannot be built are refused before they are allocated (:class:`BuildBudget`): while a model is
built, every tensor it asks for is checked against the memory available (on the meta device only the CPU
tensors that a meta model still keeps, such as SW-MLP masks, count), and a build that runs more than
:data:`MAX_BUILD_OPS` tensor operations (e.g. ``depth=10**6``) is stopped. With Linux's memory overcommit an
oversized allocation would not fail cleanly but end in the OOM killer.
"""
from __future__ import annotations

import fnmatch
import inspect
import re
import sys
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError, unknown_name
from ..layers.token_mixing import GroupedTokens, UntiedTokens
from .mixer import Mixer, Pyramid
from .shallow import ShallowMLP
from .swmlp import SWMLP
from .timm_api import TimmModel

TIMM_PREFIX = "pkmixer_"


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`create_model` was asked for; kept on the model as ``model.spec`` (checkpoints use it).
    ``arguments`` are every constructor argument it resolved to (registry defaults, the class's own defaults
    and the overrides, in their plain spelling): checkpoints record them, so that editing a registry default
    never changes what an old checkpoint means. Two specs are equal when name and overrides are."""

    name: str
    overrides: dict[str, Any]
    arguments: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ModelEntry:
    name: str  # the name it was looked up by: the canonical name or one of its aliases
    cls: type[nn.Module]
    defaults: dict[str, Any]
    description: str
    source: str  # where in the papers the configuration comes from
    tags: tuple[str, ...] = field(default=())
    data_set: str | None = None  # the data set it is meant for (its normalisation in the timm pretrained_cfg)
    canonical: str = ""  # the registered name (as list_models() lists it); "" means ``name``

    def __post_init__(self) -> None:
        if not self.canonical:
            object.__setattr__(self, "canonical", self.name)

    def accepted(self) -> list[str]:
        """The class's arguments, and the plain spellings it translates (``cls.PLAIN_OPTIONS``, see create_model)."""
        params = [p for p in inspect.signature(self.cls.__init__).parameters if p != "self"]
        return [*params, *getattr(self.cls, "PLAIN_OPTIONS", ())]


_REGISTRY: dict[str, ModelEntry] = {}
_ALIASES: dict[str, str] = {}  # an earlier name -> the canonical name

# the grammar of canonical names (docs/models.md, "Names"): [rp_]<family>[_<variant>]_<size><patch>_<img>, where
# <size> is a letter code or a number with its letter (c: S = C; m: SW-MLP width) and optional d<depth>, then p
SIZE_CODES = ("s", "b", "l", "h", "ss", "ssw", "bw", "t")
NAME_GRAMMAR = re.compile(
    r"(?:(?P<rp>rp_)?(?P<family>mixer|smixer|swmlp)(?:_(?P<variant>untied|grouped|views|pyramid))?"
    r"_(?:(?P<code>" + "|".join(sorted(SIZE_CODES, key=len, reverse=True)) + r")"
    r"|(?P<qty>[cm])(?P<number>\d+)(?:d(?P<depth>\d+))?p)(?P<patch>\d+)"
    r"|(?P<shallow>shallow)_(?P<weights>dense|kronecker|monarch))_(?P<img>\d+)")


def register(name: str, cls: type[nn.Module], description: str, source: str, *, data_set: str | None = None,
             aliases: tuple[str, ...] = (), **defaults: Any) -> None:
    """Register ``name`` (it must follow :data:`NAME_GRAMMAR`) and its earlier names ``aliases``."""
    if not NAME_GRAMMAR.fullmatch(name):
        raise ValueError(f"model name {name!r} does not follow the naming grammar (docs/models.md)")
    if name in _REGISTRY or name in _ALIASES:
        raise ValueError(f"model {name!r} registered twice")
    _REGISTRY[name] = ModelEntry(name, cls, defaults, description, source, data_set=data_set)
    for alias in aliases:
        register_alias(alias, name)


def register_alias(alias: str, name: str) -> None:
    """Make ``alias`` (e.g. a name of an earlier version) build the registered model ``name``."""
    if name not in _REGISTRY:
        raise ValueError(f"alias {alias!r} of unregistered model {name!r}")
    if alias in _REGISTRY or alias in _ALIASES:
        raise ValueError(f"model {alias!r} registered twice")
    _ALIASES[alias] = name


def list_models(pattern: str | None = None) -> list[str]:
    """Canonical names, optionally filtered by a shell-style pattern such as ``"*smixer*"`` (aliases:
    :func:`list_aliases`)."""
    names = sorted(_REGISTRY)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def list_aliases(pattern: str | None = None) -> dict[str, str]:
    """Aliases (earlier names) and the canonical name each stands for, sorted, optionally filtered by a
    shell-style pattern on the alias."""
    return {a: _ALIASES[a] for a in sorted(_ALIASES) if pattern is None or fnmatch.fnmatch(a, pattern)}


def canonical_name(name: str) -> str:
    """The canonical name of a registered name or alias (a ``pkmixer_`` prefix is dropped)."""
    return model_entry(name).canonical


def model_entry(name: str) -> ModelEntry:
    """The entry of a canonical name or an alias; an alias's entry has ``name`` the alias and ``canonical`` the
    registered name."""
    key = name[len(TIMM_PREFIX):] if name.startswith(TIMM_PREFIX) else name
    if key in _REGISTRY:
        return _REGISTRY[key]
    if key in _ALIASES:
        return replace(_REGISTRY[_ALIASES[key]], name=key)
    raise unknown_name("model", name, [*_REGISTRY, *_ALIASES])


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model (a canonical name or an alias); ``overrides`` replace its defaults (e.g.
    ``num_classes=10, rp_blocks="all"``). ``num_classes=0`` gives timm's headless model (``nn.Identity`` head).

    A class whose arguments take objects (the Mixer's ``token_mixing`` factories) may also accept a plain
    spelling of them (``untied_tokens=True``, the keywords of its earlier signature): it names those keywords in
    ``PLAIN_OPTIONS``, turns them into arguments with ``from_plain_options(kwargs)`` and back with
    ``to_plain_options(overrides)``, which is what ``model.spec`` (and so a checkpoint) records."""
    classes = overrides.get("num_classes")
    if classes == 0 and not isinstance(classes, bool):
        model = create_model(name, **{k: v for k, v in overrides.items() if k != "num_classes"})
        model.reset_classifier(0)  # records num_classes=0 in model.spec
        return model
    entry = model_entry(name)
    accepted = entry.accepted()
    for key in overrides:
        if key not in accepted:
            raise unknown_name(f"option for {entry.name}", key, accepted)
    defaults = {k: v for k, v in entry.defaults.items()
                if not any(k in _SUPERSEDES.get(o, ()) for o in overrides)}
    what = entry.name + (f"({', '.join(f'{k}={v!r}' for k, v in overrides.items())})" if overrides else "")
    kwargs = {**defaults, **overrides}
    if hasattr(entry.cls, "from_plain_options"):
        kwargs = entry.cls.from_plain_options(kwargs)
    depth = kwargs.get("depth")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > MAX_DEPTH:
        raise ConfigError(f"depth={depth} is more blocks than pkmixer builds (at most {MAX_DEPTH}; the paper's "
                          "deepest model has 32)")
    try:
        with BuildBudget(what) as budget:
            budget.precheck(entry.cls, kwargs)
            model = entry.cls(**kwargs)
    except (OverflowError, MemoryError) as err:
        raise ConfigError(f"{what} cannot be built: its sizes are too large ({type(err).__name__})") from None
    except (RuntimeError, TypeError) as err:  # torch: "Storage size calculation overflowed", "can't allocate"
        text = str(err).lower()
        if not any(word in text for word in ("overflow", "allocate", "out of memory")):
            raise
        raise ConfigError(f"{what} cannot be built: its sizes are too large ({str(err).splitlines()[0][:120]})") \
            from None
    plain = getattr(entry.cls, "to_plain_options", dict)
    own = {k: p.default for k, p in inspect.signature(entry.cls.__init__).parameters.items()
           if k != "self" and p.default is not inspect.Parameter.empty}
    # every argument as resolved: the plain options already turned into the objects they stand for (kwargs)
    model.spec = ModelSpec(entry.name, plain(dict(overrides)), plain({**own, **kwargs}))
    if isinstance(model, TimmModel) and entry.data_set is not None:
        model.data_set = entry.data_set
    return model


# ---- the build budget -----------------------------------------------------------------------------------

MAX_DEPTH = 1000  # blocks: refused at once (a Python loop per block would otherwise run for hours)
MAX_BUILD_OPS = 50_000  # tensor operations while building one model; the largest zoo entry (H/14) uses 4 428
_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
              torch.randperm, torch.arange, torch.eye, torch.empty_strided, torch.linspace}


def available_memory(device: torch.device | None = None) -> int:
    """Bytes that can be allocated now: free GPU memory on a CUDA device; otherwise MemAvailable of
    /proc/meminfo (Linux), else the free physical pages."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def _requested(func: Callable, args: tuple, kwargs: dict) -> int:
    """Elements a factory call asks for, computed from its arguments without calling it."""
    if func is torch.randperm:
        return int(args[0])
    if func is torch.arange:
        bounds = [float(a) for a in args if isinstance(a, (int, float))]
        start, end, step = (0.0, bounds[0], 1.0) if len(bounds) == 1 else (*bounds[:2], (bounds[2:] or [1.0])[0])
        return max(0, math.ceil((end - start) / step)) if step else 0
    if func is torch.eye:
        n = int(args[0])
        return n * int(args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("m", n))
    if func is torch.linspace:
        return int(args[2] if len(args) > 2 else kwargs.get("steps", 0))
    if func is torch.randint:
        size = kwargs.get("size", next((a for a in args if isinstance(a, (tuple, list, torch.Size))), ()))
    elif "size" in kwargs:
        size = kwargs["size"]
    else:
        size = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else \
            [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
        if func is torch.full:
            size = args[0]
    return math.prod(int(n) for n in size)


class BuildBudget(TorchFunctionMode):
    """Refuse (ConfigError) a model build whose tensors would not fit in the available memory, before they are
    allocated, or that runs more than :data:`MAX_BUILD_OPS` tensor operations.

    Every factory call (``torch.empty``, ``zeros``, ``rand``, ...) is sized from its arguments before it runs;
    the bytes of the storages made on a real device that are still alive add up, and the build stops as soon
    as the sum passes the memory available when the build began. :meth:`precheck` sizes what a model class
    is known to need before it starts (the SW-MLP's masks, whose sampling alone takes minutes when huge)."""

    def __init__(self, what: str, limit: int | None = None) -> None:
        super().__init__()
        self.what, self.limit, self.used, self.ops = what, limit, 0, 0
        self._live: set[tuple[int, torch.device]] = set()

    def _free(self, key: tuple[int, torch.device], nbytes: int) -> None:
        self._live.discard(key)
        self.used -= nbytes

    def precheck(self, cls: type, kwargs: dict[str, Any]) -> None:
        estimate = _PRECHECKS.get(cls)
        if estimate is None:
            return
        try:
            need = estimate(kwargs, torch.get_default_device().type == "meta")
        except (TypeError, ValueError, KeyError, OverflowError, ZeroDivisionError):
            return  # bad arguments: the class itself says what is wrong
        if need > self.limit:
            self._refuse(need)

    def __enter__(self):
        if self.limit is None:
            default = torch.get_default_device()
            self.limit = available_memory(default if default.type != "meta" else None)
        return super().__enter__()

    def _refuse(self, extra: int) -> None:
        raise ConfigError(f"{self.what} needs more than {(self.used + extra) / 2**30:.3g} GiB to build, beyond the "
                          f"{self.limit / 2**30:.3g} GiB of memory available; make it smaller")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if self.ops > MAX_BUILD_OPS:
            raise ConfigError(f"{self.what} takes more than {MAX_BUILD_OPS} tensor operations to build "
                              "(too many layers?); make it smaller")
        if func in _FACTORIES:
            device = torch.device(kwargs["device"]) if kwargs.get("device") is not None \
                else torch.get_default_device()
            if device.type != "meta":
                dtype = kwargs.get("dtype") or (torch.int64 if func in (torch.randperm, torch.randint)
                                                else torch.get_default_dtype())
                try:
                    need = _requested(func, args, kwargs) * dtype.itemsize
                except (TypeError, ValueError, IndexError, OverflowError):
                    need = 0  # a form not parsed here: counted after the call
                if self.used + need > self.limit:
                    self._refuse(need)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device.type != "meta":
            storage = out.untyped_storage()
            key = (storage.data_ptr(), storage.device)
            if storage.nbytes() and key not in self._live:  # a new storage (not a view, not in place)
                self._live.add(key)
                self.used += storage.nbytes()
                weakref.finalize(storage, self._free, key, storage.nbytes())
                if self.used > self.limit:
                    self._refuse(0)
        return out


def _swmlp_bytes(kw: dict[str, Any], meta: bool) -> int:
    """Bytes the SW-MLP's sparse layers hold: per kept weight two int64 coordinates (kept on the CPU even
    on the meta device) and a float32 value; the "masked" format also holds the dense mask and weight."""
    grid = (int(kw.get("img_size", 32)) // int(kw.get("patch_size", 4))) ** 2
    d0 = grid * int(kw.get("embed_dim", 64))
    m = d0 if kw.get("width") is None else int(kw["width"])
    p, depth = float(kw.get("density", 1.0)), int(kw.get("depth", 8))
    dims = [m, m] if kw.get("block", "fc") == "fc" else [m, max(1, int(float(kw.get("mlp_ratio", 1.0)) * m)), m]
    dense = depth * sum(a * b for a, b in zip(dims[:-1], dims[1:])) + (d0 * m if m != d0 else 0)
    if kw.get("weight_format", "sparse") == "masked":
        return int(dense * (1 if meta else 5) + 16 * p * dense)
    return int(p * dense * (16 if meta else 20))


_PRECHECKS: dict[type, Callable[[dict[str, Any], bool], int]] = {SWMLP: _swmlp_bytes}


# an override of the key replaces these defaults of an entry (e.g. γ instead of Table 1's hidden widths)
_SUPERSEDES = {"mlp_ratio": ("token_hidden", "channel_hidden")}


# ---- the zoo --------------------------------------------------------------------------------------------
# Names: docs/models.md, "Names" (NAME_GRAMMAR above); aliases= keeps the names of earlier versions working.
_TOLSTIKHIN = "Tolstikhin et al. 2021, Table 1"
# name: (patch, depth, C, D_S, D_C)
_ORIGINAL = {
    "s32": (32, 8, 512, 256, 2048), "s16": (16, 8, 512, 256, 2048),
    "b32": (32, 12, 768, 384, 3072), "b16": (16, 12, 768, 384, 3072),
    "l32": (32, 24, 1024, 512, 4096), "l16": (16, 24, 1024, 512, 4096),
    "h14": (14, 32, 1280, 640, 5120),
}
for _key, (_p, _d, _c, _ds, _dc) in _ORIGINAL.items():
    register(f"mixer_{_key}_224", Mixer, f"Mixer-{_key[0].upper()}/{_key[1:]} at 224 px", _TOLSTIKHIN,
             data_set="imagenet", img_size=224, patch_size=_p, depth=_d, embed_dim=_c, token_hidden=_ds,
             channel_hidden=_dc)

_HAYASE = "Hayase & Karakida 2024"
_CIFAR = dict(img_size=32, patch_size=4, num_classes=10, norm_eps=1e-5)
register("mixer_ss8_32", Mixer, "Mixer-SS/8: S=16, C=986, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         data_set="cifar10", **{**_CIFAR, "patch_size": 8}, depth=2, embed_dim=986, mlp_ratio=4.0)
register("mixer_ssw4_32", Mixer, "Mixer-SS-W: S=64, C=487, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         data_set="cifar10", **_CIFAR, depth=2, embed_dim=487, mlp_ratio=4.0)
register("mixer_bw14_224", Mixer, "Mixer-B-W: P=14, S=256, C=588, γ=4.57, 8 blocks", f"{_HAYASE}, Table 1, App. C.3",
         data_set="imagenet", img_size=224, patch_size=14, depth=8, embed_dim=588, mlp_ratio=4.57, norm_eps=1e-5)
register("mixer_c64d3p4_32", Mixer, "MLP-Mixer S=C=64, γ=2, 3 blocks (Fig. 2 CKA)", f"{_HAYASE}, App. C.1",
         data_set="cifar10", aliases=("mixer_f2_32",), **_CIFAR, depth=3, embed_dim=64, mlp_ratio=2.0)
register("mixer_c64p4_32", Mixer, "MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, App. D.7",
         data_set="cifar10", aliases=("mixer_s64_32",), **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0)
register("rp_mixer_c64p4_32", Mixer, "RP MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, Sec. 5.2, App. D.7",
         data_set="cifar10", aliases=("rp_mixer_s64_32",), **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0,
         rp_blocks="all")
_T4 = dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64, mlp_ratio=2.0)
_GREY = "fashion-mnist"  # the 28 px grey models are trained on Fashion-MNIST here (make demo, configs/)
register("mixer_t4_28", Mixer, "small MLP-Mixer for 28 px grey images: S=49, C=64, γ=2, 4 blocks", "pkmixer",
         data_set=_GREY, **_T4)
_ABLATION = "Tolstikhin et al. 2021, supp. A.1"  # the token-mixing ablations, on mixer_t4_28
# (create_model also takes their earlier plain overrides, untied_tokens=True, channel_groups=4, group_views=True,
# token_schedule=(...), on every Mixer entry: Mixer.from_plain_options; checkpoints record those)
register("mixer_untied_t4_28", Mixer, "mixer_t4_28 with untied token mixing: C=64 separate token MLPs", _ABLATION,
         data_set=_GREY, **_T4, token_mixing=UntiedTokens())
register("mixer_grouped_t4_28", Mixer, "mixer_t4_28 with token MLPs on G=4 grouped channels: (S·G)×(C/G) = 196×16",
         _ABLATION, data_set=_GREY, **_T4, token_mixing=GroupedTokens(4))
register("mixer_views_t4_28", Mixer, "mixer_t4_28 with G=4 trainable views R^64 -> R^16 mixed as 196×16", _ABLATION,
         data_set=_GREY, **_T4, token_mixing=GroupedTokens(4, views=True))
register("mixer_pyramid_t4_28", Mixer, "mixer_t4_28 as a pyramid: S = 49, 49, 25, 16 after blocks 1-4", _ABLATION,
         data_set=_GREY, **_T4, num_tokens=Pyramid(49, 49, 25, 16))
for _s in (64, 128):
    _tokens = None if _s == 64 else _s  # S0 = 64 at 32 px with 4 px patches; S=128 needs the skip layer
    register(f"smixer_c{_s}p4_32", Mixer, f"S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Figs. 5-7, App. C.4, C.6",
             data_set="cifar10", aliases=(f"smixer_s{_s}_32",), **_CIFAR, depth=8, embed_dim=_s, num_tokens=_tokens,
             block="fc")
    register(f"rp_smixer_c{_s}p4_32", Mixer, f"RP S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Sec. 5.2, Figs. 5-7",
             data_set="cifar10", aliases=(f"rp_smixer_s{_s}_32",), **_CIFAR, depth=8, embed_dim=_s,
             num_tokens=_tokens, block="fc", rp_blocks="all")
register("smixer_t4_28", Mixer, "small S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64,
         block="fc")
register("rp_smixer_t4_28", Mixer, "small RP S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64,
         block="fc", rp_blocks="all")
register("swmlp_m4096d6p4_32", SWMLP, "SW-MLP m=4096, p=1/64, γ=2 MLP blocks, 6 blocks (Fig. 2 CKA)",
         f"{_HAYASE}, App. C.1", data_set="cifar10", aliases=("swmlp_f2_32",), img_size=32, patch_size=4,
         num_classes=10, embed_dim=64, depth=6, block="mlp", mlp_ratio=2.0, density=1 / 64)
register("swmlp_m1619p4_32", SWMLP, "SW-MLP Ω=2^18, p=0.1, m=1619, 8 blocks (Fig. 5)", f"{_HAYASE}, App. C.4",
         data_set="cifar10", aliases=("swmlp_o18_32",), img_size=32, patch_size=4, num_classes=10, embed_dim=64,
         depth=8, block="fc", width=1619, density=0.1)
register("swmlp_t4_28", SWMLP, "small SW-MLP for 28 px grey images: m=784, p=1/8, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=16, depth=4, block="fc",
         density=1 / 8)
for _w in ("dense", "kronecker", "monarch"):
    register(f"shallow_{_w}_28", ShallowMLP, f"shallow MLP with {_w} weights on 28 px (MNIST)",
             f"{_HAYASE}, Sec. 3.3, Fig. 2d", data_set="mnist", img_size=28, in_chans=1, num_classes=10, weights=_w)


# ---- timm ---------------------------------------------------------------------------------------------
def default_cfg(name: str) -> dict[str, Any]:
    """timm's pretrained cfg of a registered model at its defaults (no weights: url and hub id empty); a built
    model's ``pretrained_cfg`` is computed from its own sizes (:mod:`pkmixer.models.timm_api`)."""
    from .timm_api import timm_cfg

    entry = model_entry(name)
    kw = entry.defaults
    sig = inspect.signature(entry.cls.__init__).parameters
    in_chans, img_size, classes = (kw.get(k, sig[k].default) for k in ("in_chans", "img_size", "num_classes"))
    return timm_cfg(TIMM_PREFIX + entry.canonical, entry.description, entry.data_set or "imagenet", in_chans,
                    img_size, classes, getattr(entry.cls, "first_conv", "stem"))


def _timm_entrypoint(name: str) -> Callable[..., nn.Module]:
    def entrypoint(pretrained: bool = False, pretrained_cfg: Any = None, pretrained_cfg_overlay: Any = None,
                   cache_dir: Any = None, **kwargs: Any) -> nn.Module:
        if pretrained:
            raise ConfigError(f"{TIMM_PREFIX}{name} has no pretrained weights to download; "
                              "import a checkpoint with pkmixer.models.convert instead")
        model = create_model(name, **kwargs)
        overlay = {**(pretrained_cfg if isinstance(pretrained_cfg, dict) else {}),
                   **(pretrained_cfg_overlay or {})}
        if hasattr(pretrained_cfg, "to_dict"):  # a timm PretrainedCfg
            overlay = {**pretrained_cfg.to_dict(), **(pretrained_cfg_overlay or {})}
        if overlay:
            model.pretrained_cfg = overlay
        return model

    entrypoint.__name__ = entrypoint.__qualname__ = TIMM_PREFIX + name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = _REGISTRY[name].description
    return entrypoint


def register_with_timm() -> None:
    """Make every entry available as ``timm.create_model("pkmixer_<name>")``, with its pretrained cfg
    (``timm.models.get_pretrained_cfg``); the aliases are registered as timm registers renamed models
    (``register_model_deprecations``: listed by ``timm.models.get_deprecated_models("registry")``, not by
    ``timm.list_models``; timm warns that it maps the old name to the new one)."""
    import timm
    from timm.models import generate_default_cfgs, register_model, register_model_deprecations

    module = sys.modules[__name__]
    # register_model reads the cfgs of the module that defines an entrypoint from its ``default_cfgs``
    module.default_cfgs = generate_default_cfgs({TIMM_PREFIX + n: default_cfg(n) for n in _REGISTRY})
    for name in _REGISTRY:
        if not timm.is_model(TIMM_PREFIX + name):
            fn = register_model(_timm_entrypoint(name))
            setattr(module, fn.__name__, fn)  # register_model_deprecations finds the current entrypoints here
    aliases = {TIMM_PREFIX + a: TIMM_PREFIX + n for a, n in _ALIASES.items() if not timm.is_model(TIMM_PREFIX + a)}
    if aliases:
        register_model_deprecations(__name__, aliases)
