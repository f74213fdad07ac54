"""``--set key=value`` options: values are Python literals (numbers, tuples, lists, None, booleans), YAML's
true/false/null, or strings."""
from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from .errors import ConfigError


_WORDS = {"true": True, "false": False, "null": None, "none": None}


def parse_value(text: str) -> Any:
    """A Python literal, YAML's true/false/null, or else the text itself (a bare word such as all or gelu)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return _WORDS.get(text.lower(), text)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """["depth=2", "rp_blocks=all", "optim.lr=0.1"] -> {"depth": 2, "rp_blocks": "all", "optim.lr": 0.1}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not all(part.isidentifier() for part in key.split(".")):
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key] = parse_value(value.strip())
    return out
