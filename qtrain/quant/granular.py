"""Symmetric quantization with finer scales than one per tensor, and the Hadamard rotation:
the references for low-bit tango (issue 32).

One scale for a whole tensor (:func:`qtrain.quant.quantize.quantize_symmetric`) leaves
most rows of a 4-bit tensor with one or two levels when a few rows (hub nodes) or
columns are large. Here a 2-d tensor is cut into tiles of ``tile = (rows, cols)``
elements (the last tiles of each dimension may be smaller), and every tile gets
quantize_symmetric's rule with its own range::

    absmax_t = max |x| over tile t;   pre, inv, scale_t as in scale_params (float32)
    q[i, j]  = clamp(round or floor(fl32(fl32(x * pre_t) * inv_t) + u), -qmax, qmax)

with ``u = counter_uniform(seed, offset + i * cols + j)``: the counters follow the
element's flat index, whatever the tiles, so a tile of the whole tensor is exactly
quantize_symmetric, and a one-row tile is quantize_symmetric of that row at counter
``offset + i * cols``. The tiles a product can use keep one scale along the dimension
it sums over, or change it only every ``block`` elements: ``(1, cols)`` (one scale a
row), ``(rows, 1)`` (one a column), ``(1, block)`` (blocks along the row).

:func:`hadamard_rotate` multiplies the last dimension by a block-diagonal Walsh-Hadamard
matrix (orthonormal: ``H H^T = I``), after padding it with zeros to a multiple of the
block. Rotating both operands of a product along the dimension it sums over leaves
the product unchanged, ``(A H)(H^T B) = A B``, and spreads a large value over the
block, so fewer levels are lost to one outlier.
"""

from __future__ import annotations

import numpy as np
import torch

from qtrain.quant.quantize import PRE_TINY, checked_quantize_args, qmax_for
from qtrain.quant.rng import counter_uniform


def check_tile(tile: object, shape: torch.Size) -> tuple[int, int]:
    """``tile`` as (rows, cols) of positive ints (at most the tensor's sizes, larger means
    the whole dimension); ValueError naming the problem otherwise."""
    if (
        not isinstance(tile, tuple)
        or len(tile) != 2
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in tile)
    ):
        raise ValueError(f"tile must be a pair of positive ints (rows, cols), got {tile!r}")
    if min(tile) < 1:
        raise ValueError(f"tile must be a pair of positive ints (rows, cols), got {tile!r}")
    return min(tile[0], max(shape[0], 1)), min(tile[1], max(shape[1], 1))


