"""RandAugment as the MLP-Mixer authors ran it: big_vision's ``randaug(num_layers, magnitude)`` (Mixer supp. B,
Table 1: two layers, magnitudes 10, 15 and 20).

big_vision's ``pp/autoaugment.py`` is a fork of tensorflow/tpu's EfficientNet ``autoaugment.py``; its
RandAugment applies ``num_layers`` times one of 16 operations, drawn uniformly, always (the sampled probability
is unused), every operation at the same magnitude m. An operation's argument is a linear function of m / 10
that is *not* clipped at m = 10, so magnitudes 15 and 20 act as 15 and 20 (timm's RandAugment, where m runs
0-10, cannot express them). At m = 10 / 15 / 20 (:func:`op_argument`):

=============  ======================================  ===================  ==============================
operation      argument                                m = 10 / 15 / 20     effect
=============  ======================================  ===================  ==============================
Rotate         ±30·m/10 degrees                        30 / 45 / 60         nearest, fill 128
ShearX, Y      ±0.3·m/10                               0.3 / 0.45 / 0.6     x += s·y (or y += s·x)
TranslateX, Y  ±translate_const·m/10 px                100 / 150 / 200      translate_const = 100 at 224 px
Cutout         pad = int(cutout_const·m/10)            40 / 60 / 80         a 2·pad square of 128
Color,         factor = 1.8·m/10 + 0.1                 1.9 / 2.8 / 3.7      blend(degenerate, image, f),
Contrast,                                                                   extrapolating past 1
Brightness,
Sharpness
Posterize      bits = int(4·m/10)                      4 / 6 / 8            keeps ``bits`` high bits
Solarize       threshold = int(256·m/10)               256 / 384 / 512      inverts pixels >= threshold
SolarizeAdd    addition = int(110·m/10)                110 / 165 / 220      adds it to pixels < 128
AutoContrast, Equalize, Invert: no argument
=============  ======================================  ===================  ==============================

± is a fair coin per application. The operations follow the TF code on uint8 images, including what it does
beyond the ranges PIL allows, and including its quirks, because that is what produced the Mixer numbers:

* Posterize keeps *more* bits as m grows (8 bits, the identity, at m = 20); TF's shifts are clamped to [0, 7],
  so m < 2.5 (0 bits) keeps 1 bit.
* Solarize compares with the threshold converted to uint8, i.e. modulo 256 (big_vision issue #110):
  256 and 512 become 0 - every pixel is inverted (m = 10, 20) - and 384 becomes 128 (m = 15).
* Contrast blends with a constant grey of min(255, H·W / 256), not the image's mean grey level: the TF code
  averages the histogram's *counts* over its 256 bins (196 at 224 px).
* Color's grey image is ``tf.image.rgb_to_grayscale`` (weights 0.2989, 0.587, 0.114 in float32, scaled back by
  255.5 and truncated); it can differ by one level from PIL's ``convert("L")``.
* Blends, auto-contrast and the 3×3 smoothing of Sharpness compute in float32 and truncate, as TF does;
  geometric operations map each output pixel (x, y) to the input pixel nearest to the transformed point
  (round half away from zero) and fill what falls outside with 128.

The constants translate_const = 100 px and cutout_const = 40 px are big_vision's for 224 px inputs;
:class:`RandAugment` scales them with the image size (``scaled_constants``). Grey (1-channel) images are
handled as their own grey level. The definitions live here once - :data:`OPS`, :data:`SIGNED_OPS`,
:func:`op_argument` and the uint8 operations of :func:`apply_op` - so that a batched version can reuse them.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch
from PIL import Image

from ..errors import ConfigError

MAX_LEVEL = 10.0  # big_vision's _MAX_LEVEL: the magnitude whose arguments are the "full" ones
TRANSLATE_CONST = 100  # px at 224 px (big_vision's HParams(cutout_const=40, translate_const=100))
CUTOUT_CONST = 40
REFERENCE_SIZE = 224  # the input size those constants are for
FILL = 128  # big_vision's replace_value: what geometric operations and cutout leave behind
MAX_MAGNITUDE = 20.0  # the largest of Mixer supp. Table 1; beyond 22.5 Posterize's shift would turn negative

# big_vision's available_ops, in its order
OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "Color", "Contrast", "Brightness",
       "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY", "Cutout", "SolarizeAdd")
GEOMETRIC_OPS = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")  # an affine map of the pixel grid
SIGNED_OPS = frozenset(GEOMETRIC_OPS)  # argument negated w.p. 1/2
ENHANCE_OPS = frozenset({"Color", "Contrast", "Brightness", "Sharpness"})
GREY_WEIGHTS = (0.2989, 0.5870, 0.1140)  # tf.image.rgb_to_grayscale

POLICY_PREFIX = "bigvision"
_SECTION = re.compile(r"(?P<key>[mn])(?P<value>\d+(\.\d+)?)")


def op_argument(op: str, magnitude: float, *, translate_const: float = TRANSLATE_CONST,
                cutout_const: float = CUTOUT_CONST) -> float | int | None:
    """The argument of ``op`` at ``magnitude`` as big_vision's ``level_to_arg`` gives it, before the random sign
    of :data:`SIGNED_OPS`; None for operations without one."""
    level = float(magnitude) / MAX_LEVEL
    if op in ("AutoContrast", "Equalize", "Invert"):
        return None
    if op == "Rotate":
        return level * 30.0
    if op == "Posterize":
        return int(level * 4)
    if op == "Solarize":
        return int(level * 256)
    if op == "SolarizeAdd":
        return int(level * 110)
    if op in ENHANCE_OPS:
        return level * 1.8 + 0.1
    if op in ("ShearX", "ShearY"):
        return level * 0.3
    if op in ("TranslateX", "TranslateY"):
        return level * float(translate_const)
    if op == "Cutout":
        return int(level * cutout_const)
    raise ConfigError(f"unknown RandAugment operation {op!r}; known: {', '.join(OPS)}")


def posterize_shift(bits: int) -> int:
    """The right-then-left shift of Posterize: 8 - bits, clamped to [0, 7] like TF's bitwise shifts."""
    return min(max(8 - bits, 0), 7)


