"""The command line and bad input: one clear error, exit status 2; --version, --help without torch, threads."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import pkmixer
from pkmixer.cli import main
from pkmixer.errors import ConfigError

from conftest import run_main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pkmixer.cli", *args], capture_output=True, text=True, timeout=300)


def test_models_json(capsys):
    assert main(["models", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == pkmixer.list_models()
    b16 = next(r for r in records if r["name"] == "mixer_b16_224")
    assert (b16["params"], b16["num_tokens"], b16["embed_dim"], b16["effective_width"]) == (59_880_472, 196, 768, 150528)


def test_models_table_and_filter(capsys):
    assert main(["models", "--filter", "*smixer*"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["model", "family"]
    assert {line.split()[0] for line in out[1:]} == set(pkmixer.list_models("*smixer*"))


def test_effective_json(capsys):
    assert main(["effective", "rp_smixer_c64p4_32", "--set", "depth=2", "--set", "embed_dim=16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["relative_error"] < 1e-10
    assert result["overrides"] == {"depth": 2, "embed_dim": 16}
    assert len(result["layers"]) == 4 and result["effective_width"] == 64 * 16


BAD_CORE_INPUT = [
    (["effective", "mixer_b17"], "did you mean mixer_b16_224"),
    (["effective", "smixer_c64p4_32", "--set", "patch_size=5"], "does not divide"),
    (["effective", "smixer_c64p4_32", "--set", "depth=0"], "depth must be a positive integer"),
    (["effective", "swmlp_t4_28", "--set", "density=1.5"], "(0, 1]"),
    (["effective", "swmlp_t4_28", "--set", "density=0"], "(0, 1]"),
    (["effective", "smixer_c64p4_32", "--set", "colour=red"], "unknown option"),
    (["effective", "smixer_c64p4_32", "--set", "depth"], "key=value"),
    (["effective", "mixer_b16_224"], "too many for explicit matrices"),
    (["effective", "smixer_c64p4_32", "--set", "rp_blocks=[9]"], "rp_blocks"),
    (["models", "--filter", "nomatch"], "no model matches"),
    (["models", "--bogus"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
]


# each case is a process that imports pkmixer (a few seconds): one in the default tier, the rest slow; all of
# them run in-process in test_bad_core_input
@pytest.mark.parametrize("args,needle", [pytest.param(*BAD_CORE_INPUT[i], marks=() if i == 0 else pytest.mark.slow)
                                         for i in (0, 1, 10, 11)])
def test_bad_input_exits_2_with_one_line(args, needle):
    """As a real process: exit status 2, one line on stderr, no traceback."""
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,needle", BAD_CORE_INPUT)
def test_bad_core_input(capsys, args, needle):
    code, _, err = run_main(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("kwargs,needle", [
    (dict(img_size=30, patch_size=4), "does not divide"),
    (dict(embed_dim=-3), "embed_dim must be a positive integer"),
    (dict(num_tokens=0), "num_tokens"),
    (dict(mlp_ratio=0.0), "mlp_ratio"),
    (dict(block="conv"), "block must be one of"),
    (dict(drop_path_rate=1.0), "drop_path_rate"),
])
def test_bad_model_arguments_raise_config_error(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        pkmixer.create_model("mixer_c64d3p4_32", **kwargs)


def test_unknown_model_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean.*rp_smixer_s64_32"):
        pkmixer.create_model("rp_smixer_s46_32")


VERBS = ["models", "effective", "width", "spectrum", "cka", "cost", "visualize", "implicit-l1", "train", "finetune",
         "convert", "throughput", "eval", "reproduce", "report"]  # the order of `pkmixer --help`


@pytest.mark.parametrize("verb", VERBS)
def test_help_for_every_verb(capsys, verb):
    code, out, _ = run_main(capsys, verb, "--help")
    assert code == 0 and out.startswith(f"usage: pkmixer {verb}")


def test_version(capsys):
    code, out, _ = run_main(capsys, "--version")
    assert code == 0 and out == f"pkmixer {pkmixer.__version__}\n"


def test_help_and_version_import_no_torch():
    """In a fresh process, `pkmixer --help`, every verb's --help and --version import neither torch nor timm nor
    numpy (the verbs import the library they call when they run); the verbs listed are all there are."""
    script = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from pkmixer.cli import main

        outputs = []
        for argv in [["--help"], ["--version"], *([verb, "--help"] for verb in {VERBS!r})]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    main(argv)
                except SystemExit as exit_:
                    assert exit_.code == 0, (argv, exit_.code)
            outputs.append(out.getvalue())
        heavy = sorted(m for m in ("torch", "timm", "numpy", "torchvision") if m in sys.modules)
        print(json.dumps({{"heavy": heavy, "help": outputs[0], "version": outputs[1]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["heavy"] == []
    assert result["version"] == f"pkmixer {pkmixer.__version__}\n"
    listed = re.search(r"\{([a-z1,-]+)\}", result["help"]).group(1).split(",")
    assert listed == VERBS


def test_width_json_reproduces_app_c4(capsys):
    code, out, _ = run_main(capsys, "width", "--omega", "2**18", "--C", "16,32,48,83,113,173",
                            "--density", "0.9,0.7,0.5,0.3,0.1", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [(r["C"], r["S"]) for r in rows if r["kind"] == "mixer"] == \
        [(16, 173), (32, 113), (48, 83), (83, 48), (113, 32), (173, 16)]
    assert [(r["p"], r["m"]) for r in rows if r["kind"] == "swmlp"] == \
        [(0.9, 540), (0.7, 612), (0.5, 724), (0.3, 935), (0.1, 1619)]


def test_width_table(capsys):
    code, out, _ = run_main(capsys, "width", "--omega", "2**19", "--gamma", "2", "--C", "4,64")
    assert code == 0 and "C* = S* = (Ω/γ)^(1/3) = 64" in out
    assert [line.split()[:3] for line in out.splitlines()[-2:]] == [["mixer", "4", "360"], ["mixer", "64", "64"]]


def test_spectrum_json_and_plot(capsys, tmp_path):
    plot = tmp_path / "fig4.svg"
    code, out, _ = run_main(capsys, "spectrum", "--omega", "2**12", "--widths", "64,128,256", "--seeds", "2",
                            "--plot", str(plot), "--json")
    report = json.loads(out)
    assert code == 0 and plot.stat().st_size > 0 and report["plot"] == str(plot)
    assert [r["m"] for r in report["rows"]] == [64, 128, 256]
    assert report["c_gamma"] == 2.0


def test_cka_between_checkpoints(capsys, tmp_path):
    from pkmixer.checkpoint import save_model

    a = save_model(tmp_path / "a.pt", pkmixer.create_model("mixer_t4_28", depth=2))
    b = save_model(tmp_path / "b.pt", pkmixer.create_model("swmlp_t4_28", depth=3))
    code, out, _ = run_main(capsys, "cka", str(a), str(a), "--batches", "2", "--batch-size", "8", "--json")
    same = json.loads(out)
    assert code == 0 and same["diagonal_mean"] == pytest.approx(1.0)
    code, out, _ = run_main(capsys, "cka", str(a), str(b), "--batches", "2", "--batch-size", "8", "--json",
                            "--plot", str(tmp_path / "cka.png"))
    mixed = json.loads(out)
    assert code == 0 and len(mixed["matrix"]) == 4 and len(mixed["matrix"][0]) == 3
    assert (tmp_path / "cka.png").stat().st_size > 0


def test_cost_json(capsys):
    code, out, _ = run_main(capsys, "cost", "mixer_b16_224", "--json")
    (b16,) = json.loads(out)
    assert code == 0 and b16["params"] == 59_880_472
    assert b16["macs"] == pytest.approx(12.6e9, rel=0.01)  # Tolstikhin et al.: 12.6 GMACs
    code, out, _ = run_main(capsys, "cost", "--omega", "2**15", "--gamma", "2", "--depth", "2", "--json")
    names = [r["model"] for r in json.loads(out)]
    assert code == 0 and len(names) == 4 and names[2].startswith("SW-MLP[sparse]")


def test_visualize_writes_and_never_overwrites(capsys, tmp_path):
    out_file = tmp_path / "units.png"
    code, out, _ = run_main(capsys, "visualize", "token-units", "--model", "mixer_c64d3p4_32", "--out", str(out_file),
                            "--option", "num_units=8", "--json")
    assert code == 0 and json.loads(out)["figure"] == str(out_file)
    before = out_file.read_bytes()
    code, _, err = run_main(capsys, "visualize", "sparsity", "--out", str(out_file))
    assert code == 2 and "exists" in err and out_file.read_bytes() == before


def test_implicit_l1_json(capsys):
    code, out, _ = run_main(capsys, "implicit-l1", "--lam", "0.3", "--json")
    report = json.loads(out)
    assert code == 0 and report["holds"] is True
    assert report["kronecker_objective"] >= report["l1_objective_at_kronecker"] >= report["l1_objective"]


@pytest.mark.parametrize("args,needle", [
    (["width", "--omega", "2**x"], "'x' is not allowed"),
    (["width", "--omega", "-5"], "Ω"),
    (["width", "--omega", "2**18", "--C", "16", "--pairs", "2"], "not both"),
    (["width", "--omega", "2**18", "--C", "a,b"], "--C expects"),
    (["width", "--omega", "2**18", "--density", "1.5"], "(0, 1]"),
    (["spectrum", "--omega", "2**12", "--widths", "8"], "width"),
    (["spectrum", "--plot", "fig.pdf"], ".png or .svg"),
    (["cka", "mixer_t4_28", "mixer_c64d3p4_32"], "different inputs"),
    (["cka", "mixer_t4_28", "mixer_t4_28", "--batch-size", "3"], "4"),
    (["cka", "mixer_t4_28", "missing.pt"], "no checkpoint file"),
    (["cost"], "model names"),
    (["cost", "mixer_b16_224", "--omega", "2**18"], "not both"),
    (["visualize", "token-units", "--out", "x.png"], "needs a model"),
    (["visualize", "sparsity", "--out", "x.gif"], ".png or .svg"),
    (["visualize", "token-units", "--model", "mixer_c64d3p4_32", "--option", "colour=1", "--out", "y.png"], "unknown option"),
    (["implicit-l1", "--S", "0"], "S"),
    (["implicit-l1", "--samples", "2"], "n_samples"),
])
def test_analysis_verbs_bad_input(capsys, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, *args)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("name,overrides,needle", [
    ("smixer_t4_28", dict(embed_dim=10**6), "GiB"),  # 4 TB of weights: refused before the allocation
    ("swmlp_t4_28", dict(width=10**7), "GiB"),  # the masks' sampling alone would take hours
    ("smixer_t4_28", dict(depth=10**6), "blocks"),
])
def test_sizes_that_cannot_be_built_are_refused(name, overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        pkmixer.create_model(name, **overrides)


def test_huge_models_still_build_on_the_meta_device():
    import torch

    with torch.device("meta"):
        model = pkmixer.create_model("smixer_t4_28", embed_dim=10**5)
        with pytest.raises(ConfigError, match="too large"):  # beyond torch's sizes even there
            pkmixer.create_model("smixer_t4_28", embed_dim=10**20)
    assert sum(p.numel() for p in model.parameters()) > 10**10


@pytest.fixture
def four_idle_cores(monkeypatch):
    """A CPU set of 4 cores, none busy, and no thread count in the environment."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    for var in ("PKMIXER_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def test_thread_count_sources_in_order(four_idle_cores, monkeypatch):
    """--threads, else PKMIXER_THREADS, else OMP_NUM_THREADS (its first level), else the idle cores divided among
    torchrun's local processes (LOCAL_WORLD_SIZE)."""
    from pkmixer.cli.threads import chosen_threads

    assert chosen_threads(None) == 4
    monkeypatch.setattr(os, "getloadavg", lambda: (1.3, 0.0, 0.0))  # 2 cores busy: 1.3 - 0.25 rounded up
    assert chosen_threads(None) == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert chosen_threads(None) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert chosen_threads(None) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert chosen_threads(None) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2,1")
    assert chosen_threads(None) == 2
    monkeypatch.setenv("PKMIXER_THREADS", "5")
    assert chosen_threads(None) == 5
    assert chosen_threads(6) == 6


