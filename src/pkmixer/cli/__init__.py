"""The ``pkmixer`` command line: thin verbs over the library. Bad input: one line on stderr, exit status 2.

The verbs live in one module per group - :mod:`.models` (models, effective, width, spectrum, cka, cost,
visualize, implicit-l1), :mod:`.train` (train, finetune, convert, throughput, eval), :mod:`.experiments`
(reproduce, report) - each parsing its arguments, calling the library and printing; this module assembles the
parser, sets the torch threads and turns a :class:`~pkmixer.errors.ConfigError` into one line on stderr.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

import torch

from ..errors import ConfigError
from . import experiments, models, train
from ..train.config import MAX_SEED
from .common import MAX_THREADS

# torch threads of a command (`--threads N`, else PKMIXER_THREADS, else default_threads())
THREADS_ENV = "PKMIXER_THREADS"
MAX_DEFAULT_THREADS = 8  # small models gain little beyond this; each thread is one more to wait for at a barrier


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


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb; each runs ``args.func(args)``."""
    parser = _Parser(prog="pkmixer", description="MLP-Mixers as wide and sparse MLPs (Hayase & Karakida 2024).")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for group in (models, train, experiments):
        group.add_parsers(sub)
    for verb, p in sub.choices.items():
        if verb != "reproduce":  # reproduce's --threads: threads per run (and of the command itself)
            p.add_argument("--threads", type=int, metavar="N",
                           help=f"torch threads (default: ${THREADS_ENV}, else the idle cores, at most "
                                f"{MAX_DEFAULT_THREADS})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; the exit status (2: bad input, refused before any work; 1: a fault of the machine -
    no space, no permission, a path that vanished - with every file whole: :func:`.common.refusal`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        torch.set_num_threads(_threads(args.threads))
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
