"""Training one run (Hayase & Karakida App. C, Table S.2; Mixer supp. B, C): :func:`train`, a short loop over a
:class:`~pkmixer.train.run.Run` (its lifecycle, files and crash-safety invariant are described there)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from . import distributed as dist_
from .config import TrainConfig
from .engine import TrainingDiverged
from .run import Run, check_stop_after, rng_state, set_threads


def train(cfg: TrainConfig | None, run_dir: str | Path, resume: bool = False, stop_after: int | None = None,
          log: Callable[[str], None] = print, threads: int | None = None) -> dict[str, Any]:
    """Train (or resume) a run; returns its summary. ConfigError for bad input, TrainingDiverged on NaN.

    ``resume`` continues from ``checkpoints/latest.pt``; a directory killed before its first checkpoint (holding
    only what a run writes) starts afresh, with its own config.yaml or ``cfg``. ``stop_after`` ends this
    invocation after that many epochs, leaving the run resumable (a job-time limit). The main process holds
    the run's lock for the whole call. ``threads`` sets torch's thread count; without it a resumed run takes
    the count its checkpoint was written with (CPU results are bit-exact only at one count), a fresh run the
    current one. A loss that becomes NaN or infinite stops the run and keeps the last good checkpoint.
    """
    check_stop_after(stop_after)
    with Run.claimed([run_dir], [cfg], [resume], log) as (run,):
        ctx = dist_.setup(run.cfg.run.device)
        try:
            set_threads([run.checkpoint], threads, ctx, log)
            run.build(ctx)
            run.start()
            started = t0 = time.time()  # an epoch's time runs from the previous epoch's row: its checkpoints count
            epochs = run.cfg.schedule.epochs
            end_epoch = epochs if stop_after is None else min(epochs, run.start_epoch + stop_after)
            for epoch in range(run.start_epoch, end_epoch):
                try:
                    train_loss = run.engine.train_epoch(epoch)
                except TrainingDiverged as err:
                    run.diverged(epoch)
                    raise TrainingDiverged(f"{err}; the run stopped and keeps its last good checkpoint in "
                                           f"{run.files.latest.parent}") from None
                metrics = {"epoch": epoch + 1, "train_loss": train_loss, **run.engine.evaluate(),
                           "lr": run.engine.lr, "epoch_time": time.time() - t0}
                t0 = time.time()
                run.end_epoch(metrics, end_epoch, rng_state())
                dist_.barrier(ctx)
            return run.finish(end_epoch, started)
        finally:
            dist_.teardown()
