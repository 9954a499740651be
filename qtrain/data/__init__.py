"""The dataset registry: every name a recipe's ``[dataset]`` table can use.

Loaders register themselves when their module is imported; the registry
imports them the first time it is asked for a name, so ``import qtrain``
stays cheap and DGL / ogb are imported only when a dataset is loaded.
"""

from __future__ import annotations

from qtrain.data.base import (
    FEAT,
    LABEL,
    TEST_MASK,
    TRAIN_MASK,
    VAL_MASK,
    NodeDataset,
    data_dir,
    index_mask,
)
from qtrain.data.registry import DATASETS, load_dataset

__all__ = [
    "DATASETS",
    "FEAT",
    "LABEL",
    "TEST_MASK",
    "TRAIN_MASK",
    "VAL_MASK",
    "NodeDataset",
    "data_dir",
    "index_mask",
    "load_dataset",
]
