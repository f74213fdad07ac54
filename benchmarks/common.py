"""Timing, peak memory, machine description and training-step builders shared by the sections.

Timing (:func:`interleaved`): the cases of one comparison run round-robin - one call of each per round, the
order rotated every round - after ``warmup`` untimed rounds; each case's figure is the median of its
``repeats`` timed calls, with the interquartile range beside it. On a GPU every call ends with
``torch.cuda.synchronize`` (not measured on the machine of docs/performance.md, which has none).

Peak memory (:func:`peak_memory`): one fresh ``python -m benchmarks.memprobe`` subprocess per case. On the
CPU, after the imports and a warm-up step of a one-block model of the same kind, it resets the kernel's peak
resident-set mark (``/proc/self/clear_refs``), notes the
resident set size, builds the model and runs the training steps; the case's peak is the peak mark (VmHWM)
minus that resident set: model, optimizer state, activations, temporaries and the allocator's slack, as the OS
sees it. The reset matters: importing torch peaks at a few GB of mappings, above most cases' own peaks, so a
plain ``ru_maxrss`` difference reads the import. A subprocess per case keeps one case's freed-but-retained
memory out of the next one's figure. On a GPU it is ``torch.cuda.max_memory_allocated`` (not measured here).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pkmixer.analysis.throughput import cpu_model


class BenchError(ValueError):
    """Bad input to the benchmark runner: one line, exit status 2."""


# section w's cases (benchmarks/sweep.py: what each compiles and stacks)
SWEEP_CASES = ("eager", "stacked", "graphs", "stacked-graphs")


@dataclass(frozen=True)
class Settings:
    """What every section needs to know about the run."""

    mode: str  # quick or full
    device: str  # cpu or cuda
    dtype: str  # float32 on the CPU; bfloat16 autocast on a GPU
    threads: int
    warmup: int
    repeats: int
    compile: bool  # also time torch.compile'd models where a section asks for it
    sweep_cases: tuple[str, ...] = SWEEP_CASES

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on a GPU (not measured here), nothing on the CPU (fp32)."""
        if self.device == "cuda" and self.dtype == "bfloat16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


@dataclass(frozen=True)
class Timing:
    median_s: float
    q1_s: float
    q3_s: float
    repeats: int

    def as_dict(self) -> dict:
        return asdict(self)


def interleaved(cases: dict[str, Callable[[], object]], settings: Settings, *, warmup: int | None = None,
                repeats: int | None = None) -> dict[str, Timing]:
    """Median time of each case's call, the cases timed round-robin in one loop (module docstring)."""
    return {name: timing(ts) for name, ts in interleaved_rounds(cases, settings, warmup=warmup,
                                                                 repeats=repeats).items()}


def interleaved_rounds(cases: dict[str, Callable[[], object]], settings: Settings, *, warmup: int | None = None,
                       repeats: int | None = None) -> dict[str, list[float]]:
    """Each case's call timed once a round, the cases round-robin in one loop (each round starting one case later):
    the seconds of every timed round, index r of every list from round r."""
    warmup = settings.warmup if warmup is None else warmup
    repeats = settings.repeats if repeats is None else repeats
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            settings.sync()
            start = time.perf_counter()
            cases[name]()
            settings.sync()
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def timing(ts: list[float]) -> Timing:
    """The median and quartiles of a case's times."""
    q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
    return Timing(statistics.median(ts), q[0], q[2], len(ts))


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict:
    """The ratio of two cases timed in the same rounds, round by round: its median and quartiles over the rounds.
    Pairing cancels what a round shares (the machine's clock and load while both ran), which a ratio of two medians
    keeps."""
    ratios = [ratio(a, b) for a, b in zip(numerator, denominator, strict=True)]
    return {"median": statistics.median(ratios), **dict(zip(("q1", "q3"), (
        statistics.quantiles(ratios, n=4)[::2] if len(ratios) > 1 else ratios * 2)))}


