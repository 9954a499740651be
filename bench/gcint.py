"""Integer-only GCN training (``train.numerics = "gcint"``) beside FP32 and tango on the
same graphs: epoch time, memory and test accuracy, and GCINT's DyQ against its StQ.

Per dataset, the built-in GCN (the example recipe ``examples/cora-gcn.toml``: 2 layers,
16 hidden units, dropout 0.5, 200 epochs) trains once per seed and variant, the variants
interleaved within each seed (FP32, tango 8-bit, gcint with DyQ, gcint with StQ, gcint
with DyQ and the integer softmax error, gcint with the bounded DyQ and the softmax error),
through qtrain's runner as ``qtrain run`` would. Per variant: the median of the runs' median epoch
times, the bytes a step keeps for its backward (qtrain's meter; for gcint, its int8
saved tensors), the peak resident memory of a step (the meter's, whole process), the
mean and spread of the test accuracy, and how many runs diverged or failed (stability).
Ratios are FP32's over the variant's (> 1: faster, smaller).

    python bench/gcint.py                              # cora, citeseer ($QTRAIN_DATA_DIR)
    python bench/gcint.py --datasets synthetic-arxiv --seeds 1 --epochs 20
    python bench/gcint.py --datasets synthetic-products --seeds 1 --epochs 2 \
        --variants fp32 "gcint stq" --set train.mode=minibatch --set model.hidden=256 \
        --set "train.fanouts=[25, 10]" --set train.batch_size=1024    # GCINT's mini-batch setting
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
from _record import ROOT, git_commit, write_json

RECIPE = ROOT / "examples" / "cora-gcn.toml"
VARIANTS: dict[str, list[str]] = {
    "fp32": [],
    "tango": ['quant.plugin=["tango"]', "quant.tango.bits=8"],
    "gcint dyq": ["train.numerics=gcint", "train.gcint_quantizer=dyq"],
    "gcint stq": ["train.numerics=gcint", "train.gcint_quantizer=stq"],
    "gcint dyq softmax": [
        "train.numerics=gcint",
        "train.gcint_quantizer=dyq",
        "train.gcint_loss=softmax",
    ],
    "gcint bounded softmax": [
        "train.numerics=gcint",
        "train.gcint_quantizer=dyq-bounded",
        "train.gcint_loss=softmax",
    ],
}


def run_one(dataset: str, variant: str, seed: int, epochs: int, extra: list[str], out: Path):
    """One run's summary (``status`` says how it ended)."""
    from qtrain.errors import QtrainError
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    overrides = [
        f"dataset.name={dataset}",
        f"train.seed={seed}",
        f"output.dir={out}",
        "output.checkpoint=false",
        *([f"train.epochs={epochs}"] if epochs else []),
        *VARIANTS[variant],
        *extra,
    ]
    try:
        return execute(load_recipe(RECIPE, overrides), reporter=Reporter())
    except QtrainError as exc:  # a diverged run is a result here, not the end of the bench
        return {"status": f"failed: {exc}"}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in runs if r.get("status") == "completed"]
    accs = [100 * r["test_acc"] for r in done if r.get("test_acc") is not None]
    return {
        "runs": len(runs),
        "completed": len(done),
        "epoch_ms": statistics.median(1000 * r["epoch_time_s"] for r in done) if done else None,
        "saved_bytes": max((r["activation_bytes"] for r in done), default=None),
        "step_peak_bytes": max((r["peak_memory_bytes"] for r in done), default=None),
        "test_acc": statistics.mean(accs) if accs else None,
        "test_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "test_accs": accs,  # per seed, in seed order
        "statuses": sorted({r.get("status", "?") for r in runs}),
    }


def measure(
    datasets: list[str], seeds: int, epochs: int, extra: list[str], variants: list[str]
) -> dict[str, Any]:
    from qtrain.plugin import import_builtin_plugins

    import_builtin_plugins()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="qtrain-gcint-") as tmp:
        for dataset in datasets:
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for seed in range(seeds):
                for variant in variants:  # interleaved: each seed runs every variant in turn
                    runs[variant].append(run_one(dataset, variant, seed, epochs, extra, Path(tmp)))
            rows = {v: summarize(r) for v, r in runs.items()}
            base = rows["fp32"]
            for row in rows.values():
                for key, ratio in (("epoch_ms", "speedup"), ("saved_bytes", "saved_ratio")):
                    ok = row[key] and base[key]
                    row[ratio] = base[key] / row[key] if ok else None
            results[dataset] = rows
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| dataset | variant | epoch ms | vs FP32 | saved MiB | vs FP32 | step peak MiB "
        "| test acc (mean ± std) | completed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for dataset, rows in results.items():
        for variant, r in rows.items():
            saved = None if r["saved_bytes"] is None else r["saved_bytes"] / 2**20
            peak = None if r["step_peak_bytes"] is None else r["step_peak_bytes"] / 2**20
            acc = "-" if r["test_acc"] is None else f"{r['test_acc']:.2f} ± {r['test_acc_std']:.2f}"
            lines.append(
                f"| {dataset} | {variant} | {fmt(r['epoch_ms'], '.1f')} | "
                f"{fmt(r['speedup'], '.2f')}x | {fmt(saved, '.2f')} | "
                f"{fmt(r['saved_ratio'], '.2f')}x | {fmt(peak, '.0f')} | {acc} | "
                f"{r['completed']}/{r['runs']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=0, help="0: the recipe's 200")
    parser.add_argument(
        "--set", action="append", default=[], help="more recipe overrides (KEY=VALUE)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help="which to run (FP32, the baseline of the ratios, always runs)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    variants = ["fp32", *(v for v in args.variants if v != "fp32")]
    results = measure(args.datasets, args.seeds, args.epochs, args.set, variants)
    print(table(results))
    write_json(
        args.json,
        {
            "command": " ".join(["python", "bench/gcint.py", *(argv or sys.argv[1:])]),
            "git_commit": git_commit(),
            "seeds": args.seeds,
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
