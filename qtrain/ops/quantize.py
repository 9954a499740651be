"""Quantize / dequantize with backend dispatch (see ``qtrain.ops.dispatch``).

The compiled backends are the op ``torch.ops.qtrain.quantize_symmetric``, whose
C++ front checks its arguments for every device; the reference checks its own.
Both refuse the same inputs with the same Python exception and agree bit for bit.
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch
from qtrain.quant import quantize as ref
from qtrain.quant.rng import op_seed

QUANTIZE_KERNELS = ("ext-cpu", "ext-cuda")


def quantize(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-tensor quantization: ``(q int8, scale float32 0-d)`` with x ~ q * scale.

    ``x`` of any floating dtype is taken as float32. ``backend`` is "auto"
    (the compiled kernel for x's device when built, else the reference with
    the fallback recorded), "reference", "ext-cpu" or "ext-cuda".
    """
    xf = ref.as_float32(x)
    chosen = dispatch.resolve("quantize", xf, backend, kernels=QUANTIZE_KERNELS)
    with dispatch.call("quantize", chosen):
        if chosen == "reference":
            return ref.quantize_symmetric(xf, bits, rounding, seed, offset)
        return torch.ops.qtrain.quantize_symmetric(
            xf, bits, ref.stochastic(rounding), op_seed(seed), offset
        )


def dequantize(q: torch.Tensor, scale: torch.Tensor | float, backend: str = "auto") -> torch.Tensor:
    """float32 ``q * scale``; one multiply, so the reference is the only implementation."""
    chosen = dispatch.resolve("dequantize", q, backend, kernels=())
    with dispatch.call("dequantize", chosen):
        out = ref.dequantize(q, scale)
    return out
