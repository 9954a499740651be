"""Normalized Rademacher random projection (exact-iclr22 section 3.2, appendix D): the reference.

``R`` is a ``[D, K]`` matrix whose entries are ``+1/sqrt(K)`` or ``-1/sqrt(K)``
with equal probability, so ``E[R R^T] = I`` and ``h -> (h R) R^T`` is an
unbiased estimate of ``h`` (Proposition 2). It is never stored: entry
``(d, k)`` is a pure function of ``(seed, offset + d*K + k)`` through the
counter generator (sign = the top bit of the 32-bit hash), so backward
regenerates exactly the matrix forward used.

The products (:func:`project_rows`, ``h R``, and :func:`unproject_rows`,
``y R^T``) have one fixed float32 order, so a compiled kernel can fuse them
with quantization and still agree bit for bit: every entry is ``+-s`` with
``s = fl32(1/sqrt(K))``, so an output is ``fl32(s * acc)`` where ``acc`` adds
the inputs, each with its sign flipped where the entry is negative (exact), one
after the other in input order, starting from +0. It is the same matrix
product, rounded once less per term than a BLAS GEMM on ``R``.
"""

from __future__ import annotations

import math

import torch

from qtrain.quant.rng import check_counter_range, counter_bits, normalize_seed


def projected_width(width: int, ratio: int) -> int:
    """K for a D/K ratio: ceil(width / ratio), at least 1."""
    return max(1, -(-width // ratio))


def rademacher_scale(k: int) -> float:
    """The entries' magnitude, fl32(1 / sqrt(k))."""
    return float(torch.tensor(1.0 / math.sqrt(k), dtype=torch.float32))


def rademacher(d: int, k: int, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """The float32 ``[d, k]`` normalized Rademacher matrix of stream ``seed`` at ``offset``."""
    if d < 0 or k < 1:
        raise ValueError(f"need d >= 0 and k >= 1, got d={d}, k={k}")
    seed = normalize_seed(seed)
    check_counter_range(d * k, offset)
    h = counter_bits(d * k, seed, offset)
    mag = rademacher_scale(k)
    signs = torch.where(h >= 2**31, -mag, mag).to(torch.float32)
    return signs.reshape(d, k)


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32 or t.dim() != 2:
        raise TypeError(
            f"{name} must be a 2-d float32 tensor [rows, width], got {t.dtype} {tuple(t.shape)}"
        )


def _signed_sums(x: torch.Tensor, signs: torch.Tensor, scale: float) -> torch.Tensor:
    """``fl32(scale * acc)``: ``acc`` adds ``x [rows, n_in]`` times ``signs [n_in, n_out]``
    (+-1: exact) one input at a time, from +0."""
    acc = torch.zeros(x.shape[0], signs.shape[1], dtype=torch.float32, device=x.device)
    signs = signs.to(x.device)
    for i in range(x.shape[1]):
        acc = acc + x[:, i : i + 1] * signs[i]
    return acc * scale


def project_rows(x: torch.Tensor, k: int, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """``x [rows, d] @ R [d, k]`` in the fixed order of the module docstring."""
    _check_rows("x", x)
    signs = rademacher(x.shape[1], k, seed, offset).sign()
    return _signed_sums(x, signs, rademacher_scale(k))


def unproject_rows(y: torch.Tensor, d: int, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """``y [rows, k] @ R^T`` back to ``d`` columns (``R`` is ``[d, k]``), in the fixed order."""
    _check_rows("y", y)
    signs = rademacher(d, y.shape[1], seed, offset).sign()
    return _signed_sums(y, signs.t(), rademacher_scale(y.shape[1]))
