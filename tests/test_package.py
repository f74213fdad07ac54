"""The package as a user installs it: ``import pkmixer`` is light and still registers the models with timm in any
import order; one version everywhere; constraints.txt pins what pyproject asks for; `make install` installs the
runtime only and `make test` adds the test extra."""
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import pkmixer

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


# each case imports torch and timm in a fresh process (several seconds): the usual orders in the default tier
@pytest.mark.parametrize("first,then,light", [
    ("import pkmixer", "import timm", True),  # registered when timm finishes importing
    ("import pkmixer.models", "import timm", False),  # pkmixer.models imports timm itself: registered when done
    pytest.param("import timm", "import pkmixer", False, marks=pytest.mark.slow),  # registered by `import pkmixer`
])
def test_timm_knows_the_models_whatever_the_import_order(first, then, light):
    """``import pkmixer`` imports neither torch nor timm; the models are timm's as soon as both are imported."""
    out = _python(f"""
        import sys, warnings
        {first}
        light = "torch" not in sys.modules and "timm" not in sys.modules
        {then}
        from pkmixer.models.registry import list_models
        names = list_models()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a current name maps to nothing deprecated
            model = timm.create_model("pkmixer_" + names[0])
        print(light, all(timm.is_model("pkmixer_" + n) for n in names), type(model).__module__.split(".")[0])
    """)
    assert out == f"{light} True pkmixer"


def test_the_model_api_and_subpackages_load_on_first_use():
    assert pkmixer.create_model is pkmixer.models.create_model and pkmixer.list_models is pkmixer.models.list_models
    assert pkmixer.theory.__name__ == "pkmixer.theory" and "create_model" in dir(pkmixer)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pkmixer.nothing  # noqa: B018


def test_one_version_everywhere():
    """pyproject reads the version from pkmixer.__version__ without importing the package; CITATION.cff says it."""
    assert "version" in PYPROJECT["project"]["dynamic"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pkmixer.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", pkmixer.__version__)
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["version"] == pkmixer.__version__ and citation["license"] == PYPROJECT["project"]["license"]
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


def test_constraints_pin_every_requirement_within_its_range():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    project = PYPROJECT["project"]
    wanted = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name]), (str(req), pins.get(name))
    assert {"torch", "torchvision", "jax", "jaxlib", "ray"} <= set(pins)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_install_is_the_runtime_and_make_test_adds_the_test_extra(tmp_path):
    """What `make` would run on a machine without .venv (-n: print only; -B: as if nothing were installed)."""
    def commands(target: str) -> list[str]:
        proc = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stdout.splitlines() if " pip install " in line]

    install, demo, test = commands("install"), commands("demo"), commands("test")
    assert install == demo and all("[test]" not in line for line in install)
    assert any(line.endswith(" -e .") for line in install)
    assert test[:len(install)] == install and test[-1].endswith("-e '.[test]'")
    assert all("-c constraints.txt" in line for line in test if "--upgrade pip" not in line)
