"""One training run of a prepared model: run directory, plugins, trainer, summary.

``train_prepared`` writes ``recipe.toml`` first, then ``metrics.jsonl`` (one line
per finished epoch), ``summary.json`` with the status and what was measured, and
the best checkpoint so far; whatever the ending (completed, interrupted,
failed), the directory stays readable and interruptions and errors are re-raised
for the CLI to report. A distributed worker passes its own trainer and run
directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from qtrain import route, signals
from qtrain.errors import RunDiverged, RunFailed
from qtrain.models.base import GNNModel
from qtrain.ops import dispatch
from qtrain.plugin import PluginContext, activated
from qtrain.recipe import Recipe, resolve_toml
from qtrain.train import resume as resume_state
from qtrain.train.activations import process_peak_rss
from qtrain.train.loop import Trainer, TrainState
from qtrain.train.progress import Reporter, RunStart
from qtrain.train.rundir import RunDir, create_run_dir


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak memory in bytes and where the number comes from."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    return process_peak_rss(), "ru_maxrss (peak resident set size of the whole process)"


def _attach_run_dir(exc: BaseException, path: Any) -> None:
    """Let the CLI say where the partial results are (it reads ``exc.run_dir``)."""
    with contextlib.suppress(AttributeError, TypeError):  # exceptions with __slots__
        exc.run_dir = str(path)  # type: ignore[attr-defined]


TrainerFactory = Callable[..., Trainer]


def train_prepared(
    recipe: Recipe,
    dataset: Any,
    graph: Any,
    model: GNNModel,
    device: torch.device,
    reporter: Reporter,
    *,
    run: RunDir | None = None,
    make_trainer: TrainerFactory = Trainer,
    resume: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train with the recipe's plugins active, writing ``run`` (a new run directory by default).

    ``make_trainer(model, graph, metric=, config=, device=, run=, reporter=)``
    builds the trainer (a distributed worker passes its own). ``resume`` (read from
    ``run``'s ``resume.pt``) continues that run after the epoch it was taken at.
    """
    run = run if run is not None else RunDir(create_run_dir(recipe.output.dir, recipe.name))
    run.write_recipe(resolve_toml(recipe))  # first: a run directory always says what it ran
    summary: dict[str, Any] = {
        "status": "running",
        "recipe": recipe.name,
        "model": recipe.model.name,
        "dataset": recipe.dataset.name,
        "mode": recipe.train.mode,
        "numerics": recipe.train.numerics,
        "seed": recipe.train.seed,
        "device": str(device),
        # who ran the graph primitives: qtrain's device route, or DGL's own kernels
        "graph_kernels": "qtrain" if device.type in route.enabled_devices() else "dgl",
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
    if recipe.train.numerics == "gcint":  # what the integer training ran with, auto resolved
        train = recipe.train
        summary["gcint"] = {
            "quantizer": train.gcint_quantizer,
            "loss": train.gcint_loss,
            "lr_shift": train.gcint_lr_shift,
            "lr_decay": train.gcint_step_decay,
        }
    if resume is not None:
        summary["resumed_from_epoch"] = resume["epoch"]
    run.write_summary(summary)
    state = TrainState()
    checkpoint_error: str | None = None
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
            if recipe.output.checkpoint:
                trainer.checkpoint_every = recipe.output.checkpoint_every
                trainer.save_checkpoint = lambda: run.write_checkpoint(
                    _checkpoint(recipe, dataset, state)
                )
                trainer.save_resume = lambda: run.write_resume(
                    resume_state.capture(trainer, state, session)
                )
            if resume is not None:
                resume_state.restore(resume, trainer, state, session)
                run.truncate_metrics(state.epochs_run)  # the later epochs are run again
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
            every = recipe.output.checkpoint_every
            just_written = every and state.epochs_run % every == 0  # by the periodic write
            if recipe.output.checkpoint and not just_written:  # a finished run can be extended
                try:
                    run.write_resume(resume_state.capture(trainer, state, session))
                except OSError as exc:  # the run's results stand; only extending it is lost
                    summary["resume_error"] = str(exc)
        summary["status"] = "completed"
    except RunDiverged as exc:
        summary["status"] = "diverged"
        summary["error"] = str(exc)
        _attach_run_dir(exc, run.path)
        raise
    except KeyboardInterrupt as exc:
        summary["status"] = "interrupted"
        _attach_run_dir(exc, run.path)
        raise
    except BaseException as exc:
        # a stop signal that came first is the run's ending and exc what it caused: a peer
        # stopped by the same signal closes its connection while this worker waits in a
        # collective, whose own interrupt was only remembered (it landed in a finalizer)
        # or is still pending (the call runs its handler)
        try:
            signals.raise_if_stopped()
        except KeyboardInterrupt as stop:
            summary["status"] = "interrupted"
            _attach_run_dir(stop, run.path)
            raise stop from exc
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
            else {
                "activation_bytes": None,
                "input_copy_bytes": None,
                "peak_memory_bytes": None,
                "peak_memory_source": None,
            }
        )
        summary["process_peak_memory_bytes"], _ = peak_memory(device)
        summary["kernels"] = dispatch.snapshot()
        summary["kernel_fallbacks"] = dispatch.fallbacks()
        # the checkpoint and the summary first: a distributed report below waits on the
        # other workers, and an interrupted or killed peer may never answer
        if recipe.output.checkpoint and state.best_state is not None:
            try:
                if state.best_epoch != state.checkpointed_epoch:
                    run.write_checkpoint(_checkpoint(recipe, dataset, state))
                summary["checkpoint"] = str(run.path / "checkpoint.pt")
            except OSError as exc:  # the summary still gets written, naming the cause
                checkpoint_error = str(exc)
                summary["checkpoint_error"] = checkpoint_error
                if summary["status"] == "completed":
                    summary["status"] = "failed"
                    summary["error"] = checkpoint_error
        run.write_summary(summary)
        report = getattr(trainer, "report", None)
        if callable(report) and summary["status"] != "interrupted":  # peers stop anywhere
            try:
                summary["distributed"] = report()
            except Exception as exc:  # a report must not hide the run's own outcome
                summary["distributed"] = {"error": f"{type(exc).__name__}: {exc}"}
        if session is not None:
            try:
                summary["plugin_reports"] = session.report()
            except Exception as exc:  # a report must not hide the run's own outcome
                summary["plugin_reports"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            curves = run.write_curves(
                f"{recipe.name}: {recipe.model.name} on {recipe.dataset.name} ({summary['status']})"
            )
            if curves:
                summary["curves"] = curves
        except Exception as exc:  # a picture must not hide the run's own outcome
            summary["curves_error"] = f"{type(exc).__name__}: {exc}"
        summary["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        run.write_summary(summary)
        run.close()
        reporter.finish(summary)
    if checkpoint_error is not None:
        raise RunFailed(checkpoint_error)
    return summary


def _checkpoint(recipe: Recipe, dataset: Any, state: TrainState) -> dict[str, Any]:
    """What checkpoint.pt holds: the best model so far and what it scored."""
    return {
        "model_state": state.best_state,
        "epoch": state.best_epoch,
        "metric": dataset.metric,
        "val_acc": state.best_val,
        "test_acc": state.best_test,
        "model": recipe.model.name,
        "recipe": resolve_toml(recipe),
    }
