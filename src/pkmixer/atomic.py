"""Files written so that a kill at any instant leaves either the old content or the new, never a mix.

Whole files (checkpoints, configs, summaries, results tables, reports) go through a temporary file in the same
folder, fsynced and renamed into place (:func:`write_atomically`); the temporary name is
``.<name>.<random>.tmp`` (:func:`is_temp_file`), so whoever owns the folder can recognise and remove leftovers
of a kill. Logs grow by whole lines (:func:`append_line`); a kill during an append can leave only the last
line cut, which readers of such logs drop (:func:`read_jsonl`).

An OS error during a write (no space, no permission, a folder that vanished) leaves the old content as well:
:func:`write_atomically` removes its temporary file and :func:`append_line` cuts the file back to its old end,
and both raise an :class:`OSError` that names the file meant to be written (also where the writer, e.g.
``torch.save``, wrapped the OSError in another exception).

Fault injection, for tests only: with ``PKMIXER_FAULT=POINT:N`` in the environment the process SIGKILLs itself
the N-th time it reaches ``POINT``, one of :data:`FAULT_POINTS`; with ``PKMIXER_FAULT=POINT:N:ERRNO`` (e.g.
``before-temp-write:3:ENOSPC``) it raises that OSError there instead - at ``before-temp-write`` from the first
write into the temporary file, as a full disk does; with ``PKMIXER_FAULT_TRACE=FILE`` every point reached is
appended to FILE as ``POINT:N``. Tests kill a run (or fail its write) at every (point, occurrence) pair of an
uninterrupted run's trace and check that resuming gives the same result. Fsync makes the writes durable, but
kill tests cannot prove safety against power loss: we claim kills.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

FAULT_ENV, FAULT_TRACE_ENV = "PKMIXER_FAULT", "PKMIXER_FAULT_TRACE"
FAULT_POINTS = (
    "before-temp-write",  # the temporary file exists, empty
    "after-temp-write",  # the temporary file is whole and fsynced, not yet renamed
    "after-rename",  # the new file is in place (the folder not yet fsynced)
    "before-append",  # a log line is about to be appended
    "mid-append",  # half of the line is written: the file ends in a cut line
    "after-append",  # the line is whole
)
_reached: Counter[str] = Counter()


def fault_point(point: str, path: Path | None = None) -> None:
    """Record ``point`` in the fault trace and die there, or raise the OSError of ``path``, if the test hook asks
    to (see the module docstring)."""
    target, trace = os.environ.get(FAULT_ENV), os.environ.get(FAULT_TRACE_ENV)
    if not target and not trace:
        return
    _reached[point] += 1
    here = f"{point}:{_reached[point]}"
    if trace:
        with open(trace, "a") as f:
            f.write(here + "\n")
    if target == here:
        os.kill(os.getpid(), signal.SIGKILL)
    if target and target.startswith(here + ":"):
        code = getattr(errno, target[len(here) + 1:])
        raise OSError(code, os.strerror(code), None if path is None else str(path))


class _FailingWrites:
    """A file whose next write raises ``error`` (an injected full disk); everything else is the file's."""

    def __init__(self, file: BinaryIO, error: OSError) -> None:
        self._file, self._error = file, error

    def write(self, data: bytes) -> int:
        raise self._error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def _naming(err: BaseException, path: Path) -> BaseException:
    """The OSError behind ``err`` (``err`` itself, or the one a writer such as ``torch.save`` wrapped in a
    RuntimeError) naming ``path`` rather than a temporary file; ``err`` when there is none."""
    found: BaseException | None = err
    while isinstance(found, RuntimeError):
        found = found.__cause__ or found.__context__
    if not isinstance(found, OSError):
        return err
    if found.filename is None or is_temp_file(Path(str(found.filename))):
        found.filename = str(path)
    return found


def reset_fault_counts() -> None:
    """Start counting occurrences afresh (a forked test child inherits its parent's counts)."""
    _reached.clear()


def is_temp_file(path: Path) -> bool:
    """A temporary file of :func:`write_atomically` (left behind only by a kill)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write through a temporary file in the same folder, renamed into place: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _naming(err, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                fault_point("before-temp-write", path)
            except OSError as err:
                f = _FailingWrites(f, err)  # type: ignore[assignment]
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; give the permissions open() would
        fault_point("after-temp-write", path)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        found = _naming(err, path)
        if found is err:
            raise
        raise found from err
    fault_point("after-rename", path)
    _fsync_dir(path.parent)


def write_text_atomically(path: Path, text: str) -> None:
    """:func:`write_atomically` for UTF-8 text."""
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


def append_line(path: Path, line: str) -> None:
    """Append one line (no newline in it) and fsync; a kill can cut only this line. On an OS error (a full
    disk) the file is cut back to where it ended and the error raised: the line is all there or not at all."""
    if "\n" in line:
        raise ValueError("append_line takes a single line")
    data = (line + "\n").encode("utf-8")
    fault_point("before-append", path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as err:
        raise _naming(err, path) from None
    try:
        end = os.fstat(fd).st_size
        half = len(data) // 2
        try:
            _write_all(fd, data[:half])
            fault_point("mid-append", path)
            _write_all(fd, data[half:])
            os.fsync(fd)
        except OSError as err:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass  # then the cut line stays, as after a kill: readers drop it
            raise _naming(err, path) from None
    finally:
        os.close(fd)
    fault_point("after-append", path)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a full disk first takes what fits (a short write), then refuses (ENOSPC)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The whole JSON lines of a log written by :func:`append_line`; a cut last line (a kill during an append)
    is dropped. A bad line before the last is not a kill's doing: ValueError."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # no newline after it: the append was cut
                break
            raise ValueError(f"{path}, line {i + 1}: not a JSON line") from None
    return rows


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
