"""Reports of reproduced experiments.

:func:`write_report` saves a preset's :class:`~pkmixer.experiments.preset.Analysis` in ``<sweep_dir>/report/``:

    report.md        title, the paper's claim and its source, scale, data set, command, the runs, the numbers
                     (mean ± std over seeds), the verdict, and links to the figures and tables
    <stem>.png/.svg  each figure
    <stem>.csv       each table
    analysis.json    numbers, verdict, supported, and a fingerprint of the rows the report was made from

A report is never replaced silently: when one exists and was made from the same rows it is left as it is
(rerunning a finished ``pkmixer reproduce`` changes nothing); made from other rows, it is replaced only with
``overwrite=True`` (``--overwrite``), and then as a whole (written beside it, then renamed into place).

The statistics over seeds live in :mod:`pkmixer.experiments.stats`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


from ..atomic import current_umask, write_text_atomically
from ..errors import ConfigError
from ..figures import save_figure
from .preset import Analysis, Preset
from .stats import format_mean_std
from .sweep import rows_to_csv

REPORT_DIR = "report"


# ---- the report -----------------------------------------------------------------------------------------


def fingerprint(rows: Sequence[dict], **context: Any) -> str:
    """A hash of the rows and their context (preset, scale, data set): equal inputs, equal report. A row's record
    ``key`` is left out: it names the config, not a result."""
    text = json.dumps({"rows": [{k: v for k, v in row.items() if k != "key"} for row in rows], **context},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict) and "mean" in value and "n" in value:
        return format_mean_std(value)
    return str(value).replace("|", "\\|")


def markdown_table(rows: Sequence[dict], limit: int = 60) -> str:
    if not rows:
        return "(no rows)\n"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"\n({len(rows) - limit} more rows in the CSV)")
    return "\n".join(lines) + "\n"


def _markdown(analysis: Analysis, preset: Preset, scale: str, dataset: str | None, command: str,
              rows: Sequence[dict]) -> str:
    finished = sum(r["status"] == "finished" for r in rows)
    hours = sum(r.get("wall_time") or 0.0 for r in rows) / 3600
    supported = {True: "yes", False: "no", None: "undecided"}[analysis.supported]
    parts = [f"# {preset.name}: {preset.title}\n",
             f"- **Paper's claim** ({preset.source}): {preset.claim}",
             f"- **Scale**: {scale}" + (f"; **data set**: {dataset}" if dataset else ""),
             f"- **Command**: `{command}`"]
    if rows:
        parts.append(f"- **Runs**: {finished} of {len(rows)} finished, {hours:.2f} h of training in all "
                     "(all runs: [results.csv](../results.csv))")
        kinds = sorted({r["precision"] for r in rows if r.get("precision")})
        if kinds:  # the paper trained in fp32 (App. C.3); bf16 or TF32 must be visible in the report
            parts.append(f"- **Precision**: {', '.join(kinds)}")
        if finished < len(rows):
            parts.append(f"- **Incomplete**: {len(rows) - finished} runs did not finish; the numbers below use the "
                         "finished ones. Run the same command again to complete them.")
    parts += ["", "## Verdict", "", analysis.verdict, ""]
    if analysis.outcome:
        reason = f" ({analysis.reason})" if analysis.reason else ""
        parts += [f"Outcome: **{analysis.outcome}**{reason}.", ""]
    parts += [f"Supports the paper's claim: **{supported}**.", ""]
    parts += [line for line in (analysis.data_set, analysis.decided_on) if line]
    parts += [""] if analysis.data_set or analysis.decided_on else []
    if analysis.regime:
        parts += ["### Regime (checked from the run configs before training)", "", *analysis.regime, ""]
    parts += verdict_table(analysis.verdicts)
    if analysis.numbers:
        parts += ["## Numbers", "", "| quantity | value |", "|---|---|"]
        parts += [f"| {_cell(k)} | {_cell(v)} |" for k, v in analysis.numbers.items()] + [""]
    if analysis.figures:
        parts += ["## Figures", ""]
        parts += [f"![{stem}]({stem}.png)\n\n[{stem}.png]({stem}.png) · [{stem}.svg]({stem}.svg)\n"
                  for stem in analysis.figures]
    if analysis.tables:
        parts += ["## Tables", ""]
        for stem, table in analysis.tables.items():
            parts += [f"### {stem} ([{stem}.csv]({stem}.csv))", "", markdown_table(table)]
    return "\n".join(parts)


def verdict_table(verdicts: Sequence[Any]) -> list[str]:
    """Markdown lines: each part of the claim with its statistic, estimate, interval, seeds and decision (a part
    contradicted at its own level but not after Holm's procedure across the parts reads undecided), then the
    paper's words each part tests, the decisions across a range of margins, what is printed beside the interval
    (power at the paper's effect, the test-set sampling error) and the rules (declared in the preset before its
    runs were read). Nothing without verdicts."""
    if not verdicts:
        return []
    from .rules import adjusted

    decisions = adjusted(verdicts)
    lines = ["| part of the claim | statistic | estimate | interval | seeds | claim holds when | decision |",
             "|---|---|---|---|--:|---|---|"]
    for v, decision in zip(verdicts, decisions):
        f = v.formatted()
        shown = f"**{decision}**"
        if decision != v.decision:
            shown += f" (alone: {v.decision}; not after Holm across the parts)"
        if v.note and v.decision != "not testable here":
            shown += f" ({v.note})"
        claimed = "-" if v.decision == "not testable here" else f"statistic {f['claimed']}"
        lines.append("| " + " | ".join(_cell(c) for c in (v.claim, v.statistic, f["estimate"],
                                                          f"{f['level']} {f['interval']}", v.seeds,
                                                          claimed, shown)) + " |")
    lines.append("")
    for v in verdicts:
        notes = []
        if v.quote:
            notes.append(f"tests {v.quote}")
        if v.decision == "not testable here":
            notes.append(f"not testable here: {v.note}")
        if v.margins:
            notes.append("across margins: " + ", ".join(f"{_margin(v, m)}: {d}" for m, d in v.margins))
        if v.extra:
            notes.append(v.extra)
        if notes:
            lines.append(f"- {v.claim}: " + "; ".join(notes) + ".")
    rules = list(dict.fromkeys(v.rule for v in verdicts if v.decision != "not testable here"))
    lines += ["", "How each part is decided (pkmixer.experiments.stats and .rules): " +
              " ".join(f"{rule}." for rule in rules) + " The claim is supported when every required part is, "
              "contradicted when a part is after Holm's procedure across the parts (family-wise one-sided level "
              "(1 − level)/2), undecided otherwise; out of regime, not converged and not testable here come "
              "first.", ""]
    return lines


def _margin(v: Any, m: float) -> str:
    if v.margin_unit is not None:
        return f"{m:g}{v.margin_unit}"
    return f"{m * v.scale:g}{v.unit or ''}"


def report_paths(sweep_dir: Path, analysis: Analysis | None = None) -> dict[str, Any]:
    folder = Path(sweep_dir) / REPORT_DIR
    if analysis is None:
        saved = _read_analysis(folder) or {}
        figures, tables = saved.get("figures"), saved.get("tables")
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in (figures, tables)):
            raise ConfigError(f"{folder / 'analysis.json'} is damaged (no lists of figures and tables); "
                              "pass --overwrite to render the report again")
    else:
        figures, tables = list(analysis.figures), list(analysis.tables)
    return {"report": str(folder / "report.md"),
            "figures": [str(folder / f"{stem}{suffix}") for stem in figures for suffix in (".png", ".svg")],
            "tables": [str(folder / f"{stem}.csv") for stem in tables]}


def write_report(analysis: Analysis, sweep_dir: Path, *, preset: Preset, scale: str, dataset: str | None,
                 command: str, rows: Sequence[dict], overwrite: bool = False,
                 refresh: bool = False) -> dict[str, Any]:
    """Save ``analysis`` in ``<sweep_dir>/report/``; returns the paths, verdict and whether it was up to date.
    A report made from the same results is left as it is (up to date) unless ``refresh`` (``pkmixer report``,
    e.g. after an edit of the preset's analysis); one made from other results is replaced only with
    ``overwrite``."""
    sweep_dir = Path(sweep_dir)
    folder = sweep_dir / REPORT_DIR
    stamp = fingerprint(rows, preset=preset.name, scale=scale, dataset=dataset)
    summary = {"verdict": analysis.verdict, "supported": analysis.supported, "numbers": analysis.numbers,
               "verdicts": [v.as_dict() for v in analysis.verdicts], "outcome": analysis.outcome,
               "reason": analysis.reason, "regime": analysis.regime, "decided_on": analysis.decided_on,
               "data_set": analysis.data_set, "rules": preset.rules_hash()}
    if folder.exists():
        previous = _read_analysis(folder)
        same = previous is not None and previous.get("fingerprint") == stamp
        if same and not (overwrite or refresh):
            return {**report_paths(sweep_dir), **summary, "up_to_date": True}
        if not (same or overwrite):
            raise ConfigError(f"{folder} exists (made from other results); pass --overwrite to replace it")
    for stem in [*analysis.figures, *analysis.tables]:
        if not stem or "/" in stem or stem.startswith(".") or stem in ("report", "analysis"):
            raise ConfigError(f"preset {preset.name}: output name {stem!r} is not a plain file stem")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=sweep_dir, prefix=".report-"))
    os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp makes 0700; give the permissions mkdir() would
    try:
        for stem, fig in analysis.figures.items():
            save_figure(fig, staging / f"{stem}.png")
            save_figure(fig, staging / f"{stem}.svg")
        for stem, table in analysis.tables.items():
            write_text_atomically(staging / f"{stem}.csv", rows_to_csv(table))
        write_text_atomically(staging / "report.md", _markdown(analysis, preset, scale, dataset, command, rows))
        record = {"preset": preset.name, "scale": scale, "dataset": dataset, "command": command,
                  "fingerprint": stamp, "figures": list(analysis.figures), "tables": list(analysis.tables), **summary}
        write_text_atomically(staging / "analysis.json", json.dumps(record, indent=1, default=str))
        if folder.exists():
            old = sweep_dir / f".report-old-{os.getpid()}"
            os.replace(folder, old)
            os.replace(staging, folder)
            shutil.rmtree(old)
        else:
            os.replace(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return {**report_paths(sweep_dir, analysis), **summary, "up_to_date": False}


def _read_analysis(folder: Path) -> dict[str, Any] | None:
    try:
        saved = json.loads((folder / "analysis.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, cut, not text
        return None
    return saved if isinstance(saved, dict) else None
