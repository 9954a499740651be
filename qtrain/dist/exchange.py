"""Halo exchange: each worker's boundary rows, quantized per node, over torch.distributed.

Before every GNN layer after the first, worker ``r`` sends to each peer ``p``
the rows of its nodes that ``p`` reads (``Partition.send_index[p]``) and
receives its halo rows; in backward the halo rows' gradients travel back to
their owners and are added to theirs. One ``all_to_all_single`` over bytes
per exchange: split sizes may differ per peer (gloo's list form ``all_to_all``
refuses uneven sizes), and both sides know every size in advance from the
row counts, the width and the bit plan, so nothing but the payload is sent.

A message to one peer is the concatenation of one segment per bit width
(adaqp-mlsys23 section 3.3): the rows that travel at ``b`` bits, in plan
order, quantized per row by ``qtrain.ops.compress.quantize_rows`` (zero point
= the row's minimum and range rounded outwards to bfloat16, stochastic
rounding, values bit-packed) followed by their bfloat16 zero points and
ranges; at 32 bits the float32 rows themselves. The bytes counted
(``bytes_sent``) are the buffers' sizes, excluding a worker's own share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from qtrain.dist.partition import Partition
from qtrain.ops import compress
from qtrain.quant.rng import normalize_seed

MESSAGE_BITS = (2, 4, 8, 32)
# segment order inside a message: float32 rows first, so they start at byte 0 of the
# received buffer and decode as a view of it, with no copy
SEGMENT_ORDER = (32, 8, 4, 2)


def message_bytes(rows: int, dim: int, bits: int) -> int:
    """Bytes a segment of ``rows`` rows of ``dim`` values takes at ``bits`` bits."""
    if rows == 0:
        return 0
    if bits == 32:
        return rows * dim * 4
    return (rows * dim * bits + 7) // 8 + rows * 4  # packed values, bf16 zero + range


def encode(rows: torch.Tensor, bits: int, seed: int, offset: int) -> torch.Tensor:
    """One segment as uint8 bytes (see the module docstring)."""
    rows = rows.detach().to(torch.float32).contiguous()
    if rows.shape[0] == 0:
        return torch.empty(0, dtype=torch.uint8)
    if bits == 32:
        return rows.reshape(-1).view(torch.uint8)
    packed, zero, rng = compress.quantize_rows(rows, bits, "stochastic", seed, offset)
    return torch.cat([packed, zero.view(torch.uint8), rng.view(torch.uint8)])


def decode(buf: torch.Tensor, rows: int, dim: int, bits: int) -> torch.Tensor:
    """float32 ``[rows, dim]`` back from :func:`encode`'s bytes."""
    if rows == 0:
        return torch.empty(0, dim, dtype=torch.float32)
    # segments start at any byte of the received buffer: copy before viewing wider types
    if bits == 32:
        if buf.data_ptr() % 4:  # views of wider types need aligned storage
            buf = buf.clone()
        return buf.view(torch.float32).reshape(rows, dim)
    n_packed = (rows * dim * bits + 7) // 8
    zero = buf[n_packed : n_packed + 2 * rows].clone().view(torch.bfloat16)
    rng = buf[n_packed + 2 * rows : n_packed + 4 * rows].clone().view(torch.bfloat16)
    return compress.dequantize_rows(buf[:n_packed], zero, rng, bits, dim)


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


