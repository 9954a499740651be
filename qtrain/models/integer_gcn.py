"""GCINT's integer-only GCN (``../shared/papers/gcint.txt``): forward, backward, loss and
update with int8 tensors between the products and int32 inside them.

Per layer ``l`` (equations 5, 8 and 9), with ``A`` the GCN-normalised adjacency
(self-loops, ``1 / sqrt(d_out(u) d_in(v))``) quantized once as ``ceil(A * 127)``::

    forward   X[l+1] = Q(SPMM(A, Q(GEMM(X[l], W[l]))))     Q: DyQ, StQ or bounded DyQ
    backward  T      = StQ(SPMM(A^T, E[l+1]))
              G[l]   = DyQ(GEMM(X[l]^T, T))
              E[l]   = StQ(GEMM(T, W[l]^T)), masked by the ReLU of X[l]
    loss      E[L]   = X[L] - 127 * onehot(label), on the training nodes (MSE, no softmax),
                       or 127 * (softmax(X[L]) - onehot(label)) with an integer softmax
                       (X[L]: the last product through Q, or per row for the softmax)
    update    W32[l] -= G[l] * 2^lr_shift;  W[l] = Q_w(W32[l])

or, where aggregating first is cheaper (``aggregates_first``), ``M = Q(SPMM(A, X[l]))``,
``X[l+1] = Q(GEMM(M, W[l]))``, ``G[l] = DyQ(GEMM(M^T, E[l+1]))`` and
``E[l] = StQ(SPMM(A^T, StQ(GEMM(E[l+1], W[l]^T))))``.

On mini-batches each layer runs on its sampled block (DGL's message flow graph) instead
of the whole graph: ``A`` is then the block's, with the float GCN's unbiased weights
``sqrt(d_in(v) / d_out(u)) / block_in(v)`` (``qtrain.models.gcn``; the full graph's
``1 / sqrt(d_out(u) d_in(v))`` wherever ``v`` keeps all its neighbours), and ``A^T`` takes
the error from the block's destinations back to its sources.

The numerics (DyQ, StQ, Q_w, the int32 products) are ``qtrain.ops.integer``'s.
Choices the paper leaves open, and why:

* The weights live as int32 master copies with 8 bits below the int8 grid (the
  float initial weights scaled so their largest is ``127 * 256``); the GEMMs take
  ``Q_w`` of them. The paper updates "in the cumulative unit of INT32" without saying
  how small steps survive the next Q_w: with int8 weights alone, every step under half
  a grid step would be lost. ``lr_shift`` sets the step: 4 (a gradient of 127 moves a
  weight 1/16 of the largest weight) trained Cora to 81.13 against FP32's 80.87 (3 seeds;
  5 gave 80.77; in a first prototype 2 and 3 gave 71.1 and 80.0, 0 gave 57.5).
* A negative ``lr_shift`` divides the gradient, rounded to nearest: mini-batches take many
  small steps where full-graph training takes one per epoch.
* The step can fall linearly to zero over the run (``IntegerSGD``'s ``decay``; the recipe's
  ``auto`` does so on mini-batches). The paper's step is constant, but DyQ hands every step
  a gradient whose largest value is about 127 however small the error has become, so a
  constant step keeps the weights moving as much late in training as early: on
  synthetic-products mini-batches (2 epochs, 3 seeds) validation swung between 64% and
  82% from one probe to the next and the test accuracy was 75.43 +- 5.44; decaying, 85.48
  +- 0.16 (synthetic-arxiv 81.29 to 81.71). Full-graph, where 200 steps are few, the
  constant step measured better (Cora 81.13 against 80.50, Citeseer 70.53 against 69.83).
* No bias (equation 1 has none); ``GraphConv``'s float bias is left out.
* Dropout zeroes inputs without rescaling the kept ones: the next product's output is
  re-windowed by DyQ / StQ, so a constant factor changes nothing but the window. It acts
  in the forward only: the error handed to the layer below is not masked by it (equation
  8 has no mask, and the figure leaves dropout out). Masked, as the chain rule would have
  it, Cora's mean test accuracy (3 seeds) fell from 81.13 to 79.67.
* The ReLU masks the error where the hidden output was not positive.
* The output error saturates at int8 (``X - 127 * onehot`` reaches -254).
* ``dyq-bounded`` is offered beside DyQ and StQ for the forward's windows (the errors keep
  StQ and the gradients DyQ): the lowest window that saturates at most one nonzero value
  in ``2^BOUNDED_TAIL``. DyQ's fullest window sits on the many small activations and
  clips the few large ones to 127; on mini-batches that cost 7 points (``BOUNDED_TAIL``
  says how it was found).
* ``softmax_error`` is offered beside the paper's MSE (``train.gcint_loss``): with many
  classes the MSE does not train (its docstring says why, with the measurements).
* The softmax error reads the last product through one window per row
  (``integer.row_window``), the MSE through the forward's window (the paper's X[L]). A
  softmax is a function of each row alone, and one window for the whole batch is set
  by its largest rows: on synthetic-products mini-batches (degrees up to ~11,000, and
  GCN's symmetric normalisation makes a hub's sums large) it left the median row's
  largest logit at 17 of 127 and 14% of rows tied at the top, so the softmax stayed
  near uniform and the error carried little of the class order. Per row, test accuracy
  after one epoch (seed 0, bounded DyQ) rose from 65.0% to 79.0% (FP32: 69.8%).
* The prediction is the argmax of the last product's int32 scores, not of int8 logits:
  no window is needed to compare integers, and one would tie them (the same epoch
  evaluated from the int32 scores, with the tensor's window in training: 70.8%).
* The product order is chosen per layer (``aggregates_first``), as DGL's GraphConv does;
  equation 5 fixes GEMM first. On synthetic-arxiv aggregating first in the widening last
  layer (16 -> 40) also lifted full-graph accuracy with the softmax error from 55.6% to
  63.3% (3 seeds), and mini-batch epochs became 2.25x faster (11.8 s to 5.2 s).
* Nodes outside the training set contribute no error.
* A sampled block's adjacency weight can exceed 1 (``d_in(v) >> d_out(u)``); it saturates
  at 127 like every int8 value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from qtrain.ops import integer
from qtrain.ops.graph import group_rows, index_dtype

MASTER_BITS = 8  # int32 master weights carry this many bits below the int8 grid
_MASTER_LIMIT = 2**30  # master weights saturate here (no int32 overflow in an update)
Quantizer = Literal["dyq", "stq", "dyq-bounded"]
LogitWindow = Literal["tensor", "row"]
StepDecay = Literal["constant", "linear"]
# IntegerSGD's step share m is an integer in units of 2^-STEP_BITS: 127 * 2^16 leaves
# int32 room for lr_shift up to the recipe's largest, 16
STEP_BITS = 16
# dyq-bounded's window saturates at most one nonzero value in 2^13 of each forward product.
# How it was found, on synthetic-arxiv mini-batch (GCINT's setting, softmax error, 3 epochs,
# seed 0; FP32 79.8% over 3 seeds), with every product exact in float64 and the windows
# switched back to int8 one kind at a time: none 82.7%, the gradients' DyQ, the errors'
# StQ or Q_w alone 82.6-82.7%, the forward's DyQ 74.5% (rounding without saturating
# 82.6%, saturating without rounding 74.7%), all 73.2% (the integer path's own). So DyQ
# clipping the largest activations is the loss. Bounding the saturated share, integer
# path: nothing saturates 77.1%, 10^-4 79.7%, 10^-3 78.4%, 10^-2 72.5%; 2^-13 gave 79.69,
# 79.60 and 79.36 on seeds 0 to 2.
BOUNDED_TAIL = 13


@dataclass(frozen=True)
class IntCsr:
    """A sparse int8 matrix in CSR: row ``r``'s entries are ``indptr[r] .. indptr[r + 1]``."""

    indptr: Tensor
    indices: Tensor
    values: Tensor  # int8, in the order of indices

    @classmethod
    def of(cls, rows: Tensor, cols: Tensor, values: Tensor, num_rows: int, num_cols: int) -> IntCsr:
        """The entries ``(rows[e], cols[e]) = values[e]``, grouped by row as the float
        route's CSR views are (``qtrain.ops.graph.group_rows``: int32 indices where they
        fit, no host sync)."""
        dtype = index_dtype(rows.numel(), num_rows, num_cols)
        entries = torch.arange(rows.numel(), device=rows.device)
        indptr, indices, order = group_rows(rows, cols, entries, num_rows, dtype)
        return cls(indptr, indices, values[order.long()])

    def spmm(self, x: Tensor) -> Tensor:
        return integer.int_spmm(self.indptr, self.indices, self.values, x)

    def to(self, device: torch.device) -> IntCsr:
        return IntCsr(self.indptr.to(device), self.indices.to(device), self.values.to(device))


