"""The dataset registry: names to loaders, and ``load_dataset``.

The built-in loaders register themselves when their module is imported; the
registry imports them by name the first time it is asked for one, so importing
qtrain stays cheap and DGL / ogb load only with a dataset.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from qtrain.data.base import NodeDataset
from qtrain.registry import Registry

BUILTIN_LOADERS = ("dglfile", "hetero", "ogb", "planetoid", "synthetic")


def _load_builtin() -> None:
    """Import the built-in loaders so that they register (called once, lazily)."""
    for module in BUILTIN_LOADERS:
        importlib.import_module(f"qtrain.data.{module}")


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
