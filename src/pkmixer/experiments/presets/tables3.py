"""Table S.3: memory, FLOPs and runtime of the SW-MLP, the RP-Mixer and the MLP-Mixer at the same Ω and width
(Hayase & Karakida App. D.9). No training runs: the costs are computed and the runtime is measured when the preset
runs.

Command::

    pkmixer reproduce tables3 --scale paper     # CIFAR and ImageNet costs; runtime of the CIFAR models
    pkmixer reproduce tables3 --scale small     # the same costs; runtime of S = C = 36 models (seconds)
    pkmixer reproduce tables3 --scale smoke     # a tiny setting, for the tests

The paper's claim: at the same connections per layer and width m = SC, a static-masked SW-MLP needs memory and
compute of order m² = S²C² while the (RP-)Mixer needs O(S² + C²): on ImageNet the RP-Mixer needs 10³ to 10⁶ times
less, and the RP-Mixer costs what the MLP-Mixer costs. Supported when, in the largest setting, the dense-masked
SW-MLP's training state is at least 10³ times the MLP-Mixer's and the RP-Mixer has exactly the MLP-Mixer's MACs.

What a run shows, per setting and model:

* ``tables3.csv``: our own accounting (:func:`pkmixer.analysis.cost.fixed_omega_comparison`: parameters, Ω per
  layer, MACs and forward FLOPs per image with stem and head, weight bytes, training state = weights, gradients
  and two AdamW moments of every parameter plus buffers, activations per image) and the ratios to the MLP-Mixer;
* ``tables3_paper.csv``: each printed memory and FLOPs value of Table S.3 beside the same quantity counted in the
  table's own convention (:func:`pkmixer.analysis.cost.table_s3_counts`: the hidden layers' weight matrices only,
  4 bytes per weight and 4 more per SW-MLP mask entry, FLOPs = 2 × their MACs) and beside ours, with the
  arithmetic that explains each difference;
* ``tables3_runtime.csv``: the runtime column, measured here - seconds per AdamW step, batch 128, float32 (App.
  D.9's setting), median of several repeats with the models taking turns, torch pinned to one CPU thread (or the
  GPU, when there is one) - as ratios RP-Mixer / MLP-Mixer and SW-MLP / MLP-Mixer beside the paper's (one V100,
  s/epoch). The device and the load average are in the table.

Settings. The caption states S = 64, C = 48, L = 3, γ = 2 for CIFAR, but the printed CIFAR numbers are those of
S = C = 64 (m = 4096, Ω = 2^19, the Fig. 2 model ``mixer_c64d3p4_32``): the SW-MLP's 805 M FLOPs and 3.22 GB need
m = 4096, and the Mixers' 12.5 M FLOPs need S = C = 64; we use S = C = 64 at 32 px, P = 4. ImageNet: S = 256,
C = 588, L = 8, γ = 4 at 224 px, P = 14 (Mixer-B-W's shape; Ω = 254 091 264). The SW-MLP has 2L blocks of S.17,
one per token- and per channel-mixing MLP of the Mixer (App. C.1), at the density p = Ω/(γm²) that gives it the
Mixer's Ω per layer. ``smoke``: S = 16, C = 8, L = 1, γ = 2 on 8 px single-channel images (P = 2).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ...analysis.cost import fixed_omega_comparison, fixed_omega_models, table_s3_counts
from ...analysis.throughput import training_step_seconds
from ...models.budget import available_memory
from ...theory.width import mixer_omega, tokens_for_channels
from ..preset import Analysis, Preset, register_preset
from ..sweep import RunSpec

# setting -> fixed_omega_comparison arguments
SETTINGS = {
    "CIFAR": dict(omega=int(mixer_omega(64, 64, 2.0)), gamma=2.0, depth=3, embed_dim=64, img_size=32, patch_size=4,
                  in_chans=3, num_classes=10, swmlp_depth=6),
    "ImageNet": dict(omega=254_091_264, gamma=4.0, depth=8, embed_dim=588, img_size=224, patch_size=14, in_chans=3,
                     num_classes=1000, swmlp_depth=16),
    "CIFAR-small": dict(omega=int(mixer_omega(36, 36, 2.0)), gamma=2.0, depth=3, embed_dim=36, img_size=24,
                        patch_size=4, in_chans=3, num_classes=10, swmlp_depth=6),
    "tiny": dict(omega=int(mixer_omega(8, 16, 2.0)), gamma=2.0, depth=1, embed_dim=8, img_size=8, patch_size=2,
                 in_chans=1, num_classes=10, swmlp_depth=2),
}
SCALE_SETTINGS = {"paper": ("CIFAR", "ImageNet"), "small": ("CIFAR", "ImageNet"), "smoke": ("tiny",)}
# the setting whose models are timed, and the timed repeats, per scale
RUNTIME = {"paper": ("CIFAR", 5), "small": ("CIFAR-small", 5), "smoke": ("tiny", 3)}
RUNTIME_BATCH = 128  # App. D.9: AdamW, mini-batch 128, float32
CIFAR_STEPS_PER_EPOCH = math.ceil(50_000 / RUNTIME_BATCH)

# Table S.3 as printed: memory (bytes), FLOPs, runtime on CIFAR (s/epoch, one V100; ± over 4 seeds)
PAPER = {
    ("CIFAR", "SW-MLP"): (3.22e9, 805e6, 28.2), ("CIFAR", "RP-Mixer"): (3.94e6, 12.5e6, 6.41),
    ("CIFAR", "MLP-Mixer"): (3.93e6, 12.5e6, 6.08),
    ("ImageNet", "SW-MLP"): (23.2e12, 5.80e12, None), ("ImageNet", "RP-Mixer"): (26.3e6, 4.06e9, None),
    ("ImageNet", "MLP-Mixer"): (26.3e6, 4.06e9, None),
}
PAPER_RUNTIME_RATIOS = {"RP-Mixer / MLP-Mixer": 6.41 / 6.08, "SW-MLP / MLP-Mixer": 28.2 / 6.08}
_FAMILY = {"MLP-Mixer": "MLP-Mixer", "RP-Mixer": "RP-Mixer", "SW-MLP[masked]": "SW-MLP"}


def family(model: str) -> str:
    """``MLP-Mixer``, ``RP-Mixer``, ``SW-MLP[masked]`` or ``SW-MLP[sparse]`` from a report's model name."""
    return model.split(" ")[0]


