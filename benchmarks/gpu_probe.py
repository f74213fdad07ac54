"""Probes of Fig. 5's paper-scale steps on a GPU (docs/performance.md, section h: "Where the steps go", and
section w): ``python -m benchmarks.gpu_probe PARTS``, PARTS comma-separated among those below (default big,small).
JSON lines per case, and a torch.profiler table of the Ω = 2^27 S-Mixer's eager step.

* big: the Ω = 2^27 S-Mixer and RP S-Mixer, eager and compiled (default mode), and the throughput of their
  matrix products' shapes against an 8192³ product, fp32 and TF32;
* small: the first Ω = 2^18 S-Mixer and RP S-Mixer eager (and with deterministic algorithms), compiled in the
  default and reduce-overhead (CUDA graphs) modes, and stacked ×3 and ×8;
* rpgraphs: the first Ω = 2^18 RP S-Mixer eager and with CUDA graphs (reduce-overhead), and dynamo's graph breaks;
* stack: whole stacked steps (forward, backward, the members' SGD) captured as one CUDA graph each, against
  eager stacked steps - step time, kernels per step and the fraction of the step the GPU is busy - for K = 1 to
  32 members;
* grid: the costliest kernels of a graphed step at K = 1, 3, 32; then the Ω ≤ 2^21 runs as graphed steps (one
  stack of 3 seeds per distinct shape, or one graph per run) replayed in turn on 1 to 16 streams, and those
  runs' 200-epoch training time projected from one round;
* compiled: the graphed stacked step with the stacked model compiled by inductor, against it uncompiled;
* layernorm: torch's layer norm over narrow channels against the same written out, eager and compiled.

Steps: fp32 (``TF32=1``: TF32 products), batch 128 of random 32 px images, the preset's optimizer; medians of 7
(small, stack, grid: 10 or 20) after 3 (small: 5).
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
torch.backends.cuda.matmul.allow_tf32 = bool(os.environ.get("TF32"))  # TF32=1: TF32 products (default fp32)
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


# ---- stacked steps: built, graphed, profiled ------------------------------------------------------------------

def stacked_setup(spec, K):
    """Fig. 5's run ``spec`` stacked K times (structure seeds 0..K-1), its MemberOptimizer and a batch."""
    models = []
    for seed in range(K):
        torch.manual_seed(seed)
        models.append(build_model(spec.config.override({"model.structure_seed": seed}).model,
                                  num_classes=10).to(dev).train())
    st = stack_models(models).train()
    opt = stack_optimizer(st, spec.config.optim)
    x = torch.randn(K, spec.config.data.batch_size, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (K, spec.config.data.batch_size), device=dev)
    return st, opt, x, y, torch.ones(K, dtype=torch.bool, device=dev)


