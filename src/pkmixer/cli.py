"""The ``pkmixer`` command line: thin verbs over the library. Bad input: one line on stderr, exit status 2."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from collections.abc import Sequence

import torch

from .errors import ConfigError, check_input_file, check_output_path
from .models.registry import create_model, list_models, model_entry
from .overrides import parse_overrides

# explicit sparse matrices in float64 beyond this many non-zeros take too long and too much memory
MAX_EFFECTIVE_NNZ = 50_000_000
MAX_BATCH = 4096  # inputs of `effective`
MAX_CKA_EXAMPLES = 1 << 20  # inputs of `cka`
MAX_SEED = 2**32 - 1  # NumPy's seeds
MAX_COUNT = 2**31 - 1  # sizes, counts and batches that are only counted, never allocated
MAX_SPECTRUM_WIDTH = 2**20  # `spectrum --widths`: (Ω/γ)^(2/3) at Ω = 2**30

# torch threads of a command (`--threads N`, else PKMIXER_THREADS, else default_threads())
THREADS_ENV = "PKMIXER_THREADS"
MAX_DEFAULT_THREADS = 8  # small models gain little beyond this; each thread is one more to wait for at a barrier
MAX_THREADS = 1024


def default_threads() -> int:
    """The cores of this process's CPU set that were idle over the last minute (cores minus the 1-minute load
    average, rounded up), at least 1 and at most :data:`MAX_DEFAULT_THREADS`. OpenMP threads wait for each other
    at every parallel region, so a thread that shares its core with another busy process slows the whole step
    down (2-thread runs measured 3-10x slower than 1-thread runs on 2 loaded cores); leaving busy cores alone
    costs at most the parallel speed-up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        busy = math.ceil(os.getloadavg()[0] - 0.25)  # a little noise is not a busy core
    except OSError:
        busy = 0
    return max(1, min(MAX_DEFAULT_THREADS, cores - max(0, busy)))


