"""Write constraints.txt: the installed version of every distribution pkmixer needs - its dependencies and its
test extra's, followed recursively through each distribution's own requirements (environment markers and extras
evaluated here) - as ``name==version``, from the environment that runs this script (`make constraints`; Python 3.11 or later)."""
from __future__ import annotations

import platform
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("test", "ray")


def needed(requirements: list[str]) -> dict[str, str]:
    """canonical name -> installed version, for ``requirements`` and everything they require."""
    found: dict[str, str] = {}
    todo = [(Requirement(r), "") for r in requirements]
    seen: set[tuple[str, str]] = set()
    while todo:
        req, extra = todo.pop()
        env = {**default_environment(), "extra": extra}
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        for wanted in [""] + sorted(req.extras):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            dist = metadata.distribution(name)  # missing: install the project's test extra first
            found[name] = dist.version
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return found


def main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    versions = needed(project["dependencies"] + [r for e in EXTRAS for r in extras[e]])
    head = (f"# The versions `make install` and `make test` install, and so the versions CI tests: what pkmixer and\n"
            f"# its {' and '.join(EXTRAS)} extras need, as installed on Python {platform.python_version()} "
            f"({sys.platform}, {platform.machine()}).\n"
            f"# Written by `make constraints` (.ci/freeze_constraints.py) from the environment that passed the tests.\n")
    body = "".join(f"{name}=={versions[name]}\n" for name in sorted(versions))
    (ROOT / "constraints.txt").write_text(head + body)


if __name__ == "__main__":
    main()
