"""One worker's full-graph training step on its partition; the epoch protocol is ``Trainer``'s.

The model runs on the worker's block (destinations: owned nodes; sources:
owned + halo) in every layer. With ``overlap`` each layer after the first
runs in two halves instead: the central nodes (no halo in-neighbour) while
the halo rows are in flight, then the marginal ones (adaqp-mlsys23 §3.4). A forward pre-hook on each GNN layer after the
first appends the halo rows, fetched from their owners, to the owned rows the
previous layer produced (``qtrain.dist.exchange``); the first layer reads the
halo's input features from the worker's own copy of the graph. The loss is
the worker's share of the global mean (local mean x local count / global
count), so the all-reduced sum of the workers' gradients (FP32) is the
single-process gradient; every worker then takes the same Adam step.
Evaluation gathers the owned validation / test predictions of every worker,
so all workers compute the same metric and stop at the same epoch.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from qtrain.data.base import FEAT, LABEL, TEST_MASK, TRAIN_MASK, VAL_MASK
from qtrain.dist.adaptive import AdaptiveBits
from qtrain.dist.exchange import Messenger, with_halo
from qtrain.dist.partition import Partition
from qtrain.models.base import GNNModel
from qtrain.train.activations import ActivationMeter
from qtrain.train.loop import Trainer, graph_tensors
from qtrain.train.metrics import loss_function, metric_function
from qtrain.train.progress import Reporter
from qtrain.train.rundir import RunDir

SPLITS = (("train", TRAIN_MASK), ("val", VAL_MASK), ("test", TEST_MASK))


class DistTrainer(Trainer):
    """``Trainer`` whose step runs on one partition and talks to the other workers."""

    def __init__(
        self,
        model: GNNModel,
        graph: Any,  # the whole graph, through model.prepare_graph
        part: Partition,
        messenger: Messenger,
        *,
        metric: str,
        config: Any,
        device: torch.device,
        run: RunDir | None = None,
        reporter: Reporter | None = None,
        adaptive: AdaptiveBits | None = None,
        overlap: bool = False,
    ) -> None:
        self.model, self.config, self.device = model, config, device
        self.adaptive = adaptive
        self.run_dir, self.reporter = run, reporter or Reporter()
        self.metric_name = metric
        self.loss_fn = loss_function(metric)
        self.metric_fn = metric_function(metric)
        self.minibatch = False
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.part, self.messenger = part, messenger
        block = part.block.to(device)
        self.blocks = [block] * len(model.layers)
        data = graph.ndata
        self.feat = data[FEAT][part.src_ids].to(device)
        self.labels = data[LABEL][part.owned].to(device)
        self.eval_labels = self.labels
        self.idx = {
            name: torch.nonzero(data[mask][part.owned], as_tuple=False).squeeze(1).to(device)
            for name, mask in SPLITS
        }
        counts = torch.tensor([self.idx[name].numel() for name, _ in SPLITS], dtype=torch.int64)
        dist.all_reduce(counts)
        self.global_counts = {name: int(n) for (name, _), n in zip(SPLITS, counts, strict=True)}
        self.meter = ActivationMeter(model.parameters(), device)
        self._step_inputs = [self.feat, self.labels, *graph_tensors(block)]
        self._epochs: list[tuple[int, float, float, float]] = []  # bytes, comm, quant, wall
        self._hooks: list[Any] = []
        self._wrapped: list[Any] = []
        if overlap:
            self._central = part.central_block.to(device)
            self._marginal = part.marginal_block.to(device)
            for i, layer in enumerate(model.layers):
                if i > 0:
                    layer.forward = self._overlapped(i, layer.forward)
                    self._wrapped.append(layer)
        else:
            self._hooks = [
                layer.register_forward_pre_hook(self._halo_hook(i), with_kwargs=True)
                for i, layer in enumerate(model.layers)
                if i > 0
            ]

    def _halo_hook(self, layer: int) -> Any:
        def append_halo(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            graph, feat, *rest = args
            return (graph, with_halo(feat, self.messenger, layer), *rest), kwargs

        return append_halo

    def _overlapped(self, layer: int, forward: Any) -> Any:
        """Layer ``layer`` split in two: the central nodes compute while the halo is in flight.

        The same sums as the whole block: a central node's in-neighbours are all
        owned, and each half normalises by full-graph degrees as the whole block
        does (``block_weights`` for GCN; in-degrees are a node's own either way).
        Owned rows are ordered central first, then the marginal rows a central node
        reads (``build_partition``), so the central half reads a prefix of them (a
        view: no copy, and per-source work only on the rows it needs) and the two
        outputs concatenate in order; the marginal half gets its destination rows as
        a separate tensor, as DGL's layers accept for bipartite inputs.
        """
        model, n_central = self.model, self.part.num_central
        n_read = self._central.num_src_nodes()

        def weights(kwargs: dict[str, Any], block: Any) -> dict[str, Any]:
            if kwargs.get("edge_weight") is None:
                return kwargs
            return {**kwargs, "edge_weight": model.block_weights(block)}  # type: ignore[operator]

        def overlapped(graph: Any, feat: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            pending = self.messenger.post_halo(feat, layer)
            inner = forward(
                self._central, feat[:n_read], *args, **weights(kwargs, self._central)
            )
            rows = with_halo(feat, self.messenger, layer, pending)
            outer = forward(
                self._marginal,
                (rows, feat[n_central:]),
                *args,
                **weights(kwargs, self._marginal),
            )
            return torch.cat([inner, outer])

        return overlapped

    def close(self) -> None:
        """Remove the layer hooks and wrappers (the model can train alone again)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for layer in self._wrapped:
            del layer.forward  # the class's own forward again
        self._wrapped = []

    def _all_reduce_grads(self) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        for p, g in zip(params, _unflatten_dense_tensors(flat, grads), strict=True):
            p.grad = g

    def _gather(self, logits: torch.Tensor, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every worker's (logits, labels) of ``split``'s owned nodes, in rank order."""
        idx = self.idx[split]
        mine = (logits[idx].detach().cpu(), self.labels[idx].cpu())
        everyone: list[Any] = [None] * self.part.world_size
        dist.all_gather_object(everyone, mine)
        return torch.cat([e[0] for e in everyone]), torch.cat([e[1] for e in everyone])

    def train_epoch(self) -> tuple[float, float]:
        stats = self.messenger.stats
        before = (stats.bytes_sent, stats.comm_seconds, stats.quant_seconds)
        start = time.perf_counter()
        if self.adaptive is not None:
            epoch = len(self._epochs) + 1
            if self.adaptive.due(epoch):
                self.adaptive.reassign(stats)  # part of this epoch's time, as the paper counts it
            # row ranges (the assigner's statistics) are traced only in the epoch before one
            self.messenger.tracing = self.adaptive.due(epoch + 1)
        result = self._train_step()
        self._epochs.append(
            (
                stats.bytes_sent - before[0],
                stats.comm_seconds - before[1],
                stats.quant_seconds - before[2],
                time.perf_counter() - start,
            )
        )
        return result

    def report(self) -> dict[str, Any]:
        """What the exchanges cost, over all workers (a collective: every worker calls it)."""
        n = len(self._epochs)
        mine = torch.tensor(
            [sum(e[i] for e in self._epochs) for i in range(4)], dtype=torch.float64
        )
        total, slowest = mine.clone(), mine.clone()
        dist.all_reduce(total)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        histograms: list[Any] = [None] * self.part.world_size
        dist.all_gather_object(histograms, self.messenger.stats.bits_histogram)
        # per worker: what it computes, what it receives, and what overlap can hide
        # transfers behind (its central nodes, which read no halo row)
        mine_nodes = (self.part.num_owned, int(self.part.halo.numel()), self.part.num_central)
        nodes: list[Any] = [None] * self.part.world_size
        dist.all_gather_object(nodes, mine_nodes)
        merged: dict[str, dict[str, int]] = {}
        for h in histograms:
            for layer, counts in h.items():
                into = merged.setdefault(layer, {})
                for bits, rows in counts.items():
                    into[str(bits)] = into.get(str(bits), 0) + rows
        per_epoch = (lambda x: x / n) if n else (lambda x: 0.0)
        comm, quant, epoch = (per_epoch(float(slowest[i])) for i in (1, 2, 3))
        return {
            "world_size": self.part.world_size,
            "owned_nodes": [n[0] for n in nodes],
            "halo_nodes": [n[1] for n in nodes],
            "central_nodes": [n[2] for n in nodes],
            "comm_bytes_per_epoch": per_epoch(float(total[0])),
            "time_per_epoch_s": {
                "communication": comm,
                "quantization": quant,
                "computation": max(0.0, epoch - comm - quant),
                "epoch": epoch,
                "note": "slowest worker's mean per training epoch",
            },
            "bits_histogram": merged,
            "message_bits": "adaptive" if self.adaptive is not None else "uniform",
            "solver_seconds": self.adaptive.solve_seconds if self.adaptive is not None else 0.0,
            "assignments": self.adaptive.assignments if self.adaptive is not None else 0,
        }

    def _train_step(self) -> tuple[float, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        idx = self.idx["train"]
        share = idx.numel() / max(self.global_counts["train"], 1)
        with self.meter.step(self._step_inputs):
            logits = self.model(self.blocks, self.feat)
            # 0 * sum keeps every worker's backward (and so its halo exchanges) running
            loss = 0.0 * logits.sum()
            if idx.numel():
                loss = loss + self.loss_fn(logits[idx], self.labels[idx]) * share
            loss.backward()
            self._all_reduce_grads()
            self.optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total.item()), self.metric_fn(*self._gather(logits, "train"))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        logits = self.model(self.blocks, self.feat)
        return {split: self.metric_fn(*self._gather(logits, split)) for split in ("val", "test")}
