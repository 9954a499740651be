"""Losses and metrics for single-label (accuracy) and multi-label (micro-F1) node classification."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_function(metric: str) -> LossFn:
    """Cross-entropy for single-label tasks, BCE-with-logits for multi-label (micro-F1) ones."""
    if metric == "micro_f1":
        return lambda logits, labels: F.binary_cross_entropy_with_logits(logits, labels.float())
    return F.cross_entropy


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of rows whose arg-max is the label (0.0 on an empty set)."""
    if labels.numel() == 0:
        return 0.0
    return float((logits.argmax(dim=-1) == labels).float().mean().item())


def micro_f1(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Micro-averaged F1 of ``logits > 0`` against 0/1 labels (0.0 when nothing is positive)."""
    pred = logits > 0
    truth = labels > 0.5
    tp = (pred & truth).sum().item()
    fp = (pred & ~truth).sum().item()
    fn = (~pred & truth).sum().item()
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom else 0.0


def metric_function(metric: str) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """The evaluation function for a dataset's ``metric``."""
    if metric == "micro_f1":
        return micro_f1
    if metric == "accuracy":
        return accuracy
    raise ValueError(f"unknown metric {metric!r}; use 'accuracy' or 'micro_f1'")
