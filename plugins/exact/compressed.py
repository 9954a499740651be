"""Compressed storage for the tensors autograd saves (exact-iclr22 sections 3.1-3.3).

:class:`CompressingCodec` is the saved-tensor codec of the ``exact`` plugin
(see ``qtrain.train.activations``). What it does with a saved tensor:

* ``bool`` (the masks of ReLU, LeakyReLU and dropout, see ``qtrain.ops.masks``):
  1 bit per element, exact.
* floating point, at least ``MIN_NUMEL`` elements: viewed as rows (one row per
  index of the first dimension: a node's or an edge's values), optionally
  projected by a normalized Rademacher matrix to ``ceil(width / rp_ratio)``
  columns, but to no fewer than :func:`min_projected_width` (narrower rows
  are not projected), then quantized per row to ``bits`` bits with stochastic rounding
  and bit-packed (``qtrain.quant.rowwise``). At 1 bit with ``rounding = "means"``, each
  row is split at its mean and stored as its two sides' means instead
  (``rowwise.quantize_rows_means``: under a tenth of the stochastic squared error, but
  biased); ``rounding = "auto"`` does so unless every row holding an exact zero has it
  at one of its ends (ReLU's output, dropout's of ReLU's, bag-of-words features): those
  are rounded stochastically between their rows' ends, where such a zero stays exactly
  zero, and the side means would move every zero to its low side's mean, a bias a
  weight gradient sums over every zero (synthetic-arxiv GCN at 1 bit: 85.20 with the
  means everywhere, 86.15 with stochastic rounding for them, FP32 86.24). A zero inside
  its row's range (dropout's output of signed features: GAT's dropped-out inputs) is
  moved by stochastic rounding too, so there the side means, with their smaller error,
  are taken.
  Rows narrower than ``MIN_ROW``
  (GAT's per-edge attention scalars) are regrouped into blocks of
  ``BLOCK`` consecutive elements, so the two 16-bit row parameters do not
  outweigh the data (the last block is padded with its last value, so the
  padding never widens its range); blocks are never projected, and take at
  least ``MIN_BLOCK_BITS`` (a block mixes unrelated edges, whose attention
  values a 1-bit block would round to its two ends: Cora GAT at 1 bit lost
  1.2 points of test accuracy that way). Nor are the
  inputs of BatchNorm (``skip_projection``): projection noise makes it
  diverge (appendix F.1).
* a narrow floating-point tensor that does not require grad is a constant of
  the graph (in-degrees, normalisation factors) that backward may divide by,
  as DGL's mean reducer does: a 2-bit level could round a degree to zero or
  bias its reciprocal, and it is small next to the activations, so it is kept
  (:class:`SharedConstant`); an equal one saved later in the step (GCNII's
  16 layers each recompute the same degree norms) shares the first one's
  storage instead of holding its own.
* anything else (integer tensors such as tango's quantized operands, small
  tensors, parameters and inputs, which the meter never hands over): kept.

The projection matrix is not stored: it is regenerated from the run's seed
and a per-tensor counter offset, inside the fused kernels that project and
quantize in one pass (and dequantize and project back in one pass). A tensor saved twice (two ops, one tensor) is
compressed once within a step.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from qtrain.ops import compress
from qtrain.quant.projection import projected_width

MIN_NUMEL = 256
MIN_ROW = 8
BLOCK = 64
ROUNDINGS = ("auto", "stochastic", "nearest", "means")
MIN_BLOCK_BITS = 2  # the fewest bits a block of narrow rows is stored at (module doc)
GRAD_BLOCK_BYTES = 8 << 20  # rows dequantized at a time for a weight gradient (float32 bytes)


@dataclass
class CompressedMask:
    packed: torch.Tensor
    shape: torch.Size


@dataclass
class CompressedTensor:
    packed: torch.Tensor
    zero: torch.Tensor
    rng: torch.Tensor
    bits: int
    width: int  # stored row width (after projection)
    shape: torch.Size
    dtype: torch.dtype
    blocked: bool  # rows are BLOCK-element runs of the flat tensor (zero-padded at the end)
    projection: tuple[int, int, int] | None  # (input width, projected width, counter offset)


class SharedConstant:
    """A graph constant kept as it is, shared by every equal one saved in the step."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


Stored = CompressedMask | CompressedTensor | SharedConstant


