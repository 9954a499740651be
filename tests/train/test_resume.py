"""``qtrain run --resume RUN_DIR``: an interrupted or finished run continues to the numbers
an uninterrupted run has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qtrain.errors import QtrainError
from qtrain.recipe import build_recipe
from qtrain.runner import execute
from qtrain.train.progress import Reporter
from qtrain.train.resume import recipe_of
from qtrain.train.rundir import read_metrics

TIMES = ("epoch_time_s", "eval_time_s")


class StopAt(Reporter):
    """Raises KeyboardInterrupt (what Ctrl-C and SIGTERM become) after epoch ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def epoch(self, record: dict[str, Any]) -> None:
        if record["epoch"] == self.at:
            raise KeyboardInterrupt


def _raw(tmp_path: Path, epochs: int, **tables: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model": {"name": "gcn", "hidden": 8, "dropout": 0.5, "input_dropout": 0.2},
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": epochs, "eval_every": 1},
        "output": {"dir": str(tmp_path / "runs"), "checkpoint_every": 2},
    }
    for key, table in tables.items():
        # another model's table replaces the GCN one (its options differ)
        other_model = key == "model" and table.get("name", "gcn") != "gcn"
        raw[key] = dict(table) if other_model else {**raw.get(key, {}), **table}
    return raw


def _numbers(run_dir: str | Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in read_metrics(run_dir)]


def _interrupted(tmp_path: Path, raw: dict[str, Any], at: int) -> Path:
    before = set((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else set()
    with pytest.raises(KeyboardInterrupt):
        execute(build_recipe(raw, "resumed"), reporter=StopAt(at))
    (run_dir,) = set((tmp_path / "runs").glob("*")) - before
    return run_dir


CASES = {
    "fp32": {},
    "exact": {"quant": {"plugin": ["exact"]}},
    "tango-uncached": {"quant": {"plugin": ["tango"], "tango": {"cache": False}}},
    # GATConv's feat_drop / attn_drop: torch's dropout, drawn by tango's fused dropout
    # from a call counter the checkpoint keeps
    # the features' int8 copy, cached across steps, is quantized again after the resume
    "tango-sage": {"model": {"name": "sage", "hidden": 8}, "quant": {"plugin": ["tango"]}},
    "tango-gat": {
        "model": {"name": "gat", "hidden": 4, "heads": 2},
        "quant": {"plugin": ["tango"]},
    },
    "minibatch": {
        "model": {"name": "sage", "hidden": 8, "dropout": 0.5},
        "train": {"mode": "minibatch", "fanouts": [4, 4], "batch_size": 64},
    },
    # the integer SGD's schedule continues from the saved step count
    "gcint-linear": {"train": {"numerics": "gcint", "gcint_lr_decay": "linear"}},
    "gcint-minibatch-linear": {
        "train": {
            "numerics": "gcint",
            "gcint_lr_decay": "linear",
            "gcint_lr_shift": -2,
            "mode": "minibatch",
            "fanouts": [4, 4],
            "batch_size": 64,
        },
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_interrupted_run_resumes_to_the_uninterrupted_numbers(tmp_path: Path, case: str) -> None:
    raw = _raw(tmp_path, 6, **CASES[case])
    whole = execute(build_recipe(raw, "whole"), reporter=Reporter())
    run_dir = _interrupted(tmp_path, raw, at=3)  # resume.pt holds epoch 2
    assert [r["epoch"] for r in read_metrics(run_dir)] == [1, 2, 3]
    resumed = execute(recipe_of(run_dir, []), reporter=Reporter(), resume_from=run_dir)
    assert resumed["run_dir"] == str(run_dir) and resumed["resumed_from_epoch"] == 2
    assert _numbers(run_dir) == _numbers(whole["run_dir"])  # epoch 3 redone, 1-6 once each
    for key in ("status", "epochs", "best_epoch", "val_acc", "test_acc", "final_loss"):
        assert resumed[key] == whole[key], key


def test_a_finished_run_is_extended_to_a_longer_runs_numbers(tmp_path: Path) -> None:
    longer = execute(build_recipe(_raw(tmp_path, 6), "longer"), reporter=Reporter())
    short = execute(build_recipe(_raw(tmp_path, 4), "short"), reporter=Reporter())
    run_dir = Path(short["run_dir"])
    extended = execute(
        recipe_of(run_dir, ["train.epochs=6"]), reporter=Reporter(), resume_from=run_dir
    )
    assert _numbers(run_dir) == _numbers(longer["run_dir"])
    assert extended["test_acc"] == longer["test_acc"] and extended["epochs"] == 6
    assert "epochs = 6" in (run_dir / "recipe.toml").read_text()


def test_a_linear_gcint_schedule_is_not_extended(tmp_path: Path) -> None:
    """The linear step falls to zero at the recorded run's end: more epochs would be
    another schedule, not a continuation."""
    raw = _raw(tmp_path, 2, train={"numerics": "gcint", "gcint_lr_decay": "linear"})
    run_dir = Path(execute(build_recipe(raw, "linear"), reporter=Reporter())["run_dir"])
    with pytest.raises(QtrainError, match=r"cannot resume: .*'linear' over updates .* = 2, "):
        execute(recipe_of(run_dir, ["train.epochs=4"]), reporter=Reporter(), resume_from=run_dir)


def test_what_cannot_resume_is_one_line(tmp_path: Path) -> None:
    done = execute(build_recipe(_raw(tmp_path, 2), "done"), reporter=Reporter())
    run_dir = Path(done["run_dir"])
    with pytest.raises(QtrainError, match=r"already has 2 of train\.epochs = 2 epochs; extend"):
        execute(recipe_of(run_dir, []), reporter=Reporter(), resume_from=run_dir)
    with pytest.raises(QtrainError, match=r"only train\.epochs may change"):
        recipe_of(run_dir, ["train.lr=0.1"])
    with pytest.raises(QtrainError, match=r"not a run directory \(no recipe\.toml there\)"):
        recipe_of(tmp_path, [])
    (run_dir / "resume.pt").unlink()
    with pytest.raises(QtrainError, match=r"no resume\.pt there"):
        execute(recipe_of(run_dir, ["train.epochs=3"]), reporter=Reporter(), resume_from=run_dir)
    (run_dir / "resume.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(QtrainError, match=r"resume\.pt cannot be read"):
        execute(recipe_of(run_dir, ["train.epochs=3"]), reporter=Reporter(), resume_from=run_dir)


def test_the_command_resumes_and_refuses_a_recipe_beside_resume(tmp_path: Path) -> None:
    run_dir = _interrupted(tmp_path, _raw(tmp_path, 4), at=3)

    def qtrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qtrain", "run", *args],
            capture_output=True,
            text=True,
            timeout=240,
        )

    done = qtrain("--resume", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert summary["resumed_from_epoch"] == 2
    refused = qtrain(str(run_dir / "recipe.toml"), "--resume", str(run_dir))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"qtrain: error: --resume {run_dir} runs the recipe recorded there; give no recipe file"
    ]
