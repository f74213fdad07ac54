"""Crash safety of a run directory: killed at every point where a write can be cut, a run resumes to exactly
the result of an uninterrupted run, with nothing lost and no temporary file left (docs/training.md).

The kills come from the fault hook of :mod:`pkmixer.atomic` (PKMIXER_FAULT=POINT:N): a run is traced once
uninterrupted, then killed at each (point, occurrence) pair of the trace in turn and resumed. Every run is a
forked child with one thread, so all of them compute in the same order and can be compared bit for bit.
"""
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from pkmixer import atomic
from pkmixer.cli import main
from pkmixer.train import loop
from pkmixer.checkpoint import read_checkpoint
from pkmixer.train.config import build_config
from pkmixer.train.rundir import RunDir, RunLock

from conftest import forked

# 5 epochs of a tiny S-Mixer on 8x8 digits, ~0.1 s each, a fifth held out to validate; the best epoch by the
# validation error (4) is not the last, so best.pt and latest.pt part ways
CFG = {"data.name": "digits", "model.name": "smixer_t4_28", "model.img_size": 8, "model.patch_size": 2,
       "model.in_chans": 1, "model.depth": 1, "model.embed_dim": 16, "data.batch_size": 32,
       "data.train_subset": 256, "data.test_subset": 128, "optim.name": "adamw", "optim.lr": 0.1,
       "data.val_fraction": 0.2, "schedule.epochs": 5, "run.progress": False}


def _child(run_dir: Path, *, resume: bool = False, fault: str | None = None, trace: Path | None = None,
           cfg: dict | None = CFG) -> int:
    """Train in a forked child with one thread; its wait status."""
    return forked(lambda: loop.train(None if cfg is None else build_config(None, cfg), run_dir, resume=resume,
                                     log=lambda _: None), fault, trace)


def _train(run_dir: Path, **kwargs) -> None:
    status = _child(run_dir, **kwargs)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the run failed (wait status {status})"


def _killed(run_dir: Path, fault: str, **kwargs) -> None:
    status = _child(run_dir, fault=fault, **kwargs)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"{fault} was not reached"


def _traced(run_dir: Path, trace: Path, **kwargs) -> list[str]:
    _train(run_dir, trace=trace, **kwargs)
    return trace.read_text().split()


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


def _outcome(run_dir: Path) -> dict:
    """What must not depend on kills: both checkpoints whole, the metrics rows and the summary (timing
    fields excepted), and no temporary file left."""
    temp = [p for p in run_dir.rglob("*") if atomic.is_temp_file(p)]
    assert not temp, f"temporary files left: {temp}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("epoch_time")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("wall_time")
    return {"latest": read_checkpoint(run_dir / "checkpoints" / "latest.pt"),
            "best": read_checkpoint(run_dir / "checkpoints" / "best.pt"), "metrics": rows, "summary": summary}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run and the trace of its write points."""
    root = tmp_path_factory.mktemp("reference")
    points = _traced(root / "run", root / "trace")
    outcome = _outcome(root / "run")
    errors = [row["val_error"] for row in outcome["metrics"]]
    assert [row["epoch"] for row in outcome["metrics"]] == [1, 2, 3, 4, 5]
    assert errors.index(min(errors)) + 1 < len(errors), f"the best epoch should not be the last: {errors}"
    assert outcome["best"]["epoch"] < outcome["latest"]["epoch"]
    return outcome, points


def _kill_resume_compare(reference_outcome: dict, run: Path, fault: str) -> None:
    _killed(run, fault)
    _train(run, resume=True)
    _same(_outcome(run), reference_outcome, fault)


def test_trace_covers_every_kind_of_write(reference):
    outcome, points = reference
    kinds = {p.split(":")[0] for p in points}
    assert kinds == set(atomic.FAULT_POINTS)
    errors = [row["val_error"] for row in outcome["metrics"]]
    improved = sum(e < min(errors[:i], default=2.0) for i, e in enumerate(errors))
    # per epoch: a metrics row; latest.pt (save_every 1) and best.pt when it improved; plus config and summary
    assert sum(p.startswith("before-append:") for p in points) == 5
    assert sum(p.startswith("before-temp-write:") for p in points) == 1 + 5 + improved + 1


def test_killed_where_best_is_lost_today(reference, tmp_path):
    """Issue 12 item 1: killed between the two checkpoint writes of the best epoch, the resumed run must
    still end with that epoch's best.pt."""
    outcome, points = reference
    best_epoch = outcome["best"]["epoch"]
    # the first rename after the best epoch's metrics row puts its best.pt in place; latest.pt follows
    rows_before = 0
    for p in points:
        if p.startswith("after-append:"):
            rows_before += 1
        if p.startswith("after-rename:") and rows_before == best_epoch:
            break
    _kill_resume_compare(outcome, tmp_path / "run", p)


