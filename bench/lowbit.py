"""Tango at 4 (and 2) bits against 8 bits in one run: epoch time and the bytes a step saves.

Issue 32: below 5 bits tango stores its quantized operands packed, two 4-bit values a
byte (``[quant.tango] packed``): what the cache keeps, what a product saves for its
backward and the rows an SpMM gathers (``qspmm4``). This bench trains each recipe once
per variant and repeat, the variants interleaved within each repeat, through qtrain's
runner as ``qtrain run`` would: tango at 8 bits (the baseline of the ratios), at 4 bits
packed, at 4 bits unpacked (int8 storage: what packing changes), at 2 bits packed, and
FP32 for reference. Per variant: the median of the runs' median epoch times with the
spread over repeats, the bytes a step keeps for its backward (qtrain's activation
meter, highest step), and the ratios 8-bit / variant (> 1: faster, smaller).

    python bench/lowbit.py                                   # synthetic-arxiv GCN and GAT
    python bench/lowbit.py --recipes cora-gcn --epochs 50 --repeats 5   # ($QTRAIN_DATA_DIR)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
from _record import ROOT, provenance, write_json

TANGO = 'quant.plugin=["tango"]'
BASELINE = "tango 8"
VARIANTS: dict[str, list[str]] = {
    "fp32": [],
    "tango 8": [TANGO, "quant.tango.bits=8"],
    "tango 4": [TANGO, "quant.tango.bits=4", "quant.tango.packed=true"],
    "tango 4 int8": [TANGO, "quant.tango.bits=4", "quant.tango.packed=false"],
    "tango 2": [TANGO, "quant.tango.bits=2", "quant.tango.packed=true"],
}


def run_one(recipe: str, variant: str, epochs: int, extra: list[str], out: Path) -> dict[str, Any]:
    """One run's summary (``status`` says how it ended)."""
    from qtrain.errors import QtrainError
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    overrides = [
        f"output.dir={out}",
        "output.checkpoint=false",
        f"train.epochs={epochs}",
        f"train.eval_every={epochs}",  # the epochs timed are training steps, not evaluations
        *VARIANTS[variant],
        *extra,
    ]
    try:
        return execute(load_recipe(ROOT / "examples" / f"{recipe}.toml", overrides), Reporter())
    except QtrainError as exc:
        return {"status": f"failed: {exc}"}


def _tango(summary: dict[str, Any]) -> dict[str, Any]:
    """The tango plugin's report inside a run summary ({} for FP32)."""
    return (summary.get("plugin_reports") or {}).get("tango", {})


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in runs if r.get("status") == "completed"]
    times = [1000 * r["epoch_time_s"] for r in done]
    return {
        "runs": len(runs),
        "completed": len(done),
        "epoch_ms": statistics.median(times) if times else None,
        "epoch_ms_min": min(times, default=None),
        "epoch_ms_max": max(times, default=None),
        "saved_bytes": max((r["activation_bytes"] for r in done), default=None),
        "operands_packed": max((_tango(r).get("operands_packed", 0) for r in done), default=0),
        "statuses": sorted({r.get("status", "?") for r in runs}),
    }


def measure(recipes: list[str], repeats: int, epochs: int, extra: list[str], variants: list[str]):
    from qtrain.plugin import import_builtin_plugins

    import_builtin_plugins()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="qtrain-lowbit-") as tmp:
        for recipe in recipes:
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for _ in range(repeats):
                for variant in variants:  # interleaved: each repeat runs every variant in turn
                    runs[variant].append(run_one(recipe, variant, epochs, extra, Path(tmp)))
            rows = {v: summarize(r) for v, r in runs.items()}
            base = rows[BASELINE]
            for row in rows.values():
                for key, ratio in (("epoch_ms", "speedup"), ("saved_bytes", "saved_ratio")):
                    ok = row[key] and base[key]
                    row[ratio] = base[key] / row[key] if ok else None
            results[recipe] = rows
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| recipe | variant | epoch ms (min-max) | vs 8-bit | saved MiB | vs 8-bit "
        "| operands packed | completed |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for recipe, rows in results.items():
        for variant, r in rows.items():
            saved = None if r["saved_bytes"] is None else r["saved_bytes"] / 2**20
            spread = f"({fmt(r['epoch_ms_min'], '.0f')}-{fmt(r['epoch_ms_max'], '.0f')})"
            lines.append(
                f"| {recipe} | {variant} | {fmt(r['epoch_ms'], '.1f')} {spread} | "
                f"{fmt(r['speedup'], '.2f')}x | {fmt(saved, '.1f')} | "
                f"{fmt(r['saved_ratio'], '.2f')}x | {r['operands_packed']} | "
                f"{r['completed']}/{r['runs']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["arxiv-gcn", "arxiv-gat"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--set", action="append", default=[], help="more recipe overrides (KEY=VALUE)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help=f"which to run ({BASELINE!r}, the baseline of the ratios, always runs)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    variants = [BASELINE, *(v for v in args.variants if v != BASELINE)]
    results = measure(args.recipes, args.repeats, args.epochs, args.set, variants)
    print(table(results))
    write_json(args.json, {**provenance(), "repeats": args.repeats, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
