"""One full training epoch (forward + backward + Adam step): tango vs DGL FP32 vs bf16 autocast.

Uses the example recipes (``examples/arxiv-gcn.toml``: GCN 3 x 256;
``examples/arxiv-gat.toml``: GAT 3 layers, 4 heads x 64) on the synthetic
ogbn-arxiv-shaped graph, and the trainer's own ``train_epoch``, so the step
timed is the step ``qtrain run`` takes. Each variant gets a fresh model with
the same seed; each epoch is timed by ``torch.utils.benchmark.Timer``
(``bench/_timing.py``), and the median of ``--repeat`` epochs after ``--warmup`` is
reported with its interquartile range (``iqr_s``), and ratios of the medians against
FP32 measured in the same process.

    python bench/epoch.py --threads 2 --json bench/results/epoch.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _record import write_json
from _timing import Timing, timed

from qtrain.plugin import PatchSession, PluginContext
from qtrain.recipe import load_recipe, parse_quant
from qtrain.train.loop import Trainer
from qtrain.train.prepare import prepared

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gcn": "arxiv-gcn", "gat": "arxiv-gat"}


@contextlib.contextmanager
def _variant(name: str, model: Any, bits: int, seed: int) -> Iterator[dict[str, Any]]:
    """The patches / autocast a variant runs under; yields a dict the variant may report into."""
    info: dict[str, Any] = {}
    if name == "fp32":
        yield info
    elif name == "bf16-autocast":
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            yield info
    else:
        quant = parse_quant({"plugin": ["tango"], "tango": {"bits": bits}})
        session = PatchSession(quant, PluginContext(seed=seed, model=model))
        with session:
            yield info
        info.update(session.report()["tango"])


def time_epochs(trainer: Trainer, warmup: int, repeat: int) -> Timing:
    """``repeat`` timed epochs (one ``train_epoch`` call each) after ``warmup`` untimed ones."""
    return timed(trainer.train_epoch, repeat, warmup)


def bench_model(
    key: str, variants: list[str], bits: int, warmup: int, repeat: int
) -> dict[str, Any]:
    recipe = load_recipe(ROOT / "examples" / f"{MODELS[key]}.toml", [])
    rows: dict[str, Any] = {}
    for name in variants:
        with prepared(recipe) as (dataset, graph, model, device):
            trainer = Trainer(
                model, graph, metric=dataset.metric, config=recipe.train, device=device
            )
            from qtrain.ops import dispatch

            dispatch.reset()
            try:
                with _variant(name, model, bits, recipe.train.seed) as info:
                    t = time_epochs(trainer, warmup, repeat)
            except Exception as exc:  # e.g. a DGL kernel without bf16 support
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {key} {name}: not supported ({rows[name]['error'][:120]})", flush=True)
                continue
            rows[name] = {
                "median_s": t.median_s,
                "iqr_s": t.iqr_s,
                "times_s": t.times_s,
                "kernels": dispatch.snapshot(),
                **({"tango": info} if info else {}),
            }
            print(f"  {key} {name}: {t.ms('.0f')} ms/epoch (median ± IQR)", flush=True)
    base = rows.get("fp32", {}).get("median_s")
    bf16 = rows.get("bf16-autocast", {}).get("median_s")
    for row in rows.values():
        if "median_s" in row:
            row["speedup_vs_fp32"] = base / row["median_s"] if base else None
            row["speedup_vs_bf16"] = bf16 / row["median_s"] if bf16 else None
    return rows


def main(argv: list[str] | None = None) -> int:
    # huge pages for torch's CPU allocator, as the qtrain command sets (qtrain.cli.main);
    # `import qtrain` no longer does. In time: torch reads it at its first allocation.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bits", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["fp32", "bf16-autocast", "tango"],
        choices=["fp32", "bf16-autocast", "tango"],
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "models": {},
    }
    print(f"epoch benchmark, {args.threads} threads, tango at {args.bits} bits", flush=True)
    for key in args.models:
        results["models"][key] = bench_model(
            key, args.variants, args.bits, args.warmup, args.repeat
        )
    print()
    print(f"{'model':6} {'variant':14} {'ms/epoch':>9} {'± IQR':>7} {'vs fp32':>8} {'vs bf16':>8}")
    for key, rows in results["models"].items():
        for name, row in rows.items():
            if "error" in row:
                print(f"{key:6} {name:14} {'n/a':>9} {'':>7}  {row['error'][:60]}")
                continue
            vs32 = row["speedup_vs_fp32"]
            vs16 = row["speedup_vs_bf16"]
            print(
                f"{key:6} {name:14} {row['median_s'] * 1e3:9.0f} {row['iqr_s'] * 1e3:7.0f} "
                f"{vs32:8.2f}x " + (f"{vs16:7.2f}x" if vs16 else "     n/a")
            )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
