"""Normalized Rademacher random projection (exact-iclr22 section 3.2, appendix D): the reference.

``R`` is a ``[D, K]`` matrix whose entries are ``+1/sqrt(K)`` or ``-1/sqrt(K)``
with equal probability, so ``E[R R^T] = I`` and ``h -> (h R) R^T`` is an
unbiased estimate of ``h`` (Proposition 2). It is never stored: entry
``(d, k)`` is a pure function of ``(seed, offset + d*K + k)`` through the
counter generator (sign = the top bit of the 32-bit hash), so backward
regenerates exactly the matrix forward used. The products themselves are
dense float32 GEMMs and run on torch's BLAS.
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