def adjacency_values(norm: Tensor) -> Tensor:
    """GCINT's adjacency (figure 2): the normalised weights as ``ceil(a * 127)``, at most
    127 (a sampled block's unbiased weight can exceed 1; it saturates)."""
    return torch.ceil(norm * integer.INT8_MAX).clamp(max=integer.INT8_MAX).to(torch.int8)


@dataclass(frozen=True)
class IntegerGraph:
    """A GCN layer's graph as the integer GCN reads it: the int8 normalised adjacency ``A``
    by destination (the forward's product) and, for training, ``A^T`` by source (the
    backward's). A full graph has ``num_src == num_dst``; a sampled block (DGL's message
    flow graph) has its destinations as the first of its sources."""

    a: IntCsr
    a_t: IntCsr | None
    num_src: int
    num_dst: int

    @classmethod
    def of(cls, graph: Any, transposed: bool = True) -> IntegerGraph:
        """A DGL graph that already has its self-loops (``GCN.prepare_graph``), normalised
        ``1 / sqrt(d_out(u) d_in(v))``; ``transposed=False`` leaves out ``A^T`` (evaluation)."""
        src, dst = (e.long() for e in graph.edges())
        out_deg = graph.out_degrees().to(torch.float64).clamp(min=1)
        in_deg = graph.in_degrees().to(torch.float64).clamp(min=1)
        norm = (out_deg[src] * in_deg[dst]).rsqrt()
        nodes = graph.num_nodes()
        return cls._of_edges(src, dst, adjacency_values(norm), nodes, nodes, transposed)

    @classmethod
    def of_block(cls, block: Any, full_out: Tensor, full_in: Tensor) -> IntegerGraph:
        """A sampled block, with the full graph's out-degree of each source and in-degree of
        each destination: the float GCN's unbiased block weights (``qtrain.models.gcn``)
        folded into GraphConv's block normalisation, ``sqrt(d_in(v) / d_out(u)) /
        block_in(v)`` per edge, which is ``1 / sqrt(d_out(u) d_in(v))`` when ``v`` keeps
        all its neighbours."""
        src, dst = (e.long() for e in block.edges())
        block_in = block.in_degrees().to(torch.float64).clamp(min=1)
        full_out = full_out.to(src.device, torch.float64)
        full_in = full_in.to(src.device, torch.float64)
        norm = (full_in[dst] / full_out[src]).sqrt() / block_in[dst]
        values = adjacency_values(norm)
        return cls._of_edges(src, dst, values, block.num_src_nodes(), block.num_dst_nodes(), True)

    @classmethod
    def _of_edges(
        cls, src: Tensor, dst: Tensor, values: Tensor, num_src: int, num_dst: int, transposed: bool
    ) -> IntegerGraph:
        a = IntCsr.of(dst, src, values, num_dst, num_src)
        a_t = IntCsr.of(src, dst, values, num_src, num_dst) if transposed else None
        return cls(a, a_t, num_src, num_dst)

    def to(self, device: torch.device) -> IntegerGraph:
        a_t = None if self.a_t is None else self.a_t.to(device)
        return IntegerGraph(self.a.to(device), a_t, self.num_src, self.num_dst)

    def spmm(self, x: Tensor) -> Tensor:
        """``A x``: int8 source rows to int32 destination rows."""
        return self.a.spmm(x)

    def spmm_transposed(self, x: Tensor) -> Tensor:
        """``A^T x``: int8 destination rows to int32 source rows."""
        if self.a_t is None:
            raise RuntimeError("this IntegerGraph was built for evaluation, without A^T")
        return self.a_t.spmm(x)


