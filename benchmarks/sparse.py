"""Section (c): the SW-MLP with sparse (CSR) weights against dense-masked ones (Hayase & Karakida App. A.2.5, D.9).

Grid: widths m and densities p ∈ {1/4, 1/16, 1/64, 1/256}; an SW-MLP of ``depth`` single-layer blocks (S.16)
at 32 px with 4 px patches and C = m/64 channels, so that the stem's output is already m wide (no input layer)
and every mixing layer is m×m with Ω = p·m² kept weights. For each (m, p) both forms are built with the same
masks and timed in one interleaved loop (training step, AdamW), and each form's peak memory is measured in
its own subprocess. Dense-masked cases whose estimated memory exceeds the mode's budget are skipped.

Largest Ω: bytes per kept weight (sparse) and per m² entry (dense-masked) are the slopes between the two
largest measured cases of each form (so that fixed costs - the stem, the head, the allocator's arenas -
cancel); the limits for the whole machine follow from them, and a real sparse run at the largest size that
fits the mode's budget checks that it trains.

Table S.3 (CIFAR): MLP-Mixer, RP-Mixer and the SW-MLP at the same Ω (S = 64, C = 48, L = 3, γ = 2,
m = 3072, p = Ω/(γm²)): peak memory of each and step times, against the paper's 3.22 GB for the dense SW-MLP
and 3.94 MB for the RP-Mixer.
"""
from __future__ import annotations

import math

import torch

from pkmixer.models.mixer import Mixer
from pkmixer.models.swmlp import SWMLP

from .common import Settings, image_batch, interleaved, peak_memory, ratio, train_step

DENSITIES = (1 / 4, 1 / 16, 1 / 64, 1 / 256)
GRID = {  # widths, depth, batch, dense-masked memory budget, real large sparse run budget (bytes)
    "smoke": dict(widths=(256,), depth=1, batch=4, masked_budget=64 << 20, large_budget=16 << 20),
    "quick": dict(widths=(1024, 4096), depth=2, batch=64, masked_budget=2 << 30, large_budget=1 << 30),
    "full": dict(widths=(1024, 4096, 8192, 16384), depth=2, batch=64, masked_budget=8 << 30, large_budget=6 << 30),
}
MASKED_BYTES_PER_ENTRY_GUESS = 30  # weight, grad, 2 AdamW moments, mask, M ⊙ W and its grad: for skipping only
MACHINE_BYTES = 24 << 30  # the memory the largest-Ω limits are computed for


def swmlp_options(m: int, p: float, depth: int, weight_format: str) -> dict:
    if m % 64:
        raise ValueError(f"width {m} is not a multiple of 64")
    return dict(img_size=32, patch_size=4, embed_dim=m // 64, density=p, depth=depth, block="fc",
                weight_format=weight_format)


def _probe(options: dict, batch: int, settings: Settings, model: str = "swmlp", steps: int = 2) -> dict:
    return peak_memory({"model": model, "options": options, "batch": batch, "steps": steps}, settings)


def section_c(settings: Settings) -> dict:
    cfg = GRID[settings.mode]
    depth, batch = cfg["depth"], cfg["batch"]
    rows = []
    for m in cfg["widths"]:
        for p in DENSITIES:
            row = {"width": m, "density": p, "depth": depth, "batch": batch, "omega": p * m * m}
            fits = MASKED_BYTES_PER_ENTRY_GUESS * depth * m * m <= cfg["masked_budget"]
            forms = ("sparse", "masked") if fits else ("sparse",)
            models = {}
            for form in forms:
                torch.manual_seed(0)
                models[form] = SWMLP(**swmlp_options(m, p, depth, form)).to(settings.torch_device)
            data = image_batch(models["sparse"], batch, settings)
            t = interleaved({form: train_step(model, data, settings) for form, model in models.items()}, settings)
            row["kept_weights"] = sum(lin.nnz for lin in models["sparse"].sparse_layers())
            del models
            row["times"] = {k: v.as_dict() for k, v in t.items()}
            row["memory"] = {form: _probe(swmlp_options(m, p, depth, form), batch, settings) for form in forms}
            if fits:
                row["speedup"] = ratio(t["masked"].median_s, t["sparse"].median_s)
                row["memory_ratio"] = ratio(row["memory"]["masked"].get("peak_bytes", math.nan),
                                            row["memory"]["sparse"].get("peak_bytes", math.nan))
            rows.append(row)
    return {"rows": rows, "largest_omega": _largest_omega(rows, settings, cfg),
            "table_s3": _table_s3(settings)}


