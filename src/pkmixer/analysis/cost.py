"""Cost accounting: parameters, connections, FLOPs and memory of every model (Hayase & Karakida App. D.9,
Table S.3; Tolstikhin et al. 2021, Table 1 and supp. Table 2).

Conventions (all counts per image unless said otherwise):

* MACs are the multiply-accumulates of convolutions and matrix products of a forward pass, computed
  analytically from the architecture (:func:`layer_costs`). This is the convention of the published numbers
  (Mixer-B/16: 12.6 G) and of :class:`torch.utils.flop_counter.FlopCounterMode`, which reports 2 FLOPs per
  MAC (:func:`measured_macs`). Each layer declares its MACs per input vector and each container the rows its
  layers run on (the model contract, :mod:`pkmixer.models.contract`): a Dense inside a mixing layer runs once
  per Kronecker block (``PKMixing.other`` rows), a per-patch stem once per patch; a sparse layer costs its kept
  weights (nnz) per row, a dense-masked one the full in·out because it multiplies a dense matrix. Not counted:
  biases, LayerNorm, activations, pooling, residual additions, the gathers of PK layers and the M ⊙ W product
  of a dense-masked layer (done once per batch).
* FLOPs = 2 × MACs; training FLOPs = 3 × forward FLOPs (the backward pass computes gradients with respect
  to the inputs and to the weights, each costing about one forward).
* Memory: ``param_bytes`` are the parameter tensors as stored (a dense-masked weight is a full matrix) in
  ``dtype``; ``buffer_bytes`` the buffers (masks, COO indices, permutations) at their own element size,
  floating ones in ``dtype``; ``train_state_bytes`` = 4 × ``param_bytes`` (weights, gradients, two AdamW
  moments) + ``buffer_bytes``, the convention that reproduces Table S.3's 23.2 TB for the ImageNet SW-MLP.
* Activations are measured exactly: :func:`saved_tensor_bytes` sums the storages that autograd saves for
  backward in a training-mode forward, found with ``torch.autograd.graph.saved_tensors_hooks``, leaving out
  the model's own parameters and buffers. The forward runs on the meta device when the model is on it (no
  memory, so it works for Mixer-H/14). Two batch sizes give the per-image slope
  (``activation_bytes_per_image``) and the batch-independent rest (``saved_fixed_bytes``, e.g. the M ⊙ W
  products of a dense-masked SW-MLP).

An SW-MLP too large to build (its masks live on the CPU even on the meta device) is costed from its
configuration with the expected number of kept weights, p·in·out per layer (:func:`swmlp_expected_cost`);
:func:`fixed_omega_comparison` sets MLP-Mixer, RP-Mixer and both SW-MLP forms side by side at the same Ω and
width m = S·C, the comparison of Table S.3.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..errors import ConfigError, check_density, check_positive, check_positive_int, unknown_name
from ..models import contract
from ..models.registry import create_model, model_entry
from ..theory.width import optimal_channels, parse_omega, tokens_for_channels

# the registered entries whose families fixed_omega_comparison builds (every default overridden) and
# swmlp_expected_cost costs: the Mixer (MLP-Mixer and RP-Mixer) and the SW-MLP
MIXER_ENTRY, SWMLP_ENTRY = "mixer_c64p4_32", "swmlp_m4096d6p4_32"
TRAIN_STATE_COPIES = 4  # weights, gradients and the two AdamW moments
TRAIN_FLOPS_FACTOR = 3  # forward + backward (input and weight gradients)


@dataclass(frozen=True)
class LayerCost:
    """One matmul or convolution: applied to ``rows`` vectors per image, ``macs`` multiply-accumulates."""

    name: str
    kind: str  # conv, linear, sparse, masked, kronecker, monarch
    rows: int
    in_features: int
    out_features: int
    macs: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CostReport:
    """The columns of Table S.3 plus parameters and connections; see the module docstring for conventions."""

    model: str
    family: str
    built: bool  # False: expected costs of an SW-MLP configuration (see swmlp_expected_cost)
    batch_size: int
    dtype: str
    params: int  # trainable parameters; an SW-MLP counts only its kept weights
    stored_params: int  # entries of the parameter tensors (a dense-masked weight counts in full)
    connections: float  # Ω, mean non-zero weights per hidden layer of the effective MLP
    mixing_layers: int
    effective_width: int
    macs: int  # forward, per image
    forward_flops: int  # 2 · macs · batch_size
    train_flops: int  # 3 · forward_flops
    param_bytes: int
    buffer_bytes: int
    train_state_bytes: int  # 4 · param_bytes + buffer_bytes
    activation_bytes_per_image: int | None  # measured; None when not built
    saved_fixed_bytes: int | None  # saved for backward, independent of the batch; None when not built
    train_memory_bytes: int | None  # train state + saved tensors for batch_size images; None when not built

    def as_dict(self) -> dict:
        return asdict(self)


# ---- MACs --------------------------------------------------------------------------------------------------


def _check_model(model: object) -> nn.Module:
    return contract.require(model, "cost accounting")


def _rows_per_image(model: nn.Module) -> dict[int, int]:
    """How many vectors per image each module runs on, by module id, as the model and its containers declare
    them (:func:`pkmixer.models.contract.rows_per_image`): one per Kronecker block inside a mixing layer
    (grouped ones included; an untied map has a weight per block), one per token in the views of a grouped
    mixing (Mixer supp. A.1), one per channel in the token-projection skip, one per patch in the stem; a module
    nothing declares runs once."""
    return {id(m): n for module in model.modules() for m, n in contract.rows_per_image(module).items()}


def layer_costs(model: nn.Module) -> list[LayerCost]:
    """Every convolution and matrix product of a forward pass with its MACs per image (analytic; works on
    meta models), as each layer declares it (:func:`pkmixer.models.contract.layer_cost`)."""
    rows = _rows_per_image(_check_model(model))
    out = []
    for name, m in model.named_modules():
        cost = contract.layer_cost(m, rows.get(id(m)))
        if cost is not None:
            out.append(LayerCost(name, *cost))
    return out


def _probe(model: nn.Module) -> nn.Module:
    """A model that can run a forward for counting. A meta model may keep CPU tensors (an SW-MLP's masks and
    indices), and its layers say how to run it (``META_FORWARD``, :mod:`pkmixer.models.contract`): one that
    cannot run on meta (a sparse product) makes a copy with zero CPU tensors in place of the meta ones,
    O(kept weights); one with CPU state (a dense mask) makes a copy wholly on meta. Other models run as they are."""
    if not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        return model
    declared = {contract.meta_forward(m) for m in model.modules()}
    if "cpu_zeros" in declared:
        return copy.deepcopy(model)._apply(lambda t: torch.zeros_like(t, device="cpu") if t.is_meta else t)
    return copy.deepcopy(model).to("meta") if "to_meta" in declared else model


def _probe_input(model: nn.Module, batch_size: int) -> torch.Tensor:
    weight = next(model.parameters())
    return torch.zeros(batch_size, model.in_chans, model.img_size, model.img_size,
                       dtype=weight.dtype, device=weight.device)


def measured_macs(model: nn.Module, batch_size: int = 2) -> int:
    """MACs per image as torch counts them (FlopCounterMode FLOPs / 2 / batch), for checking
    :func:`layer_costs`. Torch does not count sparse matrix products, so sparse SW-MLP layers count 0."""
    check_positive_int("batch_size", batch_size)
    probe = _probe(_check_model(model))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        probe(_probe_input(probe, batch_size))
    return counter.get_total_flops() // (2 * batch_size)


# ---- memory -------------------------------------------------------------------------------------------------


def _check_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"dtype must be a floating torch dtype such as torch.float32, got {dtype!r}")
    return dtype


def _bytes(t: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes of a tensor's whole storage, floating storages counted in ``dtype``."""
    nbytes = t.untyped_storage().nbytes()
    return nbytes // t.element_size() * dtype.itemsize if t.is_floating_point() else nbytes


