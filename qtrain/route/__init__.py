"""qtrain's device route: unmodified DGL models on any device torch has, DGL's build or not.

DGL's last CUDA builds stop at torch 2.4; with today's torch only its CPU
build installs, and it can neither place a graph on a GPU nor run a kernel
there. The route keeps DGL as the surface a model is written against and
runs the graph primitives itself: the graph's structure stays a CPU DGL graph
(its CSR views are copied once to the device), the features live on the
device, and every primitive DGL's modules call (SpMM, SDDMM, edge softmax,
gather / segment matmul, their heterograph forms) runs in
``qtrain.route.kernels`` on the device. Plugins enabled after the route wrap
it as they wrap DGL's own kernels.

    import qtrain
    g = qtrain.to_device(g, "cuda")      # features on the GPU, structure on the CPU
    model = dgl.nn.GraphConv(...).cuda()  # unmodified
    loss = model(g, g.ndata["feat"]).sum()

The same route runs on the CPU (``to_device(g, "cpu")``), where it is checked
against DGL's own kernels. Enabling it is process-wide; ``disable()`` puts
DGL back exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from qtrain.route.dgl_patches import DeviceRouteError, Route

ROUTE = Route()


def enable(device: torch.device | str) -> None:
    """Run DGL's primitives with qtrain's kernels for every tensor on ``device``'s type."""
    ROUTE.enable(torch.device(device))


def disable(device: torch.device | str | None = None) -> None:
    """Stop routing ``device``'s type (its calls go to DGL's kernels again); with no
    device, stop altogether and put DGL's own functions back exactly as they were."""
    if device is None:
        ROUTE.disable()
    else:
        ROUTE.devices.discard(torch.device(device).type)


def enabled_devices() -> tuple[str, ...]:
    """The device types the route serves now (empty when it is off)."""
    return tuple(sorted(ROUTE.devices))


def sampler_device(device: torch.device | str) -> torch.device:
    """Where DGL's samplers and DataLoader put blocks for a model on ``device``: the CPU
    when the route serves it (DGL's CPU build cannot place a block on a GPU; the route
    reads the structure from the CPU and the features from ``device``)."""
    device = torch.device(device)
    return torch.device("cpu") if device.type in ROUTE.devices else device


def to_device(graph: Any, device: torch.device | str) -> Any:
    """``graph`` with its features on ``device`` and the route enabled there (the one call
    a user's own loop needs). Like ``DGLGraph.to``, it returns a new graph."""
    target = torch.device(device)
    enable(target)
    return graph.to(target)


__all__ = [
    "ROUTE",
    "DeviceRouteError",
    "disable",
    "enable",
    "enabled_devices",
    "sampler_device",
    "to_device",
]
