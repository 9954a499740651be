"""A run's files survive what a disk and a killed process do to them."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from qtrain.data import cache
from qtrain.train import rundir
from qtrain.train.rundir import RunDir, read_metrics


class _FullDisk:
    """A metrics file whose next write stops half-way with ENOSPC, as a full disk does."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        self.real.write(data[: len(data) // 2])
        self.real.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_failed_metrics_write_leaves_no_half_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.append_metrics({"epoch": 1, "loss": 0.5})
    assert run._metrics is not None
    run._metrics = _FullDisk(run._metrics)  # type: ignore[assignment]
    with pytest.raises(OSError, match=r"metrics\.jsonl: No space left on device"):
        run.append_metrics({"epoch": 2, "loss": 0.25})
    run._metrics = run._metrics.real  # type: ignore[attr-defined]
    run.append_metrics({"epoch": 3, "loss": 0.125})
    run.close()
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1, 3]


def test_a_failed_checkpoint_names_the_full_disk_and_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir(tmp_path)
    run.write_checkpoint({"epoch": 1})

    def full(state: Any, path: Any) -> None:
        Path(path).write_bytes(b"half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64")

    monkeypatch.setattr(rundir.torch, "save", full)
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda _: _Usage())
    with pytest.raises(
        OSError, match=r"checkpoint\.pt \(the disk is full; 0 bytes free\); the previous"
    ):
        run.write_checkpoint({"epoch": 2})
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True) == {"epoch": 1}
    assert not (tmp_path / ".checkpoint.pt.tmp").exists()


class _Usage:
    total, used, free = 10, 10, 0


def test_temporary_cache_folders_of_killed_writers_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "synthetic-abc"
    dead = tmp_path / ".synthetic-abc.tmp-999999999-x1"  # no such process
    old_style = tmp_path / ".synthetic-abc.tmp-q8z"  # before writers named themselves
    alive = tmp_path / f".synthetic-abc.tmp-{os.getpid()}-x2"
    other = tmp_path / ".other.tmp-999999999-x3"
    for path in (dead, old_style, alive, other):
        path.mkdir()
        (path / "feat.npy").write_bytes(b"0" * 1024)
    removed = cache.remove_abandoned(folder)
    assert sorted(removed) == sorted([dead, old_style])
    assert alive.exists() and other.exists() and not dead.exists()
