"""``pkmixer reproduce`` and ``pkmixer report`` as library calls: a preset's sweep, then its report.

:func:`reproduce` picks the data set (the scale's default; Fashion-MNIST falls back to scikit-learn's bundled
digits when it is not on this machine, and says so), builds the preset's runs, runs or resumes the sweep in
``results/<name>-<scale>-<dataset>`` (or ``out``) and renders the report; :func:`rerender` renders the report of
an existing sweep directory again, from its finished runs, without training.
"""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .preset import Preset, get_preset, seeds_in
from .report import write_report
from .records import add_fields, folder_name, load_records, records_dir, run_key, split_held, write_records
from .sweep import BACKENDS, RunSpec, load_rows, read_sweep, run_sweep, unfinished

ALWAYS_THERE = ("digits", "synthetic")  # generated or bundled: nothing to look for


def default_out(name: str, scale: str, dataset: str | None, epochs: int | None = None) -> Path:
    return Path("results") / folder_name(name, scale, dataset, epochs)


def _available(dataset: str, data_dir: str | None) -> Path | None:
    """Where ``dataset`` lies on this machine (None: generated or bundled); a ConfigError saying where it looked
    when it is not there."""
    from ..data import build_dataset

    if dataset not in ALWAYS_THERE:
        return build_dataset(dataset, "test", data_dir=data_dir).root
    return None


def preset_runs(preset: Preset, scale: str, dataset: str | None, data_dir: str | None, check: bool,
                log: Callable[[str], None]) -> tuple[str | None, list[RunSpec]]:
    """The data set (``dataset`` or the scale's default) and the runs; with ``check``, the data set must be on
    this machine - except that a default Fashion-MNIST that is absent becomes the bundled digits, said in a line."""
    chosen = preset.check_dataset(scale, dataset)
    specs = preset.runs(scale, chosen)  # refuses a data set the scale does not take before looking for it
    if chosen is None or not check or not specs:
        return chosen, specs
    try:
        root = _available(chosen, data_dir)
        log(f"data: {chosen} " + ("(bundled or generated)" if root is None else f"from {root}"))
    except ConfigError as err:
        if dataset is None and chosen == "fashion-mnist" and "digits" in preset.datasets:
            log(f"data: Fashion-MNIST is not on this machine ({err}); using scikit-learn's bundled digits instead")
            return "digits", preset.runs(scale, "digits")
        raise
    return chosen, specs


def with_epochs(specs: list[RunSpec], epochs: int, name: str) -> list[RunSpec]:
    """``specs`` trained for ``epochs`` epochs instead of the scale's own; the runs that double another's epochs
    (the convergence check, ``meta["doubles"]``) for twice that. Refused for a preset whose runs vary their
    epochs otherwise."""
    if epochs < 1:
        raise ConfigError(f"--epochs must be a positive integer, got {epochs}")
    base = {s.config.schedule.epochs for s in specs if "doubles" not in s.meta}
    if len(base) > 1:
        raise ConfigError(f"preset {name} varies the epochs of its runs ({', '.join(map(str, sorted(base)))}); "
                          "drop --epochs")
    return [dataclasses.replace(s, config=s.config.override(
        {"schedule.epochs": 2 * epochs if "doubles" in s.meta else epochs})) for s in specs]


def compiled_runs(specs: list[RunSpec], mode: str) -> list[RunSpec]:
    """``specs`` trained under ``torch.compile`` in ``mode`` (``run.compile``, ``run.compile_mode``): the same
    runs to float rounding; reduce-overhead's CUDA graphs pay for the small launch-bound models on a GPU."""
    return [dataclasses.replace(s, config=s.config.override({"run.compile": True, "run.compile_mode": mode}))
            for s in specs]


def command_line(name: str, scale: str, dataset: str | None, seeds: int | None, epochs: int | None = None,
                 compile_mode: str | None = None) -> str:
    parts = ["pkmixer", "reproduce", name, "--scale", scale]
    parts += ["--dataset", dataset] if dataset else []
    parts += ["--seeds", str(seeds)] if seeds is not None else []
    parts += ["--epochs", str(epochs)] if epochs is not None else []
    parts += ["--compile", compile_mode] if compile_mode is not None else []
    return shlex.join(parts)


