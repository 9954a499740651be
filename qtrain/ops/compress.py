"""Activation compression ops with backend dispatch (see ``qtrain.ops.dispatch``).

The math is defined once in :mod:`qtrain.quant.rowwise` (per-row quantization,
bit packing) and :mod:`qtrain.quant.projection` (the Rademacher matrix); these
wrappers pick a backend per call and count it under the primitive names
``compress`` / ``decompress`` / ``pack`` / ``unpack`` / ``rademacher``, and the
fused ``project+compress`` / ``decompress+unproject`` (one pass over the
activation instead of a GEMM, a quantize and their intermediate tensor).

The compiled backends are the ops ``torch.ops.qtrain.*`` (one call for both
devices: the dispatcher routes by the tensors' device), whose C++ fronts check
their arguments for every device; the references check their own. Both refuse
the same inputs with the same Python exception and agree bit for bit.
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch
from qtrain.quant import projection
from qtrain.quant import rowwise as ref
from qtrain.quant.quantize import stochastic
from qtrain.quant.rng import op_seed

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
    chosen = dispatch.resolve("compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("compress", chosen):
        if chosen == "reference":
            return ref.quantize_rows(x, bits, rounding, seed, offset)
        return torch.ops.qtrain.quantize_rows(x, bits, stochastic(rounding), op_seed(seed), offset)


def quantize_rows_means(
    x: torch.Tensor, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-bit rows of float32 ``x [rows, width]`` at their two side means
    (:func:`qtrain.quant.rowwise.quantize_rows_means`), in :func:`quantize_rows`'s format
    at ``bits = 1``: :func:`dequantize_rows` reads it."""
    chosen = dispatch.resolve("compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("compress", chosen):
        if chosen == "reference":
            return ref.quantize_rows_means(x)
        return torch.ops.qtrain.quantize_rows_means(x)


def dequantize_rows(
    packed: torch.Tensor,
    zero: torch.Tensor,
    rng: torch.Tensor,
    bits: int,
    width: int,
    backend: str = "auto",
) -> torch.Tensor:
    """float32 ``[rows, width]`` back from :func:`quantize_rows`."""
    chosen = dispatch.resolve("decompress", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("decompress", chosen):
        if chosen == "reference":
            return ref.dequantize_rows(packed, zero, rng, bits, width)
        return torch.ops.qtrain.dequantize_rows(packed, zero, rng, bits, width)


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
    chosen = dispatch.resolve("project+compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("project+compress", chosen):
        if chosen == "reference":
            ref.check_pack_bits(bits)  # before the projection's work, as the op's front
            y = projection.project_rows(x, k, seed, projection_offset)
            return ref.quantize_rows(y, bits, rounding, seed, offset)
        return torch.ops.qtrain.project_quantize_rows(
            x, k, bits, stochastic(rounding), op_seed(seed), offset, projection_offset
        )


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
    chosen = dispatch.resolve("decompress+unproject", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("decompress+unproject", chosen):
        if chosen == "reference":
            ref.check_pack_bits(bits)
            if k < 1 or d < 0:  # before k sizes anything, as the op's front
                raise ValueError(f"need d >= 0 and k >= 1, got d={d}, k={k}")
            y = ref.dequantize_rows(packed, zero, rng, bits, k)
            return projection.unproject_rows(y, d, seed, projection_offset)
        return torch.ops.qtrain.dequantize_unproject_rows(
            packed, zero, rng, bits, k, d, op_seed(seed), projection_offset
        )


def pack_mask(mask: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """A bool tensor as a dense bit stream, 1 bit per element."""
    chosen = dispatch.resolve("pack", mask, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("pack", chosen):
        if chosen == "reference":
            return ref.pack_bits(mask, 1)
        return torch.ops.qtrain.pack_bits(mask, 1)


def unpack_mask(packed: torch.Tensor, n: int, backend: str = "auto") -> torch.Tensor:
    """The first ``n`` bits of a stream from :func:`pack_mask`, as a flat bool tensor."""
    chosen = dispatch.resolve("unpack", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("unpack", chosen):
        if chosen == "reference":
            out = ref.unpack_bits(packed, 1, n)
        else:
            out = torch.ops.qtrain.unpack_bits(packed, 1, n)
    return out.view(torch.bool)


def masked_scale(
    grad: torch.Tensor, packed: torch.Tensor, scale: float = 1.0, backend: str = "auto"
) -> torch.Tensor:
    """``grad * scale`` where the packed 1-bit mask is set, else 0 (ReLU / dropout backward)."""
    chosen = dispatch.resolve("unpack", packed, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("unpack", chosen):
        if chosen == "reference":
            return ref.masked_scale(grad, packed, scale)
        return torch.ops.qtrain.masked_scale(grad, packed, float(scale))


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
        if chosen == "reference":
            return projection.rademacher(d, k, seed, offset).to(probe.device)
        if d < 0 or k < 1:  # the op fills a [d, k] tensor, which must exist first
            raise ValueError(f"need d >= 0 and k >= 1, got d={d}, k={k}")
        out = torch.empty(d, k, device=probe.device)
        torch.ops.qtrain.fill_rademacher(out, op_seed(seed), offset)
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
    chosen = dispatch.resolve("compress", x, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("compress", chosen):
        if chosen == "reference":
            ref.quantize_rows_into(x, index, bits, rounding, seed, offset, out)
        else:
            torch.ops.qtrain.quantize_rows_into(
                x, index, bits, stochastic(rounding), op_seed(seed), offset, out
            )


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
    chosen = dispatch.resolve("decompress", segment, backend, kernels=COMPRESS_KERNELS)
    with dispatch.call("decompress", chosen):
        if chosen == "reference":
            ref.dequantize_rows_into(segment, rows, bits, out, index, add)
        else:
            torch.ops.qtrain.dequantize_rows_into(segment, rows, bits, out, index, add)
