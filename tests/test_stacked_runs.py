"""K runs trained as one stack (pkmixer.train.stacked_runs): each run directory equals its solo loop.train run - members
of their own learning rates and weight decays, gradient clipping and the Polyak average included - resumes alone or
restacked, regroups after a kill between two members' writes, and a diverging member stops alone."""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

from pkmixer import atomic
from pkmixer.checkpoint import read_checkpoint
from pkmixer.errors import ConfigError
from pkmixer.experiments.sweep import RunSpec, load_rows, run_sweep, stack_groups
from pkmixer.train import evaluation, loop, stacked_runs
from pkmixer.train.config import build_config
from pkmixer.train.engine import TrainingDiverged
from pkmixer.train.stacked_runs import member_losses, train_stack

from conftest import forked

# an RP S-Mixer on 8x8 digits, 2 blocks, crop + flip and label smoothing, warm-up then cosine, a fifth held out to
# validate: ~0.1 s an epoch
CFG = {"data.name": "digits", "model.name": "rp_smixer_t4_28", "model.img_size": 8, "model.patch_size": 2,
       "model.in_chans": 1, "model.depth": 2, "model.embed_dim": 16, "data.batch_size": 32,
       "data.train_subset": 256, "data.test_subset": 128, "data.crop_padding": 1, "data.hflip": True,
       "data.label_smoothing": 0.1, "optim.name": "adamw", "optim.lr": 0.01, "optim.weight_decay": 0.05,
       "data.val_fraction": 0.2, "schedule.epochs": 2, "schedule.warmup_epochs": 0.5, "run.progress": False,
       "run.device": "cpu"}
SEEDS = (0, 1, 2)
QUIET = dict(log=lambda _: None)


def cfg(seed: int, **extra):
    return build_config(None, {**CFG, "run.seed": seed, "model.structure_seed": seed, **extra})


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def solo(tmp_path_factory):
    """Each seed's uninterrupted solo run."""
    root = tmp_path_factory.mktemp("solo")
    torch.set_num_threads(1)
    for s in SEEDS:
        loop.train(cfg(s), root / f"s{s}", **QUIET)
    return root


def close(a, b, where: str = "") -> None:
    """Equal to float tolerance through dicts, lists and tuples (tensors and floats), exactly otherwise."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=where)
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for k in a:
            close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def outcome(run: Path) -> dict:
    """A run directory's results, timing and stack fields dropped; no temporary file left."""
    assert not [p for p in run.rglob("*") if atomic.is_temp_file(p)]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for key in ("epoch_time", "stack_members", "stack_member"):
            row.pop(key, None)
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("wall_time", None)
    out = {"files": sorted(str(p.relative_to(run)) for p in run.rglob("*")), "metrics": rows, "summary": summary}
    for name in ("latest", "best"):
        path = run / "checkpoints" / f"{name}.pt"
        if path.exists():
            out[name] = read_checkpoint(path)
    return out


def test_stacked_runs_equal_solo_runs(solo, tmp_path):
    dirs = [tmp_path / f"s{s}" for s in SEEDS]
    summaries = train_stack([cfg(s) for s in SEEDS], dirs, **QUIET)
    assert [s["status"] for s in summaries] == ["finished"] * 3
    for s, d in zip(SEEDS, dirs):
        ours, theirs = outcome(d), outcome(solo / f"s{s}")
        close(ours, theirs, f"seed {s}")
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [(r["stack_members"], r["stack_member"]) for r in rows] == [(3, s)] * 2
        alone = evaluation.evaluate_run(d, "best")  # the checkpoint loads alone
        close({k: v for k, v in alone.items() if k != "run"},
              {k: v for k, v in evaluation.evaluate_run(solo / f"s{s}", "best").items() if k != "run"})
    # the members differ from each other: each its own seed, permutations and data
    a, b = (read_checkpoint(d / "checkpoints" / "latest.pt")["state_dict"] for d in dirs[:2])
    assert not torch.equal(a["blocks.0.token.mixing.in_index"], b["blocks.0.token.mixing.in_index"])