def _threads(value: int | None) -> int:
    """The thread count to use: ``--threads``, else $PKMIXER_THREADS, else :func:`default_threads`."""
    if value is None:
        text = os.environ.get(THREADS_ENV, "").strip()
        if not text:
            return default_threads()
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{THREADS_ENV}={text!r} must be a whole number of threads") from None
        where = THREADS_ENV
    else:
        where = "--threads"
    if not 1 <= value <= MAX_THREADS:
        raise ConfigError(f"{where} must lie in [1, {MAX_THREADS}], got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


def cmd_models(args: argparse.Namespace) -> int:
    """The zoo with parameters, S, C, γ, Ω and effective width (built on the meta device: no memory)."""
    names = list_models(args.filter)
    if not names:
        raise ConfigError(f"no model matches {args.filter!r}; see `pkmixer models`")
    records = []
    for name in names:
        with torch.device("meta"):
            info = create_model(name).info()
        records.append({"name": name, **info.as_dict(), "gamma": info.gamma,
                        "description": model_entry(name).description, "source": model_entry(name).source})
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    rows = [[r["name"], r["family"], f"{r['params'] / 1e6:.2f}M", r["num_tokens"] or "-", r["embed_dim"] or "-",
             r["gamma"], f"{r['connections']:.3g}", r["effective_width"], r["max_width"], f"{r['density']:.3g}"]
            for r in records]
    _print_table(rows, ["model", "family", "params", "S", "C", "γ", "Ω/layer", "width m", "max width", "density"])
    return 0


def cmd_effective(args: argparse.Namespace) -> int:
    """Build a small instance, its effective wide MLP, and the relative error between their outputs."""
    from .theory.effective import effective_mlp

    overrides = parse_overrides(args.set)
    with torch.device("meta"):
        info = create_model(args.name, **overrides).info()
    if not 0 < args.batch <= MAX_BATCH:
        raise ConfigError(f"--batch must lie in [1, {MAX_BATCH}], got {args.batch}")
    total = info.connections * info.mixing_layers
    if total > MAX_EFFECTIVE_NNZ:
        raise ConfigError(f"{args.name} has about {total:.2g} effective connections, too many for explicit matrices "
                          f"(limit {MAX_EFFECTIVE_NNZ:.0e}); shrink it, e.g. --set depth=2 --set embed_dim=32 "
                          "--set img_size=32")
    torch.manual_seed(args.seed)
    model = create_model(args.name, **overrides).double().eval()
    torch.nn.init.normal_(model.head.weight, std=model.head.in_features ** -0.5)  # non-zero logits to compare
    x = torch.randn(args.batch, model.in_chans, model.img_size, model.img_size, dtype=torch.float64)
    eff = effective_mlp(model)
    with torch.no_grad():
        ours, wide = model(x), eff(x)
    rel = float((wide - ours).norm() / ours.norm())
    layers = [{"name": l.name, "shape": list(l.weight.shape), "nnz": int(l.weight._nnz()), "density": l.density}
              for l in eff.layers()]
    result = {"model": args.name, "overrides": overrides, "effective_width": info.effective_width,
              "relative_error": rel, "layers": layers}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    _print_table([[l["name"], "x".join(map(str, l["shape"])), l["nnz"], f"{l['density']:.3g}"] for l in layers],
                 ["effective layer", "shape", "non-zeros", "density"])
    print(f"\n{args.name}: effective width m = {info.effective_width}; relative error between the model and its "
          f"effective MLP (float64, batch {args.batch}): {rel:.3e}")
    return 0


def _csv(text: str, kind: type, flag: str) -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated {kind.__name__} values, got {text!r}") from None


def _fresh_output(path: str | None, overwrite: bool, what: str = "figure") -> str | None:
    """An output file that can be written: not a folder, not under a file, in a folder that accepts files, and
    not existing yet unless ``overwrite`` (results are never overwritten unless asked); a figure's suffix too."""
    if path is None:
        return None
    if what == "figure":
        from .figures import figure_path

        figure_path(path)
    check_output_path(path, what, overwrite=overwrite)
    return path


def _bounded(flag: str, value: int | float | None, low: int | float, high: int | float) -> None:
    """A numeric option in [low, high] (finite); None (not given) passes."""
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{flag} must lie in [{low}, {high}], got {value}")


def _data_dir(path: str | None) -> str | None:
    """--data-dir: an existing folder."""
    if path is not None and not Path(path).is_dir():
        raise ConfigError(f"--data-dir {path} is not a folder" if Path(path).exists() else f"no folder at {path}")
    return path


def _checkpoint_path(text: str) -> str:
    """A checkpoint file, or the best checkpoint of a run directory."""
    from .train.loop import RunDir

    if Path(text).is_dir():
        run = RunDir(Path(text))
        if not run.best.is_file():
            raise ConfigError(f"{text} is not a run directory with checkpoints/best.pt")
        return str(run.best)
    return text


def _load_model_arg(text: str, overrides: dict) -> torch.nn.Module:
    """A run directory (its best checkpoint), a checkpoint file (pkmixer, timm or Flax), or a registered name
    built fresh."""
    from .models.convert import import_checkpoint

    text = _checkpoint_path(text)
    if Path(text).exists() or text.endswith((".pt", ".pth", ".npz")):
        if overrides:
            raise ConfigError("--set applies to registered names, not to checkpoints")
        return import_checkpoint(text).model
    return create_model(text, **overrides)


def cmd_width(args: argparse.Namespace) -> int:
    """The fixed-Ω calculus (Sec. 4.1, Eqs. 13-15, S.43, S.45): S for each C, SW-MLP widths, the optimum."""
    from .theory.width import width_summary, width_table

    if args.C is not None and args.pairs is not None:
        raise ConfigError("give --C or --pairs, not both")
    _bounded("--pairs", args.pairs, 1, 10_000)
    _bounded("--c-min", args.c_min, 1, MAX_COUNT)
    channels = None if args.C is None else _csv(args.C, int, "--C")
    densities = None if args.density is None else _csv(args.density, float, "--density")
    rows = width_table(args.omega, args.gamma, channels=channels, count=args.pairs, densities=densities,
                       c_min=args.c_min)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    summary = width_summary(args.omega, args.gamma)
    print(f"Ω = {summary.omega:.6g}, γ = {args.gamma:g}: widest Mixer at C* = S* = (Ω/γ)^(1/3) = "
          f"{summary.c_star:.4g} (nearest integers C = {summary.C}, S = {summary.S}), m ≤ {summary.m_max:.6g}, "
          f"density ≥ {summary.p_min:.3g}; S.45: {summary.m_lower:.5g} ≤ m ≤ {summary.m_upper:.6g}; "
          f"dense MLP width √(Ω/γ) = {summary.swmlp_dense_width:.5g}\n")
    _print_table([[r["kind"], r["C"] or "-", r["S"] or "-", r["m"], f"{r['p']:.4g}", f"{r['omega']:.6g}"]
                  for r in rows], ["kind", "C", "S", "m", "density p", "Ω (exact)"])
    return 0


def cmd_spectrum(args: argparse.Namespace) -> int:
    """λ_max of SW-MLP random weights against width at fixed Ω, with √L₊ and the Mixer's c_γ (Fig. 4 right)."""
    from .analysis.plots import plot_lambda_max
    from .theory.spectrum import spectrum_report

    _fresh_output(args.plot, args.overwrite)
    widths = None if args.widths is None else _csv(args.widths, int, "--widths")
    if widths is not None and any(not 0 < m <= MAX_SPECTRUM_WIDTH for m in widths):
        raise ConfigError(f"--widths must lie in [1, {MAX_SPECTRUM_WIDTH}], got {args.widths}")
    if not 0 < args.seeds <= 1000:
        raise ConfigError(f"--seeds must lie in [1, 1000], got {args.seeds}")
    report = spectrum_report(args.omega, args.gamma, widths, args.seeds, args.seed)
    if args.plot:
        report["plot"] = str(plot_lambda_max(report, args.plot))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    mixer = report["mixer"]
    _print_table([[r["m"], f"{r['p']:.4g}", f"{r['q']:.3g}", f"{r['lambda_max_mean']:.4f} ± {r['lambda_max_std']:.4f}",
                   f"{r['sqrt_l_plus']:.4f}"] for r in report["rows"]],
                 ["width m", "density p", "q = √(pm)", "λ_max (SW-MLP)", "√L₊"])
    print(f"\nMixer at C = {mixer['C']}, S = {mixer['S']} (m = {mixer['m']}): λ_max channel "
          f"{mixer['lambda_max_channel']:.4f}, token {mixer['lambda_max_token']:.4f}; c_γ = 1 + √γ = "
          f"{report['c_gamma']:.4f}")
    if args.plot:
        print(f"figure: {report['plot']}")
    return 0


def cmd_cka(args: argparse.Namespace) -> int:
    """Mini-batch CKA between the layers of two models (Nguyen et al. 2021; Sec. 3.4, Fig. 2b-c)."""
    from .analysis.cka import cka_matrix, plot_cka

    _fresh_output(args.plot, args.overwrite)
    _data_dir(args.data_dir)
    for flag in ("batches", "batch_size"):
        if not 0 < getattr(args, flag) <= MAX_CKA_EXAMPLES:
            raise ConfigError(f"--{flag.replace('_', '-')} must lie in [1, {MAX_CKA_EXAMPLES}], got {getattr(args, flag)}")
    if args.batches * args.batch_size > MAX_CKA_EXAMPLES:
        raise ConfigError(f"--batches x --batch-size is {args.batches * args.batch_size} examples, more than "
                          f"{MAX_CKA_EXAMPLES}")
    if args.data != "gaussian":
        from .data import list_datasets

        if args.data not in list_datasets():
            from .errors import unknown_name

            raise unknown_name("data set (--data)", args.data, ["gaussian", *list_datasets()])
    torch.manual_seed(args.seed)
    model_a, model_b = (_load_model_arg(text, {}) for text in (args.a, args.b))
    shapes = [(m.in_chans, m.img_size) for m in (model_a, model_b)]
    if shapes[0] != shapes[1]:
        raise ConfigError(f"the models take different inputs: {shapes[0]} and {shapes[1]} (channels, pixels)")
    in_chans, size = shapes[0]
    if args.data == "gaussian":
        generator = torch.Generator().manual_seed(args.seed)
        batches = [torch.randn(args.batch_size, in_chans, size, size, generator=generator) for _ in range(args.batches)]
    else:
        from .data import build_dataset, build_transform, dataset_info

        transform = build_transform(dataset_info(args.data), train=False, img_size=size, in_chans=in_chans)
        test = build_dataset(args.data, "test", data_dir=args.data_dir, transform=transform)
        first = torch.utils.data.Subset(test, range(min(len(test), args.batches * args.batch_size)))
        batches = torch.utils.data.DataLoader(first, batch_size=args.batch_size, drop_last=True)
    result = cka_matrix(model_a, model_b, batches, where=args.where, labels=(args.a, args.b))
    out = result.as_dict()
    if args.plot:
        out["plot"] = str(plot_cka(result, args.plot))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    _print_table([[name, *(f"{v:.3f}" for v in row)] for name, row in zip(result.names_a, result.matrix)],
                 [f"{args.a} \\ {args.b}", *result.names_b])
    if result.diagonal_mean is not None:
        print(f"\nmean of the diagonal: {result.diagonal_mean:.4f}")
    inputs = "Gaussian inputs" if args.data == "gaussian" else f"{args.data} test images"
    print(f"{result.n_examples} {inputs} in {result.n_batches} mini-batches")
    if args.plot:
        print(f"figure: {out['plot']}")
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    """Parameters, connections, FLOPs and memory (App. D.9, Table S.3): of named models, or at a fixed Ω."""
    from .analysis.cost import cost_table, fixed_omega_comparison

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
             "float64": torch.float64}[args.dtype]
    _bounded("--batch-size", args.batch_size, 1, MAX_COUNT)
    omega_only = {"gamma": 2.0, "depth": 3, "embed_dim": None, "img_size": 32, "patch_size": 4, "num_classes": 10}
    if args.omega is None:
        given = [k for k, default in omega_only.items() if getattr(args, k) != default]
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} applies to --omega only; for a named model use "
                              f"--set {given[0] if given[0] != 'gamma' else 'mlp_ratio'}=VALUE")
    else:
        if not 0 < args.gamma < math.inf:
            raise ConfigError(f"--gamma must be a positive finite number, got {args.gamma}")
        for key in ("depth", "embed_dim", "img_size", "patch_size", "num_classes"):
            if getattr(args, key) is not None:
                _bounded(f"--{key.replace('_', '-')}", getattr(args, key), 1, MAX_COUNT)
    if args.omega is not None:
        if args.names:
            raise ConfigError("give model names or --omega, not both")
        reports = fixed_omega_comparison(args.omega, args.gamma, args.depth, embed_dim=args.embed_dim,
                                         img_size=args.img_size, patch_size=args.patch_size,
                                         num_classes=args.num_classes, batch_size=args.batch_size, dtype=dtype)
    elif args.names:
        reports = cost_table(args.names, batch_size=args.batch_size, dtype=dtype, **parse_overrides(args.set))
    else:
        raise ConfigError("give one or more model names, or --omega EXPR for the fixed-Ω comparison")
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
        return 0

    def si(n: float | None, unit: str = "") -> str:
        """1234567 -> '1.23 M' (unit B: bytes)."""
        if n is None:
            return "-"
        for prefix in ("", "K", "M", "G", "T", "P"):
            if abs(n) < 1000 or prefix == "P":
                return f"{n:.3g} {prefix}{unit}".rstrip()
            n /= 1000
        return ""

    _print_table([[r.model, si(r.params), f"{r.connections:.3g}", si(r.macs), si(r.train_flops),
                   si(r.param_bytes + r.buffer_bytes, "B"), si(r.train_state_bytes, "B"),
                   si(r.activation_bytes_per_image, "B")] for r in reports],
                 ["model", "params", "Ω/layer", "MACs/img", f"train FLOPs (batch {args.batch_size})",
                  "weights", "train state", "activations/img"])
    return 0


