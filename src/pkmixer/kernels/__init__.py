"""Small C kernels, compiled with the system's C compiler on first use and cached.

Each ``<name>.c`` beside this module is built once per machine into a shared library under the cache directory
(``$PKMIXER_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/pkmixer/kernels``, else ``~/.cache/pkmixer/kernels``),
named by a hash of its source, the compiler's version and the flags, and loaded with :mod:`ctypes`. The flags
target the x86-64 level torch's own CPU kernels use on this machine (``-march=x86-64-v4`` with AVX-512,
``x86-64-v3`` with AVX2, the compiler's default otherwise), with ``-ffp-contract=off`` so that the results do not
depend on that level. Builds write to a temporary file and rename it, so concurrent processes (a sweep's workers)
never load a half-written library.

Where a kernel cannot be had - no compiler (``$CC``, else ``cc``), a failed build, an unwritable cache,
``PKMIXER_NATIVE_KERNELS=0``, or for the kernels of :data:`NEEDS_FMA` an x86-64 CPU below AVX2 - :func:`load`
returns None, the first time with a warning that says why, and the layers that use it run torch's own operators
instead (same results up to float rounding). :func:`describe` is the line a run's environment records.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from importlib import resources
from pathlib import Path

import torch

SWITCH = "PKMIXER_NATIVE_KERNELS"
_BASE_FLAGS = ("-O3", "-std=c99", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno")
_LEVELS = {"AVX512": "-march=x86-64-v4", "AVX2": "-march=x86-64-v3"}


def cache_dir() -> Path:
    """Where built kernels are kept (module docstring)."""
    if os.environ.get("PKMIXER_KERNEL_CACHE"):
        return Path(os.environ["PKMIXER_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pkmixer" / "kernels"


def _x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def _level() -> str | None:
    """The -march flag of the x86-64 level torch's kernels use here, or None (the compiler's default)."""
    return _LEVELS.get(torch.backends.cpu.get_cpu_capability()) if _x86() else None


def _flags() -> tuple[str, ...]:
    level = _level()
    return (*_BASE_FLAGS, *((level,) if level else ()))


def _compiler() -> tuple[str, str] | None:
    """(the compiler's path, its version line), or None."""
    found = shutil.which(os.environ.get("CC") or "cc")
    if found is None:
        return None
    try:
        done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (found, done.stdout.splitlines()[0]) if done.returncode == 0 and done.stdout else None


# Kernels whose arithmetic is mostly fused multiply-adds (fmaf): on an x86-64 machine without them in hardware (below
# AVX2) the C library computes each in software, and the kernel runs slower than torch's operators.
NEEDS_FMA = frozenset({"residual_gelu_norm"})


def _build(name: str) -> tuple[ctypes.CDLL, str]:
    """Build (or find) and load ``<name>.c``: (the library, a line describing it); RuntimeError with the reason."""
    if os.environ.get(SWITCH, "1") == "0":
        raise RuntimeError(f"{SWITCH}=0")
    if name in NEEDS_FMA and _x86() and _level() is None:
        raise RuntimeError("not used on an x86-64 CPU without AVX2 and FMA (its fused multiply-adds would run in "
                           "software)")
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError(f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH")
    source = resources.files(__name__).joinpath(f"{name}.c").read_bytes()
    flags = _flags()
    key = hashlib.sha256(b"\0".join([source, compiler[1].encode(), *(f.encode() for f in flags)])).hexdigest()[:16]
    target = cache_dir() / f"{name}-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
                src.write_bytes(source)
                done = subprocess.run([compiler[0], *flags, str(src), "-o", str(out), "-lm"], capture_output=True,
                                      text=True, timeout=120)
                if done.returncode != 0:
                    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                    raise RuntimeError(f"{compiler[0]} failed: {last}")
                os.replace(out, target)
        except OSError as exc:
            raise RuntimeError(f"cannot build under {target.parent}: {exc}") from None
    return ctypes.CDLL(str(target)), f"{compiler[1]}, {' '.join(flags)}"


@functools.cache
def _loaded(name: str) -> tuple[ctypes.CDLL | None, str]:
    try:
        return _build(name)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return None, f"unavailable ({exc})"


_warned: set[str] = set()


def load(name: str) -> ctypes.CDLL | None:
    """The kernel library ``<name>.c``, built on first use; None where it cannot be had, with a warning the first
    time (module docstring)."""
    lib, line = _loaded(name)
    if lib is None and name not in _warned:
        _warned.add(name)
        warnings.warn(f"pkmixer: the C kernel {name!r} is {line}; torch's operators run instead", RuntimeWarning,
                      stacklevel=3)
    return lib


def describe(name: str) -> str:
    """One line for a run's environment: the compiler and flags the kernel was built with, or why it is
    unavailable (without a warning: a run whose model does not use the kernel records it too)."""
    return _loaded(name)[1]


def through_operator(x: torch.Tensor) -> bool:
    """Whether a kernel's layer must call its ``torch.ops.pkmixer`` operator rather than its eager autograd Function on
    x: a tensor subclass (fake tensors, wrappers), JIT tracing and torch.compile see one opaque node whose forward and
    backward choose the kernel or torch's operators themselves. (TorchScript, which cannot run this check, calls the
    operator in a branch of its own.)"""
    return type(x) is not torch.Tensor or torch.jit.is_tracing() or torch.compiler.is_compiling()


def functorch_wrapped(x: torch.Tensor) -> bool:
    """Whether x is a torch.func transform's wrapper (vmap, grad), which has no storage for a kernel to read."""
    check = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return bool(check and check(x))