def _storages(t: torch.Tensor) -> list[torch.Tensor]:
    return [t._indices(), t._values()] if t.layout == torch.sparse_coo else [t]


def saved_tensor_bytes(model: nn.Module, batch_size: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the storages autograd saves for backward in one training-mode forward of ``batch_size``
    images, each storage once, the model's parameters and buffers left out; floating storages in ``dtype``.

    Runs on the meta device for a meta model. The RNG state and the train/eval mode are left as they were.
    """
    check_positive_int("batch_size", batch_size)
    return _saved_bytes(_probe(_check_model(model)), batch_size, _check_dtype(dtype))


def forward_peak_bytes(model: nn.Module, batch_size: int = 1, dtype: torch.dtype = torch.float32) -> int:
    """An estimate of the activation bytes an inference forward of ``batch_size`` images holds at once: the
    largest input plus output of any one leaf module (both alive while it runs) and the largest output of any
    (a skip keeps a sublayer's input meanwhile); floating tensors in ``dtype``. Runs on the meta device for a
    meta model; the train/eval mode is left as it was."""
    check_positive_int("batch_size", batch_size)
    probe, dtype = _probe(_check_model(model)), _check_dtype(dtype)
    pair = largest = 0

    def size(t: object) -> int:
        if not isinstance(t, torch.Tensor):
            return 0
        return t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())

    def hook(module: nn.Module, inputs: tuple, output: object) -> None:
        nonlocal pair, largest
        out = size(output)
        pair, largest = max(pair, sum(size(t) for t in inputs) + out), max(largest, out)

    leaves = [m for m in probe.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(hook) for m in leaves]
    was_training = probe.training
    probe.eval()
    try:
        with torch.no_grad():
            probe(_probe_input(probe, batch_size))
    finally:
        probe.train(was_training)
        for handle in handles:
            handle.remove()
    return pair + largest


def _saved_bytes(probe: nn.Module, batch_size: int, dtype: torch.dtype) -> int:
    own = {s.untyped_storage()._cdata for t in [*probe.parameters(), *probe.buffers()] for s in _storages(t)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for s in _storages(t):
            key = s.untyped_storage()._cdata
            if key not in own:
                saved[key] = _bytes(s, dtype)
        return t

    was_training = probe.training
    probe.train()
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            probe(_probe_input(probe, batch_size))
    finally:
        probe.train(was_training)
    return sum(saved.values())


# ---- reports ------------------------------------------------------------------------------------------------


def _model_name(model: nn.Module) -> str:
    return contract.display_name(model)


def _report(*, model: str, family: str, built: bool, batch_size: int, dtype: torch.dtype, params: int,
            stored_params: int, connections: float, mixing_layers: int, effective_width: int, macs: int,
            buffer_bytes: int, activation: int | None, saved_fixed: int | None) -> CostReport:
    param_bytes = stored_params * dtype.itemsize
    train_state = TRAIN_STATE_COPIES * param_bytes + buffer_bytes
    return CostReport(
        model=model, family=family, built=built, batch_size=batch_size, dtype=str(dtype).removeprefix("torch."),
        params=params, stored_params=stored_params, connections=connections, mixing_layers=mixing_layers,
        effective_width=effective_width, macs=macs, forward_flops=2 * macs * batch_size,
        train_flops=TRAIN_FLOPS_FACTOR * 2 * macs * batch_size, param_bytes=param_bytes, buffer_bytes=buffer_bytes,
        train_state_bytes=train_state, activation_bytes_per_image=activation, saved_fixed_bytes=saved_fixed,
        train_memory_bytes=None if activation is None else train_state + saved_fixed + batch_size * activation)


def model_cost(model: nn.Module, batch_size: int = 1, dtype: torch.dtype = torch.float32, *,
               name: str | None = None) -> CostReport:
    """Parameters, Ω, MACs/FLOPs and memory of a built model (meta models included)."""
    info = _check_model(model).info()
    check_positive_int("batch_size", batch_size)
    dtype = _check_dtype(dtype)
    probe = _probe(model)
    one, two = (_saved_bytes(probe, b, dtype) for b in (1, 2))
    return _report(
        model=name or _model_name(model), family=info.family, built=True, batch_size=batch_size, dtype=dtype,
        params=info.params, stored_params=sum(p.numel() for p in model.parameters()),
        connections=info.connections, mixing_layers=info.mixing_layers, effective_width=info.effective_width,
        macs=sum(layer.macs for layer in layer_costs(model)),
        buffer_bytes=sum(_bytes(s, dtype) for b in model.buffers() for s in _storages(b)),
        activation=two - one, saved_fixed=2 * one - two)


def cost_table(names_or_models: Sequence[str | nn.Module], batch_size: int = 1,
               dtype: torch.dtype = torch.float32, **overrides) -> list[CostReport]:
    """:func:`model_cost` of each model; names are built from the registry on the meta device with
    ``overrides``."""
    reports = []
    for item in names_or_models:
        if isinstance(item, str):
            with torch.device("meta"):
                model = create_model(item, **overrides)
            reports.append(model_cost(model, batch_size, dtype, name=item))
        else:
            reports.append(model_cost(item, batch_size, dtype))
    return reports


def swmlp_expected_cost(batch_size: int = 1, dtype: torch.dtype = torch.float32, *, name: str | None = None,
                        **options) -> CostReport:
    """Costs of ``SWMLP(**options)`` (the family of the SW-MLP registry entries) without building it, with
    p·in·out kept weights per sparse layer (rounded).

    Follows the SW-MLP's architecture (stem, optional input layer d₀ -> m, ``depth`` blocks, LayerNorm, head).
    Activation memory needs a forward, so it is None.
    """
    signature = inspect.signature(model_entry(SWMLP_ENTRY).cls).parameters
    for key in options:
        if key not in signature:
            raise unknown_name("SW-MLP option", key, signature)
    cfg = {k: p.default for k, p in signature.items()} | options
    check_positive_int("batch_size", batch_size)
    dtype = _check_dtype(dtype)
    p, masked = check_density("density p", cfg["density"]), cfg["weight_format"] == "masked"
    if cfg["weight_format"] not in ("sparse", "masked"):
        raise ConfigError(f"weight_format must be one of sparse, masked, got {cfg['weight_format']!r}")
    if cfg["block"] not in ("fc", "mlp"):
        raise ConfigError(f"block must be one of fc, mlp, got {cfg['block']!r}")
    gamma = check_positive("mlp_ratio", cfg["mlp_ratio"])
    for key in ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth"):
        check_positive_int(key, cfg[key])
    if cfg["img_size"] % cfg["patch_size"]:
        raise ConfigError(f"patch_size {cfg['patch_size']} does not divide img_size {cfg['img_size']}")
    grid = (cfg["img_size"] // cfg["patch_size"]) ** 2
    C, d0 = cfg["embed_dim"], grid * cfg["embed_dim"]
    m = d0 if cfg["width"] is None else check_positive_int("width", cfg["width"])
    dims = [m, m] if cfg["block"] == "fc" else [m, max(1, int(gamma * m)), m]
    block_layers = [(a, b) for _ in range(cfg["depth"]) for a, b in zip(dims[:-1], dims[1:])]
    sparse_layers = ([(d0, m)] if m != d0 else []) + block_layers
    kept = [round(p * a * b) for a, b in sparse_layers]
    patch = cfg["in_chans"] * cfg["patch_size"] ** 2
    norms = cfg["depth"] + int(cfg.get("head_norm", True))  # one per block, one before the head if head_norm
    dense_params = (patch + 1) * C + sum(b for _, b in sparse_layers) + 2 * m * norms \
        + (m + 1) * cfg["num_classes"]  # stem, biases, LayerNorms, head
    full = [a * b for a, b in sparse_layers]
    block_kept = kept[len(kept) - len(block_layers):]
    return _report(
        model=name or f"SWMLP[{cfg['weight_format']}]", family="SW-MLP", built=False, batch_size=batch_size,
        dtype=dtype, params=dense_params + sum(kept), stored_params=dense_params + sum(full if masked else kept),
        connections=sum(block_kept) / len(block_kept), mixing_layers=len(block_layers), effective_width=m,
        macs=grid * patch * C + sum(full if masked else kept) + m * cfg["num_classes"],
        buffer_bytes=sum(full) if masked else 2 * 8 * sum(kept),  # bool masks, or int64 (row, col) indices
        activation=None, saved_fixed=None)


def fixed_omega_comparison(omega: str | int | float, gamma: float = 2.0, depth: int = 3, *,
                           embed_dim: int | None = None, img_size: int = 32, patch_size: int = 4, in_chans: int = 3,
                           num_classes: int = 10, batch_size: int = 1, dtype: torch.dtype = torch.float32,
                           swmlp_depth: int | None = None) -> list[CostReport]:
    """MLP-Mixer, RP-Mixer and the SW-MLP (sparse and dense-masked) at the same Ω and width (Table S.3).

    C = ``embed_dim`` and S from Ω (Sec. 4.1), or S = C = (Ω/γ)^{1/3} when ``embed_dim`` is None. The Mixers
    (built on the meta device) have ``depth`` MLP blocks of ratio γ; when S differs from the patch grid S₀
    the first block maps S₀ -> S (App. A.2.4). The SW-MLP has width m = S·C, ``swmlp_depth`` blocks of S.17
    (default ``depth``; App. C.1's comparison SW-MLP has 2L, one per token- and per channel-mixing MLP) with
    hidden width γm, and density p = Ω'/(m·γm), where Ω' is the built Mixer's own Ω, so that both have
    the same connections per layer; its costs are expected ones (:func:`swmlp_expected_cost`).
    Table S.3's caption states S = 256, C = 588, L = 8, γ = 4 at 224 px, P = 14 (Ω = 254 091 264) for ImageNet
    and S = 64, C = 48, L = 3, γ = 2 for CIFAR, but its CIFAR numbers are those of S = C = 64 (Ω = 2^19) and
    an SW-MLP of 2L blocks: see :func:`table_s3_counts`.
    """
    m, mixers, swmlp = _fixed_omega_options(omega, gamma, depth, embed_dim, img_size, patch_size, in_chans,
                                            num_classes, swmlp_depth)
    reports = []
    for label, options in mixers.items():
        with torch.device("meta"):
            reports.append(model_cost(create_model(MIXER_ENTRY, **options), batch_size, dtype, name=label))
    density = _swmlp_density(m, gamma, reports[0].connections)
    for form in ("sparse", "masked"):
        reports.append(swmlp_expected_cost(batch_size, dtype, name=_swmlp_label(form, m, density), **swmlp,
                                           density=density, weight_format=form))
    return reports



def fixed_omega_models(omega: str | int | float, gamma: float = 2.0, depth: int = 3, *,
                       embed_dim: int | None = None, img_size: int = 32, patch_size: int = 4, in_chans: int = 3,
                       num_classes: int = 10, swmlp_depth: int | None = None, device: torch.device | str = "cpu",
                       forms: Sequence[str] = ("masked", "sparse")) -> dict[str, nn.Module]:
    """The models of :func:`fixed_omega_comparison` built on ``device`` (structure seed 0): MLP-Mixer,
    RP-Mixer and the SW-MLP in each of ``forms``, keyed as that function names them (for timing them)."""
    m, mixers, swmlp = _fixed_omega_options(omega, gamma, depth, embed_dim, img_size, patch_size, in_chans,
                                            num_classes, swmlp_depth)
    with torch.device(device):
        models = {label: create_model(MIXER_ENTRY, **options) for label, options in mixers.items()}
        density = _swmlp_density(m, gamma, next(iter(models.values())).info().connections)
        for form in forms:
            models[_swmlp_label(form, m, density)] = create_model(SWMLP_ENTRY, **swmlp, density=density,
                                                                  weight_format=form)
    return models


def _fixed_omega_options(omega: str | int | float, gamma: float, depth: int, embed_dim: int | None, img_size: int,
                         patch_size: int, in_chans: int, num_classes: int, swmlp_depth: int | None
                         ) -> tuple[int, dict[str, dict], dict[str, Any]]:
    """(width m = S·C, the two Mixers' create_model options by label, the SW-MLP's options but its density and
    weight format) of :func:`fixed_omega_comparison`."""
    omega = parse_omega(omega)
    C = round(optimal_channels(omega, gamma)) if embed_dim is None else check_positive_int("embed_dim", embed_dim)
    S = tokens_for_channels(omega, C, gamma) if embed_dim is not None else C
    grid = (img_size // patch_size) ** 2 if img_size % patch_size == 0 else None
    common = dict(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes)
    mixers = {f"{label} S={S} C={C}": dict(**common, embed_dim=C, depth=depth, num_tokens=None if S == grid else S,
                                           mlp_ratio=gamma, rp_blocks=rp, norm_eps=1e-5)
              for label, rp in (("MLP-Mixer", None), ("RP-Mixer", "all"))}
    swmlp = dict(**common, embed_dim=C, width=None if S == grid else S * C, block="mlp", mlp_ratio=gamma,
                 depth=depth if swmlp_depth is None else check_positive_int("swmlp_depth", swmlp_depth))
    return S * C, mixers, swmlp


def _swmlp_density(m: int, gamma: float, connections: int) -> float:
    """The SW-MLP density p = Ω'/(m·γm) that gives it the Mixer's connections Ω' per layer."""
    return min(1.0, connections / (m * max(1, int(gamma * m))))


def _swmlp_label(form: str, m: int, density: float) -> str:
    return f"SW-MLP[{form}] m={m} p={density:.3g}"

# ---- Table S.3 as the paper counted it ----------------------------------------------------------------------


@dataclass(frozen=True)
class HiddenLayerCount:
    """Table S.3's own convention, found from its numbers (:func:`table_s3_counts`)."""

    model: str
    S: int
    C: int
    depth: int
    gamma: float
    weights: int  # entries of the hidden (mixing) layers' weight matrices: no biases, LayerNorms, stem or head
    memory_bytes: int  # 4 bytes per weight; the dense-masked SW-MLP 4 more per entry (a float32 mask)
    flops: int  # 2 x the MACs of those layers for one image, forward

    def as_dict(self) -> dict:
        return asdict(self)


def table_s3_counts(S: int, C: int, depth: int, gamma: float, *, swmlp_depth: int | None = None
                    ) -> list[HiddenLayerCount]:
    """MLP-Mixer, RP-Mixer and dense-masked SW-MLP as Hayase & Karakida's Table S.3 counts them.

    Found by matching its printed numbers: only the weight matrices of the hidden layers count.

    * MLP-Mixer and RP-Mixer (the permutations are not counted): ``depth`` blocks of a token MLP
      S -> γS -> S and a channel MLP C -> γC -> C; weights L·2γ(S² + C²), MACs L·2γ·SC(S + C) = 4LΩ.
    * SW-MLP: ``swmlp_depth`` = 2L blocks of S.17 (App. C.1: one per token- and per channel-mixing MLP) of
      two dense m × γm matrices, m = SC; 4L·γm² entries, each a float32 weight and a float32 mask (8 bytes;
      or a weight and its gradient - the table does not say).
    * FLOPs = 2 × MACs per image; memory = the bytes of those tensors, nothing for optimiser state.

    With S = C = 64, L = 3, γ = 2 this gives the printed CIFAR values 12.5 M FLOPs for the Mixers, 805 M and
    3.22 GB for the SW-MLP (the caption's C = 48 gives 8.26 M, 453 M and 1.81 GB). With S = 256, C = 588, L = 8
    it gives the printed 5.80 T and 23.2 TB for the SW-MLP at γ = 4, and the printed 4.06 G and 26.3 MB for the
    Mixers only at γ = 1 (at γ = 4: 16.3 G and 105 MB). The printed CIFAR Mixer memory, 3.93 MB, is 10 × the
    0.393 MB of this convention. :mod:`pkmixer.experiments.presets.tables3` sets these beside the printed
    values and our own accounting (:func:`fixed_omega_comparison`).
    """
    for key, value in (("S", S), ("C", C), ("depth", depth)):
        check_positive_int(key, value)
    gamma = check_positive("gamma", gamma)
    blocks = 2 * depth if swmlp_depth is None else check_positive_int("swmlp_depth", swmlp_depth)
    hidden_s, hidden_c = max(1, int(gamma * S)), max(1, int(gamma * C))
    weights = depth * 2 * (S * hidden_s + C * hidden_c)
    macs = depth * 2 * (C * S * hidden_s + S * C * hidden_c)
    m = S * C
    entries = blocks * 2 * m * max(1, int(gamma * m))
    common = dict(S=S, C=C, depth=depth, gamma=gamma)
    mixers = [HiddenLayerCount(name, **common, weights=weights, memory_bytes=4 * weights, flops=2 * macs)
              for name in ("MLP-Mixer", "RP-Mixer")]
    return mixers + [HiddenLayerCount("SW-MLP", **common, weights=entries, memory_bytes=8 * entries,
                                      flops=2 * entries)]


# ---- training-step time -----------------------------------------------------------------------------------------
