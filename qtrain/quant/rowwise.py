"""Per-row activation compression (exact-iclr22 section 3 and appendix F): the reference.

EXACT stores each saved activation row ``h`` (a node's embedding) as ``bits``-bit
integers relative to the row's own zero point and range, bit-packed, and
dequantizes it for backward. Every compiled backend must reproduce these
functions bit for bit, so each step is the float32 operation it names::

    B      = 2^bits - 1                      bits in {1, 2, 4, 8}
    zero   = bf16_floor(min(h))              stored as bfloat16, never above min(h)
    range  = bf16_ceil(fl32(max(h) - zero))  stored as bfloat16, so zero + range >= max(h)
    inv    = fl32(B / range)                 0 when range == 0
    v      = fl32(fl32(h - zero) * inv)      in [0, B] up to rounding
    stochastic: q = clamp(floor(fl32(v + u_i)), 0, B)    u_i = counter_uniform(seed, offset + i)
    nearest:    q = clamp(rint(v), 0, B)                 ties to even
    dequantized: h_hat = fl32(fl32(float(q) * step) + zero),  step = fl32(range / B)

Rounding the zero point down and the range up *before* quantizing keeps the
stored (bfloat16) values the ones the integers were computed against, so the
stochastic rounding stays unbiased (Proposition 1) instead of being off by the
bfloat16 rounding of a min or max. ``i`` is the element's flat index in the
row-major ``[rows, width]`` view. Inputs must be finite.

Packing (:func:`pack_bits`) writes the integers of the flattened tensor as one
dense little-endian bit stream: element ``i`` occupies bits ``(i*bits) % 8 ..``
of byte ``(i*bits) // 8``; the last byte is zero-padded. Rows do not start on
byte boundaries, so a 2-bit value really costs 2 bits for any width.
"""

from __future__ import annotations

import torch

from qtrain.quant.quantize import check_rounding
from qtrain.quant.rng import check_counter_range, counter_uniform, normalize_seed

PACK_BITS = (1, 2, 4, 8)


def check_pack_bits(bits: object) -> int:
    """Return ``bits`` if it is one of 1, 2, 4, 8, else raise ValueError naming them."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in PACK_BITS:
        raise ValueError(f"bits must be one of 1, 2, 4, 8, got {bits!r}")
    return bits


def packed_size(n: int, bits: int) -> int:
    """Bytes that ``n`` values of ``bits`` bits take when packed."""
    return (n * check_pack_bits(bits) + 7) // 8


# ---------------------------------------------------------------- bit packing


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 ``values`` (each < 2^bits, any shape, taken flat) into a uint8 byte stream."""
    bits = check_pack_bits(bits)
    if values.dtype not in (torch.uint8, torch.bool):
        raise TypeError(f"values must be uint8 or bool, got {values.dtype}")
    flat = values.reshape(-1).to(torch.uint8)
    if bits == 8:
        return flat.clone()
    per = 8 // bits
    n = flat.numel()
    padded = torch.zeros(packed_size(n, bits) * per, dtype=torch.uint8, device=flat.device)
    padded[:n] = flat & ((1 << bits) - 1)
    lanes = padded.reshape(-1, per).to(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32, device=flat.device) * bits
    return (lanes << shifts).sum(dim=1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first ``n`` values (uint8, flat) of a stream written by :func:`pack_bits`."""
    bits = check_pack_bits(bits)
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError(
            f"packed must be a 1-d uint8 tensor, got {packed.dtype} {tuple(packed.shape)}"
        )
    if packed.numel() < packed_size(n, bits):
        raise ValueError(
            f"packed has {packed.numel()} bytes, {n} values of {bits} bits need "
            f"{packed_size(n, bits)}"
        )
    if bits == 8:
        return packed[:n].clone()
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * bits
    lanes = (packed.to(torch.int32)[:, None] >> shifts) & ((1 << bits) - 1)
    return lanes.reshape(-1)[:n].to(torch.uint8)


def masked_scale(grad: torch.Tensor, packed: torch.Tensor, scale: float) -> torch.Tensor:
    """``grad * fl32(scale)`` where bit ``i`` of the 1-bit stream ``packed`` is set, else +0.

    The backward of ReLU (scale 1) and of inverted dropout (scale ``1 / (1 - p)``)
    read from a mask packed by :func:`pack_bits` (``bits = 1``); ``grad`` float32,
    any shape, taken flat in row-major order.
    """
    if grad.dtype != torch.float32:
        raise TypeError(f"grad must be float32, got {grad.dtype}")
    mask = unpack_bits(packed, 1, grad.numel()).reshape(grad.shape).bool()
    s = torch.tensor(scale, dtype=torch.float32)
    return torch.where(mask, grad * s, torch.zeros((), dtype=torch.float32))


# ---------------------------------------------------------------- bfloat16 with a direction


def bf16_floor(x: torch.Tensor) -> torch.Tensor:
    """The largest bfloat16 value <= x (float32 in, bfloat16 out; finite x)."""
    bits = x.to(torch.float32).view(torch.int32)
    trunc = bits & ~0xFFFF  # toward zero
    inexact = trunc != bits
    # below zero, toward zero is upward: step the magnitude up one bfloat16 ulp
    stepped = torch.where(inexact & (bits < 0), trunc + 0x10000, trunc)
    return stepped.view(torch.float32).to(torch.bfloat16)


def bf16_ceil(x: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 value >= x, for x >= 0 (float32 in, bfloat16 out)."""
    bits = x.to(torch.float32).view(torch.int32)
    trunc = bits & ~0xFFFF
    stepped = torch.where(trunc != bits, trunc + 0x10000, trunc)
    return stepped.view(torch.float32).to(torch.bfloat16)


# ---------------------------------------------------------------- rows


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2:
        raise TypeError(
            f"x must be a 2-d float32 tensor [rows, width], got "
            f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}"
        )
    return x.contiguous()


