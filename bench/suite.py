"""The benchmark suite: every bench script in a fresh process, one JSON document and one table.

Runs ``gemm.py``, ``sparse.py``, ``epoch.py`` (tango's primitives and epochs
against torch / DGL FP32 and bf16 autocast), ``exact.py``, ``exact_ops.py`` and
``exact_capacity.py`` (exact's activation memory beside the kernel's resident
memory, epoch time, primitives and the synthetic-products capacity case) and
``adaqp.py`` (distributed workers: bytes sent and epoch time of adaptive bits
against 32-bit messages) and ``hector.py`` (one relational layer under the hector
plugin against DGL's, on Hector-shaped graphs, with the accuracy check), each as a subprocess of the venv's Python with
``--json``, so every script starts with a fresh allocator and its memory
figures are its own. It then collects their JSON into one document::

    {"host", "date", "command", "git_commit", "threads", "cpu", "quick",
     "cases": [{"family", "case", "metric", "unit", "value", "value_iqr",
                "baseline_name", "baseline", "baseline_iqr", "ratio", "note", ...}],
     "jobs": [{"script", "argv", "returncode", "seconds"}],
     "raw": {"gemm.py": <its JSON>, ...}}

and renders it as markdown. Every ratio is ``baseline / value`` of two numbers
measured in this run (> 1: qtrain's variant is that many times faster, or
smaller); a case a script could not measure (DGL refusing bf16 autocast, a
script that failed) has ``"ratio": null`` and the reason in ``note``. A script
whose bars failed still measured: its cases say FAIL, and its exit status is
listed with it.

    python bench/suite.py --readme README.md   # make bench: the full profile, and the
                                               # README's tables rewritten from it
    python bench/suite.py --quick    # make bench-quick: fewer sizes and repetitions
    python bench/suite.py --render bench/results/<host>-<date>.json   # the markdown again
    python bench/suite.py --render bench/results/<host>-<date>.json --readme README.md
                                     # a run's figures into the README again (after a
                                     # change to how the tables are drawn: no new numbers)

Writes ``bench/results/<host>-<date>.json`` and ``.md`` (``-quick`` before the
suffix for the quick profile, so it never overwrites a full run).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _record import git_commit, write_json

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MIB = 2**20
GIB = 2**30


# ---------------------------------------------------------------- profiles


# epoch.py's recipes: synthetic-arxiv's, then the small graphs
EPOCH_ALL = (
    "gcn",
    "gat",
    *(f"{d}-{m}" for d in ("cora", "citeseer") for m in ("gcn", "gat", "sage")),
    "default-gcn",
)


@dataclass(frozen=True)
class Job:
    """One bench script and the arguments a profile gives it (``--threads`` and ``--json`` added)."""

    script: str
    args: tuple[str, ...]


PROFILES: dict[str, tuple[Job, ...]] = {
    # the figures bench/README.md quotes, with their commands' settings
    "full": (
        Job("gemm.py", ("--rows", "169343", "--hidden", "128", "256", "--repeat", "9")),
        Job("sparse.py", ("--widths", "128", "256", "--repeat", "5")),
        # synthetic-arxiv, then Cora and Citeseer (30 rounds each; Planetoid from
        # ../shared/datasets, a row saying so where it is absent)
        Job("epoch.py", ("--warmup", "1", "--repeat", "3", "--models", *EPOCH_ALL)),
        # where tango's int8 primitives start to pay: the payoff rule's evidence (about a minute)
        Job("crossover.py", ("--repeat", "20", "--warmup", "3")),
        Job("exact.py", ("--warmup", "1", "--repeat", "5", "--memory-steps", "2")),
        Job("exact_ops.py", ("--repeat", "7")),
        # SAGE 3 x 128 full graph on synthetic-products, three steps each, alternating:
        # FP32 peaks at 16.1 GiB, exact INT2 at 4.9 GiB (blocked GraphSAGE layers, the
        # graph as its CSC), INT2 with DGL's layers at 8.2 GiB; the 21 GiB budget lets FP32
        # finish, so peaks and step times are compared with it (issue 29: >= 3x below,
        # within 10%); about 12 minutes
        Job(
            "exact_capacity.py",
            (
                *("--budget-gib", "21", "--headroom-gib", "0.5", "--hidden", "128"),
                *("--steps", "3", "--variants", "fp32", "int2", "int2-unblocked"),
            ),
        ),
        # 4 workers on synthetic-arxiv, GCN and SAGE, one seed of 10 epochs (about 6 minutes);
        # bench/README.md's three-seed, 20-epoch figures take `python bench/adaqp.py` half an hour
        Job("adaqp.py", ("--seeds", "0", "--epochs", "10", "--reassign-period", "5")),
        # one RGCN / RGAT / HGT layer on six Hector-shaped presets (at most 200,000 edges
        # each), DGL's and PyG's layers beside, and the 3-seed accuracy check. fb15k and
        # wikikg2 (474 and 535 relations) are left to `python bench/hector.py`: there one
        # training step of DGL's and PyG's HGTConv takes minutes on 2 cores (the first full
        # run was still in fb15k's HGT after 16 minutes)
        Job(
            "hector.py",
            (
                *("--presets", "aifb", "mutag", "bgs", "biokg", "am", "mag"),
                *("--max-edges", "200000", "--repeat", "5"),
            ),
        ),
    ),
    # the same cases, one size each and fewer repetitions: 203 s on 2 idle cores, 241-336 s
    # while other jobs shared them
    "quick": (
        Job("gemm.py", ("--rows", "169343", "--hidden", "128", "--repeat", "5", "--warmup", "2")),
        Job("sparse.py", ("--widths", "128", "--repeat", "3")),
        # one timed epoch per variant after one warm-up epoch (a GAT FP32 epoch is ~13 s)
        Job("epoch.py", ("--warmup", "1", "--repeat", "1", "--models", *EPOCH_ALL)),
        # the memory part has just run a step of each variant in the same process, which
        # warms it up: a first timed round was no slower than a second one here
        Job("crossover.py", ("--repeat", "6", "--warmup", "2")),
        Job("exact.py", ("--warmup", "0", "--repeat", "1", "--memory-steps", "1")),
        Job("exact_ops.py", ("--repeat", "3")),
        # SAGE 3 x 32 full graph on synthetic-products, two steps each: FP32 passed 6.25
        # GiB, exact INT2 peaked at 5.59 GiB (fc34b44; 2.3 GiB of both the loaded graph):
        # the 6.25 GiB budget asks the full run's question in about a minute
        Job(
            "exact_capacity.py",
            (
                "--budget-gib",
                "6.25",
                *("--hidden", "32", "--layers", "3", "--variants", "fp32", "int2"),
            ),
        ),
        Job(
            "adaqp.py",
            ("--models", "gcn", "--seeds", "0", "--epochs", "4", "--reassign-period", "2"),
        ),
        Job(
            "hector.py",
            (
                *("--presets", "aifb", "fb15k", "--max-edges", "50000", "--repeat", "2"),
                *("--accuracy-seeds", "1", "--accuracy-epochs", "10"),
            ),
        ),
    ),
}

FAMILIES: dict[str, str] = {
    "gemm": "tango: quantized GEMM (quantize X and W, INT8 product, float32 out) vs torch.matmul, "
    "X of 169,343 rows (ogbn-arxiv's nodes), W hidden x hidden",
    "sparse": "tango: quantized SpMM / SDDMM (quantizing the inputs included) vs DGL's kernels "
    "on synthetic-arxiv",
    "epoch": "tango 8-bit: one full-graph training epoch (forward, backward, Adam) of the "
    "example recipes on synthetic-arxiv, Cora and Citeseer (variants interleaved, one epoch "
    "each per round)",
    "crossover": "tango's payoff rule: one primitive's forward and backward inside a tango "
    "session, quantized against kept in FP32 (what the rule decides in brackets; a ratio "
    "below 1 where it says int8, or above 1 where it says fp32, is a case it gets wrong)",
    "exact-memory": "exact: memory of a full-graph training step on synthetic-arxiv, each "
    "variant alone: what autograd saved (qtrain's meter) and the process's resident memory "
    "(the kernel's figures, which include the graph and features every variant holds)",
    "exact-epoch": "exact: epoch time, full graph on synthetic-arxiv (variants round-robin in "
    "one process)",
    "exact-ops": "exact: the primitives behind its epoch time, one 169,343 x 256 activation",
    "adaqp": "adaqp: distributed full-graph training on synthetic-arxiv, workers sharing this "
    "machine's cores (means over seeds; the run's accuracy beside)",
    "exact-capacity": "exact: full-graph GraphSAGE on synthetic-products under a resident-memory "
    "budget (each variant in a child process killed past it)",
    "hector": "hector: one relational layer (width 64, one head) on graphs shaped like Hector's "
    "datasets, a training step (forward, loss, backward) under the plugin against DGL's own "
    "layer (RGCN, HGT) or the per-edge RGAT (variants round-robin in one process)",
}


# ---------------------------------------------------------------- cases


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def case(
    family: str,
    name: str,
    metric: str,
    unit: str,
    value: Any,
    baseline_name: str,
    baseline: Any,
    note: str | None = None,
    *,
    value_iqr: Any = None,
    baseline_iqr: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """One measured comparison; ``ratio`` = baseline / value when both were measured.
    ``*_iqr`` are the spreads (interquartile ranges) of repeated timings, where there were any."""
    v, b = _num(value), _num(baseline)
    ratio = b / v if v is not None and b is not None and v > 0 else None
    if ratio is None and note is None:
        note = "not measured"
    return {
        "family": family,
        "case": name,
        "metric": metric,
        "unit": unit,
        "value": v,
        "baseline_name": baseline_name,
        "baseline": b,
        "ratio": ratio,
        "note": note,
        "value_iqr": _num(value_iqr),
        "baseline_iqr": _num(baseline_iqr),
        **extra,
    }


# issue 29's bar on every direction of the quantized linear layer's product against FP32
GEMM_BAR = 2.0


def cases_gemm(raw: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in raw["results"]:
        name = f"{r['case']}, hidden {r['hidden']}"
        for base, key in (("FP32", "fp32"), ("bf16 autocast", "bf16")):
            extra: dict[str, Any] = {}
            qtrain, baseline = _num(r.get("qtrain_ms")), _num(r.get(f"{key}_ms"))
            if key == "fp32" and qtrain and baseline:
                extra = {
                    "bar": f"quantized product vs FP32 >= {GEMM_BAR:g}x",
                    "pass": baseline / qtrain >= GEMM_BAR,
                }
            out.append(
                case(
                    "gemm",
                    name,
                    "median time",
                    "ms",
                    r["qtrain_ms"],
                    base,
                    r[f"{key}_ms"],
                    value_iqr=r.get("qtrain_iqr_ms"),
                    baseline_iqr=r.get(f"{key}_iqr_ms"),
                    **extra,
                )
            )
    return out


def cases_sparse(raw: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in raw["results"]:
        variants = [("", "qtrain_nearest")]
        if "qtrain_stochastic_ms" in r:
            variants.append((", stochastic rounding", "qtrain_stochastic"))
        for suffix, key in variants:
            name = f"{r['op']} {r['shape']}{suffix}"
            ms, iqr = r[f"{key}_ms"], r.get(f"{key}_iqr_ms")
            bf16 = r["dgl_bf16_ms"]
            for base, value, base_iqr, note in (
                ("DGL FP32", r["dgl_fp32_ms"], r.get("dgl_fp32_iqr_ms"), None),
                (
                    "DGL bf16 autocast",
                    bf16,
                    r.get("dgl_bf16_iqr_ms"),
                    None if _num(bf16) is not None else f"DGL under bf16 autocast: {bf16}",
                ),
            ):
                out.append(
                    case(
                        "sparse",
                        name,
                        "median time",
                        "ms",
                        ms,
                        base,
                        value,
                        note,
                        value_iqr=iqr,
                        baseline_iqr=base_iqr,
                    )
                )
    return out


EPOCH_MODELS = {
    "gcn": "GCN 3 x 256 (examples/arxiv-gcn.toml)",
    "gat": "GAT 3 layers, 4 heads x 64 (examples/arxiv-gat.toml)",
    **{
        f"{d}-{m}": f"{m.upper() if m != 'sage' else 'GraphSAGE'} on {d.title()} "
        f"(examples/{d}-{m}.toml)"
        for d in ("cora", "citeseer")
        for m in ("gcn", "gat", "sage")
    },
    "default-gcn": "GCN 2 x 64 on synthetic-small (qtrain.toml, the default recipe)",
}
# issue 29's bars on tango's epoch against DGL FP32: 1.5x GCN, 2x GAT on synthetic-arxiv,
# and never slower on the small graphs
EPOCH_BARS = {"gcn": 1.5, "gat": 2.0, **{key: 1.0 for key in EPOCH_MODELS if "-" in key}}


def _ms(row: dict[str, Any], key: str = "median_s") -> float | None:
    s = _num(row.get(key))
    return None if s is None else s * 1e3


def cases_epoch(raw: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, rows in raw["models"].items():
        name = f"{EPOCH_MODELS.get(key, key)}, tango 8-bit"
        if "error" in rows:  # the recipe's dataset was not there
            out.append(
                case(
                    "epoch", name, "median epoch time", "ms", None, "DGL FP32", None, rows["error"]
                )
            )
            continue
        tango = rows.get("tango", {})
        for base, variant in (("DGL FP32", "fp32"), ("DGL bf16 autocast", "bf16-autocast")):
            row = rows.get(variant, {"error": "not run"})
            note = None
            if "error" in tango:
                note = f"tango: {tango['error']}"
            elif "error" in row:
                note = f"{base}: {row['error']}"
            extra: dict[str, Any] = {}
            spread = tango.get("speedup_vs_fp32_iqr")
            if variant == "fp32" and spread and note is None:
                note = f"per-round ratios {spread[0]:.2f}-{spread[1]:.2f}x (IQR)"
            if variant == "fp32" and key in EPOCH_BARS and _ms(tango) and _ms(row):
                want = EPOCH_BARS[key]
                extra = {
                    "bar": f"tango epoch vs DGL FP32 >= {want:g}x",
                    "pass": _ms(row) / _ms(tango) >= want,
                }
            out.append(
                case(
                    "epoch",
                    name,
                    "median epoch time",
                    "ms",
                    _ms(tango),
                    base,
                    _ms(row),
                    note,
                    value_iqr=_ms(tango, "iqr_s"),
                    baseline_iqr=_ms(row, "iqr_s"),
                    **extra,
                )
            )
    return out


EXACT_MODELS = {"sage": "SAGE 3 x 256 (mean)", "gcnii": "GCNII 16 x 64"}
EXACT_VARIANTS = {
    "fp32": "FP32",
    "int2": "exact INT2",
    "rp8-int2": "exact RP 8 + INT2",
    "int2-unblocked": "exact INT2, DGL's SAGE layers (blocked_sage = false)",
}
# exact.py's bars (the issue's), by the case they judge
EXACT_BARS = {
    ("exact-memory", "sage", "int2", "FP32"): "sage activation memory fp32 / int2",
    ("exact-memory", "sage", "rp8-int2", "FP32"): "sage activation memory fp32 / rp8-int2",
    ("exact-memory", "gcnii", "rp8-int2", "FP32"): (
        "gcnii 16 layers trains, activation memory fp32 / rp8-int2"
    ),
    ("exact-epoch", "sage", "int2", "FP32"): "sage epoch time overhead int2 vs fp32",
    ("exact-epoch", "sage", "rp8-int2", "exact INT2"): "sage epoch time rp8-int2 / int2",
}


def cases_crossover(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        case(
            "crossover",
            f"{r['case']} (rule: {r['default']})",
            "forward + backward",
            "ms",
            r["tango_ms"],
            "kept in FP32",
            r["fp32_ms"],
        )
        for r in raw["rows"]
    ]


def _bar(raw: dict[str, Any], key: tuple[str, str, str, str]) -> dict[str, Any]:
    name = EXACT_BARS.get(key)
    for bar in raw.get("bars", []):
        if bar.get("bar") == name:
            return {"bar": f"{bar['bar']} {bar['want']}", "pass": bar["pass"]}
    return {}


# exact.py's memory figures, qtrain's own meter first, then the kernel's (independent of it)
EXACT_MEMORY = (
    ("activation_bytes", "activations saved for backward (qtrain's meter)"),
    ("peak_memory_bytes", "step's peak resident memory (kernel's VmHWM)"),
    ("step_added_bytes", "resident memory the step added (VmHWM - VmRSS before it)"),
)


def cases_exact(raw: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for model, rows in raw.get("memory", {}).items():
        fp32 = rows.get("fp32", {})
        for variant, row in rows.items():
            if variant == "fp32":
                continue
            name = f"{EXACT_MODELS.get(model, model)}, {EXACT_VARIANTS.get(variant, variant)}"
            for key, metric in EXACT_MEMORY:
                if key not in row:
                    continue
                note = None if row.get("trains", True) else "loss not finite"
                base = _num(fp32.get(key))
                bar = (
                    _bar(raw, ("exact-memory", model, variant, "FP32"))
                    if key == "activation_bytes"
                    else {}
                )
                out.append(
                    case(
                        "exact-memory",
                        name,
                        metric,
                        "MiB",
                        row[key] / MIB,
                        "FP32",
                        None if base is None else base / MIB,
                        note,
                        **bar,
                    )
                )
    for model, rows in raw.get("time", {}).items():
        for variant, row in rows.items():
            if variant == "fp32":
                continue
            name = f"{EXACT_MODELS.get(model, model)}, {EXACT_VARIANTS.get(variant, variant)}"
            bases = ["fp32"] + (["int2"] if variant == "rp8-int2" and "int2" in rows else [])
            for b in bases:
                label = EXACT_VARIANTS[b]
                out.append(
                    case(
                        "exact-epoch",
                        name,
                        "median epoch time",
                        "ms",
                        _ms(row),
                        label,
                        _ms(rows.get(b, {})),
                        value_iqr=_ms(row, "iqr_s"),
                        baseline_iqr=_ms(rows.get(b, {}), "iqr_s"),
                        **_bar(raw, ("exact-epoch", model, variant, label)),
                    )
                )
    return out


# exact_ops.py's names carry the shapes; these prefixes find them: (row, mine, the baseline's
# parts, what the baseline is, its column)
OPS = (
    (
        "RP 8 + INT2 compress: fused project + quantize",
        "fused project + quantize",
        ("unfused: projection x @ R [", "unfused: quantize rows"),
        "unfused: x @ R, then quantize",
        "torch / unfused",
    ),
    (
        "RP 8 + INT2 decompress: fused dequantize + project back",
        "fused dequantize + project back",
        ("unfused: projection y @ R^T",),
        "unfused: y @ R^T alone",
        "torch / unfused",
    ),
    (
        "INT1 compress: side means (quantize_rows_means)",
        "INT1 rows: side means",
        ("INT1 rows: stochastic",),
        "stochastic rounding (quantize_rows, 1 bit)",
        "INT1 stochastic",
    ),
    (
        "ReLU backward: masked_scale from packed 1-bit mask",
        "ReLU backward: masked_scale",
        ("ReLU backward: torch threshold_backward",),
        "torch threshold_backward",
        "torch / unfused",
    ),
)


def cases_exact_ops(raw: dict[str, Any]) -> list[dict[str, Any]]:
    times: dict[str, float] = raw["median_ms"]
    spreads: dict[str, float] = raw.get("iqr_ms", {})

    def find(prefix: str, table: dict[str, float]) -> float | None:
        return next((v for k, v in table.items() if k.startswith(prefix)), None)

    out = []
    for name, mine, theirs, base_name, column in OPS:
        parts = [find(p, times) for p in theirs]
        base = None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]
        out.append(
            case(
                "exact-ops",
                name,
                "median time",
                "ms",
                find(mine, times),
                column,
                base,
                None,
                value_iqr=find(mine, spreads),
                # a sum of medians has no measured spread; a single baseline has its own
                baseline_iqr=find(theirs[0], spreads) if len(theirs) == 1 else None,
            )
        )
        out[-1]["baseline_what"] = base_name
    return out


def cases_capacity(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Where FP32 finished under the budget: each exact variant's peak and step time
    against FP32's (issue 29's bars: peak >= 3x below, step within 10%). Where it was
    killed: whether each variant trains a step under the budget FP32 passed."""
    budget = raw["budget_gib"]
    variants = raw.get("variants", {})
    fp32 = variants.get("fp32", {})
    comparison = raw.get("comparison") or {}
    bars = raw.get("bars", {})

    def peak(row: dict[str, Any]) -> float | None:
        seen = max(row.get("max_rss_bytes_polled", 0), row.get("max_hwm_bytes_polled", 0))
        return seen / GIB if seen else None

    def what(label: str, row: dict[str, Any]) -> str:
        outcome = row.get("outcome", "not run")
        if outcome == "killed at the budget":
            return f"{label} killed at the budget (its figure: resident memory then, a lower bound)"
        if outcome == "finished":
            steps = row.get("steps_finished", 0)
            finite = row.get("params_finite") and all(
                math.isfinite(x) for x in row.get("losses", [])
            )
            return f"{label} trained {steps} step{'s' * (steps != 1)} under it, " + (
                "finite" if finite else "NOT finite"
            )
        return f"{label}: {outcome} {row.get('reason', '')}".strip()

    def verdict(bar: str) -> dict[str, Any]:
        found = bars.get(bar)
        return {"pass": None if found is None else bool(found)}

    model = f"SAGE {raw['layers']} x {raw['hidden']} full graph, {budget:g} GiB budget"
    out = []
    for variant, row in variants.items():
        if variant == "fp32":
            continue
        label = EXACT_VARIANTS.get(variant, variant)
        note = f"{what('FP32', fp32)}; {what(label, row)}"
        versus = comparison.get(variant)
        if versus is not None:  # both finished, with steps after their first
            out.append(
                case(
                    "exact-capacity",
                    f"{model}, {label}",
                    "highest resident memory (VmHWM)",
                    "GiB",
                    peak(row),
                    "FP32",
                    peak(fp32),
                    note,
                    bar=">= 3x below FP32",
                    budget_gib=budget,
                    **verdict(f"{variant} peak at least 3x below fp32's"),
                )
            )
            out.append(
                case(
                    "exact-capacity",
                    f"{model}, {label}",
                    "training step, after each child's first (median)",
                    "s",
                    versus["step_s_median"],
                    "FP32",
                    versus["fp32_step_s_median"],
                    note,
                    value_iqr=versus["step_s_iqr"][1] - versus["step_s_iqr"][0],
                    baseline_iqr=versus["fp32_step_s_iqr"][1] - versus["fp32_step_s_iqr"][0],
                    bar="within 10% of FP32 (ratio >= 0.91)",
                    **verdict(f"{variant} step time within 10% of fp32's"),
                )
            )
            continue
        fits = bars.get(f"{variant} trains under the budget")
        over = bars.get("fp32 exceeds the budget")
        value, base = peak(row), peak(fp32)
        if row.get("outcome") != "finished" or fp32.get("outcome") not in (
            "killed at the budget",
            "finished",
        ):
            value = None  # no step to compare: the ratio would not be a measurement
        out.append(
            case(
                "exact-capacity",
                f"{model}, {label}",
                "highest resident memory (FP32: when killed)",
                "GiB",
                value,
                "FP32",
                base,
                note,
                bar=f"FP32 exceeds {budget:g} GiB, {label} trains a step under it",
                budget_gib=budget,
                **{"pass": None if fits is None or over is None else bool(fits and over)},
            )
        )
    return out


