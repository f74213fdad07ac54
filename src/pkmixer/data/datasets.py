"""The data sets of the experiments: ``build_dataset(name, split, ...)`` and ``dataset_info(name)``.

Where the papers use them (Hayase & Karakida, App. C): MNIST for the shallow Kronecker / Monarch MLPs (App. C.1,
Fig. 2d); CIFAR-10 for the CKA and sparsity studies (App. C.1-C.2); CIFAR-10, CIFAR-100 and STL-10 for Table 1
and Figs. 5-7 (App. C.3-C.6, Table S.2), STL-10 resized to 32 px (App. C.4) or 90 px (App. D.6); ImageNet-1k for
Fig. 6d and Mixer-B-W (App. C.5, Table S.2) and for fine-tuning in the Mixer supplementary (Mixer supp. B, C).
Fashion-MNIST, scikit-learn's digits and a synthetic task are small offline stand-ins for runs on a laptop.

Discovery, first hit wins:

1. ``data_dir``, the user's folder;
2. the OS locations that packages install to (Debian's ``dataset-fashion-mnist``: /usr/share/datasets/fashion-mnist);
3. the download cache, ``$PKMIXER_DATA_CACHE`` or ``$XDG_CACHE_HOME/pkmixer/data`` or ``~/.cache/pkmixer/data``;
4. with ``download=True``, torchvision downloads the data into ``data_dir`` if given, else into the cache
   (not ImageNet, which torchvision cannot download).

Otherwise a :class:`ConfigError` of one line says where it looked and how to get the data. "digits" ships with
scikit-learn and "synthetic" is generated, so both are always there.

On-disk formats, read by the small readers below (torchvision's classes are used to download only: they
re-hash every file on each construction, 2.8 GB for STL-10, and refuse any file whose MD5 differs):

* cifar10: ``cifar-10-batches-py/`` with ``data_batch_1..5``, ``test_batch``, ``batches.meta`` (Python pickles,
  unpickled with NumPy arrays as the only objects allowed); cifar100: ``cifar-100-python/`` with ``train``,
  ``test``, ``meta`` (fine labels, 100 classes);
* stl10: ``stl10_binary/`` with ``train_X.bin``, ``train_y.bin``, ``test_X.bin``, ``test_y.bin`` (raw uint8,
  96×96×3 column-major images, labels 1..10) and optionally ``class_names.txt``;
* mnist, fashion-mnist: the IDX files ``{train,t10k}-{images-idx3,labels-idx1}-ubyte``, plain or ``.gz``, either in
  torchvision's ``MNIST/raw/`` (``FashionMNIST/raw/``) or directly in the folder (Debian's layout);
* imagenet: an ImageFolder tree ``<root>/train/<class>/*.JPEG`` and ``<root>/val/<class>/*``; any tree of that
  shape works, and the built split's ``info.num_classes`` is its number of class folders.

Splits: "train" and "test" are the official ones (imagenet's test split is its ``val/`` folder). "val" is a
stratified fraction ``val_fraction`` of the official training set: in each class, ⌊val_fraction · n_c + ½⌋ of
its n_c examples, drawn with ``seed``; "train" then excludes them. ``subset=N`` keeps the first N of a permutation of
the split drawn with ``seed`` (in index order), so a smaller subset is contained in a larger one.

digits: scikit-learn's 1797 grey 8×8 digits, pixel values 0..16 returned as float tensors (1, 8, 8) in [0, 1].
Its 80/20 train/test split is fixed: the stratified hold-out above with fraction 0.2 and seed 0 picks the 359
test images, the other 1438 are "train".

synthetic (options: num_classes=10, img_size=32, in_chans=3, train_size=2000, test_size=500, noise=0.2,
max_shift=img_size // 8, data_seed=0): one template per class, white noise smoothed by a periodic Gaussian filter
of width img_size / 8 and scaled to mean 0.5, standard deviation 0.2; an example is its class's template rolled
by a random shift of at most ``max_shift`` pixels along each axis, plus Gaussian pixel noise of standard deviation
``noise``, clipped to [0, 1]; labels are balanced. Templates, train and test examples come from three streams of
``data_seed``, so the test set does not depend on ``train_size``. A linear model learns it to high accuracy; a
constant guess gets 1 / num_classes. Images are float tensors (C, H, W).

Every split is a :class:`DatasetSplit` of ``(image, label)`` pairs like torchvision's data sets: a PIL image
(``L`` or ``RGB``) for stored uint8 data, a float tensor (C, H, W) in [0, 1] for digits and synthetic, before the
``transform`` (see :mod:`pkmixer.data.transforms`); ``info``, ``classes``, ``targets`` and ``root`` (where the
data was found) come with it.
"""
from __future__ import annotations

