"""The graph a run trains on: full-graph runs hold it in int32 and train as they did on
the loaded int64 graph."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from qtrain.plugin import PatchSession, PluginContext
from qtrain.recipe import Recipe, build_recipe
from qtrain.train import prepare
from qtrain.train.loop import Trainer
from qtrain.train.prepare import as_int32, prepared


def small_recipe(model: str, mode: str = "full", plugins: tuple[str, ...] = ()) -> Recipe:
    raw: dict[str, Any] = {
        "model": {"name": model, "hidden": 8},
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": 2, "mode": mode, "threads": 1},
        "quant": {"plugin": list(plugins)},
    }
    if mode == "minibatch":
        raw["train"]["fanouts"] = [5, 5]
    return build_recipe(raw, "tiny")


def losses(recipe: Recipe, steps: int = 3) -> tuple[list[float], Any]:
    """The loss of each of ``steps`` full-graph steps, and the graph they ran on."""
    with prepared(recipe) as (dataset, graph, model, device):
        session = PatchSession(recipe.quant, PluginContext(seed=0, device=device, model=model))
        trainer = Trainer(model, graph, metric=dataset.metric, config=recipe.train, device=device)
        with session:
            return [trainer.train_epoch()[0] for _ in range(steps)], graph


def test_a_full_graph_run_holds_int32_ids_once() -> None:
    with prepared(small_recipe("sage")) as (dataset, graph, _model, _device):
        assert graph.idtype == torch.int32
        # GraphSAGE adds no self-loops: the dataset holds that same structure, not an
        # int64 copy beside it
        assert dataset.graph is graph
        assert graph.ndata["feat"].dtype == torch.float32


@pytest.mark.parametrize(
    ("model", "plugins"),
    [("gcn", ()), ("sage", ()), ("gat", ()), ("gcn", ("tango",)), ("sage", ("exact",))],
)
def test_full_graph_training_is_the_same_on_the_compact_graph(
    monkeypatch: pytest.MonkeyPatch, model: str, plugins: tuple[str, ...]
) -> None:
    recipe = small_recipe(model, plugins=plugins)
    compact, graph = losses(recipe)
    assert graph.idtype == torch.int32
    monkeypatch.setattr(prepare, "as_int32", lambda g: g)
    loaded, graph = losses(recipe)
    assert graph.idtype == torch.int64
    assert compact == pytest.approx(loaded, rel=1e-5, abs=1e-6)


def test_ids_that_do_not_fit_int32_stay_int64(monkeypatch: pytest.MonkeyPatch) -> None:
    import dgl

    graph = dgl.graph(([0, 1, 2, 3], [1, 2, 3, 0]), num_nodes=5)
    monkeypatch.setattr(prepare, "INT32_LIMIT", 4)  # 5 nodes: more than "fit"
    assert as_int32(graph) is graph
    monkeypatch.setattr(prepare, "INT32_LIMIT", 5)
    assert as_int32(graph).idtype == torch.int32


def test_minibatch_runs_keep_the_loaded_graph() -> None:
    with prepared(small_recipe("sage", mode="minibatch")) as (dataset, graph, _model, _device):
        assert graph.idtype == torch.int64
        assert dataset.graph is graph


def test_compact_false_keeps_the_loaded_graph() -> None:
    """What a distributed worker asks for: it partitions the loaded int64 graph."""
    with prepared(small_recipe("sage"), compact=False) as (dataset, graph, _model, _device):
        assert graph.idtype == torch.int64
        assert dataset.graph is graph


def blocked_recipe(
    model: str = "sage",
    plugins: tuple[str, ...] = ("exact",),
    blocked: bool = True,
    **options: Any,
) -> Recipe:
    raw: dict[str, Any] = {
        "model": {"name": model, "hidden": 8, **options},
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": 2, "mode": "full", "threads": 1},
        "quant": {"plugin": list(plugins), "exact": {"blocked_sage": blocked, "bits": 8}},
    }
    return build_recipe(raw, "tiny")


def test_a_run_that_reads_only_the_in_csr_holds_the_graph_as_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """exact (blocked_sage, its default) on qtrain's GraphSAGE (mean): the run holds DGL's CSC alone,
    no COO beside it, the same graph for the dataset; training steps keep it so and
    give the losses of the same run on the COO graph."""
    recipe = blocked_recipe()
    with prepared(recipe) as (dataset, graph, _model, _device):
        assert graph.formats() == {"created": ["csc"], "not created": []}
        assert dataset.graph is graph
        assert graph.idtype == torch.int32
        assert graph.ndata["feat"].dtype == torch.float32
    held, graph = losses(recipe)
    assert graph.formats() == {"created": ["csc"], "not created": []}
    monkeypatch.setattr(prepare, "reads_only_in_csr", lambda *_: False)
    kept, coo = losses(recipe)
    assert "coo" in coo.formats()["created"]
    assert held == pytest.approx(kept, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    ("recipe", "why"),
    [
        (lambda: blocked_recipe(blocked=False), "blocked_sage off"),
        (lambda: small_recipe("sage"), "no plugin: DGL's backward reads the CSR"),
        (lambda: blocked_recipe(plugins=("tango", "exact")), "tango quantizes the layer"),
        (lambda: blocked_recipe("gcn"), "not GraphSAGE"),
        (lambda: blocked_recipe(aggregator="pool"), "not the mean aggregator"),
    ],
)
def test_other_runs_keep_the_coo(recipe: Any, why: str) -> None:
    with prepared(recipe()) as (_dataset, graph, _model, _device):
        assert "coo" in graph.formats()["created"], why


def test_held_as_in_csr_carries_edge_data_to_the_new_edge_ids() -> None:
    import dgl

    graph = dgl.graph(([0, 2, 1, 0, 2], [1, 1, 0, 2, 0]), num_nodes=3)
    graph.edata["w"] = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0])
    graph.ndata["x"] = torch.arange(3.0)
    held = prepare.held_as_in_csr(graph)
    assert held.ndata["x"].data_ptr() == graph.ndata["x"].data_ptr()  # shared
    src, dst, eid = held.edges(form="all", order="srcdst")
    assert held.formats()["created"] == ["csc"]  # edges() derives a COO, keeps none
    original = {
        (int(s), int(d)): float(w) for s, d, w in zip(*graph.edges(), graph.edata["w"], strict=True)
    }
    for s, d, e in zip(src, dst, eid, strict=True):
        assert float(held.edata["w"][e]) == original[(int(s), int(d))]


def test_exacts_default_holds_graphsages_graph_as_its_csc() -> None:
    with prepared(small_recipe("sage", plugins=("exact",))) as (_dataset, graph, _model, _device):
        assert graph.formats()["created"] == ["csc"]
