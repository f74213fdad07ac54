"""Figures of the theory's numbers: singular-value histograms against the Marchenko-Pastur law, and λ_max against
width at fixed Ω (Hayase & Karakida Sec. 4.3, Fig. 4 right; App. D.1). The numbers come from
:mod:`pkmixer.theory.spectrum`, which stays free of plotting; these are matplotlib ``Figure`` objects rendered by
the Agg (PNG) or SVG canvas, pyplot is never touched.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from ..errors import ConfigError
from ..figures import figure_path, save_figure
from ..theory.spectrum import c_gamma, fixed_omega_term, mp_edges, mp_pdf


def _omega_label(omega: float) -> str:
    power = math.log2(omega)
    return f"$2^{{{power:.0f}}}$" if power.is_integer() else f"{omega:.4g}"


def plot_spectrum(values: np.ndarray, gamma: float, path: str | Path, title: str | None = None,
                  bins: int = 60) -> Path:
    """Histogram of singular values against the Marchenko-Pastur density for γ (PNG or SVG by suffix)."""
    path = figure_path(path)
    s = np.asarray(values, dtype=np.float64)
    if s.size == 0:
        raise ConfigError("plot_spectrum needs at least one singular value")
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    ax.hist(s, bins=bins, density=True, color="tab:blue", alpha=0.6, label=f"empirical ({s.size} values)")
    lo, hi = mp_edges(gamma)
    grid = np.linspace(lo, hi, 400)
    ax.plot(grid, mp_pdf(grid, gamma), color="tab:red", lw=2, label=f"Marchenko–Pastur, γ = {gamma:g}")
    ax.axvline(c_gamma(gamma), color="tab:red", ls="--", lw=1,
               label=f"$c_\\gamma = 1+\\sqrt{{\\gamma}}$ = {c_gamma(gamma):.3g}")
    ax.set_xlabel("singular value")
    ax.set_ylabel("density")
    ax.set_title(title or "Singular values against the Marchenko–Pastur law")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_lambda_max(report: dict, path: str | Path) -> Path:
    """λ_max of SW-MLP weights against width m at fixed Ω, with √L₊ and the Mixer's c_γ (Fig. 4 right)."""
    path = figure_path(path)
    rows, omega, gamma = report["rows"], report["omega"], report["gamma"]
    m = np.array([r["m"] for r in rows], dtype=np.float64)
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    ax.errorbar(m, [r["lambda_max_mean"] for r in rows], yerr=[r["lambda_max_std"] for r in rows], fmt="o",
                color="tab:blue", capsize=3, label="SW-MLP $M\\odot A$ (mean ± std over seeds)")
    grid = np.geomspace(m.min(), m.max(), 200)
    theory = [math.sqrt(c_gamma(gamma) ** 2 * (1 + 3 * math.sqrt(gamma) * fixed_omega_term(omega, w, gamma)))
              for w in grid]
    ax.plot(grid, theory, color="tab:blue", lw=1.5, label="$\\sqrt{L_+}$ (Eqs. 17–18)")
    ax.axhline(report["c_gamma"], color="tab:red", lw=1.5, label=f"Mixer: $c_\\gamma = 1+\\sqrt{{\\gamma}}$ = "
                                                                  f"{report['c_gamma']:.3g}")
    ax.set_xscale("log")
    ax.set_xticks(m, [f"{w:g}" for w in m])  # ticks at the measured widths
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("width m")
    ax.set_ylabel("largest singular value $\\lambda_{max}$")
    ax.set_title(f"Largest singular value at fixed Ω = {_omega_label(omega)}, γ = {gamma:g}")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
