"""docs/reproduction.md claims no more than exists: its table of presets is the preset registry (names, sources,
run counts per scale), and every figure and table of Hayase & Karakida is either there or named as not a preset."""
import re
from pathlib import Path

import pytest

from pkmixer.experiments import list_presets

DOC = (Path(__file__).resolve().parents[1] / "docs" / "reproduction.md").read_text()
PAPER_ITEMS = [f"Fig. {i}" for i in range(1, 8)] + [f"Fig. S.{i}" for i in range(1, 10)] + \
    ["Table 1"] + [f"Table S.{i}" for i in range(1, 4)]


def _preset_table() -> dict[str, dict]:
    section = DOC.split("\n## Presets\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = {"what": cells[1], "runs": cells[2], "source": cells[3]}
    return rows


def _normal(text: str) -> str:
    return text.replace("–", "-").replace(" ", "")


def test_the_table_lists_exactly_the_registered_presets():
    assert sorted(_preset_table()) == [p.name for p in list_presets()]


@pytest.mark.parametrize("preset", list_presets(), ids=lambda p: p.name)
def test_each_row_has_the_presets_source_and_run_counts(preset):
    row = _preset_table()[preset.name]
    item = row["source"].split(",")[0]  # e.g. "Fig. 5"
    assert _normal(item) in _normal(preset.source), (item, preset.source)
    counts = [len(preset.runs(scale, None)) for scale in ("paper", "small", "smoke")]
    if row["runs"] == "0":
        assert counts == [0, 0, 0]
    else:
        parts = row["runs"].split(" / ")
        assert [int(re.match(r"\d+", part).group()) for part in parts] == counts, row["runs"]


def test_every_figure_and_table_of_the_paper_is_a_preset_or_said_not_to_be():
    sources = " ".join(p.source.split(",")[0] for p in list_presets())  # what each reproduces, e.g. "... Fig. 5"
    not_presets = DOC.split("Not presets:", 1)[1].split("\n\n", 1)[0]
    for item in PAPER_ITEMS:
        pattern = re.escape(item) + r"(?![0-9])"
        in_registry = re.search(pattern, sources) is not None
        said_not = re.search(pattern, not_presets) is not None
        assert in_registry != said_not, item
