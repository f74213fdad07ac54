"""The ``pkmixer`` command line: thin verbs over the library. Bad input: one line on stderr, exit status 2."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from .errors import ConfigError
from .models.registry import create_model, list_models, model_entry
from .overrides import parse_overrides

# explicit sparse matrices in float64 beyond this many non-zeros take too long and too much memory
MAX_EFFECTIVE_NNZ = 50_000_000


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
    if args.batch <= 0:
        raise ConfigError(f"--batch must be positive, got {args.batch}")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        sys.stderr.write(f"pkmixer {args.verb}: error: {err}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
