"""The block-diagonal Walsh-Hadamard rotation with backend dispatch (issue 32).

Rotating both operands of a product along the dimension it sums over leaves the
product unchanged, ``(A H)(H^T B) = A B`` (H orthonormal), and spreads a large value
over its block, so fewer of a low-bit tensor's levels are lost to one outlier. The
compiled backends are the op ``torch.ops.qtrain.hadamard_rotate`` (the fast transform,
differentiable: ``qtrain/ops/autograd.py``); the reference is
``qtrain.quant.granular.hadamard_rotate`` (a matmul per block). They agree to float32
rounding, not bit for bit. The arguments are checked here, once, before dispatch, so
every backend refuses the same inputs with the same exception and message.
"""

from __future__ import annotations

import math

import torch

from qtrain.ops import dispatch
from qtrain.quant import granular

# compiled backends implementing hadamard_rotate
ROTATE_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")
# the largest block the kernels take (the reference takes any power of two)
MAX_BLOCK = 1024


def check_block(block: object) -> int:
    """``block`` if it is an int power of two in 1..MAX_BLOCK, else ValueError."""
    if (
        isinstance(block, bool)
        or not isinstance(block, int)
        or not 1 <= block <= MAX_BLOCK
        or block & (block - 1)
    ):
        raise ValueError(
            f"hadamard_rotate: block must be a power of two in 1..{MAX_BLOCK}, got {block!r}"
        )
    return block


def hadamard_rotate(x: torch.Tensor, block: int, backend: str = "auto") -> torch.Tensor:
    """x's last dimension padded with zeros to P = ceil(cols / block) * block and each run
    of ``block`` values multiplied by the orthonormal Walsh-Hadamard matrix: float32
    ``[..., P]``.

    ``x`` of any floating dtype and any rank >= 1 is taken as float32 (differentiably:
    the gradient flows back to x in its own dtype); ``block`` a power of two in 1..1024.
    ``backend`` is "auto" (the compiled kernel for x's device when built, else the
    reference with the fallback recorded), "reference", "ext-cpu" or "ext-cuda". The
    rotation is its own inverse on padded rows: ``hadamard_rotate(hadamard_rotate(x, B),
    B)[..., :cols] == x`` to float32 rounding.
    """
    block = check_block(block)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"hadamard_rotate: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"hadamard_rotate: x must be a floating-point tensor, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("hadamard_rotate: x must have at least one dimension, got a 0-d tensor")
    if x.layout != torch.strided:
        raise ValueError(f"hadamard_rotate: x must be a dense (strided) tensor, got {x.layout}")
    lead, cols = x.shape[:-1], x.shape[-1]
    x2 = x.to(torch.float32).reshape(math.prod(lead), cols)
    chosen = dispatch.resolve("hadamard_rotate", x2, backend, kernels=ROTATE_KERNELS)
    with dispatch.call("hadamard_rotate", chosen):
        if chosen == "reference":
            out = granular.hadamard_rotate(x2, block)
        else:
            out = torch.ops.qtrain.hadamard_rotate(x2, block)
    return out.reshape(*lead, out.shape[-1])
