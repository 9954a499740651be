"""Pick tango's bit count from Error_X (tango-sc23 section 3.1, eq. 4).

The first epoch's forward runs, in float32, up to the output of the model's
first GNN layer; that output is quantized at every bit count 2..8 and
Error_X is computed against it, with the scales the run will use at each count (one
per tensor, or one per row: ``policy.resolve_scales``). The chosen count is the smallest whose
Error_X is at or under the target (0.3 by default, the paper's threshold).
The input features are not measured: the paper notes their error is
recovered by learning from the graph structure.

The forward draws dropout masks; the generator state is restored afterwards,
so a run that calibrates trains exactly like one told the chosen count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from qtrain.plugins.tango.policy import resolve_scales, rotation_block

from qtrain.data.base import FEAT
from qtrain.errors import QtrainError
from qtrain.ops.quantize import quantize, quantize_per_row
from qtrain.ops.rotate import hadamard_rotate
from qtrain.plugin import Calibration
from qtrain.quant.quantize import MAX_BITS, MIN_BITS, dequantize, error_x

DEFAULT_TARGET = 0.3


def error_x_by_bits(
    x: torch.Tensor,
    rounding: str = "stochastic",
    seed: int = 0,
    scales: str = "tensor",
    rotation: int = 0,
) -> dict[int, float]:
    """Error_X of x quantized at each bit count 2..8 as the run will quantize it at that
    count: one scale for x, one per row, or (``rotation`` > 0) one per row of x with its
    last dimension rotated, rotated back to x's values before comparing."""
    table: dict[int, float] = {}
    block = rotation_block(rotation, x.shape[-1]) if rotation and x.dim() == 2 else 0
    target = hadamard_rotate(x, block) if block else x
    for bits in range(MIN_BITS, MAX_BITS + 1):
        if resolve_scales(scales) == "row" and x.dim() >= 2:
            q, scale = quantize_per_row(target, bits, rounding, seed=seed)
        else:
            q, scale = quantize(target, bits, rounding, seed=seed)
        x_hat = dequantize(q, scale)
        if block:  # the normalised Hadamard matrix is its own inverse
            x_hat = hadamard_rotate(x_hat, block)[:, : x.shape[-1]]
        table[bits] = error_x(x, x_hat)
    return table


def choose_bits(errors: dict[int, float], target: float) -> tuple[int, bool]:
    """(smallest bit count with Error_X <= target, whether any met it); 8 bits if none did."""
    for bits in sorted(errors):
        if errors[bits] <= target:
            return bits, True
    return max(errors), False


class _Captured(Exception):
    """Stops the forward once the first layer's output is in hand."""


@contextlib.contextmanager
def _preserved_rng() -> Iterator[None]:
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def first_layer_output(model: Any, graph: Any, device: torch.device | None = None) -> torch.Tensor:
    """The float32 output of ``model.layers[0]`` in a training-mode forward over the full graph."""
    layers = getattr(model, "layers", None)
    if not layers:
        raise QtrainError("calibration needs a model with GNN layers (model.layers is empty)")
    captured: list[torch.Tensor] = []

    def grab(_module: Any, _inputs: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        captured.append(out.detach().to(torch.float32))
        raise _Captured

    device = device or next(model.parameters()).device
    feat = graph.ndata[FEAT].to(device)
    was_training = model.training
    handle = layers[0].register_forward_hook(grab)
    try:
        model.train()
        with _preserved_rng(), torch.no_grad(), contextlib.suppress(_Captured):
            model(graph, feat)
    finally:
        handle.remove()
        model.train(was_training)
    if not captured:
        raise QtrainError("calibration: the model's forward never reached model.layers[0]")
    return captured[0]


def calibrate_model(
    model: Any,
    graph: Any,
    *,
    target: float = DEFAULT_TARGET,
    rounding: str = "stochastic",
    scales: str = "tensor",
    rotation: int = 0,
    seed: int = 0,
    device: torch.device | None = None,
) -> Calibration:
    """Error_X of the first layer's output at 2..8 bits, and the count to train with."""
    if not target > 0:
        raise QtrainError(f"error_x_target must be > 0, got {target}")
    x = first_layer_output(model, graph, device)
    errors = error_x_by_bits(x, rounding, seed, scales, rotation)
    bits, met = choose_bits(errors, target)
    return Calibration(bits, errors, float(target), met, shape=tuple(x.shape))
