"""Progress reporting on standard error; standard output belongs to the CLI.

A ``Reporter`` gets the run's start, every finished epoch (after its metrics
line is on disk, so a reporter that raises leaves a consistent run) and the
end. ``make_reporter`` picks a rich progress bar for a terminal and one plain
line per evaluated epoch otherwise; tests pass ``NullReporter`` (or their own).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import IO, Any


@dataclass(frozen=True)
class RunStart:
    """What a reporter knows when training starts."""

    name: str
    model: str
    dataset: str
    epochs: int
    mode: str
    run_dir: str
    metric: str
    plugins: tuple[str, ...] = ()


class Reporter:
    """Base reporter: does nothing. Override what you need."""

    def start(self, info: RunStart) -> None:
        """Training is about to start."""

    def batch(self, done: int, total: int) -> None:
        """``done`` of ``total`` mini-batches of the current epoch are finished."""

    def epoch(self, record: dict[str, Any]) -> None:
        """One epoch finished; ``record`` is its metrics.jsonl line."""

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended (any status); ``summary`` is what summary.json holds."""


NullReporter = Reporter


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


class PlainReporter(Reporter):
    """One line per evaluated epoch, for logs and pipes."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = 0

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def start(self, info: RunStart) -> None:
        self.total = info.epochs
        plugins = ", ".join(info.plugins) or "none"
        self._print(
            f"qtrain: {info.model} on {info.dataset}, {info.mode}, {info.epochs} epochs, "
            f"plugins: {plugins}; run dir {info.run_dir}"
        )

    def epoch(self, record: dict[str, Any]) -> None:
        if "val_acc" not in record:
            return
        self._print(
            f"epoch {record['epoch']:>4}/{self.total}  loss {record['loss']:.4f}  "
            f"train {_fmt(record.get('train_acc'))}  val {_fmt(record.get('val_acc'))}  "
            f"test {_fmt(record.get('test_acc'))}  {record['epoch_time_s']:.3f} s"
        )

    def finish(self, summary: dict[str, Any]) -> None:
        self._print(
            f"qtrain: {summary.get('status')} after {summary.get('epochs')} epochs; best epoch "
            f"{summary.get('best_epoch')}: val {_fmt(summary.get('val_acc'))} "
            f"test {_fmt(summary.get('test_acc'))}"
        )


class RichReporter(Reporter):
    """A rich progress bar with the epoch, loss and validation metric."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        from rich.console import Console

        self.console = Console(file=stream or sys.stderr)
        self.progress: Any = None
        self.task: Any = None
        self.batch_task: Any = None
        self.best: float | None = None

    def start(self, info: RunStart) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        plugins = ", ".join(info.plugins) or "none"
        self.console.print(
            f"[bold]{info.name}[/]: {info.model} on {info.dataset} ({info.mode}), plugins: {plugins}"
        )
        self.console.print(f"run dir {info.run_dir}", highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.progress.start()
        self.task = self.progress.add_task("epoch", total=info.epochs, stats="")
        if info.mode == "minibatch":
            self.batch_task = self.progress.add_task("batch", total=None, stats="")

    def batch(self, done: int, total: int) -> None:
        if self.progress is not None and self.batch_task is not None:
            self.progress.update(self.batch_task, completed=done, total=total)

    def epoch(self, record: dict[str, Any]) -> None:
        if self.progress is None:
            return
        val = record.get("val_acc")
        if val is not None and (self.best is None or val > self.best):
            self.best = val
        stats = f"loss {record['loss']:.4f}  val {_fmt(val)}  best {_fmt(self.best)}"
        self.progress.update(self.task, completed=record["epoch"], stats=stats)

    def finish(self, summary: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def make_reporter(stream: IO[str] | None = None) -> Reporter:
    """A progress bar when ``stream`` (default stderr) is a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return RichReporter(stream)
    return PlainReporter(stream)
