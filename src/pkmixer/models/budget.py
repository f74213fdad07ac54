"""The build budget: sizes that cannot be built are refused before they are allocated.

While a model is built (:func:`pkmixer.models.registry.create_model`), every tensor it asks for is checked against
the memory available (on the meta device only the CPU tensors that a meta model still keeps, such as SW-MLP
masks, count), and a build that runs more than :data:`MAX_BUILD_OPS` tensor operations (e.g. ``depth=10**6``) is
stopped. With Linux's memory overcommit an oversized allocation would not fail cleanly but end in the OOM killer.
A model class may say what it needs before it starts (``build_bytes(kwargs, meta)``, the SW-MLP's masks).
"""
from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError

MAX_DEPTH = 1000  # blocks: refused at once (a Python loop per block would otherwise run for hours)
MAX_BUILD_OPS = 50_000  # tensor operations while building one model; the largest zoo entry (H/14) uses 4 428
_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
              torch.randperm, torch.arange, torch.eye, torch.empty_strided, torch.linspace}


def available_memory(device: torch.device | None = None) -> int:
    """Bytes that can be allocated now: free GPU memory on a CUDA device; otherwise MemAvailable of
    /proc/meminfo (Linux), else the free physical pages."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def _requested(func: Callable, args: tuple, kwargs: dict) -> int:
    """Elements a factory call asks for, computed from its arguments without calling it."""
    if func is torch.randperm:
        return int(args[0])
    if func is torch.arange:
        bounds = [float(a) for a in args if isinstance(a, (int, float))]
        start, end, step = (0.0, bounds[0], 1.0) if len(bounds) == 1 else (*bounds[:2], (bounds[2:] or [1.0])[0])
        return max(0, math.ceil((end - start) / step)) if step else 0
    if func is torch.eye:
        n = int(args[0])
        return n * int(args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("m", n))
    if func is torch.linspace:
        return int(args[2] if len(args) > 2 else kwargs.get("steps", 0))
    if func is torch.randint:
        size = kwargs.get("size", next((a for a in args if isinstance(a, (tuple, list, torch.Size))), ()))
    elif "size" in kwargs:
        size = kwargs["size"]
    else:
        size = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else \
            [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
        if func is torch.full:
            size = args[0]
    return math.prod(int(n) for n in size)


class BuildBudget(TorchFunctionMode):
    """Refuse (ConfigError) a model build whose tensors would not fit in the available memory, before they are
    allocated, or that runs more than :data:`MAX_BUILD_OPS` tensor operations.

    Every factory call (``torch.empty``, ``zeros``, ``rand``, ...) is sized from its arguments before it runs;
    the bytes of the storages made on a real device that are still alive add up, and the build stops as soon
    as the sum passes the memory available when the build began. :meth:`precheck` sizes what a model class
    is known to need before it starts (the SW-MLP's masks, whose sampling alone takes minutes when huge)."""

    def __init__(self, what: str, limit: int | None = None) -> None:
        super().__init__()
        self.what, self.limit, self.used, self.ops = what, limit, 0, 0
        self._live: set[tuple[int, torch.device]] = set()

    def _free(self, key: tuple[int, torch.device], nbytes: int) -> None:
        self._live.discard(key)
        self.used -= nbytes

    def precheck(self, cls: type, kwargs: dict[str, Any]) -> None:
        """Refuse at once a build that a model class says needs more bytes than are available (its
        ``build_bytes(kwargs, meta)``, for sizes whose sampling alone would take minutes when huge)."""
        estimate = getattr(cls, "build_bytes", None)
        if estimate is None:
            return
        try:
            need = estimate(kwargs, torch.get_default_device().type == "meta")
        except (TypeError, ValueError, KeyError, OverflowError, ZeroDivisionError):
            return  # bad arguments: the class itself says what is wrong
        if need > self.limit:
            self._refuse(need)

    def __enter__(self):
        if self.limit is None:
            default = torch.get_default_device()
            self.limit = available_memory(default if default.type != "meta" else None)
        return super().__enter__()

    def _refuse(self, extra: int) -> None:
        raise ConfigError(f"{self.what} needs more than {(self.used + extra) / 2**30:.3g} GiB to build, beyond the "
                          f"{self.limit / 2**30:.3g} GiB of memory available; make it smaller")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if self.ops > MAX_BUILD_OPS:
            raise ConfigError(f"{self.what} takes more than {MAX_BUILD_OPS} tensor operations to build "
                              "(too many layers?); make it smaller")
        if func in _FACTORIES:
            device = torch.device(kwargs["device"]) if kwargs.get("device") is not None \
                else torch.get_default_device()
            if device.type != "meta":
                dtype = kwargs.get("dtype") or (torch.int64 if func in (torch.randperm, torch.randint)
                                                else torch.get_default_dtype())
                try:
                    need = _requested(func, args, kwargs) * dtype.itemsize
                except (TypeError, ValueError, IndexError, OverflowError):
                    need = 0  # a form not parsed here: counted after the call
                if self.used + need > self.limit:
                    self._refuse(need)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device.type != "meta":
            storage = out.untyped_storage()
            key = (storage.data_ptr(), storage.device)
            if storage.nbytes() and key not in self._live:  # a new storage (not a view, not in place)
                self._live.add(key)
                self.used += storage.nbytes()
                weakref.finalize(storage, self._free, key, storage.nbytes())
                if self.used > self.limit:
                    self._refuse(0)
        return out
