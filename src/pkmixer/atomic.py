"""Files written atomically: through a temporary file in the same folder, renamed into place, so readers and a
kill at any moment see the old file or the new one, never a half-written one (checkpoints, results tables,
reports)."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write through a temporary file in the same folder, renamed into place: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; give the permissions open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomically(path: Path, text: str) -> None:
    """:func:`write_atomically` for UTF-8 text."""
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))
