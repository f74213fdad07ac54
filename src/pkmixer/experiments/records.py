"""Results kept as data: one small JSON file per finished run under the repository's ``reproduction/`` folder.

A record is the run's results-table row (:func:`pkmixer.experiments.sweep.run_row`: its meta, final metrics, the
validation-selected epoch and its test error, every epoch's training, validation and test loss and error, its
probes' numbers, the environment it ran in - torch, Python, pkmixer, commit, CPU ISA, threads, the C kernels'
builds) with its whole config, a key that identifies the config (:func:`run_key`: the config without the keys that do
not change a result, and the probes) and the hash of the rules of the preset that decided with it
(:meth:`pkmixer.experiments.preset.Preset.rules_hash`), and the numbers a preset derives from several runs' files
once its sweep is done (:meth:`~pkmixer.experiments.preset.Preset.derive`: fig2's CKA against its Mixer;
:func:`add_fields`). No checkpoints, no Gram matrices: a few kB a run.

``pkmixer reproduce`` reads the records first and hands :func:`pkmixer.experiments.sweep.run_sweep` only the runs
they do not hold (:func:`split_held`), so that a sweep on another machine skips what is recorded; it writes the
records of the runs it finished at medium scale (:func:`write_records`). ``pkmixer reproduce --docs`` regenerates
docs/reproduction.md's verdicts from them alone (:mod:`pkmixer.experiments.docs`).

Layout: ``reproduction/<preset>-<scale>-<dataset>/<run name>.json``; a sweep at another budget (``pkmixer reproduce
--epochs N``, the longer-budget check on a GPU say) keeps its records apart, in ``<preset>-<scale>-e<N>-<dataset>/``
(:func:`folder_name`), so that they never replace the scale's own. The folder is found beside the source tree
(:func:`records_dir`), or where ``PKMIXER_RECORDS`` points.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..atomic import write_text_atomically
from .sweep import DONE, RunSpec, _normalized

VERSION = 1


def records_dir() -> Path | None:
    """``$PKMIXER_RECORDS``, else the repository's ``reproduction/`` folder when this is a source checkout that has
    one; None otherwise (an installed package keeps no records)."""
    if os.environ.get("PKMIXER_RECORDS"):
        return Path(os.environ["PKMIXER_RECORDS"])
    folder = Path(__file__).resolve().parents[3] / "reproduction"
    return folder if folder.is_dir() else None


def run_key(spec: RunSpec) -> str:
    """What identifies a run's result: its config without the keys that do not change it, and its probes."""
    text = json.dumps({"config": _normalized(spec.config), "probes": sorted(spec.probes)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def folder_name(preset: str, scale: str, dataset: str | None, epochs: int | None = None) -> str:
    """A sweep's name, ``<preset>-<scale>[-e<N>][-<dataset>]``: its records' sub-folder, and its default output
    folder under results/."""
    return "-".join(str(p) for p in (preset, scale, epochs and f"e{epochs}", dataset) if p)


def budgets(folder: Path | None, preset: str, scale: str, dataset: str | None) -> list[int]:
    """The other budgets N that ``folder`` holds records of for this preset, scale and data set (the ``-e<N>``
    sub-folders), ascending."""
    if folder is None or not folder.is_dir():
        return []
    head, tail = f"{preset}-{scale}-e", f"-{dataset}"
    found = []
    for sub in folder.iterdir():
        middle = sub.name[len(head):len(sub.name) - len(tail)]
        if sub.is_dir() and sub.name.startswith(head) and sub.name.endswith(tail) and middle.isdigit():
            found.append(int(middle))
    return sorted(found)


def load_records(folder: Path | None) -> dict[str, dict]:
    """Key -> record, of every record file under ``folder`` (none without one); a file that is not a record of
    this version is skipped."""
    out: dict[str, dict] = {}
    if folder is None or not folder.is_dir():
        return out
    for path in sorted(folder.glob("*/*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("version") == VERSION and "key" in record and "row" in record:
            out[record["key"]] = record
    return out


def split_held(specs: Sequence[RunSpec], records: dict[str, dict]) -> tuple[list[RunSpec], dict[str, dict]]:
    """(the specs the records do not hold as done, run name -> the row of each held one, with this spec's name and
    meta and the record's key)."""
    todo, held = [], {}
    for spec in specs:
        record = records.get(run_key(spec))
        if record is not None and record["row"].get("status") in DONE:
            held[spec.name] = {**record["row"], **spec.meta, "run": spec.name, "recorded": True, "key": record["key"]}
        else:
            todo.append(spec)
    return todo, held


def record_of(spec: RunSpec, row: dict, *, preset: str, scale: str, rules: str) -> dict[str, Any]:
    return {"version": VERSION, "key": run_key(spec), "preset": preset, "scale": scale, "rules": rules,
            "config": spec.config.as_dict(), "probes": list(spec.probes), "row": row}


def write_records(folder: Path, specs: Sequence[RunSpec], rows: Sequence[dict], *, preset: str, scale: str,
                  dataset: str | None, rules: str, epochs: int | None = None) -> list[Path]:
    """Write the record of every finished (or diverged) run of ``rows`` that is not already a record, into the
    sweep's sub-folder (:func:`folder_name`; ``epochs``: the budget that replaced the scale's own); returns the files
    written."""
    by_name = {s.name: s for s in specs}
    sub = folder / folder_name(preset, scale, dataset, epochs)
    written = []
    for row in rows:
        spec = by_name.get(row["run"])
        if spec is None or row.get("status") not in DONE or row.get("recorded"):
            continue
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / f"{spec.name}.json"
        write_text_atomically(path, json.dumps(record_of(spec, row, preset=preset, scale=scale, rules=rules),
                                               indent=1, sort_keys=True, default=str) + "\n")
        written.append(path)
    return written


def add_fields(folder: Path, spec: RunSpec, fields: dict[str, Any], *, preset: str, scale: str,
               dataset: str | None, epochs: int | None = None) -> Path | None:
    """Add ``fields`` (:meth:`~pkmixer.experiments.preset.Preset.derive`'s numbers) to the row of ``spec``'s record
    in the sweep's sub-folder; returns the file, or None where it holds no record of this config (or already these
    values)."""
    path = folder / folder_name(preset, scale, dataset, epochs) / f"{spec.name}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != run_key(spec) or not isinstance(record.get("row"), dict):
        return None
    if all(record["row"].get(k) == v for k, v in fields.items()):
        return None
    record["row"] = {**record["row"], **fields}
    write_text_atomically(path, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    return path


def rows_for(specs: Sequence[RunSpec], records: dict[str, dict]) -> list[dict]:
    """The rows of ``specs`` that the records hold (the others left out): what a report made from records alone
    reads."""
    _, held = split_held(specs, records)
    return [held[s.name] for s in specs if s.name in held]
