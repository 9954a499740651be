"""``qtrain compare``: FP32 and quantization policies side by side on one recipe.

Every variant (FP32, then each policy: a list of plugins with the recipe's options
for them) trains once per seed, each run in its own ``qtrain run`` process so that
its peak memory and timings are its own. The runs are interleaved (seed by seed,
every variant in turn, ``repeats`` rounds), so drift of the machine spreads over
all variants alike. The results go to ``<output.dir>/<name>-compare-<time>/``:
each run's directory under ``runs/``, and ``compare.json``, ``compare.md`` and
``compare.png`` (``qtrain.compare.report``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qtrain.errors import QtrainError, RecipeError
from qtrain.recipe import QuantSection, Recipe, resolve_toml
from qtrain.train.rundir import create_run_dir, read_metrics

FP32 = "fp32"
MAX_SEEDS = 100
MAX_REPEATS = 20


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a label and the plugins it enables."""

    label: str
    plugins: tuple[str, ...]


@dataclass
class RunResult:
    """What one run of one variant measured (its summary and per-epoch times)."""

    variant: str
    seed: int
    repeat: int
    summary: dict[str, Any]
    epoch_times: list[float] = field(default_factory=list)


def variants(recipe: Recipe, policies: Sequence[str]) -> list[Variant]:
    """FP32 and the policies (``"tango"``, ``"tango+exact"``); no policy given: the
    recipe's own plugins, or tango where it names none."""
    from qtrain.plugin import PLUGINS

    wanted = list(policies) or ["+".join(recipe.quant.plugins) or "tango"]
    out = [Variant(FP32, ())]
    for policy in wanted:
        names = tuple(p.strip() for p in policy.split("+") if p.strip())
        if policy.strip() == FP32:
            continue
        if not names or len(set(names)) != len(names):
            raise QtrainError(
                f"--policy {policy!r}: name plugins joined by '+', each once, e.g. 'tango+exact'"
            )
        for name in names:
            PLUGINS.get(name)  # unknown names fail here, listing the registered ones
        label = "+".join(names)
        if label not in {v.label for v in out}:
            out.append(Variant(label, names))
    if len(out) == 1:
        raise QtrainError("qtrain compare needs at least one policy besides fp32")
    return out


def variant_recipe(recipe: Recipe, variant: Variant, seed: int, out_dir: Path) -> Recipe:
    """``recipe`` with ``variant``'s plugins (the recipe's options for those it configures,
    the defaults for the others), ``seed``, and its runs under ``out_dir``."""
    from qtrain.plugin import PLUGINS

    configs = {
        name: recipe.quant.configs.get(name) or PLUGINS.get(name).parse({}, f"quant.{name}")
        for name in variant.plugins
    }
    return dataclasses.replace(
        recipe,
        name=f"{recipe.name}-{variant.label.replace('+', '-')}-seed{seed}",
        quant=QuantSection(variant.plugins, configs),
        train=dataclasses.replace(recipe.train, seed=seed),
        output=dataclasses.replace(recipe.output, dir=str(out_dir / "runs"), checkpoint=False),
    )


def _run_once(recipe_path: Path) -> dict[str, Any]:
    """``qtrain run RECIPE --json`` in a fresh process; its summary (status included)."""
    done = subprocess.run(
        [sys.executable, "-m", "qtrain", "run", str(recipe_path), "--json"],
        capture_output=True,
        text=True,
    )
    lines = done.stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        summary = None
    if not isinstance(summary, dict):
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise QtrainError(f"qtrain compare: the run of {recipe_path} failed: {said}")
    return summary


def compare(
    recipe: Recipe,
    policies: Sequence[str] = (),
    *,
    seeds: int = 3,
    repeats: int = 1,
    progress: Callable[[str], None] = lambda _line: None,
) -> tuple[Path, dict[str, Any]]:
    """Run every variant ``seeds`` x ``repeats`` times, interleaved; write the report.

    Returns the comparison's folder and the report (``qtrain.compare.report``).
    """
    from qtrain.compare.report import build_report, write_report

    if not 1 <= seeds <= MAX_SEEDS:
        raise QtrainError(f"--seeds {seeds}: use 1 to {MAX_SEEDS}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise QtrainError(f"--repeats {repeats}: use 1 to {MAX_REPEATS}")
    if recipe.distributed.world_size > 1:
        raise RecipeError(
            "qtrain compare runs single-process recipes; set distributed.world_size = 1"
        )
    columns = variants(recipe, policies)
    out_dir = create_run_dir(recipe.output.dir, f"{recipe.name}-compare")
    results: list[RunResult] = []
    total = seeds * repeats * len(columns)
    for repeat in range(repeats):
        for seed in range(recipe.train.seed, recipe.train.seed + seeds):
            for variant in columns:
                one = variant_recipe(recipe, variant, seed, out_dir)
                path = out_dir / f"{one.name}.toml"
                path.write_text(resolve_toml(one))
                progress(f"[{len(results) + 1}/{total}] {variant.label}, seed {seed}")
                summary = _run_once(path)
                times = [
                    float(r["epoch_time_s"])
                    for r in read_metrics(summary.get("run_dir", out_dir / "missing"))
                    if isinstance(r.get("epoch_time_s"), int | float)
                ]
                results.append(RunResult(variant.label, seed, repeat, summary, times))
    report = build_report(recipe, columns, results, seeds=seeds, repeats=repeats)
    write_report(out_dir, report)
    return out_dir, report
