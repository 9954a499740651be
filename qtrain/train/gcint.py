"""``train.numerics = "gcint"``: the built-in GCN trained integer-only, as GCINT does.

Why a training mode and not a plugin: a plugin swaps DGL's primitives under the
runner's autograd, Adam and cross-entropy, and composes with other plugins. GCINT
replaces those three themselves (its own backward with its own quantizers, integer
SGD, an MSE loss without softmax), so it is the loop that changes, not a primitive;
no plugin can run beside it (the recipe refuses the combination).

``GcintTrainer`` is the runner's ``Trainer`` with the float GCN it is handed turned
into ``qtrain.models.integer_gcn.IntegerGCN`` (the same initial weights, so a seed
starts both numerics alike): the run directory, metrics, evaluation schedule, early
stopping, checkpoints and resume are the float runs'. The loss it reports is the mean
squared error of the training rows in units of 127 (the targets' one-hot scale).
"""

from __future__ import annotations

from typing import Any

import torch

from qtrain.models.integer_gcn import (
    IntegerGCN,
    IntegerGraph,
    IntegerSGD,
    integer_features,
    output_error,
)
from qtrain.ops.integer import INT8_MAX
from qtrain.train.loop import Trainer


class GcintTrainer(Trainer):
    """Full-graph integer-only GCN training (``train.numerics = "gcint"``)."""

    def __init__(self, model: Any, graph: Any, **kwargs: Any) -> None:
        config = kwargs["config"]
        integer_model = IntegerGCN.from_gcn(model, config.gcint_quantizer)
        super().__init__(integer_model, graph, **kwargs)  # type: ignore[arg-type]
        self.int_graph = IntegerGraph.of(self.graph)
        self.int_features = integer_features(self.feat)
        self.saved_bytes = 0

    def make_optimizer(self) -> IntegerSGD:
        return IntegerSGD(self.model, self.config.gcint_lr_shift)  # type: ignore[arg-type]

    def train_epoch(self) -> tuple[float, float]:
        """One integer step: forward, the output error, backward, the integer update."""
        model: IntegerGCN = self.model  # type: ignore[assignment]
        model.train()
        idx = self.idx["train"].to(self.device)
        with self.meter.step(self._step_inputs):
            logits, saved = model(self.int_graph, self.int_features, train=True)
            grads = model.backward(self.int_graph, saved, output_error(logits, self.labels, idx))
            self.optimizer.step(grads)
        # nothing goes through autograd: what the step keeps for its backward is int8
        self.saved_bytes = saved.nbytes()
        self.meter.activation_bytes = max(self.meter.activation_bytes, self.saved_bytes)
        rows = logits[idx].to(torch.float32) / INT8_MAX
        target = torch.nn.functional.one_hot(self.labels[idx], rows.shape[1]).to(rows.dtype)
        loss = float(((rows - target) ** 2).mean())
        return loss, self.metric_fn(logits[idx].to(torch.float32), self.labels[idx])

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        model: IntegerGCN = self.model  # type: ignore[assignment]
        model.eval()
        logits, _ = model(self.int_graph, self.int_features, train=False)
        logits = logits.to(torch.float32)
        out = {}
        for split in ("val", "test"):
            idx = self.idx[split].to(logits.device)
            out[split] = self.metric_fn(logits[idx], self.labels[idx])
        return out
