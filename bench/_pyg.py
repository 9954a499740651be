"""PyG's relational layers as a user installs PyG from PyPI (``pip install torch_geometric``;
no pyg-lib wheel exists for every torch, and without it PyG's typed products loop over the
relations in Python), on the same typed graph as DGL's and qtrain's layers.

* ``rgcn``: ``RGCNConv`` with sum aggregation and the root weight (DGL's ``RelGraphConv``
  without norm);
* ``hgt``: ``HGTConv`` on the graph cut into per-type dictionaries (PyG's heterogeneous
  form), one head; its output rows put back in the graph's node order.

PyG's ``RGATConv`` is left out: it multiplies every edge by its own copy of the relation's
weight (``[E, in, out]``: 3.2 GB at 200,000 edges of width 64).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from qtrain.data.base import ETYPE, NTYPE

Call = Callable[[torch.nn.Module, Any, torch.Tensor], torch.Tensor]


def available() -> bool:
    return importlib.util.find_spec("torch_geometric") is not None


def version() -> str | None:
    if not available():
        return None
    import torch_geometric

    return str(torch_geometric.__version__)


def layer(
    model: str, width: int, graph: Any, relations: Any
) -> tuple[torch.nn.Module, Call] | None:
    """PyG's layer for ``model`` (built from the caller's seed) and how to call it, or None
    where PyG has none measured here."""
    from torch_geometric import nn as pyg

    device = graph.ndata[NTYPE].device  # the features' device (qtrain.to_device)
    src, dst = graph.edges()
    edge_index = torch.stack([src, dst]).long().to(device)
    etype = graph.edata[ETYPE].long().to(device)
    if model == "rgcn":
        conv = pyg.RGCNConv(width, width, relations.num_etypes, aggr="add", root_weight=True)

        def rgcn(conv: torch.nn.Module, graph: Any, x: torch.Tensor) -> torch.Tensor:
            return conv(x, edge_index, etype)

        return conv.to(device), rgcn
    if model != "hgt":
        return None
    ntype = graph.ndata[NTYPE].long().cpu()
    etype, src, dst = etype.cpu(), src.cpu(), dst.cpu()
    counts = torch.bincount(ntype, minlength=relations.num_ntypes).tolist()
    starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
    local = torch.arange(graph.num_nodes()) - torch.tensor(starts[:-1])[ntype]
    edges = {}
    for r, canonical in enumerate(relations.etypes):
        chosen = etype == r
        pair = torch.stack([local[src[chosen].long()], local[dst[chosen].long()]])
        edges[canonical] = pair.to(device)
    conv = pyg.HGTConv(width, width, (list(relations.ntypes), list(relations.etypes)), heads=1)

    def hgt(conv: torch.nn.Module, graph: Any, x: torch.Tensor) -> torch.Tensor:
        x_dict = {name: x[starts[t] : starts[t + 1]] for t, name in enumerate(relations.ntypes)}
        out = conv(x_dict, edges)
        parts = [
            out[name] if out.get(name) is not None else x.new_zeros(counts[t], width)
            for t, name in enumerate(relations.ntypes)
        ]
        return torch.cat(parts)

    return conv.to(device), hgt
