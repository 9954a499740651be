"""Distributed full-graph training: partitions and plans, messages, and runs of 2-3 workers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import require_ext

from qtrain._compat import import_dgl
from qtrain.distributed.adaptive import message_coefficients
from qtrain.distributed.exchange import (
    BitPlan,
    Layout,
    SharedGradient,
    decode_segment,
    encode_segment,
    message_bytes,
    with_halo,
)
from qtrain.distributed.partition import assign_parts, build_partition
from qtrain.distributed.trainer import OwnedParts
from qtrain.quant import rowwise

RECIPE = """
[model]
name = "gcn"
hidden = 16
dropout = 0.0

[dataset]
name = "synthetic-small"

[train]
epochs = 4
eval_every = 2

[output]
dir = "{out}"
"""


def _graph(n: int = 60, e: int = 300, seed: int = 0) -> object:
    dgl = import_dgl()
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, n, (e,), generator=g)
    return dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n))


# ------------------------------------------------------------------ partitions


def _global_edges(block: Any) -> set[tuple[int, int]]:
    """A block's edges as (source, destination) global node ids."""
    dgl = import_dgl()
    src, dst = block.edges()
    ids = (block.srcdata[dgl.NID][src].tolist(), block.dstdata[dgl.NID][dst].tolist())
    return set(zip(*ids, strict=True))


@pytest.mark.parametrize("method", ["random", "metis"])
def test_partitions_cover_the_graph_and_plans_agree(method: str) -> None:
    dgl = import_dgl()
    graph = _graph()
    world = 3
    parts = assign_parts(graph, world, method, seed=1)
    assert parts.shape == (graph.num_nodes(),) and set(parts.tolist()) <= set(range(world))
    plans = [build_partition(graph, parts, r, world) for r in range(world)]
    assert sorted(torch.cat([p.owned for p in plans]).tolist()) == list(range(graph.num_nodes()))
    src, dst = graph.edges()
    for r, part in enumerate(plans):
        # every in-edge of an owned node is in the block, with global ids on both sides
        block = part.block
        assert block.num_dst_nodes() == part.num_owned
        assert block.num_edges() == int((parts[dst] == r).sum())
        got = _global_edges(block)
        want = {(u, v) for u, v in zip(src.tolist(), dst.tolist(), strict=True) if parts[v] == r}
        assert got == want
        assert bool((parts[part.halo] != r).all())
        # overlap's two halves hold the same edges; the central half reads a prefix of the
        # owned rows and no halo row, its destinations leading its sources
        central, marginal = part.central_block, part.marginal_block
        assert (
            _global_edges(central) | _global_edges(marginal) == want
            and central.num_edges() + marginal.num_edges() == block.num_edges()
        )
        n_read = central.num_src_nodes()
        assert part.num_central <= n_read <= part.num_owned
        assert torch.equal(central.srcdata[dgl.NID], part.owned[:n_read])
        assert torch.equal(central.dstdata[dgl.NID], part.owned[: part.num_central])
        assert torch.equal(marginal.dstdata[dgl.NID], part.owned[part.num_central :])
        assert bool((parts[central.srcdata[dgl.NID]] == r).all())
        marginal_srcs = set(marginal.srcdata[dgl.NID][marginal.edges()[0]].tolist())
        assert set(part.halo.tolist()) <= marginal_srcs
        # what r sends p is what p receives from r, in the same order
        for p in range(world):
            sent = part.owned[part.send_index[p]]
            start = sum(plans[p].recv_counts[:r])
            received = plans[p].halo[start : start + plans[p].recv_counts[r]]
            assert torch.equal(sent, received), (r, p)


def test_one_worker_owns_everything_and_bad_partitioner_is_named() -> None:
    graph = _graph()
    parts = assign_parts(graph, 1, "metis")
    part = build_partition(graph, parts, 0, 1)
    assert part.num_owned == graph.num_nodes() and part.halo.numel() == 0
    with pytest.raises(ValueError, match="partition must be one of metis, random"):
        assign_parts(graph, 2, "spectral")