def solarize_threshold(threshold: int) -> int:
    """The threshold Solarize really compares with: TF converts it to uint8, i.e. takes it modulo 256."""
    return threshold % 256


def scaled_constants(img_size: int) -> tuple[int, int]:
    """(translate_const, cutout_const) for img_size px inputs: big_vision's 100 and 40 px at 224 px."""
    return round(TRANSLATE_CONST * img_size / REFERENCE_SIZE), round(CUTOUT_CONST * img_size / REFERENCE_SIZE)


# ---- the operations, on uint8 arrays (H, W, C) ---------------------------------------------------------------
def blend(degenerate: np.ndarray, image: np.ndarray, factor: float) -> np.ndarray:
    """degenerate + factor·(image - degenerate) in float32, clipped to [0, 255] and truncated (TF's blend; PIL's
    Image.blend computes the same)."""
    if factor == 0.0:
        return degenerate.copy()
    if factor == 1.0:
        return image.copy()
    low = degenerate.astype(np.float32)
    temp = low + np.float32(factor) * (image.astype(np.float32) - low)
    return np.clip(temp, 0.0, 255.0).astype(np.uint8)


def grey(image: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale of a uint8 (H, W, 3) image as (H, W) uint8; a 1-channel image is its own."""
    if image.shape[2] == 1:
        return image[:, :, 0].copy()
    f = image.astype(np.float32) * np.float32(1.0 / 255)
    w = [np.float32(v) for v in GREY_WEIGHTS]
    g = f[:, :, 0] * w[0] + f[:, :, 1] * w[1] + f[:, :, 2] * w[2]
    return (g * np.float32(255.5)).astype(np.uint8)


def _per_channel(image: np.ndarray, fn) -> np.ndarray:
    return np.stack([fn(image[:, :, c]) for c in range(image.shape[2])], axis=2)


def autocontrast(image: np.ndarray) -> np.ndarray:
    def channel(x: np.ndarray) -> np.ndarray:
        lo, hi = np.float32(x.min()), np.float32(x.max())
        if not hi > lo:
            return x
        scale = np.float32(255.0) / (hi - lo)
        offset = -lo * scale
        return np.clip(x.astype(np.float32) * scale + offset, 0.0, 255.0).astype(np.uint8)
    return _per_channel(image, channel)


def equalize(image: np.ndarray) -> np.ndarray:
    def channel(x: np.ndarray) -> np.ndarray:
        histo = np.bincount(x.ravel(), minlength=256).astype(np.int64)
        nonzero = histo[histo != 0]
        step = (int(nonzero.sum()) - int(nonzero[-1])) // 255
        if step == 0:
            return x
        lut = (np.cumsum(histo) + step // 2) // step
        lut = np.clip(np.concatenate([[0], lut[:-1]]), 0, 255).astype(np.uint8)
        return lut[x]
    return _per_channel(image, channel)


def invert(image: np.ndarray) -> np.ndarray:
    return 255 - image


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
    shift = posterize_shift(bits)
    return (image >> shift) << shift


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
    return np.where(image < solarize_threshold(threshold), image, 255 - image)


def solarize_add(image: np.ndarray, addition: int, threshold: int = 128) -> np.ndarray:
    added = np.clip(image.astype(np.int64) + addition, 0, 255).astype(np.uint8)
    return np.where(image < threshold, added, image)


def color(image: np.ndarray, factor: float) -> np.ndarray:
    degenerate = np.repeat(grey(image)[:, :, None], image.shape[2], axis=2)
    return blend(degenerate, image, factor)


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
    h, w = image.shape[:2]
    level = int(min(h * w / 256.0, 255.0))  # the histogram's counts averaged over 256 bins (see the docstring)
    return blend(np.full_like(image, level), image, factor)


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
    return blend(np.zeros_like(image), image, factor)


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
    """Blend with PIL's SMOOTH filter ([[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13, float32, truncated) of the
    interior; the one-pixel border keeps the image's values."""
    h, w = image.shape[:2]
    result = image.copy()
    if h > 2 and w > 2:
        f = image.astype(np.float32)
        one, five = np.float32(1.0 / 13), np.float32(5.0 / 13)
        acc = np.zeros((h - 2, w - 2, image.shape[2]), np.float32)
        for dy in range(3):
            for dx in range(3):
                acc += f[dy:dy + h - 2, dx:dx + w - 2] * (five if (dy, dx) == (1, 1) else one)
        result[1:-1, 1:-1] = np.clip(acc, 0.0, 255.0).astype(np.uint8)
    return blend(result, image, factor)


def affine(image: np.ndarray, matrix: tuple[float, float, float, float, float, float],
           fill: int = FILL) -> np.ndarray:
    """Output pixel (x, y) takes input pixel (round(a0·x + a1·y + a2), round(a3·x + a4·y + a5)) - float32, round
    half away from zero, as TF's ImageProjectiveTransform with NEAREST - or ``fill`` when that is outside."""
    h, w = image.shape[:2]
    a = [np.float32(v) for v in matrix]
    y, x = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
    coords = []
    for row in (a[0:3], a[3:6]):
        v = (row[0] * x + row[1] * y + row[2]).astype(np.float64)
        coords.append(np.where(v >= 0, np.floor(v + 0.5), np.ceil(v - 0.5)))
    in_x, in_y = coords
    inside = (in_x >= 0) & (in_x < w) & (in_y >= 0) & (in_y < h)
    channels = image.shape[2]
    pixels = np.concatenate([image.reshape(h * w, channels), np.full((1, channels), fill, image.dtype)])
    index = np.where(inside, in_y * w + in_x, h * w).astype(np.intp)  # h·w: the fill pixel
    return pixels[index]


def rotate_matrix(degrees: float, height: int, width: int) -> tuple[float, ...]:
    """tfa.image.rotate's transform: a rotation by ``degrees`` about the image centre."""
    angle = np.float32(degrees * math.pi / 180.0)
    cos, sin = np.cos(angle), np.sin(angle)
    h1, w1 = np.float32(height - 1), np.float32(width - 1)
    x_offset = (w1 - (cos * w1 - sin * h1)) / np.float32(2.0)
    y_offset = (h1 - (sin * w1 + cos * h1)) / np.float32(2.0)
    return (cos, -sin, x_offset, sin, cos, y_offset)


def geometric_matrix(op: str, arg: float, height: int, width: int) -> tuple[float, ...]:
    """The :func:`affine` matrix of a geometric op with its signed argument (TF translates by -pixels: output x
    shows input x + pixels)."""
    if op == "Rotate":
        return rotate_matrix(arg, height, width)
    return {"ShearX": (1.0, arg, 0.0, 0.0, 1.0, 0.0), "ShearY": (1.0, 0.0, 0.0, arg, 1.0, 0.0),
            "TranslateX": (1.0, 0.0, arg, 0.0, 1.0, 0.0), "TranslateY": (1.0, 0.0, 0.0, 0.0, 1.0, arg)}[op]


def cutout(image: np.ndarray, pad_size: int, center: tuple[int, int], fill: int = FILL) -> np.ndarray:
    """A (2·pad_size)² square of ``fill`` centred at (row, column) ``center``, cut at the image edges."""
    h, w = image.shape[:2]
    cy, cx = center
    out = image.copy()
    out[max(0, cy - pad_size):min(h, cy + pad_size), max(0, cx - pad_size):min(w, cx + pad_size)] = fill
    return out


def apply_op(op: str, image: np.ndarray, arg: float | int | None, *, fill: int = FILL,
             cutout_center: tuple[int, int] | None = None) -> np.ndarray:
    """``op`` with its (signed) argument on a uint8 (H, W, C) image; Cutout needs ``cutout_center``."""
    if op == "AutoContrast":
        return autocontrast(image)
    if op == "Equalize":
        return equalize(image)
    if op == "Invert":
        return invert(image)
    if op == "Posterize":
        return posterize(image, arg)
    if op == "Solarize":
        return solarize(image, arg)
    if op == "SolarizeAdd":
        return solarize_add(image, arg)
    if op in ENHANCE_OPS:
        return {"Color": color, "Contrast": contrast, "Brightness": brightness, "Sharpness": sharpness}[op](image, arg)
    if op in GEOMETRIC_OPS:
        return affine(image, geometric_matrix(op, arg, *image.shape[:2]), fill)
    if op == "Cutout":
        if cutout_center is None:
            raise ValueError("Cutout needs cutout_center=(row, column)")
        return cutout(image, arg, cutout_center, fill)
    raise ConfigError(f"unknown RandAugment operation {op!r}; known: {', '.join(OPS)}")


# ---- the policy ---------------------------------------------------------------------------------------------
def parse_policy(policy: str) -> tuple[int, float]:
    """(num_layers, magnitude) of a policy string ``bigvision-n2-m15`` (sections in any order; defaults n2, m10
    as big_vision's ``randaug()``), checked."""
    parts = policy.split("-") if isinstance(policy, str) else []
    if not parts or parts[0] != POLICY_PREFIX:
        raise ConfigError(f"{policy!r} is not a big_vision RandAugment policy; write e.g. bigvision-n2-m15")
    values = {"n": 2.0, "m": MAX_LEVEL}
    for part in parts[1:]:
        match = _SECTION.fullmatch(part)
        if not match or (match["key"] == "n" and match.group(3)):
            raise ConfigError(f"rand_augment {policy!r} has an unknown section {part!r}; allowed sections: "
                              f"n<int> layers, m<number> magnitude 0-{MAX_MAGNITUDE:g}")
        values[match["key"]] = float(match["value"])
    if values["m"] > MAX_MAGNITUDE:
        raise ConfigError(f"rand_augment {policy!r}: magnitude {values['m']:g} is above {MAX_MAGNITUDE:g} (Mixer "
                          "supp. Table 1's largest); there Posterize's shift would leave TF's defined range")
    if values["n"] < 1:
        raise ConfigError(f"rand_augment {policy!r}: n (layers) must be at least 1")
    return int(values["n"]), values["m"]


def _to_array(img) -> np.ndarray:
    if isinstance(img, Image.Image):
        if img.mode not in ("L", "RGB"):
            img = img.convert("RGB")
        array = np.asarray(img, dtype=np.uint8)
        return array[:, :, None] if array.ndim == 2 else array.copy()
    if isinstance(img, torch.Tensor):
        x = img if img.dtype == torch.uint8 else (img.float() * 255).round().clamp(0, 255).to(torch.uint8)
        return x.permute(1, 2, 0).contiguous().numpy()
    raise TypeError(f"RandAugment takes a PIL image or a (C, H, W) tensor, got {type(img).__name__}")


class RandAugment:
    """big_vision's ``randaug(num_layers, magnitude)`` on a PIL image or a (C, H, W) tensor (uint8, or float in
    [0, 1]); returns a PIL image, or a uint8 tensor for tensor input. Randomness comes from torch's generator,
    like torchvision's transforms, so a run's seed fixes it."""

    def __init__(self, num_layers: int = 2, magnitude: float = MAX_LEVEL, *, translate_const: float = TRANSLATE_CONST,
                 cutout_const: float = CUTOUT_CONST, fill: int = FILL) -> None:
        self.num_layers, self.magnitude, self.fill = int(num_layers), float(magnitude), int(fill)
        self.translate_const, self.cutout_const = translate_const, cutout_const
        self.arguments = {op: op_argument(op, self.magnitude, translate_const=translate_const,
                                          cutout_const=cutout_const) for op in OPS}

    @classmethod
    def from_policy(cls, policy: str, img_size: int = REFERENCE_SIZE, fill: int = FILL) -> RandAugment:
        num_layers, magnitude = parse_policy(policy)
        translate_const, cutout_const = scaled_constants(img_size)
        return cls(num_layers, magnitude, translate_const=translate_const, cutout_const=cutout_const, fill=fill)

    def __call__(self, img):
        image = _to_array(img)
        for _ in range(self.num_layers):
            op = OPS[int(torch.randint(len(OPS), ()))]
            arg = self.arguments[op]
            if op in SIGNED_OPS and float(torch.rand(())) < 0.5:
                arg = -arg
            center = None
            if op == "Cutout":
                center = (int(torch.randint(image.shape[0], ())), int(torch.randint(image.shape[1], ())))
            image = apply_op(op, image, arg, fill=self.fill, cutout_center=center)
        if isinstance(img, torch.Tensor):
            return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
        return Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_layers={self.num_layers}, magnitude={self.magnitude:g}, "
                f"translate_const={self.translate_const}, cutout_const={self.cutout_const}, fill={self.fill})")
