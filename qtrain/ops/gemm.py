"""INT8 GEMM on quantized operands with the dequantization fused into the output.

tango-sc23 section 3.2: both operands are quantized (``qtrain.ops.quantize``),
multiplied with INT32 accumulation, and the product of the two scales turns
the INT32 result back into float32 in the same pass that writes it. The three
layouts cover a linear layer's forward and both backward products without
materialising a transposed operand::

    "nn": C[M, N] = A[M, K] @ B[K, N]
    "nt": C[M, N] = A[M, K] @ B[N, K]^T
    "tn": C[M, N] = A[K, M]^T @ B[K, N]

Every backend computes, bit for bit::

    acc[m, n] = sum_k qa * qb                  exact (int32; |acc| < 2^31 for K < 133,000)
    C[m, n]   = fl32(float(acc) * fl32(scale_a * scale_b)) (+ bias[n], float32)

:func:`quantized_gemm` fuses the quantization of float32 operands into the
product (the CUDA kernel quantizes A while loading its tiles) and also returns
``absmax(|C|)``, the next layer's quantization range, from the epilogue. With
per-tensor ranges ``absmax_a``, ``absmax_b`` given (not recomputed), it is by
definition::

    qa, scale_a = quantize with absmax_a (qtrain.quant.quantize's rule, counters offset_a + i)
    qb, scale_b = quantize with absmax_b (counters offset_b + i)
    C = int8_gemm(qa, qb, scale_a, scale_b, layout, bias);  returns (C, max |C|)

so with the tensors' true absmax values it equals ``quantize_symmetric`` of
each operand followed by :func:`int8_gemm`, bit for bit.

The compiled backends are the ops ``torch.ops.qtrain.int8_gemm`` and
``torch.ops.qtrain.quantized_gemm``, whose C++ fronts check their arguments for
every device; the references check their own, so both refuse the same inputs
with the same Python exception.
"""

from __future__ import annotations

import numpy as np
import torch

from qtrain.ops import dispatch
from qtrain.quant import quantize as qref
from qtrain.quant.packed import unpack_int4
from qtrain.quant.quantize import quantize_with_absmax
from qtrain.quant.rng import op_seed

LAYOUTS = ("nn", "nt", "tn")
GEMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends implementing int8_gemm
# compiled backends implementing int8_block_gemm
BLOCK_GEMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")
MAX_BLOCK = 65536  # int8_block_gemm's longest block: its int32 block sums stay exact
# compiled backends implementing quantized_gemm (quantization fused into the GEMM)
QUANTIZED_GEMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")
_MAX_COUNTER = 2**63 - 1


# ------------------------------------------------------------------ the references' checks
# The same checks, in the same order and with the same exceptions, as the ops' C++ fronts
# (ext/ops/int8_gemm.cpp, ext/ops/quantized_gemm.cpp); the compiled path leaves them to those.


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _dense(name: str, t: object) -> torch.Tensor:
    t = _tensor(name, t)
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    return t


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")


def _check_operand(name: str, t: object, dtype: torch.dtype) -> torch.Tensor:
    t = _dense(name, t)
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {_dtype_name(dtype)}, got {_dtype_name(t.dtype)}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-d, got shape {list(t.shape)}")
    return t


def _check_same_device(name: str, t: torch.Tensor, first: str, like: torch.Tensor) -> None:
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but {first} is on {like.device}")


def _layout_dims(
    a: torch.Tensor, b: torch.Tensor, layout: str, names: tuple[str, str] = ("qa", "qb")
) -> tuple[int, int, int]:
    """(M, K, N) of the product of 2-d operands stored as ``layout`` says."""
    if layout == "nn":
        (m, k), (k2, n) = a.shape, b.shape
    elif layout == "nt":
        (m, k), (n, k2) = a.shape, b.shape
    else:
        (k, m), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(
            f"inner dimensions differ for layout {layout!r}: {names[0]} {list(a.shape)}, "
            f"{names[1]} {list(b.shape)}"
        )
    return int(m), int(k), int(n)


