"""Device-resident data (pkmixer.data.resident) and batched augmentation (pkmixer.data.batch_augment):

* the resident tensors hold build_dataset's examples, in its order, and the batch iterator gives
  GlobalBatchSampler's batches;
* each batched operation against the per-sample one fed the SAME draws (crop offsets, flip bits, op ids and
  signs, erasing boxes, mixup λ and box), with the tolerance each needs;
* the draws are per image: a batch of 512 whose crop offsets or RandAugment ops were shared, or correlated
  between neighbours, fails the chi-square and distinctness checks;
* determinism: the key (seed, epoch, step, member) fixes the output; another member draws otherwise; two
  simulated processes together give the images of one.
"""
import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats
from test_data import write_cifar10, write_idx_set, write_imagefolder, write_stl10
from timm.data import mixup as timm_mixup
from timm.data import random_erasing as timm_erasing
from torch.overrides import TorchFunctionMode
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from pkmixer.data import build_dataset, build_transform, dataset_info
from pkmixer.data import batch_augment as ba
from pkmixer.data import randaugment as ra
from pkmixer.data.resident import ResidentBatches, epoch_order, load_resident
from pkmixer.errors import ConfigError
from pkmixer.train.distributed import Context, GlobalBatchSampler

CIFAR = dataset_info("cifar10")


@pytest.fixture(autouse=True)
def _no_real_data(tmp_path, monkeypatch):
    monkeypatch.setenv("PKMIXER_DATA_CACHE", str(tmp_path / "cache"))


def byte_images(n, size=32, channels=3, seed=0):
    """Random uint8 images (n, C, H, W), a quarter of them low-contrast (auto-contrast and equalize matter)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, channels, size, size), dtype=np.uint8)
    x[: n // 4] = rng.integers(90, 150, (n // 4, channels, size, size), dtype=np.uint8)
    return torch.from_numpy(x)


def to_pil(x):  # (C, H, W) uint8 -> PIL
    a = x.permute(1, 2, 0).numpy()
    return Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else a)


def from_pil(img):  # PIL -> (C, H, W) float of byte levels
    return TF.pil_to_tensor(img).float()


# ---- resident data -----------------------------------------------------------------------------------------
def per_sample(ds):
    """build_dataset's examples as (N, C, H, W) tensors: bytes from PIL images, floats as they are."""
    images = [img if isinstance(img, torch.Tensor) else TF.pil_to_tensor(img) for img, _ in ds]
    return torch.stack(images), torch.tensor([label for _, label in ds])


@pytest.mark.parametrize("name, writer, options", [
    ("cifar10", write_cifar10, {}),
    ("stl10", lambda root, rng: write_stl10(root, rng, n_train=16), {}),
    ("mnist", lambda root, rng: write_idx_set(root / "MNIST" / "raw", rng, n_train=12), {}),
    ("digits", None, {}),
    ("synthetic", None, {"train_size": 40, "test_size": 10, "img_size": 16}),
])
def test_resident_split_holds_build_datasets_examples_in_order(tmp_path, name, writer, options):
    if writer is not None:
        writer(tmp_path, np.random.default_rng(0))
    cases = [("train", {}), ("test", {}), ("train", {"val_fraction": 0.5, "seed": 3}),
             ("val", {"val_fraction": 0.5, "seed": 3}), ("train", {"subset": 7, "seed": 1})]
    for split, kw in cases:
        ds = build_dataset(name, split, data_dir=tmp_path, **kw, **options)
        res = load_resident(name, split, data_dir=tmp_path, **kw, **options)
        images, labels = per_sample(ds)
        assert res.images.dtype == (torch.float32 if name in ("digits", "synthetic") else torch.uint8)
        assert res.images.shape == images.shape and len(res) == len(ds)
        assert torch.equal(res.images, images.to(res.images.dtype)), (name, split, kw)
        assert torch.equal(res.labels, labels) and res.labels.dtype == torch.int64
        assert res.info == ds.info and res.classes == ds.classes


def test_image_folders_are_refused(tmp_path):
    write_imagefolder(tmp_path, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="per-sample"):
        load_resident("imagenet", "train", data_dir=tmp_path)
    with pytest.raises(ConfigError, match="varying sizes"):
        ba.build_batch_augment(dataset_info("imagenet"), train=True, img_size=32, in_chans=3)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("train", [True, False])
def test_batches_follow_global_batch_samplers_order(world, train):
    data = load_resident("digits", "test")  # 359 examples
    for rank in range(world):
        sampler = GlobalBatchSampler(len(data), 64, Context(rank, world, torch.device("cpu")), shuffle=train,
                                     seed=5, drop_last=train)
        batches = ResidentBatches(data, 64, seed=5, shuffle=train, drop_last=train, rank=rank, world=world)
        for epoch in (0, 3):
            sampler.set_epoch(epoch)
            batches.set_epoch(epoch)
            got = list(batches)
            assert [b.indices.tolist() for b in got] == list(sampler)
            assert len(got) == len(batches)
            for b in got:
                assert torch.equal(b.images, data.images[b.indices]) and torch.equal(b.labels, data.labels[b.indices])
                order = epoch_order(len(data), seed=5, epoch=epoch, shuffle=train)
                assert torch.equal(order[b.step * 64:(b.step + 1) * 64][b.rank_slice], b.indices)


# ---- same draws, batched against per-sample -----------------------------------------------------------------------
def test_crop_with_padding_and_flip_equal_the_per_sample_ops():
    x = byte_images(16)
    offsets = torch.from_numpy(np.random.default_rng(1).integers(0, 9, (16, 2)))
    flips = torch.arange(16) % 3 == 0
    out = ba.hflip(ba.crop(x.float(), offsets, 32, padding=4), flips)
    for i in range(16):
        ref = TF.crop(TF.pad(to_pil(x[i]), [4], fill=0), int(offsets[i, 0]), int(offsets[i, 1]), 32, 32)
        ref = TF.hflip(ref) if flips[i] else ref
        assert torch.equal(out[i], from_pil(ref))


def test_channel_conversions_equal_pil_and_torchvision():
    x = byte_images(8)
    grey = ba.to_channels(x.float(), 1, as_bytes=True)
    assert torch.equal(grey, torch.stack([from_pil(to_pil(im).convert("L")) for im in x]))  # exact integer formula
    g = byte_images(8, channels=1)
    assert torch.equal(ba.to_channels(g.float(), 3, as_bytes=True), torch.stack([from_pil(to_pil(im).convert("RGB"))
                                                                                  for im in g]))
    f = torch.rand(4, 3, 8, 8)
    assert torch.equal(ba.to_channels(f, 1, as_bytes=False), torch.stack([v2.Grayscale()(im) for im in f]))


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_resize_matches_pil_within_two_levels(interpolation):
    """PIL resamples bytes with fixed-point weights through 8-bit storage between its two passes; the batched
    resize computes in float32 and rounds after each pass: on white-noise 96 px images (the worst case for
    bicubic overshoot) every pixel is within 2 levels and the mean difference is below 0.2 of a level. Floats
    (digits, synthetic) follow torchvision's tensor path exactly."""
    x = byte_images(6, size=96)
    mode = v2.InterpolationMode.BILINEAR if interpolation == "bilinear" else v2.InterpolationMode.BICUBIC
    for side in (32, 90, 120):
        out = ba.resize(x.float(), side, interpolation, as_bytes=True)
        ref = torch.stack([from_pil(v2.Resize((side, side), interpolation=mode)(to_pil(im))) for im in x])
        diff = (out - ref).abs()
        assert diff.max() <= 2 and diff.mean() < 0.2, (side, diff.max(), diff.mean())
    f = torch.rand(4, 1, 8, 8)
    assert torch.equal(ba.resize(f, 28, interpolation, as_bytes=False),
                       torch.stack([v2.Resize((28, 28), interpolation=mode)(im) for im in f]))


@pytest.mark.parametrize("channels, size", [(3, 32), (1, 28)])
@pytest.mark.parametrize("magnitude", [10, 15, 20])
def test_every_rand_augment_op_is_bit_identical_to_randaugment_apply_op(channels, size, magnitude):
    x = byte_images(24, size, channels)
    table = ba.RandAugmentTable(f"bigvision-n1-m{magnitude}", size)
    rng = np.random.default_rng(magnitude)
    for k, op in enumerate(ra.OPS):
        ops = torch.full((24,), k)
        negate = torch.arange(24) % 2 == 1
        centers = torch.from_numpy(rng.integers(0, size, (24, 2)))
        out = ba.rand_augment_layer(x.float(), ops, negate, centers, table)
        for i in range(24):
            arg = table.reference.arguments[op]
            arg = -arg if op in ra.SIGNED_OPS and negate[i] else arg
            ref = ra.apply_op(op, x[i].permute(1, 2, 0).numpy(), arg, cutout_center=tuple(centers[i].tolist()))
            assert torch.equal(out[i], torch.from_numpy(ref).permute(2, 0, 1).float()), (op, i)


def test_two_layers_with_a_different_op_per_image_equal_the_per_image_loop():
    x = byte_images(64)
    table = ba.RandAugmentTable("bigvision-n2-m15", 32)
    ops, negate, centers = ba.draw_rand_augment(64, 2, (32, 32), torch.Generator().manual_seed(0))
    out = ba.rand_augment(x.float(), ops, negate, centers, table)
    for i in range(64):
        image = x[i].permute(1, 2, 0).numpy()
        for layer in range(2):
            op = ra.OPS[int(ops[i, layer])]
            arg = table.reference.arguments[op]
            arg = -arg if op in ra.SIGNED_OPS and negate[i, layer] else arg
            image = ra.apply_op(op, image, arg, cutout_center=tuple(centers[i, layer].tolist()))
        assert torch.equal(out[i], torch.from_numpy(image).permute(2, 0, 1).float())


def test_normalisation_equals_todtype_and_normalize():
    aug = ba.build_batch_augment(CIFAR, train=False, img_size=32, in_chans=3)
    x = byte_images(8)
    out, _ = aug(x, torch.zeros(8, dtype=torch.long))
    ref = build_transform(CIFAR, train=False, img_size=32, in_chans=3)
    assert torch.equal(out, torch.stack([ref(to_pil(im)) for im in x]))


def test_random_erasing_equals_timms_for_the_same_draws(monkeypatch):
    """timm's RandomErasing._erase, its Python random calls answered with the batched draws."""
    n, shape = 64, (3, 32, 32)
    draw = ba.draw_erasing(n, 0.5, shape, torch.Generator().manual_seed(0))
    x = torch.randn(n, *shape)
    out = ba.random_erase(x, draw)
    boxes = ba.erasing_boxes(draw, (32, 32))
    erasing = timm_erasing.RandomErasing(0.5, mode="pixel", device="cpu")
    for i in range(n):
        uniforms = iter([v for a, r in zip(draw.area[i].tolist(), draw.log_aspect[i].tolist()) for v in (a, r)])
        corner = iter(boxes[i, 1:3].tolist())

        class Stub:
            random = staticmethod(lambda: 0.0 if draw.apply[i] else 1.0)
            uniform = staticmethod(lambda lo, hi: next(uniforms))
            randint = staticmethod(lambda lo, hi: next(corner))

        top, left = boxes[i, 1:3].tolist()
        monkeypatch.setattr(timm_erasing, "random", Stub)
        monkeypatch.setattr(timm_erasing, "_get_pixels", lambda per_pixel, rand_color, size, dtype, device:
                            draw.noise[i][:, top:top + size[1], left:left + size[2]])
        ref = x[i].clone()
        erasing(ref)
        assert torch.equal(out[i], ref), i
    applied = boxes[:, 0].bool()
    assert 0 < applied.sum() < n and torch.equal(applied, draw.apply)  # at 32 px one of 10 attempts always fits


@pytest.mark.parametrize("cutmix", [False, True])
def test_mixup_and_cutmix_equal_timms_for_the_same_draws(monkeypatch, cutmix):
    """timm's Mixup (mode batch) on the batch reordered so that its flip pairs our 2k with 2k+1, its NumPy
    calls answered with the batched draws."""
    n = 8
    x, labels = torch.randn(n, 3, 32, 32), torch.arange(n) % 10
    draw = ba.MixDraw(0.7, cutmix, (5, 20))
    out, target = ba.mix(x, labels, draw, 10, 0.1)
    order = torch.tensor([*range(0, n, 2), *range(n - 1, 0, -2)])  # timm's partner of position i is n-1-i

    centre = iter(draw.center)

    class Random:  # timm's np.random calls: rand (mix_prob, then switch_prob), beta, randint (the centre)
        rand = staticmethod(lambda: 0.0 if cutmix else 0.99)
        beta = staticmethod(lambda a, b: draw.lam)
        randint = staticmethod(lambda lo, hi, size=None: next(centre))

    class NumPy:
        random = Random

        def __getattr__(self, name):
            return getattr(np, name)

    monkeypatch.setattr(timm_mixup, "np", NumPy())
    ref_x, ref_y = timm_mixup.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)(
        x[order].clone(), labels[order])
    assert torch.equal(out[order], ref_x) and torch.equal(target[order], ref_y)
    if cutmix:
        (yl, yh, xl, xh), lam = ba.cutmix_box(draw, (32, 32))
        # cut = int(32·sqrt(0.3)) = 17 px: rows 5-8 .. 5+9 clipped to 0..14, columns 20-8 .. 20+9
        assert (yl, yh, xl, xh) == (0, 14, 12, 29) and lam == pytest.approx(1 - 14 * 17 / 1024)


# ---- per-image randomness ----------------------------------------------------------------------------------------
def chi2_pvalue(values, categories):
    counts = np.bincount(values, minlength=categories)
    return stats.chisquare(counts).pvalue


def neighbour_correlation(values):
    v = np.asarray(values, dtype=float)
    return abs(np.corrcoef(v[:-1], v[1:])[0, 1]) if v.std() > 0 else 1.0


def test_crop_offsets_and_ops_are_drawn_per_image_not_per_batch():
    """Over a global batch of 512: offsets (9 values each with padding 4) and op ids (16) are uniform by a
    chi-square test (p > 1e-4), take nearly all values (one offset shared by the batch would give 1), and
    neighbours are uncorrelated (|r| < 0.2, about 4.5 standard errors of 1/sqrt(512))."""
    aug = ba.build_batch_augment(CIFAR, train=True, img_size=32, in_chans=3, crop_padding=4, hflip=True,
                                 rand_augment="bigvision-n2-m15")
    d = aug.draw(512, seed=0, epoch=0, step=0)
    top, left = d.crop[:, 0].numpy(), d.crop[:, 1].numpy()
    for values, k in ((top, 9), (left, 9), (top * 9 + left, 81), (d.ops[:, 0].numpy(), 16),
                      (d.ops[:, 1].numpy(), 16), (d.flip.long().numpy(), 2), (d.negate[:, 0].long().numpy(), 2)):
        assert chi2_pvalue(values, k) > 1e-4
        assert neighbour_correlation(values) < 0.2
    assert len({(a, b) for a, b in zip(top, left)}) >= 75  # of 81; E = 81·(1 - e^(-512/81)) = 80.9
    assert len(set(map(tuple, d.ops.tolist()))) >= 200  # of 256 op pairs; E = 256·(1 - e^-2) = 221.4 ± 4.5
    assert neighbour_correlation(d.ops[:, 0].numpy() * 16 + d.ops[:, 1].numpy()) < 0.2
    # the checks do fail on a batch-wide choice
    assert chi2_pvalue(np.full(512, 3), 9) < 1e-100 and neighbour_correlation(np.full(512, 3)) == 1.0
    pairs = np.repeat(np.random.default_rng(0).integers(0, 9, 256), 2)  # uniform values, drawn per pair of images
    assert chi2_pvalue(pairs, 9) > 1e-4 and neighbour_correlation(pairs) > 0.2


