"""``qtrain.patch``: a recipe's plugins around a user's own training loop.

It takes the forms a Python user writes (a plugin name, names, a ``[quant]`` table
as a dict, a QuantSection or a whole Recipe), validates them as a recipe's
``[quant]`` section is validated, and returns the plugins ready to enter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from qtrain.errors import PluginError, RecipeError
from qtrain.plugin import PatchSession, PluginContext
from qtrain.recipe import QuantSection, Recipe, parse_quant


def quant_section(policy: Any, options: Mapping[str, Any]) -> QuantSection:
    """Turn the forms ``qtrain.patch`` accepts into a validated QuantSection."""
    if isinstance(policy, Recipe):
        policy = policy.quant
    if isinstance(policy, QuantSection):
        if options:
            raise PluginError("options go in the QuantSection, not as keywords")
        return policy
    if policy is None:
        table: dict[str, Any] = {"plugin": []}
    elif isinstance(policy, str):
        table = {"plugin": [policy], policy: dict(options)}
    elif isinstance(policy, Iterable) and not isinstance(policy, Mapping):
        names = list(policy)
        if options:
            raise PluginError("keyword options need a single plugin name; pass a dict for several")
        table = {"plugin": names}
    elif isinstance(policy, Mapping):
        table = dict(policy)
        if options:
            raise PluginError("keyword options need a single plugin name; put them in the dict")
    else:
        raise PluginError(
            "qtrain.patch takes a plugin name, a list of names, a [quant] table as a dict, "
            f"a QuantSection or a Recipe, not {type(policy).__name__}"
        )
    try:
        return parse_quant(table)
    except RecipeError as exc:
        raise PluginError(str(exc)) from None


def patch(
    policy: Any = None,
    /,
    *,
    seed: int = 0,
    output_layer: torch.nn.Module | None = None,
    **options: Any,
) -> PatchSession:
    """Patch DGL for a user's own training loop.

    ``with qtrain.patch("trace") as session: train(model)`` or
    ``qtrain.patch({"plugin": ["tango", "exact"], "tango": {"bits": 8}})``.
    ``output_layer`` is the module whose output feeds the softmax: tango keeps it in
    float32 (``fp32_before_softmax``, as ``qtrain run`` does for its built-in models);
    without it nothing is kept and the report says so. ``bits = "auto"`` needs the
    model and dataset that ``qtrain run`` has, and is refused here with that reason.
    """
    if output_layer is not None and not isinstance(output_layer, torch.nn.Module):
        raise PluginError(
            f"output_layer must be a torch.nn.Module, not {type(output_layer).__name__}"
        )
    context = PluginContext(seed=seed, output_layer=output_layer)
    return PatchSession(quant_section(policy, options), context)
