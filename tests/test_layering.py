"""The import directions between pkmixer's packages (docs/architecture.md, "Packages and what each may import"),
checked on the source with ``ast``: every ``import`` and ``from ... import`` of every module under
``src/pkmixer`` - at module level, inside functions and under ``TYPE_CHECKING`` alike."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# unit -> the other units (or single modules, "models.contract") it may import; a unit is a top-level module of
# pkmixer or a subpackage, and imports within one unit are always allowed. Lower layers first.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "atomic": {"errors"},
    "overrides": {"errors"},
    "figures": {"errors", "atomic"},
    "checkpoint": {"errors", "atomic"},
    "kernels": set(),
    "layers": {"errors", "kernels"},
    "data": {"errors", "atomic"},
    # theory reads models only through the contract; models build their effective MLPs from theory.effective
    "theory": {"errors", "layers", "models.contract"},
    "models": {"errors", "atomic", "checkpoint", "layers", "data", "theory.effective"},
    "analysis": {"errors", "atomic", "figures", "checkpoint", "layers", "data", "models", "theory"},
    "train": {"errors", "atomic", "checkpoint", "kernels", "layers", "data", "models"},
    "experiments": {"errors", "atomic", "overrides", "figures", "checkpoint", "layers", "data", "models", "theory",
                    "analysis", "train"},
    "cli": {"errors", "atomic", "overrides", "figures", "checkpoint", "layers", "data", "models", "theory",
            "analysis", "train", "experiments"},
    "__init__": {"errors", "models"},
}
# third-party packages only some units may import: plotting stays out of the math, the models and training
RESTRICTED = {"matplotlib": {"figures", "analysis", "experiments"}}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str, root: Path) -> bool:
    base = root / Path(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _targets(node: ast.AST, module: str, is_package: bool, root: Path) -> list[str]:
    """The modules an import statement names, relative imports resolved (``from pkg import mod`` names pkg.mod
    where that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    subs = [f"{base}.{alias.name}" for alias in node.names if _exists(f"{base}.{alias.name}", root)]
    return subs or [base]


def _unit(module: str) -> str:
    """pkmixer.models.mixer -> models; pkmixer -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def forbidden_imports(root: Path, sources: dict[str, str] | None = None) -> list[str]:
    """Every import under ``root/pkmixer`` that the rules above forbid, as "file:line: unit -> target"
    (``sources`` maps extra module paths, relative to ``root``, to their text: for testing the checker)."""
    files = {p.relative_to(root).as_posix(): p.read_text() for p in sorted((root / "pkmixer").rglob("*.py"))}
    files.update(sources or {})
    problems = []
    for rel, text in files.items():
        path = root / rel
        module = _module_name(path, root)
        unit = _unit(module)
        assert unit in ALLOWED, f"{rel}: package {unit} has no rule in ALLOWED; add it and document it"
        for node in ast.walk(ast.parse(text, rel)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, module, path.name == "__init__.py", root):
                top = target.split(".")[0]
                if top == "pkmixer":
                    inner = target.split(".", 1)[1] if "." in target else "__init__"
                    other = _unit(target)
                    if other == unit or any(inner == a or inner.startswith(a + ".") for a in ALLOWED[unit]):
                        continue
                    problems.append(f"{rel}:{node.lineno}: {unit} -> {inner}")
                elif top in RESTRICTED and unit not in RESTRICTED[top]:
                    problems.append(f"{rel}:{node.lineno}: {unit} -> {target}")
    return problems


def test_every_import_goes_in_an_allowed_direction():
    assert forbidden_imports(SRC) == []


@pytest.mark.parametrize("rel, text, needle", [
    ("pkmixer/models/bad.py", "from ..train import loop\n", "models -> train.loop"),
    ("pkmixer/models/bad.py", "def f():\n    from ..experiments.sweep import RunSpec\n", "models -> experiments.sweep"),
    ("pkmixer/theory/bad.py", "from matplotlib.figure import Figure\n", "theory -> matplotlib.figure"),
    ("pkmixer/theory/bad.py", "from ..models.registry import create_model\n", "theory -> models.registry"),
    ("pkmixer/layers/bad.py", "import pkmixer.models.mixer\n", "layers -> models.mixer"),
    ("pkmixer/checkpoint_bad.py", "from .models import create_model\n", None),  # a new top-level module
    ("pkmixer/train/bad.py", "from ..analysis import cka\n", "train -> analysis.cka"),
    ("pkmixer/train/bad.py", "from .. import figures\n", "train -> figures"),
])
def test_the_checker_finds_a_forbidden_direction(rel, text, needle):
    if needle is None:  # a unit without a rule is itself an error
        with pytest.raises(AssertionError, match="no rule"):
            forbidden_imports(SRC, {rel: text})
        return
    found = forbidden_imports(SRC, {rel: text})
    assert [p.split(": ", 1)[1] for p in found] == [needle], found


def test_allowed_directions_have_no_cycle():
    """The rules themselves form layers: no unit can reach itself through other units (the one documented
    exception, models <-> theory through models.contract and theory.effective, is between single modules)."""
    graph = {u: {a.split(".")[0] for a in allowed if "." not in a} for u, allowed in ALLOWED.items()}

    def reach(start: str, seen: set[str]) -> set[str]:
        for nxt in graph.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen

    assert [u for u in graph if u in reach(u, set())] == []
