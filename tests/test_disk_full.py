"""A write that fails while ``pkmixer train`` runs - a full disk at every write point of a run; no permission, a
read-only file system or a vanished folder at one - gives one line on stderr and exit status 1, leaves the last
good state (every file whole and the uninterrupted run's own, no temporary file, no cut metrics line), and the
line's advice, followed, ends in exactly the uninterrupted run's result (timing fields excepted).

The failures come from the fault hook of :mod:`pkmixer.atomic`: ``PKMIXER_FAULT=POINT:N:ENOSPC`` raises the
OSError at the N-th ``POINT`` (at ``before-temp-write`` from the first write into the temporary file, as a full
disk does). A run is traced once uninterrupted, then fails at each (point, occurrence) pair of the trace in turn.
Everything runs in this process with one torch thread, so the runs compare bit for bit.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from pkmixer import atomic
from pkmixer.checkpoint import read_checkpoint
from pkmixer.cli import main

# 5 epochs of a tiny S-Mixer on 8x8 digits, about 0.1 s each
CFG = {"data.name": "digits", "model.name": "smixer_t4_28", "model.img_size": 8, "model.patch_size": 2,
       "model.in_chans": 1, "model.depth": 1, "model.embed_dim": 16, "data.batch_size": 32,
       "data.train_subset": 256, "data.test_subset": 128, "optim.name": "adamw", "optim.lr": 0.05,
       "schedule.epochs": 5, "run.progress": False}
SETTINGS = [arg for key, value in CFG.items() for arg in ("--set", f"{key}={value}")]


def _pkmixer(capsys, argv: list[str], fault: str | None = None, trace: Path | None = None) -> tuple[int, str]:
    """``pkmixer ARGV`` in this process under the fault hook: (exit status, stderr)."""
    saved = {key: os.environ.get(key) for key in (atomic.FAULT_ENV, atomic.FAULT_TRACE_ENV)}
    for key, value in ((atomic.FAULT_ENV, fault), (atomic.FAULT_TRACE_ENV, trace)):
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = str(value)
    atomic.reset_fault_counts()
    try:
        code = main(argv)
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
        atomic.reset_fault_counts()
    return code, capsys.readouterr().err


def _same(a, b, where: str = "") -> None:
    """Equal, tensors bit for bit, through dicts, lists and tuples."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _rows(run: Path) -> list[dict]:
    """The metrics rows without their timing; the file must end in a whole line."""
    text = (run / "metrics.jsonl").read_text() if (run / "metrics.jsonl").exists() else ""
    assert not text or text.endswith("\n"), "metrics.jsonl ends in a cut line"
    rows = [json.loads(line) for line in text.splitlines()]
    for row in rows:
        row.pop("epoch_time")
    return rows


