"""GCN (Kipf & Welling, ICLR 2017) from DGL's ``GraphConv``, as DGL's GCN example builds it.

On a block, ``GraphConv(norm="both")`` normalises by the block's degrees, not the
graph's: a source node's out-degree inside a block counts only the destination
nodes of that batch, so layer-wise evaluation would not compute the model that
full-graph training trains. On blocks the layer therefore gets per-edge weights
``sqrt(block_out(u) / d_out(u)) * sqrt(d_in(v) / block_in(v))``: with all
neighbours this is exactly the full-graph GCN, with sampled neighbours it is the
unbiased estimate of it. The full-graph degrees are recorded by ``prepare_graph``.

Where every destination of a block keeps all its in-edges (full-neighbour
blocks: layer-wise evaluation, a distributed worker's block) the weights
reduce to a factor per source, and the source rows are scaled instead
(``conv_inputs``): GraphConv then aggregates with ``copy_u``, which DGL runs on
CPU several times faster than ``u_mul_e``.
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
        self._per_block: dict[tuple[int, str], tuple[Any, torch.Tensor | None]] = {}

    def prepare_graph(self, graph: Any) -> Any:
        graph = self.with_self_loops(graph)
        device = next(self.parameters()).device
        self.deg_out = graph.out_degrees().float().clamp(min=1).to(device)
        self.deg_in = graph.in_degrees().float().clamp(min=1).to(device)
        self._per_block.clear()
        return graph

    def block_weights(self, block: Any) -> torch.Tensor:
        """Edge weights that turn a block's degree normalisation into the full graph's."""
        weights = self._kept(block, "weights", self._compute_block_weights)
        assert weights is not None
        return weights

    def source_scale(self, block: Any) -> torch.Tensor | None:
        """``sqrt(block_out(u) / d_out(u))`` per source, when the block weights are that alone.

        They are ``a(u) * b(v)`` with ``b(v) = sqrt(d_in(v) / block_in(v))``, which is 1 for
        every destination that keeps all its in-edges; None when one does not (sampled
        neighbours), and the edge weights are needed.
        """
        return self._kept(block, "scale", self._compute_source_scale)

    def conv_inputs(self, block: Any, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(source rows, edge weights)`` to give GraphConv on ``block`` (``h``: its source
        rows), so that it computes the full-graph GCN: the rows scaled per source and no
        weights where ``source_scale`` allows (DGL's ``copy_u`` sum instead of ``u_mul_e``:
        a hidden layer of rank 0's 4-worker arxiv block, forward and backward, one thread,
        took 410 ms instead of 1,011, ``bench/overlap_layer.py``), else the rows and
        ``block_weights``."""
        # a block on the CPU beside features on a GPU (qtrain's route): the weights go to h
        scale = self.source_scale(block)
        if scale is None:
            return h, self.block_weights(block).to(h.device)
        return h * scale.view(-1, *([1] * (h.dim() - 1))).to(h.device, h.dtype), None

    def _kept(self, block: Any, kind: str, compute: Any) -> torch.Tensor | None:
        """``compute(block)``, kept for the last few blocks: a partition's blocks (and
        layer-wise evaluation's last ones) are the same every step."""
        found = self._per_block.get((id(block), kind))
        if found is not None and found[0] is block:
            return found[1]
        value = compute(block)
        if len(self._per_block) >= 8:
            self._per_block.pop(next(iter(self._per_block)))
        self._per_block[(id(block), kind)] = (block, value)
        return value

    def _full_degrees(self, block: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The full graph's (out-degree of each source, in-degree of each destination)."""
        if self.deg_out is None or self.deg_in is None:
            raise RuntimeError("GCN.prepare_graph(graph) must run before the model sees blocks")
        dgl = import_dgl()
        device = block.device
        full_out = self.deg_out[block.srcdata[dgl.NID].to(self.deg_out.device)].to(device)
        full_in = self.deg_in[block.dstdata[dgl.NID].to(self.deg_in.device)].to(device)
        return full_out, full_in

    def _compute_source_scale(self, block: Any) -> torch.Tensor | None:
        full_out, full_in = self._full_degrees(block)
        if not bool((block.in_degrees().float().clamp(min=1) == full_in).all()):
            return None
        return torch.sqrt(block.out_degrees().float().clamp(min=1) / full_out)

    def _compute_block_weights(self, block: Any) -> torch.Tensor:
        full_out, full_in = self._full_degrees(block)
        src, dst = block.edges()
        blk_out = block.out_degrees().float().clamp(min=1)
        blk_in = block.in_degrees().float().clamp(min=1)
        return torch.sqrt(blk_out[src] / full_out[src]) * torch.sqrt(full_in[dst] / blk_in[dst])

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        h = self.input_dropout(h, graph) if i == 0 else self.dropout(h, graph)
        weight = None
        if graph.is_block:
            # a distributed worker passes its owned rows only and appends the halo in a
            # hook: the edge weights travel, and it calls conv_inputs itself (DistTrainer)
            if h.shape[0] == graph.num_src_nodes():
                h, weight = self.conv_inputs(graph, h)
            else:
                weight = self.block_weights(graph).to(h.device)
        h = self.layers[i](graph, h, edge_weight=weight)
        return F.relu(h) if i < len(self.layers) - 1 else h
