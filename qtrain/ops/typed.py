"""Typed (per-relation) segment GEMM: the dense kernel of relational GNNs.

Rows ``offsets[r] .. offsets[r + 1]`` of ``x`` belong to relation ``r`` and are
multiplied by that relation's weight, one GEMM per relation on slices of ``x``:
no per-edge copy of the weights (Hector: "one segment GEMM across all
relations"). The compiled ops are ``torch.ops.qtrain.segment_matmul`` and
``segment_matmul_tn`` (its weight gradient); ``qtrain.ops.autograd`` makes the
first differentiable through both, and the second too (so double backward works),
when ``qtrain.ops.backends`` loads the library.

``offsets`` is int64 on the CPU for every device, as DGL's ``seglen``: the host
loop reads it without waiting for the GPU (:func:`offsets_from_lengths` builds it).

:func:`int8_segment_gemm` (the op ``torch.ops.qtrain.int8_segment_gemm``) is the INT8
version for tango's relational layers, in the three layouts of ``qtrain.ops.gemm``:
each segment's block is exactly ``qtrain.ops.gemm.int8_gemm`` of that segment's slices,
bit for bit on every device (integer sums are exact).
"""

from __future__ import annotations

import itertools

import torch

from qtrain.ops import dispatch
from qtrain.ops.gemm import LAYOUTS, combined_scale, reference_int8_gemm

Tensor = torch.Tensor

SEGMENT_MATMUL_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")
# compiled backends implementing int8_segment_gemm
INT8_SEGMENT_GEMM_KERNELS: tuple[str, ...] = ("ext-cpu", "ext-cuda")


