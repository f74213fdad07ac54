"""Inference throughput and pre-training compute of the Mixers of the MLP-Mixer supplementary, Table 2
(Tolstikhin et al. 2021, supp. E "More details on computational cost"; /work/shared/seeds/002_fadafc463e1833ec.txt).

Table 2 lists, for each model at 224 px, its pre-training epochs on JFT-300M, the "Pre-Train exaFLOPs", and
the test-time throughput in images/s/core on TPUv3 and on V100 GPUs. :data:`TABLE2` holds those published
numbers as constants; :func:`throughput_table` sets beside them what we measure on the current device and
what we compute.

Measured: inference images/s of a randomly initialised model in ``eval()`` mode under
``torch.inference_mode``, its weights and inputs in ``dtype``: ``warmup`` untimed forwards of one batch, then
``repeats`` timed forwards (``torch.cuda.synchronize`` around each on a GPU); images/s = batch size / the
median time of one forward. The value is for the whole device (all CPU threads, or one GPU), not per core.

Computed: pre-training exaFLOPs = 3 × 2 × MACs × images × epochs / 10¹⁸, with MACs the forward
multiply-accumulates per image of :func:`pkmixer.analysis.cost.model_cost` on a meta-built model (matrix
products only, 1000-class head), FLOPs = 2 × MACs, the factor 3 for forward plus backward (the backward
pass costs about two forwards; :data:`pkmixer.analysis.cost.TRAIN_FLOPS_FACTOR`), and images = 300M
(JFT-300M) × Table 2's epochs. This convention reproduces the published column: e.g. Mixer-B/16,
12.6 GMACs × 6 × 300M × 7 epochs = 159 exaFLOPs against the published 161. All seven Mixers land within
2.3 % of the published values (Mixer-S/32 0.2 % above, the others up to 2.2 % below, Mixer-L/32 the
furthest); the seed does not say what the missing FLOPs are. A head for JFT-300M's classes (about 18k; not in
the seed) instead of the registered 1000-class one would add under 1 % to the MACs. Forward FLOPs alone
would give a third of the published values.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError, check_positive_int
from ..models.budget import available_memory
from ..models.registry import create_model, model_entry
from .cost import TRAIN_FLOPS_FACTOR, CostReport, _check_model, forward_peak_bytes, model_cost

JFT_IMAGES = 300_000_000  # JFT-300M, the pre-training data set of Table 2


@dataclass(frozen=True)
class PublishedRow:
    """One Mixer row of supp. Table 2, as published."""

    title: str
    image_size: int
    epochs: int  # pre-training epochs on JFT-300M
    exaflops: float  # "Pre-Train exaFLOPs"
    tpuv3: float  # throughput, images/s/core on TPUv3
    v100: float  # throughput, images/s/core on a V100 GPU


TABLE2 = {  # published: Tolstikhin et al. 2021, supplementary Table 2
    "mixer_s32_224": PublishedRow("Mixer-S/32", 224, 5, 9, 11489, 5497),
    "mixer_b32_224": PublishedRow("Mixer-B/32", 224, 7, 41, 4208, 1845),
    "mixer_s16_224": PublishedRow("Mixer-S/16", 224, 5, 34, 3994, 1605),
    "mixer_b16_224": PublishedRow("Mixer-B/16", 224, 7, 161, 1384, 516),
    "mixer_l32_224": PublishedRow("Mixer-L/32", 224, 7, 145, 1314, 546),
    "mixer_l16_224": PublishedRow("Mixer-L/16", 224, 14, 1141, 419, 151),
    "mixer_h14_224": PublishedRow("Mixer-H/14", 224, 14, 3096, 194, 58),
}


@dataclass(frozen=True)
class Mode:
    """Defaults of :func:`throughput_table` for the arguments left as None."""

    names: tuple[str, ...]
    batch_size: int
    warmup: int
    repeats: int


FULL = Mode(tuple(TABLE2), batch_size=64, warmup=3, repeats=10)  # every Mixer of Table 2: for a GPU
QUICK = Mode(("mixer_s32_224", "mixer_s16_224"), batch_size=2, warmup=2, repeats=2)  # the small ones: for a CPU
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_dtype(dtype: object) -> torch.dtype:
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ConfigError(f"dtype must be a floating torch dtype or one of {', '.join(DTYPES)}, got {dtype!r}")


def _check_device(device: object) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA device here")
    return dev


def _check_names(names: object) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence) or not names \
            or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"names must be a non-empty list of registered model names, got {names!r}")
    return tuple(model_entry(name).name for name in names)  # an unknown name is refused with the closest ones


def _check_counts(warmup: object, repeats: object) -> tuple[int, int]:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be a non-negative integer, got {warmup!r}")
    return warmup, check_positive_int("repeats", repeats)


def _build(name: str, image_size: int | None) -> nn.Module:
    """The registered model at ``image_size`` (its own when None), built on the current default device."""
    try:
        return create_model(name) if image_size is None else create_model(name, img_size=image_size)
    except ConfigError as err:
        raise ConfigError(f"{name}: {err}") from None


def _meta_cost(name: str, image_size: int | None = None) -> tuple[CostReport, int]:
    """Costs of the model built on the meta device, and its image size."""
    with torch.device("meta"):
        model = _build(name, image_size)
    return model_cost(model, name=name), model.img_size


def check_forward_memory(name: str, image_size: int | None, batch_size: int, dtype: torch.dtype,
                         device: torch.device) -> None:
    """Refuse (ConfigError), before anything is built, a measurement whose weights, input batch and activations
    (:func:`~pkmixer.analysis.cost.forward_peak_bytes`) would not fit in the memory available on ``device``."""
    with torch.device("meta"):
        model = _build(name, image_size)
    weights = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    inputs = batch_size * model.in_chans * model.img_size**2 * dtype.itemsize
    need = weights + inputs + forward_peak_bytes(model, batch_size, dtype)
    free = available_memory(device)
    if need > free:
        raise ConfigError(f"{name} at batch {batch_size} needs about {need / 2**30:.3g} GiB for its weights, inputs "
                          f"and activations, beyond the {free / 2**30:.3g} GiB available; lower --batch-size")


def _exaflops(macs: int, epochs: int, images: int) -> float:
    return TRAIN_FLOPS_FACTOR * 2 * macs * images * epochs / 1e18


def pretrain_exaflops(name: str, *, epochs: int | None = None, images: int = JFT_IMAGES) -> float:
    """Pre-training compute of a registered model, 3 × 2 × MACs × images × epochs / 10¹⁸ (module docstring).

    ``epochs`` defaults to Table 2's for the Mixers listed there; give it for any other model.
    """
    name = model_entry(name).name
    if epochs is None:
        if name not in TABLE2:
            raise ConfigError(f"{name} is not in supp. Table 2 ({', '.join(TABLE2)}); give its epochs")
        epochs = TABLE2[name].epochs
    check_positive_int("epochs", epochs)
    check_positive_int("images", images)
    return _exaflops(_meta_cost(name)[0].macs, epochs, images)


def images_per_second(model: nn.Module, batch_size: int, *, warmup: int = 3, repeats: int = 10) -> float:
    """Measured inference images/s of ``model`` on the device and in the dtype of its parameters: ``warmup``
    untimed forwards of one batch, then batch_size / the median time of ``repeats`` timed forwards."""
    check_positive_int("batch_size", batch_size)
    warmup, repeats = _check_counts(warmup, repeats)
    weight = next(model.parameters())
    x = torch.randn(batch_size, model.in_chans, model.img_size, model.img_size, device=weight.device,
                    dtype=weight.dtype)  # (B, in_chans, H, W)

    def sync() -> None:
        if weight.device.type == "cuda":
            torch.cuda.synchronize(weight.device)

    was_training = model.training
    model.eval()
    times = []
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                model(x)
            sync()
            for _ in range(repeats):
                start = time.perf_counter()
                model(x)
                sync()
                times.append(time.perf_counter() - start)
    finally:
        model.train(was_training)
    return batch_size / statistics.median(times)


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} CPU"


def throughput_table(names: Sequence[str] | None = None, batch_size: int | None = None,
                     dtype: torch.dtype | str = torch.float32, device: torch.device | str | None = None,
                     warmup: int | None = None, repeats: int | None = None, image_size: int | None = None, *,
                     quick: bool = False) -> list[dict]:
    """Measured inference images/s on ``device`` (default: CUDA when there is one, else the CPU) beside the
    published throughput and pre-training exaFLOPs of supp. Table 2 and our computed exaFLOPs.

    Arguments left as None take the defaults of :data:`FULL` (the seven Mixers of Table 2, batch 64, 3 warm-up
    forwards, 10 timed ones) or, with ``quick=True``, of :data:`QUICK` (Mixer-S/32 and S/16, batch 2, 2 and 2:
    a CPU check in seconds). ``names`` may be any registered models; those not in Table 2 get None in the
    published and exaFLOPs columns. ``image_size`` builds the models at another resolution (it must be a
    multiple of the patch size); ``params`` and ``gmacs`` are those of the measured model, while the
    exaFLOPs stay those of pre-training at 224 px.

    Each row: name, title, params, gmacs (forward, per image), image_size, batch_size, dtype, device,
    device_name, warmup, repeats, images_per_s (measured), published_tpuv3_images_per_s_per_core,
    published_v100_images_per_s_per_core, pretrain_epochs, published_exaflops, exaflops (computed).
    """
    mode = QUICK if quick else FULL
    names = mode.names if names is None else _check_names(names)
    batch_size = mode.batch_size if batch_size is None else check_positive_int("batch_size", batch_size)
    warmup, repeats = _check_counts(mode.warmup if warmup is None else warmup,
                                    mode.repeats if repeats is None else repeats)
    if image_size is not None:
        check_positive_int("image_size", image_size)
    dtype, dev = _check_dtype(dtype), _check_device(device)
    costs = [_meta_cost(name, image_size) for name in names]  # every configuration checked before measuring
    for name in names:
        check_forward_memory(name, image_size, batch_size, dtype, dev)
    rows = []
    for name, (cost, size) in zip(names, costs):
        published = TABLE2.get(name)
        model = _build(name, image_size).to(device=dev, dtype=dtype)
        rate = images_per_second(model, batch_size, warmup=warmup, repeats=repeats)
        del model  # free it before the next one is built
        exaflops = None
        if published is not None:
            pretrain_macs = cost.macs if size == published.image_size else _meta_cost(name)[0].macs
            exaflops = _exaflops(pretrain_macs, published.epochs, JFT_IMAGES)
        rows.append({
            "name": name, "title": published.title if published else None, "params": cost.params,
            "gmacs": cost.macs / 1e9, "image_size": size, "batch_size": batch_size,
            "dtype": str(dtype).removeprefix("torch."), "device": str(dev), "device_name": device_label(dev),
            "warmup": warmup, "repeats": repeats, "images_per_s": rate,
            "published_tpuv3_images_per_s_per_core": published.tpuv3 if published else None,
            "published_v100_images_per_s_per_core": published.v100 if published else None,
            "pretrain_epochs": published.epochs if published else None,
            "published_exaflops": published.exaflops if published else None,
            "exaflops": exaflops,
        })
    return rows


# ---- training-step time (Table S.3's runtime column, App. D.9) ----------------------------------------


def device_label(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's model with the torch threads in use."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{cpu_model()}, {threads} thread{'s' if threads > 1 else ''}"


def training_step_seconds(models: dict[str, nn.Module], *, batch_size: int = 128, repeats: int = 5,
                          warmup: int = 1, threads: int | None = 1, lr: float = 1e-3) -> dict:
    """Seconds per AdamW training step (zero_grad, forward, cross-entropy, backward, step) of each model on
    ``batch_size`` random images in float32, on the device of its parameters - App. D.9's runtime setting.

    The models take turns (one step each per repeat, after ``warmup`` untimed steps each), so that a change of
    load on a shared machine hits all of them alike; the GPU is synchronised around each step. ``threads``
    pins torch's CPU threads for the measurement (None: as they are). Returns the device label, the threads,
    the 1-minute load average before and after, every step time and the median per model."""
    check_positive_int("batch_size", batch_size)
    check_positive_int("repeats", repeats)
    if not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be a non-negative integer, got {warmup!r}")
    if not models:
        raise ConfigError("no models to time")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_positive_int("threads", threads))
    try:
        steps = {}
        for name, model in models.items():
            _check_model(model)
            weight = next(model.parameters())
            generator = torch.Generator().manual_seed(0)
            x = torch.randn(batch_size, model.in_chans, model.img_size, model.img_size, generator=generator)
            y = torch.randint(0, model.num_classes, (batch_size,), generator=generator)
            steps[name] = _step_function(model.train(), x.to(weight.device), y.to(weight.device), lr)
        device = next(next(iter(models.values())).parameters()).device
        label = device_label(device)
        load_before = _load_average()
        for step in steps.values():
            for _ in range(warmup):
                step()
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(repeats):
            for name, step in steps.items():
                times[name].append(step())
        return {"device": label, "threads": torch.get_num_threads() if device.type == "cpu" else None,
                "batch_size": batch_size, "repeats": repeats, "load_before": load_before,
                "load_after": _load_average(), "times": times,
                "median": {name: statistics.median(t) for name, t in times.items()}}
    finally:
        torch.set_num_threads(previous)


def _step_function(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float):
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=lr, fused=fused or None)  # the fused kernel, as pkmixer train uses
    loss_fn = nn.CrossEntropyLoss()
    cuda = x.device.type == "cuda"

    def step() -> float:
        if cuda:
            torch.cuda.synchronize(x.device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize(x.device)
        return time.perf_counter() - start

    return step


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
