"""HGT (Hu et al., WWW 2020) from DGL's ``HGTConv``.

Keys, queries and values are typed by node type, the attention and message
transforms by edge type, all through DGL's ``TypedLinear`` (segment GEMMs on the
whole graph, whose nodes and edges are grouped by type); DGL's ``edge_softmax``
normalises the attention. A linear layer maps the last HGT layer to the classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.data.base import Relations
from qtrain.models.relational import RelationalModel


@dataclass(frozen=True)
class HGTOptions:
    hidden: int = option(64, "hidden units per head", min=1)
    layers: int = option(2, "HGTConv layers (a linear layer then outputs the classes)", min=1)
    heads: int = option(1, "attention heads (concatenated)", min=1)
    dropout: float = option(0.2, "dropout inside every HGTConv", min=0.0, max=1.0)
    layer_norm: bool = option(False, "layer normalisation after every HGTConv")


class HGT(RelationalModel):
    """HGTConv layers with GELU between them, then a linear output layer."""

    def __init__(
        self, in_feats: int, num_classes: int, options: HGTOptions, relations: Relations
    ) -> None:
        super().__init__(relations)
        import_dgl()
        from dgl.nn import HGTConv

        width = options.hidden * options.heads
        for i in range(options.layers):
            self.layers.append(
                HGTConv(
                    in_feats if i == 0 else width,
                    options.hidden,
                    options.heads,
                    relations.num_ntypes,
                    relations.num_etypes,
                    dropout=options.dropout,
                    use_norm=options.layer_norm,
                )
            )
        self.classify = nn.Linear(width, num_classes)
        self._dims = [width] * options.layers

    @property
    def output_layer(self) -> nn.Module:
        return self.classify

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](
            graph,
            h,
            self.node_types(graph),
            self.edge_types(graph),
            presorted=self.presorted(graph),
        )
        return h if i == len(self.layers) - 1 else F.gelu(h)

    def decode(self, h: torch.Tensor) -> torch.Tensor:
        return self.classify(h)
