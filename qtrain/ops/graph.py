"""The CSR views of a DGL graph that the quantized SpMM / SDDMM kernels read.

Built from the graph's COO (``gidx.edges``) with a stable sort, because DGL
2.1 crashes converting a block (a bipartite mini-batch graph) to CSC under
this torch. Each relation of a graph is converted once on the CPU and copied
once to each device that asks for it (qtrain's device route keeps the
structure on the GPU while DGL's graph stays on the CPU), and kept while it
is among the most recently used: full-graph training converts once per run;
mini-batch training once per block. Indices are int32 whenever the graph
fits, halving the index traffic of the gathers.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, fields
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

    @property
    def device(self) -> torch.device:
        return self.src.device

    def to(self, device: torch.device) -> GraphCSR:
        """The same views with every array on ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            if isinstance(getattr(self, f.name), torch.Tensor)
            else getattr(self, f.name)
            for f in fields(self)
        }
        return GraphCSR(**moved)

    def in_degrees(self) -> torch.Tensor:
        """In-degree of every destination node, on the views' device (no host sync)."""
        return self.in_indptr[1:] - self.in_indptr[:-1]


def index_dtype(*sizes: int) -> torch.dtype:
    """int32 for the indices of a graph whose edge and node counts all fit it (half the
    index traffic of the gathers), else int64."""
    return torch.int64 if max(sizes, default=0) > _INT32_LIMIT else torch.int32


def group_rows(
    rows: torch.Tensor,
    cols: torch.Tensor,
    eids: torch.Tensor | None,
    num_rows: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(indptr, cols, eids)`` of the entries ``(rows[e], cols[e])`` grouped by row, stable
    (within a row, in entry order), indices as ``dtype``; no host sync on any device.
    Without ``eids`` (None) none are returned either."""
    order = torch.argsort(rows, stable=True)
    # a scatter-add, not bincount: bincount reads the largest row id back to the host
    counts = torch.zeros(num_rows, dtype=torch.int64, device=rows.device)
    one = torch.ones((), dtype=torch.int64, device=rows.device)
    counts.index_add_(0, rows, one.expand(rows.numel()))  # no entry-sized tensor of ones
    indptr = torch.zeros(num_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    grouped = cols[order].to(dtype)
    grouped_eids = eids[order].to(dtype) if eids is not None else None
    return indptr.to(dtype), grouped, grouped_eids


def build_csr(src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int) -> GraphCSR:
    """CSR views of the edges ``src[e] -> dst[e]`` (edge ids are positions)."""
    src = src.to(torch.int64)
    dst = dst.to(torch.int64)
    num_edges = int(src.numel())
    dtype = index_dtype(num_edges, num_src, num_dst)
    eids = torch.arange(num_edges, dtype=torch.int64, device=src.device)
    in_indptr, in_indices, in_eids = group_rows(dst, src, eids, num_dst, dtype)
    out_indptr, out_indices, out_eids = group_rows(src, dst, eids, num_src, dtype)
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


def _coo(gidx: Any, etype: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """(src, dst, eid, num_src, num_dst) of one relation of a graph index, zero-copy."""
    src_type, dst_type = gidx.metagraph.find_edge(etype)
    src, dst, eid = gidx.edges(etype)
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


def csr_from_gidx(gidx: Any, etype: int = 0) -> GraphCSR:
    """CSR views of one relation of a DGL ``HeteroGraphIndex`` (a graph or a block)."""
    return csr_from_coo(*_coo(gidx, etype))


_CPU = torch.device("cpu")


class _CSRCache:
    """GraphCSR of the most recently used graphs, per relation and device.

    Two keys lead to an entry. The graph-index object itself (held weakly, and
    dropped when that object is freed, so a reused ``id`` cannot hit): a hit costs
    no call into DGL. And the addresses and sizes of the relation's COO source
    and destination arrays: DGL hands the primitives a new graph-index object for
    the same graph in places (``g[etype]`` in HeteroGraphConv, blocks), but one
    graph's COO arrays stay where they are. Only arrays whose edge ids are 0..E-1
    in COO order are entered under their addresses (checked once, on a miss), and
    the entry holds the arrays, so their memory cannot be freed and reused by
    another graph while it exists. A device's views are the CPU views copied once
    per such entry, so a new index object of a known graph costs no copy. Only the
    last few graphs are kept, which covers full-graph training (one graph) and
    mini-batch training (one block per layer per step).
    """

    def __init__(self, capacity: int = 16) -> None:
        self._lock = threading.RLock()  # reentrant: a weakref callback may run inside get
        self._capacity = capacity
        self._by_arrays: OrderedDict[tuple[Any, ...], _ArraysEntry] = OrderedDict()
        self._by_index: OrderedDict[tuple[Any, ...], tuple[Any, GraphCSR]] = OrderedDict()

    def get(self, gidx: Any, etype: int = 0, device: torch.device | str | None = None) -> GraphCSR:
        device = _CPU if device is None else torch.device(device)
        index_key = (id(gidx), etype, device)
        with self._lock:
            entry = self._by_index.get(index_key)
            if entry is not None and entry[0]() is gidx:
                self._by_index.move_to_end(index_key)
                return entry[1]
        csr = self._views(gidx, etype, device)
        with self._lock:
            drop = functools.partial(self._forget, index_key)
            self._by_index[index_key] = (weakref.ref(gidx, drop), csr)
            self._by_index.move_to_end(index_key)
            while len(self._by_index) > self._capacity * 4:
                self._by_index.popitem(last=False)
        return csr

    def _forget(self, index_key: tuple[Any, ...], _ref: Any) -> None:
        with self._lock:
            entry = self._by_index.get(index_key)
            if entry is not None and entry[0] is _ref:
                del self._by_index[index_key]

    def _views(self, gidx: Any, etype: int, device: torch.device) -> GraphCSR:
        src, dst, eid, num_src, num_dst = _coo(gidx, etype)
        key = (src.data_ptr(), dst.data_ptr(), src.numel(), num_src, num_dst)
        with self._lock:
            entry = self._by_arrays.get(key)
            if entry is not None:
                self._by_arrays.move_to_end(key)
        if entry is None:
            csr = csr_from_coo(src, dst, eid, num_src, num_dst)
            if src.numel() and not torch.equal(eid, torch.arange(src.numel())):
                return csr if device == _CPU else csr.to(device)  # permuted ids: not cached
            entry = _ArraysEntry((src, dst), csr, {})
            with self._lock:
                self._by_arrays[key] = entry
                while len(self._by_arrays) > self._capacity:
                    self._by_arrays.popitem(last=False)
        if device == _CPU:
            return entry.csr
        with self._lock:
            moved = entry.on_device.get(device)
            if moved is None:
                moved = entry.on_device[device] = entry.csr.to(device)
        return moved

    def clear(self) -> None:
        with self._lock:
            self._by_arrays.clear()
            self._by_index.clear()


@dataclass
class _ArraysEntry:
    arrays: tuple[torch.Tensor, torch.Tensor]  # held so that their memory is not reused
    csr: GraphCSR  # the CPU views
    on_device: dict[torch.device, GraphCSR]  # the same views copied to each device once


CSR_CACHE = _CSRCache()


def graph_csr(gidx: Any, etype: int = 0, device: torch.device | str | None = None) -> GraphCSR:
    """The cached CSR views of relation ``etype`` of ``gidx``, on ``device`` (default CPU)."""
    return CSR_CACHE.get(gidx, etype, device)
