"""Table S.3: memory and FLOPs of the SW-MLP, the RP-Mixer and the MLP-Mixer at the same Ω and width (Hayase &
Karakida App. D.9). Analysis only: no training.

Command::

    pkmixer reproduce tables3 --scale paper     # CIFAR and ImageNet settings (seconds; small is the same)
    pkmixer reproduce tables3 --scale smoke     # a tiny setting, for the tests

The paper's claim: at the same connections per layer and width m = SC, a static-masked SW-MLP needs memory and
compute of order m² = S²C² while the (RP-)Mixer needs O(S² + C²): on ImageNet the RP-Mixer needs 10³ to 10⁶ times
less, and the RP-Mixer costs what the MLP-Mixer costs. What a run shows: for each setting, the parameters, Ω per
layer, MACs and forward FLOPs per image, weight and training-state memory and activations per image of the four
models of :func:`pkmixer.analysis.cost.fixed_omega_comparison` (conventions in that module), and each model's
ratios to the MLP-Mixer. Supported when, in the largest setting, the dense-masked SW-MLP's training state is at
least 10³ times the MLP-Mixer's and the RP-Mixer has exactly the MLP-Mixer's MACs. The runtime column of Table S.3
(s/epoch on a V100) is not reproduced.

Settings: the paper does not state the models of Table S.3; :mod:`pkmixer.analysis.cost` takes S = 64, C = 48,
L = 3, γ = 2 at 32 px, P = 4 (Ω = 344 064; the Fig. 2/4 family) for CIFAR and Mixer-B-W's S = 256, C = 588,
L = 8 at γ = 4 (Ω = 254 091 264), 224 px, P = 14 for ImageNet. ``small`` is ``paper`` (about 5 s);
``smoke`` is S = 16, C = 8, L = 1, γ = 2 on 8 px single-channel images (P = 2).
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ...analysis.cost import fixed_omega_comparison
from ...theory.width import mixer_omega
from ..preset import Analysis, Preset, register_preset
from ..sweep import RunSpec

# setting -> fixed_omega_comparison arguments
SETTINGS = {
    "CIFAR": dict(omega=344_064, gamma=2.0, depth=3, embed_dim=48, img_size=32, patch_size=4, in_chans=3,
                  num_classes=10),
    "ImageNet": dict(omega=254_091_264, gamma=4.0, depth=8, embed_dim=588, img_size=224, patch_size=14, in_chans=3,
                     num_classes=1000),
    "tiny": dict(omega=int(mixer_omega(8, 16, 2.0)), gamma=2.0, depth=1, embed_dim=8, img_size=8, patch_size=2,
                 in_chans=1, num_classes=10),
}
SCALE_SETTINGS = {"paper": ("CIFAR", "ImageNet"), "small": ("CIFAR", "ImageNet"), "smoke": ("tiny",)}


def cost_rows(setting: str) -> list[dict]:
    """The rows of one setting: each model's costs and its ratios to the MLP-Mixer's."""
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


@register_preset
class TableS3(Preset):
    name = "tables3"
    title = "Memory and FLOPs of SW-MLP, RP-Mixer and MLP-Mixer at the same Ω and width"
    claim = ("At the same Ω and width, the static-masked SW-MLP needs memory and compute of order (SC)², the "
             "RP-Mixer those of the MLP-Mixer: on ImageNet 10³ to 10⁶ times less than the SW-MLP.")
    source = "Hayase & Karakida Table S.3, App. D.9"
    datasets = ()

    def runs(self, scale: str, dataset: str | None) -> list[RunSpec]:
        self.check_dataset(scale, dataset)
        return []

    def analyze(self, rows: list[dict], sweep_dir: Path, scale: str) -> Analysis:
        table = [row for setting in SCALE_SETTINGS[self.check_scale(scale)] for row in cost_rows(setting)]
        numbers, findings = {}, []
        for setting in SCALE_SETTINGS[scale]:
            group = [r for r in table if r["setting"] == setting]
            _, rp, _, masked = group
            numbers[f"{setting}: dense-masked SW-MLP / MLP-Mixer training state"] = \
                round(masked["train_state_ratio"], 1)
            numbers[f"{setting}: dense-masked SW-MLP / MLP-Mixer forward FLOPs"] = round(masked["flops_ratio"], 1)
            numbers[f"{setting}: RP-Mixer / MLP-Mixer forward FLOPs"] = rp["flops_ratio"]
            findings.append(f"{setting}: the dense-masked SW-MLP needs {masked['train_state_ratio']:.3g} times the "
                            f"MLP-Mixer's training state and {masked['flops_ratio']:.3g} times its FLOPs; the "
                            f"RP-Mixer {rp['flops_ratio']:.3g} times its FLOPs")
        largest = [r for r in table if r["setting"] == SCALE_SETTINGS[scale][-1]]
        mixer, rp, _, masked = largest
        supported = None if scale == "smoke" else masked["train_state_ratio"] >= 1e3 and rp["macs"] == mixer["macs"]
        verdict = "; ".join(findings) + "."
        return Analysis(figures={"tables3": _figure(table)}, tables={"tables3": table}, numbers=numbers,
                        verdict=verdict, supported=supported)


def _figure(table: list[dict]) -> Figure:
    """Training state and forward FLOPs per image of each model, log scale, one group per setting."""
    settings = list(dict.fromkeys(r["setting"] for r in table))
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    for ax, key, label in zip(fig.subplots(1, 2), ("train_state_bytes", "forward_flops"),
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
    fig.suptitle("Table S.3: costs at the same Ω and width", fontsize=10)
    return fig
