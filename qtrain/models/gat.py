"""GAT (Velickovic et al., ICLR 2018) from DGL's ``GATConv``, as DGL's GAT example builds it.

Its dropout is qtrain's node-keyed one (``qtrain.models.dropout``) instead of the
``nn.Dropout`` that ``GATConv`` makes: the features' before each layer (GATConv's own
``feat_drop`` does the same to the same tensor) and the attention coefficients' (each
layer's ``attn_drop``, keyed by edge). So an FP32 run and a quantized one with the same
seed drop the same elements, and the mask costs one counter-hash pass instead of torch's
Bernoulli draw, which was 214 of a 264 ms FP32 epoch on Citeseer (3,327 x 3,703 features).
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
class GATOptions:
    hidden: int = option(8, "hidden units per head", min=1)
    layers: int = option(2, "GATConv layers (the last one outputs the classes)", min=1)
    heads: int = option(8, "attention heads of every hidden layer (concatenated)", min=1)
    out_heads: int = option(1, "attention heads of the output layer (averaged)", min=1)
    dropout: float = option(0.6, "dropout on each layer's input features", min=0.0, max=1.0)
    attn_dropout: float = option(0.6, "dropout on the attention coefficients", min=0.0, max=1.0)
    negative_slope: float = option(0.2, "LeakyReLU slope of the attention scores", min=0.0)
    residual: bool = option(False, "residual connection in every layer")


class GAT(GNNModel):
    """Multi-head GATConv layers: hidden heads concatenated then ELU, output heads averaged."""

    def __init__(self, in_feats: int, num_classes: int, options: GATOptions) -> None:
        super().__init__()
        import_dgl()
        from dgl.nn import GATConv

        n = options.layers
        self._dims: list[int] = []
        width = in_feats
        for i in range(n):
            last = i == n - 1
            out, heads = (
                (num_classes, options.out_heads) if last else (options.hidden, options.heads)
            )
            self.layers.append(
                GATConv(
                    width,
                    out,
                    heads,
                    negative_slope=options.negative_slope,
                    residual=options.residual,
                    allow_zero_in_degree=True,  # self-loops come from prepare_graph
                )
            )
            # GATConv calls attn_drop on the [edges, heads, 1] coefficients: keyed by edge
            self.layers[-1].attn_drop = NodeDropout(options.attn_dropout)
            width = out * heads
            self._dims.append(out if last else width)
        self.dropout = NodeDropout(options.dropout)

    def prepare_graph(self, graph: Any) -> Any:
        return self.with_self_loops(graph)

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](graph, self.dropout(h, graph))  # (nodes, heads, out)
        if i == len(self.layers) - 1:
            return h.mean(1)
        return F.elu(h.flatten(1))