def _slope(points: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """Bytes per unit between the two largest (units, bytes) measurements: fixed costs cancel. With one
    measurement (smoke mode), its plain ratio."""
    if len(points) == 1:
        (u, b), = points
        return b / u, [u]
    (u1, b1), (u2, b2) = sorted(points)[-2:]
    return (b2 - b1) / (u2 - u1), [u1, u2]


def _largest_omega(rows: list[dict], settings: Settings, cfg: dict) -> dict:
    """Per-weight memory from the largest measured cases, the machine's limits, and one real large run."""
    sparse = [(r["kept_weights"], r["memory"]["sparse"]["peak_bytes"]) for r in rows if r["memory"]["sparse"].get("ok")]
    masked = [(r["depth"] * r["width"] ** 2, r["memory"]["masked"]["peak_bytes"]) for r in rows
              if r["memory"].get("masked", {}).get("ok") and r["density"] == DENSITIES[0]]
    per_kept, kept_at = _slope(sparse)
    per_entry, entries_at = _slope(masked)
    depth, p = cfg["depth"], DENSITIES[-1]
    m_dense = math.isqrt(int(MACHINE_BYTES / (per_entry * depth)))
    omega_sparse = MACHINE_BYTES / (per_kept * depth)
    # the real run: the sparsest density, the widest multiple of 64 whose kept weights fit the budget
    omega_run = cfg["large_budget"] / (per_kept * depth)
    m_run = max(64, int(math.sqrt(omega_run / p)) // 64 * 64)
    run = _probe(swmlp_options(m_run, p, depth, "sparse"), 16, settings)
    return {
        "density": p, "depth": depth, "machine_bytes": MACHINE_BYTES,
        "sparse_bytes_per_kept_weight": per_kept, "sparse_slope_between_kept": kept_at,
        "masked_bytes_per_entry": per_entry, "masked_slope_between_entries": entries_at,
        "masked_max_width": m_dense, "masked_max_omega": p * m_dense ** 2,
        "sparse_max_omega": omega_sparse, "sparse_max_width_at_p": math.sqrt(omega_sparse / p),
        "omega_ratio": omega_sparse / (p * m_dense ** 2),
        "real_run": {"width": m_run, "omega": p * m_run ** 2, "batch": 16, "budget_bytes": cfg["large_budget"],
                     **run},
    }


def _table_s3(settings: Settings) -> dict:
    """Table S.3's CIFAR setting: MLP-Mixer, RP-Mixer, SW-MLP sparse and dense-masked at the same Ω."""
    S, C, depth, gamma, batch = 64, 48, 3, 2.0, 128
    omega = gamma * (C * S * S + C * C * S) / 2
    m = S * C
    p = omega / (gamma * m * m)
    mixer = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=C, depth=depth, mlp_ratio=gamma, norm_eps=1e-5)
    sw = dict(img_size=32, patch_size=4, embed_dim=C, depth=depth, block="mlp", mlp_ratio=gamma, density=p)
    specs = {"mixer": ("mixer", mixer), "rp_mixer": ("mixer", {**mixer, "rp_blocks": "all"}),
             "swmlp_sparse": ("swmlp", {**sw, "weight_format": "sparse"}),
             "swmlp_masked": ("swmlp", {**sw, "weight_format": "masked"})}
    memory = {k: _probe(opts, batch, settings, model) for k, (model, opts) in specs.items()}
    models = {}
    for k, (model, opts) in specs.items():
        torch.manual_seed(0)
        models[k] = (Mixer if model == "mixer" else SWMLP)(**opts).to(settings.torch_device)
    data = image_batch(models["mixer"], batch, settings)
    t = interleaved({k: train_step(mod, data, settings) for k, mod in models.items()}, settings)
    rp_params = memory["rp_mixer"]["param_bytes"]
    return {
        "S": S, "C": C, "depth": depth, "gamma": gamma, "omega": omega, "width": m, "density": p, "batch": batch,
        "memory": memory, "times": {k: v.as_dict() for k, v in t.items()},
        "sparse_peak_over_rp_param_bytes": memory["swmlp_sparse"]["peak_bytes"] / rp_params,
        "masked_peak_over_rp_param_bytes": memory["swmlp_masked"]["peak_bytes"] / rp_params,
        "sparse_param_bytes_over_rp_param_bytes": memory["swmlp_sparse"]["param_bytes"] / rp_params,
        "sparse_peak_over_rp_peak": memory["swmlp_sparse"]["peak_bytes"] / memory["rp_mixer"]["peak_bytes"],
        "masked_peak_over_rp_peak": memory["swmlp_masked"]["peak_bytes"] / memory["rp_mixer"]["peak_bytes"],
        "paper": {"swmlp_bytes": 3.22e9, "rp_mixer_bytes": 3.94e6, "mixer_bytes": 3.93e6,
                  "swmlp_s_per_epoch": 28.2, "rp_mixer_s_per_epoch": 6.41, "mixer_s_per_epoch": 6.08},
    }
