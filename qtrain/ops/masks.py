"""ReLU, LeakyReLU and dropout that save a 1-bit packed mask instead of a float tensor.

Their backward needs only which elements passed (exact-iclr22 appendix F.1),
so they save ``x > 0`` or the dropout draw packed at exactly 1 bit per
element (``qtrain.ops.compress.pack_mask``), with no error, and their
backward reads the packed bits directly (``compress.masked_scale``). PyTorch's own kernels
save the float output (ReLU) or a float mask (CPU dropout); quantizing those
could flip which elements pass.
"""

from __future__ import annotations

from typing import Any

import torch

from qtrain.ops import compress


class MaskedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, backend: str) -> torch.Tensor:  # type: ignore[override]
        out = torch.relu(x)
        ctx.save_for_backward(compress.pack_mask(x > 0, backend))
        ctx.backend = backend
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (packed,) = ctx.saved_tensors
        return compress.masked_scale(grad.contiguous(), packed, 1.0, ctx.backend), None


class MaskedLeakyReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slope: float, backend: str) -> torch.Tensor:  # type: ignore[override]
        mask = x > 0
        ctx.save_for_backward(compress.pack_mask(mask, backend))
        ctx.slope, ctx.backend, ctx.shape = slope, backend, x.shape
        return torch.where(mask, x, x * slope)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (packed,) = ctx.saved_tensors
        mask = compress.unpack_mask(packed, grad.numel(), ctx.backend).reshape(ctx.shape)
        return torch.where(mask, grad, grad * ctx.slope), None, None  # as torch's


class MaskedDropout(torch.autograd.Function):
    """Inverted dropout: keep each element with probability 1 - p and scale by 1 / (1 - p)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float, backend: str) -> torch.Tensor:  # type: ignore[override]
        # drawn exactly as torch's CPU dropout draws its mask, so a run keeps the
        # same random stream (and the same masks) as without the plugin
        drawn = torch.empty_like(x).bernoulli_(1.0 - p)
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(compress.pack_mask(drawn.bool(), backend))
        ctx.scale, ctx.backend = scale, backend
        return x * drawn.mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (packed,) = ctx.saved_tensors
        return compress.masked_scale(grad.contiguous(), packed, ctx.scale, ctx.backend), None, None


def relu(x: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    return MaskedReLU.apply(x, backend)


def leaky_relu(x: torch.Tensor, slope: float = 0.01, backend: str = "auto") -> torch.Tensor:
    return MaskedLeakyReLU.apply(x, slope, backend)


def dropout(x: torch.Tensor, p: float, backend: str = "auto") -> torch.Tensor:
    """Training-mode dropout; p = 1 drops everything (as torch does)."""
    if p >= 1.0:
        return x * 0.0
    return MaskedDropout.apply(x, p, backend)
