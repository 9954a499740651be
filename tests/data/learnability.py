"""How the generator tests show that a synthetic task is learnable from what they give it:
a logistic regression, fitted on the training nodes, scored on the test nodes."""

from __future__ import annotations

import torch


def logistic_accuracy(
    x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, test: torch.Tensor, classes: int
) -> float:
    """Test accuracy of a logistic regression on standardised ``x`` (seeded, 150 Adam steps)."""
    torch.manual_seed(0)
    x = (x - x[train].mean(0)) / (x[train].std(0) + 1e-6)
    model = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=1e-4)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[train]), y[train]).backward()
        opt.step()
    return float((model(x[test]).argmax(1) == y[test]).float().mean())