def integer_features(x: Tensor) -> Tensor:
    """Input features to int8 once per run (GCINT's figure 2): ``ceil(x / max|x| * 127)``."""
    top = x.abs().max()
    if not bool(torch.isfinite(top)):
        raise ValueError("the features hold NaN or Inf; GCINT needs finite features")
    if top == 0:
        return torch.zeros_like(x, dtype=torch.int8)
    return torch.ceil(x.to(torch.float64) / float(top) * integer.INT8_MAX).to(torch.int8)


@dataclass
class Saved:
    """What one training forward keeps for its backward (all int8 or bool)."""

    inputs: list[Tensor]  # each layer's GEMM operand: its input after dropout, or A times it
    positive: list[Tensor]  # each hidden layer's ReLU mask (output > 0)
    weights: list[Tensor]  # the int8 weights the forward used (parameters, not counted)
    aggregated: list[bool]  # whether the layer aggregated first (``aggregates_first``)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.inputs, *self.positive])


class IntegerGCN(nn.Module):
    """The integer GCN with the float GCN's layer widths, dropout and initial weights."""

    def __init__(
        self,
        weights: list[Tensor],
        dropout: float,
        input_dropout: float,
        quantizer: Quantizer = "dyq",
        logit_window: LogitWindow = "tensor",
    ) -> None:
        super().__init__()
        for i, w in enumerate(weights):
            top = w.abs().max()
            scale = (integer.INT8_MAX << MASTER_BITS) / float(top) if top > 0 else 0.0
            self.register_buffer(f"weight{i}", torch.round(w.detach().double() * scale).int())
        self.num_layers = len(weights)
        self.dropout = float(dropout)
        self.input_dropout = float(input_dropout)
        self.quantizer: Quantizer = quantizer
        self.logit_window: LogitWindow = logit_window

    @classmethod
    def from_gcn(
        cls, model: Any, quantizer: Quantizer = "dyq", logit_window: LogitWindow = "tensor"
    ) -> IntegerGCN:
        """From qtrain's float ``GCN``: its GraphConv weights (``[in, out]``) as the start."""
        weights = [layer.weight.detach().cpu() for layer in model.layers]
        dev = model.layers[0].weight.device
        drop, input_drop = model.dropout.p, model.input_dropout.p
        return cls(weights, drop, input_drop, quantizer, logit_window).to(dev)

    def master(self, i: int) -> Tensor:
        return getattr(self, f"weight{i}")

    def int8_weights(self) -> list[Tensor]:
        return [integer.quantize_weights(self.master(i)) for i in range(self.num_layers)]

    def _window(self, x: Tensor) -> Tensor:
        """A forward product back to int8, by the chosen quantizer."""
        if self.quantizer == "stq":
            return integer.stq(x)
        return integer.dyq(x, tail=BOUNDED_TAIL if self.quantizer == "dyq-bounded" else None)[0]

    def logits(self, scores: Tensor, rows: Tensor | None = None) -> Tensor:
        """The int8 logits the loss reads from the last product's int32 ``scores``: through
        the forward's window (``logit_window = "tensor"``, the paper's), or each row through
        its own (``"row"``, ``integer.row_window``). ``rows``: the only rows the loss reads
        (a full-graph step's training nodes); a per-row window then computes those alone and
        leaves the others 0, the same logits where they are read for a fraction of the work.
        The tensor's window is the whole product's, so it ignores ``rows``."""
        if self.logit_window == "tensor":
            return self._window(scores)
        if rows is None:
            return integer.row_window(scores)
        logits = scores.new_zeros(scores.shape, dtype=torch.int8)
        return logits.index_copy_(0, rows, integer.row_window(scores.index_select(0, rows)))

    def forward(
        self, graphs: IntegerGraph | list[IntegerGraph], x: Tensor, train: bool = False
    ) -> tuple[Tensor, Saved]:
        """The int32 scores of every destination node (the last product, before any
        window: their argmax is the prediction, ``logits`` what the loss reads), and what
        the backward needs (``train``: dropout on). ``graphs``: the full graph for every
        layer, or one block per layer."""
        weights = self.int8_weights()
        saved = Saved([], [], weights, [])
        h = x
        last = len(weights) - 1
        for i, w in enumerate(weights):
            graph = graphs[i] if isinstance(graphs, list) else graphs
            p = self.input_dropout if i == 0 else self.dropout
            if train and p > 0:
                keep = torch.rand(h.shape, device=h.device) >= p
                h = torch.where(keep, h, torch.zeros_like(h))
            aggregate = aggregates_first(graph, *w.shape)
            if aggregate:
                m = self._window(graph.spmm(h))
                saved.inputs.append(m)
                product = integer.int_gemm(m, w)
            else:
                saved.inputs.append(h)
                product = graph.spmm(self._window(integer.int_gemm(h, w)))
            saved.aggregated.append(aggregate)
            if i == last:
                return product, saved
            h = self._window(product)
            positive = h > 0
            saved.positive.append(positive)
            h = torch.where(positive, h, torch.zeros_like(h))
        raise ValueError("an IntegerGCN needs at least one layer")

    def backward(
        self, graphs: IntegerGraph | list[IntegerGraph], saved: Saved, error: Tensor
    ) -> list[Tensor]:
        """int8 gradients of every layer's weights from the int8 output error (equations 8
        and 9, the products in the order the forward took them)."""
        weights = saved.weights
        grads: list[Tensor] = [error] * self.num_layers
        for i in reversed(range(self.num_layers)):
            graph = graphs[i] if isinstance(graphs, list) else graphs
            if saved.aggregated[i]:  # Y = Q(Q(A X) W)
                grads[i], _ = integer.dyq(integer.int_gemm(saved.inputs[i], error, "tn"))
                if i > 0:
                    t = integer.stq(integer.int_gemm(error, weights[i], "nt"))
                    error = integer.stq(graph.spmm_transposed(t))
            else:  # Y = Q(A Q(X W))
                t = integer.stq(graph.spmm_transposed(error))
                grads[i], _ = integer.dyq(integer.int_gemm(saved.inputs[i], t, "tn"))
                if i > 0:
                    error = integer.stq(integer.int_gemm(t, weights[i], "nt"))
            if i > 0:
                positive = saved.positive[i - 1]
                error = torch.where(positive, error, torch.zeros_like(error))
        return grads


def aggregates_first(graph: IntegerGraph, width_in: int, width_out: int) -> bool:
    """Whether a layer runs ``Q(Q(A X) W)`` rather than the paper's ``Q(A Q(X W))``
    (equation 5): the order with fewer multiply-adds, as DGL's GraphConv picks it. On a
    full graph that is aggregating first when the layer widens; on a sampled block, whose
    sources far outnumber its destinations, the GEMM then runs on the destinations only
    (GCINT's mini-batch setting, 128 -> 256 over 25 sampled neighbours: about 10x fewer
    GEMM rows). A tie keeps the paper's order."""
    nnz = graph.a.values.numel()
    gemm_first = graph.num_src * width_in * width_out + nnz * width_out
    aggregate_first = nnz * width_in + graph.num_dst * width_in * width_out
    return aggregate_first < gemm_first


def _scatter_rows(rows: Tensor, train_idx: Tensor, num_rows: int) -> Tensor:
    """int8 ``[num_rows, C]``: the training rows' errors in their places, 0 elsewhere."""
    error = torch.zeros((num_rows, rows.shape[1]), dtype=torch.int8, device=rows.device)
    return error.index_copy_(0, train_idx, rows.to(torch.int8))


def _subtract_target(rows: Tensor, labels: Tensor) -> Tensor:
    """``rows - 127 * onehot(labels)``, in place."""
    rows[torch.arange(rows.shape[0], device=rows.device), labels] -= integer.INT8_MAX
    return rows


def mse_error(logits: Tensor, labels: Tensor, train_idx: Tensor) -> Tensor:
    """Equation 10: ``X - 127 * onehot(label)`` on the training nodes, 0 elsewhere, as int8."""
    rows = _subtract_target(logits.index_select(0, train_idx).to(torch.int16), labels[train_idx])
    limit = integer.INT8_MAX
    return _scatter_rows(rows.clamp_(-limit, limit), train_idx, logits.shape[0])


# int8 logit units per halving of a class's probability. Measured on full-graph
# synthetic-arxiv (one seed, 200 epochs, before the product order was chosen per layer):
# 4 gave 51.9%, 8 54.7%, 16 48.2%, 32 52.0%; on Cora (3 seeds) 8 gave 79.2, 16 80.5.
SOFTMAX_TEMPERATURE = 8
_EXP_BITS = 16  # the table's 1.0


@functools.lru_cache(maxsize=8)
def _exp2_table(temperature: int, device: torch.device) -> Tensor:
    """int32 ``[255]``: ``2^16 * 2^(-gap / temperature)`` for every gap between two int8
    logits (0 to 254), rounded; a constant of the loss, like the adjacency's ``ceil(A*127)``,
    made once per device."""
    gaps = torch.arange(2 * integer.INT8_MAX + 1, dtype=torch.float64)
    return torch.round(2.0 ** (_EXP_BITS - gaps / temperature)).to(torch.int32).to(device)


def softmax_error(logits: Tensor, labels: Tensor, train_idx: Tensor) -> Tensor:
    """The cross-entropy error ``127 * (softmax(X) - onehot(label))`` in integers, on the
    training nodes, 0 elsewhere, as int8: each class's weight is a table entry at its gap
    below the row's largest logit (base 2, ``SOFTMAX_TEMPERATURE`` units per halving), and
    its probability ``127 * weight / sum(weights)`` an integer division rounded to nearest.

    Not the paper's loss (section 3.7 drops softmax because ``e^x`` is no linear map); a
    table lookup is integer-only all the same. Why it is offered: the MSE error is
    ``X`` itself on every wrong class, and DyQ re-windows the logits every step, so with
    many classes the wrong classes' error is the bulk of the signal and is never worked
    off (full-graph synthetic-arxiv, 40 classes, 3 seeds: 5.5% with MSE, 63.3% with this
    error against FP32's 63.4%; README). Its error sums to about 127 per row or less over
    the wrong classes, and it is largest on the classes that outrank the true one."""
    x = logits.index_select(0, train_idx).to(torch.int16)
    gap = (x.amax(dim=1, keepdim=True) - x).long()
    # int32 weights, at most 2^16; their row sums stay in int32 below 2^14 classes
    acc = torch.int32 if x.shape[1] < 2**14 else torch.int64
    weight = _exp2_table(SOFTMAX_TEMPERATURE, x.device).take(gap).to(acc)
    total = weight.sum(dim=1, keepdim=True, dtype=acc)  # at least the largest logit's 2^16
    rows = torch.div(weight * integer.INT8_MAX + total // 2, total, rounding_mode="floor")
    return _scatter_rows(_subtract_target(rows, labels[train_idx]), train_idx, logits.shape[0])


def mse_value(logits: Tensor, labels: Tensor) -> float:
    """The loss ``mse_error`` is the gradient of, for reports: the mean squared error in
    units of 127 (the targets' one-hot scale)."""
    rows = logits.to(torch.float32) / integer.INT8_MAX
    target = torch.nn.functional.one_hot(labels, rows.shape[1]).to(rows.dtype)
    return float(((rows - target) ** 2).mean())


def softmax_value(logits: Tensor, labels: Tensor) -> float:
    """The loss ``softmax_error`` is the gradient of, for reports: the cross-entropy of the
    base-2 softmax at ``SOFTMAX_TEMPERATURE``."""
    rows = logits.to(torch.float32) * (math.log(2) / SOFTMAX_TEMPERATURE)
    return float(torch.nn.functional.cross_entropy(rows, labels))


class IntegerLoss(NamedTuple):
    """A ``train.gcint_loss``: its int8 output error, the value it is the gradient of, and
    how it reads the logits (``IntegerGCN.logits``)."""

    error: Callable[[Tensor, Tensor, Tensor], Tensor]
    value: Callable[[Tensor, Tensor], float]
    logit_window: LogitWindow


LOSSES = {
    "mse": IntegerLoss(mse_error, mse_value, "tensor"),
    "softmax": IntegerLoss(softmax_error, softmax_value, "row"),
}


# what a resumed run's mismatched optimizer setting is called in the recipe
_STATE_NAMES = {
    "lr_shift": "gcint_lr_shift",
    "decay": "gcint_lr_decay",
    "total_steps": "gcint_lr_decay = 'linear' over updates (epochs x batches)",
}


class IntegerSGD:
    """Integer SGD (equation 6) on the master weights: ``W32 -= G * 2^lr_shift * m``, the
    product rounded to nearest in integers (a negative ``lr_shift`` divides: mini-batches
    take many small steps). ``m`` is the step's share of the full step in units of
    ``2^-STEP_BITS``: always 1 for ``decay="constant"``; for ``"linear"`` it falls from 1 to
    0 over ``total_steps`` updates. DyQ hands every step a gradient whose largest value is
    about 127 whatever the error's size, so a constant step never shrinks as training
    converges; the decay is what lets it settle. It saves its setting and its step count
    (a resumed run checks the one and continues the other)."""

    def __init__(
        self, model: IntegerGCN, lr_shift: int, decay: StepDecay = "constant", total_steps: int = 1
    ) -> None:
        self.model = model
        self.lr_shift = int(lr_shift)
        self.decay = decay
        self.total_steps = max(int(total_steps), 1)
        self.steps_taken = 0

    def share(self) -> int:
        """This step's ``m`` in units of ``2^-STEP_BITS`` (integers only)."""
        if self.decay == "constant":
            return 1 << STEP_BITS
        remaining = max(self.total_steps - self.steps_taken, 0)
        return ((remaining << STEP_BITS) + self.total_steps // 2) // self.total_steps

    def step(self, grads: list[Tensor]) -> None:
        share, shift = self.share(), STEP_BITS - self.lr_shift
        for i, grad in enumerate(grads):
            scaled = grad.to(torch.int32) * share
            update = scaled << -shift if shift < 0 else integer.divide_pow2(scaled, shift)
            self.model.master(i).sub_(update).clamp_(-_MASTER_LIMIT, _MASTER_LIMIT)
        self.steps_taken += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: gradients are handed to ``step``, not accumulated."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "lr_shift": self.lr_shift,
            "decay": self.decay,
            "total_steps": self.total_steps,
            "steps_taken": self.steps_taken,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a checkpoint from before the schedule existed took constant steps
        saved = {"lr_shift": state.get("lr_shift"), "decay": state.get("decay", "constant")}
        mine: dict[str, Any] = {"lr_shift": self.lr_shift, "decay": self.decay}
        if self.decay != "constant":  # a constant step does not depend on the run's length
            saved["total_steps"], mine["total_steps"] = state.get("total_steps"), self.total_steps
        for key, value in saved.items():
            if value != mine[key]:
                raise ValueError(
                    f"the run was saved with {_STATE_NAMES[key]} = {value!r}, this one has "
                    f"{mine[key]!r}"
                )
        self.steps_taken = int(state.get("steps_taken", 0))
