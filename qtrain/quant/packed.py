"""Signed 4-bit values stored two per byte: the references of ``pack_int4`` / ``unpack_int4``
(issue 32, packed storage).

Tango quantizes to signed integers in ``[-(2^(b-1) - 1), 2^(b-1) - 1]``, held as int8; at
``b <= 4`` two of them fit in a byte. Value ``j`` of a row (the last dimension) lives in
byte ``j // 2``: the low nibble for an even ``j``, the high nibble for an odd one, as 4-bit
two's complement (``[-8, 7]``). An odd width leaves the last byte's high nibble 0. The op
``qspmm4`` gathers such rows directly (half the bytes of int8 rows).
"""

from __future__ import annotations

import torch

INT4_MIN, INT4_MAX = -8, 7


def packed_width(width: int) -> int:
    """Bytes a row of ``width`` 4-bit values takes: ``ceil(width / 2)``."""
    return (width + 1) // 2


def check_int4_width(fn: str, packed: torch.Tensor, width: object, name: str = "packed") -> int:
    """``width`` if ``ceil(width / 2) == packed.shape[-1]``, else ValueError (naming the
    packed operand ``name``)."""
    nbytes = packed.shape[-1] if packed.dim() >= 1 else 0
    if (
        isinstance(width, bool)
        or not isinstance(width, int)
        or width < 0
        or packed_width(width) != nbytes
    ):
        fits = f"{max(2 * nbytes - 1, 0)} or {2 * nbytes}"
        raise ValueError(
            f"{fn}: width must satisfy ceil(width / 2) == {name}.size(-1) ({nbytes} bytes: "
            f"width {fits}), got {width!r}"
        )
    return width


def _check_tensor(fn: str, name: str, t: object, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{fn}: {name} must be a dense (strided) tensor, got {t.layout}")
    if t.dtype != dtype:
        want, got = str(dtype).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
        raise TypeError(f"{fn}: {name} must be {want}, got {got}")
    if t.dim() == 0:
        raise ValueError(f"{fn}: {name} must have at least one dimension, got a 0-d tensor")
    return t


def check_pack_int4(q: object) -> torch.Tensor:
    """What ``pack_int4`` refuses without reading the data (the ops' front checks)."""
    return _check_tensor("pack_int4", "q", q, torch.int8)


def check_unpack_int4(packed: object, width: object) -> torch.Tensor:
    """What ``unpack_int4`` refuses (it reads no data)."""
    packed = _check_tensor("unpack_int4", "packed", packed, torch.uint8)
    check_int4_width("unpack_int4", packed, width)
    return packed


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 ``[..., D]`` with every value in [-8, 7] as uint8 ``[..., ceil(D / 2)]`` (see the
    module doc); ValueError for a value out of range."""
    q = check_pack_int4(q)
    if q.numel() and bool(((q < INT4_MIN) | (q > INT4_MAX)).any()):
        raise ValueError(
            f"pack_int4: every value of q must be in [{INT4_MIN}, {INT4_MAX}] (4-bit two's "
            "complement)"
        )
    if q.shape[-1] % 2:
        q = torch.nn.functional.pad(q, (0, 1))
    nibbles = (q & 0xF).to(torch.uint8)  # the low 4 bits of the two's complement
    pairs = nibbles.reshape(*q.shape[:-1], q.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_int4(packed: torch.Tensor, width: int) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: int8 ``[..., width]``, ``ceil(width / 2) ==
    packed.shape[-1]``."""
    packed = check_unpack_int4(packed, width)
    nibbles = torch.stack((packed & 0xF, packed >> 4), dim=-1).to(torch.int8)
    values = torch.where(nibbles > INT4_MAX, nibbles - 16, nibbles)
    return values.reshape(*packed.shape[:-1], 2 * packed.shape[-1])[..., :width].contiguous()
