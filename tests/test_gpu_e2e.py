"""bench/gpu_e2e.py on the CPU, as CI can run it: the built-in GCN, GAT and GraphSAGE
trained through qtrain's device route (``graph_kernels = "qtrain"``) on a 300-node
synthetic graph, in a subprocess (the command a GPU session runs, with ``--device cpu
--size tiny``); and bench/gpu.py's DGL install step for the GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gcn": "GCNConv", "gat": "GATConv", "sage": "SAGEConv"}
QTRAIN = (
    "qtrain FP32 (route)",
    "qtrain bf16 autocast (route)",
    "qtrain tango 8-bit (route)",
    "qtrain tango 8-bit nearest (route)",
    "qtrain exact INT2 (route)",
    "qtrain tango 8-bit + exact INT2 (route)",
)
ROW_KEYS = {
    "case",
    "shape",
    "ms",
    "baseline",
    "baseline_ms",
    "ratio",
    "gbps",
    "bw_fraction",
    "peak_memory_bytes",
    "test_acc",
    "status",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu_e2e")
    env = {**os.environ, "QTRAIN_DATA_DIR": str(out / "data")}
    command = ["bench/gpu_e2e.py", "--device", "cpu", "--size", "tiny"]
    done = subprocess.run(
        [sys.executable, *command, "--json", str(out / "rows.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    record = json.loads((out / "rows.json").read_text())
    record["stdout"] = done.stdout
    return record


def rows_of(record: dict[str, Any], variant: str) -> list[dict[str, Any]]:
    found = [r for r in record["rows"] if r["variant"] == variant]
    assert [r["model"] for r in found] == list(MODELS), variant
    return found


def test_every_model_has_every_row(tiny: dict[str, Any]) -> None:
    expected = [
        (model, variant)
        for model, conv in MODELS.items()
        for variant in (*QTRAIN, f"PyG {conv} FP32", f"PyG {conv} bf16 autocast")
    ]
    assert [(r["model"], r["variant"]) for r in tiny["rows"]] == expected
    for row in tiny["rows"]:
        assert set(row) >= ROW_KEYS, row["case"]
        assert row["size"] == "tiny" and row["device"] == "cpu"
        assert row["gbps"] is None and row["bw_fraction"] is None
        assert row["baseline"] == "qtrain FP32 (route)"
        assert row["case"] in tiny["stdout"]  # the table printed


def test_fp32_rows_train_on_the_route_well_above_chance(tiny: dict[str, Any]) -> None:
    for row in rows_of(tiny, "qtrain FP32 (route)"):
        assert row["status"] == "ok", row["case"]
        assert row["graph_kernels"] == "qtrain"
        assert row["kernels"]["spmm"]["route"] > 0  # the route ran DGL's SpMM
        assert row["accuracy_ok"] and row["test_acc"] >= row["accuracy_bar"] > row["chance"]
        assert row["epochs"] == 30 and row["timed_epochs"] == 30 - row["warmup_epochs"]
        assert 0 < row["ms_min"] <= row["ms_q1"] <= row["ms"] <= row["ms_q3"] <= row["ms_max"]
        assert row["ratio"] == 1.0 and row["baseline_ms"] == row["ms"]


@pytest.mark.parametrize("variant", QTRAIN[2:])
def test_plugin_rows_run_on_the_route(tiny: dict[str, Any], variant: str) -> None:
    for row in rows_of(tiny, variant):
        assert row["status"] == "ok", (row["case"], row["status"])
        assert row["graph_kernels"] == "qtrain"
        assert row["ms"] > 0 and row["ratio"] > 0 and row["test_acc"] is not None
        assert set(row["plugins"]) == {"tango", "exact"} & set(variant.split())


def test_bf16_autocast_rows_run_on_the_route(tiny: dict[str, Any]) -> None:
    """The whole run inside torch.autocast(bfloat16): the route must multiply the
    half-precision operands of its CSR products in float32 (no sparse bf16 kernel on the
    CPU), and the model must learn (autocast's weight cache is off)."""
    for row in rows_of(tiny, "qtrain bf16 autocast (route)"):
        assert row["status"] == "ok", (row["case"], row["status"])
        assert row["graph_kernels"] == "qtrain"
        assert row["kernels"]["spmm"]["route"] > 0
        assert row["test_acc"] >= 2 * row["chance"]  # it learns


def test_pyg_rows_run_or_say_why_not(tiny: dict[str, Any]) -> None:
    installed = importlib.util.find_spec("torch_geometric") is not None
    pyg = [r for r in tiny["rows"] if r["variant"].startswith("PyG ")]
    assert len(pyg) == 2 * len(MODELS)
    for row in pyg:
        assert row["variant"].split()[1] == MODELS[row["model"]]
        if installed:
            assert row["status"] == "ok" and row["ms"] > 0, row["status"]
        else:
            assert row["status"].startswith("not installed: PyTorch Geometric")
            assert row["ms"] is None and row["ratio"] is None


def _gpu_script() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def test_gpu_script_leaves_an_importable_dgl_alone(tmp_path: Path) -> None:
    gpu = _gpu_script()
    assert gpu.ensure_dgl(tmp_path / "dgl.log") == {"installed": False, "dgl": "2.1.0"}


def test_gpu_script_reports_a_failed_dgl_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No DGL: each way the install can fail is an error naming its cause (bench/gpu.py
    then fails the end-to-end stage alone)."""
    gpu = _gpu_script()
    missing = subprocess.CompletedProcess([], 1, "", "ModuleNotFoundError: No module named 'dgl'")
    monkeypatch.setattr(gpu, "_dgl_imports", lambda: missing)
    monkeypatch.setattr(gpu, "GPU_WHEELS", tmp_path / "none")
    assert "make gpu-wheels" in gpu.ensure_dgl(tmp_path / "dgl.log")["error"]

    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(gpu, "GPU_WHEELS", tmp_path / "empty")
    monkeypatch.setattr(gpu, "ROOT", tmp_path)
    # pip is satisfied here (this environment has DGL), but the import still fails
    result = gpu.ensure_dgl(tmp_path / "dgl.log")
    assert result["returncode"] == 0
    assert result["error"].startswith("import dgl still fails after the install")
    # a wheel that is not there
    monkeypatch.setattr(gpu, "DGL_REQUIREMENTS", ("qtrain-no-such-package==0",))
    result = gpu.ensure_dgl(tmp_path / "dgl.log")
    assert result["installed"] is False and result["returncode"] != 0
    assert result["error"].startswith("pip install from empty failed")
    assert "--no-index" in (tmp_path / "dgl.log").read_text()


def test_variants_choose_rows_beside_fp32(tmp_path: Path) -> None:
    """``--variants`` (a lent GPU's ten-minute call fits a few rows at products scale): the
    rows named, always after FP32, and no PyG row unless named; an unknown name is refused."""
    env = {**os.environ, "QTRAIN_DATA_DIR": str(tmp_path / "data")}
    command = [sys.executable, "bench/gpu_e2e.py", "--device", "cpu", "--size", "tiny"]
    done = subprocess.run(
        [*command, "--models", "gcn", "--variants", "tango-nearest", "--json", str(tmp_path / "r")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads((tmp_path / "r").read_text())["rows"]
    assert [r["variant"] for r in rows] == [QTRAIN[0], QTRAIN[3]]
    assert rows[1]["ratio"] > 0 and rows[1]["ratio_vs_pyg_fp32"] is None
    bad = subprocess.run(
        [*command, "--variants", "tango,fp16"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "--variants takes names of bf16, tango, tango-nearest" in bad.stderr.splitlines()[-1]