def cmd_visualize(args: argparse.Namespace) -> int:
    """Weight pictures: token-mixing units, per-patch units (Mixer supp. D), effective sparsity (Fig. 1, S.9)."""
    from .analysis.visualize import visualize

    _fresh_output(args.out, args.overwrite)
    if args.set and args.model is None:
        raise ConfigError("--set applies to --model; without a model there is nothing to set")
    options = parse_overrides(args.option)
    torch.manual_seed(args.seed)
    model = None if args.model is None else _load_model_arg(args.model, parse_overrides(args.set))
    path = visualize(args.kind, args.out, model, **options)
    print(json.dumps({"figure": str(path)}) if args.json else f"figure: {path}")
    return 0


def cmd_implicit_l1(args: argparse.Namespace) -> int:
    """Prop. 3.3 on a small regression: L2-regularised Kronecker optimum ≥ L1-regularised dense optimum."""
    from .theory.regularization import implicit_l1_report

    for flag, value, high in (("--S", args.S, 1024), ("--C", args.C, 1024), ("--samples", args.samples, 10**6),
                              ("--restarts", args.restarts, 1000)):
        _bounded(flag, value, 1, high)
    _bounded("--lam", args.lam, 0, math.inf)
    _bounded("--noise", args.noise, 0, math.inf)
    report = implicit_l1_report(S=args.S, C=args.C, lam=args.lam, n_samples=args.samples, noise=args.noise,
                                seed=args.seed, restarts=args.restarts)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for key, value in report.items():
        print(f"{key:>28}: {value:.6g}" if isinstance(value, float) else f"{key:>28}: {value}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train a registered model (App. C recipes); a run directory keeps config, metrics and checkpoints."""
    from .train.config import MAX_EPOCHS, build_config, load_yaml
    from .train.loop import TrainingDiverged, default_run_dir, train

    overrides = parse_overrides(args.set)
    if args.data_dir is not None:
        overrides["data.data_dir"] = args.data_dir
    _bounded("--stop-after", args.stop_after, 1, MAX_EPOCHS)
    if args.resume:
        if args.run_dir is None:
            raise ConfigError("--resume needs --run-dir DIR")
        if not Path(args.run_dir).is_dir():
            raise ConfigError(f"no run directory at {args.run_dir} to resume")
        cfg = None if args.config is None and not overrides else \
            build_config(None if args.config is None else load_yaml(args.config), overrides)
    else:
        cfg = build_config(None if args.config is None else load_yaml(args.config), overrides)
    run_dir = args.run_dir or default_run_dir(cfg)
    if not args.resume:
        _preflight(cfg, run_dir)
    try:
        summary = train(cfg, run_dir, resume=args.resume, stop_after=args.stop_after)
    except TrainingDiverged as err:
        sys.stderr.write(f"pkmixer train: {err}\n")
        return 1
    if args.json:
        print(json.dumps({"run_dir": str(run_dir), **summary}, indent=2))
    else:
        state = "" if summary["status"] == "finished" else \
            f" - stopped after epoch {summary['epochs_done']} of {summary['epochs']}; continue with --resume"
        print(f"{run_dir}: best test error {summary['best_test_error']:.2%}, last {summary['final_test_error']:.2%} "
              f"({summary['wall_time']:.0f} s){state}")
    return 0


def _check_classes(cfg) -> dict:
    """The model options with the data set's class count unless they set one; fewer classes than the data set's
    labels are refused (the loss would index past the logits)."""
    from .data import dataset_info

    d, options = cfg.data, dict(cfg.model.options)
    data_classes = None if d.name == "imagenet" else dataset_info("digits" if d.name == "auto" else d.name).num_classes
    if data_classes is not None:
        classes = options.setdefault("num_classes", data_classes)
        if isinstance(classes, int) and not isinstance(classes, bool) and 0 < classes < data_classes:
            raise ConfigError(f"model.num_classes={classes} is fewer than the {data_classes} classes of "
                              f"{d.name} (labels 0..{data_classes - 1})")
    return options


def _preflight(cfg, run_dir: str | Path) -> None:
    """What a new run will need, checked before its directory is made: a run directory that can be created,
    the data folder, the model.init file, a model that builds (on the meta device) with at least the data
    set's classes, and memory for its weights, gradients and optimizer state."""
    from .models.registry import available_memory

    check_output_path(run_dir, "run directory", folder=True)  # an existing one: train() refuses it
    d, m = cfg.data, cfg.model
    if d.data_dir is not None:
        if d.download:
            check_output_path(d.data_dir, "data.data_dir", folder=True)
        elif not Path(d.data_dir).is_dir():
            raise ConfigError(f"data.data_dir {d.data_dir} is not a folder")
    options = _check_classes(cfg)
    if m.init is not None:
        check_input_file(m.init, "model.init checkpoint")
        return  # the checkpoint sets the architecture; the loop checks that the options fit it
    with torch.device("meta"):
        model = create_model(m.name, **options)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    buffers = sum(t.numel() * t.element_size() for t in model.buffers())
    need = weights * (4 if cfg.optim.name == "adamw" else 3) + buffers  # weights, gradients, optimizer state
    device = torch.device("cuda") if cfg.run.device == "cuda" or (cfg.run.device == "auto" and
                                                                   torch.cuda.is_available()) else None
    free = available_memory(device)
    if need > free:
        raise ConfigError(f"{m.name} needs about {need / 2**30:.3g} GiB for its weights, gradients and optimizer "
                          f"state, beyond the {free / 2**30:.3g} GiB available; make it smaller")


def cmd_finetune(args: argparse.Namespace) -> int:
    """Fine-tune a checkpoint at a higher resolution: token-mixing MLPs enlarged block-diagonally (supp. C)."""
    from .models.convert import import_checkpoint

    if args.image_size <= 0:
        raise ConfigError(f"--image-size must be a positive integer, got {args.image_size}")
    taken = [item for item in args.set if item.split("=", 1)[0].strip() in ("model.name", "model.init", "model.img_size")]
    if taken:
        raise ConfigError(f"finetune sets model.name, model.init and model.img_size itself; drop --set {taken[0]}")
    source = _checkpoint_path(args.checkpoint)
    name = import_checkpoint(source).model.spec.name
    args.set = [*args.set, f"model.name={name}", f"model.init={source}", f"model.img_size={args.image_size}"]
    args.resume, args.stop_after = False, None
    return cmd_train(args)


def cmd_eval(args: argparse.Namespace) -> int:
    """Top-1 error and loss on the test split: of a run's checkpoint, or of a checkpoint file (pkmixer ``.pt``,
    timm ``.pth`` or Flax ``.npz``) on the data set given with --set data.name=..."""
    from .train.loop import evaluate_checkpoint, evaluate_run

    overrides = parse_overrides(args.set)
    if args.data_dir is not None:
        overrides["data.data_dir"] = args.data_dir
    from .train.config import build_config

    _data_dir(args.data_dir)
    target = Path(args.target)
    if not target.exists():
        raise ConfigError(f"no run directory or checkpoint file at {target}")
    taken = [k for k in overrides if k in ("model.name", "model.init")]
    if taken:
        raise ConfigError(f"eval takes the model from the checkpoint; drop --set {taken[0]}")
    if overrides:
        cfg = build_config(None, overrides)  # every value checked against its domain
        _check_classes(cfg)
        if cfg.data.data_dir is not None and not Path(cfg.data.data_dir).is_dir():
            raise ConfigError(f"data.data_dir {cfg.data.data_dir} is not a folder")
    if target.is_file():
        result = evaluate_checkpoint(target, overrides)
        where = f"{result['checkpoint']} on {result['data']}"
    else:
        if overrides:
            raise ConfigError("a run directory is evaluated with its own config: drop --set and --data-dir")
        result = evaluate_run(target, args.checkpoint)
        where = f"{result['run']} ({result['checkpoint']}, epoch {result['epoch']})"
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{where}: test error {result['test_error']:.2%}, test loss {result['test_loss']:.4f} "
              f"on {result['test_examples']} examples")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert MLP-Mixer weights between Google's Flax ``.npz`` (Listing 1 names), timm ``.pth`` and pkmixer
    ``.pt`` checkpoints, by the destination's suffix; --num-classes gives a new zero head (Mixer supp. C).
    A Flax ``.npz`` imports with Listing 1's tanh GELU, a timm ``.pth`` with the exact GELU (--act to choose);
    writing a model to a format whose code computes the other GELU warns, one line on stderr."""
    import warnings

    from .models.convert import ActivationWarning, convert_checkpoint

    _fresh_output(args.dst, args.overwrite, "destination")
    check_input_file(args.src, "source checkpoint")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ActivationWarning)
        result = convert_checkpoint(args.src, args.dst, model=args.model, num_classes=args.num_classes,
                                    img_size=args.img_size, overwrite=args.overwrite, act=args.act)
    for w in caught:
        if issubclass(w.category, ActivationWarning):
            sys.stderr.write(f"pkmixer convert: warning: {w.message}\n")
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        head = ", new head" if result["head_replaced"] else ""
        print(f"{result['source']} ({result['source_format']}) -> {result['destination']} "
              f"({result['destination_format']}): {result['model']}, {result['params'] / 1e6:.2f}M parameters, "
              f"{result['num_classes']} classes at {result['img_size']} px, {result['dtype']}, "
              f"act {result['act']}{head}")
    return 0


def cmd_throughput(args: argparse.Namespace) -> int:
    """Inference images/s on this device beside supp. Table 2's published throughput and pre-training
    exaFLOPs, and the exaFLOPs computed as 3 × 2 × MACs × 300M images × epochs."""
    from .analysis.throughput import throughput_table

    names = None if args.models is None else [n for n in args.models.split(",") if n]
    _bounded("--batch-size", args.batch_size, 1, MAX_BATCH)
    _bounded("--warmup", args.warmup, 0, 10_000)
    _bounded("--repeats", args.repeats, 1, 10_000)
    _bounded("--image-size", args.image_size, 1, 8192)
    rows = throughput_table(names, args.batch_size, args.dtype, args.device, args.warmup, args.repeats,
                            args.image_size, quick=args.quick)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print(f"{rows[0]['device_name']}, {rows[0]['dtype']}, batch {rows[0]['batch_size']}, "
          f"median of {rows[0]['repeats']} forwards after {rows[0]['warmup']} warm-up")
    _print_table([[r["title"] or r["name"], f"{r['params'] / 1e6:.1f}M", f"{r['gmacs']:.2f}", r["image_size"],
                   f"{r['images_per_s']:.1f}", num(r["published_tpuv3_images_per_s_per_core"], ".0f"),
                   num(r["published_v100_images_per_s_per_core"], ".0f"), num(r["pretrain_epochs"], "d"),
                   num(r["exaflops"], ".0f"), num(r["published_exaflops"], ".0f")] for r in rows],
                 ["model", "params", "GMACs", "px", "img/s here", "TPUv3 img/s/core", "V100 img/s/core",
                  "epochs", "exaFLOPs", "published"])
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Reproduce a figure or table of the paper: run its sweep (resumable: the same command again skips
    finished runs and resumes the others; local processes or Ray), then render the figures (PNG, SVG), tables
    (CSV) and report.md with the paper's claim, mean ± std over seeds and a verdict computed from the data."""
    from .experiments.preset import SCALES, list_presets
    from .experiments.reproduce import reproduce

    if args.list:
        if args.name:
            raise ConfigError("give a preset name or --list, not both")
        records = []
        for preset in list_presets():
            counts = {}
            for scale in SCALES:
                try:
                    counts[scale] = len(preset.runs(scale, None))
                except ConfigError:
                    counts[scale] = None
            records.append({**preset.describe(), "runs": counts})
        if args.json:
            print(json.dumps(records, indent=2))
            return 0
        _print_table([[r["name"], r["title"], r["source"],
                       *("-" if r["runs"][s] is None else r["runs"][s] for s in SCALES)] for r in records],
                     ["preset", "title", "source", *(f"runs {s}" for s in SCALES)])
        return 0
    if not args.name:
        raise ConfigError("name a preset (see `pkmixer reproduce --list`)")
    if args.data_dir is not None and Path(args.data_dir).exists() and not Path(args.data_dir).is_dir():
        raise ConfigError(f"--data-dir {args.data_dir} is not a folder")  # a missing one: the preset says where it looked
    for flag in ("workers", "threads", "seeds"):  # below 1: the sweep's own message
        value = getattr(args, flag)
        if value is not None and value > MAX_THREADS:
            raise ConfigError(f"--{flag} must be at most {MAX_THREADS}, got {value}")
    if args.out is not None:
        check_output_path(args.out, "--out", folder=True)

    def log(message: str) -> None:  # progress on stderr when stdout carries JSON
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    result = reproduce(args.name, scale=args.scale, dataset=args.dataset, data_dir=args.data_dir,
                       backend=args.backend, address=args.address, workers=args.workers, threads=args.threads,
                       out=args.out, seeds=args.seeds, overwrite=args.overwrite, log=log)
    return _print_report(result, args.json)


