"""GCNII (Chen et al., ICML 2020) from DGL's ``GCN2Conv``, as DGL's GCNII example builds it.

Deep by design: initial residual (alpha) and identity mapping (beta = log(lambda / l + 1))
keep 16-64 layers from over-smoothing. ``GCN2Conv`` writes to ``graph.ndata``, which
blocks do not have, so GCNII trains full-graph only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.models.base import GNNModel


@dataclass(frozen=True)
class GCNIIOptions:
    hidden: int = option(64, "hidden units (all GCN2Conv layers have this width)", min=1)
    layers: int = option(16, "GCN2Conv layers", min=1)
    dropout: float = option(
        0.6, "dropout before every layer and before the output Linear", min=0.0, max=1.0
    )
    alpha: float = option(0.1, "initial-residual weight", min=0.0, max=1.0)
    lambda_: float = option(
        0.5, "identity-mapping strength (beta_l = log(lambda / l + 1))", min=0.0, key="lambda"
    )


class GCNII(GNNModel):
    """Input Linear, ``layers`` GCN2Conv layers with ReLU, output Linear."""

    supports_minibatch = False

    def __init__(self, in_feats: int, num_classes: int, options: GCNIIOptions) -> None:
        super().__init__()
        import_dgl()
        from dgl.nn import GCN2Conv

        self.input_linear = nn.Linear(in_feats, options.hidden)
        for i in range(options.layers):
            self.layers.append(
                GCN2Conv(
                    options.hidden,
                    layer=i + 1,
                    alpha=options.alpha,
                    lambda_=options.lambda_,
                    project_initial_features=True,
                    allow_zero_in_degree=True,
                )
            )
        self.output_linear = nn.Linear(options.hidden, num_classes)
        self.dropout = nn.Dropout(options.dropout)
        self._hidden = options.hidden

    def prepare_graph(self, graph: Any) -> Any:
        return self.with_self_loops(graph)

    @property
    def output_layer(self) -> nn.Module:
        return self.output_linear

    def layer_dims(self) -> list[int]:
        return [self._hidden] * len(self.layers)

    def forward(self, graph_or_blocks: Any, x: torch.Tensor) -> torch.Tensor:
        graphs = self._graphs(graph_or_blocks)
        h = h0 = F.relu(self.input_linear(self.dropout(x)))
        for layer, graph in zip(self.layers, graphs, strict=True):
            # relu applied here, not passed as the conv's activation (which DGL keeps as
            # an attribute): plugins intercept F.relu where it is looked up by name
            h = F.relu(layer(graph, self.dropout(h), h0))
        return self.output_linear(self.dropout(h))
