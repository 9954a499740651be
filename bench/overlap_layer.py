"""What overlap's layer split costs by itself: one hidden layer, whole block vs two halves.

Rank 0's partition of synthetic-arxiv into ``--workers`` parts (METIS), one
process, one thread, the halo rows already present (no transfer to hide), a
hidden layer of ``examples/arxiv-<model>.toml`` forward and backward:

The owned rows are the leaf that gets the gradient, and the halo is appended
to a copy of them, as ``with_halo`` does; GCN's source rows are scaled per
source (``GCN.conv_inputs``), as the worker does.

* ``whole``: the worker's block (dst = owned, src = owned + halo), as without overlap
  (SAGE: the owned rows passed as the destination rows, as the worker does);
* ``split``: the central half on its block (src = the owned rows central nodes read,
  a prefix of the owned rows), then the marginal half, outputs concatenated, as
  ``DistTrainer`` runs a layer with overlap.

Each allocator setting runs in its own process, once with glibc's default
allocator settings and once after ``keep_freed_memory()`` (what every worker
does); in it the two modes run interleaved (one call of each per round, the order
rotated), ``--repeats`` rounds after one warm-up round, every call timed by
``torch.utils.benchmark.Timer`` (``bench/_timing.py``); prints the best and the
median times in ms, the median with its interquartile range (IQR).

    python bench/overlap_layer.py --models gcn sage --json bench/results/overlap-layer.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _record import ROOT, provenance, write_json
from _timing import Timing, interleaved
from adaqp import MODELS


def measure(model_name: str, workers: int, repeats: int, keep: bool) -> dict[str, list[float]]:
    """Seconds per forward + backward of one hidden layer, whole and split (this process)."""
    import torch

    from qtrain._malloc import keep_freed_memory
    from qtrain.distributed.partition import assign_parts, build_partition
    from qtrain.distributed.trainer import OwnedParts
    from qtrain.recipe import load_recipe
    from qtrain.train.prepare import prepared

    if keep:
        keep_freed_memory()
    torch.set_num_threads(1)
    recipe = load_recipe(ROOT / MODELS[model_name])
    with prepared(recipe) as (_dataset, graph, model, _device):
        part = build_partition(graph, assign_parts(graph, workers, "metis", 0), 0, workers)
    layer = model.layers[1]
    n_owned, n_central = part.num_owned, part.num_central
    n_read = part.central_block.num_src_nodes()
    width = model.layer_dims()[0]
    owned_rows = torch.randn(n_owned, width)
    halo_rows = torch.randn(int(part.halo.numel()), width)

    def conv(block: Any, src: torch.Tensor, dst: torch.Tensor | None = None) -> torch.Tensor:
        """The layer on ``block`` as the worker runs it (GCN: ``conv_inputs``)."""
        weight = None
        if model_name == "gcn":
            src, weight = model.conv_inputs(block, src)
        return layer(block, src if dst is None else (src, dst), edge_weight=weight)

    def whole() -> None:
        x = owned_rows.clone().requires_grad_()
        dst = x if model.reads_destination_rows else None
        conv(part.block, torch.cat([x, halo_rows]), dst).sum().backward()

    def split() -> None:
        x = owned_rows.clone().requires_grad_()
        read, marginal = OwnedParts.apply(x, n_read, n_central)
        inner = conv(part.central_block, read)
        outer = conv(part.marginal_block, torch.cat([x, halo_rows]), marginal)
        torch.cat([inner, outer]).sum().backward()

    # one warm-up round: graph formats, allocator
    timings = interleaved({"whole": whole, "split": split}, repeats, warmup=1)
    return {name: t.times_s for name, t in timings.items()}


def main(argv: list[str] | None = None) -> int:
    # huge pages for torch's CPU allocator, as the qtrain command sets (qtrain.cli.main);
    # `import qtrain` no longer does. In time: torch reads it at its first allocation.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ALLOCATOR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model_name, allocator = args.child
        times = measure(model_name, args.workers, args.repeats, allocator == "keep")
        print(json.dumps(times))
        return 0
    results: dict[str, Any] = {}
    print("one hidden layer, forward + backward: best and median ± IQR", flush=True)
    for model_name in args.models:
        for allocator in ("default", "keep"):
            child = ["--child", model_name, allocator, "--workers", str(args.workers)]
            done = subprocess.run(
                [sys.executable, __file__, *child, "--repeats", str(args.repeats)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            times = json.loads(done.stdout.strip().splitlines()[-1])
            results.setdefault(model_name, {})[allocator] = times
            best = {k: min(v) * 1e3 for k, v in times.items()}
            t = {k: Timing.of(v, k) for k, v in times.items()}
            print(
                f"{model_name:5} {allocator:8} whole best {best['whole']:7.1f} median "
                f"{t['whole'].ms()} ms | split best {best['split']:7.1f} median "
                f"{t['split'].ms()} ms | split / whole (best) "
                f"{best['split'] / best['whole']:.3f}",
                flush=True,
            )
    write_json(
        args.json,
        {
            **provenance(),
            "workers": args.workers,
            "repeats": args.repeats,
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
