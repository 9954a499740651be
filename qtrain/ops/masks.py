"""ReLU, LeakyReLU and dropout that save a boolean mask instead of a float tensor.

Their backward needs only which elements passed (exact-iclr22 appendix F.1),
so saving ``x > 0`` or the dropout draw as ``bool`` lets a saved-tensor codec
store it at exactly 1 bit per element, with no error. PyTorch's own kernels
save the float output (ReLU) or a float mask (CPU dropout); quantizing those
could flip which elements pass.
"""

from __future__ import annotations

from typing import Any

import torch


class MaskedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.relu(x)
        ctx.save_for_backward(x > 0)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, 0.0)


class MaskedLeakyReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slope: float) -> torch.Tensor:  # type: ignore[override]
        mask = x > 0
        ctx.save_for_backward(mask)
        ctx.slope = slope
        return torch.where(mask, x, x * slope)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, grad * ctx.slope), None  # as torch's (the slope is float)


class MaskedDropout(torch.autograd.Function):
    """Inverted dropout: keep each element with probability 1 - p and scale by 1 / (1 - p)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:  # type: ignore[override]
        # drawn exactly as torch's CPU dropout draws its mask, so a run keeps the
        # same random stream (and the same masks) as without the plugin
        drawn = torch.empty_like(x).bernoulli_(1.0 - p)
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(drawn.bool())
        ctx.scale = scale
        return x * drawn.mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None


def relu(x: torch.Tensor) -> torch.Tensor:
    return MaskedReLU.apply(x)


def leaky_relu(x: torch.Tensor, slope: float = 0.01) -> torch.Tensor:
    return MaskedLeakyReLU.apply(x, slope)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout; p = 1 drops everything (as torch does)."""
    if p >= 1.0:
        return x * 0.0
    return MaskedDropout.apply(x, p)
