"""Section g: ``pkmixer train`` against a hand-written in-memory training loop (its targets: docs/performance.md, section g).

Each case trains the same model with the same batch size and fused AdamW for ``EPOCHS`` epochs, in two ways:

* ``pkmixer``: :func:`pkmixer.train.loop.train` into a fresh run directory (checkpoints, metrics, the resident
  data pipeline that ``data.pipeline: auto`` picks); its per-epoch time is the ``epoch_time`` of metrics.jsonl,
  which covers training, evaluation and the previous epoch's checkpoint and metrics writes;
* ``reference``: :func:`reference_epoch`, frozen here: the normalised training and test tensors already in
  memory, a shuffled pass of plain steps (forward, cross-entropy, backward, ``optimizer.step``) and a pass of
  evaluation over the test set - the floor that a trainer's bookkeeping adds to.

The two run alternately, ``repeats`` times; a case's figure is the median over repeats of the median epoch time
of epochs 2.. (epoch 1 carries warm-up). The ratio pkmixer / reference is the target (≤ 1.1 without
augmentation, ≤ 1.2 with crop + flip); ms per step are reported beside it. The same model through the per-sample
DataLoader pipeline (``data.pipeline: per-sample``) is reported for comparison, without a target.

Cases: Fig. 5's small S-Mixer (4 blocks, C = S = 32) on 8 000 Fashion-MNIST training and its 10 000 test
images (the synthetic task of the same shape when Fashion-MNIST is not installed), and the same model on
CIFAR-shaped synthetic 32 px colour images with random crop (padding 4) and horizontal flip.
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pkmixer.data import dataset_info, load_resident
from pkmixer.errors import ConfigError
from pkmixer.models.registry import create_model
from pkmixer.train import loop
from pkmixer.train.config import build_config

from .common import Settings

EPOCHS = {"smoke": 2, "quick": 3, "full": 4}
BATCH = 128


def _cases(settings: Settings) -> list[dict]:
    model = {"model.name": "smixer_t4_28", "model.depth": 4, "model.embed_dim": 32, "model.num_tokens": 32}
    try:
        load_resident("fashion-mnist", "test", subset=1)
        fashion = {"data.name": "fashion-mnist", "data.train_subset": 8000}
    except ConfigError:
        fashion = {"data.name": "synthetic", "model.img_size": 32, "model.in_chans": 3}
    small = settings.mode == "smoke"
    size = {"data.train_subset": 512, "data.test_subset": 256} if small else {}
    fig5 = "fig5-smixer" if fashion["data.name"] == "fashion-mnist" else "fig5-smixer (synthetic)"
    return [
        {"case": fig5, "goal": 1.1, "config": {**model, **fashion, **size}},
        {"case": f"{fig5}, per-sample pipeline", "goal": None,  # the DataLoader path, for comparison
         "config": {**model, **fashion, **size, "data.pipeline": "per-sample"}},
        {"case": "crop-flip-32px-rgb", "goal": 1.2,
         "config": {**model, "data.name": "synthetic", "model.img_size": 32, "model.in_chans": 3,
                    "data.crop_padding": 4, "data.hflip": True, **size}},
    ]


def _config(case: dict, epochs: int, device: str):
    return build_config(None, {**case["config"], "data.batch_size": BATCH, "data.eval_batch_size": 256,
                               "optim.name": "adamw", "optim.lr": 0.001, "schedule.epochs": epochs,
                               "run.progress": False, "run.device": device})


def _pkmixer_epochs(case: dict, epochs: int, device: str) -> tuple[list[float], dict]:
    root = Path(tempfile.mkdtemp(prefix="pkmixer-bench-"))
    try:
        summary = loop.train(_config(case, epochs, device), root / "run", log=lambda _: None)
        rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [r["epoch_time"] for r in rows], summary


def reference_epoch(model, optimizer, x, y, x_test, y_test, generator: torch.Generator, autocast) -> None:
    """One epoch of the frozen reference loop (module docstring); do not optimise it. ``autocast``: the
    precision pkmixer trains in on this device (bf16 autocast on a GPU, nothing on the CPU)."""
    model.train()
    order = torch.randperm(x.shape[0], generator=generator).to(x.device)
    for start in range(0, x.shape[0] - BATCH + 1, BATCH):
        idx = order[start:start + BATCH]
        with autocast():
            loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad(), autocast():
        correct = sum(int((model(x_test[i:i + 256]).argmax(1) == y_test[i:i + 256]).sum())
                      for i in range(0, x_test.shape[0], 256))
    assert 0 <= correct <= x_test.shape[0]


def _reference_epochs(case: dict, epochs: int, settings: Settings) -> list[float]:
    cfg = _config(case, epochs, settings.device)
    device = settings.torch_device
    d = cfg.data
    tensors = []
    for split, subset in (("train", d.train_subset), ("test", d.test_subset)):
        data = load_resident(d.name, split, subset=subset)
        info = dataset_info(d.name)
        x = data.images.float() / (255.0 if data.images.dtype == torch.uint8 else 1.0)
        mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (info.mean, info.std))
        tensors += [((x - mean) / std).to(device), data.labels.to(device)]
    options = dict(cfg.model.options, num_classes=info.num_classes)
    torch.manual_seed(0)
    model = create_model(cfg.model.name, **options).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(epochs):
        t = time.perf_counter()
        reference_epoch(model, optimizer, *tensors, generator, settings.autocast)
        times.append(time.perf_counter() - t)
    return times


def section_g(settings: Settings) -> dict:
    """pkmixer train's epoch against the frozen reference loop, alternately, medians (module docstring)."""
    epochs = EPOCHS[settings.mode]
    rows = []
    for case in _cases(settings):
        ours, ref, steps = [], [], None
        for _ in range(settings.repeats):
            times, summary = _pkmixer_epochs(case, epochs, settings.device)
            ours.append(statistics.median(times[1:]))
            ref.append(statistics.median(_reference_epochs(case, epochs, settings)[1:]))
        cfg = _config(case, epochs, settings.device)
        n_train = len(load_resident(cfg.data.name, "train", subset=cfg.data.train_subset))
        steps = n_train // BATCH
        o, r = statistics.median(ours), statistics.median(ref)
        rows.append({"case": case["case"], "goal": case["goal"], "pipeline": summary["pipeline"],
                     "epochs": epochs, "steps_per_epoch": steps, "pkmixer_epoch_s": o, "reference_epoch_s": r,
                     "pkmixer_ms_per_step": 1e3 * o / steps, "reference_ms_per_step": 1e3 * r / steps,
                     "ratio": o / r, "repeats": settings.repeats})
    return {"rows": rows}
