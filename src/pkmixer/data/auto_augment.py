"""AutoAugment (Cubuk et al. 2019) as torchvision's ``v2.AutoAugment`` applies it, batched: a different
sub-policy, apply bits and signs per image, on a whole batch as tensor operations.

The policies are the AutoAugment paper's as torchvision lists them (:data:`SUB_POLICIES`: the 25 sub-policies of
CIFAR10, IMAGENET and SVHN, each two slots ``(op, probability, magnitude bin)``, in torchvision's order), and so is
the magnitude space
(:data:`SPACE`: each op's 10 magnitude bins, computed as torchvision computes them, and whether it is signed), both
written out here: only torchvision's public API is used (``v2.functional`` kernels), and
``tests/test_auto_augment.py`` checks that ``v2.AutoAugment`` itself still gives the same images. Per image,
``v2.AutoAugment.forward`` draws a sub-policy uniformly, then for each slot applies it iff ``rand <= p`` and, for
a signed op, negates its magnitude iff ``rand <= 0.5``; :func:`draw_auto_augment` makes those draws for a batch
(:class:`AutoAugmentDraw`) from one generator on the images' device.

:class:`AutoAugmentTable` holds, per (policy, image size), each slot's constants, built on the host once: the
op, its probability, its signed magnitude for both signs, the level table of Brightness / Posterize / Solarize /
Invert (computed by torchvision's uint8 kernels on the 256 levels), the blend factors of Color / Contrast /
Sharpness as float32, the inverse affine matrix of a geometric op and its source-pixel map (below).
:func:`auto_augment` applies the two slots to a batch of byte levels (float32 tensors holding 0..255, as
``batch_augment``'s RandAugment) - or of floats in [0, 1] (``as_bytes=False``: torchvision's float kernels, what
the per-sample pipeline runs on digits and synthetic). Every image goes through the same three stages per slot,
each the identity for the ops it does not concern, with no host synchronisation:

1. a per-image, per-channel table of the 256 levels (on floats the same functions, per pixel): Brightness,
   Posterize, Solarize, Invert (the slot's tables), AutoContrast, Equalize, and Contrast - a blend with the
   image's mean grey level, a constant per image, so a function of the level too;
2. the blends of Color (with the grey image) and Sharpness (with the rounded 3×3 smoothing, inside a one-pixel
   border): torchvision computes ``image·f`` and then ``add_(B, alpha=1 - f)``, a fused multiply-add on the CPU
   (AVX2, vector and scalar loops alike: one rounding), then clamps and truncates. On bytes B·alpha plus the
   float32 image·f is exact in float64 (B an integer, alpha 0 or |alpha| >= 1/16, f >= 1/16: at most 37
   significant bits), so one float64 sum rounded to float32 is that fused result; Contrast's tables and the
   float path use :func:`fma32`, an emulation exact for any float32 operands. The grey image is torchvision's
   own float32 expression (0.2989·R, then two ``add_(alpha=)``);
3. one per-image gather by a source-pixel map: ShearX / ShearY / TranslateX / TranslateY / Rotate (the identity
   map otherwise). torchvision's tensor path builds a grid from the inverse affine matrix
   (:func:`inverse_affine_matrix`) and samples it with ``grid_sample(mode="nearest", padding_mode="zeros")``
   (fill None: 0 outside). The table runs exactly that kernel (``v2.functional.affine`` / ``rotate``) once per
   (slot, sign) on an image whose pixels hold their own index, which yields the map; a gather by it is the same
   computation as the kernel's, bit for bit, on any device.

Against the kernels ``v2.AutoAugment`` runs on uint8 tensors, 1- and 3-channel, 28 and 32 px, every op is
bit-identical (``tests/test_auto_augment.py``). Grey (1-channel) images: Color is the
identity (``adjust_saturation`` returns the image, "to match PIL"), Contrast blends with the image's own mean.
Floats (``as_bytes=False``) follow torchvision's float kernels: the same maps and level functions (Equalize
quantises to bytes and back, Posterize keeps ``bits`` bits of x·2^bits, Solarize's threshold is the magnitude
itself), exact on the CPU except Sharpness's smoothing, a float32 convolution whose summation order is not
torchvision's (within 1e-6; an ulp, 1.2e-7, measured). The per-sample pipeline does not round float images to
bytes before AutoAugment (as it does before big_vision's RandAugment), so neither does the batched one. On CUDA
the byte path computes the same (tables, exact float64 blends, gathers), assuming CUDA's ``add_(alpha=)`` fuses
too for the grey image (nvcc contracts a + alpha·b by default); no GPU has checked it.

The per-sample pipeline gets PIL images from the stored data sets, so its ``v2.AutoAugment`` runs PIL's kernels,
not the tensor ones. Against those, measured on 300 grey and 300 tinted RGB digit-like images at 28 px
(scikit-learn's digits upscaled) and 600 smooth random RGB images at 32 px (white noise under a Gaussian of
2.5 px, random mean level and contrast), every magnitude bin and sign the three policies use, per op the largest
difference in levels and the largest fraction of pixels that differ (over bins and image sets)::

    op            max |Δ|  pixels differing  why
    Invert        0        0                 the same table
    Posterize     0        0                 the same table
    Equalize      0        0                 the same algorithm (torchvision's kernel copies PIL's)
    Brightness    0        0                 PIL's blend with black is x·f in float32, truncated, too
    TranslateX/Y  0        0                 whole pixels either way
    Rotate        0        0                 (no rounding tie met at these angles)
    Sharpness     1        0.12 %            PIL's SMOOTH filter rounds in its own way
    AutoContrast  1        3.5 %             PIL's table is int(x·scale + offset) in float64, torchvision's
                                             (x - lo) / ((hi - lo)·(1/255)) in float32: at integers they part
    Color         1        46 %              PIL's grey is ITU-R 601 in fixed point, rounded; torchvision's
                                             0.2989 / 0.587 / 0.114 in float32, floored (grey images: 0)
    Contrast      1        53 %              PIL blends with its grey's mean rounded to an integer
    Solarize      85       1.1 %             only at the levels 85 and 170, for bins 6 and 3: 255·m is
                                             85.0000025 / 170.000005; the tensor kernel compares in float32,
                                             where it is 85 / 170, and inverts that level, PIL keeps it
    ShearX/Y      255      8.9 %             on the rows (columns) where s·(y + 1/2) is half-integral - every
                                             5th at s = 0.2, 2 of 32 at s = 1/15 - grid_sample rounds the tie
                                             to even, PIL always one way: half of their pixels come from the
                                             neighbouring column (any level; the fill 0 at the edge)

``PIL_TOLERANCE`` holds these bounds with some room, and ``tests/test_auto_augment.py`` checks them on a
smaller sample of the same images, where the statistics of whole augmented pipelines also agree.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ..errors import ConfigError
from .transforms import AUTO_AUGMENT_POLICIES as POLICIES  # name -> torchvision's policy, one home

Slot = tuple[str, float, "int | None"]  # (op, probability, magnitude bin)

# The published policies (Cubuk et al. 2019), learned on reduced CIFAR-10, ImageNet and SVHN, in the order and with
# the magnitude bins torchvision's v2.AutoAugment lists them (its draws index this order).
SUB_POLICIES: dict[str, tuple[tuple[Slot, Slot], ...]] = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}


def _linspace(low: float, high: float) -> Callable[[int, int, int], torch.Tensor]:
    return lambda num_bins, height, width: torch.linspace(low, high, num_bins)


# op -> (its magnitude bins (num_bins, height, width) -> float32 tensor or None, signed): the paper's ranges (shear
# 0.3, translation 150/331 of the side, rotation 30°, enhancement factors 1 ± 0.9, posterize 4-8 bits, solarize
# threshold 1-0), binned as v2.AutoAugment bins them - float32 torch.linspace, so the magnitudes are its, bit for bit
SPACE = {
    "ShearX": (_linspace(0.0, 0.3), True),
    "ShearY": (_linspace(0.0, 0.3), True),
    "TranslateX": (lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * width, num_bins), True),
    "TranslateY": (lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * height, num_bins), True),
    "Rotate": (_linspace(0.0, 30.0), True),
    "Brightness": (_linspace(0.0, 0.9), True),
    "Color": (_linspace(0.0, 0.9), True),
    "Contrast": (_linspace(0.0, 0.9), True),
    "Sharpness": (_linspace(0.0, 0.9), True),
    "Posterize": (lambda num_bins, height, width: (8 - (torch.arange(num_bins) / ((num_bins - 1) / 4))).round().int(),
                  False),
    "Solarize": (_linspace(1.0, 0.0), False),
    "AutoContrast": (lambda num_bins, height, width: None, False),
    "Equalize": (lambda num_bins, height, width: None, False),
    "Invert": (lambda num_bins, height, width: None, False),
}
OPS = tuple(SPACE)  # op ids index this, torchvision's order
NUM_BINS = 10  # v2.AutoAugment.forward's magnitudes_fn(10, height, width)
SLOTS = 2
LEVEL_OPS = ("Brightness", "Posterize", "Solarize", "Invert")  # functions of the level alone, fixed per slot
BLEND_OPS = ("Color", "Contrast", "Sharpness")  # image·f + B·(1 - f), B the grey image, its mean, its smoothing
GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
GREY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale
SMOOTH = (1.0 / 13.0, 5.0 / 13.0)  # adjust_sharpness's kernel: 1 at the edges, 5 in the middle
EQUALIZE_SCALE = 255 + 1.0 - 1e-3  # to_dtype_image(float -> uint8, scale=True)
_OP = {op: k for k, op in enumerate(OPS)}
NO_OP = -1  # a slot not applied

# max |Δ| in levels and the fraction of pixels that differ, batched (= v2's tensor kernels) against v2's PIL kernels
PIL_TOLERANCE = {"Invert": (0, 0.0), "Posterize": (0, 0.0), "Equalize": (0, 0.0), "Brightness": (0, 0.0),
                 "TranslateX": (0, 0.0), "TranslateY": (0, 0.0), "Rotate": (0, 0.0), "Sharpness": (1, 0.005),
                 "AutoContrast": (1, 0.06), "Color": (1, 0.6), "Contrast": (1, 0.7), "Solarize": (85, 0.03),
                 "ShearX": (255, 0.12), "ShearY": (255, 0.12)}


def check_policy(policy: str) -> v2.AutoAugmentPolicy:
    if policy not in POLICIES:
        raise ConfigError(f"auto_augment must be one of {', '.join(POLICIES)}, got {policy!r}")
    return POLICIES[policy]


# ---- the draws ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AutoAugmentDraw:
    """v2.AutoAugment.forward's choices per image: the sub-policy, each slot's apply bit and sign."""

    policy: torch.Tensor  # (n,) int64 index into the policy's sub-policies
    apply: torch.Tensor  # (n, 2) bool: rand <= the slot's probability
    negate: torch.Tensor  # (n, 2) bool: rand <= 0.5 (used by signed ops only)

    def __getitem__(self, part: slice) -> AutoAugmentDraw:
        return AutoAugmentDraw(self.policy[part], self.apply[part], self.negate[part])


def draw_auto_augment(n: int, table: AutoAugmentTable, gen: torch.Generator) -> AutoAugmentDraw:
    """n images' choices, on ``gen``'s device: a sub-policy uniform over the policy's, per slot an apply test
    ``u <= p`` (torchvision's, so a slot of probability 0 fires with probability 2^-24, as there) and a sign
    ``u <= 0.5``."""
    dev = gen.device
    policy = torch.randint(0, table.num_policies, (n,), generator=gen, device=dev)
    apply = torch.rand(n, SLOTS, generator=gen, device=dev) <= table.on(dev).probability[policy]
    negate = torch.rand(n, SLOTS, generator=gen, device=dev) <= 0.5
    return AutoAugmentDraw(policy, apply, negate)


# ---- the per-slot constants -----------------------------------------------------------------------------------
def _inverse_affine(centre: list[float], angle: float, translate: list[float], shear: list[float]) -> list[float]:
    """The inverse of the affine map T·C·R(angle)·SHy(shear y)·SHx(shear x)·C⁻¹ (T the translation, C the move
    to ``centre``; angles in degrees, scale 1), as (m0, m1, m2, m3, m4, m5): the point (x, y) of the output reads
    (m0·x + m1·y + m2, m3·x + m4·y + m5) of the input. With rot = angle and sx, sy the shear angles,
    R·SHy·SHx = [[a, b], [c, d]] with a = cos(rot - sy) / cos(sy), b = -(a·tan(sx) + sin(rot)),
    c = sin(rot - sy) / cos(sy), d = cos(rot) - c·tan(sx), of determinant 1; its inverse is [[d, -b], [-c, a]]."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    m = [d, -b, 0.0, -c, a, 0.0]
    (cx, cy), (tx, ty) = centre, translate
    m[2] = cx - m[0] * (cx + tx) - m[1] * (cy + ty)  # C·RSS⁻¹·C⁻¹·T⁻¹
    m[5] = cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def inverse_affine_matrix(op: str, magnitude: float, height: int, width: int) -> list[float]:
    """The inverse affine matrix torchvision's tensor kernel samples with for a geometric op (as
    ``v2.AutoAugment`` calls ``affine`` / ``rotate``): output pixel centre (x, y), relative to the image centre
    ((W-1)/2, (H-1)/2), reads input point (m0·x + m1·y + m2, m3·x + m4·y + m5) in the same frame."""
    if op in ("ShearX", "ShearY"):  # affine(center=[0, 0]): the top-left corner, relative to the image centre
        angle = math.degrees(math.atan(magnitude))
        return _inverse_affine([-width * 0.5, -height * 0.5], 0.0, [0.0, 0.0],
                               [angle, 0.0] if op == "ShearX" else [0.0, angle])
    if op == "TranslateX":
        return _inverse_affine([0.0, 0.0], 0.0, [float(int(magnitude)), 0.0], [0.0, 0.0])
    if op == "TranslateY":
        return _inverse_affine([0.0, 0.0], 0.0, [0.0, float(int(magnitude))], [0.0, 0.0])
    if op == "Rotate":  # rotate() turns counter-clockwise: the inverse map of -angle, the angle taken modulo 360
        return _inverse_affine([0.0, 0.0], -(magnitude % 360), [0.0, 0.0], [0.0, 0.0])
    raise ValueError(f"{op} is not a geometric op")


def v2_kernel(image: torch.Tensor, op: str, magnitude: float) -> torch.Tensor:
    """One op of ``v2.AutoAugment`` on one image tensor, by torchvision's public kernels with v2.AutoAugment's
    defaults (nearest interpolation, fill None: 0 outside). The table runs it on the 256 levels (level ops, uint8)
    and on an index image (geometric ops); the other ops are computed batched (:func:`auto_augment_slot`)."""
    nearest = v2.InterpolationMode.NEAREST
    if op in ("ShearX", "ShearY"):
        angle = math.degrees(math.atan(magnitude))
        return TF.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=[angle, 0.0] if op == "ShearX" else
                         [0.0, angle], interpolation=nearest, fill=None, center=[0, 0])
    if op in ("TranslateX", "TranslateY"):
        shift = [int(magnitude), 0] if op == "TranslateX" else [0, int(magnitude)]
        return TF.affine(image, angle=0.0, translate=shift, scale=1.0, shear=[0.0, 0.0], interpolation=nearest,
                         fill=None)
    if op == "Rotate":
        return TF.rotate(image, angle=magnitude, interpolation=nearest, fill=None)
    if op == "Brightness":
        return TF.adjust_brightness(image, brightness_factor=1.0 + magnitude)
    if op == "Posterize":
        return TF.posterize(image, bits=int(magnitude))
    if op == "Solarize":  # the threshold is magnitude times the dtype's largest value
        return TF.solarize(image, threshold=(255 if image.dtype == torch.uint8 else 1.0) * magnitude)
    if op == "Invert":
        return TF.invert(image)
    raise ValueError(f"{op} is computed batched, not by the table")


