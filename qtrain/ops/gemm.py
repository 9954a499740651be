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
"""

from __future__ import annotations

import numpy as np
import torch

from qtrain.ops import dispatch
from qtrain.quant import quantize as qref
from qtrain.quant.quantize import quantize_with_absmax
from qtrain.quant.rng import check_counter_range, normalize_seed

LAYOUTS = ("nn", "nt", "tn")
GEMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends implementing int8_gemm
# compiled backends implementing quantized_gemm (quantization fused into the GEMM)
QUANTIZED_GEMM_KERNELS: tuple[str, ...] = ("ext-cuda",)


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")


def _layout_dims(a: torch.Tensor, b: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(M, K, N) of the product of 2-d operands stored as ``layout`` says."""
    if layout == "nn":
        (m, k), (k2, n) = a.shape, b.shape
    elif layout == "nt":
        (m, k), (n, k2) = a.shape, b.shape
    else:
        (k, m), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(
            f"int8_gemm({layout!r}): inner dimensions differ: qa {tuple(a.shape)}, qb {tuple(b.shape)}"
        )
    return int(m), int(k), int(n)


def _dims(qa: torch.Tensor, qb: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(M, K, N) of the product, or ValueError naming the mismatch."""
    _check_layout(layout)
    for name, t in (("qa", qa), ("qb", qb)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int8 or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-d int8 tensor, got {getattr(t, 'dtype', t)!r}")
    return _layout_dims(qa, qb, layout)


def combined_scale(scale_a: torch.Tensor | float, scale_b: torch.Tensor | float) -> float:
    """fl32(scale_a * scale_b), the one factor the INT32 accumulator is multiplied by."""
    a = torch.as_tensor(scale_a, dtype=torch.float32).reshape(())
    b = torch.as_tensor(scale_b, dtype=torch.float32).reshape(())
    return float((a * b).item())


def reference_int8_gemm(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale: float,
    layout: str = "nn",
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pure-PyTorch definition: float64 products are exact for these integer ranges."""
    a = qa.to(torch.float64)
    b = qb.to(torch.float64)
    if layout == "nt":
        b = b.t()
    elif layout == "tn":
        a = a.t()
    # exact integers, |acc| < 2^53; "+ 0.0" makes a float64 -0.0 (e.g. K = 1 and -3 * 0)
    # the integer 0 it stands for, so the sign of a zero output is that of scale (+ bias)
    acc = a @ b + 0.0
    out = acc.to(torch.float32) * torch.tensor(scale, dtype=torch.float32)
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out


def int8_gemm(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale_a: torch.Tensor | float,
    scale_b: torch.Tensor | float,
    layout: str = "nn",
    bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """float32 ``dequant(qa) @ dequant(qb)`` in ``layout`` (see the module docstring), plus bias."""
    m, _, n = _dims(qa, qb, layout)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    scale = combined_scale(scale_a, scale_b)
    chosen = dispatch.resolve("gemm", qa, backend, kernels=GEMM_KERNELS)
    with dispatch.call("gemm", chosen):
        if chosen == "ext-cpu":
            from qtrain import backends

            out = backends.ext_cpu().int8_gemm(qa, qb, scale, layout, bias)
        elif chosen == "ext-cuda":
            from qtrain import backends

            out = backends.ext_cuda().int8_gemm(qa, qb, scale, layout, bias)
        else:
            out = reference_int8_gemm(qa, qb, scale, layout, bias)
    assert out.shape == (m, n)
    return out


def _absmax_value(name: str, absmax: torch.Tensor | float) -> float:
    """A quantization range as a Python float; ValueError unless finite and >= 0."""
    value = float(torch.as_tensor(absmax, dtype=torch.float32).reshape(()).item())
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


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
    rounding = "stochastic" if stochastic else "nearest"
    qa, scale_a = quantize_with_absmax(
        a, _absmax_value("absmax_a", absmax_a), bits_a, rounding, seed, offset_a
    )
    qb, scale_b = quantize_with_absmax(
        b, _absmax_value("absmax_b", absmax_b), bits_b, rounding, seed, offset_b
    )
    out = reference_int8_gemm(qa, qb, combined_scale(scale_a, scale_b), layout, bias)
    absmax = out.abs().max() if out.numel() else torch.zeros((), dtype=torch.float32)
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
    quantization ranges (a float or a one-element tensor; on the GPU, pass the
    previous call's returned absmax to avoid a device-to-host wait). On CUDA
    the quantization of ``a`` happens inside the GEMM's tile loads.
    """
    _check_layout(layout)
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-d float32 tensor, got {getattr(t, 'dtype', t)!r}")
    m, _, n = _layout_dims(a, b, layout)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    qref.check_bits(bits_a)
    qref.check_bits(bits_b)
    rounding = qref.check_rounding(rounding)
    seed = normalize_seed(seed)
    check_counter_range(a.numel(), offset_a)
    check_counter_range(b.numel(), offset_b)
    chosen = dispatch.resolve("quantized_gemm", a, backend, kernels=QUANTIZED_GEMM_KERNELS)
    with dispatch.call("quantized_gemm", chosen):
        if chosen == "ext-cuda":
            from qtrain import backends

            amax_a = torch.as_tensor(absmax_a, dtype=torch.float32).reshape(())
            amax_b = torch.as_tensor(absmax_b, dtype=torch.float32).reshape(())
            out, absmax = backends.ext_cuda().quantized_gemm(
                a,
                b,
                amax_a,
                amax_b,
                bits_a,
                bits_b,
                layout,
                bias,
                rounding == "stochastic",
                seed,
                int(offset_a),
                int(offset_b),
            )
        else:
            out, absmax = reference_quantized_gemm(
                a,
                b,
                absmax_a,
                absmax_b,
                bits_a,
                bits_b,
                layout,
                bias,
                rounding == "stochastic",
                seed,
                offset_a,
                offset_b,
            )
    assert out.shape == (m, n)
    return out, absmax
