"""The command line and bad input: one clear error, exit status 2."""
import json
import subprocess
import sys

import pytest

import pkmixer
from pkmixer.cli import main
from pkmixer.errors import ConfigError


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
    assert main(["effective", "rp_smixer_s64_32", "--set", "depth=2", "--set", "embed_dim=16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["relative_error"] < 1e-10
    assert result["overrides"] == {"depth": 2, "embed_dim": 16}
    assert len(result["layers"]) == 4 and result["effective_width"] == 64 * 16


@pytest.mark.parametrize("args,needle", [
    (["effective", "mixer_b17"], "did you mean mixer_b16_224"),
    (["effective", "smixer_s64_32", "--set", "patch_size=5"], "does not divide"),
    (["effective", "smixer_s64_32", "--set", "depth=0"], "depth must be a positive integer"),
    (["effective", "swmlp_t4_28", "--set", "density=1.5"], "(0, 1]"),
    (["effective", "swmlp_t4_28", "--set", "density=0"], "(0, 1]"),
    (["effective", "smixer_s64_32", "--set", "colour=red"], "unknown option"),
    (["effective", "smixer_s64_32", "--set", "depth"], "key=value"),
    (["effective", "mixer_b16_224"], "too many for explicit matrices"),
    (["effective", "smixer_s64_32", "--set", "rp_blocks=[9]"], "rp_blocks"),
    (["models", "--filter", "nomatch"], "no model matches"),
    (["models", "--bogus"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


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
        pkmixer.create_model("mixer_f2_32", **kwargs)


def test_unknown_model_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean.*rp_smixer_s64_32"):
        pkmixer.create_model("rp_smixer_s46_32")


def test_help_for_every_verb():
    for verb in ("models", "effective"):
        proc = run_cli(verb, "--help")
        assert proc.returncode == 0 and "usage: pkmixer" in proc.stdout
