"""GPU timings of the exact / adaqp compression ops' CUDA kernels (torch.ops.qtrain.*).

``run(quick)`` times, on activation-sized float32 inputs (2.4M x 128 and
169,343 x 256; quick: 200,000 x 128 and 169,343 x 256), per-row quantize and
dequantize at 1, 2, 4 and 8 bits, the fused projection kernels at D/R = 8
(project + quantize, dequantize + project back), and 1-bit mask packing,
unpacking and masked_scale. Each kernel is checked against the reference on a
small input first (RuntimeError on a mismatch), then timed by torch's benchmark
Timer (a device sync around each call): warm-up calls, then the median and IQR of
repeats. Its baseline is the plain PyTorch
way to get the same result on the GPU (the reference functions on CUDA tensors,
or cuBLAS ``x @ R`` plus the quantize kernel for the projection), ``ratio`` is
baseline_ms / ms, and ``gbps`` counts the bytes the kernel must move (inputs
read once, outputs written once) against the device's measured copy bandwidth
(read + write bytes of a large ``copy_``) in ``bw_fraction``.

Importing this module has no side effects; ``python bench/gpu_compress.py
[--quick]`` prints the rows as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from _gpu import copy_bandwidth_gbps, median_ms, row

from qtrain._malloc import set_up_allocator
from qtrain.ops import backends
from qtrain.quant import projection
from qtrain.quant import rowwise as ref

BASELINE_REPEATS = 3


def _equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16}.get(a.dtype)
    return torch.equal(a.view(view), b.view(view)) if view is not None else torch.equal(a, b)


def verify(ops: Any) -> None:
    """Each timed kernel on a small input == the reference (RuntimeError otherwise)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(301, 37, generator=g) * 3 + 1
    xg = x.cuda()
    bad = []
    for bits in (1, 2, 4, 8):
        want = ref.quantize_rows(x, bits, "stochastic", 5, 2**32 - 100)
        got = ops.quantize_rows(xg, bits, True, 5, 2**32 - 100)
        if not all(_equal_bits(s, t) for s, t in zip(got, want, strict=True)):
            bad.append(f"quantize_rows bits={bits}")
        back = ops.dequantize_rows(*got, bits, 37)
        if not _equal_bits(back, ref.dequantize_rows(*want, bits, 37)):
            bad.append(f"dequantize_rows bits={bits}")
    xp = torch.randn(77, 64, generator=g)
    y = projection.project_rows(xp, 8, 3, 11)
    want = ref.quantize_rows(y, 2, "stochastic", 3, 0)
    got = ops.project_quantize_rows(xp.cuda(), 8, 2, True, 3, 0, 11)
    if not all(_equal_bits(s, t) for s, t in zip(got, want, strict=True)):
        bad.append("project_quantize_rows")
    back = projection.unproject_rows(ref.dequantize_rows(*want, 2, 8), 64, 3, 11)
    if not _equal_bits(ops.dequantize_unproject_rows(*got, 2, 8, 64, 3, 11), back):
        bad.append("dequantize_unproject_rows")
    mask = torch.rand(1001, generator=g) > 0.5
    packed = ref.pack_bits(mask, 1)
    if not _equal_bits(ops.pack_bits(mask.cuda(), 1), packed):
        bad.append("pack_bits")
    if not _equal_bits(ops.unpack_bits(packed.cuda(), 1, 1001), ref.unpack_bits(packed, 1, 1001)):
        bad.append("unpack_bits")
    grad = torch.randn(1001, generator=g)
    if not _equal_bits(
        ops.masked_scale(grad.cuda(), packed.cuda(), 2.0), ref.masked_scale(grad, packed, 2.0)
    ):
        bad.append("masked_scale")
    if bad:
        raise RuntimeError(f"CUDA kernels differ from the reference: {', '.join(bad)}")