def _outcome(run: Path) -> dict:
    """What must not depend on failed writes: both checkpoints, the metrics rows and the summary (timing fields
    excepted), and no temporary file left."""
    assert not [p for p in run.rglob("*") if atomic.is_temp_file(p)], "temporary files left"
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("wall_time")
    best = run / "checkpoints" / "best.pt"
    return {"latest": read_checkpoint(run / "checkpoints" / "latest.pt"),
            "best": read_checkpoint(best) if best.exists() else None, "metrics": _rows(run), "summary": summary}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, the trace of its write points, and the checkpoints after each epoch (the run again,
    one epoch per invocation), keyed by epoch: latest.pt by its epoch, best.pt by the epoch it was best at."""
    root = tmp_path_factory.mktemp("reference")
    saved = os.environ.get(atomic.FAULT_TRACE_ENV)
    os.environ[atomic.FAULT_TRACE_ENV] = str(root / "trace")
    atomic.reset_fault_counts()
    try:
        assert main(["train", *SETTINGS, "--run-dir", str(root / "run")]) == 0
    finally:
        os.environ.pop(atomic.FAULT_TRACE_ENV)
        if saved is not None:
            os.environ[atomic.FAULT_TRACE_ENV] = saved
        atomic.reset_fault_counts()
    outcome = _outcome(root / "run")
    latest, best = {}, {}
    steps = root / "steps"
    for epoch in range(1, CFG["schedule.epochs"] + 1):
        resume = ["--resume"] if epoch > 1 else []
        assert main(["train", *SETTINGS, "--run-dir", str(steps), "--stop-after", "1", *resume]) == 0
        latest[epoch] = read_checkpoint(steps / "checkpoints" / "latest.pt")
        if (steps / "checkpoints" / "best.pt").exists():
            checkpoint = read_checkpoint(steps / "checkpoints" / "best.pt")
            best[checkpoint["epoch"]] = checkpoint
    _same(_outcome(steps), outcome, "the run trained one epoch per invocation")
    return {"outcome": outcome, "points": (root / "trace").read_text().split(), "latest": latest, "best": best,
            "config": (root / "run" / "config.yaml").read_bytes()}


def _intact(run: Path, ref: dict) -> None:
    """The last good state: no temporary file, and each file absent or whole and the reference run's."""
    if not run.exists():
        return
    assert not [p for p in run.rglob("*") if atomic.is_temp_file(p)], "temporary files left"
    assert not (run / "config.yaml").exists() or (run / "config.yaml").read_bytes() == ref["config"]
    rows = _rows(run)
    assert rows == ref["outcome"]["metrics"][:len(rows)]
    if (run / "checkpoints" / "latest.pt").exists():
        latest = read_checkpoint(run / "checkpoints" / "latest.pt")
        _same(latest, ref["latest"][latest["epoch"]], "latest.pt")
        assert len(rows) >= latest["epoch"]
    if (run / "checkpoints" / "best.pt").exists():
        best = read_checkpoint(run / "checkpoints" / "best.pt")
        _same(best, ref["best"][best["epoch"]], "best.pt")
    if (run / "summary.json").exists():
        json.loads((run / "summary.json").read_text())


def _follow(capsys, line: str, argv: list[str]) -> int:
    """Do what the line says to go on; the exit status."""
    advice = line.rsplit(", then ", 1)[1]
    if advice.startswith("continue the run with: pkmixer "):
        return _pkmixer(capsys, advice.removeprefix("continue the run with: pkmixer ").split())[0]
    if advice.startswith("remove "):
        shutil.rmtree(advice.removeprefix("remove ").split(" (")[0])
        return _pkmixer(capsys, argv)[0]
    assert advice == "run the command again", line
    return _pkmixer(capsys, argv)[0]


def _fail_and_resume(capsys, ref: dict, run: Path, fault: str | None, monkeypatch=None, failing=None) -> str:
    """Train under ``fault`` (or with ``failing`` patched in for ``os.fsync``): one line, exit 1, the last good
    state; then follow the line to the reference result."""
    argv = ["train", *SETTINGS, "--run-dir", str(run)]
    if failing is None:
        code, err = _pkmixer(capsys, argv, fault)
    else:
        with monkeypatch.context() as patch:
            patch.setattr(atomic.os, "fsync", failing)
            code, err = _pkmixer(capsys, argv)
    lines = err.strip().splitlines()
    assert code == 1, f"{fault}: exit {code}\n{err[-2000:]}"
    assert len(lines) == 1 and "Traceback" not in err, f"{fault}: {err[-2000:]}"
    _intact(run, ref)
    assert _follow(capsys, lines[0], argv) == 0, fault
    _same(_outcome(run), ref["outcome"], fault)
    return lines[0]


def test_the_trace_has_every_kind_of_write(reference):
    assert {p.split(":")[0] for p in reference["points"]} == set(atomic.FAULT_POINTS)


@pytest.mark.parametrize("every", [pytest.param(1, marks=[pytest.mark.slow, pytest.mark.timeout(900)], id="every-point"),
                                   pytest.param(5, id="every-5th-point")])
