"""4-bit packed kernels against their int8 forms, in one run (issue 32, packed storage).

Why: at 4 bits tango stores two values a byte, which pays only if what reads and writes
them is no slower than the int8 path it replaces. On synthetic-arxiv GAT's shapes (rows
``[N, 4, 64]``, one scale per node and head, the graph's edges) each row times the int8
op against the packed one on the same values:

- quantize rows: ``quantize_per_row`` (int8) / int8 then ``pack_int4`` (what tango did) /
  ``quantize_per_row_packed`` (one pass, what it does);
- SpMM: ``qspmm`` over int8 rows / ``qspmm_packed`` (``qspmm4``) over packed ones, with
  the row scales, unweighted (GCN-like) and per-edge-and-head weighted (GAT);
- SDDMM dot (GAT's attention gradient): ``qsddmm`` over int8 rows / ``qsddmm_packed``
  (``qsddmm4``) over packed ones, with row scales on both sides;
- quantize columns by blocks of 64 nodes (GCN's X ``[N, 256]``, kept for the weight
  gradient): ``quantize_per_column`` (int8) / int8 then ``pack_int4`` (what tango did) /
  ``quantize_per_column_packed`` (one pass, what it does);
- block GEMM (GCN's weight gradient X^T dY over X ``[N, 256]`` and dY ``[N, 256]``, one
  scale per block of 64 nodes of each column): ``int8_block_gemm`` over int8 X / over X
  unpacked from its packed form first (what tango did) / over packed X as stored.

The candidates of a row run round robin (``bench/_timing.py``: one call of each per
round, the order rotated, every call timed by ``torch.utils.benchmark.Timer``) after one
warm-up round; each gets the median of ``--repeat`` rounds and its interquartile range;
ratios are of the medians, int8 / packed (above 1: packed is faster).

    python bench/packed.py [--device cpu|cuda] [--threads 2] [--dataset synthetic-arxiv]
                           [--repeat N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

import torch
from _timing import interleaved

from qtrain._malloc import set_up_allocator
from qtrain.data import load_dataset
from qtrain.ops import backends
from qtrain.ops.gemm import int8_block_gemm
from qtrain.ops.packed import pack_int4, unpack_int4
from qtrain.ops.quantize import (
    quantize_per_column,
    quantize_per_column_packed,
    quantize_per_row,
    quantize_per_row_packed,
)
from qtrain.ops.sparse import qsddmm, qsddmm_packed, qspmm, qspmm_packed

HEADS, WIDTH = 4, 64  # GAT's hidden layers: 4 heads of 64 values
HIDDEN, NODE_BLOCK = 256, 64  # GCN's hidden layers; tango's scale_block
BITS = 4


def measure(device: str, dataset: str, repeat: int) -> list[dict[str, Any]]:
    """Every row on ``device``: each candidate's median and IQR (ms) and the baseline's
    ratio to the others; printed as measured."""
    backend = "ext-cuda" if device == "cuda" else "ext-cpu"
    dev = torch.device(device)
    g = load_dataset(dataset).graph
    n, e = g.num_nodes(), g.num_edges()
    indptr, indices, eids = (t.to(dev) for t in g.adj_tensors("csc"))
    src, dst = (t.to(dev) for t in g.edges())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, HEADS, WIDTH, generator=gen) * torch.rand(n, HEADS, 1, generator=gen)
    x = x.to(dev)
    grad = torch.randn(n, HEADS, WIDTH, generator=gen).to(dev)
    weight = torch.rand(e, HEADS, 1, generator=gen).to(dev)
    q8, s = quantize_per_row(x, BITS, backend=backend)
    g8, gs = quantize_per_row(grad, BITS, backend=backend)
    q4, g4 = pack_int4(q8, backend=backend), pack_int4(g8, backend=backend)
    cols = (torch.randn(n, HIDDEN, generator=gen) * torch.rand(n, 1, generator=gen)).to(dev)
    xc8, xcs = quantize_per_column(cols, BITS, block=NODE_BLOCK, backend=backend)
    xc4 = pack_int4(xc8, backend=backend)
    gc8, gcs = quantize_per_column(
        torch.randn(n, HIDDEN, generator=gen).to(dev), BITS, block=NODE_BLOCK, backend=backend
    )
    print(
        f"dataset {dataset}: {n} nodes, {e} edges; rows [N, {HEADS}, {WIDTH}] at {BITS} bits, "
        f"a scale per node and head; device {device}, threads {torch.get_num_threads()}, "
        f"torch {torch.__version__}; median ± IQR of {repeat} rounds (ms)"
    )
    rows: list[dict[str, Any]] = []

    def row(op: str, cands: dict[str, Callable[[], Any]], base: str) -> None:
        t = interleaved(cands, repeat, warmup=1)
        r: dict[str, Any] = {"op": op, "baseline": base}
        for name, timing in t.items():
            r[f"{name}_ms"], r[f"{name}_iqr_ms"] = timing.median_ms, timing.iqr_ms
        for name in cands:
            if name != base:
                r[f"{base}_over_{name}"] = t[base].median_ms / t[name].median_ms
        rows.append(r)
        cells = "  ".join(f"{name} {t[name].ms()}" for name in cands)
        ratios = "  ".join(
            f"{base}/{name} {r[f'{base}_over_{name}']:.2f}x" for name in cands if name != base
        )
        print(f"{op:<24}{cells}   {ratios}", flush=True)

    row(
        "quantize rows",
        {
            "int8": lambda: quantize_per_row(x, BITS, backend=backend),
            "int8+pack": lambda: pack_int4(quantize_per_row(x, BITS, backend=backend)[0]),
            "packed": lambda: quantize_per_row_packed(x, BITS, backend=backend),
        },
        "int8+pack",
    )
    row(
        "SpMM copy_u",
        {
            "int8": lambda: qspmm(indptr, indices, q8, s, backend=backend),
            "packed": lambda: qspmm_packed(indptr, indices, q4, WIDTH, s, backend=backend),
        },
        "int8",
    )
    row(
        "SpMM u_mul_e (GAT)",
        {
            "int8": lambda: qspmm(indptr, indices, q8, s, weight, eids, backend=backend),
            "packed": lambda: qspmm_packed(
                indptr, indices, q4, WIDTH, s, weight, eids, backend=backend
            ),
        },
        "int8",
    )
    row(
        "SDDMM dot (GAT dW)",
        {
            "int8": lambda: qsddmm("dot", q8, s, src, g8, gs, dst, backend=backend),
            "packed": lambda: qsddmm_packed("dot", q4, s, src, g4, gs, dst, WIDTH, backend),
        },
        "int8",
    )
    row(
        "quantize cols (blocks)",
        {
            "int8": lambda: quantize_per_column(cols, BITS, block=NODE_BLOCK, backend=backend),
            "int8+pack": lambda: pack_int4(
                quantize_per_column(cols, BITS, block=NODE_BLOCK, backend=backend)[0]
            ),
            "packed": lambda: quantize_per_column_packed(
                cols, BITS, block=NODE_BLOCK, backend=backend
            ),
        },
        "int8+pack",
    )
    row(
        "block GEMM dW (GCN)",
        {
            "int8": lambda: int8_block_gemm(xc8, gc8, xcs, gcs, NODE_BLOCK, backend),
            "unpack+int8": lambda: int8_block_gemm(
                unpack_int4(xc4, HIDDEN, backend), gc8, xcs, gcs, NODE_BLOCK, backend
            ),
            "packed": lambda: int8_block_gemm(xc4, gc8, xcs, gcs, NODE_BLOCK, backend),
        },
        "unpack+int8",
    )
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    """A stage of ``bench/gpu.py``: the rows on the GPU (synthetic-arxiv), one record each,
    the packed op's time against its baseline's."""
    rows = measure("cuda", "synthetic-arxiv", 5 if quick else 11)
    return [
        {
            "case": f"packed 4-bit: {r['op']}",
            "ms": r["packed_ms"],
            "baseline": r["baseline"],
            "ratio": r[f"{r['baseline']}_over_packed"],
        }
        for r in rows
    ]


def main(argv: list[str] | None = None) -> int:
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dataset", default="synthetic-arxiv")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    backend = "ext-cuda" if args.device == "cuda" else "ext-cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/packed.py: --device cuda needs a GPU; none is visible", file=sys.stderr)
        return 1
    if not backends.available(backend):
        print(f"qtrain {backend} is not available: {backends.error(backend)}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    command = "python " + " ".join(shlex.quote(a) for a in ["bench/packed.py", *sys.argv[1:]])
    print(command)
    rows = measure(args.device, args.dataset, args.repeat)
    if args.json:
        meta = {"command": command, "device": args.device, "threads": torch.get_num_threads()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
