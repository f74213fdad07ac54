"""Weight pictures: the Mixer supplementary's unit figures and Hayase & Karakida's sparsity patterns.

* Token-mixing units (Tolstikhin et al. 2021, supp. D, Fig. 1): the hidden units of a token-mixing MLP's
  first Dense, weight (D_S, S), each drawn as a √S×√S image (tokens in raster order of the patch grid), sorted
  low frequency first, each followed by its closest inverse. The ordering heuristic is the energy-weighted
  mean spatial frequency of the unit's 2-D FFT, Σ |F(k)|² |k| / Σ |F(k)|² with |k| the radial frequency in
  cycles per pixel (:func:`spatial_frequency`); a unit's closest inverse is the other unit whose weights have
  the smallest cosine similarity with its own (:func:`closest_inverses`).
* Per-patch projection units (supp. D, Fig. 2): the stem's (C, in_chans, P, P) weights as P×P RGB (or grey)
  patches, each min-max normalised to [0, 1].
* Sparsity patterns (Hayase & Karakida Fig. 1, Fig. S.9): the non-zero entries of I_C ⊗ W (Mixer token
  mixing), J₂(I_C ⊗ W)J₁ (RP-Mixer) and M ⊙ A (SW-MLP, p = 1/C) at small S = C, or of any layer of a model's
  effective MLP (:mod:`pkmixer.theory.effective`).

The weights come from the model contract (:mod:`pkmixer.models.contract`): ``token_unit_weights(block)`` and
``patch_unit_weights()`` where a family has them, and the effective MLP of any family; nothing here names a
model class.

Every plotting function writes a PNG or an SVG, chosen by the path's suffix, and returns the path. The
figures are drawn with matplotlib's object API (no pyplot, no global state, never shown).
:func:`visualize` is the single entry point of the command line.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import nn

from ..errors import ConfigError, check_positive_int, unknown_name
from ..figures import figure_path, save_figure
from ..layers.sparse import sample_bernoulli_mask
from ..models import contract
from ..theory.effective import effective_mlp, kron_identity, permutation_matrix, spmm
from .equivalence import check_effective_nnz

MAX_PATTERN_SIDE = 4096  # larger matrices do not read as pictures


# ---- ordering and matching (pure) ----------------------------------------------------------------------------


def spatial_frequency(images: np.ndarray) -> np.ndarray:
    """Energy-weighted mean radial frequency (cycles per pixel) of each (h, w) image; 0 for an all-zero one.

    A constant image gives 0, a checkerboard √2/2, the largest value.
    """
    images = np.asarray(images, dtype=np.float64)
    if images.ndim != 3:
        raise ConfigError(f"expected images of shape (n, h, w), got {images.shape}")
    power = np.abs(np.fft.fft2(images)) ** 2
    fy, fx = np.fft.fftfreq(images.shape[1]), np.fft.fftfreq(images.shape[2])
    radius = np.hypot(fy[:, None], fx[None, :])
    energy = power.sum(axis=(1, 2))
    weighted = (power * radius).sum(axis=(1, 2))
    return np.divide(weighted, energy, out=np.zeros_like(energy), where=energy > 0)


def low_frequency_order(images: np.ndarray) -> np.ndarray:
    """Indices of the images sorted by :func:`spatial_frequency`, lowest first (ties keep their order)."""
    return np.argsort(spatial_frequency(images), kind="stable")


def closest_inverses(vectors: np.ndarray) -> np.ndarray:
    """For each row, the index of the other row with the smallest cosine similarity (its closest inverse)."""
    vectors = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), -1)
    if len(vectors) < 2:
        raise ConfigError(f"closest inverses need at least 2 units, got {len(vectors)}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    cosine = unit @ unit.T
    np.fill_diagonal(cosine, np.inf)
    return np.argmin(cosine, axis=1)


def token_unit_sequence(weights: np.ndarray, num_units: int | None = None) -> np.ndarray:
    """The display order of supp. Fig. 1 for a (units, S) weight: the ``num_units`` lowest-frequency units,
    each followed by its closest inverse (2·num_units indices; an inverse may also appear on its own)."""
    weights = np.asarray(weights, dtype=np.float64)
    side = _square_side(weights.shape[1])
    order = low_frequency_order(weights.reshape(-1, side, side))
    count = len(order) if num_units is None else min(check_positive_int("num_units", num_units), len(order))
    first = order[:count]
    return np.stack([first, closest_inverses(weights)[first]], axis=1).reshape(-1)


def _square_side(tokens: int) -> int:
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ConfigError(f"{tokens} tokens do not form a square grid: token-mixing units need a perfect square S")
    return side


# ---- sparsity patterns (pure) --------------------------------------------------------------------------------


def _pattern(weight: torch.Tensor) -> np.ndarray:
    """Boolean (out, in) map of the stored entries of a sparse matrix, or of the non-zeros of a dense one."""
    if weight.layout == torch.sparse_coo:
        rows, cols = weight.coalesce().indices().numpy()
        out = np.zeros(tuple(weight.shape), dtype=bool)
        out[rows, cols] = True
        return out
    return weight.detach().cpu().numpy() != 0


def sparsity_masks(S: int = 8, C: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """The non-zero patterns of Fig. S.9 at m = S·C: SW-MLP M ⊙ A with p = 1/C, Mixer token mixing I_C ⊗ W,
    and the RP layer J₂(I_C ⊗ W)J₁ with J₁, J₂ independent uniform permutations; W, A Gaussian."""
    check_positive_int("S", S)
    check_positive_int("C", C)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    m = S * C
    if m > MAX_PATTERN_SIDE:
        raise ConfigError(f"S·C = {m} is too large to draw (at most {MAX_PATTERN_SIDE} per side)")
    generator = torch.Generator().manual_seed(seed)
    rows, cols = sample_bernoulli_mask(m, m, 1 / C, generator)
    sw = np.zeros((m, m), dtype=bool)
    sw[rows.numpy(), cols.numpy()] = True
    mixer = kron_identity(C, torch.randn(S, S, generator=generator, dtype=torch.float64))
    J1, J2 = (torch.randperm(m, generator=generator) for _ in range(2))
    rp = spmm(permutation_matrix(J2), mixer, permutation_matrix(J1))
    return {f"SW-MLP  M ⊙ A  (p = 1/{C})": sw, "Mixer  I_C ⊗ W": _pattern(mixer),
            "RP-Mixer  J₂(I_C ⊗ W)J₁": _pattern(rp)}


def effective_pattern(model: nn.Module, layer: int | str = 0) -> tuple[str, np.ndarray]:
    """(name, non-zero pattern) of one hidden linear map of the model's effective MLP, chosen by index or by
    name such as ``"blocks.0.token.fc1"``."""
    contract.require(model, "the sparsity picture of a model")
    if any(p.is_meta for p in model.parameters()):
        raise ConfigError("the model is on the meta device: it has no weights to draw")
    check_effective_nnz(model.info(), "the model")
    layers = effective_mlp(model).layers()
    names = [lin.name for lin in layers]
    if isinstance(layer, str):
        if layer not in names:
            raise unknown_name("effective layer", layer, names)
        chosen = layers[names.index(layer)]
    elif isinstance(layer, int) and not isinstance(layer, bool) and -len(layers) <= layer < len(layers):
        chosen = layers[layer]
    else:
        raise ConfigError(f"layer must be a name or an index in [0, {len(layers)}), got {layer!r}")
    if max(chosen.weight.shape) > MAX_PATTERN_SIDE:
        raise ConfigError(f"layer {chosen.name} is {tuple(chosen.weight.shape)}, too large to draw "
                          f"(at most {MAX_PATTERN_SIDE} per side)")
    return chosen.name, _pattern(chosen.weight)


# ---- figures -------------------------------------------------------------------------------------------------


def _mosaic(tiles: np.ndarray, cols: int, fill: float) -> np.ndarray:
    """Tiles (n, h, w[, 3]) in a grid of ``cols`` columns with one-pixel ``fill`` borders."""
    n, h, w = tiles.shape[:3]
    rows = -(-n // cols)
    out = np.full((rows * (h + 1) + 1, cols * (w + 1) + 1, *tiles.shape[3:]), fill, dtype=np.float64)
    for k, tile in enumerate(tiles):
        r, c = divmod(k, cols)
        out[1 + r * (h + 1):(r + 1) * (h + 1), 1 + c * (w + 1):(c + 1) * (w + 1)] = tile
    return out


def _values(weight: torch.Tensor) -> np.ndarray:
    if weight.is_meta:
        raise ConfigError("the model is on the meta device: it has no weights to draw")
    return weight.detach().cpu().double().numpy()


def _grid_columns(count: int, cols: int | None, step: int = 1) -> int:
    """``cols`` (at most ``count``), or about √(2·count) rounded to a multiple of ``step`` (a grid about twice as
    wide as tall)."""
    if cols is not None:
        return min(check_positive_int("cols", cols), count)
    return max(step, round(math.sqrt(2 * count) / step) * step)


def _grid_figure(image: np.ndarray, title: str, **imshow) -> Figure:
    height, width = image.shape[:2]
    fig_width = 9.0
    fig = Figure(figsize=(fig_width, fig_width * height / width + 0.6), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(image, interpolation="nearest", **imshow)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    return fig


def plot_token_units(model: nn.Module, path: str | Path, *, block: int = 0, num_units: int | None = 32,
                     cols: int | None = None) -> Path:
    """Supp. Fig. 1: the first Dense of ``blocks[block]``'s token-mixing MLP, ``num_units`` units (None: all)
    sorted low frequency first, each followed by its closest inverse, in ``cols`` columns (None: about twice
    as wide as tall, pairs kept on one row); each unit scaled to [-1, 1]."""
    path = figure_path(path)
    if not isinstance(model, contract.TokenUnits):
        raise ConfigError(f"token-mixing units need a model with token mixing (token_unit_weights, "
                          f"pkmixer.models.contract), got {type(model).__name__}")
    weights = _values(model.token_unit_weights(block))  # (D_S, S_in); the model refuses blocks without images
    sequence = token_unit_sequence(weights, num_units)
    side = _square_side(weights.shape[1])
    tiles = weights[sequence].reshape(-1, side, side)
    scale = np.abs(tiles).max(axis=(1, 2), keepdims=True)
    tiles = np.divide(tiles, scale, out=np.zeros_like(tiles), where=scale > 0)
    title = (f"Block {block} token-mixing units: {len(sequence) // 2} of {len(weights)} hidden units as "
             f"{side}×{side} images\nlow frequency first, each followed by its closest inverse")
    image = _mosaic(tiles, _grid_columns(len(tiles), cols, step=2), np.nan)
    fig = _grid_figure(image, title, cmap="RdBu_r", vmin=-1, vmax=1)
    return save_figure(fig, path)


def plot_patch_units(model: nn.Module, path: str | Path, *, num_units: int | None = None,
                     cols: int | None = None) -> Path:
    """Supp. Fig. 2: the per-patch projection units (stem weights (C, in_chans, P, P)) as RGB patches (grey for
    one input channel), each normalised to [0, 1], in ``cols`` columns (None: about twice as wide as tall)."""
    path = figure_path(path)
    if not isinstance(model, contract.PatchUnits):
        raise ConfigError(f"{type(model).__name__} has no per-patch stem to draw")
    weights = _values(model.patch_unit_weights())  # (C, in_chans, P, P)
    if weights.shape[1] not in (1, 3):
        raise ConfigError(f"patch units are drawn as grey or RGB images; the stem has {weights.shape[1]} input "
                          "channels")
    count = len(weights) if num_units is None else min(check_positive_int("num_units", num_units), len(weights))
    tiles = weights[:count].transpose(0, 2, 3, 1)  # (n, P, P, in_chans)
    low = tiles.min(axis=(1, 2, 3), keepdims=True)
    span = tiles.max(axis=(1, 2, 3), keepdims=True) - low
    tiles = np.divide(tiles - low, span, out=np.full_like(tiles, 0.5), where=span > 0)
    grey = tiles.shape[-1] == 1
    image = _mosaic(tiles[..., 0] if grey else tiles, min(_grid_columns(count, cols), count), 1.0)
    patch = weights.shape[-1]
    title = f"Per-patch projection units: {count} of {len(weights)} ({patch}×{patch} patches, each scaled to [0, 1])"
    fig = _grid_figure(image, title, **({"cmap": "gray", "vmin": 0, "vmax": 1} if grey else {}))
    return save_figure(fig, path)


def plot_sparsity(patterns: Mapping[str, np.ndarray], path: str | Path, title: str | None = None) -> Path:
    """Boolean patterns side by side, non-zeros black, each titled with its non-zero count and density."""
    path = figure_path(path)
    if not patterns:
        raise ConfigError("no sparsity patterns to draw")
    fig = Figure(figsize=(3.4 * len(patterns), 4.2), layout="constrained")
    for ax, (name, pattern) in zip(fig.subplots(1, len(patterns), squeeze=False)[0], patterns.items()):
        ax.imshow(pattern, cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{name}\n{pattern.shape[0]}×{pattern.shape[1]}, nnz {int(pattern.sum())}, "
                     f"density {pattern.mean():.3g}", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def sparsity_patterns(S: int = 8, C: int = 8, seed: int = 0, path: str | Path = "sparsity.png") -> Path:
    """Fig. 1 / Fig. S.9: SW-MLP, Mixer and RP-Mixer effective weights at S, C (:func:`sparsity_masks`)."""
    return plot_sparsity(sparsity_masks(S, C, seed), path,
                         title=f"Non-zero entries of effective weights, S = {S}, C = {C}, m = {S * C}")


def model_sparsity_patterns(models: Mapping[str, nn.Module], path: str | Path, layer: int | str = 0) -> Path:
    """One effective-MLP layer (:func:`effective_pattern`) of each model, side by side, titled by the keys."""
    patterns = {}
    for label, model in models.items():
        name, pattern = effective_pattern(model, layer)
        patterns[f"{label}: {name}"] = pattern
    return plot_sparsity(patterns, path)


# ---- the command line's entry point --------------------------------------------------------------------------

KINDS = ("token-units", "patch-units", "sparsity")


def visualize(kind: str, path: str | Path, model: nn.Module | None = None, **options) -> Path:
    """Draw ``kind`` to ``path``: ``"token-units"`` (:func:`plot_token_units`), ``"patch-units"``
    (:func:`plot_patch_units`) or ``"sparsity"`` (:func:`sparsity_patterns` without a model,
    :func:`model_sparsity_patterns` with one); ``options`` are that function's keyword arguments."""
    targets = {"token-units": plot_token_units, "patch-units": plot_patch_units,
               "sparsity": sparsity_patterns if model is None else model_sparsity_patterns}
    if kind not in targets:
        raise unknown_name("picture kind", kind, KINDS)
    target = targets[kind]
    accepted = [p for p in inspect.signature(target).parameters if p not in ("model", "models", "path")]
    for key in options:
        if key not in accepted:
            raise unknown_name(f"option for {kind}", key, accepted)
    if target is sparsity_patterns:
        return target(path=path, **options)
    if model is None:
        raise ConfigError(f"{kind} needs a model")
    if target is model_sparsity_patterns:
        return target({type(model).__name__: model}, path, **options)
    return target(model, path, **options)
