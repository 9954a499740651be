"""AdaQP's adaptive bit widths at run time: trace, gather, solve on rank 0, scatter.

Until statistics exist every message travels at 8 bits (adaqp-mlsys23 §3.3).
Before training, every pair of workers times ring transfers of a few sizes,
each round started together after a barrier (:func:`calibrate_links`): the
round times inside training also hold the wait for a slower peer, which
says nothing about what a bit costs. The messenger records, for every
exchange and peer, the range of each row it sent. Every ``reassign_period``
epochs (from the second epoch on) each worker turns its rows into variance
proxies (eq. 11's beta: the sum of squared aggregation coefficients of the
message's readers on the target worker, times the width, times the squared
range, over 6) and sends them with its calibration to rank 0. Rank 0 fits
each device pair's cost model (eq. 10's theta and gamma), solves eq. 12
(``qtrain.distributed.assign``) for every exchange and ring round, and sends every
worker the bits of what it sends and receives. The solver's time is part of
the epoch it runs in.

Aggregation coefficients come from the model's aggregator: GCN's symmetric
normalisation ``1 / sqrt(d_out(u) d_in(v))``, and ``1 / d_in(v)`` for the
mean-like ones (SAGE's mean, GAT's attention as its average).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from qtrain.distributed.assign import (
    AssignmentProblem,
    assign_bits,
    fit_cost_model,
    group_messages,
    group_sums,
    variance_proxy,
)
from qtrain.distributed.exchange import BitPlan
from qtrain.distributed.partition import Partition

START_BITS = 8
SOLVER_TIME_LIMIT_S = 2.0  # per problem; the best assignment found by then is used
# Stop once within 1 % of the optimum. On the 144 problems of two 4-worker arxiv runs
# (GCN, SAGE; about 1,130 groups each; dumped from the runs and solved one by one by a
# script not kept in the repository) 1e-3 took 16.1 s (0.80 s for the hardest one) and
# 1e-2 10.6 s (0.11 s), at most 0.7 % (mean 0.05 %) worse by the scaled objective: less
# than the cost model's own error, and the other workers wait for every solve.
SOLVER_GAP = 1e-2
CALIBRATION_BYTES = (1 << 16, 1 << 20, 1 << 23)
CALIBRATION_REPEATS = 3


def calibrate_links(
    world: int, rank: int, group: Any = None, device: torch.device | None = None
) -> dict[int, list[tuple[int, float]]]:
    """``(bits sent, seconds)`` samples per peer this worker sends to, from timed ring rounds.

    Each round starts after a barrier, so a sample is the transfer, not a
    wait for a peer still computing. Every worker must call this. The buffers live
    where the exchanges' do (``device``: the worker's GPU under nccl).
    """
    samples: dict[int, list[tuple[int, float]]] = {}
    for size in CALIBRATION_BYTES:
        out = torch.zeros(size, dtype=torch.uint8, device=device)
        into = torch.empty(size, dtype=torch.uint8, device=device)
        for i in range(1, world):
            to, source = (rank + i) % world, (rank - i) % world
            for _ in range(CALIBRATION_REPEATS):
                dist.barrier(group=group)
                start = time.perf_counter()
                requests = [
                    dist.isend(out, to, group=group),
                    dist.irecv(into, source, group=group),
                ]
                for request in requests:
                    request.wait()
                samples.setdefault(to, []).append((8 * size, time.perf_counter() - start))
    return samples


def aggregation(model_name: str) -> str:
    """``"both"`` for GCN's symmetric normalisation, else ``"mean"``."""
    return "both" if model_name == "gcn" else "mean"