def _check_offsets(fn: str, offsets: Tensor, rows: int, operand: str = "x") -> list[int]:
    """offsets as Python ints, after the checks the ops make (same errors, same kinds);
    ``rows`` are those of the operand named ``operand``."""
    if offsets.dtype != torch.int64:
        raise TypeError(f"{fn}: offsets must be int64, got {offsets.dtype}")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{fn}: offsets must be 1-d with R + 1 >= 1 elements")
    if offsets.device.type != "cpu":
        raise ValueError(f"{fn}: offsets must be on the CPU, got {offsets.device}")
    bounds = offsets.tolist()
    if bounds[0] != 0:
        raise ValueError(f"{fn}: offsets must start at 0, got offsets[0] = {bounds[0]}")
    if any(b < a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{fn}: offsets must be non-decreasing")
    if bounds[-1] != rows:
        raise ValueError(
            f"{fn}: offsets must end at the rows of {operand} ({rows}), got {bounds[-1]}"
        )
    return bounds


def reference_segment_matmul(
    x: Tensor, offsets: Tensor, weight: Tensor, transpose_weight: bool = False
) -> Tensor:
    """``out[seg r] = x[seg r] @ W_r`` (``W_r = weight[r]``, or ``weight[r].T`` when
    ``transpose_weight``), one ``torch.mm`` per nonempty segment: the reference."""
    bounds = _check_offsets("reference_segment_matmul", offsets, x.shape[0])
    if weight.dim() != 3 or weight.shape[0] != len(bounds) - 1:
        raise ValueError(f"weight must be [R, ., .] with R = {len(bounds) - 1}, got {weight.shape}")
    m = weight.shape[1 if transpose_weight else 2]
    pieces = [
        torch.mm(x[s:e], weight[r].T if transpose_weight else weight[r])
        for r, (s, e) in enumerate(itertools.pairwise(bounds))
        if e > s
    ]
    return torch.cat(pieces) if pieces else x.new_empty((0, m))


def reference_segment_matmul_tn(x: Tensor, offsets: Tensor, grad: Tensor) -> Tensor:
    """``out[r] = x[seg r].T @ grad[seg r]`` (zeros for an empty segment): the reference
    of the weight gradient."""
    bounds = _check_offsets("reference_segment_matmul_tn", offsets, x.shape[0])
    if grad.shape[0] != x.shape[0]:
        raise ValueError(f"grad has {grad.shape[0]} rows but x has {x.shape[0]}")
    zeros = x.new_zeros((x.shape[1], grad.shape[1]))
    pieces = [
        torch.mm(x[s:e].T, grad[s:e]) if e > s else zeros for s, e in itertools.pairwise(bounds)
    ]
    return torch.stack(pieces) if pieces else x.new_zeros((0, x.shape[1], grad.shape[1]))


def offsets_from_lengths(lengths: Tensor) -> Tensor:
    """CPU int64 offsets ``[0, l0, l0 + l1, ...]`` of per-segment ``lengths`` (R values).

    ``lengths`` may be on any device; a device tensor is copied to the host, which
    waits for the GPU (build offsets once per graph, not per layer call).
    """
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex():
        raise TypeError(
            f"lengths must be a 1-d integer tensor, got {lengths.dtype} {tuple(lengths.shape)}"
        )
    lengths = lengths.to(device="cpu", dtype=torch.int64)
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError("lengths must be >= 0")
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets


class RowsByType:
    """Rows of mixed types grouped by type (a stable sort), so that a product with one
    matrix per type runs as one segment GEMM instead of copying a matrix per row (DGL's
    ``gather_mm``); ``restore`` puts the product's rows back in their order. Reads the
    type counts on the host (a device sync, as any segment GEMM's offsets need)."""

    def __init__(self, types: Tensor, num_types: int) -> None:
        index = types.long()
        if index.numel():
            low, high = torch.stack(torch.aminmax(index)).tolist()  # one device-to-host read
            if low < 0 or high >= num_types:
                raise ValueError(f"type ids must be in [0, {num_types}), got {low}..{high}")
        self.order = torch.argsort(index, stable=True)
        self.offsets = offsets_from_lengths(torch.bincount(index, minlength=num_types))
        self._back = torch.empty_like(self.order)
        self._back[self.order] = torch.arange(len(self.order), device=self.order.device)

    def group(self, rows: Tensor) -> Tensor:
        return rows[self.order]

    def restore(self, rows: Tensor) -> Tensor:
        return rows[self._back]


def segment_matmul(
    x: Tensor,
    weight: Tensor,
    offsets: Tensor,
    *,
    transpose_weight: bool = False,
    backend: str = "auto",
) -> Tensor:
    """``x [N, K]`` times its relation's weight, per segment of rows: ``[N, M]``.

    ``weight`` is ``[R, K, M]`` (``[R, M, K]`` with ``transpose_weight``), ``offsets``
    CPU int64 ``[R + 1]`` (0 first, non-decreasing, N last). Differentiable in ``x``
    and ``weight`` on every backend; counted as the primitive ``segment_matmul``.
    """
    chosen = dispatch.resolve("segment_matmul", x, backend, kernels=SEGMENT_MATMUL_KERNELS)
    with dispatch.call("segment_matmul", chosen):
        if chosen == "reference":
            return reference_segment_matmul(x, offsets, weight, transpose_weight)
        return torch.ops.qtrain.segment_matmul(x, offsets, weight, transpose_weight)


# ---------------------------------------------------------------- INT8 (tango)


def _check_int8_segment_gemm(
    fn: str, qa: Tensor, qb: Tensor, offsets: Tensor, layout: str
) -> list[int]:
    """offsets as Python ints, or the exception the op raises for these arguments (the
    checks of ext/ops/int8_segment_gemm.cpp and of the kernels' offsets, same kinds)."""
    if layout not in LAYOUTS:
        raise ValueError(
            f"{fn}: layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}"
        )
    for name, t in (("qa", qa), ("qb", qb)):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            raise ValueError(f"{fn}: {name} must be a dense (strided) tensor")
        if t.dtype != torch.int8:
            raise TypeError(f"{fn}: {name} must be int8, got {str(t.dtype).removeprefix('torch.')}")
    if qa.dim() != 2:
        raise ValueError(f"{fn}: qa must be 2-d, got shape {list(qa.shape)}")
    if qb.device != qa.device:
        raise ValueError(f"{fn}: qb is on {qb.device} but qa is on {qa.device}")
    bounds = _check_offsets(fn, offsets, qa.shape[0], "qa")
    relations = len(bounds) - 1
    if layout == "tn":
        if qb.dim() != 2:
            raise ValueError(f"{fn}: qb must be 2-d [N, M] for layout 'tn', got {list(qb.shape)}")
        if qb.shape[0] != qa.shape[0]:
            raise ValueError(f"{fn}: qb has {qb.shape[0]} rows but qa has {qa.shape[0]}")
        return bounds
    if qb.dim() != 3:
        raise ValueError(
            f"{fn}: qb must be 3-d [R, K, M] for layout {layout!r}, got {list(qb.shape)}"
        )
    if qb.shape[0] != relations:
        raise ValueError(f"{fn}: qb has {qb.shape[0]} relations but offsets give R = {relations}")
    dim, inner = ("K", qb.shape[1]) if layout == "nn" else ("M", qb.shape[2])
    if inner != qa.shape[1]:
        raise ValueError(
            f"{fn}: qa has {dim} = {qa.shape[1]} columns but qb [R, K, M] of shape "
            f"{list(qb.shape)} has {dim} = {inner}"
        )
    return bounds


def reference_int8_segment_gemm(
    qa: Tensor, qb: Tensor, offsets: Tensor, scale: float, layout: str
) -> Tensor:
    """The definition of ``torch.ops.qtrain.int8_segment_gemm``, float32, per segment
    ``r`` (rows ``offsets[r] .. offsets[r + 1]``, ``seg r``) the reference INT8 GEMM
    (``qtrain.ops.gemm.reference_int8_gemm``) of its slices::

        "nn": out[seg r] = int8_gemm(qa[seg r], qb[r], scale, "nn")   qa [N, K], qb [R, K, M]
        "nt": out[seg r] = int8_gemm(qa[seg r], qb[r], scale, "nt")   qa [N, M], qb [R, K, M]
        "tn": out[r] = int8_gemm(qa[seg r], qb[seg r], scale, "tn")   qa [N, K], qb [N, M]

    outputs ``[N, M]``, ``[N, K]`` and ``[R, K, M]``; a "tn" relation without rows gives
    zeros.
    """
    bounds = _check_int8_segment_gemm("reference_int8_segment_gemm", qa, qb, offsets, layout)
    segments = [(r, s, e) for r, (s, e) in enumerate(itertools.pairwise(bounds)) if e > s]
    if layout == "tn":
        shape = (len(bounds) - 1, qa.shape[1], qb.shape[1])
        out = torch.zeros(shape, dtype=torch.float32, device=qa.device)
        for r, s, e in segments:
            out[r] = reference_int8_gemm(qa[s:e], qb[s:e], scale, "tn")
        return out
    cols = qb.shape[2] if layout == "nn" else qb.shape[1]
    out = torch.empty((qa.shape[0], cols), dtype=torch.float32, device=qa.device)
    for r, s, e in segments:
        out[s:e] = reference_int8_gemm(qa[s:e], qb[r], scale, layout)
    return out


def int8_segment_gemm(
    qa: Tensor,
    qb: Tensor,
    offsets: Tensor,
    scale_a: Tensor | float,
    scale_b: Tensor | float,
    layout: str,
    backend: str = "auto",
) -> Tensor:
    """float32 ``dequant(qa) @ dequant(qb)`` per segment of rows, in ``layout`` (see
    :func:`reference_int8_segment_gemm`): each segment's block equals
    ``qtrain.ops.gemm.int8_gemm(qa_seg, qb_seg, scale_a, scale_b, layout)`` bit for bit.

    The two scales combine as int8_gemm's, into ``fl32(scale_a * scale_b)`` (a scale on
    the GPU is read back once here). ``offsets`` is CPU int64 ``[R + 1]`` (0 first,
    non-decreasing, N last). Not differentiable (int8 operands); counted as the primitive
    ``int8_segment_gemm``.
    """
    scale = combined_scale(scale_a, scale_b)
    chosen = dispatch.resolve("int8_segment_gemm", qa, backend, kernels=INT8_SEGMENT_GEMM_KERNELS)
    with dispatch.call("int8_segment_gemm", chosen):
        if chosen == "reference":
            return reference_int8_segment_gemm(qa, qb, offsets, scale, layout)
        return torch.ops.qtrain.int8_segment_gemm(qa, qb, offsets, scale, layout)
