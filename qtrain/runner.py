"""``qtrain run`` and ``qtrain calibrate`` from a validated recipe: in this process, or as
the distributed workers ``[distributed]`` asks for (``qtrain.distributed.launch``).

Bad input (a mode the model cannot train in, fanouts that do not match the layers,
a device that is not there) raises a ``RecipeError`` before a run directory exists;
what a run directory then always holds is ``qtrain.train.training``'s business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qtrain.errors import QtrainError
from qtrain.plugin import Calibration, calibrator
from qtrain.recipe import Recipe
from qtrain.train import resume as resume_state
from qtrain.train.loop import Trainer
from qtrain.train.prepare import prepared
from qtrain.train.progress import Reporter, make_reporter
from qtrain.train.rundir import RunDir
from qtrain.train.training import train_prepared


def execute(
    recipe: Recipe, reporter: Reporter | None = None, resume_from: Path | None = None
) -> dict[str, Any]:
    """Run ``recipe`` to the end and return its summary (also in ``<run_dir>/summary.json``).

    With ``[distributed] world_size > 1`` this process either starts the workers
    on this machine and waits for them, or, started as one (``RANK`` and
    ``WORLD_SIZE`` set, as torchrun sets them), is that worker. ``resume_from``
    continues that run directory's run (``qtrain.train.resume``; ``recipe`` is its
    recorded recipe, ``train.epochs`` aside).
    """
    reporter = reporter if reporter is not None else make_reporter()
    if recipe.distributed.world_size > 1:
        if resume_from is not None:
            raise QtrainError(
                f"--resume {resume_from}: distributed runs cannot resume yet; start it again"
            )
        from qtrain.distributed.launch import in_worker, launch, run_worker

        return run_worker(recipe, reporter) if in_worker() else launch(recipe)
    payload, run = None, None
    if resume_from is not None:
        payload = resume_state.load(resume_from)
        resume_state.check_resumable(payload, recipe, resume_from)
        run = RunDir(resume_from)
    make_trainer = Trainer
    if recipe.train.numerics == "gcint":
        from qtrain.train.gcint import GcintTrainer

        make_trainer = GcintTrainer
    with prepared(recipe) as (dataset, graph, model, device):
        if recipe.train.numerics == "gcint" and dataset.metric != "accuracy":
            raise QtrainError(
                f"train.numerics = 'gcint' trains single-label classification (accuracy); "
                f"dataset {recipe.dataset.name!r} is scored by {dataset.metric}"
            )
        return train_prepared(
            recipe,
            dataset,
            graph,
            model,
            device,
            reporter,
            run=run,
            make_trainer=make_trainer,
            resume=payload,
        )


def calibrate_recipe(recipe: Recipe, target: float | None = None) -> Calibration:
    """``qtrain calibrate``: the calibrating plugin of ``recipe`` (see
    ``qtrain.plugin.calibrator``) picks its bit count on the model and graph a run of
    ``recipe`` starts with; ``target`` overrides its config's."""
    plugin, config = calibrator(recipe.quant)
    with prepared(recipe) as (dataset, graph, model, device):
        return plugin.calibrate(
            config,
            model,
            graph,
            seed=recipe.train.seed,
            device=device,
            target=target,
            metric=dataset.metric,
        )
