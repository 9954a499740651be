"""``train.numerics = "gcint"``: the built-in GCN trained integer-only, as GCINT does.

Why a training mode and not a plugin: a plugin swaps DGL's primitives under the
runner's autograd, Adam and cross-entropy, and composes with other plugins. GCINT
replaces those three themselves (its own backward with its own quantizers, integer
SGD, an integer loss without autograd), so it is the loop that changes, not a primitive;
no plugin can run beside it (the recipe refuses the combination).

``GcintTrainer`` is the runner's ``Trainer`` with the float GCN it is handed turned
into ``qtrain.models.integer_gcn.IntegerGCN`` (the same initial weights, so a seed
starts both numerics alike): the run directory, metrics, evaluation schedule, early
stopping, checkpoints and resume are the float runs'. The loss it reports is the one its
output error (``train.gcint_loss``) is the gradient of: the mean squared error of the
training rows in units of 127 (the targets' one-hot scale), or the cross-entropy of the
integer softmax.

Full-graph (``mode = "full"``): one integer step per epoch over the whole graph.
Mini-batch (``mode = "minibatch"``, GCINT's Table 3 setting): the float runs' neighbour
sampler and batches; per batch the forward and backward run on the sampled blocks
(``IntegerGraph.of_block``: the float GCN's unbiased block normalisation, in int8), with
DyQ's windows chosen per batch, and one integer update. Evaluation computes every node
with all its neighbours, as the float mini-batch runs do, but over the whole graph at
once rather than in batches of destination nodes: DyQ picks one window per tensor, and
windows picked per batch of rows would put the rows of one layer's output on different
scales.
"""

from __future__ import annotations

from typing import Any

import torch

from qtrain._compat import import_dgl
from qtrain.data.base import TRAIN_MASK
from qtrain.models.integer_gcn import (
    LOSSES,
    IntegerGCN,
    IntegerGraph,
    IntegerSGD,
    Saved,
    integer_features,
)
from qtrain.train.loop import Trainer


class GcintTrainer(Trainer):
    """Integer-only GCN training (``train.numerics = "gcint"``), full-graph or mini-batch."""

    def __init__(self, model: Any, graph: Any, **kwargs: Any) -> None:
        config = kwargs["config"]
        # the full graph's degrees, which prepare_graph recorded: the block normalisation
        self.full_out, self.full_in = model.deg_out, model.deg_in
        self.loss = LOSSES[config.gcint_loss]
        # the optimizer (made by the base class, before the splits) schedules its steps
        self.steps_per_epoch = _steps_per_epoch(graph, config)
        integer_model = IntegerGCN.from_gcn(model, config.gcint_quantizer, self.loss.logit_window)
        super().__init__(integer_model, graph, **kwargs)  # type: ignore[arg-type]
        self.int_features = integer_features(self.feat)
        # on a GPU the DGL graph may stay on the CPU (DGL's CPU build; qtrain's route runs it)
        int_graph = IntegerGraph.of(self.graph, transposed=not self.minibatch)
        self.int_graph = int_graph.to(self.device)
        self.saved_bytes = 0

    def make_optimizer(self) -> IntegerSGD:
        config = self.config
        return IntegerSGD(
            self.model,  # type: ignore[arg-type]
            config.gcint_lr_shift,
            config.gcint_step_decay,
            total_steps=config.epochs * self.steps_per_epoch,
        )

    def _integer_step(
        self,
        graphs: IntegerGraph | list[IntegerGraph],
        x: torch.Tensor,
        labels: torch.Tensor,
        rows: torch.Tensor,
        inputs: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, the output error of ``rows``, backward, the integer update; the int32
        scores (for accuracy) and the int8 logits the loss read."""
        model: IntegerGCN = self.model  # type: ignore[assignment]
        with self.meter.step(inputs):
            scores, saved = model(graphs, x, train=True)
            # a batch's rows are all read by the loss; the full graph's training rows only
            logits = model.logits(scores, None if self.minibatch else rows)
            grads = model.backward(graphs, saved, self.loss.error(logits, labels, rows))
            self.optimizer.step(grads)
        self._count_saved(saved)
        return scores, logits

    def _count_saved(self, saved: Saved) -> None:
        # nothing goes through autograd: what the step keeps for its backward is int8
        self.saved_bytes = max(self.saved_bytes, saved.nbytes())
        self.meter.activation_bytes = max(self.meter.activation_bytes, self.saved_bytes)

    def train_epoch(self) -> tuple[float, float]:
        """One epoch: one integer step over the whole graph, or one per mini-batch."""
        if self.minibatch:
            return super().train_epoch()  # the float runs' batch loop, with train_batch below
        self.model.train()
        idx = self.idx["train"].to(self.device)
        scores, logits = self._integer_step(
            self.int_graph, self.int_features, self.labels, idx, self._step_inputs
        )
        return self.loss.value(logits[idx], self.labels[idx]), self.metric_fn(
            _float_scores(scores[idx]), self.labels[idx]
        )

    def _block_graph(self, block: Any) -> IntegerGraph:
        nid = import_dgl().NID
        full_out = self.full_out[block.srcdata[nid].to(self.full_out.device)]
        full_in = self.full_in[block.dstdata[nid].to(self.full_in.device)]
        return IntegerGraph.of_block(block, full_out, full_in).to(self.device)

    def batch_features(self, input_nodes: torch.Tensor) -> torch.Tensor:
        return self.int_features[input_nodes.to(self.int_features.device)]

    def train_batch(
        self, blocks: list[Any], x: torch.Tensor, y: torch.Tensor, inputs: list[torch.Tensor]
    ) -> tuple[float, torch.Tensor]:
        """One integer step on the batch's sampled blocks, and its loss."""
        graphs = [self._block_graph(block) for block in blocks]
        rows = torch.arange(y.shape[0], device=y.device)
        scores, logits = self._integer_step(graphs, x, y, rows, inputs)
        return self.loss.value(logits, y), _float_scores(scores)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        model: IntegerGCN = self.model  # type: ignore[assignment]
        model.eval()
        scores, _ = model(self.int_graph, self.int_features, train=False)
        labels = self.labels.to(scores.device)
        out = {}
        for split in ("val", "test"):
            idx = self.idx[split].to(scores.device)
            out[split] = self.metric_fn(_float_scores(scores[idx]), labels[idx])
        return out


def _steps_per_epoch(graph: Any, config: Any) -> int:
    """Integer updates per epoch: one full-graph, else one per batch of training nodes."""
    if config.mode != "minibatch":
        return 1
    train = int(graph.ndata[TRAIN_MASK].sum())
    return max(-(-train // config.batch_size), 1)


def _float_scores(scores: torch.Tensor) -> torch.Tensor:
    """int32 scores as the float metrics take them: float64 holds every int32 exactly, so
    the argmax (the prediction) is the integers' own, ties included."""
    return scores.to(torch.float64)
