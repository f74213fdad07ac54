"""big_vision's RandAugment (pkmixer.data.randaugment), the Mixer supplement's pre-training augmentation (supp. B,
Table 1: magnitudes 10, 15, 20): each operation's argument against the TF formulas of big_vision's
pp/autoaugment.py, and each operation's effect against a direct reference (PIL where PIL computes the same)."""
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from pkmixer.data import build_transform, dataset_info
from pkmixer.data import randaugment as ra
from pkmixer.data.transforms import check_rand_augment
from pkmixer.errors import ConfigError

# big_vision level_to_arg at magnitudes 10, 15, 20 (translate_const 100, cutout_const 40: 224 px inputs):
#   Rotate (m/10)·30, Posterize int((m/10)·4), Solarize int((m/10)·256), SolarizeAdd int((m/10)·110),
#   Color/Contrast/Brightness/Sharpness (m/10)·1.8 + 0.1, ShearX/Y (m/10)·0.3, TranslateX/Y (m/10)·100,
#   Cutout int((m/10)·40)
ARGUMENTS = {
    "AutoContrast": (None, None, None),
    "Equalize": (None, None, None),
    "Invert": (None, None, None),
    "Rotate": (30.0, 45.0, 60.0),
    "Posterize": (4, 6, 8),
    "Solarize": (256, 384, 512),
    "Color": (1.9, 2.8, 3.7),
    "Contrast": (1.9, 2.8, 3.7),
    "Brightness": (1.9, 2.8, 3.7),
    "Sharpness": (1.9, 2.8, 3.7),
    "ShearX": (0.3, 0.45, 0.6),
    "ShearY": (0.3, 0.45, 0.6),
    "TranslateX": (100.0, 150.0, 200.0),
    "TranslateY": (100.0, 150.0, 200.0),
    "Cutout": (40, 60, 80),
    "SolarizeAdd": (110, 165, 220),
}
MAGNITUDES = (10, 15, 20)
# what TF really does with the integer arguments: the posterize shift 8 - bits; the solarize threshold as uint8
POSTERIZE_SHIFT = {10: 4, 15: 2, 20: 0}
SOLARIZE_THRESHOLD = {10: 0, 15: 128, 20: 0}


def image(h=24, w=31, seed=0, low=0, high=256):
    return np.random.default_rng(seed).integers(low, high, (h, w, 3), dtype=np.uint8)


def pil(array):
    return Image.fromarray(array)


def round_half_away(v):
    return math.floor(v + 0.5) if v >= 0 else math.ceil(v - 0.5)


def reference_affine(array, matrix, fill=128):
    """Pixel by pixel: output (x, y) <- input (round(a0 x + a1 y + a2), round(a3 x + a4 y + a5)), in float64."""
    h, w = array.shape[:2]
    out = np.full_like(array, fill)
    for y in range(h):
        for x in range(w):
            u = round_half_away(matrix[0] * x + matrix[1] * y + matrix[2])
            v = round_half_away(matrix[3] * x + matrix[4] * y + matrix[5])
            if 0 <= u < w and 0 <= v < h:
                out[y, x] = array[v, u]
    return out


