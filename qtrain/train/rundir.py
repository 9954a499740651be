"""The run directory: resolved recipe, per-epoch metrics, summary, best checkpoint,
training curves (``qtrain.train.curves``).

Every file is written so that it stays readable if the run is interrupted at
any point: metrics lines are flushed one at a time, the summary and the
checkpoint are replaced atomically (written beside, then renamed).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import IO, Any

import torch

from qtrain.train.curves import TensorBoardLog, write_curves

RECIPE, METRICS, SUMMARY, CHECKPOINT, RESUME = (
    "recipe.toml",
    "metrics.jsonl",
    "summary.json",
    "checkpoint.pt",
    "resume.pt",
)


def create_run_dir(parent: str | Path, name: str, now: float | None = None) -> Path:
    """Make ``<parent>/<name>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... if taken) and return it."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"{name}-{stamp}"
    for n in range(1, 10_000):
        path = parent / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run directory name under {parent} for {base}")


def _jsonable(value: Any) -> Any:
    """Values JSON can hold: NaN/inf become null, tensors and paths become numbers / text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return _jsonable(value.item())
    if hasattr(value, "item") and callable(value.item):  # NumPy scalars
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def to_json(value: Any) -> str:
    """One-line strict JSON (no NaN) of ``value``."""
    return json.dumps(_jsonable(value), allow_nan=False)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` so that readers see the old or the new file, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunDir:
    """Writer for one run's files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._metrics: IO[bytes] | None = None
        self._tensorboard: TensorBoardLog | None = None
        self._tensorboard_checked = False

    def write_recipe(self, text: str) -> None:
        write_atomic(self.path / RECIPE, text)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one epoch's line and flush it to the OS; a write that fails (a full disk)
        is cut back off, so the file never ends with half a line."""
        line = (to_json(record) + "\n").encode("utf-8")
        if self._metrics is None:
            self._metrics = open(self.path / METRICS, "ab")  # noqa: SIM115
        end = self._metrics.tell()
        try:
            self._metrics.write(line)
            self._metrics.flush()
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._metrics.truncate(end)
            raise OSError(exc.errno, f"{self.path / METRICS}: {exc.strerror or exc}") from None
        if not self._tensorboard_checked:
            self._tensorboard_checked = True
            self._tensorboard = TensorBoardLog.open(self.path)
        if self._tensorboard is not None:
            self._tensorboard.add(record)

    def write_curves(self, title: str) -> dict[str, str]:
        """``curves.csv`` and ``curves.png`` from ``metrics.jsonl`` as it is now."""
        return write_curves(self.path, read_metrics(self.path), title)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(
            self.path / SUMMARY, json.dumps(_jsonable(summary), indent=2, allow_nan=False) + "\n"
        )

    def write_checkpoint(self, state: dict[str, Any]) -> None:
        """Replace the checkpoint atomically (see :meth:`_save`)."""
        self._save(CHECKPOINT, state)

    def write_resume(self, state: dict[str, Any]) -> None:
        """Replace ``resume.pt`` atomically (``qtrain.train.resume``)."""
        self._save(RESUME, state)

    def _save(self, name: str, state: dict[str, Any]) -> None:
        """``torch.save`` beside, then rename; on failure the previous file stays, the
        temporary file goes, and the error names the cause (torch.save reports a full disk
        only as "unexpected pos")."""
        tmp = self.path / f".{name}.tmp"
        try:
            torch.save(state, tmp)
            os.replace(tmp, self.path / name)
        except (OSError, RuntimeError) as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            free = shutil.disk_usage(self.path).free
            cause = "the disk is full" if free < 64 * 2**20 else f"{type(exc).__name__}: {exc}"
            raise OSError(
                f"could not write {self.path / name} ({cause}; {free} bytes free); "
                f"the previous {name} is kept"
            ) from exc

    def truncate_metrics(self, epochs: int) -> None:
        """Keep the metrics of epochs 1..``epochs`` (a resumed run redoes the later ones)."""
        kept = [r for r in read_metrics(self.path) if int(r.get("epoch", 0)) <= epochs]
        write_atomic(self.path / METRICS, "".join(to_json(r) + "\n" for r in kept))

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The epoch records of a run directory (or of a metrics.jsonl file)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    if not path.exists():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
