"""Signed 4-bit values stored two per byte, with backend dispatch (issue 32).

The compiled backends are the ops ``torch.ops.qtrain.pack_int4`` / ``unpack_int4``; the
references are ``qtrain.quant.packed``. Every backend gives the same bytes and values.
The arguments are checked here, once, before dispatch, so every backend refuses the same
inputs with the same exception; a value out of [-8, 7] is found where the data is read
(the kernel or the reference), with the same message. The calls are counted as the
primitives ``pack_int4`` / ``unpack_int4`` (profiled as quantization). The SpMM over
packed rows is ``qtrain.ops.sparse.qspmm_packed``.
"""

from __future__ import annotations

import torch

from qtrain.ops import dispatch
from qtrain.quant import packed as ref

# compiled backends implementing pack_int4 and unpack_int4
PACKED_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")


def pack_int4(q: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """int8 ``[..., D]`` with values in [-8, 7] as uint8 ``[..., ceil(D / 2)]``: value j of
    a row in byte j // 2, the low nibble for an even j (4-bit two's complement).

    ``backend`` is "auto" (the compiled kernel for q's device when built, else the
    reference with the fallback recorded), "reference", "ext-cpu" or "ext-cuda".
    """
    q = ref.check_pack_int4(q)
    chosen = dispatch.resolve("pack_int4", q, backend, kernels=PACKED_KERNELS)
    with dispatch.call("pack_int4", chosen):
        if chosen == "reference":
            return ref.pack_int4(q)
        return torch.ops.qtrain.pack_int4(q)


def unpack_int4(packed: torch.Tensor, width: int, backend: str = "auto") -> torch.Tensor:
    """The inverse of :func:`pack_int4`: int8 ``[..., width]``, where ``ceil(width / 2) ==
    packed.shape[-1]``."""
    packed = ref.check_unpack_int4(packed, width)
    chosen = dispatch.resolve("unpack_int4", packed, backend, kernels=PACKED_KERNELS)
    with dispatch.call("unpack_int4", chosen):
        if chosen == "reference":
            return ref.unpack_int4(packed, width)
        return torch.ops.qtrain.unpack_int4(packed, width)