def _check_bias(bias: object, n: int, first: str, like: torch.Tensor) -> None:
    if bias is None:
        return
    bias = _dense("bias", bias)
    if not bias.is_floating_point():
        raise TypeError(f"bias must be a floating-point tensor, got {_dtype_name(bias.dtype)}")
    if bias.dim() != 1 or bias.shape[0] != n:
        raise ValueError(f"bias must have shape ({n},), got {list(bias.shape)}")
    _check_same_device("bias", bias, first, like)


def _check_int8_gemm(
    qa: torch.Tensor, qb: torch.Tensor, layout: str, bias: torch.Tensor | None
) -> tuple[int, int, int]:
    """(M, K, N), or the exception the op's front raises for these arguments."""
    _check_layout(layout)
    _check_operand("qa", qa, torch.int8)
    _check_operand("qb", qb, torch.int8)
    _check_same_device("qb", qb, "qa", qa)
    m, k, n = _layout_dims(qa, qb, layout)
    _check_bias(bias, n, "qa", qa)
    return m, k, n


def _check_bits(name: str, bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise ValueError(f"{name} must be an integer in 2..8, got {bits!r}")
    if not 2 <= int(bits) <= 8:
        raise ValueError(f"{name} must be an integer in 2..8, got {bits}")
    return int(bits)


def _check_range(name: str, absmax: torch.Tensor | float, a: torch.Tensor) -> float:
    """A quantization range as a Python float: one value, on a's device or the CPU,
    finite and >= 0 (ValueError otherwise)."""
    t = torch.as_tensor(absmax, dtype=torch.float32)
    if t.numel() != 1:
        raise ValueError(f"{name} must hold one value, got shape {list(t.shape)}")
    if t.device != a.device and t.device.type != "cpu":
        raise ValueError(
            f"{name} is on {t.device} but must be on a's device ({a.device}) or on the CPU"
        )
    value = float(t.reshape(()).item())
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


def _check_counters(name: str, of: str, n: int, offset: object) -> int:
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"{name} must be >= 0, got {offset}")
    if n > _MAX_COUNTER - offset:
        raise ValueError(
            f"{name} + numel of {of} must stay below 2^63, got {name} {offset} and numel {n}"
        )
    return int(offset)


# ------------------------------------------------------------------ int8_gemm


def combined_scale(scale_a: torch.Tensor | float, scale_b: torch.Tensor | float) -> float:
    """fl32(scale_a * scale_b), the one factor the INT32 accumulator is multiplied by."""
    a = torch.as_tensor(scale_a, dtype=torch.float32).reshape(())
    b = torch.as_tensor(scale_b, dtype=torch.float32).reshape(())
    return float((a * b).item())


def _check_scale_vector(name: str, t: object, n: int, like: torch.Tensor) -> torch.Tensor:
    """A per-row / per-column scale of the op: float32, shape (n,), on qa's device (the
    op's front refuses the same with the same exceptions)."""
    t = _dense(name, t)
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {_dtype_name(t.dtype)}")
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {list(t.shape)}")
    _check_same_device(name, t, "qa", like)
    return t


