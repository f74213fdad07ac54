"""Reproducing the paper: sweeps (local processes or Ray), one preset per figure/table, reports.

See docs/reproduction.md; ``pkmixer reproduce --list`` lists the presets.
"""
from .preset import SCALES, Analysis, Preset, get_preset, list_presets, register_preset
from .sweep import RunSpec, load_rows, run_sweep

__all__ = ["SCALES", "Analysis", "Preset", "RunSpec", "get_preset", "list_presets", "load_rows",
           "register_preset", "run_sweep"]