@pytest.mark.slow  # inductor compiles the stacked model's C++ kernels: about a minute
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_stack_equals_solo_runs(solo, tmp_path, mode):
    """run.compile compiles the stacked model (on the CPU reduce-overhead's CUDA graphs are skipped, its step
    marks are not): each member's epochs equal its eager solo run's to float rounding, and its checkpoint is the
    uncompiled model's, which loads alone."""
    dirs = [tmp_path / f"s{s}" for s in SEEDS[:2]]
    compile_ = {"run.compile": True, "run.compile_mode": mode}
    summaries = train_stack([cfg(s, **compile_) for s in SEEDS[:2]], dirs, **QUIET)
    assert [s["status"] for s in summaries] == ["finished"] * 2
    for s, d in zip(SEEDS, dirs):
        ours, theirs = outcome(d)["metrics"], outcome(solo / f"s{s}")["metrics"]
        assert [r["epoch"] for r in ours] == [r["epoch"] for r in theirs] == [1, 2]
        for a, b in zip(ours, theirs):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
            assert a["test_error"] == pytest.approx(b["test_error"], abs=2 / 128)
        close(read_checkpoint(d / "checkpoints" / "latest.pt")["state_dict"],
              read_checkpoint(solo / f"s{s}" / "checkpoints" / "latest.pt")["state_dict"], f"seed {s}")


def test_stopped_stack_resumes_alone_and_restacked(solo, tmp_path):
    dirs = [tmp_path / f"s{s}" for s in SEEDS]
    summaries = train_stack([cfg(s) for s in SEEDS], dirs, stop_after=1, **QUIET)
    assert [(s["status"], s["epochs_done"]) for s in summaries] == [("stopped", 1)] * 3
    loop.train(None, dirs[0], resume=True, **QUIET)  # member 0 alone from its stacked checkpoint
    train_stack([None, None], dirs[1:], resume=True, **QUIET)  # the others restacked
    for s, d in zip(SEEDS, dirs):
        close(outcome(d), outcome(solo / f"s{s}"), f"seed {s}")

    # solo checkpoints restack: two solo runs stopped after an epoch, resumed as one stack
    again = [tmp_path / f"again{s}" for s in SEEDS[:2]]
    for s, d in zip(SEEDS, again):
        loop.train(cfg(s), d, stop_after=1, **QUIET)
    train_stack([cfg(s) for s in SEEDS[:2]], again, resume=True, **QUIET)
    for s, d in zip(SEEDS, again):
        close(outcome(d), outcome(solo / f"s{s}"), f"seed {s} restacked")


# each member its own lr and weight decay: warm-up from one warmup_lr and cosine to one min_lr
# make the members' schedules differ by more than a factor
OWN = {"adamw": [{"optim.lr": lr, "optim.weight_decay": wd} for lr, wd in ((0.003, 0.0), (0.01, 0.05), (0.03, 0.2))],
       "sgd": [{"optim.name": "sgd", "optim.momentum": 0.9, "optim.lr": lr, "optim.weight_decay": wd}
               for lr, wd in ((0.02, 1e-4), (0.05, 1e-3), (0.1, 5e-3))]}
SHARED = {"schedule.min_lr": 1e-3}


def _equal_solo_runs(cfgs: list, tmp_path: Path, stop_after: int | None = None) -> list[Path]:
    """The configs trained as one stack - with ``stop_after``, stopped there and resumed as a stack - equal
    their solo runs; the stack's run directories."""
    dirs = [tmp_path / f"stacked{i}" for i in range(len(cfgs))]
    for i, c in enumerate(cfgs):
        loop.train(c, tmp_path / f"solo{i}", **QUIET)
    train_stack(cfgs, dirs, stop_after=stop_after, **QUIET)
    if stop_after is not None:
        train_stack([None] * len(cfgs), dirs, resume=True, **QUIET)
    for i, d in enumerate(dirs):
        close(outcome(d), outcome(tmp_path / f"solo{i}"), f"member {i}")
    return dirs


