"""The CSR views cache: one conversion per graph, one copy per device, nothing kept for a
graph index that is gone."""

from __future__ import annotations

import gc

import torch

from qtrain._compat import import_dgl
from qtrain.ops.graph import CSR_CACHE, graph_csr

dgl = import_dgl()


def test_a_new_index_object_of_the_same_graph_reuses_the_device_copy() -> None:
    CSR_CACHE.clear()
    g = dgl.rand_graph(20, 60)
    first = graph_csr(g._graph, 0, "meta")
    assert first.in_indptr.device.type == "meta"
    assert graph_csr(g._graph, 0, "meta") is first  # the same index object: no call into DGL
    relation = g[g.canonical_etypes[0]]  # slicing a relation makes a new index object
    assert relation._graph is not g._graph
    assert graph_csr(relation._graph, 0, "meta") is first  # same COO arrays: no new copy
    assert graph_csr(g._graph).in_indptr.device.type == "cpu"


def test_an_index_that_is_gone_leaves_the_cache() -> None:
    CSR_CACHE.clear()
    g = dgl.rand_graph(10, 30)
    graph_csr(g._graph, 0, "meta")
    assert len(CSR_CACHE._by_index) == 1
    del g
    gc.collect()
    assert len(CSR_CACHE._by_index) == 0


def test_views_match_the_edges_in_edge_id_order() -> None:
    src = torch.tensor([3, 0, 2, 2, 1])
    dst = torch.tensor([0, 1, 1, 3, 3])
    g = dgl.graph((src, dst), num_nodes=4)
    csr = graph_csr(g._graph)
    assert csr.src.tolist() == src.tolist() and csr.dst.tolist() == dst.tolist()
    assert csr.in_degrees().tolist() == [1, 2, 0, 2]
