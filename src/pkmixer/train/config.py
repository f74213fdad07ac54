"""Typed, validated training configuration (Hayase & Karakida App. C, Table S.2; Mixer supp. B, C).

A :class:`TrainConfig` has five sections - model, data, optim, schedule, run - each a frozen dataclass with
commented defaults. A configuration is derived from the defaults by a YAML preset (``configs/*.yaml``) and
``--set section.key=value`` overrides; every key and value is checked, and a bad one is refused with a
message that names it and says what is allowed. Model options other than ``name`` and ``init`` are the
registered model's own options (``--set model.depth=4``), checked when the model is built.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from ..errors import ConfigError, unknown_name


@dataclass(frozen=True)
class ModelConfig:
    name: str = "rp_smixer_t4_28"  # a registered model: see `pkmixer models`
    init: str | None = None  # a checkpoint whose weights start the run
    options: dict[str, Any] = field(default_factory=dict)  # the model's own options, e.g. depth, num_classes


@dataclass(frozen=True)
class DataConfig:
    name: str = "auto"  # cifar10, cifar100, stl10, mnist, fashion-mnist, imagenet, digits, synthetic, or auto:
    #                     Fashion-MNIST when it is on disk, else scikit-learn's bundled digits
    data_dir: str | None = None  # where the data set lies; None: the OS location, else download if allowed
    download: bool = False  # fetch through torchvision when it is nowhere on disk
    val_fraction: float = 0.0  # held out of the training set (stratified, by run.seed) as the validation split,
    #                     evaluated every epoch; it selects best.pt (without it nothing is selected)
    train_subset: int | None = None  # use only this many training examples (small-scale runs)
    test_subset: int | None = None  # evaluate on only this many test examples
    batch_size: int = 128  # global mini-batch size (split across processes)
    eval_batch_size: int = 256
    workers: int = 0  # DataLoader worker processes (the per-sample pipeline)
    pipeline: Literal["auto", "resident", "per-sample"] = "auto"  # auto: the data set on the device as one tensor
    #                     with batched augmentation when both are possible (not image folders, timm's
    #                     RandAugment, Inception crops), else a DataLoader with per-sample transforms
    crop_padding: int | None = None  # random crop after zero padding (App. C.4: CIFAR 4)
    hflip: bool = False  # random horizontal flip
    auto_augment: str | None = None  # AutoAugment policy: cifar10, imagenet or svhn
    rand_augment: str | None = None  # timm's rand-m9-mstd0.5-inc1 (App. C.5), big_vision's bigvision-n2-m15 (supp. B)
    random_erasing: float = 0.0  # probability of random erasing (App. C.5: 0.25)
    random_resized_crop: tuple[float, float] | None = None  # Inception crop area range, e.g. [0.08, 1.0] (ImageNet)
    resize: int | None = None  # resize before cropping (App. D.6: STL-10 at 90)
    eval_crop: str | None = None  # resize-crop or resmall-crop (Mixer supp. C); None: resize, imagenet timm's
    mixup: float = 0.0  # mixup α (App. C.5: 0.8)
    cutmix: float = 0.0  # cutmix α (App. C.5: 1.0)
    mixup_switch_prob: float = 0.5  # probability of cutmix when both are on
    label_smoothing: float = 0.0  # (App. C.5: 0.1)


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["sgd", "adamw"] = "sgd"  # SGD with Nesterov momentum (App. C.4) or AdamW (App. C.5)
    lr: float = 0.02  # initial (peak) learning rate
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW
    clip_grad: float | None = None  # clip the global gradient norm to this
    ema_decay: float | None = None  # Polyak average of the weights, e.g. 0.9999 (Mixer supp. A.2: no consistent gain)
    lasso: float = 0.0  # β-LASSO's λ (Neyshabur 2020, Alg. 1; pkmixer.train.lasso): λ·sign(w) joins each weight's
    #                     gradient; 0: off
    lasso_beta: float = 50.0  # β-LASSO's β: after each step the weights with |w| < β·λ become 0 (0: plain LASSO)


@dataclass(frozen=True)
class ScheduleConfig:
    epochs: int = 10
    warmup_epochs: float = 0.0  # linear warm-up from warmup_lr (App. C.5: 5 epochs from 1e-6)
    warmup_lr: float = 1e-6
    min_lr: float = 0.0  # end of the cosine annealing (App. C.5: 1e-5)


CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES = get_args(CompileMode)


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    deterministic: bool = True  # deterministic algorithms; on CPU a resumed run equals an uninterrupted one
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: Literal["off", "bf16", "auto"] = "off"  # off: fp32 as the paper (App. C.3); auto: bf16 on GPU only
    tf32: bool = False  # TF32 matrix products on CUDA (faster, about 10 bits of mantissa)
    compile: bool = False  # torch.compile the model
    compile_mode: CompileMode = "default"  # torch.compile's mode; reduce-overhead replays CUDA graphs
    progress: bool = True  # progress bar on a terminal
    loggers: tuple[str, ...] = ()  # also log to: csv (metrics.csv), tensorboard, wandb, mlflow (pkmixer.train.loggers)
    save_every: int = 1  # write the latest checkpoint every this many epochs


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def as_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    def override(self, overrides: dict[str, Any]) -> TrainConfig:
        """This config with dotted ``overrides`` ({"run.seed": 1, "model.depth": 4}), checked as ``--set`` is."""
        return build_config(None, overrides, base=self)


def flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's dictionary as dotted keys, the model's options as ``model.<option>`` (as ``--set`` names them)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = prefix if (prefix, k) == ("model.", "options") else f"{prefix}{k}."
        if isinstance(v, dict):
            out.update(flat_config(v, key))
        else:
            out[key[:-1]] = v
    return out


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "schedule": ScheduleConfig,
            "run": RunConfig}


def _plain(value: Any) -> Any:
    """Tuples to lists, for YAML and JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


