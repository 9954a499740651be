"""Does ``qtrain profile`` tell the truth about an epoch, and what does profiling cost?

Runs a recipe (GAT on synthetic-arxiv by default) twice, as a user would, in
separate processes: ``qtrain run`` for warm-up + N epochs (the epoch times of
its ``metrics.jsonl`` after the warm-up), then ``qtrain profile`` with the same
warm-up and N. Prints the issue's bars with PASS / FAIL:

* the primitives' shares add up to the epoch within 5 % (``traced_share``:
  what the table does not explain is the ``untraced`` Python between ops);
* the profiled epoch agrees with ``qtrain run``'s within 10 % (which also
  bounds the profiler's overhead).

    python bench/profile_overhead.py --threads 2 --json bench/results/profile_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _record import ROOT, provenance, write_json

QTRAIN = [sys.executable, "-m", "qtrain"]


def _last_json(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.strip().splitlines()[-1])


def _qtrain(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([*QTRAIN, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"qtrain {args[0]} failed ({done.returncode}): {tail[0]}")
    return _last_json(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="examples/arxiv-gat.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as out:
        common = [f"train.threads={args.threads}", f"output.dir={json.dumps(out)}"]
        sets = [x for s in [*common, *args.overrides] for x in ("--set", s)]
        total = args.warmup + args.epochs
        length = ["--set", f"train.epochs={total}", "--set", f"train.eval_every={total}"]
        run = _qtrain(["run", args.recipe, "--json", *sets, *length])
        metrics = Path(run["run_dir"]) / "metrics.jsonl"
        epochs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        run_ms = [e["epoch_time_s"] * 1e3 for e in epochs[args.warmup :]]
        counts = ["--epochs", str(args.epochs), "--warmup", str(args.warmup)]
        prof = _qtrain(["profile", args.recipe, "--json", *counts, *sets])
    run_median = statistics.median(run_ms)
    agreement = prof["epoch_ms_median"] / run_median
    bars = [
        {
            "bar": "shares add up to the epoch (traced share)",
            "value": prof["traced_share"],
            "want": ">= 0.95",
            "pass": prof["traced_share"] >= 0.95,
        },
        {
            "bar": "profiled epoch / qtrain run epoch",
            "value": agreement,
            "want": "within 0.90-1.10",
            "pass": 0.9 <= agreement <= 1.1,
        },
    ]
    print(f"qtrain run     {args.recipe}: {run_median:,.0f} ms/epoch (median of {len(run_ms)})")
    print(
        f"qtrain profile {args.recipe}: {prof['epoch_ms_median']:,.0f} ms/epoch (median of "
        f"{prof['epochs']}), traced {prof['traced_share']:.1%}"
    )
    for p in prof["primitives"]:
        print(f"  {p['name']:13} {p['backend']:8} {p['total_ms']:9.1f} ms  {p['share']:6.1%}")
    for b in bars:
        print(f"{'PASS' if b['pass'] else 'FAIL'}  {b['bar']}: {b['value']:.3f} (want {b['want']})")
    write_json(
        args.json,
        {
            **provenance(),
            "threads": args.threads,
            "recipe": args.recipe,
            "overrides": args.overrides,
            "run_epoch_ms": run_ms,
            "profile": prof,
            "bars": bars,
        },
    )
    return 0 if all(b["pass"] for b in bars) else 1


if __name__ == "__main__":
    raise SystemExit(main())
