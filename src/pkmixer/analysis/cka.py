"""Mini-batch linear CKA between the hidden features of two models (Hayase & Karakida Sec. 3.4, Fig. 2a-c,
App. C.1; Nguyen, Raghu & Kornblith 2021, Sec. 3.1(2)).

For one mini-batch of n ≥ 4 examples, features (n, ...) are flattened to X ∈ R^{n×d}, K = XXᵀ, and

    HSIC₁(K, L) = [tr(K̃L̃) + (1ᵀK̃1)(1ᵀL̃1)/((n−1)(n−2)) − 2/(n−2) · 1ᵀK̃L̃1] / (n(n−3)),   K̃ = K, zero diagonal.

Over mini-batches, CKA = mean HSIC₁(K, L) / √(mean HSIC₁(K, K) · mean HSIC₁(L, L)), every batch weighted
equally, accumulated in float64, so features never have to be kept across batches.

Numerics. HSIC₁ is unchanged when every feature vector is shifted by the same vector (K_ij → K_ij + a_i + a_j + c
leaves it invariant), so each batch is centred before its Gram matrix is formed; this removes the cancellation
of large means. CKA is unchanged when a whole layer is multiplied by one constant, so each layer is divided by
one scale fixed at its first non-constant batch (the largest absolute centred feature there): tiny or huge
features give the same CKA as unit-scale ones. (Rescaling every batch separately would re-weight the batches
and is not equivalent.) A batch whose centred features are below ``CONSTANT_RTOL`` times its largest absolute
feature counts as constant and contributes exactly zero.

Degenerate layers. A layer whose features are constant over all examples has HSIC₁(K, K) = 0 and an undefined
CKA; :meth:`MinibatchCKA.result` raises :class:`~pkmixer.errors.ConfigError` naming it (leave it out with
``layers_a`` / ``layers_b``). The unbiased HSIC₁ is an inner product of U-centred Gram matrices, so
|CKA| ≤ 1; small negative values are possible for unrelated features.

Models are read only through the intermediate-features part of the model contract
(:class:`pkmixer.models.contract.HasIntermediates`: ``feature_names`` and ``forward_intermediates``), so any
family - or any module with those two methods - can be compared.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError, unknown_name
from ..figures import figure_path, save_figure
from ..models import contract
from ..models.features import check_where

# centred features this small relative to the raw ones are round-off of constant features
CONSTANT_RTOL = 1e-10
# annotate the heatmap cells up to this many rows and columns
ANNOTATE_MAX = 12


def hsic1(K: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """Unbiased HSIC₁ of stacks of Gram matrices with zero diagonal: (a, n, n), (b, n, n) -> (a, b)."""
    n = K.shape[-1]
    trace = torch.einsum("aij,bij->ab", K, L)  # tr(K̃L̃), both symmetric
    sums = K.sum((1, 2))[:, None] * L.sum((1, 2))[None, :] / ((n - 1) * (n - 2))
    cross = K.sum(2) @ L.sum(2).T * (2.0 / (n - 2))  # 1ᵀK̃L̃1 = (K̃1)ᵀ(L̃1)
    return (trace + sums - cross) / (n * (n - 3))


class MinibatchCKA:
    """Streaming CKA matrix between layers ``names_a`` of one model and ``names_b`` of another.

    Call :meth:`update` once per mini-batch with the features of every layer (same n examples on both
    sides), then :meth:`result` for the (len(names_a), len(names_b)) float64 CKA matrix. ``labels`` name the
    two models in error messages.
    """

    def __init__(self, names_a: Sequence[str], names_b: Sequence[str],
                 labels: tuple[str, str] = ("model A", "model B")) -> None:
        if not names_a or not names_b:
            raise ConfigError("CKA needs at least one layer on each side")
        self.names = (list(names_a), list(names_b))
        self.labels = labels
        self.scales: tuple[list[float | None], list[float | None]] = ([None] * len(names_a), [None] * len(names_b))
        self.cross = np.zeros((len(names_a), len(names_b)))  # Σ_batches HSIC₁(K_a, L_b)
        self.self_a = np.zeros(len(names_a))  # Σ_batches HSIC₁(K_a, K_a)
        self.self_b = np.zeros(len(names_b))
        self.n_batches = 0
        self.n_examples = 0

    def _grams(self, side: int, features: Sequence[torch.Tensor], n: int) -> torch.Tensor:
        """Centred Gram matrices of one side, each layer divided by its fixed scale: (layers, n, n)."""
        names, scales = self.names[side], self.scales[side]
        grams = []
        for i, (name, f) in enumerate(zip(names, features)):
            if f.ndim < 1 or f.shape[0] != n:
                raise ConfigError(f"features of layer {name!r} have shape {tuple(f.shape)}; expected ({n}, ...)")
            x = f.detach().reshape(n, -1).to(torch.float64)  # (n, d)
            if not torch.isfinite(x).all():
                raise ConfigError(f"features of layer {name!r} contain NaN or infinity")
            centred = x - x.mean(0)
            spread = float(centred.abs().max())
            if spread <= CONSTANT_RTOL * float(x.abs().max()):
                centred = torch.zeros_like(centred)  # constant in this batch: contributes exactly 0
            elif scales[i] is None:
                scales[i] = spread
            centred = centred / (scales[i] or 1.0)
            grams.append((centred @ centred.T).fill_diagonal_(0.0))  # (n, n)
        return torch.stack(grams)

    def update(self, features_a: Sequence[torch.Tensor], features_b: Sequence[torch.Tensor]) -> None:
        """Add one mini-batch: one (n, ...) tensor per layer of each side, n ≥ 4."""
        for names, features in zip(self.names, (features_a, features_b)):
            if len(features) != len(names):
                raise ConfigError(f"expected features of {len(names)} layers ({', '.join(names)}), "
                                  f"got {len(features)}")
        n = int(features_a[0].shape[0])
        if n < 4:
            raise ConfigError(f"mini-batch CKA needs at least 4 examples per batch (HSIC₁ divides by n−3), got {n}")
        self.add_grams(self._grams(0, features_a, n), self._grams(1, features_b, n))

    def add_grams(self, K: torch.Tensor, L: torch.Tensor) -> None:
        """Add one mini-batch given as its Gram matrices (:func:`feature_grams`): (layers_a, n, n), (layers_b, n, n)."""
        n = K.shape[-1]
        self.cross += hsic1(K, L).cpu().numpy()
        self.self_a += _self_hsic(K)
        self.self_b += _self_hsic(L)
        self.n_batches += 1
        self.n_examples += n

    def result(self) -> np.ndarray:
        """CKA matrix (len(names_a), len(names_b)), float64. Raises ConfigError for a constant layer."""
        if self.n_batches == 0:
            raise ConfigError("no mini-batch was given to CKA")
        for label, names, selfs in zip(self.labels, self.names, (self.self_a, self.self_b)):
            for name, value in zip(names, selfs):
                if not np.isfinite(value) or value <= 0:
                    raise ConfigError(f"layer {name!r} of {label} has constant features over all "
                                      f"{self.n_examples} examples, so its CKA is undefined; leave it out")
        return self.cross / np.sqrt(np.outer(self.self_a, self.self_b))


def feature_grams(model: nn.Module, batches: Iterable[torch.Tensor], where: str = "mixing"
                  ) -> tuple[list[str], np.ndarray]:
    """What CKA needs of one model, to store when its training ends: the feature names at ``where`` and, per layer
    and mini-batch, the centred Gram matrix with zero diagonal, each layer divided by one scale (the module
    docstring), float64 (layers, batches, n, n). :func:`cka_from_grams` of two such stacks on the same inputs is
    :func:`cka_matrix` of the two models."""
    check_where(where)
    contract.require(model, "CKA", contract.HasIntermediates, "the model")
    names = model.feature_names(where)
    acc = MinibatchCKA(names, names)
    grams, mode = [], model.training
    try:
        model.eval()
        with torch.no_grad():
            for x in batches:
                feats = model.forward_intermediates(x.to(_device(model)), list(range(len(names))), where=where,
                                                    intermediates_only=True)
                if int(x.shape[0]) < 4:
                    raise ConfigError(f"mini-batch CKA needs at least 4 examples per batch, got {int(x.shape[0])}")
                grams.append(acc._grams(0, feats, int(x.shape[0])).cpu())
    finally:
        model.train(mode)
    if not grams:
        raise ConfigError("no mini-batch was given to CKA")
    return names, torch.stack(grams, 1).numpy()


def cka_from_grams(names_a: Sequence[str], grams_a: np.ndarray, names_b: Sequence[str], grams_b: np.ndarray,
                   labels: tuple[str, str] = ("model A", "model B")) -> np.ndarray:
    """The CKA matrix of two models from their :func:`feature_grams` on the same mini-batches."""
    if grams_a.shape[1:] != grams_b.shape[1:]:
        raise ConfigError(f"the Gram matrices of {labels[0]} {grams_a.shape[1:]} and {labels[1]} "
                          f"{grams_b.shape[1:]} are not of the same mini-batches")
    acc = MinibatchCKA(names_a, names_b, labels=labels)
    for b in range(grams_a.shape[1]):
        acc.add_grams(torch.from_numpy(np.ascontiguousarray(grams_a[:, b], dtype=np.float64)),
                      torch.from_numpy(np.ascontiguousarray(grams_b[:, b], dtype=np.float64)))
    return acc.result()


def _self_hsic(K: torch.Tensor) -> np.ndarray:
    """HSIC₁(K_i, K_i) for a stack (layers, n, n) -> (layers,)."""
    return torch.stack([hsic1(k[None], k[None])[0, 0] for k in K]).cpu().numpy()


def minibatch_cka(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """CKA of one pair of layers from an iterable of (X, Y) mini-batches, X (n, ...) and Y (n, ...)."""
    acc = MinibatchCKA(["X"], ["Y"])
    for x, y in batches:
        acc.update([x], [y])
    return float(acc.result()[0, 0])


@dataclass(frozen=True)
class CKAResult:
    """CKA between layers of model A (rows) and model B (columns) at the feature points ``where``."""

    label_a: str
    label_b: str
    where: str
    names_a: list[str]
    names_b: list[str]
    matrix: np.ndarray  # (len(names_a), len(names_b)) float64
    diagonal_mean: float | None  # mean of the diagonal (Fig. 2a); None when the matrix is not square
    n_examples: int
    n_batches: int

    def as_dict(self) -> dict:
        return {**asdict(self), "matrix": self.matrix.tolist()}


def _select_layers(names: list[str], layers: Sequence[int | str] | None, label: str) -> list[int]:
    """Layer indices (negative count from the end) or names -> sorted indices into ``names``."""
    if layers is None:
        return list(range(len(names)))
    if isinstance(layers, (str, int)) or not layers:
        raise ConfigError(f"layers of {label} must be a non-empty list of indices or names, got {layers!r}")
    out = set()
    for layer in layers:
        if isinstance(layer, str):
            if layer not in names:
                raise unknown_name(f"layer of {label}", layer, names)
            out.add(names.index(layer))
        elif isinstance(layer, int) and not isinstance(layer, bool) and -len(names) <= layer < len(names):
            out.add(layer % len(names))
        else:
            raise ConfigError(f"layer {layer!r} of {label} is out of range for its {len(names)} feature points "
                              f"({names[0]} … {names[-1]})")
    return sorted(out)


def cka_matrix(model_a: nn.Module, model_b: nn.Module, batches: Iterable[torch.Tensor | Sequence[torch.Tensor]],
               where: str = "mixing", layers_a: Sequence[int | str] | None = None,
               layers_b: Sequence[int | str] | None = None, labels: tuple[str, str] = ("model A", "model B")
               ) -> CKAResult:
    """Mini-batch CKA between the features of two models over ``batches`` (inputs, or (input, label) tuples).

    Both models run in eval mode under ``torch.no_grad`` (their previous mode is restored); features come from
    ``forward_intermediates(x, indices, where=where, intermediates_only=True)``.
    """
    check_where(where)
    picks = []
    for model, layers, label in ((model_a, layers_a, labels[0]), (model_b, layers_b, labels[1])):
        contract.require(model, "CKA", contract.HasIntermediates, label)
        names = model.feature_names(where)
        picks.append((model, _select_layers(names, layers, label), names))
    acc = MinibatchCKA(*[[names[i] for i in idx] for _, idx, names in picks], labels=labels)
    modes = [m.training for m in (model_a, model_b)]
    try:
        model_a.eval()
        model_b.eval()
        with torch.no_grad():
            for batch in batches:
                x = batch if isinstance(batch, torch.Tensor) else batch[0]  # (B, in_chans, H, W)
                feats = [model.forward_intermediates(x.to(_device(model)), idx, where=where, intermediates_only=True)
                         for model, idx, _ in picks]
                acc.update(*feats)
    finally:
        model_a.train(modes[0])
        model_b.train(modes[1])
    matrix = acc.result()
    square = matrix.shape[0] == matrix.shape[1]
    return CKAResult(label_a=labels[0], label_b=labels[1], where=where, names_a=acc.names[0], names_b=acc.names[1],
                     matrix=matrix, diagonal_mean=float(np.diag(matrix).mean()) if square else None,
                     n_examples=acc.n_examples, n_batches=acc.n_batches)



def check_inputs(data: str) -> None:
    """Refuse inputs that are neither ``"gaussian"`` nor a known data set (before any model is loaded)."""
    if data != "gaussian":
        from ..data import list_datasets  # lazily: the data package imports torchvision

        if data not in list_datasets():
            raise unknown_name("data set (--data)", data, ["gaussian", *list_datasets()])


def input_batches(data: str, in_chans: int, img_size: int, batches: int, batch_size: int, *, seed: int = 0,
                  data_dir: str | None = None, resize: int | None = None) -> Iterable:
    """``batches`` mini-batches of ``batch_size`` inputs (in_chans, img_size, img_size): standard Gaussian ones
    drawn from ``seed`` (``data="gaussian"``), or the first test images of data set ``data``, as a model of that
    size evaluates them (``(images, labels)`` batches, read lazily; only whole batches)."""
    check_inputs(data)
    if data == "gaussian":
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(batch_size, in_chans, img_size, img_size, generator=generator) for _ in range(batches)]
    from ..data import build_dataset, build_transform, dataset_info

    transform = build_transform(dataset_info(data), train=False, img_size=img_size, in_chans=in_chans, resize=resize)
    test = build_dataset(data, "test", data_dir=data_dir, transform=transform)
    first = torch.utils.data.Subset(test, range(min(len(test), batches * batch_size)))
    return torch.utils.data.DataLoader(first, batch_size=batch_size, drop_last=True)


def compare_models(model_a: nn.Module, model_b: nn.Module, *, data: str = "gaussian", batches: int = 16,
                   batch_size: int = 64, seed: int = 0, data_dir: str | None = None, where: str = "mixing",
                   labels: tuple[str, str] = ("model A", "model B")) -> CKAResult:
    """:func:`cka_matrix` of two models that take the same inputs, over :func:`input_batches` (what ``pkmixer
    cka`` computes); models with different input channels or sizes are refused."""
    check_inputs(data)
    shapes = [(m.in_chans, m.img_size) for m in (model_a, model_b)]
    if shapes[0] != shapes[1]:
        raise ConfigError(f"the models take different inputs: {shapes[0]} and {shapes[1]} (channels, pixels)")
    check_batch_memory(model_a, model_b, data=data, batches=batches, batch_size=batch_size, where=where)
    inputs = input_batches(data, *shapes[0], batches, batch_size, seed=seed, data_dir=data_dir)
    return cka_matrix(model_a, model_b, inputs, where=where, labels=labels)


def check_batch_memory(model_a: nn.Module, model_b: nn.Module, *, data: str, batches: int, batch_size: int,
                       where: str = "mixing") -> None:
    """Refuse (ConfigError) mini-batches whose inputs and Gram matrices alone take more memory than is available:
    the float32 inputs (all ``batches`` of them for Gaussian ones, drawn at once) and, per mini-batch of n, an
    n×n float64 Gram matrix for each feature point of both models and one more being built."""
    from ..models.budget import available_memory

    check_where(where)
    n, (in_chans, img_size) = batch_size, (model_a.in_chans, model_a.img_size)
    layers = sum(len(m.feature_names(where)) for m in (model_a, model_b))
    inputs = (batches if data == "gaussian" else 1) * n * in_chans * img_size**2 * 4
    need = inputs + (layers + 1) * n * n * 8
    free = available_memory()
    if need > free:
        raise ConfigError(f"{batches} mini-batches of {n} examples need about {need / 2**30:.3g} GiB for their "
                          f"inputs and Gram matrices, beyond the {free / 2**30:.3g} GiB available; lower --batch-size "
                          "or --batches")


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def plot_cka(result: CKAResult, path: str | Path, title: str | None = None) -> Path:
    """Heatmap of ``result.matrix`` (model A on y from the input at the bottom, model B on x), colour bar 0..1,
    values written in the cells up to 12×12. Writes PNG or SVG by the suffix of ``path``; returns the path."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no display

    path = figure_path(path)
    rows, cols = result.matrix.shape
    label_width = 0.08 * max(len(name) for name in result.names_a)  # inches for the y tick labels
    fig = Figure(figsize=(2.5 + label_width + 0.5 * max(cols, 6), 2.0 + 0.5 * max(rows, 4)), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(result.matrix, origin="lower", vmin=0.0, vmax=1.0, cmap="magma", aspect="auto")
    fig.colorbar(image, ax=ax, label="CKA")
    ax.set_xticks(range(cols), result.names_b, rotation=60, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(rows), result.names_a)
    ax.set_xlabel(result.label_b)
    ax.set_ylabel(result.label_a)
    if rows <= ANNOTATE_MAX and cols <= ANNOTATE_MAX:
        for i in range(rows):
            for j in range(cols):
                value = result.matrix[i, j]
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if value > 0.6 else "white")
    ax.set_title(title or f"mini-batch CKA at '{result.where}' points, {result.n_examples} examples", fontsize=10)
    return save_figure(fig, path, dpi=120)
