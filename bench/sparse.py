"""Quantized SpMM / SDDMM (qtrain ext-cpu) against DGL's fp32 and bf16 message passing.

Why: quantized aggregation only pays off if gathering int8 rows beats DGL's
float kernels on the same graph. Every qtrain time *includes* quantizing the
fp32 inputs (``qtrain.ops.quantize``, ext-cpu), as training would; the graph's
CSR / edge lists are structure, built once outside the timing like DGL's own
cached formats. bf16 rows run DGL on inputs already in bf16 inside
``torch.autocast(device_type="cpu", dtype=torch.bfloat16)`` (the cast is not
timed, which favours the baseline). ``--scales row`` quantizes with one scale per row
(per node and head for the multi-head rows: tango's default), which the kernels read
as they gather (``row_scale``); ``tensor`` (the default) one scale per tensor. The candidates of a row (DGL fp32, DGL bf16,
qtrain nearest / stochastic) run round robin after one warm-up call each, one call
of each per round with the order rotated, every call timed by
``torch.utils.benchmark.Timer`` (``bench/_timing.py``); each gets the median of
``--repeat`` rounds and its interquartile range (IQR, the ``*_iqr_ms`` keys); ratios
are of the medians, baseline / qtrain, measured in the same process.

    python bench/sparse.py [--threads 2] [--dataset synthetic-arxiv] [--widths 128 256]
                           [--scales tensor|row] [--repeat N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

import torch
from _timing import Timing, interleaved

from qtrain._compat import import_dgl
from qtrain._malloc import set_up_allocator
from qtrain.data import load_dataset
from qtrain.ops import backends
from qtrain.ops.quantize import quantize, quantize_per_row
from qtrain.ops.sparse import qsddmm, qspmm

HEADS = 4  # GAT's head count for the multi-head and u_add_v shapes


def time_row(
    cands: dict[str, Callable[[], Any]], bf16: Callable[[], Any], repeat: int
) -> tuple[dict[str, Timing], str | None]:
    """The row's candidates (and DGL under bf16 autocast as "bf16") round robin, after one
    untimed warm-up call each; the second item is why bf16 could not run, or None."""

    def run_bf16() -> Any:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            return bf16()

    for fn in cands.values():
        fn()  # warm-up
    refused = None
    try:
        run_bf16()  # warm-up, and whether DGL takes bf16 here
    except Exception as exc:  # DGL raises its own error types for unsupported dtypes
        refused = f"unsupported ({type(exc).__name__})"
    else:
        cands = {**cands, "bf16": run_bf16}
    return interleaved(cands, repeat), refused


def _cell(ms: float | str | None, iqr: float | None, width: int = 14) -> str:
    if ms is None:
        return f"{'-':>{width}}"
    if isinstance(ms, str):
        return f"{ms:>{width}}"
    return f"{f'{ms:.1f} ± {iqr:.1f}':>{width}}"


def quantize_8(
    x: torch.Tensor, scales: str, rounding: str = "nearest"
) -> tuple[torch.Tensor, torch.Tensor]:
    """x at 8 bits with one scale per tensor or per row (of the last dimension: per node
    and head for [N, H, D])."""
    if scales == "row":
        return quantize_per_row(x, 8, rounding, seed=1, backend="ext-cpu")
    return quantize(x, 8, rounding, seed=1, backend="ext-cpu")


def spmm_q(
    x: torch.Tensor,
    csr: tuple[torch.Tensor, ...],
    rounding: str,
    scales: str,
    w: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantize x once (8 bits) and aggregate over the in-CSR."""
    indptr, indices, eids = csr
    q, scale = quantize_8(x, scales, rounding)
    return qspmm(indptr, indices, q, scale, w, eids if w is not None else None, backend="ext-cpu")