ADAQP_MODELS = {"gcn": "GCN 3 x 256", "sage": "SAGE 3 x 256"}


def _mean(rows: list[dict[str, Any]], get: Any) -> float | None:
    values = [_num(get(r)) for r in rows]
    return None if not values or None in values else statistics.mean(values)  # type: ignore[arg-type]


ADAQP_ACCURACY_BARS = (
    ("32-bit workers vs one process, accuracy points", "32-bit within 0.1 point of one process"),
    ("adaptive vs 32-bit, accuracy points", "adaptive within 0.3 point of 32-bit"),
)


def _adaqp_verdict(bars: dict[str, Any], bar: str, want: str) -> dict[str, Any]:
    found = bars.get(bar)
    return {} if found is None else {"bar": want, "pass": bool(found["pass"])}


def cases_adaqp(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Adaptive bits with overlap against 32-bit messages without, per model (seed means)."""
    out = []
    workers, seeds = raw["workers"], len(raw["seeds"])
    for model, runs in raw["results"].items():
        name = f"{ADAQP_MODELS.get(model, model)}, {workers} workers, adaptive bits + overlap"
        mine, w32 = runs.get("adaptive", []), runs.get("w32", [])
        acc = {
            k: _mean(v, lambda r: 100 * r["test_acc"])
            for k, v in runs.items()
            if k in ("single", "w32", "adaptive")
        }
        note = "test accuracy over {} seed{}: {}".format(
            seeds,
            "s" * (seeds != 1),
            ", ".join(
                f"{label} {acc[k]:.2f}"
                for k, label in (
                    ("single", "one process"),
                    ("w32", "32-bit"),
                    ("adaptive", "adaptive"),
                )
                if acc.get(k) is not None
            ),
        )
        bars = {b["bar"]: b for b in raw.get("bars", []) if b.get("model") == model}
        verdict = functools.partial(_adaqp_verdict, bars)
        accuracy_bars = [  # beside the accuracy note, never cut short with it
            {"bar": f"{want} ({bars[bar]['value']:.2f} points)", "pass": bool(bars[bar]["pass"])}
            for bar, want in ADAQP_ACCURACY_BARS
            if bar in bars
        ]

        sent = (
            _mean(mine, lambda r: r["comm_bytes_per_epoch"]),
            _mean(w32, lambda r: r["comm_bytes_per_epoch"]),
        )
        out.append(
            case(
                "adaqp",
                name,
                "bytes sent per epoch, all workers",
                "MiB",
                None if sent[0] is None else sent[0] / MIB,
                "32-bit messages",
                None if sent[1] is None else sent[1] / MIB,
                note,
                more_bars=accuracy_bars,
                **verdict(
                    "adaptive / 32-bit bytes per epoch", "adaptive sends <= 1/5 of 32-bit's bytes"
                ),
            )
        )
        wall = (
            _mean(mine, lambda r: r["time_per_epoch_s"]["epoch"]),
            _mean(w32, lambda r: r["time_per_epoch_s"]["epoch"]),
        )
        out.append(
            case(
                "adaqp",
                name,
                "epoch time, slowest worker (solver included)",
                "ms",
                None if wall[0] is None else wall[0] * 1e3,
                "32-bit messages",
                None if wall[1] is None else wall[1] * 1e3,
                None,  # the accuracy is on the bytes row
                **verdict(
                    "adaptive+overlap / 32-bit epoch time",
                    "adaptive + overlap is faster than 32-bit",
                ),
            )
        )
    return out


def cases_hector(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model: the plugin's training step against its baseline on every preset, then the
    geo-mean over the presets (the bar), the accuracy check beside it."""
    out = []
    accuracy = raw.get("accuracy") or {}
    for model, bar in raw["bars"].items():
        variant, baseline = bar["variant"], bar["baseline"]
        what = f"DGL's {HECTOR_LAYERS[model]}" if baseline == "dgl" else "qtrain's per-edge RGAT"
        mine_ms, base_ms = [], []
        for preset, entry in raw["presets"].items():
            rows = entry["models"][model]
            mine, base = rows[variant], rows[baseline]
            mine_ms.append(mine["train_ms"])
            base_ms.append(base["train_ms"])
            pyg = rows.get("pyg")
            note = (
                f"{entry['edges']:,} edges, {entry['relations']} relations; saves "
                f"{base['saved_mib'] / mine['saved_mib']:.2f}x fewer bytes for backward"
            )
            if pyg is not None:
                note += f"; PyG {pyg['train_ms']:.1f} ms"
            out.append(
                case(
                    "hector",
                    f"{model.upper()} {preset}",
                    "training step",
                    "ms",
                    mine["train_ms"],
                    "baseline",
                    base["train_ms"],
                    note,
                    value_iqr=mine["train_iqr_ms"],
                    baseline_iqr=base["train_iqr_ms"],
                )
            )
        checked = accuracy.get(model)
        tango_ms, hector_ms = [], []
        for entry in raw["presets"].values():
            rows = entry["models"][model]
            tango_ms.append(rows["hector+tango"]["train_ms"])
            hector_ms.append(rows["hector"]["train_ms"])
        more = []
        if checked is not None:
            more.append(
                {
                    "bar": "hector+tango within 1 point of FP32's test accuracy "
                    f"({-100 * checked['tango_drop']:+.2f} points)",
                    "pass": bool(checked["met"]),
                }
            )
        out.append(
            _geomean_case(
                f"{model.upper()} geo-mean over {len(mine_ms)} presets",
                mine_ms,
                base_ms,
                baseline_what=what,
                bar=f"geo-mean >= {bar['bar']:.0f}x",
                **{"pass": bool(bar["met"])},
                more_bars=more,
            )
        )
        out.append(
            _geomean_case(
                f"{model.upper()} hector+tango, geo-mean over {len(tango_ms)} presets",
                tango_ms,
                hector_ms,
                baseline_what="the same layer under the hector plugin alone",
                bar="faster (geo-mean > 1x)",
                **{"pass": bool(bar["tango_met"])},
            )
        )
    return out


def _geomean_case(name: str, mine_ms: list[float], base_ms: list[float], **extra: Any):
    """A hector bar: the geo-means of a variant's and its baseline's training steps."""
    mine, base = (math.exp(statistics.fmean(map(math.log, ms))) for ms in (mine_ms, base_ms))
    return case("hector", name, "training step", "ms", mine, "baseline", base, None, **extra)


HECTOR_LAYERS = {"rgcn": "RelGraphConv", "hgt": "HGTConv", "rgat": "RGAT"}


CASES = {
    "gemm.py": cases_gemm,
    "sparse.py": cases_sparse,
    "epoch.py": cases_epoch,
    "crossover.py": cases_crossover,
    "exact.py": cases_exact,
    "exact_ops.py": cases_exact_ops,
    "exact_capacity.py": cases_capacity,
    "adaqp.py": cases_adaqp,
    "hector.py": cases_hector,
}
SCRIPT_FAMILIES = {
    "gemm.py": "gemm",
    "sparse.py": "sparse",
    "epoch.py": "epoch",
    "crossover.py": "crossover",
    "exact.py": "exact-memory",
    "exact_ops.py": "exact-ops",
    "exact_capacity.py": "exact-capacity",
    "adaqp.py": "adaqp",
    "hector.py": "hector",
}


def collect(raw: dict[str, Any], errors: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every case of every script's JSON; a script that gave none is one case saying why."""
    errors = errors or {}
    out: list[dict[str, Any]] = []
    for script, fn in CASES.items():
        if script in errors or script not in raw:
            if script in errors:
                note = f"{script}: {errors[script]}"
                out.append(
                    case(SCRIPT_FAMILIES[script], "(no result)", "-", "-", None, "-", None, note)
                )
            continue
        try:
            out.extend(fn(raw[script]))
        except (KeyError, TypeError, ValueError) as exc:
            note = f"{script}: unexpected JSON ({type(exc).__name__}: {exc})"
            out.append(
                case(SCRIPT_FAMILIES[script], "(no result)", "-", "-", None, "-", None, note)
            )
    return out


# ---------------------------------------------------------------- markdown


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "GiB":
        return f"{x:.2f}"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


RATIO_RULE = (
    "ratio = baseline / qtrain: > 1 means qtrain's variant is that many times faster (times) "
    "or smaller (memory); times are medians after warm-up, ± their interquartile range, "
    "with baseline and qtrain measured in the same run, interleaved"
)
NOTE_CHARS = 160  # longer notes (a DGL error message) are cut in the table; the JSON has them whole


def _cell(x: float | None, iqr: float | None, unit: str) -> str:
    """A value with its spread where repeated timings gave one: ``20.4 ± 0.6``."""
    return _fmt(x, unit) + ("" if x is None or iqr is None else f" ± {_fmt(iqr, unit)}")


def render_table(cases: list[dict[str, Any]]) -> str:
    """One markdown table per family: a row per case (and measure, where a family has
    several), a value and ratio column per baseline."""
    blocks: list[str] = []
    families = list(dict.fromkeys(c["family"] for c in cases))
    for family in families:
        mine = [c for c in cases if c["family"] == family]
        baselines = list(
            dict.fromkeys(c["baseline_name"] for c in mine if c["baseline_name"] != "-")
        )
        measures = len({c["metric"] for c in mine if c["case"] != "(no result)"}) > 1
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for c in mine:
            row = rows.setdefault(
                (c["case"], c["metric"]),
                {
                    "unit": c["unit"],
                    "value": c["value"],
                    "iqr": c.get("value_iqr"),
                    "notes": [],
                    "by": {},
                },
            )
            row["by"][c["baseline_name"]] = c
            note = c.get("note")
            if note:
                note = note if len(note) <= NOTE_CHARS else note[: NOTE_CHARS - 3] + "..."
                if note not in row["notes"]:
                    row["notes"].append(note)
            if c.get("baseline_what"):
                row["notes"].append(f"baseline: {c['baseline_what']}")
            judged = [*c.get("more_bars", []), *([c] if c.get("bar") is not None else [])]
            for bar in judged:
                verdict = {True: "PASS", False: "FAIL", None: "n/a"}[bar.get("pass")]
                row["notes"].append(f"bar: {bar['bar']}: {verdict}")
        units = list(dict.fromkeys(row["unit"] for row in rows.values()))
        head = ["case"] + (["measure"] if measures else [])
        head.append(f"qtrain ({units[0]})" if len(units) == 1 else "qtrain")
        for b in baselines:
            head += [b, f"vs {b}"]
        head.append("notes")
        lines = [
            f"**{family}**: {FAMILIES.get(family, '')}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join("---" for _ in head) + "|",
        ]
        for (name, metric), row in rows.items():
            cells = [_escape(name)]
            if measures:
                cells.append(_escape(metric + ("" if len(units) == 1 else f" ({row['unit']})")))
            cells.append(_cell(row["value"], row["iqr"], row["unit"]))
            for b in baselines:
                c = row["by"].get(b)
                cells += (
                    ["-", "-"]
                    if c is None
                    else [
                        _cell(c["baseline"], c.get("baseline_iqr"), c["unit"]),
                        _ratio(c["ratio"]),
                    ]
                )
            cells.append(_escape("; ".join(row["notes"])) or "")
            lines.append("| " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _provenance(doc: dict[str, Any]) -> list[str]:
    """Where and how a suite ran, as markdown list items."""
    total = doc.get("seconds")
    return [
        f"- command: `{doc['command']}`"
        + (f" ({total:.0f} s)" if isinstance(total, int | float) else ""),
        f"- machine: {doc['cpu']}, {doc.get('cores', '?')} cores, {doc['threads']} threads"
        + (f", ext ISA {doc['isa']}" if doc.get("isa") else "")
        + (f", torch {doc['torch']}" if doc.get("torch") else "")
        + (f", DGL {doc['dgl']}" if doc.get("dgl") else ""),
        f"- commit: {doc.get('git_commit') or 'unknown'}",
        "- scripts: "
        + ", ".join(
            f"`{' '.join(j['argv'])}` ({j['seconds']:.0f} s"
            + ("" if j["returncode"] == 0 else f", exit status {j['returncode']}")
            + ")"
            for j in doc.get("jobs", [])
        ),
        f"- {RATIO_RULE}",
    ]


def render_markdown(doc: dict[str, Any]) -> str:
    """The whole report: where and how it ran, then the tables."""
    profile = "quick" if doc.get("quick") else "full"
    lines = [
        f"# qtrain benchmarks, {profile} profile: {doc['host']}, {doc['date']}",
        "",
        *_provenance(doc),
        "",
        render_table(doc["cases"]),
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the README's tables

README_BEGIN = (
    "<!-- bench:begin (written by `make bench`: bench/suite.py --readme; do not edit) -->"
)
README_END = "<!-- bench:end -->"


def readme_section(doc: dict[str, Any], results: str) -> str:
    """The README's performance tables: this run's, named by its commit and results file."""
    profile = "quick" if doc.get("quick") else "full"
    return "\n".join(
        [
            f"Measured by the {profile} profile on {doc['date']} on {doc['host']} "
            f"(`{results}.json` and `.md` hold every figure and each script's own output):",
            "",
            *_provenance(doc),
            "",
            render_table(doc["cases"]),
        ]
    )


def write_readme(readme: Path, doc: dict[str, Any], results: Path) -> None:
    """Put ``doc``'s tables into ``readme``, naming ``results`` (its JSON without suffix)."""
    where = results.resolve()
    with contextlib.suppress(ValueError):
        where = where.relative_to(ROOT)
    readme.write_text(replace_readme_section(readme.read_text(), readme_section(doc, str(where))))
    print(f"wrote the tables of {where}.json into {readme}")


def replace_readme_section(text: str, section: str) -> str:
    """``text`` with what lies between the README's two markers replaced by ``section``."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin or text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise ValueError(
            f"the README needs one '{README_BEGIN}' line and, after it, one '{README_END}' "
            "line around the tables the suite writes"
        )
    return text[: begin + len(README_BEGIN)] + "\n\n" + section.rstrip() + "\n\n" + text[end:]


# ---------------------------------------------------------------- running


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        if match:
            return match.group(1).strip()
    return platform.processor() or platform.machine()


def run_job(
    job: Job, threads: int, tmp: Path
) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """Run one script in a fresh process; (its record, its JSON or None, the error or None)."""
    out = tmp / (Path(job.script).stem + ".json")
    argv = [str(BENCH / job.script), "--threads", str(threads), *job.args, "--json", str(out)]
    print(f"\n=== {shlex.join(['python', 'bench/' + job.script, *argv[1:-2]])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, check=False)
    record = {
        "script": job.script,
        "argv": ["bench/" + job.script, *argv[1:-2]],
        "returncode": proc.returncode,
        "seconds": time.perf_counter() - start,
    }
    print(f"=== {job.script}: exit {proc.returncode}, {record['seconds']:.0f} s", flush=True)
    try:
        # a script whose bars failed still measured: its JSON says which failed
        return record, json.loads(out.read_text()), None
    except (OSError, json.JSONDecodeError) as exc:
        if proc.returncode != 0:
            return record, None, f"exit status {proc.returncode}"
        return record, None, f"no JSON ({type(exc).__name__})"


def _first(raw: dict[str, Any], *paths: tuple[str, ...]) -> Any:
    for path in paths:
        node: Any = raw
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def _readme_problem(readme: Path, doc: dict[str, Any] | None, source: Path | None) -> str | None:
    """Why the README's tables cannot be written, checked before anything is measured: they
    must name a clean commit (the checkout's, or that of the saved run being rendered)."""
    if doc is None:
        commit = git_commit()
        if commit is None or commit.endswith("+dirty"):
            return (
                "--readme writes tables that name the commit measured, but the checkout has "
                "uncommitted changes: commit them first, or leave out --readme"
            )
    elif str(doc.get("git_commit") or "+dirty").endswith("+dirty"):
        return f"{source} names no clean commit, so its tables cannot go into the README"
    try:
        replace_readme_section(readme.read_text(), "")
    except (OSError, ValueError) as exc:
        return f"{readme}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick profile (make bench-quick)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--only", nargs="+", default=None, choices=list(CASES), help="run these scripts only"
    )
    parser.add_argument("--out-dir", type=Path, default=BENCH / "results")
    parser.add_argument(
        "--render", type=Path, default=None, help="print the markdown of a suite JSON"
    )
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="also write the tables into this README, between its bench markers "
        "(make bench); needs a clean checkout, so that they name a commit",
    )
    args = parser.parse_args(argv)
    doc = json.loads(args.render.read_text()) if args.render is not None else None
    if args.readme is not None:
        problem = _readme_problem(args.readme, doc, args.render)
        if problem is not None:
            print(f"suite.py: error: {problem}", file=sys.stderr)
            return 2
    if doc is not None:
        doc["cases"] = collect(doc.get("raw", {}), doc.get("errors", {}))  # today's rendering
        if args.readme is not None:
            write_readme(args.readme, doc, args.render.with_suffix(""))
        else:
            print(render_markdown(doc), end="")
        return 0

    profile = "quick" if args.quick else "full"
    jobs = [j for j in PROFILES[profile] if args.only is None or j.script in args.only]
    now = datetime.now(timezone.utc)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    records = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qtrain-bench-") as tmp:
        for job in jobs:
            record, result, error = run_job(job, args.threads, Path(tmp))
            records.append(record)
            if result is not None:
                raw[job.script] = result
            if error is not None:
                errors[job.script] = error
    doc: dict[str, Any] = {
        "host": socket.gethostname(),
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(
            ["python", "bench/suite.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "git_commit": git_commit(),
        "threads": args.threads,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "isa": _first(raw, ("gemm.py", "isa"), ("sparse.py", "meta", "isa")),
        "torch": _first(raw, ("gemm.py", "torch"), ("sparse.py", "meta", "torch")),
        "dgl": _first(raw, ("sparse.py", "meta", "dgl")),
        "quick": args.quick,
        "seconds": time.perf_counter() - start,
        "jobs": records,
        "errors": errors,
        "cases": collect(raw, errors),
        "raw": raw,
    }
    stem = f"{host}-{now:%Y-%m-%d}" + ("-quick" if args.quick else "")
    write_json(args.out_dir / f"{stem}.json", doc)
    markdown = render_markdown(doc)
    (args.out_dir / f"{stem}.md").write_text(markdown)
    print()
    print(markdown, end="")
    print(f"wrote {args.out_dir / stem}.json and .md ({doc['seconds']:.0f} s)")
    if args.readme is not None:
        write_readme(args.readme, doc, args.out_dir / stem)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
