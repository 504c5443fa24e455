"""Datasets (readers, on-disk cache), partitioners and local validation splits."""

from raysim.data.partition import PARTITIONERS, SCHEMES, natural_partition, partition, partition_stats, train_val_split
from raysim.data.registry import (
    DATASETS,
    ArrayDataset,
    DatasetInfo,
    DatasetNotFoundError,
    dataset_names,
    load_dataset,
    register_dataset,
    to_float_tensor,
)

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "DatasetInfo",
    "DatasetNotFoundError",
    "dataset_names",
    "load_dataset",
    "register_dataset",
    "to_float_tensor",
    "PARTITIONERS",
    "SCHEMES",
    "natural_partition",
    "partition",
    "partition_stats",
    "train_val_split",
]
