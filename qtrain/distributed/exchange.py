"""Halo exchange: each worker's boundary rows, quantized per node, over torch.distributed.

Before every GNN layer after the first, worker ``r`` sends to each peer ``p``
the rows of its nodes that ``p`` reads (``Partition.send_index[p]``) and
receives its halo rows; in backward the halo rows' gradients travel back to
their owners and are added to theirs. Messages go point to point in ring
rounds (``isend`` / ``irecv``), so their sizes may differ per peer (gloo's
``all_to_all`` refuses uneven sizes); both sides know every size in advance
from the row counts, the width and the bit plan, so nothing but the payload
is sent.

A message to one peer is the concatenation of one segment per bit width
(adaqp-mlsys23 section 3.3): the rows that travel at ``b`` bits, in plan
order, quantized per row by ``qtrain.ops.compress.quantize_rows_into`` (zero
point = the row's minimum and range rounded outwards to bfloat16, stochastic
rounding, values bit-packed) followed by their bfloat16 zero points and
ranges; at 32 bits the float32 rows themselves. The bytes counted
(``bytes_sent``) are the messages' sizes, excluding a worker's own share.

Each segment is gathered and quantized in one pass straight into the
exchange's send buffer, and decoded straight into the rows that read it:
the layer's source tensor (owned rows, then halo) forward, the owned rows'
gradient (added) backward. The buffers are kept per exchange and reused
every step. A 32-bit message whose rows are contiguous on its side of the
wire is sent from, or received into, those rows themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from qtrain.distributed.partition import Partition
from qtrain.ops import compress
from qtrain.quant import rowwise
from qtrain.quant.rng import normalize_seed

MESSAGE_BITS = (2, 4, 8, 32)
# segment order inside a message: float32 rows first, so they start at the message's
# first byte, which is aligned in the exchange buffer (a float32 view needs no copy)
SEGMENT_ORDER = (32, 8, 4, 2)
_ALIGN = 64  # bytes: where each peer's message starts in an exchange buffer


def message_bytes(rows: int, dim: int, bits: int) -> int:
    """Bytes a segment of ``rows`` rows of ``dim`` values takes at ``bits`` bits."""
    if bits == 32:
        return rows * dim * 4
    return rowwise.segment_bytes(rows, dim, bits)  # packed values, bf16 zeros and ranges


@dataclass
class BitPlan:
    """Bits per message row, per peer, for one layer and direction (sender's row order)."""

    per_peer: list[torch.Tensor]  # int64 bits of each row sent to (or received from) the peer
    _segments: dict[int, list[tuple[int, torch.Tensor | None]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @staticmethod
    def uniform(counts: list[int], bits: int) -> BitPlan:
        return BitPlan([torch.full((n,), bits, dtype=torch.int64) for n in counts])

    def segments(self, peer: int) -> list[tuple[int, torch.Tensor | None]]:
        """``(bits, row positions)`` of each non-empty segment of the message to ``peer``;
        positions are None when one segment holds every row in order (no gather needed).
        A plan is used for many exchanges, so the segments are computed once."""
        if peer not in self._segments:
            bits = self.per_peer[peer]
            found = [
                (b, torch.nonzero(bits == b, as_tuple=False).squeeze(1))
                for b in SEGMENT_ORDER
                if bool((bits == b).any())
            ]
            whole = len(found) == 1
            self._segments[peer] = [(b, None if whole else where) for b, where in found]
        return self._segments[peer]

    def rows(self, peer: int) -> int:
        return int(self.per_peer[peer].numel())


# A peer's rows in a local tensor: their indices in message order, or the first of a
# contiguous run (the halo rows of one owner, both in the source tensor and its gradient).
PeerRows = torch.Tensor | int


@dataclass(frozen=True)
class Segment:
    """The rows of one bit width in one peer's message, and where they lie on this side."""

    bits: int
    rows: int
    where: torch.Tensor | None  # positions in the peer's plan order; None: all, in order
    index: torch.Tensor | None  # rows of the local tensor; None: the run first .. first + rows
    first: int
    start: int  # byte offset in the exchange buffer
    nbytes: int

    def run(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor this segment's kernel reads or writes: all of it with an index,
        else the contiguous run of its rows (a view)."""
        return tensor if self.index is not None else tensor[self.first : self.first + self.rows]


@dataclass(frozen=True)
class PeerMessage:
    """One peer's message: its bytes in the exchange buffer and its segments."""

    start: int
    nbytes: int
    rows: int
    segments: tuple[Segment, ...]

    @property
    def direct(self) -> bool:
        """One 32-bit segment of contiguous rows: the rows themselves go on the wire."""
        return (
            len(self.segments) == 1
            and self.segments[0].bits == 32
            and self.segments[0].index is None
        )


@dataclass(frozen=True)
class Layout:
    """Every peer's message of one exchange, on one side of the wire."""

    peers: tuple[PeerMessage, ...]
    nbytes: int
    dim: int

    @staticmethod
    def build(
        plan: BitPlan,
        rows: list[PeerRows],
        dim: int,
        rank: int,
        device: torch.device | None = None,
    ) -> Layout:
        """Lay out ``plan``'s messages over ``rows[p]``, the local rows of peer ``p``'s
        message in plan order (this worker's own entry stays empty). Row indices are
        placed on ``device``, where the exchanged tensors live (a worker's GPU)."""
        peers, at = [], 0
        for p, base in enumerate(rows):
            segments, start = [], at
            for bits, where in plan.segments(p) if p != rank else []:
                n = plan.rows(p) if where is None else int(where.numel())
                if isinstance(base, torch.Tensor):
                    index, first = (base if where is None else base[where]), 0
                elif where is None:
                    index, first = None, base
                else:
                    index, first = base + where, 0
                if device is not None:
                    index = None if index is None else index.to(device)
                    where = None if where is None else where.to(device)
                size = message_bytes(n, dim, bits)
                segments.append(Segment(bits, n, where, index, first, at, size))
                at += size
            peers.append(
                PeerMessage(start, at - start, plan.rows(p) if p != rank else 0, tuple(segments))
            )
            at = (at + _ALIGN - 1) // _ALIGN * _ALIGN
        return Layout(tuple(peers), at, dim)


def encode_segment(
    source: torch.Tensor, seg: Segment, buffer: torch.Tensor, seed: int, offset: int
) -> None:
    """Write ``seg``'s rows of float32 ``source [rows, dim]`` into its bytes of ``buffer``."""
    out = buffer[seg.start : seg.start + seg.nbytes]
    if seg.rows == 0:
        return
    if seg.bits == 32:
        rows = out.view(torch.float32).view(seg.rows, source.shape[1])
        if seg.index is None:
            rows.copy_(seg.run(source))
        else:
            torch.index_select(source, 0, seg.index, out=rows)
        return
    compress.quantize_rows_into(seg.run(source), seg.index, seg.bits, seed, offset, out)


def decode_segment(buffer: torch.Tensor, seg: Segment, dest: torch.Tensor, add: bool) -> None:
    """Write (or with ``add`` add) ``seg``'s rows from ``buffer`` into float32 ``dest``."""
    data = buffer[seg.start : seg.start + seg.nbytes]
    if seg.rows == 0:
        return
    if seg.bits == 32:
        rows = data.view(torch.float32).view(seg.rows, dest.shape[1])
        if seg.index is not None:
            (dest.index_add_ if add else dest.index_copy_)(0, seg.index, rows)
        elif add:
            seg.run(dest).add_(rows)
        else:
            seg.run(dest).copy_(rows)
        return
    compress.dequantize_rows_into(data, seg.rows, seg.bits, seg.run(dest), seg.index, add)


def _bytes_of(rows: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 row run as the uint8 tensor that goes on the wire."""
    return rows.reshape(-1).view(torch.uint8)


@dataclass
class Pending:
    """An exchange whose messages are in flight; ``dest`` is complete after decoding."""

    buffer: torch.Tensor  # the receive buffer
    layout: Layout
    dest: torch.Tensor
    add: bool
    requests: list[Any]
    keep: list[torch.Tensor]  # what is being sent, alive until the sends complete
    shape: torch.Size = field(default_factory=torch.Size)


@dataclass
class ExchangeStats:
    """What the exchanges of one worker cost, and what they sent."""

    bytes_sent: int = 0
    comm_seconds: float = 0.0
    quant_seconds: float = 0.0
    exchanges: int = 0
    bits_histogram: dict[str, dict[int, int]] = field(default_factory=dict)  # layer -> bits -> rows
    # (exchange, peer) -> range (max - min) of each row last sent there, when tracing
    ranges: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)  # exchange -> values per row


class Messenger:
    """One worker's halo exchanges; the bit plans come from ``plan(layer, direction)``."""

    def __init__(
        self,
        part: Partition,
        plan: Callable[[int, str], tuple[BitPlan, BitPlan]],
        seed: int = 0,
        group: Any = None,
    ) -> None:
        self.part = part
        self.plan = plan  # -> (plan of what this worker sends, plan of what it receives)
        self.group = group
        self.seed = normalize_seed(seed * 1_000_003 + part.rank)
        self._offset = 0
        self.stats = ExchangeStats()
        self.tracing = False  # record row ranges (the adaptive assigner's statistics)
        starts = [part.num_owned]
        for n in part.recv_counts:
            starts.append(starts[-1] + n)
        self._halo_rows: list[PeerRows] = starts[:-1]  # each owner's run in owned + halo
        self._owned_rows: list[PeerRows] = list(part.send_index)
        self._layouts: dict[tuple[str, str], tuple[BitPlan, Layout]] = {}
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}

    def _layout(
        self,
        tag: str,
        side: str,
        plan: BitPlan,
        rows: list[PeerRows],
        dim: int,
        device: torch.device,
    ) -> Layout:
        """``plan``'s layout, kept until the plan changes (a reassignment)."""
        found = self._layouts.get((tag, side))
        if found is None or found[0] is not plan or found[1].dim != dim:
            found = (plan, Layout.build(plan, rows, dim, self.part.rank, device))
            self._layouts[(tag, side)] = found
        return found[1]

    def _buffer(self, tag: str, side: str, nbytes: int, device: torch.device) -> torch.Tensor:
        """A byte buffer of this exchange on the exchanged rows' device (nccl sends GPU
        memory only), reused every step (fresh pages cost faults)."""
        buf = self._buffers.get((tag, side))
        if buf is None or buf.numel() != nbytes or buf.device != device:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self._buffers[(tag, side)] = buf
        return buf

    def _post(
        self,
        tag: str,
        source: torch.Tensor,
        send: Layout,
        recv: Layout,
        dest: torch.Tensor,
        *,
        add: bool,
        overlap: bool,
    ) -> Pending:
        """Encode ``source``'s rows and start the transfers; the received rows go to
        ``dest`` in :meth:`_complete`. With ``overlap`` every ring round is posted at once
        and :meth:`_complete` waits, so the caller can compute in between."""
        rank, world = self.part.rank, self.part.world_size
        start = time.perf_counter()
        self.stats.dims[tag] = int(source.shape[1])
        hist = self.stats.bits_histogram.setdefault(tag, {})
        out = self._buffer(tag, "send", send.nbytes, source.device)
        chunks: list[torch.Tensor] = []
        for p, message in enumerate(send.peers):
            for seg in message.segments:
                if not message.direct:
                    encode_segment(source, seg, out, self.seed, self._offset)
                self._offset += seg.rows * int(source.shape[1])
                hist[seg.bits] = hist.get(seg.bits, 0) + seg.rows
            if self.tracing and p != rank and message.rows:
                self.stats.ranges[(tag, p)] = _row_ranges(source, message, out)
            if message.direct:
                chunks.append(_bytes_of(message.segments[0].run(source)))
            else:
                chunks.append(out[message.start : message.start + message.nbytes])
        into = self._buffer(tag, "recv", recv.nbytes, dest.device)
        received = [
            _bytes_of(m.segments[0].run(dest))
            if m.direct and not add
            else into[m.start : m.start + m.nbytes]
            for m in recv.peers
        ]
        pending = Pending(into, recv, dest, add, [], chunks)
        posted = time.perf_counter()
        self.stats.quant_seconds += posted - start
        for i in range(1, world):  # ring rounds
            to, source_rank = (rank + i) % world, (rank - i) % world
            requests = []
            if chunks[to].numel():
                requests.append(dist.isend(chunks[to], to, group=self.group))
            if received[source_rank].numel():
                requests.append(dist.irecv(received[source_rank], source_rank, group=self.group))
            if overlap:
                pending.requests.extend(requests)
                continue
            for request in requests:
                request.wait()
        self.stats.comm_seconds += time.perf_counter() - posted
        self.stats.bytes_sent += sum(m.nbytes for m in send.peers)
        self.stats.exchanges += 1
        return pending

    def _complete(self, pending: Pending) -> torch.Tensor:
        """Wait for what :meth:`_post` started, and decode it into ``pending.dest``."""
        start = time.perf_counter()
        for request in pending.requests:
            request.wait()
        pending.keep.clear()
        waited = time.perf_counter()
        for message in pending.layout.peers:
            if message.direct and not pending.add:
                continue  # received in place
            for seg in message.segments:
                decode_segment(pending.buffer, seg, pending.dest, pending.add)
        self.stats.comm_seconds += waited - start
        self.stats.quant_seconds += time.perf_counter() - waited
        return pending.dest

    def post_halo(self, x_owned: torch.Tensor, layer: int, overlap: bool = True) -> Pending:
        """Start fetching ``x_owned``'s halo rows; :meth:`finish_halo` returns the layer's
        source rows, ``x_owned`` followed by the halo."""
        part = self.part
        tag = f"layer{layer}.forward"
        flat = x_owned.detach().reshape(x_owned.shape[0], -1).to(torch.float32).contiguous()
        dim = int(flat.shape[1])
        send_plan, recv_plan = self.plan(layer, "forward")
        send = self._layout(tag, "send", send_plan, self._owned_rows, dim, flat.device)
        recv = self._layout(tag, "recv", recv_plan, self._halo_rows, dim, flat.device)
        rows = flat.new_empty(part.num_owned + int(part.halo.numel()), dim)
        rows[: part.num_owned].copy_(flat)
        pending = self._post(tag, flat, send, recv, rows, add=False, overlap=overlap)
        pending.shape = x_owned.shape[1:]
        return pending

    def finish_halo(self, pending: Pending, dtype: torch.dtype) -> torch.Tensor:
        """The source rows (owned, then halo) of a fetch :meth:`post_halo` started."""
        rows = self._complete(pending)
        return rows.reshape(rows.shape[0], *pending.shape).to(dtype)

    def fetch_halo(self, x_owned: torch.Tensor, layer: int) -> torch.Tensor:
        """``x_owned`` followed by its halo rows, fetched from their owners."""
        return self.finish_halo(self.post_halo(x_owned, layer, overlap=False), x_owned.dtype)

    def post_grads(self, grad_rows: torch.Tensor, layer: int, overlap: bool = True) -> Pending:
        """Start sending the halo rows' gradients (``grad_rows``: the layer's source rows'
        gradient, owned rows then halo) back to their owners. ``pending.dest`` is already
        the owned rows' own gradient (float32 ``[owned, values]``), which the owners'
        returns are added to by :meth:`finish_grads`; more may be added to it meanwhile."""
        part = self.part
        tag = f"layer{layer}.backward"
        flat = grad_rows.reshape(grad_rows.shape[0], -1).to(torch.float32).contiguous()
        dim = int(flat.shape[1])
        # backward reverses the roles: the halo rows' gradients go to their owners
        recv_plan, send_plan = self.plan(layer, "backward")
        send = self._layout(tag, "send", send_plan, self._halo_rows, dim, flat.device)
        recv = self._layout(tag, "recv", recv_plan, self._owned_rows, dim, flat.device)
        grad = flat[: part.num_owned].clone()
        pending = self._post(tag, flat, send, recv, grad, add=True, overlap=overlap)
        pending.shape = grad_rows.shape[1:]
        return pending

    def finish_grads(self, pending: Pending, dtype: torch.dtype) -> torch.Tensor:
        """The owned rows' gradient of a return :meth:`post_grads` started."""
        grad = self._complete(pending)
        return grad.reshape(self.part.num_owned, *pending.shape).to(dtype)

    def return_grads(self, grad_rows: torch.Tensor, layer: int) -> torch.Tensor:
        """The gradient of the owned rows, from the gradient of the layer's source rows
        (owned, then halo): each halo row's gradient goes back to its owner and is added."""
        pending = self.post_grads(grad_rows, layer, overlap=False)
        return self.finish_grads(pending, grad_rows.dtype)


def _row_ranges(source: torch.Tensor, message: PeerMessage, buffer: torch.Tensor) -> torch.Tensor:
    """max - min of each row of an encoded message, in plan order (the assigner's
    statistics). A quantized segment already holds each row's range as quantized
    (from the bfloat16 zero point, rounded outwards), the one its step and so its
    variance are made of: it is read from the buffer, not gathered and recomputed.
    Returned on the CPU, where the assigner solves (one copy per traced exchange)."""
    ranges = torch.empty(message.rows, dtype=torch.float32, device=source.device)
    dim = int(source.shape[1])
    for seg in message.segments:
        if seg.bits == 32:
            rows = seg.run(source) if seg.index is None else source[seg.index]
            spread = rows.amax(1) - rows.amin(1) if dim else rows.new_zeros(seg.rows)
        else:
            at = seg.start + rowwise.packed_size(seg.rows * dim, seg.bits) + 2 * seg.rows
            spread = buffer[at : at + 2 * seg.rows].clone().view(torch.bfloat16).float()
        if seg.where is None:
            ranges.copy_(spread)
        else:
            ranges[seg.where] = spread
    return ranges.cpu()


class SharedGradient:
    """One gradient of the owned rows for two autograd Functions that both read them.

    Overlap's halves read the owned rows through ``OwnedParts`` and ``WithHalo``.
    Left to autograd, each would return a gradient of all the owned rows and
    autograd would add the two. Here the one whose backward runs first leaves
    its part and returns none, and the second returns the whole. Autograd runs
    ``WithHalo`` first (it was made later): its backward only starts returning
    the halo gradients (:meth:`Messenger.post_grads`), ``OwnedParts`` adds its
    part into the gradient while they are in flight, after the central half's
    backward has run, and then waits for them.
    """

    def __init__(self, messenger: Messenger) -> None:
        self.messenger = messenger
        self.pending: Pending | None = None  # the halo gradients' return, when WithHalo ran first
        self.dtype: torch.dtype = torch.float32
        self.local: torch.Tensor | None = None  # OwnedParts' part, when it ran first

    @property
    def resolved(self) -> bool:
        """Whether no part is left waiting for the other (both backwards ran, or neither)."""
        return self.pending is None and self.local is None

    def halo_returned(self, grad_rows: torch.Tensor, layer: int) -> torch.Tensor | None:
        """``WithHalo``'s backward: the owned rows' gradient if ``OwnedParts`` already ran."""
        if self.local is None:
            self.pending, self.dtype = self.messenger.post_grads(grad_rows, layer), grad_rows.dtype
            return None
        grad = self.messenger.return_grads(grad_rows, layer)
        local, self.local = self.local, None
        return grad.add_(local)

    def owned_part(
        self,
        add_into: Callable[[torch.Tensor], None],
        shape: torch.Size,
        dtype: torch.dtype,
        device: torch.device,
    ) -> torch.Tensor | None:
        """``OwnedParts``' backward: ``add_into(grad)`` adds its part to a gradient of the
        owned rows (``shape``, ``dtype``); the whole gradient if ``WithHalo`` already ran."""
        pending, self.pending = self.pending, None
        if pending is None:
            self.local = torch.zeros(shape, dtype=dtype, device=device)
            add_into(self.local)
            return None
        add_into(pending.dest.view(shape) if dtype == torch.float32 else pending.dest)
        return self.messenger.finish_grads(pending, self.dtype)


class WithHalo(torch.autograd.Function):
    """``x_owned`` followed by its halo rows forward; backward the halo rows' gradients
    go back to their owners and are added to the owned rows' own."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x_owned: torch.Tensor,
        messenger: Messenger,
        layer: int,
        pending: Pending | None,
        shared: SharedGradient | None,
    ) -> torch.Tensor:
        ctx.messenger, ctx.layer, ctx.shared = messenger, layer, shared
        if pending is None:
            return messenger.fetch_halo(x_owned.detach(), layer)
        return messenger.finish_halo(pending, x_owned.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        if ctx.shared is not None:
            return ctx.shared.halo_returned(grad, ctx.layer), None, None, None, None
        return ctx.messenger.return_grads(grad, ctx.layer), None, None, None, None


def with_halo(
    x_owned: torch.Tensor,
    messenger: Messenger,
    layer: int,
    pending: Pending | None = None,
    shared: SharedGradient | None = None,
) -> torch.Tensor:
    """``x_owned`` followed by its halo rows: a block's source rows for ``layer``; with
    ``pending`` (from ``Messenger.post_halo``) the fetch already under way; with
    ``shared``, the gradient of ``x_owned`` is made together with another reader's."""
    return WithHalo.apply(x_owned, messenger, layer, pending, shared)
