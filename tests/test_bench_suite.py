"""bench/suite.py's pure parts: script JSON -> cases and ratios -> markdown (nothing is timed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import BENCH, bench_script


@pytest.fixture(scope="module")
def suite() -> Any:
    yield from bench_script("suite")


# trimmed copies of what each script writes with --json
GEMM = {
    "isa": "avx512vnni",
    "torch": "2.13.0+cpu",
    "results": [
        {
            "hidden": 128,
            "case": "fwd X@W nearest",
            "fp32_ms": 30.0,
            "bf16_ms": 20.0,
            "qtrain_ms": 10.0,
        },
    ],
}
SPARSE = {
    "meta": {"isa": "avx512vnni", "torch": "2.13.0+cpu", "dgl": "2.1.0"},
    "results": [
        {
            "op": "copy_u_sum",
            "shape": "x[N,128]",
            "dgl_fp32_ms": 90.0,
            "dgl_bf16_ms": 60.0,
            "qtrain_nearest_ms": 30.0,
            "qtrain_nearest_iqr_ms": 1.5,
            "qtrain_stochastic_ms": 45.0,
            "dgl_fp32_iqr_ms": 4.0,
        },
        {
            "op": "u_dot_v",
            "shape": "[N,128] . [N,128]",
            "dgl_fp32_ms": 100.0,
            "dgl_bf16_ms": "unsupported (DGLError)",
            "qtrain_nearest_ms": 25.0,
        },
    ],
}
EPOCH = {
    "models": {
        "gcn": {
            "fp32": {"median_s": 5.0},
            "bf16-autocast": {"median_s": 4.0},
            "tango": {"median_s": 2.5, "iqr_s": 0.125},
        },
        "gat": {
            "fp32": {"median_s": 12.0},
            "bf16-autocast": {"error": "DGLError: node features bf16, edge features float32"},
            "tango": {"median_s": 6.0},
        },
    }
}
MIB = 2**20
EXACT = {
    "memory": {
        "sage": {
            "fp32": {
                "activation_bytes": 1000 * MIB,
                "peak_memory_bytes": 4000 * MIB,
                "step_added_bytes": 1500 * MIB,
                "trains": True,
            },
            "int2": {
                "activation_bytes": 50 * MIB,
                "peak_memory_bytes": 3200 * MIB,
                "step_added_bytes": 600 * MIB,
                "trains": True,
            },
            "rp8-int2": {"activation_bytes": 40 * MIB, "trains": True},
        },
    },
    "time": {
        "sage": {
            "fp32": {"median_s": 8.0},
            "int2": {"median_s": 10.0},
            "rp8-int2": {"median_s": 12.5},
        }
    },
    "bars": [
        {
            "bar": "sage activation memory fp32 / int2",
            "value": 20.0,
            "want": ">= 10x",
            "pass": True,
        },
        {"bar": "sage epoch time rp8-int2 / int2", "value": 1.25, "want": "<= 1.00", "pass": False},
    ],
}
EXACT_OPS = {
    "median_ms": {
        "fused project + quantize INT2 [256 -> 32]": 20.0,
        "unfused: quantize rows INT2 [169343, 32] (projected)": 5.0,
        "unfused: projection x @ R [256 -> 32]": 35.0,
        "unfused: projection y @ R^T [32 -> 256]": 60.0,
        "fused dequantize + project back INT2 [32 -> 256]": 30.0,
        "ReLU backward: masked_scale from packed bits": 15.0,
        "ReLU backward: torch threshold_backward": 60.0,
        "INT1 rows: side means [169343, 256]": 9.0,
        "INT1 rows: stochastic [169343, 256]": 6.0,
    },
    "iqr_ms": {
        "fused project + quantize INT2 [256 -> 32]": 1.0,
        "ReLU backward: masked_scale from packed bits": 0.5,
        "ReLU backward: torch threshold_backward": 2.0,
    },
}
GIB = 2**30
CAPACITY = {
    "budget_gib": 6.0,
    "hidden": 16,
    "layers": 2,
    "variants": {
        "fp32": {
            "outcome": "killed at the budget",
            "max_rss_bytes_polled": int(6.01 * GIB),
            "max_hwm_bytes_polled": int(6.01 * GIB),
            "steps_finished": 0,
        },
        "int2": {
            "outcome": "finished",
            "max_rss_bytes_polled": int(4.5 * GIB),
            "max_hwm_bytes_polled": int(4.6 * GIB),
            "steps_finished": 1,
            "losses": [3.8],
            "params_finite": True,
        },
    },
    "bars": {"fp32 exceeds the budget": True, "int2 trains under the budget": True},
}
ADAQP = {
    "workers": 4,
    "seeds": [0, 1],
    "results": {
        "gcn": {
            "single": [{"test_acc": 0.70}, {"test_acc": 0.72}],
            "w32": [
                {
                    "test_acc": 0.70,
                    "comm_bytes_per_epoch": 100 * MIB,
                    "time_per_epoch_s": {"epoch": 3.0},
                },
                {
                    "test_acc": 0.72,
                    "comm_bytes_per_epoch": 100 * MIB,
                    "time_per_epoch_s": {"epoch": 3.4},
                },
            ],
            "adaptive": [
                {
                    "test_acc": 0.69,
                    "comm_bytes_per_epoch": 10 * MIB,
                    "time_per_epoch_s": {"epoch": 2.0},
                },
                {
                    "test_acc": 0.71,
                    "comm_bytes_per_epoch": 15 * MIB,
                    "time_per_epoch_s": {"epoch": 2.0},
                },
            ],
        }
    },
    "bars": [
        {"model": "gcn", "bar": "adaptive / 32-bit bytes per epoch", "value": 0.125, "pass": True},
        {
            "model": "gcn",
            "bar": "adaptive+overlap / 32-bit epoch time",
            "value": 0.625,
            "pass": True,
        },
    ],
}


def _hector_row(ms: float, saved: float) -> dict[str, Any]:
    return {"train_ms": ms, "train_iqr_ms": 0.5, "saved_mib": saved}


HECTOR = {
    "presets": {
        preset: {
            "edges": edges,
            "relations": relations,
            "models": {
                "rgcn": {
                    "dgl": _hector_row(4 * ms, 20.0),
                    "hector": _hector_row(ms, 10.0),
                    "hector+tango": _hector_row(ms / tango, 6.0),
                    "pyg": _hector_row(40 * ms, 90.0),
                },
            },
        }
        for preset, edges, relations, ms, tango in (
            ("aifb", 49_000, 104, 10.0, 0.9),
            ("fb15k", 100_000, 474, 40.0, 1.6),
        )
    },
    "bars": {
        "rgcn": {
            "variant": "hector",
            "baseline": "dgl",
            "train_geomean": 4.0,
            "bar": 2.0,
            "met": True,
            "tango_over_hector": 1.2,
            "tango_met": True,
        }
    },
    "accuracy": {"rgcn": {"tango_drop": 0.004, "met": True}},
}
RAW = {
    "gemm.py": GEMM,
    "sparse.py": SPARSE,
    "epoch.py": EPOCH,
    "exact.py": EXACT,
    "exact_ops.py": EXACT_OPS,
    "exact_capacity.py": CAPACITY,
    "adaqp.py": ADAQP,
    "hector.py": HECTOR,
}


def _find(
    cases: list[dict[str, Any]], family: str, name: str, baseline: str, metric: str = ""
) -> dict[str, Any]:
    """The case named ``name`` exactly, or else the one case whose name starts with it
    (of the measure starting with ``metric``)."""
    mine = [
        c
        for c in cases
        if c["family"] == family
        and c["baseline_name"] == baseline
        and c["metric"].startswith(metric)
    ]
    hits = [c for c in mine if c["case"] == name] or [c for c in mine if c["case"].startswith(name)]
    assert len(hits) == 1, (family, name, baseline, [c["case"] for c in mine])
    return hits[0]


def test_ratios_are_baseline_over_value(suite: Any) -> None:
    cases = suite.collect(RAW)
    g = _find(cases, "gemm", "fwd X@W nearest, hidden 128", "FP32")
    assert (g["value"], g["baseline"], g["ratio"], g["unit"]) == (10.0, 30.0, 3.0, "ms")
    assert _find(cases, "gemm", "fwd X@W nearest", "bf16 autocast")["ratio"] == 2.0

    assert _find(cases, "sparse", "copy_u_sum x[N,128]", "DGL FP32")["ratio"] == 3.0
    stoch = _find(cases, "sparse", "copy_u_sum x[N,128], stochastic", "DGL bf16 autocast")
    assert stoch["ratio"] == pytest.approx(60 / 45)

    gcn = _find(cases, "epoch", "GCN", "DGL bf16 autocast")
    assert (gcn["value"], gcn["baseline"], gcn["ratio"]) == (2500.0, 4000.0, 1.6)
    assert _find(cases, "epoch", "GAT", "DGL FP32")["ratio"] == 2.0

    mem = _find(cases, "exact-memory", "SAGE 3 x 256 (mean), exact INT2", "FP32", "activations")
    assert (mem["value"], mem["baseline"], mem["ratio"], mem["unit"]) == (50.0, 1000.0, 20.0, "MiB")
    assert mem["pass"] is True
    int2 = _find(cases, "exact-epoch", "SAGE 3 x 256 (mean), exact INT2", "FP32")
    assert int2["ratio"] == pytest.approx(0.8)  # 25 % slower
    rp = _find(cases, "exact-epoch", "SAGE 3 x 256 (mean), exact RP 8", "exact INT2")
    assert rp["ratio"] == pytest.approx(0.8) and rp["pass"] is False
    assert _find(cases, "exact-epoch", "SAGE 3 x 256 (mean), exact RP 8", "FP32")["ratio"] == 0.64

    fused = _find(cases, "exact-ops", "RP 8 + INT2 compress", "torch / unfused")
    assert (fused["baseline"], fused["ratio"]) == (40.0, 2.0)  # x @ R + quantize, measured
    assert _find(cases, "exact-ops", "ReLU backward", "torch / unfused")["ratio"] == 4.0
    means = _find(cases, "exact-ops", "INT1 compress: side means", "INT1 stochastic")
    assert (means["value"], means["baseline"]) == (9.0, 6.0)

    cap = _find(cases, "exact-capacity", "SAGE 2 x 16 full graph, 6 GiB budget", "FP32")
    assert cap["value"] == pytest.approx(4.6) and cap["baseline"] == pytest.approx(6.01)
    assert cap["ratio"] == pytest.approx(6.01 / 4.6) and cap["pass"] is True
    assert "FP32 killed at the budget" in cap["note"]


def test_unmeasured_cases_have_no_ratio_and_say_why(suite: Any) -> None:
    cases = suite.collect(RAW)
    dot = _find(cases, "sparse", "u_dot_v", "DGL bf16 autocast")
    assert dot["ratio"] is None and dot["baseline"] is None
    assert "unsupported (DGLError)" in dot["note"]
    gat = _find(cases, "epoch", "GAT", "DGL bf16 autocast")
    assert gat["ratio"] is None and "node features bf16" in gat["note"]
    # a measured case carries no note
    assert _find(cases, "gemm", "fwd X@W nearest", "FP32")["note"] is None

    # a script that failed is one case saying so; one that was not run is absent
    partial = suite.collect({"gemm.py": GEMM}, {"sparse.py": "exit status 1"})
    families = {c["family"] for c in partial}
    assert families == {"gemm", "sparse"}
    failed = [c for c in partial if c["family"] == "sparse"]
    assert len(failed) == 1 and failed[0]["ratio"] is None
    assert "exit status 1" in failed[0]["note"]

    # a capacity run whose exact child did not finish gives no ratio
    broken = {
        **CAPACITY,
        "variants": {**CAPACITY["variants"], "int2": {"outcome": "killed at the budget"}},
    }
    (cap,) = suite.cases_capacity(broken)
    assert cap["ratio"] is None and "exact INT2 killed at the budget" in cap["note"]

    # JSON of an unexpected shape does not stop the others
    odd = suite.collect({"gemm.py": {"results": [{"hidden": 1}]}, "epoch.py": EPOCH})
    assert any(c["family"] == "gemm" and c["ratio"] is None for c in odd)
    assert any(c["family"] == "epoch" and c["ratio"] == 2.0 for c in odd)


def test_markdown(suite: Any) -> None:
    doc = {
        "host": "box",
        "date": "2026-11-23 05:00 UTC",
        "command": "python bench/suite.py --quick",
        "git_commit": "abc123",
        "threads": 2,
        "cpu": "AMD EPYC",
        "cores": 2,
        "isa": "avx512vnni",
        "quick": True,
        "seconds": 250.0,
        "jobs": [
            {"argv": ["bench/gemm.py", "--threads", "2"], "returncode": 0, "seconds": 4.2},
            {"argv": ["bench/sparse.py"], "returncode": 1, "seconds": 1.0},
        ],
        "cases": suite.collect(RAW),
    }
    md = suite.render_markdown(doc)
    assert "quick profile: box, 2026-11-23 05:00 UTC" in md
    assert "`python bench/suite.py --quick` (250 s)" in md
    assert "AMD EPYC, 2 cores, 2 threads, ext ISA avx512vnni" in md
    assert "`bench/gemm.py --threads 2` (4 s), `bench/sparse.py` (1 s, exit status 1)" in md
    lines = md.splitlines()
    # one table per family, in the order the cases came
    heads = [line.split("**")[1] for line in lines if line.startswith("**")]
    assert heads == [
        "gemm",
        "sparse",
        "epoch",
        "exact-memory",
        "exact-epoch",
        "exact-ops",
        "exact-capacity",
        "adaqp",
        "hector",
    ]
    assert (
        "| case | qtrain (ms) | FP32 | vs FP32 | bf16 autocast | vs bf16 autocast | notes |"
        in lines
    )
    assert (
        "| fwd X@W nearest, hidden 128 | 10.0 | 30.0 | 3.00x | 20.0 | 2.00x "
        "| bar: quantized product vs FP32 >= 2x: PASS |" in lines
    )
    # both baselines of a case on one row; an unmeasured one is "-" with the reason
    gat = next(line for line in lines if line.startswith("| GAT"))
    assert "| 6000 | 12000 | 2.00x | - | - |" in gat and "node features bf16" in gat
    rp = next(
        line
        for line in lines
        if line.startswith("| SAGE 3 x 256 (mean), exact RP 8 + INT2 | 12500")
    )
    assert "| 8000 | 0.64x | 10000 | 0.80x |" in rp and "FAIL" in rp
    cap = next(line for line in lines if "6 GiB budget" in line)
    assert "| 4.60 | 6.01 | 1.31x |" in cap and "PASS" in cap
    # every row has as many cells as its header
    for i, line in enumerate(lines):
        if line.startswith("| case"):
            width = line.count(" | ")
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert lines[j].count(" | ") - lines[j].count("\\|") == width, lines[j]
                j += 1


def test_profiles_name_every_script(suite: Any) -> None:
    for profile in ("full", "quick"):
        scripts = [job.script for job in suite.PROFILES[profile]]
        assert sorted(scripts) == sorted(suite.CASES)
        for script in scripts:
            assert (BENCH / script).is_file()


def test_memory_has_the_kernels_measure_beside_qtrains_meter(suite: Any) -> None:
    cases = suite.collect(RAW)
    name = "SAGE 3 x 256 (mean), exact INT2"
    rss = _find(cases, "exact-memory", name, "FP32", "step's peak resident memory")
    assert (rss["value"], rss["baseline"], rss["ratio"]) == (3200.0, 4000.0, 1.25)
    added = _find(cases, "exact-memory", name, "FP32", "resident memory the step added")
    assert added["ratio"] == 2.5
    assert "bar" not in rss  # the bars judge the meter's figure only
    # a variant whose JSON has no resident figures gets the meter's row alone
    rp = [c for c in cases if c["case"] == "SAGE 3 x 256 (mean), exact RP 8 + INT2"]
    assert {c["metric"] for c in rp if c["family"] == "exact-memory"} == {
        "activations saved for backward (qtrain's meter)"
    }
    md = suite.render_table([c for c in cases if c["family"] == "exact-memory"]).splitlines()
    assert "| case | measure | qtrain (MiB) | FP32 | vs FP32 | notes |" in md
    row = next(line for line in md if "step's peak resident" in line and "exact INT2 |" in line)
    assert "| 3200 | 4000 | 1.25x |" in row


def test_adaqp_compares_adaptive_bits_with_32_bit_messages(suite: Any) -> None:
    cases = suite.collect(RAW)
    sent = _find(cases, "adaqp", "GCN 3 x 256, 4 workers", "32-bit messages", "bytes")
    assert (sent["value"], sent["baseline"], sent["ratio"]) == (12.5, 100.0, 8.0)
    assert sent["pass"] is True and "1/5" in sent["bar"]
    wall = _find(cases, "adaqp", "GCN 3 x 256, 4 workers", "32-bit messages", "epoch time")
    assert (wall["value"], wall["baseline"], wall["ratio"]) == (2000.0, 3200.0, 1.6)
    assert "one process 71.00, 32-bit 71.00, adaptive 70.00" in sent["note"]
    assert "2 seeds" in sent["note"] and wall["note"] is None
    mixed = suite.render_table([c for c in cases if c["family"] == "adaqp"]).splitlines()
    # two units in one table: the unit goes with the measure
    assert "| case | measure | qtrain | 32-bit messages | vs 32-bit messages | notes |" in mixed
    assert any("per epoch, all workers (MiB) | 12.5 | 100.0 | 8.00x |" in x for x in mixed)


def test_spreads_are_shown_beside_medians(suite: Any) -> None:
    c = suite.case(
        "gemm", "x", "median time", "ms", 10.0, "FP32", 30.0, value_iqr=0.4, baseline_iqr=2.25
    )
    assert (c["value_iqr"], c["baseline_iqr"]) == (0.4, 2.25)
    line = suite.render_table([c]).splitlines()[-1]
    assert line == "| x | 10.0 ± 0.4 | 30.0 ± 2.2 | 3.00x |  |"


README = """# tool

