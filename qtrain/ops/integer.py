"""Integer-only numerics of GCINT (``../shared/papers/gcint.txt``, sections 3.2-3.6).

Every tensor of an integer GCN step is int8 between the products and int32 inside
them: a product's int32 result goes back to int8 by keeping a 7-bit window of its
magnitudes and the sign, the window chosen per tensor.

* :func:`dyq` (the paper's DyQ, equations 2-4): the window ``[k, k + 6]`` of bit
  positions that holds the most nonzero magnitudes (``g(k)``, over ``k = 0 .. 25``;
  ties go to the lowest ``k``, which loses the fewest small values);
* :func:`stq` (StQ): the fixed window ``k = 7`` (the int8 x int8 product's bits
  7 .. 13, as if both operands were fractions of 127);
* :func:`quantize_weights` (Q_w, equation 7): ``ceil(w * 127 / max|w|)``;
* :func:`int_gemm` and :func:`int_spmm`: int8 operands, exact int32 sums.

Choices the paper leaves open, and why:

* Rounding inside the window: to nearest (add ``2^(k-1)``, then shift), in integers.
  Equation 3 truncates (keeps bits ``k .. k+6``) and equation 4 takes the ceiling;
  they disagree, and both are biased; round-to-nearest costs one add.
* Saturation: a magnitude at or above ``2^(k+7)`` becomes 127 (equation 3's
  ``7'b1111111``), so int8 holds ``-127 .. 127`` and negation never overflows.
* The histogram counts the position of each magnitude's leading one (equation 2's
  ``f(2^x)``: values in ``[2^x, 2^(x+1))``, both signs); zeros fall in no bin.
* An all-zero tensor has ``k = 0`` and stays zero.

The functions are the pure-PyTorch definitions (the op library's kernels for the
sparse product and the requantization are still to come: issue 28); the int8 x int8
dense product runs on ``torch._int_mm`` (oneDNN's int8 kernels on the CPU, cuBLASLt on
CUDA, with operands zero-padded to its shape rules there). Each call is counted in the
run's ``kernels`` table (``int_gemm``, ``int_spmm``, ``requantize``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from qtrain.ops import dispatch

INT8_MAX = 127
WINDOW = 7  # magnitude bits of an int8 (the sign is the eighth)
MAX_SHIFT = 25  # equation 2: k = 0 .. 25, so the window's top bit is at most 31
STATIC_SHIFT = 7  # StQ: DyQ with k fixed at 7


def _check_int(fn: str, x: Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(x, Tensor) or x.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{fn}: expects an {names} tensor, got {got}")


def msb_histogram(x: Tensor) -> Tensor:
    """int64 ``[32]``: how many elements of int32 ``x`` have their magnitude's leading one
    at bit ``i`` (``|x|`` in ``[2^i, 2^(i+1))``); zeros are not counted. Bin 31 holds
    only ``-2^31``."""
    _check_int("msb_histogram", x, (torch.int32,))
    magnitude = x.to(torch.int64).abs()
    nonzero = magnitude[magnitude > 0]
    if nonzero.numel() == 0:
        return torch.zeros(32, dtype=torch.int64, device=x.device)
    # the leading one's position: float64 holds every int32 magnitude exactly, and
    # frexp's exponent is that position plus one, without rounding near powers of two
    _, exponent = torch.frexp(nonzero.to(torch.float64))
    return torch.bincount(exponent.to(torch.int64) - 1, minlength=32)


def dyq_shift(x: Tensor) -> int:
    """DyQ's ``k``: the start of the 7-bit window of bit positions holding the most
    nonzero magnitudes of int32 ``x`` (equation 2), the lowest ``k`` on ties."""
    hist = msb_histogram(x)
    windows = hist.unfold(0, WINDOW, 1)[: MAX_SHIFT + 1].sum(dim=1)
    return int(torch.argmax(windows))  # the first maximum: the lowest k


def requantize(x: Tensor, shift: int) -> Tensor:
    """int32 ``x`` to int8 through the window ``[shift, shift + 6]``: the magnitude
    rounded to nearest at bit ``shift``, saturated at 127, the sign kept."""
    _check_int("requantize", x, (torch.int32,))
    if not 0 <= shift <= MAX_SHIFT:
        raise ValueError(f"requantize: shift must be in 0..{MAX_SHIFT}, got {shift}")
    with dispatch.call("requantize", "reference"):
        return _requantize(x, shift)


def _requantize(x: Tensor, shift: int) -> Tensor:
    magnitude = x.to(torch.int64).abs()
    if shift > 0:
        magnitude = (magnitude + (1 << (shift - 1))) >> shift
    magnitude = magnitude.clamp(max=INT8_MAX)
    return torch.where(x < 0, -magnitude, magnitude).to(torch.int8)


def dyq(x: Tensor) -> tuple[Tensor, int]:
    """Dynamic quantization (DyQ): int32 ``x`` to int8 through its fullest 7-bit
    window; returns the int8 tensor and the window's ``k``."""
    shift = dyq_shift(x)
    return requantize(x, shift), shift


