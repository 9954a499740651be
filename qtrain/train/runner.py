"""``qtrain run`` and ``qtrain calibrate`` from a validated recipe: in this process, or as
the distributed workers ``[distributed]`` asks for (``qtrain.distributed.launch``).

Bad input (a mode the model cannot train in, fanouts that do not match the layers,
a device that is not there) raises a ``RecipeError`` before a run directory exists;
what a run directory then always holds is ``qtrain.train.training``'s business.
"""

from __future__ import annotations

from typing import Any

from qtrain.calibrate import DEFAULT_TARGET, Calibration, calibrate_model
from qtrain.recipe import Recipe
from qtrain.train.prepare import prepared
from qtrain.train.progress import Reporter, make_reporter
from qtrain.train.training import train_prepared


def execute(recipe: Recipe, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run ``recipe`` to the end and return its summary (also in ``<run_dir>/summary.json``).

    With ``[distributed] world_size > 1`` this process either starts the workers
    on this machine and waits for them, or, started as one (``RANK`` and
    ``WORLD_SIZE`` set, as torchrun sets them), is that worker.
    """
    reporter = reporter if reporter is not None else make_reporter()
    if recipe.distributed.world_size > 1:
        from qtrain.distributed.launch import in_worker, launch, run_worker

        return run_worker(recipe, reporter) if in_worker() else launch(recipe)
    with prepared(recipe) as (dataset, graph, model, device):
        return train_prepared(recipe, dataset, graph, model, device, reporter)


def calibrate_recipe(recipe: Recipe, target: float | None = None) -> Calibration:
    """``qtrain calibrate``: Error_X at 2..8 bits on the first layer of ``recipe``'s first epoch.

    Rounding and target come from ``[quant.tango]`` when the recipe has it;
    ``target`` overrides the latter.
    """
    tango = recipe.quant.configs.get("tango")
    rounding = getattr(tango, "rounding", "stochastic")
    if target is None:
        target = getattr(tango, "error_x_target", DEFAULT_TARGET)
    with prepared(recipe) as (_dataset, graph, model, device):
        return calibrate_model(
            model, graph, target=target, rounding=rounding, seed=recipe.train.seed, device=device
        )
