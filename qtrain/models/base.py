"""The interface every qtrain model has, so the trainer and plugins need no special cases.

A model is a stack of DGL's own ``dgl.nn`` convolutions (plugins work by
patching DGL, so a model must never carry its own convolution code). It runs
on one graph (full-graph training: the same graph for every layer) or on a
list of blocks (neighbour-sampled mini-batches), and it can run layer by layer
over the whole graph with full neighbourhoods, which is how mini-batch
training evaluates without running out of memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from qtrain import route
from qtrain._compat import import_dgl


class GNNModel(nn.Module):
    """Base class: ``layers`` holds the GNN layers in order; subclasses define one step.

    Subclasses fill ``self.layers`` and override ``layer_step`` (dropout, the
    convolution and what follows it for layer ``i``); ``encode`` / ``decode``
    are row-wise transforms before the first and after the last GNN layer
    (identity unless the model has input / output ``Linear`` layers).
    """

    supports_minibatch: ClassVar[bool] = True
    # Whether a layer reads a block's destination rows apart from its source rows (SAGE's
    # self term). On a block DGL takes them as a slice of the source rows, whose gradient
    # is a zero-filled tensor of all source rows; a distributed worker then passes its
    # owned rows as the destination rows instead (DistTrainer).
    reads_destination_rows: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList()

    # --- graph preparation -------------------------------------------------

    def prepare_graph(self, graph: Any) -> Any:
        """The graph as this model expects it (self-loops etc.); called once, before training."""
        return graph

    @staticmethod
    def with_self_loops(graph: Any) -> Any:
        """Remove then add self-loops, as DGL's GCN / GAT examples do (one loop per node)."""
        dgl = import_dgl()
        return dgl.add_self_loop(dgl.remove_self_loop(graph))

    # --- structure -----------------------------------------------------------

    @property
    def output_layer(self) -> nn.Module:
        """The layer whose output feeds the softmax (kept in FP32 by quantizing plugins)."""
        return self.layers[-1]

    @property
    def output_layer_name(self) -> str:
        """The qualified module name of ``output_layer`` (as in ``named_modules()``)."""
        target = self.output_layer
        for name, module in self.named_modules():
            if module is target:
                return name
        raise LookupError("output_layer is not a submodule of the model")

    def layer_dims(self) -> list[int]:
        """Output width (per node, flattened) of each GNN layer, for layer-wise inference."""
        raise NotImplementedError

    # --- computation ---------------------------------------------------------

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Row-wise transform of the input features before ``layers[0]``."""
        return x

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        """Run GNN layer ``i`` on ``graph`` (a graph or a block), with what goes around it."""
        raise NotImplementedError

    def decode(self, h: torch.Tensor) -> torch.Tensor:
        """Row-wise transform of the last GNN layer's output into logits."""
        return h

    def forward(self, graph_or_blocks: Any, x: torch.Tensor) -> torch.Tensor:
        """Logits for the destination nodes: one graph for all layers, or one block per layer."""
        graphs = self._graphs(graph_or_blocks)
        # Each layer's input is handed over with no reference left in this frame, so a
        # layer step frees it once its dropout has read it, unless autograd saved it:
        # under exact, which saves masks, that is one [nodes, width] tensor fewer at the
        # forward's peak.
        carried = [self.encode(x)]
        for i, graph in enumerate(graphs):
            carried.append(self.layer_step(i, graph, carried.pop()))
        return self.decode(carried.pop())

    def _graphs(self, graph_or_blocks: Any) -> Sequence[Any]:
        if isinstance(graph_or_blocks, list | tuple):
            if not self.supports_minibatch:
                raise ValueError(f"{type(self).__name__} does not run on mini-batch blocks")
            if len(graph_or_blocks) != len(self.layers):
                raise ValueError(
                    f"got {len(graph_or_blocks)} blocks for a model with {len(self.layers)} layers"
                )
            return list(graph_or_blocks)
        return [graph_or_blocks] * len(self.layers)

    @torch.no_grad()
    def inference(
        self, graph: Any, x: torch.Tensor, batch_size: int, device: torch.device | str
    ) -> torch.Tensor:
        """Logits for every node, computed layer by layer with all neighbours.

        Each layer runs over all nodes in batches of ``batch_size`` destination
        nodes, so memory stays bounded by one layer's output (DGL's GraphSAGE
        example does the same). Outputs are gathered on the CPU. Call in eval mode.
        ``batch_size`` 0 (or at least the node count): one full-graph forward, the same
        logits without sampling every node's neighbourhood into blocks (on
        synthetic-products, 2 cores: 264 s in batches of 65,536 nodes, 22 s at once).
        """
        if not self.supports_minibatch or not 0 < batch_size < graph.num_nodes():
            return self(graph.to(device), x.to(device)).cpu()
        dgl = import_dgl()
        device = torch.device(device)
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        nodes = torch.arange(graph.num_nodes(), device=graph.device)
        loader = dgl.dataloading.DataLoader(
            graph,
            nodes,
            sampler,
            device=route.sampler_device(device),
            batch_size=batch_size,
            shuffle=False,
            drop_last=False,
            num_workers=0,
        )
        h = self.encode(x.to(device)).cpu()
        dims = self.layer_dims()
        for i in range(len(self.layers)):
            out = torch.empty(graph.num_nodes(), dims[i], dtype=h.dtype)
            for input_nodes, output_nodes, blocks in loader:
                block_in = h[input_nodes.cpu()].to(device)
                y = self.layer_step(i, blocks[0], block_in)
                out[output_nodes.cpu()] = y.reshape(y.shape[0], -1).cpu()
            h = out
        return self.decode(h.to(device)).cpu()
