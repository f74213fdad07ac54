"""The data layer of the training harness: data sets found on disk, in the OS or downloaded (App. C), and their
input pipelines (App. C.4-C.5, Table S.2; Mixer supp. B, C), with big_vision's RandAugment (Mixer supp. B); for
in-memory data sets, device-resident tensors and batched augmentation."""
from .batch_augment import BatchAugment, build_batch_augment
from .datasets import (
    DatasetInfo,
    DatasetSplit,
    SyntheticOptions,
    build_dataset,
    dataset_info,
    default_cache_dir,
    list_datasets,
    read_idx,
)
from .randaugment import RandAugment
from .resident import ResidentBatches, ResidentSplit, load_resident, to_resident
from .transforms import build_loss, build_mixup, build_transform, check_rand_augment, natural_images

__all__ = ["BatchAugment", "DatasetInfo", "DatasetSplit", "RandAugment", "ResidentBatches", "ResidentSplit",
           "SyntheticOptions", "build_batch_augment", "build_dataset", "build_loss", "build_mixup", "build_transform",
           "check_rand_augment", "dataset_info", "default_cache_dir", "list_datasets", "load_resident", "to_resident",
           "natural_images", "read_idx"]
