"""GraphSAGE's mean layer computed a block of rows at a time, for full-graph training under exact.

``SAGEConv`` with the mean aggregator computes ``out = h W_s^T + b + mean(h) W_n^T``.
Run as DGL's calls (or ``LeanSAGEConv``'s), three full-size tensors are alive at
its forward's peak (the input, the aggregation, a product: a product cannot write
over its own input) and three at its backward's (the output gradient, one input
gradient waiting for the other, the aggregation's gradient). On a full graph
those are the step's peak: on synthetic-products at width 128, 1.17 GiB each.

Under exact the aggregation is only needed in backward as its compressed rows,
so it never has to exist whole. Forward here takes the aggregation of one block
of destination rows (DGL's own kernel over a block made of those rows of the
layer's in-CSR), adds its product into the block's rows of the output,
compresses the block and drops it. Backward uses ``A^T D^-1 g W_n``: for each
block of destination rows, the block's output gradient divided by the in-degrees
is projected by ``W_n`` and added into the input gradient's rows of the block's
sources (``qtrain.ops.scatter.scatter_rows_add``, a kernel of the op library, over
the same rows of the in-CSR). Both directions hold two full-size tensors and one
block. The weight gradients come from the stored rows a block at a time
(``CompressingCodec.weight_grad_rows``, as for every other product under exact).
Where ``SAGEConv`` projects first (input wider than output), the blocks aggregate
``feat W_n^T`` instead, and backward gathers the narrower gradient of those rows.

The in-CSR is the only structure the layer reads (:class:`Adjacency`, without
edge ids): DGL's CSC where the graph holds one (a run whose steps read nothing
else holds the graph as that alone: ``qtrain.train.prepare.held_as_in_csr``),
else its own, built once per graph from the COO, so DGL never builds its CSC or
CSR beside the COO.

The stored blocks go through the saved-tensor hooks in force when the layer runs
(the activation meter's, or the plugin's own), so the meter counts their stored
bytes exactly as it would count the whole aggregation's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from qtrain.plugins.exact.compressed import CompressedTensor, CompressingCodec
from qtrain.plugins.exact.projected import weight_grad

from qtrain import route
from qtrain._compat import import_dgl
from qtrain.ops.graph import group_rows
from qtrain.ops.scatter import scatter_rows_add

BLOCK_BYTES = 32 << 20  # float32 bytes of one block of aggregated rows


def block_rows(width: int) -> int:
    """Rows per block: ``BLOCK_BYTES`` of float32 rows, a multiple of 8 (whole bytes of
    packed bits at any bit width, as ``weight_grad_rows`` reads them)."""
    return max(8, BLOCK_BYTES // (4 * max(1, width)) // 8 * 8)


def fusable(module: Any, graph: Any, feat: Any, edge_weight: Any) -> bool:
    """Whether ``module(graph, feat, edge_weight)`` is a call this layer computes: a
    ``SAGEConv`` with the mean aggregator, on a whole
    homogeneous CPU graph with edges (DGL's own kernels, not qtrain's device route), float32
    node rows, no edge weights, under grad mode. Every other call keeps DGL's forward."""
    return (
        torch.is_grad_enabled()
        and getattr(module, "_aggre_type", None) == "mean"
        and edge_weight is None
        and isinstance(feat, torch.Tensor)
        and feat.dim() == 2
        and feat.dtype == torch.float32
        and feat.device.type == "cpu"
        and "cpu" not in route.enabled_devices()  # the route runs DGL's kernels itself
        and not graph.is_block
        and graph.is_homogeneous
        and graph.num_edges() > 0
        and feat.shape[0] == graph.num_nodes()
        and saved_tensor_hooks() is not None
    )


