"""One relational layer (input and output width 64, one head: Hector's setting) on graphs
shaped like Hector's datasets: training-step and inference time, and saved-activation bytes.

Per preset (``synthetic-<name>``, scaled down to ``--max-edges`` edges keeping its types)
and model, the variants run round robin (``bench/_timing.py``), each a fresh layer from the
same seed, on the whole graph (nodes and edges grouped by type, so typed products take the
segment-GEMM path):

* ``rgcn``: DGL's ``RelGraphConv`` (one weight per relation, no bases);
* ``hgt``: DGL's ``HGTConv``;
* ``rgat``: qtrain's ``RGATConv`` (Hector's RGAT from DGL's primitives) plain, with
  compact materialization, with operator reordering, and with both.

A training step is forward, a negative log-likelihood against fixed random labels of
every node (as Hector measures), backward; inference is forward without autograd.
``saved_mib`` is what autograd saved in a training step (qtrain's meter, the same one
``qtrain run`` reports). Ratios are the plain form's time (or bytes) over the variant's.
qtrain's ``hector`` plugin, which would give DGL's RGCN and HGT layers the same
optimizations, is not written yet, so those two rows have DGL's figures only.

    python bench/hector.py --threads 2 --json bench/results/hector.json
    python bench/hector.py --presets aifb mutag --max-edges 50000 --repeat 3
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _record import git_commit, write_json
from _timing import Timing, interleaved

from qtrain._compat import import_dgl
from qtrain.data import load_dataset
from qtrain.data.base import ETYPE, FEAT, NTYPE
from qtrain.data.hetero import HECTOR_SHAPES
from qtrain.models.rgat import RGATConv
from qtrain.train.activations import ActivationMeter

WIDTH = 64
RGAT_VARIANTS = {
    "plain": {},
    "compact": {"compact": True},
    "reorder": {"reorder": True},
    "compact+reorder": {"compact": True, "reorder": True},
}


def layers(model: str, relations: Any) -> dict[str, torch.nn.Module]:
    """The variants of one model's layer, each built from seed 0."""
    dgl = import_dgl()
    out: dict[str, torch.nn.Module] = {}
    if model == "rgat":
        for name, options in RGAT_VARIANTS.items():
            torch.manual_seed(0)
            out[name] = RGATConv(WIDTH, WIDTH, 1, relations.num_etypes, 0.2, True, **options)
    elif model == "rgcn":
        torch.manual_seed(0)
        out["dgl"] = dgl.nn.RelGraphConv(WIDTH, WIDTH, relations.num_etypes)
    elif model == "hgt":
        torch.manual_seed(0)
        out["dgl"] = dgl.nn.HGTConv(
            WIDTH, WIDTH, 1, relations.num_ntypes, relations.num_etypes, dropout=0.0
        )
    return out


def forward(model: str, layer: torch.nn.Module, graph: Any, x: torch.Tensor) -> torch.Tensor:
    etype = graph.edata[ETYPE]
    if model == "rgat":
        return layer(graph, x, etype, True).flatten(1)
    if model == "rgcn":
        return layer(graph, x, etype, presorted=True)
    return layer(graph, x, graph.ndata[NTYPE], etype, presorted=True)


def measure(
    model: str, graph: Any, x: torch.Tensor, labels: torch.Tensor, relations: Any, repeat: int
) -> dict[str, Any]:
    variants = layers(model, relations)

    def step(layer: torch.nn.Module) -> Any:
        def run() -> None:
            layer.zero_grad(set_to_none=True)
            out = forward(model, layer, graph, x)
            F.nll_loss(F.log_softmax(out, 1), labels).backward()

        return run

    def infer(layer: torch.nn.Module) -> Any:
        def run() -> None:
            with torch.no_grad():
                forward(model, layer, graph, x)

        return run

    train: dict[str, Timing] = interleaved(
        {k: step(v) for k, v in variants.items()}, repeat, warmup=1
    )
    inference: dict[str, Timing] = interleaved(
        {k: infer(v) for k, v in variants.items()}, repeat, warmup=1
    )
    rows: dict[str, Any] = {}
    for name, layer in variants.items():
        meter = ActivationMeter(layer.parameters(), x.device)
        with meter.step([x, labels]):
            step(layer)()
        rows[name] = {
            "train_ms": train[name].median_ms,
            "train_iqr_ms": train[name].iqr_ms,
            "inference_ms": inference[name].median_ms,
            "inference_iqr_ms": inference[name].iqr_ms,
            "saved_mib": meter.activation_bytes / 2**20,
        }
    base = rows.get("plain")
    if base is not None:
        for row in rows.values():
            row["train_speedup"] = base["train_ms"] / row["train_ms"]
            row["inference_speedup"] = base["inference_ms"] / row["inference_ms"]
            row["saved_ratio"] = base["saved_mib"] / row["saved_mib"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets", nargs="+", default=list(HECTOR_SHAPES), choices=list(HECTOR_SHAPES)
    )
    parser.add_argument(
        "--models", nargs="+", default=["rgcn", "rgat", "hgt"], choices=["rgcn", "rgat", "hgt"]
    )
    parser.add_argument("--max-edges", type=int, default=200_000, help="scale presets down to this")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    results: dict[str, Any] = {}
    for preset in args.presets:
        edges = HECTOR_SHAPES[preset][2]
        scale = min(1.0, args.max_edges / edges)
        data = load_dataset(
            f"synthetic-{preset}", {"scale": scale, "cache": False, "features": WIDTH}
        )
        graph, rel = data.graph, data.relations
        x = graph.ndata[FEAT]
        labels = torch.randint(
            0, WIDTH, (graph.num_nodes(),), generator=torch.Generator().manual_seed(0)
        )
        entry = {
            "scale": scale,
            "nodes": graph.num_nodes(),
            "edges": graph.num_edges(),
            "node_types": rel.num_ntypes,
            "relations": rel.num_etypes,
            "models": {},
        }
        print(
            f"{preset}: {graph.num_nodes():,} nodes ({rel.num_ntypes} types), "
            f"{graph.num_edges():,} edges ({rel.num_etypes} relations), scale {scale:.4g}",
            flush=True,
        )
        for model in args.models:
            rows = measure(model, graph, x, labels, rel, args.repeat)
            entry["models"][model] = rows
            for name, row in rows.items():
                ratio = (
                    f"  vs plain: train {row['train_speedup']:.2f}x, inference "
                    f"{row['inference_speedup']:.2f}x, saved {row['saved_ratio']:.2f}x"
                    if "train_speedup" in row
                    else ""
                )
                print(
                    f"  {model:4} {name:16} train {row['train_ms']:8.1f} ± {row['train_iqr_ms']:.1f} ms"
                    f"  inference {row['inference_ms']:8.1f} ± {row['inference_iqr_ms']:.1f} ms"
                    f"  saved {row['saved_mib']:7.1f} MiB{ratio}",
                    flush=True,
                )
        results[preset] = entry
    write_json(
        args.json,
        {
            "command": " ".join(["python", *sys.argv]),
            "git_commit": git_commit(),
            "cpu": platform.machine(),
            "threads": args.threads,
            "width": WIDTH,
            "heads": 1,
            "max_edges": args.max_edges,
            "repeat": args.repeat,
            "presets": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
