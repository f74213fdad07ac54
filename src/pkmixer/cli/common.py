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


# ---- what a command that stops says -------------------------------------------------------------------------

# what to do about an OS error (an environment fault, exit status 1), by errno name
FAULT_ADVICE = {
    "ENOSPC": "free space on its disk",
    "EDQUOT": "free space within your disk quota",
    "EFBIG": "free space, or write to a file system that takes larger files",
    "EACCES": "give this user access to it and its folder, or choose another path",
    "EPERM": "give this user access to it and its folder, or choose another path",
    "EROFS": "its file system is read-only: choose a path on a writable disk",
    "ENOENT": "it was moved or removed while pkmixer ran: put it back, or choose another path",
    "ENOTDIR": "a folder on its path was replaced by a file while pkmixer ran: put it back, or choose another path",
    "EIO": "the disk reported a read or write error: check it",
}


def refusal(err: BaseException, args) -> tuple[int, str] | None:
    """(exit status, one line for stderr) of an error the user can act on, None for any other (a bug: its
    traceback shows). Bad input (:class:`ConfigError`): 2 and its message. An OS error of :data:`FAULT_ADVICE`
    (a full disk, no permission, a read-only file system, a path that vanished): 1, the path, what to do, and
    how to go on - the files are whole (:mod:`pkmixer.atomic`), so a run resumes from its last checkpoint."""
    import errno
    import os

    if isinstance(err, ConfigError):
        return 2, str(err)
    name = errno.errorcode.get(getattr(err, "errno", None) or -1)
    if not isinstance(err, OSError) or name not in FAULT_ADVICE:
        return None
    where = f"{err.filename}: " if err.filename else ""
    line = f"{where}{err.strerror or os.strerror(err.errno)}; {FAULT_ADVICE[name]}, then {_going_on(err, args)}"
    return 1, line


def _going_on(err: OSError, args) -> str:
    """How to go on after an environment fault: resume the run (train, finetune), rerun the sweep (reproduce,
    which resumes its runs), or run the command again (the others wrote nothing: their outputs are atomic)."""
    if args.verb == "reproduce":
        return "run the same command again: the sweep goes on where it stopped"
    if args.verb not in ("train", "finetune"):
        return "run the command again"
    run = Path(args.run_dir) if args.run_dir else None
    if run is None and err.filename:  # the default run directory: the folder of the file that holds the run's lock
        run = next((p for p in Path(str(err.filename)).parents if (p / ".lock").is_file()), None)
    if run is None or not run.is_dir():
        return "run the command again"
    if not (run / "config.yaml").is_file():
        return f"remove {run} (the run wrote nothing) and run the command again"
    return f"continue the run with: pkmixer train --resume --run-dir {run}"
