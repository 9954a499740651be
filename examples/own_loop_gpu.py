"""Your own DGL model and training loop on a GPU, with DGL's CPU-only build and today's torch.

    python examples/own_loop_gpu.py                  # the GPU when torch sees one, else the CPU
    python examples/own_loop_gpu.py --device cpu     # qtrain's route on the CPU (what CI runs)
    python examples/own_loop_gpu.py --plugin tango   # the same loop with quantized primitives

The model is plain ``dgl.nn``; the one qtrain call is ``qtrain.to_device``,
which leaves DGL's graph on the CPU (its build cannot hold one on a GPU),
puts the features on the device and has qtrain run every graph primitive
there. Plugins are entered after it, so they wrap qtrain's primitives.
"""

from __future__ import annotations

import argparse
import contextlib

import dgl
import torch
import torch.nn.functional as F
from dgl.nn import GATConv, GraphConv

import qtrain


class Net(torch.nn.Module):
    """GraphConv, then a one-head GATConv: an unmodified DGL model."""

    def __init__(self, width: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv = GraphConv(width, hidden)
        self.attend = GATConv(hidden, classes, num_heads=1)

    def forward(self, graph: dgl.DGLGraph, x: torch.Tensor) -> torch.Tensor:
        return self.attend(graph, F.relu(self.conv(graph, x))).squeeze(1)


def two_communities(nodes: int, seed: int) -> dgl.DGLGraph:
    """A graph whose labels can be learned: two communities, features that hint at them."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (nodes,), generator=gen)
    src = torch.randint(0, nodes, (nodes * 8,), generator=gen)
    same = torch.rand(nodes * 8, generator=gen) < 0.9  # most edges stay in a community
    pool = [torch.nonzero(labels == c).squeeze(1) for c in (0, 1)]
    partner = torch.stack([p[torch.randint(0, len(p), (nodes * 8,), generator=gen)] for p in pool])
    dst = torch.where(
        same,
        partner[labels[src], torch.arange(nodes * 8)],
        partner[1 - labels[src], torch.arange(nodes * 8)],
    )
    graph = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=nodes))
    graph.ndata["feat"] = torch.randn(nodes, 16, generator=gen) + labels[:, None] * 0.5
    graph.ndata["label"] = labels
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--plugin", choices=["tango", "exact"], default=None)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    torch.manual_seed(0)
    graph = qtrain.to_device(two_communities(2000, seed=0), args.device)  # the one call
    feat, labels = graph.ndata["feat"], graph.ndata["label"]
    train = torch.arange(graph.num_nodes(), device=feat.device) % 2 == 0
    model = Net(16, 32, 2).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    plugins = qtrain.patch(args.plugin) if args.plugin else contextlib.nullcontext()
    with plugins:
        for _ in range(args.epochs):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(graph, feat)[train], labels[train])
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(graph, feat).argmax(1) == labels)[~train].float().mean().item()
    print(f"device {feat.device}, loss {loss.item():.4f}, held-out accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