@pytest.mark.parametrize("var,value,needle", [
    ("OMP_NUM_THREADS", "many", "OMP_NUM_THREADS='many' must be a whole number"),
    ("OMP_NUM_THREADS", "0", "OMP_NUM_THREADS must lie in [1, 1024], got 0"),
    ("LOCAL_WORLD_SIZE", "0", "LOCAL_WORLD_SIZE must be a positive number of processes"),
    ("LOCAL_WORLD_SIZE", "two", "LOCAL_WORLD_SIZE='two' must be a whole number"),
])
def test_bad_thread_environment_exits_2(capsys, four_idle_cores, monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    code, _, err = run_main(capsys, "width", "--omega", "2**18")
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_omp_num_threads_sets_the_commands_threads(capsys, four_idle_cores, monkeypatch):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    try:
        code, _, _ = run_main(capsys, "width", "--omega", "2**18")
        assert code == 0 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_threads_option_and_environment(capsys, monkeypatch):
    import torch

    from pkmixer.cli import default_threads

    assert 1 <= default_threads() <= 8
    try:
        code, _, _ = run_main(capsys, "width", "--omega", "2**18", "--threads", "2")
        assert code == 0 and torch.get_num_threads() == 2
        monkeypatch.setenv("PKMIXER_THREADS", "1")
        code, _, _ = run_main(capsys, "width", "--omega", "2**18")
        assert code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(1)