def message_coefficients(
    graph: Any, parts: torch.Tensor, part: Partition, how: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Sum of alpha^2 over each message's readers on its target worker.

    Returns ``(send, recv)``: ``send[p]`` for the rows this worker sends ``p``
    in forward (its nodes that ``p`` reads), ``recv[p]`` for its halo rows
    from ``p`` (whose gradients it sends back to ``p``); the readers of both
    are the same edges, so the values match the forward message's.
    """
    src, dst = (t.to(torch.int64).cpu() for t in graph.edges())
    parts = parts.cpu()
    deg_in = graph.in_degrees().float().clamp(min=1).cpu()
    deg_out = graph.out_degrees().float().clamp(min=1).cpu()
    cross = parts[src] != parts[dst]
    s, d = src[cross], dst[cross]
    coef = 1.0 / (deg_out[s] * deg_in[d]) if how == "both" else 1.0 / deg_in[d] ** 2
    world = part.world_size
    keys, inverse = torch.unique(s * world + parts[d], return_inverse=True)
    sums = torch.zeros(keys.numel(), dtype=torch.float64).index_add_(0, inverse, coef.double())

    def lookup(nodes: torch.Tensor, reader: int) -> torch.Tensor:
        if nodes.numel() == 0:
            return torch.zeros(0, dtype=torch.float64)
        wanted = nodes * world + reader
        at = torch.searchsorted(keys, wanted).clamp(max=max(keys.numel() - 1, 0))
        found = keys[at] == wanted
        return torch.where(found, sums[at], torch.zeros((), dtype=torch.float64))

    send = [lookup(part.owned[idx], p) for p, idx in enumerate(part.send_index)]
    starts = np.cumsum([0, *part.recv_counts])
    recv = [lookup(part.halo[starts[p] : starts[p + 1]], part.rank) for p in range(world)]
    return send, recv


class AdaptiveBits:
    """One worker's bit plans, 8 bits until rank 0's first assignment."""

    def __init__(
        self,
        part: Partition,
        coefficients: tuple[list[torch.Tensor], list[torch.Tensor]],
        *,
        lam: float,
        group_size: int,
        period: int,
        device: torch.device | None = None,
    ) -> None:
        self.part = part
        self.send_alpha2, self.recv_alpha2 = coefficients
        self.lam, self.group_size, self.period = lam, group_size, period
        self.links = calibrate_links(part.world_size, part.rank, device=device)
        self._plans: dict[tuple[int, str], tuple[BitPlan, BitPlan]] = {}
        self._start = (  # every exchange until the first assignment
            BitPlan.uniform(part.send_counts, START_BITS),
            BitPlan.uniform(part.recv_counts, START_BITS),
        )
        self.solve_seconds = 0.0
        self.assignments = 0

    def plan(self, layer: int, direction: str) -> tuple[BitPlan, BitPlan]:
        """(bits of the forward-sent rows, bits of the forward-received rows) of an exchange."""
        return self._plans.get((layer, direction), self._start)

    def due(self, epoch: int) -> bool:
        """Whether to reassign before 1-based ``epoch`` (statistics exist from epoch 2 on)."""
        return epoch >= 2 and (epoch - 2) % self.period == 0

    def reassign(self, stats: Any) -> None:
        """Gather statistics on rank 0, solve, scatter the plans (every worker calls this)."""
        rank, world = self.part.rank, self.part.world_size
        mine: dict[tuple[str, int], np.ndarray] = {}
        for (tag, peer), ranges in stats.ranges.items():
            alpha2 = (self.send_alpha2 if tag.endswith("forward") else self.recv_alpha2)[peer]
            dim = stats.dims[tag]
            beta = variance_proxy(alpha2, dim, torch.zeros_like(alpha2), ranges.double())
            mine[(tag, peer)] = (beta.numpy(), dim)
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object((mine, self.links), gathered, dst=0)
        plans: list[Any] = [None]
        todo = self._solve(gathered) if rank == 0 else None
        dist.scatter_object_list(plans, todo, src=0)
        result = plans[0]
        for tag in {t for t, _ in result["send"]} | {t for t, _ in result["recv"]}:
            layer, direction = int(tag.split(".")[0][len("layer") :]), tag.split(".")[1]
            sent = self._per_peer(result["send"], tag, direction == "forward")
            got = self._per_peer(result["recv"], tag, direction != "forward")
            if direction == "forward":
                self._plans[(layer, direction)] = (sent, got)
            else:  # backward sends over the halo rows and receives over the owned ones
                self._plans[(layer, direction)] = (got, sent)
        self.solve_seconds += result["solve_seconds"]
        self.assignments += 1

    def _per_peer(self, table: dict[tuple[str, int], np.ndarray], tag: str, owned: bool) -> BitPlan:
        counts = self.part.send_counts if owned else self.part.recv_counts
        return BitPlan(
            [
                torch.as_tensor(table[(tag, p)], dtype=torch.int64)
                if (tag, p) in table
                else torch.full((n,), START_BITS, dtype=torch.int64)
                for p, n in enumerate(counts)
            ]
        )

    def _solve(self, gathered: list[Any]) -> list[dict[str, Any]]:
        """Rank 0: eq. 12 per exchange and ring round; what each worker sends and receives.
        ``solve_seconds`` is the wall time of solving them all."""
        world = len(gathered)
        out: list[dict[str, Any]] = [
            {"send": {}, "recv": {}, "solve_seconds": 0.0} for _ in range(world)
        ]
        theta = np.zeros((world, world))
        gamma = np.zeros((world, world))
        for s, (_, samples) in enumerate(gathered):
            for p, pairs in samples.items():
                if pairs:
                    bits, secs = zip(*pairs, strict=True)
                    theta[s, p], gamma[s, p] = fit_cost_model(list(bits), list(secs))
        tags = sorted({tag for mine, _ in gathered for tag, _ in mine})
        problems: list[tuple[AssignmentProblem, list[tuple[int, int, torch.Tensor, int]], str]] = []
        for tag in tags:
            for i in range(1, world):
                betas, values, pairs, members = [], [], [], []
                for s in range(world):
                    p = (s + i) % world
                    entry = gathered[s][0].get((tag, p))
                    if entry is None or entry[0].size == 0:
                        continue
                    beta, dim = torch.as_tensor(entry[0]), entry[1]
                    _, group_ids = group_messages(beta, self.group_size)
                    groups = int(group_ids.max()) + 1
                    betas.append(group_sums(beta, group_ids, groups).numpy())
                    counts = group_sums(torch.ones_like(beta), group_ids, groups).numpy()
                    values.append(counts * dim)
                    pairs.append(np.full(groups, s, dtype=np.int64))
                    members.append((s, p, group_ids, groups))
                if not members:
                    continue
                problem = AssignmentProblem(
                    beta=np.concatenate(betas),
                    values=np.concatenate(values),
                    pair=np.concatenate(pairs),
                    theta=np.array([theta[s, (s + i) % world] for s in range(world)]),
                    gamma=np.array([gamma[s, (s + i) % world] for s in range(world)]),
                    lam=self.lam,
                )
                problems.append((problem, members, tag))
        # HiGHS releases the GIL, and every other worker on this machine is waiting for
        # the result: the problems (one per exchange and ring round) are solved side by
        # side on the machine's cores. HiGHS may print to file descriptor 1: the CLI
        # points it at stderr.
        start = time.perf_counter()
        with ThreadPoolExecutor(
            max_workers=max(1, min(len(problems), os.cpu_count() or 1))
        ) as pool:
            solutions = list(
                pool.map(
                    lambda job: assign_bits(
                        job[0], mip_rel_gap=SOLVER_GAP, time_limit=SOLVER_TIME_LIMIT_S
                    ),
                    problems,
                )
            )
        seconds = time.perf_counter() - start
        for (_, members, tag), solution in zip(problems, solutions, strict=True):
            at = 0
            for s, p, group_ids, groups in members:
                bits = np.asarray(solution.bits[at : at + groups])[group_ids.numpy()]
                at += groups
                out[s]["send"][(tag, p)] = bits
                out[p]["recv"][(tag, s)] = bits
        for entry in out:
            entry["solve_seconds"] = seconds
        return out
