"""Section h: the paper-scale Fig. 5 sweep on one GPU, projected from measured training steps.

For each distinct model of ``pkmixer reproduce fig5 --scale paper --dataset cifar10`` (111 runs, 200 epochs of
50 000 images), in each precision of the engine (fp32; fp32 with TF32 products; bf16 autocast):

* training images/s: fused AdamW steps at the run's batch size on device-resident random 32 px images, median
  over ``repeats`` timed rounds of ``STEPS`` steps; evaluation images/s the same way without gradients;
* the fraction of the device's matmul throughput that a step reaches: 6 × the forward multiply-adds per image
  (:func:`pkmixer.analysis.cost.measured_macs`; forward + backward ≈ 3 forwards) × images/s, over an 8192³
  matrix product in the same precision, timed in the same run;
* the projection: Σ over the sweep's runs of epochs × (50 000 / training images/s + 10 000 / evaluation
  images/s), per precision and per Ω.

What it leaves out: the data pipeline (augmentation on the device: crop, flip, RandAugment, mixup) and the
checkpoint writes, both measured by section g; so the projection is a floor. Targets: the Ω ≤ 2^21
runs in ≤ 30 GPU-minutes in all; the Ω = 2^27 runs at ≥ 60 % of the matmul throughput. A GPU only; on the CPU
the section runs its smoke form (two models, one precision) so that the code is exercised by the tests.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from pkmixer.analysis.cost import measured_macs
from pkmixer.experiments import get_preset
from pkmixer.train.build import build_model
from pkmixer.train.engine import compiled

from .common import Settings

STEPS = 10
TRAIN_IMAGES, TEST_IMAGES = 50_000, 10_000
PRECISIONS = ("fp32", "tf32", "bf16")


def _set_precision(precision: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"


def _autocast(precision: str, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _timed(fn, settings: Settings) -> float:
    """Median seconds of one call of ``fn`` over ``repeats`` rounds, after warm-up (synchronised on CUDA)."""
    for _ in range(max(1, settings.warmup)):
        fn()
    settings.sync()
    times = []
    for _ in range(settings.repeats):
        t = time.perf_counter()
        fn()
        settings.sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_tflops(precision: str, settings: Settings, n: int) -> float:
    """An n³ matrix product's throughput in ``precision`` (TFLOP/s)."""
    _set_precision(precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=settings.torch_device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / _timed(lambda: a @ b, settings) / 1e12


def _shapes(settings: Settings) -> list[dict]:
    """The sweep's distinct models: one spec each, with the count of runs and epochs that share it."""
    specs = get_preset("fig5").runs("paper", "cifar10")
    groups: dict[tuple, dict] = {}
    for spec in specs:
        cfg = spec.config
        shape = {k: v for k, v in cfg.model.options.items() if k != "structure_seed"}  # seeds cost the same
        key = (cfg.model.name, tuple(sorted(shape.items())), cfg.data.batch_size)
        group = groups.setdefault(key, {"spec": spec, "runs": 0, "epochs": 0})
        group["runs"] += 1
        group["epochs"] += cfg.schedule.epochs
    shapes = list(groups.values())
    if settings.device == "cpu":  # smoke form: the smallest S-Mixer and SW-MLP, tiny batches
        shapes = [min((g for g in shapes if g["spec"].meta["model"] == family),
                      key=lambda g: g["spec"].meta["omega"]) for family in ("S-Mixer", "SW-MLP")]
    return shapes


def _throughput(spec, precision: str, settings: Settings, compile_mode: str | None = None) -> dict:
    """Training and evaluation images/s of ``spec``'s model in ``precision``, and its forward MACs per image;
    with ``compile_mode``, of the model as ``run.compile`` builds it (:func:`pkmixer.train.engine.compiled`)."""
    device = settings.torch_device
    _set_precision(precision)
    torch.manual_seed(0)
    model = build_model(spec.config.model, num_classes=10).to(device)
    macs = measured_macs(model, batch_size=2)
    net = model if compile_mode is None else compiled(model, compile_mode)
    batch = spec.config.data.batch_size if device.type == "cuda" else 8
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
    steps = STEPS if device.type == "cuda" else 1

    def train() -> None:
        for _ in range(steps):
            with _autocast(precision, device):
                loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    def evaluate() -> None:
        with torch.no_grad(), _autocast(precision, device):
            for _ in range(steps):
                net(x)

    model.train()
    train_s = _timed(train, settings) / (steps * batch)
    model.eval()
    eval_s = _timed(evaluate, settings) / (steps * batch)
    return {"train_images_per_s": 1 / train_s, "eval_images_per_s": 1 / eval_s, "macs_per_image": macs}


def _compiled_cases(groups: list[dict]) -> list[tuple[dict, str]]:
    """The Ω = 2^27 models in torch.compile's default mode, and the first Ω = 2^18 S-Mixer and RP S-Mixer with
    CUDA graphs (reduce-overhead)."""
    cases = [(g, "default") for g in groups if g["spec"].meta["omega"] == 2**27]
    for family in ("S-Mixer", "RP S-Mixer"):
        cases += [next((g, "reduce-overhead") for g in groups
                       if g["spec"].meta["omega"] == 2**18 and g["spec"].meta["model"] == family)]
    return cases


def _row(group: dict, precision: str, peaks: dict, settings: Settings, compile_mode: str | None) -> dict:
    spec, meta = group["spec"], group["spec"].meta
    t = _throughput(spec, precision, settings, compile_mode)
    tflops = 6 * t["macs_per_image"] * t["train_images_per_s"] / 1e12
    hours = group["epochs"] * (TRAIN_IMAGES / t["train_images_per_s"] + TEST_IMAGES / t["eval_images_per_s"]) / 3600
    return {"model": meta["model"], "omega": meta["omega"], "name": spec.config.model.name,
            "options": {k: v for k, v in spec.config.model.options.items() if k != "num_classes"},
            "runs": group["runs"], "precision": precision, "compile_mode": compile_mode, **t, "train_tflops": tflops,
            "fraction_of_matmul": tflops / peaks[precision], "projected_gpu_hours": hours}


def section_h(settings: Settings) -> dict:
    """Per-model step throughput per precision, its fraction of matmul throughput, and the sweep's projection;
    with compilation allowed (no ``--no-compile``) on a GPU, also compiled: the Ω = 2^27 models in torch.compile's
    default mode (fusion of the memory-bound operations) and the first Ω = 2^18 model of each family with CUDA
    graphs (reduce-overhead), in fp32 and TF32."""
    n = 8192 if settings.device == "cuda" else 256
    precisions = PRECISIONS if settings.device == "cuda" else ("fp32",)
    peaks = {p: matmul_tflops(p, settings, n) for p in precisions}
    rows, totals = [], defaultdict(float)
    groups = _shapes(settings)
    for group in groups:
        for precision in precisions:
            rows.append(_row(group, precision, peaks, settings, None))
            totals[(precision, group["spec"].meta["omega"])] += rows[-1]["projected_gpu_hours"]
    if settings.compile and settings.device == "cuda":
        for group, mode in _compiled_cases(groups):
            for precision in ("fp32", "tf32"):
                rows.append(_row(group, precision, peaks, settings, mode))
    _set_precision("fp32")
    projection = [{"precision": p, "omega": omega, "gpu_hours": h} for (p, omega), h in sorted(totals.items())]
    return {"matmul_tflops": peaks, "matmul_n": n, "steps": STEPS, "rows": rows, "projection": projection,
            "device_name": torch.cuda.get_device_name() if settings.device == "cuda" else "cpu"}
