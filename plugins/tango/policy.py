"""How a run quantizes: bit count, rounding, scale granularity, the random stream, the
cache, the backend.

One ``QuantPolicy`` lives for one plugin activation. Stochastic rounding takes
its counters from one stream per policy: each quantization takes the next
``numel`` counters, so a run with the same seed and the same sequence of
calls draws the same random numbers (runs repeat), and no two tensors share
randomness.

Scales (issue 32): ``"tensor"`` gives every quantized tensor one scale (tango-sc23's
rule). ``"row"`` gives one scale per row, so a few large rows (hub nodes, a large
output feature) no longer leave the others with one or two levels at 4 bits. A
product can only take scales that do not vary along the dimension it sums over, so
each caller says which quantization it needs (``by``): ``"rows"`` (one scale per row of
x: a GEMM's left operand, an SpMM's gathered rows), ``"columns"`` (one scale per
column, q in x's layout: the operands of a product that sums over x's rows, such as
a weight gradient X^T dY, or a weight read as ``x @ W``) or ``"tensor"`` (a product
whose kernel takes one scale). With ``scales = "tensor"`` every ``by`` gives the
per-tensor quantization.

``"block"`` is ``"row"`` except for the products that sum over the nodes (a weight
gradient X^T dY): they ask for ``"node blocks"``, one scale per block of ``scale_block``
rows (nodes) of each column, and multiply with ``int8_block_gemm``. One scale per column
spans every node (169,343 on synthetic-arxiv), and at 2 bits it rounds most of a
gradient column to 0: the step's gradient error there is 2.1 with one scale per column
and 0.57 with blocks of 64 (README, "Scales per block").

Rotation (``rotation = B``): a GEMM may instead ask for ``"rotated rows"`` (x's last
dimension, padded to a multiple of B, times the block-diagonal Hadamard matrix, then one
scale per row) or ``"rotated columns"`` (the same for x's first dimension: the rows of
the rotated x^T). Rotating both operands of a product along the dimension it sums over
leaves the product unchanged, ``(A H)(B H)^T = A B^T``, and spreads one large value over
its block before the few levels of a low bit count are divided among a row.

Weights (``weight_bits``): the parameters a product reads are small next to the node
tensors (a [K, N] weight against [nodes, K] activations) and quantized once a step, so
their bit count decides little of what a step reads or saves; at 4 bits and below they
lose accuracy that more bits there win back (synthetic-arxiv GCN at 4 bits, README).

Packed operands (``packed``): at 4 bits or fewer a quantized value fits a nibble, so an
operand asked for ``packed`` is stored two values a byte (uint8 ``[..., ceil(D / 2)]``,
``qtrain.ops.packed``): what the cache keeps, what a product saves for its backward and the
rows an SpMM gathers (``qspmm4``) and an SDDMM reads (``qsddmm4``) take half the bytes of
int8. Rows and columns (one scale per column or per block of nodes) are quantized straight
into nibbles (``quantize_per_row_packed``, ``quantize_per_column_packed``: no int8 copy);
the block GEMM of a weight gradient reads packed columns as stored, the other GEMMs (which
read int8) unpack; a tensor asked for both forms is quantized once, the second form made
from the first (packing or unpacking, no second draw).

Unsigned levels (``unsigned``): symmetric levels ``-(2^(b-1) - 1) .. 2^(b-1) - 1`` spend
half their codes on signs that a ReLU's output never has: at 2 bits such a tensor keeps
only 0 and its row's maximum. A tensor without negative values quantized at
``UNSIGNED_MAX_BITS`` or fewer takes the unsigned levels ``0 .. 2^b - 1`` instead, with
scale ``absmax / (2^b - 1)``: exactly what the symmetric quantizer at ``b + 1`` bits makes
of a nonnegative tensor, so the kernels are the same and every value still fits b bits.

Affine levels (``affine``): a signed activation (a linear layer's output, an ELU's) at
2 bits on symmetric levels keeps -max, 0 and +max of its row, and most of a row rounds to
0: synthetic-arxiv GAT's step gradient error is 2.9 at 2 bits with them. A product that
can correct for it (``shifted``: the GEMM's X by rows, an SpMM's gathered rows) asks for
affine levels, and at ``UNSIGNED_MAX_BITS`` or fewer such an operand with a negative value
is quantized as ``x - m`` on the unsigned levels, ``m`` each row's minimum (its zero
point, kept as the value's ``shift``): the levels span the row's minimum to its maximum.
The product adds m's share (``m * colsum(W)`` for a GEMM, the aggregated ``m`` for an
SpMM) in float32, so it computes exactly what the dequantized operands make. Weights and
gradients keep the symmetric levels (gradients: affine levels there lowered GAT's error by
about 0.07 only, simulated, and every backward product would need the correction).

Step inputs (``input_bits``): a forward operand that takes no part in the gradient a
training step records (the node features, or what the model computes from them alone,
such as GCN's normalised and aggregated features) is quantized at ``input_bits``, every
other tensor (weights, activations, gradients) at ``bits``. Such a tensor is remembered
(weakly), so an evaluation reading the same tensor (the features) quantizes it as the
steps did. Measured on synthetic-arxiv GCN at 4 bits (README): the step inputs at 8
bits recover most of what 4 bits lose, and they cost nothing a step (quantized once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from qtrain.plugins.tango.cache import QuantCache, Quantized
from torch.utils.weak import WeakIdKeyDictionary

from qtrain.ops.packed import pack_int4, unpack_int4
from qtrain.ops.quantize import (
    PACKED_ROW_BITS,
    quantize,
    quantize_per_column,
    quantize_per_column_packed,
    quantize_per_row,
    quantize_per_row_packed,
)
from qtrain.ops.rotate import hadamard_rotate

_CONSTANT_MIX = 0xBF58476D1CE4E5B9  # odd: seeds of step constants apart from the stream's
ROWS, COLUMNS, TENSOR = "rows", "columns", "tensor"  # what a primitive asks for (``by``)
ROTATED_ROWS, ROTATED_COLUMNS = "rotated rows", "rotated columns"  # with ``rotation``
NODE_BLOCKS = "node blocks"  # with scales = "block": a scale per block of rows of a column
PACKABLE_BITS = PACKED_ROW_BITS  # at this bit count or fewer a quantized value fits a nibble
# unsigned levels for a nonnegative tensor up to this bit count: its values 0..2^bits - 1
# still fit the signed nibble that packed operands keep (0..7 at 3 bits)
UNSIGNED_MAX_BITS = 3


def resolve_scales(scales: str, rotation: int = 0) -> str:
    """The granularity a run with ``scales`` (``"auto"``, ``"tensor"``, ``"row"`` or
    ``"block"``) quantizes with: ``"auto"`` is ``"block"`` at every bit count. One scale per
    tensor loses accuracy at 4 bits on every recipe (Cora GCN: 75.3 per tensor, 80.8 per
    row, FP32 80.9) and at 8 bits on a larger graph (synthetic-arxiv GCN, 3 seeds: 83.9 per
    tensor, 86.3 per row, FP32 86.3); per row costs 5-25% more epoch time (README). Blocks
    of nodes in the weight gradient cut one step's gradient error on synthetic-arxiv GCN
    from 0.30 to 0.07 at 4 bits and from 2.1 to 0.57 at 2 bits (README, "Scales per
    block"). With a ``rotation`` the weight gradient's operands are rotated columns, so
    ``"auto"`` is ``"row"`` there."""
    if scales == "auto":
        return "row" if rotation else "block"
    return scales


def is_weight(x: torch.Tensor) -> bool:
    """A weight: a leaf that needs a gradient (a parameter, in training and in evaluation)."""
    return x.requires_grad and x.is_leaf


def rotation_block(rotation: int, length: int) -> int:
    """The Hadamard block for a summed dimension of ``length``: ``rotation``, or the
    smallest power of two covering a shorter dimension (7 classes pad to 8, not 32)."""
    return min(rotation, 1 << max(length - 1, 0).bit_length())


class NonFiniteOperand(ValueError):
    """An operand holds NaN or Inf, which the quantizer refuses: the primitive runs in
    float32 instead, so a diverged step shows NaN / Inf as in float32 rather than failing."""


@dataclass
class QuantPolicy:
    """Quantization settings plus the state they need (counter stream, cache).

    Nothing here is checked: tango's config validated the settings where the recipe
    entered, and the op's front (or the reference) checks them again at the kernel."""

    bits: int = 8
    input_bits: int | None = None  # the step inputs' bit count (module doc); None: bits
    weight_bits: int | None = None  # the weights' bit count (module doc); None: bits
    rounding: str = "stochastic"
    scales: str = "tensor"  # "tensor", "row" or "block" (resolved: never "auto")
    scale_block: int = 64  # rows of a column per scale of a "node blocks" quantization
    rotation: int = 0  # Hadamard block along a GEMM's summed dimension; 0: none
    packed: bool = False  # store operands asked for ``packed`` two 4-bit values a byte
    unsigned: bool = False  # unsigned levels for nonnegative tensors (module doc)
    unsigned_quantized: int = 0  # quantizations that took the unsigned levels
    affine: bool = False  # affine levels for signed activations asked for ``shifted``
    affine_quantized: int = 0  # quantizations that took affine levels
    seed: int = 0
    cache: QuantCache | None = field(default_factory=QuantCache)
    backend: str = "auto"
    # told (primitive, why) when a backward runs in float32 (tango's fp32_calls report)
    on_fp32: Callable[[str, str], None] | None = None
    step_inputs_quantized: int = 0  # quantizations made at input_bits, not bits
    weights_quantized: int = 0  # quantizations made at weight_bits, not bits
    operands_packed: int = 0  # quantized operands stored packed (two values a byte)
    _offset: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # tensors quantized as step inputs while a step recorded (weakly: they die freely)
    _step_inputs: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary, repr=False)

    def _take(self, n: int) -> int:
        with self._lock:
            start = self._offset
            self._offset += n
        return start

    def gradient(self, grad: torch.Tensor, by: str = ROWS, packed: bool = False) -> Quantized:
        """Quantize an incoming gradient. Through the cache when it is on: autograd hands
        one tensor to every branch of a sum (RGCN's relation messages plus its self-loop,
        a residual), and each branch's quantized backward then reads one quantization
        instead of making its own. The cache holds tensors weakly, so no gradient outlives
        its backward. ``packed`` as in :meth:`cached`."""
        return self._through_cache(grad, False, by, None, packed)

    @staticmethod
    def constant(x: torch.Tensor, recording: bool | None = None) -> bool:
        """True for a forward operand that takes no part in the gradient being recorded:
        a step input (the node features, or what the model computes from them alone),
        or anything of an evaluation (no gradient recorded).

        ``recording``: whether the primitive's caller records a gradient, taken where it
        was called (``torch.is_grad_enabled()`` there; the default reads it now). Inside
        an autograd Function's forward grad mode is always off, so a forward must be
        told: read there, every weight and activation would count as a constant."""
        if recording is None:
            recording = torch.is_grad_enabled()
        return not (recording and x.requires_grad)

    def bits_for(
        self,
        x: torch.Tensor,
        constant: bool,
        recording: bool,
        derived_from: torch.Tensor | None = None,
    ) -> int:
        """The bit count x is quantized at: ``input_bits`` for a step input (a ``constant``
        while a training step is ``recording``, or one remembered as such, or a constant
        ``derived_from`` one, such as ``r * X`` from the features X), else ``bits``. A step
        input is remembered, and so is what it was derived from. A weight (a leaf that
        needs a gradient: a parameter) takes ``weight_bits``, in an evaluation too."""
        if is_weight(x):
            return self.bits if self.weight_bits is None else self.weight_bits
        if self.input_bits is None or self.input_bits == self.bits or not constant:
            return self.bits
        with self._lock:
            known = self._step_inputs
            step_input = (
                recording or x in known or (derived_from is not None and derived_from in known)
            )
            if step_input:
                known[x] = None
                if derived_from is not None:
                    known[derived_from] = None
        return self.input_bits if step_input else self.bits

    def fresh(
        self,
        x: torch.Tensor,
        constant: bool = False,
        by: str = ROWS,
        bits: int | None = None,
        shifted: bool = False,
        packed: bool = False,
    ) -> Quantized:
        """Quantize x now (anything that is used once), ``by`` as the module doc says, at
        ``bits`` (None: :meth:`bits_for` outside a recording step: ``input_bits`` for a
        remembered step input, such as the features a backward without the cache
        quantizes again).

        Stochastic rounding draws from the stream, except for a ``constant``
        (:meth:`constant`): that draws from a seed of its own at counter 0, so its
        quantization depends on its values only, not on how many tensors were
        quantized before it, and an evaluation leaves the stream where it was. The
        cache keeps the node features across steps and an evaluation's weights until
        the optimizer changes them; after a resume they are quantized again and must
        come out as they did.

        ``shifted``: the caller corrects for affine levels (module doc), which x then
        takes where :meth:`shifts` and it has a negative value. ``packed``: stored two
        values a byte (the caller has checked :meth:`packs`); rows are quantized straight
        into nibbles, no int8 copy made."""
        if bits is None:
            bits = self.bits_for(x, True, False)
        if bits != self.bits:
            with self._lock:
                if is_weight(x):
                    self.weights_quantized += 1
                else:
                    self.step_inputs_quantized += 1
        low = self._row_minimum(x) if shifted and self.shifts(x, by, bits) else None
        # the row minima tell a nonnegative x apart too: no second pass for the sign
        nonnegative = None if low is None else bool((low >= 0).all())
        shift = low if nonnegative is False else None
        by = self.granularity(x, by)
        if shift is None:
            target = self._rotated(x, by)
            bits = self._levels(target, bits, nonnegative)
        else:  # x - m is nonnegative: the unsigned levels of bits (module doc)
            target, bits = x - shift, bits + 1
            with self._lock:
                self.affine_quantized += 1
        seed, offset = self.seed, 0
        if self.rounding == "stochastic":
            if constant:
                seed = (self.seed * _CONSTANT_MIX + x.numel()) % 2**64
            else:
                offset = self._take(target.numel())
        try:
            q, scale = self._quantize(target, by, bits, seed, offset, packed)
        except ValueError:
            # checked only once the quantizer has refused x: no extra pass when x is finite
            if bool(torch.isfinite(x).all()):
                raise
            raise NonFiniteOperand("operand holds NaN or Inf") from None
        return Quantized(q, scale, shift)

    def shifts(self, x: torch.Tensor, by: str, bits: int) -> bool:
        """Whether x, asked for ``shifted`` ``by`` at ``bits``, may take affine levels: with
        ``affine``, at ``UNSIGNED_MAX_BITS`` or fewer, by rows (not rotated), x not a weight."""
        return (
            self.affine
            and bits <= UNSIGNED_MAX_BITS
            and not is_weight(x)
            and self.granularity(x, by) == ROWS
        )

    @staticmethod
    def _row_minimum(x: torch.Tensor) -> torch.Tensor | None:
        """Each row's minimum (``[..., 1]``; NaN where a row holds one, which the quantizer
        then refuses), or None for an empty x."""
        if x.numel() == 0:
            return None
        return x.detach().amin(-1, keepdim=True)

    @property
    def per_row(self) -> bool:
        """Whether products take one scale per row (``scales`` "row" or "block")."""
        return self.scales in ("row", "block")

    def node_side(self) -> str:
        """What a product that sums over the nodes (a weight gradient X^T dY) asks for of X
        and dY: their rotated columns (``rotation``), blocks of ``scale_block`` rows of each
        column (``scales = "block"``) or their columns."""
        if self.rotation:
            return ROTATED_COLUMNS
        return NODE_BLOCKS if self.scales == "block" else COLUMNS

    def _levels(self, x: torch.Tensor, bits: int, nonnegative: bool | None = None) -> int:
        """The symmetric bit count that quantizes x: ``bits + 1`` (the unsigned levels of
        ``bits``, module doc) for a tensor without negative values where ``unsigned`` and
        ``bits <= UNSIGNED_MAX_BITS``, else ``bits``. NaN never passes the test.
        ``nonnegative``: the sign test's answer where the caller has it already."""
        if not self.unsigned or bits > UNSIGNED_MAX_BITS or x.numel() == 0:
            return bits
        if nonnegative is None:
            nonnegative = bool((x.amin() >= 0).item())
        if not nonnegative:
            return bits
        with self._lock:
            self.unsigned_quantized += 1
        return bits + 1

    def granularity(self, x: torch.Tensor, by: str) -> str:
        """What x is quantized by: ``by``, or one scale for the whole tensor where the
        policy's scales are per tensor or x has no rows to speak of (one dimension)."""
        if by in (ROTATED_ROWS, ROTATED_COLUMNS):
            return by  # asked for by the rotated GEMM only, which passes 2-d operands
        if (
            self.scales == "tensor"
            or x.dim() < 2
            or (by in (COLUMNS, NODE_BLOCKS) and x.dim() != 2)
        ):
            return TENSOR
        return by

    def _rotated(self, x: torch.Tensor, by: str) -> torch.Tensor:
        """What is quantized for ``by``: x, or x (rotated rows) / x^T (rotated columns) with
        its last dimension rotated in blocks of ``rotation``."""
        if by == ROTATED_ROWS:
            return hadamard_rotate(x, self.rotation_block(x.shape[-1]), self.backend)
        if by == ROTATED_COLUMNS:
            return hadamard_rotate(x.t(), self.rotation_block(x.shape[0]), self.backend)
        return x

    def rotation_block(self, length: int) -> int:
        """The Hadamard block for a summed dimension of ``length`` (:func:`rotation_block`)."""
        return rotation_block(self.rotation, length)

    def _quantize(
        self, x: torch.Tensor, by: str, bits: int, seed: int, offset: int, packed: bool = False
    ) -> Quantized:
        args = (bits, self.rounding, seed, offset, self.backend)
        block = self.scale_block if by == NODE_BLOCKS else 0  # a column quantizer's block
        if packed:  # bits <= PACKABLE_BITS: the caller checked packs
            if by in (ROWS, ROTATED_ROWS):
                value = Quantized(*quantize_per_row_packed(x, *args))
            elif by in (COLUMNS, NODE_BLOCKS):
                value = Quantized(*quantize_per_column_packed(x, *args, block=block))
            else:
                q, scale = self._quantize(x, by, bits, seed, offset)
                value = Quantized(pack_int4(q, self.backend), scale)
            with self._lock:
                self.operands_packed += 1
            return value
        if by == TENSOR:
            return quantize(x, *args)
        if by in (COLUMNS, NODE_BLOCKS):
            return quantize_per_column(x, *args, block=block)
        return quantize_per_row(x, *args)  # rows, and the rows of a rotated x

    def cached(
        self,
        x: torch.Tensor,
        recording: bool | None = None,
        by: str = ROWS,
        packed: bool = False,
        shifted: bool = False,
    ) -> Quantized:
        """Quantize a forward operand, reusing an earlier quantization of the same unchanged
        tensor if cached (a constant's and a stream draw's are kept apart: a weight an
        evaluation quantized is not what the next training step draws). ``recording`` as
        in :meth:`constant`; ``by`` as the module doc says. ``packed``: the caller reads
        packed rows too (uint8, two values a byte), which it gets where the policy packs
        and x's bit count allows (:meth:`packs`); the width to unpack them to is
        :meth:`quantized_width`. ``shifted``: the caller corrects for affine levels (the
        value's ``shift``, module doc)."""
        if recording is None:
            recording = torch.is_grad_enabled()
        constant = self.constant(x, recording)
        bits = self.bits_for(x, constant, recording)
        return self._through_cache(x, constant, by, bits, packed, shifted)

    def packs(self, bits: int) -> bool:
        """Whether an operand asked for packed at ``bits`` is stored packed."""
        return self.packed and bits <= PACKABLE_BITS

    def quantized_width(self, x: torch.Tensor, by: str) -> int:
        """The last dimension of x's quantization ``by``: what packed rows unpack to (a
        rotated side is padded to its Hadamard block; rotated columns are x^T's rows)."""
        by = self.granularity(x, by)
        if by == ROTATED_ROWS:
            length = x.shape[-1]
        elif by == ROTATED_COLUMNS:
            length = x.shape[0]
        else:
            return x.shape[-1]
        block = self.rotation_block(length)
        return -(-length // block) * block

    def unpacked(self, value: Quantized, width: int) -> Quantized:
        """``value`` as int8 (packed rows unpacked to ``width``; int8 as it is)."""
        value = Quantized.of(value)
        q, s = value
        if q.dtype != torch.uint8:
            return value
        return Quantized(unpack_int4(q, width, self.backend), s, value.shift)

    def _through_cache(
        self,
        x: torch.Tensor,
        constant: bool,
        by: str,
        bits: int | None = None,
        packed: bool = False,
        shifted: bool = False,
    ) -> Quantized:
        bits = self.bits if bits is None else bits
        packed = packed and self.packs(bits)
        shifted = shifted and self.shifts(x, by, bits)
        if self.cache is None:
            return self.fresh(x, constant, by, bits, shifted, packed)
        settings = self._settings(constant, self.granularity(x, by), bits, shifted)
        packed_settings = (*settings, "packed")
        mine, other = (packed_settings, settings) if packed else (settings, packed_settings)
        cache = self.cache

        def make(t: torch.Tensor) -> Quantized:
            # one quantization a tensor: its other form, if cached, converted
            found = cache.peek(t, other)
            if found is None:
                return self.fresh(t, constant, by, bits, shifted, packed)
            if packed:
                return self._packed(found)
            return self.unpacked(found, self.quantized_width(t, by))

        return cache.get_or_quantize(x, mine, make)

    def _packed(self, value: Quantized) -> Quantized:
        """An int8 quantization (values within a nibble) as packed rows."""
        value = Quantized.of(value)
        with self._lock:
            self.operands_packed += 1
        return Quantized(pack_int4(value[0], self.backend), value[1], value.shift)

    def store(
        self,
        x: torch.Tensor,
        value: Quantized,
        by: str = ROWS,
        bits: int | None = None,
        shifted: bool = False,
    ) -> None:
        """Cache ``value``, made at ``bits`` (None: ``bits_for`` x now) and ``shifted`` as
        :meth:`fresh` takes it, as the forward operand ``x``'s quantization ``by`` (with the
        cache on)."""
        if self.cache is not None:
            recording = torch.is_grad_enabled()
            constant = self.constant(x, recording)
            if bits is None:
                bits = self.bits_for(x, constant, recording)
            shifted = shifted and self.shifts(x, by, bits)
            settings = self._settings(constant, self.granularity(x, by), bits, shifted)
            self.cache.put(x, settings, Quantized.of(value))

    def _settings(
        self, constant: bool, granularity: str, bits: int, shifted: bool = False
    ) -> tuple[object, ...]:
        """What a cached quantization was made under (a constant's kept apart, and one
        that may take affine levels from one that may not)."""
        return (bits, self.rounding, self.seed, constant, granularity, shifted)

    def fp32(self, primitive: str, why: str) -> None:
        """Report that a part of ``primitive`` ran in float32 (see ``on_fp32``)."""
        if self.on_fp32 is not None:
            self.on_fp32(primitive, why)

    def note_reuse(self) -> None:
        """Count a forward-to-backward reuse of a quantized operand."""
        if self.cache is not None:
            self.cache.note_reuse()
