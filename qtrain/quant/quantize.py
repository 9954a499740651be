"""Symmetric per-tensor quantization (tango-sc23 section 2.3 and eq. 1-3): the reference.

Every compiled backend must reproduce :func:`quantize_symmetric` bit for bit,
so each step is spelled out as the float32 operation it is::

    qmax   = 2^(B-1) - 1                   B in 2..8; levels -qmax..qmax (Z = 0)
    absmax = max |x|
    inv    = fl32(qmax / absmax)           0 when absmax == 0
    nearest:    q = round(fl32(x * inv))                 ties to even (torch.round)
    stochastic: q = floor(fl32(fl32(x * inv) + u_i))      u_i = counter_uniform(seed, offset + i)
    q      = clamp(q, -qmax, qmax) as int8
    scale  = fl32(absmax / qmax)           x ~ q * scale (eq. 2)

``floor(v + u)`` with u uniform in [0, 1) rounds up with probability
``v - floor(v)``: eq. 3, so the rounding is unbiased. If ``qmax / absmax``
overflows float32 (absmax below about 1e-37) x and absmax are first multiplied
by 2^64, which is exact, so tiny tensors still use every level. Tensors with NaN
or Inf are refused: they have no finite scale.
"""

from __future__ import annotations

import numpy as np
import torch

from qtrain.quant.rng import check_counter_range, counter_uniform, normalize_seed

MIN_BITS = 2
MAX_BITS = 8
ROUNDINGS = ("nearest", "stochastic")
ERROR_X_EPS = 5e-4
PRE_TINY = 2.0**64


def check_bits(bits: object) -> int:
    """Return ``bits`` if it is an int in 2..8, else raise ValueError naming the range."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise ValueError(
            f"bits must be an integer in {MIN_BITS}..{MAX_BITS}, got {bits!r} "
            f"({type(bits).__name__})"
        )
    if not MIN_BITS <= int(bits) <= MAX_BITS:
        raise ValueError(f"bits must be an integer in {MIN_BITS}..{MAX_BITS}, got {bits}")
    return int(bits)


def check_rounding(rounding: object) -> str:
    """Return ``rounding`` if it is 'nearest' or 'stochastic', else raise ValueError."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of 'nearest', 'stochastic', got {rounding!r}")
    return str(rounding)


def stochastic(rounding: object) -> bool:
    """The compiled ops' flag for ``rounding`` (they take a bool), checked on the way: the
    Python front is where the name enters the op library."""
    return check_rounding(rounding) == "stochastic"


def qmax_for(bits: int) -> int:
    """Largest quantized magnitude for ``bits`` bits: 2^(bits-1) - 1 (symmetric, no -2^(bits-1))."""
    return (1 << (check_bits(bits) - 1)) - 1


def as_float32(x: torch.Tensor) -> torch.Tensor:
    """x as float32; other float dtypes are converted, the rest refused with TypeError."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    return x.detach().to(torch.float32)


def scale_params(absmax: float, qmax: int) -> tuple[float, float, float]:
    """(pre, inv, scale) as float32 values, exactly as every backend computes them.

    Division is done in numpy float32 (IEEE, correctly rounded) rather than
    through a torch kernel that might multiply by a reciprocal.
    """
    a = np.float32(absmax)
    with np.errstate(over="ignore", divide="ignore"):
        scale = float(a / np.float32(qmax))
        if a == 0:
            return 1.0, 0.0, scale
        pre = np.float32(1.0)
        inv = np.float32(qmax) / a
        if not np.isfinite(inv):
            pre = np.float32(PRE_TINY)
            inv = np.float32(qmax) / (a * pre)
    return float(pre), float(inv), scale


def quantize_symmetric(
    x: torch.Tensor,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x to ``bits`` bits with one scale for the whole tensor.

    Returns ``(q, scale)``: ``q`` int8 of x's shape (values in [-qmax, qmax]),
    ``scale`` a float32 0-d tensor with ``x ~ q * scale``. Stochastic rounding
    uses counters ``offset .. offset + numel - 1`` of stream ``seed``, so the
    caller picks disjoint offsets for tensors that must not share randomness.
    """
    xf, bits, rounding, seed = checked_quantize_args(x, bits, rounding, seed, offset)
    absmax = xf.abs().max().item() if xf.numel() else 0.0  # scale 0 for an empty x
    if not np.isfinite(absmax):
        raise ValueError("x contains NaN or Inf; quantization needs finite values")
    return _quantize_checked(xf, absmax, bits, rounding, seed, offset)