@dataclass
class Pending:
    """An exchange whose messages are in flight."""

    chunks: list[torch.Tensor]  # kept alive until the sends complete
    received: list[torch.Tensor]
    incoming_counts: list[int]
    dim: int
    recv_plan: BitPlan
    requests: list[Any]
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

    def _exchange(
        self,
        outgoing: list[torch.Tensor],
        incoming_counts: list[int],
        dim: int,
        send_plan: BitPlan,
        recv_plan: BitPlan,
        layer: str,
    ) -> list[torch.Tensor]:
        return self._complete(
            self._post(outgoing, incoming_counts, dim, send_plan, recv_plan, layer)
        )

    def _post(
        self,
        outgoing: list[torch.Tensor],
        incoming_counts: list[int],
        dim: int,
        send_plan: BitPlan,
        recv_plan: BitPlan,
        layer: str,
        *,
        overlap: bool = False,
    ) -> Pending:
        """Encode and start sending; with ``overlap`` every ring round is posted at once and
        :meth:`_complete` waits, so the caller can compute in between."""
        rank, world = self.part.rank, self.part.world_size
        start = time.perf_counter()
        self.stats.dims[layer] = dim
        chunks: list[torch.Tensor] = []
        for p in range(world):
            pieces = []
            if self.tracing and p != rank and outgoing[p].shape[0]:
                rows = outgoing[p]
                self.stats.ranges[(layer, p)] = (rows.amax(1) - rows.amin(1)).float().cpu()
            for bits, where in send_plan.segments(p) if p != rank else []:
                rows = outgoing[p] if where is None else outgoing[p][where]
                pieces.append(encode(rows, bits, self.seed, self._offset))
                self._offset += rows.numel()
                hist = self.stats.bits_histogram.setdefault(layer, {})
                hist[bits] = hist.get(bits, 0) + int(rows.shape[0])
            if len(pieces) == 1:
                chunks.append(pieces[0])
            else:
                chunks.append(torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.uint8))
        received = [
            torch.empty(
                sum(
                    message_bytes(_count(w, recv_plan, p), dim, b) for b, w in recv_plan.segments(p)
                )
                if p != rank
                else 0,
                dtype=torch.uint8,
            )
            for p in range(world)
        ]
        pending = Pending(chunks, received, incoming_counts, dim, recv_plan, [])
        posted = time.perf_counter()
        self.stats.quant_seconds += posted - start
        for i in range(1, world):  # ring rounds
            to, source = (rank + i) % world, (rank - i) % world
            requests = []
            if chunks[to].numel():
                requests.append(dist.isend(chunks[to], to, group=self.group))
            if received[source].numel():
                requests.append(dist.irecv(received[source], source, group=self.group))
            if overlap:
                pending.requests.extend(requests)
                continue
            for request in requests:
                request.wait()
        self.stats.comm_seconds += time.perf_counter() - posted
        self.stats.bytes_sent += sum(int(c.numel()) for c in chunks)
        self.stats.exchanges += 1
        return pending

    def _complete(self, pending: Pending) -> list[torch.Tensor]:
        """Wait for what :meth:`_post` started, and decode it per peer."""
        start = time.perf_counter()
        for request in pending.requests:
            request.wait()
        waited = time.perf_counter()
        rank = self.part.rank
        out = []
        for p in range(self.part.world_size):
            segments = pending.recv_plan.segments(p) if p != rank else []
            if len(segments) == 1 and segments[0][1] is None:  # one width: decode in place
                bits = segments[0][0]
                out.append(
                    decode(pending.received[p], pending.incoming_counts[p], pending.dim, bits)
                )
                continue
            rows = torch.empty(pending.incoming_counts[p], pending.dim, dtype=torch.float32)
            at = 0
            for bits, where in segments:
                n = _count(where, pending.recv_plan, p)
                size = message_bytes(n, pending.dim, bits)
                rows[where] = decode(pending.received[p][at : at + size], n, pending.dim, bits)
                at += size
            out.append(rows)
        self.stats.comm_seconds += waited - start
        self.stats.quant_seconds += time.perf_counter() - waited
        return out

    def _post_forward(self, x_owned: torch.Tensor, layer: int, overlap: bool) -> Pending:
        part = self.part
        flat = x_owned.detach().reshape(x_owned.shape[0], -1)
        send_plan, recv_plan = self.plan(layer, "forward")
        pending = self._post(
            [flat[idx] for idx in part.send_index],
            part.recv_counts,
            int(x_owned.shape[1:].numel()),
            send_plan,
            recv_plan,
            f"layer{layer}.forward",
            overlap=overlap,
        )
        pending.shape = x_owned.shape[1:]
        return pending

    def post_halo(self, x_owned: torch.Tensor, layer: int) -> Pending:
        """Start fetching ``x_owned``'s halo rows (every ring round at once); see :class:`FinishHalo`."""
        return self._post_forward(x_owned, layer, overlap=True)

    def finish_halo(self, pending: Pending, dtype: torch.dtype) -> torch.Tensor:
        """The halo rows of a fetch that :meth:`post_halo` (or :meth:`fetch_halo`) started."""
        got = self._complete(pending)
        halo = torch.cat(got) if got else torch.empty(0, pending.dim)
        return halo.reshape(halo.shape[0], *pending.shape).to(dtype)

    def fetch_halo(self, x_owned: torch.Tensor, layer: int) -> torch.Tensor:
        """The halo rows of ``x_owned``'s layer input, from their owners."""
        return self.finish_halo(self._post_forward(x_owned, layer, overlap=False), x_owned.dtype)

    def return_grads(
        self, grad_halo: torch.Tensor, layer: int, owned_shape: torch.Size
    ) -> torch.Tensor:
        """The gradient of the owned rows from the halo rows' gradients on every peer."""
        part = self.part
        dim = int(torch.Size(owned_shape[1:]).numel())
        flat = grad_halo.reshape(grad_halo.shape[0], dim)
        bounds = [0]
        for n in part.recv_counts:
            bounds.append(bounds[-1] + n)
        outgoing = [flat[bounds[p] : bounds[p + 1]] for p in range(part.world_size)]
        # backward reverses the roles: what was received is sent back
        recv_plan, send_plan = self.plan(layer, "backward")
        got = self._exchange(
            outgoing, part.send_counts, dim, send_plan, recv_plan, f"layer{layer}.backward"
        )
        grad = torch.zeros(owned_shape[0], dim, dtype=torch.float32)
        for p, rows in enumerate(got):
            if rows.shape[0]:
                grad.index_add_(0, part.send_index[p], rows)
        return grad.reshape(owned_shape).to(grad_halo.dtype)


