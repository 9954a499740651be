"""Splitting a graph across workers: who owns which node, and what each worker must receive.

Worker ``r`` owns the nodes with ``parts == r`` and computes their outputs in
every layer. The in-neighbours of its nodes that other workers own are its
*halo*: their rows arrive from their owners before each layer. Worker ``r``
trains on one DGL block per layer, with its owned nodes as destinations and
``owned + halo`` as sources (owned first, so DGL's ``feat[:num_dst]``
convention holds; the halo ordered by owner, then by global id). Both
``srcdata[dgl.NID]`` and ``dstdata[dgl.NID]`` hold global ids, which is how
models normalise by full-graph degrees (see ``qtrain.models.gcn``).

The send plan of ``r`` to ``p`` and the receive plan of ``p`` from ``r`` are
the same list (owned by ``r``, an in-neighbour of a node ``p`` owns, sorted
by global id), computed independently on both sides from the same graph and
``parts``, so no worker has to tell another what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from qtrain._compat import import_dgl

PARTITIONERS = ("metis", "random")


def assign_parts(graph: Any, world_size: int, method: str, seed: int = 0) -> torch.Tensor:
    """int64 owner rank of every node: METIS through DGL (min edge cut), or uniform random."""
    if method not in PARTITIONERS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONERS)}, got {method!r}")
    n = graph.num_nodes()
    if world_size == 1:
        return torch.zeros(n, dtype=torch.int64)
    if method == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, world_size, (n,), generator=g)
    dgl = import_dgl()
    # METIS wants a symmetric graph without self-loops. DGL prints its timings from C++
    # to file descriptor 1; the CLI points that at stderr while a run is going.
    simple = dgl.to_bidirected(dgl.remove_self_loop(graph).cpu())
    return dgl.metis_partition_assignment(simple, world_size).to(torch.int64)


@dataclass
class Partition:
    """Worker ``rank``'s share of the graph and its exchange plans (local indices)."""

    rank: int
    world_size: int
    # global ids in three sorted runs: the central nodes, the marginal ones a central node
    # reads, the other marginal ones
    owned: torch.Tensor
    halo: torch.Tensor  # global ids: those from rank 0's nodes first, then rank 1's, ...
    block: Any  # dst = owned, src = owned + halo
    send_index: list[torch.Tensor]  # per peer: positions in `owned` of the rows it receives
    recv_counts: list[int]  # per peer: halo rows that come from it (in `halo` order)
    # the same layer split for overlap: central nodes (no halo in-neighbour) need owned rows
    # only; marginal ones also the halo. Positions in `owned` (central ones lead):
    central: torch.Tensor
    marginal: torch.Tensor
    central_block: Any  # dst = central, src = the owned rows they read (a prefix of owned)
    marginal_block: Any  # dst = marginal, src = owned + halo (dst rows not leading)

    @property
    def num_owned(self) -> int:
        return int(self.owned.numel())

    @property
    def num_central(self) -> int:
        return int(self.central.numel())

    @property
    def send_counts(self) -> list[int]:
        return [int(s.numel()) for s in self.send_index]

    @property
    def src_ids(self) -> torch.Tensor:
        """Global ids of the block's source rows: owned, then halo."""
        return torch.cat([self.owned, self.halo])


def _boundary_sources(
    src: torch.Tensor, dst: torch.Tensor, parts: torch.Tensor, owner: int, reader: int
) -> torch.Tensor:
    """Sorted unique nodes of ``owner`` with an edge into a node of ``reader``."""
    keep = (parts[src] == owner) & (parts[dst] == reader)
    return torch.unique(src[keep])


def build_partition(graph: Any, parts: torch.Tensor, rank: int, world_size: int) -> Partition:
    """Worker ``rank``'s block and plans, from the whole graph and everyone's ``parts``."""
    dgl = import_dgl()
    if parts.numel() != graph.num_nodes():
        raise ValueError(f"parts has {parts.numel()} entries for {graph.num_nodes()} nodes")
    parts = parts.to(torch.int64).cpu()
    src, dst = (t.to(torch.int64).cpu() for t in graph.edges())
    # owned nodes in three runs, each by global id: the central nodes (no in-neighbour on
    # another worker), the marginal ones that a central node reads, the other marginal ones.
    # A layer's central half then reads a prefix of the owned rows, as a view
    into_owned = parts[dst] == rank
    is_marginal = torch.zeros(graph.num_nodes(), dtype=torch.bool)
    is_marginal[dst[into_owned & (parts[src] != rank)]] = True
    read_by_central = torch.zeros(graph.num_nodes(), dtype=torch.bool)
    read_by_central[src[into_owned & ~is_marginal[dst]]] = True
    mine = torch.nonzero(parts == rank, as_tuple=False).squeeze(1)
    central_ids = mine[~is_marginal[mine]]
    marginal_ids = mine[is_marginal[mine]]
    read = read_by_central[marginal_ids]
    owned = torch.cat([central_ids, marginal_ids[read], marginal_ids[~read]])
    n_owned, n_central = int(owned.numel()), int(central_ids.numel())
    n_central_src = n_central + int(read.sum())
    recv = [
        _boundary_sources(src, dst, parts, p, rank) if p != rank else owned.new_empty(0)
        for p in range(world_size)
    ]
    halo = torch.cat(recv) if recv else owned.new_empty(0)
    local = torch.full((graph.num_nodes(),), -1, dtype=torch.int64)
    local[owned] = torch.arange(n_owned)
    local[halo] = n_owned + torch.arange(halo.numel())
    lsrc, ldst = local[src[into_owned]], local[dst[into_owned]]
    all_src = torch.cat([owned, halo])
    n_src = n_owned + int(halo.numel())
    block = _block(dgl, lsrc, ldst, all_src, owned, n_src)
    central = torch.arange(n_central)
    marginal = torch.arange(n_central, n_owned)
    keep_c = ldst < n_central
    # central half: dst = the central nodes, src = the owned rows they read (a block whose
    # destinations lead its sources, as DGL expects); marginal half: dst = the marginal
    # nodes, src = owned + halo, so its destinations are not the leading sources and the
    # layer gets its destination rows separately (see DistTrainer)
    central_block = _block(
        dgl, lsrc[keep_c], ldst[keep_c], owned[:n_central_src], owned[:n_central], n_central_src
    )
    marginal_block = _block(
        dgl, lsrc[~keep_c], ldst[~keep_c] - n_central, all_src, owned[n_central:], n_src
    )
    send_index = [
        local[_boundary_sources(src, dst, parts, rank, p)] if p != rank else owned.new_empty(0)
        for p in range(world_size)
    ]
    return Partition(
        rank=rank,
        world_size=world_size,
        owned=owned,
        halo=halo,
        block=block,
        send_index=send_index,
        recv_counts=[int(r.numel()) for r in recv],
        central=central,
        marginal=marginal,
        central_block=central_block,
        marginal_block=marginal_block,
    )


def _block(
    dgl: Any,
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    num_src: int,
) -> Any:
    """A block from local edge ends, with global ids on both sides (``dgl.NID``)."""
    block = dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=int(dst_ids.numel()))
    block.srcdata[dgl.NID] = src_ids.clone()
    block.dstdata[dgl.NID] = dst_ids.clone()
    return block
