"""The torch thread count of a command: ``--threads N``, else ``$PKMIXER_THREADS``, else ``$OMP_NUM_THREADS`` (the
OpenMP convention; its first entry where it lists one per nesting level), else the idle cores
(:func:`default_threads`), shared among the processes of this node under torchrun (``$LOCAL_WORLD_SIZE``)."""
from __future__ import annotations

import math
import os

from ..errors import ConfigError
from .common import MAX_THREADS

THREADS_ENV = "PKMIXER_THREADS"
OMP_ENV = "OMP_NUM_THREADS"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"  # torchrun: the processes on this node
MAX_DEFAULT_THREADS = 8  # small models gain little beyond this; each thread is one more to wait for at a barrier


def default_threads(local_processes: int = 1) -> int:
    """The cores of this process's CPU set that were idle over the last minute (cores minus the 1-minute load
    average, rounded up), divided among ``local_processes`` (floor), at least 1 and at most
    :data:`MAX_DEFAULT_THREADS`. OpenMP threads wait for each other at every parallel region, so a thread that
    shares its core with another busy process slows the whole step down (2-thread runs measured 3-10x slower than
    1-thread runs on 2 loaded cores); leaving busy cores alone costs at most the parallel speed-up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        busy = math.ceil(os.getloadavg()[0] - 0.25)  # a little noise is not a busy core
    except OSError:
        busy = 0
    return max(1, min(MAX_DEFAULT_THREADS, (cores - max(0, busy)) // local_processes))


def _env_count(name: str, first_of_list: bool = False) -> int | None:
    """A positive whole number from the environment; None where the variable is unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    head = text.split(",")[0].strip() if first_of_list else text
    try:
        return int(head)
    except ValueError:
        raise ConfigError(f"{name}={text!r} must be a whole number of threads"
                          + (" (or a comma-separated list, one per nesting level)" if first_of_list else "")) \
            from None


def chosen_threads(value: int | None) -> int:
    """The thread count to use (module docstring), checked to lie in [1, MAX_THREADS]."""
    for where, count in (("--threads", value), (THREADS_ENV, _env_count(THREADS_ENV)),
                         (OMP_ENV, _env_count(OMP_ENV, first_of_list=True))):
        if count is not None:
            if not 1 <= count <= MAX_THREADS:
                raise ConfigError(f"{where} must lie in [1, {MAX_THREADS}], got {count}")
            return count
    local = _env_count(LOCAL_WORLD_SIZE_ENV)
    if local is not None and local < 1:
        raise ConfigError(f"{LOCAL_WORLD_SIZE_ENV} must be a positive number of processes, got {local}")
    return default_threads(local or 1)


def set_torch_threads(value: int | None) -> None:
    """torch's intra-op thread count for this command: :func:`chosen_threads`."""
    count = chosen_threads(value)
    import torch

    torch.set_num_threads(count)
