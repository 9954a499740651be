"""What the relational models (RGCN, RGAT, HGT) share: the types they are built for, and
where a layer finds the type ids of its graph.

A relational dataset is one homogeneous graph with ``ndata["ntype"]`` and
``edata["etype"]`` (``qtrain.data.base.Relations``), its edges grouped by edge
type. A layer reads the ids from the graph it is given, so the same code runs
on the whole graph and on a mini-batch block (DGL copies node and edge data
into blocks). On the whole graph the edges and the nodes are sorted by type, so
DGL's typed linear layers take their segment-GEMM path (``segment_mm``, one
segment per type, no per-edge copy of the weights); a block's are not, and they
gather (``gather_mm``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from qtrain.data.base import ETYPE, NTYPE, Relations
from qtrain.models.base import GNNModel


class RelationalModel(GNNModel):
    """A model whose layers have weights per node or edge type."""

    # build_model passes the dataset's Relations, and refuses a dataset without types
    needs_relations: ClassVar[bool] = True

    def __init__(self, relations: Relations) -> None:
        super().__init__()
        self.relations = relations

    @staticmethod
    def edge_types(graph: Any) -> torch.Tensor:
        """The graph's (or block's) edge type ids."""
        return graph.edata[ETYPE]

    @staticmethod
    def node_types(graph: Any) -> torch.Tensor:
        """The type ids of the graph's nodes (a block's source nodes, destinations first)."""
        return graph.srcdata[NTYPE]

    @staticmethod
    def presorted(graph: Any) -> bool:
        """Whether the edges and nodes are grouped by type: the whole graph's are."""
        return not graph.is_block

    @staticmethod
    def relation_norm(graph: Any) -> torch.Tensor:
        """``1 / |N_v^r|`` per edge (RGCN's c_{v,r}): one over the number of in-edges of the
        edge's type at its destination, as (E, 1)."""
        _, dst = graph.edges()
        etype = graph.edata[ETYPE]
        key = dst.long() * (int(etype.max()) + 1 if len(etype) else 1) + etype
        _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        return (1.0 / counts[inverse].float()).unsqueeze(1)