def sddmm_q(
    op: str, a: torch.Tensor, b: torch.Tensor, edges: tuple[torch.Tensor, ...], scales: str
) -> torch.Tensor:
    """Quantize both operands (8 bits, nearest) and run the per-edge op."""
    qa, sa = quantize_8(a, scales)
    qb, sb = quantize_8(b, scales)
    return qsddmm(op, qa, sa, edges[0], qb, sb, edges[1], backend="ext-cpu")


def main(argv: list[str] | None = None) -> int:
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dataset", default="synthetic-arxiv")
    p.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    p.add_argument("--scales", choices=["tensor", "row"], default="tensor")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if any(w % HEADS for w in args.widths):
        p.error(f"widths must be multiples of {HEADS} (the multi-head rows split them)")
    if not backends.available("ext-cpu"):
        print(f"qtrain._ext is not available: {backends.error('ext-cpu')}", file=sys.stderr)
        return 1

    torch.set_num_threads(args.threads)
    dgl = import_dgl()
    g = load_dataset(args.dataset).graph
    n, e = g.num_nodes(), g.num_edges()
    csr = g.adj_tensors("csc")  # (indptr over destinations, source ids, edge ids)
    edges = g.edges()  # (src, dst) in edge-id order, DGL's SDDMM output order
    gen = torch.Generator().manual_seed(0)
    command = "python " + " ".join(shlex.quote(a) for a in ["bench/sparse.py", *sys.argv[1:]])
    info = backends.ext_cpu().info()
    print(command)
    print(
        f"dataset {args.dataset}: {n} nodes, {e} edges; threads {torch.get_num_threads()}; "
        f"ext isa {info['isa']}; torch {torch.__version__}, dgl {dgl.__version__}; "
        f"one scale per {args.scales}; median ± IQR of {args.repeat} rounds"
    )

    rows: list[dict[str, Any]] = []

    def bench(
        op: str,
        shape: str,
        dgl_fn: Callable[[], Any],
        dgl_bf16_fn: Callable[[], Any],
        q_fns: dict[str, Callable[[], Any]],
    ) -> None:
        r: dict[str, Any] = {"op": op, "shape": shape}
        cands = {"fp32": dgl_fn, **{f"qtrain_{name}": fn for name, fn in q_fns.items()}}
        t, refused = time_row(cands, dgl_bf16_fn, args.repeat)
        r["dgl_fp32_ms"] = t["fp32"].median_ms
        r["dgl_fp32_iqr_ms"] = t["fp32"].iqr_ms
        r["dgl_bf16_ms"] = t["bf16"].median_ms if refused is None else refused
        r["dgl_bf16_iqr_ms"] = t["bf16"].iqr_ms if refused is None else None
        for name in q_fns:
            r[f"qtrain_{name}_ms"] = t[f"qtrain_{name}"].median_ms
            r[f"qtrain_{name}_iqr_ms"] = t[f"qtrain_{name}"].iqr_ms
        q = r["qtrain_nearest_ms"]
        r["fp32_over_qtrain"] = r["dgl_fp32_ms"] / q
        bf = r["dgl_bf16_ms"]
        r["bf16_over_qtrain"] = bf / q if isinstance(bf, float) else None
        rows.append(r)
        ratio_bf = f"{r['bf16_over_qtrain']:6.2f}x" if r["bf16_over_qtrain"] else f"{'-':>7}"
        print(
            f"{op:<18}{shape:<22}{_cell(r['dgl_fp32_ms'], r['dgl_fp32_iqr_ms'])}"
            f"{_cell(bf, r['dgl_bf16_iqr_ms'])}{_cell(q, r['qtrain_nearest_iqr_ms'])}"
            f"{_cell(r.get('qtrain_stochastic_ms'), r.get('qtrain_stochastic_iqr_ms'))}"
            f"{r['fp32_over_qtrain']:7.2f}x{ratio_bf}"
        )

    print(
        f"{'op':<18}{'shape':<22}{'dgl fp32':>14}{'dgl bf16':>14}{'qtrain':>14}{'q stoch':>14}"
        f"{'fp32/q':>8}{'bf16/q':>7}   (ms, median ± IQR; qtrain includes quantization)"
    )

    def widths_rows(w: int) -> None:
        """The SpMM and u_dot_v rows at feature width w."""
        x = torch.randn(n, w, generator=gen)
        xb = x.to(torch.bfloat16)
        we = torch.rand(e, 1, generator=gen)
        web = we.to(torch.bfloat16)
        bench(
            "copy_u_sum",
            f"x[N,{w}]",
            lambda: dgl.ops.copy_u_sum(g, x),
            lambda: dgl.ops.copy_u_sum(g, xb),
            {
                "nearest": lambda: spmm_q(x, csr, "nearest", args.scales),
                "stochastic": lambda: spmm_q(x, csr, "stochastic", args.scales),
            },
        )
        bench(
            "u_mul_e_sum",
            f"x[N,{w}] w[E,1]",
            lambda: dgl.ops.u_mul_e_sum(g, x, we),
            lambda: dgl.ops.u_mul_e_sum(g, xb, web),
            {
                "nearest": lambda: spmm_q(x, csr, "nearest", args.scales, we),
                "stochastic": lambda: spmm_q(x, csr, "stochastic", args.scales, we),
            },
        )
        xh = x.reshape(n, HEADS, w // HEADS)
        xhb = xh.to(torch.bfloat16)
        wh = torch.rand(e, HEADS, 1, generator=gen)
        whb = wh.to(torch.bfloat16)
        bench(
            "u_mul_e_sum (MH)",
            f"x[N,{HEADS},{w // HEADS}] w[E,{HEADS},1]",
            lambda: dgl.ops.u_mul_e_sum(g, xh, wh),
            lambda: dgl.ops.u_mul_e_sum(g, xhb, whb),
            {
                "nearest": lambda: spmm_q(xh, csr, "nearest", args.scales, wh),
                "stochastic": lambda: spmm_q(xh, csr, "stochastic", args.scales, wh),
            },
        )
        y = torch.randn(n, w, generator=gen)
        yb = y.to(torch.bfloat16)
        bench(
            "u_dot_v",
            f"[N,{w}] . [N,{w}]",
            lambda: dgl.ops.u_dot_v(g, x, y),
            lambda: dgl.ops.u_dot_v(g, xb, yb),
            {"nearest": lambda: sddmm_q("dot", x, y, edges, args.scales)},
        )
        yh = y.reshape(n, HEADS, w // HEADS)
        yhb = yh.to(torch.bfloat16)
        bench(
            "u_dot_v (MH)",
            f"[N,{HEADS},{w // HEADS}] . same",
            lambda: dgl.ops.u_dot_v(g, xh, yh),
            lambda: dgl.ops.u_dot_v(g, xhb, yhb),
            {"nearest": lambda: sddmm_q("dot", xh, yh, edges, args.scales)},
        )

    for w in args.widths:
        widths_rows(w)
    el = torch.randn(n, HEADS, 1, generator=gen)
    er = torch.randn(n, HEADS, 1, generator=gen)
    elb, erb = el.to(torch.bfloat16), er.to(torch.bfloat16)
    bench(
        "u_add_v (GAT)",
        f"[N,{HEADS},1] + [N,{HEADS},1]",
        lambda: dgl.ops.u_add_v(g, el, er),
        lambda: dgl.ops.u_add_v(g, elb, erb),
        {"nearest": lambda: sddmm_q("add", el, er, edges, args.scales)},
    )

    if args.json:
        meta = {
            "command": command,
            "dataset": args.dataset,
            "nodes": n,
            "edges": e,
            "threads": torch.get_num_threads(),
            "repeat": args.repeat,
            "scales": args.scales,
            "isa": info["isa"],
            "torch": torch.__version__,
            "dgl": dgl.__version__,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