def _shape_rows(ops: Any, n_rows: int, width: int, bw: float, seed: int) -> list[dict[str, Any]]:
    """The rows of one activation shape (its tensors are freed on return)."""
    out: list[dict[str, Any]] = []
    x = torch.randn(n_rows, width, device="cuda")
    shape = tuple(x.shape)
    n = x.numel()
    for bits in (1, 2, 4, 8):
        ms = median_ms(lambda b=bits: ops.quantize_rows(x, b, True, seed, 0))
        base = median_ms(
            lambda b=bits: ref.quantize_rows(x, b, "stochastic", seed, 0), BASELINE_REPEATS, 1
        )
        moved = 4 * n + (n * bits + 7) // 8 + 4 * n_rows
        out.append(row(f"quantize_rows int{bits}", shape, ms, "reference on CUDA", base, moved, bw))
        q = ops.quantize_rows(x, bits, True, seed, 0)
        ms = median_ms(lambda b=bits, q=q: ops.dequantize_rows(*q, b, width))
        base = median_ms(lambda b=bits, q=q: ref.dequantize_rows(*q, b, width), BASELINE_REPEATS, 1)
        out.append(
            row(f"dequantize_rows int{bits}", shape, ms, "reference on CUDA", base, moved, bw)
        )
    # the fused projection at D/R = 8, INT2 (the exact plugin's RP + INT2)
    k = projection.projected_width(width, 8)
    r_mat = projection.rademacher(width, k, seed, 0).cuda()
    ms = median_ms(lambda: ops.project_quantize_rows(x, k, 2, True, seed, 0, 0))
    base = median_ms(lambda: ops.quantize_rows(x @ r_mat, 2, True, seed, 0), BASELINE_REPEATS, 1)
    moved = 4 * n + (n_rows * k * 2 + 7) // 8 + 4 * n_rows
    out.append(
        row(
            f"project_quantize_rows int2 k={k}",
            shape,
            ms,
            "cuBLAS x @ R + quantize_rows kernel",
            base,
            moved,
            bw,
        )
    )
    got = ops.project_quantize_rows(x, k, 2, True, seed, 0, 0)
    ms = median_ms(lambda: ops.dequantize_unproject_rows(*got, 2, k, width, seed, 0))
    base = median_ms(lambda: ops.dequantize_rows(*got, 2, k) @ r_mat.t(), BASELINE_REPEATS, 1)
    out.append(
        row(
            f"dequantize_unproject_rows int2 k={k}",
            shape,
            ms,
            "dequantize_rows kernel + cuBLAS y @ R^T",
            base,
            moved,
            bw,
        )
    )
    # 1-bit masks: ReLU / dropout forward (pack), backward (unpack or masked_scale)
    mask = x > 0
    ms = median_ms(lambda: ops.pack_bits(mask, 1))
    base = median_ms(lambda: ref.pack_bits(mask, 1), BASELINE_REPEATS, 1)
    moved = n + (n + 7) // 8
    out.append(row("pack_bits 1-bit mask", shape, ms, "reference on CUDA", base, moved, bw))
    packed = ops.pack_bits(mask, 1)
    ms = median_ms(lambda: ops.unpack_bits(packed, 1, n))
    base = median_ms(lambda: ref.unpack_bits(packed, 1, n), BASELINE_REPEATS, 1)
    out.append(row("unpack_bits 1-bit mask", shape, ms, "reference on CUDA", base, moved, bw))
    ms = median_ms(lambda: ops.masked_scale(x, packed, 2.0))
    base = median_ms(lambda: torch.where(mask, x * 2.0, 0.0), BASELINE_REPEATS, 1)
    moved = 8 * n + (n + 7) // 8
    out.append(row("masked_scale", shape, ms, "torch.where on a bool mask", base, moved, bw))
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Timing rows (see the module docstring); needs a GPU and the op library's CUDA kernels."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench/gpu_compress.py needs a CUDA device")
    backends.ext_cuda()  # the library with its CUDA kernels, or QtrainError saying why not
    ops = torch.ops.qtrain
    verify(ops)
    torch.backends.cuda.matmul.allow_tf32 = False  # the baselines compute float32 products
    copy_bytes = 1 << 30
    bw = copy_bandwidth_gbps(copy_bytes)
    ms = 2 * copy_bytes / bw / 1e6
    rows = [row("device copy", (copy_bytes // 4,), ms, None, None, 2 * copy_bytes, bw)]
    shapes = ((200_000, 128), (169_343, 256)) if quick else ((2_400_000, 128), (169_343, 256))
    for n_rows, width in shapes:
        rows += _shape_rows(ops, n_rows, width, bw, seed=7)
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    for row in run(quick="--quick" in sys.argv[1:]):
        print(json.dumps(row))
