"""A user's own model in a recipe: ``[model] name = "package.module:Class"``, or the name
of an installed package's ``qtrain.models`` entry point.

The class is built as ``Class(in_feats, num_classes, ...)`` with the dataset's
sizes, and its options are the other keys of ``[model]``:

* a class with an ``Options`` dataclass (fields declared with
  ``qtrain.config.option``, as the built-in models do) gets one instance of it:
  ``Class(in_feats, num_classes, options)``, validated, listed and written to the
  resolved recipe like a built-in model's options;
* any other class gets its constructor's keyword parameters after the first two,
  checked against the signature (types where they are annotated as
  int / float / bool / str / list, defaults from the signature):
  ``Class(in_feats, num_classes, hidden=64)``.

A ``qtrain.models.GNNModel`` subclass trains in every mode it supports. Any other
``torch.nn.Module`` whose ``forward(graph, features)`` returns logits trains
full-graph: qtrain wraps it, and its ``layers`` (a ``ModuleList``) and
``output_layer``, where it has them, are what calibration and tango's FP32 output
layer use.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Callable
from typing import Any

from torch import nn

from qtrain.config import option
from qtrain.errors import RecipeError
from qtrain.models.base import GNNModel
from qtrain.registry import Entry

ENTRY_POINT_GROUP = "qtrain.models"
_PLAIN = (int, float, bool, str)


def is_reference(name: str) -> bool:
    """Whether a model name is a ``module:Class`` reference (built-in names have no colon)."""
    return ":" in name


def import_class(reference: str) -> type:
    """The class ``package.module:Class`` names, or a RecipeError saying what failed."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise RecipeError(
            f"model.name = {reference!r}: a user model is named 'package.module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error importing it is theirs to see
        raise RecipeError(
            f"model.name = {reference!r}: cannot import {module_name!r} "
            f"({type(exc).__name__}: {exc}); is it on PYTHONPATH?"
        ) from None
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise RecipeError(f"model.name = {reference!r}: {module_name} has no {attr!r}")
    return found


def _option_type(annotation: Any) -> Any:
    """The recipe type of a constructor parameter: checked where it is a TOML scalar or
    a list of them, anything otherwise."""
    if annotation in _PLAIN:
        return annotation
    if typing.get_origin(annotation) is list and all(
        a in _PLAIN for a in typing.get_args(annotation)
    ):
        return annotation
    return Any


def options_from_signature(cls: type, name: str) -> type:
    """A frozen options dataclass of ``cls``'s keyword parameters after the first two."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError) as exc:
        raise RecipeError(
            f"model {name!r}: cannot read the constructor's signature ({exc})"
        ) from None
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) < 2:
        raise RecipeError(
            f"model {name!r}: the constructor must take (in_feats, num_classes, ...) "
            f"first; it takes ({', '.join(p.name for p in params)})"
        )
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: the options go through unchecked
        hints = {}
    fields = []
    for p in params[2:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        tp = _option_type(hints.get(p.name, Any))
        default = dataclasses.MISSING if p.default is p.empty else p.default
        fields.append((p.name, tp, option(default, f"{cls.__name__}({p.name}=...)")))
    return dataclasses.make_dataclass(f"{cls.__name__}Options", fields, frozen=True)


class ModuleModel(GNNModel):
    """A user's ``nn.Module`` with ``forward(graph, features)``, trained full-graph."""

    supports_minibatch = False

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    @property  # the user's own layers, not a second registration of them
    def layers(self) -> nn.ModuleList:  # type: ignore[override]
        found = getattr(self.module, "layers", None)
        return found if isinstance(found, nn.ModuleList) else nn.ModuleList()

    @property
    def output_layer(self) -> nn.Module | None:  # type: ignore[override]
        found = getattr(self.module, "output_layer", None)
        if isinstance(found, nn.Module):
            return found
        layers = self.layers
        return layers[-1] if len(layers) else None

    def prepare_graph(self, graph: Any) -> Any:
        prepare = getattr(self.module, "prepare_graph", None)
        return prepare(graph) if callable(prepare) else graph

    def forward(self, graph_or_blocks: Any, x: Any) -> Any:
        return self.module(graph_or_blocks, x)


def entry_for(name: str, cls: Any) -> Entry[Callable[..., GNNModel]]:
    """The registry entry of a user's model class."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise RecipeError(f"model {name!r} is {cls!r}, not a torch.nn.Module class")
    declared = getattr(cls, "Options", None)
    gnn = issubclass(cls, GNNModel)

    if declared is not None and dataclasses.is_dataclass(declared):
        options: type = declared

        def build(in_feats: int, num_classes: int, opts: Any) -> GNNModel:
            made = cls(in_feats, num_classes, opts)
            return made if gnn else ModuleModel(made)

    else:
        options = options_from_signature(cls, name)

        def build(in_feats: int, num_classes: int, opts: Any) -> GNNModel:
            kwargs = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
            made = cls(in_feats, num_classes, **kwargs)
            return made if gnn else ModuleModel(made)

    # what check_launchable and the trainer ask of a factory before building it
    build.supports_minibatch = gnn and cls.supports_minibatch  # type: ignore[attr-defined]
    doc = (inspect.getdoc(cls) or "").strip().splitlines()
    summary = doc[0] if doc else f"{cls.__module__}.{cls.__qualname__}"
    return Entry(name, build, options, summary)
