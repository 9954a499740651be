"""Dropout whose mask belongs to the node, not to the tensor it happens to be in.

``torch.nn.Dropout`` draws a mask for whatever tensor it gets, so a worker that
holds one partition of the graph draws different masks from a single process
holding all of it, and distributed training stops being the same computation.
:class:`NodeDropout` draws element (node v, feature j) of training step t from
the counter generator at ``(stream key, t)`` and counter ``global_id(v) * width
+ j`` (``qtrain.ops.masks.keyed_dropout``): every worker, and a single process,
drop exactly the same elements of a node's row. Like torch's dropout it saves a
float mask for backward; under the exact plugin, a 1-bit packed one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from qtrain._compat import import_dgl
from qtrain.ops import masks

_GOLDEN = 0x9E3779B97F4A7C15


def row_ids(graph: Any, rows: int, device: torch.device) -> torch.Tensor:
    """Global node ids of the ``rows`` rows of a tensor on ``graph``'s nodes.

    A block's rows are its source nodes (a layer's input) or its destination
    nodes (a layer's output); a graph's are its nodes. Global ids come from
    ``dgl.NID`` where the graph or block carries them (partitions, sampled
    blocks, subgraphs); a whole graph's node ids are its row numbers.
    """
    if graph is None:
        return torch.arange(rows, device=device)
    dgl = import_dgl()
    if getattr(graph, "is_block", False):
        for n, data in (
            (graph.num_src_nodes(), graph.srcdata),
            (graph.num_dst_nodes(), graph.dstdata),
        ):
            if rows == n:
                return data[dgl.NID] if dgl.NID in data else torch.arange(rows, device=device)
        raise ValueError(
            f"{rows} rows match neither the block's {graph.num_src_nodes()} source nor "
            f"{graph.num_dst_nodes()} destination nodes"
        )
    if rows != graph.num_nodes():
        raise ValueError(f"{rows} rows for a graph of {graph.num_nodes()} nodes")
    return graph.ndata[dgl.NID] if dgl.NID in graph.ndata else torch.arange(rows, device=device)


class NodeDropout(nn.Module):
    """Inverted dropout with masks keyed by (stream, training step, global node id, feature).

    The stream key is drawn from torch's generator when the module is made (so
    a seeded run is reproducible), and each training-mode call is one step of
    the stream, so processes that build the same model and call it in the same
    order draw the same masks.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = float(p)
        self.key = int(torch.randint(0, 2**62, ()).item())
        self.calls = 0

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, h: torch.Tensor, graph: Any = None) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return h
        seed = (self.key + self.calls * _GOLDEN) % 2**64
        self.calls += 1
        ids = row_ids(graph, h.shape[0], h.device)
        return masks.keyed_dropout(h, ids, self.p, seed)


def dropout_steps(model: nn.Module) -> dict[str, int]:
    """The step counter of each keyed dropout module of ``model``, by module name: its
    next masks depend on it (a checkpoint and calibration keep it)."""
    return {name: m.calls for name, m in model.named_modules() if isinstance(m, NodeDropout)}


def set_dropout_steps(model: nn.Module, steps: dict[str, int]) -> None:
    """Put ``model``'s keyed dropout streams back at ``steps`` (:func:`dropout_steps`)."""
    for name, module in model.named_modules():
        if isinstance(module, NodeDropout) and name in steps:
            module.calls = steps[name]


@contextlib.contextmanager
def preserved_dropout_steps(model: nn.Module) -> Iterator[None]:
    """Inside, ``model``'s keyed dropout may draw; afterwards each module's stream is back
    where it was, so a forward run aside (calibration) leaves the masks of training as
    they would have been."""
    steps = dropout_steps(model)
    try:
        yield
    finally:
        set_dropout_steps(model, steps)
