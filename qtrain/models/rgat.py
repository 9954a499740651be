"""RGAT as Hector evaluates it (Busbridge et al. 2019; Hector's Figure 2 and Listing 1).

For an edge ``u -> v`` of relation ``r``: the message ``m = W_r h_u``, the attention
score ``leakyrelu((W_r h_u) . w_s[r] + (W_r h_v) . w_t[r])``, normalised over ``v``'s
incoming edges by DGL's ``edge_softmax``; ``h_v' = sum a * m`` (plus ``W_0 h_v``, the
node's own term, by default). The products go through DGL's ``TypedLinear`` /
``segment_mm`` (one segment GEMM over rows grouped by relation on the whole graph),
the aggregation through DGL's ``update_all``: DGL's primitives, so plugins see them.

The plain form computes one message and two products per edge. Hector's two
optimizations are options, each giving the same result:

* ``compact`` (compact materialization): ``W_r h_u`` depends only on the pair
  (u, r), so it is computed once per pair that has an edge, and the aggregation
  runs on a graph from those pairs to the destinations (``u_mul_e``: no per-edge
  message tensor); likewise ``W_r h_v`` per (destination, relation) pair;
* ``reorder`` (linear operator reordering): ``(W_r h_v) . w_t[r] = h_v . (W_r w_t[r])``,
  so the target term is a product with the per-relation vectors ``W_r w_t[r]``,
  ``heads`` columns wide, instead of a ``heads x out`` wide GEMM.
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
from qtrain.models.compact import compact_index
from qtrain.models.relational import RelationalModel


@dataclass(frozen=True)
class RGATOptions:
    hidden: int = option(64, "hidden units per head", min=1)
    layers: int = option(2, "RGAT layers (the last one outputs the classes)", min=1)
    heads: int = option(1, "attention heads of every hidden layer (concatenated)", min=1)
    negative_slope: float = option(0.2, "LeakyReLU slope of the attention scores", min=0.0)
    self_loop: bool = option(True, "the node's own term W_0 h_v")
    dropout: float = option(0.0, "dropout on every layer's input but the first", min=0.0, max=1.0)
    compact: bool = option(
        False,
        "compute each message once per (node, relation) pair instead of once per edge "
        "(Hector's compact materialization; the same result, fewer rows)",
    )
    reorder: bool = option(
        False,
        "attention's target term from the per-relation vectors W_r w_t[r] (Hector's linear "
        "operator reordering; the same result, a narrower product)",
    )


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
        compact: bool = False,
        reorder: bool = False,
    ) -> None:
        super().__init__()
        import_dgl()
        from dgl.nn import TypedLinear

        self.compact, self.reorder = compact, reorder
        self.num_etypes = num_etypes
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
        h_dst = h[: graph.num_dst_nodes()] if graph.is_block else h
        shape = (-1, self.heads, self.out_feats)
        if self.compact:
            out = self._compact(graph, h, h_dst, etype)
        else:
            out = self._per_edge(graph, h, h_dst, etype, presorted)
        if self.self_loop is not None:
            out = out + self.self_loop(h_dst).view(shape)
        return out

    def _target_weights(self) -> torch.Tensor:
        """``W_r w_t[r]`` per relation and head: (relations, in, heads)."""
        w = self.linear_r.get_weight().view(self.num_etypes, -1, self.heads, self.out_feats)
        return torch.einsum("rihd,rhd->rih", w, self.attn_dst)

    def _per_edge(
        self, graph: Any, h: torch.Tensor, h_dst: torch.Tensor, etype: torch.Tensor, presorted: bool
    ) -> Any:
        import dgl.function as fn
        from dgl.nn.functional import edge_softmax
        from dgl.ops import gather_mm, segment_mm

        src, dst = graph.edges()
        shape = (-1, self.heads, self.out_feats)
        msg = self.linear_r(h[src.long()], etype, presorted).view(shape)
        if self.reorder:
            x, w = h_dst[dst.long()], self._target_weights()
            if presorted:
                lengths = torch.bincount(etype, minlength=self.num_etypes).cpu()
                target_score = segment_mm(x, w, seglen_a=lengths)
            else:
                target_score = gather_mm(x, w, idx_b=etype)
        else:
            target = self.linear_r(h_dst[dst.long()], etype, presorted).view(shape)
            target_score = (target * self.attn_dst[etype]).sum(-1)
        score = F.leaky_relu(
            (msg * self.attn_src[etype]).sum(-1) + target_score, self.negative_slope
        )  # (E, heads)
        with graph.local_scope():
            graph.edata["m"] = msg * edge_softmax(graph, score).unsqueeze(-1)
            graph.update_all(fn.copy_e("m", "m"), fn.sum("m", "h"))
            return graph.dstdata["h"]

    def _compact(
        self, graph: Any, h: torch.Tensor, h_dst: torch.Tensor, etype: torch.Tensor
    ) -> Any:
        import dgl.function as fn
        from dgl.nn.functional import edge_softmax
        from dgl.ops import segment_mm

        index = compact_index(graph, etype, self.num_etypes)
        src, dst = index.src, index.dst
        shape = (-1, self.heads, self.out_feats)
        msg = self.linear_r(h[src.node], src.rel, True).view(shape)  # one row per pair
        source_score = (msg * self.attn_src[src.rel]).sum(-1)
        if self.reorder:
            target_score = segment_mm(h_dst[dst.node], self._target_weights(), seglen_a=dst.lengths)
        else:
            target = self.linear_r(h_dst[dst.node], dst.rel, True).view(shape)
            target_score = (target * self.attn_dst[dst.rel]).sum(-1)
        score = F.leaky_relu(
            source_score[src.of_edge] + target_score[dst.of_edge], self.negative_slope
        )  # (E, heads), edges in the graph's order
        attention = edge_softmax(graph, score).unsqueeze(-1)
        to_dst = index.to_dst
        with to_dst.local_scope():
            to_dst.srcdata["m"] = msg
            to_dst.edata["a"] = attention
            to_dst.update_all(fn.u_mul_e("m", "a", "x"), fn.sum("x", "h"))
            return to_dst.dstdata["h"]


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
                    compact=options.compact,
                    reorder=options.reorder,
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
