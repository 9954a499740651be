"""Autograd Functions for tango's quantized GEMM, SpMM and SDDMM (tango-sc23 section 3).

Forward quantizes each operand once (through the policy's cache, so a tensor
read by two primitives, or a weight read by every forward until the
optimizer changes it, is quantized once) and keeps the quantized operands
for backward; backward quantizes the incoming gradient and reuses them. With
the cache off, forward keeps the float operands and backward quantizes them
again. All products go to ``qtrain.ops.gemm`` / ``qtrain.ops.sparse``, which
pick the compiled kernel and count the call.

At 4 bits or fewer (the policy's ``packed``) an SpMM gathers packed rows (``qspmm4``:
half the bytes of int8) and keeps them for its backward, whose attention-weight SDDMM
reads them packed too (``qsddmm4``), and a GEMM keeps X's columns packed for its weight
gradient, which the block GEMM (``int8_block_gemm``, the default scales) reads packed and
the other forms unpack first; the values are those of int8 storage, bit for bit.

Gradients of float32 inputs are float32; master weights stay float32 (the
optimizer never sees a quantized value).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from qtrain.plugins.tango.policy import (
    COLUMNS,
    NODE_BLOCKS,
    ROTATED_COLUMNS,
    ROTATED_ROWS,
    ROWS,
    TENSOR,
    NonFiniteOperand,
    QuantPolicy,
)

from qtrain.ops.gemm import int8_block_gemm, int8_gemm
from qtrain.ops.graph import GraphCSR
from qtrain.ops.rotate import hadamard_rotate
from qtrain.ops.sparse import qsddmm, qsddmm_packed, qspmm, qspmm_packed
from qtrain.ops.typed import int8_segment_gemm
from qtrain.quant.granular import dequantize_tiles
from qtrain.quant.quantize import dequantize

_state = threading.local()


def inside_kernel() -> bool:
    """True while qtrain's own backward runs: its helper products must not be re-patched."""
    return getattr(_state, "depth", 0) > 0