import gzip
import math
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import Dataset

from ..errors import ConfigError, check_positive_int, unknown_name

SPLITS = ("train", "val", "test")
DIGITS_TEST_FRACTION, DIGITS_SPLIT_SEED = 0.2, 0


@dataclass(frozen=True)
class DatasetInfo:
    """Facts about a data set that models and transforms need."""

    name: str
    title: str  # as people write it: "CIFAR-10"
    num_classes: int
    in_chans: int
    image_size: int | None  # side of the square images as stored; None where they vary (ImageFolder)
    mean: tuple[float, ...]  # per-channel mean and standard deviation of the pixels in [0, 1], for normalisation
    std: tuple[float, ...]
    source: str  # where the papers use it
    splits: tuple[str, ...] = SPLITS  # "val" is held out of the official training set
    system_dirs: tuple[str, ...] = ()  # where OS packages install it


_REGISTRY: dict[str, DatasetInfo] = {info.name: info for info in [
    DatasetInfo("cifar10", "CIFAR-10", 10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                "App. C.1-C.6, Table 1, Figs. 2, 5-7"),
    DatasetInfo("cifar100", "CIFAR-100", 100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
                "App. C.3-C.6, Table 1, Figs. 5-7"),
    DatasetInfo("stl10", "STL-10", 10, 3, 96, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713),
                "App. C.4-C.6, D.6, Figs. 5-7"),
    DatasetInfo("mnist", "MNIST", 10, 1, 28, (0.1307,), (0.3081,), "App. C.1, Fig. 2d"),
    DatasetInfo("fashion-mnist", "Fashion-MNIST", 10, 1, 28, (0.2860,), (0.3530,),
                "offline stand-in for MNIST", system_dirs=("/usr/share/datasets/fashion-mnist",)),
    DatasetInfo("imagenet", "ImageNet", 1000, 3, None, tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD),
                "App. C.5, Table S.2, Fig. 6d; Mixer supp. B, C"),
    DatasetInfo("digits", "scikit-learn digits", 10, 1, 8, (0.3049,), (0.3759,), "offline smoke tests"),
    DatasetInfo("synthetic", "synthetic templates", 10, 3, 32, (0.5,) * 3, (math.hypot(0.2, 0.2),) * 3,
                "offline smoke tests"),
]}


def list_datasets() -> list[str]:
    return sorted(_REGISTRY)


# ---- synthetic task ---------------------------------------------------------------------------------------
SYNTHETIC_CONTRAST = 0.2  # pixel standard deviation of a template


@dataclass(frozen=True)
class SyntheticOptions:
    """The generator's options (module docstring); ``max_shift=None`` means img_size // 8."""

    num_classes: int = 10
    img_size: int = 32
    in_chans: int = 3
    train_size: int = 2000
    test_size: int = 500
    noise: float = 0.2
    max_shift: int | None = None
    data_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_classes", "img_size", "in_chans", "train_size", "test_size"):
            check_positive_int(f"synthetic {name}", getattr(self, name))
        if isinstance(self.noise, bool) or not isinstance(self.noise, (int, float)) or not self.noise >= 0:
            raise ConfigError(f"synthetic noise must be a number >= 0, got {self.noise!r}")
        shift = self.max_shift
        if shift is not None and (isinstance(shift, bool) or not isinstance(shift, int)
                                  or not 0 <= shift < self.img_size):
            raise ConfigError(f"synthetic max_shift must be an integer in [0, img_size={self.img_size}), got {shift!r}")
        _check_int("synthetic data_seed", self.data_seed)

    @property
    def shift(self) -> int:
        return self.img_size // 8 if self.max_shift is None else self.max_shift


