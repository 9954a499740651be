"""The comparison's numbers (``compare.json``), its table (``compare.md``) and its chart
(``compare.png``).

Per variant: the test metric's mean, standard deviation and range over the runs
that completed; the epoch time as the median of each run's median epoch, with the
range over runs; activation memory (what autograd saved, qtrain's meter), the
training steps' peak resident memory and the whole process's peak (independent
of qtrain's meter); the kernels the runs used. Every ratio is FP32's value
divided by the variant's (> 1: the variant is that many times faster, or smaller),
the direction of every ratio qtrain prints (bench tables, ``qtrain profile``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qtrain import __version__
from qtrain.recipe import Recipe

MIB = 2**20


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _kernels(summaries: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each primitive's backends over the runs (``fp32``: calls that stayed float32)."""
    found: dict[str, set[str]] = {}
    for summary in summaries:
        for primitive, counts in (summary.get("kernels") or {}).items():
            used = {backend for backend, n in (counts or {}).items() if n}
            if used:
                found.setdefault(primitive, set()).update(used)
    return {p: sorted(b) for p, b in sorted(found.items())}


def _row(label: str, runs: list[Any]) -> dict[str, Any]:
    done = [r.summary for r in runs if r.summary.get("status") == "completed"]
    metric = _finite([s.get("test_acc") for s in done])
    epoch_ms = [1000 * t for t in _finite([s.get("epoch_time_s") for s in done])]
    activation = _finite([s.get("activation_bytes") for s in done])
    step_peak = _finite([s.get("peak_memory_bytes") for s in done])
    process_peak = _finite([s.get("process_peak_memory_bytes") for s in done])
    return {
        "variant": label,
        "runs": len(runs),
        "completed": len(done),
        "statuses": sorted({str(r.summary.get("status")) for r in runs}),
        "test_metric": {
            "mean": statistics.fmean(metric) if metric else None,
            "std": statistics.stdev(metric) if len(metric) > 1 else None,
            "min": min(metric) if metric else None,
            "max": max(metric) if metric else None,
            "values": metric,
        },
        "epoch_ms": _spread(epoch_ms),
        "activation_mib": statistics.fmean(activation) / MIB if activation else None,
        "step_peak_mib": statistics.fmean(step_peak) / MIB if step_peak else None,
        "process_peak_mib": statistics.fmean(process_peak) / MIB if process_peak else None,
        "kernels": _kernels(done),
        "run_dirs": [r.summary.get("run_dir") for r in runs],
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    """``base / value``: how many times less time or memory the variant takes than FP32."""
    return base / value if base is not None and value else None


def build_report(
    recipe: Recipe, columns: Sequence[Any], results: Sequence[Any], *, seeds: int, repeats: int
) -> dict[str, Any]:
    """The comparison as one JSON-ready dict (rows in variant order, FP32 first)."""
    rows = [_row(v.label, [r for r in results if r.variant == v.label]) for v in columns]
    base = rows[0]
    for row in rows:
        row["vs_fp32"] = {
            "epoch_time": _ratio(row["epoch_ms"]["median"], base["epoch_ms"]["median"]),
            "activation": _ratio(row["activation_mib"], base["activation_mib"]),
            "step_peak": _ratio(row["step_peak_mib"], base["step_peak_mib"]),
            "process_peak": _ratio(row["process_peak_mib"], base["process_peak_mib"]),
        }
    metric = next((r.summary.get("metric") for r in results if r.summary.get("metric")), None)
    return {
        "recipe": recipe.name,
        "model": recipe.model.name,
        "dataset": recipe.dataset.name,
        "epochs": recipe.train.epochs,
        "metric": metric or "accuracy",
        "seeds": list(range(recipe.train.seed, recipe.train.seed + seeds)),
        "repeats": repeats,
        "order": "interleaved: for each repeat, for each seed, every variant in turn",
        "ratios": "fp32 / variant (> 1: the variant is that many times faster, or smaller)",
        "qtrain": __version__,
        "rows": rows,
    }


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def table_rows(report: dict[str, Any], compact: bool = False) -> list[list[str]]:
    """The table's cells, header first: the Markdown file's, or (``compact``) the
    terminal's, without the process-peak columns and with short headers."""
    header = [
        "variant",
        f"test {report['metric']} (mean ± std)",
        "epoch ms (median, min-max)",
        "time vs fp32",
        "activation MiB",
        "vs fp32",
        "step peak MiB",
        "vs fp32",
        "process peak MiB",
        "vs fp32",
        "runs",
    ]
    if compact:
        header = ["variant", report["metric"], "epoch ms", "vs fp32", "act MiB", "vs fp32"]
        header += ["peak MiB", "vs fp32", "runs"]
    out = [header]
    for row in report["rows"]:
        m, t, r = row["test_metric"], row["epoch_ms"], row["vs_fp32"]
        metric = _fmt(m["mean"], ".4f") + ("" if m["std"] is None else f" ± {m['std']:.4f}")
        time = _fmt(t["median"], ".1f") + (
            "" if t["min"] is None else f" ({t['min']:.1f}-{t['max']:.1f})"
        )
        cells = [
            row["variant"],
            metric,
            time,
            _fmt(r["epoch_time"], ".2f", "x"),
            _fmt(row["activation_mib"], ".2f"),
            _fmt(r["activation"], ".2f", "x"),
            _fmt(row["step_peak_mib"], ".0f"),
            _fmt(r["step_peak"], ".2f", "x"),
            _fmt(row["process_peak_mib"], ".0f"),
            _fmt(r["process_peak"], ".2f", "x"),
            f"{row['completed']}/{row['runs']}",
        ]
        out.append(cells[:8] + cells[10:] if compact else cells)
    return out


def markdown(report: dict[str, Any]) -> str:
    rows = table_rows(report)
    lines = [
        f"# qtrain compare: {report['recipe']} ({report['model']} on {report['dataset']}, "
        f"{report['epochs']} epochs)",
        "",
        f"Seeds {report['seeds']}, {report['repeats']} repeat(s), {report['order']}. "
        f"Ratios: {report['ratios']}. qtrain {report['qtrain']}.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "|" + "---|" * len(rows[0]),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    lines += ["", "Kernels used (backends per primitive; fp32 = calls that stayed float32):", ""]
    for row in report["rows"]:
        used = "; ".join(f"{p}: {', '.join(b)}" for p, b in row["kernels"].items()) or "-"
        lines.append(f"- {row['variant']}: {used}")
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: Path) -> Path:
    """Test metric (mean, std), epoch time (median, range) and memory per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [r["variant"] for r in rows]
    xs = list(range(len(rows)))
    fig, (acc_ax, time_ax, mem_ax) = plt.subplots(1, 3, figsize=(13, 3.8))
    try:
        means = [r["test_metric"]["mean"] or 0.0 for r in rows]
        stds = [r["test_metric"]["std"] or 0.0 for r in rows]
        acc_ax.bar(xs, means, yerr=stds, capsize=4, color="tab:green")
        acc_ax.set(title=f"test {report['metric']} (mean ± std)", xticks=xs, xticklabels=names)
        med = [r["epoch_ms"]["median"] or 0.0 for r in rows]
        low = [m - (r["epoch_ms"]["min"] or m) for m, r in zip(med, rows, strict=True)]
        high = [(r["epoch_ms"]["max"] or m) - m for m, r in zip(med, rows, strict=True)]
        time_ax.bar(xs, med, yerr=[low, high], capsize=4, color="tab:blue")
        time_ax.set(title="epoch time, ms (median, range)", xticks=xs, xticklabels=names)
        width = 0.38  # one scale for both: how many times less than FP32's
        mem_ax.bar(
            [x - width / 2 for x in xs],
            [r["vs_fp32"]["activation"] or 0.0 for r in rows],
            width,
            label="activations (meter)",
        )
        mem_ax.bar(
            [x + width / 2 for x in xs],
            [r["vs_fp32"]["step_peak"] or 0.0 for r in rows],
            width,
            label="step peak (resident)",
        )
        mem_ax.axhline(1.0, color="gray", linewidth=0.8)
        mem_ax.set(title="memory: fp32 / variant (> 1: smaller)", xticks=xs, xticklabels=names)
        mem_ax.legend(fontsize="small")
        for ax in (acc_ax, time_ax, mem_ax):
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"{report['recipe']}: {report['model']} on {report['dataset']}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def write_report(out_dir: Path, report: dict[str, Any]) -> dict[str, str]:
    """compare.json, compare.md and compare.png in ``out_dir``; their paths."""
    files = {
        "json": out_dir / "compare.json",
        "markdown": out_dir / "compare.md",
        "png": out_dir / "compare.png",
    }
    report["files"] = {k: str(v) for k, v in files.items()}
    files["json"].write_text(json.dumps(report, indent=2) + "\n")
    files["markdown"].write_text(markdown(report))
    chart(report, files["png"])
    return report["files"]
