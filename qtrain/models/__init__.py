"""Model registry: recipe names to DGL models built from ``dgl.nn`` modules.

``build_model(section, dataset)`` turns a recipe's ``[model]`` table into a
``GNNModel`` sized for the dataset. Importing this package is cheap: the model
modules (and DGL) load on first use of the registry. Besides the built-in
models, a recipe can name a user's class as ``package.module:Class`` or an
installed package's ``qtrain.models`` entry point (``qtrain.models.user``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from qtrain.errors import RecipeError
from qtrain.models.base import GNNModel
from qtrain.models.user import ENTRY_POINT_GROUP, entry_for, import_class, is_reference
from qtrain.registry import Entry, Registry

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
    "rgcn": (
        "rgcn",
        "RGCN",
        "RGCNOptions",
        "RGCN: RelGraphConv layers, a weight per relation (relational datasets)",
    ),
    "rgat": (
        "rgat",
        "RGAT",
        "RGATOptions",
        "RGAT: per-relation messages and attention, as Hector evaluates it (relational datasets)",
    ),
    "hgt": (
        "hgt",
        "HGT",
        "HGTOptions",
        "HGT: HGTConv layers, typed by node and edge type (relational datasets)",
    ),
}


# entry points that failed to load: named when a recipe asks for them
_BROKEN_ENTRY_POINTS: dict[str, str] = {}


def _load() -> None:
    """Import the built-in model modules and register them (DGL loads here), then the
    models installed packages declare in the ``qtrain.models`` entry-point group."""
    for name, (module_name, cls_name, opts_name, summary) in _BUILTIN.items():
        module = importlib.import_module(f"qtrain.models.{module_name}")
        MODELS.add(
            name, getattr(module, cls_name), options=getattr(module, opts_name), summary=summary
        )
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _BUILTIN:
            continue
        try:
            entry = entry_for(ep.name, ep.load())
        except Exception as exc:  # a broken package must not break the built-in models
            _BROKEN_ENTRY_POINTS[ep.name] = f"entry point {ep.value!r}: {exc}"
            continue
        MODELS.add(ep.name, entry.factory, options=entry.options, summary=entry.summary)


def _resolve(name: str) -> Entry[ModelFactory] | None:
    """A ``module:Class`` name's entry; the reason a broken entry point failed."""
    if name in _BROKEN_ENTRY_POINTS:
        raise RecipeError(f"model {name!r} could not be loaded: {_BROKEN_ENTRY_POINTS[name]}")
    if is_reference(name):
        return entry_for(name, import_class(name))
    return None


MODELS: Registry[ModelFactory] = Registry("model", loader=_load, resolve=_resolve)


def build_model(section: Any, dataset: Any) -> GNNModel:
    """The model a recipe's ``[model]`` section names, sized for ``dataset`` (and built for
    its node and edge types, when the model is relational)."""
    entry = MODELS.get(section.name)
    if getattr(entry.factory, "needs_relations", False):
        if dataset.relations is None:
            raise RecipeError(
                f"model {section.name!r} is relational: it needs a dataset with node and edge "
                f"types (such as synthetic-hetero-small), and {dataset.name!r} has one of each"
            )
        return entry.factory(
            dataset.num_features, dataset.num_classes, section.options, dataset.relations
        )
    return entry.factory(dataset.num_features, dataset.num_classes, section.options)


__all__ = ["MODELS", "GNNModel", "build_model"]