def test_a_full_disk_at_every_write_point(capsys, reference, tmp_path, every):
    points = reference["points"][::every]
    for i, point in enumerate(points):
        line = _fail_and_resume(capsys, reference, tmp_path / f"run{i}", f"{point}:ENOSPC")
        assert line.startswith("pkmixer train: error: ") and "No space left on device; free space" in line, line


@pytest.mark.parametrize("error,says", [("EACCES", "give this user access"), ("EROFS", "read-only"),
                                        ("ENOENT", "moved or removed"), ("ENOSPC", "free space")])
def test_each_fault_of_the_machine(capsys, reference, tmp_path, error, says):
    """Writing epoch 2's latest.pt fails: the line names the file, says what to do and how to resume."""
    writes = [p for p in reference["points"] if p.startswith("before-temp-write:")]
    rows = 0
    for point in reference["points"]:  # the second checkpoint write after epoch 2's metrics row: latest.pt
        rows += point.startswith("after-append:")
        if rows == 2 and point in writes:
            fault = point
    run = tmp_path / "run"
    line = _fail_and_resume(capsys, reference, run, f"{fault}:{error}")
    assert f"{run / 'checkpoints' / 'latest.pt'}: {os.strerror(getattr(errno, error))}; " in line, line
    assert says in line and line.endswith(f"continue the run with: pkmixer train --resume --run-dir {run}"), line


def test_a_disk_that_fills_when_a_checkpoint_is_synced(capsys, reference, tmp_path, monkeypatch):
    """No fault hook: the file system reports no space when epoch 2's latest.pt is flushed to disk (as NFS and
    thin-provisioned disks do)."""
    real_fsync, seen = os.fsync, []

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        seen.append(Path(name).name.startswith(".latest.pt."))
        if sum(seen) == 2 and seen[-1]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    run = tmp_path / "run"
    line = _fail_and_resume(capsys, reference, run, None, monkeypatch, fsync)
    assert line == (f"pkmixer train: error: {run / 'checkpoints' / 'latest.pt'}: No space left on device; free space "
                    f"on its disk, then continue the run with: pkmixer train --resume --run-dir {run}")


def test_the_first_write_fails(capsys, reference, tmp_path):
    """config.yaml cannot be written: nothing of the run is kept, and running the command again trains it."""
    line = _fail_and_resume(capsys, reference, tmp_path / "run", "before-temp-write:1:ENOSPC")
    assert str(tmp_path / "run" / "config.yaml") in line


# ---- the write functions on their own -----------------------------------------------------------------------


def test_a_short_append_is_cut_back(tmp_path, monkeypatch):
    """A full disk first takes part of a line (a short write), then refuses: the file is cut back to its end."""
    log = tmp_path / "log.jsonl"
    log.write_text('{"epoch": 1}\n')
    real_write, calls = os.write, []

    def full_disk(fd: int, data) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "write", full_disk)
        with pytest.raises(OSError) as caught:
            atomic.append_line(log, json.dumps({"epoch": 2, "loss": 0.5}))
    assert log.read_text() == '{"epoch": 1}\n' and len(calls) == 2
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(log)


def test_a_wrapped_disk_error_is_raised_as_it_is(tmp_path):
    """torch.save reports a full disk as a RuntimeError around the OSError: the OSError comes out, naming the
    file, and the old file stays."""
    target = tmp_path / "latest.pt"
    target.write_bytes(b"old")

    def writer(f) -> None:
        f.write(b"new, half")
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos")  # noqa: B904 - as torch does

    with pytest.raises(OSError) as caught:
        atomic.write_atomically(target, writer)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


def test_only_a_wrapped_os_error_is_unwrapped(tmp_path):
    """Bad input raised while handling an OS error stays bad input (exit status 2), not a fault of the machine."""
    from pkmixer.errors import ConfigError

    def writer(f) -> None:
        try:
            (tmp_path / "missing").read_bytes()
        except OSError:
            raise ConfigError("the value cannot be written")  # noqa: B904 - its context is the OSError

    with pytest.raises(ConfigError):
        atomic.write_atomically(tmp_path / "out.txt", writer)
    assert not list(tmp_path.iterdir())
