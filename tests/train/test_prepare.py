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
