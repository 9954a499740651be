"""End-to-end GCN training on a GPU through qtrain's ops, the graph held as CSR tensors.

The lent GPU machines have no CUDA build of DGL, so this trains the model DGL's
GraphConv computes (``A_hat (H W)``, ``A_hat = D^-1/2 (A + I) D^-1/2``) with
the graph as CSR tensors: once with FP32 ``torch.sparse`` (cuSPARSE CSR SpMM,
its transpose for backward) and ``torch.matmul``, once with the same products
in bf16 autocast, and once through qtrain's quantized autograd Functions
(``QuantLinear``, ``QuantSpMM``: INT8 GEMM and quantized SpMM on ext-cuda).
Each row is the median epoch (forward, loss, backward, Adam step) over the
timed epochs, and the qtrain run must lower its training loss.

Imported by ``bench/gpu.py``; ``run(quick)`` returns rows in that script's format.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import torch
import torch.nn.functional as F
from qtrain.plugins.tango.functions import QuantSpMM, quant_linear
from qtrain.plugins.tango.policy import QuantPolicy

from qtrain.ops.dispatch import COUNTER
from qtrain.ops.graph import GraphCSR, build_csr


def power_law_graph(
    nodes: int, avg_degree: int, device: torch.device, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Directed edges with power-law in-degrees (a few hubs, many leaves), plus self-loops."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    edges = nodes * avg_degree
    # destinations: Zipf-like by sampling node ranks from a skewed distribution
    u = torch.rand(edges, generator=g)
    dst = (nodes * u.pow(3.0)).long().clamp_(max=nodes - 1)
    src = torch.randint(0, nodes, (edges,), generator=g)
    loops = torch.arange(nodes)
    return torch.cat([src, loops]).to(device), torch.cat([dst, loops]).to(device)


def normalized_weights(src: torch.Tensor, dst: torch.Tensor, nodes: int) -> torch.Tensor:
    """GraphConv's symmetric normalisation per edge: 1 / sqrt(d_out(u) d_in(v))."""
    d_out = torch.bincount(src, minlength=nodes).float().clamp(min=1)
    d_in = torch.bincount(dst, minlength=nodes).float().clamp(min=1)
    return (d_out[src] * d_in[dst]).rsqrt()


class _CSRMatmul(torch.autograd.Function):
    """``A @ x`` with cuSPARSE, backward ``A^T @ g`` with the transposed CSR (built once)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, at: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.at = at
        return torch.sparse.mm(a, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return None, None, torch.sparse.mm(ctx.at, grad.contiguous())


class _Model(torch.nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(a, b) / a**0.5) for a, b in itertools.pairwise(dims)
        )


def _epochs(step: Any, params: Any, epochs: int, warmup: int) -> tuple[list[float], list[float]]:
    """Milliseconds and losses of ``epochs`` timed epochs after ``warmup`` untimed ones."""
    opt = torch.optim.Adam(params, lr=0.01)
    times, losses = [], []
    for i in range(warmup + epochs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        loss = step()
        loss.backward()
        opt.step()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
        losses.append(float(loss))
    return times, losses


def run(quick: bool) -> list[dict[str, Any]]:
    device = torch.device("cuda")
    nodes, degree, width, hidden, classes = (
        (200_000, 10, 100, 256, 47) if quick else (2_400_000, 26, 100, 256, 47)
    )
    epochs, warmup = (3, 1) if quick else (10, 2)
    src, dst = power_law_graph(nodes, degree, device)
    weight = normalized_weights(src, dst, nodes)
    csr: GraphCSR = build_csr(src, dst, nodes, nodes)
    # cuSPARSE operands: A [dst, src] and A^T, float32 values, int32 indices
    a = torch.sparse_coo_tensor(torch.stack([dst, src]), weight, (nodes, nodes)).coalesce()
    a_csr = a.to_sparse_csr()
    at_csr = a.t().coalesce().to_sparse_csr()
    # bf16 autocast leaves torch.sparse.mm alone, and cuSPARSE has no fp32 A x bf16 X
    # product (seen on an H100): the bf16 run holds its own bf16 copies of A and A^T
    a_bf16, at_bf16 = a_csr.to(torch.bfloat16), at_csr.to(torch.bfloat16)
    x = torch.randn(nodes, width, device=device)
    labels = torch.randint(0, classes, (nodes,), device=device)
    train = torch.rand(nodes, device=device) < 0.1
    dims = [width, hidden, hidden, classes]
    shape = f"GCN 3x{hidden}, {nodes} nodes, {int(src.numel())} edges (self-loops included)"

    def fp32_step(model: _Model, a: torch.Tensor = a_csr, at: torch.Tensor = at_csr) -> Any:
        def step() -> torch.Tensor:
            h = x
            for i, w in enumerate(model.weights):
                h = _CSRMatmul.apply(a, at, h @ w)
                if i < len(model.weights) - 1:
                    h = F.relu(h)
            return F.cross_entropy(h[train], labels[train])

        return step

    def bf16_step(model: _Model) -> Any:
        inner = fp32_step(model, a_bf16, at_bf16)

        def step() -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return inner()

        return step

    def qtrain_step(model: _Model, policy: QuantPolicy) -> Any:
        def step() -> torch.Tensor:
            h = x
            for i, w in enumerate(model.weights):
                h = quant_linear(policy, h, w, linear=False)
                h = QuantSpMM.apply(policy, csr, h, weight)
                if i < len(model.weights) - 1:
                    h = F.relu(h)
            return F.cross_entropy(h[train], labels[train])

        return step

    results: dict[str, tuple[list[float], list[float]]] = {}
    for name in ("fp32", "bf16", "qtrain-int8"):
        torch.manual_seed(0)
        model = _Model(dims).to(device)
        if name == "fp32":
            step = fp32_step(model)
        elif name == "bf16":
            step = bf16_step(model)
        else:
            COUNTER.reset()
            step = qtrain_step(model, QuantPolicy(bits=8, rounding="stochastic", seed=0))
        results[name] = _epochs(step, model.parameters(), epochs, warmup)
        if name == "qtrain-int8":
            ran = COUNTER.snapshot()
            if not any("ext-cuda" in per for per in ran.values()):
                raise RuntimeError(f"the qtrain epochs did not run on ext-cuda kernels: {ran}")
    q_times, q_losses = results["qtrain-int8"]
    if not q_losses[-1] < q_losses[0]:
        raise RuntimeError(f"qtrain GCN did not lower its loss: {q_losses}")
    q_ms = statistics.median(q_times)
    rows = []
    for base in ("fp32", "bf16"):
        b_ms = statistics.median(results[base][0])
        rows.append(
            {
                "case": f"e2e GCN epoch vs {base}",
                "shape": shape,
                "ms": q_ms,
                "baseline": f"{base} torch.sparse CSR + matmul",
                "baseline_ms": b_ms,
                "ratio": b_ms / q_ms,
                "gbps": None,
                "bw_fraction": None,
                "losses": {k: [round(v, 4) for v in r[1]] for k, r in results.items()},
            }
        )
    return rows
