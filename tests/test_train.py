"""End-to-end training: accuracy on real and synthetic data, exact resume (also after SIGKILL), torchrun,
divergence, and refusals that leave the disk untouched."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pkmixer import kernels
from pkmixer.cli import main
from pkmixer.train import build, engine, evaluation, loop
from pkmixer.checkpoint import read_checkpoint
from pkmixer.errors import ConfigError
from pkmixer.train.config import build_config

from conftest import run_main

# a tiny S-Mixer on the bundled 8x8 digits: 16 tokens of 2x2 patches
DIGITS = {"data.name": "digits", "model.name": "smixer_t4_28", "model.img_size": 8, "model.patch_size": 2,
          "model.in_chans": 1, "data.batch_size": 32, "optim.name": "adamw", "optim.lr": 0.005, "run.progress": False}
# a synthetic task small enough for a few seconds per run
SYNTH = {"data.name": "synthetic", "model.name": "smixer_t4_28", "model.depth": 2, "model.embed_dim": 32,
         "data.batch_size": 64, "optim.name": "adamw", "optim.lr": 0.003, "schedule.epochs": 4,
         "run.progress": False}
FASHION = Path("/usr/share/datasets/fashion-mnist")


def quiet(_: str) -> None:
    pass


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(run_dir / "checkpoints" / "latest.pt")["state_dict"]


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("epoch_time")
    return rows


@pytest.mark.slow  # 12 epochs; test_digits_one_epoch_run_and_eval is its default-tier counterpart
def test_digits_reach_90_percent(tmp_path):
    summary = loop.train(build_config(None, {**DIGITS, "schedule.epochs": 12, "data.val_fraction": 0.1}),
                         tmp_path / "run", log=quiet)
    assert summary["status"] == "finished" and summary["selection"] == "val_error"
    assert summary["selected_test_error"] <= 0.10
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir()) == [".lock", "checkpoints", "config.yaml", "metrics.jsonl", "summary.json"]
    assert len(_metrics(run)) == 12
    # eval reproduces the validation-selected checkpoint's test error exactly
    result = evaluation.evaluate_run(run)
    assert result["checkpoint"] == "best" and result["selection"] == "val_error"
    assert result["epoch"] == summary["selected_epoch"]
    assert result["test_error"] == pytest.approx(summary["selected_test_error"])


def test_digits_one_epoch_run_and_eval(tmp_path):
    """The quick counterpart of test_digits_reach_90_percent: one epoch on 256 images (200 to test, a tenth of
    the training set held out to validate), the run directory's files, and eval reproducing the selected
    checkpoint's error."""
    run = tmp_path / "run"
    summary = loop.train(build_config(None, {**DIGITS, "schedule.epochs": 1, "data.train_subset": 256,
                                              "data.test_subset": 200, "data.val_fraction": 0.1}), run, log=quiet)
    assert summary["status"] == "finished" and summary["selected_test_error"] < 0.9  # 10 classes: chance is 0.9
    assert sorted(p.name for p in run.iterdir()) == [".lock", "checkpoints", "config.yaml", "metrics.jsonl", "summary.json"]
    assert len(_metrics(run)) == 1
    assert evaluation.evaluate_run(run, "best")["test_error"] == pytest.approx(summary["selected_test_error"])


@pytest.mark.slow  # training to an accuracy
def test_synthetic_is_learned(tmp_path):
    summary = loop.train(build_config(None, SYNTH), tmp_path / "run", log=quiet)
    assert summary["final_test_error"] < 0.3  # 10 classes: chance is 0.9


