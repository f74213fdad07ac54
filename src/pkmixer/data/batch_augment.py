"""Batched augmentation: the per-sample pipeline of :func:`pkmixer.data.build_transform` (plus timm's mixup /
cutmix of :func:`pkmixer.data.build_mixup`) as tensor operations on a whole batch on its device, with
per-image randomness.

One call, ``BatchAugment(images, labels, seed=, epoch=, step=, member=, rank_slice=, global_size=)``, turns a
batch as stored (uint8, or float in [0, 1] for digits / synthetic, (n, C, H, W)) into float32
(n, in_chans, img_size, img_size) inputs and int64 labels, or soft (n, num_classes) targets under mixup. It is
two steps, kept apart so that tests can feed the same draws to the per-sample operations:

* :meth:`BatchAugment.draw` - every random choice of a *global* batch of ``global_size`` images, as tensors on
  the device (crop offsets, flip bits, AutoAugment sub-policies / apply bits / signs, RandAugment op ids / signs /
  cutout centres, erasing boxes and noise) and, for mixup, the per-batch scalars (timm's ``mode="batch"``: one λ,
  one cutmix box per batch). Each stage draws from its own generator, seeded from a hash of (seed, epoch, step,
  member, stage): the same key gives the same draws on any number of processes and after a resume, another
  member gets other draws, and turning one augmentation on does not move another's draws. Generators run on the
  images' device, so a CPU run and a CUDA run draw differently (each reproducibly).
* :meth:`BatchAugment.apply` - the operations, for this process's slice of those draws.

Per stage, against the per-sample pipeline (``tests/test_device_data.py`` checks each with the same draws,
``tests/test_auto_augment.py`` AutoAugment):

=====================  ====================================================================================
in_chans conversion    grey -> RGB repeats; RGB -> grey is PIL's ``convert("L")`` for bytes (exact integer
                       formula) and torchvision's 0.2989 / 0.587 / 0.114 for floats (exact)
resize                 ``F.interpolate(antialias=True)`` bilinear / bicubic, rounded to bytes for byte data as
                       PIL does (PIL resamples in two passes through 8-bit storage: within 1 level bilinear, 2
                       bicubic); floats as torchvision's tensor path (exact)
random crop, padding   zero padding, per-image offsets, gathered by index (exact)
horizontal flip        per-image bit (exact)
v2 AutoAugment         :mod:`pkmixer.data.auto_augment`: torchvision's CIFAR10 / IMAGENET / SVHN policies, the
                       sub-policy, apply bits and signs per image; level tables, float32 blends, one per-image
                       source-pixel map for the geometric ops (exact: bit-identical to v2's uint8 tensor kernels;
                       on floats too, but Sharpness within 1e-6). The per-sample pipeline runs v2's PIL kernels
                       on stored data: against those within 1 level, except shears (pixels moved by one at
                       rounding ties) and Solarize at its threshold level (``tests/test_auto_augment.py``)
bigvision RandAugment  :mod:`pkmixer.data.randaugment`'s 16 operations on whole batches, op ids, signs and
                       cutout centres per image and layer; rotate / shear / translate through one per-image
                       affine map of the output grid with big_vision's nearest-neighbour rounding (half away
                       from zero) and fill 128 (exact: bit-identical to ``randaugment.apply_op``)
normalisation          x/255, minus mean, over std, as ToDtype + Normalize (exact)
random erasing         timm's RandomErasing(p, mode="pixel"): up to 10 attempts of area in [0.02, 1/3] and log
                       aspect in [log 0.3, log 1/0.3], the first that fits, per-pixel normal noise (exact)
mixup / cutmix         timm's Mixup, mode="batch": one λ ~ Beta(α, α) per batch, cutmix w.p. switch_prob, box
                       and λ correction as ``cutmix_bbox_and_lam``, smoothed one-hot targets (exact), except
                       the partner of an image: timm pairs i with B-1-i (``x.flip(0)``); here 2k with 2k+1, so
                       that a pair never straddles two processes. The batch order is a random permutation, so
                       both are uniformly random pairings.
=====================  ====================================================================================

Not batched (a :class:`ConfigError` says so; they keep the per-sample path): timm's ``rand-...`` RandAugment, the
Inception random-resized crop. The batched operations make no host synchronisation: no ``.item()``, no Python
branch on a tensor's value; the mixup scalars are drawn on the host from NumPy (like timm) and enter the kernels
as Python numbers.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from . import auto_augment as aa
from . import randaugment as ra
from .datasets import DatasetInfo
from .transforms import _channel_stats, build_mixup, build_transform

STAGES = {"crop": 1, "flip": 2, "rand_augment": 3, "erase": 4, "mix": 5, "auto_augment": 6}  # append only
ERASE_ATTEMPTS = 10  # timm's RandomErasing
ERASE_AREA = (0.02, 1 / 3)  # timm's defaults (min_area, max_area)
ERASE_LOG_ASPECT = (math.log(0.3), math.log(1 / 0.3))
PIL_GREY = (19595, 38470, 7471)  # PIL's convert("L"): (R·19595 + G·38470 + B·7471 + 2^15) >> 16
TV_GREY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale on float tensors


def stream_seed(seed: int, epoch: int, step: int, member: int, stage: str) -> int:
    """A 63-bit seed for one stage of one step of one member: a hash (NumPy's SeedSequence) of the key."""
    key = [int(v) % 2**64 for v in (seed, epoch, step, member, STAGES[stage])]
    words = np.random.SeedSequence(key).generate_state(2, np.uint32)
    return (int(words[0]) | int(words[1]) << 32) & (2**63 - 1)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ---- draws ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ErasingDraw:
    """timm RandomErasing's choices per image: apply bit, 10 attempts of (area fraction, log aspect), the
    uniforms behind the box's top-left corner, and per-pixel noise."""

    apply: torch.Tensor  # (n,) bool
    area: torch.Tensor  # (n, 10) float64 fraction of the image
    log_aspect: torch.Tensor  # (n, 10) float64
    top: torch.Tensor  # (n,) float64 in [0, 1)
    left: torch.Tensor  # (n,) float64 in [0, 1)
    noise: torch.Tensor  # (n, C, H, W) float32 standard normal

    def __getitem__(self, part: slice) -> ErasingDraw:
        return ErasingDraw(*(t[part] for t in (self.apply, self.area, self.log_aspect, self.top, self.left,
                                               self.noise)))


@dataclass(frozen=True)
class MixDraw:
    """timm Mixup's per-batch choices (mode="batch"): λ as drawn, cutmix or mixup, the cutmix box centre."""

    lam: float  # 1.0: no mixing this batch
    cutmix: bool
    center: tuple[int, int]  # (row, column)


@dataclass(frozen=True)
class Draws:
    """Every random choice of a batch: tensors with the batch on the first axis, None where a stage is off."""

    crop: torch.Tensor | None = None  # (n, 2) int64 top, left in the padded image
    flip: torch.Tensor | None = None  # (n,) bool
    ops: torch.Tensor | None = None  # (n, L) int64 RandAugment op ids (indices into randaugment.OPS)
    negate: torch.Tensor | None = None  # (n, L) bool: the signed ops' argument negated
    centers: torch.Tensor | None = None  # (n, L, 2) int64 Cutout centre (row, column)
    erase: ErasingDraw | None = None
    mix: MixDraw | None = None
    auto: aa.AutoAugmentDraw | None = None  # (n,) sub-policy, (n, 2) apply bits and signs

    def __getitem__(self, part: slice) -> Draws:
        """The draws of images ``part`` of the batch (a process's slice); mixup's are per batch."""
        return Draws(**{name: (value if value is None or name == "mix" else value[part])
                        for name, value in vars(self).items()})


def draw_crop(n: int, span: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """(n, 2) offsets, uniform in [0, span_h] × [0, span_w] (torchvision's RandomCrop)."""
    top = torch.randint(0, span[0] + 1, (n,), generator=gen, device=gen.device)
    left = torch.randint(0, span[1] + 1, (n,), generator=gen, device=gen.device)
    return torch.stack([top, left], 1)


def draw_flip(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, generator=gen, device=gen.device) < 0.5


def draw_rand_augment(n: int, layers: int, size: tuple[int, int],
                      gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """big_vision's choices per image and layer: an op uniform over the 16, a fair sign, a cutout centre."""
    ops = torch.randint(0, len(ra.OPS), (n, layers), generator=gen, device=gen.device)
    negate = torch.rand(n, layers, generator=gen, device=gen.device) < 0.5
    rows = torch.randint(0, size[0], (n, layers), generator=gen, device=gen.device)
    cols = torch.randint(0, size[1], (n, layers), generator=gen, device=gen.device)
    return ops, negate, torch.stack([rows, cols], 2)


def draw_erasing(n: int, probability: float, shape: tuple[int, int, int], gen: torch.Generator) -> ErasingDraw:
    dev = gen.device

    def uniform(*size: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        return low + (high - low) * torch.rand(*size, generator=gen, device=dev, dtype=torch.float64)

    apply = torch.rand(n, generator=gen, device=dev) < probability
    area = uniform(n, ERASE_ATTEMPTS, low=ERASE_AREA[0], high=ERASE_AREA[1])
    log_aspect = uniform(n, ERASE_ATTEMPTS, low=ERASE_LOG_ASPECT[0], high=ERASE_LOG_ASPECT[1])
    top, left = uniform(n), uniform(n)
    noise = torch.randn(n, *shape, generator=gen, device=dev)
    return ErasingDraw(apply, area, log_aspect, top, left, noise)


def draw_mix(rng: np.random.Generator, mixup_alpha: float, cutmix_alpha: float, switch_prob: float,
             size: tuple[int, int], prob: float = 1.0) -> MixDraw:
    """timm's ``Mixup._params_per_batch`` and ``rand_bbox``'s centre, from a NumPy generator."""
    lam, cutmix = 1.0, False
    if rng.random() < prob:
        if mixup_alpha > 0 and cutmix_alpha > 0:
            cutmix = bool(rng.random() < switch_prob)
            alpha = cutmix_alpha if cutmix else mixup_alpha
        elif mixup_alpha > 0:
            alpha = mixup_alpha
        else:
            cutmix, alpha = True, cutmix_alpha
        lam = float(rng.beta(alpha, alpha))
    center = (int(rng.integers(0, size[0])), int(rng.integers(0, size[1])))
    return MixDraw(lam, cutmix, center)


# ---- operations: channels, size, crop, flip ---------------------------------------------------------------
def to_channels(x: torch.Tensor, in_chans: int, *, as_bytes: bool) -> torch.Tensor:
    """Grey -> RGB (repeat) or RGB -> grey: PIL's integer formula for byte data (values 0..255), torchvision's
    float formula otherwise."""
    c = x.shape[1]
    if c == in_chans:
        return x
    if (c, in_chans) == (1, 3):
        return x.expand(-1, 3, -1, -1).contiguous()
    if (c, in_chans) == (3, 1):
        r, g, b = x.unbind(1)
        if as_bytes:
            w = PIL_GREY
            return torch.floor((r * w[0] + g * w[1] + b * w[2] + 32768) / 65536)[:, None]
        return r.mul(TV_GREY[0]).add_(g, alpha=TV_GREY[1]).add_(b, alpha=TV_GREY[2])[:, None]
    raise ConfigError(f"cannot turn {c}-channel images into in_chans={in_chans}; only grey <-> RGB")


def resize(x: torch.Tensor, side: int, interpolation: str, *, as_bytes: bool) -> torch.Tensor:
    """A square resize as v2.Resize((side, side)): antialiased bilinear / bicubic. Byte data goes through PIL's two
    passes (horizontal, then vertical), each rounded and clipped to bytes; floats as torchvision's tensor path."""
    if x.shape[-2:] == (side, side):
        return x  # PIL and torchvision return the image itself
    if interpolation == "nearest":
        return F.interpolate(x, size=(side, side), mode="nearest-exact" if as_bytes else "nearest")
    if not as_bytes:
        return F.interpolate(x, size=(side, side), mode=interpolation, antialias=True, align_corners=False)
    # PIL: a horizontal pass, then a vertical one, each rounded and clipped to bytes (bicubic overshoots)
    for size in ((x.shape[-2], side), (side, side)):
        if x.shape[-2:] != size:
            x = F.interpolate(x, size=size, mode=interpolation, antialias=True, align_corners=False)
            x = x.round().clamp_(0, 255)
    return x


def crop(x: torch.Tensor, offsets: torch.Tensor, size: int, padding: int = 0) -> torch.Tensor:
    """Per-image crops of size × size at ``offsets`` (n, 2) = (top, left) of the image zero-padded by
    ``padding`` on each side."""
    if padding:
        x = F.pad(x, (padding,) * 4)
    n, c, h, w = x.shape
    span = torch.arange(size, device=x.device)
    rows, cols = offsets[:, 0, None] + span, offsets[:, 1, None] + span  # (n, size) each
    index = (rows[:, :, None] * w + cols[:, None, :]).reshape(n, 1, size * size).expand(n, c, size * size)
    return torch.gather(x.reshape(n, c, h * w), 2, index).reshape(n, c, size, size)  # one gather: 5x indexing


def center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision's centre crop: top = round((H - size) / 2)."""
    h, w = x.shape[-2:]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return x[..., top:top + size, left:left + size]


def hflip(x: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
    return torch.where(flags[:, None, None, None], x.flip(-1), x)


# ---- operations: big_vision RandAugment on batches of byte levels (float tensors holding 0..255) ---------------
def _f32(v: float) -> float:
    """A Python float equal to float32(v), so that kernels see the constant NumPy's float32 code uses."""
    return float(np.float32(v))


def blend(degenerate: torch.Tensor, image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """randaugment.blend per image: factor (n,) float32."""
    f = factor[:, None, None, None]
    return (degenerate + f * (image - degenerate)).clamp(0, 255).floor()


def grey(x: torch.Tensor) -> torch.Tensor:
    """randaugment.grey per image: (n, 1, H, W)."""
    if x.shape[1] == 1:
        return x
    f = x * _f32(1.0 / 255)
    w = [_f32(v) for v in ra.GREY_WEIGHTS]
    g = f[:, 0] * w[0] + f[:, 1] * w[1] + f[:, 2] * w[2]
    return (g * _f32(255.5)).floor()[:, None]


def _levels(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(256, dtype=x.dtype, device=x.device)


def autocontrast_lut(x: torch.Tensor) -> torch.Tensor:
    """randaugment.autocontrast as a look-up table per image and channel: (n, C, 256)."""
    v = _levels(x)
    lo = x.amin(dim=(2, 3))[..., None]
    hi = x.amax(dim=(2, 3))[..., None]
    wide = hi > lo
    scale = torch.full_like(lo, 255.0) / torch.where(wide, hi - lo, torch.ones_like(lo))
    offset = -lo * scale
    return torch.where(wide, (v * scale + offset).clamp(0, 255).floor(), v)


def equalize_lut(x: torch.Tensor) -> torch.Tensor:
    """randaugment.equalize as a look-up table per image and channel, (n, C, 256): 256-bin histograms by an
    integer scatter-add (exact in any order, so deterministic on CUDA too), then TF's table."""
    n, c, h, w = x.shape
    levels = x.reshape(n * c, h * w).long()
    histo = torch.zeros(n * c, 256, dtype=torch.long, device=x.device).scatter_add_(1, levels,
                                                                                     torch.ones_like(levels))
    top = histo.gather(1, levels.amax(1, keepdim=True))  # the count of the largest value present
    step = (h * w - top) // 255
    lut = (histo.cumsum(1)[:, :-1] + step // 2) // step.clamp(min=1)
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut], 1).clamp(0, 255).to(x.dtype)
    return torch.where(step == 0, _levels(x), lut).reshape(n, c, 256)


def apply_lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """x (n, C, H, W) of byte levels through per-image, per-channel tables lut (n, C, 256)."""
    n, c, h, w = x.shape
    return torch.gather(lut, 2, x.reshape(n, c, h * w).long()).reshape(x.shape)


def sharpen_degenerate(x: torch.Tensor) -> torch.Tensor:
    """The SMOOTH-filtered interior (float32 sums in randaugment.sharpness's order, truncated), border kept."""
    h, w = x.shape[-2:]
    if h <= 2 or w <= 2:
        return x
    one, five = _f32(1.0 / 13), _f32(5.0 / 13)
    acc = torch.zeros_like(x[..., 1:-1, 1:-1])
    for dy in range(3):
        for dx in range(3):
            acc = acc + x[..., dy:dy + h - 2, dx:dx + w - 2] * (five if (dy, dx) == (1, 1) else one)
    out = x.clone()
    out[..., 1:-1, 1:-1] = acc.clamp(0, 255).floor()
    return out


def affine(x: torch.Tensor, matrices: torch.Tensor, fill: float) -> torch.Tensor:
    """Per-image randaugment.affine: output (x, y) takes input (round(a0·x + a1·y + a2), round(a3·x + a4·y + a5))
    - coordinates in float32, rounded half away from zero - or ``fill`` outside; matrices (n, 6) float32. This is
    grid sampling with a per-image affine grid, written as a gather because ``grid_sample``'s nearest mode rounds
    half to even after normalising the coordinates, which moves ties by a pixel from big_vision's."""
    n, c, h, w = x.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=x.device),
                            torch.arange(w, dtype=torch.float32, device=x.device), indexing="ij")
    a = matrices[:, :, None, None]

    def nearest(v: torch.Tensor) -> torch.Tensor:
        v = v.double()
        return torch.where(v >= 0, torch.floor(v + 0.5), torch.ceil(v - 0.5))

    u = nearest(a[:, 0] * xs + a[:, 1] * ys + a[:, 2])  # (n, H, W)
    v = nearest(a[:, 3] * xs + a[:, 4] * ys + a[:, 5])
    inside = (u >= 0) & (u < w) & (v >= 0) & (v < h)
    index = torch.where(inside, v * w + u, float(h * w)).long().reshape(n, 1, h * w).expand(n, c, h * w)
    pixels = torch.cat([x.reshape(n, c, h * w), x.new_full((n, c, 1), fill)], 2)
    return torch.gather(pixels, 2, index).reshape(n, c, h, w)


class RandAugmentTable:
    """The per-op constants of a big_vision RandAugment (policy, image size): argument-derived matrices and
    factors, looked up per image by op id. Built from randaugment's ``RandAugment.from_policy``."""

    def __init__(self, policy: str, img_size: int, fill: int = ra.FILL) -> None:
        self.reference = ra.RandAugment.from_policy(policy, img_size, fill=fill)
        self.layers, self.fill = self.reference.num_layers, float(fill)
        args = self.reference.arguments
        identity = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
        matrices = np.tile(np.asarray(identity, np.float32), (len(ra.OPS), 2, 1))
        factors = np.ones(len(ra.OPS), np.float32)
        for k, op in enumerate(ra.OPS):
            for s, sign in enumerate((1.0, -1.0)):
                if op in ra.GEOMETRIC_OPS:
                    matrices[k, s] = ra.geometric_matrix(op, sign * args[op], img_size, img_size)
            if op in ra.ENHANCE_OPS:
                factors[k] = args[op]
        self.matrices, self.factors = torch.from_numpy(matrices), torch.from_numpy(factors)
        self.shift = ra.posterize_shift(args["Posterize"])
        self.threshold = ra.solarize_threshold(args["Solarize"])
        self.addition = args["SolarizeAdd"]
        self.cutout = args["Cutout"]
        self.contrast_level = float(int(min(img_size * img_size / 256.0, 255.0)))
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:
            self._on[device] = (self.matrices.to(device), self.factors.to(device))
        return self._on[device]


_OP = {op: k for k, op in enumerate(ra.OPS)}


def rand_augment_layer(x: torch.Tensor, ops: torch.Tensor, negate: torch.Tensor, centers: torch.Tensor,
                       table: RandAugmentTable) -> torch.Tensor:
    """One layer of big_vision RandAugment: image i gets op ``ops[i]`` (sign ``negate[i]``, cutout centre
    ``centers[i]``). x: (n, C, H, W) float holding byte levels 0..255. Nothing depends on the draws' values on
    the host: every image goes through the same four stages, each the identity for the ops it does not concern -

    1. a per-image, per-channel look-up table on byte levels: AutoContrast, Equalize, Invert, Posterize,
       Solarize, SolarizeAdd, Contrast and Brightness (blends with a constant) are functions of the level;
    2. a blend with a degenerate image: Color (its grey image) and Sharpness (its smoothed image);
    3. one per-image affine map of the output grid: Rotate, ShearX/Y, TranslateX/Y (identity matrix otherwise);
    4. the Cutout square.
    """
    matrices, factors = table.on(x.device)
    n, _, h, w = x.shape
    is_op = lambda name: (ops == _OP[name])[:, None, None]  # noqa: E731  (n, 1, 1) against (n, C, 256)
    v = _levels(x)
    f = factors[ops][:, None, None]
    level = table.contrast_level
    step = float(2 ** table.shift)
    lut = torch.where(is_op("AutoContrast"), autocontrast_lut(x), v)
    lut = torch.where(is_op("Equalize"), equalize_lut(x), lut)
    for name, values in (("Invert", 255 - v), ("Posterize", torch.floor(v / step) * step),
                         ("Solarize", torch.where(v < table.threshold, v, 255 - v)),
                         ("SolarizeAdd", torch.where(v < 128, (v + table.addition).clamp(0, 255), v))):
        lut = torch.where(is_op(name), values, lut)
    lut = torch.where(is_op("Contrast"), (level + f * (v - level)).clamp(0, 255).floor(), lut)
    lut = torch.where(is_op("Brightness"), (f * v).clamp(0, 255).floor(), lut)
    y = apply_lut(x, lut)
    # Color and Sharpness: blend(degenerate, x, factor); for every other image blend(y, y, ·) = y
    pick = lambda name: (ops == _OP[name])[:, None, None, None]  # noqa: E731
    degenerate = torch.where(pick("Color"), grey(x).expand_as(x), torch.where(pick("Sharpness"),
                                                                              sharpen_degenerate(x), y))
    y = blend(degenerate, y, factors[ops])
    y = affine(y, matrices[ops, negate.long()], table.fill)
    rows = torch.arange(h, device=x.device)[None, :, None]
    cols = torch.arange(w, device=x.device)[None, None, :]
    cy, cx, pad = centers[:, 0, None, None], centers[:, 1, None, None], table.cutout
    box = (rows >= cy - pad) & (rows < cy + pad) & (cols >= cx - pad) & (cols < cx + pad)  # (n, H, W)
    return torch.where(pick("Cutout") & box[:, None], table.fill, y)


def rand_augment(x: torch.Tensor, ops: torch.Tensor, negate: torch.Tensor, centers: torch.Tensor,
                 table: RandAugmentTable) -> torch.Tensor:
    for layer in range(ops.shape[1]):
        x = rand_augment_layer(x, ops[:, layer], negate[:, layer], centers[:, layer], table)
    return x


# ---- operations: erasing and mixing (on normalised float images) ----------------------------------------------
def random_erase(x: torch.Tensor, draw: ErasingDraw) -> torch.Tensor:
    """timm's RandomErasing(mode="pixel", count 1) per image from ``draw``."""
    n, _, h, w = x.shape
    applied, top, left, eh, ew = _erasing_box(draw, h, w)
    rows = torch.arange(h, device=x.device, dtype=torch.float64)[None, :, None]
    cols = torch.arange(w, device=x.device, dtype=torch.float64)[None, None, :]
    box = (rows >= top[:, None, None]) & (rows < (top + eh)[:, None, None]) & \
          (cols >= left[:, None, None]) & (cols < (left + ew)[:, None, None])
    return torch.where((applied[:, None, None] & box)[:, None], draw.noise.to(x.dtype), x)


def erasing_boxes(draw: ErasingDraw, size: tuple[int, int]) -> torch.Tensor:
    """(n, 5) int64: applied, top, left, height, width of each image's erased box (for tests and inspection)."""
    return torch.stack(_erasing_box(draw, *size), 1).long()


def _erasing_box(draw: ErasingDraw, h: int, w: int) -> tuple[torch.Tensor, ...]:
    """(applied, top, left, height, width) per image: the first of timm's 10 attempts whose box fits."""
    target = draw.area * (h * w)
    aspect = torch.exp(draw.log_aspect)
    eh = torch.round(torch.sqrt(target * aspect))  # (n, 10); Python's round: half to even, as torch.round
    ew = torch.round(torch.sqrt(target / aspect))
    fits = (ew < w) & (eh < h)
    first = fits.long().argmax(1, keepdim=True)  # the first attempt that fits (0 when none does)
    eh, ew = eh.gather(1, first)[:, 0], ew.gather(1, first)[:, 0]
    top, left = torch.floor(draw.top * (h - eh + 1)), torch.floor(draw.left * (w - ew + 1))
    return draw.apply & fits.any(1), top, left, eh, ew


def cutmix_box(draw: MixDraw, size: tuple[int, int]) -> tuple[tuple[int, int, int, int], float]:
    """timm's ``cutmix_bbox_and_lam`` (correct_lam=True) for the drawn centre: ((yl, yh, xl, xh), λ)."""
    h, w = size
    ratio = math.sqrt(1 - draw.lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = draw.center
    yl, yh = min(max(cy - cut_h // 2, 0), h), min(max(cy + (cut_h + 1) // 2, 0), h)
    xl, xh = min(max(cx - cut_w // 2, 0), w), min(max(cx + (cut_w + 1) // 2, 0), w)
    return (yl, yh, xl, xh), 1.0 - (yh - yl) * (xh - xl) / float(h * w)


def partner(x: torch.Tensor) -> torch.Tensor:
    """Each image's mixing partner: 2k <-> 2k+1."""
    n = x.shape[0]
    return x.reshape(n // 2, 2, *x.shape[1:]).flip(1).reshape(x.shape)


def mix(x: torch.Tensor, labels: torch.Tensor, draw: MixDraw, num_classes: int,
        smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's Mixup (mode="batch") with partners 2k <-> 2k+1: images and smoothed, mixed one-hot targets."""
    lam = draw.lam
    if lam != 1.0:  # a host-side float, not a tensor
        other = partner(x)
        if draw.cutmix:
            (yl, yh, xl, xh), lam = cutmix_box(draw, x.shape[-2:])
            x = x.clone()
            x[:, :, yl:yh, xl:xh] = other[:, :, yl:yh, xl:xh]
        else:
            x = x * lam + other * (1.0 - lam)
    off = smoothing / num_classes
    y1 = torch.full((labels.shape[0], num_classes), off, device=labels.device).scatter_(
        1, labels.long().view(-1, 1), 1.0 - smoothing + off)
    return x, y1 * lam + partner(y1) * (1.0 - lam)


# ---- the pipeline -----------------------------------------------------------------------------------------------
class BatchAugment:
    """The batched pipeline of one configuration (build it with :func:`build_batch_augment`); call it on a batch
    as stored. See the module docstring."""

    def __init__(self, info: DatasetInfo, *, train: bool, img_size: int, in_chans: int, crop_padding: int | None,
                 hflip: bool, auto_augment: str | None, rand_augment: str | None, random_erasing: float,
                 resize: int | None, eval_crop: str | None, crop_pct: float, interpolation: str, normalize: bool,
                 mixup_alpha: float, cutmix_alpha: float, switch_prob: float, label_smoothing: float,
                 num_classes: int) -> None:
        self.train, self.img_size, self.in_chans = train, img_size, in_chans
        self.interpolation, self.normalize = interpolation, normalize
        self.mean, self.std = _channel_stats(info, in_chans)
        if train:
            self.side = resize or img_size
            self.padding = crop_padding or 0
            self.cropping = crop_padding is not None or self.side > img_size
            self.hflip = hflip
            self.table = RandAugmentTable(rand_augment, img_size) if rand_augment else None
            self.auto = aa.AutoAugmentTable(auto_augment, img_size) if auto_augment else None
            self.erasing = float(random_erasing)
            self.mixing = mixup_alpha > 0 or cutmix_alpha > 0
        else:
            self.side = math.floor(img_size / crop_pct) if eval_crop else (resize or img_size)
            self.padding, self.cropping, self.hflip, self.table, self.auto = 0, False, False, None, None
            self.erasing, self.mixing = 0.0, False
        self.mixup_alpha, self.cutmix_alpha, self.switch_prob = float(mixup_alpha), float(cutmix_alpha), switch_prob
        self.label_smoothing, self.num_classes = float(label_smoothing), num_classes
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """mean and std as (C, 1, 1) float32 on ``device``, copied there once (a copy from the host each step
        would wait for the device)."""
        if device not in self._on:
            self._on[device] = tuple(torch.tensor(v, dtype=torch.float32).view(-1, 1, 1).to(device)
                                     for v in (self.mean, self.std))
        return self._on[device]

    @property
    def random(self) -> bool:
        return (self.cropping or self.hflip or self.auto is not None or self.table is not None or self.erasing > 0
                or self.mixing)

    def draw(self, global_size: int, *, seed: int, epoch: int, step: int, member: int = 0,
             device: str | torch.device = "cpu") -> Draws:
        """Every random choice of a global batch of ``global_size`` images (module docstring)."""
        device = torch.device(device)
        gen = lambda stage: _generator(device, stream_seed(seed, epoch, step, member, stage))  # noqa: E731
        n, size, out = global_size, self.img_size, {}
        if self.cropping:
            span = self.side + 2 * self.padding - size
            out["crop"] = draw_crop(n, (span, span), gen("crop"))
        if self.hflip:
            out["flip"] = draw_flip(n, gen("flip"))
        if self.auto is not None:
            out["auto"] = aa.draw_auto_augment(n, self.auto, gen("auto_augment"))
        if self.table is not None:
            out["ops"], out["negate"], out["centers"] = draw_rand_augment(n, self.table.layers, (size, size),
                                                                          gen("rand_augment"))
        if self.erasing > 0:
            out["erase"] = draw_erasing(n, self.erasing, (self.in_chans, size, size), gen("erase"))
        if self.mixing:
            rng = np.random.default_rng(stream_seed(seed, epoch, step, member, "mix"))
            out["mix"] = draw_mix(rng, self.mixup_alpha, self.cutmix_alpha, self.switch_prob, (size, size))
        return Draws(**out)

    def apply(self, images: torch.Tensor, labels: torch.Tensor, draws: Draws) -> tuple[torch.Tensor, torch.Tensor]:
        """The pipeline on ``images`` (n, C, H, W) as stored, with ``draws`` already cut to these n images."""
        as_bytes = images.dtype == torch.uint8
        x = images.to(torch.float32)  # byte levels 0..255, or floats in [0, 1]
        x = to_channels(x, self.in_chans, as_bytes=as_bytes)
        x = resize(x, self.side, self.interpolation, as_bytes=as_bytes)
        if self.cropping:
            x = crop(x, draws.crop, self.img_size, self.padding)
        elif x.shape[-1] != self.img_size:
            x = center_crop(x, self.img_size)
        if self.hflip:
            x = hflip(x, draws.flip)
        if self.auto is not None:  # v2.AutoAugment: byte levels, or floats as the per-sample pipeline has them
            x = aa.auto_augment(x, draws.auto, self.auto, as_bytes=as_bytes)
        if self.table is not None:
            if not as_bytes:  # the per-sample RandAugment rounds float images to bytes, and returns bytes
                x, as_bytes = (x * 255).round().clamp(0, 255), True
            x = rand_augment(x, draws.ops, draws.negate, draws.centers, self.table)
        if as_bytes:
            x = x * (1.0 / 255)  # ToDtype(float32, scale=True)
        if self.normalize:
            mean, std = self._stats(x.device)
            x = (x - mean) / std
        if self.erasing > 0:
            x = random_erase(x, draws.erase)
        if self.mixing:
            return mix(x, labels, draws.mix, self.num_classes, self.label_smoothing)
        return x, labels

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, *, seed: int = 0, epoch: int = 0, step: int = 0,
                 member: int = 0, rank_slice: slice | None = None,
                 global_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Augment this process's images: ``images`` are positions ``rank_slice`` of a global batch of
        ``global_size`` (default: they are the whole batch). Draws are keyed by (seed, epoch, step, member)."""
        n = images.shape[0]
        if rank_slice is None:
            rank_slice, global_size = slice(0, n), n if global_size is None else global_size
        if global_size is None:
            raise ConfigError("global_size is needed with rank_slice: the draws are made for the whole global batch")
        if len(range(global_size)[rank_slice]) != n:
            raise ConfigError(f"rank_slice {rank_slice} of a global batch of {global_size} does not hold the "
                              f"{n} images given")
        if self.mixing and (n % 2 or (rank_slice.start or 0) % 2 or rank_slice.step not in (None, 1)):
            raise ConfigError(f"mixup and cutmix pair images 2k and 2k+1: each process needs an even, contiguous "
                              f"slice starting at an even position, got {rank_slice} of {global_size}")
        if not self.random:
            return self.apply(images, labels, Draws())
        draws = self.draw(global_size, seed=seed, epoch=epoch, step=step, member=member, device=images.device)
        return self.apply(images, labels, draws[rank_slice])

    def __repr__(self) -> str:
        parts = [f"train={self.train}", f"img_size={self.img_size}", f"in_chans={self.in_chans}",
                 f"side={self.side}"]
        if self.cropping:
            parts.append(f"crop_padding={self.padding}")
        if self.hflip:
            parts.append("hflip")
        if self.auto is not None:
            parts.append(f"auto_augment={self.auto.name!r}")
        if self.table is not None:
            parts.append(repr(self.table.reference))
        if self.erasing:
            parts.append(f"random_erasing={self.erasing}")
        if self.mixing:
            parts.append(f"mixup={self.mixup_alpha}, cutmix={self.cutmix_alpha}, switch_prob={self.switch_prob}")
        return f"{type(self).__name__}({', '.join(parts)})"


def build_batch_augment(info: DatasetInfo, *, train: bool, img_size: int, in_chans: int,
                        crop_padding: int | None = None, hflip: bool = False, auto_augment: str | None = None,
                        rand_augment: str | None = None, random_erasing: float = 0.0,
                        random_resized_crop: Sequence[float] | None = None, resize: int | None = None,
                        eval_crop: str | None = None, crop_pct: float = 0.875, interpolation: str | None = None,
                        normalize: bool = True, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
                        switch_prob: float = 0.5, label_smoothing: float = 0.0,
                        num_classes: int | None = None) -> BatchAugment:
    """The batched equivalent of ``build_transform(info, ...)`` followed by ``build_mixup(...)`` (same keys, same
    checks and messages); refuses what has no batched version (module docstring)."""
    build_transform(info, train=train, img_size=img_size, in_chans=in_chans, crop_padding=crop_padding, hflip=hflip,
                    auto_augment=auto_augment, rand_augment=rand_augment, random_erasing=random_erasing,
                    random_resized_crop=random_resized_crop, resize=resize, eval_crop=eval_crop,
                    crop_pct=crop_pct, interpolation=interpolation, normalize=normalize)  # validates every key
    num_classes = info.num_classes if num_classes is None else num_classes
    build_mixup(mixup_alpha, cutmix_alpha, switch_prob, label_smoothing, num_classes)  # validates
    if info.image_size is None:
        raise ConfigError(f"{info.title} has images of varying sizes; batched augmentation needs a resident data "
                          "set of one size - use the per-sample pipeline")
    if train and rand_augment is not None and rand_augment.split("-")[0] != ra.POLICY_PREFIX:
        raise ConfigError(f"timm's RandAugment {rand_augment!r} has no batched version; use big_vision's "
                          f"({ra.POLICY_PREFIX}-n2-m15) or the per-sample pipeline")
    if train and random_resized_crop is not None:
        raise ConfigError("random_resized_crop has no batched version; use the per-sample pipeline")
    interpolation = interpolation or "bilinear"  # natural_images data sets (bicubic) are refused above
    return BatchAugment(info, train=train, img_size=img_size, in_chans=in_chans, crop_padding=crop_padding,
                        hflip=hflip, auto_augment=auto_augment if train else None,
                        rand_augment=rand_augment if train else None,
                        random_erasing=random_erasing if train else 0.0, resize=resize,
                        eval_crop=eval_crop, crop_pct=crop_pct, interpolation=interpolation, normalize=normalize,
                        mixup_alpha=mixup_alpha if train else 0.0, cutmix_alpha=cutmix_alpha if train else 0.0,
                        switch_prob=switch_prob, label_smoothing=label_smoothing, num_classes=num_classes)