@pytest.mark.parametrize("optim", list(OWN))
def test_members_of_their_own_lr_and_weight_decay_equal_solo_runs(tmp_path, optim):
    cfgs = [cfg(s, **SHARED, **own) for s, own in zip(SEEDS, OWN[optim])]
    dirs = _equal_solo_runs(cfgs, tmp_path)
    lrs = [[json.loads(line)["lr"] for line in (d / "metrics.jsonl").read_text().splitlines()] for d in dirs]
    assert lrs[0][0] < lrs[1][0] < lrs[2][0]  # each its own schedule


def test_csr_swmlp_members_equal_solo_runs(tmp_path):
    """SW-MLPs with CSR weights, each member its own mask (and number of kept weights) and learning rate."""
    csr = {**SHARED, "model.name": "swmlp_t4_28", "model.embed_dim": 4, "model.depth": 2}
    dirs = _equal_solo_runs([cfg(s, **csr, **own) for s, own in zip(SEEDS, OWN["adamw"])], tmp_path)
    nnz = [read_checkpoint(d / "checkpoints" / "latest.pt")["state_dict"]["blocks.0.linears.0.values"].numel()
           for d in dirs]
    assert len(set(nnz)) == 3


CLIP = 0.2  # about the median of the members' gradient norms


def test_clipping_and_polyak_average_equal_solo_runs(tmp_path, monkeypatch):
    """optim.clip_grad clips each member by its own global norm (it binds: the members' norms exceed it) and
    optim.ema_decay keeps each member's average - checkpointed, restacked on resume and evaluated - as alone."""
    norms, clip = [], stacked_runs.clip_member_grads_
    monkeypatch.setattr(stacked_runs, "clip_member_grads_", lambda model, bound: norms.append(clip(model, bound)))
    extra = {**SHARED, "optim.clip_grad": CLIP, "optim.ema_decay": 0.9}
    cfgs = [cfg(s, **extra, **own) for s, own in zip(SEEDS, OWN["sgd"])]  # SGD: the step is linear in the clip
    dirs = _equal_solo_runs(cfgs, tmp_path, stop_after=1)
    above = torch.stack(norms) > CLIP  # (steps, members)
    assert above.any(0).all(), "the clip should bind for every member"
    for d in dirs:
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert all("ema_test_error" in r for r in rows) and "final_ema_test_error" in outcome(d)["summary"]
        assert "ema" in read_checkpoint(d / "checkpoints" / "latest.pt")


def _child(dirs: list[Path], *, resume: bool = False, fault: str | None = None, trace: Path | None = None) -> int:
    """train_stack of the first len(dirs) seeds in a forked child with one thread; its wait status."""
    return forked(lambda: train_stack([cfg(s) for s in SEEDS[:len(dirs)]], dirs, resume=resume, **QUIET),
                  fault, trace)


