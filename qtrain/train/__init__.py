"""Training: ``execute(recipe)`` runs one recipe end to end and returns its summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qtrain.recipe import Recipe
    from qtrain.train.progress import Reporter


def execute(recipe: Recipe, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run ``recipe`` (see ``qtrain.train.runner.execute``); imports torch and DGL on first call."""
    from qtrain.train.runner import execute as _execute

    return _execute(recipe, reporter)


__all__ = ["execute"]
