"""One peak-memory measurement, run in a fresh process: ``python -m benchmarks.memprobe '<json spec>'``.

The spec names a model (``{"model": "swmlp", "options": {...}}`` for :class:`pkmixer.models.swmlp.SWMLP`,
``{"model": "mixer", "options": {...}}`` for :class:`pkmixer.models.mixer.Mixer`), a ``batch`` size and a
number of (fused) AdamW training ``steps``. Prints one JSON line: the peak bytes over the resident set size measured
just before the model is built (CPU; ``torch.cuda.max_memory_allocated`` on a GPU), the model's parameter,
kept-weight and buffer counts, and the last loss (finite: the model trains). See :mod:`benchmarks.common`.

CPU method: after the imports, the input batch and one step of a one-block model of the same kind (which pages
in the libraries' code and starts the thread pools), the kernel's peak-RSS mark is reset to the current RSS
(``echo 5 > /proc/self/clear_refs``); the answer is the peak mark (VmHWM) at the end minus the RSS at the reset
(VmRSS). Without the reset (older kernels), ``ru_maxrss`` is used and the method field says so.
"""
from __future__ import annotations

import json
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F

from pkmixer.models.mixer import Mixer
from pkmixer.models.swmlp import SWMLP

MODELS = {"swmlp": SWMLP, "mixer": Mixer}


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux ≥ 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes(reset: bool) -> int:
    """VmHWM after a reset; else ru_maxrss, whose mark may still be the imports' peak (then an over-estimate)."""
    if reset:
        return _status_bytes("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _toy(model: str, options: dict) -> dict:
    """A one-block model of the same kind and form: its run pages in the libraries' code and thread pools."""
    return {**options, "depth": 1} | ({"embed_dim": 1, "width": None} if model == "swmlp" else {})


def _train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, bf16: bool
           ) -> tuple[torch.Tensor, list[float]]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loss, step_s = torch.tensor(float("nan")), []
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t)
    return loss, step_s


def probe(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    cuda = spec["device"] == "cuda"
    device = torch.device(spec["device"])
    batch, steps = spec["batch"], spec["steps"]
    cls = MODELS[spec["model"]]
    g = torch.Generator().manual_seed(0)
    opts = spec["options"]
    img, chans = opts.get("img_size", 32), opts.get("in_chans", 3)
    x = torch.randn(batch, chans, img, img, generator=g).to(device)
    y = torch.randint(0, opts.get("num_classes", 10), (batch,), generator=g).to(device)
    _train(cls(**_toy(spec["model"], opts)).to(device), x, y, 1, cuda and spec["dtype"] == "bfloat16")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset = _reset_peak_rss()
        base = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = cls(**opts).to(device)
    build_s = time.perf_counter() - t0
    loss, step_s = _train(model, x, y, steps, cuda and spec["dtype"] == "bfloat16")
    peak = torch.cuda.max_memory_allocated() if cuda else _peak_rss_bytes(reset)
    kept = sum(lin.nnz for lin in model.sparse_layers()) if isinstance(model, SWMLP) else None
    return {
        "ok": True, "peak_bytes": peak - base, "baseline_bytes": base,
        "params": sum(p.numel() for p in model.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "kept_weights": kept, "loss": loss.item(), "trains": math.isfinite(loss.item()),
        "build_s": build_s, "step_s": step_s,
        "method": "cuda.max_memory_allocated" if cuda
        else "VmHWM after reset - VmRSS" if reset else "ru_maxrss - VmRSS",
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m benchmarks.memprobe '<json spec>'", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(probe(json.loads(sys.argv[1]))))
