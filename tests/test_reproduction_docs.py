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


def test_the_medium_verdicts_are_what_the_records_and_presets_generate():
    """The block between the markers is `pkmixer reproduce --docs`'s text from reproduction/ alone: a number typed by
    hand, a stale row or a preset whose design changed since the last --docs fails here."""
    from pkmixer.experiments import docs
    from pkmixer.experiments.records import records_dir

    root = Path(__file__).resolve().parents[1]
    assert docs.current_block(DOC), "docs/reproduction.md has no generated block"
    assert docs.current_block(DOC) == docs.generate(records_dir(), root), \
        "docs/reproduction.md's medium verdicts differ from `pkmixer reproduce --docs`: run it"


def test_a_recorded_presets_section_shows_its_epoch_doubling_numbers():
    """figs7's records hold its two epoch-doubling runs: its section prints what they measured under the outcome
    and counts them apart from the 50 runs the verdict reads."""
    section = DOC.split("### figs7 at medium scale", 1)[1].split("\n### ", 1)[0]
    assert "50 runs of 50 epochs on fashion-mnist and 2 of twice as many" in section
    outcome = section.index("*Outcome:")
    line = section.index("*Epoch doubling (seed 0's statistics, as trained -> doubled):* final test loss(RP)")
    assert outcome < line < section.index("| part of the claim")


def test_the_medium_verdicts_table_has_a_row_for_exactly_the_presets_with_a_medium_scale():
    section = DOC.split("\n## Medium-scale verdicts\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|")[0].strip() for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| preset ") and "part of the claim" not in line]
    assert sorted(set(rows) & {p.name for p in list_presets()}) == sorted(p.name for p in list_presets()
                                                                           if "medium" in p.scales)


def test_every_verdict_row_is_an_outcome_and_unrecorded_ones_show_no_estimate():
    """Every row of the verdict table is an outcome; a preset whose runs are not all recorded shows no estimate."""
    from pkmixer.experiments import docs

    block = docs.current_block(DOC)
    names, seen = {p.name for p in list_presets()}, set()
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if line.startswith("| ") and cells[0] in names:  # the verdict table's rows, not the presets' part tables
            seen.add(cells[0])
            decision = cells[4]
            assert decision.startswith(("not run yet under this design", "out of regime", "not testable here",
                                        "supported", "contradicted", "undecided", "not converged")), decision
            if decision.startswith(("not run yet", "out of regime (without training", "not testable here")):
                assert cells[3] == "-", line
    assert seen == {p.name for p in list_presets() if "medium" in p.scales}


@pytest.mark.parametrize("preset", list_presets(), ids=lambda p: p.name)
def test_each_row_has_the_presets_source_and_run_counts(preset):
    row = _preset_table()[preset.name]
    item = row["source"].split(",")[0]  # e.g. "Fig. 5"
    assert _normal(item) in _normal(preset.source), (item, preset.source)
    counts = [len(preset.runs(scale, None)) if scale in preset.scales else None
              for scale in ("paper", "medium", "small", "smoke")]  # None: no such scale, "-" in the table
    if row["runs"] == "0":
        assert counts in ([0, None, 0, 0], [0, 0, 0, 0])
    else:
        parts = row["runs"].split(" / ")
        assert [None if part == "-" else int(re.match(r"\d+", part).group()) for part in parts] == counts, row["runs"]


def test_every_figure_and_table_of_the_paper_is_a_preset_or_said_not_to_be():
    sources = " ".join(p.source.split(",")[0] for p in list_presets())  # what each reproduces, e.g. "... Fig. 5"
    not_presets = DOC.split("Not presets:", 1)[1].split("\n\n", 1)[0]
    for item in PAPER_ITEMS:
        pattern = re.escape(item) + r"(?![0-9])"
        in_registry = re.search(pattern, sources) is not None
        said_not = re.search(pattern, not_presets) is not None
        assert in_registry != said_not, item


def _batched(cfg) -> bool:
    """Whether data.pipeline=auto takes the resident, batched pipeline: the engine's own rule
    (batch_augment_for for both splits), on the model's image size, channels and classes."""
    from types import SimpleNamespace

    from pkmixer.data import dataset_info
    from pkmixer.errors import ConfigError
    from pkmixer.models.registry import model_entry
    from pkmixer.train.build import batch_augment_for

    entry = model_entry(cfg.model.name)
    options = {**entry.defaults, **cfg.model.options}
    info = dataset_info(cfg.data.name)
    model = SimpleNamespace(img_size=options.get("img_size", 224), in_chans=options.get("in_chans", 3),
                            num_classes=options.get("num_classes", info.num_classes))
    try:
        for train in (True, False):
            batch_augment_for(cfg.data, model, train, info)
    except ConfigError:
        return False
    return True


