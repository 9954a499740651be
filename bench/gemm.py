"""Benchmark qtrain's quantized linear-layer products against float32 and bf16 matmul.

For each hidden size h, with X float32 [rows, h] ~ randn and W [h, h]:

* forward: ``X @ W`` in float32, under bf16 autocast, and qtrain's quantized
  forward = quantize(X) + quantize(W) + int8_gemm "nn" (float32 in and out),
  with nearest and with stochastic rounding;
* backward, given the quantized dY (and the X, W quantized in the forward):
  dX = dY @ W^T (int8_gemm "nt") and dW = X^T @ dY (int8_gemm "tn"), against the
  same products in float32 and bf16.

Every candidate of a row runs once per repetition, round robin (the order rotated
each round), so all of them see the same machine load; each call is timed by
``torch.utils.benchmark.Timer`` (``bench/_timing.py``). The table shows medians after
warm-up, with their interquartile range (IQR), and the ratios of the medians
fp32_time / qtrain_time and bf16_time / qtrain_time, measured in this process.
Run with ``--threads 2`` to compare with the README's figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from _timing import interleaved

from qtrain._malloc import set_up_allocator
from qtrain.ops import backends, quantize
from qtrain.ops.gemm import int8_gemm

Fn = Callable[[], object]


def _bf16(fn: Callable[[], torch.Tensor]) -> Fn:
    """fn under CPU bf16 autocast, as a mixed-precision baseline would run it."""

    def run() -> torch.Tensor:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            return fn()

    return run


def bench_hidden(rows: int, h: int, bits: int, repeat: int, warmup: int) -> list[dict[str, object]]:
    """Rows of the result table for one hidden size."""
    g = torch.Generator().manual_seed(h)
    x = torch.randn(rows, h, generator=g)
    w = torch.randn(h, h, generator=g) / h**0.5
    dy = torch.randn(rows, h, generator=g)

    def fwd(rounding: str) -> Fn:
        def run() -> torch.Tensor:
            qx, sx = quantize(x, bits, rounding, seed=1, backend="ext-cpu")
            qw, sw = quantize(w, bits, rounding, seed=2, backend="ext-cpu")
            return int8_gemm(qx, qw, sx, sw, "nn", backend="ext-cpu")

        return run

    qx, sx = quantize(x, bits, backend="ext-cpu")
    qw, sw = quantize(w, bits, backend="ext-cpu")
    qdy, sdy = quantize(dy, bits, "stochastic", seed=3, backend="ext-cpu")
    cases: list[tuple[str, Fn, Fn, Fn]] = [
        ("fwd X@W nearest", lambda: x @ w, _bf16(lambda: x @ w), fwd("nearest")),
        ("fwd X@W stochastic", lambda: x @ w, _bf16(lambda: x @ w), fwd("stochastic")),
        (
            "bwd dX=dY@W^T (nt)",
            lambda: dy @ w.t(),
            _bf16(lambda: dy @ w.t()),
            lambda: int8_gemm(qdy, qw, sdy, sw, "nt", backend="ext-cpu"),
        ),
        (
            "bwd dW=X^T@dY (tn)",
            lambda: x.t() @ dy,
            _bf16(lambda: x.t() @ dy),
            lambda: int8_gemm(qx, qdy, sx, sdy, "tn", backend="ext-cpu"),
        ),
    ]
    out = []
    for name, f32, bf16, qt in cases:
        t = interleaved({"fp32": f32, "bf16": bf16, "qtrain": qt}, repeat, warmup)
        out.append(
            {
                "hidden": h,
                "case": name,
                "fp32_ms": t["fp32"].median_ms,
                "fp32_iqr_ms": t["fp32"].iqr_ms,
                "bf16_ms": t["bf16"].median_ms,
                "bf16_iqr_ms": t["bf16"].iqr_ms,
                "qtrain_ms": t["qtrain"].median_ms,
                "qtrain_iqr_ms": t["qtrain"].iqr_ms,
                "speedup_vs_fp32": t["fp32"].median_ms / t["qtrain"].median_ms,
                "speedup_vs_bf16": t["bf16"].median_ms / t["qtrain"].median_ms,
            }
        )
    return out


def _print_table(results: list[dict[str, object]], title: str) -> None:
    header = ("h", "product", "fp32 ms", "bf16 ms", "qtrain ms", "fp32/qtrain", "bf16/qtrain")
    body = [
        (
            str(r["hidden"]),
            str(r["case"]),
            f"{r['fp32_ms']:.1f} ± {r['fp32_iqr_ms']:.1f}",
            f"{r['bf16_ms']:.1f} ± {r['bf16_iqr_ms']:.1f}",
            f"{r['qtrain_ms']:.1f} ± {r['qtrain_iqr_ms']:.1f}",
            f"{r['speedup_vs_fp32']:.2f}x",
            f"{r['speedup_vs_bf16']:.2f}x",
        )
        for r in results
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
        print(title)
        for row in (header, *body):
            print(
                "  ".join(
                    c.rjust(wd) if i != 1 else c.ljust(wd)
                    for i, (c, wd) in enumerate(zip(row, widths, strict=True))
                )
            )
        return
    table = Table(title=title)
    for i, col in enumerate(header):
        table.add_column(col, justify="left" if i == 1 else "right")
    for row in body:
        table.add_row(*row)
    Console(width=max(120, Console().width)).print(table)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run every hidden size, print the table and optionally write JSON."""
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch (and qtrain) threads")
    ap.add_argument("--rows", type=int, default=169343, help="rows of X (ogbn-arxiv nodes)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--bits", type=int, default=8, help="quantization bits (2..8)")
    ap.add_argument("--repeat", type=int, default=7, help="timed rounds (median and IQR reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)

    if not backends.available("ext-cpu"):
        print(f"qtrain._ext not built: {backends.error('ext-cpu')}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    info = backends.ext_cpu().info()
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)
    title = (
        f"threads={torch.get_num_threads()} rows={args.rows} bits={args.bits} "
        f"repeat={args.repeat} isa={info['isa']} torch={torch.__version__} "
        f"cpu={platform.processor() or platform.machine()}; ms: median ± IQR"
    )
    print(f"command: {command}")
    results: list[dict[str, object]] = []
    for h in args.hidden:
        results.extend(bench_hidden(args.rows, h, args.bits, args.repeat, args.warmup))
    _print_table(results, title)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "threads": torch.get_num_threads(),
                    "rows": args.rows,
                    "bits": args.bits,
                    "repeat": args.repeat,
                    "warmup": args.warmup,
                    "isa": info["isa"],
                    "torch": torch.__version__,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
