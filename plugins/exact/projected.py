"""Dense products whose backward reads the saved input's stored form without rebuilding it.

Projected (exact-iclr22 section 3.2), as below; and unprojected, where the weight
gradient is summed over blocks of the stored rows, each dequantized in turn.

EXACT stores ``y = Q(x R)`` (``R`` the ``[d, k]`` normalized Rademacher
matrix) for a product ``x @ W`` and, in backward, rebuilds ``x^ = y R^T`` for
the weight gradient ``x^T g``. Because ``(y R^T)^T g = R (y^T g)``, the same
gradient (equal in exact arithmetic, so the same unbiased estimate) can be
formed from the k-column ``y`` directly: backward never builds the d-column
``x^``, and the weight gradient's product over all rows is k/d the size
(1/8 at D/R = 8). This is where random projection buys time on a CPU, not
only memory: the projection costs one pass over ``x`` in forward, the
smaller product saves more than that in backward.

The stored form is the ``exact`` codec's own (``CompressingCodec.encode``:
same bits, same counter offsets, shared with any other op that saves ``x``),
and ``x`` goes through ``save_for_backward``, so the activation meter counts
exactly the bytes it counted before.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from qtrain.plugins.exact.compressed import CompressedTensor, CompressingCodec


class StoredInputProduct(torch.autograd.Function):
    """``x @ w (+ bias)`` (``linear``: ``x @ w^T (+ bias)``) for a parameter ``w``, whose
    backward reads ``x``'s stored form and never rebuilds ``x``: from the projected rows
    (``R (y^T g)``) or, unprojected, from the quantized rows a block at a time.

    Unpacking ``x`` for torch's own backward would rebuild it whole: a [rows, width]
    float32 tensor alive beside the layer's gradients, at the peak of a full-graph
    backward (and, projected, a product k/d the size would be d columns wide).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        codec: CompressingCodec,
        stored: CompressedTensor,
        linear: bool,
    ) -> torch.Tensor:
        if linear:
            out = F.linear(x, w, bias)
        elif bias is None:
            out = torch.mm(x, w)
        else:
            out = torch.addmm(bias, x, w)
        ctx.codec, ctx.stored, ctx.w, ctx.linear = codec, stored, w, linear
        # Saved like any activation, so the hooks in force (the activation meter,
        # or the exact plugin's own) replace x by the codec's stored form, the
        # very object backward reads, and count it once however many ops save x.
        # Backward never unpacks it.
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        w: torch.Tensor = ctx.w
        grad_x = grad_w = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad @ w if ctx.linear else grad @ w.t()
        if ctx.needs_input_grad[1]:
            grad_w = weight_grad(ctx.codec, ctx.stored, grad, ctx.linear)
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_w, grad_bias, None, None, None


def weight_grad(
    codec: CompressingCodec, stored: CompressedTensor, grad: torch.Tensor, linear: bool
) -> torch.Tensor:
    """``x^T grad`` (``linear``: ``grad^T x``) from ``x``'s stored form."""
    if stored.projection is None:
        return codec.weight_grad_rows(stored, grad, linear)
    y = codec.projected_rows(stored)  # [rows, k]
    r = codec.projection_matrix(stored)  # [d, k]
    return (grad.t() @ y) @ r.t() if linear else r @ (y.t() @ grad)


def projected_product(
    codec: CompressingCodec,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    linear: bool,
) -> torch.Tensor | None:
    """The product through :class:`StoredInputProduct` with ``x`` stored projected, or None
    where the codec would not project ``x`` (narrow rows, BatchNorm inputs, tensors that
    need no gradient).

    Only for use under saved-tensor hooks that apply ``codec`` (the ``exact``
    plugin's): without them autograd would keep ``x`` itself as well.
    """
    stored = codec.encode_projected(x)
    if stored is None:
        return None
    return StoredInputProduct.apply(x, w, bias, codec, stored, linear)


def row_blocked_product(
    codec: CompressingCodec,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    linear: bool,
) -> torch.Tensor | None:
    """The product through :class:`StoredInputProduct` with ``x`` stored as unprojected
    quantized rows, or None where the codec would store ``x`` otherwise. Only under the
    ``exact`` plugin's saved-tensor hooks, as :func:`projected_product`."""
    stored = codec.encode_rows(x)
    if stored is None:
        return None
    return StoredInputProduct.apply(x, w, bias, codec, stored, linear)
