"""The data layer: data sets read from small fakes written in their real on-disk formats, discovery and its
errors, splits, the offline data sets, transforms, mixup and the loss."""
import dataclasses
import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch.utils.data import DataLoader

from pkmixer.data import (
    DatasetSplit,
    build_dataset,
    build_loss,
    build_mixup,
    build_transform,
    dataset_info,
    default_cache_dir,
    list_datasets,
    read_idx,
)
from pkmixer.data import datasets as D
from pkmixer.errors import ConfigError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _no_real_places(tmp_path, monkeypatch):
    """Keep the download cache in tmp_path and the OS locations out of every test that does not ask for them."""
    monkeypatch.setenv("PKMIXER_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(D._REGISTRY, "fashion-mnist",
                        dataclasses.replace(D._REGISTRY["fashion-mnist"], system_dirs=(str(tmp_path / "os"),)))


# ---- fakes in the real formats -------------------------------------------------------------------------------
def _images(rng, n, h, w, c=None):
    return rng.integers(0, 256, size=(n, h, w) if c is None else (n, h, w, c), dtype=np.uint8)


def _cifar_row(img):  # CIFAR stores each 32×32×3 image as its red, green and blue planes, each row-major
    return np.concatenate([img[:, :, ch].ravel() for ch in range(3)])


def _pickle(path, obj):
    path.write_bytes(pickle.dumps(obj, protocol=2))


def write_cifar10(root, rng, per_batch=4, n_test=6):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    images, labels = {}, {}
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", n_test)]:
        images[name], labels[name] = _images(rng, n, 32, 32, 3), [int(v) for v in rng.integers(0, 10, n)]
        _pickle(folder / name, {"batch_label": name, "labels": labels[name],
                                "data": np.stack([_cifar_row(im) for im in images[name]]),
                                "filenames": [f"{name}_{i}.png" for i in range(n)]})
    _pickle(folder / "batches.meta", {"num_cases_per_batch": per_batch, "num_vis": 3072,
                                      "label_names": [f"class{i}" for i in range(10)]})
    train = [f"data_batch_{i}" for i in range(1, 6)]
    return (np.concatenate([images[b] for b in train]), sum((labels[b] for b in train), []),
            images["test_batch"], labels["test_batch"])


def write_cifar100(root, rng, n_train=8, n_test=5):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = []
    for name, n in (("train", n_train), ("test", n_test)):
        imgs, fine = _images(rng, n, 32, 32, 3), [int(v) for v in rng.integers(0, 100, n)]
        fine[0] = 99
        _pickle(folder / name, {"filenames": [f"{i}.png" for i in range(n)], "batch_label": name,
                                "fine_labels": fine, "coarse_labels": [f // 5 for f in fine],
                                "data": np.stack([_cifar_row(im) for im in imgs])})
        out += [imgs, fine]
    _pickle(folder / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)],
                              "coarse_label_names": [f"coarse{i}" for i in range(20)]})
    return out


def write_stl10(root, rng, n_train=5, n_test=3, labels_from=1):
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    out = []
    for split, n in (("train", n_train), ("test", n_test)):
        imgs = _images(rng, n, 96, 96, 3)
        labels = rng.integers(0, 10, n)
        # each image: its three channels, each stored column by column
        raw = np.concatenate([imgs[k][:, :, ch].ravel(order="F") for k in range(n) for ch in range(3)])
        raw.tofile(folder / f"{split}_X.bin")
        (labels + labels_from).astype(np.uint8).tofile(folder / f"{split}_y.bin")
        out += [imgs, labels]
    (folder / "class_names.txt").write_text("\n".join(D._STL10_CLASSES) + "\n")
    return out


def _idx_bytes(array):
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape) + array.tobytes()


def write_idx_set(folder, rng, n_train=7, n_test=4, gz=False):
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        imgs, labels = _images(rng, n, 28, 28), rng.integers(0, 10, n).astype(np.uint8)
        for kind, array in (("images-idx3", imgs), ("labels-idx1", labels)):
            name = folder / f"{prefix}-{kind}-ubyte"
            if gz:
                with gzip.open(f"{name}.gz", "wb") as f:
                    f.write(_idx_bytes(array))
            else:
                name.write_bytes(_idx_bytes(array))
        out += [imgs, labels]
    return out


def write_imagefolder(root, rng, classes=("cat", "dog", "fish"), per_class=(2, 1)):
    out = {}
    for split, n in zip(("train", "val"), per_class):
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                img = _images(rng, 1, 6 + i, 9, 3)[0]  # non-square, sizes vary
                Image.fromarray(img).save(root / split / cls / f"{i}.png")
                out[(split, cls, i)] = img
    return out


