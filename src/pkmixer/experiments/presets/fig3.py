"""Fig. 3: the theoretical line of the effective width m and the density p against C at fixed Ω (Hayase & Karakida
Sec. 4.1, Eqs. 13-15, S.45). Analysis only: no training.

Command::

    pkmixer reproduce fig3 --scale paper     # Ω = 10^8, γ = 1 as in the figure; small is the same, smoke coarser

The paper's claim: at fixed Ω and γ, S = (√(C² + 8Ω/(γC)) − C)/2 (Eq. 14), so the effective width m = S·C of a
Mixer is a function of C alone; it has a single peak, at C* = S* = (Ω/γ)^{1/3} with m = (Ω/γ)^{2/3} (Eq. 15),
where the density p = Ω/(γm²) (Eq. 13) is smallest. What a run shows: m(C) and p(C) on log axes from C = 1 to
the C at which S = 1, with C* and the bounds of S.45, (√(1 + 8Ω/γ) − 1)/2 ≤ m ≤ (Ω/γ)^{2/3}; the CSV holds the
curve. The verdict is exact arithmetic, not a statistic (nothing here is random, so there are no seeds): supported
when m rises up to C* and falls after it on the plotted grid, its largest value is (Ω/γ)^{2/3} at C* to 1e-9, p is
smallest there, the curve is symmetric under C ↔ S, and it stays within the bounds of S.45.

Scales: ``paper`` and ``small`` - Ω = 10^8, γ = 1 (the figure's caption), 401 values of C; ``smoke`` - the same
line at 41 values of C.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ...theory.width import mixer_width, optimal_channels, width_bounds
from ..preset import Analysis, Preset, register_preset
from ..sweep import RunSpec

OMEGA, GAMMA = 10**8, 1.0  # Fig. 3's caption
POINTS = {"paper": 401, "small": 401, "smoke": 41}  # values of C on the plotted range
TOLERANCE = 1e-9  # relative, for the exact checks of the verdict


def width_curve(omega: float, gamma: float, points: int) -> list[dict]:
    """Rows C, S, m = S·C and p = Ω/(γm²) at ``points`` values of C geometrically spaced from 1 to the C at which
    S = 1, with C* among them (the exact, unrounded S of Eq. 14)."""
    c_max = width_bounds(omega, gamma)[0]  # the C at which S = 1 (there m = C: S.45's lower bound)
    grid = np.unique(np.append(np.geomspace(1.0, c_max, points), optimal_channels(omega, gamma)))
    rows = []
    for C in grid:
        m = mixer_width(omega, float(C), gamma)
        rows.append({"C": float(C), "S": m / C, "m": m, "p": omega / (gamma * m * m)})
    return rows


@register_preset
class Fig3(Preset):
    name = "fig3"
    title = "Effective width m and density p against C at fixed Ω (theory, no training)"
    claim = ("At fixed Ω and γ the effective width m = SC, as a function of C, has a single peak at "
             "C* = S* = (Ω/γ)^{1/3} with m = (Ω/γ)^{2/3} (Eq. 15), where the density p = Ω/(γm²) is smallest.")
    source = "Hayase & Karakida Fig. 3, Sec. 4.1, Eqs. 13-15"
    datasets = ()

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        return []

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        curve = width_curve(OMEGA, GAMMA, POINTS[self.check_scale(scale)])
        c_star, (lower, upper) = optimal_channels(OMEGA, GAMMA), width_bounds(OMEGA, GAMMA)
        m = np.array([r["m"] for r in curve])
        C = np.array([r["C"] for r in curve])
        peak = int(np.argmax(m))
        rising, falling = bool(np.all(np.diff(m[:peak + 1]) > 0)), bool(np.all(np.diff(m[peak:]) < 0))
        at_peak = math.isclose(C[peak], c_star, rel_tol=TOLERANCE) and math.isclose(m[peak], upper, rel_tol=TOLERANCE)
        p_smallest = int(np.argmin([r["p"] for r in curve])) == peak
        # C <-> S: the point at C = S(C₀) has S = C₀ and the same width
        symmetric = all(math.isclose(mixer_width(OMEGA, r["S"], GAMMA), r["m"], rel_tol=1e-7) for r in curve[::10])
        within = bool(np.all(m >= lower * (1 - TOLERANCE)) and np.all(m <= upper * (1 + TOLERANCE)))
        supported = rising and falling and at_peak and p_smallest and symmetric and within
        numbers = {"Ω, γ": f"{OMEGA:.0e}, {GAMMA:g}", "C* = S* = (Ω/γ)^(1/3)": round(c_star, 4),
                   "largest m on the curve": round(float(m[peak]), 2), "(Ω/γ)^(2/3) (Eq. 15)": round(upper, 2),
                   "smallest p = (Ω/γ)^(-1/3)": f"{OMEGA / (GAMMA * upper ** 2):.4g}",
                   "lower bound of m (S.45, at C = 1 or S = 1)": round(lower, 2),
                   "C range plotted": f"1 to {C[-1]:.1f} ({len(curve)} values)"}
        verdict = (f"Exact, no seeds: m(C) rises up to C = {C[peak]:.2f} and falls after it "
                   f"({'single peak' if rising and falling else 'not a single peak'}); the largest m is "
                   f"{m[peak]:.6g} {'=' if at_peak else '≠'} (Ω/γ)^(2/3) = {upper:.6g} at C* = {c_star:.4g}; p is "
                   f"{'smallest' if p_smallest else 'not smallest'} there; the curve is "
                   f"{'symmetric' if symmetric else 'not symmetric'} under C ↔ S and "
                   f"{'within' if within else 'outside'} the bounds of S.45 [{lower:.4g}, {upper:.4g}].")
        return Analysis(figures={"fig3": _figure(curve, c_star, lower, upper)}, tables={"fig3": curve},
                        numbers=numbers, verdict=verdict, supported=supported)


def _figure(curve: list[dict], c_star: float, lower: float, upper: float):
    """m and p against C on log axes (Fig. 3), with C* and the bounds of S.45."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.2), layout="constrained")
    ax = fig.add_subplot()
    C = [r["C"] for r in curve]
    ax.plot(C, [r["m"] for r in curve], color="tab:red", label="effective width $m = SC$")
    ax.axhline(upper, color="tab:red", linestyle=":", linewidth=1, label="$(\\Omega/\\gamma)^{2/3}$ (Eq. 15)")
    ax.axhline(lower, color="grey", linestyle=":", linewidth=1, label="lower bound (S.45)")
    ax.axvline(c_star, color="grey", linestyle="--", linewidth=1, label=f"$C^* = S^*$ = {c_star:.4g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("channels C (S from Ω, Eq. 14)")
    ax.set_ylabel("effective width m", color="tab:red")
    right = ax.twinx()
    right.plot(C, [r["p"] for r in curve], color="tab:blue", label="density $p = \\Omega/(\\gamma m^2)$")
    right.set_yscale("log")
    right.set_ylabel("density p", color="tab:blue")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower center")
    ax.set_title(f"Fig. 3: m and p against C at $\\Omega = 10^{{{round(math.log10(OMEGA))}}}$, γ = {GAMMA:g}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    return fig