def graphed(st, opt, x, y, act):
    """The whole stacked step (forward, backward, the members' SGD, the restore of diverged members) captured
    as one CUDA graph after 3 warm-up steps on a side stream (torch's whole-network capture); the replay
    function. The learning rate stays the captured tensor's (no schedule)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            stacked_step(st, opt, x, y, act)
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stacked_step(st, opt, x, y, act)
    return graph.replay


def kernels(fn, steps=3):
    """GPU kernels (and copies) per call of ``fn`` and their summed device time per call, µs (profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn(); sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        sync()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return len(events) / steps, sum(e.time_range.elapsed_us() for e in events) / steps


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
                setup = stacked_setup(spec, K)
                out(part="small-stacked", fam=fam, K=K, ms=timed(lambda: stacked_step(*setup), 5, 20) * 1e3)
        try_("small-stacked", stacked)


if "rpgraphs" in PARTS:
    def rpgraphs():
        import torch._dynamo.utils as dynamo_utils
        spec = pick("RP S-Mixer", 2**18)
        eager = timed(make(spec), 5, 20) * 1e3
        t0 = time.time(); step = make(spec, "reduce-overhead"); step(); step(); sync()
        c = time.time() - t0
        out(part="rpgraphs", eager_ms=eager, graphs_ms=timed(step, 5, 20) * 1e3, compile_s=c,
            graph_breaks=sum(dynamo_utils.counters["graph_break"].values()))
    try_("rpgraphs", rpgraphs)


first = pick("S-Mixer", 2**18)

if "stack" in PARTS:
    import copy

    def agreement():
        """The graphed step trains as stacked_step does: 5 steps each from the same start."""
        a = stacked_setup(first, 3)
        b = (copy.deepcopy(a[0]),)
        b = b + (stack_optimizer(b[0], first.config.optim),) + a[2:]
        replay = graphed(*a)
        replay(); replay(); sync()
        for _ in range(5):
            stacked_step(*b)
        sync()
        diff = max((p - q).abs().max().item() for p, q in zip(a[0].parameters(), b[0].parameters()))
        out(part="stack-agreement", max_abs_param_diff=diff)
    try_("stack-agreement", agreement)

    for fam, omega, Ks in (("S-Mixer", 2**18, (1, 3, 8, 32)), ("RP S-Mixer", 2**18, (3, 32)),
                           ("SW-MLP", 2**18, (3, 32)), ("S-Mixer", 2**21, (3, 32)), ("RP S-Mixer", 2**21, (3,))):
        spec = pick(fam, omega)
        for K in Ks:
            def case():
                setup = stacked_setup(spec, K)
                eager = lambda: stacked_step(*setup)  # noqa: E731
                e_ms = timed(eager, 3, 10) * 1e3
                e_n, e_us = kernels(eager)
                replay = graphed(*setup)
                g_ms = timed(replay, 3, 20) * 1e3
                g_n, g_us = kernels(replay)
                out(part="stack-step", fam=fam, omega=omega, K=K, eager_ms=e_ms, eager_kernels=e_n,
                    eager_busy=e_us / 1e3 / e_ms, graph_ms=g_ms, graph_kernels=g_n, graph_busy=g_us / 1e3 / g_ms,
                    graph_us_per_member_step=g_ms * 1e3 / K)
            try_(f"stack-step-{fam}-{omega}-{K}", case)
            torch.cuda.empty_cache()


if "grid" in PARTS:
    def top_kernels():
        """Where a graphed step's GPU time goes, K = 1, 3 and 32: the 8 costliest kernels per step."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        for K in (1, 3, 32):
            setup = stacked_setup(first, K)
            replay = graphed(*setup)
            replay(); sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    replay()
                sync()
            cost = {}
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    n, t = cost.get(e.name, (0, 0.0))
                    cost[e.name] = (n + 1, t + e.time_range.elapsed_us())
            top = sorted(cost.items(), key=lambda kv: -kv[1][1])[:8]
            out(part="stack-top-kernels", K=K, total_us=sum(t for _, t in cost.values()) / 3,
                top=[(name[:90], n / 3, round(t / 3, 1)) for name, (n, t) in top])
            del setup, replay
            torch.cuda.empty_cache()
    try_("stack-top-kernels", top_kernels)

    def whole_grid(K):
        """The Ω ≤ 2^21 runs as graphed steps: one stack of K = 3 seeds per distinct shape, or (K = 1) one graph
        per run; one round = one step of every run, the graphs replayed in turn on one stream or spread over N
        streams; the 200-epoch training time projected from a round."""
        small = [s for s in specs if s.meta["omega"] <= 2**21]
        units = {}
        for s in small:
            key = (s.meta["model"], tuple(sorted((k, v) for k, v in s.config.model.options.items() if "seed" not in k)))
            units.setdefault(key if K > 1 else s.name, s)
        t0 = time.time()
        kept, replays = [], []  # kept: the models, optimisers and batches the graphs read and write
        for s in units.values():
            try:
                setup = stacked_setup(s, K)
                replays.append(graphed(*setup))
                kept.append(setup)
            except Exception as e:  # noqa
                out(part="grid-capture", K=K, run=s.name, error=repr(e)[:300])
        sync()
        out(part="grid-captured", K=K, graphs=len(replays), runs=len(small), capture_s=time.time() - t0,
            memory_gb=torch.cuda.memory_allocated() / 1e9)
        per_epoch = -(-50_000 // first.config.data.batch_size)
        for n in (1, 4, 8, 16):
            streams = [torch.cuda.Stream() for _ in range(n)]

            def round_():
                main = torch.cuda.current_stream()
                for s in streams:
                    s.wait_stream(main)
                for i, r in enumerate(replays):
                    with torch.cuda.stream(streams[i % n]):
                        r()
                for s in streams:
                    main.wait_stream(s)
            ms = timed(round_, 3, 10) * 1e3
            out(part="grid-round", K=K, streams=n, round_ms=ms,
                projected_train_minutes_200_epochs=ms / 1e3 * per_epoch * 200 / 60 * len(small) / (K * len(replays)))
        del kept, replays
        torch.cuda.empty_cache()
    for K in (3, 1):
        try_(f"grid-{K}", lambda: whole_grid(K))

if "compiled" in PARTS:
    def compiled_stacks():
        """The graphed stacked step with the stacked model compiled by inductor (default mode: fused layer norms
        and elementwise work) against the same step uncompiled."""
        for fam, omega, K in (("S-Mixer", 2**18, 3), ("S-Mixer", 2**18, 32), ("S-Mixer", 2**21, 3),
                              ("RP S-Mixer", 2**18, 3), ("SW-MLP", 2**18, 3)):
            spec = pick(fam, omega)
            st, opt, x, y, act = stacked_setup(spec, K)
            plain = timed(graphed(st, opt, x, y, act), 3, 20) * 1e3
            t0 = time.time()
            replay = graphed(torch.compile(st), opt, x, y, act)
            c = time.time() - t0
            n, _ = kernels(replay)
            out(part="stack-compiled", fam=fam, omega=omega, K=K, graph_ms=plain, compiled_graph_ms=timed(replay, 3, 20) * 1e3,
                compiled_kernels=n, compile_s=c)
            torch.cuda.empty_cache()
    try_("compiled", compiled_stacks)

if "layernorm" in PARTS:
    def manual_ln(x, w, b, eps=1e-6):
        mu = x.mean(-1, keepdim=True)
        xc = x - mu
        var = (xc * xc).mean(-1, keepdim=True)
        return xc * torch.rsqrt(var + eps) * w + b

    def layernorm():
        """A layer norm over the C channels of (K·128·S, C) rows, for the Ω = 2^18 S-Mixers' shapes, K = 1 and
        32: torch's kernel, the same written out, and that compiled; forward and forward + backward, ms."""
        comp = torch.compile(manual_ln)
        for C, S in ((16, 173), (32, 113), (113, 32), (173, 16)):
            for K in (1, 32):
                x = torch.randn(K * 128 * S, C, device=dev, requires_grad=True)
                w = torch.ones(C, device=dev, requires_grad=True)
                b = torch.zeros(C, device=dev, requires_grad=True)
                g = torch.randn_like(x)
                res = {}
                for name, f in (("native", lambda: F.layer_norm(x, (C,), w, b, 1e-6)),
                                ("manual", lambda: manual_ln(x, w, b)), ("compiled", lambda: comp(x, w, b))):
                    res[name + "_fwd"] = timed(f, 3, 20) * 1e3
                    res[name + "_fwdbwd"] = timed(lambda: torch.autograd.grad(f(), (x, w, b), g), 3, 20) * 1e3
                out(part="layernorm", C=C, S=S, K=K, elems_M=x.numel() / 1e6, **res)
    try_("layernorm", layernorm)