def reference_int8_gemm(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale: float,
    layout: str = "nn",
    bias: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    col_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition: float64 products are exact for these integer ranges.

    ``row_scale`` [M] / ``col_scale`` [N] (float32, optional) refine the one ``scale``::

        C[m, n] = fl32(float(acc) * fl32(fl32(scale * row_scale[m]) * col_scale[n])) (+ bias[n])

    (an absent vector is 1: without either, the factor is ``scale``)."""
    m, _, n = _check_int8_gemm(qa, qb, layout, bias)
    if row_scale is not None:
        _check_scale_vector("row_scale", row_scale, m, qa)
    if col_scale is not None:
        _check_scale_vector("col_scale", col_scale, n, qa)
    a = qa.to(torch.float64)
    b = qb.to(torch.float64)
    if layout == "nt":
        b = b.t()
    elif layout == "tn":
        a = a.t()
    # exact integers, |acc| < 2^53; "+ 0.0" makes a float64 -0.0 (e.g. K = 1 and -3 * 0)
    # the integer 0 it stands for, so the sign of a zero output is that of scale (+ bias)
    acc = a @ b + 0.0
    factor = torch.tensor(scale, dtype=torch.float32, device=acc.device)
    if row_scale is not None:
        factor = (factor * row_scale)[:, None]
    if col_scale is not None:
        factor = factor * col_scale[None, :]
    out = acc.to(torch.float32) * factor
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out


def per_tensor(scale: torch.Tensor | float) -> bool:
    """True for one scale for a whole tensor (a number or a 0-d tensor), False for a
    tensor of scales (one per row)."""
    return not isinstance(scale, torch.Tensor) or scale.dim() == 0


def _scale_vector(name: str, scale: object, n: int, like: torch.Tensor) -> torch.Tensor:
    """Scales of one operand's rows (or columns) as float32 ``[n]``: a tensor of n values in
    any shape that holds them in one row or column (``[n]``, ``[n, 1]``, ``[1, n]``)."""
    t = _dense(name, scale)
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {_dtype_name(t.dtype)}")
    if t.numel() != n or sum(d != 1 for d in t.shape) > 1:
        raise ValueError(f"{name} must hold one value per row ({n}), got shape {list(t.shape)}")
    _check_same_device(name, t, "qa", like)
    return t.reshape(n).contiguous()


def int8_gemm(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale_a: torch.Tensor | float,
    scale_b: torch.Tensor | float,
    layout: str = "nn",
    bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """float32 ``dequant(qa) @ dequant(qb)`` in ``layout`` (see the module docstring), plus bias.

    ``scale_a`` is one scale for all of qa or one per row of the product (M values, such as
    the ``[M, 1]`` scales of ``qtrain.ops.quantize.quantize_per_row``); ``scale_b`` one for
    all of qb or one per column of the product (N values, such as the ``[1, N]`` scales of
    ``quantize_per_column``). Per-row / per-column scales never vary along the summed
    dimension, so the sum stays an exact integer one, and the op applies them in its
    epilogue (:func:`reference_int8_gemm`'s ``row_scale`` / ``col_scale``; a per-tensor
    scale on the other side is its ``scale``)::

        C[m, n] = fl32(float(acc[m, n]) * fl32(scale_a[m] * scale_b[n])) (+ bias[n])

    A per-tensor scale is passed to the op as a number: one on the GPU is read back here.
    """
    chosen = dispatch.resolve("gemm", _tensor("qa", qa), backend, kernels=GEMM_KERNELS)
    if per_tensor(scale_a) and per_tensor(scale_b):
        scale = combined_scale(scale_a, scale_b)
        with dispatch.call("gemm", chosen):
            if chosen == "reference":
                return reference_int8_gemm(qa, qb, scale, layout, bias)
            return torch.ops.qtrain.int8_gemm(qa, qb, scale, layout, bias)
    m, _, n = _check_int8_gemm(qa, _tensor("qb", qb), layout, bias)
    row = None if per_tensor(scale_a) else _scale_vector("scale_a", scale_a, m, qa)
    col = None if per_tensor(scale_b) else _scale_vector("scale_b", scale_b, n, qa)
    scale = combined_scale(scale_a if row is None else 1.0, scale_b if col is None else 1.0)
    with dispatch.call("gemm", chosen):
        if chosen == "reference":
            return reference_int8_gemm(qa, qb, scale, layout, bias, row, col)
        return torch.ops.qtrain.int8_gemm(qa, qb, scale, layout, bias, row, col)


# ------------------------------------------------------------------ int8_block_gemm


def _block_operand(
    name: str, q: object, scale_name: str, scale: object
) -> tuple[torch.Tensor, int]:
    """(operand, its columns): int8 ``[K, width]``, or uint8 ``[K, ceil(width / 2)]`` holding
    4-bit values packed two a byte, whose width its scales' columns give."""
    q = _dense(name, q)
    if q.dtype not in (torch.int8, torch.uint8):
        raise TypeError(
            f"{name} must be int8, or uint8 holding 4-bit values packed two a byte, got "
            f"{_dtype_name(q.dtype)}"
        )
    if q.dim() != 2:
        raise ValueError(f"{name} must be 2-d, got shape {list(q.shape)}")
    if q.dtype == torch.int8:
        return q, q.shape[1]
    scale = _dense(scale_name, scale)
    if scale.dim() != 2:
        raise ValueError(
            f"{scale_name} must be 2-d (one scale per block of rows of each column), got "
            f"shape {list(scale.shape)}"
        )
    width = scale.shape[1]
    if q.shape[1] != (width + 1) // 2:
        raise ValueError(
            f"{name} is packed (uint8, two 4-bit values a byte), so its {scale_name}'s {width} "
            f"columns need {(width + 1) // 2} bytes a row, got {q.shape[1]}"
        )
    return q, width


def _check_block_gemm(
    qa: object, qb: object, scale_a: object, scale_b: object, block: object
) -> tuple[int, int, int, int]:
    """(M, K, N, block), or the exception the op's front (ext/ops/int8_block_gemm.cpp) raises."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise ValueError(f"block must be an integer in 1..{MAX_BLOCK}, got {block!r}")
    if not 1 <= int(block) <= MAX_BLOCK:
        raise ValueError(f"block must be an integer in 1..{MAX_BLOCK}, got {block}")
    qa, m = _block_operand("qa", qa, "scale_a", scale_a)
    qb, n = _block_operand("qb", qb, "scale_b", scale_b)
    _check_same_device("qb", qb, "qa", qa)
    _, k, _ = _layout_dims(qa, qb, "tn")
    blocks = -(-k // int(block))
    for name, scale, cols in (("scale_a", scale_a, m), ("scale_b", scale_b, n)):
        t = _dense(name, scale)
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {_dtype_name(t.dtype)}")
        if tuple(t.shape) != (blocks, cols):
            raise ValueError(
                f"{name} must have shape ({blocks}, {cols}) (one scale per block of rows of "
                f"each column), got {list(t.shape)}"
            )
        _check_same_device(name, t, "qa", qa)
    return m, k, n, int(block)


def reference_block_gemm(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """The pure-PyTorch definition of :func:`int8_block_gemm`: the exact integer sum of
    each block of ``block`` rows (float64 products are exact here), each block's term
    ``fl32(float(acc_b[m, n]) * fl32(scale_a[b, m] * scale_b[b, n]))`` added in float32 into
    its group's sum (:func:`block_gemm_groups`, from 0, in block order), and the groups'
    sums added in group order. A packed operand is its values unpacked."""
    m, k, n, block = _check_block_gemm(qa, qb, scale_a, scale_b, block)
    if qa.dtype == torch.uint8:
        qa = unpack_int4(qa, m)
    if qb.dtype == torch.uint8:
        qb = unpack_int4(qb, n)
    blocks = -(-k // block)
    groups = block_gemm_groups(blocks, m, n)
    out = torch.zeros((m, n), dtype=torch.float32, device=qa.device)
    for g in range(groups):
        part = torch.zeros((m, n), dtype=torch.float32, device=qa.device)
        for b in range(blocks * g // groups, blocks * (g + 1) // groups):
            rows = slice(b * block, (b + 1) * block)
            acc = qa[rows].to(torch.float64).t() @ qb[rows].to(torch.float64) + 0.0
            part = part + acc.to(torch.float32) * (scale_a[b][:, None] * scale_b[b][None, :])
        out = part if g == 0 else out + part
    return out


def block_gemm_groups(blocks: int, m: int, n: int) -> int:
    """How many contiguous groups :func:`int8_block_gemm` adds its blocks in (each group in
    block order, then the groups in order): at most 16, fewer where 16 float32 ``[M, N]``
    partial sums would pass 64 MiB, one per block at most. A function of the shape, so
    every device and thread count adds the same values in the same order
    (ext/common/block_gemm.h)."""
    fit = max(1, (64 << 20) // max(1, m * n * 4))
    return max(1, min(blocks, 16, fit))


def int8_block_gemm(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    block: int,
    backend: str = "auto",
) -> torch.Tensor:
    """float32 ``dequant(qa)^T @ dequant(qb)`` ("tn": qa [K, M], qb [K, N]) with one scale per
    block of ``block`` rows of each column (``scale_a`` [ceil(K / block), M], ``scale_b``
    [.., N]: ``quantize_per_column(..., block=block)``'s scales). The product a weight
    gradient X^T dY is, summed over every node: one scale per column over 169,343 nodes
    leaves most of a 2-bit column at 0. Each block sums exactly in int32 and is scaled in
    float32; the blocks add in float32 in the reference's order (:func:`block_gemm_groups`)
    on every device, ISA and thread count: bit for bit. Either operand may be stored packed
    (uint8 ``[K, ceil(width / 2)]``, ``pack_int4``'s layout, its width its scales'): the
    kernels read the nibbles, no int8 copy is made."""
    chosen = dispatch.resolve("block_gemm", _tensor("qa", qa), backend, kernels=BLOCK_GEMM_KERNELS)
    with dispatch.call("block_gemm", chosen):
        if chosen == "reference":
            return reference_block_gemm(qa, qb, scale_a, scale_b, block)
        return torch.ops.qtrain.int8_block_gemm(qa, qb, scale_a, scale_b, block)


# ------------------------------------------------------------------ quantized_gemm


def reference_quantized_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    absmax_a: torch.Tensor | float,
    absmax_b: torch.Tensor | float,
    bits_a: int = 8,
    bits_b: int = 8,
    layout: str = "nn",
    bias: torch.Tensor | None = None,
    stochastic: bool = False,
    seed: int = 0,
    offset_a: int = 0,
    offset_b: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-PyTorch definition of :func:`quantized_gemm` (see the module docstring)."""
    _check_layout(layout)
    bits_a = _check_bits("bits_a", bits_a)
    bits_b = _check_bits("bits_b", bits_b)
    _check_operand("a", a, torch.float32)
    _check_operand("b", b, torch.float32)
    _check_same_device("b", b, "a", a)
    _, _, n = _layout_dims(a, b, layout, ("a", "b"))
    range_a = _check_range("absmax_a", absmax_a, a)
    range_b = _check_range("absmax_b", absmax_b, a)
    _check_bias(bias, n, "a", a)
    offset_a = _check_counters("offset_a", "a", a.numel(), offset_a)
    offset_b = _check_counters("offset_b", "b", b.numel(), offset_b)
    rounding = "stochastic" if stochastic else "nearest"
    qa, scale_a = quantize_with_absmax(a, range_a, bits_a, rounding, seed, offset_a)
    qb, scale_b = quantize_with_absmax(b, range_b, bits_b, rounding, seed, offset_b)
    out = reference_int8_gemm(qa, qb, combined_scale(scale_a, scale_b), layout, bias)
    absmax = out.abs().max() if out.numel() else torch.zeros((), device=out.device)
    return out, absmax.to(torch.float32).reshape(())


def quantized_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    absmax_a: torch.Tensor | float,
    absmax_b: torch.Tensor | float,
    bits_a: int = 8,
    bits_b: int = 8,
    layout: str = "nn",
    bias: torch.Tensor | None = None,
    rounding: str = "nearest",
    seed: int = 0,
    offset_a: int = 0,
    offset_b: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize float operands with the given ranges, INT8-multiply, dequantize: ``(C, max|C|)``.

    ``a`` and ``b`` are float32 matrices stored as ``layout`` asks (as
    :func:`int8_gemm`'s ``qa``, ``qb``); ``absmax_a`` / ``absmax_b`` are their
    quantization ranges (a float or a one-element tensor on a's device or the
    CPU; on the GPU, pass the previous call's returned absmax to avoid a
    device-to-host wait). On CUDA the quantization of ``a`` happens inside the
    GEMM's tile loads.
    """
    rounding = qref.check_rounding(rounding)
    stochastic = rounding == "stochastic"
    chosen = dispatch.resolve(
        "quantized_gemm", _tensor("a", a), backend, kernels=QUANTIZED_GEMM_KERNELS
    )
    with dispatch.call("quantized_gemm", chosen):
        if chosen == "reference":
            return reference_quantized_gemm(
                a,
                b,
                absmax_a,
                absmax_b,
                bits_a,
                bits_b,
                layout,
                bias,
                stochastic,
                seed,
                offset_a,
                offset_b,
            )
        out, absmax = torch.ops.qtrain.quantized_gemm(
            a,
            b,
            torch.as_tensor(absmax_a, dtype=torch.float32),
            torch.as_tensor(absmax_b, dtype=torch.float32),
            bits_a,
            bits_b,
            layout,
            bias,
            stochastic,
            op_seed(seed),
            offset_a,
            offset_b,
        )
        return out, absmax
