"""The dataset registry: every name a recipe's ``[dataset]`` table can use.

Loaders register themselves when their module is imported; the registry
imports them the first time it is asked for a name, so ``import qtrain``
stays cheap and DGL / ogb are imported only when a dataset is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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
from qtrain.registry import Registry


def _load_builtin() -> None:
    """Import the built-in loaders so that they register (called once, lazily)."""
    from qtrain.data import dglfile, ogb, planetoid, synthetic  # noqa: F401


DATASETS: Registry[Callable[[Any], NodeDataset]] = Registry("dataset", loader=_load_builtin)


def load_dataset(name: str, options: Any = None) -> NodeDataset:
    """Load dataset ``name`` with ``options``.

    ``options`` is the entry's options dataclass (what the recipe parsed), or
    a plain mapping / None, which is validated against the entry's options
    with the entry's own defaults (so ``synthetic-small`` keeps its preset).
    """
    entry = DATASETS.get(name)
    if options is None or isinstance(options, Mapping):
        options = entry.parse(dict(options or {}), "dataset")
    elif not isinstance(options, entry.options):
        raise TypeError(
            f"dataset {name!r} takes {entry.options.__name__}, not {type(options).__name__}"
        )
    return entry.factory(options)


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