def min_projected_width(bits: int) -> int:
    """The narrowest projection worth its variance: ``32 / bits`` columns.

    There a row's packed values take as many bytes as its two bfloat16
    parameters, so projecting further saves less than half of what is left
    while the projection's variance, ``(D - 1) / K`` times the row's squared
    norm, keeps growing. Cora's 16-wide hidden layers at INT2 are not
    projected at all; ogbn-arxiv's 256-wide ones go to 32 columns at D/R = 8.
    """
    return 32 // bits


def _row_width(t: torch.Tensor) -> int:
    """Values per index of the first dimension (0 for 1-d tensors, which have no rows)."""
    return t.numel() // t.shape[0] if t.dim() >= 2 else 0


def _zeros_at_row_ends(rows: torch.Tensor) -> bool:
    """Whether ``rows`` hold an exact zero and every row that does has it as its minimum
    or maximum: then stochastic rounding between the rows' ends gives every zero back
    exactly, which at 1 bit is worth more than the side means' smaller error."""
    zero = rows == 0
    if not bool(zero.any()):
        return False
    low, high = torch.aminmax(rows, dim=1)
    inside = (low < 0) & (high > 0)
    return not bool((zero.any(dim=1) & inside).any())


class CompressingCodec:
    """Per-row quantization (+ optional random projection) of saved activations."""

    def __init__(
        self,
        bits: int,
        rp_ratio: int = 1,
        rounding: str = "stochastic",
        seed: int = 0,
        backend: str = "auto",
    ) -> None:
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
        if rounding == "means" and bits != 1:
            raise ValueError(f'rounding = "means" stores rows at 1 bit, got bits = {bits}')
        self.bits, self.rp_ratio, self.rounding = bits, rp_ratio, rounding
        self.seed, self.backend = seed, backend
        self._offset = 0  # counter stream position: every tensor draws fresh randomness
        # entries drop out when their tensor dies, so a codec used outside the
        # trainer's steps (``qtrain.patch`` around a user's loop) does not grow
        self._seen: dict[tuple, tuple[weakref.ref, Stored]] = {}
        self._no_projection: weakref.WeakValueDictionary[int, torch.Tensor] = (
            weakref.WeakValueDictionary()
        )
        self._suspended = 0
        self.stats = {
            "masks": 0,
            "quantized": 0,
            "projected": 0,
            "constants": 0,  # narrow graph constants kept as they are ...
            "shared": 0,  # ... and later equal ones that share the first one's storage
            "kept": 0,
            "reused": 0,
            "side_means": 0,  # ... of the quantized: stored at their rows' side means
        }
        self._constants: dict[tuple, list[weakref.ref[SharedConstant]]] = {}
        self.original_bytes = 0
        self.stored_bytes = 0

    # -- the codec protocol ---------------------------------------------------

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Keep everything saved inside the block as it is (a loss, a softmax)."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def begin_step(self) -> None:
        self.end_step()

    def end_step(self) -> None:
        self._seen.clear()
        self._no_projection.clear()
        self._constants.clear()

    def skip_projection(self, t: torch.Tensor) -> None:
        """Quantize ``t`` (and views of its storage) without projecting it: a BatchNorm input."""
        self._no_projection[t.untyped_storage().data_ptr()] = t

    def nbytes(self, stored: Stored) -> int:
        if isinstance(stored, SharedConstant):
            return stored.tensor.untyped_storage().nbytes()
        if isinstance(stored, CompressedMask):
            return stored.packed.numel()
        return stored.packed.numel() + 2 * stored.zero.numel() * stored.zero.element_size()

    def encode(self, t: torch.Tensor) -> Stored | None:
        if self._suspended or t.numel() < MIN_NUMEL or t.layout != torch.strided:
            return self._keep()
        if t.dtype != torch.bool and not t.is_floating_point():
            return self._keep()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t._version)
        hit = self._seen.get(key)
        if hit is not None and hit[0]() is t:
            self.stats["reused"] += 1
            return hit[1]
        if t.dtype != torch.bool and _row_width(t) < MIN_ROW and not t.requires_grad:
            stored, new = self._shared_constant(t)  # degrees, norms: maybe a divisor
        else:
            stored, new = (self._mask(t) if t.dtype == torch.bool else self._quantize(t)), True
            self._seen[key] = (weakref.ref(t, self._forget(key)), stored)
        self.original_bytes += t.numel() * t.element_size()
        if new:
            self.stored_bytes += self.nbytes(stored)
        return stored

    def decode(self, stored: Stored) -> torch.Tensor:
        if isinstance(stored, SharedConstant):
            return stored.tensor
        if isinstance(stored, CompressedMask):
            n = stored.shape.numel()
            return compress.unpack_mask(stored.packed, n, self.backend).reshape(stored.shape)
        if stored.projection is not None:
            width, k, offset = stored.projection
            rows = compress.dequantize_unproject_rows(
                stored.packed,
                stored.zero,
                stored.rng,
                stored.bits,
                k,
                width,
                self.seed,
                offset,
                self.backend,
            )
        else:
            rows = compress.dequantize_rows(
                stored.packed, stored.zero, stored.rng, stored.bits, stored.width, self.backend
            )
        flat = rows.reshape(-1)
        n = stored.shape.numel()
        if stored.blocked:
            flat = flat[:n]
        return flat.reshape(stored.shape).to(stored.dtype)

    # -- the projected product (qtrain.plugins.exact.projected) --------------------------

    def encode_projected(self, x: torch.Tensor) -> CompressedTensor | None:
        """``x`` [rows, width] stored projected (as :meth:`encode` would store it), or None
        where :meth:`encode` would not project it."""
        if not self._stores_rows(x) or self._projected_width(x, x.shape[1]) is None:
            return None
        stored = self.encode(x)
        return stored if isinstance(stored, CompressedTensor) and stored.projection else None

    def projected_rows(self, stored: CompressedTensor) -> torch.Tensor:
        """The dequantized projected rows ``y`` [rows, k]: ``y @ R^T`` is what :meth:`decode`
        returns (up to float rounding), with ``R`` = :meth:`projection_matrix`."""
        return compress.dequantize_rows(
            stored.packed, stored.zero, stored.rng, stored.bits, stored.width, self.backend
        )

    def projection_matrix(self, stored: CompressedTensor) -> torch.Tensor:
        """The ``[width, k]`` normalized Rademacher matrix ``stored`` was projected by."""
        assert stored.projection is not None
        width, k, offset = stored.projection
        return compress.rademacher(
            width, k, self.seed, offset, self.backend, device=stored.packed.device
        )

    # -- the row-blocked product (qtrain.plugins.exact.projected) -----------------------

    def encode_rows(self, x: torch.Tensor) -> CompressedTensor | None:
        """``x`` [rows, width] stored as quantized rows, unprojected (as :meth:`encode` would
        store it), or None where :meth:`encode` would store it otherwise."""
        if not self._stores_rows(x) or self._projected_width(x, x.shape[1]) is not None:
            return None
        stored = self.encode(x)
        if isinstance(stored, CompressedTensor) and not stored.projection and not stored.blocked:
            return stored
        return None

    def weight_grad_rows(
        self, stored: CompressedTensor, grad: torch.Tensor, linear: bool
    ) -> torch.Tensor:
        """``x^T grad`` ([width, out]; ``linear``: ``grad^T x``, [out, width]) for the rows
        ``stored`` holds, dequantized a block of rows at a time: the full-size ``x`` is
        never rebuilt (it would be the largest tensor of its layer's backward)."""
        rows, width = stored.shape
        step = max(8, GRAD_BLOCK_BYTES // (4 * width) // 8 * 8)  # 8 rows: whole bytes
        total: torch.Tensor | None = None
        for a in range(0, rows, step):
            b = min(rows, a + step)
            packed = stored.packed[a * width * stored.bits // 8 : -(-b * width * stored.bits // 8)]
            x = compress.dequantize_rows(
                packed, stored.zero[a:b], stored.rng[a:b], stored.bits, width, self.backend
            )
            part = grad[a:b].t() @ x if linear else x.t() @ grad[a:b]
            total = part if total is None else total.add_(part)
        if total is None:  # no rows
            shape = (grad.shape[1], width) if linear else (width, grad.shape[1])
            return grad.new_zeros(shape)
        return total

    # -- helpers -------------------------------------------------------------

    def _stores_rows(self, x: torch.Tensor) -> bool:
        """Whether :meth:`encode` would store ``x`` as whole float32 rows (2-d, wide
        enough, not while suspended): what a product's backward can read in place."""
        return (
            not self._suspended
            and x.dim() == 2
            and x.numel() >= MIN_NUMEL
            and x.shape[1] >= MIN_ROW
            and x.layout == torch.strided
            and x.dtype == torch.float32
        )

    def _forget(self, key: tuple) -> Callable[[weakref.ref], None]:
        seen = self._seen

        def drop(ref: weakref.ref) -> None:
            entry = seen.get(key)
            if entry is not None and entry[0] is ref:
                del seen[key]

        return drop

    def _shared_constant(self, t: torch.Tensor) -> tuple[SharedConstant, bool]:
        """(``t`` itself, True), or (an equal constant saved earlier, False): each layer
        recomputes its norms."""
        group = (t.shape, t.dtype, t.device)
        alive = [c for ref in self._constants.get(group, []) if (c := ref()) is not None]
        for candidate in alive:
            if torch.equal(candidate.tensor, t):
                self.stats["shared"] += 1
                return candidate, False
        shared = SharedConstant(t)
        self._constants[group] = [*(weakref.ref(c) for c in alive), weakref.ref(shared)]
        self.stats["constants"] += 1
        return shared, True

    def _keep(self) -> None:
        self.stats["kept"] += 1
        return None

    def _mask(self, t: torch.Tensor) -> CompressedMask:
        self.stats["masks"] += 1
        return CompressedMask(compress.pack_mask(t.contiguous(), self.backend), t.shape)

    def _projected_width(self, t: torch.Tensor, width: int) -> int | None:
        """The width ``t``'s rows are projected to, or None when they are stored unprojected."""
        k = max(projected_width(width, self.rp_ratio), min_projected_width(self.bits))
        project = (
            self.rp_ratio > 1
            and k < width
            and t.requires_grad
            and t.untyped_storage().data_ptr() not in self._no_projection
        )
        return k if project else None

    def _rounding_of(self, rows: torch.Tensor, bits: int) -> str:
        """How ``rows`` stored at ``bits`` are rounded: the two side means at 1 bit under
        ``"means"``, and under ``"auto"`` unless their zeros sit at their rows' ends
        (module doc); stochastically where ``"auto"`` or ``"means"`` meet more bits (a
        block of narrow rows is stored at 2)."""
        if self.rounding == "auto":
            return "stochastic" if bits != 1 or _zeros_at_row_ends(rows) else "means"
        if self.rounding == "means" and bits != 1:
            return "stochastic"
        return self.rounding

    def _draw(self, n: int) -> int:
        offset = self._offset
        self._offset += n
        return offset

    def _quantize(self, t: torch.Tensor) -> CompressedTensor:
        x = t.detach().to(torch.float32)
        width = _row_width(t)
        blocked = width < MIN_ROW
        if blocked:
            flat = x.reshape(-1)
            pad = -flat.numel() % BLOCK
            if pad:  # repeat the last value: a zero could widen the last block's range
                flat = torch.cat([flat, flat[-1:].expand(pad)])
            rows = flat.reshape(-1, BLOCK)
        else:
            rows = x.reshape(t.shape[0], width)
        bits = max(self.bits, MIN_BLOCK_BITS) if blocked else self.bits
        projection = None
        k = self._projected_width(t, rows.shape[1]) if not blocked else None
        rows = rows.contiguous()
        rounding = self._rounding_of(rows, bits)
        if rounding == "means":
            self.stats["side_means"] += 1
        if k is not None:
            offset = self._draw(rows.shape[1] * k)
            projection = (rows.shape[1], k, offset)
            quantize_offset = self._draw(rows.shape[0] * k)
            if rounding == "means":  # projected by the regenerated matrix, then split
                matrix = compress.rademacher(
                    rows.shape[1], k, self.seed, offset, self.backend, device=rows.device
                )
                packed, zero, rng = compress.quantize_rows_means(rows @ matrix, self.backend)
            else:  # one pass: the projected tensor is never materialized
                packed, zero, rng = compress.project_quantize_rows(
                    rows,
                    k,
                    self.bits,
                    rounding,
                    self.seed,
                    quantize_offset,
                    offset,
                    self.backend,
                )
            self.stats["projected"] += 1
        else:
            k = rows.shape[1]
            offset = self._draw(rows.numel())
            if rounding == "means":
                packed, zero, rng = compress.quantize_rows_means(rows, self.backend)
            else:
                packed, zero, rng = compress.quantize_rows(
                    rows, bits, rounding, self.seed, offset, self.backend
                )
        self.stats["quantized"] += 1
        return CompressedTensor(packed, zero, rng, bits, k, t.shape, t.dtype, blocked, projection)
