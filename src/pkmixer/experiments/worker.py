"""Sweep worker processes whose life is tied to the process that starts them, from their first statement.

:func:`spawn_context` is a ``multiprocessing`` spawn context for ``ProcessPoolExecutor(mp_context=...)``. On
Linux its processes start as ``python -c PROGRAM`` like every spawned process, but PROGRAM first runs
:func:`bootstrap_code`, before it imports ``multiprocessing``, the parent's main module, pkmixer or torch:

1. ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel SIGKILLs the child when its parent dies;
2. ``os.getppid()`` must still be the parent that started it, else the child exits at once: a parent killed
   between the fork and step 1 (during the interpreter's own start-up) has no death left to signal.

Only then does the child read its process object from the parent (``multiprocessing.spawn.spawn_main``). A
killed driver therefore leaves no worker behind, whatever the worker was doing: starting the interpreter,
importing torch (seconds) or training. The multiprocessing resource tracker needs nothing of its own: it ends
when every write end of its pipe is closed, and only the driver and its workers hold one, so it ends with
them, after unlinking the semaphores the killed driver left in /dev/shm.

The death signal comes from the parent *thread* that created the child, not from the whole process (Linux
sends it when that thread exits). ``ProcessPoolExecutor`` creates spawn workers in the thread that submits
(or, for replacements, in its manager thread); both outlive the workers, since leaving the executor's
``with`` block waits for them.

Elsewhere (macOS, Windows, frozen executables) :func:`spawn_context` is the plain spawn context: workers
that outlive a killed driver are possible there.
"""
from __future__ import annotations

import io
import multiprocessing
import os
import sys
from multiprocessing import context

__all__ = ["bootstrap_code", "spawn_context", "supported"]


def supported() -> bool:
    """True where workers are started with the death-signal bootstrap (Linux, not a frozen executable)."""
    return sys.platform.startswith("linux") and not getattr(sys, "frozen", False)


def bootstrap_code(parent_pid: int) -> str:
    """The first statements of a worker: die with ``parent_pid`` (PR_SET_PDEATHSIG = 1, SIGKILL), or exit
    at once when it is no longer the parent. Uses only ctypes, os and signal (no site-packages)."""
    return ("import ctypes, os, signal\n"
            "try:\n"
            "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
            "except (OSError, AttributeError):\n"
            "    pass\n"
            f"if os.getppid() != {int(parent_pid)}:\n"
            "    os._exit(70)\n")


if supported():
    from multiprocessing import popen_spawn_posix, spawn, util

    class _Popen(popen_spawn_posix.Popen):
        """``popen_spawn_posix.Popen`` with :func:`bootstrap_code` ahead of ``spawn_main``: its ``_launch``,
        copied from CPython 3.11, with only the command line changed."""

        def _launch(self, process_obj):
            from multiprocessing import resource_tracker

            tracker_fd = resource_tracker.getfd()
            self._fds.append(tracker_fd)
            prep_data = spawn.get_preparation_data(process_obj._name)
            fp = io.BytesIO()
            context.set_spawning_popen(self)
            try:
                context.reduction.dump(prep_data, fp)
                context.reduction.dump(process_obj, fp)
            finally:
                context.set_spawning_popen(None)

            parent_r = child_w = child_r = parent_w = None
            try:
                parent_r, child_w = os.pipe()
                child_r, parent_w = os.pipe()
                program = (bootstrap_code(os.getpid()) + "from multiprocessing.spawn import spawn_main\n"
                           f"spawn_main(tracker_fd={tracker_fd!r}, pipe_handle={child_r!r})\n")
                cmd = [spawn.get_executable(), *util._args_from_interpreter_flags(), "-c", program,
                       "--multiprocessing-fork"]
                self._fds.extend([child_r, child_w])
                self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
                self.sentinel = parent_r
                with open(parent_w, "wb", closefd=False) as f:
                    f.write(fp.getbuffer())
            finally:
                self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w)
                                                                      if fd is not None])
                for fd in (child_r, child_w):
                    if fd is not None:
                        os.close(fd)

    class _Process(context.SpawnProcess):
        _start_method = "spawn"

        @staticmethod
        def _Popen(process_obj):
            return _Popen(process_obj)

    class _Context(context.SpawnContext):
        Process = _Process


def spawn_context() -> multiprocessing.context.BaseContext:
    """A spawn context whose processes die with this process (see the module docstring); the plain spawn
    context where that is not :func:`supported`."""
    return _Context() if supported() else multiprocessing.get_context("spawn")
