"""Training curves of a run: ``curves.csv`` and ``curves.png`` beside ``metrics.jsonl``,
and TensorBoard event files under ``tensorboard/`` when tensorboard is installed.

``metrics.jsonl`` stays the record; the CSV is the same numbers for a spreadsheet
or pandas (one row per epoch, an empty cell where an epoch had no evaluation), the
PNG the picture a user looks at first (loss, then the accuracies, by epoch). Both
are redrawn from ``metrics.jsonl`` when a run ends, however it ends. TensorBoard
gets each epoch as it is written, so a running job can be watched.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

COLUMNS = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_time_s")
CSV_FILE, PNG_FILE, TENSORBOARD_DIR = "curves.csv", "curves.png", "tensorboard"
_ACCURACIES = (("train_acc", "train"), ("val_acc", "validation"), ("test_acc", "test"))


def _number(value: Any) -> float | None:
    """A finite float, or None (a missing or null field: no evaluation, a NaN loss)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def write_csv(records: list[dict[str, Any]], path: Path) -> Path:
    """One row per epoch record, in :data:`COLUMNS` order; empty where a value is missing."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for record in records:
            row = []
            for column in COLUMNS:
                value = record.get(column) if column == "epoch" else _number(record.get(column))
                row.append("" if value is None else value)
            writer.writerow(row)
    return path


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The (epoch, value) pairs of ``key`` where it has a finite value."""
    epochs, values = [], []
    for record in records:
        value = _number(record.get(key))
        if value is not None and isinstance(record.get("epoch"), int):
            epochs.append(record["epoch"])
            values.append(value)
    return epochs, values


def write_png(records: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Loss (left) and accuracies (right) by epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    try:
        epochs, losses = _series(records, "loss")
        loss_ax.plot(epochs, losses, color="tab:red", marker="." if len(epochs) < 30 else None)
        loss_ax.set(xlabel="epoch", ylabel="training loss", title="loss")
        for key, label in _ACCURACIES:
            epochs, values = _series(records, key)
            if values:
                acc_ax.plot(epochs, values, label=label, marker="." if len(epochs) < 30 else None)
        acc_ax.set(xlabel="epoch", ylabel="metric", title="train / validation / test")
        if acc_ax.lines:
            acc_ax.legend(loc="lower right")
        for ax in (loss_ax, acc_ax):
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def write_curves(run_path: Path, records: list[dict[str, Any]], title: str) -> dict[str, str]:
    """``curves.csv`` and ``curves.png`` of ``records`` in ``run_path``; returns their paths."""
    return {
        "csv": str(write_csv(records, run_path / CSV_FILE)),
        "png": str(write_png(records, run_path / PNG_FILE, title)),
    }


class TensorBoardLog:
    """Each epoch record as TensorBoard scalars (``loss``, ``acc/train`` ...), where
    ``torch.utils.tensorboard`` can be imported (it needs the tensorboard package)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    @classmethod
    def open(cls, run_path: Path) -> TensorBoardLog | None:
        """A log under ``run_path/tensorboard``, or None where tensorboard is not installed."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # an optional extra: the CSV and PNG are always written
            return None
        return cls(SummaryWriter(log_dir=str(run_path / TENSORBOARD_DIR)))

    def add(self, record: dict[str, Any]) -> None:
        epoch = record.get("epoch")
        if not isinstance(epoch, int):
            return
        for key, tag in (("loss", "loss"), ("epoch_time_s", "epoch_time_s")):
            value = _number(record.get(key))
            if value is not None:
                self.writer.add_scalar(tag, value, epoch)
        for key, label in _ACCURACIES:
            value = _number(record.get(key))
            if value is not None:
                self.writer.add_scalar(f"acc/{label}", value, epoch)
        self.writer.flush()  # a running job is watched while it trains

    def close(self) -> None:
        self.writer.close()
