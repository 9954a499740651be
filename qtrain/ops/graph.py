"""The CSR views of a DGL graph that the quantized SpMM / SDDMM kernels read.

Built from the graph's COO (``gidx.edges``) with a stable sort, because DGL
2.1 crashes converting a block (a bipartite mini-batch graph) to CSC under
this torch. Each graph is converted once and kept while it is among the most
recently used: full-graph training converts once per run; mini-batch
training once per block. Indices are int32 whenever the graph fits, halving the index
traffic of the gathers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

_INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class GraphCSR:
    """One relation's edges, grouped by destination (in-CSR) and by source (out-CSR)."""

    num_src: int
    num_dst: int
    num_edges: int
    src: torch.Tensor  # [E] source of edge e (edge-id order)
    dst: torch.Tensor  # [E] destination of edge e
    in_indptr: torch.Tensor  # [num_dst + 1]
    in_indices: torch.Tensor  # [E] source node of each in-edge
    in_eids: torch.Tensor  # [E] edge id of each in-edge
    out_indptr: torch.Tensor  # [num_src + 1]
    out_indices: torch.Tensor  # [E] destination node of each out-edge
    out_eids: torch.Tensor  # [E] edge id of each out-edge
    edge_ids: torch.Tensor  # [E] 0..E-1, the row index of edge data


def _grouped(
    rows: torch.Tensor, cols: torch.Tensor, eids: torch.Tensor, num_rows: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=num_rows)
    indptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return indptr.to(dtype), cols[order].to(dtype), eids[order].to(dtype)


def build_csr(src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int) -> GraphCSR:
    """CSR views of the edges ``src[e] -> dst[e]`` (edge ids are positions)."""
    src = src.to(torch.int64)
    dst = dst.to(torch.int64)
    num_edges = int(src.numel())
    big = max(num_edges, num_src, num_dst) > _INT32_LIMIT
    dtype = torch.int64 if big else torch.int32
    eids = torch.arange(num_edges, dtype=torch.int64, device=src.device)
    in_indptr, in_indices, in_eids = _grouped(dst, src, eids, num_dst, dtype)
    out_indptr, out_indices, out_eids = _grouped(src, dst, eids, num_src, dtype)
    return GraphCSR(
        num_src=num_src,
        num_dst=num_dst,
        num_edges=num_edges,
        src=src.to(dtype),
        dst=dst.to(dtype),
        in_indptr=in_indptr,
        in_indices=in_indices,
        in_eids=in_eids,
        out_indptr=out_indptr,
        out_indices=out_indices,
        out_eids=out_eids,
        edge_ids=eids.to(dtype),
    )


def _coo(gidx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """(src, dst, eid, num_src, num_dst) of a single-relation graph index, zero-copy."""
    src_type, dst_type = gidx.metagraph.find_edge(0)
    src, dst, eid = gidx.edges(0)
    return src, dst, eid, int(gidx.number_of_nodes(src_type)), int(gidx.number_of_nodes(dst_type))


def csr_from_coo(
    src: torch.Tensor, dst: torch.Tensor, eid: torch.Tensor, num_src: int, num_dst: int
) -> GraphCSR:
    """CSR views of DGL's COO arrays (put in edge-id order first if they are not)."""
    num_edges = int(src.numel())
    if num_edges and not torch.equal(eid, torch.arange(num_edges, device=eid.device)):
        by_id_src = torch.empty_like(src)
        by_id_dst = torch.empty_like(dst)
        by_id_src[eid.long()] = src
        by_id_dst[eid.long()] = dst
        src, dst = by_id_src, by_id_dst
    return build_csr(src, dst, num_src, num_dst)


def csr_from_gidx(gidx: Any) -> GraphCSR:
    """CSR views of a single-relation DGL ``HeteroGraphIndex`` (a graph or a block)."""
    return csr_from_coo(*_coo(gidx))


class _CSRCache:
    """GraphCSR of the most recently used graphs.

    DGL hands the primitives a different graph-index object from layer to
    layer and epoch to epoch, but one graph's COO source and destination
    arrays stay where they are; so the key is their addresses and sizes
    (graphs whose edge ids are not 0..E-1 in COO order are not cached). The entry holds the arrays,
    so their memory cannot be freed and reused by another graph while the
    entry exists. Only the last few graphs are kept, which covers full-graph
    training (one graph) and mini-batch training (one block per layer per step).
    """

    def __init__(self, capacity: int = 16) -> None:
        self._lock = threading.Lock()
        self._capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], tuple[Any, GraphCSR]] = OrderedDict()

    def get(self, gidx: Any) -> GraphCSR:
        src, dst, eid, num_src, num_dst = _coo(gidx)
        if src.numel() and not torch.equal(eid, torch.arange(src.numel(), device=eid.device)):
            return csr_from_coo(src, dst, eid, num_src, num_dst)  # permuted ids: not cached
        key = (src.data_ptr(), dst.data_ptr(), src.numel(), num_src, num_dst)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[1]
        csr = csr_from_coo(src, dst, eid, num_src, num_dst)
        with self._lock:
            self._entries[key] = ((src, dst), csr)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return csr

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CSR_CACHE = _CSRCache()


def graph_csr(gidx: Any) -> GraphCSR:
    """The cached CSR views of ``gidx``."""
    return CSR_CACHE.get(gidx)
