"""DGL's ``SAGEConv`` with the mean aggregator, computed with two fewer full-size tensors.

DGL's forward keeps the aggregation in ``graph.dstdata`` until the layer returns and
adds its two products into a third tensor: at the sum, the layer's input, the
aggregation, both products and the sum are alive, five [nodes, out] float32 tensors.
On a full graph that sum is the step's peak (synthetic-products, GraphSAGE 3 x 128:
1.17 GiB each). Here the aggregation is dropped once ``fc_neigh`` has read it (when
autograd did not keep it: under ``exact`` it keeps a compressed copy) and the second
product is added into the first in place. Same parameters, same calls in the same
order (plugins see ``fc_neigh``, the aggregation, then ``fc_self``), same bits: the sum
is the one float addition DGL's forward does.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from qtrain._compat import import_dgl


@functools.cache
def lean_sage_conv() -> type:
    """The ``SAGEConv`` subclass (made on first use: DGL is imported lazily)."""
    import_dgl()
    from dgl import ops
    from dgl.nn import SAGEConv

    class LeanSAGEConv(SAGEConv):  # type: ignore[misc]
        """``SAGEConv`` whose mean-aggregator forward holds fewer full-size tensors."""

        def forward(self, graph: Any, feat: Any, edge_weight: Any = None) -> torch.Tensor:
            if (
                self._aggre_type != "mean"
                or isinstance(feat, tuple)
                or edge_weight is not None
                or graph.num_edges() == 0
            ):
                return super().forward(graph, feat, edge_weight)
            feat_src = self.feat_drop(feat)
            h_self = feat_src[: graph.num_dst_nodes()] if graph.is_block else feat_src
            if self._in_src_feats > self._out_feats:  # project first: A(XW)
                h_neigh = ops.copy_u_mean(graph, self.fc_neigh(feat_src))
            else:
                h_neigh = self.fc_neigh(ops.copy_u_mean(graph, feat_src))
            rst = self.fc_self(h_self)
            rst += h_neigh
            del h_neigh
            if self.activation is not None:
                rst = self.activation(rst)
            if self.norm is not None:
                rst = self.norm(rst)
            return rst

    return LeanSAGEConv