def _synthetic_options(options: dict[str, Any]) -> SyntheticOptions:
    allowed = list(SyntheticOptions.__dataclass_fields__)
    for key in options:
        if key not in allowed:
            raise unknown_name("synthetic option", key, allowed)
    return SyntheticOptions(**options)


def _synthetic(opts: SyntheticOptions, train: bool) -> ArrayImages:
    K, C, H = opts.num_classes, opts.in_chans, opts.img_size
    from scipy.ndimage import gaussian_filter

    white = np.random.default_rng([opts.data_seed, 0]).standard_normal((K, C, H, H))
    smooth = gaussian_filter(white, sigma=(0, 0, H / 8, H / 8), mode="wrap")  # periodic, so rolling is seamless
    smooth -= smooth.mean(axis=(1, 2, 3), keepdims=True)
    smooth /= smooth.std(axis=(1, 2, 3), keepdims=True)
    templates = (0.5 + SYNTHETIC_CONTRAST * smooth).astype(np.float32)  # (K, C, H, H)

    n = opts.train_size if train else opts.test_size
    rng = np.random.default_rng([opts.data_seed, 1 if train else 2])
    labels = rng.permutation(np.arange(n) % K)
    shifts = rng.integers(-opts.shift, opts.shift + 1, size=(n, 2))
    rows = (np.arange(H)[None] - shifts[:, :1]) % H  # (n, H): source row of each output row
    cols = (np.arange(H)[None] - shifts[:, 1:]) % H
    images = templates[labels[:, None, None, None], np.arange(C)[None, :, None, None],
                       rows[:, None, :, None], cols[:, None, None, :]]  # (n, C, H, H)
    images += opts.noise * rng.standard_normal(images.shape, dtype=np.float32)
    return ArrayImages(torch.from_numpy(np.clip(images, 0, 1)), labels, [f"template {k}" for k in range(K)])


def _digits(train: bool) -> ArrayImages:
    from sklearn.datasets import load_digits

    digits = load_digits()
    test = _stratified_holdout(digits.target, DIGITS_TEST_FRACTION, np.random.default_rng(DIGITS_SPLIT_SEED))
    chosen = np.setdiff1d(np.arange(len(digits.target)), test) if train else test
    images = torch.from_numpy((digits.images[chosen] / 16).astype(np.float32))[:, None]  # (N, 1, 8, 8)
    return ArrayImages(images, digits.target[chosen], [str(d) for d in range(10)])


def dataset_info(name: str, **synthetic_options: Any) -> DatasetInfo:
    """The facts of a registered data set; for "synthetic", of the task the options describe."""
    if name not in _REGISTRY:
        raise unknown_name("data set", name, _REGISTRY)
    info = _REGISTRY[name]
    if name != "synthetic":
        if synthetic_options:
            raise ConfigError(f"option(s) {', '.join(sorted(synthetic_options))} apply only to the synthetic data "
                              f"set, not to {name}")
        return info
    opts = _synthetic_options(synthetic_options)
    C = opts.in_chans
    return replace(info, num_classes=opts.num_classes, in_chans=C, image_size=opts.img_size, mean=(0.5,) * C,
                   std=(math.hypot(SYNTHETIC_CONTRAST, opts.noise),) * C)


# ---- in-memory images and splits --------------------------------------------------------------------------
class ArrayImages(Dataset):
    """Images held in memory: uint8 (N, H, W) or (N, H, W, 3) arrays give PIL images as torchvision's data sets
    do; a float tensor (N, C, H, W) gives tensors."""

    def __init__(self, images: np.ndarray | torch.Tensor, targets: Sequence[int], classes: Sequence[str]) -> None:
        if len(images) != len(targets):
            raise ConfigError(f"{len(images)} images but {len(targets)} labels")
        self.images = images
        self.targets = [int(t) for t in targets]
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Image.Image | torch.Tensor, int]:
        image = self.images[index]
        return (image if isinstance(image, torch.Tensor) else Image.fromarray(image)), self.targets[index]


