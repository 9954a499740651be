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
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch

LAYOUTS = ("nn", "nt", "tn")
GEMM_KERNELS: tuple[str, ...] = ("ext-cpu",)  # compiled backends implementing int8_gemm


def _dims(qa: torch.Tensor, qb: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(M, K, N) of the product, or ValueError naming the mismatch."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    for name, t in (("qa", qa), ("qb", qb)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int8 or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-d int8 tensor, got {getattr(t, 'dtype', t)!r}")
    if layout == "nn":
        (m, k), (k2, n) = qa.shape, qb.shape
    elif layout == "nt":
        (m, k), (n, k2) = qa.shape, qb.shape
    else:
        (k, m), (k2, n) = qa.shape, qb.shape
    if k != k2:
        raise ValueError(
            f"int8_gemm({layout!r}): inner dimensions differ: qa {tuple(qa.shape)}, qb {tuple(qb.shape)}"
        )
    return int(m), int(k), int(n)


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
        else:
            out = reference_int8_gemm(qa, qb, scale, layout, bias)
    assert out.shape == (m, n)
    return out
