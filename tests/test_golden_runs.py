"""Recorded training numbers: small solo, stacked and resumed runs (with and without a validation split) whose every
metrics row - ``epoch_time`` aside - must stay what it was when ``tests/data/golden_runs.json`` was written, so
that a change to the trainer that is meant to leave results alone is shown to. Float rounding differs between
CPU kernels (AVX2, AVX-512) and torch releases, so the file holds one record per environment, and the comparison
runs where one matches this machine's.

Record this machine's environment, or regenerate its record (only when results are meant to change, and say so in
the commit; then regenerate every environment's record that can be had): ``python tests/test_golden_runs.py
tests/data/golden_runs.json``."""
import json
import sys
from pathlib import Path

import pytest
import torch

RECORD = Path(__file__).parent / "data" / "golden_runs.json"
BASE = {"data.name": "digits", "model.name": "rp_smixer_t4_28", "model.img_size": 8, "model.patch_size": 2,
        "model.in_chans": 1, "model.depth": 2, "model.embed_dim": 16, "data.batch_size": 32,
        "data.train_subset": 512, "data.test_subset": 256, "data.crop_padding": 1, "data.hflip": True,
        "data.label_smoothing": 0.1, "optim.name": "adamw", "optim.lr": 0.01, "optim.weight_decay": 0.05,
        "schedule.epochs": 3, "schedule.warmup_epochs": 0.5, "run.progress": False, "run.device": "cpu"}
SWMLP = {**BASE, "model.name": "swmlp_t4_28", "model.embed_dim": 4, "model.width": 64, "model.density": 0.25,
         "optim.ema_decay": 0.9}


def _environment() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def train_all(root: Path) -> dict:
    """Every recorded run, trained under ``root`` with one thread: {name: metrics rows without epoch_time}."""
    from pkmixer.train import loop, stacked_runs
    from pkmixer.train.config import build_config

    quiet = dict(log=lambda _: None)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for split, val in (("", {}), ("val-", {"data.val_fraction": 0.2})):
            def cfg(base: dict, seed: int, **extra):
                return build_config(None, {**base, **val, "run.seed": seed, "model.structure_seed": seed, **extra})

            loop.train(cfg(BASE, 0), root / f"{split}solo", **quiet)
            loop.train(cfg(SWMLP, 1), root / f"{split}solo-swmlp", **quiet)
            stacked_runs.train_stack([cfg(BASE, s) for s in (0, 1, 2)], [root / f"{split}stack{s}" for s in (0, 1, 2)],
                                     **quiet)
            stacked_runs.train_stack([cfg(SWMLP, s) for s in (4, 5)], [root / f"{split}stack-swmlp{s}" for s in (4, 5)],
                                     **quiet)
            loop.train(cfg(BASE, 3), root / f"{split}resumed", stop_after=1, **quiet)
            loop.train(None, root / f"{split}resumed", resume=True, **quiet)
    finally:
        torch.set_num_threads(before)
    out = {}
    for run in sorted(root.iterdir()):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        out[run.name] = [{k: v for k, v in row.items() if k != "epoch_time"} for row in rows]
    return out


def _records(path: Path = RECORD) -> list[dict]:
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data["records"] if "records" in data else [data]  # one environment, as first written


@pytest.mark.slow  # 18 small runs, about 30 s
def test_metrics_rows_are_the_recorded_ones(tmp_path):
    here = _environment()
    record = next((r for r in _records() if r["environment"] == here), None)
    if record is None:
        pytest.skip(f"recorded with {[r['environment'] for r in _records()]}; this machine has {here}: float "
                    "rounding differs")
    runs = train_all(tmp_path)
    assert runs.keys() == record["runs"].keys()
    for name, rows in runs.items():
        assert rows == record["runs"][name], name


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        ours = {"environment": _environment(), "runs": train_all(Path(where))}
    others = [r for r in _records(Path(sys.argv[1])) if r["environment"] != ours["environment"]]
    Path(sys.argv[1]).write_text(json.dumps({"records": [*others, ours]}, indent=1, sort_keys=True) + "\n")
