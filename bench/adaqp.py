"""Distributed full-graph training (adaqp): accuracy, bytes on the wire and epoch time.

For each model (GCN and GraphSAGE 3 x 256 from ``examples/arxiv-*.toml``, on
synthetic-arxiv) and seed, three runs of ``qtrain run`` as a user starts
them: one process; ``--workers`` workers with 32-bit messages and no overlap;
the same workers with adaptive message bits and overlap. Prints the issue's
bars with PASS / FAIL:

* 32-bit workers match one process within 0.1 accuracy point (mean over seeds);
* adaptive within 0.3 point of 32-bit;
* adaptive sends <= 1/5 of the 32-bit bytes per epoch (``comm_bytes_per_epoch``,
  counted from the buffers, the first epochs at 8 bits included);
* adaptive with overlap takes less wall-clock time per epoch than 32-bit
  without (each run's slowest worker's mean epoch, the solver's time included;
  same machine, same bench run; seed by seed, the variants alternating in order).

``--variants`` adds ``w32-overlap`` and ``adaptive-no-overlap``, which separate
what overlap and what the bit widths each do to the time.

    python bench/adaqp.py --seeds 0 1 2 --epochs 20 --reassign-period 5 --json bench/results/adaqp-accuracy.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _record import ROOT, provenance, write_json

MODELS = {"gcn": "examples/arxiv-gcn.toml", "sage": "examples/arxiv-sage.toml"}


def variants(workers: int, period: int) -> dict[str, list[str]]:
    """The runs the bars compare, and two more that split the time bar's two causes."""
    w = f"distributed.world_size={workers}"
    adaptive = ['distributed.message_bits="adaptive"', f"distributed.reassign_period={period}"]
    return {
        "single": [],
        "w32": [w, "distributed.message_bits=32"],
        "adaptive": [w, *adaptive, "distributed.overlap=true"],
        # not in the bars: overlap alone, adaptive bits alone
        "w32-overlap": [w, "distributed.message_bits=32", "distributed.overlap=true"],
        "adaptive-no-overlap": [w, *adaptive],
    }


BAR_VARIANTS = ("single", "w32", "adaptive")


def run(recipe: str, sets: list[str]) -> dict[str, Any]:
    args = [x for s in sets for x in ("--set", s)]
    done = subprocess.run(
        [sys.executable, "-m", "qtrain", "run", recipe, "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        # the run directory goes with the temporary output directory: keep the failed
        # worker's last words in the bench's own output
        for log in re.findall(r"see (\S+worker-\d+\.log)", tail[0]):
            if Path(log).exists():
                last = Path(log).read_text(errors="replace").splitlines()[-30:]
                print(f"--- last lines of {log}:", *last, sep="\n", file=sys.stderr)
        raise SystemExit(f"qtrain run {recipe} {' '.join(sets)} failed: {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--reassign-period", type=int, default=10)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(BAR_VARIANTS),
        choices=list(variants(4, 1)),
        help="runs per model and seed (the bars need single, w32 and adaptive)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads in all (0: each run's default); workers get an equal share",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as out:
        chosen = [
            (name, sets)
            for name, sets in variants(args.workers, args.reassign_period).items()
            if name in args.variants
        ]
        for model in args.models:
            # seed by seed, the variants in turn and in reverse order every other seed, so
            # that a machine getting slower or faster during the bench favours none of them
            for i, seed in enumerate(args.seeds):
                for name, sets in chosen if i % 2 == 0 else chosen[::-1]:
                    common = [
                        f"train.epochs={args.epochs}",
                        f"train.seed={seed}",
                        f"train.eval_every={max(1, args.epochs // 10)}",
                        f"output.dir={json.dumps(out)}",
                        "output.checkpoint=false",
                    ]
                    if args.threads:
                        share = args.threads if name == "single" else args.threads // args.workers
                        common.append(f"train.threads={max(1, share)}")
                    summary = run(MODELS[model], [*common, *sets])
                    info = summary.get("distributed") or {}
                    row = {
                        "test_acc": summary["test_acc"],
                        "epoch_time_s": summary["epoch_time_s"],
                        "comm_bytes_per_epoch": info.get("comm_bytes_per_epoch"),
                        "time_per_epoch_s": info.get("time_per_epoch_s"),
                        "solver_seconds": info.get("solver_seconds"),
                        "bits_histogram": info.get("bits_histogram"),
                    }
                    results.setdefault(model, {}).setdefault(name, []).append(row)
                    split = row["time_per_epoch_s"] or {}
                    print(
                        f"{model:5} {name:19} seed {seed}: test {row['test_acc']:.4f}  "
                        f"median {row['epoch_time_s'] * 1e3:7.0f} ms/epoch"
                        + (
                            f"  mean {split['epoch'] * 1e3:7.0f} ms (comm "
                            f"{split['communication'] * 1e3:.0f}, quant "
                            f"{split['quantization'] * 1e3:.0f}, compute "
                            f"{split['computation'] * 1e3:.0f}; solver "
                            f"{row['solver_seconds']:.2f} s in all)  "
                            f"{row['comm_bytes_per_epoch'] / 2**20:7.1f} MiB/epoch"
                            if split
                            else ""
                        ),
                        flush=True,
                    )
    bars = []
    for model, rows in results.items():
        if not all(k in rows for k in BAR_VARIANTS):
            continue
        acc = {k: 100 * statistics.mean(r["test_acc"] for r in v) for k, v in rows.items()}
        # wall-clock per epoch: the slowest worker's mean, the solver's epochs included
        wall = {
            k: statistics.mean(r["time_per_epoch_s"]["epoch"] for r in v)
            for k, v in rows.items()
            if k != "single"
        }
        sent = {
            k: statistics.mean(r["comm_bytes_per_epoch"] for r in v)
            for k, v in rows.items()
            if k != "single"
        }
        checks = [
            (
                "32-bit workers vs one process, accuracy points",
                abs(acc["w32"] - acc["single"]),
                0.1,
            ),
            ("adaptive vs 32-bit, accuracy points", abs(acc["adaptive"] - acc["w32"]), 0.3),
            ("adaptive / 32-bit bytes per epoch", sent["adaptive"] / sent["w32"], 0.2),
            ("adaptive+overlap / 32-bit epoch time", wall["adaptive"] / wall["w32"], 1.0 - 1e-9),
        ]
        for name, value, limit in checks:
            bars.append(
                {
                    "model": model,
                    "bar": name,
                    "value": value,
                    "limit": limit,
                    "pass": value <= limit,
                }
            )
    print()
    for b in bars:
        print(
            f"{'PASS' if b['pass'] else 'FAIL'}  {b['model']:5} {b['bar']}: {b['value']:.3f} "
            f"(want <= {b['limit']:.2f})"
        )
    write_json(
        args.json,
        {
            **provenance(),
            "workers": args.workers,
            "threads": args.threads,
            "epochs": args.epochs,
            "seeds": args.seeds,
            "results": results,
            "bars": bars,
        },
    )
    return 0 if all(b["pass"] for b in bars) else 1


if __name__ == "__main__":
    raise SystemExit(main())
