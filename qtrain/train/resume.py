"""Resuming a run: ``qtrain run --resume RUN_DIR`` continues where ``resume.pt`` left off.

``resume.pt`` is everything the next epoch depends on, taken at the end of an
epoch: the model's and the optimizer's state, what the run measured so far
(best epoch and weights, times, early-stopping count), every random generator
(Python, NumPy, torch's CPU and CUDA ones), the step counters of qtrain's keyed
dropout, and each plugin's own state (its random-stream position). It is written
with the periodic checkpoint (every ``output.checkpoint_every`` epochs) and when a
run completes, atomically, so an interrupted or killed run resumes from its last
one and a finished run can be extended (``--set train.epochs=N``). A resumed run
redoes the epochs after that point and ends with the numbers an uninterrupted run
has; tango's cache of quantized operands is not saved, so with ``cache = true`` and
stochastic rounding the operands cached across epochs are drawn again (the same
distribution, not the same bits).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qtrain.errors import QtrainError
from qtrain.models.dropout import dropout_steps, set_dropout_steps
from qtrain.train.loop import Trainer, TrainState, cpu_state
from qtrain.train.rundir import RECIPE, RESUME

FORMAT = 1


def _numpy_state() -> tuple[str, list[int], int, int, float]:
    """NumPy's legacy generator state in plain Python types (a weights-only load reads it)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)


def capture(trainer: Trainer, state: TrainState, plugins: Any) -> dict[str, Any]:
    """What ``resume.pt`` holds, taken between epochs."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {
        "format": FORMAT,
        "epoch": state.epochs_run,
        "model": cpu_state(trainer.model),
        "optimizer": trainer.optimizer.state_dict(),
        "train_state": {f.name: getattr(state, f.name) for f in dataclasses.fields(state)},
        "dropout_steps": dropout_steps(trainer.model),
        "plugins": plugins.state_dict() if plugins is not None else {},
        "rng": {
            "python": random.getstate(),
            "numpy": _numpy_state(),
            "torch": torch.get_rng_state(),
            "cuda": cuda,
        },
    }


def load(run_dir: Path) -> dict[str, Any]:
    """``run_dir``'s resume state, or a QtrainError saying why there is none."""
    path = run_dir / RESUME
    if not path.is_file():
        raise QtrainError(
            f"--resume {run_dir}: no {RESUME} there (it is written every "
            "output.checkpoint_every epochs and when a run completes; a run stopped before "
            "its first one, or with output.checkpoint = false, cannot resume)"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise QtrainError(f"--resume {run_dir}: {RESUME} cannot be read ({exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise QtrainError(f"--resume {run_dir}: {RESUME} is not a qtrain resume state")
    return payload


def restore(payload: dict[str, Any], trainer: Trainer, state: TrainState, plugins: Any) -> None:
    """Put the run back where ``payload`` was taken (after the model, the trainer and the
    plugins were built as the run built them)."""
    trainer.model.load_state_dict(payload["model"])
    try:
        trainer.optimizer.load_state_dict(payload["optimizer"])
    except ValueError as exc:  # a setting the saved optimizer state does not fit
        raise QtrainError(f"cannot resume: {exc}") from None
    for name, value in payload["train_state"].items():
        setattr(state, name, value)
    set_dropout_steps(trainer.model, payload["dropout_steps"])
    if plugins is not None:
        plugins.load_state_dict(payload["plugins"])
    rng = payload["rng"]
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def recipe_of(run_dir: Path, overrides: list[str]) -> Any:
    """The recipe ``run_dir`` ran (its ``recipe.toml``), with ``overrides`` of
    ``train.epochs`` alone: anything else would make the resumed run another run."""
    from qtrain.recipe import load_recipe

    path = run_dir / RECIPE
    if not path.is_file():
        raise QtrainError(f"--resume {run_dir}: not a run directory (no {RECIPE} there)")
    recorded = load_recipe(path, [])
    recipe = load_recipe(path, overrides)
    same_epochs = dataclasses.replace(recipe.train, epochs=recorded.train.epochs)
    if dataclasses.replace(recipe, train=same_epochs) != recorded:
        raise QtrainError(
            f"--resume {run_dir} continues the run as {path} records it: only "
            "train.epochs may change (--set train.epochs=N)"
        )
    return recipe


def check_resumable(payload: dict[str, Any], recipe: Any, run_dir: Path) -> None:
    """Refuse a resume with nothing left to run, naming what would extend it."""
    done, wanted = int(payload["epoch"]), recipe.train.epochs
    if payload["train_state"].get("stopped_early"):
        raise QtrainError(
            f"--resume {run_dir}: the run stopped early at epoch {done} (train.patience); "
            "there is nothing left to train"
        )
    if payload["train_state"].get("diverged_at") is not None:
        raise QtrainError(f"--resume {run_dir}: the run diverged; resuming would diverge again")
    if done >= wanted:
        raise QtrainError(
            f"--resume {run_dir}: the run already has {done} of train.epochs = {wanted} epochs; "
            f"extend it with --set train.epochs=N (N > {done})"
        )