def stq(x: Tensor) -> Tensor:
    """Static quantization (StQ): int32 ``x`` to int8 through the window at bit 7."""
    return requantize(x, STATIC_SHIFT)


def quantize_weights(w: Tensor) -> Tensor:
    """Q_w (equation 7): int32 master weights to int8, ``ceil(w * 127 / max|w|)``,
    computed in integers; all-zero weights stay zero."""
    _check_int("quantize_weights", w, (torch.int32,))
    wide = w.to(torch.int64)
    top = wide.abs().max().clamp(min=1) if wide.numel() else torch.ones((), dtype=torch.int64)
    scaled = wide * INT8_MAX
    up = torch.where(scaled >= 0, (scaled + top - 1) // top, -((-scaled) // top))
    return up.to(torch.int8)


def _padded_for_int_mm(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Zero rows and columns that meet torch._int_mm's rules on CUDA (cuBLASLt: M > 16,
    K and N multiples of 8); zeros add nothing to the sums, and the caller slices the
    result back."""
    m, k = a.shape
    n = b.shape[1]
    pad_m, pad_k, pad_n = max(0, 17 - m), (-k) % 8, (-n) % 8
    if pad_m or pad_k:
        a = torch.nn.functional.pad(a, (0, pad_k, 0, pad_m))
    if pad_k or pad_n:
        b = torch.nn.functional.pad(b, (0, pad_n, 0, pad_k))
    return a, b


def int_gemm(a: Tensor, b: Tensor) -> Tensor:
    """int8 ``a [M, K]`` times int8 ``b [K, N]``, exact int32 ``[M, N]``."""
    _check_int("int_gemm", a, (torch.int8,))
    _check_int("int_gemm", b, (torch.int8,))
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"int_gemm: needs [M, K] @ [K, N], got {list(a.shape)} @ {list(b.shape)}")
    rows, cols = a.shape[0], b.shape[1]
    if rows == 0 or cols == 0 or a.shape[1] == 0:
        return torch.zeros(rows, cols, dtype=torch.int32, device=a.device)
    if a.device.type == "cuda":
        a, b = _padded_for_int_mm(a, b)
    with dispatch.call("int_gemm", "torch._int_mm"):
        out = torch._int_mm(a.contiguous(), b.contiguous())
    return out[:rows, :cols]


def int_spmm(src: Tensor, dst: Tensor, values: Tensor, x: Tensor, rows: int) -> Tensor:
    """``out[d] = sum over edges e with dst[e] = d of values[e] * x[src[e]]``: int8 edge
    values and rows, exact int32 ``[rows, width]`` (the sparse product of equation 1)."""
    _check_int("int_spmm", values, (torch.int8,))
    _check_int("int_spmm", x, (torch.int8,))
    if src.shape != dst.shape or values.shape != src.shape or src.dim() != 1:
        raise ValueError("int_spmm: src, dst and values must be 1-d and of one length")
    out = torch.zeros(rows, x.shape[1], dtype=torch.int32, device=x.device)
    with dispatch.call("int_spmm", "reference"):
        if src.numel():
            messages = values.to(torch.int32).unsqueeze(1) * x.to(torch.int32)[src]
            out.index_add_(0, dst, messages)
    return out
