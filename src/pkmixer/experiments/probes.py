"""Probes: what a sweep measures on a run's trained model once, when the run finishes (Mixer supp. A.1's
evaluations), stored in the run directory's ``probes.json`` so that a preset's ``analyze`` reads numbers from the
results rows and never reloads a checkpoint.

A :class:`~pkmixer.experiments.sweep.RunSpec` names its probes (``probes=("fewshot5", "top5")``); the sweep runs
them on the final weights (``checkpoints/latest.pt``) after training, and again for a finished run whose
``probes.json`` lacks one (a kill between the last checkpoint and the probe file), so that at any instant the
sweep directory resumes to the same table. Each probe returns a flat dict of numbers that becomes row columns:

* ``fewshot5`` - linear 5-shot error (the supplement's "linear 5-shot top-1 accuracy"; big_vision's few-shot
  evaluator): ridge regression from the frozen pre-logit features of 5 training images per class (standardised
  over those images, λ = :data:`RIDGE`) onto ±1 one-hot targets, evaluated on the whole test split; the mean over
  :data:`DRAWS` draws of the shots, keyed by the run's seed.
* ``top5`` - top-1 and top-5 error of the final weights on the test split (the supplement reports top-5 for
  its "views" ablation).
* ``kept`` - the fraction (and number) of non-zero entries among the weights β-LASSO acts on (those a run
  decays but the classifier's, :mod:`pkmixer.train.lasso`; Hayase & Karakida Table 1's dynamic-sparsity baseline).
* ``grams-<B>x<n>`` - what mini-batch CKA needs (Hayase & Karakida Fig. 2a-c): the Gram matrices of the features
  at every mixing block on the first B·n test images in batches of n (:func:`pkmixer.analysis.cka.feature_grams`),
  stored as ``grams.npz``; :func:`load_grams` reads them, and CKA between two runs is
  :func:`pkmixer.analysis.cka.cka_from_grams` of theirs.
"""
from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..atomic import write_atomically, write_text_atomically
from ..checkpoint import read_checkpoint
from ..errors import ConfigError
from ..train.config import DataConfig, build_config, load_yaml
from ..train.rundir import RunDir, RunLock

SHOTS = 5
DRAWS = 5  # draws of the shot set, averaged
RIDGE = 1.0  # the ridge penalty on standardised features