def saved_tensor_hooks() -> tuple[Any, Any] | None:
    """The innermost ``(pack, unpack)`` pair of saved-tensor hooks in force, or None.

    The blocks of the aggregation are packed one at a time, as they are made, so that
    each is compressed and dropped before the next exists; ``save_for_backward`` would
    pack them only when the forward returns, with all of them alive. torch exposes the
    pair only privately; where a torch lacks the call, there is none (DGL's forward runs)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


_NO_IDS = {dtype: torch.empty(0, dtype=dtype) for dtype in (torch.int32, torch.int64)}


def _rows_sum(
    indptr: torch.Tensor, indices: torch.Tensor, start: int, stop: int, x: torch.Tensor
) -> torch.Tensor:
    """Rows ``start:stop`` of ``A @ x`` for the 0/1 CSR matrix ``A``: DGL's own ``copy_u_sum``
    kernel over a block made of those rows (torch's CSR product is about 3x slower on CPU)."""
    dgl = import_dgl()
    first, last = int(indptr[start]), int(indptr[stop])
    block = dgl.create_block(
        (
            "csc",
            (indptr[start : stop + 1] - indptr[start], indices[first:last], _NO_IDS[indptr.dtype]),
        ),
        num_src_nodes=x.shape[0],
        num_dst_nodes=stop - start,
    )
    return dgl.ops.copy_u_sum(block, x)


@dataclass(frozen=True)
class Adjacency:
    """A graph's edges grouped by destination, without edge ids: all the layer reads,
    in both directions (backward scatters over the same rows)."""

    indptr: torch.Tensor
    indices: torch.Tensor


_adjacency: dict[int, tuple[weakref.ref, Adjacency]] = {}


def adjacency(graph: Any) -> Adjacency:
    """``graph``'s :class:`Adjacency`: DGL's CSC where the graph holds one (read in place;
    a run whose steps read nothing else holds only that: ``qtrain.train.prepare``), else
    grouped from its COO once and kept while the graph lives (DGL's CSC would carry an
    edge-id array beside it, 0.46 GiB on synthetic-products, and stay)."""
    if "csc" in graph.formats()["created"]:
        indptr, indices, _ = graph.adj_tensors("csc")  # views of DGL's arrays
        return Adjacency(indptr, indices)
    key = id(graph)
    hit = _adjacency.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    src, dst = graph.edges()
    indptr, indices, _ = group_rows(dst, src, None, graph.num_nodes(), src.dtype)
    built = Adjacency(indptr, indices)

    def forget(ref: weakref.ref) -> None:
        if _adjacency.get(key, (None,))[0] is ref:
            del _adjacency[key]

    _adjacency[key] = (weakref.ref(graph, forget), built)
    return built


def _store(codec: CompressingCodec, x: torch.Tensor, projects: bool) -> CompressedTensor | None:
    """``x`` as the codec stores the input of a product (projected rows or quantized
    rows), or None where it would store ``x`` otherwise."""
    stored = codec.encode_projected(x) if projects else None
    return stored if stored is not None else codec.encode_rows(x)


def _product_grad(
    codec: CompressingCodec, stored: CompressedTensor | None, kept: Any, grad: torch.Tensor
) -> torch.Tensor:
    """``grad^T x`` (a linear weight's gradient) from ``x``'s stored form, or from ``x``
    as the hooks gave it back (``kept`` unpacks it) where the codec did not store rows."""
    if stored is not None:
        return weight_grad(codec, stored, grad, linear=True)
    return grad.t() @ kept()


class SageMeanRows(torch.autograd.Function):
    """``feat W_s^T + b + mean_{u -> v}(feat[u]) W_n^T`` a block of rows at a time (module
    docstring); ``codec`` is the exact plugin's. ``project_first``: the mean of the
    projected rows ``feat W_n^T`` (narrower than ``feat``), as DGL's forward orders it."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        feat: torch.Tensor,
        w_self: torch.Tensor,
        b_self: torch.Tensor | None,
        w_neigh: torch.Tensor,
        graph: Any,
        codec: CompressingCodec,
        projects: bool,
        project_first: bool,
    ) -> torch.Tensor:
        pack, unpack = saved_tensor_hooks()  # fusable() checked they are there
        nodes = feat.shape[0]
        adj = adjacency(graph)
        degrees = (adj.indptr[1:] - adj.indptr[:-1]).clamp_(min=1).to(feat.dtype)
        source = feat @ w_neigh.t() if project_first else feat
        out = feat.new_empty(nodes, w_self.shape[0])
        step = block_rows(max(feat.shape[1], out.shape[1]))
        blocks: list[tuple[int, int, CompressedTensor | None, Any]] = []
        for start in range(0, nodes, step):
            stop = min(nodes, start + step)
            agg = _rows_sum(adj.indptr, adj.indices, start, stop, source)
            agg.div_(degrees[start:stop, None])
            rows = out[start:stop]
            if b_self is None:
                torch.mm(feat[start:stop], w_self.t(), out=rows)
            else:
                torch.addmm(b_self, feat[start:stop], w_self.t(), out=rows)
            if project_first:
                rows.add_(agg)
                continue
            rows.addmm_(agg, w_neigh.t())
            stored = _store(codec, agg, projects)
            blocks.append((start, stop, stored, pack(agg)))  # the hooks count what is kept
        del source
        # a step's input (no gradient) is saved as the hooks save it: by reference
        ctx.stored_feat = _store(codec, feat, projects) if ctx.needs_input_grad[0] else None
        ctx.save_for_backward(feat)
        ctx.codec, ctx.project_first = codec, project_first
        ctx.blocks, ctx.unpack = blocks, unpack
        ctx.degrees = pack(degrees)  # saved as DGL's mean saves its divisor
        ctx.adjacency, ctx.w_self, ctx.w_neigh = adj, w_self, w_neigh
        ctx.has_bias = b_self is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad = grad.contiguous()
        w_self, w_neigh, unpack, codec = ctx.w_self, ctx.w_neigh, ctx.unpack, ctx.codec
        adj: Adjacency = ctx.adjacency
        grad_feat = grad_w_self = grad_b = grad_w_neigh = None
        needs_feat, needs_neigh = ctx.needs_input_grad[0], ctx.needs_input_grad[3]
        # projecting first, the gradient of the projected rows (the spread, as narrow as
        # the output) is kept whole: W_n's gradient is spread^T feat; otherwise each
        # block's spread is projected and added into the input gradient's rows at once
        spread = (
            grad.new_zeros(grad.shape)
            if ctx.project_first and (needs_feat or needs_neigh)
            else None
        )
        if needs_feat or spread is not None:
            grad_feat = grad @ w_self if needs_feat else None
            inv_degrees = unpack(ctx.degrees).reciprocal()
            nodes = grad.shape[0]
            step = block_rows(max(grad.shape[1], w_neigh.shape[1]))
            for start in range(0, nodes, step):
                stop = min(nodes, start + step)
                scaled = grad[start:stop] * inv_degrees[start:stop, None]
                ranged = adj.indptr[start : stop + 1]
                if spread is not None:
                    scatter_rows_add(spread, ranged, adj.indices, scaled)
                else:
                    scatter_rows_add(grad_feat, ranged, adj.indices, scaled @ w_neigh)
            if spread is not None and grad_feat is not None:
                for start in range(0, nodes, step):
                    stop = min(nodes, start + step)
                    grad_feat[start:stop].addmm_(spread[start:stop], w_neigh)
        feat_rows = lambda: ctx.saved_tensors[0]  # noqa: E731  (by reference, or decoded)
        if ctx.needs_input_grad[1]:
            grad_w_self = _product_grad(codec, ctx.stored_feat, feat_rows, grad)
        if ctx.needs_input_grad[2] and ctx.has_bias:
            grad_b = grad.sum(0)
        if spread is not None:
            if needs_neigh:
                grad_w_neigh = _product_grad(codec, ctx.stored_feat, feat_rows, spread)
        elif needs_neigh:
            for start, stop, stored, held in ctx.blocks:
                part = _product_grad(
                    codec, stored, lambda held=held: unpack(held), grad[start:stop]
                )
                grad_w_neigh = part if grad_w_neigh is None else grad_w_neigh.add_(part)
        return grad_feat, grad_w_self, grad_b, grad_w_neigh, None, None, None, None


def sage_mean(
    module: Any, graph: Any, feat: torch.Tensor, codec: CompressingCodec, projects: bool
) -> torch.Tensor:
    """``module(graph, feat)`` for a call :func:`fusable` accepted: the same parameters,
    dropout, activation and norm as ``SAGEConv``'s forward, the sum a block at a time."""
    feat = module.feat_drop(feat).contiguous()
    fc_self, fc_neigh = module.fc_self, module.fc_neigh
    project_first = module._in_src_feats > module._out_feats
    rst = SageMeanRows.apply(
        feat, fc_self.weight, fc_self.bias, fc_neigh.weight, graph, codec, projects, project_first
    )
    if module.activation is not None:
        rst = module.activation(rst)
    if module.norm is not None:
        rst = module.norm(rst)
    return rst
