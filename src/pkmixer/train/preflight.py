"""What a new run needs, checked before anything is written: the device, the run directory, the data folder,
the ``model.init`` file, a head with at least the data set's classes, and memory for the model's training state.
``pkmixer train`` and ``pkmixer finetune`` call :func:`preflight`; the run's own engine checks the head again
against the split it built (:func:`check_head_classes`, the one home of that check)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, check_input_file, check_output_path
from ..models.budget import available_memory
from ..models.registry import create_model
from .config import DataConfig, ModelConfig, TrainConfig
from .distributed import uses_cuda


def check_head_classes(model_classes: int, data_classes: int, data_name: str) -> None:
    """Refuse a head with fewer classes than the data set's labels (the loss would index past the logits)."""
    if model_classes < data_classes:
        raise ConfigError(f"model.num_classes={model_classes} gives the model {model_classes} classes, fewer than the "
                          f"{data_classes} classes of {data_name} (labels 0..{data_classes - 1})")


def model_options(model: ModelConfig, data: DataConfig) -> dict[str, Any]:
    """The model options with the data set's class count unless they set one, checked by
    :func:`check_head_classes` (ImageNet's class count is the folder's: known only once it is read)."""
    from ..data import dataset_info  # lazily: the data package imports torchvision

    d, options = data, dict(model.options)
    data_classes = None if d.name == "imagenet" else dataset_info("digits" if d.name == "auto" else d.name).num_classes
    if data_classes is not None:
        classes = options.setdefault("num_classes", data_classes)
        if isinstance(classes, int) and not isinstance(classes, bool) and 0 < classes:
            check_head_classes(classes, data_classes, d.name)
    return options


def preflight(cfg: TrainConfig, run_dir: str | Path) -> None:
    """What a new run will need, checked before its directory is made: the device it asks for, a run directory
    that can be created, the data folder, the model.init file, a model that builds (on the meta device) with at
    least the data set's classes, and memory for its weights, gradients and optimizer state."""
    cuda = uses_cuda(cfg.run.device)
    check_output_path(run_dir, "run directory", folder=True)  # an existing one: train() refuses it
    d, m = cfg.data, cfg.model
    if d.data_dir is not None:
        if d.download:
            check_output_path(d.data_dir, "data.data_dir", folder=True)
        elif not Path(d.data_dir).is_dir():
            raise ConfigError(f"data.data_dir {d.data_dir} is not a folder")
    options = model_options(cfg.model, cfg.data)
    if m.init is not None:
        check_input_file(m.init, "model.init checkpoint")
        return  # the checkpoint sets the architecture; the loop checks that the options fit it
    with torch.device("meta"):
        model = create_model(m.name, **options)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    buffers = sum(t.numel() * t.element_size() for t in model.buffers())
    need = weights * (4 if cfg.optim.name == "adamw" else 3) + buffers  # weights, gradients, optimizer state
    free = available_memory(torch.device("cuda") if cuda else None)
    if need > free:
        raise ConfigError(f"{m.name} needs about {need / 2**30:.3g} GiB for its weights, gradients and optimizer "
                          f"state, beyond the {free / 2**30:.3g} GiB available; make it smaller")