def reproduce(name: str, *, scale: str = "small", dataset: str | None = None, data_dir: str | None = None,
              backend: str = "local", address: str | None = None, workers: int | None = None,
              threads: int | None = None, out: str | Path | None = None, seeds: int | None = None,
              epochs: int | None = None, overwrite: bool = False, progress: bool = True,
              log: Callable[[str], None] = print, stack: bool = False,
              compile_mode: str | None = None, records: str | Path | None = None) -> dict[str, Any]:
    """Run (or resume) preset ``name``'s sweep and render its report; returns the report's paths, the verdict,
    the numbers and the run counts. Runs that failed leave the report unrendered ("failed" lists them).
    ``epochs`` replaces the scale's epochs (:func:`with_epochs`): the medium scale's convergence check at a longer
    budget, on a GPU say. ``stack`` trains the runs that differ only in their seeds, learning rate and weight decay as
    stacked jobs
    (:func:`~pkmixer.experiments.sweep.run_sweep`). ``compile_mode`` trains every run compiled in that mode
    (:func:`compiled_runs`). ``records``: the folder of kept results (None: :func:`~.records.records_dir`, "" for
    none): the runs it holds are not run again, and at medium scale the runs finished here are written to it, with
    the numbers the preset derives from several runs' files (:meth:`~.preset.Preset.derive`) once all have finished.
    A run's record is keyed by its config, so a record made with other epochs or on another data set is not taken."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    preset = get_preset(name).with_seeds(seeds)
    preset.check_scale(scale)
    dataset, specs = preset_runs(preset, scale, dataset, data_dir, check=backend == "local", log=log)
    if seeds is not None and specs and len(seeds_in(specs)) != seeds:
        raise ConfigError(f"preset {name} does not vary its seeds; drop --seeds")
    if epochs is not None and specs:
        specs = with_epochs(specs, epochs, name)
    if compile_mode is not None:
        specs = compiled_runs(specs, compile_mode)
    if data_dir is not None:
        specs = [dataclasses.replace(s, config=s.config.override({"data.data_dir": str(data_dir)})) for s in specs]
    sweep_dir = Path(out) if out is not None else default_out(name, scale, dataset, epochs)
    info = {"preset": name, "scale": scale, "dataset": dataset, "seeds": seeds, "epochs": epochs,
            "compile": compile_mode, "command": command_line(name, scale, dataset, seeds, epochs, compile_mode)}
    if (sweep_dir / "sweep.json").is_file():
        theirs = read_sweep(sweep_dir)["info"]
        mine = {k: info[k] for k in ("preset", "scale", "dataset", "epochs", "compile")}
        if {k: theirs.get(k) for k in mine} != mine:
            raise ConfigError(f"{sweep_dir} holds the sweep of `{theirs.get('command', 'another command')}`; "
                              "choose another --out")
    folder = records_dir() if records is None else (Path(records) if records else None)
    todo, held = split_held(specs, load_records(folder))
    if held:
        log(f"records: {len(held)} of the {len(specs)} runs are held in {folder}; they are not run again")
    keep = folder is not None and scale == "medium"
    written: list[Path] = []

    def record(spec: RunSpec, row: dict) -> None:  # as each run ends: a sweep killed later keeps it
        written.extend(write_records(folder, [spec], [row], preset=name, scale=scale, dataset=dataset,
                                     rules=preset.rules_hash(), epochs=epochs))

    ran = run_sweep(todo, sweep_dir, backend=backend, workers=workers, address=address, progress=progress,
                    log=log, threads=threads, info=info, stack=stack,
                    on_row=record if keep else None) if todo or not held else []
    by_name = {r["run"]: r for r in ran}
    rows = [held.get(s.name) or {**by_name[s.name], "key": run_key(s)} for s in specs]
    if keep and ran:  # runs that ended before this call (a resumed sweep) are recorded here
        done = {path.stem for path in written}
        written += write_records(folder, todo, [r for r in ran if r["run"] not in done], preset=name, scale=scale,
                                 dataset=dataset, rules=preset.rules_hash(), epochs=epochs)
        if written:
            log(f"records: {len(written)} runs written to {folder}")
    left = unfinished(rows)
    result: dict[str, Any] = {"preset": name, "scale": scale, "dataset": dataset, "out": str(sweep_dir),
                              "runs": len(rows), "finished": sum(r["status"] == "finished" for r in rows)}
    if left:
        return {**result, "failed": [{"run": r["run"], "status": r["status"], "error": r["error"]} for r in left]}
    derived = preset.derive(rows, sweep_dir)
    if derived:
        rows = [{**r, **derived.get(r["run"], {})} for r in rows]
        if keep:
            added = 0
            for s in specs:
                if s.name in derived:
                    added += add_fields(folder, s, derived[s.name], preset=name, scale=scale, dataset=dataset,
                                        epochs=epochs) is not None
            if added:
                log(f"records: {added} runs' records given the numbers derived from the sweep's files")
    analysis = preset.analyze(rows, sweep_dir, scale)
    report = write_report(analysis, sweep_dir, preset=preset, scale=scale, dataset=dataset, command=info["command"],
                          rows=rows, overwrite=overwrite)
    return {**result, **report}


def rerender(sweep_dir: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Render the report of an existing sweep directory again from its runs, without training (always: the
    preset's analysis may have changed since; a report from other results needs ``overwrite``)."""
    sweep_dir = Path(sweep_dir)
    info = read_sweep(sweep_dir)["info"]
    if not info.get("preset"):
        raise ConfigError(f"{sweep_dir} was not made by `pkmixer reproduce` (sweep.json names no preset)")
    preset = get_preset(info["preset"]).with_seeds(info.get("seeds"))
    rows = load_rows(sweep_dir)
    analysis = preset.analyze(rows, sweep_dir, info["scale"])
    report = write_report(analysis, sweep_dir, preset=preset, scale=info["scale"], dataset=info.get("dataset"),
                          command=info.get("command", ""), rows=rows, overwrite=overwrite, refresh=True)
    return {"preset": preset.name, "scale": info["scale"], "dataset": info.get("dataset"), "out": str(sweep_dir),
            "runs": len(rows), "finished": sum(r["status"] == "finished" for r in rows), **report}


def check_regime(name: str, *, scale: str = "medium", dataset: str | None = None) -> dict[str, Any]:
    """The regime check of preset ``name`` at ``scale`` from its run configs, without training: its lines, whether
    it is reached, the runs and the estimated hours on 2 cores (where the preset's per-run time is recorded)."""
    from . import recipes

    preset = get_preset(name)
    chosen = preset.check_dataset(scale, dataset)
    specs = preset.runs(scale, chosen)
    check = preset.regime_check(scale, chosen)
    hours = recipes.estimate_hours(name, specs) if name in recipes.RUN_EPOCH_SECONDS and specs else None
    return {"preset": name, "scale": scale, "dataset": chosen, "reached": check.reached, "lines": check.lines(),
            "runs": len(specs), "hours_on_2_cores": hours}
