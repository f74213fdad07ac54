"""The model and theory verbs: models, effective, width, spectrum, cka, cost, visualize, implicit-l1. Each imports
the library it calls (torch, the models) itself, so that building the parser imports neither."""
from __future__ import annotations

import argparse
import json
import math

from ..errors import ConfigError
from ..overrides import parse_overrides
from .common import (MAX_BATCH, MAX_CKA_EXAMPLES, MAX_COUNT, MAX_SPECTRUM_WIDTH, bounded, csv_values, data_dir_arg,
                     fresh_output, load_model_arg, print_table)


def cmd_models(args: argparse.Namespace) -> int:
    """The zoo with parameters, S, C, γ, Ω and effective width (built on the meta device: no memory)."""
    import torch

    from ..models.registry import create_model, list_models, model_entry

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
    print_table(rows, ["model", "family", "params", "S", "C", "γ", "Ω/layer", "width m", "max width", "density"])
    return 0


def cmd_effective(args: argparse.Namespace) -> int:
    """Build a small instance, its effective wide MLP, and the relative error between their outputs."""
    from ..analysis.equivalence import effective_check

    overrides = parse_overrides(args.set)
    bounded("--batch", args.batch, 1, MAX_BATCH)
    result = effective_check(args.name, overrides, batch=args.batch, seed=args.seed)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print_table([[l["name"], "x".join(map(str, l["shape"])), l["nnz"], f"{l['density']:.3g}"]
                 for l in result["layers"]], ["effective layer", "shape", "non-zeros", "density"])
    print(f"\n{args.name}: effective width m = {result['effective_width']}; relative error between the model and "
          f"its effective MLP (float64, batch {args.batch}): {result['relative_error']:.3e}")
    return 0


def cmd_width(args: argparse.Namespace) -> int:
    """The fixed-Ω calculus (Sec. 4.1, Eqs. 13-15, S.43, S.45): S for each C, SW-MLP widths, the optimum."""
    from ..theory.width import width_summary, width_table

    if args.C is not None and args.pairs is not None:
        raise ConfigError("give --C or --pairs, not both")
    bounded("--pairs", args.pairs, 1, 10_000)
    bounded("--c-min", args.c_min, 1, MAX_COUNT)
    channels = None if args.C is None else csv_values(args.C, int, "--C")
    densities = None if args.density is None else csv_values(args.density, float, "--density")
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
    print_table([[r["kind"], r["C"] or "-", r["S"] or "-", r["m"], f"{r['p']:.4g}", f"{r['omega']:.6g}"]
                 for r in rows], ["kind", "C", "S", "m", "density p", "Ω (exact)"])
    return 0


def cmd_spectrum(args: argparse.Namespace) -> int:
    """λ_max of SW-MLP random weights against width at fixed Ω, with √L₊ and the Mixer's c_γ (Fig. 4 right)."""
    from ..analysis.plots import plot_lambda_max
    from ..theory.spectrum import spectrum_report

    fresh_output(args.plot, args.overwrite)
    widths = None if args.widths is None else csv_values(args.widths, int, "--widths")
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
    print_table([[r["m"], f"{r['p']:.4g}", f"{r['q']:.3g}", f"{r['lambda_max_mean']:.4f} ± {r['lambda_max_std']:.4f}",
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
    import torch

    from ..analysis.cka import check_inputs, compare_models, plot_cka

    fresh_output(args.plot, args.overwrite)
    data_dir_arg(args.data_dir)
    for flag in ("--batches", "--batch-size"):
        bounded(flag, getattr(args, flag[2:].replace("-", "_")), 1, MAX_CKA_EXAMPLES)
    if args.batches * args.batch_size > MAX_CKA_EXAMPLES:
        raise ConfigError(f"--batches x --batch-size is {args.batches * args.batch_size} examples, more than "
                          f"{MAX_CKA_EXAMPLES}")
    check_inputs(args.data)
    torch.manual_seed(args.seed)  # fresh weights of registered names
    model_a, model_b = (load_model_arg(text, {}) for text in (args.a, args.b))
    result = compare_models(model_a, model_b, data=args.data, batches=args.batches, batch_size=args.batch_size,
                            seed=args.seed, data_dir=args.data_dir, where=args.where, labels=(args.a, args.b))
    out = result.as_dict()
    if args.plot:
        out["plot"] = str(plot_cka(result, args.plot))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_table([[name, *(f"{v:.3f}" for v in row)] for name, row in zip(result.names_a, result.matrix)],
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
    import torch

    from ..analysis.cost import cost_table, fixed_omega_comparison

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
             "float64": torch.float64}[args.dtype]
    bounded("--batch-size", args.batch_size, 1, MAX_COUNT)
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
                bounded(f"--{key.replace('_', '-')}", getattr(args, key), 1, MAX_COUNT)
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

    print_table([[r.model, si(r.params), f"{r.connections:.3g}", si(r.macs), si(r.train_flops),
                  si(r.param_bytes + r.buffer_bytes, "B"), si(r.train_state_bytes, "B"),
                  si(r.activation_bytes_per_image, "B")] for r in reports],
                ["model", "params", "Ω/layer", "MACs/img", f"train FLOPs (batch {args.batch_size})",
                 "weights", "train state", "activations/img"])
    return 0


def cmd_visualize(args: argparse.Namespace) -> int:
    """Weight pictures: token-mixing units, per-patch units (Mixer supp. D), effective sparsity (Fig. 1, S.9)."""
    import torch

    from ..analysis.visualize import visualize

    fresh_output(args.out, args.overwrite)
    if args.set and args.model is None:
        raise ConfigError("--set applies to --model; without a model there is nothing to set")
    options = parse_overrides(args.option)
    torch.manual_seed(args.seed)
    model = None if args.model is None else load_model_arg(args.model, parse_overrides(args.set))
    path = visualize(args.kind, args.out, model, **options)
    print(json.dumps({"figure": str(path)}) if args.json else f"figure: {path}")
    return 0


def cmd_implicit_l1(args: argparse.Namespace) -> int:
    """Prop. 3.3 on a small regression: L2-regularised Kronecker optimum ≥ L1-regularised dense optimum."""
    from ..theory.regularization import implicit_l1_report

    for flag, value, high in (("--S", args.S, 1024), ("--C", args.C, 1024), ("--samples", args.samples, 10**6),
                              ("--restarts", args.restarts, 1000)):
        bounded(flag, value, 1, high)
    bounded("--lam", args.lam, 0, math.inf)
    bounded("--noise", args.noise, 0, math.inf)
    report = implicit_l1_report(S=args.S, C=args.C, lam=args.lam, n_samples=args.samples, noise=args.noise,
                                seed=args.seed, restarts=args.restarts)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for key, value in report.items():
        print(f"{key:>28}: {value:.6g}" if isinstance(value, float) else f"{key:>28}: {value}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The sub-commands of this group, in the order `pkmixer --help` lists them."""
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
