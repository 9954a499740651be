"""Where a distributed worker's tensors live: the CPU under gloo, its own GPU under nccl.

Without GPUs the nccl side is proven as far as a CPU can: the device each worker
picks (and the one-line refusals), and every index an exchange uses placed on the
worker's device (torch's ``meta`` device stands in for the GPU: a CPU index mixed
into a meta tensor's gather raises, as on CUDA).
"""

from __future__ import annotations

import pytest
import torch

from qtrain.distributed.exchange import BitPlan, Layout
from qtrain.distributed.launch import check_launchable, worker_device
from qtrain.errors import RecipeError
from qtrain.recipe import build_recipe


def _recipe(backend: str, device: str) -> object:
    raw = {
        "model": {"name": "gcn"},
        "dataset": {"name": "synthetic-small"},
        "train": {"device": device},
        "distributed": {"backend": backend},
    }
    return build_recipe(raw, "devices")


def test_gloo_workers_train_on_the_cpu() -> None:
    for device in ("cpu", "auto"):
        recipe = _recipe("gloo", device)
        check_launchable(recipe)
        assert worker_device(recipe) == torch.device("cpu")


@pytest.mark.parametrize(
    ("backend", "device", "says"),
    [
        ("gloo", "cuda", "gloo workers train on the CPU; use backend = 'nccl' for GPUs"),
        ("gloo", "cuda:1", "gloo workers train on the CPU"),
        ("nccl", "cpu", "each nccl worker trains on the GPU of its local rank (cuda:LOCAL_RANK)"),
        ("nccl", "cuda:0", "use device 'cuda' or 'auto'"),
    ],
)
def test_a_device_the_backend_cannot_use_is_refused(backend: str, device: str, says: str) -> None:
    with pytest.raises(RecipeError, match=r"^train\.device = ") as refused:
        check_launchable(_recipe(backend, device))
    assert says in str(refused.value)


def test_an_nccl_worker_takes_the_gpu_of_its_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _recipe("nccl", "auto")
    check_launchable(recipe)
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert worker_device(recipe) == torch.device("cuda", 3) and chosen == [torch.device("cuda", 3)]
    monkeypatch.setenv("LOCAL_RANK", "4")
    with pytest.raises(RecipeError, match=r"LOCAL_RANK 4 needs GPU cuda:4, but torch sees 4 CUDA"):
        worker_device(recipe)


def test_every_exchange_index_lies_on_the_workers_device() -> None:
    # two peers besides this worker (rank 1): one addressed by row indices (owned rows
    # sent), one by a contiguous run (its halo rows); mixed widths force gathers
    plan = BitPlan(
        [
            torch.tensor([8, 32, 8, 2]),
            torch.zeros(0, dtype=torch.int64),
            torch.tensor([32, 32, 4]),
        ]
    )
    rows = [torch.tensor([5, 1, 7, 3]), 0, 10]
    layout = Layout.build(plan, rows, dim=6, rank=1, device=torch.device("meta"))
    segments = [seg for peer in layout.peers for seg in peer.segments]
    assert len(segments) == 5
    for seg in segments:
        assert seg.index is None or seg.index.device.type == "meta"
        assert seg.where is None or seg.where.device.type == "meta"
    source = torch.empty(20, 6, device="meta")
    for seg in segments:  # each segment's gather runs on the device (a CPU index would raise)
        if seg.index is not None:
            assert source.index_select(0, seg.index).shape == (seg.rows, 6)
    # the CPU layout is unchanged: same segments, same bytes
    cpu = Layout.build(plan, rows, dim=6, rank=1)
    assert cpu.nbytes == layout.nbytes
    assert [(s.bits, s.rows, s.start) for p in cpu.peers for s in p.segments] == [
        (s.bits, s.rows, s.start) for s in segments
    ]
