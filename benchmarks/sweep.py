"""Section w: Fig. 5's Ω ≤ 2^21 runs at paper scale as a whole sweep on one GPU, timed end to end.

Section h projects the sweep from model steps alone; this section runs the real thing, truncated in epochs:
:func:`pkmixer.experiments.sweep.run_sweep` over the 87 runs of ``pkmixer reproduce fig5 --scale paper --dataset
cifar10`` with Ω ≤ 2^21 (S-Mixers, RP S-Mixers and SW-MLPs), each trained for 1 and then for 2 epochs in fresh
directories, with the whole run pipeline: data resident on the GPU, crop and flip per image, evaluation, checkpoint
and metrics writes, ``workers`` runs at a time sharing the GPU (start ``nvidia-cuda-mps-control -d`` first so that
their kernels overlap). The data is CIFAR-10-shaped random images written in CIFAR-10's on-disk format (random
labels: some SW-MLPs diverge and stop early, as they would not on CIFAR-10, so the figure is a slight floor).

Projection of the paper's 200 epochs: wall(1) + 199 × (wall(2) − wall(1)), the second epoch's marginal cost
(process start and data loading fall in the first). A compiled case first runs an untimed 1-epoch sweep that fills
inductor's on-disk cache, as a real sweep's first runs do for the rest (on the H100 a cold 1-epoch sweep took 250 s
and a warm 2-epoch one 178 s, so without it the difference is meaningless); its extra time over the warm 1-epoch
sweep is added to the projection. Cases: eager execution (eager), ``run.compile_mode=reduce-overhead`` (graphs:
CUDA graphs, ``pkmixer reproduce --compile reduce-overhead``), and each with a point's 3 seeds trained as one stack
(stacked, stacked-graphs: ``--stack``, 29 jobs of 3); ``--sweep-cases`` picks them. Target:
≤ 30 GPU-minutes for these runs. A GPU only; on the CPU the smoke form trains 2 runs of 256 images.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pkmixer.experiments import get_preset
from pkmixer.experiments.reproduce import compiled_runs, with_epochs
from pkmixer.experiments.sweep import run_sweep

from .common import Settings

PAPER_EPOCHS = 200
CASES = {"eager": (None, False), "stacked": (None, True),  # common.SWEEP_CASES: (compile mode, stacked)
         "graphs": ("reduce-overhead", False), "stacked-graphs": ("reduce-overhead", True)}


def fake_cifar10(root: Path, per_batch: int) -> None:
    """Random uint8 images and labels in CIFAR-10's python format (5 training batches and a test batch)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        (folder / name).write_bytes(pickle.dumps({"batch_label": name, "labels": labels, "data": data,
                                                  "filenames": [f"{i}.png" for i in range(per_batch)]}, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"num_cases_per_batch": per_batch, "num_vis": 3072,
                                                        "label_names": [f"c{i}" for i in range(10)]}, protocol=2))


def _specs(data_dir: Path, epochs: int, mode: str | None, smoke: bool) -> list:
    specs = [s for s in get_preset("fig5").runs("paper", "cifar10") if s.meta["omega"] <= 2**21]
    specs = with_epochs(specs, epochs, "fig5")
    if mode is not None:
        specs = compiled_runs(specs, mode)
    extra = {"data.train_subset": 256, "data.test_subset": 128} if smoke else {}
    specs = [dataclasses.replace(s, config=s.config.override({"data.data_dir": str(data_dir), **extra}))
             for s in specs]
    return specs[:2] if smoke else specs


def section_w(settings: Settings) -> dict:
    """Each case's sweep wall time at 1 and 2 epochs, and the projection to 200 (module docstring)."""
    smoke = settings.device != "cuda"
    workers = 2 if smoke else min(14, os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        fake_cifar10(data, 1_000 if smoke else 10_000)
        for case in settings.sweep_cases:
            mode, stack = CASES[case]
            if smoke and mode is not None:
                continue  # compiling on the CPU takes minutes: the CUDA-graph case is for the GPU
            walls = {}
            for label, epochs in (("cold", 1), (1, 1), (2, 2)) if mode else ((1, 1), (2, 2)):
                specs = _specs(data, epochs, mode, smoke)
                t = time.perf_counter()
                done = run_sweep(specs, Path(tmp) / f"{case}-{label}", workers=workers, threads=1, progress=False,
                                 log=lambda _: None, stack=stack)
                walls[label] = time.perf_counter() - t
                status = {s: sum(r["status"] == s for r in done) for s in {r["status"] for r in done}}
                print(f"section w: {case}, {label}: {walls[label]:.1f} s, {status}", file=sys.stderr, flush=True)
            per_epoch = walls[2] - walls[1]
            compiling = walls.get("cold", walls[1]) - walls[1]  # the first compilations, before the cache holds them
            rows.append({"case": case, "compile_mode": mode, "stacked": stack, "runs": len(specs), "workers": workers,
                         "cold_cache_extra_s": compiling, "wall_1_epoch_s": walls[1], "wall_2_epochs_s": walls[2],
                         "per_epoch_s": per_epoch, "status": status,
                         "stack_sizes": sorted({r["stack"] or 1 for r in done}),
                         "projected_gpu_minutes": (compiling + walls[1] + (PAPER_EPOCHS - 1) * per_epoch) / 60})
    return {"rows": rows, "paper_epochs": PAPER_EPOCHS}