def _no_codes(rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The codes of rows with no values: no packed bytes, zero points and ranges of 0."""
    empty16 = torch.zeros(rows, dtype=torch.bfloat16, device=device)
    return torch.zeros(0, dtype=torch.uint8, device=device), empty16, empty16.clone()


def quantize_rows(
    x: torch.Tensor,
    bits: int,
    rounding: str = "stochastic",
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize each row of float32 ``x [rows, width]``: ``(packed uint8, zero bf16, range bf16)``."""
    bits = check_pack_bits(bits)
    check_rounding(rounding)
    x = _as_rows(x)
    seed = normalize_seed(seed)
    check_counter_range(x.numel(), offset)
    rows, width = x.shape
    if rows == 0 or width == 0:
        return _no_codes(rows, x.device)
    levels = (1 << bits) - 1
    zero = bf16_floor(x.amin(dim=1))
    zero32 = zero.to(torch.float32)
    rng = bf16_ceil(x.amax(dim=1) - zero32)
    rng32 = rng.to(torch.float32)
    # tensor / tensor: a correctly rounded division (a scalar divisor may become a reciprocal)
    inv = torch.where(rng32 > 0, torch.full_like(rng32, levels) / rng32, torch.zeros_like(rng32))
    v = (x - zero32[:, None]) * inv[:, None]
    if rounding == "nearest":
        r = torch.round(v)
    else:
        u = counter_uniform(x.numel(), seed, offset, device=x.device).reshape(x.shape)
        r = torch.floor(v + u)
    q = torch.clamp(r, 0, levels).to(torch.uint8)
    return pack_bits(q, bits), zero, rng


def quantize_rows_means(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-bit rows at two fitted levels, in :func:`quantize_rows`'s format (``bits = 1``).

    At 1 bit, :func:`quantize_rows` stores every value as its row's minimum or maximum
    (stochastically): unbiased, but a value in the middle of its row gets an error of
    half the row's range. Here each row is split at its mean and every value stored as
    the mean of its side, deterministically: the two-level quantizer with the least
    squared error for that split (on Gaussian rows of 64 values, a thirteenth of the
    stochastic one's, and below stochastic rounding's at 2 bits), biased toward the side
    means. Each step, in this order::

        t      = fl32(sum64(h) / width)          float64 sums of the row's values
        bit    = h >= t
        hi     = fl32(sum64(h[bit]) / count)     t where no value is >= t (a NaN row)
        lo     = fl32(sum64(h[~bit]) / count)    hi where every value is >= t
        zero   = bf16(lo)                        round to nearest even
        range  = bf16(fl32(hi - zero))

    so :func:`dequantize_rows` at 1 bit returns ``zero`` or ``zero + range``. The sums
    are exact (and so order-free) while a row's values span under 53 bits, as they do
    unless subnormals meet large values. A row holding a NaN stores zero = NaN and
    dequantizes to NaN, as in :func:`quantize_rows`.
    """
    x = _as_rows(x)
    rows, width = x.shape
    if rows == 0 or width == 0:
        return _no_codes(rows, x.device)
    x64 = x.to(torch.float64)
    sums = x64.sum(1)
    # tensor / tensor: a correctly rounded division (a scalar divisor may become a reciprocal)
    t = (sums / torch.full_like(sums, width)).to(torch.float32)
    high = x >= t[:, None]
    n_high = high.sum(1)
    n_low = width - n_high
    zero64 = torch.zeros((), dtype=torch.float64, device=x.device)
    s_high = torch.where(high, x64, zero64).sum(1)
    s_low = torch.where(high, zero64, x64).sum(1)
    hi = torch.where(n_high > 0, (s_high / n_high.clamp(min=1)).to(torch.float32), t)
    lo = torch.where(n_low > 0, (s_low / n_low.clamp(min=1)).to(torch.float32), hi)
    zero = lo.to(torch.bfloat16)
    rng = (hi - zero.to(torch.float32)).to(torch.bfloat16)
    return pack_bits(high, 1), zero, rng


def dequantize_rows(
    packed: torch.Tensor,
    zero: torch.Tensor,
    rng: torch.Tensor,
    bits: int,
    width: int,
) -> torch.Tensor:
    """float32 ``[rows, width]`` rows back from :func:`quantize_rows`'s output."""
    bits = check_pack_bits(bits)
    if zero.dtype != torch.bfloat16 or rng.dtype != torch.bfloat16 or zero.shape != rng.shape:
        raise TypeError("zero and range must be bfloat16 tensors of one shape [rows]")
    rows = zero.numel()
    levels = (1 << bits) - 1
    q = unpack_bits(packed, bits, rows * width).reshape(rows, width)
    rng32 = rng.to(torch.float32)
    step = rng32 / torch.full_like(rng32, levels)
    return q.to(torch.float32) * step[:, None] + zero.to(torch.float32)[:, None]


# ---------------------------------------------------------------- message segments


def segment_bytes(rows: int, width: int, bits: int) -> int:
    """Bytes of a segment of ``rows`` quantized rows: packed values, bf16 zeros and ranges."""
    return 0 if rows == 0 else packed_size(rows * width, bits) + 4 * rows


def quantize_rows_into(
    x: torch.Tensor,
    index: torch.Tensor | None,
    bits: int,
    rounding: str,
    seed: int,
    offset: int,
    out: torch.Tensor,
) -> None:
    """:func:`quantize_rows` of ``x[index]`` (all of ``x`` if None) written into the uint8
    segment ``out``: the packed values, then the bfloat16 zeros, then the ranges."""
    x = _as_rows(x)
    rows = x if index is None else x[_checked_index(index, x.shape[0], "quantize_rows_into")]
    write_segment(out, *quantize_rows(rows, bits, rounding, seed, offset), rows.shape[1], bits)


def _checked_index(index: torch.Tensor, limit: int, fn: str) -> torch.Tensor:
    """``index`` once every entry is in ``[0, limit)``, else IndexError naming the first one
    outside: on CUDA an indexing op would stop the process's device with an assert instead."""
    flat = index.reshape(-1)
    outside = ((flat < 0) | (flat >= limit)).nonzero()
    if outside.numel():
        i = int(outside[0, 0])
        raise IndexError(f"{fn}: index[{i}] = {int(flat[i])} is outside [0, {limit})")
    return index


def write_segment(
    out: torch.Tensor,
    packed: torch.Tensor,
    zero: torch.Tensor,
    rng: torch.Tensor,
    width: int,
    bits: int,
) -> None:
    """Lay :func:`quantize_rows`'s output out in the uint8 segment ``out``: the packed
    values, then the bfloat16 zeros, then the ranges."""
    want = segment_bytes(zero.numel(), width, bits)
    if out.dtype != torch.uint8 or out.dim() != 1 or out.numel() != want:
        raise ValueError(
            f"out must be a 1-d uint8 tensor of {want} bytes, got {out.dtype} {tuple(out.shape)}"
        )
    if want:
        out.copy_(torch.cat([packed, zero.view(torch.uint8), rng.view(torch.uint8)]))


def dequantize_rows_into(
    segment: torch.Tensor,
    rows: int,
    bits: int,
    out: torch.Tensor,
    index: torch.Tensor | None,
    add: bool,
) -> None:
    """The ``rows`` rows of a :func:`quantize_rows_into` segment dequantized into
    ``out[index]`` (``out``'s rows in order if None), or added onto them with ``add``."""
    width = out.shape[1]
    n_packed = packed_size(rows * width, bits)
    if segment.numel() != segment_bytes(rows, width, bits):
        raise ValueError(
            f"the segment has {segment.numel()} bytes, {rows} rows of {width} values at "
            f"{bits} bits need {segment_bytes(rows, width, bits)}"
        )
    if index is not None:
        _checked_index(index, out.shape[0], "dequantize_rows_into")
        if torch.unique(index).numel() != index.numel():
            raise ValueError("index names a row twice; each row may be written once")
    if rows == 0:
        return
    zero = segment[n_packed : n_packed + 2 * rows].clone().view(torch.bfloat16)
    rng = segment[n_packed + 2 * rows :].clone().view(torch.bfloat16)
    values = dequantize_rows(segment[:n_packed], zero, rng, bits, width)
    target = index if index is not None else slice(None)
    if add:
        out[target] += values
    else:
        out[target] = values
