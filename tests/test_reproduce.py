"""`pkmixer reproduce` and `pkmixer report`: the fig5 smoke scale end to end, a sweep killed part-way and run
again, re-rendering, and refusals (exit status 2, one line)."""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkmixer.cli import main
from pkmixer.experiments import get_preset, list_presets
from pkmixer.experiments.sweep import load_rows

from conftest import run_main

SMOKE = ["reproduce", "fig5", "--scale", "smoke", "--threads", "1", "--workers", "1"]


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    """A finished fig5 smoke sweep with its report (made once for the module)."""
    out = tmp_path_factory.mktemp("fig5") / "smoke"
    assert main([*SMOKE, "--out", str(out), "--json"]) == 0
    return out


def _copy(smoke_dir, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(smoke_dir, target)
    return target


def test_smoke_end_to_end(smoke_dir, tmp_path, capsys):
    rows = load_rows(smoke_dir)
    preset = get_preset("fig5")
    assert len(rows) == len(preset.runs("smoke", None)) == 6
    assert all(r["status"] == "finished" and r["epochs"] == 1 for r in rows)
    assert {r["model"] for r in rows} == {"S-Mixer", "RP S-Mixer", "SW-MLP"}
    report = smoke_dir / "report"
    assert {p.name for p in report.iterdir()} == {"report.md", "fig5.png", "fig5.svg", "fig5_curves.png",
                                                   "fig5_curves.svg", "fig5.csv", "analysis.json"}
    text = (report / "report.md").read_text()
    assert preset.claim in text and "pkmixer reproduce fig5 --scale smoke --dataset digits" in text
    assert "(fig5.png)" in text and "undecided" in text and "6 of 6 finished" in text
    analysis = json.loads((report / "analysis.json").read_text())
    assert analysis["supported"] is None and "least-squares slope" in analysis["verdict"]  # two widths: the slope part
    assert analysis["outcome"] == "undecided" and "rests on one data set" in analysis["data_set"]
    # the same command again: every run skipped, the report up to date and left as it is
    copy = _copy(smoke_dir, tmp_path)
    before = (copy / "report" / "fig5.png").stat().st_mtime_ns
    code, out, _ = run_main(capsys, *SMOKE, "--out", str(copy))
    assert code == 0 and "all 6 runs are done" in out and "(up to date, unchanged)" in out
    assert f"figure: {copy / 'report' / 'fig5.png'}" in out and "verdict: Error against effective width" in out
    assert (copy / "report" / "fig5.png").stat().st_mtime_ns == before


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\tZ" not in status.split("State:")[1].splitlines()[0]


@pytest.mark.slow  # a kill test; test_smoke_end_to_end runs the same sweep in the default tier
def test_killed_sweep_resumes_with_complete_table(tmp_path):
    """SIGKILL the driver of a 2-worker sweep after 2 runs finished: its workers die with it, and the same
    command again completes the table - every run once - without retraining the finished runs."""
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pkmixer.cli", *SMOKE[:-1], "2", "--threads", "1",
                             "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = out / "results.jsonl"
    deadline = time.time() + 120
    finished = 0
    while finished < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
        if results.exists():
            finished = sum(json.loads(line)["status"] == "finished" for line in results.read_text().splitlines())
    assert proc.poll() is None, "the sweep ended before it could be killed"
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    workers = [int(p) for p in children.read_text().split()] if children.exists() else []
    assert workers or not children.exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while any(_alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers), "worker processes outlived the killed sweep"
    done_before = {r["run"]: r for r in load_rows(out) if r["status"] == "finished"}
    assert 2 <= len(done_before) < 6
    stamps = {name: (out / "runs" / name / "summary.json").stat().st_mtime_ns for name in done_before}

    assert main([*SMOKE, "--out", str(out)]) == 0
    table = [json.loads(line) for line in results.read_text().splitlines()]
    names = [r["run"] for r in table]
    assert sorted(names) == sorted(s.name for s in get_preset("fig5").runs("smoke", None))  # complete, unique
    assert all(r["status"] == "finished" and r["epochs"] == 1 for r in table)
    assert all((out / "runs" / n / "summary.json").stat().st_mtime_ns == t for n, t in stamps.items())  # not rerun
    assert [r for r in table if r["run"] in done_before] == list(done_before.values())
    assert (out / "report" / "fig5.png").is_file()


def test_report_rerenders(smoke_dir, tmp_path, capsys):
    copy = _copy(smoke_dir, tmp_path)
    shutil.rmtree(copy / "report")
    code, out, _ = run_main(capsys, "report", str(copy))
    assert code == 0 and f"figure: {copy / 'report' / 'fig5.svg'}" in out
    assert (copy / "report" / "report.md").read_text() == (smoke_dir / "report" / "report.md").read_text()
    # the same results: rendered again all the same (the preset's analysis may have changed), not "up to date"
    (copy / "report" / "report.md").write_text("an older analysis\n")
    code, out, _ = run_main(capsys, "report", str(copy))
    assert code == 0 and "up to date" not in out
    assert (copy / "report" / "report.md").read_text() == (smoke_dir / "report" / "report.md").read_text()
    # other results (here: a run's last test error edited) and a report on disk: refused without --overwrite
    metrics = copy / "runs" / "swmlp-o512-m23-s0" / "metrics.jsonl"
    line = json.loads(metrics.read_text())
    metrics.write_text(json.dumps({**line, "test_error": 0.5}) + "\n")
    snapshot = {p.name: p.read_bytes() for p in (copy / "report").iterdir()}
    code, _, err = run_main(capsys, "report", str(copy))
    assert code == 2 and "pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in (copy / "report").iterdir()} == snapshot
    code, out, _ = run_main(capsys, "report", str(copy), "--overwrite", "--json")
    result = json.loads(out)
    assert code == 0 and result["up_to_date"] is False
    assert "| SW-MLP | 512 | - | - | 23 | 1 | 0.5 |" in (copy / "report" / "report.md").read_text()
    assert not [p for p in copy.iterdir() if p.name.startswith(".report")]  # no staging left behind


def test_list(capsys):
    code, out, _ = run_main(capsys, "reproduce", "--list", "--json")
    records = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and records["fig5"]["runs"] == {"paper": 111, "medium": 71, "small": 10, "smoke": 6}
    assert records["figs9"]["runs"]["medium"] is None  # analysis-only presets have no medium scale
    assert len(records) == len(list_presets())
    code, out, _ = run_main(capsys, "reproduce", "--list")
    assert code == 0 and "fig5" in out and "App. C.4" in out


def test_paper_scale_settings():
    """App. C.4: the (C, S) pairs, SW-MLP widths and the optimiser of the paper's Fig. 5."""
    specs = get_preset("fig5").runs("paper", "stl10")
    pairs = {(s.meta["omega"], s.meta["C"], s.meta["S"]) for s in specs if s.meta["model"] == "S-Mixer"}
    assert {(C, S) for o, C, S in pairs if o == 2**18} == {(16, 173), (32, 113), (48, 83), (83, 48), (113, 32),
                                                           (173, 16)}
    assert {(C, S) for o, C, S in pairs if o == 2**21} == {(16, 504), (32, 346), (64, 226), (226, 64), (346, 32),
                                                           (504, 16)}
    assert {(C, S) for o, C, S in pairs if o == 2**27} == {(128, 1386), (256, 904), (904, 256), (1386, 128)}
    assert sorted(s.meta["width"] for s in specs if s.meta["model"] == "SW-MLP" and s.meta["seed"] == 0) == \
        [540, 612, 724, 935, 1619]
    config = specs[0].config
    o = config.optim
    assert (o.name, o.lr, o.momentum, o.nesterov, o.weight_decay) == ("sgd", 0.02, 0.9, True, 0.0)
    assert config.schedule.epochs == 200 and config.data.batch_size == 128
    assert config.data.resize == 32 and config.model.options["depth"] == 8
    assert {s.meta["seed"] for s in specs} == {0, 1, 2}


def test_refusals(smoke_dir, tmp_path, capsys):
    cases = [
        (["reproduce", "fig55"], "unknown preset 'fig55'; did you mean fig5"),
        (["reproduce", "fig5", "--scale", "huge"], "unknown scale 'huge'"),
        (["reproduce", "fig5", "--scale", "smoke", "--dataset", "cifar10"], "runs on digits, not cifar10"),
        (["reproduce", "fig5", "--scale", "smoke", "--dataset", "imagenet"], "unknown data set for preset fig5"),
        (["reproduce", "fig5", "--scale", "paper", "--data-dir", str(tmp_path / "none")], "CIFAR-10 not found"),
        (["reproduce", "fig5", "--address", "10.0.0.1:6379", "--out", str(tmp_path / "a")], "needs --backend ray"),
        (["reproduce", "fig5", "--scale", "smoke", "--workers", "0", "--out", str(tmp_path / "w")], "--workers"),
        (["reproduce", "fig5", "--scale", "smoke", "--seeds", "0"], "--seeds must be a positive integer"),
        (["reproduce", "fig5", "--list"], "not both"),
        (["reproduce"], "name a preset"),
        (["reproduce", "fig5", "--backend", "slurm"], "invalid choice"),
        (["reproduce", "fig5", "--scale", "small", "--dataset", "digits", "--out", str(smoke_dir)], "holds the sweep"),
        (["report", str(tmp_path)], "not a sweep directory"),
    ]
    for args, needle in cases:
        code, _, err = run_main(capsys, *args)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "a").exists()


