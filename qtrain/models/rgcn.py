"""RGCN (Schlichtkrull et al., ESWC 2018) from DGL's ``RelGraphConv``.

A layer is ``h_v' = W_0 h_v + sum_r sum_{u in N_v^r} (1 / |N_v^r|) W_r h_u`` (Hector's
equation 1): one weight per relation (or ``num_bases`` shared bases), the node's own
term as a "virtual self-loop". ``RelGraphConv`` forms the messages with DGL's
``TypedLinear``, which on the whole graph is one segment GEMM over the edges grouped
by relation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.data.base import Relations
from qtrain.models.relational import RelationalModel

NORM = "rgcn_norm"  # edge data: 1 / |N_v^r|


@dataclass(frozen=True)
class RGCNOptions:
    hidden: int = option(64, "hidden units per layer", min=1)
    layers: int = option(2, "RelGraphConv layers (the last one outputs the classes)", min=1)
    num_bases: int = option(
        0,
        "basis decomposition of the relation weights: 0 = one full weight per relation "
        "(Hector's setting), else that many shared bases",
        min=0,
    )
    self_loop: bool = option(True, "the node's own term W_0 h_v (the virtual self-loop)")
    dropout: float = option(0.0, "dropout on every layer's output but the last", min=0.0, max=1.0)


class RGCN(RelationalModel):
    """RelGraphConv layers, ReLU between them, normalised by in-degree per relation."""

    def __init__(
        self, in_feats: int, num_classes: int, options: RGCNOptions, relations: Relations
    ) -> None:
        super().__init__(relations)
        import_dgl()
        from dgl.nn import RelGraphConv

        dims = [in_feats] + [options.hidden] * (options.layers - 1) + [num_classes]
        bases = options.num_bases or None
        for i in range(options.layers):
            self.layers.append(
                RelGraphConv(
                    dims[i],
                    dims[i + 1],
                    relations.num_etypes,
                    regularizer="basis" if bases else None,
                    num_bases=bases,
                    self_loop=options.self_loop,
                    dropout=0.0 if i == options.layers - 1 else options.dropout,
                )
            )
        self._dims = dims[1:]

    def prepare_graph(self, graph: Any) -> Any:
        graph.edata[NORM] = self.relation_norm(graph)  # blocks take it from here
        return graph

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](
            graph,
            h,
            self.edge_types(graph),
            graph.edata[NORM],
            presorted=self.presorted(graph),
        )
        return h if i == len(self.layers) - 1 else F.relu(h)