def test_the_whole_pipeline_has_the_per_sample_pipelines_statistics():
    """One image, augmented 512 times by each pipeline (crop 4 + flip): the per-pixel mean images agree within
    0.1 (normalised units; their standard error is about 0.04)."""
    img = byte_images(1)[0]
    kw = dict(train=True, img_size=32, in_chans=3, crop_padding=4, hflip=True)
    per_sample_tf = build_transform(CIFAR, **kw)
    torch.manual_seed(0)
    ref = torch.stack([per_sample_tf(to_pil(img)) for _ in range(512)])
    out, _ = ba.build_batch_augment(CIFAR, **kw)(img.expand(512, -1, -1, -1), torch.zeros(512, dtype=torch.long))
    assert (out.mean(0) - ref.mean(0)).abs().max() < 0.4
    assert (out.mean(0) - ref.mean(0)).abs().mean() < 0.1
    assert float(out.std(0).mean()) == pytest.approx(float(ref.std(0).mean()), rel=0.05)


# ---- determinism ----------------------------------------------------------------------------------------------
FULL = dict(train=True, img_size=32, in_chans=3, crop_padding=4, hflip=True, rand_augment="bigvision-n2-m15",
            random_erasing=0.25, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)


def test_the_key_fixes_the_output_and_members_draw_otherwise():
    aug = ba.build_batch_augment(CIFAR, **FULL)
    x, y = byte_images(32), torch.arange(32) % 10
    a = aug(x, y, seed=1, epoch=2, step=3, member=0)
    b = aug(x, y, seed=1, epoch=2, step=3, member=0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for other in (dict(member=1), dict(step=4), dict(epoch=3), dict(seed=2)):
        key = {"seed": 1, "epoch": 2, "step": 3, "member": 0, **other}
        d0, d1 = aug.draw(32, seed=1, epoch=2, step=3), aug.draw(32, **key)
        assert not torch.equal(d0.crop, d1.crop) and not torch.equal(d0.ops, d1.ops), other
        assert not torch.equal(aug(x, y, **key)[0], a[0])


def test_two_processes_see_the_images_of_one():
    aug = ba.build_batch_augment(CIFAR, **FULL)
    x, y = byte_images(32), torch.arange(32) % 10
    one = aug(x, y, seed=0, epoch=1, step=7)
    parts = [aug(x[s], y[s], seed=0, epoch=1, step=7, rank_slice=s, global_size=32)
             for s in (slice(0, 16), slice(16, 32))]
    assert torch.equal(torch.cat([p[0] for p in parts]), one[0])
    assert torch.equal(torch.cat([p[1] for p in parts]), one[1])
    with pytest.raises(ConfigError, match="even"):
        aug(x[3:9], y[3:9], rank_slice=slice(3, 9), global_size=32)


@pytest.mark.parametrize("policy", [dict(rand_augment="bigvision-n2-m15"), dict(auto_augment="cifar10")])
def test_an_epoch_over_resident_data_runs_with_every_augmentation(policy):
    """Every batched stage at once, with either policy (synthetic floats: AutoAugment's float kernels)."""
    data = load_resident("synthetic", "train", train_size=96, test_size=8)
    settings = {k: v for k, v in FULL.items() if k != "rand_augment"}
    aug = ba.build_batch_augment(data.info, **settings, **policy)
    batches = ResidentBatches(data, 32, seed=0, shuffle=True, drop_last=True)
    batches.set_epoch(1)
    for b in batches:
        x, y = aug(b.images, b.labels, seed=0, epoch=1, step=b.step, rank_slice=b.rank_slice,
                   global_size=b.global_size)
        assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32 and torch.isfinite(x).all()
        assert y.shape == (32, 10) and torch.allclose(y.sum(1), torch.ones(32))


class NoHostSync(TorchFunctionMode):
    """Fails on every tensor operation that makes the host wait for the device: reading a value (item, tolist,
    bool, int, float, index, nonzero) or copying a host tensor to a device (torch.tensor, as_tensor, .to(device))."""

    READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy", "cpu", "cuda",
             "tensor", "as_tensor", "from_numpy"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        moves = name == "to" and ("device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:]))
        if name in self.READS or moves:
            raise AssertionError(f"host synchronisation in the batched pipeline: {name}")
        return func(*args, **kwargs)


def test_the_batched_pipeline_never_reads_a_tensor_on_the_host():
    aug = ba.build_batch_augment(CIFAR, **FULL)
    x, y = byte_images(16), torch.arange(16) % 10
    aug(x, y)  # device constants are copied once, on the first call
    with NoHostSync():
        out, target = aug(x, y, seed=0, epoch=0, step=1)
    with pytest.raises(AssertionError, match="item"), NoHostSync():
        x.sum().item()  # the guard works


@pytest.mark.parametrize("eval_crop", [None, "resize-crop"])
def test_evaluation_pipeline_matches_build_transform(tmp_path, eval_crop):
    write_stl10(tmp_path, np.random.default_rng(0))
    data = load_resident("stl10", "test", data_dir=tmp_path)
    kw = dict(train=False, img_size=32, in_chans=3, resize=40, eval_crop=eval_crop)
    out, _ = ba.build_batch_augment(data.info, **kw)(data.images, data.labels)
    ref = torch.stack([build_transform(data.info, **kw)(to_pil(im)) for im in data.images])
    # normalised units: 2 byte levels over the smallest standard deviation
    assert (out - ref).abs().max() <= 2 / 255 / min(data.info.std) + 1e-6


def test_what_has_no_batched_version_is_refused():
    assert ba.build_batch_augment(CIFAR, train=True, img_size=32, in_chans=3, auto_augment="cifar10").auto is not None
    for kw, match in ((dict(auto_augment="bogus"), "auto_augment"), (dict(rand_augment="rand-m9"), "timm"),
                      (dict(random_resized_crop=(0.5, 1.0)), "random_resized_crop"),
                      (dict(rand_augment="bogus"), "RandAugment policy"), (dict(mixup_alpha=-1), "mixup_alpha")):
        with pytest.raises(ConfigError, match=match):
            ba.build_batch_augment(CIFAR, train=True, img_size=32, in_chans=3, **kw)


def test_grey_data_for_an_rgb_model_with_float_source_and_rand_augment():
    """digits (floats in [0, 1], 8 px) for a 3-channel 16 px model: the per-sample pipeline rounds to bytes before
    RandAugment; with every op forced to Invert both pipelines give 255 - round(255·x)."""
    data = load_resident("digits", "test")
    info = data.info
    kw = dict(train=True, img_size=16, in_chans=3, rand_augment="bigvision-n1-m10")
    aug = ba.build_batch_augment(info, **kw)
    d = aug.draw(8, seed=0, epoch=0, step=0)
    d = ba.Draws(ops=torch.full_like(d.ops, ra.OPS.index("Invert")), negate=d.negate, centers=d.centers)
    out, _ = aug.apply(data.images[:8], data.labels[:8], d)
    resized = v2.Resize((16, 16), interpolation=v2.InterpolationMode.BILINEAR)
    ref = torch.stack([255 - (resized(v2.RGB()(im)) * 255).round().clamp(0, 255) for im in data.images[:8]])
    mean, std = torch.tensor(info.mean * 3).view(-1, 1, 1), torch.tensor(info.std * 3).view(-1, 1, 1)
    assert torch.allclose(out, (ref / 255 - mean) / std, atol=1e-5)
