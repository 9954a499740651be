"""Counter-based uniform random numbers, the reference for ``ext/qtrain_rng.h``.

Element ``i`` is a pure function of ``(seed, offset + i)``: no generator state,
so a kernel can draw any element from any thread in any order and still agree
bit for bit with this module (stochastic rounding must not change with the
thread count, and tests compare backends exactly). The construction::

    hash32(x)  = lowbias32: x ^= x>>16; x *= 0x21f0aaad; x ^= x>>15;
                 x *= 0x735a2d97; x ^= x>>15                    (mod 2^32)
    seed (u64) -> s_lo, s_hi; k1 = hash32(s_lo ^ hash32(s_hi ^ 0x9e3779b9))
                              k2 = hash32(k1 ^ 0x85ebca6b)
    counter c (u64) -> lo, hi; h = hash32(hash32(lo ^ k1) ^ hash32(hi ^ k2))
    u = (h >> 8) / 2^24                                         in [0, 1)

Counters are 64-bit, so streams longer than 2^32 elements (a 6e9-element
tensor) never wrap. The torch code uses int64 tensors holding values below
2^32, explicit masks, and 32x16-bit partial products, so no step relies on
signed overflow or on ``>>`` being logical (torch's is arithmetic on int64).
"""

from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
_M1 = 0x21F0AAAD
_M2 = 0x735A2D97
_SEED_SALT = 0x9E3779B9
_KEY2_SALT = 0x85EBCA6B
_MAX_COUNTER = 2**63 - 1  # counters are int64 in torch and in the C++ checks


def hash32_int(x: int) -> int:
    """lowbias32 on a Python int (mod 2^32); used for per-call keys."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 15
    x = (x * _M2) & MASK32
    x ^= x >> 15
    return x


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 ``x`` in [0, 2^32) without int64 overflow."""
    lo = x * (c & 0xFFFF)  # < 2^48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # only the low 16 bits survive the shift
    return (lo + hi) & MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 elementwise on an int64 tensor of values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 15)


def normalize_seed(seed: object) -> int:
    """A seed as the unsigned 64-bit value every backend uses (any int, taken mod 2^64)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return int(seed) % 2**64


def op_seed(seed: object) -> int:
    """A seed's 64 bits as the signed int64 a torch op schema carries (the kernels read
    them back as unsigned): what the ops of ``torch.ops.qtrain`` take."""
    seed = normalize_seed(seed)
    return seed - 2**64 if seed >= 2**63 else seed


def seed_keys(seed: int) -> tuple[int, int]:
    """The two 32-bit round keys of a seed (any Python int, taken mod 2^64)."""
    seed = normalize_seed(seed)
    k1 = hash32_int((seed & MASK32) ^ hash32_int((seed >> 32) ^ _SEED_SALT))
    k2 = hash32_int(k1 ^ _KEY2_SALT)
    return k1, k2


def check_counter_range(n: int, offset: int) -> None:
    """Raise ValueError unless offset >= 0 and offset + n <= 2^63 - 1 (as the C++ side checks)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    if offset + n > _MAX_COUNTER:
        raise ValueError(f"offset + n must stay below 2^63, got offset {offset} and n {n}")


def counter_bits(
    n: int, seed: int = 0, offset: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The 32-bit hashes h_i (int64 tensor of values in [0, 2^32)) for counters offset + i."""
    check_counter_range(n, offset)
    return counter_bits_at(
        torch.arange(int(n), dtype=torch.int64, device=device) + int(offset), seed
    )


def counter_bits_at(counters: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The 32-bit hashes (int64 values in [0, 2^32)) at arbitrary int64 ``counters`` >= 0."""
    if counters.dtype != torch.int64:
        raise TypeError(f"counters must be int64, got {counters.dtype}")
    k1, k2 = seed_keys(seed)
    lo = counters & MASK32
    if counters.numel() == 0:
        return lo
    # the high word takes few distinct values (one per 2^32 counters): hash a table of them
    hi = counters >> 32
    hi_first, hi_last = int(hi.min()), int(hi.max())
    hi_keys = hash32(
        torch.arange(hi_first, hi_last + 1, dtype=torch.int64, device=counters.device) ^ k2
    )
    kh = hi_keys[hi - hi_first] if hi_last > hi_first else hi_keys[0]
    return hash32(hash32(lo ^ k1) ^ kh)


def counter_uniform(
    n: int, seed: int = 0, offset: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """n float32 uniforms in [0, 1) with 24 random bits; element i depends only on (seed, offset + i)."""
    h = counter_bits(n, seed, offset, device)
    return (h >> 8).to(torch.float32) * (2.0**-24)