def test_kill_between_members_regroups_to_the_uninterrupted_result(tmp_path):
    """Killed between two members' writes of an epoch, members are left at different epochs: the resume trains
    the one behind alone until it catches up, then both as one stack, and ends where the uninterrupted run does."""
    reference = [tmp_path / "ref" / f"s{s}" for s in SEEDS[:2]]
    status = _child(reference, trace=tmp_path / "trace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    points = (tmp_path / "trace").read_text().split()
    # appends: member 0's row of epoch 1, member 1's, then epoch 2's; each member's checkpoints follow its row
    assert sum(p.startswith("before-append:") for p in points) == 4
    expected = [outcome(d) for d in reference]
    for fault in ("before-append:2", "after-append:2", "before-append:4", "after-rename:"):
        if fault == "after-rename:":  # member 0's epoch-2 latest.pt in place, member 1's epoch 2 not written
            fault += str(sum(p.startswith("after-rename:") for p in points[:points.index("before-append:4")]))
        run = [tmp_path / fault.replace(":", "-") / f"s{s}" for s in SEEDS[:2]]
        status = _child(run, fault=fault)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"{fault} was not reached"
        done = [read_checkpoint(d / "checkpoints" / "latest.pt")["epoch"] if (d / "checkpoints" / "latest.pt").exists()
                else 0 for d in run]
        assert done[0] == done[1] + 1, f"{fault}: members at epochs {done}"
        status = _child(run, resume=True)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        for d, want in zip(run, expected):
            close(outcome(d), want, f"{fault} {d.name}")
        rows = [json.loads(line) for line in (run[1] / "metrics.jsonl").read_text().splitlines()]
        # behind by epoch 1, member 1 trains it alone and then regroups with member 0 for epoch 2
        assert [r["stack_members"] for r in rows] == ([1, 2] if done[1] == 0 else [2, 1]), fault


def test_diverging_member_stops_alone(solo, tmp_path):
    dirs = [tmp_path / f"s{s}" for s in SEEDS[:2]]
    train_stack([cfg(s) for s in SEEDS[:2]], dirs, stop_after=1, **QUIET)
    latest = dirs[1] / "checkpoints" / "latest.pt"
    payload = read_checkpoint(latest)
    payload["state_dict"]["head.weight"][0, 0] = float("inf")  # its loss goes non-finite in epoch 2
    torch.save(payload, latest)
    solo_copy = tmp_path / "solo1"
    shutil.copytree(dirs[1], solo_copy)
    out = train_stack([None, None], dirs, resume=True, **QUIET)
    assert out[0]["status"] == "finished" and out[1]["status"] == "diverged" and out[1]["epoch"] == 2
    close(outcome(dirs[0]), outcome(solo / "s0"))  # the other member is untouched
    with pytest.raises(TrainingDiverged):
        loop.train(None, solo_copy, resume=True, **QUIET)
    close(outcome(dirs[1]), outcome(solo_copy))  # the status and files a solo run leaves
    assert outcome(dirs[1])["summary"] == {"status": "diverged", "epoch": 2}


@pytest.mark.parametrize("extra, words", [
    ({"optim.betas": [0.8, 0.99]}, "differs from run 0 in optim.betas"),
    ({"optim.clip_grad": 1.0}, "differs from run 0 in optim.clip_grad"),
    ({"model.depth": 1}, "differs from run 0 in model.depth"),
])
def test_refuses_runs_that_differ_in_more_than_seeds(tmp_path, extra, words):
    with pytest.raises(ConfigError, match=words):
        train_stack([cfg(0), cfg(1, **extra)], [tmp_path / "a", tmp_path / "b"], **QUIET)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # no trace left


@pytest.mark.parametrize("extra, words", [
    ({"data.pipeline": "per-sample"}, "resident data pipeline"),
    ({"model.drop_path_rate": 0.1}, "dropout or stochastic depth"),
])
def test_refuses_what_cannot_stack(tmp_path, extra, words):
    with pytest.raises(ConfigError, match=words):
        train_stack([cfg(0, **extra), cfg(1, **extra)], [tmp_path / "a", tmp_path / "b"], **QUIET)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_member_losses_equal_each_members_criterion():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 8, 10, generator=g)
    hard = torch.randint(0, 10, (3, 8), generator=g)
    soft = torch.softmax(torch.randn(3, 8, 10, generator=g), -1)
    for criterion, targets in ((torch.nn.CrossEntropyLoss(), hard), (LabelSmoothingCrossEntropy(0.1), hard),
                               (SoftTargetCrossEntropy(), soft)):
        want = torch.stack([criterion(logits[k], targets[k]) for k in range(3)])
        torch.testing.assert_close(member_losses(criterion, logits, targets), want)