def test_cut_metrics_line_resumes(reference, tmp_path):
    """A kill in the middle of an append leaves a cut last line: the resume drops it and goes on."""
    outcome, _ = reference
    run = tmp_path / "run"
    _killed(run, "mid-append:3")
    assert not (run / "metrics.jsonl").read_bytes().endswith(b"\n")
    _train(run, resume=True)
    _same(_outcome(run), outcome)


def _sample(points: list[str], every: int) -> list[str]:
    return points[::every] if every > 1 else points


@pytest.mark.parametrize("every", [pytest.param(1, marks=[pytest.mark.slow, pytest.mark.timeout(900)], id="every-point"),
                                   pytest.param(7, id="every-7th-point")])
def test_kill_at_every_write_point_then_resume(reference, tmp_path, every):
    outcome, points = reference
    for i, fault in enumerate(_sample(points, every)):
        _kill_resume_compare(outcome, tmp_path / f"run{i}", fault)


@pytest.mark.parametrize("every", [pytest.param(1, marks=[pytest.mark.slow, pytest.mark.timeout(900)], id="every-point"),
                                   pytest.param(4, id="every-4th-point")])
def test_kill_during_the_resume_that_drops_rows(reference, tmp_path, every):
    """Killed after epoch 3's row and before its checkpoint, the resume must drop that row (a rewrite of
    metrics.jsonl): kill the resume at each of its own write points, resume again, compare."""
    outcome, _ = reference
    killed = tmp_path / "killed"
    _killed(killed, "after-append:3")
    first = [json.loads(line)["epoch"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert first == [1, 2, 3] and read_checkpoint(killed / "checkpoints" / "latest.pt")["epoch"] == 2
    traced = tmp_path / "traced"
    shutil.copytree(killed, traced)
    resume_points = _traced(traced, tmp_path / "trace", resume=True)
    assert resume_points[:3] == ["before-temp-write:1", "after-temp-write:1", "after-rename:1"]  # the rewrite
    _same(_outcome(traced), outcome)
    for i, fault in enumerate(_sample(resume_points, every)):
        run = tmp_path / f"run{i}"
        shutil.copytree(killed, run)
        _killed(run, fault, resume=True)
        _train(run, resume=True)
        _same(_outcome(run), outcome, fault)


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_afresh(reference, tmp_path, capsys):
    """Issue 12 item 5: `train --resume` on such a directory starts the run afresh and says so."""
    outcome, _ = reference
    run = tmp_path / "run"
    _killed(run, "after-temp-write:2")  # config.yaml written, best.pt of epoch 1 not yet in place
    assert not (run / "checkpoints" / "latest.pt").exists() and (run / "config.yaml").is_file()
    torch.set_num_threads(1)
    code = main(["train", "--run-dir", str(run), "--resume"])
    out, err = capsys.readouterr()
    assert code == 0 and "never reached its first checkpoint: starting it afresh" in out
    _same(_outcome(run), outcome)

    early = tmp_path / "early"
    _killed(early, "before-temp-write:1")  # only the lock and config.yaml's temp file: no config to go on
    code = main(["train", "--run-dir", str(early), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "nothing to resume" in err and len(err.splitlines()) == 1
    (early / "notes.txt").write_text("mine")
    settings = [arg for k, v in CFG.items() for arg in ("--set", f"{k}={v}")]
    code = main(["train", *settings, "--run-dir", str(early), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "files a run does not write (notes.txt)" in err
    assert (early / "notes.txt").read_text() == "mine"


def test_one_process_trains_a_run_at_a_time(reference, tmp_path, capsys):
    outcome, _ = reference
    run = tmp_path / "run"
    _killed(run, "after-append:2")
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # pragma: no cover - a second trainer that holds the lock until killed
        with RunLock(RunDir(run)):
            os.write(write, b"x")
            signal.pause()
        os._exit(0)
    try:
        os.read(read, 1)
        before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
        code = main(["train", "--run-dir", str(run), "--resume"])
        err = capsys.readouterr().err
        assert code == 2 and f"another process (pid {holder}) is training" in err
        assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    _train(run, resume=True)  # the kernel released the dead holder's lock
    _same(_outcome(run), outcome)
