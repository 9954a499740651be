"""Compact materialization's index (Hector section 3.2.2): a relation's product of a node's
features depends only on the pair (node, relation), so relational layers compute it once
per pair that has an edge instead of once per edge, and aggregate over a graph whose
sources are those pairs.

The index is built once per graph and kept while the graph lives (full-graph training
reuses one graph every epoch); it is rebuilt when the edge types it was built from
change.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from qtrain._compat import import_dgl


class Pairs:
    """The distinct (node, relation) pairs of a graph's edges at one end, grouped by
    relation (so a typed product takes one segment per relation) and, within a relation,
    by the node's type when ``node_types`` is given; and each edge's pair. With
    ``distinct=False`` every edge is its own pair (the same layout without compaction)."""

    def __init__(
        self,
        ends: torch.Tensor,
        etype: torch.Tensor,
        num_nodes: int,
        relations: int,
        node_types: torch.Tensor | None = None,
        distinct: bool = True,
    ) -> None:
        ends, etype = ends.long(), etype.long()
        group = etype
        types = 1
        if node_types is not None and len(node_types):
            types = int(node_types.max()) + 1
            group = etype * types + node_types.long()[ends]
        key = group * num_nodes + ends
        if distinct:
            unique, self.of_edge = torch.unique(key, return_inverse=True)
        else:
            order = torch.argsort(group, stable=True)
            unique, self.of_edge = key[order], torch.empty_like(order)
            self.of_edge[order] = torch.arange(len(order), device=order.device)
        self.node = unique % num_nodes
        group_of_pair = unique // num_nodes
        self.rel = group_of_pair // types
        self.lengths = torch.bincount(self.rel, minlength=relations).cpu()
        # the (relation, node type) groups present, in order, with their pair counts: a
        # product whose weight depends on both takes one segment per group
        groups, group_lengths = torch.unique_consecutive(group_of_pair, return_counts=True)
        self.group_rel, self.group_type = groups // types, groups % types
        self.group_lengths = group_lengths.cpu()

    def __len__(self) -> int:
        return len(self.node)


class CompactIndex:
    """What compact materialization needs of one graph: the source and destination pairs,
    and the graph from source pairs to destinations whose edges are the graph's edges in
    order."""

    def __init__(
        self,
        graph: Any,
        etype: torch.Tensor,
        relations: int,
        src_types: torch.Tensor | None = None,
        distinct: bool = True,
    ) -> None:
        dgl = import_dgl()
        # under qtrain's device route the structure stays on the CPU and the types live
        # with the features: the pairs are computed there, the graph from them stays a
        # CPU DGL graph like every other
        src, dst = graph.edges()
        device = etype.device
        self.stamp = _stamp(graph, etype, relations, src_types, distinct)
        self.src = Pairs(
            src.to(device), etype, graph.num_src_nodes(), relations, src_types, distinct
        )
        self._dst_pairs = (dst.to(device), etype, graph.num_dst_nodes(), relations)
        self.to_dst = dgl.heterograph(
            {("pair", "to", "node"): (self.src.of_edge.to(src.device, dst.dtype), dst)},
            num_nodes_dict={"pair": len(self.src), "node": graph.num_dst_nodes()},
            device=src.device,
        )

    @functools.cached_property
    def dst(self) -> Pairs:
        """The destination pairs, made on first use: only RGAT's target term reads them."""
        return Pairs(*self._dst_pairs)


def _stamp(
    graph: Any, etype: torch.Tensor, relations: int, src_types: Any, distinct: bool
) -> tuple[Any, ...]:
    """What an index was built from: the same tensors, unchanged, give the same index."""

    def of(t: torch.Tensor | None) -> tuple[Any, ...]:
        return () if t is None else (t.data_ptr(), t._version, t.numel(), t.device)

    return (graph.num_edges(), relations, distinct, *of(etype), *of(src_types))


_INDEXES: weakref.WeakKeyDictionary[Any, CompactIndex] = weakref.WeakKeyDictionary()


def compact_index(
    graph: Any,
    etype: torch.Tensor,
    relations: int,
    src_types: torch.Tensor | None = None,
    distinct: bool = True,
) -> CompactIndex:
    """The graph's ``CompactIndex`` (source pairs also grouped by the source's node type
    when ``src_types`` is given; one pair per edge when not ``distinct``)."""
    index = _INDEXES.get(graph)
    if index is None or index.stamp != _stamp(graph, etype, relations, src_types, distinct):
        index = _INDEXES[graph] = CompactIndex(graph, etype, relations, src_types, distinct)
    return index