def test_sweep_stacks_runs_that_differ_in_seeds_and_lr(tmp_path):
    one = {"schedule.epochs": 1}
    specs = [RunSpec(f"lr{lr}-s{s}", cfg(s, **one, **{"optim.lr": lr}), {"lr": lr, "seed": s})
             for lr in (0.01, 0.02) for s in SEEDS[:2]]
    drop = {**one, "model.drop_path_rate": 0.1}  # stochastic depth: refused by the stack, trained alone
    specs += [RunSpec(f"drop-s{s}", cfg(s, **drop), {"seed": s}) for s in SEEDS[:2]]
    assert [[s.name for s in g] for g in stack_groups(specs)] == [[s.name for s in specs[:4]],
                                                                  [s.name for s in specs[4:]]]
    kw = dict(workers=1, threads=1, progress=False, log=lambda _: None)
    stacked = run_sweep(specs, tmp_path / "stacked", stack=True, **kw)
    alone = run_sweep(specs, tmp_path / "alone", **kw)
    assert [r["status"] for r in stacked] == ["finished"] * 6
    assert [r["stack"] for r in stacked] == [4, 4, 4, 4, None, None] and {r["stack"] for r in alone} == {None}
    for a, b in zip(stacked, alone):
        assert [c.get("stack_members") for c in a["curve"]] == [a["stack"]]
        curve = [{k: v for k, v in c.items() if not k.startswith("stack")} for c in a["curve"]]
        close(curve, b["curve"], a["run"])
        close(a["final_test_loss"], b["final_test_loss"])
    again = run_sweep(specs, tmp_path / "stacked", stack=True, **kw)  # all done: skipped, the table unchanged
    assert [{k: v for k, v in r.items() if k != "wall_time"} for r in again] == \
        [{k: v for k, v in r.items() if k != "wall_time"} for r in stacked]


# ---- a stacked sweep killed anywhere ----------------------------------------------------------------------

def _sweep_specs() -> list[RunSpec]:
    """Two learning rates and two seeds: one stack of three."""
    return [RunSpec(f"lr{lr}-s{s}", cfg(s, **{"optim.lr": lr}), {"lr": lr, "seed": s})
            for lr, s in ((0.01, 0), (0.01, 1), (0.02, 0))]


def _sweep_child(root: Path, fault: str | None = None, trace: Path | None = None) -> int:
    """``run_sweep(stack=True)`` of :func:`_sweep_specs` in a forked child (one worker: the child itself)."""
    return forked(lambda: run_sweep(_sweep_specs(), root, stack=True, workers=1, threads=1, progress=False,
                                    log=lambda _: None), fault, trace)


def _sweep_outcome(root: Path) -> dict:
    """The table and every run directory's outcome, timing and stack fields dropped."""
    rows = []
    for row in load_rows(root):
        row = {k: v for k, v in row.items() if k not in ("wall_time", "stack")}
        row["curve"] = [{k: v for k, v in c.items() if not k.startswith("stack")} for c in row["curve"]]
        rows.append(row)
    return {"rows": rows, "runs": {s.name: outcome(root / "runs" / s.name) for s in _sweep_specs()}}


# every 4th of the trace's 93 write points (the points come in threes: a stride of 4 meets every kind); all 93
# passed as well, in 5 min on a loaded core
EVERY = 4


@pytest.mark.slow  # 24 kills and resumes of ~3 s each
@pytest.mark.timeout(600)
def test_stacked_sweep_killed_anywhere_resumes_to_the_uninterrupted_table(tmp_path):
    """Issue 15 item 2: ``run_sweep(stack=True)`` killed at write points all through its uninterrupted trace
    (sweep.json, the table, every member's config, rows, checkpoints and summary), then run again, ends with the
    uninterrupted sweep's table and run directories - to float rounding, as members a kill left behind train on
    in a smaller stack until the others' epoch."""
    status = _sweep_child(tmp_path / "ref", trace=tmp_path / "trace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    want = _sweep_outcome(tmp_path / "ref")
    assert [r["status"] for r in want["rows"]] == ["finished"] * 3
    assert [r["stack"] for r in load_rows(tmp_path / "ref")] == [3] * 3
    regrouped = 0
    for i, fault in enumerate((tmp_path / "trace").read_text().split()[::EVERY]):
        root = tmp_path / f"kill{i}"
        status = _sweep_child(root, fault=fault)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"{fault} was not reached"
        status = _sweep_child(root)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, fault
        close(_sweep_outcome(root), want, fault)
        assert not [p for p in root.rglob("*") if atomic.is_temp_file(p)], fault  # the sweep root's too
        regrouped += any(c["stack_members"] < 3 for r in load_rows(root) for c in r["curve"])
    assert regrouped, "some kill should leave members at different epochs"