def test_fashion_mnist_falls_back_to_digits_when_absent(monkeypatch):
    """make demo on a machine without Fashion-MNIST: the bundled digits, said in a line; asked for by name, the
    missing data set is an error."""
    from pkmixer.errors import ConfigError
    from pkmixer.experiments import reproduce as rep

    def absent(dataset, data_dir):
        if dataset == "fashion-mnist":
            raise ConfigError("Fashion-MNIST not found: looked in /nowhere")

    monkeypatch.setattr(rep, "_available", absent)
    lines = []
    dataset, specs = rep.preset_runs(get_preset("fig5"), "small", None, None, check=True, log=lines.append)
    assert dataset == "digits" and {s.config.data.name for s in specs} == {"digits"}
    assert {s.config.model.options["img_size"] for s in specs} == {8}
    assert len(lines) == 1 and "using scikit-learn's bundled digits instead" in lines[0]
    with pytest.raises(ConfigError, match="Fashion-MNIST not found"):
        rep.preset_runs(get_preset("fig5"), "small", "fashion-mnist", None, check=True, log=lines.append)


def test_epochs_replaces_the_scales_epochs_and_doubles_the_doubling_runs(tmp_path, capsys):
    """--epochs N: every run trains N epochs, the convergence-check runs (meta "doubles") 2N; the sweep
    directory remembers N, so the same directory is refused to another N; a preset that varies its runs'
    epochs refuses the flag."""
    from pkmixer.errors import ConfigError
    from pkmixer.experiments.reproduce import default_out, with_epochs

    specs = get_preset("fig5").runs("medium", "digits")
    longer = with_epochs(specs, 20, "fig5")
    assert {s.config.schedule.epochs for s in longer if "doubles" not in s.meta} == {20}
    assert {s.config.schedule.epochs for s in longer if "doubles" in s.meta} == {40}
    assert [s.name for s in longer] == [s.name for s in specs]
    assert str(default_out("fig5", "medium", "digits", 20)) == "results/fig5-medium-e20-digits"
    mixed = [specs[0], dataclasses.replace(specs[1], config=specs[1].config.override({"schedule.epochs": 3}))]
    with pytest.raises(ConfigError, match="varies the epochs"):
        with_epochs(mixed, 20, "fig5")
    out = tmp_path / "e2"
    assert main([*SMOKE, "--epochs", "2", "--out", str(out), "--json"]) == 0
    assert {r["epochs"] for r in load_rows(out)} == {2}
    assert json.loads((out / "sweep.json").read_text())["info"]["epochs"] == 2
    capsys.readouterr()
    code, _, err = run_main(capsys, *SMOKE, "--epochs", "3", "--out", str(out))
    assert code == 2 and "--epochs 2" in err


def test_compile_trains_every_run_compiled_and_the_directory_remembers_it(tmp_path, capsys):
    """--compile MODE sets run.compile and run.compile_mode on every run and nothing else; a directory made
    without it is refused to it (its runs are other configs), naming the command that made it."""
    from pkmixer.experiments.reproduce import compiled_runs

    specs = get_preset("fig5").runs("smoke", None)
    graphs = compiled_runs(specs, "reduce-overhead")
    assert all(g.config.run.compile and g.config.run.compile_mode == "reduce-overhead" for g in graphs)
    assert [g.config.override({"run.compile": False, "run.compile_mode": "default"}) for g in graphs] == \
        [s.config for s in specs]
    out = tmp_path / "eager"
    assert main([*SMOKE, "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    code, _, err = run_main(capsys, *SMOKE, "--compile", "reduce-overhead", "--out", str(out))
    assert code == 2 and "holds the sweep of" in err and "--compile" not in err.split("holds the sweep of")[1]