@pytest.mark.parametrize("how", ["both", "mean"])
def test_message_coefficients_sum_the_readers_alphas(how: str) -> None:
    graph = _graph(n=40, e=200, seed=3)
    world = 3
    parts = assign_parts(graph, world, "random", seed=2)
    plans = [build_partition(graph, parts, r, world) for r in range(world)]
    src, dst = (t.tolist() for t in graph.edges())
    d_in = graph.in_degrees().float().clamp(min=1).tolist()
    d_out = graph.out_degrees().float().clamp(min=1).tolist()

    def alpha2(u: int, v: int) -> float:
        return 1 / (d_out[u] * d_in[v]) if how == "both" else 1 / d_in[v] ** 2

    for r, part in enumerate(plans):
        send, recv = message_coefficients(graph, parts, part, how)
        for p in range(world):
            for k, got in zip(
                part.owned[part.send_index[p]].tolist(), send[p].tolist(), strict=True
            ):
                want = sum(
                    alpha2(u, v) for u, v in zip(src, dst, strict=True) if u == k and parts[v] == p
                )
                assert got == pytest.approx(want)
        # the halo rows' coefficients are their owner's forward message's
        start = 0
        for p in range(world):
            halo = part.halo[start : start + part.recv_counts[p]]
            sent = message_coefficients(graph, parts, plans[p], how)[0][r]
            assert torch.allclose(recv[p], sent)
            assert torch.equal(plans[p].owned[plans[p].send_index[r]], halo)
            start += part.recv_counts[p]


# ------------------------------------------------------------------ messages


def _one_peer_layout(plan: BitPlan, rows: torch.Tensor | int, dim: int) -> Layout:
    """Rank 1's layout of a message to rank 0 (rank 1's own entry stays empty)."""
    return Layout.build(plan, [rows, 0], dim, rank=1)


@pytest.mark.parametrize("bits", [2, 4, 8, 32])
@pytest.mark.parametrize("shape", [(7, 5), (1, 1), (0, 3), (33, 17)])
def test_messages_round_trip_within_one_level(bits: int, shape: tuple[int, int]) -> None:
    if bits != 32:
        require_ext()  # the reference quantizer is slow but exact; ext keeps this test quick
    x = torch.randn(*shape)
    if shape[0] > 2:
        x[1] = 0.0  # a zero row
        x[2] = 3.0  # a constant row
    layout = _one_peer_layout(BitPlan.uniform([shape[0], 0], bits), 0, shape[1])
    (seg,) = layout.peers[0].segments or (None,)
    assert layout.peers[0].nbytes == message_bytes(*shape, bits)
    assert layout.peers[0].direct == (bits == 32 and shape[0] > 0)  # the rows go on the wire
    if seg is None:
        return
    buf = torch.zeros(layout.nbytes, dtype=torch.uint8)
    encode_segment(x, seg, buf, seed=1, offset=0)
    y = torch.full(shape, float("nan"))
    decode_segment(buf, seg, y, add=False)
    if bits == 32:
        assert torch.equal(y, x)
    else:
        # one level of the row's range, widened by the bfloat16 rounding of zero and range
        span = x.amax(1) - x.amin(1) + 2**-6 * x.abs().amax(1)
        step = span / (2**bits - 1)
        assert bool(((y - x).abs() <= step[:, None] + 1e-6).all())
        if shape[0] > 2:
            assert torch.equal(y[1], x[1]) and torch.equal(y[2], x[2])


@pytest.mark.parametrize("add", [False, True])
def test_mixed_width_messages_land_on_their_rows(add: bool) -> None:
    """A message over indexed rows with every width, decoded onto a contiguous run (the
    halo, forward) or added onto indexed rows (owned gradients, backward), equals
    quantizing each width's rows by the reference and placing them by hand."""
    require_ext()
    g = torch.Generator().manual_seed(3)
    source = torch.randn(40, 19, generator=g)
    source[5] = 2.5  # a constant row
    sent = torch.randperm(40, generator=g)[:23]  # the rows of this message, in plan order
    plan = BitPlan([torch.tensor([32, 8, 4, 2] * 5 + [8, 2, 2]), torch.empty(0, dtype=torch.int64)])
    send = _one_peer_layout(plan, sent, 19)
    assert [s.bits for s in send.peers[0].segments] == [32, 8, 4, 2]
    received_at = torch.randperm(30, generator=g)[:23] if add else 4
    recv = _one_peer_layout(plan, received_at, 19)
    buf = torch.zeros(send.nbytes, dtype=torch.uint8)
    offset = 1000
    for seg in send.peers[0].segments:
        encode_segment(source, seg, buf, seed=9, offset=offset)
        offset += seg.rows * 19
    dest = torch.randn(30, 19, generator=g)
    expect = dest.clone()
    offset = 1000
    for seg in recv.peers[0].segments:
        decode_segment(buf, seg, dest, add=add)
        rows = source[sent[seg.where]]
        if seg.bits != 32:
            q = rowwise.quantize_rows(rows, seg.bits, "stochastic", 9, offset)
            rows = rowwise.dequantize_rows(*q, seg.bits, 19)
        offset += seg.rows * 19
        at = received_at[seg.where] if add else 4 + seg.where
        expect[at] = expect[at] + rows if add else rows
    assert torch.equal(dest, expect)