def _tile_absmax(xf: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """max |x| of every tile, float32 [ceil(rows / tr), ceil(cols / tc)]."""
    rows, cols = xf.shape
    tr, tc = tile
    pr, pc = -rows % tr, -cols % tc
    padded = torch.nn.functional.pad(xf.abs(), (0, pc, 0, pr))
    return padded.reshape((rows + pr) // tr, tr, (cols + pc) // tc, tc).amax(dim=(1, 3))


def _expand(per_tile: torch.Tensor, tile: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """A per-tile tensor repeated over its tiles' elements, cropped to ``shape``."""
    out = per_tile.repeat_interleave(tile[0], dim=0).repeat_interleave(tile[1], dim=1)
    return out[: shape[0], : shape[1]]


def tile_scale_params(absmax: torch.Tensor, qmax: int) -> tuple[torch.Tensor, ...]:
    """(pre, inv, scale) of every tile, float32, as ``scale_params`` computes one: divisions
    in numpy float32 (correctly rounded), a tile whose ``qmax / absmax`` overflows scaled
    by 2^64 first, an all-zero tile with ``inv = 0`` and ``scale = 0``."""
    a = absmax.detach().cpu().numpy().astype(np.float32)
    q = np.float32(qmax)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scale = a / q
        inv = np.where(a == 0, np.float32(0), q / a).astype(np.float32)
        tiny = (a != 0) & ~np.isfinite(inv)
        pre = np.where(tiny, np.float32(PRE_TINY), np.float32(1)).astype(np.float32)
        inv = np.where(tiny, q / (a * pre), inv).astype(np.float32)
    return tuple(torch.from_numpy(v).to(absmax.device) for v in (pre, inv, scale))


def quantize_tiles(
    x: torch.Tensor,
    bits: int,
    tile: tuple[int, int],
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-d x with one scale per tile (see the module doc).

    Returns ``(q, scale)``: q int8 of x's shape, scale float32
    ``[ceil(rows / tile_rows), ceil(cols / tile_cols)]`` (``dequantize_tiles`` expands it)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2-d tensor, got {shape}")
    tile = check_tile(tile, x.shape)
    xf, bits, rounding, seed = checked_quantize_args(x, bits, rounding, seed, offset)
    qmax = qmax_for(bits)
    absmax = _tile_absmax(xf, tile)
    if xf.numel() and not bool(torch.isfinite(absmax).all()):
        raise ValueError("x contains NaN or Inf; quantization needs finite values")
    pre, inv, scale = tile_scale_params(absmax, qmax)
    if xf.numel() == 0:
        return torch.empty(xf.shape, dtype=torch.int8, device=xf.device), scale
    v = (xf * _expand(pre, tile, xf.shape)) * _expand(inv, tile, xf.shape)
    if rounding == "nearest":
        r = torch.round(v)
    else:
        u = counter_uniform(xf.numel(), seed, offset, device=xf.device).reshape(xf.shape)
        r = torch.floor(v + u)
    return torch.clamp(r, -qmax, qmax).to(torch.int8), scale


def quantize_rows_symmetric(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_tiles` with one tile a row: ``(q, scale [rows, 1])``. A tensor without
    columns has all-zero scales (a row with nothing in it has range 0)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2-d tensor, got {shape}")
    if x.shape[1] == 0:
        checked_quantize_args(x, bits, rounding, seed, offset)
        rows = x.shape[0]
        return (
            torch.empty((rows, 0), dtype=torch.int8, device=x.device),
            torch.zeros((rows, 1), dtype=torch.float32, device=x.device),
        )
    return quantize_tiles(x, bits, (1, x.shape[1]), rounding, seed, offset)


def quantize_cols_symmetric(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_tiles` with one tile a column: ``(q, scale [1, cols])``, q in x's own
    layout (a column is quantize_symmetric of that column, its counters those of its
    elements' flat indices in x). A tensor without rows has all-zero scales."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2-d tensor, got {shape}")
    if x.shape[0] == 0:
        checked_quantize_args(x, bits, rounding, seed, offset)
        cols = x.shape[1]
        return (
            torch.empty((0, cols), dtype=torch.int8, device=x.device),
            torch.zeros((1, cols), dtype=torch.float32, device=x.device),
        )
    return quantize_tiles(x, bits, (x.shape[0], 1), rounding, seed, offset)


def quantize_col_blocks(
    x: torch.Tensor,
    bits: int,
    block: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_tiles` with one tile per block of ``block`` rows of a column: ``(q,
    scale [ceil(rows / block), cols])``, q in x's own layout (``[0, cols]`` scales without
    rows). ``block`` a positive int."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2-d tensor, got {shape}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if x.shape[0] == 0:
        checked_quantize_args(x, bits, rounding, seed, offset)
        return (
            torch.empty((0, x.shape[1]), dtype=torch.int8, device=x.device),
            torch.zeros((0, x.shape[1]), dtype=torch.float32, device=x.device),
        )
    return quantize_tiles(x, bits, (block, 1), rounding, seed, offset)


def dequantize_tiles(q: torch.Tensor, scale: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """float32 ``q * scale`` with each tile's scale (the inverse of :func:`quantize_tiles`)."""
    tile = check_tile(tile, q.shape)
    return q.to(torch.float32) * _expand(scale, tile, q.shape)


def hadamard_matrix(n: int) -> torch.Tensor:
    """The orthonormal n x n Walsh-Hadamard matrix (Sylvester's construction), float32;
    n a power of two."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"the Hadamard block must be a power of two >= 1, got {n!r}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / np.sqrt(n)).to(torch.float32)


def hadamard_rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    """x's last dimension padded with zeros to a multiple of ``block`` and multiplied by the
    block-diagonal Hadamard matrix (each run of ``block`` values by ``hadamard_matrix``)."""
    h = hadamard_matrix(block).to(x.device)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    width = x.shape[-1]
    padded = torch.nn.functional.pad(x.to(torch.float32), (0, -width % block))
    blocks = padded.reshape(*x.shape[:-1], padded.shape[-1] // block, block)
    return (blocks @ h).reshape(padded.shape)