def _eval_batches(data: DataConfig, model: nn.Module, ds, indices: Sequence[int] | None = None
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``ds`` (or its examples ``indices``) through the evaluation transform, in batches of
    ``data.eval_batch_size``: batched on resident data, per example otherwise."""
    from ..data.resident import to_resident
    from ..train.build import batch_augment_for, transform_for
    from ..train.feeds import ResidentFeed, choose_feed

    order = torch.arange(len(ds)) if indices is None else torch.as_tensor(list(indices), dtype=torch.int64)
    size = data.eval_batch_size
    if choose_feed(data, model, ds, train=False) is ResidentFeed:
        held, augment = to_resident(ds), batch_augment_for(data, model, False, ds.info)
        for chunk in order.split(size):
            yield augment(held.images[chunk], held.labels[chunk])
    else:
        ds.transform = transform_for(data, model, train=False)
        for chunk in order.split(size):
            pairs = [ds[int(i)] for i in chunk]
            yield torch.stack([p[0] for p in pairs]), torch.as_tensor([int(p[1]) for p in pairs])


def _features(data: DataConfig, model: nn.Module, ds, indices: Sequence[int] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pre-logit features, logits and labels of ``ds`` (or of ``indices``), on the CPU in float64."""
    feats, logits, labels = [], [], []
    model.eval()
    with torch.no_grad():
        for images, y in _eval_batches(data, model, ds, indices):
            tokens = model.forward_features(images)
            feats.append(model.forward_head(tokens, pre_logits=True).double().cpu())
            logits.append(model.forward_head(tokens).double().cpu())
            labels.append(y.cpu())
    return torch.cat(feats), torch.cat(logits), torch.cat(labels)


def ridge_error(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                classes: int, ridge: float = RIDGE) -> float:
    """Test error of the ridge-regression classifier fitted on (``train_x``, ``train_y``): features standardised
    with the training set's mean and std, an unpenalised bias, ±1 one-hot targets."""
    mean, std = train_x.mean(0), train_x.std(0, unbiased=False).clamp_min(1e-12)
    a, b = (train_x - mean) / std, (test_x - mean) / std
    targets = 2.0 * nn.functional.one_hot(train_y, classes).double() - 1.0
    offset = targets.mean(0)
    weights = torch.linalg.solve(a.T @ a + ridge * torch.eye(a.shape[1], dtype=a.dtype), a.T @ (targets - offset))
    predicted = (b @ weights + offset).argmax(1)
    return float((predicted != test_y).double().mean())


def _shots(labels: np.ndarray, classes: int, shots: int, rng: np.random.Generator) -> list[int]:
    picked = []
    for c in range(classes):
        members = np.flatnonzero(labels == c)
        if len(members) < shots:
            raise ConfigError(f"the few-shot probe needs {shots} training examples of class {c}; "
                              f"the training split has {len(members)}")
        picked += rng.choice(members, size=shots, replace=False).tolist()
    return picked


def fewshot5(data: DataConfig, seed: int, model: nn.Module, sets: dict, run: RunDir) -> dict[str, float]:
    train, test = sets["train"], sets["test"]
    classes = train.info.num_classes
    labels = np.asarray(train.targets)
    test_x, _, test_y = _features(data, model, test)
    errors = []
    for draw in range(DRAWS):
        rng = np.random.default_rng([seed, draw])
        train_x, _, train_y = _features(data, model, train, _shots(labels, classes, SHOTS, rng))
        errors.append(ridge_error(train_x, train_y, test_x, test_y, classes))
    return {"fewshot5_error": float(np.mean(errors))}


def top5(data: DataConfig, seed: int, model: nn.Module, sets: dict, run: RunDir) -> dict[str, float]:
    _, logits, labels = _features(data, model, sets["test"])
    top = logits.topk(min(5, logits.shape[1]), dim=1).indices
    return {"top1_error": float((top[:, 0] != labels).double().mean()),
            "top5_error": float(1.0 - (top == labels[:, None]).any(1).double().mean())}


GRAMS = re.compile(r"grams-([1-9][0-9]*)x([1-9][0-9]*)")


def grams(data: DataConfig, seed: int, model: nn.Module, sets: dict, run: RunDir, batches: int,
          size: int) -> dict[str, Any]:
    from ..analysis.cka import feature_grams

    test = sets["test"]
    count = min(len(test), batches * size) // size * size
    if count == 0:
        raise ConfigError(f"the CKA probe needs at least {size} test images; the test split has {len(test)}")
    images = torch.cat([x for x, _ in _eval_batches(data, model, test, range(count))])
    names, stack = feature_grams(model, images.split(size))
    buffer = io.BytesIO()
    np.savez(buffer, grams=stack.astype(np.float32), names=np.array(names))  # float32: CKA to ~1e-6
    write_atomically(run.grams, lambda f: f.write(buffer.getvalue()))
    return {"layers": len(names), "batches": stack.shape[1], "batch_size": size}


def kept(data: DataConfig, seed: int, model: nn.Module, sets: dict, run: RunDir) -> dict[str, float]:
    from ..train.lasso import kept_fraction, lasso_weights

    weights = [p.detach() for p in lasso_weights(model)]
    fraction = kept_fraction(weights)
    return {"kept_fraction": fraction, "kept_weights": fraction * sum(w.numel() for w in weights)}


PROBES: dict[str, Callable[..., dict[str, Any]]] = {"fewshot5": fewshot5, "top5": top5, "kept": kept}
COLUMNS = {"fewshot5": ("fewshot5_error",), "top5": ("top1_error", "top5_error"),
           "kept": ("kept_fraction", "kept_weights")}  # what each adds to a row


def _probe(name: str) -> Callable[..., dict[str, Any]]:
    if name in PROBES:
        return PROBES[name]
    match = GRAMS.fullmatch(name)
    if match is None:
        raise ConfigError(f"unknown probe {name!r}; the probes are {', '.join(PROBES)} and grams-<B>x<n>")
    return lambda data, seed, model, sets, run: grams(data, seed, model, sets, run, int(match[1]), int(match[2]))


def load_grams(run_dir: str | Path) -> tuple[list[str], np.ndarray]:
    """The feature names and Gram matrices (layers, batches, n, n) a ``grams-<B>x<n>`` probe stored."""
    path = RunDir(Path(run_dir)).grams
    try:
        with np.load(path) as data:
            return [str(n) for n in data["names"]], data["grams"]
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError(f"{path}: no stored CKA Gram matrices ({type(err).__name__}); run the sweep again to "
                          "measure them") from None


def probe_columns(names: Sequence[str], measured: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """The row columns of the probes ``names``: their numbers in ``measured`` (:func:`read_probes`), None where a
    probe has not run yet."""
    return {column: measured.get(name, {}).get(column) for name in names for column in COLUMNS.get(name, ())}


def check_probes(names: Sequence[str]) -> tuple[str, ...]:
    for name in names:
        _probe(name)
    return tuple(names)


def read_probes(run_dir: str | Path) -> dict[str, dict[str, float]]:
    """Probe name -> its numbers, from ``probes.json`` ({} when there is none or it is unreadable)."""
    try:
        data = json.loads(RunDir(Path(run_dir)).probes.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def missing_probes(run_dir: str | Path, names: Sequence[str]) -> list[str]:
    done = read_probes(run_dir)
    return [n for n in names if n not in done]


def run_probes(run_dir: str | Path, names: Sequence[str], log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the probes of ``names`` that ``probes.json`` lacks on the run's final weights; write the file
    atomically (once, with every probe) and return its contents."""
    from ..train.build import model_and_data

    run = RunDir(Path(run_dir))
    todo = missing_probes(run.root, check_probes(names))
    if not todo:
        return read_probes(run.root)
    with RunLock(run):  # one process writes a run directory; a kill's temporary file goes here
        run.remove_temp_files()
        results = read_probes(run.root)
        cfg = build_config(load_yaml(run.config))
        payload = read_checkpoint(run.latest)
        model, sets = model_and_data(cfg.model, cfg.data, cfg.run.seed, ("train", "test"), payload, run.latest)
        for name in todo:
            log(f"probe {name}")
            results[name] = _probe(name)(cfg.data, cfg.run.seed, model, sets, run)
        write_text_atomically(run.probes, json.dumps(results, indent=2))
    return results
