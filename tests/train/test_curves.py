"""Training curves: curves.csv and curves.png beside metrics.jsonl, TensorBoard when installed."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from qtrain.recipe import build_recipe
from qtrain.runner import execute
from qtrain.train import curves
from qtrain.train.progress import Reporter
from qtrain.train.rundir import RunDir, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECORDS = [
    {"epoch": 1, "loss": 2.0, "train_acc": 0.1, "epoch_time_s": 0.5},
    {"epoch": 2, "loss": 1.5, "train_acc": 0.3, "val_acc": 0.25, "test_acc": 0.2, "best": True},
    {"epoch": 3, "loss": None, "diverged": True},  # how a diverged epoch is recorded
]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_csv_has_one_row_per_epoch_and_empty_cells_where_nothing_was_measured(
    tmp_path: Path,
) -> None:
    rows = _rows(curves.write_csv(RECORDS, tmp_path / "c.csv"))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert list(rows[0]) == list(curves.COLUMNS)
    assert rows[0]["val_acc"] == "" and rows[0]["epoch_time_s"] == "0.5"
    assert rows[1]["val_acc"] == "0.25" and rows[1]["epoch_time_s"] == ""
    assert rows[2]["loss"] == ""  # null, never "None" or "nan"


@pytest.mark.parametrize("records", [RECORDS, [], RECORDS[:1]], ids=["three", "none", "one"])
def test_png_is_drawn_for_any_number_of_epochs(tmp_path: Path, records: list[dict]) -> None:
    path = curves.write_png(records, tmp_path / "c.png", "title")
    assert path.read_bytes()[:8] == PNG_MAGIC


def _recipe(tmp_path: Path, **train: Any) -> Any:
    return build_recipe(
        {
            "model": {"name": "gcn", "hidden": 8},
            "dataset": {"name": "synthetic-small", "nodes": 300},
            "train": {"epochs": 4, "eval_every": 2, **train},
            "output": {"dir": str(tmp_path / "runs")},
        },
        "curves",
    )


def test_every_run_writes_its_curves(tmp_path: Path) -> None:
    summary = execute(_recipe(tmp_path), reporter=Reporter())
    run = Path(summary["run_dir"])
    assert summary["curves"] == {"csv": str(run / "curves.csv"), "png": str(run / "curves.png")}
    rows, records = _rows(run / "curves.csv"), read_metrics(run)
    assert [int(r["epoch"]) for r in rows] == [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert [float(r["loss"]) for r in rows] == pytest.approx([r["loss"] for r in records])
    assert [r["val_acc"] != "" for r in rows] == [False, True, False, True]
    assert (run / "curves.png").read_bytes()[:8] == PNG_MAGIC
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["curves"] == summary["curves"]


def test_a_failing_picture_does_not_fail_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: RunDir, title: str) -> dict[str, str]:
        raise RuntimeError("no backend")

    monkeypatch.setattr(RunDir, "write_curves", broken)
    summary = execute(_recipe(tmp_path), reporter=Reporter())
    assert summary["status"] == "completed" and "curves" not in summary
    assert summary["curves_error"] == "RuntimeError: no backend"


class FakeWriter:
    """What TensorBoardLog calls of torch.utils.tensorboard.SummaryWriter."""

    def __init__(self, log_dir: str = "") -> None:
        self.log_dir = log_dir
        self.scalars: list[tuple[str, float, int]] = []
        self.flushes = 0
        self.closed = False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def test_tensorboard_gets_every_epoch_as_it_is_written(tmp_path: Path) -> None:
    writer = FakeWriter()
    log = curves.TensorBoardLog(writer)
    for record in RECORDS:
        log.add(record)
    assert writer.scalars == [
        ("loss", 2.0, 1),
        ("epoch_time_s", 0.5, 1),
        ("acc/train", 0.1, 1),
        ("loss", 1.5, 2),
        ("acc/train", 0.3, 2),
        ("acc/validation", 0.25, 2),
        ("acc/test", 0.2, 2),
    ]
    assert writer.flushes == 3


def test_a_run_logs_to_tensorboard_where_it_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[FakeWriter] = []

    class Module:
        @staticmethod
        def SummaryWriter(log_dir: str) -> FakeWriter:
            made.append(FakeWriter(log_dir))
            return made[-1]

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", Module)
    summary = execute(_recipe(tmp_path), reporter=Reporter())
    (writer,) = made
    assert writer.log_dir == str(Path(summary["run_dir"]) / "tensorboard")
    assert [s[2] for s in writer.scalars if s[0] == "loss"] == [1, 2, 3, 4]
    assert writer.closed


def test_without_tensorboard_a_run_writes_no_event_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert curves.TensorBoardLog.open(tmp_path) is None
    summary = execute(_recipe(tmp_path), reporter=Reporter())
    assert summary["status"] == "completed"
    assert not (Path(summary["run_dir"]) / "tensorboard").exists()