@pytest.mark.slow  # training to an accuracy; tests/test_data.py reads the real files in the default tier
@pytest.mark.skipif(not FASHION.exists(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist(tmp_path):
    cfg = build_config(None, {"data.name": "fashion-mnist", "model.name": "smixer_t4_28", "model.depth": 2,
                              "data.train_subset": 6000, "data.test_subset": 2000, "data.batch_size": 64,
                              "optim.name": "adamw", "optim.lr": 0.003, "schedule.epochs": 2, "run.progress": False})
    summary = loop.train(cfg, tmp_path / "run", log=quiet)
    assert summary["final_test_error"] < 0.30


@pytest.mark.slow  # test_stop_and_resume_is_exact_tiny is its default-tier counterpart
def test_stop_and_resume_is_exact(tmp_path):
    cfg = build_config(None, SYNTH)
    loop.train(cfg, tmp_path / "straight", log=quiet)
    first = loop.train(cfg, tmp_path / "pieces", stop_after=1, log=quiet)
    assert first["status"] == "stopped" and first["epochs_done"] == 1
    loop.train(None, tmp_path / "pieces", resume=True, stop_after=2, log=quiet)
    loop.train(None, tmp_path / "pieces", resume=True, log=quiet)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "pieces")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(tmp_path / "straight") == _metrics(tmp_path / "pieces")


def test_stop_and_resume_is_exact_tiny(tmp_path):
    """The quick counterpart of test_stop_and_resume_is_exact: two epochs of a few steps, stopped after the first."""
    cfg = build_config(None, {**SYNTH, "schedule.epochs": 2, "data.train_subset": 128, "data.test_subset": 64})
    loop.train(cfg, tmp_path / "straight", log=quiet)
    first = loop.train(cfg, tmp_path / "pieces", stop_after=1, log=quiet)
    assert first["status"] == "stopped" and first["epochs_done"] == 1
    assert loop.train(None, tmp_path / "pieces", resume=True, log=quiet)["status"] == "finished"
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "pieces")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(tmp_path / "straight") == _metrics(tmp_path / "pieces")


def test_resume_keeps_the_thread_count_the_run_was_checkpointed_with(tmp_path, monkeypatch):
    """CPU results are bit-exact only at one thread count, and the default count follows the load: a resume
    without an explicit count takes the one the checkpoint records, and says so; an explicit one wins."""
    cfg = build_config(None, {**SYNTH, "schedule.epochs": 3, "data.train_subset": 64, "data.test_subset": 32})
    seen = []
    real_epoch = engine.StepEngine.train_epoch

    def recording(self, epoch):
        seen.append(torch.get_num_threads())
        return real_epoch(self, epoch)

    monkeypatch.setattr(engine.StepEngine, "train_epoch", recording)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        loop.train(cfg, tmp_path / "run", stop_after=1, log=quiet)
        assert read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")["threads"] == 1
        torch.set_num_threads(2)  # the load changed between the invocations
        lines = []
        loop.train(None, tmp_path / "run", resume=True, stop_after=1, log=lines.append)
        assert seen == [1, 1] and any("torch threads: 1, the count the run was checkpointed with" in x for x in lines)
        loop.train(None, tmp_path / "run", resume=True, log=quiet, threads=2)
        assert seen == [1, 1, 2]
    finally:
        torch.set_num_threads(before)
    environment = json.loads((tmp_path / "run" / "summary.json").read_text())["environment"]
    assert environment["threads"] == 2 and environment["layer_norm_kernel"] == kernels.describe("layer_norm")


@pytest.mark.slow  # a kill test: a subprocess SIGKILLed mid-epoch
def test_sigkill_mid_epoch_then_resume_is_exact(tmp_path):
    overrides = {**SYNTH, "schedule.epochs": 3, "data.batch_size": 16}
    args = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
    loop.train(build_config(None, overrides), tmp_path / "straight", log=quiet)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "pkmixer.cli", "train", *args, "--run-dir", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / "latest.pt"
    deadline = time.time() + 120
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # into epoch 2 (an epoch takes about a second here)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert read_checkpoint(latest)["epoch"] < 3  # the checkpoint on disk is whole and readable
    assert main(["train", "--run-dir", str(killed), "--resume"]) == 0
    a, b = _weights(tmp_path / "straight"), _weights(killed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(tmp_path / "straight") == _metrics(killed)


@pytest.mark.slow  # torchrun: two processes that each import torch
def test_torchrun_two_processes_match_one(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    overrides = {**SYNTH, "schedule.epochs": 2, "data.batch_size": 32, "data.workers": 0}
    args = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", "29533", "-m", "pkmixer.cli", "train", *args,
                    "--run-dir", str(tmp_path / "two")], check=True, env=env, capture_output=True, timeout=300)
    loop.train(build_config(None, overrides), tmp_path / "one", log=quiet)
    two, one = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    for k in one:
        assert torch.allclose(two[k].float(), one[k].float(), atol=1e-4, rtol=1e-3), k
    m_two, m_one = _metrics(tmp_path / "two"), _metrics(tmp_path / "one")
    assert [r["test_examples"] for r in m_two] == [r["test_examples"] for r in m_one]
    for r2, r1 in zip(m_two, m_one):
        assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=1e-4)
        assert r2["test_error"] == pytest.approx(r1["test_error"], abs=2 / r1["test_examples"])
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["processes"] == 2


