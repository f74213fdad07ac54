"""Run the benchmark suite: ``python -m benchmarks.run [--mode quick|full] [--sections abcdefghnsw] [--device D]``.

Writes ``<out-dir>/<machine>-<mode>-<UTC timestamp>.json`` and a ``.md`` beside it; never overwrites a file
(exit 2 if the name exists). Bad input: one line on stderr, exit 2. See :mod:`benchmarks` for the sections.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from datetime import datetime, timezone

import torch

from .common import SWEEP_CASES, BenchError, Settings, machine, retain_freed_memory, threads

SECTIONS = "abcdefghnsw"
MODES = {"smoke": dict(warmup=0, repeats=2), "quick": dict(warmup=1, repeats=3), "full": dict(warmup=2, repeats=7)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="quick",
                    help="quick (a few minutes on 2 CPU cores), full, or smoke (toy sizes, for tests)")
    ap.add_argument("--sections", default=None, help="any of the letters abcdefghnsw (f needs a; h and w need "
                    "--device cuda, or --mode smoke; default: all that the device runs)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (bf16 autocast; not measured on the CPU box)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per case (default: by mode)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed warm-up rounds (default: by mode)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile cases")
    ap.add_argument("--sweep-cases", default=",".join(SWEEP_CASES), help="section w's cases: eager, stacked (seeds "
                    "as one stack), graphs (CUDA graphs, run.compile_mode=reduce-overhead), stacked-graphs; "
                    "comma-separated (default: all)")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--name", default=None, help="file stem (default: <host>-<mode>-<UTC timestamp>)")
    return ap.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    if args.mode not in MODES:
        raise BenchError(f"--mode must be one of {', '.join(MODES)}, got {args.mode!r}")
    if args.sections is None:
        args.sections = SECTIONS if args.device == "cuda" else SECTIONS.replace("h", "").replace("w", "")
    if not args.sections or any(c not in SECTIONS for c in args.sections):
        raise BenchError(f"--sections must be letters among {SECTIONS}, got {args.sections!r}")
    if "f" in args.sections and "a" not in args.sections:
        raise BenchError("section f reads section a's measurements: add a to --sections")
    for key in "hw":
        if key in args.sections and args.device != "cuda" and args.mode != "smoke":
            raise BenchError(f"section {key} projects a GPU sweep: add --device cuda (or --mode smoke to check its "
                             "code)")
    if args.device not in ("cpu", "cuda"):
        raise BenchError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda asked for, but torch sees no CUDA device here")
    n = (os.cpu_count() or 1) if args.threads is None else args.threads
    for flag, value in (("--threads", n), ("--repeats", args.repeats), ("--warmup", args.warmup)):
        if value is not None and (value < (0 if flag == "--warmup" else 1)):
            raise BenchError(f"{flag} must be {'non-negative' if flag == '--warmup' else 'positive'}, got {value}")
    cases = tuple(args.sweep_cases.split(","))
    if not cases or any(c not in SWEEP_CASES for c in cases):
        raise BenchError(f"--sweep-cases must be among {', '.join(SWEEP_CASES)}, comma-separated; got "
                         f"{args.sweep_cases!r}")
    mode = MODES[args.mode]
    return Settings(mode=args.mode, device=args.device, dtype="bfloat16" if args.device == "cuda" else "float32",
                    threads=n, warmup=mode["warmup"] if args.warmup is None else args.warmup,
                    repeats=mode["repeats"] if args.repeats is None else args.repeats, compile=not args.no_compile,
                    sweep_cases=cases)


def output_paths(args: argparse.Namespace, settings: Settings) -> tuple[str, str]:
    stem = args.name or "{}-{}-{}".format(re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()), settings.mode,
                                          datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stem):
        raise BenchError(f"--name may hold letters, digits, '_', '.', '-' only, got {stem!r}")
    paths = tuple(os.path.join(args.out_dir, stem + ext) for ext in (".json", ".md"))
    for path in paths:
        if os.path.exists(path):
            raise BenchError(f"{path} exists; pick another --name (results are never overwritten)")
    return paths


def run(settings: Settings, sections: str, log=print) -> dict:
    """Run ``sections`` and return the result dict (the JSON file's content)."""
    from . import engine, gpu, layers, mixers, narrow, report, sparse, stack, sweep

    started = time.time()
    if settings.device == "cpu":
        retain_freed_memory()
    with threads(settings.threads):
        result = {"schema": "pkmixer-bench/1", "settings": settings.__dict__ | {"sections": sections},
                  "machine": machine(settings),
                  "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "sections": {}}
        runners = {"a": mixers.section_a, "b": mixers.section_b, "c": sparse.section_c, "d": layers.section_d,
                   "e": layers.section_e, "g": engine.section_g,
                   "h": gpu.section_h, "n": narrow.section_n, "s": stack.section_s, "w": sweep.section_w}
        for key in sections:
            if key == "f":
                continue
            t = time.time()
            log(f"section {key} ...", flush=True)
            result["sections"][key] = runners[key](settings)
            log(f"section {key}: {time.time() - t:.0f} s", flush=True)
        if "f" in sections:
            result["sections"]["f"] = mixers.section_f(result["sections"]["a"])
    result["elapsed_s"] = time.time() - started
    result["load_average_end"] = os.getloadavg()
    result["targets"] = report.targets(result)
    return result


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        settings = settings_from(args)
        json_path, md_path = output_paths(args, settings)
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from . import report

    result = run(settings, "".join(c for c in SECTIONS if c in args.sections),
                 log=lambda *a, **k: print(*a, file=sys.stderr, **k))
    os.makedirs(args.out_dir, exist_ok=True)
    for path, text in ((json_path, json.dumps(result, indent=1)), (md_path, report.markdown(result))):
        with open(path, "x") as f:  # "x": never overwrite
            f.write(text)
    print(report.markdown(result))
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