def setting_shape(setting: str) -> tuple[int, int, int, float, int]:
    """S, C, L, γ and the SW-MLP's blocks of a setting."""
    kw = SETTINGS[setting]
    return (tokens_for_channels(kw["omega"], kw["embed_dim"], kw["gamma"]), kw["embed_dim"], kw["depth"], kw["gamma"],
            kw["swmlp_depth"])


def cost_rows(setting: str) -> list[dict]:
    """The rows of one setting: each model's costs (our accounting) and its ratios to the MLP-Mixer's."""
    reports = fixed_omega_comparison(**SETTINGS[setting])
    base = reports[0]
    rows = []
    for r in reports:
        weights = r.param_bytes + r.buffer_bytes
        rows.append({"setting": setting, "model": r.model, "params": r.params, "omega": r.connections,
                     "width": r.effective_width, "macs": r.macs, "forward_flops": r.forward_flops,
                     "weight_bytes": weights, "train_state_bytes": r.train_state_bytes,
                     "activation_bytes_per_image": r.activation_bytes_per_image,
                     "flops_ratio": r.forward_flops / base.forward_flops,
                     "weight_ratio": weights / (base.param_bytes + base.buffer_bytes),
                     "train_state_ratio": r.train_state_bytes / base.train_state_bytes})
    return rows