def cmd_report(args: argparse.Namespace) -> int:
    """Render the report of a `pkmixer reproduce` output directory again from its finished runs, without
    training (e.g. after editing a preset's analysis, or from copied results)."""
    from .experiments.reproduce import rerender

    if not Path(args.dir).is_dir():
        raise ConfigError(f"no output directory of `pkmixer reproduce` at {args.dir}")
    check_output_path(Path(args.dir) / "report", "report folder", folder=True)
    return _print_report(rerender(args.dir, overwrite=args.overwrite), args.json)


def _print_report(result: dict, as_json: bool) -> int:
    """The outcome of reproduce/report: paths and verdict (exit 0), or the runs that did not finish (exit 1)."""
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    elif "failed" in result:
        for row in result["failed"]:
            sys.stderr.write(f"run {row['run']}: {row['status']}{': ' + row['error'] if row['error'] else ''}\n")
    else:
        state = " (up to date, unchanged)" if result["up_to_date"] else ""
        print(f"report: {result['report']}{state}")
        for path in result["figures"]:
            print(f"figure: {path}")
        for path in result["tables"]:
            print(f"table: {path}")
        print(f"verdict: {result['verdict']}")
    if "failed" in result:
        sys.stderr.write(f"pkmixer: {len(result['failed'])} of {result['runs']} runs did not finish (logs in "
                         f"{result['out']}/logs); run the same command again to retry them\n")
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pkmixer", description="MLP-Mixers as wide and sparse MLPs (Hayase & Karakida 2024).")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    p = sub.add_parser("models", help="list the model zoo", description=cmd_models.__doc__)
    p.add_argument("--filter", help="shell-style pattern on the name, e.g. '*smixer*'")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("effective", help="check a model against its effective wide MLP",
                       description=cmd_effective.__doc__)
    p.add_argument("name", help="a registered model (see `pkmixer models`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model option, e.g. --set depth=2 --set rp_blocks=all")
    p.add_argument("--batch", type=int, default=4, help="inputs to compare (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_effective)

    p = sub.add_parser("width", help="fixed-Ω width and sparsity calculus", description=cmd_width.__doc__)
    p.add_argument("--omega", required=True, help="connections per layer Ω: an integer or an expression like 2**18")
    p.add_argument("--gamma", type=float, default=1.0, help="expansion factor γ (default 1: S-Mixer)")
    p.add_argument("--C", help="comma-separated channel counts: S for each (else symmetric pairs)")
    p.add_argument("--pairs", type=int, help="number of C values below C* (mirrored: 2N pairs)")
    p.add_argument("--c-min", type=int, default=16, help="smallest C of --pairs (default 16; App. C.4 uses 128 at 2**27)")
    p.add_argument("--density", help="comma-separated SW-MLP densities p: the width m = √(Ω/(γp)) for each")
    p.add_argument("--json", action="store_true", help="machine-readable output: a list of rows")
    p.set_defaults(func=cmd_width)

    p = sub.add_parser("spectrum", help="largest singular values of random sparse and Mixer weights",
                       description=cmd_spectrum.__doc__)
    p.add_argument("--omega", default="2**16", help="connections per layer Ω (default 2**16)")
    p.add_argument("--gamma", type=float, default=1.0, help="expansion factor γ (default 1)")
    p.add_argument("--widths", help="comma-separated widths m (default: 6 from √(Ω/γ) to (Ω/γ)^(2/3))")
    p.add_argument("--seeds", type=int, default=3, help="random weights per width (default 3)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--plot", metavar="FILE", help="write the figure (.png or .svg)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing figure")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_spectrum)

    p = sub.add_parser("cka", help="layer-by-layer mini-batch CKA between two models", description=cmd_cka.__doc__)
    p.add_argument("a", help="model A: a run directory, a checkpoint file or a registered name (fresh weights)")
    p.add_argument("b", help="model B: a run directory, a checkpoint file or a registered name (fresh weights)")
    p.add_argument("--data", default="gaussian",
                   help="inputs: a data set's test split (e.g. fashion-mnist, cifar10) or gaussian (default)")
    p.add_argument("--data-dir", help="where the data set lies")
    p.add_argument("--where", choices=["mixing", "block"], default="mixing",
                   help="feature points: mixing-layer outputs before the skip (paper) or block outputs")
    p.add_argument("--batches", type=int, default=16, help="mini-batches (default 16)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per mini-batch, at least 4 (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and fresh weights (default 0)")
    p.add_argument("--plot", metavar="FILE", help="write the heatmap (.png or .svg)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing figure")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_cka)

    p = sub.add_parser("cost", help="parameters, FLOPs and memory", description=cmd_cost.__doc__)
    p.add_argument("names", nargs="*", help="registered models (built on the meta device: no memory)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model option")
    p.add_argument("--omega", help="compare MLP-Mixer, RP-Mixer and SW-MLP (sparse, dense-masked) at this Ω")
    p.add_argument("--gamma", type=float, default=2.0, help="γ for --omega (default 2)")
    p.add_argument("--depth", type=int, default=3, help="blocks for --omega (default 3)")
    p.add_argument("--embed-dim", type=int, help="C for --omega (default: C* = (Ω/γ)^(1/3))")
    p.add_argument("--img-size", type=int, default=32, help="image side for --omega (default 32; ImageNet 224)")
    p.add_argument("--patch-size", type=int, default=4, help="patch side for --omega (default 4; ImageNet 14)")
    p.add_argument("--num-classes", type=int, default=10, help="classes for --omega (default 10)")
    p.add_argument("--batch-size", type=int, default=1, help="batch for FLOPs and memory (default 1)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "float64"], default="float32")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("visualize", help="weight pictures", description=cmd_visualize.__doc__)
    p.add_argument("kind", choices=["token-units", "patch-units", "sparsity"])
    p.add_argument("--model", help="a checkpoint file or a registered name (fresh weights); "
                                   "sparsity without a model draws the Fig. S.9 trio")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model option")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="picture option, e.g. --option block=1 --option num_units=16")
    p.add_argument("--out", required=True, metavar="FILE", help="the figure to write (.png or .svg)")
    p.add_argument("--seed", type=int, default=0, help="seed of fresh weights (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing figure")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_visualize)

    p = sub.add_parser("implicit-l1", help="numerical check of the implicit L1 bound (Prop. 3.3)",
                       description=cmd_implicit_l1.__doc__)
    p.add_argument("--S", type=int, default=3, help="tokens S (default 3)")
    p.add_argument("--C", type=int, default=3, help="channels C (default 3)")
    p.add_argument("--lam", type=float, default=0.5, help="L2 strength λ; the L1 side uses λ/(CS) (default 0.5)")
    p.add_argument("--samples", type=int, default=200, help="regression samples (default 200)")
    p.add_argument("--noise", type=float, default=0.1, help="label noise (default 0.1)")
    p.add_argument("--restarts", type=int, default=8, help="random starts of the non-convex side (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_implicit_l1)

    p = sub.add_parser("train", help="train a model; resumable run directories", description=cmd_train.__doc__)
    p.add_argument("config", nargs="?", help="a YAML preset (configs/*.yaml); defaults otherwise")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting, e.g. --set optim.lr=0.1 --set model.depth=4 --set data.name=digits")
    p.add_argument("--data-dir", help="where the data set lies (the same as --set data.data_dir=DIR)")
    p.add_argument("--run-dir", help="the run directory (default runs/<model>-<data>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    p.add_argument("--stop-after", type=int, metavar="N", help="stop after N epochs in this invocation (resumable)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("finetune", help="fine-tune a checkpoint at a higher resolution (Mixer supp. C)",
                       description=cmd_finetune.__doc__)
    p.add_argument("checkpoint", help="a checkpoint file or a run directory (its best checkpoint)")
    p.add_argument("--image-size", type=int, required=True, help="the new image side: an integer multiple of the old")
    p.add_argument("config", nargs="?", help="a YAML preset (e.g. configs/supp/finetune_cifar10.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a setting")
    p.add_argument("--data-dir", help="where the data set lies")
    p.add_argument("--run-dir", help="the run directory (default runs/<model>-<data>-<time>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("convert", help="convert Mixer weights: Flax .npz, timm .pth, pkmixer .pt",
                       description=cmd_convert.__doc__)
    p.add_argument("src", help="a Flax .npz (e.g. Google's imagenet21k/Mixer-B_16.npz), timm .pth or pkmixer .pt")
    p.add_argument("dst", help="the file to write; its suffix picks the format: .npz, .pth or .pt")
    p.add_argument("--model", help="the registered model the weights must fit (default: inferred from the shapes)")
    p.add_argument("--num-classes", type=int, help="a new zero head with this many classes")
    p.add_argument("--img-size", type=int, help="the image side (default: the checkpoint's, from its token count)")
    p.add_argument("--act", choices=["gelu", "gelu_tanh"],
                   help="the GELU of the model (default: gelu_tanh for a Flax .npz, as Listing 1's nn.gelu; gelu, the "
                        "exact one, for a timm .pth; a pkmixer .pt's own)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("throughput", help="images/s here beside supp. Table 2", description=cmd_throughput.__doc__)
    p.add_argument("--models", help="comma-separated registered models (default: the seven Mixers of Table 2)")
    p.add_argument("--quick", action="store_true", help="Mixer-S/32 and S/16, batch 2: a CPU check in seconds")
    p.add_argument("--batch-size", type=int, help="images per forward (default 64; 2 with --quick)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: CUDA when present)")
    p.add_argument("--warmup", type=int, help="untimed forwards first (default 3; 2 with --quick)")
    p.add_argument("--repeats", type=int, help="timed forwards, median taken (default 10; 2 with --quick)")
    p.add_argument("--image-size", type=int, help="measure at another resolution (a multiple of the patch)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_throughput)

    p = sub.add_parser("eval", help="evaluate a run or a checkpoint file", description=cmd_eval.__doc__)
    p.add_argument("target", help="a run directory written by `pkmixer train`, or a checkpoint file")
    p.add_argument("--checkpoint", choices=["best", "latest"], default="best", help="which of a run's checkpoints")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="for a checkpoint file: the data, e.g. --set data.name=cifar10 --set data.test_subset=1000")
    p.add_argument("--data-dir", help="for a checkpoint file: where the data set lies")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("reproduce", help="reproduce a figure or table of the paper: sweep, figures, report",
                       description=cmd_reproduce.__doc__)
    p.add_argument("name", nargs="?", help="a preset, e.g. fig5 (see --list)")
    p.add_argument("--list", action="store_true", help="list the presets and their number of runs per scale")
    p.add_argument("--scale", default="small", help="paper (the seed's settings), small (CPU minutes; default) "
                                                    "or smoke (seconds)")
    p.add_argument("--dataset", help="a data set the preset accepts (default: the scale's own)")
    p.add_argument("--data-dir", help="where the data set lies")
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local worker processes (default) or Ray tasks")
    p.add_argument("--address", help="the Ray cluster to join (default: start a local Ray instance)")
    p.add_argument("--workers", type=int, help="runs at a time (default: one per core, or per GPU)")
    p.add_argument("--threads", type=int, help="torch threads per run (default: the cores shared among local workers; 1 per Ray task)")
    p.add_argument("--seeds", type=int, help="seeds per point (default: the scale's own)")
    p.add_argument("--out", help="the output directory (default results/<name>-<scale>-<dataset>)")
    p.add_argument("--overwrite", action="store_true", help="replace a report made from other results")
    p.add_argument("--json", action="store_true", help="machine-readable output (progress goes to stderr)")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("report", help="re-render a reproduce directory's report without training",
                       description=cmd_report.__doc__)
    p.add_argument("dir", help="an output directory of `pkmixer reproduce`")
    p.add_argument("--overwrite", action="store_true", help="replace a report made from other results")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_report)
    for verb, p in sub.choices.items():
        if verb != "reproduce":  # reproduce's --threads: threads per run (and of the command itself)
            p.add_argument("--threads", type=int, metavar="N",
                           help=f"torch threads (default: ${THREADS_ENV}, else the idle cores, at most "
                                f"{MAX_DEFAULT_THREADS})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        torch.set_num_threads(_threads(args.threads))
        seed = getattr(args, "seed", None)
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"--seed must lie in [0, {MAX_SEED}], got {seed}")
        return args.func(args)
    except ConfigError as err:
        sys.stderr.write(f"pkmixer {args.verb}: error: {err}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
