"""The data layer of the training harness: data sets found on disk, in the OS or downloaded (App. C), and their
input pipelines (App. C.4-C.5, Table S.2; Mixer supp. B, C), with big_vision's RandAugment (Mixer supp. B)."""
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
from .transforms import build_loss, build_mixup, build_transform, check_rand_augment, natural_images

__all__ = ["DatasetInfo", "DatasetSplit", "RandAugment", "SyntheticOptions", "build_dataset", "build_loss",
           "build_mixup", "build_transform", "check_rand_augment", "dataset_info", "default_cache_dir",
           "list_datasets", "natural_images", "read_idx"]
