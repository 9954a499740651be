"""Autograd of the op library's differentiable ops (``segment_matmul``,
``segment_matmul_tn``, whose public function is ``qtrain.ops.typed.segment_matmul``, and
``hadamard_rotate``, ``qtrain.ops.rotate.hadamard_rotate``).

Registered on the ops themselves (``torch.library.register_autograd``), so a call of
``torch.ops.qtrain.segment_matmul`` is differentiable wherever it comes from, and every
backward calls only the ops (so it is differentiable again). Kept apart from
``typed.py`` so that ``qtrain.ops.backends`` can register it when it loads the library
without importing the dispatcher, which imports ``backends``.
"""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, offsets, weight, transpose_weight = inputs
    ctx.save_for_backward(x, offsets, weight)
    ctx.transpose_weight = transpose_weight


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None, None]:
    """dx = grad @ W_r^T per segment; dW_r = x_r^T grad_r (or its transpose, computed
    directly as grad_r^T x_r): only the ops, so the backward is differentiable too."""
    x, offsets, weight = ctx.saved_tensors
    ops = torch.ops.qtrain
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = ops.segment_matmul(grad, offsets, weight, not ctx.transpose_weight)
    if ctx.needs_input_grad[2]:
        grad_w = (
            ops.segment_matmul_tn(grad, offsets, x)
            if ctx.transpose_weight
            else ops.segment_matmul_tn(x, offsets, grad)
        )
    return grad_x, None, grad_w, None


def _setup_tn(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, offsets, grad = inputs
    ctx.save_for_backward(x, offsets, grad)


def _backward_tn(ctx: Any, dout: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
    """out[r] = x_r^T g_r: dx_r = g_r dout[r]^T, dg_r = x_r dout[r]."""
    x, offsets, grad = ctx.saved_tensors
    ops = torch.ops.qtrain
    dx = ops.segment_matmul(grad, offsets, dout, True) if ctx.needs_input_grad[0] else None
    dg = ops.segment_matmul(x, offsets, dout, False) if ctx.needs_input_grad[2] else None
    return dx, None, dg


def _setup_rotate(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, block = inputs
    ctx.block = block
    ctx.cols = x.shape[1]


def _backward_rotate(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    """The op is linear and H_B symmetric: dx = hadamard_rotate(grad, B) cut back to x's
    columns (the padding's gradient is dropped)."""
    return torch.ops.qtrain.hadamard_rotate(grad, ctx.block)[:, : ctx.cols], None


_registered = False


def register_autograd() -> None:
    """Make the differentiable ops differentiable (once per process); ``qtrain.ops.backends``
    calls it when it loads the library, beside the fake kernels."""
    global _registered
    if _registered:
        return
    from qtrain.ops.fakes import defined_ops

    defined = defined_ops()
    if {"segment_matmul", "segment_matmul_tn"} <= defined:
        torch.library.register_autograd("qtrain::segment_matmul", _backward, setup_context=_setup)
        torch.library.register_autograd(
            "qtrain::segment_matmul_tn", _backward_tn, setup_context=_setup_tn
        )
    if "hadamard_rotate" in defined:
        torch.library.register_autograd(
            "qtrain::hadamard_rotate", _backward_rotate, setup_context=_setup_rotate
        )
    _registered = True
