"""Model registry: recipe names to DGL models built from ``dgl.nn`` modules.

``build_model(section, dataset)`` turns a recipe's ``[model]`` table into a
``GNNModel`` sized for the dataset. Importing this package is cheap: the model
modules (and DGL) load on first use of the registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from qtrain.models.base import GNNModel
from qtrain.registry import Registry

ModelFactory = Callable[[int, int, Any], GNNModel]

_BUILTIN = {
    # name: (module, class, options class, summary)
    "gcn": (
        "gcn",
        "GCN",
        "GCNOptions",
        "GCN: GraphConv layers, symmetric normalisation, self-loops",
    ),
    "sage": (
        "sage",
        "SAGE",
        "SAGEOptions",
        "GraphSAGE: SAGEConv layers (mean / gcn / pool / lstm)",
    ),
    "gat": ("gat", "GAT", "GATOptions", "GAT: multi-head GATConv layers, heads concatenated"),
    "gcnii": ("gcnii", "GCNII", "GCNIIOptions", "GCNII: deep GCN2Conv stack (full-graph only)"),
}


def _load() -> None:
    """Import the built-in model modules and register them (DGL loads here)."""
    for name, (module_name, cls_name, opts_name, summary) in _BUILTIN.items():
        module = importlib.import_module(f"qtrain.models.{module_name}")
        MODELS.add(
            name, getattr(module, cls_name), options=getattr(module, opts_name), summary=summary
        )


MODELS: Registry[ModelFactory] = Registry("model", loader=_load)


def build_model(section: Any, dataset: Any) -> GNNModel:
    """The model a recipe's ``[model]`` section names, sized for ``dataset``."""
    entry = MODELS.get(section.name)
    return entry.factory(dataset.num_features, dataset.num_classes, section.options)


__all__ = ["MODELS", "GNNModel", "build_model"]
