"""Sweeps: one row per run whatever happened before, skip and resume, refusals, failures, the Ray backend."""
import json

import pytest
import torch

from pkmixer.errors import ConfigError
from pkmixer.experiments import sweep
from pkmixer.experiments.sweep import RunSpec, load_rows, run_sweep
from pkmixer.train import loop
from pkmixer.checkpoint import read_checkpoint
from pkmixer.train.config import build_config

# a tiny S-Mixer on the bundled 8x8 digits: well under a second per epoch
TINY = {"model": {"name": "smixer_t4_28", "img_size": 8, "patch_size": 2, "in_chans": 1, "depth": 1, "embed_dim": 8},
        "data": {"name": "digits", "batch_size": 50, "train_subset": 400, "test_subset": 200}, "optim": {"name": "adamw", "lr": 0.005},
        "schedule": {"epochs": 2}, "run": {"progress": False}}


def spec(name: str, seed: int = 0, **sections) -> RunSpec:
    config = {k: dict(v) for k, v in TINY.items()}
    for section, values in sections.items():
        config[section].update(values)
    config["run"]["seed"] = seed
    return RunSpec(name, build_config(config), {"seed": seed, "family": "tiny"})


def quiet(_: str) -> None:
    pass


def _table(sweep_dir):
    lines = (sweep_dir / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_rows_skip_and_resume(tmp_path):
    specs = [spec("a", 0), spec("b", 1), spec("c", 2)]
    # b: interrupted after its first epoch (resumable); c: created, killed before its first checkpoint
    loop.train(specs[1].config, tmp_path / "runs" / "b", stop_after=1, log=quiet)
    (tmp_path / "runs" / "c").mkdir(parents=True)
    (tmp_path / "runs" / "c" / "config.yaml").write_text("model: {}\n")

    lines = []
    rows = run_sweep(specs, tmp_path, workers=1, threads=1, log=lines.append)
    assert [r["run"] for r in rows] == ["a", "b", "c"]
    assert all(r["status"] == "finished" and r["epochs"] == 2 for r in rows)
    assert rows[0]["seed"] == 0 and rows[0]["family"] == "tiny" and 0 <= rows[0]["final_test_error"] < 1
    assert "1 to resume, 2 to start" in lines[0] and lines[-1].startswith("[3/3]")
    assert _table(tmp_path) == rows == load_rows(tmp_path)
    assert (tmp_path / "results.csv").read_text().count("\n") == 4
    # the resumed run equals an uninterrupted one (exact on CPU)
    loop.train(specs[1].config, tmp_path / "straight", log=quiet)
    a = read_checkpoint(tmp_path / "straight" / "checkpoints" / "latest.pt")["state_dict"]
    b = read_checkpoint(tmp_path / "runs" / "b" / "checkpoints" / "latest.pt")["state_dict"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)  # bitwise only at equal thread counts

    # again: nothing to do, nothing touched; a new spec is added with its own row
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*") if p.is_file()}
    lines.clear()
    rows = run_sweep([*specs, spec("d", 3)], tmp_path, workers=1, log=lines.append)
    assert "3 done" in lines[0] and len(rows) == 4 and len(_table(tmp_path)) == 4
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_refusals(tmp_path):
    run_sweep([spec("a")], tmp_path, workers=1, progress=False)
    cases = [
        ([spec("a", optim={"lr": 0.1})], "another config (optim.lr"),
        ([spec("x"), spec("x")], "appears twice"),
        ([RunSpec("../up", build_config(TINY), {})], "directory name"),
        ([RunSpec("m", build_config(TINY), {"status": 1})], "reserved"),
        ([RunSpec("m", TINY, {})], "its config must be a TrainConfig"),
        ([spec("n", model={"depth": 0})], "run n: depth must be a positive integer"),
        ([spec("o", model={"colour": 1})], "unknown option"),
        ([spec("p", data={"name": "auto"})], "data.name=auto"),
    ]
    for specs, needle in cases:
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
            run_sweep(specs, tmp_path, workers=1, progress=False)
    with pytest.raises(ConfigError, match="backend"):
        run_sweep([spec("a")], tmp_path, backend="slurm")
    with pytest.raises(ConfigError, match="--workers"):
        run_sweep([spec("q")], tmp_path, workers=0)
    # a run directory holding files a run does not write is never deleted
    foreign = tmp_path / "runs" / "r"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    rows = run_sweep([spec("r")], tmp_path, workers=1, progress=False)
    assert rows[0]["status"] == "failed" and "notes.txt" in rows[0]["error"]
    assert (foreign / "notes.txt").read_text() == "mine"


def test_failed_run_is_recorded_and_retried(tmp_path):
    missing = spec("cifar", data={"name": "cifar10", "data_dir": str(tmp_path / "nothing")},
                   model={"img_size": 32, "patch_size": 4, "in_chans": 3})
    rows = run_sweep([spec("ok"), missing], tmp_path, workers=1, progress=False)
    assert rows[0]["status"] == "finished"
    assert rows[1]["status"] == "failed" and "CIFAR-10 not found" in rows[1]["error"]
    assert "CIFAR-10 not found" in (tmp_path / "logs" / "cifar.log").read_text()
    assert _table(tmp_path) == rows
    rows = run_sweep([spec("ok"), missing], tmp_path, workers=1, progress=False)  # retried, fails again
    assert [r["status"] for r in rows] == ["finished", "failed"]


def test_one_driver_at_a_time(tmp_path):
    import fcntl

    tmp_path.joinpath(".lock").touch()
    with open(tmp_path / ".lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ConfigError, match="another process .*is running the sweep in"):
            run_sweep([spec("a")], tmp_path, workers=1, progress=False)


@pytest.mark.slow  # starts a Ray cluster
def test_ray_backend(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'pkmixer[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        specs = [spec("a", 0), spec("b", 1)]
        loop.train(specs[1].config, tmp_path / "runs" / "b", stop_after=1, log=quiet)
        lines = []
        rows = run_sweep(specs, tmp_path, backend="ray", log=lines.append)
        assert [(r["run"], r["status"], r["epochs"]) for r in rows] == [("a", "finished", 2), ("b", "finished", 2)]
        assert "1 to resume" in lines[0] and "Ray: 2 CPUs" in lines[1]
        assert _table(tmp_path) == rows
        # the same results as the local backend
        local = run_sweep(specs, tmp_path / "local", workers=1, threads=1, progress=False)
        assert [r["final_test_error"] for r in local] == [r["final_test_error"] for r in rows]
        rows_again = run_sweep(specs, tmp_path, backend="ray", progress=False)
        assert rows_again == rows
    finally:
        ray.shutdown()


def test_workers_share_gpus_round_robin(monkeypatch):
    """More workers than GPUs share them: worker k takes GPU k mod the count; the default stays one per GPU."""
    monkeypatch.setattr(sweep, "available_cores", lambda: 16)
    assert sweep._plan(100, None, None, 1) == (1, 16)
    assert sweep._plan(100, 8, None, 1) == (8, 2)
    assert sweep._plan(3, 8, None, 2) == (3, 5)
    assert sweep.gpu_assignment(5, 2) == [0, 1, 0, 1, 0]


def test_each_run_is_handed_on_as_it_ends(tmp_path):
    """on_row sees every run's finished row at its end, before the sweep returns (what reproduce records at once)."""
    seen = []

    def on_row(s, row):
        seen.append((s.name, row["status"], (tmp_path / "results.jsonl").read_text().count('"finished"')))

    run_sweep([spec("a", 0), spec("b", 1)], tmp_path, workers=1, threads=1, log=quiet, on_row=on_row)
    assert seen == [("a", "finished", 1), ("b", "finished", 2)]
