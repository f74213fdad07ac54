"""Fig. S.9: the non-zero pattern of an SW-MLP weight, a Mixer's I_C ⊗ W and an RP Mixer's J₂(I_C ⊗ W)J₁
(Hayase & Karakida App. D.8, Fig. 1, Sec. 5.2). Analysis only: no training.

Command::

    pkmixer reproduce figs9 --scale paper     # S = C = 8 as in the figure; small is the same, smoke S = C = 4

The paper's claim: random permutations destroy the block-diagonal structure of the Mixer's effective weight,
so that the RP Mixer's weight looks like the unstructured random sparse weight M ⊙ A of an SW-MLP of the same
density p = 1/C, while it keeps the Mixer's non-zeros per row (and hence its singular values, Eq. 19). What a
run shows: the three patterns of one draw (m = SC, p = 1/C), and over several draws the fraction of non-zeros
inside the C diagonal S×S blocks (1 for the Mixer, 1/C expected for a uniformly scattered weight) and the
non-zeros per row. Supported when the Mixer's block fraction is 1, the RP weight's is closer to the SW-MLP's
than to the Mixer's, and the RP weight has exactly S non-zeros in every row, like the Mixer's.

Scales: ``paper`` and ``small`` - S = C = 8 (Fig. S.9's caption), 10 draws; ``smoke`` - S = C = 4, 3 draws.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...analysis.visualize import sparsity_masks
from ..preset import Analysis, Preset, register_preset
from ..stats import mean_std
from ..sweep import RunSpec

SIZES = {"paper": (8, 10), "small": (8, 10), "smoke": (4, 3)}  # S = C, draws
KINDS = ("SW-MLP", "Mixer", "RP-Mixer")


def block_fraction(pattern: np.ndarray, block: int) -> float:
    """Fraction of the non-zeros of ``pattern`` that lie inside its diagonal ``block``×``block`` blocks."""
    rows, cols = np.nonzero(pattern)
    return float(np.mean(rows // block == cols // block)) if rows.size else 0.0


@register_preset
class FigS9(Preset):
    name = "figs9"
    title = "Non-zero patterns of SW-MLP, Mixer and RP-Mixer weights"
    claim = ("Random permutations break the block-diagonal structure of the Mixer's effective weight I_C ⊗ W: "
             "J₂(I_C ⊗ W)J₁ looks like the random sparse weight M ⊙ A of an SW-MLP with p = 1/C.")
    source = "Hayase & Karakida Fig. S.9, App. D.8"
    datasets = ()

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        return []

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        size, draws = SIZES[self.check_scale(scale)]
        samples = [dict(zip(KINDS, sparsity_masks(size, size, seed).values())) for seed in range(draws)]
        table = []
        for kind in KINDS:
            fractions = mean_std(block_fraction(s[kind], size) for s in samples)
            per_row = np.concatenate([s[kind].sum(1) for s in samples])
            density = float(np.mean([s[kind].mean() for s in samples]))
            table.append({"weight": kind, "m": size * size, "density": density,
                          "block_fraction_mean": fractions["mean"], "block_fraction_std": fractions["std"],
                          "nonzeros_per_row_min": int(per_row.min()), "nonzeros_per_row_max": int(per_row.max()),
                          "draws": draws})
        by = {t["weight"]: t for t in table}
        rp, mixer, sw = (by[k]["block_fraction_mean"] for k in ("RP-Mixer", "Mixer", "SW-MLP"))
        rows_kept = by["RP-Mixer"]["nonzeros_per_row_min"] == by["RP-Mixer"]["nonzeros_per_row_max"] == size
        supported = mixer == 1.0 and abs(rp - sw) < abs(rp - mixer) and rows_kept
        numbers = {f"{t['weight']}: non-zeros in the diagonal blocks": {"mean": t["block_fraction_mean"],
                                                                        "std": t["block_fraction_std"], "n": draws}
                   for t in table}
        numbers["uniform scatter: 1/C"] = 1 / size
        verdict = (f"At S = C = {size} ({draws} draws) the fraction of non-zeros inside the diagonal blocks is "
                   f"{mixer:.3f} for the Mixer, {rp:.3f} for the RP-Mixer and {sw:.3f} for the SW-MLP (1/C = "
                   f"{1 / size:.3f}); the RP weight has {'exactly' if rows_kept else 'not always'} S = {size} "
                   f"non-zeros per row, like the Mixer's.")
        first = samples[0]
        figure = _figure({f"{k}": first[k] for k in KINDS}, size)
        return Analysis(figures={"figs9": figure}, tables={"figs9": table}, numbers=numbers, verdict=verdict,
                        supported=supported)


def _figure(patterns: dict[str, np.ndarray], size: int):
    """The three patterns side by side (analysis.visualize's drawing, returned as a Figure)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.4 * len(patterns), 4.0), layout="constrained")
    for ax, (name, pattern) in zip(fig.subplots(1, len(patterns)), patterns.items()):
        ax.imshow(pattern, cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{name}\n{pattern.shape[0]}×{pattern.shape[1]}, nnz {int(pattern.sum())}, "
                     f"block fraction {block_fraction(pattern, size):.2f}", fontsize=9)
    fig.suptitle(f"Fig. S.9: non-zero entries at S = C = {size}, m = {size * size}, p = 1/{size}", fontsize=10)
    return fig
