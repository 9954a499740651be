"""RGAT as Hector evaluates it (Busbridge et al. 2019; Hector's Figure 2 and Listing 1).

For an edge ``u -> v`` of relation ``r``: the message ``m = W_r h_u``, the attention
score ``leakyrelu((W_r h_u) . w_s[r] + (W_r h_v) . w_t[r])``, normalised over ``v``'s
incoming edges by DGL's ``edge_softmax``; ``h_v' = sum a * m`` (plus ``W_0 h_v``, the
node's own term, by default). The per-edge products go through DGL's ``TypedLinear``
(one segment GEMM over the edges grouped by relation on the whole graph), the
aggregation through DGL's ``update_all``: DGL's primitives, so plugins see them. This
is the plain form, one message and two products per edge; computing each message
once per (source, relation) and the attention from ``W_r w_s[r]`` are the ``hector``
plugin's optimizations.
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
class RGATOptions:
    hidden: int = option(64, "hidden units per head", min=1)
    layers: int = option(2, "RGAT layers (the last one outputs the classes)", min=1)
    heads: int = option(1, "attention heads of every hidden layer (concatenated)", min=1)
    negative_slope: float = option(0.2, "LeakyReLU slope of the attention scores", min=0.0)
    self_loop: bool = option(True, "the node's own term W_0 h_v")
    dropout: float = option(0.0, "dropout on every layer's input but the first", min=0.0, max=1.0)


class RGATConv(nn.Module):
    """One RGAT layer: relation-typed messages, per-relation attention vectors, edge softmax."""

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        heads: int,
        num_etypes: int,
        negative_slope: float,
        self_loop: bool,
    ) -> None:
        super().__init__()
        import_dgl()
        from dgl.nn import TypedLinear

        self.heads, self.out_feats = heads, out_feats
        self.linear_r = TypedLinear(in_feats, heads * out_feats, num_etypes)
        self.attn_src = nn.Parameter(torch.empty(num_etypes, heads, out_feats))
        self.attn_dst = nn.Parameter(torch.empty(num_etypes, heads, out_feats))
        self.self_loop = nn.Linear(in_feats, heads * out_feats) if self_loop else None
        self.negative_slope = negative_slope
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.attn_src, gain=gain)
        nn.init.xavier_normal_(self.attn_dst, gain=gain)

    def forward(self, graph: Any, h: torch.Tensor, etype: torch.Tensor, presorted: bool) -> Any:
        """``(destinations, heads, out_feats)``."""
        import dgl.function as fn
        from dgl.nn.functional import edge_softmax

        src, dst = graph.edges()
        h_dst = h[: graph.num_dst_nodes()] if graph.is_block else h
        shape = (-1, self.heads, self.out_feats)
        with graph.local_scope():
            msg = self.linear_r(h[src.long()], etype, presorted).view(shape)
            target = self.linear_r(h_dst[dst.long()], etype, presorted).view(shape)
            score = (msg * self.attn_src[etype]).sum(-1) + (target * self.attn_dst[etype]).sum(-1)
            score = F.leaky_relu(score, self.negative_slope)  # (E, heads)
            graph.edata["m"] = msg * edge_softmax(graph, score).unsqueeze(-1)
            graph.update_all(fn.copy_e("m", "m"), fn.sum("m", "h"))
            out = graph.dstdata["h"]
        if self.self_loop is not None:
            out = out + self.self_loop(h_dst).view(shape)
        return out


class RGAT(RelationalModel):
    """RGAT layers: hidden heads concatenated then ELU, the output layer's heads averaged."""

    def __init__(
        self, in_feats: int, num_classes: int, options: RGATOptions, relations: Relations
    ) -> None:
        super().__init__(relations)
        n = options.layers
        self._dims: list[int] = []
        width = in_feats
        for i in range(n):
            last = i == n - 1
            out, heads = (num_classes, 1) if last else (options.hidden, options.heads)
            self.layers.append(
                RGATConv(
                    width,
                    out,
                    heads,
                    relations.num_etypes,
                    options.negative_slope,
                    options.self_loop,
                )
            )
            width = out * heads
            self._dims.append(width)
        self.dropout = nn.Dropout(options.dropout)

    def layer_dims(self) -> list[int]:
        return list(self._dims)

    def layer_step(self, i: int, graph: Any, h: torch.Tensor) -> torch.Tensor:
        if i > 0:
            h = self.dropout(h)
        h = self.layers[i](graph, h, self.edge_types(graph), self.presorted(graph))
        if i == len(self.layers) - 1:
            return h.mean(1)
        return F.elu(h.flatten(1))