def sgemm_case(settings: Settings, seconds: float, n: int = 2048) -> tuple[Callable[[], object], float]:
    """The peer of section (f): k plain n×n×n matrix products in the run's dtype, k chosen so that one call
    lasts about ``seconds`` (as long as the model step it is interleaved with, so both see the same load),
    and the FLOPs of one call, 2kn³."""
    dtype = torch.bfloat16 if settings.dtype == "bfloat16" else torch.float32
    a = torch.randn(n, n, device=settings.torch_device, dtype=dtype)
    b = torch.randn(n, n, device=settings.torch_device, dtype=dtype)
    one = interleaved({"mm": lambda: torch.mm(a, b)}, settings, warmup=1, repeats=3)["mm"].median_s
    k = max(1, round(seconds / one))

    def run() -> None:
        for _ in range(k):
            torch.mm(a, b)

    return run, 2.0 * k * n ** 3


def train_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], settings: Settings,
               compiled: bool = False) -> Callable[[], None]:
    """One training step (forward, cross-entropy, backward, fused AdamW update) of ``model`` on a fixed batch."""
    model.train()
    forward = torch.compile(model) if compiled else model
    opt = adamw(model)
    x, y = batch

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with settings.autocast():
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()

    return step


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with the fused kernel (CPU and CUDA): the same optimizer for every model compared, and the fastest
    one, so that the optimizer's share of a step (a quarter of Mixer-B/16's with the per-tensor loop here) does not
    dilute the models' differences."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def infer_step(model: nn.Module, x: torch.Tensor, settings: Settings, compiled: bool = False
               ) -> Callable[[], None]:
    """One inference forward (eval mode, ``torch.inference_mode``) of ``model`` on a fixed batch."""
    model.eval()
    forward = torch.compile(model) if compiled else model

    def step() -> None:
        with torch.inference_mode(), settings.autocast():
            forward(x)

    return step


def image_batch(model: nn.Module, batch_size: int, settings: Settings, num_classes: int = 10
                ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, model.in_chans, model.img_size, model.img_size, generator=g)
    y = torch.randint(0, num_classes, (batch_size,), generator=g)
    return x.to(settings.torch_device), y.to(settings.torch_device)


def train_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one forward + backward on an input of ``input_shape``, counted by torch.utils.flop_counter on
    a meta copy of ``model`` (matrix products and convolutions; sparse products are not counted)."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(model).to("meta").train()
    with FlopCounterMode(display=False) as counter:
        meta(torch.zeros(input_shape, device="meta")).sum().backward()
    return counter.get_total_flops()


def machine(settings: Settings) -> dict:
    """The machine, as docs/performance.md describes it."""
    info = {
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "mkl": torch.backends.mkl.is_available(),
        "memory_bytes": _total_memory(),
        "device": settings.device,
        "device_name": torch.cuda.get_device_name() if settings.device == "cuda" else "cpu",
        "load_average": os.getloadavg(),
        "heap": heap_settings(),
    }
    try:
        import timm

        info["timm"] = timm.__version__
    except ImportError:
        info["timm"] = None
    return info


# glibc's mallopt parameters (malloc.h) and the values retain_freed_memory sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 1 << 30
_heap = {"retained": False}


def retain_freed_memory() -> bool:
    """Keep freed memory in the process's heap where the C library is glibc: its mmap threshold at 32 MiB (its
    most) and its trim threshold at 1 GiB; whether it is set. A section's loop interleaves many models, whose
    tensors of a few MiB glibc would otherwise map afresh and give back around their steps (its mmap threshold
    follows the largest block freed so far, and it trims the heap's top once twice that is free there), a page
    fault for each page touched, far more of them than a trainer running one model meets (docs/performance.md,
    section (n)). With it the loops time steps of a process whose heap has reached its steady size."""
    if not _heap["retained"] and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _heap["retained"] = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                                 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
        except (OSError, AttributeError):
            pass
    return _heap["retained"]


def heap_settings() -> str:
    """The machine record's line for :func:`retain_freed_memory`."""
    if _heap["retained"]:
        return f"freed memory kept (glibc mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold 1 GiB)"
    return "the C library's defaults"


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def peak_memory(spec: dict, settings: Settings, timeout: float = 1800) -> dict:
    """Run one memory probe (:mod:`benchmarks.memprobe`) in a fresh subprocess and return its JSON answer."""
    env = dict(os.environ, OMP_NUM_THREADS=str(settings.threads))
    payload = json.dumps({**spec, "device": settings.device, "dtype": settings.dtype, "threads": settings.threads})
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memprobe", payload], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")