# ---- arguments ----------------------------------------------------------------------------------------------
def test_the_table_covers_big_visions_sixteen_ops_in_order():
    assert ra.OPS == ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "Color", "Contrast",
                      "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY", "Cutout",
                      "SolarizeAdd")
    assert set(ARGUMENTS) == set(ra.OPS)
    assert ra.SIGNED_OPS == {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"}


@pytest.mark.parametrize("op", ra.OPS)
@pytest.mark.parametrize("k, magnitude", list(enumerate(MAGNITUDES)))
def test_op_arguments_follow_the_tf_formulas(op, k, magnitude):
    expected = ARGUMENTS[op][k]
    got = ra.op_argument(op, magnitude)
    if expected is None or isinstance(expected, int):
        assert got == expected and type(got) is type(expected)
    else:
        assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_posterize_and_solarize_arguments_as_tf_applies_them(magnitude):
    assert ra.posterize_shift(ra.op_argument("Posterize", magnitude)) == POSTERIZE_SHIFT[magnitude]
    assert ra.solarize_threshold(ra.op_argument("Solarize", magnitude)) == SOLARIZE_THRESHOLD[magnitude]
    assert ra.posterize_shift(0) == 7  # m < 2.5: TF clamps the shift of 8 to 7, one bit is kept


def test_magnitudes_above_ten_are_not_capped():
    for magnitude, k in ((15, 1), (20, 2)):
        augment = ra.RandAugment.from_policy(f"bigvision-n2-m{magnitude}", img_size=224)
        assert (augment.num_layers, augment.magnitude) == (2, magnitude)
        for op in ra.OPS:
            expected = ARGUMENTS[op][k]
            assert augment.arguments[op] == (expected if expected is None else pytest.approx(expected))


def test_constants_scale_with_the_image_size():
    assert ra.scaled_constants(224) == (100, 40)
    assert ra.scaled_constants(32) == (14, 6)
    augment = ra.RandAugment.from_policy("bigvision-m15", img_size=32)
    assert augment.arguments["TranslateX"] == pytest.approx(21.0) and augment.arguments["Cutout"] == 9


# ---- effects ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_posterize_keeps_the_high_bits(magnitude):
    x = image()
    bits = ra.op_argument("Posterize", magnitude)
    assert np.array_equal(ra.apply_op("Posterize", x, bits), np.asarray(ImageOps.posterize(pil(x), bits)))
    if magnitude == 20:
        assert np.array_equal(ra.apply_op("Posterize", x, bits), x)  # 8 bits: the identity


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_solarize_uses_the_uint8_threshold(magnitude):
    x = image()
    out = ra.apply_op("Solarize", x, ra.op_argument("Solarize", magnitude))
    assert np.array_equal(out, np.asarray(ImageOps.solarize(pil(x), SOLARIZE_THRESHOLD[magnitude])))
    if magnitude in (10, 20):
        assert np.array_equal(out, 255 - x)  # threshold 256 or 512 is 0 in uint8: everything inverted


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_solarize_add_adds_to_dark_pixels(magnitude):
    x = image()
    addition = ra.op_argument("SolarizeAdd", magnitude)
    expected = np.array([[[min(int(v) + addition, 255) if v < 128 else v for v in px] for px in row] for row in x])
    assert np.array_equal(ra.apply_op("SolarizeAdd", x, addition), expected)


@pytest.mark.parametrize("factor", [0.5, *ARGUMENTS["Brightness"]])
def test_brightness_is_pils(factor):
    x = image()
    expected = np.asarray(ImageEnhance.Brightness(pil(x)).enhance(factor))
    assert np.array_equal(ra.apply_op("Brightness", x, factor), expected)


def tf_grey(x):
    """tf.image.rgb_to_grayscale on uint8: (0.2989 R + 0.587 G + 0.114 B) / 255 · 255.5, truncated."""
    return np.floor((0.2989 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]) / 255 * 255.5).astype(np.uint8)


@pytest.mark.parametrize("factor", [0.5, *ARGUMENTS["Color"]])
def test_color_blends_with_tfs_grey_image(factor):
    x = image()
    grey = tf_grey(x)
    assert np.array_equal(ra.grey(x), grey)
    assert np.abs(grey.astype(int) - np.asarray(pil(x).convert("L"), dtype=int)).max() <= 1  # PIL's grey
    degenerate = pil(np.repeat(grey[:, :, None], 3, axis=2))
    assert np.array_equal(ra.apply_op("Color", x, factor), np.asarray(Image.blend(degenerate, pil(x), factor)))


@pytest.mark.parametrize("factor", [0.5, *ARGUMENTS["Contrast"]])
def test_contrast_blends_with_big_visions_constant_grey(factor):
    x = image(64, 48)
    level = 64 * 48 // 256  # the histogram's counts over 256 bins: 12, whatever the pixels
    degenerate = Image.new("RGB", (48, 64), (level,) * 3)
    assert np.array_equal(ra.apply_op("Contrast", x, factor), np.asarray(Image.blend(degenerate, pil(x), factor)))
    assert ra.contrast(image(224, 224), 0.0).max() == ra.contrast(image(224, 224), 0.0).min() == 196


