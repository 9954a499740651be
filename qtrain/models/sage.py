"""GraphSAGE (Hamilton et al., NeurIPS 2017) from DGL's ``SAGEConv``, as DGL's example builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.models.base import GNNModel
from qtrain.models.dropout import NodeDropout
from qtrain.models.lean_sage import lean_sage_conv


@dataclass(frozen=True)
class SAGEOptions:
    hidden: int = option(16, "hidden units per layer", min=1)
    layers: int = option(2, "SAGEConv layers (the last one outputs the classes)", min=1)
    dropout: float = option(0.5, "dropout before every layer after the first", min=0.0, max=1.0)
    input_dropout: float = option(0.0, "dropout on the input features", min=0.0, max=1.0)
    aggregator: Literal["mean", "gcn", "pool", "lstm"] = option(
        "mean", "neighbour aggregator of SAGEConv"
    )


class SAGE(GNNModel):
    """SAGEConv layers with ReLU and dropout; no self-loops (SAGE keeps the node's own term)."""

    reads_destination_rows = True

    def __init__(self, in_feats: int, num_classes: int, options: SAGEOptions) -> None:
        super().__init__()
        import_dgl()
        SAGEConv = lean_sage_conv()  # DGL's layer, two fewer full-size tensors (mean)

        dims = [in_feats] + [options.hidden] * (options.layers - 1) + [num_classes]
        for i in range(options.layers):
            self.layers.append(SAGEConv(dims[i], dims[i + 1], options.aggregator))
        self._dims = dims[1:]
        self.dropout = NodeDropout(options.dropout)
        self.input_dropout = NodeDropout(options.input_dropout)

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: object, h: torch.Tensor) -> torch.Tensor:
        h = self.input_dropout(h, graph) if i == 0 else self.dropout(h, graph)
        h = self.layers[i](graph, h)
        return F.relu(h) if i < len(self.layers) - 1 else h