def _pixels(image):
    return np.asarray(image)


# ---- registry --------------------------------------------------------------------------------------------
def test_registry_lists_the_data_sets_and_rejects_unknown_names():
    assert list_datasets() == ["cifar10", "cifar100", "digits", "fashion-mnist", "imagenet", "mnist", "stl10",
                               "synthetic"]
    info = dataset_info("cifar100")
    assert (info.num_classes, info.in_chans, info.image_size, len(info.mean)) == (100, 3, 32, 3)
    assert dataset_info("stl10").image_size == 96 and dataset_info("mnist").in_chans == 1
    with pytest.raises(ConfigError, match=r"unknown data set 'cifar'; did you mean cifar10, cifar100\?"):
        dataset_info("cifar")
    with pytest.raises(ConfigError, match="known: cifar10, cifar100, digits, fashion-mnist, imagenet, mnist"):
        build_dataset("svhn", "train")
    with pytest.raises(ConfigError, match="unknown split 'tran'; did you mean train"):
        build_dataset("digits", "tran")


# ---- the formats -------------------------------------------------------------------------------------------
def test_cifar10_fake_round_trips_and_agrees_with_torchvision(tmp_path, monkeypatch):
    train_imgs, train_labels, test_imgs, test_labels = write_cifar10(tmp_path, np.random.default_rng(0))
    train = build_dataset("cifar10", "train", data_dir=tmp_path)
    test = build_dataset("cifar10", "test", data_dir=tmp_path)
    assert isinstance(train, DatasetSplit) and (len(train), len(test)) == (20, 6)
    assert train.root == tmp_path / "cifar-10-batches-py" and train.info.num_classes == 10
    assert train.classes == [f"class{i}" for i in range(10)] and train.targets == train_labels
    image, label = train[13]
    assert image.mode == "RGB" and image.size == (32, 32) and label == train_labels[13]
    for k in range(20):
        np.testing.assert_array_equal(_pixels(train[k][0]), train_imgs[k])
    for k in range(6):
        np.testing.assert_array_equal(_pixels(test[k][0]), test_imgs[k])
        assert test[k][1] == test_labels[k]
    # torchvision reads the same fake the same way (its MD5 checks switched off: the fake is not the real file)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    reference = torchvision.datasets.CIFAR10(str(tmp_path), train=True)
    for k in (0, 7, 19):
        np.testing.assert_array_equal(_pixels(reference[k][0]), _pixels(train[k][0]))
        assert reference[k][1] == train[k][1]


def test_cifar100_fake_uses_the_fine_labels(tmp_path):
    train_imgs, train_fine, test_imgs, test_fine = write_cifar100(tmp_path, np.random.default_rng(1))
    train = build_dataset("cifar100", "train", data_dir=tmp_path / "cifar-100-python")  # the folder itself works too
    test = build_dataset("cifar100", "test", data_dir=tmp_path)
    assert train.info.num_classes == 100 and len(train.classes) == 100 and train.classes[99] == "fine99"
    assert train.targets == train_fine and test.targets == test_fine and train[0][1] == 99
    for k in range(len(test)):
        np.testing.assert_array_equal(_pixels(test[k][0]), test_imgs[k])


def test_stl10_fake_round_trips_and_agrees_with_torchvision(tmp_path, monkeypatch):
    train_imgs, train_labels, test_imgs, test_labels = write_stl10(tmp_path, np.random.default_rng(2))
    train = build_dataset("stl10", "train", data_dir=tmp_path)
    test = build_dataset("stl10", "test", data_dir=tmp_path)
    assert (len(train), len(test)) == (5, 3) and train.classes == D._STL10_CLASSES
    assert train.targets == train_labels.tolist() and test.targets == test_labels.tolist()  # stored 1..10
    for k in range(5):
        assert train[k][0].size == (96, 96)
        np.testing.assert_array_equal(_pixels(train[k][0]), train_imgs[k])
    monkeypatch.setattr(torchvision.datasets.STL10, "_check_integrity", lambda self: True)
    reference = torchvision.datasets.STL10(str(tmp_path), split="test")
    for k in range(3):
        np.testing.assert_array_equal(_pixels(reference[k][0]), _pixels(test[k][0]))
        assert reference[k][1] == test[k][1]