intro

<!-- bench:begin (written by `make bench`: bench/suite.py --readme; do not edit) -->

old tables

<!-- bench:end -->

## Layout
"""


def test_the_readme_section_between_the_markers_is_replaced(suite: Any) -> None:
    once = suite.replace_readme_section(README, "new tables\n")
    assert "old tables" not in once and "new tables" in once
    assert once.startswith("# tool\n\nintro\n")
    assert once.endswith("<!-- bench:end -->\n\n## Layout\n")
    assert suite.replace_readme_section(once, "new tables\n") == once  # idempotent
    for broken in (
        README.replace(suite.README_END, ""),
        README.replace(suite.README_BEGIN, ""),
        README + suite.README_BEGIN,
        "# tool\n" + suite.README_END + "\n" + suite.README_BEGIN + "\n",
    ):
        with pytest.raises(ValueError, match="bench:begin"):
            suite.replace_readme_section(broken, "x")


def test_readme_tables_need_a_committed_checkout(
    suite: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README)
    ran: list[Any] = []
    monkeypatch.setattr(suite, "run_job", lambda *a: ran.append(a))
    monkeypatch.setattr(suite, "git_commit", lambda: "abc123+dirty")
    assert suite.main(["--readme", str(readme), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uncommitted changes" in err[0]
    monkeypatch.setattr(suite, "git_commit", lambda: "abc123")
    readme.write_text("# no markers\n")
    assert suite.main(["--readme", str(readme), "--out-dir", str(tmp_path)]) == 2
    assert "bench:begin" in capsys.readouterr().err
    assert ran == [] and readme.read_text() == "# no markers\n"  # refused before measuring


def test_the_readme_names_the_commit_and_the_results(suite: Any) -> None:
    doc = {
        "host": "box",
        "date": "2026-11-26 05:00 UTC",
        "command": "python bench/suite.py --readme README.md",
        "git_commit": "0123abc",
        "threads": 2,
        "cpu": "AMD EPYC",
        "cores": 2,
        "quick": False,
        "seconds": 600.0,
        "jobs": [],
        "cases": suite.collect(RAW),
    }
    section = suite.readme_section(doc, "bench/results/box-2026-11-26")
    assert "full profile on 2026-11-26 05:00 UTC on box" in section
    assert "`bench/results/box-2026-11-26.json`" in section
    assert "- commit: 0123abc" in section and "ratio = baseline / qtrain" in section
    assert "| fwd X@W nearest, hidden 128 | 10.0 | 30.0 | 3.00x |" in section


def test_the_scripts_spreads_reach_the_cases(suite: Any) -> None:
    cases = suite.collect(RAW)
    copy = _find(cases, "sparse", "copy_u_sum x[N,128]", "DGL FP32")
    assert (copy["value_iqr"], copy["baseline_iqr"]) == (1.5, 4.0)
    assert (
        _find(cases, "sparse", "copy_u_sum x[N,128], stochastic", "DGL FP32")["value_iqr"] is None
    )
    gcn = _find(cases, "epoch", "GCN", "DGL FP32")
    assert (gcn["value_iqr"], gcn["baseline_iqr"]) == (125.0, None)
    relu = _find(cases, "exact-ops", "ReLU backward", "torch / unfused")
    assert (relu["value_iqr"], relu["baseline_iqr"]) == (0.5, 2.0)
    fused = _find(cases, "exact-ops", "RP 8 + INT2 compress", "torch / unfused")
    assert (fused["value_iqr"], fused["baseline_iqr"]) == (1.0, None)  # a sum of two medians
    md = suite.render_table([copy])
    assert "| copy_u_sum x[N,128] | 30.0 ± 1.5 | 90.0 ± 4.0 | 3.00x |" in md


def test_a_saved_run_renders_into_the_readme_again(suite: Any, tmp_path: Path) -> None:
    """A change to how the tables are drawn needs no new run: --render with --readme."""
    saved = tmp_path / "box-2026-11-26.json"
    doc = {
        "host": "box",
        "date": "2026-11-26 05:00 UTC",
        "command": "python bench/suite.py --readme README.md",
        "git_commit": "0123abc",
        "threads": 2,
        "cpu": "AMD EPYC",
        "cores": 2,
        "quick": False,
        "seconds": 600.0,
        "jobs": [],
        "raw": {"gemm.py": GEMM},
        "cases": [],  # drawn again from raw
    }
    saved.write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert suite.main(["--render", str(saved), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "| fwd X@W nearest, hidden 128 | 10.0 | 30.0 | 3.00x |" in text
    assert "- commit: 0123abc" in text and "old tables" not in text
    saved.write_text(json.dumps({**doc, "git_commit": "0123abc+dirty"}))
    assert suite.main(["--render", str(saved), "--readme", str(readme)]) == 2
    assert readme.read_text() == text


def test_adaqp_accuracy_bars_are_in_the_table(suite: Any) -> None:
    raw = {
        **ADAQP,
        "bars": [
            *ADAQP["bars"],
            {
                "model": "gcn",
                "bar": "adaptive vs 32-bit, accuracy points",
                "value": 0.32,
                "pass": False,
            },
        ],
    }
    sent = _find(suite.cases_adaqp(raw), "adaqp", "GCN", "32-bit messages", "bytes")
    assert {"bar": "adaptive within 0.3 point of 32-bit (0.32 points)", "pass": False} in sent[
        "more_bars"
    ]
    row = suite.render_table([sent]).splitlines()[-1]
    assert row.endswith(
        "bar: adaptive within 0.3 point of 32-bit (0.32 points): FAIL; "
        "bar: adaptive sends <= 1/5 of 32-bit's bytes: PASS |"
    )


def test_hector_rows_per_preset_and_the_geomean_bar(suite: Any) -> None:
    cases = suite.cases_hector(HECTOR)
    aifb = _find(cases, "hector", "RGCN aifb", "baseline")
    assert aifb["ratio"] == 4.0 and "PyG 400.0 ms" in aifb["note"] and "2.00x fewer" in aifb["note"]
    geo = _find(cases, "hector", "RGCN geo-mean over 2 presets", "baseline")
    assert geo["ratio"] == pytest.approx(4.0) and geo["value"] == pytest.approx(20.0)
    assert geo["pass"] is True and geo["baseline_what"] == "DGL's RelGraphConv"
    assert geo["more_bars"] == [
        {"bar": "hector+tango within 1 point of FP32's test accuracy (-0.40 points)", "pass": True}
    ]
    # tango on top of hector: the geo-mean of the two presets' speed-ups (0.9x and 1.6x)
    top = _find(cases, "hector", "RGCN hector+tango, geo-mean over 2 presets", "baseline")
    assert top["ratio"] == pytest.approx(1.2) and top["pass"] is True
    assert top["bar"] == "faster (geo-mean > 1x)"
    assert top["baseline_what"] == "the same layer under the hector plugin alone"


def test_epoch_bars_and_a_missing_dataset(suite: Any) -> None:
    raw = {
        "models": {
            **EPOCH["models"],
            "cora-gcn": {
                "fp32": {"median_s": 0.010, "times_s": [0.010, 0.011]},
                "tango": {
                    "median_s": 0.011,
                    "times_s": [0.011, 0.010],
                    "speedup_vs_fp32_iqr": [0.93, 1.08],
                },
            },
            "citeseer-gat": {"error": "dataset: the folder /x/planetoid/citeseer does not exist"},
        }
    }
    cases = suite.cases_epoch(raw)
    gcn = _find(cases, "epoch", "GCN 3 x 256", "DGL FP32", "median")
    assert gcn["bar"] == "tango epoch vs DGL FP32 >= 1.5x" and gcn["pass"] is True  # 2.0x
    gat = _find(cases, "epoch", "GAT 3 layers", "DGL FP32", "median")
    assert gat["bar"] == "tango epoch vs DGL FP32 >= 2x" and gat["pass"] is True
    cora = _find(cases, "epoch", "GCN on Cora", "DGL FP32", "median")
    assert cora["pass"] is False and "per-round ratios 0.93-1.08x" in cora["note"]
    citeseer = _find(cases, "epoch", "GAT on Citeseer", "DGL FP32", "median")
    assert citeseer["ratio"] is None and "does not exist" in citeseer["note"]
    table = suite.render_table(cases)
    assert "bar: tango epoch vs DGL FP32 >= 1x: FAIL" in table


def test_crossover_rows_compare_int8_with_fp32_and_name_the_rule(suite: Any) -> None:
    raw = {
        "rows": [
            {"case": "gemm 2708x16x7", "fp32_ms": 0.3, "tango_ms": 0.4, "default": "fp32"},
            {"case": "gemm 2708x64x64", "fp32_ms": 0.8, "tango_ms": 0.4, "default": "int8"},
        ]
    }
    cases = suite.collect({"crossover.py": raw})
    assert [c["case"] for c in cases] == [
        "gemm 2708x16x7 (rule: fp32)",
        "gemm 2708x64x64 (rule: int8)",
    ]
    assert cases[1]["ratio"] == 2.0 and cases[1]["baseline_name"] == "kept in FP32"
    assert all(c["family"] == "crossover" for c in cases)


def test_every_gemm_direction_is_judged_against_twice_fp32(suite: Any) -> None:
    raw = {
        "results": [
            {
                "hidden": 128,
                "case": "fwd X@W nearest",
                "fp32_ms": 40.0,
                "bf16_ms": 22.0,
                "qtrain_ms": 21.0,
            },
            {
                "hidden": 128,
                "case": "bwd dW=X^T@dY (tn)",
                "fp32_ms": 40.0,
                "bf16_ms": 33.0,
                "qtrain_ms": 9.0,
            },
        ]
    }
    cases = suite.cases_gemm(raw)
    fwd = _find(cases, "gemm", "fwd X@W nearest, hidden 128", "FP32")
    assert fwd["bar"] == "quantized product vs FP32 >= 2x" and fwd["pass"] is False  # 1.90x
    assert _find(cases, "gemm", "bwd dW=X^T@dY (tn), hidden 128", "FP32")["pass"] is True
    assert "bar" not in _find(cases, "gemm", "fwd X@W nearest, hidden 128", "bf16 autocast")
    assert "bar: quantized product vs FP32 >= 2x: FAIL" in suite.render_table(cases)


def test_a_capacity_run_where_fp32_finished_compares_peaks_and_steps(suite: Any) -> None:
    """Issue 29's bars: exact's peak >= 3x below FP32's, its step within 10% of FP32's."""
    row = {"outcome": "finished", "steps_finished": 3, "losses": [1.0], "params_finite": True}
    raw = {
        "budget_gib": 21.0,
        "hidden": 128,
        "layers": 3,
        "variants": {
            "fp32": {**row, "max_rss_bytes_polled": int(16 * GIB), "max_hwm_bytes_polled": 0},
            "int2": {**row, "max_rss_bytes_polled": int(5 * GIB), "max_hwm_bytes_polled": 0},
        },
        "comparison": {
            "int2": {
                "peak_ratio": 3.2,
                "step_time_ratio": 1.05,
                "step_s_median": 35.0,
                "step_s_iqr": [34.0, 36.0],
                "fp32_step_s_median": 33.3,
                "fp32_step_s_iqr": [33.0, 34.0],
            }
        },
        "bars": {
            "fp32 exceeds the budget": False,
            "int2 trains under the budget": True,
            "int2 peak at least 3x below fp32's": True,
            "int2 step time within 10% of fp32's": False,
        },
    }
    memory, step = suite.cases_capacity(raw)
    assert (memory["value"], memory["baseline"]) == (5.0, 16.0)
    assert memory["ratio"] == pytest.approx(3.2) and memory["pass"] is True
    assert (step["value"], step["baseline"]) == (35.0, 33.3)
    assert step["value_iqr"] == 2.0 and step["baseline_iqr"] == 1.0 and step["pass"] is False
    assert step["ratio"] == pytest.approx(33.3 / 35.0)
