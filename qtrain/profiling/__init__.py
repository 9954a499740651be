"""``qtrain profile``: where an epoch's time goes, primitive by primitive (torch.profiler)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qtrain.errors import QtrainError
from qtrain.profiling.report import to_json, write_chart
from qtrain.profiling.session import BASELINES, Profile, baseline_recipe, profile_recipe
from qtrain.recipe import Recipe, resolve_toml
from qtrain.train.rundir import RunDir, create_run_dir, write_atomic
from qtrain.train.rundir import to_json as json_line

__all__ = ["BASELINES", "ProfileRun", "profile_run"]


@dataclass
class ProfileRun:
    """A finished ``qtrain profile``: what it measured and where it wrote it."""

    profile: Profile
    baseline: Profile | None
    compare: str | None
    compare_error: str | None
    result: dict[str, Any]
    run_dir: Path


def check_options(epochs: int, warmup: int, compare: str | None) -> None:
    if epochs < 1:
        raise QtrainError(f"--epochs must be >= 1, got {epochs}")
    if warmup < 0:
        raise QtrainError(f"--warmup must be >= 0, got {warmup}")
    if compare is not None and compare not in BASELINES:
        raise QtrainError(f"--compare must be one of {', '.join(BASELINES)}, got {compare!r}")


def profile_run(
    recipe: Recipe,
    *,
    epochs: int = 3,
    warmup: int = 2,
    compare: str | None = None,
    trace: Path | None = None,
) -> ProfileRun:
    """Profile ``recipe`` (and its baseline), writing ``profile.json`` and ``profile.png``
    to a new run directory ``<output.dir>/<name>-profile-<time>``."""
    check_options(epochs, warmup, compare)
    if recipe.distributed.world_size > 1:
        raise QtrainError(
            f"qtrain profile runs one process, but distributed.world_size = "
            f"{recipe.distributed.world_size}; profile with --set distributed.world_size=1 "
            "(a distributed run's summary splits its time into communication, quantization "
            "and computation)"
        )
    if trace is not None and not trace.parent.is_dir():
        raise QtrainError(f"--trace {trace}: the folder {trace.parent} does not exist")
    path = create_run_dir(recipe.output.dir, f"{recipe.name}-profile")
    RunDir(path).write_recipe(resolve_toml(recipe))
    profile = profile_recipe(recipe, label=recipe.name, epochs=epochs, warmup=warmup, trace=trace)
    baseline, error = None, None
    if compare is not None:
        try:
            baseline = profile_recipe(
                baseline_recipe(recipe),
                label=compare,
                epochs=epochs,
                warmup=warmup,
                bf16=compare == "bf16",
            )
        except Exception as exc:  # DGL refuses some models under bf16 autocast
            error = f"{type(exc).__name__}: {exc}"
    chart = write_chart(path / "profile.png", profile, baseline, compare)
    result = to_json(
        profile,
        baseline,
        compare,
        recipe=recipe.name,
        run_dir=str(path),
        chart=str(chart),
        trace=str(trace) if trace is not None else None,
        compare_error=error,
    )
    write_atomic(path / "profile.json", json_line(result) + "\n")
    return ProfileRun(profile, baseline, compare, error, result, path)
