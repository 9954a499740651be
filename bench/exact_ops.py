"""The primitives behind the exact plugin's epoch time, one [rows, width] activation each.

Times, on one synthetic-arxiv-sized activation (169,343 x 256 float32 by
default), what ``exact`` adds to a step and what it replaces: per-row INT2
quantize and dequantize (compiled kernels), the fused kernels RP + INT2 runs
(project + quantize, dequantize + project back: one pass each), the same
projection as separate dense products (forward ``x @ R``, backward
``y @ R^T``, and in bf16 with the conversion) for comparison, and ReLU /
dropout backward from a packed 1-bit mask
(``masked_scale``) against torch's ``threshold_backward`` and ``torch.where``
on a bool mask, and exact's two 1-bit codecs (the side means,
``quantize_rows_means``, against stochastic rounding, ``quantize_rows`` at 1 bit). The cases run round robin, one call of each per round with the
order rotated, every call timed by ``torch.utils.benchmark.Timer``
(``bench/_timing.py``): medians of ``--repeat`` rounds after four warm-up rounds
(``median_ms``), with their interquartile range (``iqr_ms``); every call allocates its
output, as a training step does. The first calls that allocate a new large output
fault in (and, with transparent huge pages on madvise, compact) fresh memory and run
up to 20x slower, which a training loop pays once: the warm-up rounds leave them out.

    python bench/exact_ops.py --threads 2 --json bench/results/exact_ops.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _record import provenance, write_json
from _timing import interleaved

from qtrain._malloc import set_up_allocator
from qtrain.ops import compress
from qtrain.quant.projection import projected_width

WARMUP = 4  # rounds


def main() -> int:
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=169_343)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--bits", type=int, default=2, choices=(1, 2, 4, 8))
    parser.add_argument("--rp-ratio", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.width, generator=g)
    grad = torch.randn(args.rows, args.width, generator=g)
    k = projected_width(args.width, args.rp_ratio)
    r = compress.rademacher(args.width, k, seed=0)
    y = x @ r
    packed, zero, rng = compress.quantize_rows(x, args.bits)
    fused = compress.project_quantize_rows(x, k, args.bits)
    mask = x > 0
    mask_bits = compress.pack_mask(mask)
    xb, rb = x.bfloat16(), r.bfloat16()

    cases: dict[str, Callable[[], Any]] = {
        f"quantize rows INT{args.bits} [{args.rows}, {args.width}]": lambda: compress.quantize_rows(
            x, args.bits
        ),
        f"dequantize rows INT{args.bits} [{args.rows}, {args.width}]": lambda: (
            compress.dequantize_rows(packed, zero, rng, args.bits, args.width)
        ),
        f"fused project + quantize INT{args.bits} [{args.width} -> {k}]": lambda: (
            compress.project_quantize_rows(x, k, args.bits)
        ),
        f"fused dequantize + project back INT{args.bits} [{k} -> {args.width}]": lambda: (
            compress.dequantize_unproject_rows(*fused, args.bits, k, args.width)
        ),
        f"unfused: quantize rows INT{args.bits} [{args.rows}, {k}] (projected)": lambda: (
            compress.quantize_rows(y, args.bits)
        ),
        f"unfused: projection x @ R [{args.width} -> {k}]": lambda: x @ r,
        f"unfused: projection y @ R^T [{k} -> {args.width}]": lambda: y @ r.t(),
        "unfused: projection x @ R, bf16 operands already converted": lambda: xb @ rb,
        "x to bf16": lambda: x.bfloat16(),
        # exact's two 1-bit codecs (rounding = "means" / "stochastic"), same input and format
        f"INT1 rows: side means [{args.rows}, {args.width}]": lambda: compress.quantize_rows_means(
            x
        ),
        f"INT1 rows: stochastic [{args.rows}, {args.width}]": lambda: compress.quantize_rows(x, 1),
        "ReLU backward: masked_scale from packed bits": lambda: compress.masked_scale(
            grad, mask_bits, 1.0
        ),
        "ReLU backward: torch threshold_backward": lambda: torch.ops.aten.threshold_backward(
            grad, x, 0.0
        ),
        "ReLU backward: torch.where on a bool mask": lambda: torch.where(mask, grad, 0.0),
    }
    timings = interleaved(cases, args.repeat, WARMUP)
    rows = {name: t.median_ms for name, t in timings.items()}
    print(f"ms, median ± IQR of {args.repeat} rounds after {WARMUP} warm-up rounds")
    for name, t in timings.items():
        print(f"{t.ms():>15} ms  {name}")
    write_json(
        args.json,
        {
            **provenance(),
            "threads": args.threads,
            "torch": torch.__version__,
            "median_ms": rows,
            "iqr_ms": {name: t.iqr_ms for name, t in timings.items()},
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
