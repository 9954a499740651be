"""``qtrain profile``: span attribution (pure), and the command on a tiny recipe."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import require_ext
from typer.testing import CliRunner

from qtrain.cli import app
from qtrain.profiling.attribution import (
    EPOCH_SCOPE,
    OP_SCOPE,
    attribute,
    classify,
    rows,
    top_other,
)

runner = CliRunner()

TINY_GAT = """
[model]
name = "gat"
hidden = 8
heads = 2

[dataset]
name = "synthetic-small"

[train]
epochs = 3

[output]
dir = "{out}"
"""


@dataclass
class FakeSpan:
    name: str
    duration_us: float
    children: list[FakeSpan] = field(default_factory=list)


def _epoch(*children: FakeSpan, total: float) -> FakeSpan:
    return FakeSpan(EPOCH_SCOPE, total, list(children))


# ------------------------------------------------------------------ attribution


def test_classify_names() -> None:
    assert classify("qtrain::gemm[ext-cpu]") == ("GEMM", "ext-cpu")
    assert classify("qtrain::compress[ext-cpu]") == ("quantize", "ext-cpu")
    assert classify("qtrain::quantize_rows[ext-cpu]") == ("quantize", "ext-cpu")
    assert classify("qtrain::quantize_cols[ext-cuda]") == ("quantize", "ext-cuda")
    assert classify("qtrain::hadamard_rotate[ext-cpu]") == ("quantize", "ext-cpu")
    assert classify("autograd::engine::evaluate_function: RowQuantLinearBackward") == (
        "GEMM",
        None,
    )
    assert classify("qtrain::decompress+unproject[reference]") == ("projection", "reference")
    assert classify(OP_SCOPE + "SpMM") == ("SpMM", None)
    assert classify(OP_SCOPE + "nonsense") is None
    assert classify("autograd::engine::evaluate_function: GSpMMBackward") == ("SpMM", None)
    assert classify("autograd::engine::evaluate_function: QuantLinearBackward") == ("GEMM", None)
    assert classify("autograd::engine::evaluate_function: ReluBackward0") is None
    assert classify("aten::addmm") == ("GEMM", None)
    assert classify("Optimizer.step#Adam.step") == ("optimizer", None)
    assert classify("aten::relu") is None
    assert classify("qtrain::unknown[ext-cpu]") is None


def test_attribution_charges_every_microsecond_once() -> None:
    quantized_gemm = FakeSpan(
        OP_SCOPE + "GEMM",
        100,
        [
            FakeSpan("qtrain::quantize[ext-cpu]", 30, [FakeSpan("aten::empty", 1)]),
            FakeSpan("qtrain::gemm[ext-cpu]", 50, [FakeSpan("aten::empty", 2)]),
        ],
    )
    fp32_gemm = FakeSpan(OP_SCOPE + "GEMM", 40, [FakeSpan("aten::mm", 35)])
    spmm = FakeSpan(OP_SCOPE + "SpMM", 20)  # DGL: no kernel scope inside
    relu = FakeSpan("aten::relu", 10, [FakeSpan("aten::clamp_min", 6)])
    backward = FakeSpan(
        "autograd::engine::evaluate_function: MmBackward0", 60, [FakeSpan("aten::mm", 55)]
    )
    compress = FakeSpan("qtrain::compress[ext-cpu]", 5)  # exact's hook, at top level
    epoch = _epoch(quantized_gemm, fp32_gemm, spmm, relu, backward, compress, total=250)
    profiled = attribute([epoch, epoch])
    assert profiled.epochs == 2
    assert profiled.untraced_us == 2 * (250 - 235)
    table = {(r.name, r.backend): r for r in rows(profiled)}
    # the quantized GEMM's own time excludes its quantize call, which is a row of its own
    assert table[("GEMM", "ext-cpu")].total_ms == pytest.approx(0.070)
    assert table[("GEMM", "ext-cpu")].quantizing_share == pytest.approx(30 / 100)
    # FP32 GEMM forward + MmBackward0: two calls per epoch, aten::mm merged into them
    assert table[("GEMM", "torch")].calls == 2
    assert table[("GEMM", "torch")].total_ms == pytest.approx(0.100)
    assert table[("GEMM", "torch")].quantizing_share is None
    assert table[("SpMM", "dgl")].total_ms == pytest.approx(0.020)
    assert table[("quantize", "ext-cpu")].calls == 2  # inside the GEMM, and exact's
    assert table[("quantize", "ext-cpu")].total_ms == pytest.approx(0.035)
    assert table[("other", "torch")].total_ms == pytest.approx(0.010)
    # rows + untraced = the epoch
    total = sum(r.total_ms for r in table.values()) + profiled.untraced_us / 2 / 1e3
    assert total == pytest.approx(0.250)
    assert sum(r.share for r in table.values()) == pytest.approx(235 / 250)
    assert top_other(profiled) == [("aten::relu", pytest.approx(0.010))]


def test_attribution_of_nothing() -> None:
    profiled = attribute([])
    assert profiled.epochs == 0 and rows(profiled) == []


# ------------------------------------------------------------------ the command


@pytest.fixture
def tiny_gat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "gat.toml"
    path.write_text(TINY_GAT.format(out=tmp_path / "runs"))
    return path


def _json_last_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_profile_json_rows_add_up_and_files_are_written(tiny_gat: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    result = runner.invoke(
        app,
        [
            "profile",
            str(tiny_gat),
            "--epochs",
            "2",
            "--warmup",
            "1",
            "--json",
            "--trace",
            str(trace),
        ],
    )
    assert result.exit_code == 0, result.output
    out = _json_last_line(result.stdout)
    assert out["epochs"] == 2 and out["epoch_ms"] > 0
    names = {p["name"] for p in out["primitives"]}
    assert {"GEMM", "SpMM", "SDDMM", "edge softmax", "optimizer"} <= names
    for p in out["primitives"]:
        assert set(p) >= {"name", "backend", "calls", "total_ms", "median_ms", "share"}
        assert p["calls"] > 0 and p["total_ms"] >= 0 and p["median_ms"] >= 0
    # time is attributed once (a quantize inside a GEMM is not counted twice), so the
    # primitives never add up to more than the epoch, and the profiler sees most of it
    traced = sum(p["total_ms"] for p in out["primitives"])
    assert traced <= out["epoch_ms"] * (1 + 1e-6) and out["untraced_ms"] >= 0
    assert out["traced_share"] == pytest.approx(traced / out["epoch_ms"])
    assert out["traced_share"] > 0.5
    run_dir = Path(out["run_dir"])
    assert (run_dir / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run_dir / "profile.json").read_text())["epoch_ms"] == out["epoch_ms"]
    assert (run_dir / "recipe.toml").exists()
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "qtrain::epoch" for e in events)


def test_profile_compare_fp32_adds_speedups(tiny_gat: Path) -> None:
    require_ext()
    result = runner.invoke(
        app,
        [
            "profile",
            str(tiny_gat),
            "--epochs",
            "1",
            "--warmup",
            "1",
            "--compare",
            "fp32",
            "--set",
            'quant.plugin=["tango"]',
            "--set",
            "quant.tango.fp32_when_small=false",  # quantized GEMMs on this tiny graph
        ],
    )
    assert result.exit_code == 0, result.output
    assert "vs fp32" in result.stdout and "ext-cpu" in result.stdout
    assert "tango_cache" in result.stdout
    quick = ["--epochs", "1", "--warmup", "0", "--compare", "fp32", "--json"]
    as_json = runner.invoke(
        app,
        [
            "profile",
            str(tiny_gat),
            *quick,
            "--set",
            'quant.plugin=["tango"]',
            "--set",
            "quant.tango.fp32_when_small=false",
        ],
    )
    out = _json_last_line(as_json.stdout)
    compare = out["compare"]
    assert compare["baseline"] == "fp32" and compare["epoch_ms"] > 0
    assert compare["speedup"]["epoch"] == pytest.approx(compare["epoch_ms"] / out["epoch_ms"])
    spread = compare["epoch_speedup_spread"]  # one run each: the ratio comes with its range
    assert spread["min"] <= spread["median"] <= spread["max"] and spread["epochs"] == [1, 1]
    assert "epoch speedup vs fp32" in result.stdout and "range" in result.stdout
    # the FP32 baseline runs no quantized kernel: qtrain's own only unpack its node-keyed
    # dropout masks (GAT's dropout is qtrain's since 2026-12-01)
    own = {p["name"] for p in compare["primitives"] if p["backend"] not in ("torch", "dgl")}
    assert own <= {"unpack"}, compare["primitives"]
    gemm = [p for p in out["primitives"] if p["name"] == "GEMM" and p["backend"] == "ext-cpu"]
    assert gemm and 0 < gemm[0]["quantizing_share"] < 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "int4"], "--compare must be one of fp32, bf16"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--trace", "/nonexistent/dir/t.json"], "does not exist"),
        (["--set", "distributed.world_size=2"], "qtrain profile runs one process"),
    ],
)
def test_profile_bad_options_are_one_line(tiny_gat: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["profile", str(tiny_gat), *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
