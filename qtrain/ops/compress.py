"""Activation compression ops with backend dispatch (see ``qtrain.ops.dispatch``).

The math is defined once in :mod:`qtrain.quant.rowwise` (per-row quantization,
bit packing) and :mod:`qtrain.quant.projection` (the Rademacher matrix); these
wrappers validate arguments once, pick a backend per call and count it under
the primitive names ``compress`` / ``decompress`` / ``pack`` / ``unpack`` /
``rademacher``, and the fused ``project+compress`` / ``decompress+unproject``
(one pass over the activation instead of a GEMM, a quantize and their
intermediate tensor). Backends agree bit for bit.
"""

from __future__ import annotations

import torch

from qtrain import backends
from qtrain.ops import dispatch
from qtrain.quant import projection
from qtrain.quant import rowwise as ref
from qtrain.quant.rng import check_counter_range, normalize_seed

# compiled backends implementing each primitive
COMPRESS_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")


def quantize_rows(
    x: torch.Tensor,
    bits: int,
    rounding: str = "stochastic",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row ``bits``-bit quantization of float32 ``x [rows, width]``, packed.

    Returns ``(packed uint8 [ceil(rows*width*bits/8)], zero bf16 [rows], range bf16 [rows])``.
    """
    bits = ref.check_pack_bits(bits)
    ref.check_rounding(rounding)
    seed = normalize_seed(seed)
    check_counter_range(x.numel(), offset)
    chosen = dispatch.resolve("compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("compress", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().quantize_rows(
                x, bits, rounding == "stochastic", seed, int(offset)
            )
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().quantize_rows(
                x, bits, rounding == "stochastic", seed, int(offset)
            )
        else:
            out = ref.quantize_rows(x, bits, rounding, seed, offset)
    return out


def dequantize_rows(
    packed: torch.Tensor,
    zero: torch.Tensor,
    rng: torch.Tensor,
    bits: int,
    width: int,
    backend: str = "auto",
) -> torch.Tensor:
    """float32 ``[rows, width]`` back from :func:`quantize_rows`."""
    bits = ref.check_pack_bits(bits)
    chosen = dispatch.resolve("decompress", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("decompress", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().dequantize_rows(packed, zero, rng, bits, int(width))
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().dequantize_rows(packed, zero, rng, bits, int(width))
        else:
            out = ref.dequantize_rows(packed, zero, rng, bits, width)
    return out


def project_quantize_rows(
    x: torch.Tensor,
    k: int,
    bits: int,
    rounding: str = "stochastic",
    seed: int = 0,
    offset: int = 0,
    projection_offset: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` of ``project_rows(x, k)``: float32 ``x [rows, d]`` to ``k``
    columns by the Rademacher matrix at ``projection_offset``, then quantized (rounding
    draws at ``offset``)."""
    bits = ref.check_pack_bits(bits)
    ref.check_rounding(rounding)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    seed = normalize_seed(seed)
    check_counter_range(x.shape[0] * k if x.dim() == 2 else 0, offset)
    check_counter_range(x.shape[-1] * k if x.dim() == 2 else 0, projection_offset)
    chosen = dispatch.resolve("project+compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("project+compress", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().project_quantize_rows(
                x, int(k), bits, rounding == "stochastic", seed, int(offset), int(projection_offset)
            )
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().project_quantize_rows(
                x, int(k), bits, rounding == "stochastic", seed, int(offset), int(projection_offset)
            )
        else:
            y = projection.project_rows(x, k, seed, projection_offset)
            out = ref.quantize_rows(y, bits, rounding, seed, offset)
    return out


def dequantize_unproject_rows(
    packed: torch.Tensor,
    zero: torch.Tensor,
    rng: torch.Tensor,
    bits: int,
    k: int,
    d: int,
    seed: int = 0,
    projection_offset: int = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """float32 ``[rows, d]`` back from :func:`project_quantize_rows`: dequantized, then
    ``unproject_rows`` by the same matrix."""
    bits = ref.check_pack_bits(bits)
    if k < 1 or d < 0:
        raise ValueError(f"need k >= 1 and d >= 0, got k={k}, d={d}")
    seed = normalize_seed(seed)
    check_counter_range(d * k, projection_offset)
    chosen = dispatch.resolve("decompress+unproject", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("decompress+unproject", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().dequantize_unproject_rows(
                packed, zero, rng, bits, int(k), int(d), seed, int(projection_offset)
            )
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().dequantize_unproject_rows(
                packed, zero, rng, bits, int(k), int(d), seed, int(projection_offset)
            )
        else:
            y = ref.dequantize_rows(packed, zero, rng, bits, k)
            out = projection.unproject_rows(y, d, seed, projection_offset)
    return out


def pack_mask(mask: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """A bool tensor as a dense bit stream, 1 bit per element."""
    chosen = dispatch.resolve("pack", mask, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("pack", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().pack_bits(mask.reshape(-1).view(torch.uint8), 1)
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().pack_bits(mask.reshape(-1).view(torch.uint8), 1)
        else:
            out = ref.pack_bits(mask, 1)
    return out


def unpack_mask(packed: torch.Tensor, n: int, backend: str = "auto") -> torch.Tensor:
    """The first ``n`` bits of a stream from :func:`pack_mask`, as a flat bool tensor."""
    chosen = dispatch.resolve("unpack", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("unpack", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().unpack_bits(packed, 1, int(n))
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().unpack_bits(packed, 1, int(n))
        else:
            out = ref.unpack_bits(packed, 1, n)
    return out.view(torch.bool)


def masked_scale(
    grad: torch.Tensor, packed: torch.Tensor, scale: float = 1.0, backend: str = "auto"
) -> torch.Tensor:
    """``grad * scale`` where the packed 1-bit mask is set, else 0 (ReLU / dropout backward)."""
    chosen = dispatch.resolve("unpack", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("unpack", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().masked_scale(grad, packed, float(scale))
        elif chosen == "ext-cuda":
            out = backends.ext_cuda().masked_scale(grad, packed, float(scale))
        else:
            out = ref.masked_scale(grad, packed, scale)
    return out


def rademacher(
    d: int,
    k: int,
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The float32 ``[d, k]`` normalized Rademacher matrix (see :mod:`qtrain.quant.projection`),
    on ``device`` (the CPU by default)."""
    probe = torch.empty(0, device=device)
    chosen = dispatch.resolve("rademacher", probe, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("rademacher", chosen):
        if chosen == "ext-cpu":
            out = backends.ext_cpu().rademacher(int(d), int(k), normalize_seed(seed), int(offset))
        elif chosen == "ext-cuda":
            with torch.cuda.device(probe.device):  # the kernel allocates on the current device
                out = backends.ext_cuda().rademacher(
                    int(d), int(k), normalize_seed(seed), int(offset)
                )
        else:
            out = projection.rademacher(d, k, seed, offset).to(probe.device)
    return out


def quantize_rows_into(
    x: torch.Tensor,
    index: torch.Tensor | None,
    bits: int,
    seed: int,
    offset: int,
    out: torch.Tensor,
    rounding: str = "stochastic",
    backend: str = "auto",
) -> None:
    """:func:`quantize_rows` of ``x[index]`` (all rows if None) written into the uint8
    segment ``out`` (packed values, bf16 zeros, bf16 ranges): a halo message is
    gathered, quantized and laid out in one pass, into a buffer the caller reuses."""
    bits = ref.check_pack_bits(bits)
    ref.check_rounding(rounding)
    seed = normalize_seed(seed)
    rows = x.shape[0] if index is None else index.numel()
    check_counter_range(rows * (x.shape[1] if x.dim() == 2 else 0), offset)
    chosen = dispatch.resolve("compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("compress", chosen):
        if chosen == "ext-cpu":
            backends.ext_cpu().quantize_rows_into(
                x, index, bits, rounding == "stochastic", seed, int(offset), out
            )
        elif chosen == "ext-cuda":  # the gather and the layout in torch, the kernel compiled
            quantized = backends.ext_cuda().quantize_rows(
                x if index is None else x[index], bits, rounding == "stochastic", seed, int(offset)
            )
            ref.write_segment(out, *quantized, x.shape[1], bits)
        else:
            ref.quantize_rows_into(x, index, bits, rounding, seed, offset, out)


def dequantize_rows_into(
    segment: torch.Tensor,
    rows: int,
    bits: int,
    out: torch.Tensor,
    index: torch.Tensor | None = None,
    add: bool = False,
    backend: str = "auto",
) -> None:
    """The ``rows`` rows of a :func:`quantize_rows_into` segment dequantized into
    ``out[index]`` (``out``'s rows in order if None), or added onto them with ``add``:
    halo rows land where the layer reads them, gradients where their owner sums them."""
    bits = ref.check_pack_bits(bits)
    chosen = dispatch.resolve("decompress", segment, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("decompress", chosen):
        if chosen == "ext-cpu":
            backends.ext_cpu().dequantize_rows_into(segment, int(rows), bits, out, index, add)
        else:  # CUDA: the composition below runs its kernels through torch
            ref.dequantize_rows_into(segment, rows, bits, out, index, add)
