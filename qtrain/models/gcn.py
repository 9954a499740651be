"""GCN (Kipf & Welling, ICLR 2017) from DGL's ``GraphConv``, as DGL's GCN example builds it.

On a block, ``GraphConv(norm="both")`` normalises by the block's degrees, not the
graph's: a source node's out-degree inside a block counts only the destination
nodes of that batch, so layer-wise evaluation would not compute the model that
full-graph training trains. On blocks the layer therefore gets per-edge weights
``sqrt(block_out(u) / d_out(u)) * sqrt(d_in(v) / block_in(v))``: with all
neighbours this is exactly the full-graph GCN, with sampled neighbours it is the
unbiased estimate of it. The full-graph degrees are recorded by ``prepare_graph``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.models.base import GNNModel
from qtrain.models.dropout import NodeDropout


@dataclass(frozen=True)
class GCNOptions:
    hidden: int = option(16, "hidden units per layer", min=1)
    layers: int = option(2, "GraphConv layers (the last one outputs the classes)", min=1)
    dropout: float = option(0.5, "dropout before every layer after the first", min=0.0, max=1.0)
    input_dropout: float = option(0.0, "dropout on the input features", min=0.0, max=1.0)


class GCN(GNNModel):
    """GraphConv layers with symmetric normalisation (``norm="both"``), ReLU and dropout."""

    def __init__(self, in_feats: int, num_classes: int, options: GCNOptions) -> None:
        super().__init__()
        import_dgl()
        from dgl.nn import GraphConv

        dims = [in_feats] + [options.hidden] * (options.layers - 1) + [num_classes]
        for i in range(options.layers):
            # self-loops come from prepare_graph, so the per-call zero-in-degree check is moot
            self.layers.append(
                GraphConv(dims[i], dims[i + 1], norm="both", allow_zero_in_degree=True)
            )
        self._dims = dims[1:]
        self.dropout = NodeDropout(options.dropout)
        self.input_dropout = NodeDropout(options.input_dropout)
        self.register_buffer("deg_out", None, persistent=False)
        self.register_buffer("deg_in", None, persistent=False)
        self._block_weights: dict[int, tuple[Any, torch.Tensor]] = {}

    def prepare_graph(self, graph: Any) -> Any:
        graph = self.with_self_loops(graph)
        device = next(self.parameters()).device
        self.deg_out = graph.out_degrees().float().clamp(min=1).to(device)
        self.deg_in = graph.in_degrees().float().clamp(min=1).to(device)
        self._block_weights.clear()
        return graph

    def block_weights(self, block: Any) -> torch.Tensor:
        """Edge weights that turn a block's degree normalisation into the full graph's.

        Kept for the last few blocks: a partition's blocks are the same every step.
        """
        found = self._block_weights.get(id(block))
        if found is not None and found[0] is block:
            return found[1]
        weights = self._compute_block_weights(block)
        if len(self._block_weights) >= 4:
            self._block_weights.pop(next(iter(self._block_weights)))
        self._block_weights[id(block)] = (block, weights)
        return weights

    def _compute_block_weights(self, block: Any) -> torch.Tensor:
        if self.deg_out is None or self.deg_in is None:
            raise RuntimeError("GCN.prepare_graph(graph) must run before the model sees blocks")
        dgl = import_dgl()
        src, dst = block.edges()
        blk_out = block.out_degrees().float().clamp(min=1)
        blk_in = block.in_degrees().float().clamp(min=1)
        full_out = self.deg_out[block.srcdata[dgl.NID].to(self.deg_out.device)].to(blk_out.device)
        full_in = self.deg_in[block.dstdata[dgl.NID].to(self.deg_in.device)].to(blk_in.device)
        return torch.sqrt(blk_out[src] / full_out[src]) * torch.sqrt(full_in[dst] / blk_in[dst])

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        h = self.input_dropout(h, graph) if i == 0 else self.dropout(h, graph)
        weight = self.block_weights(graph) if graph.is_block else None
        h = self.layers[i](graph, h, edge_weight=weight)
        return F.relu(h) if i < len(self.layers) - 1 else h
