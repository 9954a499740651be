"""Losses and metrics for single-label (accuracy) and multi-label (micro-F1) node classification."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# None for a split with no nodes: a number there would be one the run did not earn
MetricFn = Callable[[torch.Tensor, torch.Tensor], float | None]


def loss_function(metric: str) -> LossFn:
    """Cross-entropy for single-label tasks, BCE-with-logits for multi-label (micro-F1) ones."""
    if metric == "micro_f1":
        return lambda logits, labels: F.binary_cross_entropy_with_logits(logits, labels.float())
    # looked up at each call, not kept: a plugin intercepts F.cross_entropy by name
    return lambda logits, labels: F.cross_entropy(logits, labels)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Fraction of rows whose arg-max is the label (None on an empty set)."""
    if labels.shape[0] == 0:
        return None
    return float((logits.argmax(dim=-1) == labels).float().mean().item())


def micro_f1(logits: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Micro-averaged F1 of ``logits > 0`` against 0/1 labels (0.0 when nothing is positive,
    None on an empty set)."""
    if labels.shape[0] == 0:
        return None
    pred = logits > 0
    truth = labels > 0.5
    tp = (pred & truth).sum().item()
    fp = (pred & ~truth).sum().item()
    fn = (~pred & truth).sum().item()
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom else 0.0


def metric_function(metric: str) -> MetricFn:
    """The evaluation function for a dataset's ``metric``."""
    if metric == "micro_f1":
        return micro_f1
    if metric == "accuracy":
        return accuracy
    raise ValueError(f"unknown metric {metric!r}; use 'accuracy' or 'micro_f1'")
