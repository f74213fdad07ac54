"""What the verbs share: bounds of their options, argument readers (numbers, lists, output files, data folders,
models given as a name, checkpoint or run directory) and the plain-text table."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, check_output_path
from ..train.config import MAX_INT

if TYPE_CHECKING:
    import torch


MAX_BATCH = 4096  # inputs of `effective`, images of `throughput`
MAX_CKA_EXAMPLES = 1 << 20  # inputs of `cka`
MAX_COUNT = MAX_INT  # sizes, counts and batches that are only counted, never allocated
MAX_SPECTRUM_WIDTH = 2**20  # `spectrum --widths`: (Ω/γ)^(2/3) at Ω = 2**30
MAX_THREADS = 1024  # --threads, $PKMIXER_THREADS; reproduce's --workers, --threads, --seeds


def print_table(rows: list[list[str]], header: list[str]) -> None:
    """Rows under a header, the first column left-aligned and the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


def csv_values(text: str, kind: type, flag: str) -> list:
    """A comma-separated option as a list of ``kind`` values."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated {kind.__name__} values, got {text!r}") from None


def fresh_output(path: str | None, overwrite: bool, what: str = "figure") -> str | None:
    """An output file that can be written: not a folder, not under a file, in a folder that accepts files, and
    not existing yet unless ``overwrite`` (results are never overwritten unless asked); a figure's suffix too."""
    if path is None:
        return None
    if what == "figure":
        from ..figures import figure_path

        figure_path(path)
    check_output_path(path, what, overwrite=overwrite)
    return path


def bounded(flag: str, value: int | float | None, low: int | float, high: int | float) -> None:
    """A numeric option in [low, high] (finite); None (not given) passes."""
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{flag} must lie in [{low}, {high}], got {value}")


def data_dir_arg(path: str | None) -> str | None:
    """--data-dir: an existing folder."""
    if path is not None and not Path(path).is_dir():
        raise ConfigError(f"--data-dir {path} is not a folder" if Path(path).exists() else f"no folder at {path}")
    return path


def checkpoint_path(text: str) -> str:
    """A checkpoint file, or a run directory's checkpoint: best.pt (validation-selected) where it has one, else
    latest.pt."""
    from ..train.rundir import RunDir

    if Path(text).is_dir():
        run = RunDir(Path(text))
        if not run.selected.is_file():
            raise ConfigError(f"{text} is not a run directory with checkpoints (best.pt or latest.pt)")
        return str(run.selected)
    return text


def load_model_arg(text: str, overrides: dict) -> torch.nn.Module:
    """A run directory (its best.pt, else latest.pt), a checkpoint file (pkmixer, timm or Flax), or a registered name
    built fresh."""
    from ..models.convert import import_checkpoint
    from ..models.registry import create_model

    text = checkpoint_path(text)
    if Path(text).exists() or text.endswith((".pt", ".pth", ".npz")):
        if overrides:
            raise ConfigError("--set applies to registered names, not to checkpoints")
        return import_checkpoint(text).model
    return create_model(text, **overrides)
