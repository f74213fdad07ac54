"""Each training config in configs/ is one run of a paper-scale preset: the recipe lives in one place
(src/pkmixer/experiments/recipes.py and the preset modules) and the YAML files cannot drift from it."""
from pathlib import Path

import pytest
import yaml

from pkmixer.experiments import get_preset
from pkmixer.experiments.sweep import NEUTRAL_KEYS
from pkmixer.train.config import build_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# config file -> (preset, data set, the preset's run at paper scale that the file must equal)
PAPER_RUNS = {
    "cifar10_mixer_adamw.yaml": ("fig2", "cifar10", "mixer-s64-s0"),  # App. C.1
    "cifar10_smixer.yaml": ("fig7", "cifar10", "smixer-l8-s0"),  # App. C.4 recipe, App. C.6 model
    "imagenet_mixer.yaml": ("fig6", "imagenet", "mixer-p16-s0"),  # App. C.5, Table S.2
}
NOT_A_PAPER_RUN = {"demo.yaml"}  # a one-minute CPU run (make demo's companion), no recipe of the paper


def _resolved(config: dict) -> dict:
    """The validated config without what differs between runs of one recipe (seed, structure seed) and the keys
    that do not change a result (data directory, workers, progress bar, ...)."""
    resolved = build_config(config).as_dict()
    for section, key in NEUTRAL_KEYS | {("run", "seed")}:
        resolved[section].pop(key, None)
    resolved["model"]["options"].pop("structure_seed", None)
    return resolved


def test_every_config_is_accounted_for():
    assert {p.name for p in CONFIGS.glob("*.yaml")} == set(PAPER_RUNS) | NOT_A_PAPER_RUN


@pytest.mark.parametrize("filename", sorted(PAPER_RUNS))
def test_config_equals_its_preset_run(filename):
    preset, dataset, run = PAPER_RUNS[filename]
    specs = {spec.name: spec for spec in get_preset(preset).runs("paper", dataset)}
    expected = specs[run].config.as_dict()
    got = yaml.safe_load((CONFIGS / filename).read_text())
    assert _resolved(got) == _resolved(expected), (
        f"configs/{filename} differs from run {run} of `pkmixer reproduce {preset} --scale paper "
        f"--dataset {dataset}`; the preset's config is:\n{yaml.safe_dump(expected, sort_keys=False)}")


def test_configs_cite_their_appendix_section():
    for filename in PAPER_RUNS:
        assert "App. C." in (CONFIGS / filename).read_text().split("\nmodel:")[0], filename
