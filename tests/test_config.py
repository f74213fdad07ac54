"""Typed configs: presets, --set overrides, refusals that name the key and what is allowed."""
from pathlib import Path

import pytest

from pkmixer.errors import ConfigError
from pkmixer.train.config import TrainConfig, build_config, load_yaml, save_yaml

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_defaults_are_valid_and_frozen():
    cfg = build_config()
    assert cfg == TrainConfig()
    with pytest.raises(AttributeError):
        cfg.optim.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_preset_loads_and_round_trips(path, tmp_path):
    cfg = build_config(load_yaml(path))
    save_yaml(cfg, tmp_path / "c.yaml")
    assert build_config(load_yaml(tmp_path / "c.yaml")) == cfg
    assert path.read_text().startswith("#")  # each preset says what it is and how to run it


def test_overrides_after_preset():
    cfg = build_config({"optim": {"name": "adamw", "lr": 0.001}},
                       {"optim.lr": 0.1, "model.depth": 2, "data.name": "digits", "optim.betas": [0.9, 0.95]})
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.betas) == ("adamw", 0.1, (0.9, 0.95))
    assert cfg.model.options == {"depth": 2} and cfg.data.name == "digits"
    assert isinstance(build_config(None, {"optim.lr": 1}).optim.lr, float)


@pytest.mark.parametrize("overrides,needle", [
    ({"optim.lr": -1}, "optim.lr=-1.0 must be positive"),
    ({"optim.nam": "sgd"}, "did you mean name"),
    ({"optim.name": "adam"}, "choose one of sgd, adamw"),
    ({"foo.bar": 1}, "section.key"),
    ({"lr": 1}, "section.key"),
    ({"data.batch_size": 1.5}, "must be an integer"),
    ({"data.batch_size": 0}, "must be positive"),
    ({"run.deterministic": "yes"}, "true or false"),
    ({"data.val_fraction": 1.0}, "[0, 1)"),
    ({"data.eval_crop": "center"}, "resize-crop"),
    ({"optim.betas": [0.9]}, "list of 2"),
    ({"run.device": "tpu"}, "auto, cpu, cuda"),
    ({"optim.lr": float("nan")}, "finite"),
    ({"optim.betas": [2.0, 0.999]}, "optim.betas[0]=2.0 must lie in [0, 1)"),
    ({"run.seed": -1}, "run.seed=-1 must lie in"),
    ({"run.seed": 2**40}, "run.seed"),
    ({"schedule.warmup_epochs": float("inf")}, "finite"),
    ({"data.batch_size": 10**20}, "too large"),
    ({"optim.momentum": 0.0}, "nesterov"),
    ({"data.random_resized_crop": [0.9, 0.1]}, "area range"),
    ({"data.name": "cifar11"}, "did you mean cifar10"),
    ({"model.name": "smixer_t4"}, "did you mean"),
    ({"data.auto_augment": "mnist"}, "auto_augment"),
])
def test_bad_values_name_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        build_config(None, overrides)


def test_bad_files(tmp_path):
    (tmp_path / "bad.yaml").write_text("optim: [1, 2\n")
    (tmp_path / "list.yaml").write_text("- 1\n")
    (tmp_path / "section.yaml").write_text("optimiser:\n  lr: 1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="mapping of sections"):
        build_config(load_yaml(tmp_path / "list.yaml"))
    with pytest.raises(ConfigError, match="did you mean optim"):
        build_config(load_yaml(tmp_path / "section.yaml"))
    with pytest.raises(ConfigError, match="no config file"):
        load_yaml(tmp_path / "missing.yaml")


def test_yaml_nan_and_binary_files(tmp_path):
    (tmp_path / "nan.yaml").write_text("optim:\n  lr: .nan\n")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="optim.lr=nan must be a finite number"):
        build_config(load_yaml(tmp_path / "nan.yaml"))
    with pytest.raises(ConfigError, match="not a text file"):
        load_yaml(tmp_path / "binary.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        load_yaml(tmp_path)
