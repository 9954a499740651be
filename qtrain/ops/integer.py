"""Integer-only numerics of GCINT (``../shared/papers/gcint.txt``, sections 3.2-3.6).

Every tensor of an integer GCN step is int8 between the products and int32 inside
them: a product's int32 result goes back to int8 by keeping a 7-bit window of its
magnitudes and the sign, the window chosen per tensor.

* :func:`dyq` (the paper's DyQ, equations 2-4): the window ``[k, k + 6]`` of bit
  positions that holds the most nonzero magnitudes (``g(k)``, over ``k = 0 .. 25``;
  ties go to the lowest ``k``, which loses the fewest small values);
  with ``tail=t``, the lowest window that saturates at most one nonzero magnitude in
  ``2^t`` (not the paper's: ``train.gcint_quantizer = "dyq-bounded"``, whose reason is in
  ``qtrain/models/integer_gcn.py``);
* :func:`stq` (StQ): the fixed window ``k = 7`` (the int8 x int8 product's bits
  7 .. 13, as if both operands were fractions of 127);
* :func:`row_window` (not the paper's): each row of a matrix through its own window, the
  lowest that saturates nothing (the softmax loss reads the logits so; its reason is in
  ``qtrain/models/integer_gcn.py``);
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
* A product whose exact sum leaves int32 (more than 131071 terms of 127 x 127)
  saturates at the int32 limits rather than wrapping: DyQ then sees it in the top bins.

The ``reference_*`` functions are the pure-PyTorch definitions. The public functions run
the op library's kernels (``torch.ops.qtrain.int8_gemm_int32`` / ``int8_spmm`` /
``requantize`` / ``dyq``: VNNI on the CPU, tensor cores on CUDA; ``ext/README.md``) when
they are built for the tensors' device, else the reference, through
``qtrain.ops.dispatch`` like every primitive: each call is counted in the run's
``kernels`` table (``int_gemm``, ``int_spmm``, ``requantize``, ``dyq``) with the backend
that served it. DyQ's window is chosen on the tensor's device, so a CUDA step never
waits for the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qtrain.ops import dispatch

INT8_MAX = 127
INT32_MAX = 2**31 - 1
WINDOW = 7  # magnitude bits of an int8 (the sign is the eighth)
MAX_SHIFT = 25  # equation 2: k = 0 .. 25, so the window's top bit is at most 31
STATIC_SHIFT = 7  # StQ: DyQ with k fixed at 7
MAX_TAIL = 24  # dyq's tail: a count (< 2^39) times 2^tail stays within int64


INT_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")  # compiled backends of every op here
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check_int(fn: str, x: object, dtypes: tuple[torch.dtype, ...]) -> Tensor:
    if not isinstance(x, Tensor) or x.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{fn}: expects an {names} tensor, got {got}")
    return x


def _check_shift(fn: str, shift: object) -> int:
    if isinstance(shift, bool) or not isinstance(shift, int) or not 0 <= shift <= MAX_SHIFT:
        raise ValueError(f"{fn}: shift must be an integer in 0..{MAX_SHIFT}, got {shift!r}")
    return shift


# --------------------------------------------------------------------------- references


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


def window_shift(hist: Tensor, tail: int | None = None) -> Tensor:
    """DyQ's ``k`` from an MSB histogram; an int64 0-d tensor.

    ``tail=None`` (equation 2): the start of the 7-bit window that holds the most nonzero
    magnitudes, the lowest ``k`` on ties. ``tail=t``: the lowest ``k`` that saturates at
    most one nonzero magnitude in ``2^t`` (those with their leading one at bit ``k + 7`` or
    above), so the largest values keep their size and only a bounded tail is clipped."""
    if tail is None:
        windows = hist.unfold(0, WINDOW, 1)[: MAX_SHIFT + 1].sum(dim=1)
        return torch.argmax(windows)  # the first maximum: the lowest k
    # above[j] = how many magnitudes have their leading one at bit j or higher
    above = torch.flip(torch.cumsum(torch.flip(hist, [0]), 0), [0])
    saturated = torch.cat([above[WINDOW:], above.new_zeros(WINDOW)])[: MAX_SHIFT + 1]
    fits = (saturated << tail) <= above[0]
    return torch.argmax(fits.to(torch.int64))  # the first k that fits (k = 25 always does)


def divide_pow2(x: Tensor, shift: int) -> Tensor:
    """``x / 2^shift`` in ``x``'s integer dtype: the magnitude rounded to nearest at bit
    ``shift`` (halves away from zero), the sign kept; the rounding every window here uses.
    The caller leaves the magnitude one bit of headroom (the half added before the shift)."""
    if shift <= 0:
        return x
    magnitude = (x.abs() + (1 << (shift - 1))) >> shift
    return torch.where(x < 0, -magnitude, magnitude)


def reference_requantize(x: Tensor, shift: int) -> Tensor:
    """int32 ``x`` to int8 through the window ``[shift, shift + 6]``: the magnitude
    rounded to nearest at bit ``shift``, saturated at 127, the sign kept."""
    return divide_pow2(x.to(torch.int64), shift).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def reference_dyq(x: Tensor, tail: int | None = None) -> tuple[Tensor, Tensor]:
    """DyQ by its definition: the histogram, the window (``window_shift``), the
    requantization."""
    shift = window_shift(msb_histogram(x), tail)
    return reference_requantize(x, int(shift)), shift


def reference_int_gemm(a: Tensor, b: Tensor, layout: str = "nn") -> Tensor:
    """The exact product in float64 (every partial sum of int8 products is an integer
    below 2^53, so any summation order is exact), saturated to int32."""
    a = a.t() if layout == "tn" else a
    b = b.t() if layout == "nt" else b
    out = a.to(torch.float64) @ b.to(torch.float64)
    return out.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32)


def reference_int_spmm(indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor) -> Tensor:
    """``out[r] = sum over k in indptr[r] .. indptr[r + 1] of values[k] * x[indices[k]]``,
    summed in int64 and saturated to int32."""
    rows = indptr.numel() - 1
    out = torch.zeros(rows, x.shape[1], dtype=torch.int64, device=x.device)
    if indices.numel():
        row_of = torch.repeat_interleave(
            torch.arange(rows, device=x.device), indptr[1:] - indptr[:-1]
        )
        messages = values.to(torch.int64).unsqueeze(1) * x.to(torch.int64)[indices.long()]
        out.index_add_(0, row_of, messages)
    return out.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32)


# --------------------------------------------------------------------------- public ops


def requantize(x: Tensor, shift: int, backend: str = "auto") -> Tensor:
    """int32 ``x`` to int8 through the window ``[shift, shift + 6]`` (StQ's rule)."""
    _check_int("requantize", x, (torch.int32,))
    shift = _check_shift("requantize", shift)
    chosen = dispatch.resolve("requantize", x, backend, kernels=INT_KERNELS)
    with dispatch.call("requantize", chosen):
        if chosen == "reference":
            return reference_requantize(x, shift)
        return torch.ops.qtrain.requantize(x, shift)


def dyq(x: Tensor, backend: str = "auto", *, tail: int | None = None) -> tuple[Tensor, Tensor]:
    """Dynamic quantization (DyQ): int32 ``x`` to int8 through its fullest 7-bit window, or
    with ``tail=t`` the lowest window that saturates at most one value in ``2^t``
    (``window_shift``); returns the int8 tensor and the window's ``k`` (int64 0-d, on
    ``x``'s device)."""
    _check_int("dyq", x, (torch.int32,))
    if tail is not None and (
        isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= MAX_TAIL
    ):
        raise ValueError(f"dyq: tail must be None or an integer in 0..{MAX_TAIL}, got {tail!r}")
    chosen = dispatch.resolve("dyq", x, backend, kernels=INT_KERNELS)
    with dispatch.call("dyq", chosen):
        if chosen == "reference":
            return reference_dyq(x, tail)
        return torch.ops.qtrain.dyq(x, tail)


def dyq_shift(x: Tensor) -> int:
    """DyQ's ``k`` for int32 ``x`` (equation 2), the lowest ``k`` on ties."""
    _check_int("dyq_shift", x, (torch.int32,))
    return int(window_shift(msb_histogram(x)))


def stq(x: Tensor, backend: str = "auto") -> Tensor:
    """Static quantization (StQ): int32 ``x`` to int8 through the window at bit 7."""
    return requantize(x, STATIC_SHIFT, backend)


def row_window(x: Tensor) -> Tensor:
    """int32 ``[rows, C]`` to int8, each row through its own window: the lowest ``k`` at
    which the row's largest magnitude fits 7 bits (before rounding), rounded to nearest
    as ``requantize`` rounds, saturated at 127. A row of zeros stays zero; ``-2^31`` is
    read as ``-(2^31 - 1)`` (its magnitude has no int32).

    Integer operations only (compares, shifts) on ``x``'s device, no host sync, in int32
    throughout; a small tensor (the logits of a batch), so no kernel of its own."""
    _check_int("row_window", x, (torch.int32,))
    if x.dim() != 2:
        raise ValueError(f"row_window: x must be a matrix [rows, C], got {x.dim()} dimensions")
    x = x.clamp(min=-INT32_MAX)
    magnitude = x.abs()
    top = magnitude.amax(dim=1, keepdim=True) if x.shape[1] else magnitude.sum(1, keepdim=True)
    # k = how many of 2^7, 2^8, ..., 2^31 the row's largest magnitude reaches
    limits = torch.tensor([1 << (WINDOW + j) for j in range(MAX_SHIFT)], device=x.device)
    shift = (top.to(torch.int64) >= limits).sum(dim=1, keepdim=True).to(torch.int32)
    # to nearest without overflow: keep one bit below the window, add it, drop it
    kept = torch.bitwise_right_shift(magnitude, (shift - 1).clamp(min=0))
    rounded = torch.where(shift > 0, torch.bitwise_right_shift(kept + 1, 1), kept)
    small = rounded.clamp_(max=INT8_MAX).to(torch.int8)
    return torch.where(x < 0, -small, small)


def quantize_weights(w: Tensor) -> Tensor:
    """Q_w (equation 7): int32 master weights to int8, ``ceil(w * 127 / max|w|)``,
    computed in integers; all-zero weights stay zero."""
    _check_int("quantize_weights", w, (torch.int32,))
    wide = w.to(torch.int64)
    top = wide.abs().max().clamp(min=1) if wide.numel() else torch.ones((), dtype=torch.int64)
    scaled = wide * INT8_MAX
    up = torch.where(scaled >= 0, (scaled + top - 1) // top, -((-scaled) // top))
    return up.to(torch.int8)


_LAYOUTS = ("nn", "nt", "tn")


def int_gemm(a: Tensor, b: Tensor, layout: str = "nn", backend: str = "auto") -> Tensor:
    """int8 ``a`` times int8 ``b``, exact int32 (saturated): ``"nn"`` ``a [M, K] @ b [K, N]``,
    ``"nt"`` ``a @ b[N, K]^T``, ``"tn"`` ``a[K, M]^T @ b`` (the transposes are read in
    place, never copied)."""
    _check_int("int_gemm", a, (torch.int8,))
    _check_int("int_gemm", b, (torch.int8,))
    if layout not in _LAYOUTS:
        raise ValueError(f"int_gemm: layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    inner_a = a.shape[0] if layout == "tn" else a.shape[-1]
    inner_b = b.shape[-1] if layout == "nt" else b.shape[0]
    if a.dim() != 2 or b.dim() != 2 or inner_a != inner_b:
        raise ValueError(
            f"int_gemm: inner dimensions differ for layout {layout!r}: "
            f"{list(a.shape)} and {list(b.shape)}"
        )
    if a.device != b.device:
        raise ValueError(f"int_gemm: b is on {b.device} but a is on {a.device}")
    chosen = dispatch.resolve("int_gemm", a, backend, kernels=INT_KERNELS)
    with dispatch.call("int_gemm", chosen):
        if chosen == "reference":
            return reference_int_gemm(a, b, layout)
        return torch.ops.qtrain.int8_gemm_int32(a, b, layout)


def int_spmm(
    indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor, backend: str = "auto"
) -> Tensor:
    """The sparse product of equation 1 over CSR rows: ``out[r] = sum of values[k] *
    x[indices[k]]`` for ``k`` in ``indptr[r] .. indptr[r + 1]``; int8 values (one per entry,
    in CSR order) and rows, exact int32 ``[rows, width]``."""
    _check_int("int_spmm", values, (torch.int8,))
    _check_int("int_spmm", x, (torch.int8,))
    _check_int("int_spmm", indptr, (torch.int32, torch.int64))
    _check_int("int_spmm", indices, (torch.int32, torch.int64))
    if x.dim() != 2 or indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError("int_spmm: needs indptr [rows + 1] and x [N, width]")
    if indices.dim() != 1 or values.shape != indices.shape:
        raise ValueError("int_spmm: indices and values must be 1-d and of one length")
    chosen = dispatch.resolve("int_spmm", x, backend, kernels=INT_KERNELS)
    with dispatch.call("int_spmm", chosen):
        if chosen == "reference":
            return reference_int_spmm(indptr, indices, values, x)
        return torch.ops.qtrain.int8_spmm(indptr, indices, values, x)