def test_labels_outside_the_classes_are_refused(tmp_path):
    write_stl10(tmp_path, np.random.default_rng(3), labels_from=0)  # 0-based on disk: one label becomes -1
    with pytest.raises(ConfigError, match=r"STL-10 in .*stl10_binary has labels -1\.\.\d, outside 0\.\.9"):
        build_dataset("stl10", "train", data_dir=tmp_path)


def test_mnist_fake_plain_and_gzip_agree_with_torchvision(tmp_path):
    rng = np.random.default_rng(4)
    train_imgs, train_labels, test_imgs, test_labels = write_idx_set(tmp_path / "plain" / "MNIST" / "raw", rng)
    train = build_dataset("mnist", "train", data_dir=tmp_path / "plain")
    assert len(train) == 7 and train.classes[3] == "3 - three" and train.targets == train_labels.tolist()
    assert train[0][0].mode == "L" and train[0][0].size == (28, 28)
    reference = torchvision.datasets.MNIST(str(tmp_path / "plain"), train=False)  # reads plain IDX, no MD5
    test = build_dataset("mnist", "test", data_dir=tmp_path / "plain")
    for k in range(4):
        np.testing.assert_array_equal(_pixels(test[k][0]), test_imgs[k])
        np.testing.assert_array_equal(_pixels(reference[k][0]), test_imgs[k])
        assert test[k][1] == reference[k][1] == test_labels[k]
    gz_imgs = write_idx_set(tmp_path / "gz" / "MNIST" / "raw", rng, gz=True)[0]
    gz = build_dataset("mnist", "train", data_dir=tmp_path / "gz")
    np.testing.assert_array_equal(np.stack([_pixels(gz[k][0]) for k in range(7)]), gz_imgs)


def test_idx_reader_rejects_broken_files(tmp_path):
    good = tmp_path / "ok-idx3-ubyte"
    good.write_bytes(_idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4)))
    np.testing.assert_array_equal(read_idx(good), np.arange(24).reshape(2, 3, 4))
    (tmp_path / "short").write_bytes(_idx_bytes(np.zeros((2, 3, 4), np.uint8))[:-1])
    with pytest.raises(ConfigError, match=r"holds 23 values, its header says \(2, 3, 4\)"):
        read_idx(tmp_path / "short")
    (tmp_path / "float").write_bytes(bytes([0, 0, 0x0D, 1, 0, 0, 0, 1]) + b"\0" * 4)
    with pytest.raises(ConfigError, match="is not an IDX file of unsigned bytes"):
        read_idx(tmp_path / "float")
    folder = tmp_path / "bad" / "MNIST" / "raw"
    write_idx_set(folder, np.random.default_rng(5))
    (folder / "train-labels-idx1-ubyte").write_bytes(b"junk")
    with pytest.raises(ConfigError, match=r"cannot read MNIST: .*train-labels-idx1-ubyte is not an IDX file"):
        build_dataset("mnist", "train", data_dir=tmp_path / "bad")


def test_fashion_mnist_debian_layout_through_data_dir(tmp_path):
    train_imgs, train_labels, _, _ = write_idx_set(tmp_path / "debian", np.random.default_rng(6), gz=True)
    train = build_dataset("fashion-mnist", "train", data_dir=tmp_path / "debian")
    assert train.root == tmp_path / "debian" and train.classes[-1] == "Ankle boot"
    np.testing.assert_array_equal(np.stack([_pixels(train[k][0]) for k in range(7)]), train_imgs)
    assert train.targets == train_labels.tolist()


def test_imagefolder_fake(tmp_path):
    written = write_imagefolder(tmp_path / "inet", np.random.default_rng(7))
    train = build_dataset("imagenet", "train", data_dir=tmp_path / "inet")
    test = build_dataset("imagenet", "test", data_dir=tmp_path / "inet")
    assert (len(train), len(test)) == (6, 3) and train.classes == ["cat", "dog", "fish"]
    assert train.info.num_classes == 3 and dataset_info("imagenet").num_classes == 1000
    assert train.targets == [0, 0, 1, 1, 2, 2] and test.targets == [0, 1, 2]
    image, label = train[3]
    assert label == 1 and image.mode == "RGB" and image.size == (9, 7)
    np.testing.assert_array_equal(_pixels(image), written[("train", "dog", 1)])
    np.testing.assert_array_equal(_pixels(test[2][0]), written[("val", "fish", 0)])
    (tmp_path / "inet" / "val" / "cow").mkdir()
    Image.fromarray(written[("val", "cat", 0)]).save(tmp_path / "inet" / "val" / "cow" / "0.png")
    with pytest.raises(ConfigError, match="the class folders of .*val differ from those of .*train"):
        build_dataset("imagenet", "test", data_dir=tmp_path / "inet")


