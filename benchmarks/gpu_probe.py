"""A one-off probe of Fig. 5's paper-scale steps on a GPU (docs/performance.md, section h: "Where the steps go"):
``python -m benchmarks.gpu_probe big,small``. JSON lines per case, and a torch.profiler table of the Ω = 2^27
S-Mixer's eager step.

* big: the Ω = 2^27 S-Mixer and RP S-Mixer, eager and compiled (default mode), and the throughput of their
  matrix products' shapes against an 8192³ product, fp32 and TF32;
* small: the first Ω = 2^18 S-Mixer and RP S-Mixer eager (and with deterministic algorithms), compiled in the
  default and reduce-overhead (CUDA graphs) modes, and stacked ×3 and ×8.

Steps: fp32, batch 128 of random 32 px images, the preset's optimizer; medians of 7 (small: 20) after 3 (5).
Not a bench section (no JSON file, no interleaving): section h's compiled rows measure the same in the suite.
``DEV=cpu`` runs it on the CPU (slowly) to check the code.
"""
import json
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from pkmixer.experiments import get_preset
from pkmixer.train.build import build_model
from pkmixer.train.engine import build_optimizer
from pkmixer.train.stack import stack_models, stacked_step, build_optimizer as stack_optimizer

import os
dev = torch.device(os.environ.get("DEV", "cuda"))
specs = get_preset("fig5").runs("paper", "cifar10")
PARTS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["big", "small"]


def pick(model, omega):
    return next(s for s in specs if s.meta["model"] == model and s.meta["omega"] == omega)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, warm=3, reps=7):
    for _ in range(warm):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def out(**kw):
    print(json.dumps(kw), flush=True)


def make(spec, compile_mode=None):
    torch.manual_seed(0)
    model = build_model(spec.config.model, num_classes=10).to(dev).train()
    opt = build_optimizer(spec.config.optim, model)
    net = torch.compile(model, mode=compile_mode) if compile_mode else model
    B = spec.config.data.batch_size
    x = torch.randn(B, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (B,), device=dev)

    def step():
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def try_(name, fn):
    try:
        fn()
    except Exception as e:  # noqa
        out(part=name, error=repr(e)[:500])
        traceback.print_exc(limit=3)


def gemm(m, k, n, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(m, k, device=dev); b = torch.randn(k, n, device=dev)
    t = timed(lambda: a @ b)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2 * m * k * n / t / 1e12


if "big" in PARTS:
    for fam in ("S-Mixer", "RP S-Mixer"):
        spec = pick(fam, 2**27)
        o = spec.config.model.options
        def eager():
            step = make(spec)
            t = timed(step)
            out(part="big-eager", fam=fam, options=o, ms=t * 1e3)
            if fam == "S-Mixer":
                from torch.profiler import profile, ProfilerActivity
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        step()
                    sync()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
        try_("big-eager", eager)
        def compiled():
            t0 = time.time(); step = make(spec, "default"); step(); sync()
            c = time.time() - t0
            out(part="big-compile", fam=fam, ms=timed(step) * 1e3, compile_s=c)
        try_("big-compile", compiled)
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    C, S, B = 128, 1386, 128
    for tf32 in (False, True):
        out(part="gemm", tf32=tf32, token=gemm(B * C, S, S, tf32), channel=gemm(B * S, C, C, tf32),
            square=gemm(8192, 8192, 8192, tf32))

if "small" in PARTS:
    for fam in ("S-Mixer", "RP S-Mixer"):
        spec = pick(fam, 2**18)
        def eager():
            out(part="small-eager", fam=fam, options=spec.config.model.options, ms=timed(make(spec), 5, 20) * 1e3)
            torch.use_deterministic_algorithms(True, warn_only=True)
            out(part="small-eager-det", fam=fam, ms=timed(make(spec), 5, 20) * 1e3)
            torch.use_deterministic_algorithms(False)
        try_("small-eager", eager)
        for mode in ("default", "reduce-overhead"):
            def compiled():
                t0 = time.time(); step = make(spec, mode); step(); step(); sync()
                c = time.time() - t0
                out(part="small-compile", fam=fam, mode=mode, ms=timed(step, 5, 20) * 1e3, compile_s=c)
            try_("small-compile-" + mode, compiled)
        def stacked():
            for K in (3, 8):
                models = []
                for seed in range(K):
                    torch.manual_seed(seed)
                    models.append(build_model(spec.config.override({"model.structure_seed": seed}).model,
                                              num_classes=10).to(dev).train())
                st = stack_models(models).train()
                opt = stack_optimizer(st, spec.config.optim)
                x = torch.randn(K, 128, 3, 32, 32, device=dev); y = torch.randint(0, 10, (K, 128), device=dev)
                act = torch.ones(K, dtype=torch.bool, device=dev)
                out(part="small-stacked", fam=fam, K=K, ms=timed(lambda: stacked_step(st, opt, x, y, act), 5, 20) * 1e3)
        try_("small-stacked", stacked)