def _settings_rows() -> list[str]:
    """The rows of docs/reproduction.md's paper-scale settings table, rebuilt from the presets' run configs."""
    from pkmixer.experiments.preset import list_presets

    rows: list[str] = []
    for preset in list_presets():
        specs = []
        for dataset in (None, "imagenet") if "imagenet" in getattr(preset, "datasets", ()) else (None,):
            specs += preset.runs("paper", dataset)
        for spec in specs:
            c = spec.config
            d, o, s, r = c.data, c.optim, c.schedule, c.run
            aug = [f"crop pad {d.crop_padding}"] if d.crop_padding is not None else []
            aug += ["flip"] if d.hflip else []
            aug += [f"AutoAugment {d.auto_augment}"] if d.auto_augment else []
            aug += [f"RandAugment {d.rand_augment}"] if d.rand_augment else []
            aug += ["Inception crop"] if d.random_resized_crop else []
            aug += [f"mixup {d.mixup}/cutmix {d.cutmix}"] if d.mixup or d.cutmix else []
            aug += [f"erasing {d.random_erasing}"] if d.random_erasing else []
            aug += [f"smoothing {d.label_smoothing}"] if d.label_smoothing else []
            batched = _batched(c)
            evaluation = d.eval_crop or (f"resize {d.resize}" if d.resize else
                                         "timm: resize 256 bicubic, centre crop 224" if d.name == "imagenet"
                                         else "none (native size)")
            optim = (f"{o.name} lr {o.lr:g}" + (f", wd {o.weight_decay:g}" if o.weight_decay else "")
                     + (", Nesterov" if o.name == "sgd" and o.nesterov else ""))
            precision = "fp32" if r.amp == "off" and not r.tf32 else f"amp {r.amp}, tf32 {r.tf32}"
            row = (f"| `{preset.name}` | {d.name} | {optim} | {s.epochs} | {d.batch_size} | {', '.join(aug) or 'none'} "
                   f"| {evaluation} | {precision} | {'off' if o.ema_decay is None else o.ema_decay} | "
                   f"{'resident' if batched else 'per-sample'} |")
            if row not in rows:
                rows.append(row)
    return rows


def test_paper_scale_settings_table_matches_the_presets():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "reproduction.md").read_text()
    start = text.index("| preset | data | optimiser |")
    table = [line for line in text[start:].split("\n\n")[0].splitlines()[2:]]
    assert table == _settings_rows()


def test_the_demo_paragraph_cites_the_kept_run_of_make_demo():
    """The demo's time, its runs' times and its verdict in "The demo" are those of the run kept in reproduction/demo/:
    `time`'s real line in its log, the runs' wall times in its results.csv, the verdict row of its report."""
    import csv

    kept = Path(__file__).resolve().parents[1] / "reproduction" / "demo"
    section = DOC.split("\n## The demo\n", 1)[1].split("\n## ", 1)[0].replace("\n", " ")
    claim = re.search(r"took \*\*(\d+) min (\d+) s\*\* \(each run (\d+)-(\d+) s .*?\*\*(\w+)\*\*: slope of the error "
                      r"on log₂ width ([+−-][\d.]+) points per doubling, 92 % interval (\[[^\]]+\])", section)
    assert claim, "the demo paragraph no longer states the kept run's time and verdict"
    minutes, seconds, fastest, slowest, outcome, estimate, interval = claim.groups()
    real = re.search(r"^real\s+(\d+)m([\d.]+)s$", (kept / "make-demo.log").read_text(), re.M)
    assert (int(minutes), int(seconds)) == (int(real.group(1)), round(float(real.group(2))))
    walls = [float(r["wall_time"]) for r in csv.DictReader((kept / "results.csv").open())]
    assert (int(fastest), int(slowest)) == (round(min(walls)), round(max(walls)))
    row = next(line for line in (kept / "report.md").read_text().splitlines() if "error falls as the width grows |"
               in line and line.startswith("| S-Mixer"))
    assert f"| {estimate} points | 92 % {interval} points |" in row and row.endswith(f"**{outcome}** |")