@pytest.mark.parametrize("factor", [0.5, *ARGUMENTS["Sharpness"]])
def test_sharpness_blends_with_the_smoothed_interior(factor):
    x = image()
    h, w = x.shape[:2]
    total = sum(x[dy:dy + h - 2, dx:dx + w - 2].astype(int) * (5 if (dy, dx) == (1, 1) else 1)
                for dy in range(3) for dx in range(3))
    smooth = ra.sharpness(x, 0.0)
    assert np.array_equal(smooth[[0, -1]], x[[0, -1]]) and np.array_equal(smooth[:, [0, -1]], x[:, [0, -1]])
    inner = smooth[1:-1, 1:-1].astype(int)
    exact = total % 13 != 0  # elsewhere TF's float32 sum may land just below the integer and truncate to it - 1
    assert np.array_equal(inner[exact], (total // 13)[exact])
    assert np.all((inner[~exact] == total[~exact] // 13) | (inner[~exact] == total[~exact] // 13 - 1))
    assert np.array_equal(ra.apply_op("Sharpness", x, factor), np.asarray(Image.blend(pil(smooth), pil(x), factor)))


def test_autocontrast_invert_and_equalize():
    x = image(low=40, high=200)
    out = ra.apply_op("AutoContrast", x, None)
    assert np.abs(out.astype(int) - np.asarray(ImageOps.autocontrast(pil(x)), dtype=int)).max() <= 1
    assert all(out[..., c].min() == 0 and out[..., c].max() == 255 for c in range(3))
    flat = np.full((4, 5, 3), 77, np.uint8)
    assert np.array_equal(ra.apply_op("AutoContrast", flat, None), flat)
    assert np.array_equal(ra.apply_op("Invert", x, None), np.asarray(ImageOps.invert(pil(x))))
    # TF's equalize: step = (pixels - count of the top value) // 255, lut = (cumsum + step // 2) // step shifted
    expected = np.empty_like(x)
    for c in range(3):
        histo = [int((x[..., c] == v).sum()) for v in range(256)]
        last = [n for n in histo if n][-1]
        step = (sum(histo) - last) // 255
        lut, running = [], 0
        for v in range(256):
            lut.append(min((running + step // 2) // step, 255))
            running += histo[v]
        expected[..., c] = np.array(lut)[x[..., c]]
    assert np.array_equal(ra.apply_op("Equalize", x, None), expected)


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_translations_shift_by_the_argument_and_fill_with_128(magnitude, sign):
    x = image(224, 224)
    pixels = sign * ra.op_argument("TranslateX", magnitude)
    p = int(pixels)
    expected = np.full_like(x, 128)
    if p >= 0:  # output x shows input x + pixels (TF translates by -pixels)
        expected[:, :224 - p] = x[:, p:]
    else:
        expected[:, -p:] = x[:, :224 + p]
    assert np.array_equal(ra.apply_op("TranslateX", x, pixels), expected)
    assert np.array_equal(ra.apply_op("TranslateY", x.transpose(1, 0, 2), pixels), expected.transpose(1, 0, 2))


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_shears_follow_the_projective_transform(magnitude, sign):
    x = image(13, 17)
    s = sign * ra.op_argument("ShearX", magnitude)
    assert np.array_equal(ra.apply_op("ShearX", x, s), reference_affine(x, (1, s, 0, 0, 1, 0)))
    assert np.array_equal(ra.apply_op("ShearY", x, s), reference_affine(x, (1, 0, 0, s, 1, 0)))


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_rotation_about_the_centre(magnitude, sign):
    x = image(20, 27)
    degrees = sign * ra.op_argument("Rotate", magnitude)
    h, w = x.shape[:2]
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    matrix = (c, -s, ((w - 1) - (c * (w - 1) - s * (h - 1))) / 2, s, c, ((h - 1) - (s * (w - 1) + c * (h - 1))) / 2)
    differ = (ra.apply_op("Rotate", x, degrees) != reference_affine(x, matrix)).any(axis=2)
    assert differ.mean() < 0.02  # float32 (TF) against float64 here: only ties at half a pixel may round apart
    square = image(16, 16)
    assert np.array_equal(ra.apply_op("Rotate", square, 90.0), np.rot90(square))  # counter-clockwise
    assert np.array_equal(ra.apply_op("Rotate", square, 0.0), square)


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_cutout_fills_a_square_cut_at_the_edges(magnitude):
    x = image(224, 224)
    pad = ra.op_argument("Cutout", magnitude)
    for center in ((100, 120), (5, 220)):
        out = ra.apply_op("Cutout", x, pad, cutout_center=center)
        mask = np.zeros((224, 224), bool)
        mask[max(0, center[0] - pad):center[0] + pad, max(0, center[1] - pad):center[1] + pad] = True
        assert (out[mask] == 128).all() and np.array_equal(out[~mask], x[~mask])
    assert mask.sum() == (5 + pad) * (224 - 220 + pad)


# ---- the transform ------------------------------------------------------------------------------------------
def test_rand_augment_draws_every_op_and_applies_it(monkeypatch):
    seen = []
    original = ra.apply_op

    def spy(op, array, arg, **kwargs):
        seen.append((op, arg))
        return original(op, array, arg, **kwargs)

    monkeypatch.setattr(ra, "apply_op", spy)
    torch.manual_seed(0)
    augment = ra.RandAugment.from_policy("bigvision-n2-m20", img_size=32)
    x = pil(image(32, 32))
    for _ in range(300):
        out = augment(x)
        assert out.size == (32, 32) and out.mode == "RGB"
    assert len(seen) == 600 and {op for op, _ in seen} == set(ra.OPS)
    for op in ra.SIGNED_OPS:
        signs = {np.sign(arg) for name, arg in seen if name == op}
        assert signs == {1.0, -1.0}
    assert all(arg == augment.arguments[op] for op, arg in seen if op not in ra.SIGNED_OPS)


def test_rand_augment_takes_tensors_and_grey_images():
    torch.manual_seed(1)
    augment = ra.RandAugment(3, 15)
    x = torch.rand(3, 12, 10)
    out = augment(x)
    assert out.dtype == torch.uint8 and out.shape == (3, 12, 10)
    grey = Image.fromarray(image(12, 10)[..., 0])
    for _ in range(50):
        assert augment(grey).mode == "L"
    ra.RandAugment(1, 0)(x)  # magnitude 0 runs too


def test_build_transform_uses_big_visions_rand_augment():
    info = dataset_info("cifar10")
    tf = build_transform(info, train=True, img_size=32, in_chans=3, crop_padding=4, hflip=True,
                         rand_augment="bigvision-n2-m15")
    steps = [s for s in tf.transforms if isinstance(s, ra.RandAugment)]
    assert len(steps) == 1 and (steps[0].num_layers, steps[0].magnitude) == (2, 15.0)
    assert steps[0].translate_const == 14 and steps[0].cutout_const == 6
    torch.manual_seed(2)
    for sample in (torch.rand(3, 32, 32), pil(image(32, 32))):
        out = tf(sample)
        assert out.dtype == torch.float32 and out.shape == (3, 32, 32)
    # a grey data set for an RGB model and the reverse
    mnist = dataset_info("mnist")
    for chans in (1, 3):
        tf = build_transform(mnist, train=True, img_size=28, in_chans=chans, rand_augment="bigvision-m20")
        assert tf(torch.rand(1, 28, 28)).shape == (chans, 28, 28)


@pytest.mark.parametrize("policy, message", [
    ("bigvision-m25", "magnitude 25 is above 20"),
    ("bigvision-x3", "unknown section 'x3'"),
    ("bigvision-n2.5", "unknown section 'n2.5'"),
    ("bigvision-n0", "n .layers. must be at least 1"),
    ("bigvision-m-1", "unknown section 'm'"),
    ("randaug-m15", "must start with 'rand' .timm's, e.g. rand-m9-mstd0.5-inc1. or 'bigvision'"),
])
def test_policy_errors(policy, message):
    with pytest.raises(ConfigError, match=message):
        check_rand_augment(policy)


def test_policy_defaults_are_big_visions():
    assert ra.parse_policy("bigvision") == (2, 10.0)
    assert ra.parse_policy("bigvision-m15-n3") == (3, 15.0)
    assert check_rand_augment("bigvision-n2-m20") == "bigvision-n2-m20"
    tf = build_transform(dataset_info("cifar10"), train=True, img_size=32, in_chans=3, rand_augment="bigvision")
    assert [(s.num_layers, s.magnitude) for s in tf.transforms if isinstance(s, ra.RandAugment)] == [(2, 10.0)]
