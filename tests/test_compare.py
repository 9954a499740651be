"""``qtrain compare``: FP32 and policies on one recipe, interleaved, in one table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qtrain.compare import RunResult, Variant, variant_recipe, variants
from qtrain.compare.report import build_report, markdown, table_rows
from qtrain.errors import QtrainError, RecipeError
from qtrain.recipe import build_recipe


def _recipe(tmp_path: Path, **quant: Any) -> Any:
    return build_recipe(
        {
            "model": {"name": "gcn", "hidden": 8},
            "dataset": {"name": "synthetic-small", "nodes": 300},
            "train": {"epochs": 3, "seed": 5},
            "quant": quant or {"plugin": []},
            "output": {"dir": str(tmp_path / "runs")},
        },
        "cmp",
    )


def test_variants_are_fp32_then_each_policy_once(tmp_path: Path) -> None:
    plain = _recipe(tmp_path)
    assert variants(plain, []) == [Variant("fp32", ()), Variant("tango", ("tango",))]
    assert [v.label for v in variants(plain, ["exact", "tango + exact", "exact", "fp32"])] == [
        "fp32",
        "exact",
        "tango+exact",
    ]
    configured = _recipe(tmp_path, plugin=["tango", "exact"])
    assert variants(configured, [])[1] == Variant("tango+exact", ("tango", "exact"))
    with pytest.raises(RecipeError, match=r"unknown plugin 'tangoo'"):
        variants(plain, ["tangoo"])
    with pytest.raises(QtrainError, match=r"each once"):
        variants(plain, ["tango+tango"])
    with pytest.raises(QtrainError, match=r"at least one policy besides fp32"):
        variants(plain, ["fp32"])


def test_a_policy_takes_the_recipes_options_and_defaults_for_the_rest(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, plugin=["tango"], tango={"bits": 4})
    one = variant_recipe(recipe, Variant("tango+exact", ("tango", "exact")), 7, tmp_path / "c")
    assert one.quant.plugins == ("tango", "exact")
    assert one.quant.configs["tango"].bits == 4 and one.quant.configs["exact"].bits == 2
    assert one.train.seed == 7 and one.output.dir == str(tmp_path / "c" / "runs")
    assert not one.output.checkpoint
    fp32 = variant_recipe(recipe, Variant("fp32", ()), 7, tmp_path / "c")
    assert fp32.quant.plugins == () and fp32.model == recipe.model


def _result(variant: str, seed: int, status: str = "completed", **summary: Any) -> RunResult:
    base = {
        "status": status,
        "metric": "accuracy",
        "test_acc": 0.5,
        "epoch_time_s": 0.1,
        "activation_bytes": 8 * 2**20,
        "peak_memory_bytes": 400 * 2**20,
        "process_peak_memory_bytes": 500 * 2**20,
        "kernels": {"spmm": {"fp32": 3}},
        "run_dir": f"/runs/{variant}-{seed}",
    }
    return RunResult(variant, seed, 0, {**base, **summary})


def test_the_report_gives_mean_spread_and_ratios_to_fp32(tmp_path: Path) -> None:
    columns = [Variant("fp32", ()), Variant("exact", ("exact",))]
    results = [
        _result("fp32", 5, test_acc=0.80, epoch_time_s=0.10),
        _result(
            "exact",
            5,
            test_acc=0.78,
            epoch_time_s=0.12,
            activation_bytes=2**20,
            kernels={"spmm": {"fp32": 3}, "compress": {"ext-cpu": 4, "reference": 0}},
        ),
        _result("fp32", 6, test_acc=0.84, epoch_time_s=0.14),
        _result("exact", 6, status="diverged", test_acc=None),
    ]
    report = build_report(_recipe(tmp_path), columns, results, seeds=2, repeats=1)
    fp32, exact = report["rows"]
    assert fp32["test_metric"]["mean"] == pytest.approx(0.82)
    assert fp32["test_metric"]["std"] == pytest.approx(0.0282842712)
    assert fp32["epoch_ms"] == pytest.approx({"median": 120.0, "min": 100.0, "max": 140.0})
    assert (exact["runs"], exact["completed"], exact["statuses"]) == (
        2,
        1,
        ["completed", "diverged"],
    )
    assert exact["test_metric"]["std"] is None  # one completed run: no spread to show
    assert exact["vs_fp32"]["epoch_time"] == pytest.approx(1.0)  # 120 ms / 120 ms
    assert exact["vs_fp32"]["activation"] == pytest.approx(8.0)  # fp32 / exact: 8x smaller
    assert exact["kernels"] == {"compress": ["ext-cpu"], "spmm": ["fp32"]}
    assert report["seeds"] == [5, 6]
    rows = table_rows(report)
    assert rows[2][3] == "1.00x" and rows[2][5] == "8.00x" and rows[2][-1] == "1/2"
    assert len(table_rows(report, compact=True)[0]) == 9
    text = markdown(report)
    assert "| exact | 0.7800 | 120.0 (120.0-120.0) | 1.00x |" in text
    assert "- exact: compress: ext-cpu; spmm: fp32" in text


def _qtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qtrain", *args], capture_output=True, text=True, timeout=600
    )


def test_the_command_runs_every_variant_interleaved_and_writes_the_files(tmp_path: Path) -> None:
    recipe = tmp_path / "cmp.toml"
    recipe.write_text(
        '[model]\nname = "gcn"\nhidden = 8\n[dataset]\nname = "synthetic-small"\nnodes = 300\n'
        f'[train]\nepochs = 3\n[output]\ndir = "{tmp_path / "runs"}"\n'
    )
    done = _qtrain("compare", str(recipe), "--policy", "trace", "--seeds", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["variant"] for r in report["rows"]] == ["fp32", "trace"]
    fp32, trace = report["rows"]
    assert fp32["completed"] == trace["completed"] == 2
    # trace changes no numbers: the same accuracy per seed
    assert trace["test_metric"]["values"] == fp32["test_metric"]["values"]
    progress = [line for line in done.stderr.splitlines() if line.startswith("qtrain compare: [")]
    assert [line.split("] ")[1] for line in progress] == [
        "fp32, seed 0",
        "trace, seed 0",
        "fp32, seed 1",
        "trace, seed 1",
    ]
    for path in report["files"].values():
        assert Path(path).is_file()
    assert Path(report["files"]["png"]).read_bytes()[:4] == b"\x89PNG"
    refused = _qtrain("compare", str(recipe), "--policy", "tangoo")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "unknown plugin 'tangoo'" in refused.stderr