def test_pickles_cannot_run_code(tmp_path):
    write_cifar10(tmp_path, np.random.default_rng(8))

    class Boom:
        def __reduce__(self):
            return os.system, ("touch " + str(tmp_path / "pwned"),)

    _pickle(tmp_path / "cifar-10-batches-py" / "test_batch", {"data": Boom(), "labels": []})
    with pytest.raises(ConfigError, match=r"cannot read CIFAR-10 from .* \(UnpicklingError: refusing to unpickle "
                                          r"(posix|os)\.system\)"):
        build_dataset("cifar10", "test", data_dir=tmp_path)
    assert not (tmp_path / "pwned").exists()


# ---- discovery -------------------------------------------------------------------------------------------
def _fake_fashion(folder, n_train):
    return write_idx_set(folder, np.random.default_rng(n_train), n_train=n_train, gz=True)


def test_discovery_order_data_dir_then_os_location_then_cache(tmp_path):
    _fake_fashion(tmp_path / "mine", 3)
    _fake_fashion(tmp_path / "os", 5)  # the OS location of the fixture
    _fake_fashion(tmp_path / "cache" / "FashionMNIST" / "raw", 9)  # torchvision's layout in the download cache
    assert default_cache_dir() == tmp_path / "cache"
    assert len(build_dataset("fashion-mnist", "train", data_dir=tmp_path / "mine")) == 3
    assert len(build_dataset("fashion-mnist", "train", data_dir=tmp_path / "nothing-here")) == 5
    assert len(build_dataset("fashion-mnist", "train")) == 5
    for name in os.listdir(tmp_path / "os"):
        os.remove(tmp_path / "os" / name)
    found = build_dataset("fashion-mnist", "train")
    assert len(found) == 9 and found.root == tmp_path / "cache" / "FashionMNIST" / "raw"


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("PKMIXER_DATA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "pkmixer" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "pkmixer" / "data"


def test_missing_data_is_one_line_naming_where_it_looked(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as err:
        build_dataset("cifar10", "train", data_dir=tmp_path / "empty")
    assert str(err.value) == (
        f"CIFAR-10 not found: looked for cifar-10-batches-py/ in {tmp_path / 'empty'} (data_dir), "
        f"{tmp_path / 'cache'} (download cache, missing); pass --data-dir DIR with the CIFAR-10 python batches "
        "(cifar-10-batches-py/), or --set data.download=true")
    with pytest.raises(ConfigError) as err:
        build_dataset("fashion-mnist", "test")
    assert str(err.value) == (
        "Fashion-MNIST not found: looked for {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (directly or under "
        f"FashionMNIST/raw/) in {tmp_path / 'os'} (OS location, missing), {tmp_path / 'cache'} (download cache, "
        "missing); apt-get install dataset-fashion-mnist, pass --data-dir DIR with the Fashion-MNIST IDX files "
        "(FashionMNIST/raw/ or the .gz files themselves), or --set data.download=true")
    with pytest.raises(ConfigError) as err:
        build_dataset("imagenet", "train", download=True)
    assert "\n" not in str(err.value) and str(err.value).endswith("(ImageNet cannot be downloaded automatically)")


def test_download_goes_to_data_dir_and_failures_are_one_line(tmp_path, monkeypatch):
    calls = []

    def fake_download(root):  # stands in for torchvision's download: no network in tests
        calls.append(root)
        write_cifar10(root, np.random.default_rng(9))

    fmt = D._FORMATS["cifar10"]
    monkeypatch.setitem(D._FORMATS, "cifar10", dataclasses.replace(fmt, download=fake_download))
    with pytest.raises(ConfigError, match="CIFAR-10 not found"):
        build_dataset("cifar10", "test", data_dir=tmp_path / "dl")  # download=False never downloads
    assert calls == []
    assert len(build_dataset("cifar10", "test", data_dir=tmp_path / "dl", download=True)) == 6
    assert len(build_dataset("cifar10", "test", download=True)) == 6  # without data_dir: into the cache
    assert calls == [tmp_path / "dl", tmp_path / "cache"]
    assert len(build_dataset("cifar10", "test", download=True)) == 6 and len(calls) == 2  # found, not fetched again

    def offline(root):
        raise OSError("[Errno -3] Temporary failure in name resolution\nmore detail")

    monkeypatch.setitem(D._FORMATS, "cifar100", dataclasses.replace(D._FORMATS["cifar100"], download=offline))
    with pytest.raises(ConfigError) as err:
        build_dataset("cifar100", "train", download=True)
    assert str(err.value) == (
        f"downloading CIFAR-100 into {tmp_path / 'cache'} failed (OSError: [Errno -3] Temporary failure in name "
        "resolution); pass --data-dir DIR with the CIFAR-100 python version (cifar-100-python/), "
        "or --set data.download=true")


# ---- splits ----------------------------------------------------------------------------------------------
def test_val_split_is_stratified_disjoint_and_seeded():
    full = build_dataset("digits", "train")
    train = build_dataset("digits", "train", val_fraction=0.25, seed=1)
    val = build_dataset("digits", "val", val_fraction=0.25, seed=1)
    assert set(train.indices).isdisjoint(val.indices)
    assert sorted([*train.indices, *val.indices]) == list(range(len(full)))
    counts = np.bincount(full.targets, minlength=10)
    np.testing.assert_array_equal(np.bincount(val.targets, minlength=10), np.floor(0.25 * counts + 0.5))
    assert val.targets == [full.targets[i] for i in val.indices]
    torch.testing.assert_close(val[5][0], full[int(val.indices[5])][0], rtol=0, atol=0)
    again = build_dataset("digits", "val", val_fraction=0.25, seed=1)
    other = build_dataset("digits", "val", val_fraction=0.25, seed=2)
    np.testing.assert_array_equal(again.indices, val.indices)
    assert not np.array_equal(other.indices, val.indices)
    test = build_dataset("digits", "test", val_fraction=0.25)  # the official test split is never carved
    assert len(test) == 359


def test_subsets_are_seeded_nested_and_checked():
    small = build_dataset("digits", "train", subset=50, seed=3)
    large = build_dataset("digits", "train", subset=200, seed=3)
    assert len(small) == 50 and set(small.indices) <= set(large.indices)
    assert list(small.indices) == sorted(small.indices)
    np.testing.assert_array_equal(build_dataset("digits", "train", subset=50, seed=3).indices, small.indices)
    assert not np.array_equal(build_dataset("digits", "train", subset=50, seed=4).indices, small.indices)
    val = build_dataset("digits", "val", val_fraction=0.1, subset=20)
    assert set(val.indices) <= set(build_dataset("digits", "val", val_fraction=0.1).indices)
    assert len(build_dataset("digits", "test", subset=10)) == 10
    with pytest.raises(ConfigError, match="subset 400 is larger than the 359 examples of digits test"):
        build_dataset("digits", "test", subset=400)
    with pytest.raises(ConfigError, match="subset must be a positive integer, got 0"):
        build_dataset("digits", "test", subset=0)


def test_split_option_errors(tmp_path):
    with pytest.raises(ConfigError, match="split 'val' needs val_fraction > 0"):
        build_dataset("digits", "val")
    with pytest.raises(ConfigError, match=r"val_fraction must lie in \[0, 1\), got 1.0"):
        build_dataset("digits", "train", val_fraction=1.0)
    with pytest.raises(ConfigError, match="seed must be an integer, got 1.5"):
        build_dataset("digits", "train", seed=1.5)
    write_cifar10(tmp_path, np.random.default_rng(10), per_batch=1)  # 5 training images
    with pytest.raises(ConfigError, match="val_fraction 0.01 holds out 0 of the 5 training examples of cifar10"):
        build_dataset("cifar10", "val", data_dir=tmp_path, val_fraction=0.01)


# ---- offline data sets -----------------------------------------------------------------------------------
def test_digits_are_always_there_and_split_deterministically():
    from sklearn.datasets import load_digits

    train, test = build_dataset("digits", "train", data_dir="/nonexistent"), build_dataset("digits", "test")
    assert (len(train), len(test)) == (1438, 359) and train.root is None
    image, label = test[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32 and isinstance(label, int)
    stacked = torch.cat([torch.stack([x for x, _ in split]) for split in (train, test)])
    assert float(stacked.min()) == 0.0 and float(stacked.max()) == 1.0
    # train and test together are exactly scikit-learn's images / 16, each once
    digits = load_digits()
    ours = sorted(map(bytes, stacked.numpy().reshape(1797, 64)))
    assert ours == sorted(map(bytes, (digits.images / 16).astype(np.float32).reshape(1797, 64)))
    assert np.bincount(test.targets).tolist() == np.floor(0.2 * np.bincount(digits.target) + 0.5).tolist()
    torch.testing.assert_close(build_dataset("digits", "test")[17][0], test[17][0], rtol=0, atol=0)


def test_synthetic_is_deterministic_and_learnable():
    from sklearn.linear_model import LogisticRegression

    opts = dict(img_size=16, in_chans=1, train_size=600, test_size=300, noise=0.1, max_shift=2)
    train, test = build_dataset("synthetic", "train", **opts), build_dataset("synthetic", "test", **opts)
    assert train.info.image_size == 16 and train.info.in_chans == 1 and train.info.num_classes == 10
    x_train, x_test = (torch.stack([x for x, _ in ds]).reshape(len(ds), -1).numpy() for ds in (train, test))
    assert x_train.shape == (600, 256) and x_train.min() >= 0 and x_train.max() <= 1
    assert np.bincount(train.targets).tolist() == [60] * 10
    np.testing.assert_array_equal(build_dataset("synthetic", "train", **opts)[7][0].numpy().ravel(), x_train[7])
    other_seed = build_dataset("synthetic", "train", **opts, data_seed=1)
    assert not torch.equal(other_seed[7][0], train[7][0])
    assert not any(torch.equal(test[k][0], train[k][0]) for k in range(10))  # its own stream
    bigger = build_dataset("synthetic", "test", **{**opts, "train_size": 900})
    assert torch.equal(bigger[3][0], test[3][0])  # the test set does not depend on train_size
    clf = LogisticRegression(max_iter=500).fit(x_train, train.targets)
    accuracy = clf.score(x_test, test.targets)
    constant = max(np.bincount(test.targets)) / len(test)
    assert accuracy >= 0.8 and constant <= 0.15, (accuracy, constant)


def test_synthetic_options_are_checked():
    with pytest.raises(ConfigError, match="unknown synthetic option 'img_szie'; did you mean img_size"):
        build_dataset("synthetic", "train", img_szie=8)
    with pytest.raises(ConfigError, match="option.s. img_size apply only to the synthetic data set, not to digits"):
        build_dataset("digits", "train", img_size=8)
    with pytest.raises(ConfigError, match=r"synthetic max_shift must be an integer in \[0, img_size=8\), got 8"):
        dataset_info("synthetic", img_size=8, max_shift=8)
    with pytest.raises(ConfigError, match="synthetic train_size must be a positive integer"):
        dataset_info("synthetic", train_size=-1)
    info = dataset_info("synthetic", in_chans=2, noise=0.0)
    assert info.mean == (0.5, 0.5) and info.std == pytest.approx((0.2, 0.2))


# ---- transforms ------------------------------------------------------------------------------------------
def test_transforms_give_the_models_input_shape(tmp_path):
    write_cifar10(tmp_path / "c", np.random.default_rng(11))
    write_idx_set(tmp_path / "m" / "MNIST" / "raw", np.random.default_rng(12))
    cifar = build_dataset("cifar10", "train", data_dir=tmp_path / "c")
    mnist = build_dataset("mnist", "train", data_dir=tmp_path / "m")
    digits = build_dataset("digits", "train")
    heavy = dict(crop_padding=4, hflip=True, random_erasing=0.25)
    cases = [  # (data set, model img_size, model in_chans, options)
        (cifar, 32, 3, dict(heavy, auto_augment="cifar10")),
        (cifar, 32, 1, dict(heavy, rand_augment="rand-m9-mstd0.5-inc1")),
        (cifar, 24, 3, dict(resize=28, hflip=True)),
        (mnist, 32, 3, dict(heavy, rand_augment="rand-m9-mstd0.5-inc1")),
        (mnist, 28, 1, dict(heavy, auto_augment="imagenet")),
        (digits, 16, 3, dict(heavy, auto_augment="cifar10")),
        (digits, 16, 1, dict(heavy, rand_augment="rand-n3-m10-p0.7")),
        (cifar, 16, 3, dict(random_resized_crop=(0.08, 1.0), hflip=True)),
    ]
    for ds, size, chans, options in cases:
        for train in (True, False):
            tf = build_transform(ds.info, train=train, img_size=size, in_chans=chans, **options)
            for k in range(3):
                x = tf(ds[k][0])
                assert type(x) is torch.Tensor and x.dtype == torch.float32 and x.shape == (chans, size, size)
    loader = DataLoader(build_dataset("mnist", "train", data_dir=tmp_path / "m", transform=build_transform(
        mnist.info, train=True, img_size=32, in_chans=3, crop_padding=2)), batch_size=4)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and labels.dtype == torch.int64


def test_eval_transform_normalises_with_the_data_sets_statistics():
    digits = build_dataset("digits", "train")
    tf = build_transform(digits.info, train=False, img_size=8, in_chans=1)
    x = torch.stack([tf(image) for image, _ in digits])
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01
    raw = torch.stack([image for image, _ in digits])
    torch.testing.assert_close(x, (raw - 0.3049) / 0.3759)  # 8 px to 8 px: no resampling
    as_rgb = build_transform(digits.info, train=False, img_size=8, in_chans=3)(digits[0][0])
    torch.testing.assert_close(as_rgb, x[0].expand(3, 8, 8))
    synthetic = build_dataset("synthetic", "train", img_size=8, train_size=400)
    tf = build_transform(synthetic.info, train=False, img_size=8, in_chans=3)
    y = torch.stack([tf(image) for image, _ in synthetic])
    assert abs(float(y.mean())) < 0.05 and abs(float(y.std()) - 1) < 0.1
    plain = build_transform(digits.info, train=False, img_size=8, in_chans=1, normalize=False)
    torch.testing.assert_close(plain(digits[3][0]), digits[3][0])


def test_eval_crops_on_a_non_square_image():
    # 80 px wide, 40 px high: black outer quarters (columns 0-19 and 60-79), white middle half
    pixels = np.full((40, 80), 255, np.uint8)
    pixels[:, :20] = pixels[:, 60:] = 0
    image = Image.fromarray(pixels)
    info = dataset_info("mnist")
    common = dict(train=False, img_size=32, in_chans=1, crop_pct=0.875, normalize=False, interpolation="nearest")
    squashed = build_transform(info, eval_crop="resize-crop", **common)(image)[0]
    kept = build_transform(info, eval_crop="resmall-crop", **common)(image)[0]
    assert squashed.shape == kept.shape == (32, 32)
    # resize-crop: 80×40 -> 36×36 squashes the width, the central 32 still shows both black quarters
    torch.testing.assert_close(squashed[:, :6], torch.zeros(32, 6))
    torch.testing.assert_close(squashed[:, -6:], torch.zeros(32, 6))
    torch.testing.assert_close(squashed[:, 8:24], torch.ones(32, 16))
    # resmall-crop: 80×40 -> 72×36 keeps the aspect ratio, the central 32 columns come from the white half
    torch.testing.assert_close(kept, torch.ones(32, 32))
    # without eval_crop: a square resize of the whole image, no crop; eval_crop replaces resize in evaluation
    whole = build_transform(info, **common)(image)[0]
    assert whole[:, :7].max() == 0 and whole[:, 9:23].min() == 1 and whole[:, -7:].max() == 0
    torch.testing.assert_close(build_transform(info, eval_crop="resmall-crop", resize=48, **common)(image)[0], kept)
    resized = build_transform(info, resize=48, **common)(image)[0]  # 48×48, then the central 32×32
    assert resized[:, :3].max() == 0 and resized[:, 5:27].min() == 1 and resized[:, -3:].max() == 0


def test_stl10_resizing_and_train_crops(tmp_path):
    write_stl10(tmp_path, np.random.default_rng(13))
    stl = build_dataset("stl10", "train", data_dir=tmp_path)
    assert build_transform(stl.info, train=True, img_size=90, in_chans=3, crop_padding=4)(stl[0][0]).shape \
        == (3, 90, 90)  # App. D.6
    tf = build_transform(stl.info, train=False, img_size=32, in_chans=3, normalize=False)
    reference = torch.from_numpy(np.array(stl[0][0].resize((32, 32), Image.BILINEAR))).permute(2, 0, 1) / 255
    assert float((tf(stl[0][0]) - reference).abs().mean()) < 0.02  # App. C.4: 96 px resized to 32 px


def test_rand_augment_at_full_magnitude_does_not_crash():
    image = Image.fromarray(np.random.default_rng(14).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    tf = build_transform(dataset_info("cifar10"), train=True, img_size=16, in_chans=3,
                         rand_augment="rand-m10-n4-p1.0-inc1")  # timm's posterize would keep 0 bits here
    for _ in range(200):
        assert tf(image).shape == (3, 16, 16)


@pytest.mark.parametrize("policy, bad", [
    ("rand-m9-foo", "'foo'"), ("rand-mabc", "'mabc'"), ("rand-m9.5", "'m9.5'"), ("rand-m9-mmax20", "'mmax20'"),
    ("rand-mstd.5", "'mstd.5'"), ("rand-tcolor", "'tcolor'"), ("augmix-m5", "'augmix-m5'"), ("", "''"),
])
def test_rand_augment_policy_errors(policy, bad):
    with pytest.raises(ConfigError) as err:
        build_transform(dataset_info("cifar10"), train=True, img_size=32, in_chans=3, rand_augment=policy)
    message = str(err.value)
    assert bad in message and "\n" not in message
    assert ("allowed sections: m<int> magnitude" in message) or ("must start with 'rand'" in message)


@pytest.mark.parametrize("options, message", [
    (dict(auto_augment="cifar"), "auto_augment must be one of cifar10, imagenet, svhn, got 'cifar'"),
    (dict(auto_augment="cifar10", rand_augment="rand-m9"), "auto_augment and rand_augment are both set"),
    (dict(resize=30), "resize 30 is smaller than img_size 32"),
    (dict(eval_crop="center"), "eval_crop must be one of None, resize-crop, resmall-crop, got 'center'"),
    (dict(crop_pct=0), r"crop_pct must lie in \(0, 1\], got 0"),
    (dict(crop_padding=-1), "crop_padding must be an integer >= 0 or None, got -1"),
    (dict(random_erasing=1.5), r"random_erasing must lie in \[0, 1\), got 1.5"),
    (dict(random_resized_crop=(0.5, 0.1)), "random_resized_crop must be a .min, max. area fraction"),
    (dict(random_resized_crop=(0.08, 1.0), crop_padding=4), "random_resized_crop replaces resize and crop_padding"),
    (dict(interpolation="lanczos"), "interpolation must be one of bilinear, bicubic, nearest, got 'lanczos'"),
    (dict(in_chans=2), "cannot turn 3-channel cifar10 images into in_chans=2"),
    (dict(img_size=0), "img_size must be a positive integer, got 0"),
])
def test_transform_option_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        build_transform(dataset_info("cifar10"), **{"train": True, "img_size": 32, "in_chans": 3, **options})


# ---- mixup and the loss ----------------------------------------------------------------------------------
def test_mixup_gives_soft_targets_that_sum_to_one():
    mixup = build_mixup(0.8, 1.0, 0.5, 0.1, num_classes=10)  # App. C.5
    assert isinstance(mixup, Mixup)
    torch.manual_seed(0)
    images, labels = torch.rand(8, 3, 16, 16), torch.arange(8)
    for _ in range(4):  # both mixup and cutmix are drawn
        mixed, targets = mixup(images.clone(), labels)
        assert mixed.shape == images.shape and targets.shape == (8, 10)
        torch.testing.assert_close(targets.sum(1), torch.ones(8))
        assert float(targets.min()) >= 0.1 / 10 - 1e-6 and float(targets.max()) < 1
    loss = build_loss(mixup_active=True, label_smoothing=0.1)
    assert isinstance(loss, SoftTargetCrossEntropy) and loss(torch.randn(8, 10), targets).ndim == 0
    assert build_mixup(0.0, 0.0, 0.5, 0.1, num_classes=10) is None
    assert isinstance(build_loss(False, 0.1), LabelSmoothingCrossEntropy)
    assert type(build_loss(False, 0.0)) is torch.nn.CrossEntropyLoss
    with pytest.raises(ConfigError, match="mixup_alpha must be a number >= 0, got -1"):
        build_mixup(-1, 1.0, 0.5, 0.1, 10)
    with pytest.raises(ConfigError, match=r"switch_prob must lie in \[0, 1\], got 2"):
        build_mixup(0.8, 1.0, 2, 0.1, 10)
    with pytest.raises(ConfigError, match=r"label_smoothing must lie in \[0, 1\), got 1"):
        build_loss(False, 1)


# ---- the real Fashion-MNIST that Debian installs ---------------------------------------------------------
@pytest.mark.skipif(not (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Debian's dataset-fashion-mnist is not installed (no /usr/share/datasets/fashion-mnist)")
def test_real_fashion_mnist_from_the_os_location(monkeypatch):
    monkeypatch.setitem(D._REGISTRY, "fashion-mnist", dataclasses.replace(
        D._REGISTRY["fashion-mnist"], system_dirs=(str(DEBIAN_FASHION),)))
    train = build_dataset("fashion-mnist", "train")
    assert train.root == DEBIAN_FASHION and len(train) == 60000 and train.info.num_classes == 10
    assert train.source.images.shape == (60000, 28, 28) and np.bincount(train.targets).tolist() == [6000] * 10
    pixels = train.source.images.astype(np.float64) / 255
    assert pixels.mean() == pytest.approx(train.info.mean[0], abs=1e-4)
    assert pixels.std() == pytest.approx(train.info.std[0], abs=1e-4)
    assert train[0][0].size == (28, 28) and len(build_dataset("fashion-mnist", "test")) == 10000
