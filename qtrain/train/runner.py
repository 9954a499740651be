"""One run from a validated recipe: seeds, data, model, run directory, plugins, training.

``execute(recipe)`` returns the summary that it also writes to
``summary.json``. Bad input (a mode the model cannot train in, fanouts that
do not match the layers, a device that is not there) raises a ``RecipeError``
before the run directory is created. Once the directory exists, any ending
(completed, interrupted, failed) leaves ``recipe.toml``, ``metrics.jsonl``
(one line per finished epoch), ``summary.json`` with the status and what was
measured, and the best checkpoint so far; interruptions and errors are then
re-raised for the CLI to report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from qtrain._compat import import_dgl
from qtrain.calibrate import DEFAULT_TARGET, Calibration, calibrate_model
from qtrain.errors import QtrainError, RecipeError
from qtrain.models import build_model
from qtrain.models.base import GNNModel
from qtrain.ops import dispatch
from qtrain.plugin import PluginContext, activated
from qtrain.recipe import Recipe, resolve_toml
from qtrain.train.activations import process_peak_rss
from qtrain.train.loop import Trainer, TrainState, dgl_threads
from qtrain.train.progress import Reporter, RunStart, make_reporter
from qtrain.train.rundir import RunDir, create_run_dir


def seed_everything(seed: int) -> None:
    """Seed every generator a run draws from: Python, NumPy, torch (CPU and CUDA), DGL."""
    dgl = import_dgl()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    dgl.seed(seed)


def resolve_device(name: str) -> torch.device:
    """The torch device for ``train.device``, or a RecipeError if it is not usable here."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RecipeError(f"train.device = {name!r}, but torch sees no CUDA device; use 'cpu'")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise RecipeError(
                f"train.device = {name!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak memory in bytes and where the number comes from."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    return process_peak_rss(), "ru_maxrss (peak resident set size of the whole process)"


def check_mode(recipe: Recipe, model: GNNModel) -> None:
    """Refuse training modes the model or the fanouts cannot serve, naming the keys."""
    train = recipe.train
    if train.mode != "minibatch":
        return
    if not model.supports_minibatch:
        raise RecipeError(
            f"train.mode = 'minibatch' is not supported by model {recipe.model.name!r} "
            "(it trains full-graph only); use train.mode = 'full'"
        )
    layers = len(model.layers)
    if len(train.fanouts) != layers:
        raise RecipeError(
            f"train.fanouts = {list(train.fanouts)} has {len(train.fanouts)} entries, but model "
            f"{recipe.model.name!r} has {layers} GNN layers (model.layers); give one fanout per layer"
        )


def check_dgl_device(device: torch.device) -> None:
    """Fail early (before the run directory exists) if DGL cannot place graphs on ``device``."""
    dgl = import_dgl()
    try:
        dgl.graph(([0], [0])).to(device)
    except Exception as exc:  # a DGL build without CUDA raises its own error type
        raise QtrainError(
            f"train.device = '{device}': this DGL build cannot place graphs there ({exc}); use 'cpu'"
        ) from None


def _attach_run_dir(exc: BaseException, path: Any) -> None:
    """Let the CLI say where the partial results are (it reads ``exc.run_dir``)."""
    with contextlib.suppress(AttributeError, TypeError):  # exceptions with __slots__
        exc.run_dir = str(path)  # type: ignore[attr-defined]


@contextlib.contextmanager
def prepared(recipe: Recipe) -> Iterator[tuple[Any, Any, GNNModel, torch.device]]:
    """Threads, seeds, dataset, model and graph exactly as a run of ``recipe`` starts them.

    Yields ``(dataset, graph, model, device)`` with the graph through
    ``model.prepare_graph`` and the model on the device; thread counts are
    restored afterwards.
    """
    from qtrain.data import load_dataset

    train = recipe.train
    device = resolve_device(train.device)
    previous_threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        if train.threads:
            torch.set_num_threads(train.threads)
            stack.callback(torch.set_num_threads, previous_threads)
            stack.enter_context(dgl_threads(train.threads))
        seed_everything(train.seed)
        dataset = load_dataset(recipe.dataset.name, recipe.dataset.options)
        seed_everything(train.seed)  # the model's weights do not depend on how the data was made
        model = build_model(recipe.model, dataset)
        check_mode(recipe, model)
        graph = model.prepare_graph(dataset.graph)
        if device.type == "cuda":
            check_dgl_device(device)
            torch.cuda.reset_peak_memory_stats(device)
        yield dataset, graph, model.to(device), device


