"""The reproduction verbs: reproduce, report."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError, check_output_path
from ..train.config import COMPILE_MODES
from .common import MAX_THREADS, print_table


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Reproduce a figure or table of the paper: run its sweep (resumable: the same command again skips
    finished runs and resumes the others; local processes or Ray), then render the figures (PNG, SVG), tables
    (CSV) and report.md with the paper's claim, mean ± std over seeds and a verdict computed from the data."""
    from ..experiments.preset import SCALES, list_presets
    from ..experiments.reproduce import reproduce

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
        print_table([[r["name"], r["title"], r["source"],
                      *("-" if r["runs"][s] is None else r["runs"][s] for s in SCALES)] for r in records],
                    ["preset", "title", "source", *(f"runs {s}" for s in SCALES)])
        return 0
    if args.docs:
        return _regenerate_docs(args)
    if not args.name:
        raise ConfigError("name a preset (see `pkmixer reproduce --list`)")
    if args.check_regime:
        from ..experiments.reproduce import check_regime

        result = check_regime(args.name, scale=args.scale, dataset=args.dataset)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            hours = result["hours_on_2_cores"]
            print(f"{args.name} at {args.scale} scale on {result['dataset']}: {result['runs']} runs"
                  + (f", estimated {hours:.1f} h on 2 cores" if hours is not None else ""))
            print("\n".join(result["lines"]))
        return 0
    if args.data_dir is not None and Path(args.data_dir).exists() and not Path(args.data_dir).is_dir():
        raise ConfigError(f"--data-dir {args.data_dir} is not a folder")  # a missing one: the preset says where it looked
    for flag in ("workers", "threads", "seeds", "epochs"):  # below 1: the sweep's own message
        value = getattr(args, flag)
        if value is not None and value > MAX_THREADS:
            raise ConfigError(f"--{flag} must be at most {MAX_THREADS}, got {value}")
    if args.out is not None:
        check_output_path(args.out, "--out", folder=True)

    def log(message: str) -> None:  # progress on stderr when stdout carries JSON
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    result = reproduce(args.name, scale=args.scale, dataset=args.dataset, data_dir=args.data_dir,
                       backend=args.backend, address=args.address, workers=args.workers, threads=args.threads,
                       out=args.out, seeds=args.seeds, epochs=args.epochs, overwrite=args.overwrite, log=log,
                       stack=args.stack, compile_mode=args.compile)
    return _print_report(result, args.json)


def _regenerate_docs(args: argparse.Namespace) -> int:
    """`pkmixer reproduce --docs`: docs/reproduction.md's medium-scale verdicts from reproduction/ alone."""
    from ..experiments import docs
    from ..experiments.records import records_dir

    if args.name:
        raise ConfigError("--docs regenerates every preset's verdicts; drop the preset name")
    folder = records_dir()
    root = folder.parent if folder is not None else Path.cwd()
    doc = root / "docs" / "reproduction.md"
    if not doc.is_file():
        raise ConfigError(f"no {doc}: run --docs in a source checkout")
    try:
        changed = docs.update(doc, folder, root)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(f"{doc}: {'regenerated' if changed else 'already up to date'} from {folder or 'no records'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Render the report of a `pkmixer reproduce` output directory again from its finished runs, without
    training (e.g. after editing a preset's analysis, or from copied results)."""
    from ..experiments.reproduce import rerender

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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The sub-commands of this group, in the order `pkmixer --help` lists them."""
    p = sub.add_parser("reproduce", help="reproduce a figure or table of the paper: sweep, figures, report",
                       description=cmd_reproduce.__doc__)
    p.add_argument("name", nargs="?", help="a preset, e.g. fig5 (see --list)")
    p.add_argument("--list", action="store_true", help="list the presets and their number of runs per scale")
    p.add_argument("--scale", default="small", help="paper (the seed's settings), medium (decides on a CPU: "
                   "at most 2 h on 2 cores; fig2, fig2d, fig4-fig7, figs1-figs8, suppa1, table1), small (the quick "
                   "look, CPU minutes; default) or smoke (seconds)")
    p.add_argument("--dataset", help="a data set the preset accepts (default: the scale's own)")
    p.add_argument("--data-dir", help="where the data set lies")
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local worker processes (default) or Ray tasks")
    p.add_argument("--address", help="the Ray cluster to join (default: start a local Ray instance)")
    p.add_argument("--workers", type=int, help="runs at a time (default: one per core, or per GPU; more than the GPUs share them round-robin)")
    p.add_argument("--threads", type=int, help="torch threads per run (default: the cores shared among local workers; 1 per Ray task)")
    p.add_argument("--seeds", type=int, help="seeds per point (default: the scale's own)")
    p.add_argument("--epochs", type=int, help="train each run for this many epochs instead of the scale's own "
                   "(the epoch-doubling runs for twice as many); the default --out gains -e<N>")
    p.add_argument("--out", help="the output directory (default results/<name>-<scale>[-e<N>]-<dataset>)")
    p.add_argument("--overwrite", action="store_true", help="replace a report made from other results")
    p.add_argument("--stack", action="store_true", help="train the runs that differ only in their seeds, learning "
                   "rate and weight decay as one stacked model each (pays on a GPU; each run's row records its stack)")
    p.add_argument("--compile", choices=COMPILE_MODES, help="train each run under torch.compile in this mode "
                   "(reduce-overhead: CUDA graphs, which pay for the small launch-bound models on a GPU)")
    p.add_argument("--check-regime", action="store_true", help="print whether the scale's runs reach the claim's "
                   "regime (from their configs) and their estimated time, without training")
    p.add_argument("--docs", action="store_true", help="regenerate docs/reproduction.md's medium-scale verdicts and "
                   "figures from the results kept in reproduction/, without training")
    p.add_argument("--json", action="store_true", help="machine-readable output (progress goes to stderr)")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("report", help="re-render a reproduce directory's report without training",
                       description=cmd_report.__doc__)
    p.add_argument("dir", help="an output directory of `pkmixer reproduce`")
    p.add_argument("--overwrite", action="store_true", help="replace a report made from other results")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_report)
