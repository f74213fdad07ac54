"""``--set key=value`` options: values are Python literals (numbers, tuples, lists, None, booleans) or strings."""
from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from .errors import ConfigError


def parse_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word such as all or gelu


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