class DatasetSplit(Dataset):
    """One split of a data set: ``(transform(image), label)`` for the chosen ``indices`` of ``source``."""

    def __init__(self, source: Dataset, indices: np.ndarray, *, info: DatasetInfo, split: str, root: Path | None,
                 transform: Callable[[Any], Any] | None) -> None:
        self.source = source
        self.indices = indices
        self.info = info
        self.split = split
        self.root = root  # the folder the data was read from; None for generated data
        self.transform = transform
        self.classes: list[str] = list(source.classes)
        targets = source.targets
        self.targets: list[int] = [int(targets[i]) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.source[int(self.indices[index])]
        return (image if self.transform is None else self.transform(image)), label

    def __repr__(self) -> str:
        where = "generated" if self.root is None else f"from {self.root}"
        return f"DatasetSplit({self.info.name} {self.split}: {len(self)} examples, {where})"


def _stratified_holdout(targets: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of round(fraction · n_c) examples of each class c, drawn by ``rng``."""
    targets = np.asarray(targets)
    order = rng.permutation(len(targets))
    held = [members[:math.floor(fraction * len(members) + 0.5)]
            for c in np.unique(targets) for members in [order[targets[order] == c]]]
    return np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)


# ---- readers of the on-disk formats -----------------------------------------------------------------------
_IDX_TYPES = {0x08: np.uint8}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (LeCun's MNIST format; gzip-compressed if the name ends in .gz) as a NumPy array."""
    path = Path(path)
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ConfigError(f"{path} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=_IDX_TYPES[raw[2]], offset=4 + 4 * ndim)
    if data.size != math.prod(shape):
        raise ConfigError(f"{path} holds {data.size} values, its header says {shape}")
    return data.reshape(shape)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and NumPy arrays only, so that a data folder cannot run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        entry = _ArrayUnpickler(f, encoding="latin1").load()
    if not isinstance(entry, dict):
        raise ConfigError(f"{path} does not hold a dictionary")
    return entry


@dataclass(frozen=True)
class _DiskFormat:
    looked_for: str  # what a folder must hold, for the error message
    hint: str  # how to get the data
    find: Callable[[Path, bool], Path | None]  # (root, train split?) -> the folder holding the files
    read: Callable[[Path, bool], Dataset]  # (that folder, train split?) -> images with .targets and .classes
    download: Callable[[Path], object] | None  # root -> downloads the data under root


def _first_with(candidates: Sequence[Path], files: Sequence[str]) -> Path | None:
    return next((d for d in candidates if all((d / f).is_file() for f in files)), None)


def _cifar(folder: str, files: dict[bool, tuple[str, ...]], meta: str, label_key: str, names_key: str,
           tv_class: type, hint: str) -> _DiskFormat:
    def find(root: Path, train: bool) -> Path | None:
        return _first_with([root / folder, root], [*files[train], meta])

    def read(where: Path, train: bool) -> Dataset:
        images, labels = [], []
        for name in files[train]:
            entry = _unpickle(where / name)
            images.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(entry[label_key])
        classes = _unpickle(where / meta)[names_key]
        return ArrayImages(np.concatenate(images).transpose(0, 2, 3, 1), labels, classes)  # (N, 32, 32, 3)

    return _DiskFormat(f"{folder}/", hint, find, read, lambda root: tv_class(str(root), train=True, download=True))


_STL10_FILES = {True: ("train_X.bin", "train_y.bin"), False: ("test_X.bin", "test_y.bin")}
_STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def _stl10_find(root: Path, train: bool) -> Path | None:
    return _first_with([root / "stl10_binary", root], _STL10_FILES[train])


def _stl10_read(where: Path, train: bool) -> Dataset:
    images_file, labels_file = _STL10_FILES[train]
    raw = np.fromfile(where / images_file, dtype=np.uint8)
    if raw.size % (3 * 96 * 96):
        raise ConfigError(f"{where / images_file} is not a whole number of 96×96×3 images")
    images = raw.reshape(-1, 3, 96, 96).transpose(0, 3, 2, 1)  # stored (N, C, W, H), column-major -> (N, H, W, C)
    labels = np.fromfile(where / labels_file, dtype=np.uint8).astype(np.int64) - 1  # stored 1..10
    names = where / "class_names.txt"
    classes = names.read_text().split() if names.is_file() else _STL10_CLASSES
    return ArrayImages(images, labels, classes)


_IDX_FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _idx_file(folder: Path, name: str) -> Path | None:
    return next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)


def _mnist_like(tv_folder: str, tv_class: type, hint: str) -> _DiskFormat:
    def find(root: Path, train: bool) -> Path | None:
        return next((d for d in (root / tv_folder / "raw", root)
                     if all(_idx_file(d, name) for name in _IDX_FILES[train])), None)

    def read(where: Path, train: bool) -> Dataset:
        images, labels = (read_idx(_idx_file(where, name)) for name in _IDX_FILES[train])
        if images.ndim != 3 or labels.ndim != 1:
            raise ConfigError(f"{where} holds IDX arrays of shapes {images.shape} and {labels.shape}, "
                              "not (N, H, W) images and (N,) labels")
        return ArrayImages(images, labels, tv_class.classes)

    looked_for = f"{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz] (directly or under {tv_folder}/raw/)"
    return _DiskFormat(looked_for, hint, find, read, lambda root: tv_class(str(root), train=True, download=True))


def _imagefolder_find(root: Path, train: bool) -> Path | None:
    return root if (root / "train").is_dir() and (train or (root / "val").is_dir()) else None


def _imagefolder_read(where: Path, train: bool) -> Dataset:
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import find_classes

    images = ImageFolder(str(where / ("train" if train else "val")))
    if not train and images.classes != find_classes(where / "train")[0]:
        raise ConfigError(f"the class folders of {where / 'val'} differ from those of {where / 'train'}")
    return images


_DOWNLOAD = "or --set data.download=true"
_FORMATS = {
    "cifar10": _cifar("cifar-10-batches-py", {True: tuple(f"data_batch_{i}" for i in range(1, 6)),
                                              False: ("test_batch",)}, "batches.meta", "labels", "label_names",
                      torchvision.datasets.CIFAR10,
                      f"pass --data-dir DIR with the CIFAR-10 python batches (cifar-10-batches-py/), {_DOWNLOAD}"),
    "cifar100": _cifar("cifar-100-python", {True: ("train",), False: ("test",)}, "meta", "fine_labels",
                       "fine_label_names", torchvision.datasets.CIFAR100,
                       f"pass --data-dir DIR with the CIFAR-100 python version (cifar-100-python/), {_DOWNLOAD}"),
    "stl10": _DiskFormat("stl10_binary/", f"pass --data-dir DIR with the STL-10 binary files (stl10_binary/), "
                         f"{_DOWNLOAD}", _stl10_find, _stl10_read,
                         lambda root: torchvision.datasets.STL10(str(root), split="train", download=True)),
    "mnist": _mnist_like("MNIST", torchvision.datasets.MNIST,
                         f"pass --data-dir DIR with the MNIST IDX files (MNIST/raw/), {_DOWNLOAD}"),
    "fashion-mnist": _mnist_like("FashionMNIST", torchvision.datasets.FashionMNIST,
                                 "apt-get install dataset-fashion-mnist, pass --data-dir DIR with the Fashion-MNIST "
                                 f"IDX files (FashionMNIST/raw/ or the .gz files themselves), {_DOWNLOAD}"),
    "imagenet": _DiskFormat("train/<class>/ and val/<class>/ image folders",
                            "pass --data-dir DIR with DIR/train/<class>/*.JPEG and DIR/val/<class>/* "
                            "(ImageNet cannot be downloaded automatically)",
                            _imagefolder_find, _imagefolder_read, None),
}


def default_cache_dir() -> Path:
    """Where downloads go without ``data_dir``: $PKMIXER_DATA_CACHE, else $XDG_CACHE_HOME/pkmixer/data, else
    ~/.cache/pkmixer/data."""
    if os.environ.get("PKMIXER_DATA_CACHE"):
        return Path(os.environ["PKMIXER_DATA_CACHE"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "pkmixer" / "data"


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _locate(info: DatasetInfo, fmt: _DiskFormat, train: bool, data_dir: str | os.PathLike | None,
            download: bool) -> Path:
    places = [(Path(data_dir).expanduser(), "data_dir")] if data_dir is not None else []
    places += [(Path(d), "OS location") for d in info.system_dirs]
    cache = default_cache_dir()
    places.append((cache, "download cache"))
    for root, _ in places:
        if (found := fmt.find(root, train)) is not None:
            return found
    if download and fmt.download is not None:
        target = places[0][0] if data_dir is not None else cache
        try:
            fmt.download(target)
        except (OSError, RuntimeError, ValueError) as err:
            raise ConfigError(f"downloading {info.title} into {target} failed ({_one_line(err)}); {fmt.hint}") from err
        if (found := fmt.find(target, train)) is not None:
            return found
        raise ConfigError(f"downloaded {info.title} into {target} but found no {fmt.looked_for} there; {fmt.hint}")
    where = ", ".join(f"{root} ({why}{'' if root.is_dir() else ', missing'})" for root, why in places)
    raise ConfigError(f"{info.title} not found: looked for {fmt.looked_for} in {where}; {fmt.hint}")


def _read(info: DatasetInfo, fmt: _DiskFormat, where: Path, train: bool) -> Dataset:
    try:
        return fmt.read(where, train)
    except ConfigError as err:
        raise ConfigError(f"cannot read {info.title}: {err}") from err
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as err:
        raise ConfigError(f"cannot read {info.title} from {where} ({_one_line(err)})") from err


# ---- the entry point --------------------------------------------------------------------------------------
def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    return value


def build_dataset(name: str, split: str, *, data_dir: str | os.PathLike | None = None, download: bool = False,
                  transform: Callable[[Any], Any] | None = None, val_fraction: float = 0.0,
                  subset: int | None = None, seed: int = 0, **synthetic_options: Any) -> DatasetSplit:
    """The ``split`` ("train", "val" or "test") of data set ``name``, found, held out and subsetted as the module
    docstring says; ``synthetic_options`` describe the synthetic task. ``data_dir`` and ``download`` do not
    concern digits and synthetic, which are always there."""
    info = dataset_info(name, **synthetic_options)
    if split not in info.splits:
        raise unknown_name("split", split, info.splits)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 <= val_fraction < 1:
        raise ConfigError(f"val_fraction must lie in [0, 1), got {val_fraction!r}")
    if split == "val" and val_fraction == 0:
        raise ConfigError("split 'val' needs val_fraction > 0, the fraction of the training set to hold out")
    if subset is not None:
        check_positive_int("subset", subset)
    _check_int("seed", seed)
    if not isinstance(download, bool):
        raise ConfigError(f"download must be true or false, got {download!r}")

    train = split != "test"
    root = None
    if name == "digits":
        source = _digits(train)
    elif name == "synthetic":
        source = _synthetic(_synthetic_options(synthetic_options), train)
    else:
        fmt = _FORMATS[name]
        root = _locate(info, fmt, train, data_dir, download)
        source = _read(info, fmt, root, train)
    if name == "imagenet":
        info = replace(info, num_classes=len(source.classes))
    targets = np.asarray(source.targets, dtype=np.int64)
    if len(targets) and not (targets.min() >= 0 and targets.max() < info.num_classes):
        raise ConfigError(f"{info.title} in {root} has labels {targets.min()}..{targets.max()}, "
                          f"outside 0..{info.num_classes - 1}")

    indices = np.arange(len(targets))
    if train and val_fraction > 0:
        held = _stratified_holdout(targets, val_fraction, np.random.default_rng([seed, 0]))
        if len(held) in (0, len(targets)):
            raise ConfigError(f"val_fraction {val_fraction} holds out {len(held)} of the {len(targets)} training "
                              f"examples of {name}; choose a fraction that leaves both splits non-empty")
        indices = held if split == "val" else np.setdiff1d(indices, held)
    if subset is not None:
        if subset > len(indices):
            raise ConfigError(f"subset {subset} is larger than the {len(indices)} examples of {name} {split}")
        indices = np.sort(np.random.default_rng([seed, 1]).permutation(indices)[:subset])
    return DatasetSplit(source, indices, info=info, split=split, root=root, transform=transform)