class AutoAugmentTable:
    """The constants of a torchvision AutoAugment policy at one square image size, per (sub-policy, slot, sign):
    arrays indexed [policy, slot, negate] (module docstring). ``on(device)`` gives them as tensors there."""

    def __init__(self, policy: str, img_size: int) -> None:
        check_policy(policy)
        self.name, self.img_size = policy, img_size
        subs = SUB_POLICIES[policy]
        self.num_policies = p_count = len(subs)
        h = w = img_size
        shape = (p_count, SLOTS, 2)
        self.ops = np.zeros((p_count, SLOTS), np.int64)
        self.probability = np.zeros((p_count, SLOTS), np.float32)
        self.magnitude = np.zeros(shape, np.float64)  # as forward passes it, sign applied
        self.lut = np.tile(np.arange(256, dtype=np.float32), (*shape, 1))  # byte level -> level
        self.factor = np.ones(shape, np.float32)  # 1 + magnitude (Brightness, blends: image·factor)
        self.alpha = np.zeros(shape, np.float32)  # 1 - factor (blends: + B·alpha)
        self.levels = np.full(shape, 256.0, np.float32)  # Posterize on floats: 2^bits
        self.threshold = np.ones(shape, np.float32)  # Solarize on floats
        self.matrices = np.tile(np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]), (*shape, 1))
        self.map_row = np.zeros(shape, np.int64)  # row of ``maps``; 0: the identity
        maps, rows = [np.arange(h * w)], {}
        ramp = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)
        index_image = torch.arange(1, h * w + 1, dtype=torch.float32).view(1, h, w)
        for p, sub in enumerate(subs):
            for s, (op, probability, bin_) in enumerate(sub):
                self.ops[p, s] = _OP[op]
                self.probability[p, s] = probability
                bins_of, signed = SPACE[op]
                bins = bins_of(NUM_BINS, h, w)
                for neg in (0, 1):
                    m = 0.0 if bins is None else float(bins[bin_])
                    if signed and neg:
                        m *= -1
                    self.magnitude[p, s, neg] = m
                    if op in LEVEL_OPS:
                        self.lut[p, s, neg] = v2_kernel(ramp, op, m).view(256).numpy()
                    self.factor[p, s, neg] = 1.0 + m
                    self.alpha[p, s, neg] = 1.0 - (1.0 + m)
                    if op == "Posterize":
                        self.levels[p, s, neg] = 1 << int(m)
                    if op == "Solarize":
                        self.threshold[p, s, neg] = 1.0 * m  # _max_value(float) · magnitude
                    if op in GEOMETRIC_OPS:
                        self.matrices[p, s, neg] = inverse_affine_matrix(op, m, h, w)
                        if (op, m) not in rows:
                            source = v2_kernel(index_image, op, m).view(h * w).long() - 1  # -1: outside
                            rows[op, m] = len(maps)
                            maps.append(torch.where(source < 0, h * w, source).numpy())
                        self.map_row[p, s, neg] = rows[op, m]
        self.maps = np.stack(maps)  # (M, H·W) source pixel of each output pixel; H·W: outside (fill 0)
        blends = np.isin(self.ops, [_OP["Color"], _OP["Sharpness"]])[..., None].repeat(2, -1)
        a, f = np.abs(self.alpha[blends]), self.factor[blends]
        if not (((a == 0) | (a >= 1 / 16)).all() and (f >= 1 / 16).all()):  # _slot_bytes's float64 blend
            raise ValueError(f"{policy}: a Color / Sharpness factor within 1/16 of 0 or 1 is not blended exactly")
        self._on: dict[torch.device, _DeviceTable] = {}

    def on(self, device: torch.device) -> _DeviceTable:
        """The tensors on ``device``, copied there once."""
        if device not in self._on:
            t = {name: torch.from_numpy(np.ascontiguousarray(getattr(self, name))).to(device)
                 for name in ("ops", "probability", "lut", "factor", "alpha", "levels", "threshold", "map_row",
                              "maps")}
            self._on[device] = _DeviceTable(**t)
        return self._on[device]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, img_size={self.img_size})"