def _printed(value: float, printed: float) -> bool:
    """``value`` as Table S.3 would print it - three significant digits, rounded or cut - is ``printed``."""
    if value <= 0:
        return False
    scale = 10 ** (math.floor(math.log10(value)) - 2)
    return any(math.isclose(f(value / scale) * scale, printed, rel_tol=1e-9) for f in (round, math.floor))


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _explain(quantity: str, printed: float, convention, gamma_one, ours: float, model: str) -> str:
    """Which counting gives the printed value, with its arithmetic."""
    unit = "B" if quantity == "memory" else ""
    value = convention.memory_bytes if quantity == "memory" else convention.flops
    sw = model == "SW-MLP"
    if quantity == "memory":
        how = (f"{convention.weights:,} hidden-layer weight entries × (4 B weight + 4 B mask)" if sw else
               f"{convention.weights:,} hidden-layer weights × 4 B")
    else:
        how = f"2 × {convention.flops // 2:,} MACs of the hidden layers per image"
    shape = f"S = {convention.S}, C = {convention.C}, L = {convention.depth}, γ = {convention.gamma:g}"
    what = ("training state (weights, gradients, 2 AdamW moments of every parameter, buffers)"
            if quantity == "memory" else "forward FLOPs (with stem and head)")
    ours_text = f"; our {what} is {_si(ours, unit)}"
    if _printed(value, printed):
        return f"reproduced: {how} = {_si(value, unit)} ({shape}){ours_text}"
    alt = gamma_one.memory_bytes if quantity == "memory" else gamma_one.flops
    if _printed(alt, printed):
        alt_how = (f"{gamma_one.weights:,} weights × 4 B" if quantity == "memory" else
                   f"2 × {gamma_one.flops // 2:,} MACs")
        return (f"reproduced only with γ = 1, not the caption's γ = {convention.gamma:g}: {alt_how} = "
                f"{_si(alt, unit)}; at γ = {convention.gamma:g} the same count is {_si(value, unit)}{ours_text}")
    if _printed(10 * value, printed):
        return (f"10 × the convention's {how} = {_si(value, unit)} ({shape}): a factor 10, most likely a misplaced "
                f"decimal point{ours_text}")
    near = (f" {_si(printed, unit)} is {printed / value:.3g} × that, near the factor 10 of the MLP-Mixer's printed "
            "memory" if 9.9 < printed / value < 10.1 else "")
    extra = (" The convention counts no permutations (at ImageNet the paper prints the same 26.3 MB for both "
             "Mixers), and no counting we tried gives the RP-Mixer's 0.01 MB more than the MLP-Mixer's on CIFAR."
             if model == "RP-Mixer" else "")
    return f"not reproduced: the convention gives {_si(value, unit)} ({shape});{near}{ours_text}.{extra}"


def paper_rows(setting: str, ours: list[dict]) -> list[dict]:
    """Each printed memory and FLOPs value of ``setting`` beside Table S.3's convention and our accounting."""
    S, C, L, gamma, blocks = setting_shape(setting)
    convention = {c.model: c for c in table_s3_counts(S, C, L, gamma, swmlp_depth=blocks)}
    gamma_one = {c.model: c for c in table_s3_counts(S, C, L, 1.0, swmlp_depth=blocks)}
    by_family = {_FAMILY[family(r["model"])]: r for r in ours if family(r["model"]) in _FAMILY}
    rows = []
    for model in ("SW-MLP", "RP-Mixer", "MLP-Mixer"):
        memory, flops, _ = PAPER[(setting, model)]
        conv, mine = convention[model], by_family[model]
        for quantity, printed, value, our in (("memory", memory, conv.memory_bytes, mine["train_state_bytes"]),
                                              ("FLOPs", flops, conv.flops, mine["forward_flops"])):
            rows.append({"setting": setting, "model": model, "quantity": quantity, "paper": printed,
                         "paper_convention": value, "ours": our,
                         "explanation": _explain(quantity, printed, conv, gamma_one[model], our, model)})
    return rows


