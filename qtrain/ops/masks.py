"""ReLU, LeakyReLU and dropout that save a 1-bit packed mask instead of a float tensor.

Their backward needs only which elements passed (exact-iclr22 appendix F.1),
so they save ``x > 0`` or the dropout draw packed at exactly 1 bit per
element (``qtrain.ops.compress.pack_mask``), with no error, and their
backward reads the packed bits directly (``compress.masked_scale``). PyTorch's own kernels
save the float output (ReLU) or a float mask (CPU dropout); quantizing those
could flip which elements pass.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from qtrain.ops import compress, dispatch
from qtrain.quant import rowwise
from qtrain.quant.rng import counter_bits_at, op_seed

KEEP_MASK_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")


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


# ---------------------------------------------------------------- dropout keyed by row id


def keep_threshold(p: float) -> int:
    """The 24-bit threshold of drop probability ``p``: an element is kept when its
    24 random bits are >= ceil(p * 2^24), so it is kept with probability 1 - p
    (to 2^-24)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return math.ceil(p * 2**24)


def reference_keep_mask(ids: torch.Tensor, width: int, threshold: int, seed: int) -> torch.Tensor:
    """Bool ``[rows, width]``: element (r, j) kept when the hash at counter
    ``ids[r] * width + j`` has its top 24 bits >= ``threshold``."""
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise TypeError(f"ids must be a 1-d int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or (width and int(ids.max()) >= 2**62 // width)):
        raise ValueError("ids must be in [0, 2^62 / width)")
    counters = ids.to(torch.int64)[:, None] * width + torch.arange(width, dtype=torch.int64)
    return (counter_bits_at(counters.reshape(-1), seed) >> 8).reshape(counters.shape) >= threshold


def keep_mask(
    ids: torch.Tensor, width: int, p: float, seed: int, backend: str = "auto"
) -> torch.Tensor:
    """The packed (1 bit per element) keep-mask of a ``[len(ids), width]`` tensor whose
    row r belongs to global id ``ids[r]``: a pure function of (seed, id, column)."""
    threshold = keep_threshold(p)
    chosen = dispatch.resolve("dropout-mask", ids, backend, kernels=KEEP_MASK_KERNELS)
    with dispatch.call("dropout-mask", chosen):
        if chosen == "reference":
            mask = reference_keep_mask(ids, int(width), threshold, seed)
            return rowwise.pack_bits(mask.reshape(-1), 1)
        return torch.ops.qtrain.keep_mask_rows(ids, width, threshold, op_seed(seed))


class PackedMaskDropout(torch.autograd.Function):
    """Inverted dropout with a packed (1 bit per element) keep-mask the caller drew
    (:func:`keep_mask`): forward and backward are the same masked scale, and only the
    mask is saved. :func:`keyed_dropout` uses it under :func:`packed_dropout_masks`."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, scale: float, backend: str
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(packed)
        ctx.scale, ctx.backend = scale, backend
        return _masked_scale(x, packed, scale, backend)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (packed,) = ctx.saved_tensors
        return _masked_scale(grad, packed, ctx.scale, ctx.backend), None, None, None


def _masked_scale(
    x: torch.Tensor, packed: torch.Tensor, scale: float, backend: str
) -> torch.Tensor:
    """``x * scale`` where the mask is set, else 0; float32 through the kernels, other
    dtypes (autocast) through torch in their own precision."""
    if x.dtype == torch.float32:
        return compress.masked_scale(x.contiguous(), packed, scale, backend)
    mask = compress.unpack_mask(packed, x.numel(), backend).reshape(x.shape)
    return torch.where(mask, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))


# callbacks of the active plugins that want dropout's mask saved at 1 bit (exact)
_PACKED_DROPOUT: list[Callable[[], None]] = []


@contextlib.contextmanager
def packed_dropout_masks(on_call: Callable[[], None]) -> Iterator[None]:
    """Inside, :func:`keyed_dropout` saves its mask packed at 1 bit per element and
    calls ``on_call`` once per call (the exact plugin's rule for dropout); outside,
    it saves a float32 mask, as torch's dropout does, so an FP32 run's activation
    memory is that of the model a DGL user writes."""
    _PACKED_DROPOUT.append(on_call)
    try:
        yield
    finally:
        _PACKED_DROPOUT.remove(on_call)


def keyed_dropout(
    x: torch.Tensor, ids: torch.Tensor, p: float, seed: int, backend: str = "auto"
) -> torch.Tensor:
    """Training-mode dropout of ``x [rows, ...]`` keyed by the rows' global ``ids``."""
    if ids.shape != (x.shape[0],):
        raise ValueError(f"ids must have shape ({x.shape[0]},), got {tuple(ids.shape)}")
    if p >= 1.0:
        return x * 0.0
    if p <= 0.0:
        return x
    width = x[0].numel() if x.shape[0] else 0
    packed = keep_mask(ids.to(device=x.device, dtype=torch.int64), width, p, seed, backend)
    if _PACKED_DROPOUT:
        for on_call in _PACKED_DROPOUT:
            on_call()
        return PackedMaskDropout.apply(x, packed, 1.0 / (1.0 - p), backend)
    kept = compress.unpack_mask(packed, x.numel(), backend).reshape(x.shape)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)
    # x * mask with a float mask, saved for backward as torch's dropout saves it
    return x * torch.where(kept, scale, torch.zeros((), dtype=torch.float32)).to(x.dtype)
