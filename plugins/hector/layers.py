"""DGL's ``RelGraphConv`` and ``HGTConv`` forwards with Hector's two optimizations.

Compact materialization (Hector section 3.2.2): DGL computes a relation's product for
every edge (``W_r h_u`` per edge in RGCN; HGT's ``k_u W_att_r`` and ``v_u W_msg_r`` per
edge), although it depends only on the pair (source, relation). Here it is computed once
per pair that has an edge (one segment GEMM over pairs grouped by relation), and the
edges read their pair's row through DGL's SDDMM and SpMM on a graph from pairs to
destinations, so no per-edge message tensor is made or saved.

Linear operator reordering (Hector section 3.2.3), for HGT: ``k_u W_att_r`` is
``x_u (W_k[type(u)] W_att_r)``, so the key and the message come straight from the input
through one product of weights per (relation, source type), computed per call
(``in x d x d`` per group, no node or edge factor), instead of two GEMMs per row.

The results equal DGL's forwards up to float rounding (tests/plugins/test_hector.py);
the layers' parameters, options and outputs are DGL's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from qtrain._compat import import_dgl
from qtrain.models.compact import CompactIndex, Pairs, compact_index


def _typed_weight_ok(linear: Any) -> bool:
    """A ``TypedLinear`` whose weight is one matrix per type (none or basis regularizer)."""
    return getattr(linear, "regularizer", None) != "bdd"


def rgcn_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``RelGraphConv.forward`` with messages once per (source, relation) pair."""
    import_dgl()
    import dgl.function as fn

    def forward(
        self: Any, g: Any, feat: Any, etypes: Any, norm: Any = None, *, presorted: bool = False
    ) -> Any:
        if not (isinstance(etypes, torch.Tensor) and _typed_weight_ok(self.linear_r)):
            return original(self, g, feat, etypes, norm, presorted=presorted)
        self.presorted = presorted
        index = compact_index(g, etypes, self.linear_r.num_types)
        pairs = index.src
        messages = self.linear_r(feat[pairs.node], pairs.rel, True)  # one row per pair
        to_dst = index.to_dst
        with to_dst.local_scope():
            to_dst.srcdata["m"] = messages
            if norm is None:
                to_dst.update_all(fn.copy_u("m", "x"), fn.sum("x", "h"))
            else:
                to_dst.edata["norm"] = norm
                to_dst.update_all(fn.u_mul_e("m", "norm", "x"), fn.sum("x", "h"))
            h = to_dst.dstdata["h"]
        # the rest as DGL's RelGraphConv.forward
        if self.layer_norm:
            h = self.layer_norm_weight(h)
        if self.bias:
            h = h + self.h_bias
        if self.self_loop:
            # the input itself when every node is a destination (DGL slices it always): a
            # view is another tensor to tango's cache, which then quantized the features
            # again for this product although the layer's input never changed
            x_dst = feat if feat.shape[0] == g.num_dst_nodes() else feat[: g.num_dst_nodes()]
            h = h + x_dst @ self.loop_weight
        if self.activation:
            h = self.activation(h)
        return self.dropout(h)

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward


def _per_pair(self: Any, x: torch.Tensor, ntype: torch.Tensor, pairs: Pairs, presorted: bool):
    """HGT's keys and messages per pair, as DGL orders the products: ``(x W_k) W_att_r``."""
    heads, size = self.num_heads, self.head_size
    k = self.linear_k(x, ntype, presorted).view(-1, heads, size)[pairs.node]
    v = self.linear_v(x, ntype, presorted).view(-1, heads, size)[pairs.node]
    keys = [self.relation_att[i](k[:, i], pairs.rel, True) for i in range(heads)]
    values = [self.relation_msg[i](v[:, i], pairs.rel, True) for i in range(heads)]
    return torch.stack(keys, 1), torch.stack(values, 1)


def _reordered(self: Any, x: torch.Tensor, pairs: Pairs):
    """HGT's keys and messages per pair as ``x (W_k W_att_r)``: one segment GEMM each over
    the pairs grouped by (relation, source type)."""
    from dgl.ops import segment_mm

    heads, size = self.num_heads, self.head_size
    groups = len(pairs.group_rel)
    rows = x[pairs.node]

    def through(linear: Any, relation: Any) -> torch.Tensor:
        node_w = linear.get_weight()[pairs.group_type].view(groups, -1, heads, size)
        rel_w = torch.stack([m.get_weight() for m in relation])[:, pairs.group_rel]
        joined = torch.einsum("gihd,hgde->gihe", node_w, rel_w).reshape(groups, -1, heads * size)
        return segment_mm(rows, joined, seglen_a=pairs.group_lengths).view(-1, heads, size)

    return through(self.linear_k, self.relation_att), through(self.linear_v, self.relation_msg)


def hgt_forward(original: Callable[..., Any], compact: bool, reorder: bool) -> Callable[..., Any]:
    """``HGTConv.forward`` with keys and messages once per (source, relation) pair
    (``compact``; else once per edge) and, with ``reorder``, from the products of weights."""
    import_dgl()
    import dgl.function as fn
    from dgl.nn.functional import edge_softmax

    def forward(self: Any, g: Any, x: Any, ntype: Any, etype: Any, *, presorted: bool = False):
        linears = [self.linear_k, self.linear_v, *self.relation_att, *self.relation_msg]
        if not (isinstance(etype, torch.Tensor) and all(map(_typed_weight_ok, linears))):
            return original(self, g, x, ntype, etype, presorted=presorted)
        self.presorted = presorted
        x_dst = x[: g.num_dst_nodes()] if g.is_block else x
        dst_ntype = ntype[: g.num_dst_nodes()] if g.is_block else ntype
        heads, size = self.num_heads, self.head_size
        index: CompactIndex = compact_index(
            g, etype, self.relation_att[0].num_types, ntype if reorder else None, compact
        )
        q = self.linear_q(x_dst, dst_ntype, presorted).view(-1, heads, size)
        if reorder:
            keys, values = _reordered(self, x, index.src)
        else:
            keys, values = _per_pair(self, x, ntype, index.src, presorted)
        priority = torch.stack(list(self.relation_pri), 1)[etype.long()]  # (E, heads)
        to_dst = index.to_dst
        with to_dst.local_scope():
            to_dst.srcdata["k"] = keys
            to_dst.dstdata["q"] = q
            to_dst.apply_edges(fn.u_dot_v("k", "q", "a"))
            score = to_dst.edata["a"].squeeze(-1) * priority / self.sqrt_d
            to_dst.srcdata["v"] = values
            to_dst.edata["w"] = edge_softmax(g, score).unsqueeze(-1)
            to_dst.update_all(fn.u_mul_e("v", "w", "m"), fn.sum("m", "h"))
            h = to_dst.dstdata["h"].view(-1, heads * size)
        # the rest as DGL's HGTConv.forward
        h = self.drop(self.linear_a(h, dst_ntype, presorted))
        alpha = torch.sigmoid(self.skip[dst_ntype]).unsqueeze(-1)
        if x_dst.shape != h.shape:
            h = h * alpha + (x_dst @ self.residual_w) * (1 - alpha)
        else:
            h = h * alpha + x_dst * (1 - alpha)
        if self.use_norm:
            h = self.norm(h)
        return h

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward
