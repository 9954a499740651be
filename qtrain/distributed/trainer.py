"""One worker's full-graph training step on its partition; the epoch protocol is ``Trainer``'s.

The model runs on the worker's block (destinations: owned nodes; sources:
owned + halo) in every layer. With ``overlap`` each layer after the first
runs in two halves instead: the central nodes (no halo in-neighbour) while
the halo rows are in flight, then the marginal ones (adaqp-mlsys23 §3.4);
backward, the halo rows' gradients travel back while the central half runs
its backward. Without it, a forward pre-hook on each GNN layer after the
first appends the halo rows, fetched from their owners, to the owned rows the
previous layer produced (``qtrain.distributed.exchange``); the first layer reads the
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
from qtrain.distributed.adaptive import AdaptiveBits
from qtrain.distributed.exchange import Messenger, SharedGradient, with_halo
from qtrain.distributed.partition import Partition
from qtrain.models.base import GNNModel
from qtrain.train.activations import ActivationMeter
from qtrain.train.loop import Trainer, graph_tensors
from qtrain.train.metrics import loss_function, metric_function
from qtrain.train.progress import Reporter
from qtrain.train.rundir import RunDir

SPLITS = (("train", TRAIN_MASK), ("val", VAL_MASK), ("test", TEST_MASK))


class OwnedParts(torch.autograd.Function):
    """``(x[:n_read], x[n_central:])`` as views, their gradients written into one tensor.

    Overlap's two halves read overlapping parts of the owned rows. Two plain slices
    would each zero-fill a gradient of all the owned rows in backward and then add
    them; this writes each row's gradient once (the rows both read, added). With a
    ``SharedGradient`` it adds them into the gradient the halo's return makes instead.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        n_read: int,
        n_central: int,
        shared: SharedGradient | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= n_central <= n_read <= x.shape[0]:
            raise ValueError(f"need 0 <= n_central <= n_read <= {x.shape[0]} rows")
        ctx.n_read, ctx.n_central, ctx.shared = n_read, n_central, shared
        ctx.like = (x.shape, x.dtype, x.device)
        return x[:n_read], x[n_central:]

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_read: torch.Tensor | None, g_rest: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None]:
        n_read, n_central = ctx.n_read, ctx.n_central
        shape, dtype, device = ctx.like
        if ctx.shared is not None:

            def add_into(grad: torch.Tensor) -> None:
                if g_read is not None:
                    grad[:n_read].add_(g_read.reshape(grad[:n_read].shape))
                if g_rest is not None:
                    grad[n_central:].add_(g_rest.reshape(grad[n_central:].shape))

            return ctx.shared.owned_part(add_into, shape, dtype, device), None, None, None
        if g_read is None and g_rest is None:
            return None, None, None, None
        grad = torch.empty(shape, dtype=dtype, device=device)
        if g_rest is None:
            grad[n_read:].zero_()
            grad[:n_read].copy_(g_read)
            return grad, None, None, None
        grad[n_central:].copy_(g_rest)
        if g_read is None:
            grad[:n_central].zero_()
        else:
            grad[:n_central].copy_(g_read[:n_central])
            grad[n_central:n_read].add_(g_read[n_central:])
        return grad, None, None, None


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
        counts = torch.tensor(
            [self.idx[name].numel() for name, _ in SPLITS], dtype=torch.int64, device=device
        )
        dist.all_reduce(counts)  # on the worker's device: nccl reduces GPU tensors only
        self.global_counts = {name: int(n) for (name, _), n in zip(SPLITS, counts, strict=True)}
        self.meter = ActivationMeter(model.parameters(), device)
        self._step_inputs = [self.feat, self.labels, *graph_tensors(block)]
        self._epochs: list[tuple[int, float, float, float]] = []  # bytes, comm, quant, wall
        self._hooks: list[Any] = []
        self._wrapped: list[Any] = []
        self._shared: list[SharedGradient] = []  # this step's overlapped layers' gradients
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
            rows, kwargs = self._conv_inputs(graph, with_halo(feat, self.messenger, layer), kwargs)
            if self.model.reads_destination_rows:
                return (graph, (rows, feat), *rest), kwargs
            return (graph, rows, *rest), kwargs

        return append_halo

    def _conv_inputs(
        self, block: Any, rows: torch.Tensor, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The layer's source rows and keyword arguments on ``block``, now that the halo is in.

        A model with edge weights (GCN: full-graph degrees on a block) passed them for
        the owned rows alone; ``conv_inputs`` makes them what ``block`` needs, which is
        a scaling of the source rows where every destination keeps all its in-edges, as
        on a worker's block and both halves of it (``GCN.conv_inputs``).
        """
        if kwargs.get("edge_weight") is None:
            return rows, kwargs
        rows, weight = self.model.conv_inputs(block, rows)  # type: ignore[operator]
        return rows, {**kwargs, "edge_weight": weight}

    def _overlapped(self, layer: int, forward: Any) -> Any:
        """Layer ``layer`` split in two: the central nodes compute while the halo is in flight.

        The same sums as the whole block: a central node's in-neighbours are all
        owned, and each half normalises by full-graph degrees as the whole block
        does (``GCN.conv_inputs``; in-degrees are a node's own either way).
        Owned rows are ordered central first, then the marginal rows a central node
        reads (``build_partition``), so the central half reads a prefix of them (a
        view: no copy, and per-source work only on the rows it needs) and the two
        outputs concatenate in order; the marginal half gets its destination rows as
        a separate tensor, as DGL's layers accept for bipartite inputs.
        """
        n_central = self.part.num_central
        n_read = self._central.num_src_nodes()

        def overlapped(graph: Any, feat: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            pending = self.messenger.post_halo(feat, layer)
            shared = None
            if torch.is_grad_enabled():
                shared = SharedGradient(self.messenger)
                self._shared.append(shared)
            read, marginal = OwnedParts.apply(feat, n_read, n_central, shared)
            rows, central_kwargs = self._conv_inputs(self._central, read, kwargs)
            inner = forward(self._central, rows, *args, **central_kwargs)
            rows, marginal_kwargs = self._conv_inputs(
                self._marginal, with_halo(feat, self.messenger, layer, pending, shared), kwargs
            )
            outer = forward(self._marginal, (rows, marginal), *args, **marginal_kwargs)
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
            [sum(e[i] for e in self._epochs) for i in range(4)],
            dtype=torch.float64,
            device=self.device,
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
        self._shared.clear()
        with self.meter.step(self._step_inputs):
            logits = self.model(self.blocks, self.feat)
            # 0 * sum keeps every worker's backward (and so its halo exchanges) running
            loss = 0.0 * logits.sum()
            if idx.numel():
                loss = loss + self.loss_fn(logits[idx], self.labels[idx]) * share
            loss.backward()
            if not all(shared.resolved for shared in self._shared):
                # one of a layer's two halves got no gradient: the owned rows' would be
                # incomplete (cannot happen with DGL's layers, which read their inputs)
                raise RuntimeError("an overlapped layer's halves did not both run backward")
            self._all_reduce_grads()
            self.optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total.item()), self.metric_fn(*self._gather(logits, "train"))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        self.model.eval()
        logits = self.model(self.blocks, self.feat)
        return {split: self.metric_fn(*self._gather(logits, split)) for split in ("val", "test")}
