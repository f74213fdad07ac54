"""Writing figures: one place that checks the file type and saves a matplotlib ``Figure``.

Figures are built as ``matplotlib.figure.Figure`` objects (never pyplot: no global state, no display) and
written as PNG or SVG, chosen by the path's suffix, through a temporary file (:mod:`pkmixer.atomic`).
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .atomic import write_atomically
from .errors import ConfigError

FIGURE_SUFFIXES = (".png", ".svg")


def figure_path(path: str | Path) -> Path:
    """``path`` as a Path, refused unless it ends in .png or .svg."""
    path = Path(path)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise ConfigError(f"a figure path must end in {' or '.join(FIGURE_SUFFIXES)}, got {str(path)!r}")
    return path


def save_figure(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write ``fig`` to ``path`` (PNG or SVG by suffix; atomically: never a half-written file), creating the
    folder; returns the path."""
    path = figure_path(path)
    write_atomically(path, lambda f: fig.savefig(f, format=path.suffix.lower()[1:], dpi=dpi, bbox_inches="tight"))
    return path