def test_traced_ranges_come_from_the_encoded_message() -> None:
    """The assigner's row ranges, in plan order: exact for 32-bit rows, for the others the
    range their segment stored (the one their quantization step is made of)."""
    require_ext()
    from qtrain.distributed.exchange import _row_ranges

    source = torch.randn(12, 9) * torch.arange(1, 13).float()[:, None]
    sent = torch.tensor([11, 3, 5, 0, 7, 2])
    plan = BitPlan([torch.tensor([2, 32, 8, 4, 32, 2]), torch.empty(0, dtype=torch.int64)])
    layout = _one_peer_layout(plan, sent, 9)
    buf = torch.zeros(layout.nbytes, dtype=torch.uint8)
    for seg in layout.peers[0].segments:
        encode_segment(source, seg, buf, seed=0, offset=0)
    got = _row_ranges(source, layout.peers[0], buf)
    exact = source[sent].amax(1) - source[sent].amin(1)
    assert torch.equal(got[[1, 4]], exact[[1, 4]])
    quantized = [0, 2, 3, 5]
    stored = rowwise.quantize_rows(source[sent[quantized]], 2, "nearest")[2].float()
    assert torch.equal(got[quantized], stored) and bool((stored >= exact[quantized]).all())


def test_bit_plan_groups_rows_by_width() -> None:
    plan = BitPlan([torch.tensor([8, 2, 8, 32]), torch.empty(0, dtype=torch.int64)])
    segments = plan.segments(0)
    assert [b for b, _ in segments] == [32, 8, 2]  # float32 rows first: they decode as a view
    assert [w.tolist() for _, w in segments] == [[3], [0, 2], [1]]
    assert plan.segments(1) == []
    assert BitPlan.uniform([3], 4).segments(0) == [(4, None)]  # one width: no gather
    assert [t.tolist() for t in BitPlan.uniform([2, 0], 4).per_peer] == [[4, 4], []]


@pytest.mark.parametrize(("n_central", "n_read"), [(3, 7), (0, 0), (0, 10), (10, 10), (4, 4)])
@pytest.mark.parametrize("used", ["both", "read", "rest"])
def test_owned_parts_gradient_is_that_of_two_slices(n_central: int, n_read: int, used: str) -> None:
    """Overlap's halves read overlapping parts of the owned rows (GCN's marginal half
    reads no destination rows, so one part may get no gradient)."""
    x = torch.randn(10, 5, dtype=torch.float64)
    w_read, w_rest = (
        torch.randn(n_read, 5, dtype=x.dtype),
        torch.randn(10 - n_central, 5, dtype=x.dtype),
    )

    def grad(parts: Any) -> torch.Tensor:
        leaf = x.clone().requires_grad_()
        read, rest = parts(leaf)
        assert torch.equal(read, x[:n_read]) and torch.equal(rest, x[n_central:])
        loss = leaf.sum() * 0  # a gradient also when neither part is used
        if used in ("both", "read"):
            loss = loss + (read * w_read).sum()
        if used in ("both", "rest"):
            loss = loss + (rest * w_rest).sum()
        loss.backward()
        return leaf.grad

    expected = grad(lambda t: (t[:n_read], t[n_central:]))
    torch.testing.assert_close(grad(lambda t: OwnedParts.apply(t, n_read, n_central)), expected)
    with pytest.raises(ValueError, match="n_central <= n_read"):
        OwnedParts.apply(x, 2, 3)