def test_nan_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    """Fault injection: once the first checkpoint exists, the model's training outputs turn to NaN."""
    run = tmp_path / "run"
    real_build = build.build_model

    def poisoned(model_cfg, num_classes):
        model = real_build(model_cfg, num_classes)

        def hook(module, inputs, output):
            good = (run / "checkpoints" / "latest.pt").exists() and module.training
            return output * float("nan") if good else output
        model.register_forward_hook(hook)
        return model

    monkeypatch.setattr(build, "build_model", poisoned)
    args = [arg for k, v in SYNTH.items() for arg in ("--set", f"{k}={v}")]
    code = main(["train", *args, "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 1 and "loss became nan" in err and len(err.strip().splitlines()) == 1
    assert read_checkpoint(run / "checkpoints" / "latest.pt")["epoch"] >= 1  # the last good one is intact
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


def test_refusals_leave_disk_untouched(tmp_path, capsys):
    run = tmp_path / "run"
    settings = [arg for k, v in {**SYNTH, "schedule.epochs": 1}.items() for arg in ("--set", f"{k}={v}")]
    assert main(["train", *settings, "--run-dir", str(run)]) == 0
    snapshot = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}

    cases = [
        (["train", *settings, "--run-dir", str(run)], "exists; pass --resume"),
        (["train", "--set", "optim.lr=-1", "--run-dir", str(tmp_path / "x")], "optim.lr"),
        (["train", "--set", "data.name=cifar10", "--set", f"data.data_dir={tmp_path / 'nothing'}",
          "--run-dir", str(tmp_path / "y")], "nothing"),
        (["train", "--run-dir", str(run), "--resume", "--set", "optim.lr=0.5"], "keeps its own config"),
        (["train", "--run-dir", str(tmp_path / "none"), "--resume"], "no run directory"),
        (["eval", str(tmp_path / "none")], "no run directory or checkpoint"),
        (["train", str(tmp_path / "missing.yaml")], "no config file"),
        (["train", "--set", "model.name=nope"], "unknown model"),
        # refused once the data set is read, after the run directory and two folders above it were made
        (["train", *settings, "--set", "data.batch_size=100000", "--run-dir", str(tmp_path / "z" / "w" / "run")],
         "exceeds the"),
    ]
    for args, needle in cases:
        code, _, err = run_main(capsys, *args)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == snapshot
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists() and not (tmp_path / "z").exists()

    # a corrupt or foreign latest checkpoint: refused, and left as it is
    latest = run / "checkpoints" / "latest.pt"
    latest.write_bytes(b"not a checkpoint")
    code, _, err = run_main(capsys, "eval", str(run), "--checkpoint", "latest")
    assert code == 2 and "not a readable checkpoint" in err
    torch.save({"weights": torch.zeros(2)}, latest)
    code, _, err = run_main(capsys, "train", "--run-dir", str(run), "--resume")
    assert code == 2 and "not a pkmixer checkpoint" in err
    assert set(torch.load(latest, weights_only=True)) == {"weights"}


def test_cka_reads_run_directories_and_data(tmp_path, capsys):
    run = tmp_path / "run"
    loop.train(build_config(None, {**DIGITS, "schedule.epochs": 1}), run, log=quiet)
    code = main(["cka", str(run), str(run), "--data", "digits", "--batches", "2", "--batch-size", "16", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["diagonal_mean"] == pytest.approx(1.0) and result["n_examples"] == 32


def test_finetune_at_higher_resolution(tmp_path, capsys):
    """Mixer supp. C: the fine-tuned run starts from the block-diagonally enlarged checkpoint."""
    from pkmixer.models.resolution import enlarge_resolution
    from pkmixer.models.restore import load_model

    small_run = tmp_path / "small"
    loop.train(build_config(None, {**DIGITS, "schedule.epochs": 2}), small_run, log=quiet)
    args = ["finetune", str(small_run), "--image-size", "16", "--set", "data.name=digits", "--set",
            "schedule.epochs=1", "--set", "optim.lr=1e-12", "--set", "run.progress=false", "--run-dir",
            str(tmp_path / "big")]
    assert main(args) == 0
    capsys.readouterr()
    tuned = load_model(tmp_path / "big" / "checkpoints" / "latest.pt")
    expected = enlarge_resolution(load_model(small_run / "checkpoints" / "latest.pt"), 2)  # no validation split
    assert tuned.img_size == 16 and tuned.token_tiles == 2
    for key, value in expected.state_dict().items():  # lr 1e-12: the weights are still the enlarged ones
        assert torch.allclose(tuned.state_dict()[key], value, atol=1e-6), key
    assert main(["finetune", str(small_run), "--image-size", "12", "--set", "data.name=digits",
                 "--run-dir", str(tmp_path / "odd")]) == 2
    assert "integer multiple" in capsys.readouterr().err


def test_the_test_split_selects_nothing(tmp_path):
    """Two runs that differ only in their test split select the same epoch and write the same best.pt, and every
    training and validation number is the same; only the test numbers move. The test errors are chosen so that
    selecting on them would pick epoch 4 in one run and epoch 5 in the other."""
    base = {**DIGITS, "model.depth": 1, "model.embed_dim": 16, "data.train_subset": 256, "data.val_fraction": 0.2,
            "optim.lr": 0.1, "schedule.epochs": 5}
    runs = {n: tmp_path / f"test{n}" for n in (100, 300)}
    summaries = {n: loop.train(build_config(None, {**base, "data.test_subset": n}), d, log=quiet)
                 for n, d in runs.items()}
    rows = {n: _metrics(d) for n, d in runs.items()}
    lowest_test = {n: min(r, key=lambda row: row["test_error"])["epoch"] for n, r in rows.items()}
    assert lowest_test[100] != lowest_test[300]  # a selection on the test split would differ
    strip = [{k: v for k, v in row.items() if not k.startswith("test_")} for row in rows[100]]
    assert strip == [{k: v for k, v in row.items() if not k.startswith("test_")} for row in rows[300]]
    assert summaries[100]["selected_epoch"] == summaries[300]["selected_epoch"] == \
        min(rows[100], key=lambda row: (row["val_error"], row["epoch"]))["epoch"]
    best = {n: read_checkpoint(d / "checkpoints" / "best.pt") for n, d in runs.items()}
    assert best[100]["epoch"] == best[300]["epoch"] == summaries[100]["selected_epoch"]
    assert all(torch.equal(best[100]["state_dict"][k], v) for k, v in best[300]["state_dict"].items())


def test_a_run_without_a_validation_split_selects_nothing(tmp_path):
    """No validation split: no best.pt, the summary says so, and eval takes latest.pt."""
    run = tmp_path / "run"
    summary = loop.train(build_config(None, {**DIGITS, "schedule.epochs": 2, "data.train_subset": 128,
                                              "data.test_subset": 100}), run, log=quiet)
    assert summary["selection"] == "none" and summary["selected_epoch"] is None
    assert not (run / "checkpoints" / "best.pt").exists()
    result = evaluation.evaluate_run(run)
    assert result["checkpoint"] == "latest" and result["epoch"] == 2 and result["selection"].startswith("none")
    assert result["test_error"] == pytest.approx(summary["final_test_error"])
    with pytest.raises(ConfigError, match="no best.pt"):
        evaluation.evaluate_run(run, "best")