def runtime_rows(scale: str) -> list[dict]:
    """The runtime column measured now: seconds per AdamW step (batch 128, float32) of each model of the scale's
    runtime setting on the GPU when there is one, else on one CPU thread; medians of the repeats, with the models
    taking turns. A model whose estimated training memory exceeds half of what is free is not timed."""
    setting, repeats = RUNTIME[scale]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    free = available_memory(device)  # free GPU memory, or MemAvailable
    reports = {r.model: r for r in fixed_omega_comparison(**SETTINGS[setting], batch_size=RUNTIME_BATCH)}
    skipped = {}
    for name, r in reports.items():
        # weights, gradients, AdamW moments, buffers, a dense-masked layer's M ⊙ W products, activations
        masked = family(name) == "SW-MLP[masked]"
        activations = (r.activation_bytes_per_image if r.activation_bytes_per_image is not None
                       else 4 * 8 * r.effective_width * (1 + SETTINGS[setting]["gamma"]) * r.mixing_layers // 2)
        need = r.train_state_bytes + (r.param_bytes if masked else 0) + RUNTIME_BATCH * activations
        if need > free / 2:
            skipped[name] = need
    forms = [f for f in ("masked", "sparse") if not any(family(n) == f"SW-MLP[{f}]" for n in skipped)]
    models = fixed_omega_models(**SETTINGS[setting], device=device, forms=forms)
    models = {k: v for k, v in models.items() if k not in skipped}
    timing = training_step_seconds(models, batch_size=RUNTIME_BATCH, repeats=repeats, threads=1)
    base = timing["median"][next(iter(models))]
    S, C, L, gamma, _ = setting_shape(setting)
    rows = []
    for name in reports:
        fam = family(name)
        paper = PAPER.get(("CIFAR", _FAMILY.get(fam, "")), (None, None, None))[2] if scale != "smoke" else None
        row = {"setting": setting, "shape": f"S={S} C={C} L={L} γ={gamma:g}", "model": name,
               "device": timing["device"], "batch_size": RUNTIME_BATCH, "repeats": repeats}
        if name in skipped:
            row.update(step_s=None, step_ratio=None, epoch_s_estimate=None, times_s=None,
                       note=f"not timed: needs about {_si(skipped[name], 'B')}, {_si(free, 'B')} free here")
        else:
            median = timing["median"][name]
            row.update(step_s=median, step_ratio=median / base, epoch_s_estimate=median * CIFAR_STEPS_PER_EPOCH,
                       times_s=" ".join(f"{t:.4g}" for t in timing["times"][name]), note="")
        row.update(paper_epoch_s=paper, paper_ratio=None if paper is None else paper / 6.08,
                   load_before=timing["load_before"], load_after=timing["load_after"])
        rows.append(row)
    return rows


@register_preset
class TableS3(Preset):
    name = "tables3"
    title = "Memory, FLOPs and runtime of SW-MLP, RP-Mixer and MLP-Mixer at the same Ω and width"
    claim = ("At the same Ω and width, the static-masked SW-MLP needs memory and compute of order (SC)², the "
             "RP-Mixer those of the MLP-Mixer: on ImageNet 10³ to 10⁶ times less than the SW-MLP.")
    source = "Hayase & Karakida Table S.3, App. D.9"
    datasets = ()

    def build(self, scale: str, dataset: str | None) -> list[RunSpec]:
        return []

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        settings = SCALE_SETTINGS[self.check_scale(scale)]
        table = [row for setting in settings for row in cost_rows(setting)]
        tables = {"tables3": table}
        if scale != "smoke":
            tables["tables3_paper"] = [row for setting in settings
                                       for row in paper_rows(setting, [r for r in table if r["setting"] == setting])]
        runtime = runtime_rows(scale)
        tables["tables3_runtime"] = runtime
        numbers, findings = {}, []
        for setting in settings:
            group = [r for r in table if r["setting"] == setting]
            _, rp, _, masked = group
            numbers[f"{setting}: dense-masked SW-MLP / MLP-Mixer training state"] = \
                round(masked["train_state_ratio"], 1)
            numbers[f"{setting}: dense-masked SW-MLP / MLP-Mixer forward FLOPs"] = round(masked["flops_ratio"], 1)
            numbers[f"{setting}: RP-Mixer / MLP-Mixer forward FLOPs"] = rp["flops_ratio"]
            findings.append(f"{setting}: the dense-masked SW-MLP needs {masked['train_state_ratio']:.3g} times the "
                            f"MLP-Mixer's training state and {masked['flops_ratio']:.3g} times its FLOPs; the "
                            f"RP-Mixer {rp['flops_ratio']:.3g} times its FLOPs")
        if "tables3_paper" in tables:
            paper = tables["tables3_paper"]
            exact = sum(r["explanation"].startswith("reproduced:") for r in paper)
            gamma_one = sum(r["explanation"].startswith("reproduced only with γ = 1") for r in paper)
            numbers[f"Table S.3 values reproduced by its own convention (of {len(paper)})"] = exact
            numbers["Table S.3 values reproduced only with γ = 1"] = gamma_one
            findings.append(f"{exact} of Table S.3's {len(paper)} memory and FLOPs values are reproduced exactly by "
                            f"its own convention (hidden-layer weights only), {gamma_one} more only with γ = 1 "
                            "(tables3_paper.csv explains each)")
        timed = {family(r["model"]): r for r in runtime if r["step_s"] is not None}
        device = runtime[0]["device"]
        runtime_text = []
        for label, num in (("RP-Mixer / MLP-Mixer", "RP-Mixer"), ("SW-MLP / MLP-Mixer", "SW-MLP[masked]")):
            ratio = timed[num]["step_ratio"] if num in timed and "MLP-Mixer" in timed else None
            numbers[f"runtime {label} (measured: {device}, batch {RUNTIME_BATCH}, fp32 AdamW)"] = \
                None if ratio is None else round(ratio, 3)
            numbers[f"runtime {label} (paper: V100)"] = round(PAPER_RUNTIME_RATIOS[label], 3)
            runtime_text.append(f"{label} {'not timed' if ratio is None else f'{ratio:.3g}'} "
                                f"(paper {PAPER_RUNTIME_RATIOS[label]:.3g})")
        findings.append(f"runtime per AdamW step on {device} ({runtime[0]['shape']}): " + ", ".join(runtime_text))
        largest = [r for r in table if r["setting"] == settings[-1]]
        mixer, rp, _, masked = largest
        supported = None if scale == "smoke" else masked["train_state_ratio"] >= 1e3 and rp["macs"] == mixer["macs"]
        verdict = "; ".join(findings) + "."
        return Analysis(figures={"tables3": _figure(table, runtime)}, tables=tables, numbers=numbers,
                        verdict=verdict, supported=supported)


def _figure(table: list[dict], runtime: list[dict]) -> Figure:
    """Training state and forward FLOPs per image of each model, log scale, one group per setting; the measured
    step-time ratios to the MLP-Mixer beside the paper's."""
    settings = list(dict.fromkeys(r["setting"] for r in table))
    fig = Figure(figsize=(13.0, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, key, label in zip(axes[:2], ("train_state_bytes", "forward_flops"),
                              ("training state (bytes)", "forward FLOPs per image")):
        for j, setting in enumerate(settings):
            group = [r for r in table if r["setting"] == setting]
            x = [j * (len(group) + 1) + i for i in range(len(group))]
            ax.bar(x, [r[key] for r in group], color=["tab:red", "tab:orange", "tab:cyan", "tab:blue"][:len(group)])
            for xi, r in zip(x, group):
                ax.text(xi, r[key], r["model"].split(" ")[0], rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks([j * 5 + 1.5 for j in range(len(settings))], settings)
        ax.set_ylabel(label)
    ax = axes[2]
    timed = [r for r in runtime if r["step_ratio"] is not None]
    x = range(len(timed))
    ax.bar([i - 0.2 for i in x], [r["step_ratio"] for r in timed], width=0.4, color="tab:green", label="measured")
    paper = [(i, r["paper_ratio"]) for i, r in zip(x, timed) if r["paper_ratio"] is not None]
    ax.bar([i + 0.2 for i, _ in paper], [v for _, v in paper], width=0.4, color="tab:gray", label="paper (V100)")
    ax.set_yscale("log")
    ax.set_xticks(list(x), [family(r["model"]) for r in timed], fontsize=7, rotation=15)
    ax.set_ylabel("step time / MLP-Mixer's")
    ax.set_title(f"{runtime[0]['shape']}, {runtime[0]['device']}", fontsize=7)
    ax.legend(fontsize=7)
    fig.suptitle("Table S.3: costs at the same Ω and width", fontsize=10)
    return fig
