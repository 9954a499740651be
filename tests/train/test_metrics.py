"""Losses are looked up by name at each call, so a plugin intercepting them sees the run's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from qtrain.plugin import Patcher
from qtrain.train.metrics import loss_function


@pytest.mark.parametrize(
    ("metric", "func", "labels"),
    [
        ("accuracy", F.cross_entropy, torch.tensor([0, 2, 1])),
        ("micro_f1", F.binary_cross_entropy_with_logits, torch.tensor([[1, 0, 1]] * 3)),
    ],
)
def test_the_trainers_loss_reaches_a_plugin_intercepting_it(
    metric: str, func: Any, labels: torch.Tensor
) -> None:
    loss = loss_function(metric)  # made before the interception, as the Trainer does
    seen: list[str] = []

    def handler(kind: str, inner: Any, args: tuple, kwargs: dict) -> Any:
        seen.append(kind)
        return inner(*args, **kwargs)

    patcher = Patcher("test")
    patcher.functions({func: "loss"}, handler)
    logits = torch.randn(3, 3)
    try:
        value = loss(logits, labels)
    finally:
        patcher.restore()
    assert seen == ["loss"]
    torch.testing.assert_close(value, loss(logits, labels))
