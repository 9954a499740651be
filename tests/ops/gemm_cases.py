"""Inputs shared by the int8_gemm and quantized_gemm tests: shapes, operands stored as a
layout asks, the references on one thread, and the CPU kernel variants to run."""

from __future__ import annotations

from collections.abc import Callable

import torch

from qtrain.ops.gemm import reference_int8_gemm, reference_quantized_gemm

Maker = Callable[[tuple[int, ...]], torch.Tensor]

# (M, K, N): degenerate tiles, vector tails, K not a multiple of 4 (the CPU tail group, the
# CUDA unvectorized loads), several CPU row blocks and panels, the tails of the CUDA 64 x 256
# tile and of its 32-wide k-step, several CUDA row and column blocks
SHAPES = [
    (1, 1, 1),
    (1, 7, 1),
    (3, 1, 5),
    (3, 5, 17),
    (5, 3, 17),
    (5, 33, 1),
    (6, 4, 16),
    (7, 5, 33),
    (13, 17, 64),
    (17, 33, 65),
    (17, 127, 129),
    (33, 127, 127),
    (33, 129, 3),
    (64, 32, 256),
    (64, 250, 80),
    (65, 64, 257),
    (127, 96, 128),
    (129, 129, 129),
    (200, 250, 80),
    (513, 256, 256),
]
EMPTY_SHAPES = [(0, 3, 4), (4, 0, 5), (5, 3, 0), (0, 0, 0), (3, 0, 1)]


def stored_shapes(m: int, k: int, n: int, layout: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of A and B stored as ``layout`` asks for the product (M, K) @ (K, N)."""
    return ((k, m) if layout == "tn" else (m, k)), ((n, k) if layout == "nt" else (k, n))


def operands(m: int, k: int, n: int, layout: str, make: Maker) -> tuple[torch.Tensor, torch.Tensor]:
    """A, B made by ``make`` and stored as ``layout`` asks (CPU tensors)."""
    sa, sb = stored_shapes(m, k, n, layout)
    return make(sa), make(sb)


def int8s(seed: int, low: int = -128, high: int = 128) -> Maker:
    g = torch.Generator().manual_seed(seed)
    return lambda shape: torch.randint(low, high, shape, generator=g, dtype=torch.int8)


def constant(value: int) -> Maker:
    return lambda shape: torch.full(shape, value, dtype=torch.int8)


def floats(seed: int, scale: float = 1.0) -> Maker:
    g = torch.Generator().manual_seed(seed)
    return lambda shape: torch.randn(shape, generator=g) * scale


def _one_thread(fn: Callable[[], object]) -> object:
    """fn on one thread: a tiny float64 matmul on a busy machine otherwise waits
    milliseconds for its thread team (the result does not depend on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def int8_reference(
    qa: torch.Tensor,
    qb: torch.Tensor,
    scale: float,
    layout: str,
    bias: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    col_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference_int8_gemm of CPU copies (row / column scales included), on one thread."""
    bias, row_scale, col_scale = (
        None if t is None else t.cpu() for t in (bias, row_scale, col_scale)
    )
    out = _one_thread(
        lambda: reference_int8_gemm(qa.cpu(), qb.cpu(), scale, layout, bias, row_scale, col_scale)
    )
    assert isinstance(out, torch.Tensor)
    return out


def quantized_reference(a: torch.Tensor, b: torch.Tensor, *args: object, **kwargs: object):
    """reference_quantized_gemm of CPU copies (ranges and bias included), on one thread."""
    args = tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in args)
    kwargs = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return _one_thread(lambda: reference_quantized_gemm(a.cpu(), b.cpu(), *args, **kwargs))
