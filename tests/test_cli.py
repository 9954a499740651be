"""The command line: listings, doctor, runs, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qtrain.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

TINY = """
[model]
name = "gcn"
hidden = 8

[dataset]
name = "synthetic-small"

[train]
epochs = 3

[output]
dir = "{out}"
"""


@pytest.fixture
def tiny_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(out=tmp_path / "runs"))
    return path


def _json_last_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("command", "expected"),
    [("models", "gcnii"), ("datasets", "synthetic-arxiv"), ("plugins", "trace")],
)
def test_listings(command: str, expected: str) -> None:
    result = runner.invoke(app, [command])
    assert result.exit_code == 0, result.output
    assert expected in result.stdout
    listed = runner.invoke(app, [command, "--json"])
    entries = json.loads(listed.stdout)
    assert expected in {e["name"] for e in entries}
    assert all("options" in e and "summary" in e for e in entries)


def test_doctor_reports_versions_compat_and_extension() -> None:
    result = runner.invoke(app, ["doctor", "--json"])
    report = _json_last_line(result.stdout)
    assert report["dgl"].startswith("2.")
    assert report["torch"]
    assert "ext-cpu" in report["extensions"] and "ext-cuda" in report["extensions"]
    # DGL 2.1's graphbolt has no build for the pinned torch: qtrain replaces it
    assert "dgl.graphbolt replaced by an empty module (no build for this torch)" in report["compat"]
    assert report["dgl_import_hook"].startswith("installed")  # qtrain_dgl_hook.pth ran
    assert "qtrain's device route" in report["graph_primitives"]
    assert result.exit_code == (0 if report["healthy"] else 1)
    table = runner.invoke(app, ["doctor"])
    assert "dgl" in table.stdout and "ext-cpu" in table.stdout


def test_run_json_summary_and_run_directory(tiny_recipe: Path) -> None:
    result = runner.invoke(app, ["run", str(tiny_recipe), "--json", "--set", "train.epochs=2"])
    assert result.exit_code == 0, result.output
    summary = _json_last_line(result.stdout)
    for key in (
        "test_acc",
        "val_acc",
        "best_epoch",
        "epochs",
        "epoch_time_s",
        "train_time_s",
        "peak_memory_bytes",
        "run_dir",
        "plugins",
    ):
        assert key in summary, key
    assert summary["epochs"] == 2
    run_dir = Path(summary["run_dir"])
    assert run_dir.name.startswith("tiny-")
    for name in ("recipe.toml", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).exists(), name
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert "epochs = 2" in (run_dir / "recipe.toml").read_text()


def test_a_split_without_nodes_prints_none(tiny_recipe: Path) -> None:
    sets = ["--set", "train.epochs=2", "--set", "dataset.val_fraction=0.0"]
    result = runner.invoke(app, ["run", str(tiny_recipe), *sets])
    assert result.exit_code == 0, result.output
    assert " val none " in result.stdout and "test accuracy 0." in result.stdout


def test_run_with_trace_plugin_reports_primitive_calls(tiny_recipe: Path) -> None:
    result = runner.invoke(app, ["run", str(tiny_recipe), "--json", "--set", "quant.plugin=trace"])
    assert result.exit_code == 0, result.output
    summary = _json_last_line(result.stdout)
    assert summary["plugins"] == ["trace"]
    calls = summary["plugin_reports"]["trace"]["calls"]
    assert calls["gspmm"]["copy_lhs/sum"] > 0 and calls["dense"]["matmul"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "train.epochs=zero"], "train.epochs = 'zero' must be an integer"),
        (["--set", "model.name=resnet"], "unknown model 'resnet'; registered:"),
        (["--set", "dataset.name=imagenet"], "unknown dataset 'imagenet'; registered:"),
        (["--set", "quant.plugin=nope"], "unknown plugin 'nope'; registered:"),
        (["--set", "epochs"], "must look like SECTION.KEY=VALUE"),
        (["--set", "dataset.name=cora"], "cora"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny_recipe: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["run", str(tiny_recipe), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("qtrain: error: ")
    assert message in lines[0]
    assert "Traceback" not in result.output


def test_missing_recipe_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run"])
    assert result.exit_code == 2
    assert "./qtrain.toml does not exist" in result.stderr
    result = runner.invoke(app, ["run", "nothere.toml"])
    assert result.exit_code == 2
    assert "recipe nothere.toml not found" in result.stderr


@pytest.mark.parametrize("source", ["/dev/zero", "big", "directory"])
def test_a_recipe_that_is_no_short_file_is_refused(tmp_path: Path, source: str) -> None:
    """/dev/zero was read until memory ran out; a device or huge file is not a recipe."""
    path = Path(source)
    if source == "big":
        path = tmp_path / "big.toml"
        path.write_text("# padding\n" * 120_000)  # 1.2 MB of valid TOML
    elif source == "directory":
        path = tmp_path
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qtrain: error: recipe "), result.stderr
    assert ("larger than 1 MiB" in lines[0]) != (source == "directory")


def test_debug_shows_the_traceback(tiny_recipe: Path) -> None:
    result = runner.invoke(app, ["run", str(tiny_recipe), "--debug", "--set", "model.name=resnet"])
    assert result.exit_code != 0
    assert result.exception is not None


def test_console_script_keeps_stdout_machine_readable(tiny_recipe: Path, tmp_path: Path) -> None:
    """A real process: the last stdout line parses as JSON even with DGL printing."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qtrain",
            "run",
            str(tiny_recipe),
            "--json",
            "--set",
            "train.epochs=1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert _json_last_line(proc.stdout)["epochs"] == 1
    bad = subprocess.run(
        [sys.executable, "-m", "qtrain", "run", str(tiny_recipe), "--set", "train.lr=-1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "qtrain: error: train.lr = -1.0 is too small; allowed: >= 0.0"
    assert bad.stdout == ""


def test_the_command_asks_for_huge_pages_unless_told_otherwise() -> None:
    """``qtrain`` (cli.main) sets THP_MEM_ALLOC_ENABLE=1 for torch's allocator before torch
    is even imported (torch reads it at its first allocation); a user's value wins."""
    probe = (
        "import os, sys; from qtrain.cli import main; torch = 'torch' in sys.modules; "
        "sys.argv = ['qtrain', '--help']\n"
        "try: main()\n"
        "except SystemExit: pass\n"
        "print(torch, os.environ.get('THP_MEM_ALLOC_ENABLE'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    for given, expected in ((None, "1"), ("0", "0")):
        run_env = env if given is None else {**env, "THP_MEM_ALLOC_ENABLE": given}
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=run_env
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == f"False {expected}", done.stdout


def test_import_qtrain_leaves_the_allocator_alone() -> None:
    """A library import (or a user's ``import dgl``, which imports qtrain) sets nothing."""
    probe = "import os, qtrain, dgl; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))"
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "None"


def test_version_needs_no_command() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip().startswith("qtrain 0.")


def test_json_prints_the_summary_of_a_run_that_did_not_complete(tiny_recipe: Path) -> None:
    sets = ["--set", "train.lr=1e30", "--set", "train.epochs=20"]
    result = runner.invoke(app, ["run", str(tiny_recipe), "--json", *sets])
    assert result.exit_code == 1
    summary = _json_last_line(result.stdout)
    assert summary["status"] == "diverged" and summary["diverged_at"] is not None


def test_a_diverging_run_exits_1_with_one_line(tiny_recipe: Path) -> None:
    result = runner.invoke(
        app, ["run", str(tiny_recipe), "--set", "train.lr=1e30", "--set", "train.epochs=20"]
    )
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("qtrain: error")]
    assert len(lines) == 1 and "diverged at epoch" in lines[0] and "Traceback" not in result.stderr


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """What schedulers and `timeout` send: the summary says interrupted, metrics and the
    best checkpoint stay."""
    import signal
    import time

    path = tmp_path / "long.toml"
    path.write_text(TINY.format(out=tmp_path / "runs").replace("epochs = 3", "epochs = 100000"))
    env = {**os.environ, "QTRAIN_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qtrain", "run", str(path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        metrics: list[Path] = []
        while time.monotonic() < deadline:
            metrics = list((tmp_path / "runs").glob("*/metrics.jsonl"))
            if metrics and len(metrics[0].read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert metrics, "the run never wrote an epoch"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=240)  # 2 busy cores in CI: be patient
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    run_dir = metrics[0].parent
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["epochs"] >= 2
    assert (run_dir / "checkpoint.pt").exists()
    assert "interrupted" in stderr and "Traceback" not in stderr