def execute(recipe: Recipe, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run ``recipe`` to the end and return its summary (also in ``<run_dir>/summary.json``).

    With ``[distributed] world_size > 1`` this process either starts the workers
    on this machine and waits for them, or, started as one (``RANK`` and
    ``WORLD_SIZE`` set, as torchrun sets them), is that worker.
    """
    reporter = reporter if reporter is not None else make_reporter()
    if recipe.distributed.world_size > 1:
        from qtrain.dist.launch import in_worker, launch, run_worker

        return run_worker(recipe, reporter) if in_worker() else launch(recipe)
    with prepared(recipe) as (dataset, graph, model, device):
        return _run(recipe, dataset, graph, model, device, reporter)


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


TrainerFactory = Callable[..., Trainer]


def _run(
    recipe: Recipe,
    dataset: Any,
    graph: Any,
    model: GNNModel,
    device: torch.device,
    reporter: Reporter,
    *,
    run: RunDir | None = None,
    make_trainer: TrainerFactory = Trainer,
) -> dict[str, Any]:
    """Train with the recipe's plugins active, writing ``run`` (a new run directory by default).

    ``make_trainer(model, graph, metric=, config=, device=, run=, reporter=)``
    builds the trainer (a distributed worker passes its own).
    """
    run = run if run is not None else RunDir(create_run_dir(recipe.output.dir, recipe.name))
    run.write_recipe(resolve_toml(recipe))  # first: a run directory always says what it ran
    summary: dict[str, Any] = {
        "status": "running",
        "recipe": recipe.name,
        "model": recipe.model.name,
        "dataset": recipe.dataset.name,
        "mode": recipe.train.mode,
        "seed": recipe.train.seed,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "metric": dataset.metric,
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_nodes": int(graph.num_nodes()),
        "num_edges": int(graph.num_edges()),  # as trained on: after prepare_graph (self-loops)
        "dataset_info": dataset.info or {},
        "run_dir": str(run.path),
        "plugins": list(recipe.quant.plugins),
        "plugin_reports": {},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    run.write_summary(summary)
    state = TrainState()
    session: Any = None
    trainer: Trainer | None = None
    dispatch.reset()  # the run's `kernels` table counts this run's calls only
    wall_start = time.perf_counter()
    try:
        context = PluginContext(
            seed=recipe.train.seed,
            device=device,
            model=model,
            dataset=dataclasses.replace(dataset, graph=graph),
        )
        session = activated(recipe.quant, context)
        with session:
            summary["plugins"] = list(session.names)
            trainer = make_trainer(
                model,
                graph,
                metric=dataset.metric,
                config=recipe.train,
                device=device,
                run=run,
                reporter=reporter,
            )
            reporter.start(
                RunStart(
                    name=recipe.name,
                    model=recipe.model.name,
                    dataset=recipe.dataset.name,
                    epochs=recipe.train.epochs,
                    mode=recipe.train.mode,
                    run_dir=str(run.path),
                    metric=dataset.metric,
                    plugins=tuple(session.names),
                )
            )
            trainer.run(state)
        summary["status"] = "completed"
    except KeyboardInterrupt as exc:
        summary["status"] = "interrupted"
        _attach_run_dir(exc, run.path)
        raise
    except BaseException as exc:
        summary["status"] = "failed"
        summary["error"] = f"{type(exc).__name__}: {exc}"
        _attach_run_dir(exc, run.path)
        raise
    finally:
        summary.update(state.summary())
        summary["wall_time_s"] = time.perf_counter() - wall_start
        summary.update(
            trainer.meter.summary()
            if trainer is not None
            else {"activation_bytes": None, "peak_memory_bytes": None, "peak_memory_source": None}
        )
        summary["process_peak_memory_bytes"], _ = peak_memory(device)
        summary["kernels"] = dispatch.snapshot()
        report = getattr(trainer, "report", None)
        if callable(report):
            try:
                summary["distributed"] = report()
            except Exception as exc:  # a report must not hide the run's own outcome
                summary["distributed"] = {"error": f"{type(exc).__name__}: {exc}"}
        summary["kernel_fallbacks"] = dispatch.fallbacks()
        if session is not None:
            try:
                summary["plugin_reports"] = session.report()
            except Exception as exc:  # a report must not hide the run's own outcome
                summary["plugin_reports"] = {"error": f"{type(exc).__name__}: {exc}"}
        summary["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if recipe.output.checkpoint and state.best_state is not None:
            run.write_checkpoint(
                {
                    "model_state": state.best_state,
                    "epoch": state.best_epoch,
                    "metric": dataset.metric,
                    "val_acc": state.best_val,
                    "test_acc": state.best_test,
                    "model": recipe.model.name,
                    "recipe": resolve_toml(recipe),
                }
            )
            summary["checkpoint"] = str(run.path / "checkpoint.pt")
        run.write_summary(summary)
        run.close()
        reporter.finish(summary)
    return summary
