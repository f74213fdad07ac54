"""The ``pkmixer`` command line: thin verbs over the library. Bad input: one line on stderr, exit status 2.

The verbs live in one module per group - :mod:`.models` (models, effective, width, spectrum, cka, cost,
visualize, implicit-l1), :mod:`.train` (train, finetune, convert, throughput, eval), :mod:`.experiments`
(reproduce, report) - each parsing its arguments, calling the library and printing; this module assembles the
parser, sets the torch threads (:mod:`.threads`) and turns a :class:`~pkmixer.errors.ConfigError` into one line on
stderr. Nothing here or in the verbs' modules imports torch at module level: each verb imports the library it
calls, so ``pkmixer --help`` and every verb's ``--help`` start at once.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from ..errors import ConfigError
from . import experiments, models, train
from ..train.config import MAX_SEED
from .threads import MAX_DEFAULT_THREADS, THREADS_ENV, default_threads, set_torch_threads  # noqa: F401


def installed_version() -> str:
    """The version of the installed pkmixer distribution (pyproject reads it from ``pkmixer.__version__``)."""
    try:
        return metadata.version("pkmixer")
    except metadata.PackageNotFoundError:
        return "(not installed: pip install .)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb; each runs ``args.func(args)``."""
    parser = _Parser(prog="pkmixer", description="MLP-Mixers as wide and sparse MLPs (Hayase & Karakida 2024).")
    parser.add_argument("--version", action="version", version=f"pkmixer {installed_version()}")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for group in (models, train, experiments):
        group.add_parsers(sub)
    for verb, p in sub.choices.items():
        if verb != "reproduce":  # reproduce's --threads: threads per run (and of the command itself)
            p.add_argument("--threads", type=int, metavar="N",
                           help=f"torch threads (default: ${THREADS_ENV}, else $OMP_NUM_THREADS, else the idle "
                                f"cores shared among torchrun's local processes, at most {MAX_DEFAULT_THREADS})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; the exit status (2: bad input, refused before any work; 1: a fault of the machine -
    no space, no permission, a path that vanished - with every file whole: :func:`.common.refusal`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        set_torch_threads(args.threads)
        # a count the user chose (not the load-dependent default): `train --resume` keeps the run's own otherwise
        args.threads_chosen = args.threads is not None or bool(os.environ.get(THREADS_ENV, "").strip())
        seed = getattr(args, "seed", None)
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"--seed must lie in [0, {MAX_SEED}], got {seed}")
        return args.func(args)
    except Exception as err:  # bad input or a fault of the machine: one line; anything else: its traceback
        from .common import refusal

        known = refusal(err, args)
        if known is None:
            raise
        sys.stderr.write(f"pkmixer {args.verb}: error: {known[1]}\n")
        return known[0]
