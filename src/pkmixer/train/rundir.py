"""A run directory: its files, the lock of the one process that trains it, and the repairs a resume makes.

::

    .lock                  held (flock) by the process that trains the run, for its whole life
    config.yaml            the resolved configuration
    metrics.jsonl          one JSON line per epoch (appended whole; a kill can cut only the last line)
    checkpoints/latest.pt  model, optimiser, schedule, epoch, best error and RNG states
    checkpoints/best.pt    the same at the lowest validation error so far (none without a validation split: the
                           test split selects nothing)
    summary.json           finished, stopped or diverged; best and last test error; wall time
    error.txt              why a sweep's run failed (written by the sweep)
    metrics.csv            the metrics rows as a table, with the csv logger (run.loggers)
    tensorboard/, wandb/   the tensorboard and wandb loggers' files

Every file is written atomically (:mod:`pkmixer.atomic`), so at every instant the directory is a state that
``--resume`` continues to the result of an uninterrupted run (see :func:`pkmixer.train.loop.train` for the
order of the writes that makes this hold). Temporary files a kill left behind are removed under the lock.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import append_line, is_temp_file, read_jsonl, write_text_atomically
from ..errors import ConfigError

# what a run (or the sweep around it) writes into its directory; anything else is the user's
RUN_FILES = frozenset({".lock", "config.yaml", "metrics.jsonl", "metrics.csv", "summary.json", "error.txt",
                       "checkpoints", "tensorboard", "wandb", "probes.json", "grams.npz"})


@dataclass(frozen=True)
class RunDir:
    root: Path

    lock = property(lambda self: self.root / ".lock")
    config = property(lambda self: self.root / "config.yaml")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    metrics_csv = property(lambda self: self.root / "metrics.csv")
    checkpoints = property(lambda self: self.root / "checkpoints")
    latest = property(lambda self: self.root / "checkpoints" / "latest.pt")
    best = property(lambda self: self.root / "checkpoints" / "best.pt")
    summary = property(lambda self: self.root / "summary.json")
    error = property(lambda self: self.root / "error.txt")
    tensorboard = property(lambda self: self.root / "tensorboard")
    probes = property(lambda self: self.root / "probes.json")  # written by a sweep (pkmixer.experiments.probes)
    grams = property(lambda self: self.root / "grams.npz")  # its CKA probe's Gram matrices

    @property
    def selected(self) -> Path:
        """The checkpoint that stands for the run: best.pt (validation-selected) where there is one, else
        latest.pt."""
        return self.best if self.best.is_file() else self.latest

    def foreign_files(self) -> list[str]:
        """Names in the directory that no run writes (a temporary file of ours counts as a run's)."""
        return sorted(p.name for p in self.root.iterdir() if p.name not in RUN_FILES and not is_temp_file(p))

    def remove_temp_files(self) -> None:
        """Remove the temporary files a kill left (call only under the run's lock)."""
        found = [p for folder in (self.root, self.checkpoints) if folder.is_dir()
                 for p in folder.iterdir() if is_temp_file(p) and p.is_file()]
        for p in found:
            p.unlink(missing_ok=True)

    def clear_unstarted(self) -> None:
        """Empty a run that never reached its first checkpoint (under its lock), keeping the lock file.
        Refused when the directory holds anything a run does not write."""
        foreign = self.foreign_files()
        if foreign:
            raise ConfigError(f"{self.root} holds files a run does not write ({', '.join(foreign[:3])}); "
                              "move them away or choose another --run-dir")
        for p in self.root.iterdir():
            if p.name == ".lock":
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()

    # ---- metrics ----------------------------------------------------------------------------------------

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metrics rows (a line cut by a kill dropped)."""
        try:
            return read_jsonl(self.metrics)
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(f"{self.metrics} is damaged ({err}); it is not something a kill leaves") from None

    def append_metrics(self, row: dict[str, Any]) -> None:
        append_line(self.metrics, json.dumps(row))

    def truncate_metrics(self, epochs_done: int) -> None:
        """Keep the rows of epochs up to the checkpoint's (rows after it and a cut line were written before a
        kill, and the epochs are trained again). Rewritten atomically, and only when something must go."""
        if not self.metrics.exists():
            return
        rows = self.read_metrics()
        keep = [r for r in rows if r.get("epoch", 0) <= epochs_done]
        text = "".join(json.dumps(r) + "\n" for r in keep)
        if text.encode("utf-8") != self.metrics.read_bytes():
            write_text_atomically(self.metrics, text)


def hold_lock(path: Path, what: str) -> int:
    """An exclusive ``flock`` on ``path`` (made if missing; its content becomes this pid), released by the kernel
    when the process dies however it dies: the open descriptor. ConfigError at once when another process holds
    it: "another process (pid N) is <what>"."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:  # removed by a holder that gave up
            raise OSError
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise ConfigError(f"another process{f' (pid {holder})' if holder else ''} is {what}; wait for it to end") \
            from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def remove_if_untouched(root: Path, made_parents: tuple[Path, ...] = ()) -> bool:
    """Remove ``root`` if it holds only its ``.lock`` (a run or sweep directory made for an attempt that wrote
    nothing), then the folders made above it (``made_parents``, the deepest first) while they are empty; True
    if ``root`` was removed."""
    if {p.name for p in root.iterdir()} != {".lock"}:
        return False
    (root / ".lock").unlink()
    root.rmdir()
    for folder in made_parents:  # one another process filled stays
        try:
            folder.rmdir()
        except OSError:
            break
    return True


class RunLock:
    """The lock of the one process that trains a run directory (``flock`` on ``.lock``, released by the
    kernel when the process dies, however it dies). A second process is refused at once."""

    def __init__(self, run: RunDir, made_dir: bool = False, made_parents: tuple[Path, ...] = ()) -> None:
        # made_dir: the directory was made for this lock's holder; made_parents: so were these folders above it
        self.run, self.made_dir, self.made_parents = run, made_dir, made_parents
        self.fd: int | None = None
        self.made_file = False

    def __enter__(self) -> RunLock:
        self.made_file = not self.run.lock.exists()
        self.fd = hold_lock(self.run.lock, f"training {self.run.root}")
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        if self.fd is None:
            return
        # refused input, or a first write the machine refused (no space, no permission): leave no trace of the attempt
        if kind is not None and issubclass(kind, (ConfigError, OSError)):
            if not (self.made_dir and remove_if_untouched(self.run.root, self.made_parents)) and self.made_file:
                self.run.lock.unlink()
        os.close(self.fd)  # after the unlink: no other process can lock the removed file meanwhile
        self.fd = None
