"""The README as a newcomer uses it: its quickstart runs as printed - the Python block prints the text block that
follows it, each ``$ pkmixer ...`` line of the console block prints the lines under it (a line ``...`` stands for
any lines, ``...`` within a line for any text) - its model zoo table is ``pkmixer models --json``, formatted, its
examples use current model names, and the links of the README and docs/index.md resolve, anchors included.
The ``sh`` blocks (set-up commands) are not run here."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

import pkmixer

from conftest import run_main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(kind: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README) if lang == kind]


def lines_match(expected: list[str], actual: list[str]) -> bool:
    """``actual`` against ``expected``, where a line ``...`` matches any lines and ``...`` in a line any text."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(lines_match(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    pattern = ".*".join(map(re.escape, expected[0].split("...")))
    return bool(actual) and re.fullmatch(pattern, actual[0]) is not None and lines_match(expected[1:], actual[1:])


def test_the_matcher():
    assert lines_match(["a", "...", "d ...e"], ["a", "b", "c", "d 1.0e"]) and lines_match(["..."], [])
    assert not lines_match(["a", "b"], ["a", "c"]) and not lines_match(["a ...x"], ["a y"])


def test_the_python_quickstart_prints_what_the_readme_says():
    (code,) = blocks("python")
    (printed,) = blocks("text")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert out.getvalue() == printed


def test_the_command_line_quickstart_prints_what_the_readme_says(capsys):
    (session,) = blocks("console")
    commands: list[tuple[str, list[str]]] = []
    for line in session.rstrip("\n").splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line.rstrip())
    assert len(commands) >= 2
    for command, expected in commands:
        argv = shlex.split(command)
        assert argv[0] == "pkmixer", command
        code, out, err = run_main(capsys, *argv[1:])
        assert code == 0, (command, err)
        actual = [line.rstrip() for line in out.rstrip("\n").splitlines()]
        assert lines_match(expected, actual), (command, "\n".join(actual))


def zoo_rows() -> list[str]:
    """The model zoo table's rows as the README writes them, from `pkmixer models --json`."""
    from pkmixer.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["models", "--json"]) == 0

    def omega(x: float) -> str:
        mantissa, exponent = f"{x:.2e}".split("e")
        return f"{mantissa}e{int(exponent)}"

    def cell(value) -> str:
        return "–" if value in (None, "-") else str(value)

    return [f"| `{r['name']}` | {r['family']} | {r['params'] / 1e6:.3g} | {cell(r['num_tokens'])} | "
            f"{cell(r['embed_dim'])} | {cell(r['gamma']).replace('/', ' / ')} | {omega(r['connections'])} | "
            f"{r['effective_width']} | {r['description']} |" for r in json.loads(out.getvalue())]


def test_the_model_zoo_table_is_pkmixer_models():
    start = README.index("| name | family | params (M) |")
    table = README[start:].split("\n\n")[0].splitlines()[2:]
    expected = zoo_rows()
    assert table == expected, "the README's model zoo table is stale; its rows should read:\n" + "\n".join(expected)


MODEL_NAME = re.compile(r"(?:pkmixer_)?((?:rp_)?(?:s?mixer|swmlp|shallow)_[a-z0-9_]+)")


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_examples_use_current_model_names(doc):
    """Names the registry lists, never the deprecated aliases (timm warns about those)."""
    text = (ROOT / doc).read_text()
    named = set(MODEL_NAME.findall(text))
    assert named <= set(pkmixer.list_models()), sorted(named - set(pkmixer.list_models()))
    assert named or doc != "README.md"


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_links_resolve(doc):
    path = ROOT / doc
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    local = [link for link in links if "://" not in link]
    assert local
    for link in local:
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.is_file() and file.is_relative_to(ROOT), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, link
    assert all(link.startswith("https://") for link in links if "://" in link)
