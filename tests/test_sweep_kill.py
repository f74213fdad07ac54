"""A sweep driver SIGKILLed while its pool workers start up: none of its processes - workers,
multiprocessing's resource tracker - outlives it by more than 2 s, and nothing is written into the sweep after
the kill. Also the worker bootstrap's two guards on their own: the parent gone before it runs, and after."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkmixer.experiments import worker

from test_sweep import spec

pytestmark = pytest.mark.skipif(not worker.supported(), reason="the death-signal bootstrap is Linux-only")

# The driver: run_sweep with 2 workers. Spawn runs the driver's main module in each worker (as __mp_main__)
# during the worker's start-up, before the pool's initializer, pkmixer or torch: the mark and pause there hold
# a worker inside its start-up imports for as long as the test needs.
DRIVER = """\
import os, sys, time
from pathlib import Path

if __name__ == "__mp_main__":
    (Path(os.environ["KILL_TEST_MARKS"]) / f"worker-{os.getpid()}").write_text("")
    time.sleep(float(os.environ["KILL_TEST_PAUSE"]))

if __name__ == "__main__":
    import json
    from pkmixer.experiments.sweep import RunSpec, run_sweep
    from pkmixer.train.config import build_config

    specs = [RunSpec(s["name"], build_config(s["config"]), s["meta"]) for s in json.loads(os.environ["KILL_TEST_SPECS"])]
    run_sweep(specs, sys.argv[1], workers=2, threads=1, progress=False)
"""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in "ZX"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _session(sid: int) -> dict[int, str]:
    """Living processes of session ``sid`` (the driver's: it is started in a session of its own, which its
    workers and resource tracker inherit), with their command lines."""
    members = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[0] not in "ZX" and int(fields[3]) == sid:
                members[int(entry.name)] = _cmdline(int(entry.name))
    return members


def _children(pid: int) -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()
            and (_stat_fields(int(e.name)) or ["", "0"])[1] == str(pid)]


def _snapshot(root: Path) -> dict[str, tuple[int, int, bool]]:
    files = {}
    for path in root.rglob("*"):
        try:
            st = path.stat()
        except OSError:
            continue
        files[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, path.is_dir())
    return files


def _wait(condition, proc, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the driver ended (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def _kill_driver(tmp_path: Path, moment: str, quiet_s: float) -> dict:
    """Start a 2-worker sweep driver, SIGKILL it at ``moment``, check that its session is empty 2 s later
    and that the sweep directory does not change for ``quiet_s`` more seconds."""
    sweep, marks = tmp_path / "sweep", tmp_path / "marks"
    marks.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    specs = [spec(f"r{i}", i, schedule={"epochs": 3}) for i in range(4)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILL_TEST_MARKS": str(marks),
           "KILL_TEST_PAUSE": "5" if moment == "importing" else "0",
           "KILL_TEST_SPECS": json.dumps([{"name": s.name, "config": s.config.as_dict(), "meta": s.meta} for s in specs])}
    with open(tmp_path / "driver.err", "w") as err:
        proc = subprocess.Popen([sys.executable, str(driver), str(sweep)], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        def has_child(needle: str):
            return lambda: any(needle in _cmdline(c) for c in _children(proc.pid))

        conditions = {
            "tracker": has_child("resource_tracker"),  # the pool's first process, before any worker
            "forked": has_child("spawn_main"),  # a worker forked: in exec or the interpreter's start-up
            "importing": lambda: len(list(marks.iterdir())) == 2,  # both workers in their start-up imports
            "training": lambda: any((sweep / "runs").glob("*/config.yaml")),  # a worker started a run
        }
        _wait(conditions[moment], proc, f"the moment {moment!r}")
        before = _session(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        while _session(proc.pid) and time.monotonic() < killed + 2:
            time.sleep(0.01)
        survivors = _session(proc.pid)
        assert not survivors, f"alive 2 s after the driver was killed: {survivors}"
        time.sleep(max(0.0, killed + 2 - time.monotonic()))
        first = _snapshot(sweep)
        time.sleep(quiet_s)
        assert _snapshot(sweep) == first, "the sweep directory changed after the driver was killed"
        return {"before": before, "files": first}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # only on failure: whatever of this test's sweep is left
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.slow  # a kill test: a 2-worker sweep driver SIGKILLed; the bootstrap tests below stay in the default tier
def test_killed_while_workers_import(tmp_path):
    """Both workers held in their start-up imports (where the old PR_SET_PDEATHSIG, set in the pool's
    initializer, had not been set yet) when the driver is killed: they die with it and never write."""
    seen = _kill_driver(tmp_path, "importing", quiet_s=3)
    workers = [cmd for cmd in seen["before"].values() if "spawn_main" in cmd]
    assert len(workers) == 2 and any("resource_tracker" in cmd for cmd in seen["before"].values())
    assert not any(name.startswith(("runs", "logs")) for name in seen["files"])  # no worker got to a run


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["tracker", "forked", "training"])
def test_killed_at_other_moments(tmp_path, moment):
    """The resource tracker just started, a worker just forked, the workers training: the same holds."""
    _kill_driver(tmp_path, moment, quiet_s=5)


# ---- the bootstrap alone (no torch: fast) ---------------------------------------------------------------

# A parent that starts `python -c PROGRAM` with PROGRAM = BEFORE + bootstrap_code(parent) + AFTER (the worker
# module loaded from its file: stdlib only), prints the child's pid, then: "wait" for the child, "exit" at once,
# or exit once the child has passed the bootstrap ("booted" exists).
PARENT = """\
import importlib.util, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
child = subprocess.Popen([sys.executable, "-c", sys.argv[2] + worker.bootstrap_code(os.getpid()) + sys.argv[3]])
print(child.pid, flush=True)
if sys.argv[4] == "wait":
    child.wait()
while sys.argv[4] == "booted" and not os.path.exists(sys.argv[5]) and child.poll() is None:
    time.sleep(0.01)
"""


def _bootstrap_case(tmp_path, before: str, mode: str, sleep: float) -> tuple[int, Path, Path]:
    """(the child's pid, the file it writes after the bootstrap, the file it writes ``sleep`` s later)."""
    booted, ran = tmp_path / "booted", tmp_path / "ran"
    after = f"import time\nopen({str(booted)!r}, 'w')\ntime.sleep({sleep})\nopen({str(ran)!r}, 'w').write('ran')\n"
    parent = subprocess.run([sys.executable, "-c", PARENT, worker.__file__, before, after, mode, str(booted)],
                            capture_output=True, text=True, timeout=60, check=True)
    return int(parent.stdout.split()[0]), booted, ran


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _alive(pid)


def test_bootstrap_parent_gone_before_it_runs(tmp_path):
    """The parent dies between the fork and the bootstrap (here: a child slow to start): no death signal can
    come any more, so the getppid check ends the child at once."""
    child, booted, ran = _bootstrap_case(tmp_path, "import time\ntime.sleep(1)\n", "exit", sleep=0)
    assert _gone_within(child, 10) and not booted.exists() and not ran.exists()


def test_bootstrap_parent_dies_after_it_ran(tmp_path):
    """The parent dies after the bootstrap: the kernel kills the child (PR_SET_PDEATHSIG) at once."""
    child, booted, ran = _bootstrap_case(tmp_path, "", "booted", sleep=5)
    assert booted.exists() and _gone_within(child, 2) and not ran.exists()


def test_bootstrap_parent_alive(tmp_path):
    """Control: with its parent alive the child runs through."""
    _, booted, ran = _bootstrap_case(tmp_path, "", "wait", sleep=0)
    assert booted.exists() and ran.read_text() == "ran"