MAX_INT = 2**31 - 1  # no count, size or seed of a run goes beyond this
MAX_SEED = MAX_INT  # seeds lie in [0, MAX_SEED] (within NumPy's 2**32 - 1)
MAX_EPOCHS = 1_000_000
MAX_WORKERS = 256  # DataLoader worker processes


def _check_value(where: str, value: Any, kind: Any) -> Any:
    """``value`` converted to the annotated ``kind``, or a ConfigError naming ``where`` and what is allowed."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_value(where, value, inner[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}={value!r} is not allowed; choose one of {', '.join(map(str, args))}")
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # any length; one value may stand alone
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, (list, tuple)):
            raise ConfigError(f"{where}={value!r} must be a list")
        return tuple(_check_value(f"{where}[{i}]", v, args[0]) for i, v in enumerate(values))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}={value!r} must be a list of {len(args)} values")
        return tuple(_check_value(f"{where}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={value!r} must be a mapping of options")
        return dict(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} must be true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}={value!r} must be an integer")
        if abs(value) > MAX_INT:
            raise ConfigError(f"{where}={value!r} is too large (at most {MAX_INT})")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}={value!r} must be a number")
        try:
            value = float(value)
        except OverflowError:
            raise ConfigError(f"{where}={value!r} is too large") from None
        if not math.isfinite(value):
            raise ConfigError(f"{where}={value!r} must be a finite number")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}={value!r} must be a string")
        return value
    raise TypeError(f"unsupported config type {kind!r} at {where}")


def _old_spellings(name: str, values: dict[str, Any], base: Any) -> dict[str, Any]:
    """A section's keys of earlier releases, read as today's: ``run.tensorboard: true`` is the tensorboard
    logger."""
    if name != "run" or "tensorboard" not in values:
        return values
    values = dict(values)
    if _check_value("run.tensorboard", values.pop("tensorboard"), bool):
        loggers = _check_value("run.loggers", values.get("loggers", base.loggers), tuple[str, ...])
        values["loggers"] = loggers if "tensorboard" in loggers else (*loggers, "tensorboard")
    return values


def _section(name: str, cls: type, values: dict[str, Any], base: Any) -> Any:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    updates = {}
    values = _old_spellings(name, values, base)
    for key, value in values.items():
        if name == "model" and key not in known:  # a model option
            updates.setdefault("options", dict(base.options))[key] = value
            continue
        if key not in known:
            raise unknown_name(f"key in section '{name}'", f"{key}", known)
        updates[key] = _check_value(f"{name}.{key}", value, hints[key])
    return dataclasses.replace(base, **updates)


def _positive(values: dict[str, Any], nullable: bool = False) -> None:
    for key, value in values.items():
        if value is not None and value <= 0:
            raise ConfigError(f"{key}={value} must be positive{' (or null)' if nullable else ''}")


def _not_negative(values: dict[str, float]) -> None:
    for key, value in values.items():
        if value < 0:
            raise ConfigError(f"{key}={value} must not be negative")


def _unit(values: dict[str, float]) -> None:
    for key, value in values.items():
        if not 0 <= value < 1:
            raise ConfigError(f"{key}={value} must lie in [0, 1)")


def _check_model(m: ModelConfig) -> None:
    from ..models.registry import model_entry

    model_entry(m.name)  # an unknown model is refused with the closest names
    if m.init is not None and not m.init.strip():
        raise ConfigError("model.init must name a checkpoint file (or be null)")


def _check_data(d: DataConfig) -> None:
    from ..data import check_rand_augment, list_datasets
    from ..data.transforms import AUTO_AUGMENT_POLICIES, EVAL_CROPS

    if d.name != "auto" and d.name not in list_datasets():
        raise unknown_name("data set (data.name)", d.name, ["auto", *list_datasets()])
    if d.data_dir is not None and not d.data_dir.strip():
        raise ConfigError("data.data_dir must name a folder (or be null)")
    _positive({"data.batch_size": d.batch_size, "data.eval_batch_size": d.eval_batch_size})
    _positive({"data.train_subset": d.train_subset, "data.test_subset": d.test_subset, "data.resize": d.resize},
              nullable=True)
    if d.crop_padding is not None and d.crop_padding < 0:
        raise ConfigError(f"data.crop_padding={d.crop_padding} must not be negative (or null for none)")
    if not 0 <= d.workers <= MAX_WORKERS:
        raise ConfigError(f"data.workers={d.workers} must lie in [0, {MAX_WORKERS}]")
    _unit({"data.val_fraction": d.val_fraction, "data.random_erasing": d.random_erasing,
           "data.label_smoothing": d.label_smoothing})
    if not 0 <= d.mixup_switch_prob <= 1:
        raise ConfigError(f"data.mixup_switch_prob={d.mixup_switch_prob} must lie in [0, 1]")
    _not_negative({"data.mixup": d.mixup, "data.cutmix": d.cutmix})
    if d.random_resized_crop is not None:
        low, high = d.random_resized_crop
        if not 0 < low <= high <= 1:
            raise ConfigError(f"data.random_resized_crop={list(d.random_resized_crop)} must be an area range "
                              "[low, high] with 0 < low <= high <= 1")
    if d.eval_crop not in (None, *EVAL_CROPS):
        raise ConfigError(f"data.eval_crop={d.eval_crop!r} is not allowed; choose {' or '.join(EVAL_CROPS)}")
    if d.auto_augment is not None and d.auto_augment not in AUTO_AUGMENT_POLICIES:
        raise ConfigError(f"data.auto_augment={d.auto_augment!r} is not allowed; choose one of "
                          f"{', '.join(AUTO_AUGMENT_POLICIES)}")
    if d.rand_augment is not None:
        check_rand_augment(d.rand_augment)


def _check_optim(o: OptimConfig) -> None:
    _unit({"optim.betas[0]": o.betas[0], "optim.betas[1]": o.betas[1]})
    if not 0 <= o.momentum <= 1:
        raise ConfigError(f"optim.momentum={o.momentum} must lie in [0, 1]")
    if o.name == "sgd" and o.nesterov and o.momentum == 0:
        raise ConfigError("optim.nesterov=true needs optim.momentum > 0 (or set optim.nesterov=false)")
    _not_negative({"optim.weight_decay": o.weight_decay, "optim.lasso": o.lasso, "optim.lasso_beta": o.lasso_beta})
    if o.lr <= 0:
        raise ConfigError(f"optim.lr={o.lr} must be positive")
    if o.clip_grad is not None and o.clip_grad <= 0:
        raise ConfigError(f"optim.clip_grad={o.clip_grad} must be positive (or null for none)")
    if o.ema_decay is not None and not 0 < o.ema_decay < 1:
        raise ConfigError(f"optim.ema_decay={o.ema_decay} must lie in (0, 1) (or null for none)")


def _check_schedule(s: ScheduleConfig) -> None:
    _positive({"schedule.epochs": s.epochs})
    _not_negative({"schedule.warmup_epochs": s.warmup_epochs, "schedule.min_lr": s.min_lr,
                   "schedule.warmup_lr": s.warmup_lr})
    for key, value in {"schedule.epochs": s.epochs, "schedule.warmup_epochs": s.warmup_epochs}.items():
        if value > MAX_EPOCHS:
            raise ConfigError(f"{key}={value} is more than {MAX_EPOCHS}")


def _check_run(r: RunConfig) -> None:
    from .loggers import LOGGERS

    _positive({"run.save_every": r.save_every})
    for logger in r.loggers:
        if logger not in LOGGERS:
            raise unknown_name("logger (run.loggers)", logger, LOGGERS)
    if len(set(r.loggers)) != len(r.loggers):
        raise ConfigError(f"run.loggers={list(r.loggers)} names a logger twice")
    if not 0 <= r.seed <= MAX_SEED:
        raise ConfigError(f"run.seed={r.seed} must lie in [0, {MAX_SEED}]")


# every value against its domain, section by section (types and finiteness were checked by _check_value)
RANGE_CHECKS = {"model": _check_model, "data": _check_data, "optim": _check_optim, "schedule": _check_schedule,
                "run": _check_run}


def build_config(preset: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None,
                 base: TrainConfig | None = None) -> TrainConfig:
    """Defaults (or ``base``), then a nested ``preset`` mapping, then dotted ``overrides`` ({"optim.lr": 0.1})."""
    cfg = base or TrainConfig()
    nested: dict[str, dict[str, Any]] = {}
    if preset is not None:
        if not isinstance(preset, dict):
            raise ConfigError("a config must be a mapping of sections: model, data, optim, schedule, run")
        for section, values in preset.items():
            if section not in SECTIONS:
                raise unknown_name("config section", str(section), SECTIONS)
            if not isinstance(values, dict):
                raise ConfigError(f"config section '{section}' must be a mapping, got {values!r}")
            nested.setdefault(section, {}).update(values)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or not key:
            raise ConfigError(f"--set keys look like section.key with a section among "
                              f"{', '.join(SECTIONS)}; got {dotted!r}")
        nested.setdefault(section, {})[key] = value
    updates = {name: _section(name, SECTIONS[name], values, getattr(cfg, name)) for name, values in nested.items()}
    cfg = dataclasses.replace(cfg, **updates)
    for name, check in RANGE_CHECKS.items():
        check(getattr(cfg, name))
    return cfg



def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file at {path}" if not path.is_dir() else f"{path} is a folder, not a config file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8); a config is a YAML file") from None
    except OSError as err:
        raise ConfigError(f"cannot read {path} ({err.strerror or type(err).__name__})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:  # e.g. a timestamp out of range
        raise ConfigError(f"{path} holds a value YAML cannot read ({type(err).__name__}: {err})") from None
    return data or {}


def save_yaml(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config atomically (a kill leaves the old file or the new one)."""
    from ..atomic import write_text_atomically

    write_text_atomically(Path(path), yaml.safe_dump(cfg.as_dict(), sort_keys=False))
