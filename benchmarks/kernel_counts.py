"""Instructions the fused sublayers' kernel runs: ``python -m benchmarks.kernel_counts [--out FILE.json]``.

Builds ``src/pkmixer/kernels/residual_gelu_norm.c`` with the loader's flags (:mod:`pkmixer.kernels`) into a small C
driver that calls its forward and its backward once on random (rows, n) streams, runs the driver under valgrind's
callgrind, collecting inside one entry point at a time (``--toggle-collect``, the functions it calls included), and
sorts the instructions executed by kind from objdump's disassembly of the driver: vector arithmetic, vector loads,
stores and moves, the rest (scalar, integer, branches), and calls into the C library. Per vector = instructions over
the stream's floats in vectors of the build's width (8 floats below AVX-512, 16 with it). Unlike a timing, a count
does not depend on the machine's load or clock: it says what the code does per number, the same on every run of a
build (docs/performance.md, section (n)). The layouts are the streams of section (n)'s models: the CIFAR S-Mixer's
(128, 64, 64) with a channel and a token bias, the square grid model's (128, 32, 32), and the (8, 87) and (4, 126)
grid models' packed rows, with a channel bias and with the token bias of their sequence-first stream.

Needs the C compiler, valgrind and objdump; where one is missing, one line on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from pkmixer import kernels

# (n, rows, period, repeat): period 0 for a channel bias, S for a token bias, one per row of a (B, S, C) stream
# (repeat 1) or per run of B rows of the sequence-first (S, B, C) stream of a narrow S-Mixer (repeat B)
LAYOUTS = ((64, 8192, 0, 1), (64, 8192, 64, 1), (32, 4096, 0, 1), (8, 11136, 0, 1), (8, 11136, 87, 128),
           (4, 16128, 0, 1), (4, 16128, 126, 128))
ENTRY_POINTS = {"forward": "pkmixer_residual_gelu_norm_forward", "backward": "pkmixer_residual_gelu_norm_backward"}

DRIVER = r"""
#include <stdlib.h>
int main(int argc, char** argv) {
    if (argc != 5) return 2;
    const ptrdiff_t n = atoi(argv[1]), rows = atoi(argv[2]), period = atoi(argv[3]), repeat = atoi(argv[4]);
    const size_t count = (size_t)rows * (size_t)n;
    float* s[8]; /* x, z, y, u, gy, gu, gx, gz */
    for (int i = 0; i < 8; ++i) {
        if (!(s[i] = malloc(count * sizeof(float)))) return 1;
        for (size_t j = 0; j < count; ++j) s[i][j] = 4.0f * (float)rand() / (float)RAND_MAX - 2.0f;
    }
    float *mean = malloc((size_t)rows * sizeof(float)), *rstd = malloc((size_t)rows * sizeof(float));
    static float bias[2048], weight[2048], beta[2048], gweight[2048], gbeta[2048], gbias[2048];
    for (int i = 0; i < 2048; ++i) bias[i] = 0.1f, weight[i] = 1.0f, beta[i] = 0.0f;
    if (!mean || !rstd) return 1;
    if (pkmixer_residual_gelu_norm_forward(s[0], s[1], bias, period, repeat, weight, beta, s[2], s[3], mean, rstd,
                                           rows, n, 1e-6f))
        return 1;
    return pkmixer_residual_gelu_norm_backward(s[4], s[5], s[2], mean, rstd, weight, s[1], bias, period, repeat,
                                               s[6], s[7], gweight, gbeta, gbias, rows, n);
}
"""

_ARITHMETIC = re.compile(r"v(f?n?m(add|sub)|mul|add|sub|div|sqrt|rcp|rsqrt|max|min|cvt|round|hadd|psll|psrl|psra"
                         r"|padd|psub|pmul|and|andn|or|xor|pand|pandn|por|pxor|cmp|pcmp|blend|pblend)")
_MOVES = re.compile(r"v(mov|broadcast|pbroadcast|insert|extract|perm|shuf|unpck|pshuf|gather|maskmov)")


def _kind(mnemonic: str | None) -> str:
    if mnemonic is None:
        return "C library"
    if _MOVES.match(mnemonic):
        return "vector moves, loads, stores"
    if _ARITHMETIC.match(mnemonic):
        return "vector arithmetic"
    return "scalar, integer, branches"


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise SystemExit(f"benchmarks.kernel_counts: {tool} not found on PATH")
    return found


def build(directory: Path) -> tuple[Path, int]:
    """The driver with the kernel compiled in (a position-dependent executable, so that objdump's addresses are the
    run's), and the build's vector width in floats."""
    flags = [f for f in kernels._flags() if f not in ("-shared", "-fPIC")]
    source = directory / "driver.c"
    kernel = resources.files("pkmixer.kernels").joinpath("residual_gelu_norm.c").read_text()
    source.write_text(kernel + DRIVER)
    out = directory / "driver"
    compiler = kernels._compiler()
    if compiler is None:
        raise SystemExit("benchmarks.kernel_counts: no C compiler on PATH")
    done = subprocess.run([compiler[0], *flags, "-no-pie", str(source), "-o", str(out), "-lm"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks.kernel_counts: the driver did not build: {done.stderr.strip()[-300:]}")
    return out, 16 if "-march=x86-64-v4" in flags else 8


def mnemonics(binary: Path) -> dict[int, str]:
    """Each instruction's address in the driver and its mnemonic."""
    text = subprocess.run([_need("objdump"), "-d", "--no-show-raw-insn", str(binary)], capture_output=True,
                          text=True, check=True).stdout
    found = {}
    for line in text.splitlines():
        m = re.match(r"\s+([0-9a-f]+):\s+(\S+)", line)
        if m:
            found[int(m.group(1), 16)] = m.group(2)
    return found


def instructions(profile: Path) -> collections.Counter:
    """Instructions executed at each address, from callgrind's output with --dump-instr=yes --dump-line=no (its
    compressed positions: absolute, +offset or -offset from the line before; a call's inclusive cost, on the line
    after ``calls=``, is skipped, its callee's own lines count)."""
    counts: collections.Counter = collections.Counter()
    address, after_call = 0, False
    for line in profile.read_text().splitlines():
        if line.startswith("calls="):
            after_call = True
            continue
        m = re.match(r"^(0x[0-9a-f]+|[+-]\d+|\*)\s+(\d+)", line)
        if not m:
            continue
        position = m.group(1)
        if position.startswith("0x"):
            address = int(position, 16)
        elif position != "*":
            address += int(position)
        if after_call:
            after_call = False
            continue
        counts[address] += int(m.group(2))
    return counts


def count(driver: Path, layout: tuple[int, int, int, int], directory: Path, names: dict[int, str]) -> dict:
    """Per entry point: the instructions executed, in all and by kind."""
    out = {}
    for direction, entry in ENTRY_POINTS.items():
        profile = directory / f"{direction}-{'-'.join(map(str, layout))}.out"
        subprocess.run([_need("valgrind"), "--tool=callgrind", f"--toggle-collect={entry}", "--dump-instr=yes",
                        "--dump-line=no", f"--callgrind-out-file={profile}", str(driver), *map(str, layout)],
                       capture_output=True, check=True)
        by_kind: collections.Counter = collections.Counter()
        for address, executed in instructions(profile).items():
            by_kind[_kind(names.get(address))] += executed
        out[direction] = {"instructions": sum(by_kind.values()), "by_kind": dict(by_kind)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel_counts", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="also write the counts as JSON here (never overwritten)")
    args = ap.parse_args(argv)
    try:
        if args.out is not None and args.out.exists():
            raise SystemExit(f"benchmarks.kernel_counts: {args.out} exists")
        for tool in ("valgrind", "objdump"):
            _need(tool)
        rows_out = []
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            driver, width = build(directory)
            names = mnemonics(driver)
            print(f"{'(n, rows, bias, repeat)':<32} {'per vector of ' + str(width) + ' floats: forward':>36}  "
                  "backward")
            for n, rows, period, repeat in LAYOUTS:
                counted = count(driver, (n, rows, period, repeat), directory, names)
                vectors = rows * n / width
                row = {"n": n, "rows": rows, "bias": "token" if period else "channel", "repeat": repeat,
                       "floats_per_vector": width, "vectors": vectors, **counted}
                rows_out.append(row)
                cells = []
                for direction in ENTRY_POINTS:
                    c = counted[direction]
                    arithmetic = c["by_kind"].get("vector arithmetic", 0)
                    cells.append(f"{c['instructions'] / vectors:6.1f} ({arithmetic / vectors:5.1f} arithmetic)")
                print(f"{str((n, rows, row['bias'], repeat)):<32} {cells[0]:>36}  {cells[1]}")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            raise
        print(exc.code, file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(json.dumps({"flags": list(kernels._flags()), "compiler": kernels._compiler()[1],
                                        "rows": rows_out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