class _LoopbackMessenger:
    """A worker's messenger without peers: fixed halo rows come in, and the halo rows'
    gradients it is given are answered by fixed gradients for the owned rows."""

    def __init__(self, halo: torch.Tensor, returned: torch.Tensor) -> None:
        self.halo, self.returned = halo, returned
        self.posted = self.finished = 0

    def fetch_halo(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        return torch.cat([x, self.halo])

    def post_grads(self, grad_rows: torch.Tensor, layer: int, overlap: bool = True) -> Any:
        self.posted += 1
        owned = self.returned.shape[0]
        return SimpleNamespace(dest=grad_rows[:owned].reshape(owned, -1).clone())

    def finish_grads(self, pending: Any, dtype: torch.dtype) -> torch.Tensor:
        self.finished += 1
        return pending.dest.add_(self.returned.reshape(pending.dest.shape)).to(dtype)

    def return_grads(self, grad_rows: torch.Tensor, layer: int) -> torch.Tensor:
        return self.finish_grads(self.post_grads(grad_rows, layer), grad_rows.dtype)


@pytest.mark.parametrize("halo_first", [False, True])
@pytest.mark.parametrize("used", ["both", "read", "rest"])
def test_shared_gradient_is_the_sum_of_both_readers(halo_first: bool, used: str) -> None:
    """Overlap's halves share one gradient of the owned rows: whichever of OwnedParts and
    WithHalo runs backward first (autograd runs the later-made one first), the owned rows'
    gradient is that of the plain slices plus what the halo's owners send back, and the
    halo gradients' return is started and finished once."""
    owned, n_central, n_read = 9, 3, 6
    x = torch.randn(owned, 4, dtype=torch.float64)
    halo, returned = torch.randn(5, 4, dtype=x.dtype), torch.randn(owned, 4, dtype=x.dtype)
    w_read, w_rest = (
        torch.randn(n_read, 4, dtype=x.dtype),
        torch.randn(owned - n_central, 4, dtype=x.dtype),
    )
    w_rows = torch.randn(owned + 5, 4, dtype=x.dtype)

    def grad(shared: bool) -> torch.Tensor:
        leaf = x.clone().requires_grad_()
        messenger = _LoopbackMessenger(halo, returned)
        link = SharedGradient(messenger) if shared else None  # type: ignore[arg-type]

        def rows() -> torch.Tensor:
            return with_halo(leaf, messenger, 1, None, link)  # type: ignore[arg-type]

        first = rows() if halo_first else None
        read, rest = OwnedParts.apply(leaf, n_read, n_central, link)
        source = first if first is not None else rows()
        loss = (source * w_rows).sum()
        if used in ("both", "read"):
            loss = loss + (read * w_read).sum()
        if used in ("both", "rest"):
            loss = loss + (rest * w_rest).sum()
        loss.backward()
        assert (messenger.posted, messenger.finished) == (1, 1)
        if link is not None:
            assert link.pending is None and link.local is None
        return leaf.grad

    expected = w_rows[:owned] + returned
    if used in ("both", "read"):
        expected[:n_read] += w_read
    if used in ("both", "rest"):
        expected[n_central:] += w_rest
    torch.testing.assert_close(grad(shared=False), expected)
    torch.testing.assert_close(grad(shared=True), expected)


# ------------------------------------------------------------------ runs


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "gcn.toml"
    path.write_text(RECIPE.format(out=tmp_path / "runs"))
    return path


def _qtrain(recipe: Path, *sets: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    args = [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "QTRAIN_DATA_DIR": str(recipe.parent / "data")}
    return subprocess.run(
        [sys.executable, "-m", "qtrain", "run", str(recipe), "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _summary(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_workers_unquantized_equal_one_process_and_quantized_send_less(recipe: Path) -> None:
    drop = ("model.dropout=0.5", "model.input_dropout=0.2")  # masks keyed by global node id
    single = _summary(_qtrain(recipe, *drop))
    two = _summary(_qtrain(recipe, *drop, "distributed.world_size=2"))
    # the same computation: only the float summation order of the aggregation may differ
    assert two["final_loss"] == pytest.approx(single["final_loss"], rel=1e-5)
    assert two["test_acc"] == pytest.approx(single["test_acc"], abs=1e-6)
    info = two["distributed"]
    assert info["world_size"] == 2 and min(info["halo_nodes"]) > 0
    assert sum(info["owned_nodes"]) == two["num_nodes"]
    assert all(0 <= c <= n for c, n in zip(info["central_nodes"], info["owned_nodes"], strict=True))
    assert info["comm_bytes_per_epoch"] > 0
    assert set(info["time_per_epoch_s"]) >= {"communication", "quantization", "computation"}
    assert info["bits_histogram"] == {
        "layer1.forward": {"32": info["bits_histogram"]["layer1.forward"]["32"]},
        "layer1.backward": {"32": info["bits_histogram"]["layer1.backward"]["32"]},
    }
    # overlapping the central nodes with the halo transfer changes nothing either
    overlapped = _summary(
        _qtrain(recipe, *drop, "distributed.world_size=2", "distributed.overlap=true")
    )
    assert overlapped["final_loss"] == pytest.approx(single["final_loss"], rel=1e-5)
    run_dir = Path(two["run_dir"])
    assert (run_dir / "summary.json").exists() and (run_dir / "metrics.jsonl").exists()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    require_ext()
    low = _summary(_qtrain(recipe, *drop, "distributed.world_size=2", "distributed.message_bits=2"))
    assert low["distributed"]["comm_bytes_per_epoch"] <= info["comm_bytes_per_epoch"] / 5
    assert low["final_loss"] == pytest.approx(single["final_loss"], rel=0.05)


def test_sage_workers_with_and_without_overlap_equal_one_process(recipe: Path) -> None:
    """SAGE reads the destination rows apart (the worker passes its owned rows as them)."""
    sage = ('model.name="sage"', "model.dropout=0.5", "train.epochs=3")
    single = _summary(_qtrain(recipe, *sage))
    for overlap in ("false", "true"):
        two = _summary(
            _qtrain(recipe, *sage, "distributed.world_size=2", f"distributed.overlap={overlap}")
        )
        assert two["final_loss"] == pytest.approx(single["final_loss"], rel=1e-5)
        assert two["test_acc"] == pytest.approx(single["test_acc"], abs=1e-6)


def test_workers_on_the_device_route_equal_one_process(recipe: Path) -> None:
    """The route (what a GPU worker runs) on the CPU: halo rows, blocks, both halves of an
    overlapped layer and 8-bit messages go through qtrain's kernels, with DGL's losses."""
    route = ('train.graph_kernels="qtrain"', "train.epochs=3")
    single = _summary(_qtrain(recipe, "train.epochs=3"))
    two = _summary(_qtrain(recipe, *route, "distributed.world_size=2", "distributed.overlap=true"))
    assert two["graph_kernels"] == "qtrain"
    assert two["final_loss"] == pytest.approx(single["final_loss"], rel=1e-5)
    require_ext()
    low = _summary(
        _qtrain(recipe, *route, "distributed.world_size=2", "distributed.message_bits=8")
    )
    assert low["final_loss"] == pytest.approx(single["final_loss"], rel=0.02)


def test_tango_runs_its_quantized_kernels_on_every_worker(recipe: Path) -> None:
    """The tango plugin patches each worker's DGL, overlap's two halves included (every
    primitive quantized: this graph is below the sizes where int8 pays on a CPU)."""
    require_ext()
    tango = (
        'quant.plugin=["tango"]',
        "quant.tango.fp32_when_small=false",
        "distributed.overlap=true",
    )
    single = _summary(_qtrain(recipe, *tango))
    two = _summary(_qtrain(recipe, *tango, "distributed.world_size=2"))
    assert two["distributed"]["world_size"] == 2 and two["plugins"] == ["tango"]
    for primitive in ("gemm", "spmm"):  # rank 0's kernel counts
        assert two["kernels"][primitive].get("ext-cpu", 0) > 0, two["kernels"]
    # stochastic rounding draws differ per worker, so the losses are close, not equal
    assert two["final_loss"] == pytest.approx(single["final_loss"], rel=0.02)


def test_auto_bits_calibrate_on_the_whole_graph_on_every_worker(recipe: Path) -> None:
    """Each worker holds the whole graph and the same model: its calibration step is the
    single process's, so the workers train at the count one process would pick."""
    require_ext()
    auto = (
        'quant.plugin=["tango"]',
        "quant.tango.fp32_when_small=false",
        'quant.tango.bits="auto"',
    )
    single = _summary(_qtrain(recipe, *auto))["plugin_reports"]["tango"]
    two = _summary(_qtrain(recipe, *auto, "distributed.world_size=2"))["plugin_reports"]["tango"]
    for measure in ("error_x", "gradient_error"):  # float sums in another order per worker
        assert two["calibration"][measure] == pytest.approx(
            single["calibration"][measure], rel=1e-3
        )
    assert two["bits"] == single["bits"] == single["calibration"]["bits"] < 8


def test_adaptive_bits_are_assigned_by_rank_0_and_reported(recipe: Path) -> None:
    require_ext()
    done = _qtrain(
        recipe,
        "distributed.world_size=2",
        'distributed.message_bits="adaptive"',
        "distributed.reassign_period=2",
        "distributed.group_size=16",
        "train.epochs=5",
    )
    info = _summary(done)["distributed"]
    assert info["message_bits"] == "adaptive"
    assert info["assignments"] == 2  # before epochs 2 and 4
    assert info["solver_seconds"] > 0
    widths = {b for layer in info["bits_histogram"].values() for b in layer}
    assert "8" in widths and widths <= {"2", "4", "8"}


def test_refused_before_any_worker_starts(recipe: Path) -> None:
    done = _qtrain(recipe, "distributed.world_size=2", 'model.name="gcnii"')
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        "qtrain: error: model 'gcnii' does not run on blocks, so it cannot train distributed; "
        "use gcn, sage or gat"
    )
    done = _qtrain(recipe, "distributed.world_size=2", 'train.mode="minibatch"')
    assert done.returncode == 2 and "distributed training is full-graph" in done.stderr
    done = _qtrain(recipe, "distributed.world_size=2", 'train.device="cuda"')
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "qtrain: error: train.device = 'cuda' with distributed.backend = 'gloo': gloo workers "
        "train on the CPU; use backend = 'nccl' for GPUs (one per worker) or device 'cpu'"
    )


def test_a_run_shows_rank_0s_progress_only_and_logs_every_worker(recipe: Path) -> None:
    """The elastic agent adds nothing to the terminal or the run directory."""
    done = _qtrain(recipe, "distributed.world_size=2", "train.epochs=2")
    run_dir = Path(_summary(done)["run_dir"])
    rank0 = (run_dir / "worker-0.log").read_text().splitlines()
    assert any(line.startswith("epoch    2/2") for line in rank0), rank0
    assert done.stderr.splitlines() == rank0  # progress, and no line of the agent's
    assert (run_dir / "worker-1.log").is_file()
    expected = {"recipe.toml", "metrics.jsonl", "summary.json", "worker-0.log", "worker-1.log"}
    expected |= {"checkpoint.pt", "resume.pt", "curves.csv", "curves.png"}
    assert {p.name for p in run_dir.iterdir()} <= expected


def test_a_worker_that_refuses_its_input_ends_the_run_with_one_line(recipe: Path) -> None:
    """Each worker reads the dataset itself: a missing one is refused by the workers (exit
    status 2), and the launcher says so once, quoting the worker's own line."""
    (recipe.parent / "data").mkdir()
    done = _qtrain(recipe, "distributed.world_size=2", 'dataset.name="cora"')
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("qtrain: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert re.fullmatch(
        r"qtrain: error: worker rank [01] exited with status 2: dataset 'cora': the folder "
        r".* does not exist; .*; the other workers were stopped and (.*) keeps what rank 0 "
        r"wrote",
        errors[0],
    ), errors[0]
    (run_dir,) = (recipe.parent / "runs").iterdir()
    for rank in (0, 1):  # each worker's own error is in its log
        assert "qtrain: error: dataset 'cora'" in (run_dir / f"worker-{rank}.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "exited with status 2" in summary["error"]


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    kids = [int(x) for x in out.stdout.split()]
    return kids + [k for kid in kids for k in _descendants(kid)]


def test_a_killed_worker_ends_the_run_naming_its_rank(recipe: Path) -> None:
    env = {**os.environ, "QTRAIN_DATA_DIR": str(recipe.parent / "data")}
    sets = ["--set", "distributed.world_size=3", "--set", "train.epochs=1000000"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "qtrain", "run", str(recipe), *sets],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        runs = recipe.parent / "runs"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # wait until rank 0 has trained an epoch
            metrics = list(runs.glob("*/metrics.jsonl"))
            if metrics and metrics[0].read_text().strip():
                break
            assert launcher.poll() is None, launcher.communicate()[1]
            time.sleep(0.2)
        workers = sorted(_descendants(launcher.pid))
        assert len(workers) == 3
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = launcher.communicate(timeout=60)
        assert time.monotonic() - killed_at < 60
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("qtrain: error: worker rank 1 was killed by SIGKILL"), err[-2000:]
    assert "keeps what rank 0 wrote" in last
    assert not [w for w in workers if _alive(w)]


def test_workers_die_with_a_launcher_killed_outright(recipe: Path) -> None:
    """SIGKILL cannot be passed on: the workers' parent-death signal (SIGTERM) stops them,
    and rank 0 ends the summary "interrupted" itself."""
    env = {**os.environ, "QTRAIN_DATA_DIR": str(recipe.parent / "data")}
    sets = ["--set", "distributed.world_size=2", "--set", "train.epochs=1000000"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "qtrain", "run", str(recipe), *sets],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    workers: list[int] = []
    try:
        runs = recipe.parent / "runs"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # wait until rank 0 has trained an epoch
            metrics = list(runs.glob("*/metrics.jsonl"))
            if metrics and metrics[0].read_text().strip():
                break
            assert launcher.poll() is None
            time.sleep(0.2)
        workers = _descendants(launcher.pid)
        assert len(workers) == 2
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
    assert not [w for w in workers if _alive(w)]
    summary = json.loads((metrics[0].parent / "summary.json").read_text())
    assert summary["status"] == "interrupted"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_more_local_workers_than_the_machine_holds_are_refused(tmp_path: Path) -> None:
    from qtrain.distributed.launch import WORKERS_PER_CORE
    from qtrain.errors import RecipeError
    from qtrain.recipe import build_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    too_many = WORKERS_PER_CORE * (os.cpu_count() or 1) + 1
    raw = {
        "model": {"name": "gcn", "hidden": 8},
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": 1},
        "distributed": {"world_size": too_many},
        "output": {"dir": str(tmp_path / "runs")},
    }
    with pytest.raises(RecipeError, match=rf"world_size = {too_many}: this machine .* at most"):
        execute(build_recipe(raw, "many"), reporter=Reporter())
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_distributed_run_keeps_its_summary_and_checkpoint(
    recipe: Path, how: str
) -> None:
    """Ctrl-C (the shell's process group) and SIGTERM (a scheduler) reach the launcher
    only: the elastic agent starts each worker in a session of its own, and passes the
    signal on to them. Either way the summary ends "interrupted" (written by rank 0, or by
    the launcher when rank 0 was stuck in a collective whose peer had gone) and the last
    checkpoint stays."""
    env = {**os.environ, "QTRAIN_DATA_DIR": str(recipe.parent / "data")}
    sets = ["--set", "distributed.world_size=2", "--set", "train.epochs=1000000"]
    sets += ["--set", "output.checkpoint_every=1"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "qtrain", "run", str(recipe), *sets],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a shell gives a command
    )
    try:
        runs = recipe.parent / "runs"
        deadline = time.monotonic() + 300
        metrics: list[Path] = []
        while time.monotonic() < deadline:  # wait until rank 0 has written a checkpoint
            metrics = list(runs.glob("*/metrics.jsonl"))
            if metrics and (metrics[0].parent / "checkpoint.pt").exists():
                break
            assert launcher.poll() is None, launcher.communicate()[1]
            time.sleep(0.2)
        assert metrics, "rank 0 never wrote an epoch"
        if how == "ctrl-c":
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, err[-2000:]
    run_dir = metrics[0].parent
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary.get("error")
    assert (run_dir / "checkpoint.pt").exists()
