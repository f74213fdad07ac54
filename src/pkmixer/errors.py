"""One error type for bad user input, and the small checks that raise it.

The command line turns a :class:`ConfigError` into one line on stderr and exit status 2. Numbers are checked
to be finite as well as in range; output paths are checked before any work starts (:func:`check_output_path`).
"""
from __future__ import annotations

import difflib
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


class ConfigError(ValueError):
    """A model, layer or command was given arguments it cannot accept."""


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_density(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{name} must lie in (0, 1], got {value!r}")
    return float(value)


def check_rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{name} must lie in [0, 1), got {value!r}")
    return float(value)


def unknown_name(kind: str, name: str, known: Iterable[str]) -> ConfigError:
    """An error for an unknown ``name`` that suggests the closest known names."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
    return ConfigError(f"unknown {kind} {name!r}{hint}")


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (as a path, a broken link counts as existing)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(".")


def check_output_path(path: str | os.PathLike, what: str = "output", *, folder: bool = False,
                      overwrite: bool = False) -> Path:
    """``path`` as a Path, refused (ConfigError) unless it can be written: a file that exists only with
    ``overwrite``; never a folder where a file is wanted (nor a file where a folder is wanted); not under a
    file; and the folder that would hold it must accept new files - tried by creating and removing an empty
    temporary file there, since permission bits say nothing to root (nor about /proc or read-only mounts).
    With ``folder=True`` an existing folder is accepted (what is inside is the caller's business)."""
    path = Path(path)
    if not str(path) or "\0" in str(path):
        raise ConfigError(f"{what} path {str(path)!r} is not a valid path")
    if os.path.lexists(path):
        if folder:
            if not path.is_dir():
                raise ConfigError(f"{what} {path} is a file, not a folder")
            probe_in = path
        else:
            if path.is_dir():
                raise ConfigError(f"{what} {path} is a folder, not a file name")
            if not overwrite:
                raise ConfigError(f"{path} exists; pass --overwrite to replace it")
            if not path.is_file():
                raise ConfigError(f"{what} {path} is not a regular file")
            probe_in = path.parent
    else:
        probe_in = _nearest_existing(path.parent)
        if not probe_in.is_dir():
            raise ConfigError(f"{what} {path} cannot be created: {probe_in} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe_in):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"{what} {path} cannot be written: {probe_in} does not accept new files ({reason})") \
            from None
    return path


def check_input_file(path: str | os.PathLike, what: str = "input") -> Path:
    """``path`` as a Path, refused unless it is a readable regular file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no {what} file at {path}")
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder, not a file")
    if not path.is_file():
        raise ConfigError(f"{what} {path} is not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path} ({err.strerror or type(err).__name__})") from None
    return path