@contextmanager
def _kernel_scope() -> Iterator[None]:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _operand(
    policy: QuantPolicy, x: torch.Tensor, recording: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return policy.cached(x, recording)


def _saved(
    ctx: Any,
    policy: QuantPolicy,
    tensors: tuple[torch.Tensor, ...],
    quantized: tuple[tuple[torch.Tensor, torch.Tensor], ...],
    extra: tuple[torch.Tensor | None, ...] = (),
    needed: tuple[bool, ...] | None = None,
) -> None:
    """Save for backward the quantized operands (cache on) or the float ones (cache off), then ``extra``.

    ``needed[i]`` False saves nothing for operand i (its slot holds None): backward
    will not read it, and keeping it would make tango save more than float32 does
    (a copy_u SpMM's input, a first layer's weight when the features need no gradient).
    Everything goes through ``save_for_backward``, so saved-tensor hooks (the
    activation-memory meter, the ``exact`` plugin) see what tango keeps.
    """
    ctx.policy = policy
    ctx.n_operands = len(tensors)
    ctx.keeps_quantized = policy.cache is not None
    keep = needed if needed is not None else (True,) * len(tensors)
    if ctx.keeps_quantized:
        kept = [t if k else None for pair, k in zip(quantized, keep, strict=True) for t in pair]
    else:
        kept = [t if k else None for t, k in zip(tensors, keep, strict=True)]
    ctx.save_for_backward(*kept, *extra)


def _unpacked(ctx: Any) -> tuple[list[Any], list[Any]]:
    """(the saved operands as stored, the extra tensors); reads ``saved_tensors`` once."""
    saved = list(ctx.saved_tensors)
    width = 2 * ctx.n_operands if ctx.keeps_quantized else ctx.n_operands
    return saved[:width], saved[width:]


def _operands(
    ctx: Any, stored: list[Any], by: str = ROWS
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The quantized operands: reused from forward (cache on) or quantized now ``by`` (cache
    off)."""
    policy: QuantPolicy = ctx.policy
    if ctx.keeps_quantized:
        pairs = [(stored[i], stored[i + 1]) for i in range(0, len(stored), 2)]
        for q, _ in pairs:
            if q is not None:
                policy.note_reuse()
        return pairs
    return [(None, None) if t is None else policy.fresh(t, False, by) for t in stored]


def _restored(ctx: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return _operands(ctx, _unpacked(ctx)[0])


def _floats(ctx: Any, widths: tuple[int, ...] = ()) -> list[torch.Tensor]:
    """The saved operands in float32: dequantized (cache on; packed rows unpacked to
    ``widths[i]``, given by the Functions that save packed operands) or as saved (cache off)."""
    stored = _unpacked(ctx)[0]
    if not ctx.keeps_quantized:
        return stored
    floats = []
    for i in range(0, len(stored), 2):
        value = (stored[i], stored[i + 1])
        if value[0] is not None and value[0].dtype == torch.uint8:
            value = ctx.policy.unpacked(value, widths[i // 2])
        floats.append(None if value[0] is None else dequantize(*value))
    return floats


Grads = tuple[Any, ...]


def _backward(
    ctx: Any,
    grad: torch.Tensor,
    primitive: str,
    quantized: Callable[[Any, torch.Tensor], Grads],
    fp32: Callable[[Any, torch.Tensor], Grads],
) -> Grads:
    """``quantized(ctx, grad)``, or ``fp32(ctx, grad)`` when the incoming gradient holds NaN
    or Inf (the quantizer refuses it): a diverged step then ends with the non-finite
    gradients float32 gives instead of failing inside autograd. The forward operands were
    finite (else the forward ran in float32), so the float32 backward takes them dequantized."""
    with _kernel_scope():
        try:
            return quantized(ctx, grad)
        except NonFiniteOperand:
            ctx.policy.fp32(primitive, "gradient not finite")
            return fp32(ctx, grad)


# ---------------------------------------------------------------- GEMM


class QuantLinear(torch.autograd.Function):
    """``x @ w^T + b`` (linear: w [N, K]) or ``x @ w + b`` (matmul: w [K, N]) for 2-d x."""

    @staticmethod
    def forward(
        ctx: Any,
        policy: QuantPolicy,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: Any,
        linear: bool,
        recording: bool,
    ) -> torch.Tensor:  # type: ignore[override]
        qx, sx = _operand(policy, x, recording)
        qw, sw = _operand(policy, w, recording)
        out = int8_gemm(qx, qw, sx, sw, "nt" if linear else "nn", bias, policy.backend)
        needs = ctx.needs_input_grad  # (policy, x, w, bias, linear): dX reads w, dW reads x
        _saved(ctx, policy, (x, w), ((qx, sx), (qw, sw)), needed=(needs[2], needs[1]))
        # a constant x's int8 copy may live for the run (the features): dW may then read
        # its cached transpose
        ctx.x_constant = policy.constant(x, recording)
        ctx.linear = linear
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _backward(ctx, grad, "gemm", QuantLinear._grads, QuantLinear._fp32_grads)

    @staticmethod
    def _grads(ctx: Any, grad: torch.Tensor) -> Grads:
        (qx, sx), (qw, sw) = _restored(ctx)
        policy: QuantPolicy = ctx.policy
        qg, sg = policy.gradient(grad.contiguous())
        dx = dw = None
        if ctx.needs_input_grad[1]:
            dx = int8_gemm(qg, qw, sg, sw, "nn" if ctx.linear else "nt", None, policy.backend)
        if ctx.needs_input_grad[2]:
            dw = QuantLinear._weight_grad(ctx, qx, sx, qg, sg)
        return None, dx, dw, QuantLinear._bias_grad(ctx, grad), None, None

    @staticmethod
    def _weight_grad(
        ctx: Any, qx: torch.Tensor, sx: torch.Tensor, qg: torch.Tensor, sg: torch.Tensor
    ) -> torch.Tensor:
        """dW = X^T dY ([K, N]; linear: its transpose dY^T X). For a step constant X whose
        int8 copy outlives the step, from the second step a plain product over the rows
        of X^T, cached (the same integer sums, so the same bits as the transposed
        product, which re-packs X's columns on every call)."""
        policy: QuantPolicy = ctx.policy
        xt = policy.cache.transposed(qx) if ctx.x_constant and policy.cache is not None else None
        if xt is not None:
            dw = int8_gemm(xt, qg, sx, sg, "nn", None, policy.backend)
            return dw.t().contiguous() if ctx.linear else dw
        if ctx.linear:  # dW[N, K] = dY^T X
            return int8_gemm(qg, qx, sg, sx, "tn", None, policy.backend)
        return int8_gemm(qx, qg, sx, sg, "tn", None, policy.backend)

    @staticmethod
    def _fp32_grads(ctx: Any, grad: torch.Tensor) -> Grads:
        x, w = _floats(ctx)
        dx = dw = None
        if ctx.needs_input_grad[1]:
            dx = grad @ w if ctx.linear else grad @ w.t()
        if ctx.needs_input_grad[2]:
            dw = grad.t() @ x if ctx.linear else x.t() @ grad
        return None, dx, dw, QuantLinear._bias_grad(ctx, grad), None, None

    @staticmethod
    def _bias_grad(ctx: Any, grad: torch.Tensor) -> torch.Tensor | None:
        return grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None


class RowQuantLinear(torch.autograd.Function):
    """:class:`QuantLinear` with one scale per row or column (the policy's ``scales =
    "row"``): every operand is quantized along the dimension its product keeps, so no
    scale varies along a sum and every product stays an exact integer one::

        forward  Y  = X W^T (linear, W [N, K]):  X by rows,  W by rows      ("nt")
                 Y  = X W   (matmul, W [K, N]):  X by rows,  W by columns   ("nn")
        dX       dY W   / dY W^T:                dY by rows, W by columns / by rows
        dW       dY^T X / X^T dY:                dY and X by columns        ("tn")

    With ``scales = "block"`` dW's operands are quantized by blocks of the policy's
    ``scale_block`` rows (nodes) of each column instead, and multiplied by
    ``int8_block_gemm`` (one scale per column spans every node: at 2 bits most of a
    gradient column rounds to 0).

    With the policy's ``rotation`` every ``by`` above is its rotated form: the rows of x
    (rows) or of x^T (columns) with the summed dimension last, rotated in Hadamard blocks,
    then one scale a row; every product is then ``A' B'^T`` ("nt"), equal to ``A B^T``
    before quantization.

    X's rows serve the forward (and an SpMM reading X: one cache entry); X's columns,
    quantized in the forward when W needs a gradient, are what backward keeps (cache on),
    or X itself (cache off). W is the parameter: backward reads its other side from the
    cache (one quantization a step)."""

    @staticmethod
    def forward(
        ctx: Any,
        policy: QuantPolicy,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: Any,
        linear: bool,
        recording: bool,
    ) -> torch.Tensor:  # type: ignore[override]
        rows, columns = _sides(policy)
        value = policy.cached(x, recording, rows, shifted=True)
        qx, sx = value
        qw, sw = policy.cached(w, recording, rows if linear else columns)
        layout = "nt" if linear or policy.rotation else "nn"
        out = int8_gemm(qx, qw, sx, sw, layout, bias, policy.backend)
        if value.shift is not None:
            _add_gemm_shift(out, value.shift, qw, sw, layout)
        needs = ctx.needs_input_grad  # (policy, x, w, bias, linear, recording)
        ctx.policy, ctx.linear, ctx.has_bias = policy, linear, bias is not None
        ctx.keeps_quantized = policy.cache is not None
        ctx.x_constant = policy.constant(x, recording)
        x_cols: tuple[torch.Tensor, ...] = ()
        if needs[2] and recording:  # an evaluation (nothing recorded) runs no backward
            # kept packed where the policy packs: only backward reads them, unpacked there
            nodes = policy.node_side()
            x_cols = (
                policy.cached(x, recording, nodes, packed=True) if ctx.keeps_quantized else (x,)
            )
            ctx.x_width = policy.quantized_width(x, nodes)
        ctx.save_for_backward(*x_cols, w if needs[1] else None)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _backward(ctx, grad, "gemm", RowQuantLinear._grads, RowQuantLinear._fp32_grads)

    @staticmethod
    def _grads(ctx: Any, grad: torch.Tensor) -> Grads:
        policy: QuantPolicy = ctx.policy
        rows, columns = _sides(policy)
        saved = ctx.saved_tensors
        grad = grad.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[1]:  # sums over the output features
            qw, sw = policy.cached(saved[-1], True, columns if ctx.linear else rows)
            qg, sg = policy.gradient(grad, rows)
            layout = "nn" if ctx.linear and not policy.rotation else "nt"
            dx = int8_gemm(qg, qw, sg, sw, layout, None, policy.backend)
        if ctx.needs_input_grad[2]:  # sums over the nodes
            nodes = policy.node_side()
            if ctx.keeps_quantized:
                qxc, sxc = saved[0], saved[1]
                if nodes != NODE_BLOCKS:  # the block GEMM reads packed columns as they are
                    qxc, sxc = policy.unpacked((qxc, sxc), ctx.x_width)
                policy.note_reuse()
            else:
                qxc, sxc = policy.fresh(saved[0], False, nodes)
            qgc, sgc = policy.gradient(grad, nodes)
            if nodes == NODE_BLOCKS:
                block = policy.scale_block
                if ctx.linear:  # dW [N, K] = dY^T X
                    dw = int8_block_gemm(qgc, qxc, sgc, sxc, block, policy.backend)
                else:  # dW [K, N] = X^T dY
                    dw = int8_block_gemm(qxc, qgc, sxc, sgc, block, policy.backend)
            elif not policy.rotation:
                dw = QuantLinear._weight_grad(ctx, qxc, sxc, qgc, sgc)
            elif ctx.linear:  # dW [N, K] = dY^T X
                dw = int8_gemm(qgc, qxc, sgc, sxc, "nt", None, policy.backend)
            else:  # dW [K, N] = X^T dY
                dw = int8_gemm(qxc, qgc, sxc, sgc, "nt", None, policy.backend)
        return None, dx, dw, QuantLinear._bias_grad(ctx, grad), None, None

    @staticmethod
    def _fp32_grads(ctx: Any, grad: torch.Tensor) -> Grads:
        """Float32 backward; kept rotated columns of X are rotated back (the normalised
        Hadamard matrix is its own inverse) and cut to X's rows."""
        policy: QuantPolicy = ctx.policy
        saved = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[1]:
            w = saved[-1]
            dx = grad @ w if ctx.linear else grad @ w.t()
        if ctx.needs_input_grad[2]:
            if ctx.keeps_quantized:
                qx, sx = policy.unpacked((saved[0], saved[1]), ctx.x_width)
                if policy.node_side() == NODE_BLOCKS and sx.dim() == 2:
                    x = dequantize_tiles(qx, sx, (policy.scale_block, 1))
                else:
                    x = dequantize(qx, sx)
            else:
                x = saved[0]
            if ctx.keeps_quantized and policy.rotation:
                block = policy.rotation_block(grad.shape[0])
                x = hadamard_rotate(x, block, policy.backend)[:, : grad.shape[0]].t()
            dw = grad.t() @ x if ctx.linear else x.t() @ grad
        return None, dx, dw, QuantLinear._bias_grad(ctx, grad), None, None


def _add_gemm_shift(
    out: torch.Tensor, shift: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, layout: str
) -> None:
    """Add to ``out = (q s) W`` the share of X's zero points (affine levels: X = q s + m):
    ``m`` times the sums of the dequantized W over the dimension the product sums (W
    [N, K] for "nt", [K, N] for "nn"), so out is what the dequantized operands make."""
    sums = dequantize(qw, sw).sum(1 if layout == "nt" else 0)
    out.addmm_(shift, sums.unsqueeze(0))


def _sides(policy: QuantPolicy) -> tuple[str, str]:
    """What :class:`RowQuantLinear` asks for by rows and by columns: rotated or not."""
    return (ROTATED_ROWS, ROTATED_COLUMNS) if policy.rotation else (ROWS, COLUMNS)


def quant_linear(
    policy: QuantPolicy,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    linear: bool,
) -> torch.Tensor:
    """Quantized dense product for x of any rank >= 2 (leading dims flattened)."""
    function: type[torch.autograd.Function] = QuantLinear
    if policy.per_row or policy.rotation:
        function = RowQuantLinear
    if x.dim() == 2:
        return function.apply(policy, x, w, bias, linear, torch.is_grad_enabled())
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    out = function.apply(policy, flat, w, bias, linear, torch.is_grad_enabled())
    return out.reshape(*lead, out.shape[-1])


# ---------------------------------------------------------------- typed GEMM


class QuantSegmentMM(torch.autograd.Function):
    """``x [N, K]`` times ``w[r] [K, M]`` for the rows of segment r (DGL's ``segment_mm``,
    every typed linear layer's product), INT8 with per-tensor scales: one segment GEMM
    forward (``nn``) and two backward (``nt`` for dx, ``tn`` for dW)."""

    @staticmethod
    def forward(
        ctx: Any,
        policy: QuantPolicy,
        x: torch.Tensor,
        w: torch.Tensor,
        offsets: torch.Tensor,
        recording: bool,
    ) -> torch.Tensor:  # type: ignore[override]
        # the segment GEMM takes one scale per operand
        qx, sx = policy.cached(x, recording, TENSOR)
        qw, sw = policy.cached(w, recording, TENSOR)
        out = int8_segment_gemm(qx, qw, offsets, sx, sw, "nn", policy.backend)
        needs = ctx.needs_input_grad  # (policy, x, w, offsets): dX reads w, dW reads x
        _saved(ctx, policy, (x, w), ((qx, sx), (qw, sw)), (offsets,), needed=(needs[2], needs[1]))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _backward(
            ctx, grad, "segment_gemm", QuantSegmentMM._grads, QuantSegmentMM._fp32_grads
        )

    @staticmethod
    def _grads(ctx: Any, grad: torch.Tensor) -> Grads:
        stored, (offsets,) = _unpacked(ctx)
        (qx, sx), (qw, sw) = _operands(ctx, stored, TENSOR)
        policy: QuantPolicy = ctx.policy
        qg, sg = policy.gradient(grad.contiguous(), TENSOR)
        dx = dw = None
        if ctx.needs_input_grad[1]:
            dx = int8_segment_gemm(qg, qw, offsets, sg, sw, "nt", policy.backend)
        if ctx.needs_input_grad[2]:
            dw = int8_segment_gemm(qx, qg, offsets, sx, sg, "tn", policy.backend)
        return None, dx, dw, None, None

    @staticmethod
    def _fp32_grads(ctx: Any, grad: torch.Tensor) -> Grads:
        x, w = _floats(ctx)
        _, (offsets,) = _unpacked(ctx)
        ops = torch.ops.qtrain
        dx = ops.segment_matmul(grad, offsets, w, True) if ctx.needs_input_grad[1] else None
        dw = ops.segment_matmul_tn(x, offsets, grad) if ctx.needs_input_grad[2] else None
        return None, dx, dw, None, None


# ---------------------------------------------------------------- SpMM


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as [N, D] or [N, H, D] (what the kernels take)."""
    if x.dim() in (2, 3):
        return x
    if x.dim() == 1:
        return x.reshape(-1, 1)
    return x.reshape(x.shape[0], x.shape[1], -1)


def _gather_sum(
    policy: QuantPolicy,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    value: tuple[torch.Tensor, torch.Tensor],
    width: int,
    weight: torch.Tensor | None = None,
    eids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The SpMM of quantized rows of ``width`` values: packed ones (uint8, what the policy
    stores at 4 bits or fewer) by ``qspmm4``, which gathers half the bytes, int8 by ``qspmm``."""
    q, s = value
    if q.dtype == torch.uint8:
        return qspmm_packed(indptr, indices, q, width, s, weight, eids, policy.backend)
    return qspmm(indptr, indices, q, s, weight, eids, policy.backend)


def _edge_dots(
    policy: QuantPolicy,
    csr: GraphCSR,
    x: tuple[torch.Tensor, torch.Tensor],
    g: tuple[torch.Tensor, torch.Tensor],
    width: int,
) -> torch.Tensor:
    """Each edge's dot of its source's row of x and its destination's row of g (rows of
    ``width`` values; per head for 3-d rows): the SDDMM over packed rows (``qsddmm4``, which
    reads the nibbles) when both are stored packed, else over int8 rows (a packed side
    unpacked)."""
    (qx, sx), (qg, sg) = x, g
    if qx.dtype == torch.uint8 and qg.dtype == torch.uint8:
        return qsddmm_packed("dot", qx, sx, csr.src, qg, sg, csr.dst, width, policy.backend)
    qx, sx = policy.unpacked((qx, sx), width)
    qg, sg = policy.unpacked((qg, sg), width)
    return qsddmm("dot", qx, sx, csr.src, qg, sg, csr.dst, policy.backend)


def _spread_shift(
    csr: GraphCSR, shift: torch.Tensor, weight: torch.Tensor | None, like: torch.Tensor
) -> torch.Tensor:
    """The share of the gathered rows' zero points (affine levels, ``shift`` [N, 1] or
    [N, H, 1]) in each destination's (edge-weighted) sum, shaped to add to ``like``."""
    messages = shift.index_select(0, csr.src.long())
    if weight is not None:
        messages = messages * weight
    total = like.new_zeros((like.shape[0], *messages.shape[1:]))
    return total.index_add_(0, csr.dst.long(), messages)


class QuantSpMM(torch.autograd.Function):
    """Sum aggregation of ``copy_u`` (node to node) or ``u_mul_e`` messages."""

    @staticmethod
    def forward(
        ctx: Any, policy: QuantPolicy, csr: GraphCSR, x: torch.Tensor, w: Any, recording: bool
    ) -> torch.Tensor:  # type: ignore[override]
        value = policy.cached(x, recording, ROWS, packed=True, shifted=True)
        qx, sx = value
        ctx.width = x.shape[-1]
        out = _gather_sum(
            policy, csr.in_indptr, csr.in_indices, (qx, sx), ctx.width, w, csr.in_eids
        )
        if value.shift is not None:
            out.add_(_spread_shift(csr, value.shift, w, out))
        ctx.csr = csr
        ctx.w_shape = None if w is None else w.shape
        # only the weight's gradient reads x (dX is the transposed aggregation of the gradient)
        x_needed = w is not None and ctx.needs_input_grad[3]
        # the zero points of x's affine levels, for the kept quantization (cache on)
        shift = value.shift if x_needed and policy.cache is not None else None
        _saved(
            ctx,
            policy,
            (x,),
            ((qx, sx),),
            (None if w is None else w.detach(), shift),
            needed=(x_needed,),
        )
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _backward(ctx, grad, "spmm", QuantSpMM._grads, QuantSpMM._fp32_grads)

    @staticmethod
    def _grads(ctx: Any, grad: torch.Tensor) -> Grads:
        csr: GraphCSR = ctx.csr
        policy: QuantPolicy = ctx.policy
        qg, sg = policy.gradient(grad.contiguous(), packed=True)
        stored, (w, shift) = _unpacked(ctx)
        dx = dw = None
        if ctx.needs_input_grad[2]:
            dx = _gather_sum(
                policy, csr.out_indptr, csr.out_indices, (qg, sg), grad.shape[-1], w, csr.out_eids
            )
        if w is not None and ctx.needs_input_grad[3]:
            ((qx, sx),) = _operands(ctx, stored)
            dots = _edge_dots(policy, csr, (qx, sx), (qg, sg), ctx.width)
            if shift is not None:  # x = q s + m: m times the sum of each gradient row
                qg, sg = policy.unpacked((qg, sg), ctx.width)
                sums = dequantize(qg, sg).sum(-1, keepdim=True).index_select(0, csr.dst.long())
                dots = dots + shift.index_select(0, csr.src.long()) * sums
            dw = _reduce_to(dots, ctx.w_shape)
        return None, None, dx, dw, None

    @staticmethod
    def _fp32_grads(ctx: Any, grad: torch.Tensor) -> Grads:
        csr: GraphCSR = ctx.csr
        src, dst = csr.src.long(), csr.dst.long()
        w, shift = _unpacked(ctx)[1]
        grad_e = grad.index_select(0, dst)  # each edge's destination gradient
        dx = dw = None
        if ctx.needs_input_grad[2]:
            messages = grad_e if w is None else grad_e * w
            dx = grad.new_zeros((csr.num_src, *grad.shape[1:])).index_add_(0, src, messages)
        if w is not None and ctx.needs_input_grad[3]:
            (x,) = _floats(ctx, (ctx.width,))
            if shift is not None:
                x = x + shift
            dots = (x.index_select(0, src) * grad_e).sum(-1, keepdim=True)
            dw = _reduce_to(dots, ctx.w_shape)
        return None, None, dx, dw, None


class QuantEdgeToNode(torch.autograd.Function):
    """``copy_e`` sum: edge data summed into destination nodes, the incidence-matrix SpMM."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, policy: QuantPolicy, csr: GraphCSR, e: torch.Tensor, recording: bool
    ) -> torch.Tensor:
        q, s = policy.fresh(e, policy.constant(e, recording))
        ctx.csr = csr
        return qspmm(csr.in_indptr, csr.in_eids, q, s, backend=policy.backend)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        csr: GraphCSR = ctx.csr
        return None, None, grad.index_select(0, csr.dst.long()), None


def _reduce_to(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum x ([E, H, 1] or [E, 1]) down to a broadcast operand's shape."""
    if x.shape == shape:
        return x
    if x.numel() == int(torch.Size(shape).numel()):
        return x.reshape(shape)
    # a per-edge scalar weight shared by H heads: sum the heads' contributions
    return x.flatten(1).sum(1).reshape(shape)


# ---------------------------------------------------------------- SDDMM


def _segment_sum(
    policy: QuantPolicy, indptr: torch.Tensor, eids: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    q, s = policy.fresh(values.contiguous())
    return qspmm(indptr, eids, q, s, backend=policy.backend)


class QuantSDDMM(torch.autograd.Function):
    """Per-edge ``u op v`` (or ``v op u``) on quantized node data: add, sub, mul, dot."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        policy: QuantPolicy,
        csr: GraphCSR,
        op: str,
        x: torch.Tensor,
        y: torch.Tensor,
        lhs_is_src: bool,
        recording: bool,
    ) -> torch.Tensor:
        qx, sx = _operand(policy, x, recording)
        qy, sy = _operand(policy, y, recording)
        lhs_index, rhs_index = (csr.src, csr.dst) if lhs_is_src else (csr.dst, csr.src)
        out = qsddmm(op, qx, sx, lhs_index, qy, sy, rhs_index, policy.backend)
        ctx.csr, ctx.op, ctx.lhs_is_src = csr, op, lhs_is_src
        # add / sub backward sums the gradient per node and reads neither operand;
        # dot / mul: x's gradient reads y and y's reads x
        needs = ctx.needs_input_grad  # (policy, csr, op, x, y, lhs_is_src, recording)
        products = op in ("dot", "mul")
        _saved(
            ctx,
            policy,
            (x, y),
            ((qx, sx), (qy, sy)),
            needed=(products and needs[4], products and needs[3]),
        )
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return _backward(ctx, grad, "sddmm", QuantSDDMM._grads, QuantSDDMM._fp32_grads)

    @staticmethod
    def _grads(ctx: Any, grad: torch.Tensor) -> Grads:
        csr: GraphCSR = ctx.csr
        policy: QuantPolicy = ctx.policy
        # rows grouped by the lhs node (src: out-CSR) or by the rhs node
        src_side = (csr.out_indptr, csr.out_indices, csr.out_eids)
        dst_side = (csr.in_indptr, csr.in_indices, csr.in_eids)
        lhs_side, rhs_side = (src_side, dst_side) if ctx.lhs_is_src else (dst_side, src_side)
        lhs_index, rhs_index = (csr.src, csr.dst) if ctx.lhs_is_src else (csr.dst, csr.src)
        dx = dy = None
        if ctx.op in ("add", "sub"):
            if ctx.needs_input_grad[3]:
                dx = _segment_sum(policy, lhs_side[0], lhs_side[2], grad)
            if ctx.needs_input_grad[4]:
                dy = _segment_sum(policy, rhs_side[0], rhs_side[2], grad)
                dy = -dy if ctx.op == "sub" else dy
        elif ctx.op == "dot":
            (qx, sx), (qy, sy) = _restored(ctx)
            w = grad.flatten(1)  # [E, H]
            if ctx.needs_input_grad[3]:
                dx = qspmm(lhs_side[0], lhs_side[1], qy, sy, w, lhs_side[2], policy.backend)
            if ctx.needs_input_grad[4]:
                dy = qspmm(rhs_side[0], rhs_side[1], qx, sx, w, rhs_side[2], policy.backend)
        else:  # mul: elementwise weights per feature, done in float32 on the dequantized data
            (qx, sx), (qy, sy) = _restored(ctx)
            if ctx.needs_input_grad[3]:
                y_e = dequantize(qy, sy).index_select(0, rhs_index.long())
                dx = grad.new_zeros((csr_rows(csr, ctx.lhs_is_src), *grad.shape[1:]))
                dx.index_add_(0, lhs_index.long(), grad * y_e)
            if ctx.needs_input_grad[4]:
                x_e = dequantize(qx, sx).index_select(0, lhs_index.long())
                dy = grad.new_zeros((csr_rows(csr, not ctx.lhs_is_src), *grad.shape[1:]))
                dy.index_add_(0, rhs_index.long(), grad * x_e)
        return None, None, None, dx, dy, None, None

    @staticmethod
    def _fp32_grads(ctx: Any, grad: torch.Tensor) -> Grads:
        """add and sub: the gradient summed per node. (dot and mul quantize no gradient:
        they take it as float32 weights.)"""
        csr: GraphCSR = ctx.csr
        lhs_index, rhs_index = (csr.src, csr.dst) if ctx.lhs_is_src else (csr.dst, csr.src)
        dx = dy = None
        if ctx.needs_input_grad[3]:
            dx = grad.new_zeros((csr_rows(csr, ctx.lhs_is_src), *grad.shape[1:]))
            dx.index_add_(0, lhs_index.long(), grad)
        if ctx.needs_input_grad[4]:
            dy = grad.new_zeros((csr_rows(csr, not ctx.lhs_is_src), *grad.shape[1:]))
            dy.index_add_(0, rhs_index.long(), -grad if ctx.op == "sub" else grad)
        return None, None, None, dx, dy, None, None


def csr_rows(csr: GraphCSR, src_side: bool) -> int:
    """Number of nodes on the source or destination side."""
    return csr.num_src if src_side else csr.num_dst
