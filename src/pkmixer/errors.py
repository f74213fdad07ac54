"""One error type for bad user input, and the small checks that raise it.

The command line turns a :class:`ConfigError` into one line on stderr and exit status 2.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A model, layer or command was given arguments it cannot accept."""


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
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