def quantize_with_absmax(
    x: torch.Tensor,
    absmax: float,
    bits: int,
    rounding: str = "nearest",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_symmetric`'s rule with a given range instead of max |x|.

    Values beyond ``absmax`` clamp to +-qmax (a fused GEMM quantizes its operand
    with a range computed earlier). With ``absmax = max |x|`` this is
    ``quantize_symmetric`` bit for bit; an empty x gets the scale of ``absmax``.
    """
    xf, bits, rounding, seed = checked_quantize_args(x, bits, rounding, seed, offset)
    return _quantize_checked(xf, absmax, bits, rounding, seed, offset)


def checked_quantize_args(
    x: torch.Tensor, bits: int, rounding: str, seed: int, offset: int
) -> tuple[torch.Tensor, int, str, int]:
    """(float32 x, bits, rounding, seed) validated, the counter range included for both
    roundings, as the compiled backends do."""
    bits = check_bits(bits)
    rounding = check_rounding(rounding)
    xf = as_float32(x)
    seed = normalize_seed(seed)
    check_counter_range(xf.numel(), offset)
    return xf, bits, rounding, seed


def _quantize_checked(
    xf: torch.Tensor, absmax: float, bits: int, rounding: str, seed: int, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The symmetric rounding rule on arguments :func:`checked_quantize_args` has validated."""
    qmax = qmax_for(bits)
    n = xf.numel()
    pre, inv, scale = scale_params(absmax, qmax)
    scale_t = torch.tensor(scale, dtype=torch.float32, device=xf.device)
    if n == 0:
        return torch.empty(xf.shape, dtype=torch.int8, device=xf.device), scale_t
    if pre != 1.0:
        xf = xf * pre
    v = xf * inv
    if rounding == "nearest":
        r = torch.round(v)
    else:
        u = counter_uniform(n, seed, offset, device=xf.device).reshape(xf.shape)
        r = torch.floor(v + u)
    return torch.clamp(r, -qmax, qmax).to(torch.int8), scale_t


def dequantize(q: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """float32 values ``q * scale`` (tango eq. 2 with zero point 0)."""
    return q.to(torch.float32) * scale


def error_x(x: torch.Tensor, x_hat: torch.Tensor, eps: float = ERROR_X_EPS) -> float:
    """Tango's relative quantization error, eq. 4 (what ``bits = "auto"`` calibrates on).

    ``Error_X = (1/N) * sum_i | (X_i - X_i,Quant) / (X_i + X_i,Quant + eps) |``
    with ``x_hat`` the dequantized values and eps = 0.0005 as in the paper.
    The denominator adds x and x_hat (same sign under symmetric quantization)
    so a small absolute error on a tiny value does not blow up, and eps avoids
    0/0 where both are zero. Mostly in [0, 1]; it can exceed 1 only for
    negative values within about eps of zero. Computed in float64; 0.0 for
    an empty tensor.
    """
    if x.shape != x_hat.shape:
        raise ValueError(
            f"x and x_hat must have the same shape, got {tuple(x.shape)} and {tuple(x_hat.shape)}"
        )
    if x.numel() == 0:
        return 0.0
    a = x.detach().to(torch.float64)
    b = x_hat.detach().to(torch.float64)
    return float(((a - b) / (a + b + eps)).abs().mean().item())
