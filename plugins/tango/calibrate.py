"""Pick tango's bit count before training: two measures at each bit count 2..8.

Error_X (tango-sc23 section 3.1, eq. 4): the first epoch's forward runs, in float32,
up to the output of the model's first GNN layer; that output is quantized at every
count with the scales the run will use (one per tensor, or one per row:
``policy.resolve_scales``, rotated where the run rotates) and Error_X is computed
against it. The paper picks the smallest count at or under 0.3.

The gradient error: one training step of the whole configuration that will run
(every quantized primitive, what stays float32, the cache, the recipe's loss) at each
count, against the same step in float32: ``|g_b - g_fp32| / |g_fp32|`` over all the
model's parameter gradients. Dropout is off in both steps, so they differ by
quantization alone. Error_X of one layer's output does not follow how much a recipe
loses (Cora GAT has the lowest 4-bit Error_X of the Planetoid recipes and lost the
most at 4 bits; synthetic-arxiv GCN passes 0.3 at 4 bits and loses 0.6 point there);
the gradient, what training consumes, reads high for both at 4 bits (0.28, 0.30).
``criterion = "gradient"`` (the default) picks on it; README "Choosing the bit count"
has what it picked and what those runs measured.

The forward draws dropout masks; torch's generators and the model's keyed dropout
streams are put back afterwards, and the parameters' gradients are left as they were,
so a run that calibrates trains exactly like one told the chosen count.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
from qtrain.plugins.tango.policy import UNSIGNED_MAX_BITS, resolve_scales, rotation_block

from qtrain.data.base import FEAT, LABEL, TRAIN_MASK
from qtrain.errors import QtrainError
from qtrain.models.dropout import preserved_dropout_steps
from qtrain.ops import dispatch
from qtrain.ops.quantize import quantize, quantize_per_row
from qtrain.ops.rotate import hadamard_rotate
from qtrain.plugin import Calibration
from qtrain.quant.quantize import MAX_BITS, MIN_BITS, dequantize, error_x
from qtrain.train.metrics import loss_function

DEFAULT_TARGET = 0.3  # Error_X, the paper's threshold
# gradient error: under what synthetic-arxiv GCN read at 2 bits with blocks and unsigned
# levels (0.246, 7.5 points lost) and what Cora GAT (0.28) and synthetic-arxiv GCN (0.30)
# read at 4 bits with one scale per row (0.96 and 0.6 point lost); over what Cora GCN and
# SAGE read at 3 bits (0.175, 0.169), which keep their accuracy (README, "Choosing the bit
# count")
DEFAULT_GRADIENT_TARGET = 0.2
Criterion = Literal["gradient", "error_x"]
# a patch session of the run's configuration at a given bit count (the plugin makes it)
QuantizedAt = Callable[[int], AbstractContextManager[Any]]


def error_x_by_bits(
    x: torch.Tensor,
    rounding: str = "stochastic",
    seed: int = 0,
    scales: str = "tensor",
    rotation: int = 0,
    unsigned: bool = False,
    affine: bool = False,
) -> dict[int, float]:
    """Error_X of x quantized at each bit count 2..8 as the run will quantize it at that
    count: one scale for x, one per row, or (``rotation`` > 0) one per row of x with its
    last dimension rotated, rotated back to x's values before comparing; with ``unsigned``,
    a nonnegative x at 3 bits or fewer on the unsigned levels, with ``affine`` (one scale
    per row, no rotation) a signed x at 3 bits or fewer as ``x - m`` on them, ``m`` each
    row's minimum (the policy's rules)."""
    table: dict[int, float] = {}
    block = rotation_block(rotation, x.shape[-1]) if rotation and x.dim() == 2 else 0
    target = hadamard_rotate(x, block) if block else x
    nonnegative = target.numel() > 0 and bool((target.amin() >= 0).item())
    per_row = resolve_scales(scales) in ("row", "block") and x.dim() >= 2
    shift = (
        x.amin(-1, keepdim=True)
        if affine and per_row and not block and x.numel() > 0 and not nonnegative
        else None
    )
    for bits in range(MIN_BITS, MAX_BITS + 1):
        few = bits <= UNSIGNED_MAX_BITS
        levels = bits + 1 if few and ((unsigned and nonnegative) or shift is not None) else bits
        shifted = target - shift if few and shift is not None else target
        if per_row:
            q, scale = quantize_per_row(shifted, levels, rounding, seed=seed)
        else:
            q, scale = quantize(shifted, levels, rounding, seed=seed)
        x_hat = dequantize(q, scale)
        if shifted is not target:
            x_hat = x_hat + shift
        if block:  # the normalised Hadamard matrix is its own inverse
            x_hat = hadamard_rotate(x_hat, block)[:, : x.shape[-1]]
        table[bits] = error_x(x, x_hat)
    return table


def _step_gradient(
    model: Any,
    graph: Any,
    feat: torch.Tensor,
    loss: Callable[[torch.Tensor], torch.Tensor],
    params: list[torch.Tensor],
) -> torch.Tensor:
    """``params``' gradients of one full-graph step of ``loss`` (of the logits), flattened;
    the gradients they held before are put back."""
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        with _preserved_streams(model), torch.enable_grad():
            loss(model(graph, feat)).backward()
        return torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten()
                for p in params
            ]
        )
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g


def gradient_error_by_bits(
    model: Any,
    graph: Any,
    quantized_at: QuantizedAt,
    metric: str = "accuracy",
    device: torch.device | None = None,
) -> dict[int, float]:
    """``|g_b - g_fp32| / |g_fp32|`` of one step's parameter gradients at each count
    2..8, each step run inside ``quantized_at(b)`` (the run's configuration at b bits),
    dropout off (eval mode) so that the steps differ only by what the primitives compute.
    A count whose gradient is not finite reads infinity (never chosen)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise QtrainError("calibration needs a model with trainable parameters")
    device = device or params[0].device
    train = graph.ndata[TRAIN_MASK].to(device).bool()
    if not train.any():
        raise QtrainError("calibration needs training nodes (the train mask selects none)")
    feat = graph.ndata[FEAT].to(device)
    label = graph.ndata[LABEL].to(device)[train]
    criterion = loss_function(metric)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return criterion(logits[train], label)

    was_training = model.training
    model.eval()
    try:
        reference = _step_gradient(model, graph, feat, loss, params)
        if not torch.isfinite(reference).all():
            raise QtrainError(
                "calibration: the float32 step's gradient is not finite; "
                "check the features and the learning setup before choosing a bit count"
            )
        norm = reference.norm().item()
        table: dict[int, float] = {}
        for bits in range(MIN_BITS, MAX_BITS + 1):
            with quantized_at(bits):
                grad = _step_gradient(model, graph, feat, loss, params)
            if not torch.isfinite(grad).all():
                table[bits] = math.inf
            elif norm == 0.0:  # nothing to learn from this step: any error is relative to 0
                table[bits] = 0.0 if grad.norm().item() == 0.0 else math.inf
            else:
                table[bits] = (grad - reference).norm().item() / norm
        return table
    finally:
        model.train(was_training)


def choose_bits(errors: dict[int, float], target: float) -> tuple[int, bool]:
    """(smallest bit count whose error is <= target, whether any met it); 8 bits if none
    did."""
    for bits in sorted(errors):
        if errors[bits] <= target:
            return bits, True
    return max(errors), False


class _Captured(Exception):
    """Stops the forward once the first layer's output is in hand."""


@contextlib.contextmanager
def _preserved_streams(model: Any) -> Iterator[None]:
    """torch's generators and ``model``'s keyed dropout streams, as they were before."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        with preserved_dropout_steps(model):
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
        with _preserved_streams(model), torch.no_grad(), contextlib.suppress(_Captured):
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
    criterion: Criterion = "gradient",
    target: float | None = None,
    quantized_at: QuantizedAt | None = None,
    metric: str = "accuracy",
    rounding: str = "stochastic",
    scales: str = "tensor",
    rotation: int = 0,
    unsigned: bool = False,
    affine: bool = False,
    seed: int = 0,
    device: torch.device | None = None,
) -> Calibration:
    """Error_X of the first layer's output and (with ``quantized_at``) the step's
    gradient error at 2..8 bits; the count to train with, by ``criterion``: the smallest
    at or under ``target`` (default: 0.3 for Error_X, 0.2 for the gradient)."""
    if criterion == "gradient" and quantized_at is None:
        raise QtrainError('criterion = "gradient" needs the run\'s configuration to step')
    if target is None:
        target = DEFAULT_GRADIENT_TARGET if criterion == "gradient" else DEFAULT_TARGET
    if not target > 0:
        raise QtrainError(f"the calibration target must be > 0, got {target}")
    with dispatch.COUNTER.set_aside():  # the trial steps' kernel calls are not the run's
        x = first_layer_output(model, graph, device)
        errors = error_x_by_bits(x, rounding, seed, scales, rotation, unsigned, affine)
        gradient = (
            {}
            if quantized_at is None
            else gradient_error_by_bits(model, graph, quantized_at, metric, device)
        )
    bits, met = choose_bits(gradient if criterion == "gradient" else errors, target)
    return Calibration(
        bits,
        errors,
        float(target),
        met,
        shape=tuple(x.shape),
        gradient_error=gradient,
        criterion=criterion,
    )