def _count(where: torch.Tensor | None, plan: BitPlan, peer: int) -> int:
    """Rows of a segment: its positions, or all of the peer's rows (None)."""
    return plan.rows(peer) if where is None else int(where.numel())


class HaloExchange(torch.autograd.Function):
    """``halo = fetch(x_owned)`` forward; owners get the halo rows' gradients backward."""

    @staticmethod
    def forward(ctx: Any, x_owned: torch.Tensor, messenger: Messenger, layer: int) -> torch.Tensor:  # type: ignore[override]
        ctx.messenger, ctx.layer, ctx.shape = messenger, layer, x_owned.shape
        return messenger.fetch_halo(x_owned.detach(), layer)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return ctx.messenger.return_grads(grad.contiguous(), ctx.layer, ctx.shape), None, None


class FinishHalo(torch.autograd.Function):
    """The halo rows of a fetch started by ``Messenger.post_halo``; backward as HaloExchange."""

    @staticmethod
    def forward(
        ctx: Any, x_owned: torch.Tensor, messenger: Messenger, layer: int, pending: Pending
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.messenger, ctx.layer, ctx.shape = messenger, layer, x_owned.shape
        return messenger.finish_halo(pending, x_owned.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return ctx.messenger.return_grads(grad.contiguous(), ctx.layer, ctx.shape), None, None, None


def with_halo(x_owned: torch.Tensor, messenger: Messenger, layer: int) -> torch.Tensor:
    """``x_owned`` followed by its halo rows: a block's source rows for ``layer``."""
    return torch.cat([x_owned, HaloExchange.apply(x_owned, messenger, layer)])