@dataclass(frozen=True)
class _DeviceTable:
    ops: torch.Tensor
    probability: torch.Tensor
    lut: torch.Tensor
    factor: torch.Tensor
    alpha: torch.Tensor
    levels: torch.Tensor
    threshold: torch.Tensor
    map_row: torch.Tensor
    maps: torch.Tensor


# ---- float32 arithmetic as torchvision's kernels do it ----------------------------------------------------------
def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a·b + c rounded once, as the fused multiply-add of ``c.add_(a, alpha=b)`` on the CPU (AVX2), for
    float32 tensors (no overflow or subnormals). a·b is exact in float64 (48 bits); the sum is rounded to odd in
    float64 (TwoSum's error term decides the last bit), which a rounding to float32 then turns into the correctly
    rounded result: a plain float64 sum could land on a float32 tie and round twice."""
    prod = a.double() * b.double()
    c = c.double()
    s = prod + c
    bv = s - prod
    err = (prod - (s - bv)) + (c - bv)  # s + err == prod + c exactly
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.copysign(torch.full_like(s, math.inf), err)
    s = torch.where((err != 0) & even, torch.nextafter(s, toward), s)
    return s.float()


def grey(x: torch.Tensor, *, floor: bool) -> torch.Tensor:
    """torchvision's ``_rgb_to_grayscale_image(preserve_dtype=False)`` of (n, 3, H, W): (n, 1, H, W), floored
    for byte data as ``adjust_saturation`` / ``adjust_contrast`` do."""
    r, g, b = x.unbind(1)
    out = r.mul(GREY_WEIGHTS[0]).add_(g, alpha=GREY_WEIGHTS[1]).add_(b, alpha=GREY_WEIGHTS[2])[:, None]
    return out.floor_() if floor else out


def _levels(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(256, dtype=x.dtype, device=x.device)


def autocontrast_lut(x: torch.Tensor) -> torch.Tensor:
    """``autocontrast_image`` on bytes as a table per image and channel (n, C, 256): (v - lo) / ((hi - lo)·(1/255)),
    clamped and truncated; the identity where hi == lo."""
    v = _levels(x)
    lo, hi = x.amin(dim=(2, 3))[..., None], x.amax(dim=(2, 3))[..., None]
    flat = hi == lo
    inv_scale = torch.where(flat, 1.0, (hi - lo) * (1.0 / 255))
    lo = torch.where(flat, 0.0, lo)
    return ((v - lo) / inv_scale).clamp(0, 255).floor()


def autocontrast_float(x: torch.Tensor) -> torch.Tensor:
    """``autocontrast_image`` on floats in [0, 1]."""
    lo, hi = x.amin(dim=(2, 3), keepdim=True), x.amax(dim=(2, 3), keepdim=True)
    flat = hi == lo
    inv_scale = torch.where(flat, 1.0, (hi - lo) * 1.0)
    lo = torch.where(flat, 0.0, lo)
    return ((x - lo) / inv_scale).clamp(0, 1)


def equalize_lut(x: torch.Tensor, levels: torch.Tensor | None = None) -> torch.Tensor:
    """``equalize_image`` (PIL's algorithm) on byte levels as a table per image and channel, (n, C, 256): 256-bin
    histograms by an integer scatter-add, step = (pixels - count of the top level) // 255, table
    (cumulative + step // 2) // step shifted by one; the identity where step is 0."""
    n, c, h, w = x.shape
    levels = (x.reshape(n, c, h * w).long() if levels is None else levels).reshape(n * c, h * w)
    histo = torch.zeros(n * c, 256, dtype=torch.long, device=x.device).scatter_add_(1, levels,
                                                                                     torch.ones_like(levels))
    top = histo.gather(1, levels.amax(1, keepdim=True))
    step = (h * w - top) // 255
    lut = (histo.cumsum(1)[:, :-1] + step // 2) // step.clamp(min=1)
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut.clamp(0, 255)], 1).to(x.dtype)
    return torch.where(step == 0, _levels(x), lut).reshape(n, c, 256)


def apply_lut(x: torch.Tensor, lut: torch.Tensor, levels: torch.Tensor | None = None) -> torch.Tensor:
    """x (n, C, H, W) of byte levels through per-image, per-channel tables lut (n, C, 256); ``levels``: x as
    int64 (n, C, H·W), where the caller has it."""
    n, c, h, w = x.shape
    levels = x.reshape(n, c, h * w).long() if levels is None else levels
    return torch.gather(lut, 2, levels).reshape(x.shape)


def smooth_bytes(x: torch.Tensor) -> torch.Tensor:
    """``adjust_sharpness``'s blurred interior on byte levels, (n, C, H-2, W-2): the kernel's float32 convolution
    rounded, which is round(N / 13) for the integer N = 3×3 box sum + 4·centre - never a tie, and float32 errors
    (< 1e-3) stay far from the 1/26 that separates N / 13 from one. N is a sum of integers, exact in any order."""
    rows = x[..., :, :-2] + x[..., :, 1:-1] + x[..., :, 2:]
    box = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]
    return ((box + 4 * x[..., 1:-1, 1:-1]) / 13).round()


def smooth_float(x: torch.Tensor) -> torch.Tensor:
    """``adjust_sharpness``'s blurred interior of floats: the same float32 depthwise convolution."""
    c = x.shape[1]
    a, b = SMOOTH
    kernel = x.new_full((3, 3), a)
    kernel[1, 1] = b
    return F.conv2d(x, kernel.expand(c, 1, 3, 3), groups=c)


# ---- the operations ---------------------------------------------------------------------------------------
def _any_of(ops: torch.Tensor, names: tuple[str, ...]) -> torch.Tensor:
    out = torch.zeros_like(ops, dtype=torch.bool)
    for name in names:
        out |= ops == _OP[name]
    return out


def _geometry(y: torch.Tensor, ops: torch.Tensor, entry: tuple[torch.Tensor, ...], t: _DeviceTable) -> torch.Tensor:
    """Stage 3: each image gathered by its source-pixel map (the identity map but for geometric ops)."""
    n, c, h, w = y.shape
    index = t.maps[torch.where(_any_of(ops, GEOMETRIC_OPS), t.map_row[entry], 0)]  # (n, H·W)
    pixels = torch.cat([y.reshape(n, c, h * w), y.new_zeros(n, c, 1)], 2)
    return torch.gather(pixels, 2, index[:, None].expand(n, c, h * w)).reshape(y.shape)


def _slot_bytes(x: torch.Tensor, ops: torch.Tensor, entry: tuple[torch.Tensor, ...],
                t: _DeviceTable) -> torch.Tensor:
    """A slot on byte levels. Contrast is a function of the level too (the image's mean is a per-image
    constant), so stage 1 is one table per image and channel; stage 2 is left with Color and Sharpness, whose
    B·alpha + C is exact in float64 (B an integer, |alpha| >= 1/16, C = level·factor >= 1/16 or 0: at most 37
    significant bits), so one float64 multiply-add and a rounding to float32 are the fused multiply-add."""
    n, c, h, w = x.shape
    v = _levels(x)
    is_op = lambda name: ops == _OP[name]  # noqa: E731
    factor, alpha = t.factor[entry], t.alpha[entry]  # (n,)
    g = grey(x, floor=True) if c == 3 else x  # torchvision's grey of an RGB image, floored; a grey image itself
    xi = x.reshape(n, c, h * w).long()
    # 1. a table per image and channel
    lut = torch.where(_any_of(ops, LEVEL_OPS)[:, None], t.lut[entry], v)[:, None]  # (n, 1, 256)
    mean = g.sum(dim=(1, 2, 3))[:, None] / (h * w)  # torch.mean on the CPU: an exact sum of levels, divided
    contrast = fma32(mean, alpha[:, None], v * factor[:, None]).clamp(0, 255).floor()  # _blend(image, mean, f)
    lut = torch.where(is_op("Contrast")[:, None, None], contrast[:, None], lut)
    lut = torch.where(is_op("AutoContrast")[:, None, None], autocontrast_lut(x), lut)
    lut = torch.where(is_op("Equalize")[:, None, None], equalize_lut(x, xi), lut)
    y = apply_lut(x, lut.expand(n, c, 256), xi)
    # 2. Color: B = grey, C = image·factor; Sharpness: B = smoothed - image in the interior, C = image; else 0·0 + y
    color = is_op("Color") if c == 3 else torch.zeros_like(ops, dtype=torch.bool)  # identity on grey images
    scale = torch.where(color, factor, 1.0).view(n, 1, 1, 1)
    b = torch.where(color.view(n, 1, 1, 1), g, 0.0)  # (n, 1, H, W)
    blended = color
    if h > 2 and w > 2:
        sharp = is_op("Sharpness")
        d = torch.where(sharp.view(n, 1, 1, 1), smooth_bytes(x) - x[..., 1:-1, 1:-1], 0.0)
        b = F.pad(d, (1, 1, 1, 1)) + b  # (n, C, H, W): the border is kept
        blended = color | sharp
    a = torch.where(blended, alpha, 0.0).view(n, 1, 1, 1)
    y = (b.double() * a.double() + (y * scale).double()).float().clamp_(0, 255).floor_()
    return _geometry(y, ops, entry, t)


def _slot_floats(x: torch.Tensor, ops: torch.Tensor, entry: tuple[torch.Tensor, ...],
                 t: _DeviceTable) -> torch.Tensor:
    """A slot on floats in [0, 1], as torchvision's float kernels (no tables, blends by :func:`fma32`)."""
    n, c, h, w = x.shape
    is_op = lambda name: (ops == _OP[name]).view(n, 1, 1, 1)  # noqa: E731
    factor = t.factor[entry].view(n, 1, 1, 1)
    # 1. functions of the level
    y = torch.where(is_op("Brightness"), x.mul(factor).clamp(0, 1), x)
    levels = t.levels[entry].view(n, 1, 1, 1)
    y = torch.where(is_op("Posterize"), x.mul(levels).floor().clamp(torch.zeros_like(levels), levels - 1)
                    .mul(1.0 / levels), y)
    y = torch.where(is_op("Solarize"), torch.where(x >= t.threshold[entry].view(n, 1, 1, 1), 1.0 - x, x), y)
    y = torch.where(is_op("Invert"), 1.0 - x, y)
    y = torch.where(is_op("AutoContrast"), autocontrast_float(x), y)
    quantised = x.mul(EQUALIZE_SCALE).floor()  # to uint8 (truncation), then back by ·(1/255)
    y = torch.where(is_op("Equalize"), apply_lut(quantised, equalize_lut(quantised)).mul(1.0 / 255), y)
    # 2. blends: clamp(B·alpha + C), one rounding
    alpha = t.alpha[entry].view(n, 1, 1, 1)
    zero = torch.zeros_like(x)
    if c == 3:
        g = grey(x, floor=False)
        b = torch.where(is_op("Color"), g.expand_as(x), torch.where(is_op("Contrast"), g.mean(dim=(1, 2, 3),
                                                                                             keepdim=True), zero))
        blend_c = is_op("Color") | is_op("Contrast")
    else:  # Color is the identity on grey images
        b = torch.where(is_op("Contrast"), x.mean(dim=(1, 2, 3), keepdim=True), zero)
        blend_c = is_op("Contrast")
    base = torch.where(blend_c, x * factor, x)  # image.mul(ratio) of _blend
    if h > 2 and w > 2:
        inner = x[..., 1:-1, 1:-1]
        b = b.clone()
        b[..., 1:-1, 1:-1] = torch.where(is_op("Sharpness"), smooth_float(x) - inner, b[..., 1:-1, 1:-1])
    y = torch.where(blend_c | is_op("Sharpness"), fma32(b, alpha, base).clamp(0, 1), y)
    return _geometry(y, ops, entry, t)


def auto_augment_slot(x: torch.Tensor, ops: torch.Tensor, entry: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                      table: AutoAugmentTable, *, as_bytes: bool = True) -> torch.Tensor:
    """One slot: image i gets op ``ops[i]`` (an index into :data:`OPS`; :data:`NO_OP` for none) with the
    constants at ``entry`` = (policy, slot, negate) index tensors of the table. x: (n, C, H, W) float32, byte
    levels (``as_bytes``) or floats in [0, 1]."""
    t = table.on(x.device)
    return _slot_bytes(x, ops, entry, t) if as_bytes else _slot_floats(x, ops, entry, t)


def auto_augment(x: torch.Tensor, draw: AutoAugmentDraw, table: AutoAugmentTable, *,
                 as_bytes: bool = True) -> torch.Tensor:
    """v2.AutoAugment on a batch with per-image draws: slot 0 then slot 1 of each image's sub-policy, where
    applied. x: (n, C, H, W) float32, byte levels 0..255 (or floats in [0, 1] with ``as_bytes=False``)."""
    if x.shape[-2:] != (table.img_size, table.img_size):
        raise ConfigError(f"{table!r} is for {table.img_size} px images, got {tuple(x.shape[-2:])}")
    t = table.on(x.device)
    negate = draw.negate.long()
    for slot in range(SLOTS):
        ops = torch.where(draw.apply[:, slot], t.ops[draw.policy, slot], NO_OP)
        entry = (draw.policy, torch.full_like(draw.policy, slot), negate[:, slot])
        x = auto_augment_slot(x, ops, entry, table, as_bytes=as_bytes)
    return x
